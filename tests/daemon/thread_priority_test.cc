// The daemon's warm-stock threads run reniced and SCHED_IDLE
// (daemon/lease/thread_priority), checked by asking the kernel (getpriority,
// sched_getscheduler of each thread); and the lease
// manager sends warm-stock refills to the stock executor, not the workers.
#include "lease/thread_priority.h"

#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <future>
#include <mutex>
#include <set>
#include <thread>

#include "test_util.h"

namespace cxlpool {
namespace {

using testing::Harness;
using testing::TestConfig;
using testing::TwoSocketCxl;
constexpr uint64_t kMiB = 1ull << 20;

TEST(ThreadPriorityTest, EveryThreadOfThePoolIsRenicedAndIdle) {
  constexpr unsigned kThreads = 3;
  boost::asio::thread_pool pool(kThreads);
  auto base = ThreadNice();
  ASSERT_TRUE(base.ok());
  const int target = std::min(*base + 7, 19);
  ASSERT_TRUE(SetPoolPriority(pool, kThreads, target, true).ok());
  // Ask the kernel from many tasks; every thread that runs one reports.
  std::mutex mu;
  std::set<long> tids;
  std::set<int> nices;
  std::set<bool> idle;
  std::vector<std::future<void>> done;
  for (int i = 0; i < 64; ++i) {
    auto p = std::make_shared<std::promise<void>>();
    done.push_back(p->get_future());
    boost::asio::post(pool, [&, p] {
      auto n = ThreadNice();
      auto is_idle = ThreadIsIdle();
      std::lock_guard<std::mutex> lock(mu);
      tids.insert(::syscall(SYS_gettid));
      nices.insert(n.ok() ? *n : -100);
      idle.insert(is_idle.ok() && *is_idle);
      p->set_value();
    });
  }
  for (auto& f : done) f.wait();
  pool.join();
  EXPECT_EQ(nices, std::set<int>{target});
  EXPECT_EQ(idle, std::set<bool>{true}) << "sched_getscheduler: SCHED_IDLE on every thread";
  EXPECT_GE(tids.size(), 1u);
  // The caller's own priority is untouched.
  EXPECT_EQ(*ThreadNice(), *base);
  EXPECT_FALSE(*ThreadIsIdle());
}

TEST(ThreadPriorityTest, IdleCanBeLeft) {
  std::promise<std::pair<bool, bool>> seen;
  std::thread t([&] {
    bool a = SetThreadIdle(true).ok() && *ThreadIsIdle();
    bool b = SetThreadIdle(false).ok() && !*ThreadIsIdle();
    seen.set_value({a, b});
  });
  auto [entered, left] = seen.get_future().get();
  t.join();
  EXPECT_TRUE(entered);
  EXPECT_TRUE(left) << "back to SCHED_OTHER without privilege";
}

TEST(ThreadPriorityTest, OutOfRangeIsRefused) {
  EXPECT_EQ(SetThreadNice(20).code(), Code::kInvalidArgument);
  EXPECT_EQ(SetThreadNice(-21).code(), Code::kInvalidArgument);
}

// Refills go to the stock executor: while it does not run, no stock appears,
// however long the loop and the workers run; once it runs, the stock lands.
TEST(ThreadPriorityTest, WarmStockRefillsRunOnTheStockExecutor) {
  Harness h(TwoSocketCxl(16 * kMiB), TestConfig({{2 * kMiB, 2}}));
  boost::asio::io_context stock;
  h.mgr->SetStockExecutor(stock.get_executor());
  h.Connect(1);
  h.mgr->StartWarmStock();
  h.Drain();
  EXPECT_EQ(h.Pool("node0").warm_bytes, 4 * kMiB) << "reserved for the builds";
  EXPECT_GT(h.mgr->pending_builds(), 0u) << "nothing built on the workers";
  auto g = h.Alloc(1, 2 * kMiB, 0);  // not from stock: it is not built yet
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_FALSE(g->lease.from_warm_stock);
  stock.run();
  h.Drain();
  EXPECT_EQ(h.mgr->pending_builds(), 0u);
  auto out = h.AllocOnRequestPath(1, 2 * kMiB, 0);
  ASSERT_TRUE(out.has_value() && out->ok());
  EXPECT_TRUE((*out)->lease.from_warm_stock);
  h.mgr->Disconnect(1);
  h.Drain();
  stock.restart();
  stock.run();
  h.Drain();
  EXPECT_EQ(h.Pool("node0").leased_bytes, 0u);
}

}  // namespace
}  // namespace cxlpool
