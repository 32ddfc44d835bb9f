// Config reload (what SIGHUP runs) on a lease manager with live leases: a
// good file changes quotas, priority reserves, capacities and the warm
// reserve without dropping a lease; a capacity below what is leased is
// refused and kept; a restart-only key is reported and kept; a bad file
// (the removed warm_stock key among them) changes nothing.
#include "reload/reload.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "cxlpool/common/log.h"
#include "test_util.h"

namespace cxlpool {
namespace {

using testing::Harness;
using testing::TestConfig;
using testing::TwoSocketCxl;

constexpr uint64_t kMiB = 1ull << 20;

class ReloadTest : public ::testing::Test {
 protected:
  ReloadTest() : h_(TwoSocketCxl(64 * kMiB), Initial()), current_(Initial()) {
    char tmpl[] = "/tmp/cxlpool-reload-XXXXXX";
    CXLPOOL_CHECK(::mkdtemp(tmpl) != nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/cxlpoold.toml";
    h_.Connect(1, 1000, 1000);
  }
  ~ReloadTest() override {
    (void)!std::system(("rm -rf '" + dir_ + "'").c_str());
    SetLogLevel(LogLevel::kInfo);
  }
  static DaemonConfig Initial() {
    DaemonConfig c = TestConfig();
    c.quotas.push_back(testing::UidQuota(1000, 8 * kMiB));
    return c;
  }
  Result<ReloadReport> Reload(const std::string& text) {
    std::ofstream(path_) << text;
    return ReloadConfigFile(path_, h_.topo, h_.mgr.get(), &current_);
  }

  Harness h_;
  DaemonConfig current_;
  std::string dir_, path_;
};

// The [daemon] and [pools] part that the configs below share.
constexpr const char* kPoolsHead = R"(
[daemon]
log_level = "debug"
[pools]
capacity = "100%"
pin = false
thp = false
reserve_low = "2M"
reserve_high = "2M"
)";

const std::string kGood = std::string(kPoolsHead) + R"([pools.node.1]
capacity = "16M"
[[quota]]
uid = 1000
max_bytes = "32M"
priority = 2
[priorities]
reserve = { 0 = "50%" }
)";

TEST_F(ReloadTest, GoodConfigAppliesWithoutDroppingLeases) {
  auto a = h_.Alloc(1, 6 * kMiB, 0);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(h_.Alloc(1, 4 * kMiB, 0).status().code(), Code::kResourceExhausted);  // 8 MiB quota

  auto r = Reload(kGood);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  h_.Drain();  // reserve refills
  EXPECT_EQ(h_.mgr->Gauges()["live_leases"], 1u) << "the lease survived";
  EXPECT_EQ(h_.Pool("node0").leased_bytes, 6 * kMiB);
  EXPECT_EQ(h_.Pool("node1").capacity_bytes, 16 * kMiB);
  EXPECT_EQ(h_.Pool("node0").reserve_ready_bytes, 2 * kMiB);
  EXPECT_EQ(GetLogLevel(), LogLevel::kDebug);
  // New quota (32 MiB) and class 2, which no reserve binds.
  EXPECT_EQ(h_.mgr->mutable_quotas()->PriorityOf(Tenant{1000, 1000, ""}), 2);
  EXPECT_TRUE(h_.Alloc(1, 20 * kMiB, 0).ok());
  // Usage carried over: 26 MiB used of 32 MiB.
  auto over = h_.Alloc(1, 8 * kMiB, 2);
  ASSERT_FALSE(over.ok());
  EXPECT_NE(over.status().message().find("used 26.0 MiB"), std::string::npos)
      << over.status().message();
  // Class 0 (another uid) is held to the 50% reserve on node0.
  h_.Connect(2, 3000, 3000);
  AllocParams p;
  p.size_bytes = 8 * kMiB;
  p.numa_node = 0;
  p.strict = true;
  EXPECT_EQ(h_.Alloc(2, p).status().code(), Code::kResourceExhausted);
}

TEST_F(ReloadTest, ReserveWatermarksApplyAtOnce) {
  auto r = Reload(R"(
[pools]
capacity = "100%"
pin = false
thp = false
reserve_low = "4M"
reserve_high = "8M"
[pools.node.1]
reserve_high = "25%"
)");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::string applied;
  for (const auto& a : r->applied) applied += a + "\n";
  EXPECT_NE(applied.find("node0 reserve 4.0 MiB low, 8.0 MiB high"), std::string::npos) << applied;
  h_.Drain();  // refills
  EXPECT_EQ(h_.Pool("node0").reserve_ready_bytes, 8 * kMiB);
  EXPECT_EQ(h_.Pool("node1").reserve_high_bytes, 16 * kMiB) << "25% of 64 MiB";
  EXPECT_EQ(h_.Pool("node1").reserve_ready_bytes, 16 * kMiB);
  // Lower: ready stock above the new high watermark is retired.
  r = Reload(R"(
[pools]
capacity = "100%"
pin = false
thp = false
reserve_low = "2M"
reserve_high = "2M"
)");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  h_.Drain();
  EXPECT_EQ(h_.Pool("node0").reserve_ready_bytes, 2 * kMiB);
  EXPECT_EQ(h_.Pool("node1").reserve_ready_bytes, 2 * kMiB);
  EXPECT_EQ(h_.Pool("node0").reserve_retiring_bytes, 0u);
}

TEST_F(ReloadTest, CapacityBelowLeasedIsKeptAndRestartKeysReported) {
  ASSERT_TRUE(h_.Alloc(1, 6 * kMiB, 1).ok());
  auto r = Reload(R"(
[daemon]
socket = "/run/elsewhere.sock"
workers = 7
stock_idle = false
[pools]
capacity = "100%"
pin = false
thp = false
[pools.node.1]
capacity = "4M"
[limits]
max_requests = 10
)");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(h_.Pool("node1").capacity_bytes, 64 * kMiB) << "kept: 6 MiB are leased";
  std::string kept;
  for (const auto& k : r->kept) kept += k + "\n";
  EXPECT_NE(kept.find("node1 capacity 4.0 MiB refused"), std::string::npos) << kept;
  EXPECT_NE(kept.find("daemon.socket changed: needs a restart"), std::string::npos) << kept;
  EXPECT_NE(kept.find("daemon.workers changed"), std::string::npos) << kept;
  EXPECT_NE(kept.find("daemon.stock_idle changed"), std::string::npos) << kept;
  EXPECT_NE(kept.find("limits changed: needs a restart"), std::string::npos) << kept;
  EXPECT_FALSE(current_.limits.max_requests.has_value()) << "the running limits are kept";
  EXPECT_EQ(current_.workers, TestConfig().workers) << "the running value is kept";
  EXPECT_TRUE(current_.stock_idle) << "the running value is kept";
  // The quota rule the file no longer has is gone.
  EXPECT_TRUE(h_.mgr->Quotas().empty());
}

TEST_F(ReloadTest, BadConfigChangesNothing) {
  ASSERT_TRUE(h_.Alloc(1, 6 * kMiB, 0).ok());
  for (const char* text : {"[pools]\ncapacity = \"120%\"\n", "[[quota]\n",
                           "[[quota]]\nuid = 1000\nmax_bytes = \"1M\"\nbogus = 1\n"}) {
    auto r = Reload(text);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
    EXPECT_NE(r.status().message().find(path_), std::string::npos) << r.status().message();
  }
  auto missing = ReloadConfigFile(dir_ + "/absent.toml", h_.topo, h_.mgr.get(), &current_);
  EXPECT_EQ(missing.status().code(), Code::kNotFound);
  ASSERT_EQ(h_.mgr->Quotas().size(), 1u);
  EXPECT_EQ(h_.mgr->Quotas()[0].rule.max_bytes, 8 * kMiB);
  EXPECT_EQ(h_.mgr->Quotas()[0].used_bytes, 6 * kMiB);
  EXPECT_EQ(h_.Pool("node0").capacity_bytes, 64 * kMiB);
  EXPECT_EQ(h_.mgr->Gauges()["live_leases"], 1u);
}

// A file that still has warm_stock is refused as a whole: the error names
// the file, the key and its replacement, and the daemon keeps running on
// what it had (reserve watermarks, quotas, leases), even the keys of that
// file that were fine.
TEST_F(ReloadTest, RemovedWarmStockIsRefusedAndTheRunningConfigKept) {
  ASSERT_TRUE(h_.Alloc(1, 6 * kMiB, 0).ok());
  auto first = Reload(R"(
[pools]
capacity = "100%"
pin = false
thp = false
reserve_low = "4M"
reserve_high = "8M"
[[quota]]
uid = 1000
max_bytes = "8M"
)");
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  h_.Drain();
  ASSERT_EQ(h_.Pool("node0").reserve_ready_bytes, 8 * kMiB);
  for (const std::string key : {"pools", "pools.node.1"}) {
    const std::string warm = "warm_stock = [{ size = \"2M\", count = 1 }]\n";
    auto r = Reload(kPoolsHead + (key == "pools" ? warm : "[pools.node.1]\n" + warm) +
                    R"(
[[quota]]
uid = 1000
max_bytes = "32M"
)");
    ASSERT_FALSE(r.ok()) << key;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
    EXPECT_EQ(r.status().message(),
              path_ + ": " + key +
                  ".warm_stock: removed; set reserve_low and reserve_high (bytes or a "
                  "percentage) instead");
  }
  h_.Drain();
  EXPECT_EQ(current_.pool_defaults.reserve_low.bytes, 4 * kMiB) << "the running config is kept";
  EXPECT_EQ(current_.pool_defaults.reserve_high.bytes, 8 * kMiB);
  EXPECT_EQ(h_.Pool("node0").reserve_low_bytes, 4 * kMiB);
  EXPECT_EQ(h_.Pool("node0").reserve_high_bytes, 8 * kMiB);
  EXPECT_EQ(h_.Pool("node0").reserve_ready_bytes, 8 * kMiB);
  EXPECT_NE(GetLogLevel(), LogLevel::kDebug);
  ASSERT_EQ(h_.mgr->Quotas().size(), 1u);
  EXPECT_EQ(h_.mgr->Quotas()[0].rule.max_bytes, 8 * kMiB);
  EXPECT_EQ(h_.mgr->Gauges()["live_leases"], 1u);
}

}  // namespace
}  // namespace cxlpool
