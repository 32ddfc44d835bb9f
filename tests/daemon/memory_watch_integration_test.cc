// A real cxlpoold on a captured-style sysfs tree (--sysfs-root, one node)
// whose node0 MemTotal changes while it runs: the memory watch timer
// (daemon.memory_watch_interval) resizes the pool and logs the change; with
// the timer off, a SIGHUP re-reads MemTotal. Waits are bounded polls.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <csignal>
#include <fstream>
#include <optional>
#include <string>

#include "test_support.h"

namespace cxlpool {
namespace {

using testsupport::Daemon;
using testsupport::kMiB;
using testsupport::PollUntil;
using testsupport::RawClient;
using testsupport::TempDir;

class MemoryWatchIntegrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testsupport::SkipWithoutDaemon();
    ASSERT_FALSE(tree_.path.empty());
    root_ = tree_.path + "/root";
    std::string node = root_ + "/sys/devices/system/node";
    ASSERT_EQ(testsupport::RunShell("mkdir -p '" + node + "/node0'").first, 0);
    Write(node + "/online", "0\n");
    Write(node + "/possible", "0\n");
    Write(node + "/has_memory", "0\n");
    Write(node + "/node0/cpulist", "0\n");
    Write(node + "/node0/distance", "10\n");
    SetMemTotal(64 * kMiB);
  }
  void TearDown() override {
    if (::testing::Test::HasFailure())
      std::fprintf(stderr, "daemon log:\n%s", daemon_.Log().c_str());
  }
  void Write(const std::string& path, const std::string& text) {
    std::ofstream out(path + ".tmp");
    out << text;
    out.close();
    ASSERT_EQ(std::rename((path + ".tmp").c_str(), path.c_str()), 0) << path;
  }
  void SetMemTotal(uint64_t bytes) {
    Write(root_ + "/sys/devices/system/node/node0/meminfo",
          "Node 0 MemTotal:       " + std::to_string(bytes / 1024) +
              " kB\nNode 0 MemFree:        " + std::to_string(bytes / 2048) + " kB\n");
  }
  void Start(const std::string& interval) {
    daemon_.set_log_to_file(true);
    Status st = daemon_.Start("[daemon]\nmemory_watch_interval = \"" + interval +
                                  "\"\n[pools]\ncapacity = \"50%\"\npin = false\nthp = false\n",
                              {"--sysfs-root", root_});
    ASSERT_TRUE(st.ok()) << st.ToString() << "\n" << daemon_.Log();
    auto c = RawClient::Connect(daemon_.socket(), "memwatch");
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    client_.emplace(std::move(*c));
  }
  // node0's capacity, or 0 when it cannot be asked.
  uint64_t Capacity() {
    proto::PoolsReply reply;
    if (!client_->Call(proto::PoolsRequest(), &reply).ok()) return 0;
    for (const auto& p : reply.pools()) {
      if (p.name() == "node0") return p.capacity_bytes();
    }
    return 0;
  }
  // True once the daemon's log holds `text` (waits up to `ms`).
  bool LogShows(const std::string& text, int ms = 5000) {
    return PollUntil([&] { return daemon_.Log().find(text) != std::string::npos; }, ms, 20);
  }

  TempDir tree_{"memwatch"};
  std::string root_;
  Daemon daemon_;
  std::optional<RawClient> client_;
};

TEST_F(MemoryWatchIntegrationTest, TimerFollowsMemoryOnlinedAndOfflined) {
  Start("100ms");
  ASSERT_EQ(Capacity(), 32 * kMiB) << "50 % of 64 MiB at start";
  SetMemTotal(256 * kMiB);  // onlined
  EXPECT_TRUE(PollUntil([&] { return Capacity() == 128 * kMiB; }, 10000, 20))
      << "capacity " << Capacity();
  EXPECT_TRUE(LogShows("node0: MemTotal 64.0 MiB -> 256.0 MiB, capacity 32.0 MiB -> 128.0 MiB"));
  SetMemTotal(128 * kMiB);  // offlined again
  EXPECT_TRUE(PollUntil([&] { return Capacity() == 64 * kMiB; }, 10000, 20))
      << "capacity " << Capacity();
  // A garbled file: warned, the pool keeps its capacity.
  Write(root_ + "/sys/devices/system/node/node0/meminfo", "garbage\n");
  EXPECT_TRUE(LogShows("node0: cannot read MemTotal", 10000));
  EXPECT_EQ(Capacity(), 64 * kMiB);
  EXPECT_TRUE(daemon_.Stop().ok());
}

TEST_F(MemoryWatchIntegrationTest, WithTheTimerOffSighupReReadsMemTotal) {
  Start("0");
  ASSERT_EQ(Capacity(), 32 * kMiB);
  SetMemTotal(256 * kMiB);
  // No timer: nothing can have changed it (no wait involved).
  EXPECT_EQ(Capacity(), 32 * kMiB);
  ASSERT_EQ(::kill(daemon_.pid(), SIGHUP), 0);
  EXPECT_TRUE(PollUntil([&] { return Capacity() == 128 * kMiB; }, 10000, 20))
      << "capacity " << Capacity();
  EXPECT_TRUE(
      LogShows("SIGHUP: node0 capacity 32.0 MiB -> 128.0 MiB (MemTotal 64.0 MiB -> 256.0 MiB)"));
  EXPECT_TRUE(daemon_.Stop().ok());
}

}  // namespace
}  // namespace cxlpool
