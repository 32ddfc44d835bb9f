// Admission: the four fair shares (connections, requests in flight, queued
// reply bytes, fds) with the refusals they give, the fd allowance of a
// reader, and the requests in flight the busy budget weighs.
#include "server/admission.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

namespace cxlpool {
namespace {

using Clock = Admission::Clock;

ServerLimits SmallLimits() {
  ServerLimits l;
  l.max_connections = 8;
  l.max_connections_per_uid = 4;
  l.reserved_connections = 2;
  l.max_requests = 32;
  l.max_requests_per_uid = 3;
  l.max_queued_bytes = 1600;
  l.max_queued_bytes_per_uid = 1000;
  l.max_fds = 64;
  l.max_fds_per_uid = 10;
  l.max_fds_per_frame = 8;
  return l;
}

TEST(Admission, ConnectionsPerUidAreRefusedNamingTheLimit) {
  Admission a(SmallLimits(), nullptr);
  for (int i = 0; i < 4; ++i) {
    ASSERT_FALSE(a.CheckConnection(1000).has_value());
    a.AddConnection(1000);
  }
  std::optional<Refusal> no = a.CheckConnection(1000);
  ASSERT_TRUE(no.has_value());
  EXPECT_STREQ(no->limit, "max_connections_per_uid");
  EXPECT_TRUE(no->per_uid);
  EXPECT_EQ(
      no->why,
      "uid 1000 holds 4 connections and asks for 1 more; limits.max_connections_per_uid is 4");
  EXPECT_FALSE(a.CheckConnection(1001).has_value());  // another uid is not affected
  a.RemoveConnection(1000);
  EXPECT_FALSE(a.CheckConnection(1000).has_value());
  EXPECT_EQ(a.connections(), 3u);
}

TEST(Admission, TheLastConnectionsAreKeptForUidsThatHoldNone) {
  Admission a(SmallLimits(), nullptr);
  for (uid_t u = 1; u <= 3; ++u) {
    a.AddConnection(u);
    a.AddConnection(u);
  }
  // 6 of 8 taken: the last 2 are the reserve.
  std::optional<Refusal> no = a.CheckConnection(1);
  ASSERT_TRUE(no.has_value());
  EXPECT_STREQ(no->limit, "reserved_connections");
  EXPECT_FALSE(no->per_uid);
  EXPECT_FALSE(a.CheckConnection(9).has_value());  // a newcomer gets one
  a.AddConnection(9);
  a.AddConnection(10);
  no = a.CheckConnection(11);
  ASSERT_TRUE(no.has_value());
  EXPECT_STREQ(no->limit, "max_connections");
}

TEST(Admission, RequestsInFlightAreTheBusyBudgetsDemand) {
  BusyBudget busy(std::chrono::milliseconds(250));
  Admission a(SmallLimits(), &busy);
  EXPECT_EQ(&a.busy(), &busy);
  auto t = Clock::now();
  for (int i = 0; i < 3; ++i) {
    ASSERT_FALSE(a.CheckRequest(1).has_value());
    a.AddRequest(1, t);
  }
  std::optional<Refusal> no = a.CheckRequest(1);
  ASSERT_TRUE(no.has_value());
  EXPECT_STREQ(no->limit, "max_requests_per_uid");
  EXPECT_NE(no->why.find("requests in flight"), std::string::npos);
  // Uid 1 has 3 in flight next to uid 2's one: over its bucket, it is held.
  a.AddRequest(2, t);
  busy.Charge(2, std::chrono::milliseconds(1), t);
  busy.Charge(1, std::chrono::milliseconds(60), t);
  EXPECT_TRUE(a.Throttled(1, t));
  EXPECT_GT(a.RefilledAt(1, t), t);
  EXPECT_FALSE(a.Throttled(2, t));
  // Its demand falls with its answers: no longer heavier than the other.
  a.RemoveRequest(1, t);
  a.RemoveRequest(1, t);
  EXPECT_FALSE(a.Throttled(1, t));
  EXPECT_EQ(a.requests(), 2u);
}

TEST(Admission, AnOwnBudgetWhenNoneIsShared) {
  ServerLimits l = SmallLimits();
  l.max_busy_per_uid = std::chrono::milliseconds(0);
  Admission a(l, nullptr);
  EXPECT_FALSE(a.busy().enabled());
}

TEST(Admission, QueuedBytesSayWhoseLimitIsReached) {
  Admission a(SmallLimits(), nullptr);
  a.AddQueued(1, 900);
  std::optional<Refusal> no = a.CheckQueued(1, 200);
  ASSERT_TRUE(no.has_value());
  EXPECT_STREQ(no->limit, "max_queued_bytes_per_uid");
  EXPECT_TRUE(no->per_uid);
  a.AddQueued(2, 600);
  // 1500 of 1600 queued: the daemon's limit, not uid 3's.
  no = a.CheckQueued(3, 200);
  ASSERT_TRUE(no.has_value());
  EXPECT_STREQ(no->limit, "max_queued_bytes");
  EXPECT_FALSE(no->per_uid);
  a.RemoveQueued(1, 900);
  EXPECT_FALSE(a.CheckQueued(3, 200).has_value());
  EXPECT_EQ(a.queued_bytes(), 600u);
}

TEST(Admission, SyncFdsMovesACharge) {
  Admission a(SmallLimits(), nullptr);
  uint64_t charged = 0;
  a.SyncFds(1, 5, &charged);
  EXPECT_EQ(charged, 5u);
  EXPECT_EQ(a.fds(1), 5u);
  a.SyncFds(1, 2, &charged);
  EXPECT_EQ(a.fds(1), 2u);
  a.AddFds(1, 3);
  a.SyncFds(1, 0, &charged);
  EXPECT_EQ(a.fds(1), 3u);
  a.RemoveFds(1, 3);
  EXPECT_EQ(a.fds(), 0u);
}

TEST(Admission, FdAllowanceNamesTheLimitThatCutIt) {
  Admission a(SmallLimits(), nullptr);
  // Plenty left: a whole frame's worth and more, no limit named.
  Admission::FdAllowance f = a.FdAllowanceFor(1, 0);
  EXPECT_EQ(f.fds, 10u);
  EXPECT_EQ(f.limit, nullptr);
  // Uid 1 holds 6 of its 10: 4 more (plus what the reader holds).
  a.AddFds(1, 6);
  f = a.FdAllowanceFor(1, 1);
  EXPECT_EQ(f.fds, 5u);
  ASSERT_NE(f.limit, nullptr);
  EXPECT_STREQ(f.limit, "max_fds_per_uid");
  std::optional<Refusal> no = a.CheckFds(1, 5);
  ASSERT_TRUE(no.has_value());
  EXPECT_STREQ(no->limit, "max_fds_per_uid");
  EXPECT_FALSE(a.CheckFds(1, 4).has_value());
}

}  // namespace
}  // namespace cxlpool
