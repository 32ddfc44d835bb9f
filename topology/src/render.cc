// Human view of a Topology (render.h).
#include "cxlpool/topology/render.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "cxlpool/common/strings.h"

namespace cxlpool {
namespace {

// Prints a tree: Add() calls build a list of (depth, text) lines, then
// Flush draws "|--" / "`--" connectors like tree(1).
class Tree {
 public:
  void Add(int depth, std::string text) { lines_.push_back({depth, std::move(text)}); }
  void Flush(std::ostream& os) const {
    for (size_t i = 0; i < lines_.size(); ++i) {
      std::string prefix;
      for (int d = 0; d < lines_[i].depth; ++d) {
        bool more = HasLaterSibling(i, d);
        if (d + 1 == lines_[i].depth) {
          prefix += more ? "|-- " : "`-- ";
        } else {
          prefix += HasLaterSiblingOfAncestor(i, d) ? "|   " : "    ";
        }
      }
      os << prefix << lines_[i].text << "\n";
    }
  }

 private:
  struct Line {
    int depth;
    std::string text;
  };
  // Is there a later line at depth d+1 before any line shallower than d+1?
  bool HasLaterSibling(size_t i, int d) const {
    for (size_t j = i + 1; j < lines_.size(); ++j) {
      if (lines_[j].depth < d + 1) return false;
      if (lines_[j].depth == d + 1) return true;
    }
    return false;
  }
  // For the ancestor of line i at depth d+1: does it have a later sibling?
  // Every line between that ancestor and i is deeper, so the same scan works.
  bool HasLaterSiblingOfAncestor(size_t i, int d) const { return HasLaterSibling(i, d); }
  std::vector<Line> lines_;
};

std::string Bytes(const std::optional<uint64_t>& b) { return b ? HumanBytes(*b) : "?"; }

std::string Num(const std::optional<uint64_t>& v, const char* unit) {
  return v ? std::to_string(*v) + " " + unit : std::string("?");
}

std::string JoinInts(const std::vector<int>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(v[i]);
  }
  return out;
}

std::string JoinStrings(const std::vector<std::string>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + v[i];
  return out;
}

std::string GpuLabel(const Gpu& g) {
  std::string s = "GPU" + std::to_string(g.index);
  if (!g.pci_bus_id.empty()) s += " " + g.pci_bus_id;
  if (g.name) s += " " + *g.name;
  if (g.memory_bytes) s += " (" + HumanBytes(*g.memory_bytes) + ")";
  return s;
}

void RenderNodes(const Topology& topo, Tree* tree) {
  tree->Add(0, "Memory topology: " + std::to_string(topo.numa_nodes.size()) + " NUMA node(s), " +
                   std::to_string(topo.gpus.size()) + " GPU(s), " +
                   std::to_string(topo.dax_devices.size()) + " DAX device(s), " +
                   std::to_string(topo.cxl_regions.size()) + " CXL region(s)");
  for (const auto& n : topo.numa_nodes) {
    std::string head = "node " + std::to_string(n.id) + ": " + NodeKindName(n.kind);
    head += n.memory_tier ? ", tier " + std::to_string(*n.memory_tier) : ", tier ?";
    head += ", " + Bytes(n.memory_bytes);
    if (n.free_bytes) head += " (" + HumanBytes(*n.free_bytes) + " free)";
    head += n.cpus.empty() ? ", no cpus" : ", cpus " + FormatCpuList(n.cpus);
    tree->Add(1, head);
    if (!n.kind_reason.empty())
      tree->Add(2, "why " + std::string(NodeKindName(n.kind)) + ": " + n.kind_reason);
    if (n.zone || n.kernel_zone_bytes || n.movable_bytes) {
      std::string z = "zone: " + n.zone.value_or("?");
      if (n.kernel_zone_bytes && n.movable_bytes) {
        z += " (kernel zones " + HumanBytes(*n.kernel_zone_bytes) + ", movable " +
             HumanBytes(*n.movable_bytes) + ")";
      }
      switch (LongTermPinsOf(n)) {
        case LongTermPins::kYes:
          z += "; long-term pins stay";
          break;
        case LongTermPins::kPartly:
          z += "; long-term pins stay only while the kernel zones have room";
          break;
        case LongTermPins::kNo:
          z += "; long-term pins (CUDA, RDMA) migrate its pages to another node";
          break;
        case LongTermPins::kUnknown:
          break;
      }
      tree->Add(2, z);
    }
    if (auto why = NotPooledReason(n)) tree->Add(2, "not pooled: " + *why);
    if (n.hugepages_2m_total || n.hugepages_1g_total) {
      auto pair = [](const std::optional<uint64_t>& free, const std::optional<uint64_t>& total) {
        return (free ? std::to_string(*free) : std::string("?")) + "/" +
               (total ? std::to_string(*total) : std::string("?"));
      };
      tree->Add(2, "hugepages free/total: 2M " + pair(n.hugepages_2m_free, n.hugepages_2m_total) +
                       ", 1G " + pair(n.hugepages_1g_free, n.hugepages_1g_total));
    }
    for (const auto& a : n.access) {
      tree->Add(2, "HMAT access" + std::to_string(a.access_class) + " from node(s) " +
                       (a.initiators.empty() ? std::string("?") : JoinInts(a.initiators)) +
                       ": read " + Num(a.read_bandwidth_mbps, "MB/s") + ", write " +
                       Num(a.write_bandwidth_mbps, "MB/s") + "; latency read " +
                       Num(a.read_latency_ns, "ns") + ", write " + Num(a.write_latency_ns, "ns"));
    }
    for (const auto& d : topo.dax_devices) {
      if (!d.target_node || *d.target_node != n.id) continue;
      std::string line = "backed by " + d.name + " (" + d.mode.value_or("?") + ", " +
                         d.source.value_or("?") + ", " + Bytes(d.size_bytes) + ")";
      for (const auto& r : topo.cxl_regions) {
        if (std::find(r.dax_devices.begin(), r.dax_devices.end(), d.name) != r.dax_devices.end()) {
          line += " of CXL " + r.name + " (" + r.type.value_or("?") + "; " +
                  JoinStrings(r.memdevs) + ")";
        }
      }
      tree->Add(2, line);
    }
    for (const auto& r : topo.cxl_regions) {
      bool via_dax = false;
      for (const auto& d : topo.dax_devices)
        if (d.target_node && *d.target_node == n.id &&
            std::find(r.dax_devices.begin(), r.dax_devices.end(), d.name) != r.dax_devices.end())
          via_dax = true;
      if (!via_dax &&
          std::find(r.numa_nodes.begin(), r.numa_nodes.end(), n.id) != r.numa_nodes.end()) {
        tree->Add(2, "backed by CXL " + r.name + " (" + r.type.value_or("?") + "; " +
                         JoinStrings(r.memdevs) + ")");
      }
    }
    for (const auto& g : topo.gpus) {
      if (g.numa_node && *g.numa_node == n.id) tree->Add(2, "local " + GpuLabel(g));
      if (g.memory_node && *g.memory_node == n.id) tree->Add(2, "memory of " + GpuLabel(g));
    }
  }
}

void RenderDevices(const Topology& topo, std::ostream& os) {
  if (!topo.dax_devices.empty()) {
    os << "\nDAX devices:\n";
    for (const auto& d : topo.dax_devices) {
      os << "  " << d.name << ": " << d.mode.value_or("?") << ", source " << d.source.value_or("?")
         << ", " << Bytes(d.size_bytes) << ", target node "
         << (d.target_node ? std::to_string(*d.target_node) : "?");
      if (d.region) os << ", " << *d.region << (d.dynamic.value_or(false) ? " (dynamic)" : "");
      if (d.align_bytes) os << ", align " << HumanBytes(*d.align_bytes);
      os << "\n";
    }
  }
  if (!topo.cxl_memdevs.empty() || !topo.cxl_regions.empty()) {
    os << "\nCXL:\n";
    for (const auto& m : topo.cxl_memdevs) {
      os << "  " << m.name << ": ram " << Bytes(m.ram_bytes) << ", pmem " << Bytes(m.pmem_bytes)
         << ", node " << (m.numa_node ? std::to_string(*m.numa_node) : "?");
      if (m.serial) os << ", serial " << *m.serial;
      os << "\n";
    }
    for (const auto& r : topo.cxl_regions) {
      os << "  " << r.name << ": " << r.type.value_or("?") << ", " << Bytes(r.size_bytes)
         << ", memdevs " << (r.memdevs.empty() ? "-" : JoinStrings(r.memdevs)) << ", dax "
         << (r.dax_devices.empty() ? "-" : JoinStrings(r.dax_devices)) << ", nodes "
         << (r.numa_nodes.empty() ? "-" : JoinInts(r.numa_nodes)) << "\n";
    }
  }
}

std::string Pad(const std::string& s, size_t w) {
  return s.size() >= w ? s + " " : s + std::string(w - s.size(), ' ');
}

void RenderMatrix(const Topology& topo, std::ostream& os) {
  if (topo.gpus.empty()) {
    os << "\nNo NVIDIA GPUs found.\n";
    return;
  }
  os << "\nGPU x memory node (SLIT distance from the GPU's node / preference rank):\n";
  const size_t w = 9;
  os << Pad("", 8);
  for (const auto& n : topo.numa_nodes) os << Pad("node" + std::to_string(n.id), w);
  os << Pad("NUMA Affinity", 15) << Pad("Memory Node", 13) << "NVLinks\n";
  for (const auto& g : topo.gpus) {
    os << Pad("GPU" + std::to_string(g.index), 8);
    const NumaNode* local = g.numa_node ? topo.FindNode(*g.numa_node) : nullptr;
    auto pref = topo.gpu_memory_preference.find(g.index);
    for (const auto& n : topo.numa_nodes) {
      std::string cell;
      if (g.memory_node && *g.memory_node == n.id) {
        cell = "HBM";
      } else {
        cell = "?";
        if (local != nullptr) {
          if (auto it = local->distances.find(n.id); it != local->distances.end()) {
            cell = std::to_string(it->second);
          }
        }
        cell += "/";
        std::string rank = "x";
        if (pref != topo.gpu_memory_preference.end()) {
          auto pos = std::find(pref->second.begin(), pref->second.end(), n.id);
          if (pos != pref->second.end()) rank = std::to_string(pos - pref->second.begin() + 1);
        }
        cell += rank;
      }
      os << Pad(cell, w);
    }
    os << Pad(g.numa_node ? std::to_string(*g.numa_node) : "N/A", 15)
       << Pad(g.memory_node ? std::to_string(*g.memory_node) : "N/A", 13);
    if (!g.nvlinks_known) {
      os << "N/A";
    } else {
      int active = 0, to_gpu = 0, to_switch = 0;
      for (const auto& l : g.nvlinks) {
        if (!l.active) continue;
        ++active;
        if (l.remote_type == std::optional<std::string>("gpu")) ++to_gpu;
        if (l.remote_type == std::optional<std::string>("switch")) ++to_switch;
      }
      os << active << "/" << g.nvlinks.size() << " active";
      if (to_gpu) os << ", " << to_gpu << " to GPUs";
      if (to_switch) os << ", " << to_switch << " to NVSwitch";
    }
    os << "\n";
  }
  os << "\nLegend:\n"
        "  D/R  = SLIT distance from the GPU's NUMA node / rank in gpu_memory_preference\n"
        "  x    = not a candidate (no memory, or another GPU's memory node)\n"
        "  HBM  = this GPU's own memory node\n"
        "  ?    = unknown (GPU's node or distance not known)\n";
}

}  // namespace

std::string RenderTopologyText(const Topology& topo) {
  std::ostringstream os;
  Tree tree;
  RenderNodes(topo, &tree);
  tree.Flush(os);
  RenderDevices(topo, os);
  RenderMatrix(topo, os);
  if (!topo.warnings.empty()) {
    os << "\nWarnings (" << topo.warnings.size() << "):\n";
    for (const auto& w : topo.warnings) os << "  - " << w << "\n";
  }
  return os.str();
}

}  // namespace cxlpool
