#include "cxlpool/topology/topology.h"

#include <algorithm>
#include <cctype>

namespace cxlpool {

const char* NodeKindName(NodeKind k) {
  switch (k) {
    case NodeKind::kDram:
      return "dram";
    case NodeKind::kCxl:
      return "cxl";
    case NodeKind::kHbm:
      return "hbm";
    case NodeKind::kNvm:
      return "nvm";
    case NodeKind::kGpu:
      return "gpu";
    case NodeKind::kUnknown:
      return "unknown";
  }
  return "unknown";
}

bool ParseNodeKind(const std::string& s, NodeKind* out) {
  for (NodeKind k : {NodeKind::kDram, NodeKind::kCxl, NodeKind::kHbm, NodeKind::kNvm,
                     NodeKind::kGpu, NodeKind::kUnknown}) {
    if (s == NodeKindName(k)) {
      *out = k;
      return true;
    }
  }
  return false;
}

const char* LongTermPinsName(LongTermPins p) {
  switch (p) {
    case LongTermPins::kYes:
      return "yes";
    case LongTermPins::kPartly:
      return "partly";
    case LongTermPins::kNo:
      return "no";
    case LongTermPins::kUnknown:
      return nullptr;
  }
  return nullptr;
}

LongTermPins LongTermPinsOf(const NumaNode& node) {
  if (!node.kernel_zone_bytes || !node.movable_bytes) return LongTermPins::kUnknown;
  const bool kernel = *node.kernel_zone_bytes > 0, movable = *node.movable_bytes > 0;
  if (kernel && movable) return LongTermPins::kPartly;
  if (kernel) return LongTermPins::kYes;
  if (movable) return LongTermPins::kNo;
  return LongTermPins::kUnknown;
}

std::optional<std::string> NotPooledReason(const NumaNode& node) {
  if (node.kind == NodeKind::kGpu) {
    return std::string("GPU memory: the daemon never pools a GPU's own memory");
  }
  if (!node.memory_bytes || *node.memory_bytes == 0) {
    return std::string(node.memory_bytes ? "no memory" : "memory size unknown");
  }
  if (node.kind == NodeKind::kUnknown && node.backing_unidentified) {
    return "CPU-less memory of unknown kind (no CXL, hmem, nvdimm or GPU backing found): not "
           "pooled unless [pools.node." +
           std::to_string(node.id) + "] enabled = true";
  }
  return std::nullopt;
}

std::optional<std::string> NoMemorySizeKnown(const Topology& topo) {
  for (const auto& n : topo.numa_nodes) {
    if (n.memory_bytes) return std::nullopt;
  }
  if (topo.numa_nodes.empty()) return std::string("no NUMA node found, so no memory to pool");
  const bool assumed = topo.numa_nodes.size() == 1 && topo.numa_nodes[0].sole_node_assumed;
  return std::string("no NUMA node has a known memory size (") +
         (assumed ? "no /sys/devices/system/node, and /proc/meminfo has no MemTotal"
                  : "no /sys/devices/system/node/nodeN/meminfo has a MemTotal") +
         "), so there is no memory to pool";
}

std::string Topology::KernelZoneRemedy(int id) const {
  std::string devs;
  for (const auto& d : dax_devices) {
    if (d.mode == std::optional<std::string>("system-ram") && d.target_node == id) {
      devs += (devs.empty() ? "" : " ") + d.name;
    }
  }
  const std::string node = std::to_string(id);
  const std::string daxctl = devs.empty() ? "<daxX.Y>" : devs;
  std::string s = "online node " + node + "'s memory in a kernel zone: daxctl offline-memory " +
                  daxctl + " && daxctl online-memory --no-movable " + daxctl;
  if (devs.empty()) {
    s += " for the DAX device behind it, or for each of its blocks: echo offline > "
         "/sys/devices/system/node/node" +
         node + "/memoryN/state && echo online_kernel > (the same file)";
  }
  return s;
}

const NumaNode* Topology::FindNode(int id) const {
  for (const auto& n : numa_nodes)
    if (n.id == id) return &n;
  return nullptr;
}

const Gpu* Topology::FindGpu(int index) const {
  for (const auto& g : gpus)
    if (g.index == index) return &g;
  return nullptr;
}

namespace {
std::string Lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
}  // namespace

const Gpu* Topology::FindGpuByName(const std::string& name) const {
  if (!name.empty() && std::all_of(name.begin(), name.end(), ::isdigit)) {
    return FindGpu(std::stoi(name));
  }
  std::string want = Lower(name);
  for (const auto& g : gpus) {
    if (g.uuid && Lower(*g.uuid) == want) return &g;
    std::string bus = Lower(g.pci_bus_id);
    if (bus == want) return &g;
    // "bb:dd.f" without domain, or an 8-digit NVML domain "00000000:bb:dd.f".
    auto colon = bus.find(':');
    if (colon != std::string::npos && bus.substr(colon + 1) == want) return &g;
    auto wcolon = want.find(':');
    if (wcolon != std::string::npos && want.substr(wcolon + 1) == bus.substr(colon + 1) &&
        std::all_of(want.begin(), want.begin() + wcolon, [](char c) { return c == '0'; }) &&
        std::all_of(bus.begin(), bus.begin() + colon, [](char c) { return c == '0'; })) {
      return &g;
    }
  }
  return nullptr;
}

}  // namespace cxlpool
