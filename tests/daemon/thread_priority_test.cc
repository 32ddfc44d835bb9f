// The daemon's stock threads (reserve refills) run reniced and SCHED_IDLE
// (daemon/lease/thread_priority), checked by asking the kernel for every
// thread of the pool (/proc/self/task/<tid>/stat, found by name, and
// getpriority / sched_getscheduler from inside); and the lease
// manager sends reserve refills to the stock executor, not the workers.
#include "lease/thread_priority.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "test_util.h"

namespace cxlpool {
namespace {

using testing::Harness;
using testing::TestConfig;
using testing::TwoSocketCxl;
constexpr uint64_t kMiB = 1ull << 20;

// nice (field 19) and scheduling policy (field 41) of each thread of this
// process named `comm`, by tid, as /proc/self/task/<tid>/stat says.
struct TaskPriority {
  int nice = 0;
  int policy = -1;
};
std::map<long, TaskPriority> TasksNamed(const std::string& comm) {
  std::map<long, TaskPriority> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream c(e.path() / "comm");
    std::string name;
    std::getline(c, name);
    if (name != comm) continue;
    std::ifstream st(e.path() / "stat");
    std::string line((std::istreambuf_iterator<char>(st)), std::istreambuf_iterator<char>());
    std::istringstream rest(line.substr(line.rfind(')') + 2));
    std::vector<std::string> f((std::istream_iterator<std::string>(rest)),
                               std::istream_iterator<std::string>());
    if (f.size() < 39) continue;  // fields 3.. follow the comm
    out[std::stol(e.path().filename().string())] = {std::stoi(f[16]), std::stoi(f[38])};
  }
  return out;
}

TEST(ThreadPriorityTest, EveryThreadOfThePoolIsRenicedAndIdle) {
  constexpr unsigned kThreads = 3;
  boost::asio::thread_pool pool(kThreads);
  auto base = ThreadNice();
  ASSERT_TRUE(base.ok());
  const int target = std::min(*base + 7, 19);
  ASSERT_TRUE(SetPoolPriority(pool, kThreads, target, true, "prio-test").ok());
  // Every thread of the pool, found by its name through /proc (not only
  // those that happen to run a task), as the kernel reports it.
  std::map<long, TaskPriority> tasks = TasksNamed("prio-test");
  EXPECT_EQ(tasks.size(), kThreads) << "one named thread per pool thread";
  for (const auto& [tid, p] : tasks) {
    EXPECT_EQ(p.nice, target) << "thread " << tid;
    EXPECT_EQ(p.policy, SCHED_IDLE) << "thread " << tid;
  }
  // And from inside: every task the pool runs sees the same.
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
  for (long tid : tids) EXPECT_EQ(tasks.count(tid), 1u) << "task ran on unnamed thread " << tid;
  pool.join();
  EXPECT_EQ(nices, std::set<int>{target});
  EXPECT_EQ(idle, std::set<bool>{true}) << "sched_getscheduler: SCHED_IDLE on every thread";
  // The caller's own priority is untouched, and so is every other thread.
  EXPECT_EQ(*ThreadNice(), *base);
  EXPECT_FALSE(*ThreadIsIdle());
  for (const auto& [tid, p] : TasksNamed("daemon_thread_p")) {
    EXPECT_EQ(p.nice, *base) << "thread " << tid;
    EXPECT_EQ(p.policy, SCHED_OTHER) << "thread " << tid;
  }
}

TEST(ThreadPriorityTest, ABadThreadNameIsRefused) {
  boost::asio::thread_pool pool(1);
  EXPECT_EQ(SetPoolPriority(pool, 1, 19, true, "").code(), Code::kInvalidArgument);
  EXPECT_EQ(SetPoolPriority(pool, 1, 19, true, std::string(16, 'x')).code(),
            Code::kInvalidArgument);
  pool.join();
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

// Reserve refills go to the stock executor: while it does not run, no
// extent appears, however long the loop and the workers run; once it runs,
// the extents land.
TEST(ThreadPriorityTest, ReserveRefillsRunOnTheStockExecutor) {
  Harness h(TwoSocketCxl(16 * kMiB), TestConfig(4 * kMiB));
  boost::asio::io_context stock;
  h.mgr->SetStockExecutor(stock.get_executor());
  h.Connect(1);
  h.mgr->StartRefills();
  h.Drain();
  EXPECT_EQ(h.Pool("node0").reserve_building_bytes, 4 * kMiB) << "reserved for the builds";
  EXPECT_EQ(h.Pool("node0").reserve_ready_bytes, 0u) << "nothing built on the workers";
  auto g = h.Alloc(1, 2 * kMiB, 0);  // not from the reserve: it is not built yet
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_FALSE(g->lease.from_warm_stock);
  stock.run();
  h.Drain();
  EXPECT_EQ(h.Pool("node0").reserve_building_bytes, 0u);
  EXPECT_EQ(h.Pool("node0").reserve_ready_bytes, 4 * kMiB);
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
