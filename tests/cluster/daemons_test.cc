// cxlpoold daemons as hosts of one cluster: a real 3-member etcd with TLS,
// three daemons (each its own socket, state directory and session) that
// see one shared device (a file). Checked through etcd and cxlpoolctl.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "cluster_hosts.h"
#include "cxlpool/client.hpp"
#include "etcd_cluster.h"
#include "test_support.h"

namespace cxlpool {
namespace {

using clustertest::HostName;
using nlohmann::json;
using testsupport::Daemon;
using testsupport::EtcdCluster;
using testsupport::PollUntil;
using testsupport::RunShell;
using testsupport::TempDir;

constexpr uint64_t kHeader = 2ull << 20;
constexpr uint64_t kSlice = 4ull << 20;
constexpr uint64_t kDeviceBytes = 64ull << 20;
constexpr uint32_t kSlices = (kDeviceBytes - kHeader) / kSlice;  // 15

class DaemonsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testsupport::SkipWithoutDaemon();
    auto c = EtcdCluster::Start({});
    if (!c.ok() && c.status().code() == Code::kUnsupported) GTEST_SKIP() << c.status().ToString();
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    etcd_ = std::move(c.value());
    ASSERT_FALSE(dir_.path.empty());
    shared_ = dir_.path + "/shared.img";
    // Every slice starts full of a pattern: a claim must zero it.
    int fd = ::open(shared_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, kDeviceBytes), 0);
    std::string pattern(kDeviceBytes - kHeader, '\xa5');
    ASSERT_EQ(::pwrite(fd, pattern.data(), pattern.size(), kHeader),
              static_cast<ssize_t>(pattern.size()));
    ::close(fd);
  }

  std::string Config(const std::string& host, Daemon& d) {
    EXPECT_TRUE(d.MakeDir().ok());
    return clustertest::HostConfig(*etcd_, etcd_->endpoints(), host, d.dir() + "/state", shared_);
  }

  Status StartHost(int i, const std::string& extra = "") {
    hosts_[i] = std::make_unique<Daemon>();
    hosts_[i]->set_log_to_file(true);
    std::string name = "h";  // += : GCC 12's -O3 -Wrestrict misreads "h" + std::string
    name += std::to_string(i);
    return hosts_[i]->Start(Config(name, *hosts_[i]) + extra);
  }

  // What the shared file holds at [offset, offset + n).
  std::string DeviceBytes(uint64_t offset, size_t n) {
    std::string buf(n, '\0');
    int fd = ::open(shared_.c_str(), O_RDONLY | O_CLOEXEC);
    const ssize_t got = ::pread(fd, buf.data(), n, static_cast<off_t>(offset));
    ::close(fd);
    return got == static_cast<ssize_t>(n) ? buf : std::string();
  }

  std::string Ctl(const std::string& args) { return clustertest::Ctl(*etcd_, args); }
  json View() {
    json j = clustertest::View(*etcd_);
    EXPECT_FALSE(j.empty()) << Ctl("cluster --json");
    return j;
  }
  static std::map<std::string, std::set<uint32_t>> Owners(const json& v) {
    return clustertest::Owners(v);
  }
  static size_t Quarantined(const json& v) { return clustertest::Quarantined(v); }
  bool SliceIsZero(uint32_t index) {
    std::string buf(kSlice, '\x01');
    int fd = ::open(shared_.c_str(), O_RDONLY | O_CLOEXEC);
    const ssize_t n = ::pread(fd, buf.data(), buf.size(), kHeader + uint64_t{index} * kSlice);
    ::close(fd);
    return n == static_cast<ssize_t>(kSlice) && buf.find_first_not_of('\0') == std::string::npos;
  }

  std::unique_ptr<EtcdCluster> etcd_;
  TempDir dir_{"cluster"};
  std::string shared_;
  std::unique_ptr<Daemon> hosts_[3];
};

// Three daemons join, publish their records and claim disjoint slices,
// each zeroed before it counts as theirs; the rest keep their bytes.
TEST_F(DaemonsTest, HostsJoinAndClaimDisjointZeroedSlices) {
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(StartHost(i).ok()) << i;
  std::map<std::string, std::set<uint32_t>> owners;
  ASSERT_TRUE(PollUntil(
      [&] {
        const json v = View();
        owners = Owners(v);
        size_t published = 0;  // records that already name the shared device
        for (const auto& h : v.value("hosts", json::array()))
          published += !h.value("shared_devices", json::array()).empty();
        return published == 3 && owners.size() == 3 && owners["h0"].size() == 2 &&
               owners["h1"].size() == 2 && owners["h2"].size() == 2;
      },
      15000, 100))
      << Ctl("cluster");
  std::set<uint32_t> all;
  for (const auto& [h, s] : owners) all.insert(s.begin(), s.end());
  EXPECT_EQ(all.size(), 6u);  // disjoint
  for (uint32_t i = 0; i < kSlices; ++i) EXPECT_EQ(SliceIsZero(i), all.count(i) == 1) << i;
  const json v = View();
  ASSERT_EQ(v.value("hosts", json::array()).size(), 3u);
  for (const auto& h : v["hosts"]) {
    EXPECT_FALSE(h.value("pools", json::array()).empty());
    const json shared = h.value("shared_devices", json::array());
    ASSERT_EQ(shared.size(), 1u);
    EXPECT_EQ(shared.at(0).value("id", ""), "shared-0");
  }
  EXPECT_NE(Ctl("cluster place --size 1M").find("yes"), std::string::npos);
  // A clean stop gives every unused slice back and leaves at once.
  ASSERT_TRUE(hosts_[2]->Stop().ok());
  const json after = View();
  EXPECT_EQ(after.value("hosts", json::array()).size(), 2u);
  EXPECT_EQ(Owners(after).count("h2"), 0u);
  EXPECT_EQ(Quarantined(after), 0u);
}

// SIGKILL: the host's slices are quarantined once its session expires
// (within TTL + 1 s), nobody claims them, and they come back either when an
// operator fences the host or when it restarts (at once: same instance).
TEST_F(DaemonsTest, KilledHostIsQuarantinedUntilFencedOrBack) {
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(StartHost(i).ok()) << i;
  ASSERT_TRUE(PollUntil([&] { return Owners(View()).size() == 2; }, 15000, 100));
  const auto kill = std::chrono::steady_clock::now();
  hosts_[0]->Kill();
  ASSERT_TRUE(PollUntil([&] { return Quarantined(View()) == 2; }, 6000, 50)) << Ctl("cluster");
  const auto seen = std::chrono::steady_clock::now() - kill;
  // The figure (TTL + 1 s) is C3's, printed below; the test only bounds it
  // loosely, as a 2-core CI box may be slow.
  EXPECT_LE(seen, std::chrono::milliseconds(8000));
  std::cout << "[ C3 ] quarantine seen "
            << std::chrono::duration_cast<std::chrono::milliseconds>(seen).count()
            << " ms after SIGKILL (TTL 2 s)\n";
  EXPECT_NE(Ctl("cluster fence h0").find("--confirm-down"), std::string::npos);
  EXPECT_EQ(Owners(View())["h1"].size(), 2u);  // h1 took none of them

  // Back before any fence: the restarted daemon revokes its old session,
  // rejoins and frees its unused slices (its journal lists none in use).
  const auto restart = std::chrono::steady_clock::now();
  ASSERT_TRUE(hosts_[0]->Restart().ok());
  ASSERT_TRUE(PollUntil(
      [&] {
        const json v = View();
        return Quarantined(v) == 0 && Owners(v)["h0"].size() == 2;
      },
      10000, 20))
      << Ctl("cluster");
  const auto back = std::chrono::steady_clock::now() - restart;
  EXPECT_LE(back, std::chrono::milliseconds(8000));  // not the TTL-long wait (30 s)
  std::cout << "[ C3 ] slices free again "
            << std::chrono::duration_cast<std::chrono::milliseconds>(back).count()
            << " ms after the restart\n";

  // Now for good: kill it and fence it.
  hosts_[0]->Kill();
  ASSERT_TRUE(PollUntil([&] { return Quarantined(View()) == 2; }, 6000, 50));
  const std::string fenced = Ctl("cluster fence h0 --confirm-down --reason test");
  EXPECT_NE(fenced.find("fenced h0 epoch"), std::string::npos) << fenced;
  const json v = View();
  EXPECT_EQ(Quarantined(v), 0u);
  const json fences = v.value("fences", json::array());
  ASSERT_EQ(fences.size(), 1u);
  EXPECT_EQ(fences[0].value("host", ""), "h0");
  EXPECT_NE(fences[0].value("by", "").find('@'), std::string::npos);
}

// Without etcd the daemons fence their shared slices and go on serving from
// local pools; when etcd is back they rejoin with new epochs.
TEST_F(DaemonsTest, LocalPoolsServeWhileEtcdIsGone) {
  ASSERT_TRUE(StartHost(0).ok());
  ASSERT_TRUE(PollUntil([&] { return Owners(View()).size() == 1; }, 15000, 100));
  const json first = View();
  ASSERT_EQ(first.value("hosts", json::array()).size(), 1u);
  const int64_t epoch = first["hosts"][0].value("epoch", int64_t{0});
  // Every member stopped (as a partition from all of them would look).
  for (int i = 0; i < etcd_->size(); ++i) ASSERT_TRUE(etcd_->StopMember(i).ok());
  auto stats = [&] {
    return RunShell(testsupport::CtlBinary() + " --socket " + hosts_[0]->socket() + " --json stats")
        .second;
  };
  auto fenced = [&] { return clustertest::Gauge(*hosts_[0], "cluster_shared_fenced") == 1; };
  ASSERT_TRUE(PollUntil(fenced, 8000, 100)) << stats();
  const auto t0 = std::chrono::steady_clock::now();
  auto [rc, out] = RunShell(testsupport::CtlBinary() + " --socket " + hosts_[0]->socket() +
                            " alloc --size 64M 2>&1");
  EXPECT_EQ(rc, 0) << out;
  // Not etcd's worst case (2 s x 3 endpoints): the local path never asks it.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_NE(hosts_[0]->Log().find("lost its session"), std::string::npos);
  // Shared slices are refused while fenced; a request that lists DRAM after
  // them gets DRAM.
  auto [strict_rc, strict_out] =
      RunShell(testsupport::CtlBinary() + " --socket " + hosts_[0]->socket() +
               " alloc --size 1M --tier shared --strict 2>&1");
  EXPECT_NE(strict_rc, 0) << strict_out;
  EXPECT_NE(strict_out.find("session lost"), std::string::npos) << strict_out;
  auto [rc2, out2] = RunShell(testsupport::CtlBinary() + " --socket " + hosts_[0]->socket() +
                              " --json alloc --size 1M --tier shared,dram 2>&1");
  EXPECT_EQ(rc2, 0) << out2;
  EXPECT_NE(out2.find("node0"), std::string::npos) << out2;
  for (int i = 0; i < etcd_->size(); ++i) ASSERT_TRUE(etcd_->ContMember(i).ok());
  ASSERT_TRUE(PollUntil(
      [&] {
        const json v = View();
        const json hosts = v.value("hosts", json::array());
        return hosts.size() == 1 && hosts[0].value("epoch", int64_t{0}) > epoch &&
               !hosts[0].value("shared_fenced", true);
      },
      15000, 100))
      << Ctl("cluster");
}

// "h1/lease 7". Appended: GCC 12's -O3 -Wrestrict misreads "h" + std::string.
std::string LeaseTag(int host, uint64_t id) {
  std::string t = HostName(host);
  t += "/lease ";
  t += std::to_string(id);
  return t;
}

// A lease of the "shared" tier is one slice its host owns: the client maps
// the device at the slice's offset, so what it writes is on the device; the
// hosts' leases sit on disjoint slices; a host's quota on the tier holds; a
// released slice is zeroed before it serves again; and a SIGKILLed host
// re-adopts the slices its leases hold, which its client hands back.
TEST_F(DaemonsTest, SharedTierLeasesSitOnSlicesTheirHostOwns) {
  ASSERT_TRUE(StartHost(0).ok());
  const std::string quota =
      "[[quota]]\nuid = " + std::to_string(::getuid()) + "\ntier = \"shared\"\nmax_leases = 2\n";
  ASSERT_TRUE(StartHost(1, quota).ok());
  ASSERT_TRUE(PollUntil([&] { return Owners(View()).size() == 2; }, 15000, 100)) << Ctl("cluster");
  auto c0 = Client::Connect(hosts_[0]->socket());
  auto c1 = Client::Connect(hosts_[1]->socket());
  ASSERT_TRUE(c0.ok() && c1.ok());
  AllocOptions o;
  o.size_bytes = 1 << 20;
  o.tier_preference = {"shared"};
  o.strict = true;
  struct Held {
    int host;
    Lease lease;
    uint32_t slice;
  };
  std::vector<Held> held;
  auto take = [&](int host) -> ClientStatus {
    auto l = (host == 0 ? *c0 : *c1).Allocate(o);
    if (!l.ok()) return l.status();
    const LeaseInfo i = l->info();
    EXPECT_EQ(i.backing, "shared-slice");
    EXPECT_EQ(i.pool, "shared:shared.img");
    EXPECT_EQ(i.size_bytes, kSlice);  // a whole slice
    EXPECT_EQ((i.device_offset - kHeader) % kSlice, 0u);
    const uint32_t slice = static_cast<uint32_t>((i.device_offset - kHeader) / kSlice);
    // Tagged with host and lease, through the client's mapping.
    const std::string tag = LeaseTag(host, i.id);
    std::memset(l->data(), 0x5a, l->size());
    std::memcpy(l->data(), tag.data(), tag.size());
    held.push_back({host, std::move(*l), slice});
    return ClientStatus();
  };
  // Three on h0: one more than it claims ahead (a Take waits for a claim).
  for (int k = 0; k < 3; ++k) ASSERT_TRUE(take(0).ok()) << k;
  for (int k = 0; k < 2; ++k) ASSERT_TRUE(take(1).ok()) << k;
  ClientStatus refused = take(1);
  EXPECT_EQ(refused.code(), ErrorCode::kResourceExhausted) << refused.message();
  EXPECT_NE(refused.message().find("shared"), std::string::npos) << refused.message();

  auto tag_of = [](const Held& h) { return LeaseTag(h.host, h.lease.info().id); };
  auto check = [&](const char* when) {
    const auto owners = Owners(View());
    std::set<uint32_t> slices;
    for (const Held& h : held) {
      EXPECT_TRUE(slices.insert(h.slice).second) << when << ": slice " << h.slice << " twice";
      EXPECT_EQ(owners.count(HostName(h.host)) ? owners.at(HostName(h.host)).count(h.slice) : 0u,
                1u)
          << when << ": slice " << h.slice << " not owned by h" << h.host << "\n"
          << Ctl("cluster");
      const std::string tag = tag_of(h);
      EXPECT_EQ(DeviceBytes(kHeader + uint64_t{h.slice} * kSlice, tag.size()), tag) << when;
    }
  };
  ASSERT_TRUE(PollUntil(
      [&] {  // owned slices show in etcd's view once the claims are in
        const auto owners = Owners(View());
        for (const Held& h : held)
          if (!owners.count(HostName(h.host)) || !owners.at(HostName(h.host)).count(h.slice))
            return false;
        return true;
      },
      10000, 50));
  check("granted");
  const std::string listed =
      RunShell(testsupport::CtlBinary() + " --socket " + hosts_[0]->socket() + " leases 2>&1")
          .second;
  EXPECT_NE(listed.find("shared:shared.img"), std::string::npos) << listed;
  // The CLI asks for the tier as the docs say.
  auto [rc, alloc] = RunShell(testsupport::CtlBinary() + " --socket " + hosts_[0]->socket() +
                              " alloc --size 1M --tier shared --strict 2>&1");
  EXPECT_EQ(rc, 0) << alloc;
  EXPECT_NE(alloc.find("shared"), std::string::npos) << alloc;

  // Released: zeroed before it serves again.
  const uint32_t freed = held[0].slice;
  ASSERT_TRUE(held[0].lease.Release().ok());
  held.erase(held.begin());
  ASSERT_TRUE(PollUntil([&] { return SliceIsZero(freed); }, 10000, 20)) << "slice " << freed;

  // SIGKILL h0 while its client holds two leases: the restarted daemon
  // re-adopts those slices (its journal's), not freeing them to others.
  auto epoch_of_h0 = [&](const json& v) {
    for (const auto& h : v.value("hosts", json::array()))
      if (h.value("host", "") == "h0") return h.value("epoch", int64_t{0});
    return int64_t{0};
  };
  const int64_t before = epoch_of_h0(View());
  hosts_[0]->Kill();
  ASSERT_TRUE(hosts_[0]->Restart().ok());
  ASSERT_TRUE(PollUntil(
      [&] {
        const json v = View();
        return epoch_of_h0(v) > before && Quarantined(v) == 0 && Owners(v).count("h0") &&
               Owners(v).at("h0").count(held[0].slice) && Owners(v).at("h0").count(held[1].slice);
      },
      15000, 50))
      << Ctl("cluster") << hosts_[0]->Log();
  check("after h0's restart");
  // The client hands them back to the new daemon and releases them.
  for (Held& h : held) {
    if (h.host != 0) continue;
    EXPECT_TRUE(h.lease.Release().ok()) << "slice " << h.slice;
    EXPECT_TRUE(PollUntil([&] { return SliceIsZero(h.slice); }, 10000, 20))
        << "slice " << h.slice << "\n"
        << Ctl("cluster") << hosts_[0]->Log();
  }
}

// A lease whose host an operator fenced while it was down, and whose slice
// another host then claimed: when the host comes back it revokes the lease
// (its holder is told) instead of serving memory it no longer owns.
TEST_F(DaemonsTest, ALeaseOnASliceFencedAwayIsRevoked) {
  ASSERT_TRUE(StartHost(0).ok());
  ASSERT_TRUE(StartHost(1).ok());
  ASSERT_TRUE(PollUntil([&] { return Owners(View()).size() == 2; }, 15000, 100));
  auto c0 = Client::Connect(hosts_[0]->socket());
  auto c1 = Client::Connect(hosts_[1]->socket());
  ASSERT_TRUE(c0.ok() && c1.ok());
  AllocOptions o;
  o.size_bytes = kSlice;
  o.tier_preference = {"shared"};
  o.strict = true;
  auto lease = c0->Allocate(o);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  const uint32_t slice = static_cast<uint32_t>((lease->info().device_offset - kHeader) / kSlice);
  hosts_[0]->Kill();
  ASSERT_TRUE(PollUntil([&] { return Quarantined(View()) > 0; }, 8000, 50)) << Ctl("cluster");
  const std::string fenced = Ctl("cluster fence h0 --confirm-down --reason test");
  ASSERT_NE(fenced.find("fenced h0 epoch"), std::string::npos) << fenced;
  // h1 takes slices until it owns the fenced lease's.
  std::vector<Lease> h1_leases;
  while (!Owners(View())["h1"].count(slice)) {
    auto l = c1->Allocate(o);
    ASSERT_TRUE(l.ok()) << l.status().ToString() << "\n" << Ctl("cluster");
    h1_leases.push_back(std::move(*l));
  }
  auto losses = [&] {
    auto [rc, out] =
        RunShell(testsupport::CtlBinary() + " --socket " + hosts_[0]->socket() + " --json stats");
    json j = json::parse(out, nullptr, false);
    if (rc != 0 || j.is_discarded()) return int64_t{-1};
    return j.value("counters", json::object()).value("slice_losses", int64_t{0});
  };
  ASSERT_TRUE(hosts_[0]->Restart().ok());
  ASSERT_TRUE(PollUntil([&] { return losses() == 1; }, 15000, 50))
      << Ctl("cluster") << hosts_[0]->Log();
  EXPECT_NE(hosts_[0]->Log().find("no longer this host's"), std::string::npos);
  // The holder hears it: its lease is revoked.
  EXPECT_TRUE(PollUntil(
      [&] {
        (void)c0->ProcessEvents();
        return lease->revoked();
      },
      5000, 20));
  EXPECT_EQ(Owners(View())["h0"].count(slice), 0u);
}

}  // namespace
}  // namespace cxlpool
