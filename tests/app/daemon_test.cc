// A whole Daemon in this process on a --sysfs-root tree (one 64 MiB node)
// with its state directory and socket in a temp dir: it starts its
// components in order, answers HELLO, and a stop request (RequestStop, or
// SIGTERM as the service manager sends it) stops them in reverse order and
// ends Run with 0. A metrics port in use or a bad --grace-period stops the
// start with exit code 2 before the components after it. No sleeps: the
// client's connect and the loop thread's join are the waits.
#include "daemon.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <csignal>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "cxlpool/common/unique_fd.h"
#include "settings.h"
#include "test_support.h"

namespace cxlpool {
namespace {

using Names = std::vector<std::string>;
using testsupport::RawClient;
using testsupport::TempDir;

// Every component of a daemon with the tiering engine and the metrics
// endpoint off, in start order.
const Names kStartOrder = {"threads", "topology", "pools",           "state directory",
                           "leases",  "server",   "tiering",         "memory watch",
                           "reload",  "watchdog", "reserve refills", "signals"};

class DaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(dir_.path.empty());
    std::string node = dir_.path + "/root/sys/devices/system/node";
    ASSERT_EQ(
        testsupport::RunShell("mkdir -p '" + node + "/node0' '" + dir_.path + "/state'").first, 0);
    Write(node + "/online", "0\n");
    Write(node + "/possible", "0\n");
    Write(node + "/has_memory", "0\n");
    Write(node + "/node0/cpulist", "0\n");
    Write(node + "/node0/distance", "10\n");
    Write(node + "/node0/meminfo",
          "Node 0 MemTotal:       65536 kB\nNode 0 MemFree:        32768 kB\n");
    flags_.config = dir_.path + "/cxlpoold.toml";
    flags_.socket = dir_.path + "/cxlpool.sock";
    flags_.sysfs_root = dir_.path + "/root";
    flags_.state_dir = dir_.path + "/state";
    flags_.foreground = true;
    flags_.log_level = "warning";
  }
  static void Write(const std::string& path, const std::string& text) {
    std::ofstream out(path);
    out << text;
    ASSERT_TRUE(out.good()) << path;
  }
  // A Daemon on `config` (the [pools] table is added), not started yet.
  std::unique_ptr<Daemon> Make(const std::string& config = "") {
    Write(flags_.config, config + "\n[pools]\ncapacity = \"50%\"\npin = false\nthp = false\n");
    int exit_code = -1;
    std::optional<DaemonSettings> settings = LoadDaemonSettings(flags_, &exit_code);
    EXPECT_TRUE(settings.has_value()) << "exit code " << exit_code;
    if (!settings) return nullptr;
    return std::make_unique<Daemon>(std::move(*settings));
  }
  // Starts `d`, runs it on a thread, checks it answers HELLO, then `stop`s
  // it and waits for Run to return.
  void StartServeStop(Daemon& d, const std::function<void()>& stop) {
    ASSERT_EQ(d.Start(), 0);
    EXPECT_EQ(d.started(), kStartOrder);
    int run_result = -1;
    std::thread loop([&] { run_result = d.Run(); });
    auto client = RawClient::Connect(flags_.socket, "daemon-test", 5000);
    EXPECT_TRUE(client.ok()) << client.status().ToString();
    stop();
    loop.join();
    EXPECT_EQ(run_result, 0);
    Names reversed = d.started();
    std::reverse(reversed.begin(), reversed.end());
    EXPECT_EQ(d.stopped(), reversed);
  }

  TempDir dir_{"app-daemon"};
  DaemonFlags flags_;
};

TEST_F(DaemonTest, StartsServesAndStopsInReverseOnRequest) {
  auto d = Make();
  ASSERT_NE(d, nullptr);
  StartServeStop(*d, [&] { d->RequestStop(); });
}

TEST_F(DaemonTest, SigtermStopsIt) {
  auto d = Make();
  ASSERT_NE(d, nullptr);
  StartServeStop(*d, [] { ::kill(::getpid(), SIGTERM); });
}

TEST_F(DaemonTest, StopRequestedTwiceStopsOnce) {
  auto d = Make();
  ASSERT_NE(d, nullptr);
  StartServeStop(*d, [&] {
    d->RequestStop();
    d->RequestStop();
  });
  EXPECT_EQ(d->stopped().size(), kStartOrder.size());
}

TEST_F(DaemonTest, MetricsPortInUseExitsTwo) {
  // A loopback port another socket holds: the start ends at the metrics
  // endpoint, before the components after it.
  UniqueFd holder(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  ASSERT_TRUE(holder);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::bind(holder.get(), reinterpret_cast<sockaddr*>(&addr), len), 0);
  ASSERT_EQ(::listen(holder.get(), 1), 0);
  ASSERT_EQ(::getsockname(holder.get(), reinterpret_cast<sockaddr*>(&addr), &len), 0);
  auto d =
      Make("[metrics]\nhttp_listen = \"127.0.0.1:" + std::to_string(ntohs(addr.sin_port)) + "\"\n");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->Start(), 2);
  EXPECT_EQ(d->started(), Names(kStartOrder.begin(), kStartOrder.begin() + 7));
  EXPECT_TRUE(d->stopped().empty());
}

TEST_F(DaemonTest, BadGracePeriodExitsTwo) {
  flags_.grace_period = "soon";
  auto d = Make();
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->Start(), 2);
  EXPECT_EQ(d->started(), Names(kStartOrder.begin(), kStartOrder.begin() + 3));
}

TEST(DaemonSettingsTest, CheckConfigExitsZeroWithoutSettings) {
  DaemonFlags flags;
  flags.check_config = true;
  int exit_code = -1;
  EXPECT_FALSE(LoadDaemonSettings(flags, &exit_code).has_value());
  EXPECT_EQ(exit_code, 0);
}

TEST(DaemonSettingsTest, UnknownLogLevelExitsTwo) {
  DaemonFlags flags;
  flags.log_level = "loud";
  int exit_code = -1;
  EXPECT_FALSE(LoadDaemonSettings(flags, &exit_code).has_value());
  EXPECT_EQ(exit_code, 2);
}

}  // namespace
}  // namespace cxlpool
