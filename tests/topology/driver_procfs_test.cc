// GPU memory nodes from the NVIDIA driver's own procfs
// (/proc/driver/nvidia/gpus/<bus id>/numa_status), with or without NVML, and
// the PCI scan on trees that lack attributes. Bad numa_status files are
// warnings, never a crash.
#include <gtest/gtest.h>

#include "cxlpool/topology/discover.h"
#include "gpu_discovery.h"
#include "gpu_test_util.h"

namespace cxlpool {
namespace {

using testing_gpu::AddPci;
using testing_gpu::Board;
using testing_gpu::ScopedEnv;

constexpr char kStatus[] = "/proc/driver/nvidia/gpus/0009:01:00.0/numa_status";

bool HasWarning(const Topology& t, const std::string& needle) {
  for (const auto& w : t.warnings)
    if (w.find(needle) != std::string::npos) return true;
  return false;
}

std::string AllWarnings(const Topology& t) {
  std::string out;
  for (const auto& w : t.warnings) out += "  " + w + "\n";
  return out;
}

// Grace Hopper: node 0 with the CPUs, node 1 CPU-less (the GPU's HBM).
Topology GraceHopper() {
  Topology t;
  std::vector<int> cpus;
  for (int c = 0; c < 72; ++c) cpus.push_back(c);
  t.numa_nodes.push_back(
      testing_gpu::MakeNode(0, cpus, 480ull << 30, {{0, 10}, {1, 80}}, NodeKind::kDram));
  NumaNode hbm = testing_gpu::MakeNode(1, {}, 96ull << 30, {{0, 80}, {1, 10}}, NodeKind::kUnknown);
  hbm.backing_unidentified = true;
  t.numa_nodes.push_back(hbm);
  return t;
}

Topology DiscoverWithoutNvml(const FileSystem& fs, Topology t) {
  ScopedEnv l("CXLPOOL_NVML_LIBRARY", std::nullopt);
  DiscoverOptions o;
  o.use_nvml = false;
  DiscoverGpus(fs, o, &t);
  ComputeGpuMemoryPreference(&t);
  return t;
}

TEST(ParseNumaStatus, WhatTheDriverWrites) {
  auto s = ParseNumaStatus(
      "Node:      1\nStatus:    online\nAddress:   400000000000\nSize:      1780000000\n");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->node, 1);
  EXPECT_EQ(s->status, "online");
  // Before the GPU is opened the driver prints only Node and Status.
  s = ParseNumaStatus(std::string("Node:      3\nStatus:    offline\n\0", 33));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->node, 3);
  EXPECT_EQ(s->status, "offline");
  s = ParseNumaStatus("Node:      -1\nStatus:    disabled\n");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->node, std::nullopt);
}

TEST(ParseNumaStatus, TruncatedAndGarbledAreErrors) {
  for (const char* bad : {"", "Nod", "Node:", "Node:   \nStatus: online\n", "Node: x1\n",
                          "Node: 1048577\n", "Node: -2\n", "Node: 1\nNode: 2\n", "\x89PNG\r\n"}) {
    EXPECT_FALSE(ParseNumaStatus(bad).ok()) << "'" << bad << "'";
  }
}

TEST(DriverProcfs, MarksTheGpuMemoryNodeWithoutNvml) {
  FakeFileSystem fs;
  AddPci(&fs, "0009:01:00.0", "0x10de", "0x030200", "0");
  fs.AddFile(kStatus, "Node:      1\nStatus:    online\n");
  Topology t = DiscoverWithoutNvml(fs, GraceHopper());
  EXPECT_TRUE(t.warnings.empty()) << AllWarnings(t);
  ASSERT_EQ(t.gpus.size(), 1u);
  EXPECT_EQ(t.gpus[0].source, "pci");
  EXPECT_EQ(t.gpus[0].memory_node, 1);
  EXPECT_EQ(t.gpus[0].memory_node_source, "driver");
  EXPECT_EQ(t.numa_nodes[1].kind, NodeKind::kGpu);
  EXPECT_NE(t.numa_nodes[1].kind_reason.find("NVIDIA driver, " + std::string(kStatus)),
            std::string::npos)
      << t.numa_nodes[1].kind_reason;
  ASSERT_TRUE(NotPooledReason(t.numa_nodes[1]).has_value());
  EXPECT_NE(NotPooledReason(t.numa_nodes[1])->find("GPU memory"), std::string::npos);
  EXPECT_EQ(t.gpu_memory_preference.at(0), (std::vector<int>{0}));
}

TEST(DriverProcfs, WithNvmlTheDriverStillCounts) {
  // The minimal fake NVML lacks nvmlDeviceGetNumaNodeId: the driver tells.
  FakeFileSystem fs;
  AddPci(&fs, "0009:01:00.0", "0x10de", "0x030200", "0");
  fs.AddFile(kStatus, "Node:      1\nStatus:    online\n");
  ScopedEnv b("CXLPOOL_FAKE_NVML_BOARD", Board("grace-hopper"));
  ScopedEnv l("CXLPOOL_NVML_LIBRARY", std::nullopt);
  DiscoverOptions o;
  o.nvml_library = FAKE_NVML_MINIMAL_LIB;
  Topology t = GraceHopper();
  DiscoverGpus(fs, o, &t);
  ASSERT_EQ(t.gpus.size(), 1u);
  EXPECT_EQ(t.gpus[0].source, "nvml");
  EXPECT_EQ(t.gpus[0].memory_node, 1);
  EXPECT_EQ(t.gpus[0].memory_node_source, "driver");
  EXPECT_EQ(t.numa_nodes[1].kind, NodeKind::kGpu);
  // The full fake says node 1 too: NVML's word, and no disagreement.
  o.nvml_library = FAKE_NVML_LIB;
  Topology u = GraceHopper();
  DiscoverGpus(fs, o, &u);
  EXPECT_EQ(u.gpus[0].memory_node_source, "nvml");
  EXPECT_EQ(u.numa_nodes[1].kind, NodeKind::kGpu);
  EXPECT_TRUE(u.warnings.empty()) << AllWarnings(u);
}

TEST(DriverProcfs, PciTreeWithoutClassOrDeviceStillHasTheGpu) {
  // The function's class attribute is missing (a partial capture): the
  // driver has bound it, so it is a GPU.
  FakeFileSystem fs;
  fs.AddFile("/sys/bus/pci/devices/0009:01:00.0/vendor", "0x10de\n");
  fs.AddFile("/sys/bus/pci/devices/0009:01:00.0/numa_node", "0\n");
  fs.AddFile(kStatus, "Node:      1\nStatus:    online\n");
  Topology t = DiscoverWithoutNvml(fs, GraceHopper());
  EXPECT_TRUE(t.warnings.empty()) << AllWarnings(t);
  ASSERT_EQ(t.gpus.size(), 1u);
  EXPECT_EQ(t.gpus[0].source, "pci");
  EXPECT_EQ(t.gpus[0].numa_node, 0);
  // No PCI directory at all: the driver's list alone.
  FakeFileSystem bare;
  bare.AddFile(kStatus, "Node:      1\nStatus:    online\n");
  Topology u = DiscoverWithoutNvml(bare, GraceHopper());
  ASSERT_EQ(u.gpus.size(), 1u);
  EXPECT_EQ(u.gpus[0].source, "driver");
  EXPECT_EQ(u.gpus[0].pci_bus_id, "0009:01:00.0");
  EXPECT_EQ(u.gpus[0].numa_node, std::nullopt);
  EXPECT_EQ(u.numa_nodes[1].kind, NodeKind::kGpu);
}

TEST(DriverProcfs, BadNumaStatusIsAWarningNeverAMark) {
  struct Case {
    std::string text;
    std::string warning;
  };
  const std::vector<Case> cases = {
      {"Nod", "no 'Node:' line"},
      {"Node:", "'Node:' is not a node id"},
      {std::string("Node: \xff\xfe\0\x01", 10), "'Node:' is not a node id"},
      {"Node:      7\nStatus:    online\n", "names NUMA node 7, which sysfs does not show"},
      {"Node:      0\nStatus:    online\n", "names NUMA node 0, which has CPUs"},
  };
  for (const auto& c : cases) {
    FakeFileSystem fs;
    AddPci(&fs, "0009:01:00.0", "0x10de", "0x030200", "0");
    fs.AddFile(kStatus, c.text);
    Topology t = DiscoverWithoutNvml(fs, GraceHopper());
    EXPECT_TRUE(HasWarning(t, c.warning)) << "'" << c.text << "':\n" << AllWarnings(t);
    EXPECT_EQ(t.numa_nodes[0].kind, NodeKind::kDram);
    EXPECT_EQ(t.numa_nodes[1].kind, NodeKind::kUnknown) << c.text;
    ASSERT_EQ(t.gpus.size(), 1u);
    EXPECT_EQ(t.gpus[0].memory_node, std::nullopt);
  }
  // An unreadable file and a directory that is no bus id are warnings too.
  FakeFileSystem fs;
  fs.AddFile("/proc/driver/nvidia/gpus/not-a-bus/numa_status", "Node: 1\n");
  fs.AddFile(kStatus, "Node: 1\n");
  fs.FailPath(kStatus, Status(Code::kPermissionDenied, "open: Permission denied"));
  std::vector<std::string> warnings;
  auto gpus = ScanDriverGpus(fs, &warnings);
  ASSERT_EQ(gpus.size(), 1u);
  EXPECT_EQ(gpus[0].memory_node, std::nullopt);
  ASSERT_EQ(warnings.size(), 2u);
  // In directory order: "0009:01:00.0" sorts before "not-a-bus".
  EXPECT_NE(warnings[0].find("PERMISSION_DENIED"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[1].find("not a PCI bus id"), std::string::npos) << warnings[1];
}

TEST(DriverProcfs, NoDriverDirectoryIsSilent) {
  FakeFileSystem fs;
  AddPci(&fs, "0009:01:00.0", "0x10de", "0x030200", "0");
  Topology t = DiscoverWithoutNvml(fs, GraceHopper());
  EXPECT_TRUE(t.warnings.empty()) << AllWarnings(t);
  EXPECT_EQ(t.numa_nodes[1].kind, NodeKind::kUnknown);
  // ... and then the node is left out as memory of unknown kind.
  EXPECT_NE(NotPooledReason(t.numa_nodes[1])->find("unknown kind"), std::string::npos);
}

}  // namespace
}  // namespace cxlpool
