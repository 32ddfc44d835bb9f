// Placement on fake topologies: GPU preference, explicit nodes, tier lists,
// strict refusals, caller's home node, and errors for unknown GPUs/nodes.
#include "lease/placement.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace cxlpool {
namespace {

using testing::TestConfig;
using testing::TwoSocketCxl;

class PlacementTest : public ::testing::Test {
 protected:
  void SetUp() override {
    topo_ = TwoSocketCxl();
    PoolBuildOptions o;
    o.bind = false;
    auto pools = BuildPools(topo_, TestConfig(), o, nullptr);
    ASSERT_TRUE(pools.ok());
    owned_ = std::move(*pools);
    for (auto& p : owned_) pools_.push_back(p.get());
  }
  std::vector<int> Nodes(const PlacementRequest& r) {
    auto c = PlanPlacement(topo_, pools_, r);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    std::vector<int> out;
    if (c.ok())
      for (auto& x : *c) out.push_back(x.pool->numa_node());
    return out;
  }
  Topology topo_;
  std::vector<std::unique_ptr<Pool>> owned_;
  std::vector<Pool*> pools_;
};

TEST_F(PlacementTest, GpuMemoryNodeIsNeverPooled) {
  ASSERT_EQ(pools_.size(), 4u);
  for (Pool* p : pools_) EXPECT_NE(p->kind(), "gpu");
}

TEST_F(PlacementTest, GpuPreferenceOrder) {
  PlacementRequest r;
  r.gpu = "1";
  EXPECT_EQ(Nodes(r), (std::vector<int>{1, 3, 0, 2}));
  r.gpu = "GPU-0000";
  EXPECT_EQ(Nodes(r), (std::vector<int>{0, 2, 1, 3}));
  r.gpu = "17:00.0";  // PCI bus id without domain
  EXPECT_EQ(Nodes(r), (std::vector<int>{0, 2, 1, 3}));
  auto c = PlanPlacement(topo_, pools_, r);
  ASSERT_TRUE(c.ok());
  EXPECT_NE((*c)[0].reason.find("nearest to GPU 0 (preference #1 of 4)"), std::string::npos)
      << (*c)[0].reason;
}

TEST_F(PlacementTest, TierPreferenceReorders) {
  PlacementRequest r;
  r.gpu = "0";
  r.tiers = {"cxl"};
  EXPECT_EQ(Nodes(r), (std::vector<int>{2, 3, 0, 1}));
  r.strict = true;  // only the best CXL node near GPU 0
  EXPECT_EQ(Nodes(r), (std::vector<int>{2}));
}

TEST_F(PlacementTest, ExplicitNodeThenDistance) {
  PlacementRequest r;
  r.numa_node = 3;
  EXPECT_EQ(Nodes(r), (std::vector<int>{3, 1, 0, 2}));
  r.strict = true;
  EXPECT_EQ(Nodes(r), (std::vector<int>{3}));
}

TEST_F(PlacementTest, HomeNodeByDistance) {
  PlacementRequest r;
  r.home_node = 1;
  EXPECT_EQ(Nodes(r), (std::vector<int>{1, 3, 0, 2}));
  r.home_node = std::nullopt;  // unknown: node id order
  EXPECT_EQ(Nodes(r), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(NodeOfCpu(topo_, 3), 1);
  EXPECT_EQ(NodeOfCpu(topo_, 99), std::nullopt);
  EXPECT_EQ(OnlyCpuNode(topo_), std::nullopt);  // two nodes have CPUs
  Topology one = topo_;
  one.numa_nodes[1].cpus.clear();
  EXPECT_EQ(OnlyCpuNode(one), 0);
  one.numa_nodes[0].cpus.clear();
  EXPECT_EQ(OnlyCpuNode(one), std::nullopt);  // none
}

TEST_F(PlacementTest, Errors) {
  PlacementRequest r;
  r.gpu = "7";
  auto c = PlanPlacement(topo_, pools_, r);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kNotFound);
  EXPECT_NE(c.status().message().find("no GPU '7' (known: 0, 1)"), std::string::npos);
  r = {};
  r.numa_node = 4;  // the GPU-memory node has no pool
  c = PlanPlacement(topo_, pools_, r);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kNotFound);
  r = {};
  r.tiers = {"fast"};
  c = PlanPlacement(topo_, pools_, r);
  EXPECT_EQ(c.status().code(), Code::kInvalidArgument);
  r = {};
  r.numa_node = 0;
  r.gpu = "0";
  EXPECT_EQ(PlanPlacement(topo_, pools_, r).status().code(), Code::kInvalidArgument);
  r = {};
  r.tiers = {"hbm"};
  r.strict = true;  // no HBM anywhere
  EXPECT_EQ(PlanPlacement(topo_, pools_, r).status().code(), Code::kNotFound);
}

TEST(LastCpuTest, ParsesProcStatWithSpacesInComm) {
  FakeFileSystem fs;
  std::string fields;
  for (int i = 3; i <= 52; ++i) fields += " " + std::to_string(i == 39 ? 7 : i);
  fs.AddFile("/proc/42/stat", "42 (a) b (c)" + fields + "\n");
  EXPECT_EQ(LastCpuOf(fs, 42), 7);
  EXPECT_EQ(LastCpuOf(fs, 43), std::nullopt);
  fs.AddFile("/proc/44/stat", "garbage");
  EXPECT_EQ(LastCpuOf(fs, 44), std::nullopt);
}

}  // namespace
}  // namespace cxlpool
