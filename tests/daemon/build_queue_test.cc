#include "lease/build_queue.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace cxlpool {
namespace {

TEST(BuildQueueTest, StartsAtOnceBelowTheLimit) {
  BuildQueue q(2);
  std::vector<int> started;
  q.Submit(1, [&] { started.push_back(1); });
  q.Submit(1, [&] { started.push_back(2); });
  EXPECT_EQ(started, (std::vector<int>{1, 2}));
  EXPECT_EQ(q.running(), 2u);
  EXPECT_EQ(q.waiting(), 0u);
}

TEST(BuildQueueTest, UidsTakeTurnsOnceFull) {
  // One worker; uid 1 floods with 4 builds, then uid 2 asks for 2 and uid 3
  // for 1: after the running one, the turns go 1, 2, 3, 1, 2, 1.
  BuildQueue q(1);
  std::string order;
  auto job = [&](char c) { return [&order, c] { order += c; }; };
  for (int i = 0; i < 5; ++i) q.Submit(1, job('a'));
  q.Submit(2, job('b'));
  q.Submit(2, job('b'));
  q.Submit(3, job('c'));
  EXPECT_EQ(order, "a");
  EXPECT_EQ(q.waiting(), 7u);
  while (q.running() > 0) q.Done(static_cast<uid_t>(order.back() - 'a' + 1));
  EXPECT_EQ(order, "aabcabaa");
  EXPECT_EQ(q.waiting(), 0u);
}

TEST(BuildQueueTest, ANewcomerWaitsForOneBuildNotTheFlood) {
  BuildQueue q(2);
  int flood_started = 0;
  bool victim_started = false;
  for (int i = 0; i < 256; ++i) q.Submit(1, [&] { ++flood_started; });
  q.Submit(2, [&] { victim_started = true; });
  EXPECT_EQ(flood_started, 2);
  EXPECT_FALSE(victim_started);
  // One of the flood's two builds finishes: the worker goes to uid 2, which
  // has none running, though uid 1 was waiting first.
  q.Done(1);
  EXPECT_TRUE(victim_started);
  EXPECT_EQ(flood_started, 2);
  q.Done(2);
  EXPECT_EQ(flood_started, 3);
  EXPECT_EQ(q.running(), 2u);
}

TEST(BuildQueueTest, DoneForAUidWithNothingRunningIsACrash) {
  BuildQueue q(1);
  q.Submit(1, [] {});
  EXPECT_DEATH(q.Done(2), "check failed");
}

TEST(BuildQueueTest, RaisingTheLimitStartsWaitingBuilds) {
  BuildQueue q(1);
  int started = 0;
  for (int i = 0; i < 3; ++i) q.Submit(7, [&] { ++started; });
  EXPECT_EQ(started, 1);
  q.set_max_running(3);
  EXPECT_EQ(started, 3);
  q.set_max_running(0);  // at least one
  q.Done(7);
  q.Done(7);
  q.Done(7);
  EXPECT_EQ(q.running(), 0u);
}

TEST(BuildQueueTest, AUidRefusedByMayStartWaitsAndOthersGoFirst) {
  // uid 1 is over its share of daemon time: its builds wait (the worker
  // stays idle rather than run them) while uid 2's start; Retry starts
  // them once it is allowed again.
  BuildQueue q(2);
  bool allow1 = false;
  q.set_may_start([&](uid_t uid) { return uid != 1 || allow1; });
  std::string order;
  q.Submit(1, [&] { order += 'a'; });
  q.Submit(1, [&] { order += 'a'; });
  EXPECT_EQ(order, "");
  EXPECT_TRUE(q.held());
  q.Submit(2, [&] { order += 'b'; });
  EXPECT_EQ(order, "b");
  EXPECT_TRUE(q.held());
  q.Retry();
  EXPECT_EQ(order, "b");
  allow1 = true;
  q.Retry();
  EXPECT_EQ(order, "ba");  // two workers: b and one a
  EXPECT_FALSE(q.held());
  q.Done(2);
  EXPECT_EQ(order, "baa");
  EXPECT_EQ(q.waiting(), 0u);
}

}  // namespace
}  // namespace cxlpool
