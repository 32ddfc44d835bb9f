#include "server/busy_budget.h"

#include <gtest/gtest.h>

#include <chrono>

namespace cxlpool {
namespace {

using std::chrono::milliseconds;
using Clock = BusyBudget::Clock;

TEST(BusyBudget, OffNeverThrottles) {
  BusyBudget b;
  const auto t = Clock::now();
  b.SetInFlight(1, 256, t);
  b.SetInFlight(2, 1, t);
  b.Charge(1, std::chrono::seconds(5), t);
  b.Charge(2, milliseconds(1), t);
  EXPECT_FALSE(b.Throttled(1, t));
  EXPECT_EQ(b.charged_ns(1), 5'000'000'000u);
}

TEST(BusyBudget, AFloodNextToALightTenantIsHeldToItsBudget) {
  BusyBudget b(milliseconds(250));  // a bucket of 25 ms
  auto t = Clock::now();
  b.SetInFlight(1, 256, t);  // the flood
  b.SetInFlight(2, 1, t);    // a client doing one request at a time
  b.Charge(2, milliseconds(1), t);
  b.Charge(1, milliseconds(20), t);
  EXPECT_FALSE(b.Throttled(1, t)) << "within its burst";
  b.Charge(1, milliseconds(10), t);  // 5 ms over
  EXPECT_TRUE(b.Throttled(1, t));
  EXPECT_FALSE(b.Throttled(2, t));
  // 5 ms of debt refill in 20 ms at 250 ms a second.
  const auto at = b.RefilledAt(1, t);
  EXPECT_GE(at - t, milliseconds(19));
  EXPECT_LE(at - t, milliseconds(21));
  EXPECT_FALSE(b.Throttled(1, at));
  EXPECT_EQ(b.throttled(), 1u);
}

TEST(BusyBudget, TheLightTenantIsNeverThrottledForItsOwnTime) {
  // A client doing cheap requests back to back takes a lot of loop time;
  // its demand (one in flight) is what sets it apart from the flood.
  BusyBudget b(milliseconds(250));
  auto t = Clock::now();
  b.SetInFlight(1, 256, t);
  b.SetInFlight(2, 1, t);
  b.Charge(1, milliseconds(100), t);
  b.Charge(2, milliseconds(900), t);
  EXPECT_FALSE(b.Throttled(2, t));
  EXPECT_TRUE(b.Throttled(1, t));
}

TEST(BusyBudget, SimilarDemandOrAloneIsNotThrottled) {
  BusyBudget b(milliseconds(250));
  auto t = Clock::now();
  b.SetInFlight(1, 64, t);
  b.Charge(1, milliseconds(500), t);
  EXPECT_FALSE(b.Throttled(1, t)) << "alone: the daemon stays work-conserving";
  b.SetInFlight(2, 40, t);
  b.Charge(2, milliseconds(500), t);
  EXPECT_FALSE(b.Throttled(1, t)) << "two heavy tenants of similar demand";
  EXPECT_FALSE(b.Throttled(2, t));
}

TEST(BusyBudget, AQuietTenantStopsCounting) {
  BusyBudget b(milliseconds(250));
  auto t = Clock::now();
  b.SetInFlight(1, 256, t);
  b.Charge(2, milliseconds(1), t);  // one request, answered
  b.Charge(1, milliseconds(100), t);
  EXPECT_TRUE(b.Throttled(1, t));
  // Nothing in flight and no charge within kActiveWindow: uid 2 is gone.
  const auto later = t + BusyBudget::kActiveWindow + milliseconds(1);
  b.Charge(1, milliseconds(300), later);
  EXPECT_FALSE(b.Throttled(1, later));
}

TEST(BusyBudget, DebtIsAtMostOneSecondsWorth) {
  BusyBudget b(milliseconds(250));
  auto t = Clock::now();
  b.SetInFlight(1, 256, t);
  b.SetInFlight(2, 1, t);
  b.Charge(1, std::chrono::seconds(60), t);
  EXPECT_LE(b.RefilledAt(1, t) - t, std::chrono::milliseconds(1001));
}

}  // namespace
}  // namespace cxlpool
