// NodeMemoryWatch on a FakeFileSystem tree and real pools (a LeaseManager
// harness): memory onlined after start raises a pool's capacity and restarts
// the warm reserve; a shrink below use is refused (warned once per change) and
// retried once leases are released; a shrink above use applies; a byte
// capacity is clamped to the new MemTotal; a garbled or unreadable meminfo
// leaves the pool alone; an unchanged MemTotal does nothing; devdax pools are
// never touched; a config reload resolves against the current MemTotal.
#include "pool/node_memory_watch.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "cxlpool/common/fs.h"
#include "reload/reload.h"
#include "test_util.h"

namespace cxlpool {
namespace {

using testing::FakeDaxControl;
using testing::Harness;
using testing::TestConfig;
using testing::TwoSocketCxl;

constexpr uint64_t kMiB = 1ull << 20;

std::string Joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  return out;
}

// What the daemon does on every tick: check, and restart reserve refills
// when a capacity changed.
MemoryWatchReport CheckAndRestock(NodeMemoryWatch& watch, const DaemonConfig& cfg, Harness& h) {
  MemoryWatchReport r = watch.Check(cfg, h.mgr->pools());
  if (r.resized) h.mgr->StartRefills();
  return r;
}

class NodeMemoryWatchTest : public ::testing::Test {
 protected:
  // The four memory nodes of TwoSocketCxl, each with `mem` bytes.
  void SetUpTree(uint64_t mem) {
    for (int n = 0; n < 4; ++n) SetMemTotal(n, mem);
  }
  void SetMemTotal(int node, uint64_t bytes) {
    std::string p = "Node " + std::to_string(node) + " ";
    fs_.AddFile("/sys/devices/system/node/node" + std::to_string(node) + "/meminfo",
                p + "MemTotal:       " + std::to_string(bytes / 1024) + " kB\n" + p +
                    "MemFree:        " + std::to_string(bytes / 2048) + " kB\n" + p +
                    "HugePages_Total:     0\n");
  }

  // A 64 MiB tree and a manager over it with the default config, a watch,
  // and connection 1 holding a 48 MiB lease on node0 (the shrink cases).
  struct Loaded {
    explicit Loaded(FakeFileSystem* fs)
        : h(TwoSocketCxl(64 * kMiB), TestConfig()), watch(fs, h.topo) {}
    Harness h;
    NodeMemoryWatch watch;
    uint64_t lease_id = 0;
  };
  std::unique_ptr<Loaded> LoadNode0() {
    SetUpTree(64 * kMiB);
    auto l = std::make_unique<Loaded>(&fs_);
    l->h.Connect(1);
    auto g = l->h.Alloc(1, 48 * kMiB, 0);
    EXPECT_TRUE(g.ok()) << g.status().ToString();
    if (g.ok()) l->lease_id = g->lease.id;
    return l;
  }

  FakeFileSystem fs_;
};

TEST_F(NodeMemoryWatchTest, UnchangedMemTotalDoesNothing) {
  SetUpTree(16 * kMiB);
  Harness h(TwoSocketCxl(16 * kMiB), TestConfig(2 * kMiB));
  NodeMemoryWatch watch(&fs_, h.topo);
  DaemonConfig cfg = TestConfig(2 * kMiB);
  for (int i = 0; i < 2; ++i) {
    auto r = CheckAndRestock(watch, cfg, h);
    EXPECT_TRUE(r.applied.empty()) << Joined(r.applied);
    EXPECT_TRUE(r.warnings.empty()) << Joined(r.warnings);
    EXPECT_FALSE(r.resized);
  }
  EXPECT_EQ(h.Pool("node0").capacity_bytes, 16 * kMiB);
  EXPECT_EQ(h.Pool("node0").reserve_building_bytes, 0u) << "refills were not restarted";
}

TEST_F(NodeMemoryWatchTest, GrowthRaisesCapacityAndRefillsTheReserve) {
  SetUpTree(16 * kMiB);
  // 50 % of 16 MiB: a 16 MiB reserve is held to the pool's 8 MiB for now.
  DaemonConfig cfg = TestConfig(16 * kMiB);
  cfg.pool_defaults.capacity.percent = 50;
  Harness h(TwoSocketCxl(16 * kMiB), cfg);
  h.mgr->StartRefills();
  h.Drain();
  ASSERT_EQ(h.Pool("node0").capacity_bytes, 8 * kMiB);
  ASSERT_EQ(h.Pool("node0").reserve_high_bytes, 8 * kMiB);
  ASSERT_EQ(h.Pool("node0").reserve_ready_bytes, 8 * kMiB);
  NodeMemoryWatch watch(&fs_, h.topo);

  SetMemTotal(0, 64 * kMiB);  // memory onlined into node0
  auto r = CheckAndRestock(watch, cfg, h);
  ASSERT_EQ(r.applied.size(), 1u) << Joined(r.applied);
  EXPECT_EQ(r.applied[0], "node0: MemTotal 16.0 MiB -> 64.0 MiB, capacity 8.0 MiB -> 32.0 MiB");
  EXPECT_TRUE(r.warnings.empty()) << Joined(r.warnings);
  EXPECT_TRUE(r.grew);
  EXPECT_EQ(h.Pool("node0").capacity_bytes, 32 * kMiB);
  EXPECT_EQ(h.Pool("node1").capacity_bytes, 8 * kMiB) << "other nodes unchanged";
  EXPECT_EQ(watch.applied_total(0), 64 * kMiB);
  h.Drain();  // the restarted refill builds the reserve that fits now
  EXPECT_EQ(h.Pool("node0").reserve_high_bytes, 16 * kMiB);
  EXPECT_EQ(h.Pool("node0").reserve_ready_bytes, 16 * kMiB);
  EXPECT_EQ(h.Pool("node1").reserve_ready_bytes, 8 * kMiB) << "other nodes unchanged";
  // Served from that reserve.
  h.Connect(1);
  auto g = h.Alloc(1, 16 * kMiB, 0);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_TRUE(g->lease.from_warm_stock);
  // Nothing more to do on the next tick.
  r = CheckAndRestock(watch, cfg, h);
  EXPECT_TRUE(r.applied.empty()) << Joined(r.applied);
}

TEST_F(NodeMemoryWatchTest, ShrinkBelowUseIsRefusedWarnedOnceAndRetriedAfterRelease) {
  DaemonConfig cfg = TestConfig();
  auto loaded = LoadNode0();
  ASSERT_NE(loaded->lease_id, 0u);
  Harness& h = loaded->h;
  NodeMemoryWatch& watch = loaded->watch;

  SetMemTotal(0, 32 * kMiB);  // memory offlined under the lease
  auto r = CheckAndRestock(watch, cfg, h);
  EXPECT_TRUE(r.applied.empty()) << Joined(r.applied);
  ASSERT_EQ(r.warnings.size(), 1u) << Joined(r.warnings);
  EXPECT_EQ(r.warnings[0],
            "node0: MemTotal 64.0 MiB -> 32.0 MiB, capacity 64.0 MiB -> 32.0 MiB refused: "
            "48.0 MiB in use; kept 64.0 MiB (retried on every check)");
  EXPECT_EQ(h.Pool("node0").capacity_bytes, 64 * kMiB);
  EXPECT_EQ(watch.applied_total(0), 64 * kMiB) << "still pending";
  // The same change is not warned again on the next ticks.
  r = CheckAndRestock(watch, cfg, h);
  EXPECT_TRUE(r.warnings.empty()) << Joined(r.warnings);
  EXPECT_EQ(h.Pool("node0").capacity_bytes, 64 * kMiB);
  // A further change is a new warning.
  SetMemTotal(0, 40 * kMiB);
  r = CheckAndRestock(watch, cfg, h);
  ASSERT_EQ(r.warnings.size(), 1u) << Joined(r.warnings);
  EXPECT_NE(r.warnings[0].find("MemTotal 64.0 MiB -> 40.0 MiB"), std::string::npos)
      << r.warnings[0];

  // The lease goes: once its memory is reclaimed the retry applies.
  ASSERT_TRUE(h.mgr->Release(1, loaded->lease_id).ok());
  h.Drain();
  r = CheckAndRestock(watch, cfg, h);
  ASSERT_EQ(r.applied.size(), 1u) << Joined(r.applied) << Joined(r.warnings);
  EXPECT_EQ(r.applied[0], "node0: MemTotal 64.0 MiB -> 40.0 MiB, capacity 64.0 MiB -> 40.0 MiB");
  EXPECT_EQ(h.Pool("node0").capacity_bytes, 40 * kMiB);
  EXPECT_FALSE(r.grew);
  // And a request for that node beyond its new capacity is refused.
  AllocParams p;
  p.size_bytes = 48 * kMiB;
  p.numa_node = 0;
  p.strict = true;
  auto big = h.Alloc(1, p);
  EXPECT_EQ(big.status().code(), Code::kResourceExhausted) << big.status().ToString();
}

TEST_F(NodeMemoryWatchTest, ShrinkAboveUseApplies) {
  SetUpTree(64 * kMiB);
  DaemonConfig cfg = TestConfig();
  cfg.pool_defaults.capacity.percent = 90;
  Harness h(TwoSocketCxl(64 * kMiB), cfg);
  NodeMemoryWatch watch(&fs_, h.topo);
  h.Connect(1);
  auto g = h.Alloc(1, 8 * kMiB, 1);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  SetMemTotal(1, 32 * kMiB);
  auto r = CheckAndRestock(watch, cfg, h);
  ASSERT_EQ(r.applied.size(), 1u) << Joined(r.warnings);
  EXPECT_TRUE(r.resized);
  EXPECT_FALSE(r.grew);
  auto pool = h.Pool("node1");
  EXPECT_EQ(pool.capacity_bytes, static_cast<uint64_t>(32 * kMiB * 0.9));
  EXPECT_EQ(pool.leased_bytes, 8 * kMiB) << "the lease is untouched";
  EXPECT_TRUE(h.mgr->Stat(1, g->lease.id).ok());
}

TEST_F(NodeMemoryWatchTest, ByteCapacityIsClampedToTheNewMemTotal) {
  SetUpTree(64 * kMiB);
  DaemonConfig cfg = TestConfig();
  cfg.pool_defaults.capacity.is_percent = false;
  cfg.pool_defaults.capacity.bytes = 48 * kMiB;  // "48M"
  Harness h(TwoSocketCxl(64 * kMiB), cfg);
  NodeMemoryWatch watch(&fs_, h.topo);
  ASSERT_EQ(h.Pool("node2").capacity_bytes, 48 * kMiB);
  SetMemTotal(2, 32 * kMiB);
  CheckAndRestock(watch, cfg, h);
  EXPECT_EQ(h.Pool("node2").capacity_bytes, 32 * kMiB) << "never more than the node has";
  SetMemTotal(2, 128 * kMiB);
  auto r = CheckAndRestock(watch, cfg, h);
  EXPECT_EQ(h.Pool("node2").capacity_bytes, 48 * kMiB) << "back to the configured bytes";
  ASSERT_EQ(r.applied.size(), 1u);
  EXPECT_EQ(r.applied[0], "node2: MemTotal 32.0 MiB -> 128.0 MiB, capacity 32.0 MiB -> 48.0 MiB");
  // MemTotal changes again, the capacity does not: recorded, no resize.
  SetMemTotal(2, 256 * kMiB);
  r = CheckAndRestock(watch, cfg, h);
  ASSERT_EQ(r.applied.size(), 1u);
  EXPECT_EQ(r.applied[0], "node2: MemTotal 128.0 MiB -> 256.0 MiB, capacity 48.0 MiB unchanged");
  EXPECT_FALSE(r.resized);
}

TEST_F(NodeMemoryWatchTest, GarbledOrUnreadableMeminfoLeavesThePoolAlone) {
  SetUpTree(64 * kMiB);
  DaemonConfig cfg = TestConfig();
  Harness h(TwoSocketCxl(64 * kMiB), cfg);
  NodeMemoryWatch watch(&fs_, h.topo);
  fs_.AddFile("/sys/devices/system/node/node0/meminfo", "Node 0 MemTotal: lots\n\x01garbage");
  fs_.FailPath("/sys/devices/system/node/node1/meminfo",
               Status(Code::kPermissionDenied, "node1/meminfo: permission denied"));
  auto r = CheckAndRestock(watch, cfg, h);
  EXPECT_TRUE(r.applied.empty()) << Joined(r.applied);
  ASSERT_EQ(r.warnings.size(), 2u) << Joined(r.warnings);
  EXPECT_NE(r.warnings[0].find("node0: cannot read MemTotal"), std::string::npos) << r.warnings[0];
  EXPECT_NE(r.warnings[0].find("no parsable MemTotal"), std::string::npos) << r.warnings[0];
  EXPECT_NE(r.warnings[1].find("node1: cannot read MemTotal"), std::string::npos) << r.warnings[1];
  EXPECT_NE(r.warnings[1].find("permission denied"), std::string::npos) << r.warnings[1];
  EXPECT_EQ(h.Pool("node0").capacity_bytes, 64 * kMiB);
  EXPECT_EQ(h.Pool("node1").capacity_bytes, 64 * kMiB);
  // Warned once, not on every tick.
  r = CheckAndRestock(watch, cfg, h);
  EXPECT_TRUE(r.warnings.empty()) << Joined(r.warnings);
  // Readable again with a new value: applied.
  SetMemTotal(0, 96 * kMiB);
  r = CheckAndRestock(watch, cfg, h);
  ASSERT_EQ(r.applied.size(), 1u) << Joined(r.warnings);
  EXPECT_EQ(h.Pool("node0").capacity_bytes, 96 * kMiB);
  // A missing file is the same.
  FakeFileSystem empty;
  NodeMemoryWatch none(&empty, h.topo);
  empty.AddDir("/sys/devices/system/node");
  r = CheckAndRestock(none, cfg, h);
  EXPECT_EQ(r.warnings.size(), 4u) << Joined(r.warnings);
  EXPECT_EQ(h.Pool("node2").capacity_bytes, 64 * kMiB);
}

TEST_F(NodeMemoryWatchTest, DevdaxPoolsAreNotTouched) {
  SetUpTree(64 * kMiB);
  FakeDaxControl dax;
  dax.AddRegion("dax_region0", 0, 32 * kMiB, 2 * kMiB, /*dynamic=*/true, 2);
  DaemonConfig cfg = TestConfig();
  cfg.devdax.push_back({"dax_region0", std::nullopt});
  Harness h(TwoSocketCxl(64 * kMiB), cfg, &dax);
  NodeMemoryWatch watch(&fs_, h.topo);
  uint64_t dax_cap = h.Pool("dax_region0").capacity_bytes;
  ASSERT_EQ(dax_cap, 32 * kMiB);
  SetMemTotal(2, 128 * kMiB);
  auto r = CheckAndRestock(watch, cfg, h);
  ASSERT_EQ(r.applied.size(), 1u) << Joined(r.applied);
  EXPECT_EQ(r.applied[0].rfind("node2:", 0), 0u) << r.applied[0];
  EXPECT_EQ(h.Pool("node2").capacity_bytes, 128 * kMiB);
  EXPECT_EQ(h.Pool("dax_region0").capacity_bytes, dax_cap);
  std::vector<std::string> applied, kept;
  for (Pool* p : h.mgr->pools()) {
    if (std::string(p->backing()) == "devdax") {
      EXPECT_FALSE(watch.ApplyForReload(p, cfg.pool_defaults.capacity, &applied, &kept));
    }
  }
  EXPECT_TRUE(applied.empty() && kept.empty());
  EXPECT_EQ(h.Pool("dax_region0").capacity_bytes, dax_cap);
}

TEST_F(NodeMemoryWatchTest, ReloadResolvesAgainstTheCurrentMemTotal) {
  SetUpTree(16 * kMiB);
  DaemonConfig current = TestConfig();
  Harness h(TwoSocketCxl(16 * kMiB), current);
  NodeMemoryWatch watch(&fs_, h.topo);
  SetMemTotal(0, 64 * kMiB);  // onlined; no tick ran yet
  DaemonConfig next = TestConfig();
  next.pool_defaults.capacity.percent = 50;
  ReloadOptions ro;
  ro.memory = &watch;
  ReloadReport r = ApplyConfig(next, h.topo, h.mgr.get(), &current, ro);
  EXPECT_EQ(h.Pool("node0").capacity_bytes, 32 * kMiB) << "50 % of the MemTotal now";
  EXPECT_EQ(h.Pool("node1").capacity_bytes, 8 * kMiB);
  EXPECT_NE(Joined(r.applied).find("node0 capacity 16.0 MiB -> 32.0 MiB (MemTotal 16.0 MiB -> "
                                   "64.0 MiB)"),
            std::string::npos)
      << Joined(r.applied);
  // The reload took the change: the next tick has nothing to do.
  auto c = CheckAndRestock(watch, current, h);
  EXPECT_TRUE(c.applied.empty()) << Joined(c.applied);
  // Without a watch the MemTotal discovered at start is used (as before).
  DaemonConfig again = TestConfig();
  r = ApplyConfig(again, h.topo, h.mgr.get(), &current);
  EXPECT_EQ(h.Pool("node0").capacity_bytes, 16 * kMiB);
}

TEST_F(NodeMemoryWatchTest, ReloadRefusalWithAMemTotalChangeIsRetriedByTheWatch) {
  DaemonConfig current = TestConfig();
  auto loaded = LoadNode0();
  ASSERT_NE(loaded->lease_id, 0u);
  Harness& h = loaded->h;
  NodeMemoryWatch& watch = loaded->watch;
  SetMemTotal(0, 32 * kMiB);
  ReloadOptions ro;
  ro.memory = &watch;
  ReloadReport r = ApplyConfig(TestConfig(), h.topo, h.mgr.get(), &current, ro);
  EXPECT_NE(Joined(r.kept).find("node0 capacity 32.0 MiB refused: 48.0 MiB in use"),
            std::string::npos)
      << Joined(r.kept);
  EXPECT_EQ(h.Pool("node0").capacity_bytes, 64 * kMiB);
  ASSERT_TRUE(h.mgr->Release(1, loaded->lease_id).ok());
  h.Drain();
  auto c = CheckAndRestock(watch, current, h);
  ASSERT_EQ(c.applied.size(), 1u) << Joined(c.warnings);
  EXPECT_EQ(h.Pool("node0").capacity_bytes, 32 * kMiB);
}

TEST_F(NodeMemoryWatchTest, WithoutNumaNodeDirectoriesNodeZeroIsProcMeminfo) {
  FakeFileSystem flat;
  flat.AddFile("/proc/meminfo", "MemTotal:       4194304 kB\nMemFree:  1024 kB\n");
  Topology t;
  NodeMemoryWatch watch(&flat, t);
  auto total = watch.ReadMemTotal(0);
  ASSERT_TRUE(total.ok()) << total.status().ToString();
  EXPECT_EQ(*total, 4ull << 30);
  EXPECT_EQ(watch.ReadMemTotal(1).status().code(), Code::kNotFound);
  EXPECT_FALSE(watch.applied_total(0).has_value());
}

}  // namespace
}  // namespace cxlpool
