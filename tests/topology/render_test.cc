// The human view: the node tree, backing devices, and the GPU x node matrix.
#include "cxlpool/topology/render.h"

#include <gtest/gtest.h>

#include "cxlpool/topology/discover.h"
#include "gpu_test_util.h"

namespace cxlpool {
namespace {

bool Has(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

TEST(RenderText, EmptyTopologyDoesNotCrash) {
  std::string s = RenderTopologyText(Topology{});
  EXPECT_TRUE(Has(s, "0 NUMA node(s)"));
  EXPECT_TRUE(Has(s, "No NVIDIA GPUs found."));
}

TEST(RenderText, TreeBackingAndMatrix) {
  Topology t = testing_gpu::TwoSockets();
  t.numa_nodes.push_back(
      testing_gpu::MakeNode(2, {}, 128ull << 30, {{0, 14}, {1, 26}, {2, 10}}, NodeKind::kCxl));
  t.numa_nodes[0].distances[2] = 14;
  t.numa_nodes[1].distances[2] = 26;
  t.numa_nodes[2].kind_reason = "CXL region0 -> dax0.0 -> node 2";
  AccessClass a;
  a.initiators = {0};
  a.read_bandwidth_mbps = 30000;
  a.read_latency_ns = 250;
  t.numa_nodes[2].access.push_back(a);
  DaxDevice d{"dax0.0"};
  d.target_node = 2;
  d.mode = "system-ram";
  d.source = "cxl";
  d.size_bytes = 128ull << 30;
  t.dax_devices.push_back(d);
  CxlRegion r{"region0"};
  r.type = "ram";
  r.memdevs = {"mem0"};
  r.dax_devices = {"dax0.0"};
  r.numa_nodes = {2};
  t.cxl_regions.push_back(r);
  Gpu g;
  g.index = 0;
  g.pci_bus_id = "0000:17:00.0";
  g.name = "NVIDIA H100 NVL";
  g.numa_node = 0;
  t.gpus.push_back(g);
  t.warnings.push_back("node 5: meminfo garbled");
  ComputeGpuMemoryPreference(&t);
  std::string s = RenderTopologyText(t);

  EXPECT_TRUE(Has(s, "|-- node 0: dram")) << s;
  EXPECT_TRUE(Has(s, "`-- node 2: cxl")) << s;
  EXPECT_TRUE(Has(s, "no cpus")) << s;
  EXPECT_TRUE(Has(s, "why cxl: CXL region0 -> dax0.0 -> node 2")) << s;
  EXPECT_TRUE(Has(s, "HMAT access0 from node(s) 0: read 30000 MB/s")) << s;
  EXPECT_TRUE(Has(s, "backed by dax0.0 (system-ram, cxl, 128.0 GiB) of CXL region0 (ram; mem0)"))
      << s;
  EXPECT_TRUE(Has(s, "local GPU0 0000:17:00.0 NVIDIA H100 NVL")) << s;
  // Matrix row: node0 10/1, node1 21/3, node2 14/2 (distance/rank).
  EXPECT_TRUE(Has(s, "GPU0    10/1     21/3     14/2     0")) << s;
  EXPECT_TRUE(Has(s, "node 5: meminfo garbled")) << s;
}

}  // namespace
}  // namespace cxlpool
