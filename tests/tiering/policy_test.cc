// The tiering policy and its numbers, on values: heat decay, the token
// bucket, and every rule of Decide (tiering/policy.h) with the sentence
// that explains it. No clock but the numbers passed in.
#include "tiering/policy.h"

#include <gtest/gtest.h>

#include <cmath>

#include "tiering/temperature.h"

namespace cxlpool::tiering {
namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kGiB = 1ull << 30;
constexpr int64_t kSec = 1'000'000'000;

TEST(HeatTest, HalvesEveryHalfLife) {
  Heat h;
  h.Add(1000, 0, 10 * kSec);
  EXPECT_DOUBLE_EQ(h.At(0, 10 * kSec), 1000);
  EXPECT_NEAR(h.At(10 * kSec, 10 * kSec), 500, 1e-9);
  EXPECT_NEAR(h.At(30 * kSec, 10 * kSec), 125, 1e-9);
  // Adding later decays what was there first.
  h.Add(100, 10 * kSec, 10 * kSec);
  EXPECT_NEAR(h.At(10 * kSec, 10 * kSec), 600, 1e-9);
  // Time never runs backwards into growth; negatives are ignored.
  EXPECT_NEAR(h.At(0, 10 * kSec), 600, 1e-9);
  h.Add(-50, 10 * kSec, 10 * kSec);
  EXPECT_NEAR(h.At(10 * kSec, 10 * kSec), 600, 1e-9);
  h.Set(0, 10 * kSec);
  EXPECT_EQ(h.At(20 * kSec, 10 * kSec), 0);
}

TEST(RateLimiterTest, AverageStaysAtTheRateAndARangeIsNeverSplit) {
  // 100 MiB/s, burst one second.
  RateLimiter r(100 * kMiB, 0, 0);
  EXPECT_TRUE(r.TryTake(64 * kMiB, 0));
  EXPECT_FALSE(r.TryTake(64 * kMiB, 0));  // 36 MiB left: the range waits whole
  EXPECT_TRUE(r.TryTake(36 * kMiB, 0));
  EXPECT_FALSE(r.TryTake(1, 0));
  // 64 MiB are there after 0.64 s.
  int64_t wait = r.NsUntil(64 * kMiB, 0);
  EXPECT_NEAR(static_cast<double>(wait), 0.64e9, 0.01e9);
  EXPECT_FALSE(r.TryTake(64 * kMiB, wait - 10'000'000));
  EXPECT_TRUE(r.TryTake(64 * kMiB, wait + 1'000'000));
  // A range larger than the burst goes once the bucket is full, into debt.
  RateLimiter b(100 * kMiB, 0, 0);
  EXPECT_TRUE(b.Full(0));
  EXPECT_TRUE(b.TryTake(1 * kGiB, 0));
  EXPECT_LT(b.Available(0), 0);
  EXPECT_FALSE(b.Full(9 * kSec));
  EXPECT_TRUE(b.Full(11 * kSec));
  // Over 100 s, no more than rate x time + burst leaves.
  RateLimiter s(100 * kMiB, 0, 0);
  uint64_t taken = 0;
  for (int64_t t = 0; t <= 100 * kSec; t += kSec / 100) {
    while (s.TryTake(8 * kMiB, t)) taken += 8 * kMiB;
  }
  EXPECT_LE(taken, 100 * 100 * kMiB + 100 * kMiB);
  EXPECT_GE(taken, 100 * 100 * kMiB - 8 * kMiB);
  // 0: unlimited.
  RateLimiter u(0, 0, 0);
  for (int i = 0; i < 100; ++i) EXPECT_TRUE(u.TryTake(kGiB, 0));
  EXPECT_EQ(u.NsUntil(kGiB, 0), 0);
}

TEST(HintTest, NamesAndValuesMatchTheWire) {
  EXPECT_EQ(HintFromInt(1), Hint::kHot);
  EXPECT_EQ(HintFromInt(4), Hint::kDontNeed);
  EXPECT_FALSE(HintFromInt(0));
  EXPECT_FALSE(HintFromInt(5));
  EXPECT_EQ(ParseHint("will_need"), Hint::kWillNeed);
  EXPECT_EQ(ParseHint("dontneed"), Hint::kDontNeed);
  EXPECT_FALSE(ParseHint("warm"));
  EXPECT_STREQ(HintName(Hint::kCold), "cold");
}

// A node with a DRAM pool (node0) and a CXL pool (node2) of 1 GiB each.
class PolicyTest : public ::testing::Test {
 protected:
  PolicyTest() {
    cfg.hot_threshold = 1.0;
    cfg.cold_threshold = 0.1;
    cfg.min_residency_ns = 30 * kSec;
    cfg.fast_low_watermark = 0.10;
    cfg.fast_high_watermark = 0.25;
    cfg.slow_reserve = 0.0;
    pools.push_back(Pool("node0", 0, "dram", kGiB, kGiB));
    pools.push_back(Pool("node2", 2, "cxl", kGiB, kGiB));
  }
  static PoolState Pool(std::string name, int node, std::string kind, uint64_t cap, uint64_t free) {
    PoolState p;
    p.name = std::move(name);
    p.numa_node = node;
    p.kind = kind;
    p.tier = TierClassOfKind(kind, true);
    p.capacity_bytes = cap;
    p.free_bytes = free;
    return p;
  }
  static UnitState Unit(uint64_t id, std::string pool, double temp, uint64_t len = 64 * kMiB) {
    UnitState u;
    u.lease_id = id;
    u.length = len;
    u.pool = std::move(pool);
    u.temperature = temp;
    u.promote_pool = "node0";
    u.demote_pool = "node2";
    return u;
  }
  PoolState& P(const std::string& name) {
    for (auto& p : pools)
      if (p.name == name) return p;
    throw std::runtime_error("no pool");
  }
  PolicyOutput Run(int64_t budget = INT64_MAX / 2) {
    return Decide(cfg, pools, units, now, budget);
  }
  std::string Stay(const PolicyOutput& o, uint64_t id) {
    auto it = o.stays.find({id, 0});
    return it == o.stays.end() ? std::string("<none>") : it->second;
  }

  PolicyConfig cfg;
  std::vector<PoolState> pools;
  std::vector<UnitState> units;
  int64_t now = 1000 * kSec;
};

TEST_F(PolicyTest, PromotesHotRangesAndSaysWhy) {
  units.push_back(Unit(1, "node2", 3.5));
  units.back().evidence = "holders copied 224 MiB in";
  units.push_back(Unit(2, "node2", 0.5));
  PolicyOutput o = Run();
  ASSERT_EQ(o.decisions.size(), 1u);
  const Decision& d = o.decisions[0];
  EXPECT_EQ(d.direction, Direction::kPromote);
  EXPECT_EQ(d.lease_id, 1u);
  EXPECT_EQ(d.from_pool, "node2");
  EXPECT_EQ(d.to_pool, "node0");
  EXPECT_EQ(d.rule, "hot");
  EXPECT_NE(d.why.find("hot (temperature 3.50 >= hot 1.00, priority 0)"), std::string::npos)
      << d.why;
  EXPECT_NE(d.why.find("holders copied 224 MiB in"), std::string::npos) << d.why;
  // Lease 2 sits between the thresholds: hysteresis.
  EXPECT_NE(Stay(o, 2).find("between cold 0.10 and hot 1.00"), std::string::npos) << Stay(o, 2);
}

TEST_F(PolicyTest, HysteresisBetweenThresholdsAndAfterAMove) {
  // Just under hot, on CXL: stays; just over cold, on DRAM under pressure: stays.
  P("node0").free_bytes = 50 * kMiB;  // below the low watermark (~102 MiB)
  units.push_back(Unit(1, "node2", 0.99));
  units.push_back(Unit(2, "node0", 0.11));
  PolicyOutput o = Run();
  EXPECT_TRUE(o.decisions.empty());
  EXPECT_NE(Stay(o, 1).find("hysteresis"), std::string::npos);
  EXPECT_NE(Stay(o, 2).find("hysteresis"), std::string::npos);
  // Cold now, but it moved 10 s ago: min residency holds it.
  units[1].temperature = 0.0;
  units[1].last_moved_ns = now - 10 * kSec;
  o = Run();
  EXPECT_TRUE(o.decisions.empty());
  EXPECT_NE(Stay(o, 2).find("moved 10 s ago; stays at least 30 s"), std::string::npos)
      << Stay(o, 2);
  // 31 s later it may go.
  now += 21 * kSec;
  o = Run();
  ASSERT_EQ(o.decisions.size(), 1u);
  EXPECT_EQ(o.decisions[0].direction, Direction::kDemote);
  EXPECT_EQ(o.decisions[0].rule, "pressure");
}

TEST_F(PolicyTest, PressureDemotesColdestOfTheLowestPriorityFirstUntilTheHighWatermark) {
  // 64 MiB free of 1 GiB: needs 256 MiB - 64 MiB = 192 MiB back (3 ranges).
  P("node0").free_bytes = 64 * kMiB;
  for (uint64_t id = 1; id <= 6; ++id) units.push_back(Unit(id, "node0", 0.0));
  units[0].priority = 5;        // high class: last
  units[1].temperature = 0.05;  // a little warmer
  units[2].priority = 0, units[2].temperature = 0.01;
  units[5].temperature = 2.0;  // hot: never demoted for pressure
  PolicyOutput o = Run();
  ASSERT_EQ(o.decisions.size(), 3u);
  std::vector<uint64_t> ids;
  for (const auto& d : o.decisions) {
    EXPECT_EQ(d.direction, Direction::kDemote);
    EXPECT_EQ(d.to_pool, "node2");
    EXPECT_NE(d.why.find("node0 is under pressure"), std::string::npos) << d.why;
    ids.push_back(d.lease_id);
  }
  // Priority 0 first, coldest first: 4 and 5 (0.0), then 3 (0.01); never
  // 2 (warmer), 1 (priority 5) or 6 (hot).
  EXPECT_EQ(ids, (std::vector<uint64_t>{4, 5, 3}));
  ASSERT_FALSE(o.pressure.empty());
  EXPECT_NE(o.pressure[0].find("under pressure"), std::string::npos) << o.pressure[0];
}

TEST_F(PolicyTest, NoPressureNoDemotionOfColdRanges) {
  units.push_back(Unit(1, "node0", 0.0));
  PolicyOutput o = Run();
  EXPECT_TRUE(o.decisions.empty());
  EXPECT_NE(Stay(o, 1).find("is not under pressure"), std::string::npos) << Stay(o, 1);
}

TEST_F(PolicyTest, PromotionKeepsTheLowWatermarkAndHigherPriorityGoesFirst) {
  // 200 MiB free, low watermark ~102 MiB: room for one 64 MiB range only.
  P("node0").free_bytes = 200 * kMiB;
  units.push_back(Unit(1, "node2", 5.0));
  units.push_back(Unit(2, "node2", 1.5));
  units[1].priority = 7;
  PolicyOutput o = Run();
  ASSERT_EQ(o.decisions.size(), 1u);
  EXPECT_EQ(o.decisions[0].lease_id, 2u);  // priority before temperature
  EXPECT_NE(Stay(o, 1).find("node0 has 136.0 MiB free, needs 64.0 MiB"), std::string::npos)
      << Stay(o, 1);
}

TEST_F(PolicyTest, DemandDemotesColderRangesOfTheSameOrLowerPriority) {
  // DRAM nearly full (free 110 MiB, just above the low watermark): a hot
  // priority-3 range needs room; cold ranges of priority <= 3 make it.
  P("node0").free_bytes = 110 * kMiB;
  units.push_back(Unit(1, "node2", 4.0));
  units[0].priority = 3;
  units.push_back(Unit(2, "node0", 0.0));
  units[1].priority = 9;  // higher class: not a victim
  units.push_back(Unit(3, "node0", 0.02));
  units[2].priority = 3;
  PolicyOutput o = Run();
  ASSERT_EQ(o.decisions.size(), 2u);
  EXPECT_EQ(o.decisions[0].direction, Direction::kDemote);
  EXPECT_EQ(o.decisions[0].lease_id, 3u);
  EXPECT_EQ(o.decisions[0].rule, "demand");
  EXPECT_NE(o.decisions[0].why.find("makes room on node0 for hot lease 1 (priority 3)"),
            std::string::npos)
      << o.decisions[0].why;
  EXPECT_EQ(o.decisions[1].direction, Direction::kPromote);
  EXPECT_EQ(o.decisions[1].lease_id, 1u);
  // Without a victim of its class it stays, and says how much room there was.
  units[2].priority = 4;
  o = Run();
  EXPECT_TRUE(o.decisions.empty());
  EXPECT_NE(Stay(o, 1).find("not enough to make room"), std::string::npos) << Stay(o, 1);
}

TEST_F(PolicyTest, WhenEverythingIsWarmTheHottestSwapInForMuchColderRanges) {
  // DRAM full of warm ranges (none cold): a range 5x hotter than the
  // coldest of them takes its place; one only 2x hotter does not (hysteresis).
  P("node0").free_bytes = 110 * kMiB;
  units.push_back(Unit(1, "node2", 10.0));
  units.push_back(Unit(2, "node0", 2.0));
  units.push_back(Unit(3, "node0", 6.0));
  PolicyOutput o = Run();
  ASSERT_EQ(o.decisions.size(), 2u);
  EXPECT_EQ(o.decisions[0].lease_id, 2u);
  EXPECT_NE(o.decisions[0].why.find("this range is 5.00x colder (temperature 2.00 vs 10.0; "
                                    "swap_ratio 4.00)"),
            std::string::npos)
      << o.decisions[0].why;
  EXPECT_EQ(o.decisions[1].lease_id, 1u);
  units[0].temperature = 5.0;  // only 2.5x hotter than lease 2
  o = Run();
  EXPECT_TRUE(o.decisions.empty());
  EXPECT_NE(Stay(o, 1).find("cold or 4.00x colder"), std::string::npos) << Stay(o, 1);
  cfg.swap_ratio = 0;  // off: only cold ranges make room
  units[0].temperature = 100.0;
  EXPECT_TRUE(Run().decisions.empty());
}

TEST_F(PolicyTest, UrgentHintsActWithoutPressureOrHeat) {
  units.push_back(Unit(1, "node2", 0.0));
  units[0].urgent = Hint::kWillNeed;
  units.push_back(Unit(2, "node0", 0.5));
  units[1].urgent = Hint::kDontNeed;
  PolicyOutput o = Run();
  ASSERT_EQ(o.decisions.size(), 2u);
  EXPECT_EQ(o.decisions[0].lease_id, 1u);
  EXPECT_EQ(o.decisions[0].rule, "will_need");
  EXPECT_EQ(o.decisions[1].lease_id, 2u);
  EXPECT_EQ(o.decisions[1].rule, "dont_need");
  EXPECT_NE(o.decisions[1].why.find("dont_need hint"), std::string::npos);
}

TEST_F(PolicyTest, OptedOutAndImmovableLeasesStayWithTheirReason) {
  units.push_back(Unit(1, "node2", 9.0));
  units[0].opted_out = true;
  units.push_back(Unit(2, "node2", 9.0));
  units[1].not_movable = "devdax memory cannot move";
  units.push_back(Unit(3, "node2", 9.0));
  units[2].cooperative = true;
  units[2].cooperative_blocked = "holder pid 7 did not answer";
  units.push_back(Unit(4, "node2", 9.0));
  units[3].cooperative = true;  // may be asked
  PolicyOutput o = Run();
  ASSERT_EQ(o.decisions.size(), 1u);
  EXPECT_EQ(o.decisions[0].lease_id, 4u);
  EXPECT_TRUE(o.decisions[0].cooperative);
  EXPECT_NE(o.decisions[0].why.find("cooperative"), std::string::npos);
  EXPECT_EQ(Stay(o, 1), "opted out: pinned to its tier");
  EXPECT_EQ(Stay(o, 2), "devdax memory cannot move");
  EXPECT_EQ(Stay(o, 3), "holder pid 7 did not answer");
}

TEST_F(PolicyTest, TheRateBudgetEndsTheRoundAndTheRestWaits) {
  for (uint64_t id = 1; id <= 4; ++id) units.push_back(Unit(id, "node2", 2.0 + id));
  // 150 MiB of budget: two 64 MiB ranges fit whole, the rest wait.
  PolicyOutput o = Run(150 * kMiB);
  ASSERT_EQ(o.decisions.size(), 2u);
  EXPECT_EQ(o.decisions[0].lease_id, 4u);  // hottest first
  EXPECT_EQ(o.decisions[1].lease_id, 3u);
  EXPECT_NE(Stay(o, 2).find("waits for the rate limit"), std::string::npos) << Stay(o, 2);
  // Not enough for one range: nothing moves, everything says so.
  o = Run(63 * kMiB);
  EXPECT_TRUE(o.decisions.empty());
  EXPECT_NE(Stay(o, 4).find("waits for the rate limit"), std::string::npos);
}

TEST_F(PolicyTest, NearestFastPoolIsTheTargetAndAHotRangeThereStays) {
  pools.push_back(Pool("node1", 1, "dram", kGiB, kGiB));
  units.push_back(Unit(1, "node1", 4.0));  // hot, on the wrong socket's DRAM
  units.push_back(Unit(2, "node0", 4.0));  // hot, already where it belongs
  PolicyOutput o = Run();
  ASSERT_EQ(o.decisions.size(), 1u);
  EXPECT_EQ(o.decisions[0].lease_id, 1u);
  EXPECT_EQ(o.decisions[0].from_pool, "node1");
  EXPECT_EQ(o.decisions[0].to_pool, "node0");
  EXPECT_NE(Stay(o, 2).find("already on node0"), std::string::npos) << Stay(o, 2);
}

TEST_F(PolicyTest, SlowPoolsKeepTheirReserve) {
  cfg.slow_reserve = 0.5;
  P("node0").free_bytes = 10 * kMiB;
  P("node2").free_bytes = 540 * kMiB;  // 512 MiB reserve: room for 28 MiB
  units.push_back(Unit(1, "node0", 0.0));
  PolicyOutput o = Run();
  EXPECT_TRUE(o.decisions.empty());
  EXPECT_NE(Stay(o, 1).find("(reserve)"), std::string::npos) << Stay(o, 1);
}

TEST(PolicyConfigTest, InconsistentSettingsAreNamed) {
  PolicyConfig c;
  EXPECT_EQ(CheckPolicyConfig(c), "");
  c.hot_threshold = 0.1;
  c.cold_threshold = 0.1;
  EXPECT_NE(CheckPolicyConfig(c).find("hot_threshold"), std::string::npos);
  c = PolicyConfig();
  c.fast_low_watermark = 0.3;
  c.fast_high_watermark = 0.2;
  EXPECT_NE(CheckPolicyConfig(c).find("watermarks"), std::string::npos);
}

TEST(TierClassTest, KindsMapToTiers) {
  EXPECT_EQ(TierClassOfKind("dram", true), TierClass::kFast);
  EXPECT_EQ(TierClassOfKind("cxl", true), TierClass::kSlow);
  EXPECT_EQ(TierClassOfKind("nvm", true), TierClass::kSlow);
  EXPECT_EQ(TierClassOfKind("hbm", true), TierClass::kOther);
  EXPECT_EQ(TierClassOfKind("cxl", false), TierClass::kOther);  // devdax
}

}  // namespace
}  // namespace cxlpool::tiering
