// LeaseBook on values: heat from signals and hints (the owner's steer, another
// holder's only warm), heat carried over when a lease is cut differently, and
// the bookkeeping of refusals, moves and gone leases.
#include "tiering/lease_book.h"

#include <gtest/gtest.h>

namespace cxlpool::tiering {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

LeaseFacts Lease(uint64_t id, std::vector<uint64_t> unit_lengths) {
  LeaseFacts f;
  f.id = id;
  uint64_t off = 0;
  for (uint64_t len : unit_lengths) {
    UnitFacts u;
    u.offset = off;
    u.length = len;
    u.pool = "dram0";
    f.units.push_back(u);
    off += len;
  }
  f.size_bytes = off;
  return f;
}

RangeSignal Range(uint64_t offset, uint64_t length, uint64_t read, std::optional<Hint> hint = {}) {
  RangeSignal s;
  s.lease_id = 1;
  s.offset = offset;
  s.length = length;
  s.bytes_read = read;
  s.hint = hint;
  return s;
}

class LeaseBookTest : public ::testing::Test {
 protected:
  LeaseBookTest() {
    options_.policy.hot_threshold = 1.0;
    options_.policy.cold_threshold = 0.1;
    options_.hint_boost = 2.0;
  }
  double Temp(uint64_t id, uint32_t unit) { return book_.Temperature(*book_.Unit(id, unit)); }

  FakeClock clock_;
  TieringOptions options_;
  LeaseBook book_{&clock_, options_};
};

TEST_F(LeaseBookTest, SignalsHeatTheUnitsTheyOverlap) {
  LeaseFacts f = Lease(1, {4 * kMiB, 4 * kMiB});
  // 8 MiB copied through the middle 4 MiB: half of it on each unit.
  book_.Signal(f, Range(2 * kMiB, 4 * kMiB, 8 * kMiB), true, clock_.MonotonicNs());
  EXPECT_DOUBLE_EQ(Temp(1, 0), 1.0);
  EXPECT_DOUBLE_EQ(Temp(1, 1), 1.0);
  EXPECT_EQ(book_.Unit(1, 0)->bytes_read, 4 * kMiB);
  EXPECT_NE(book_.Evidence(*book_.Unit(1, 0)).find("since start"), std::string::npos);
}

TEST_F(LeaseBookTest, ColdHintsActOnlyOnWholeUnits) {
  LeaseFacts f = Lease(1, {4 * kMiB, 4 * kMiB});
  const int64_t now = clock_.MonotonicNs();
  book_.Signal(f, Range(0, 8 * kMiB, 0, Hint::kWillNeed), true, now);
  EXPECT_DOUBLE_EQ(Temp(1, 0), 2.0);  // hint_boost x hot
  EXPECT_EQ(book_.Unit(1, 0)->urgent, Hint::kWillNeed);
  // A dont_need over unit 0 and part of unit 1: only unit 0 turns cold.
  book_.Signal(f, Range(0, 6 * kMiB, 0, Hint::kDontNeed), true, now);
  EXPECT_DOUBLE_EQ(Temp(1, 0), 0.0);
  EXPECT_EQ(book_.Unit(1, 0)->urgent, Hint::kDontNeed);
  EXPECT_DOUBLE_EQ(Temp(1, 1), 2.0);
  EXPECT_EQ(book_.Unit(1, 1)->urgent, Hint::kWillNeed);
  EXPECT_EQ(book_.Unit(1, 1)->hints, 2u);
}

TEST_F(LeaseBookTest, AnotherHoldersHintOnlyKeepsWarm) {
  LeaseFacts f = Lease(1, {4 * kMiB});
  book_.Signal(f, Range(0, 4 * kMiB, 0, Hint::kWillNeed), false, clock_.MonotonicNs());
  EXPECT_DOUBLE_EQ(Temp(1, 0), 0.55);  // halfway between cold and hot
  EXPECT_FALSE(book_.Unit(1, 0)->urgent);
  book_.Signal(f, Range(0, 4 * kMiB, 0, Hint::kDontNeed), false, clock_.MonotonicNs());
  EXPECT_DOUBLE_EQ(Temp(1, 0), 0.55);
}

TEST_F(LeaseBookTest, HeatCarriesOverWhenRecut) {
  LeaseFacts f = Lease(1, {8 * kMiB});
  book_.Signal(f, Range(0, 8 * kMiB, 8 * kMiB), true, clock_.MonotonicNs());
  book_.Moved(1, 0, Direction::kPromote);
  const int64_t moved = book_.Unit(1, 0)->last_moved_ns;
  book_.Track(Lease(1, {2 * kMiB, 6 * kMiB}));
  EXPECT_DOUBLE_EQ(Temp(1, 0), 1.0);
  EXPECT_DOUBLE_EQ(Temp(1, 1), 1.0);
  EXPECT_EQ(book_.Unit(1, 1)->last_moved_ns, moved);
}

TEST_F(LeaseBookTest, MovesSpendTheHintTheyAnswer) {
  LeaseFacts f = Lease(1, {4 * kMiB});
  book_.Signal(f, Range(0, 4 * kMiB, 0, Hint::kWillNeed), true, clock_.MonotonicNs());
  book_.Moved(1, 0, Direction::kDemote);
  EXPECT_EQ(book_.Unit(1, 0)->urgent, Hint::kWillNeed);
  book_.Moved(1, 0, Direction::kPromote);
  EXPECT_FALSE(book_.Unit(1, 0)->urgent);
}

TEST_F(LeaseBookTest, RefusalsPinsAndGoneLeases) {
  book_.Track(Lease(1, {4 * kMiB}));
  book_.Track(Lease(2, {4 * kMiB}));
  book_.Refuse(1, 0, 99, "no room", true);
  EXPECT_EQ(book_.Unit(1, 0)->refused_until_ns, 99);
  EXPECT_EQ(book_.Unit(1, 0)->verdict, "no room");
  book_.Refuse(1, 5, 99, "no such unit");  // ignored
  book_.Slot(2).pinned_by = {3, 4};
  book_.DropPins(3);
  EXPECT_EQ(book_.Find(2)->pinned_by, (std::set<ConnId>{4}));
  book_.CoopSkipped(2, 77, "declined");
  EXPECT_EQ(book_.Find(2)->coop_retry_ns, 77);
  EXPECT_EQ(book_.KeepOnly({2}), (std::vector<uint64_t>{1}));
  EXPECT_EQ(book_.Find(1), nullptr);
  EXPECT_NE(book_.Find(2), nullptr);
}

}  // namespace
}  // namespace cxlpool::tiering
