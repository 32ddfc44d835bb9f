// PeriodicTimer on a real io_context: the job runs again and again until
// stopped, a restart replaces the schedule, and a stopped timer leaves the
// loop nothing to wait for (io.run() returns). No sleeps: the loop returns
// only once no wait is armed.
#include "periodic_timer.h"

#include <gtest/gtest.h>

#include <chrono>

namespace cxlpool {
namespace {

using std::chrono::hours;
using std::chrono::milliseconds;

TEST(PeriodicTimerTest, RunsRepeatedlyUntilStopped) {
  boost::asio::io_context io;
  int runs = 0;
  PeriodicTimer* self = nullptr;
  PeriodicTimer timer(io, "tick", [&] {
    if (++runs == 3) self->Stop();
  });
  self = &timer;
  EXPECT_EQ(timer.name(), "tick");
  EXPECT_FALSE(timer.running());
  timer.Start(milliseconds(1));
  EXPECT_TRUE(timer.running());
  EXPECT_EQ(timer.interval(), milliseconds(1));
  io.run();  // returns once the job stopped its timer
  EXPECT_EQ(runs, 3);
  EXPECT_EQ(timer.runs(), 3u);
  EXPECT_FALSE(timer.running());
}

TEST(PeriodicTimerTest, ZeroIntervalNeverRuns) {
  boost::asio::io_context io;
  int runs = 0;
  PeriodicTimer timer(io, "off", [&] { ++runs; });
  timer.Start(milliseconds(0));
  EXPECT_FALSE(timer.running());
  io.run();
  EXPECT_EQ(runs, 0);
}

TEST(PeriodicTimerTest, StopBeforeTheFirstRun) {
  boost::asio::io_context io;
  int runs = 0;
  PeriodicTimer timer(io, "stopped", [&] { ++runs; });
  timer.Start(milliseconds(1));
  timer.Stop();
  io.run();  // the cancelled wait completes; nothing re-arms
  EXPECT_EQ(runs, 0);
}

TEST(PeriodicTimerTest, RestartReplacesTheSchedule) {
  boost::asio::io_context io;
  int runs = 0;
  PeriodicTimer* self = nullptr;
  PeriodicTimer timer(io, "restarted", [&] {
    ++runs;
    self->Stop();
  });
  self = &timer;
  timer.Start(hours(1));
  timer.Start(milliseconds(1));  // the hour-long wait is gone
  EXPECT_EQ(timer.interval(), milliseconds(1));
  io.run();
  EXPECT_EQ(runs, 1);
}

TEST(PeriodicTimerTest, JobMayChangeItsOwnInterval) {
  boost::asio::io_context io;
  int runs = 0;
  PeriodicTimer* self = nullptr;
  PeriodicTimer timer(io, "self-tuning", [&] {
    ++runs;
    if (runs == 1) self->Start(milliseconds(2));  // the next run, on the new schedule only
    if (runs == 3) self->Stop();
  });
  self = &timer;
  timer.Start(milliseconds(1));
  io.run();
  EXPECT_EQ(runs, 3);
}

TEST(PeriodicTimerTest, TwoTimersOnOneLoop) {
  boost::asio::io_context io;
  int a = 0, b = 0;
  PeriodicTimer* ta_self = nullptr;
  PeriodicTimer* tb_self = nullptr;
  PeriodicTimer ta(io, "a", [&] {
    if (++a == 5) ta_self->Stop();
  });
  PeriodicTimer tb(io, "b", [&] {
    if (++b == 2) tb_self->Stop();
  });
  ta_self = &ta;
  tb_self = &tb;
  ta.Start(milliseconds(1));
  tb.Start(milliseconds(1));
  io.run();
  EXPECT_EQ(a, 5);
  EXPECT_EQ(b, 2);
}

}  // namespace
}  // namespace cxlpool
