// Stopping builds and bounding the reserve (issue 37, item 9):
//   * a refill on the stock threads, in the middle of the prefault of a
//     1 GiB extent shared by both of them, ends when the refiller is
//     stopped: the build fails with UNAVAILABLE instead of running to the
//     end, and both stock threads are free again;
//   * a request-path build (no yields) honours its stop flag as well;
//   * the reserves together are capped to what the running kernel can give
//     (MemAvailable of its /proc/meminfo, through a fake file system, less a
//     margin), and the cap holds through a reconfiguration.
// "In the middle" is observed, never timed: the test waits (bounded poll)
// until the build has faulted pages into this process, then stops it.
#include <gtest/gtest.h>
#include <sched.h>

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "cxlpool/common/fs.h"
#include "cxlpool/common/strings.h"
#include "lease/thread_priority.h"
#include "pool/backing.h"
#include "pool/extent_reserve.h"

namespace cxlpool {
namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kGiB = 1ull << 30;

// RssShmem of this process: shared memory pages mapped here (the builds'
// own mappings of their memfds).
uint64_t RssShmem() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("RssShmem:", 0) == 0) {
      auto m = ParseMeminfo(line);
      return m.count("RssShmem") ? m["RssShmem"] : 0;
    }
  }
  return 0;
}

// Runs `loop` in slices until `done` or `limit_ms`.
bool RunLoopUntil(boost::asio::io_context& loop, const std::function<bool()>& done,
                  int limit_ms = 30000) {
  auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(limit_ms);
  while (!done()) {
    if (std::chrono::steady_clock::now() > end) return false;
    loop.run_for(std::chrono::milliseconds(2));
    loop.restart();
  }
  return true;
}

// A bounded poll (every 2 ms, `limit_ms` at most).
bool PollFor(const std::function<bool()>& done, int limit_ms = 30000) {
  auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(limit_ms);
  while (!done()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

// Not pinned, not bound: the test needs no privilege and no NUMA node.
MemfdSpec Unpinned() {
  MemfdSpec s;
  s.pin = false;
  s.name = "cxlpool-reserve-stop-test";
  return s;
}

TEST(ReserveStopTest, ARefillStopsInTheMiddleOfALargeSharedPrefault) {
  // One 1 GiB granule and nothing else: the refill is one 1 GiB extent,
  // whose prefault (16 chunks of 64 MiB) both stock threads share.
  ReserveSettings s;
  auto ladder = ExtentLadder::Make({kGiB});
  ASSERT_TRUE(ladder.ok()) << ladder.status().ToString();
  s.ladder = *ladder;
  s.low_bytes = kGiB;
  s.high_bytes = kGiB;
  s.small_per_class = 0;
  ExtentReserve r("node0", s, Unpinned());

  boost::asio::io_context loop;
  boost::asio::thread_pool stock(2);
  boost::asio::thread_pool retire(1);
  // As in the daemon: SCHED_IDLE, so this thread's polls preempt them.
  ASSERT_TRUE(SetPoolPriority(stock, 2, 19, true).ok());
  ReserveRefiller::Options o;
  o.loop = loop.get_executor();
  o.stock = stock.get_executor();
  o.stock_threads = 2;
  o.retire = retire.get_executor();
  std::mutex mu;
  std::optional<Code> result;
  o.factory = [&](const MemfdSpec& spec) {
    EXPECT_TRUE(spec.stop != nullptr) << "a refill carries the reserve's stop flag";
    auto e = Extent::Create(spec);
    std::lock_guard<std::mutex> l(mu);
    result = e.ok() ? Code::kOk : e.status().code();
    return e;
  };
  int failed = 0;
  o.on_built = [&](bool ok) { failed += ok ? 0 : 1; };
  ReserveRefiller f(&r, o);

  const uint64_t before = RssShmem();
  f.Kick();
  ASSERT_EQ(r.building_bytes(), kGiB);
  // Under way: some of it is faulted in (a 64 MiB chunk is four of these).
  ASSERT_TRUE(RunLoopUntil(loop, [&] { return RssShmem() >= before + 16 * kMiB; }))
      << "the refill never started faulting";
  f.Stop();  // what SIGTERM does (LeaseManager::StopReserves)
  EXPECT_TRUE(r.stop_requested());
  ASSERT_TRUE(RunLoopUntil(loop, [&] { return f.pending_builds() == 0; }))
      << "the refill did not end after Stop";
  {
    std::lock_guard<std::mutex> l(mu);
    ASSERT_TRUE(result.has_value());
    EXPECT_EQ(*result, Code::kUnavailable) << "the build ran to its end instead of stopping";
  }
  EXPECT_EQ(failed, 1);
  EXPECT_EQ(r.ready_bytes(), 0u);
  EXPECT_EQ(r.building_bytes(), 0u);
  EXPECT_EQ(RssShmem(), before) << "the stopped build left its mapping behind";

  // Both stock threads are free: two tasks meet each other (neither thread
  // is still filling chunks of the stopped build, or spinning).
  std::mutex m2;
  std::condition_variable cv;
  int arrived = 0;
  for (int i = 0; i < 2; ++i) {
    boost::asio::post(stock, [&] {
      std::unique_lock<std::mutex> l(m2);
      ++arrived;
      cv.notify_all();
      cv.wait_for(l, std::chrono::seconds(20), [&] { return arrived == 2; });
    });
  }
  {
    std::unique_lock<std::mutex> l(m2);
    EXPECT_TRUE(cv.wait_for(l, std::chrono::seconds(20), [&] { return arrived == 2; }))
        << "a stock thread is still busy with the stopped refill";
  }
  stock.join();
  retire.join();
}

TEST(ReserveStopTest, ARequestPathBuildHonoursItsStopFlag) {
  auto stop = std::make_shared<std::atomic<bool>>(false);
  MemfdSpec spec = Unpinned();
  spec.size_bytes = kGiB;
  spec.stop = stop;  // no yield_between_steps: a request-path build
  const uint64_t before = RssShmem();
  auto done = std::async(std::launch::async, [&] {
    // Idle, so that the polls below get the CPU on a busy machine.
    EXPECT_TRUE(SetThreadIdle(true).ok());
    return BuildMemfd(spec);
  });
  ASSERT_TRUE(PollFor([&] { return RssShmem() >= before + 16 * kMiB; }))
      << "the build never started faulting";
  stop->store(true);
  ASSERT_EQ(done.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  auto built = done.get();
  ASSERT_FALSE(built.ok()) << "the build ran to its end instead of stopping";
  EXPECT_EQ(built.status().code(), Code::kUnavailable) << built.status().ToString();
  EXPECT_EQ(RssShmem(), before);

  // Stopped before it starts: nothing is made at all.
  auto again = BuildMemfd(spec);
  EXPECT_EQ(again.status().code(), Code::kUnavailable);
}

// ---- the kernel's limit ----------------------------------------------------------

std::string Meminfo(uint64_t total, std::optional<uint64_t> available, uint64_t free) {
  std::string t = "MemTotal:       " + std::to_string(total / 1024) + " kB\n" +
                  "MemFree:        " + std::to_string(free / 1024) + " kB\n";
  if (available) t += "MemAvailable:   " + std::to_string(*available / 1024) + " kB\n";
  return t;
}

ReserveSettings Watermarks(uint64_t low, uint64_t high) {
  ReserveSettings s;
  s.low_bytes = low;
  s.high_bytes = high;
  return s;
}

TEST(ReserveClampTest, RoomIsMemAvailableLessAMargin) {
  FakeFileSystem proc;
  proc.AddFile("/proc/meminfo", Meminfo(32 * kGiB, 6 * kGiB, kGiB));
  auto room = ReadKernelRoom(proc);
  ASSERT_TRUE(room.ok()) << room.status().ToString();
  EXPECT_EQ(room->available, 6 * kGiB);
  EXPECT_EQ(room->margin, 2 * kGiB);  // a sixteenth of MemTotal
  EXPECT_EQ(room->room(), 4 * kGiB);

  // A small machine: at least 256 MiB; an old kernel: MemFree.
  proc.AddFile("/proc/meminfo", Meminfo(kGiB, std::nullopt, 200 * kMiB));
  room = ReadKernelRoom(proc);
  ASSERT_TRUE(room.ok());
  EXPECT_EQ(room->available, 200 * kMiB);
  EXPECT_EQ(room->margin, 256 * kMiB);
  EXPECT_EQ(room->room(), 0u);

  proc.AddFile("/proc/meminfo", "garbage\n");
  EXPECT_EQ(ReadKernelRoom(proc).status().code(), Code::kInvalidArgument);
  FakeFileSystem empty;  // fails closed: never a read of the real file
  EXPECT_EQ(ReadKernelRoom(empty).status().code(), Code::kNotFound);
}

TEST(ReserveClampTest, ReservesTogetherFitWhatTheKernelCanGive) {
  // 17 pools of a captured tree, each asking for 1 GiB (plus its small
  // extents), on a kernel with 6 GiB available of 32 GiB: 4 GiB of room.
  std::vector<std::unique_ptr<ExtentReserve>> owned;
  std::vector<ExtentReserve*> reserves;
  uint64_t asked = 0;
  for (int i = 0; i < 17; ++i) {
    owned.push_back(std::make_unique<ExtentReserve>("node" + std::to_string(i),
                                                    Watermarks(512 * kMiB, kGiB), Unpinned()));
    reserves.push_back(owned.back().get());
    asked += owned.back()->limit_bytes();
  }
  ASSERT_GT(asked, 17 * kGiB);
  FakeFileSystem proc;
  proc.AddFile("/proc/meminfo", Meminfo(32 * kGiB, 6 * kGiB, kGiB));
  EXPECT_EQ(ClampReservesToKernel(reserves, proc), 17u);
  uint64_t total = 0;
  for (const ExtentReserve* r : reserves) {
    total += r->limit_bytes();
    EXPECT_LE(r->limit_bytes(), r->cap_bytes());
    EXPECT_GT(r->settings().high_bytes, 0u);
    EXPECT_LE(r->settings().low_bytes, r->settings().high_bytes);
    // The low watermark keeps (about) its half of the high one.
    EXPECT_GE(2 * r->settings().low_bytes + 2 * kMiB, r->settings().high_bytes);
    EXPECT_EQ(r->settings().high_bytes % (2 * kMiB), 0u);
  }
  EXPECT_LE(total, 4 * kGiB);
  EXPECT_GT(total, 3 * kGiB) << "the room is used, not thrown away";
  // Every refill plan stays within the cap.
  uint64_t planned = 0;
  for (uint64_t g : reserves[0]->PlanRefill(UINT64_MAX)) planned += g;
  EXPECT_LE(planned, reserves[0]->cap_bytes());

  // A reload (or a capacity change) cannot lift the cap.
  reserves[0]->Reconfigure(Watermarks(kGiB, 2 * kGiB));
  EXPECT_LE(reserves[0]->limit_bytes(), reserves[0]->cap_bytes());

  // Reserves that fit are left as they are.
  ExtentReserve fits("node0", Watermarks(256 * kMiB, 512 * kMiB), Unpinned());
  const uint64_t limit = fits.limit_bytes();
  EXPECT_EQ(ClampReservesToKernel({&fits}, proc), 0u);
  EXPECT_EQ(fits.limit_bytes(), limit);
  EXPECT_EQ(fits.cap_bytes(), UINT64_MAX);
  // No /proc/meminfo: nothing is capped (and the daemon says so).
  FakeFileSystem none;
  EXPECT_EQ(ClampReservesToKernel({&fits}, none), 0u);
}

}  // namespace
}  // namespace cxlpool
