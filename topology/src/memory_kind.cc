// Node kinds from what backs each node. Declared in memory_internal.h; the
// rules are written down (with their reasons) in docs/topology-kinds.md.
#include <algorithm>

#include "cxlpool/common/strings.h"
#include "memory_internal.h"

namespace cxlpool::memory_internal {
namespace {

const CxlRegion* RegionOfDax(const Topology& topo, const std::string& dax) {
  for (const auto& r : topo.cxl_regions) {
    if (std::find(r.dax_devices.begin(), r.dax_devices.end(), dax) != r.dax_devices.end()) {
      return &r;
    }
  }
  return nullptr;
}

std::string Join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

}  // namespace

void ClassifyNodes(Topology* topo) {
  // The fastest CPU-attached node, to tell HBM from CXL behind hmem.
  std::optional<uint64_t> dram_bw;
  for (const auto& n : topo->numa_nodes) {
    if (n.cpus.empty()) continue;
    if (auto bw = HmatReadBandwidth(n)) dram_bw = std::max(dram_bw.value_or(0), *bw);
  }

  for (auto& node : topo->numa_nodes) {
    // What was hot-plugged into this node as system RAM, by source.
    std::vector<std::string> cxl, hmem, nvdimm;
    for (const auto& d : topo->dax_devices) {
      if (d.mode != "system-ram" || d.target_node != node.id) continue;
      const CxlRegion* region = RegionOfDax(*topo, d.name);
      if (region || d.source == "cxl") {
        cxl.push_back(region ? "CXL region " + region->name + " via " + d.name
                             : "CXL memory via " + d.name);
      } else if (d.source == "hmem") {
        hmem.push_back(d.name);
      } else if (d.source == "nvdimm") {
        nvdimm.push_back(d.name);
      }
    }

    if (node.sole_node_assumed) {
      // No NUMA in sysfs: the one node is the machine's memory, CPUs found or not.
      node.kind = NodeKind::kDram;
      node.kind_reason =
          "the only node (no /sys/devices/system/node: a kernel without NUMA), so it holds " +
          (node.cpus.empty() ? std::string("every CPU") : "CPUs " + FormatCpuList(node.cpus)) +
          " and all memory";
      if (!cxl.empty()) node.kind_reason += "; also holds " + Join(cxl);
      continue;
    }
    if (!node.cpus.empty()) {
      node.kind = NodeKind::kDram;
      node.kind_reason = "has CPUs " + FormatCpuList(node.cpus);
      if (node.memory_bytes && *node.memory_bytes == 0) node.kind_reason += " (no memory)";
      if (!cxl.empty()) node.kind_reason += "; also holds " + Join(cxl);
      continue;
    }
    if (!cxl.empty()) {
      node.kind = NodeKind::kCxl;
      node.kind_reason = "CPU-less; memory from " + Join(cxl) + " (kmem)";
      continue;
    }
    if (!nvdimm.empty()) {
      node.kind = NodeKind::kNvm;
      node.kind_reason =
          "CPU-less; memory from nvdimm (pmem) namespace via " + Join(nvdimm) + " (kmem)";
      continue;
    }
    if (!hmem.empty()) {
      // Soft-reserved (EFI_MEMORY_SP) memory claimed by dax_hmem: HBM on some
      // platforms, a firmware-configured CXL expander on others. HMAT decides.
      std::string what = "CPU-less; soft-reserved memory via " + Join(hmem) + " (hmem, kmem)";
      auto bw = HmatReadBandwidth(node);
      if (bw && dram_bw && *bw > *dram_bw) {
        node.kind = NodeKind::kHbm;
        node.kind_reason = what + "; HMAT read bandwidth " + std::to_string(*bw) +
                           " MB/s exceeds the CPU nodes' " + std::to_string(*dram_bw) + " MB/s";
      } else if (bw && dram_bw) {
        node.kind = NodeKind::kCxl;
        node.kind_reason = what + "; HMAT read bandwidth " + std::to_string(*bw) +
                           " MB/s is not above the CPU nodes' " + std::to_string(*dram_bw) +
                           " MB/s, so a memory expander";
      } else {
        node.kind = NodeKind::kUnknown;
        node.kind_reason = what + "; no HMAT bandwidth to tell HBM from CXL";
      }
      continue;
    }
    node.kind = NodeKind::kUnknown;
    node.backing_unidentified = true;
    if (node.memory_bytes && *node.memory_bytes > 0) {
      node.kind_reason = "CPU-less memory node with no CXL, hmem or nvdimm backing found";
    } else {
      node.kind_reason = "CPU-less node with no memory and no backing found";
    }
  }
}

}  // namespace cxlpool::memory_internal
