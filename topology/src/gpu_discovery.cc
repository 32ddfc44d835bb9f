// GPU discovery: NVML when a library is loadable, else a sysfs PCI scan.
#include "gpu_discovery.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <tuple>

#include "cxlpool/common/log.h"
#include "cxlpool/common/strings.h"
#include "memory_internal.h"

namespace cxlpool {
namespace {

constexpr const char* kPciDevices = "/sys/bus/pci/devices";
constexpr const char* kDriverGpus = "/proc/driver/nvidia/gpus";
constexpr const char* kDefaultNvml = "libnvidia-ml.so.1";
constexpr uint64_t kNvidiaVendor = 0x10de;
constexpr uint64_t kDisplayClass = 0x03;
// Mask sizes handed to NVML, in unsigned longs: 4096 CPUs, 1024 nodes.
constexpr unsigned kCpuMaskWords = 4096 / (8 * sizeof(unsigned long));
constexpr unsigned kNodeMaskWords = 1024 / (8 * sizeof(unsigned long));

// (domain, bus, device, function) of a normalised bus id, for bus order.
std::tuple<uint64_t, uint64_t, uint64_t, uint64_t> BusKey(const std::string& id) {
  auto parts = Split(id, ':');
  if (parts.size() != 3) return {~0ull, 0, 0, 0};
  auto dot = parts[2].find('.');
  auto v = [](std::string_view s) { return ParseU64(s, 16).value_or(~0ull); };
  return {v(parts[0]), v(parts[1]), v(std::string_view(parts[2]).substr(0, dot)),
          dot == std::string::npos ? 0 : v(std::string_view(parts[2]).substr(dot + 1))};
}

std::vector<int> MaskBits(const unsigned long* words, unsigned nwords) {
  std::vector<int> out;
  const int bits = 8 * sizeof(unsigned long);
  for (unsigned w = 0; w < nwords; ++w)
    for (int b = 0; b < bits; ++b)
      if (words[w] & (1ul << b)) out.push_back(static_cast<int>(w) * bits + b);
  return out;
}

// The node holding most of `cpus` (lowest id on ties); nullopt if none.
std::optional<int> NodeOfCpus(const Topology& topo, const std::vector<int>& cpus) {
  std::set<int> want(cpus.begin(), cpus.end());
  std::optional<int> best;
  size_t best_count = 0;
  for (const auto& n : topo.numa_nodes) {
    size_t c = 0;
    for (int cpu : n.cpus) c += want.count(cpu);
    if (c > best_count || (c == best_count && c > 0 && best && n.id < *best)) {
      best = n.id;
      best_count = c;
    }
  }
  return best;
}

bool NodeHasCpus(const Topology& topo, int id) {
  const NumaNode* n = topo.FindNode(id);
  return n != nullptr && !n->cpus.empty();
}

std::string Prefix(int index) { return "GPU " + std::to_string(index) + ": "; }

// Turns an NVML buffer into a string, stopping at the first NUL.
std::string FromBuffer(const char* buf, size_t size) {
  return std::string(buf, strnlen(buf, size));
}

void WarnUnlessUnsupported(const NvmlLibrary& nvml, nvmlReturn_t r, int index, const char* what,
                           std::vector<std::string>* warnings) {
  if (r == NVML_SUCCESS || r == NVML_ERROR_NOT_SUPPORTED) return;
  warnings->push_back(Prefix(index) + "NVML " + what + " failed: " + nvml.ErrorString(r));
}

std::optional<int> NvmlAffinityNode(const NvmlLibrary& nvml, nvmlDevice_t dev, int index,
                                    const Topology& topo, std::vector<std::string>* warnings) {
  if (nvml.nvmlDeviceGetMemoryAffinity != nullptr) {
    unsigned long set[kNodeMaskWords] = {};
    nvmlReturn_t r =
        nvml.nvmlDeviceGetMemoryAffinity(dev, kNodeMaskWords, set, NVML_AFFINITY_SCOPE_NODE);
    WarnUnlessUnsupported(nvml, r, index, "memory affinity", warnings);
    if (r == NVML_SUCCESS) {
      std::vector<int> nodes = MaskBits(set, kNodeMaskWords);
      for (int n : nodes)
        if (NodeHasCpus(topo, n)) return n;
      if (!nodes.empty()) return nodes.front();
    }
  }
  std::vector<int> cpus;
  if (nvml.nvmlDeviceGetCpuAffinityWithinScope != nullptr) {
    unsigned long set[kCpuMaskWords] = {};
    nvmlReturn_t r =
        nvml.nvmlDeviceGetCpuAffinityWithinScope(dev, kCpuMaskWords, set, NVML_AFFINITY_SCOPE_NODE);
    WarnUnlessUnsupported(nvml, r, index, "CPU affinity (node scope)", warnings);
    if (r == NVML_SUCCESS) cpus = MaskBits(set, kCpuMaskWords);
  }
  if (cpus.empty() && nvml.nvmlDeviceGetCpuAffinity != nullptr) {
    unsigned long set[kCpuMaskWords] = {};
    nvmlReturn_t r = nvml.nvmlDeviceGetCpuAffinity(dev, kCpuMaskWords, set);
    WarnUnlessUnsupported(nvml, r, index, "CPU affinity", warnings);
    if (r == NVML_SUCCESS) cpus = MaskBits(set, kCpuMaskWords);
  }
  if (!cpus.empty()) return NodeOfCpus(topo, cpus);
  return std::nullopt;
}

std::optional<std::string> RemoteType(nvmlIntNvLinkDeviceType_t t) {
  switch (t) {
    case NVML_NVLINK_DEVICE_TYPE_GPU:
      return "gpu";
    case NVML_NVLINK_DEVICE_TYPE_SWITCH:
      return "switch";
    case NVML_NVLINK_DEVICE_TYPE_IBMNPU:
      return "cpu";
    default:
      return std::nullopt;
  }
}

void NvmlLinks(const NvmlLibrary& nvml, nvmlDevice_t dev, Gpu* gpu,
               std::vector<std::string>* warnings) {
  if (nvml.nvmlDeviceGetNvLinkState == nullptr) return;  // unsupported: nvlinks null
  gpu->nvlinks_known = true;
  for (unsigned link = 0; link < NVML_NVLINK_MAX_LINKS; ++link) {
    nvmlEnableState_t state = NVML_FEATURE_DISABLED;
    nvmlReturn_t r = nvml.nvmlDeviceGetNvLinkState(dev, link, &state);
    if (r == NVML_ERROR_NOT_SUPPORTED || r == NVML_ERROR_INVALID_ARGUMENT) continue;  // no link
    if (r != NVML_SUCCESS) {
      warnings->push_back(Prefix(gpu->index) + "NVML NVLink " + std::to_string(link) +
                          " state failed: " + nvml.ErrorString(r));
      continue;
    }
    NvLink l;
    l.link = static_cast<int>(link);
    l.active = state == NVML_FEATURE_ENABLED;
    if (l.active && nvml.nvmlDeviceGetNvLinkRemotePciInfo_v2 != nullptr) {
      nvmlPciInfo_t pci;
      std::memset(&pci, 0, sizeof pci);
      if (nvml.nvmlDeviceGetNvLinkRemotePciInfo_v2(dev, link, &pci) == NVML_SUCCESS) {
        auto id = NormalizePciBusId(FromBuffer(pci.busId, sizeof pci.busId));
        if (id.ok()) l.remote_pci_bus_id = id.value();
      }
    }
    if (l.active && nvml.nvmlDeviceGetNvLinkRemoteDeviceType != nullptr) {
      nvmlIntNvLinkDeviceType_t t = NVML_NVLINK_DEVICE_TYPE_UNKNOWN;
      if (nvml.nvmlDeviceGetNvLinkRemoteDeviceType(dev, link, &t) == NVML_SUCCESS) {
        l.remote_type = RemoteType(t);
      }
    }
    gpu->nvlinks.push_back(std::move(l));
  }
}

}  // namespace

std::optional<NvmlChoice> ChooseNvmlLibrary(const FileSystem& fs, const DiscoverOptions& options) {
  if (!options.use_nvml) return std::nullopt;
  if (!options.nvml_library.empty()) return NvmlChoice{options.nvml_library, true};
  if (const char* env = std::getenv("CXLPOOL_NVML_LIBRARY"); env != nullptr && *env != '\0') {
    return NvmlChoice{env, true};
  }
  if (fs.IsThisSystem()) return NvmlChoice{kDefaultNvml, false};
  return std::nullopt;
}

std::optional<int> PciNumaNode(const FileSystem& fs, const std::string& bus_id,
                               std::vector<std::string>* warnings) {
  std::string path = JoinPath(JoinPath(kPciDevices, bus_id), "numa_node");
  auto text = fs.ReadTrimmed(path);
  if (!text.ok()) return std::nullopt;
  auto v = ParseI64(text.value());
  if (!v || *v < -1 || *v > 1 << 20) {
    warnings->push_back(path + ": garbled numa_node '" + text.value() + "'");
    return std::nullopt;
  }
  if (*v < 0) return std::nullopt;
  return static_cast<int>(*v);
}

std::vector<Gpu> ScanPciGpus(const FileSystem& fs, std::vector<std::string>* warnings,
                             const std::set<std::string>& driver_bus_ids) {
  std::vector<Gpu> gpus;
  auto names = fs.ListDir(kPciDevices);
  if (!names.ok()) {
    warnings->push_back(std::string("cannot list ") + kPciDevices + " (" +
                        CodeName(names.status().code()) + "): no PCI scan for GPUs");
    return gpus;
  }
  for (const auto& name : names.value()) {
    std::string dir = JoinPath(kPciDevices, name);
    auto vendor_text = fs.ReadTrimmed(JoinPath(dir, "vendor"));
    if (!vendor_text.ok()) continue;  // not a device directory we can read
    auto vendor = ParseU64(vendor_text.value(), 0);
    if (!vendor) {
      warnings->push_back(dir + "/vendor: garbled '" + vendor_text.value() + "'");
      continue;
    }
    if (*vendor != kNvidiaVendor) continue;
    auto id = NormalizePciBusId(name);
    if (!id.ok()) {
      warnings->push_back(dir + ": " + id.status().message());
      continue;
    }
    const bool driver_bound = driver_bus_ids.count(id.value()) > 0;
    auto class_text = fs.ReadTrimmed(JoinPath(dir, "class"));
    auto pci_class = class_text.ok() ? ParseU64(class_text.value(), 0) : std::nullopt;
    if (!pci_class && !driver_bound) {
      warnings->push_back(dir + "/class: missing or garbled; NVIDIA function skipped");
      continue;
    }
    // The driver binds GPUs only, so a function it lists needs no class.
    if (pci_class && (*pci_class >> 16) != kDisplayClass) continue;  // audio, bridges, NVSwitch
    Gpu g;
    g.pci_bus_id = id.value();
    g.numa_node = PciNumaNode(fs, name, warnings);
    g.source = "pci";
    gpus.push_back(std::move(g));
  }
  std::sort(gpus.begin(), gpus.end(),
            [](const Gpu& a, const Gpu& b) { return BusKey(a.pci_bus_id) < BusKey(b.pci_bus_id); });
  for (size_t i = 0; i < gpus.size(); ++i) gpus[i].index = static_cast<int>(i);
  return gpus;
}

Result<std::vector<Gpu>> ScanNvmlGpus(const NvmlLibrary& nvml, const FileSystem& fs,
                                      const Topology& topo, std::vector<std::string>* warnings) {
  unsigned int count = 0;
  nvmlReturn_t r = nvml.nvmlDeviceGetCount_v2(&count);
  if (r != NVML_SUCCESS) {
    return Status(NvmlCodeToCode(r), "nvmlDeviceGetCount_v2: " + nvml.ErrorString(r));
  }
  if (count > 4096)
    return Status(Code::kInvalidArgument,
                  "NVML reports " + std::to_string(count) + " GPUs; refusing");
  bool have_pci_dir = fs.IsDir(kPciDevices);
  std::vector<Gpu> gpus;
  for (unsigned int i = 0; i < count; ++i) {
    int index = static_cast<int>(i);
    nvmlDevice_t dev = nullptr;
    r = nvml.nvmlDeviceGetHandleByIndex_v2(i, &dev);
    if (r != NVML_SUCCESS) {
      warnings->push_back(Prefix(index) + "NVML handle failed: " + nvml.ErrorString(r));
      continue;
    }
    Gpu g;
    g.index = index;
    g.source = "nvml";
    if (nvml.nvmlDeviceGetUUID != nullptr) {
      char buf[NVML_DEVICE_UUID_V2_BUFFER_SIZE] = {};
      r = nvml.nvmlDeviceGetUUID(dev, buf, sizeof buf);
      WarnUnlessUnsupported(nvml, r, index, "UUID", warnings);
      if (r == NVML_SUCCESS) g.uuid = FromBuffer(buf, sizeof buf);
    }
    if (nvml.nvmlDeviceGetName != nullptr) {
      char buf[NVML_DEVICE_NAME_V2_BUFFER_SIZE] = {};
      r = nvml.nvmlDeviceGetName(dev, buf, sizeof buf);
      WarnUnlessUnsupported(nvml, r, index, "name", warnings);
      if (r == NVML_SUCCESS) g.name = FromBuffer(buf, sizeof buf);
    }
    if (nvml.nvmlDeviceGetPciInfo_v3 != nullptr) {
      nvmlPciInfo_t pci;
      std::memset(&pci, 0, sizeof pci);
      r = nvml.nvmlDeviceGetPciInfo_v3(dev, &pci);
      WarnUnlessUnsupported(nvml, r, index, "PCI info", warnings);
      if (r == NVML_SUCCESS) {
        auto id = NormalizePciBusId(FromBuffer(pci.busId, sizeof pci.busId));
        if (id.ok()) {
          g.pci_bus_id = id.value();
        } else {
          warnings->push_back(Prefix(index) + "NVML " + id.status().message());
        }
      }
    }
    if (nvml.nvmlDeviceGetMemoryInfo != nullptr) {
      nvmlMemory_t mem;
      std::memset(&mem, 0, sizeof mem);
      r = nvml.nvmlDeviceGetMemoryInfo(dev, &mem);
      WarnUnlessUnsupported(nvml, r, index, "memory info", warnings);
      if (r == NVML_SUCCESS) g.memory_bytes = mem.total;
    }
    g.numa_node = NvmlAffinityNode(nvml, dev, index, topo, warnings);
    if (!g.pci_bus_id.empty()) {
      if (!g.numa_node) g.numa_node = PciNumaNode(fs, g.pci_bus_id, warnings);
      const std::string dir = JoinPath(kPciDevices, g.pci_bus_id);
      if (have_pci_dir && !fs.Exists(dir)) {
        warnings->push_back(Prefix(index) + "NVML bus id " + g.pci_bus_id + " is not in " +
                            kPciDevices);
      } else if (have_pci_dir) {
        // The device there must be NVIDIA's, else NVML and this sysfs tree
        // describe different machines (or the bus was renumbered).
        auto vendor_text = fs.ReadTrimmed(JoinPath(dir, "vendor"));
        auto vendor = vendor_text.ok() ? ParseU64(vendor_text.value(), 0) : std::nullopt;
        if (vendor && *vendor != kNvidiaVendor) {
          warnings->push_back(Prefix(index) + "NVML bus id " + g.pci_bus_id + " is vendor " +
                              vendor_text.value() + " in " + kPciDevices + ", not NVIDIA (0x10de)");
        }
      }
    }
    if (nvml.nvmlDeviceGetNumaNodeId != nullptr) {
      unsigned int node = 0;
      r = nvml.nvmlDeviceGetNumaNodeId(dev, &node);
      WarnUnlessUnsupported(nvml, r, index, "NUMA node id", warnings);
      if (r == NVML_SUCCESS && node < (1u << 20)) {
        int n = static_cast<int>(node);
        if (NodeHasCpus(topo, n)) {
          // A node with CPUs is not GPU memory; at most an affinity hint.
          if (!g.numa_node) g.numa_node = n;
        } else {
          g.memory_node = n;
          g.memory_node_source = "nvml";
        }
      }
    }
    NvmlLinks(nvml, dev, &g, warnings);
    gpus.push_back(std::move(g));
  }
  return gpus;
}

Result<NumaStatus> ParseNumaStatus(std::string_view text) {
  NumaStatus out;
  bool have_node = false;
  for (const auto& line : Split(text, '\n')) {
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string_view key = Trim(std::string_view(line).substr(0, colon));
    std::string_view value = TrimSysfsValue(std::string_view(line).substr(colon + 1));
    if (key == "Node") {
      if (have_node) return Status(Code::kInvalidArgument, "two 'Node:' lines");
      auto v = ParseI64(value);
      if (!v || *v < -1 || *v > (1 << 20)) {
        return Status(Code::kInvalidArgument,
                      "'Node:' is not a node id: '" + memory_internal::Printable(value) + "'");
      }
      have_node = true;
      if (*v >= 0) out.node = static_cast<int>(*v);
    } else if (key == "Status") {
      out.status = memory_internal::Printable(value);
    }
  }
  if (!have_node) return Status(Code::kInvalidArgument, "no 'Node:' line");
  return out;
}

std::vector<DriverGpu> ScanDriverGpus(const FileSystem& fs, std::vector<std::string>* warnings) {
  std::vector<DriverGpu> out;
  auto names = fs.ListDir(kDriverGpus);
  if (!names.ok()) {
    if (names.status().code() != Code::kNotFound) {
      warnings->push_back(std::string(kDriverGpus) + ": " + names.status().ToString());
    }
    return out;
  }
  for (const auto& name : names.value()) {
    const std::string dir = JoinPath(kDriverGpus, name);
    if (!fs.IsDir(dir)) continue;
    auto id = NormalizePciBusId(name);
    if (!id.ok()) {
      warnings->push_back(dir + ": not a PCI bus id; ignored");
      continue;
    }
    DriverGpu g;
    g.pci_bus_id = id.value();
    g.path = JoinPath(dir, "numa_status");
    auto text = fs.ReadFile(g.path);
    if (!text.ok()) {
      // Drivers before NUMA support have no such file: nothing to say then.
      if (text.status().code() != Code::kNotFound) {
        warnings->push_back(g.path + ": " + text.status().ToString());
      }
    } else if (auto st = ParseNumaStatus(*text); !st.ok()) {
      warnings->push_back(g.path + ": " + st.status().message() + " ('" +
                          memory_internal::Printable(*text) + "'); the memory node of GPU " +
                          g.pci_bus_id + " is unknown");
    } else {
      g.memory_node = st->node;
      g.numa_status = st->status;
    }
    out.push_back(std::move(g));
  }
  std::sort(out.begin(), out.end(), [](const DriverGpu& a, const DriverGpu& b) {
    return BusKey(a.pci_bus_id) < BusKey(b.pci_bus_id);
  });
  return out;
}

void ApplyDriverMemoryNodes(const std::vector<DriverGpu>& driver, Topology* topo) {
  for (const auto& d : driver) {
    if (!d.memory_node) continue;
    const int n = *d.memory_node;
    const NumaNode* node = topo->FindNode(n);
    if (node == nullptr) {
      topo->warnings.push_back(d.path + ": names NUMA node " + std::to_string(n) +
                               ", which sysfs does not show; ignored");
      continue;
    }
    if (!node->cpus.empty()) {
      topo->warnings.push_back(d.path + ": names NUMA node " + std::to_string(n) +
                               ", which has CPUs; not taken as GPU memory");
      continue;
    }
    for (auto& g : topo->gpus) {
      if (g.pci_bus_id != d.pci_bus_id) continue;
      if (!g.memory_node) {
        g.memory_node = n;
        g.memory_node_source = "driver";
      } else if (*g.memory_node != n) {
        topo->warnings.push_back("GPU " + std::to_string(g.index) + " (" + g.pci_bus_id +
                                 "): NVML places its memory on NUMA node " +
                                 std::to_string(*g.memory_node) + ", " + d.path + " on node " +
                                 std::to_string(n) + "; both are taken as GPU memory");
      }
    }
  }
}

void MarkGpuMemoryNodes(Topology* topo, const std::vector<DriverGpu>& driver) {
  auto mark = [&](int id, const std::string& who, const std::string& source) {
    NumaNode* node = nullptr;
    for (auto& n : topo->numa_nodes)
      if (n.id == id) node = &n;
    if (node == nullptr) return false;
    std::string reason = "holds the memory of " + who + " (" + source + ")";
    if (node->kind == NodeKind::kGpu && !node->kind_reason.empty()) {
      reason = node->kind_reason + "; also " + reason;  // two GPUs share a node
    } else if (node->kind != NodeKind::kUnknown) {
      reason += "; sysfs alone suggested " + std::string(NodeKindName(node->kind));
    }
    node->kind = NodeKind::kGpu;
    node->kind_reason = reason;
    return true;
  };
  auto gpu_name = [](int index, const std::string& bus) {
    return "GPU " + std::to_string(index) + (bus.empty() ? "" : " (" + bus + ")");
  };
  for (const auto& g : topo->gpus) {
    if (!g.memory_node) continue;
    std::string who = gpu_name(g.index, g.pci_bus_id);
    std::string source =
        g.memory_node_source == "driver"
            ? "NVIDIA driver, " + std::string(kDriverGpus) + "/" + g.pci_bus_id + "/numa_status"
            : "NVML nvmlDeviceGetNumaNodeId";
    if (!mark(*g.memory_node, who, source)) {
      topo->warnings.push_back(who + ": " +
                               (g.memory_node_source == "driver" ? "the driver" : "NVML") +
                               " places its memory on NUMA node " + std::to_string(*g.memory_node) +
                               ", which sysfs does not show");
    }
  }
  // The driver's word also counts for a node whose GPU is in no list here,
  // and for a second node it gives a GPU that NVML placed elsewhere.
  for (const auto& d : driver) {
    if (!d.memory_node) continue;
    const NumaNode* node = topo->FindNode(*d.memory_node);
    if (node == nullptr || !node->cpus.empty()) continue;  // warned in Apply
    bool told = false;
    for (const auto& g : topo->gpus) {
      told = told || (g.pci_bus_id == d.pci_bus_id && g.memory_node == d.memory_node);
    }
    if (told) continue;
    const Gpu* g = nullptr;
    for (const auto& x : topo->gpus)
      if (x.pci_bus_id == d.pci_bus_id) g = &x;
    mark(*d.memory_node, g != nullptr ? gpu_name(g->index, g->pci_bus_id) : "GPU " + d.pci_bus_id,
         "NVIDIA driver, " + d.path);
  }
}

void DiscoverGpus(const FileSystem& fs, const DiscoverOptions& options, Topology* topo) {
  topo->gpus.clear();
  // The driver's own list: read whether or not NVML loads, so GPU memory
  // nodes are known on a machine (or in a container) without NVML.
  std::vector<DriverGpu> driver = ScanDriverGpus(fs, &topo->warnings);
  std::set<std::string> driver_ids;
  for (const auto& d : driver) driver_ids.insert(d.pci_bus_id);
  bool from_nvml = false;
  if (auto choice = ChooseNvmlLibrary(fs, options)) {
    auto lib = NvmlLibrary::Open(choice->path);
    if (!lib.ok()) {
      // No driver on a machine without GPUs is normal: only an explicitly
      // named library that fails, or a present-but-broken default, warns.
      if (choice->is_explicit || lib.status().code() != Code::kNotFound) {
        topo->warnings.push_back("NVML unavailable (" + lib.status().ToString() +
                                 "); GPUs from the PCI scan");
      } else {
        CXLPOOL_LOG(kDebug) << lib.status().ToString();
      }
    } else {
      auto gpus = ScanNvmlGpus(*lib.value(), fs, *topo, &topo->warnings);
      if (!gpus.ok()) {
        topo->warnings.push_back("NVML enumeration failed (" + gpus.status().ToString() +
                                 "); GPUs from the PCI scan");
      } else {
        topo->gpus = std::move(gpus).value();
        from_nvml = true;
      }
    }
  }
  if (from_nvml && topo->gpus.empty()) {
    std::vector<std::string> ignored;
    auto pci = ScanPciGpus(fs, &ignored, driver_ids);
    if (!pci.empty()) {
      topo->warnings.push_back("NVML reports no GPUs but the PCI scan finds " +
                               std::to_string(pci.size()) + "; using the PCI scan");
      topo->gpus = std::move(pci);
      from_nvml = false;
    }
  } else if (!from_nvml) {
    topo->gpus = ScanPciGpus(fs, &topo->warnings, driver_ids);
  }
  if (!from_nvml) {
    // A GPU the driver has bound but the PCI scan could not read (vendor
    // or the whole device directory missing from the tree) is still a GPU.
    bool added = false;
    for (const auto& d : driver) {
      bool have = false;
      for (const auto& g : topo->gpus) have = have || g.pci_bus_id == d.pci_bus_id;
      if (have) continue;
      Gpu g;
      g.pci_bus_id = d.pci_bus_id;
      g.numa_node = PciNumaNode(fs, d.pci_bus_id, &topo->warnings);
      g.source = "driver";
      topo->gpus.push_back(std::move(g));
      added = true;
    }
    if (added) {
      std::sort(topo->gpus.begin(), topo->gpus.end(), [](const Gpu& a, const Gpu& b) {
        return BusKey(a.pci_bus_id) < BusKey(b.pci_bus_id);
      });
      for (size_t i = 0; i < topo->gpus.size(); ++i) topo->gpus[i].index = static_cast<int>(i);
    }
  }
  ApplyDriverMemoryNodes(driver, topo);
  MarkGpuMemoryNodes(topo, driver);
}

}  // namespace cxlpool
