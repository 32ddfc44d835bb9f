// DiscoverMemory and its passes on a FakeFileSystem (fails closed), with
// fault injection, plus the node-kind rules on hand-built topologies.
#include <gtest/gtest.h>

#include "cxlpool/topology/discover.h"
#include "memory_internal.h"

namespace cxlpool::memory_internal {
namespace {

bool HasWarning(const Topology& t, const std::string& needle) {
  for (const auto& w : t.warnings) {
    if (w.find(needle) != std::string::npos) return true;
  }
  return false;
}

std::string AllWarnings(const Topology& t) {
  std::string out;
  for (const auto& w : t.warnings) out += "  " + w + "\n";
  return out;
}

// Two nodes: node0 with CPUs 0-3, node1 CPU-less; one memory block each.
void AddTwoNodes(FakeFileSystem* fs) {
  const std::string n = "/sys/devices/system/node";
  fs->AddFile(n + "/online", "0-1\n");
  fs->AddFile(n + "/has_cpu", "0\n");
  fs->AddFile(n + "/node0/cpulist", "0-3\n");
  fs->AddFile(n + "/node0/meminfo", "Node 0 MemTotal:  8388608 kB\nNode 0 MemFree:   4194304 kB\n");
  fs->AddFile(n + "/node0/distance", "10 20\n");
  fs->AddFile(n + "/node1/cpulist", "\n");
  fs->AddFile(n + "/node1/meminfo", "Node 1 MemTotal:  2097152 kB\nNode 1 MemFree:   2097152 kB\n");
  fs->AddFile(n + "/node1/distance", "20 10\n");
  fs->AddSymlink(n + "/node0/memory0", "../../memory/memory0");
  fs->AddFile("/sys/devices/system/memory/memory0/state", "online\n");
  fs->AddFile("/sys/devices/system/memory/memory0/valid_zones", "Normal\n");
  fs->AddSymlink(n + "/node1/memory8", "../../memory/memory8");
  fs->AddFile("/sys/devices/system/memory/memory8/state", "online\n");
  fs->AddFile("/sys/devices/system/memory/memory8/valid_zones", "Movable\n");
}

TEST(DiscoverMemoryFake, TwoNodesBasics) {
  FakeFileSystem fs;
  AddTwoNodes(&fs);
  Topology t;
  DiscoverMemory(fs, &t);
  ASSERT_EQ(t.numa_nodes.size(), 2u) << AllWarnings(t);
  EXPECT_TRUE(t.warnings.empty()) << AllWarnings(t);
  const NumaNode* n0 = t.FindNode(0);
  ASSERT_NE(n0, nullptr);
  EXPECT_EQ(n0->cpus, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(n0->memory_bytes, 8ull << 30);
  EXPECT_EQ(n0->free_bytes, 4ull << 30);
  EXPECT_EQ(n0->distances, (std::map<int, int>{{0, 10}, {1, 20}}));
  EXPECT_EQ(n0->zone, "Normal");
  EXPECT_EQ(n0->kind, NodeKind::kDram);
  const NumaNode* n1 = t.FindNode(1);
  ASSERT_NE(n1, nullptr);
  EXPECT_TRUE(n1->cpus.empty());
  EXPECT_EQ(n1->zone, "Movable");
  EXPECT_EQ(n1->kind, NodeKind::kUnknown);
  EXPECT_FALSE(n1->kind_reason.empty());
  EXPECT_FALSE(n1->hugepages_2m_total.has_value());
  EXPECT_TRUE(n1->access.empty());
}

TEST(DiscoverMemoryFake, PermissionDeniedMeminfoKeepsTheRest) {
  FakeFileSystem fs;
  AddTwoNodes(&fs);
  fs.FailPath("/sys/devices/system/node/node0/meminfo",
              Status(Code::kPermissionDenied, "open: Permission denied"));
  Topology t;
  DiscoverMemory(fs, &t);
  ASSERT_EQ(t.numa_nodes.size(), 2u);
  EXPECT_FALSE(t.numa_nodes[0].memory_bytes.has_value());
  EXPECT_EQ(t.numa_nodes[0].cpus.size(), 4u);
  EXPECT_EQ(t.numa_nodes[0].distances.size(), 2u);
  EXPECT_TRUE(HasWarning(t, "node0/meminfo: PERMISSION_DENIED")) << AllWarnings(t);
  EXPECT_EQ(t.numa_nodes[1].memory_bytes, 2ull << 30);
}

TEST(DiscoverMemoryFake, IoErrorsOnBusDirectoriesAreWarnings) {
  FakeFileSystem fs;
  AddTwoNodes(&fs);
  fs.FailPath("/sys/bus/dax/devices", Status(Code::kIo, "EIO"));
  fs.FailPath("/sys/bus/cxl/devices", Status(Code::kIo, "EIO"));
  fs.FailPath("/sys/devices/virtual/memory_tiering", Status(Code::kIo, "EIO"));
  Topology t;
  DiscoverMemory(fs, &t);
  EXPECT_EQ(t.numa_nodes.size(), 2u);
  EXPECT_TRUE(HasWarning(t, "/sys/bus/dax/devices: IO")) << AllWarnings(t);
  EXPECT_TRUE(HasWarning(t, "/sys/bus/cxl/devices: IO")) << AllWarnings(t);
  EXPECT_TRUE(HasWarning(t, "/sys/devices/virtual/memory_tiering: IO")) << AllWarnings(t);
}

TEST(DiscoverMemoryFake, OnlineNodeWithoutDirectoryIsSkipped) {
  FakeFileSystem fs;
  AddTwoNodes(&fs);
  fs.AddFile("/sys/devices/system/node/online", "0-2\n");
  Topology t;
  DiscoverMemory(fs, &t);
  EXPECT_EQ(t.numa_nodes.size(), 2u);
  EXPECT_TRUE(HasWarning(t, "node 2 is online but")) << AllWarnings(t);
  // The SLIT rows have 2 values but 3 nodes are online: rejected, not misread.
  EXPECT_TRUE(t.numa_nodes[0].distances.empty());
}

TEST(DiscoverMemoryFake, NoNumaDirectoryMeansOneNode) {
  FakeFileSystem fs;
  fs.AddFile("/sys/devices/system/cpu/online", "0-7\n");
  fs.AddFile("/proc/meminfo", "MemTotal:  1048576 kB\nMemFree: 524288 kB\n");
  Topology t;
  DiscoverMemory(fs, &t);
  ASSERT_EQ(t.numa_nodes.size(), 1u);
  EXPECT_EQ(t.numa_nodes[0].id, 0);
  EXPECT_EQ(t.numa_nodes[0].cpus.size(), 8u);
  EXPECT_EQ(t.numa_nodes[0].memory_bytes, 1ull << 30);
  EXPECT_EQ(t.numa_nodes[0].kind, NodeKind::kDram);
  EXPECT_TRUE(HasWarning(t, "assuming a single NUMA node")) << AllWarnings(t);
}

// An old kernel without NUMA in sysfs and without cpu/online (hwloc's
// 2i386-2c-nohugepage capture): the one node 0 holds every CPU (the cpuN
// directories) and all of /proc/meminfo, and is DRAM.
TEST(DiscoverMemoryFake, NoNumaNoCpuOnlineTakesCpuDirectories) {
  FakeFileSystem fs;
  fs.AddFile("/sys/devices/system/cpu/cpu0/topology/core_id", "0\n");
  fs.AddFile("/sys/devices/system/cpu/cpu1/online", "1\n");
  fs.AddFile("/sys/devices/system/cpu/cpu2/online", "0\n");  // offline
  fs.AddDir("/sys/devices/system/cpu/cpuidle");
  fs.AddFile("/proc/meminfo", "MemTotal:      2075428 kB\nMemFree:       1771036 kB\n");
  Topology t;
  DiscoverMemory(fs, &t);
  ASSERT_EQ(t.numa_nodes.size(), 1u);
  const NumaNode& n = t.numa_nodes[0];
  EXPECT_EQ(n.id, 0);
  EXPECT_EQ(n.cpus, (std::vector<int>{0, 1}));
  EXPECT_EQ(n.memory_bytes, 2075428ull * 1024);
  EXPECT_EQ(n.free_bytes, 1771036ull * 1024);
  EXPECT_EQ(n.kind, NodeKind::kDram) << n.kind_reason;
  EXPECT_NE(n.kind_reason.find("the only node"), std::string::npos) << n.kind_reason;
  EXPECT_FALSE(n.backing_unidentified);
  EXPECT_EQ(NotPooledReason(n), std::nullopt);
  EXPECT_EQ(NoMemorySizeKnown(t), std::nullopt);
}

TEST(DiscoverMemoryFake, NoNumaCpusFromCpuinfoElseStillDram) {
  FakeFileSystem fs;
  fs.AddFile("/proc/cpuinfo", "processor\t: 0\n\nprocessor\t: 1\n");
  fs.AddFile("/proc/meminfo", "MemTotal:  1048576 kB\n");
  Topology t;
  DiscoverMemory(fs, &t);
  ASSERT_EQ(t.numa_nodes.size(), 1u);
  EXPECT_EQ(t.numa_nodes[0].cpus, (std::vector<int>{0, 1}));
  EXPECT_EQ(t.numa_nodes[0].kind, NodeKind::kDram);

  // No CPU found anywhere: still the machine's memory, and said so.
  FakeFileSystem bare;
  bare.AddFile("/proc/meminfo", "MemTotal:  1048576 kB\n");
  Topology u;
  DiscoverMemory(bare, &u);
  ASSERT_EQ(u.numa_nodes.size(), 1u);
  EXPECT_TRUE(u.numa_nodes[0].cpus.empty());
  EXPECT_EQ(u.numa_nodes[0].kind, NodeKind::kDram) << u.numa_nodes[0].kind_reason;
  EXPECT_EQ(NotPooledReason(u.numa_nodes[0]), std::nullopt);
  EXPECT_TRUE(HasWarning(u, "no CPUs found")) << AllWarnings(u);
}

// The PS3 capture: no NUMA and no /proc/meminfo. Nothing is known to pool,
// and NoMemorySizeKnown says why (the daemon refuses to start on it).
TEST(DiscoverMemoryFake, NoNumaNoMeminfoIsNoMemorySizeKnown) {
  FakeFileSystem fs;
  fs.AddFile("/sys/devices/system/cpu/online", "0-1\n");
  Topology t;
  DiscoverMemory(fs, &t);
  ASSERT_EQ(t.numa_nodes.size(), 1u);
  EXPECT_EQ(t.numa_nodes[0].memory_bytes, std::nullopt);
  EXPECT_TRUE(HasWarning(t, "/proc/meminfo: missing")) << AllWarnings(t);
  auto why = NoMemorySizeKnown(t);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("/proc/meminfo has no MemTotal"), std::string::npos) << *why;

  fs.AddFile("/proc/meminfo", "Buffers: 4 kB\n");  // present, but no MemTotal
  Topology g;
  DiscoverMemory(fs, &g);
  EXPECT_TRUE(HasWarning(g, "/proc/meminfo: no parsable MemTotal")) << AllWarnings(g);
  EXPECT_TRUE(NoMemorySizeKnown(g).has_value());
  EXPECT_TRUE(NoMemorySizeKnown(Topology{}).has_value());
}

TEST(DiscoverMemoryFake, ZoneSkipsOfflineAndStraddlingBlocks) {
  FakeFileSystem fs;
  AddTwoNodes(&fs);
  const std::string n = "/sys/devices/system/node/node0";
  const std::string m = "/sys/devices/system/memory";
  // Two offline blocks that could go Movable, one straddling ("none"), and an
  // old-kernel line listing the current zone first.
  for (int b : {1, 2}) {
    fs.AddSymlink(n + "/memory" + std::to_string(b), "../../memory/memory" + std::to_string(b));
    fs.AddFile(m + "/memory" + std::to_string(b) + "/state", "offline\n");
    fs.AddFile(m + "/memory" + std::to_string(b) + "/valid_zones", "Movable\n");
  }
  fs.AddSymlink(n + "/memory3", "../../memory/memory3");
  fs.AddFile(m + "/memory3/state", "online\n");
  fs.AddFile(m + "/memory3/valid_zones", "none\n");
  fs.AddSymlink(n + "/memory4", "../../memory/memory4");
  fs.AddFile(m + "/memory4/state", "online\n");
  fs.AddFile(m + "/memory4/valid_zones", "Normal Movable\n");
  Topology t;
  DiscoverMemory(fs, &t);
  EXPECT_EQ(t.FindNode(0)->zone, "Normal") << AllWarnings(t);
  EXPECT_TRUE(t.warnings.empty()) << AllWarnings(t);
}

TEST(DiscoverMemoryFake, ZoneFallsBackToZoneinfo) {
  FakeFileSystem fs;
  AddTwoNodes(&fs);
  fs.FailPath("/sys/devices/system/memory/memory8/state", Status(Code::kIo, "EIO"));
  fs.AddFile("/proc/zoneinfo",
             "Node 1, zone   Normal\n  managed 10\nNode 1, zone  Movable\n  managed 500\n");
  Topology t;
  DiscoverMemory(fs, &t);
  EXPECT_EQ(t.FindNode(1)->zone, "Movable");
  EXPECT_TRUE(HasWarning(t, "1 of 1 memory blocks unreadable")) << AllWarnings(t);
}

TEST(DiscoverMemoryFake, HmatAccessClassesAndDanglingInitiator) {
  FakeFileSystem fs;
  AddTwoNodes(&fs);
  const std::string a = "/sys/devices/system/node/node1/access1/initiators";
  fs.AddSymlink(a + "/node0", "../../../node0");
  fs.AddSymlink(a + "/node5", "../../../node5");  // no such node
  fs.AddFile(a + "/read_bandwidth", "30000\n");
  fs.AddFile(a + "/write_bandwidth", "garbage\n");
  fs.AddFile(a + "/read_latency", "250\n");
  Topology t;
  DiscoverMemory(fs, &t);
  const NumaNode* n1 = t.FindNode(1);
  ASSERT_EQ(n1->access.size(), 1u);
  const AccessClass& ac = n1->access[0];
  EXPECT_EQ(ac.access_class, 1);
  EXPECT_EQ(ac.initiators, std::vector<int>{0});
  EXPECT_EQ(ac.read_bandwidth_mbps, 30000u);
  EXPECT_FALSE(ac.write_bandwidth_mbps.has_value());
  EXPECT_EQ(ac.read_latency_ns, 250u);
  EXPECT_FALSE(ac.write_latency_ns.has_value());  // absent: no warning
  EXPECT_TRUE(HasWarning(t, "write_bandwidth: not an integer")) << AllWarnings(t);
  EXPECT_TRUE(HasWarning(t, "node5: dangling initiator link")) << AllWarnings(t);
  EXPECT_EQ(t.warnings.size(), 2u) << AllWarnings(t);
}

// A CXL RAM region with one memdev and a kmem DAX device, as the kernel lays
// it out, in a fake tree.
void AddCxlRegion(FakeFileSystem* fs, bool with_uport = true) {
  const std::string root = "/sys/devices/platform/ACPI0017:00/root0";
  const std::string mem = "/sys/devices/pci0000:35/0000:35:01.0/0000:36:00.0/mem0";
  fs->AddFile(mem + "/serial", "0x10\n");
  fs->AddFile(mem + "/ram/size", "0x80000000\n");
  fs->AddFile(mem + "/pmem/size", "0x0\n");
  fs->AddFile(mem + "/numa_node", "-1\n");
  fs->AddSymlink("/sys/bus/cxl/devices/mem0",
                 "../../../devices/pci0000:35/0000:35:01.0/0000:36:00.0/mem0");
  if (with_uport) {
    fs->AddSymlink(root + "/port1/endpoint2/uport",
                   "../../../../../pci0000:35/0000:35:01.0/0000:36:00.0/mem0");
  }
  fs->AddFile(root + "/port1/endpoint2/decoder2.0/mode", "ram\n");
  fs->AddSymlink("/sys/bus/cxl/devices/decoder2.0",
                 "../../../devices/platform/ACPI0017:00/root0/port1/endpoint2/decoder2.0");
  const std::string region = root + "/decoder0.0/region0";
  fs->AddFile(region + "/size", "0x80000000\n");
  fs->AddFile(region + "/target0", "decoder2.0\n");
  fs->AddSymlink("/sys/bus/cxl/devices/region0",
                 "../../../devices/platform/ACPI0017:00/root0/decoder0.0/region0");
  const std::string dax = region + "/dax_region0/dax0.0";
  fs->AddFile(region + "/dax_region0/dax_region/id", "0\n");
  fs->AddFile(region + "/dax_region0/dax_region/create", "");
  fs->AddFile(dax + "/size", "2147483648\n");
  fs->AddFile(dax + "/target_node", "1\n");
  fs->AddSymlink(dax + "/driver", "../../../../../../../bus/dax/drivers/kmem");
  fs->AddSymlink("/sys/bus/dax/devices/dax0.0",
                 "../../../devices/platform/ACPI0017:00/root0/decoder0.0/region0/"
                 "dax_region0/dax0.0");
}

TEST(DiscoverMemoryFake, CxlRegionChainMakesNodeCxl) {
  FakeFileSystem fs;
  AddTwoNodes(&fs);
  AddCxlRegion(&fs);
  Topology t;
  DiscoverMemory(fs, &t);
  ASSERT_EQ(t.cxl_memdevs.size(), 1u) << AllWarnings(t);
  EXPECT_EQ(t.cxl_memdevs[0].serial, 16u);
  EXPECT_EQ(t.cxl_memdevs[0].ram_bytes, 2ull << 30);
  EXPECT_EQ(t.cxl_memdevs[0].pmem_bytes, 0u);
  EXPECT_FALSE(t.cxl_memdevs[0].numa_node.has_value());
  ASSERT_EQ(t.cxl_regions.size(), 1u);
  const CxlRegion& r = t.cxl_regions[0];
  EXPECT_EQ(r.type, "ram");  // no 'mode' file (kernel < 6.3): from dax_region0
  EXPECT_EQ(r.memdevs, std::vector<std::string>{"mem0"});
  EXPECT_EQ(r.dax_devices, std::vector<std::string>{"dax0.0"});
  EXPECT_EQ(r.numa_nodes, std::vector<int>{1});
  ASSERT_EQ(t.dax_devices.size(), 1u);
  EXPECT_EQ(t.dax_devices[0].mode, "system-ram");
  EXPECT_EQ(t.dax_devices[0].source, "cxl");
  EXPECT_EQ(t.dax_devices[0].region, "dax_region0");
  EXPECT_EQ(t.dax_devices[0].dynamic, true);
  EXPECT_EQ(t.FindNode(1)->kind, NodeKind::kCxl);
  EXPECT_NE(t.FindNode(1)->kind_reason.find("region0"), std::string::npos);
  EXPECT_TRUE(t.warnings.empty()) << AllWarnings(t);
}

TEST(DiscoverMemoryFake, BrokenDecoderChainIsAWarning) {
  FakeFileSystem fs;
  AddTwoNodes(&fs);
  AddCxlRegion(&fs, /*with_uport=*/false);
  fs.AddFile("/sys/devices/platform/ACPI0017:00/root0/decoder0.0/region0/target1", "decoder7.0");
  Topology t;
  DiscoverMemory(fs, &t);
  ASSERT_EQ(t.cxl_regions.size(), 1u);
  EXPECT_TRUE(t.cxl_regions[0].memdevs.empty());
  EXPECT_TRUE(HasWarning(t, "decoder 'decoder7.0' not found")) << AllWarnings(t);
  EXPECT_TRUE(HasWarning(t, "cannot name the memdev behind decoder2.0")) << AllWarnings(t);
  // The DAX side does not depend on the memdev chain.
  EXPECT_EQ(t.cxl_regions[0].numa_nodes, std::vector<int>{1});
}

// ---- kind rules on hand-built topologies ---------------------------------------

Topology HmemTopology(std::optional<uint64_t> dram_bw, std::optional<uint64_t> hmem_bw) {
  Topology t;
  NumaNode cpu;
  cpu.id = 0;
  cpu.cpus = {0, 1};
  if (dram_bw) cpu.access.push_back(AccessClass{1, {0}, dram_bw, {}, {}, {}});
  NumaNode mem;
  mem.id = 1;
  mem.memory_bytes = 1ull << 30;
  if (hmem_bw) mem.access.push_back(AccessClass{1, {0}, hmem_bw, {}, {}, {}});
  t.numa_nodes = {cpu, mem};
  DaxDevice d;
  d.name = "dax1.0";
  d.mode = "system-ram";
  d.source = "hmem";
  d.target_node = 1;
  t.dax_devices = {d};
  return t;
}

TEST(ClassifyNodes, HmemFasterThanDramIsHbm) {
  Topology t = HmemTopology(200000, 800000);
  ClassifyNodes(&t);
  EXPECT_EQ(t.numa_nodes[0].kind, NodeKind::kDram);
  EXPECT_EQ(t.numa_nodes[1].kind, NodeKind::kHbm);
  EXPECT_NE(t.numa_nodes[1].kind_reason.find("800000"), std::string::npos);
}

TEST(ClassifyNodes, HmemNotFasterIsCxl) {
  Topology t = HmemTopology(200000, 60000);
  ClassifyNodes(&t);
  EXPECT_EQ(t.numa_nodes[1].kind, NodeKind::kCxl);
}

TEST(ClassifyNodes, HmemWithoutHmatIsUnknown) {
  Topology t = HmemTopology(std::nullopt, 60000);
  ClassifyNodes(&t);
  EXPECT_EQ(t.numa_nodes[1].kind, NodeKind::kUnknown);
  EXPECT_NE(t.numa_nodes[1].kind_reason.find("no HMAT"), std::string::npos);
}

TEST(ClassifyNodes, NvdimmIsNvmAndDevdaxDoesNotCount) {
  Topology t = HmemTopology(200000, 800000);
  t.dax_devices[0].source = "nvdimm";
  ClassifyNodes(&t);
  EXPECT_EQ(t.numa_nodes[1].kind, NodeKind::kNvm);
  t.dax_devices[0].mode = "devdax";  // memory not in the node
  ClassifyNodes(&t);
  EXPECT_EQ(t.numa_nodes[1].kind, NodeKind::kUnknown);
}

}  // namespace
}  // namespace cxlpool::memory_internal

namespace cxlpool::memory_internal {
namespace {

TEST(DiscoverMemoryFake, ZoneBytesFromBlocksAndWhatAPinDoes) {
  FakeFileSystem fs;
  AddTwoNodes(&fs);
  fs.AddFile("/sys/devices/system/memory/block_size_bytes", "8000000\n");  // 128 MiB
  // node1 gets a second block, onlined to a kernel zone: mixed.
  fs.AddSymlink("/sys/devices/system/node/node1/memory9", "../../memory/memory9");
  fs.AddFile("/sys/devices/system/memory/memory9/state", "online\n");
  fs.AddFile("/sys/devices/system/memory/memory9/valid_zones", "Normal\n");
  Topology t;
  DiscoverMemory(fs, &t);
  EXPECT_TRUE(t.warnings.empty()) << AllWarnings(t);
  const NumaNode* n0 = t.FindNode(0);
  EXPECT_EQ(n0->kernel_zone_bytes, 128ull << 20);
  EXPECT_EQ(n0->movable_bytes, 0u);
  EXPECT_EQ(LongTermPinsOf(*n0), LongTermPins::kYes);
  const NumaNode* n1 = t.FindNode(1);
  EXPECT_EQ(n1->kernel_zone_bytes, 128ull << 20);
  EXPECT_EQ(n1->movable_bytes, 128ull << 20);
  EXPECT_EQ(LongTermPinsOf(*n1), LongTermPins::kPartly);
  EXPECT_STREQ(LongTermPinsName(LongTermPinsOf(*n1)), "partly");
}

TEST(DiscoverMemoryFake, MovableOnlyNodeCannotHoldPins) {
  FakeFileSystem fs;
  AddTwoNodes(&fs);
  fs.AddFile("/sys/devices/system/memory/block_size_bytes", "8000000\n");
  Topology t;
  DiscoverMemory(fs, &t);
  const NumaNode* n1 = t.FindNode(1);
  EXPECT_EQ(n1->kernel_zone_bytes, 0u);
  EXPECT_EQ(n1->movable_bytes, 128ull << 20);
  EXPECT_EQ(LongTermPinsOf(*n1), LongTermPins::kNo);
  // Without a block size, or with a garbled one, the counts are unknown.
  FakeFileSystem bad;
  AddTwoNodes(&bad);
  bad.AddFile("/sys/devices/system/memory/block_size_bytes", "lots\n");
  Topology u;
  DiscoverMemory(bad, &u);
  EXPECT_FALSE(u.FindNode(1)->movable_bytes.has_value());
  EXPECT_EQ(LongTermPinsOf(*u.FindNode(1)), LongTermPins::kUnknown);
  EXPECT_TRUE(HasWarning(u, "block_size_bytes: not a hex block size")) << AllWarnings(u);
}

TEST(DiscoverMemoryFake, ZoneBytesFromZoneinfoWhenBlocksStraddle) {
  FakeFileSystem fs;
  AddTwoNodes(&fs);
  fs.AddFile("/sys/devices/system/memory/block_size_bytes", "8000000\n");
  fs.AddFile("/sys/devices/system/memory/memory8/valid_zones", "none\n");
  // 2 GiB of MemTotal in 524288 managed pages: 4 KiB pages, told exactly.
  fs.AddFile("/proc/zoneinfo",
             "Node 1, zone   Normal\n  managed 131072\nNode 1, zone  Movable\n"
             "  managed 393216\nNode 1, zone   Device\n  managed 0\n");
  Topology t;
  DiscoverMemory(fs, &t);
  const NumaNode* n1 = t.FindNode(1);
  EXPECT_EQ(n1->zone, "Movable");
  EXPECT_EQ(n1->kernel_zone_bytes, 512ull << 20);
  EXPECT_EQ(n1->movable_bytes, 1536ull << 20);
  EXPECT_EQ(LongTermPinsOf(*n1), LongTermPins::kPartly);
}

TEST(DiscoverMemoryFake, ZoneinfoPageSizeFollowsMemTotal) {
  FakeFileSystem fs;
  AddTwoNodes(&fs);
  fs.FailPath("/sys/devices/system/memory/memory8/state", Status(Code::kIo, "EIO"));
  // 2 GiB in 32768 pages: 64 KiB pages (an arm64 kernel).
  fs.AddFile("/proc/zoneinfo", "Node 1, zone  Movable\n  managed 32768\n");
  Topology t;
  DiscoverMemory(fs, &t);
  EXPECT_EQ(t.FindNode(1)->movable_bytes, 2ull << 30);
  EXPECT_EQ(t.FindNode(1)->kernel_zone_bytes, 0u);
}

// A captured ARM server writes every node's cpulist as "0-31\n\0": trailing
// NULs (and whitespace) are padding, as hwloc reads them; a NUL before other
// bytes is garbage.
TEST(DiscoverMemoryFake, TrailingNulPaddingIsAccepted) {
  FakeFileSystem fs;
  AddTwoNodes(&fs);
  const std::string n = "/sys/devices/system/node";
  fs.AddFile(n + "/online", std::string("0-1\n\0", 5));
  fs.AddFile(n + "/has_cpu", std::string("0\n\0\0", 4));
  fs.AddFile(n + "/node0/cpulist", std::string("0-3\n\0", 5));
  fs.AddFile(n + "/node0/distance", std::string("10 20\0\n", 7));
  fs.AddFile(n + "/node0/meminfo",
             std::string("Node 0 MemTotal:  8388608 kB\nNode 0 MemFree:   4194304 kB\n") +
                 std::string(1, '\0'));
  fs.AddFile("/sys/devices/system/memory/memory0/valid_zones", std::string("Normal\n\0", 8));
  Topology t;
  DiscoverMemory(fs, &t);
  EXPECT_TRUE(t.warnings.empty()) << AllWarnings(t);
  const NumaNode* n0 = t.FindNode(0);
  ASSERT_NE(n0, nullptr);
  EXPECT_EQ(n0->cpus, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(n0->kind, NodeKind::kDram);
  EXPECT_EQ(n0->memory_bytes, 8ull << 30);
  EXPECT_EQ(n0->distances.size(), 2u);
  EXPECT_EQ(n0->zone, "Normal");

  fs.AddFile(n + "/node0/cpulist", std::string("0-3\0junk\n", 9));
  Topology g;
  DiscoverMemory(fs, &g);
  EXPECT_TRUE(HasWarning(g, "node0/cpulist: bad list '0-3\\x00junk'")) << AllWarnings(g);
}

TEST(NotPooledReason, UnknownBackingGpuAndEmptyNodes) {
  FakeFileSystem fs;
  AddTwoNodes(&fs);
  Topology t;
  DiscoverMemory(fs, &t);
  EXPECT_FALSE(NotPooledReason(*t.FindNode(0)).has_value());
  auto why = NotPooledReason(*t.FindNode(1));
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("unknown kind"), std::string::npos) << *why;
  EXPECT_NE(why->find("[pools.node.1] enabled = true"), std::string::npos) << *why;
  NumaNode gpu = *t.FindNode(1);
  gpu.kind = NodeKind::kGpu;
  EXPECT_NE(NotPooledReason(gpu)->find("GPU memory"), std::string::npos);
  NumaNode empty = *t.FindNode(0);
  empty.memory_bytes = 0;
  EXPECT_EQ(NotPooledReason(empty), "no memory");
  // hmem without HMAT is kind unknown too, but its backing is known: pooled.
  NumaNode hmem = *t.FindNode(1);
  hmem.backing_unidentified = false;
  EXPECT_FALSE(NotPooledReason(hmem).has_value());
}

TEST(KernelZoneRemedy, NamesTheDaxDeviceWhenThereIsOne) {
  Topology t;
  DaxDevice d;
  d.name = "dax0.0";
  d.mode = "system-ram";
  d.target_node = 2;
  t.dax_devices.push_back(d);
  EXPECT_NE(t.KernelZoneRemedy(2).find("daxctl offline-memory dax0.0 && daxctl online-memory "
                                       "--no-movable dax0.0"),
            std::string::npos)
      << t.KernelZoneRemedy(2);
  EXPECT_NE(t.KernelZoneRemedy(3).find("/sys/devices/system/node/node3/memoryN/state"),
            std::string::npos)
      << t.KernelZoneRemedy(3);
}

}  // namespace
}  // namespace cxlpool::memory_internal
