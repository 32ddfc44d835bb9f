// Hosts in their own network namespaces (issue 39's partitions): each
// cxlpoold runs inside a namespace joined to this one by a veth and reaches
// the 3-member etcd (TLS) only over that link; a partition is the link going
// down. Exits 77, saying why, when namespaces or veths cannot be made here.
#include <gtest/gtest.h>

#include <chrono>
#include <iostream>
#include <thread>

#include "cluster_hosts.h"
#include "etcd_cluster.h"
#include "netns.h"
#include "test_support.h"

namespace cxlpool {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::steady_clock;
using testsupport::Daemon;
using testsupport::EtcdCluster;
using testsupport::NetnsHost;
using testsupport::PollUntil;

constexpr int kHosts = 2;
constexpr uint64_t kDeviceBytes = 64ull << 20;

using clustertest::HostName;

class PartitionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testsupport::SkipWithoutDaemon();
    ASSERT_FALSE(dir_.path.empty());
    Status s = c_.Start("partition_test", kHosts, dir_.path, kDeviceBytes);
    if (s.code() == Code::kUnsupported) GTEST_SKIP() << s.ToString();
    ASSERT_TRUE(s.ok()) << s.ToString();
    for (int i = 0; i < kHosts; ++i) {
      ns_[i] = c_.ns[i].get();
      hosts_[i] = c_.hosts[i].get();
    }
    etcd_ = c_.etcd.get();
  }

  json View() { return clustertest::View(*etcd_); }
  std::string Ctl(const std::string& args) { return clustertest::Ctl(*etcd_, args); }
  int64_t Epoch(const json& v, const std::string& host) {
    for (const auto& h : v.value("hosts", json::array()))
      if (h.value("host", "") == host) return h.value("epoch", int64_t{0});
    return 0;
  }
  // No slice is listed twice, by two owners or two epochs.
  ::testing::AssertionResult OwnedOnce(const json& v) {
    std::map<uint32_t, int> seen;
    for (const auto& d : v.value("shared_devices", json::array()))
      for (const auto& s : d.value("owned_slices", json::array()))
        if (++seen[s.value("index", 0u)] > 1)
          return ::testing::AssertionFailure() << "slice " << s.value("index", 0u) << " twice";
    return ::testing::AssertionSuccess();
  }

  testsupport::TempDir dir_{"partition"};
  clustertest::NamespacedHosts c_;
  NetnsHost* ns_[kHosts] = {};
  EtcdCluster* etcd_ = nullptr;
  Daemon* hosts_[kHosts] = {};
};

// A host cut off from etcd fences itself within its TTL and keeps serving
// from local pools; the others see its slices quarantined and claim none of
// them. When the link is back it rejoins with a new epoch and the quarantine
// ends.
TEST_F(PartitionTest, PartitionedHostFencesItselfAndRejoins) {
  ASSERT_TRUE(PollUntil(
      [&] {
        auto o = clustertest::Owners(View());
        return o["h0"].size() == 2 && o["h1"].size() == 2;
      },
      20000, 100))
      << Ctl("cluster") << hosts_[0]->Log();
  const json before = View();
  const int64_t epoch = Epoch(before, "h0");
  const std::set<uint32_t> h0_slices = clustertest::Owners(before)["h0"];
  ASSERT_GT(epoch, 0);

  ASSERT_TRUE(ns_[0]->Partition().ok());
  const auto cut = steady_clock::now();
  ASSERT_TRUE(PollUntil(
      [&] { return clustertest::Gauge(*hosts_[0], "cluster_shared_fenced") == 1; }, 8000, 50))
      << hosts_[0]->Log();
  const auto fenced = steady_clock::now() - cut;
  ASSERT_TRUE(PollUntil([&] { return clustertest::Quarantined(View()) == 2; }, 8000, 50))
      << Ctl("cluster");
  std::cout << "[ partition ] h0 fenced itself "
            << std::chrono::duration_cast<milliseconds>(fenced).count()
            << " ms after its link went down (TTL 2 s)\n";
  EXPECT_LE(fenced, milliseconds(6000));  // TTL + slack for a 2-core CI box
  EXPECT_NE(hosts_[0]->Log().find("lost its session"), std::string::npos);

  // The local path does not wait for the network.
  const auto t0 = steady_clock::now();
  auto [rc, out] = testsupport::RunShell(testsupport::CtlBinary() + " --socket " +
                                         hosts_[0]->socket() + " alloc --size 16M 2>&1");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_LT(steady_clock::now() - t0, std::chrono::seconds(5));

  // Two TTLs later h1 has still taken none of h0's slices.
  std::this_thread::sleep_for(milliseconds(4000));
  json during = View();
  EXPECT_EQ(clustertest::Quarantined(during), 2u);
  auto owners = clustertest::Owners(during);  // kept: a range-for over a temporary's member dangles
  for (uint32_t s : owners["h1"]) EXPECT_EQ(h0_slices.count(s), 0u) << s;
  EXPECT_TRUE(OwnedOnce(during));
  EXPECT_EQ(clustertest::Gauge(*hosts_[1], "cluster_shared_fenced"), 0);

  ASSERT_TRUE(ns_[0]->Heal().ok());
  const auto healed = steady_clock::now();
  ASSERT_TRUE(PollUntil(
      [&] {
        const json v = View();
        return Epoch(v, "h0") > epoch && clustertest::Quarantined(v) == 0 &&
               clustertest::Owners(v)["h0"].size() == 2;
      },
      15000, 100))
      << Ctl("cluster") << hosts_[0]->Log();
  std::cout << "[ partition ] h0 back with a new epoch and no quarantine "
            << std::chrono::duration_cast<milliseconds>(steady_clock::now() - healed).count()
            << " ms after the link came up\n";
  EXPECT_TRUE(PollUntil(
      [&] { return clustertest::Gauge(*hosts_[0], "cluster_shared_fenced") == 0; }, 5000, 50));
  EXPECT_TRUE(OwnedOnce(View()));
}

}  // namespace
}  // namespace cxlpool
