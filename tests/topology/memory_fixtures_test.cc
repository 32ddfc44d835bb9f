// DiscoverMemory on every fixture tree (tests/topology/fixtures/<name>/root,
// built by make_fixtures.py or captured), read through a rooted FileSystem.
#include <gtest/gtest.h>

#include <cstdlib>

#include "cxlpool/topology/discover.h"
#include "memory_internal.h"

namespace cxlpool {
namespace {

constexpr uint64_t kKiB = 1024, kGiB = 1ull << 30;

std::string FixtureRoot(const std::string& name) {
  return std::string(CXLPOOL_TOPOLOGY_FIXTURES) + "/" + name + "/root";
}

Topology Discover(const std::string& name) {
  auto fs = MakeRootedFileSystem(FixtureRoot(name));
  Topology t;
  DiscoverMemory(*fs, &t);
  return t;
}

std::string AllWarnings(const Topology& t) {
  std::string out;
  for (const auto& w : t.warnings) out += "  " + w + "\n";
  return out;
}

bool HasWarning(const Topology& t, const std::string& needle) {
  for (const auto& w : t.warnings) {
    if (w.find(needle) != std::string::npos) return true;
  }
  return false;
}

const DaxDevice* FindDax(const Topology& t, const std::string& name) {
  for (const auto& d : t.dax_devices) {
    if (d.name == name) return &d;
  }
  return nullptr;
}

std::vector<int> Range(int lo, int hi) {
  std::vector<int> v;
  for (int i = lo; i <= hi; ++i) v.push_back(i);
  return v;
}

TEST(FixtureTwoSocketCxl, NodesCpusMemoryDistances) {
  Topology t = Discover("two-socket-cxl");
  EXPECT_TRUE(t.warnings.empty()) << AllWarnings(t);
  ASSERT_EQ(t.numa_nodes.size(), 3u);
  auto cpus0 = Range(0, 7), more0 = Range(16, 23);
  cpus0.insert(cpus0.end(), more0.begin(), more0.end());
  auto cpus1 = Range(8, 15), more1 = Range(24, 31);
  cpus1.insert(cpus1.end(), more1.begin(), more1.end());
  const NumaNode& n0 = *t.FindNode(0);
  const NumaNode& n1 = *t.FindNode(1);
  const NumaNode& n2 = *t.FindNode(2);
  EXPECT_EQ(n0.cpus, cpus0);
  EXPECT_EQ(n1.cpus, cpus1);
  EXPECT_TRUE(n2.cpus.empty());
  EXPECT_EQ(n0.memory_bytes, 33247232 * kKiB);
  EXPECT_EQ(n0.free_bytes, 30146560 * kKiB);
  EXPECT_EQ(n2.memory_bytes, 16 * kGiB);
  EXPECT_EQ(n0.distances, (std::map<int, int>{{0, 10}, {1, 21}, {2, 24}}));
  EXPECT_EQ(n2.distances, (std::map<int, int>{{0, 24}, {1, 28}, {2, 10}}));
  EXPECT_EQ(n0.hugepages_2m_total, 512u);
  EXPECT_EQ(n0.hugepages_2m_free, 500u);
  EXPECT_EQ(n0.hugepages_1g_total, 4u);
  EXPECT_EQ(n0.hugepages_1g_free, 4u);
  EXPECT_EQ(n2.hugepages_1g_total, 0u);
}

TEST(FixtureTwoSocketCxl, TiersZonesHmat) {
  Topology t = Discover("two-socket-cxl");
  ASSERT_EQ(t.memory_tiers.size(), 2u);
  EXPECT_EQ(t.memory_tiers[0].id, 4);
  EXPECT_EQ(t.memory_tiers[0].nodes, (std::vector<int>{0, 1}));
  EXPECT_EQ(t.memory_tiers[1].id, 22);
  EXPECT_EQ(t.memory_tiers[1].nodes, (std::vector<int>{2}));
  EXPECT_EQ(t.FindNode(0)->memory_tier, 4);
  EXPECT_EQ(t.FindNode(2)->memory_tier, 22);
  EXPECT_EQ(t.FindNode(0)->zone, "Normal");  // 14 Normal blocks beat 2 DMA32
  EXPECT_EQ(t.FindNode(1)->zone, "Normal");
  EXPECT_EQ(t.FindNode(2)->zone, "Movable");
  const NumaNode& n2 = *t.FindNode(2);
  ASSERT_EQ(n2.access.size(), 2u);
  for (int k = 0; k < 2; ++k) {
    const AccessClass& ac = n2.access[k];
    EXPECT_EQ(ac.access_class, k);
    EXPECT_EQ(ac.initiators, std::vector<int>{0});
    EXPECT_EQ(ac.read_bandwidth_mbps, 65536u);
    EXPECT_EQ(ac.write_bandwidth_mbps, 49152u);
    EXPECT_EQ(ac.read_latency_ns, 270u);
    EXPECT_EQ(ac.write_latency_ns, 290u);
  }
  EXPECT_EQ(t.FindNode(1)->access.at(1).initiators, std::vector<int>{1});
  EXPECT_EQ(t.FindNode(1)->access.at(1).read_bandwidth_mbps, 262144u);
}

TEST(FixtureTwoSocketCxl, DaxCxlChainAndKinds) {
  Topology t = Discover("two-socket-cxl");
  ASSERT_EQ(t.dax_devices.size(), 1u);
  const DaxDevice& d = t.dax_devices[0];
  EXPECT_EQ(d.name, "dax0.0");
  EXPECT_EQ(d.size_bytes, 16 * kGiB);
  EXPECT_EQ(d.target_node, 2);
  EXPECT_EQ(d.mode, "system-ram");
  EXPECT_EQ(d.source, "cxl");
  EXPECT_EQ(d.region, "dax_region0");
  EXPECT_EQ(d.dynamic, true);
  EXPECT_EQ(d.align_bytes, 2u << 20);
  ASSERT_EQ(t.cxl_memdevs.size(), 1u);
  EXPECT_EQ(t.cxl_memdevs[0].name, "mem0");
  EXPECT_EQ(t.cxl_memdevs[0].serial, 0x4D2u);
  EXPECT_EQ(t.cxl_memdevs[0].ram_bytes, 16 * kGiB);
  EXPECT_EQ(t.cxl_memdevs[0].pmem_bytes, 0u);
  EXPECT_EQ(t.cxl_memdevs[0].numa_node, 0);
  ASSERT_EQ(t.cxl_regions.size(), 1u);
  const CxlRegion& r = t.cxl_regions[0];
  EXPECT_EQ(r.name, "region0");
  EXPECT_EQ(r.size_bytes, 16 * kGiB);
  EXPECT_EQ(r.type, "ram");
  EXPECT_EQ(r.memdevs, std::vector<std::string>{"mem0"});
  EXPECT_EQ(r.dax_devices, std::vector<std::string>{"dax0.0"});
  EXPECT_EQ(r.numa_nodes, std::vector<int>{2});
  EXPECT_EQ(t.FindNode(0)->kind, NodeKind::kDram);
  EXPECT_EQ(t.FindNode(1)->kind, NodeKind::kDram);
  EXPECT_EQ(t.FindNode(2)->kind, NodeKind::kCxl);
  EXPECT_NE(t.FindNode(2)->kind_reason.find("CXL region region0 via dax0.0"), std::string::npos)
      << t.FindNode(2)->kind_reason;
}

TEST(FixtureCxlDevdax, RegionsDaxModesAndKinds) {
  Topology t = Discover("cxl-devdax");
  EXPECT_TRUE(t.warnings.empty()) << AllWarnings(t);
  ASSERT_EQ(t.numa_nodes.size(), 2u);
  EXPECT_EQ(t.numa_nodes[0].id, 0);
  EXPECT_EQ(t.numa_nodes[1].id, 2);  // ids need not be contiguous
  EXPECT_EQ(t.FindNode(2)->distances, (std::map<int, int>{{0, 17}, {2, 10}}));
  EXPECT_EQ(t.FindNode(2)->zone, "Normal");
  EXPECT_EQ(t.FindNode(2)->memory_tier, 20);

  ASSERT_EQ(t.dax_devices.size(), 3u);
  const DaxDevice* d0 = FindDax(t, "dax0.0");
  ASSERT_NE(d0, nullptr);
  EXPECT_EQ(d0->mode, "devdax");
  EXPECT_EQ(d0->source, "cxl");
  EXPECT_EQ(d0->target_node, 1);
  EXPECT_EQ(d0->dynamic, true);
  EXPECT_EQ(d0->align_bytes, kGiB);
  const DaxDevice* d2 = FindDax(t, "dax2.0");
  ASSERT_NE(d2, nullptr);
  EXPECT_EQ(d2->mode, "devdax");
  EXPECT_EQ(d2->source, "cxl");  // CXL pmem, reached through the nvdimm bridge
  EXPECT_EQ(d2->region, "dax_region2");
  EXPECT_EQ(d2->dynamic, false);
  const DaxDevice* d3 = FindDax(t, "dax3.0");
  ASSERT_NE(d3, nullptr);
  EXPECT_EQ(d3->mode, "system-ram");
  EXPECT_EQ(d3->source, "nvdimm");
  EXPECT_EQ(d3->dynamic, false);
  EXPECT_EQ(d3->target_node, 2);

  ASSERT_EQ(t.cxl_memdevs.size(), 2u);
  EXPECT_EQ(t.cxl_memdevs[1].name, "mem1");
  EXPECT_EQ(t.cxl_memdevs[1].ram_bytes, 0u);
  EXPECT_EQ(t.cxl_memdevs[1].pmem_bytes, 16 * kGiB);
  ASSERT_EQ(t.cxl_regions.size(), 2u);
  EXPECT_EQ(t.cxl_regions[0].type, "ram");
  EXPECT_EQ(t.cxl_regions[0].memdevs, std::vector<std::string>{"mem0"});
  EXPECT_EQ(t.cxl_regions[0].dax_devices, std::vector<std::string>{"dax0.0"});
  EXPECT_TRUE(t.cxl_regions[0].numa_nodes.empty());  // devdax: memory in no node
  EXPECT_EQ(t.cxl_regions[1].type, "pmem");
  EXPECT_EQ(t.cxl_regions[1].memdevs, std::vector<std::string>{"mem1"});
  EXPECT_EQ(t.cxl_regions[1].dax_devices, std::vector<std::string>{"dax2.0"});
  EXPECT_TRUE(t.cxl_regions[1].numa_nodes.empty());

  EXPECT_EQ(t.FindNode(0)->kind, NodeKind::kDram);
  EXPECT_EQ(t.FindNode(2)->kind, NodeKind::kNvm);
}

TEST(FixtureGraceHopper, CpuLessHbmNode) {
  Topology t = Discover("grace-hopper");
  EXPECT_TRUE(t.warnings.empty()) << AllWarnings(t);
  ASSERT_EQ(t.numa_nodes.size(), 2u);
  EXPECT_EQ(t.FindNode(0)->cpus, Range(0, 71));
  EXPECT_EQ(t.FindNode(0)->kind, NodeKind::kDram);
  const NumaNode& n1 = *t.FindNode(1);
  EXPECT_TRUE(n1.cpus.empty());
  EXPECT_EQ(n1.memory_bytes, 99614720 * kKiB);
  EXPECT_EQ(n1.zone, "Movable");
  EXPECT_EQ(n1.distances, (std::map<int, int>{{0, 80}, {1, 10}}));
  // Memory side alone cannot tell GPU memory; DiscoverGpus turns it into gpu.
  EXPECT_EQ(n1.kind, NodeKind::kUnknown);
  // 64K-page kernel: 2M hugepages exist, 1G do not (512M instead).
  EXPECT_EQ(t.FindNode(0)->hugepages_2m_total, 0u);
  EXPECT_FALSE(t.FindNode(0)->hugepages_1g_total.has_value());
  EXPECT_TRUE(t.dax_devices.empty());
  EXPECT_TRUE(t.cxl_regions.empty());
}

TEST(FixtureGarbled, WarnsAndKeepsWhatItCan) {
  Topology t = Discover("garbled");
  ASSERT_EQ(t.numa_nodes.size(), 2u);
  const NumaNode& n0 = *t.FindNode(0);
  const NumaNode& n1 = *t.FindNode(1);
  // cpulist is junk; the same set comes from cpumap.
  EXPECT_EQ(n0.cpus, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_TRUE(HasWarning(t, "node0/cpulist: bad list")) << AllWarnings(t);
  EXPECT_TRUE(HasWarning(t, "cpus taken from cpumap"));
  EXPECT_EQ(n0.memory_bytes, 8126464 * kKiB);
  EXPECT_TRUE(n0.distances.empty());
  EXPECT_TRUE(HasWarning(t, "node0/distance: bad distance 'abc'"));
  EXPECT_FALSE(n0.hugepages_2m_total.has_value());
  EXPECT_TRUE(HasWarning(t, "nr_hugepages: not an integer: 'NaN'"));
  EXPECT_EQ(n0.kind, NodeKind::kDram);

  EXPECT_FALSE(n1.memory_bytes.has_value());
  EXPECT_TRUE(HasWarning(t, "node1/meminfo: no parsable MemTotal line ('\\x00\\xff"))
      << AllWarnings(t);
  EXPECT_TRUE(n1.distances.empty());
  EXPECT_TRUE(HasWarning(t, "node1/distance: distance row has 3 values for 2 online nodes"));
  ASSERT_EQ(n1.access.size(), 1u);
  EXPECT_EQ(n1.access[0].initiators, std::vector<int>{0});
  EXPECT_FALSE(n1.access[0].read_bandwidth_mbps.has_value());
  EXPECT_EQ(n1.access[0].write_bandwidth_mbps, 50000u);
  EXPECT_FALSE(n1.access[0].read_latency_ns.has_value());
  EXPECT_TRUE(HasWarning(t, "read_latency: not an integer: ''"));
  EXPECT_TRUE(HasWarning(t, "node7: dangling initiator link"));
  EXPECT_EQ(n1.zone, "Movable");
  EXPECT_TRUE(HasWarning(t, "node1: 1 of 3 memory blocks unreadable"));
  EXPECT_EQ(n1.memory_tier, 22);
  EXPECT_TRUE(HasWarning(t, "memory_tier4/nodelist: bad list 'garbage'"));
  EXPECT_EQ(n1.kind, NodeKind::kUnknown);

  EXPECT_TRUE(HasWarning(t, "/sys/bus/dax/devices/dax9.9: dangling"));
  ASSERT_EQ(t.dax_devices.size(), 1u);
  const DaxDevice& d = t.dax_devices[0];
  EXPECT_FALSE(d.size_bytes.has_value());
  EXPECT_FALSE(d.target_node.has_value());
  EXPECT_FALSE(d.align_bytes.has_value());
  EXPECT_FALSE(d.mode.has_value());
  EXPECT_TRUE(HasWarning(t, "bound to unexpected driver 'weird_driver'"));
  EXPECT_EQ(d.source, "hmem");

  ASSERT_EQ(t.cxl_memdevs.size(), 1u);
  EXPECT_FALSE(t.cxl_memdevs[0].serial.has_value());
  EXPECT_FALSE(t.cxl_memdevs[0].ram_bytes.has_value());
  EXPECT_FALSE(t.cxl_memdevs[0].pmem_bytes.has_value());
  EXPECT_FALSE(t.cxl_memdevs[0].numa_node.has_value());
  EXPECT_TRUE(HasWarning(t, "mem0/pmem/size: missing"));
  EXPECT_TRUE(HasWarning(t, "mem0/numa_node: not a node id: '-7'"));
  ASSERT_EQ(t.cxl_regions.size(), 1u);  // region1 is a dangling link
  EXPECT_TRUE(HasWarning(t, "/sys/bus/cxl/devices/region1: dangling"));
  EXPECT_FALSE(t.cxl_regions[0].size_bytes.has_value());
  EXPECT_FALSE(t.cxl_regions[0].type.has_value());
  EXPECT_TRUE(t.cxl_regions[0].memdevs.empty());
  EXPECT_TRUE(HasWarning(t, "mode: unexpected mode 'sideways'"));
  EXPECT_TRUE(HasWarning(t, "decoder 'decoder9.9' not found"));
  EXPECT_TRUE(HasWarning(t, "not a decoder name 'not a decoder'"));
  for (const auto& w : t.warnings) {
    EXPECT_TRUE(w.rfind("/sys/", 0) == 0 || w.rfind("/proc/", 0) == 0) << w;
    for (char c : w) EXPECT_TRUE(c >= 0x20 && c < 0x7f) << "unprintable in: " << w;
  }
}

TEST(FixturePartial, MissingFilesGivePartialTopology) {
  Topology t = Discover("partial");
  ASSERT_EQ(t.numa_nodes.size(), 3u);
  EXPECT_FALSE(t.FindNode(1)->memory_bytes.has_value());
  EXPECT_EQ(t.FindNode(1)->cpus, (std::vector<int>{2, 3}));
  EXPECT_TRUE(t.FindNode(2)->distances.empty());
  EXPECT_EQ(t.FindNode(0)->distances.size(), 3u);
  EXPECT_EQ(t.warnings.size(), 2u) << AllWarnings(t);
  EXPECT_TRUE(HasWarning(t, "node1/meminfo: missing"));
  EXPECT_TRUE(HasWarning(t, "node2/distance: missing"));
  // No memory blocks in this tree: zones come from /proc/zoneinfo.
  EXPECT_EQ(t.FindNode(0)->zone, "Normal");
  EXPECT_EQ(t.FindNode(2)->zone, "Movable");
  EXPECT_TRUE(t.memory_tiers.empty());
  EXPECT_FALSE(t.FindNode(0)->memory_tier.has_value());
  EXPECT_TRUE(t.dax_devices.empty());
  EXPECT_TRUE(t.cxl_memdevs.empty());
  EXPECT_FALSE(t.FindNode(0)->hugepages_2m_total.has_value());
  EXPECT_EQ(t.FindNode(0)->kind, NodeKind::kDram);
  EXPECT_EQ(t.FindNode(1)->kind, NodeKind::kDram);
  EXPECT_EQ(t.FindNode(2)->kind, NodeKind::kUnknown);
}

TEST(FixtureThisMachine, CapturedTreeReadsCleanly) {
  Topology t = Discover("this-machine");
  EXPECT_TRUE(t.warnings.empty()) << AllWarnings(t);
  ASSERT_FALSE(t.numa_nodes.empty());
  size_t cpus = 0;
  for (const auto& n : t.numa_nodes) {
    cpus += n.cpus.size();
    ASSERT_TRUE(n.memory_bytes.has_value()) << "node " << n.id;
    EXPECT_FALSE(n.distances.empty()) << "node " << n.id;
    EXPECT_FALSE(n.kind_reason.empty());
    if (!n.cpus.empty()) {
      EXPECT_EQ(n.kind, NodeKind::kDram);
    }
    if (*n.memory_bytes > 0) {
      EXPECT_TRUE(n.zone.has_value()) << "node " << n.id;
    }
  }
  EXPECT_GT(cpus, 0u);
}

}  // namespace
}  // namespace cxlpool
