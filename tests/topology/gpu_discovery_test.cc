// DiscoverGpus through the fake NVML boards, the minimal fake (missing entry
// points), the PCI fallback, and the NVML library choice.
#include "gpu_discovery.h"

#include <gtest/gtest.h>

#include "cxlpool/topology/discover.h"
#include "gpu_test_util.h"

namespace cxlpool {
namespace {

using testing_gpu::AddPci;
using testing_gpu::Board;
using testing_gpu::ScopedEnv;
using testing_gpu::TwoSockets;
using testing_gpu::WriteTemp;

// Two-socket tree whose PCI devices match the 2gpu-nvlink-bridge board.
FakeFileSystem TwoGpuTree() {
  FakeFileSystem fs;
  AddPci(&fs, "0000:17:00.0", "0x10de", "0x030200", "0");
  AddPci(&fs, "0000:ca:00.0", "0x10de", "0x030200", "1");
  return fs;
}

Topology Discover(const FileSystem& fs, Topology topo, const std::string& lib,
                  const std::string& board) {
  ScopedEnv b("CXLPOOL_FAKE_NVML_BOARD", board);
  ScopedEnv l("CXLPOOL_NVML_LIBRARY", std::nullopt);
  DiscoverOptions o;
  o.nvml_library = lib;
  DiscoverGpus(fs, o, &topo);
  ComputeGpuMemoryPreference(&topo);
  return topo;
}

TEST(DiscoverGpus, DgxBoardEightGpusOnNvSwitch) {
  FakeFileSystem fs;  // no PCI tree: NVML alone
  Topology t = TwoSockets();
  t.numa_nodes[0].cpus = {0, 1, 2};  // affinity comes from NVML's memory affinity
  t = Discover(fs, t, FAKE_NVML_LIB, Board("dgx-h100-8gpu-nvswitch"));
  ASSERT_EQ(t.gpus.size(), 8u);
  const char* buses[] = {"0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0",
                         "0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0"};
  for (int i = 0; i < 8; ++i) {
    const Gpu& g = t.gpus[i];
    EXPECT_EQ(g.index, i);
    EXPECT_EQ(g.pci_bus_id, buses[i]);
    EXPECT_EQ(g.source, "nvml");
    EXPECT_EQ(g.name, "NVIDIA H100 80GB HBM3");
    ASSERT_TRUE(g.uuid.has_value());
    EXPECT_EQ(g.uuid->rfind("GPU-", 0), 0u);
    EXPECT_EQ(g.memory_bytes, 85520809984ull);
    EXPECT_EQ(g.numa_node, i < 4 ? 0 : 1);
    EXPECT_EQ(g.memory_node, std::nullopt);
    ASSERT_TRUE(g.nvlinks_known);
    ASSERT_EQ(g.nvlinks.size(), 18u);
    for (const auto& l : g.nvlinks) {
      if (i == 7 && l.link == 17) {
        EXPECT_FALSE(l.active);
        EXPECT_EQ(l.remote_pci_bus_id, std::nullopt);
        EXPECT_EQ(l.remote_type, std::nullopt);
        continue;
      }
      EXPECT_TRUE(l.active);
      EXPECT_EQ(l.remote_type, "switch");
      EXPECT_EQ(l.remote_pci_bus_id, l.link < 5    ? "0000:05:00.0"
                                     : l.link < 9  ? "0000:06:00.0"
                                     : l.link < 13 ? "0000:07:00.0"
                                                   : "0000:08:00.0");
    }
  }
  // No PCI tree to check the bus ids against: no warning about it either.
  for (const auto& w : t.warnings) EXPECT_EQ(w.find("is not in"), std::string::npos) << w;
  EXPECT_EQ(t.gpu_memory_preference.at(0), (std::vector<int>{0, 1}));
  EXPECT_EQ(t.gpu_memory_preference.at(7), (std::vector<int>{1, 0}));
}

TEST(DiscoverGpus, BridgeBoardLinksPointAtThePeer) {
  FakeFileSystem fs = TwoGpuTree();
  Topology t = Discover(fs, TwoSockets(), FAKE_NVML_LIB, Board("2gpu-nvlink-bridge"));
  ASSERT_EQ(t.gpus.size(), 2u);
  EXPECT_TRUE(t.warnings.empty()) << t.warnings.front();
  EXPECT_EQ(t.gpus[0].pci_bus_id, "0000:17:00.0");
  EXPECT_EQ(t.gpus[1].pci_bus_id, "0000:ca:00.0");
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(t.gpus[i].nvlinks.size(), 12u);
    for (const auto& l : t.gpus[i].nvlinks) {
      EXPECT_TRUE(l.active);
      EXPECT_EQ(l.remote_type, "gpu");
      EXPECT_EQ(l.remote_pci_bus_id, t.gpus[1 - i].pci_bus_id);
    }
  }
}

TEST(DiscoverGpus, GraceHopperMarksTheGpuMemoryNode) {
  FakeFileSystem fs;
  AddPci(&fs, "0009:01:00.0", "0x10de", "0x030200", "0");
  Topology t;
  std::vector<int> cpus;
  for (int c = 0; c < 72; ++c) cpus.push_back(c);
  t.numa_nodes.push_back(
      testing_gpu::MakeNode(0, cpus, 480ull << 30, {{0, 10}, {1, 80}}, NodeKind::kDram));
  t.numa_nodes.push_back(
      testing_gpu::MakeNode(1, {}, 96ull << 30, {{0, 80}, {1, 10}}, NodeKind::kUnknown));
  t = Discover(fs, t, FAKE_NVML_LIB, Board("grace-hopper"));
  ASSERT_EQ(t.gpus.size(), 1u);
  EXPECT_EQ(t.gpus[0].pci_bus_id, "0009:01:00.0");
  EXPECT_EQ(t.gpus[0].numa_node, 0);
  EXPECT_EQ(t.gpus[0].memory_node, 1);
  EXPECT_TRUE(t.gpus[0].nvlinks_known);
  EXPECT_TRUE(t.gpus[0].nvlinks.empty());
  EXPECT_EQ(t.numa_nodes[1].kind, NodeKind::kGpu);
  EXPECT_NE(t.numa_nodes[1].kind_reason.find("GPU 0 (0009:01:00.0)"), std::string::npos);
  EXPECT_EQ(t.numa_nodes[0].kind, NodeKind::kDram);
  // The GPU's own HBM node is not a spill target.
  EXPECT_EQ(t.gpu_memory_preference.at(0), (std::vector<int>{0}));
}

TEST(DiscoverGpus, MinimalLibraryMeansUnsupportedNotCrash) {
  FakeFileSystem fs = TwoGpuTree();
  Topology t = Discover(fs, TwoSockets(), FAKE_NVML_MINIMAL_LIB, Board("2gpu-nvlink-bridge"));
  ASSERT_EQ(t.gpus.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(t.gpus[i].source, "nvml");
    EXPECT_FALSE(t.gpus[i].nvlinks_known);  // no NVLink entry points: null in JSON
    EXPECT_TRUE(t.gpus[i].nvlinks.empty());
    EXPECT_EQ(t.gpus[i].memory_node, std::nullopt);
    // No memory affinity entry point: the CPU affinity mask maps to the node.
    EXPECT_EQ(t.gpus[i].numa_node, i);
    EXPECT_TRUE(t.gpus[i].uuid.has_value());
  }
  EXPECT_TRUE(t.warnings.empty()) << t.warnings.front();
}

TEST(DiscoverGpus, MinimalLibraryOnGraceHopperLeavesNodeUnknown) {
  FakeFileSystem fs;
  AddPci(&fs, "0009:01:00.0", "0x10de", "0x030200", "0");
  Topology t = TwoSockets();
  t.numa_nodes[1].cpus.clear();
  t.numa_nodes[1].kind = NodeKind::kUnknown;
  t = Discover(fs, t, FAKE_NVML_MINIMAL_LIB, Board("grace-hopper"));
  ASSERT_EQ(t.gpus.size(), 1u);
  EXPECT_EQ(t.gpus[0].memory_node, std::nullopt);
  EXPECT_EQ(t.numa_nodes[1].kind, NodeKind::kUnknown);
}

TEST(DiscoverGpus, UnsupportedFactsAreNullWithoutWarnings) {
  std::string board = WriteTemp("unsupported.json", R"({"gpus": [{
      "uuid": "GPU-1", "name": "Fake", "pci_bus_id": "00000000:17:00.0",
      "memory_total_bytes": 1024, "memory_affinity": [0],
      "unsupported": ["uuid", "name", "memory", "memory_affinity", "cpu_affinity",
                      "numa_node_id", "nvlink"]}]})");
  FakeFileSystem fs = TwoGpuTree();
  Topology t = Discover(fs, TwoSockets(), FAKE_NVML_LIB, board);
  ASSERT_EQ(t.gpus.size(), 1u);
  const Gpu& g = t.gpus[0];
  EXPECT_EQ(g.uuid, std::nullopt);
  EXPECT_EQ(g.name, std::nullopt);
  EXPECT_EQ(g.memory_bytes, std::nullopt);
  EXPECT_EQ(g.numa_node, 0);  // from the PCI device's numa_node
  EXPECT_TRUE(g.nvlinks_known);
  EXPECT_TRUE(g.nvlinks.empty());
  EXPECT_TRUE(t.warnings.empty()) << t.warnings.front();
}

TEST(DiscoverGpus, FailingEntryPointWarnsAndLeavesFactNull) {
  FakeFileSystem fs = TwoGpuTree();
  ScopedEnv b("CXLPOOL_FAKE_NVML_BOARD", Board("2gpu-nvlink-bridge"));
  auto lib = NvmlLibrary::Open(FAKE_NVML_LIB);
  ASSERT_TRUE(lib.ok());
  (*lib)->nvmlDeviceGetUUID = [](nvmlDevice_t, char*, unsigned int) {
    return NVML_ERROR_GPU_IS_LOST;
  };
  std::vector<std::string> warnings;
  auto gpus = ScanNvmlGpus(**lib, fs, TwoSockets(), &warnings);
  ASSERT_TRUE(gpus.ok());
  ASSERT_EQ(gpus->size(), 2u);
  EXPECT_EQ((*gpus)[0].uuid, std::nullopt);
  EXPECT_TRUE((*gpus)[0].name.has_value());
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_NE(warnings[0].find("GPU 0: NVML UUID failed"), std::string::npos) << warnings[0];
}

TEST(DiscoverGpus, BoardNotMatchingTheTreeIsReported) {
  FakeFileSystem fs;
  AddPci(&fs, "0000:17:00.0", "0x10de", "0x030200", "0");
  Topology t = Discover(fs, TwoSockets(), FAKE_NVML_LIB, Board("2gpu-nvlink-bridge"));
  ASSERT_EQ(t.gpus.size(), 2u);
  ASSERT_EQ(t.warnings.size(), 1u);
  EXPECT_NE(t.warnings[0].find("0000:ca:00.0 is not in /sys/bus/pci/devices"), std::string::npos);
}

TEST(DiscoverGpus, BusIdOfAnotherVendorIsReported) {
  FakeFileSystem fs;
  AddPci(&fs, "0000:17:00.0", "0x10de", "0x030200", "0");
  AddPci(&fs, "0000:ca:00.0", "0x8086", "0x020000", "1");  // a NIC where NVML says GPU 1
  Topology t = Discover(fs, TwoSockets(), FAKE_NVML_LIB, Board("2gpu-nvlink-bridge"));
  ASSERT_EQ(t.gpus.size(), 2u);
  ASSERT_EQ(t.warnings.size(), 1u);
  EXPECT_NE(t.warnings[0].find("0000:ca:00.0 is vendor 0x8086"), std::string::npos)
      << t.warnings[0];
}

TEST(DiscoverGpus, MissingLibraryFallsBackToPciScan) {
  FakeFileSystem fs = TwoGpuTree();
  Topology t = Discover(fs, TwoSockets(), "/nonexistent/libnvidia-ml.so.1", "");
  ASSERT_EQ(t.gpus.size(), 2u);
  EXPECT_EQ(t.gpus[0].source, "pci");
  EXPECT_EQ(t.gpus[0].numa_node, 0);
  EXPECT_EQ(t.gpus[1].numa_node, 1);
  EXPECT_FALSE(t.gpus[0].nvlinks_known);
  ASSERT_EQ(t.warnings.size(), 1u);
  EXPECT_NE(t.warnings[0].find("NVML unavailable"), std::string::npos);
  EXPECT_EQ(t.gpu_memory_preference.at(1), (std::vector<int>{1, 0}));
}

TEST(DiscoverGpus, LibraryWithoutCountFallsBackToPciScan) {
  FakeFileSystem fs = TwoGpuTree();
  Topology t = Discover(fs, TwoSockets(), FAKE_NVML_NOCOUNT_LIB, Board("2gpu-nvlink-bridge"));
  ASSERT_EQ(t.gpus.size(), 2u);
  EXPECT_EQ(t.gpus[0].source, "pci");
  ASSERT_EQ(t.warnings.size(), 1u);
  EXPECT_NE(t.warnings[0].find("nvmlDeviceGetCount_v2"), std::string::npos);
}

TEST(DiscoverGpus, NvmlWithNoGpusDefersToPciScan) {
  FakeFileSystem fs = TwoGpuTree();
  Topology t = Discover(fs, TwoSockets(), FAKE_NVML_LIB, WriteTemp("none.json", R"({"gpus": []})"));
  ASSERT_EQ(t.gpus.size(), 2u);
  EXPECT_EQ(t.gpus[0].source, "pci");
  ASSERT_EQ(t.warnings.size(), 1u);
  EXPECT_NE(t.warnings[0].find("NVML reports no GPUs"), std::string::npos);
}

TEST(ChooseNvmlLibrary, ForeignRootNeverLoadsTheSystemNvml) {
  FakeFileSystem foreign;
  ScopedEnv l("CXLPOOL_NVML_LIBRARY", std::nullopt);
  EXPECT_EQ(ChooseNvmlLibrary(foreign, {}), std::nullopt);

  auto real = MakeRootedFileSystem("/");
  auto c = ChooseNvmlLibrary(*real, {});
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->path, "libnvidia-ml.so.1");
  EXPECT_FALSE(c->is_explicit);

  DiscoverOptions off;
  off.use_nvml = false;
  EXPECT_EQ(ChooseNvmlLibrary(*real, off), std::nullopt);
}

TEST(ChooseNvmlLibrary, ExplicitChoiceWinsOnAnyRoot) {
  FakeFileSystem foreign;
  {
    ScopedEnv l("CXLPOOL_NVML_LIBRARY", "/opt/fake/libnvidia-ml.so");
    auto c = ChooseNvmlLibrary(foreign, {});
    ASSERT_TRUE(c.has_value());
    EXPECT_EQ(c->path, "/opt/fake/libnvidia-ml.so");
    EXPECT_TRUE(c->is_explicit);
    DiscoverOptions o;
    o.nvml_library = "/from/options.so";
    EXPECT_EQ(ChooseNvmlLibrary(foreign, o)->path, "/from/options.so");
  }
  {
    ScopedEnv l("CXLPOOL_NVML_LIBRARY", "");  // empty counts as unset
    EXPECT_EQ(ChooseNvmlLibrary(foreign, {}), std::nullopt);
  }
}

}  // namespace
}  // namespace cxlpool
