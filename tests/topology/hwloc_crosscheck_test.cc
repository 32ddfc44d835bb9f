// Cross-check against hwloc, the field's reference: for every fixture tree,
// hwloc's Linux backend reads the same root (HWLOC_FSROOT) and its NUMA node
// ids, cpus, memory sizes and SLIT distances must agree with DiscoverMemory.
// Strict trees must agree on everything; the garbled/partial trees only where
// both sides found a value (hwloc drops a whole SLIT matrix on one bad row,
// cxlpool drops only that row).
#include <gtest/gtest.h>
#include <hwloc.h>

#include <cstdlib>
#include <set>

#include "cxlpool/topology/discover.h"

namespace cxlpool {
namespace {

struct HwlocNode {
  std::vector<int> cpus;
  uint64_t local_memory = 0;
  uint64_t hugepage_bytes = 0;  // page_types beyond the base page
};

struct HwlocView {
  std::map<int, HwlocNode> nodes;
  std::vector<int> all_cpus;
  std::map<int, std::map<int, int>> distances;  // empty if hwloc found none
};

std::vector<int> Cpus(hwloc_const_bitmap_t set) {
  std::vector<int> out;
  if (!set) return out;
  for (int i = hwloc_bitmap_first(set); i >= 0; i = hwloc_bitmap_next(set, i)) out.push_back(i);
  return out;
}

// Loads `root` with hwloc's Linux backend only, never touching this machine.
std::optional<HwlocView> LoadHwloc(const std::string& root, std::string* error) {
  setenv("HWLOC_FSROOT", root.c_str(), 1);
  setenv("HWLOC_THISSYSTEM", "0", 1);
  setenv("HWLOC_COMPONENTS", "-x86", 1);  // no CPUID on the real CPU
  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo) != 0) {
    *error = "hwloc_topology_init failed";
    return std::nullopt;
  }
  if (hwloc_topology_load(topo) != 0) {
    *error = "hwloc_topology_load failed for " + root;
    hwloc_topology_destroy(topo);
    return std::nullopt;
  }
  HwlocView v;
  v.all_cpus = Cpus(hwloc_topology_get_topology_cpuset(topo));
  for (hwloc_obj_t o = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_NUMANODE, nullptr); o;
       o = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_NUMANODE, o)) {
    HwlocNode n;
    n.cpus = Cpus(o->cpuset);
    n.local_memory = o->attr->numanode.local_memory;
    for (unsigned i = 1; i < o->attr->numanode.page_types_len; ++i) {
      n.hugepage_bytes +=
          o->attr->numanode.page_types[i].size * o->attr->numanode.page_types[i].count;
    }
    v.nodes[static_cast<int>(o->os_index)] = n;
  }
  unsigned nr = 1;
  hwloc_distances_s* dist = nullptr;
  if (hwloc_distances_get_by_name(topo, "NUMALatency", &nr, &dist, 0) == 0 && nr >= 1) {
    for (unsigned i = 0; i < dist->nbobjs; ++i) {
      for (unsigned j = 0; j < dist->nbobjs; ++j) {
        v.distances[static_cast<int>(dist->objs[i]->os_index)]
                   [static_cast<int>(dist->objs[j]->os_index)] =
            static_cast<int>(dist->values[i * dist->nbobjs + j]);
      }
    }
    hwloc_distances_release(topo, dist);
  }
  hwloc_topology_destroy(topo);
  return v;
}

// Every disagreement, one line each. `strict`: a value missing on either
// side is a disagreement too.
std::vector<std::string> Compare(const HwlocView& hw, const Topology& t, bool strict) {
  std::vector<std::string> bad;
  std::set<int> ours_ids, hw_ids;
  for (const auto& n : t.numa_nodes) ours_ids.insert(n.id);
  for (const auto& [id, n] : hw.nodes) hw_ids.insert(id);
  if (ours_ids != hw_ids) bad.push_back("node ids differ");

  std::set<int> our_cpus;
  for (const auto& n : t.numa_nodes) {
    auto it = hw.nodes.find(n.id);
    if (it == hw.nodes.end()) continue;
    const HwlocNode& h = it->second;
    std::string tag = "node " + std::to_string(n.id) + ": ";
    our_cpus.insert(n.cpus.begin(), n.cpus.end());
    // hwloc gives a CPU-less node the cpuset of the object it hangs under, so
    // only nodes with CPUs compare exactly; the union covers the rest.
    if (!n.cpus.empty() && n.cpus != h.cpus) bad.push_back(tag + "cpus differ");

    // hwloc >= 2.? reports MemTotal; older ones subtract the hugepages.
    if (!n.memory_bytes) {
      if (strict) bad.push_back(tag + "no memory size");
    } else if (h.local_memory != 0 || strict) {
      if (*n.memory_bytes != h.local_memory &&
          *n.memory_bytes != h.local_memory + h.hugepage_bytes) {
        bad.push_back(tag + "memory " + std::to_string(*n.memory_bytes) + " vs hwloc " +
                      std::to_string(h.local_memory) + " (+" + std::to_string(h.hugepage_bytes) +
                      " in hugepages)");
      }
    }

    auto row = hw.distances.find(n.id);
    if (hw.distances.empty() && hw.nodes.size() == 1) {
      // hwloc keeps no 1x1 matrix; the lone row must just be "local".
      if (n.distances != std::map<int, int>{{n.id, 10}}) bad.push_back(tag + "lone row not 10");
    } else if (row == hw.distances.end() || n.distances.empty()) {
      if (strict) bad.push_back(tag + "distances missing on one side");
    } else if (row->second != n.distances) {
      bad.push_back(tag + "distances differ");
    }
  }
  std::vector<int> union_cpus(our_cpus.begin(), our_cpus.end());
  if (union_cpus != hw.all_cpus) bad.push_back("the set of all cpus differs");
  return bad;
}

struct Case {
  const char* name;
  bool strict;
};

class HwlocCrossCheck : public ::testing::TestWithParam<Case> {};

TEST_P(HwlocCrossCheck, AgreesWithHwloc) {
  const Case& c = GetParam();
  // "live" is this machine itself, read through "/" by both sides.
  std::string root = std::string(c.name) == "live"
                         ? std::string("/")
                         : std::string(CXLPOOL_TOPOLOGY_FIXTURES) + "/" + c.name + "/root";
  std::string error;
  auto hw = LoadHwloc(root, &error);
  ASSERT_TRUE(hw.has_value()) << error;
  ASSERT_FALSE(hw->nodes.empty()) << "hwloc found no NUMA node in " << root;

  auto fs = MakeRootedFileSystem(root);
  Topology t;
  DiscoverMemory(*fs, &t);
  for (const auto& line : Compare(*hw, t, c.strict)) ADD_FAILURE() << c.name << ": " << line;

  // The comparison must be able to fail: perturb each fact and expect a report.
  if (c.strict) {
    for (int what = 0; what < 3; ++what) {
      Topology wrong = t;
      NumaNode& n = wrong.numa_nodes.back();
      if (what == 0) n.memory_bytes = *n.memory_bytes + 4096;
      if (what == 1) n.distances.begin()->second += 1;
      if (what == 2) wrong.numa_nodes.front().cpus.push_back(4095);
      EXPECT_FALSE(Compare(*hw, wrong, c.strict).empty()) << "perturbation " << what;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HwlocCrossCheck,
                         ::testing::Values(Case{"this-machine", true}, Case{"two-socket-cxl", true},
                                           Case{"cxl-devdax", true}, Case{"grace-hopper", true},
                                           Case{"garbled", false}, Case{"partial", false},
                                           Case{"hwloc-2i386-2c-nohugepage", true},
                                           Case{"live", true}),
                         [](const ::testing::TestParamInfo<Case>& param_info) {
                           std::string s = param_info.param.name;
                           for (auto& ch : s) {
                             if (ch == '-') ch = '_';
                           }
                           return s;
                         });

}  // namespace
}  // namespace cxlpool
