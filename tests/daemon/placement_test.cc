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
  r.numa_node = 4;  // the GPU-memory node exists but has no pool: not "not found"
  c = PlanPlacement(topo_, pools_, r);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kUnsupported);
  EXPECT_NE(c.status().message().find("NUMA node 4 (kind gpu) is not pooled: GPU memory"),
            std::string::npos)
      << c.status().message();
  EXPECT_NE(c.status().message().find("no config key pools it"), std::string::npos);
  r.numa_node = 9;  // no such node
  c = PlanPlacement(topo_, pools_, r);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kNotFound);
  EXPECT_NE(c.status().message().find("no NUMA node 9 (nodes: 0, 1, 2, 3, 4;"), std::string::npos)
      << c.status().message();
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

// A node the config turned off exists: the refusal names the key that pools it.
TEST(PlacementUnpooled, NodeTurnedOffByConfigNamesTheKey) {
  Topology topo = TwoSocketCxl();
  DaemonConfig cfg = TestConfig();
  PoolConfig off = cfg.pool_defaults;
  off.enabled = false;
  off.enabled_explicitly = true;
  cfg.node_pools[2] = off;
  PoolBuildOptions o;
  o.bind = false;
  auto owned = BuildPools(topo, cfg, o, nullptr);
  ASSERT_TRUE(owned.ok()) << owned.status().ToString();
  std::vector<Pool*> pools;
  for (auto& p : *owned) pools.push_back(p.get());
  PlacementRequest r;
  r.numa_node = 2;
  auto c = PlanPlacement(topo, pools, r);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kUnsupported);
  EXPECT_NE(c.status().message().find("NUMA node 2 (kind cxl) is not pooled: excluded by config "
                                      "([pools.node.2] enabled = false); set enabled = true"),
            std::string::npos)
      << c.status().message();
  r.numa_node = 1;  // its neighbours still serve
  EXPECT_TRUE(PlanPlacement(topo, pools, r).ok());
}

// Zones: node0/1 DRAM in kernel zones, node2 CXL all ZONE_MOVABLE (a pin
// moves its pages off), node3 CXL with both (mixed).
class LongTermPinPlacementTest : public ::testing::Test {
 protected:
  void SetUp() override { Build(TestConfig()); }
  void Build(const DaemonConfig& cfg) {
    topo_ = TwoSocketCxl();
    for (auto& n : topo_.numa_nodes) {
      n.kernel_zone_bytes = 64ull << 20;
      n.movable_bytes = 0;
    }
    topo_.numa_nodes[2].kernel_zone_bytes = 0;
    topo_.numa_nodes[2].movable_bytes = 64ull << 20;
    topo_.numa_nodes[3].kernel_zone_bytes = 16ull << 20;
    topo_.numa_nodes[3].movable_bytes = 48ull << 20;
    DaxDevice d;
    d.name = "dax0.0";
    d.mode = "system-ram";
    d.target_node = 2;
    topo_.dax_devices.push_back(d);
    PoolBuildOptions o;
    o.bind = false;
    owned_.clear();
    pools_.clear();
    auto pools = BuildPools(topo_, cfg, o, nullptr);
    ASSERT_TRUE(pools.ok());
    owned_ = std::move(*pools);
    for (auto& p : owned_) pools_.push_back(p.get());
  }
  std::vector<Candidate> Plan(const PlacementRequest& r) {
    auto c = PlanPlacement(topo_, pools_, r);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? *c : std::vector<Candidate>{};
  }
  static std::vector<int> Nodes(const std::vector<Candidate>& c) {
    std::vector<int> out;
    for (const auto& x : c) out.push_back(x.pool->numa_node());
    return out;
  }
  Topology topo_;
  std::vector<std::unique_ptr<Pool>> owned_;
  std::vector<Pool*> pools_;
};

TEST_F(LongTermPinPlacementTest, SkipsMovableOnlyNodesInFallback) {
  PlacementRequest r;
  r.gpu = "0";
  r.tiers = {"cxl"};
  // Without a pin the CXL node next to GPU 0 comes first.
  EXPECT_EQ(Nodes(Plan(r)), (std::vector<int>{2, 3, 0, 1}));
  r.long_term_pin = true;
  auto c = Plan(r);
  EXPECT_EQ(Nodes(c), (std::vector<int>{3, 0, 1}));
  ASSERT_FALSE(c.empty());
  EXPECT_TRUE(c[0].settle);  // mixed: moved into its kernel zones at build
  EXPECT_FALSE(c[1].settle);
  EXPECT_NE(c[0].reason.find("skipped node2"), std::string::npos) << c[0].reason;
  EXPECT_NE(c[0].reason.find("kernel zones before the grant"), std::string::npos) << c[0].reason;
  // A named movable node falls back too.
  r = {};
  r.numa_node = 2;
  r.long_term_pin = true;
  EXPECT_EQ(Nodes(Plan(r)), (std::vector<int>{0, 1, 3}));
}

TEST_F(LongTermPinPlacementTest, StrictOnAMovableNodeIsRefusedWithTheRemedy) {
  PlacementRequest r;
  r.numa_node = 2;
  r.strict = true;
  r.long_term_pin = true;
  auto c = PlanPlacement(topo_, pools_, r);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kUnsupported);
  const std::string& m = c.status().message();
  EXPECT_NE(m.find("node 2 cannot hold a long-term pin"), std::string::npos) << m;
  EXPECT_NE(m.find("64.0 MiB memory is all in ZONE_MOVABLE"), std::string::npos) << m;
  EXPECT_NE(m.find("daxctl offline-memory dax0.0 && daxctl online-memory --no-movable dax0.0"),
            std::string::npos)
      << m;
  // Strict on the mixed node is fine (settled), and so is the same request
  // without a pin.
  r.numa_node = 3;
  auto m3 = Plan(r);
  ASSERT_EQ(m3.size(), 1u);
  EXPECT_TRUE(m3[0].settle);
  r.numa_node = 2;
  r.long_term_pin = false;
  EXPECT_EQ(Nodes(Plan(r)), (std::vector<int>{2}));
}

TEST_F(LongTermPinPlacementTest, AllowAndRefuseOverrides) {
  DaemonConfig cfg = TestConfig();
  PoolConfig allow = cfg.pool_defaults;
  allow.long_term_pins = LongTermPinPolicy::kAllow;
  PoolConfig refuse = cfg.pool_defaults;
  refuse.long_term_pins = LongTermPinPolicy::kRefuse;
  cfg.node_pools[2] = allow;
  cfg.node_pools[0] = refuse;
  Build(cfg);
  PlacementRequest r;
  r.numa_node = 2;
  r.strict = true;
  r.long_term_pin = true;
  auto c = Plan(r);  // forced: the admin accepts that the pin moves the pages
  ASSERT_EQ(c.size(), 1u);
  EXPECT_FALSE(c[0].settle);
  EXPECT_NE(c[0].reason.find("long_term_pins = \"allow\""), std::string::npos) << c[0].reason;
  r.numa_node = 0;
  auto refused = PlanPlacement(topo_, pools_, r);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("takes no long-term pinned leases"), std::string::npos);
  r.strict = false;
  EXPECT_EQ(Nodes(Plan(r)), (std::vector<int>{2, 1, 3}));
}

TEST_F(LongTermPinPlacementTest, NothingLeftIsRefusedAndExcludedPoolsFallBack) {
  PlacementRequest r;
  r.tiers = {"cxl"};
  r.strict = true;
  r.long_term_pin = true;
  r.home_node = 0;
  // The strict choice is node 2: refused.
  EXPECT_EQ(PlanPlacement(topo_, pools_, r).status().code(), Code::kUnsupported);
  // A build on mixed node 3 failed for this request: it is excluded, and a
  // named node that was excluded falls back by distance from it.
  PlacementRequest e;
  e.numa_node = 3;
  e.long_term_pin = true;
  for (Pool* p : pools_)
    if (p->numa_node() == 3) e.exclude.push_back(p);
  EXPECT_EQ(Nodes(Plan(e)), (std::vector<int>{1, 0}));
}

TEST(LastCpuTest, ParsesProcStatWithSpacesInComm) {
  FakeFileSystem fs;
  std::string fields;
  for (int i = 3; i <= 52; ++i) fields.append(" ").append(std::to_string(i == 39 ? 7 : i));
  fs.AddFile("/proc/42/stat", "42 (a) b (c)" + fields + "\n");
  EXPECT_EQ(LastCpuOf(fs, 42), 7);
  EXPECT_EQ(LastCpuOf(fs, 43), std::nullopt);
  fs.AddFile("/proc/44/stat", "garbage");
  EXPECT_EQ(LastCpuOf(fs, 44), std::nullopt);
}

}  // namespace
}  // namespace cxlpool
