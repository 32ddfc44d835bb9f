// The PCI fallback: NVIDIA display-class functions only, bus order, NUMA node
// from sysfs, and garbled or missing files turned into warnings.
#include <gtest/gtest.h>

#include "gpu_discovery.h"
#include "gpu_test_util.h"

namespace cxlpool {
namespace {

using testing_gpu::AddPci;

TEST(PciScan, FindsNvidiaDisplayFunctionsInBusOrder) {
  FakeFileSystem fs;
  AddPci(&fs, "0000:b1:00.0", "0x10de", "0x030200", "1");   // 3D controller
  AddPci(&fs, "0000:b1:00.1", "0x10de", "0x040300", "1");   // its HDMI audio
  AddPci(&fs, "0000:05:00.0", "0x10de", "0x068000", "0");   // NVSwitch (bridge)
  AddPci(&fs, "0000:00:02.0", "0x8086", "0x030000", "0");   // Intel iGPU
  AddPci(&fs, "0001:03:00.0", "0x10de", "0x030000", "-1");  // VGA, no NUMA info
  AddPci(&fs, "0000:17:00.0", "0x10de", "0x030200", "0");
  std::vector<std::string> warnings;
  auto gpus = ScanPciGpus(fs, &warnings);
  EXPECT_TRUE(warnings.empty()) << warnings.front();
  ASSERT_EQ(gpus.size(), 3u);
  EXPECT_EQ(gpus[0].pci_bus_id, "0000:17:00.0");
  EXPECT_EQ(gpus[1].pci_bus_id, "0000:b1:00.0");
  EXPECT_EQ(gpus[2].pci_bus_id, "0001:03:00.0");
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(gpus[i].index, i);
    EXPECT_EQ(gpus[i].source, "pci");
    EXPECT_EQ(gpus[i].uuid, std::nullopt);
    EXPECT_EQ(gpus[i].memory_bytes, std::nullopt);
    EXPECT_FALSE(gpus[i].nvlinks_known);
  }
  EXPECT_EQ(gpus[0].numa_node, 0);
  EXPECT_EQ(gpus[1].numa_node, 1);
  EXPECT_EQ(gpus[2].numa_node, std::nullopt);  // -1
}

TEST(PciScan, DomainsSortNumerically) {
  FakeFileSystem fs;
  AddPci(&fs, "10000:01:00.0", "0x10de", "0x030200", "0");  // VMD domain
  AddPci(&fs, "0002:01:00.0", "0x10de", "0x030200", "0");
  std::vector<std::string> warnings;
  auto gpus = ScanPciGpus(fs, &warnings);
  ASSERT_EQ(gpus.size(), 2u);
  EXPECT_EQ(gpus[0].pci_bus_id, "0002:01:00.0");
  EXPECT_EQ(gpus[1].pci_bus_id, "10000:01:00.0");
}

TEST(PciScan, GarbledFilesWarnAndNeverCrash) {
  FakeFileSystem fs;
  AddPci(&fs, "0000:17:00.0", "0x10de", "0x030200", "zero");      // garbled numa_node
  AddPci(&fs, "0000:18:00.0", "\x01\xff junk", "0x030200", "0");  // garbled vendor
  AddPci(&fs, "0000:19:00.0", "0x10de", "display", "0");          // garbled class
  AddPci(&fs, "not-a-bus-id", "0x10de", "0x030200", "0");         // garbled name
  AddPci(&fs, "0000:1a:00.0", "0x10de", "0x030200", "");          // no numa_node file
  fs.AddSymlink("/sys/bus/pci/devices/0000:1b:00.0", "../../../devices/nowhere");  // dangling
  std::vector<std::string> warnings;
  auto gpus = ScanPciGpus(fs, &warnings);
  ASSERT_EQ(gpus.size(), 2u);
  EXPECT_EQ(gpus[0].pci_bus_id, "0000:17:00.0");
  EXPECT_EQ(gpus[0].numa_node, std::nullopt);
  EXPECT_EQ(gpus[1].pci_bus_id, "0000:1a:00.0");
  EXPECT_EQ(gpus[1].numa_node, std::nullopt);
  ASSERT_EQ(warnings.size(), 4u);
  EXPECT_NE(warnings[0].find("numa_node"), std::string::npos) << warnings[0];
}

TEST(PciScan, UnreadableFilesAreSkipped) {
  FakeFileSystem fs;
  AddPci(&fs, "0000:17:00.0", "0x10de", "0x030200", "0");
  fs.FailPath("/sys/devices/pci0000:00/0000:17:00.0/numa_node",
              Status(Code::kPermissionDenied, "EACCES"));
  std::vector<std::string> warnings;
  auto gpus = ScanPciGpus(fs, &warnings);
  ASSERT_EQ(gpus.size(), 1u);
  EXPECT_EQ(gpus[0].numa_node, std::nullopt);
}

TEST(PciScan, MissingPciBusIsAWarning) {
  FakeFileSystem fs;
  std::vector<std::string> warnings;
  EXPECT_TRUE(ScanPciGpus(fs, &warnings).empty());
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("no PCI scan for GPUs"), std::string::npos) << warnings[0];
}

}  // namespace
}  // namespace cxlpool
