// UrgentHints on values: each uid's bucket of urgent hints, the wait a
// refused sender is held, the on-demand queue, and how a round's time is
// shared among the uids it served.
#include "tiering/urgent_hints.h"

#include <gtest/gtest.h>

#include <map>

namespace cxlpool::tiering {
namespace {

constexpr int64_t kSec = 1'000'000'000;

TEST(UrgentHintsTest, EachUidHasASecondsWorth) {
  UrgentHints u(2);
  EXPECT_TRUE(u.Take(7, 0).ok());
  EXPECT_TRUE(u.Take(7, 0).ok());
  Status st = u.Take(7, 0);
  EXPECT_EQ(st.code(), Code::kResourceExhausted);
  EXPECT_NE(st.message().find("tiering.max_urgent_hints_per_uid"), std::string::npos);
  EXPECT_TRUE(u.Take(8, 0).ok());  // another uid's bucket is its own
  EXPECT_TRUE(u.Take(7, kSec / 2).ok());
}

TEST(UrgentHintsTest, ZeroIsNoLimit) {
  UrgentHints u(0);
  for (int i = 0; i < 100; ++i) EXPECT_TRUE(u.Take(7, 0).ok());
  EXPECT_EQ(u.WaitNs(7, 50, 0), 0);
}

TEST(UrgentHintsTest, WaitIsAtMostASecond) {
  UrgentHints u(10);
  EXPECT_EQ(u.WaitNs(7, 1, 0), 0);  // never seen: full
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(u.Take(7, 0).ok());
  EXPECT_EQ(u.WaitNs(7, 0, 0), 0);
  EXPECT_NEAR(static_cast<double>(u.WaitNs(7, 5, 0)), kSec / 2.0, 1e6);
  EXPECT_EQ(u.WaitNs(7, 50, 0), kSec);
  u.ForgetFull(kSec);  // full again: forgotten, so it starts full
  EXPECT_EQ(u.WaitNs(7, 1, kSec), 0);
}

TEST(UrgentHintsTest, QueueKeepsTheLastSenderPerLease) {
  UrgentHints u(10);
  u.Queue(1, 7);
  u.Queue(2, 8);
  u.Queue(1, 9);
  u.Queue(3, 9);
  u.Forget(3);
  EXPECT_EQ(u.size(), 2u);
  std::map<uint64_t, uid_t> q = u.Drain();
  EXPECT_TRUE(u.empty());
  EXPECT_EQ(q, (std::map<uint64_t, uid_t>{{1, 9}, {2, 8}}));
}

TEST(UrgentHintsTest, TimeIsSharedByLeasesServed) {
  std::map<uid_t, std::chrono::nanoseconds> charged;
  auto charge = [&](uid_t uid, std::chrono::nanoseconds ns) { charged[uid] += ns; };
  UrgentHints::ChargeShares({{1, 7}, {2, 7}, {3, 8}}, std::chrono::nanoseconds(300), charge);
  EXPECT_EQ(charged.at(7).count(), 200);
  EXPECT_EQ(charged.at(8).count(), 100);
  charged.clear();
  UrgentHints::ChargeShares({}, std::chrono::nanoseconds(300), charge);
  EXPECT_TRUE(charged.empty());
}

}  // namespace
}  // namespace cxlpool::tiering
