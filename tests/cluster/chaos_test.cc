// Chaos for the cluster layer (issue 39, C5): randomized faults against three
// cxlpoold hosts, each in its own network namespace (tests/support/netns.h),
// on a 3-member etcd with TLS, all sharing one device (a file). Faults:
//   kill       SIGKILL a daemon, restart it (same instance and state dir);
//   stop       SIGSTOP a daemon past its TTL, then SIGCONT;
//   partition  take a host's link down past its TTL, then up;
//   leader     SIGKILL etcd's leader, restart it.
// While each fault runs and until the cluster settles, the test reads etcd
// every few milliseconds and holds these invariants:
//   * capacity: free + owned + quarantined + fenced slices = the device's
//     slices, and the device's slicing covers the file;
//   * fencing: a slice seen quarantined under (host, epoch) changes hands
//     only after that host rejoined with a later epoch or was fenced;
//   * leases: after each settle a client of every host releases its oldest
//     lease of tier "shared" (beyond two) and takes a new one, checks that it
//     reads zero, and writes a tag naming host and lease through its mapping.
//     Every lease held sits, all the time, on a slice etcd records as its
//     host's (owned, or quarantined while the host is away; never another
//     host's, never free), and its tag stays on the device (no stale write);
//   * one owner: once settled, each daemon's own count of owned slices
//     (STATS cluster_slices_owned) is what etcd records for it, and every
//     host is live, unfenced, and nothing is quarantined.
// The local grant path is checked on the partitioned host during its
// partition.
//
// CXLPOOL_CHAOS_FAULTS sets the number of faults (default 12: the stress
// label's short run); CXLPOOL_CHAOS_SEED the seed (default: time). Exits 77
// where network namespaces cannot be made.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "cluster_hosts.h"
#include "cxlpool/client.hpp"
#include "cxlpool/cluster/slice_registry.h"
#include "etcd_cluster.h"
#include "netns.h"
#include "test_support.h"

namespace cxlpool {
namespace {

using cluster::ClusterView;
using cluster::SliceState;
using std::chrono::milliseconds;
using std::chrono::steady_clock;
using testsupport::Daemon;
using testsupport::EtcdCluster;
using testsupport::NetnsHost;

constexpr int kHosts = 3;
constexpr uint64_t kHeader = 2ull << 20;
constexpr uint64_t kSlice = 4ull << 20;
constexpr uint64_t kDeviceBytes = 64ull << 20;
constexpr uint32_t kSlices = (kDeviceBytes - kHeader) / kSlice;  // 15
constexpr int kClaimAhead = 2;                                   // HostConfig's
const milliseconds kPastTtl(3000);                               // TTL 2 s + 1 s
const std::string kDevice = "shared-0";

using clustertest::HostName;

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : fallback;
}

// What the checker remembers about one slice.
struct Held {
  std::string owner;
  int64_t epoch = 0;
};

// A lease of the shared tier the test's client holds, and its tag.
struct HeldLease {
  int host = 0;
  Lease lease;
  uint32_t slice = 0;
  std::string tag;
};
constexpr size_t kLeasesPerHost = 2;

class ChaosTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testsupport::SkipWithoutDaemon();
    ASSERT_FALSE(dir_.path.empty());
    Status st = c_.Start("chaos_test", kHosts, dir_.path, kDeviceBytes);
    if (st.code() == Code::kUnsupported) GTEST_SKIP() << st.ToString();
    ASSERT_TRUE(st.ok()) << st.ToString();
    for (int i = 0; i < kHosts; ++i) {
      ns_[i] = c_.ns[i].get();
      hosts_[i] = c_.hosts[i].get();
      auto c = Client::Connect(hosts_[i]->socket());
      ASSERT_TRUE(c.ok()) << c.status().ToString();
      clients_[i] = std::move(*c);
    }
    etcd_ = c_.etcd.get();
    shared_ = c_.shared;
    etcd::ClientOptions o;
    o.endpoints = etcd_->endpoints();
    o.tls = {etcd_->ca_file(), etcd_->client_cert_file(), etcd_->client_key_file()};
    auto client = etcd::Client::Connect(o);
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    client_ = std::move(client.value());
    registry_ = std::make_unique<cluster::SliceRegistry>(client_.get(), cluster::Keys());
    // Every epoch a host key is created with, from a watch on the whole
    // prefix: a host may rejoin, free its earlier epoch's slices and lose
    // its session again between two polls (an etcd leader change can make
    // a poll fail for seconds), and the polls alone would never see that
    // epoch.
    const std::string hosts = cluster::Keys().Hosts();
    auto note = [this, hosts](const etcd::KeyValue& kv) {
      if (kv.key.rfind(hosts, 0) != 0) return;
      int64_t& e = watched_epoch_[kv.key.substr(hosts.size())];
      e = std::max(e, kv.create_revision);
    };
    watch_ = client_->WatchPrefix(
        cluster::Keys().prefix() + "/", 0,
        [this, note](const std::vector<etcd::WatchEvent>& events, int64_t) {
          std::lock_guard<std::mutex> lock(watched_mu_);
          for (const auto& e : events)
            if (e.type == etcd::WatchEvent::Type::kPut) note(e.kv);
        },
        [this, note, hosts]() -> int64_t {
          auto r = client_->GetPrefix(hosts);
          if (!r.ok()) return 0;
          std::lock_guard<std::mutex> lock(watched_mu_);
          for (const auto& kv : r->kvs) note(kv);
          return r->revision;
        });
  }

  void TearDown() override {
    if (watch_) watch_->Stop();
  }

  // Whether `host` had an epoch above `epoch` by etcd revision `revision`:
  // waits (3 s at most) until the watch has delivered that far.
  bool RejoinedBy(const std::string& host, int64_t epoch, int64_t revision) {
    const auto until = steady_clock::now() + milliseconds(3000);
    while (watch_->revision() < revision && steady_clock::now() < until)
      std::this_thread::sleep_for(milliseconds(5));
    std::lock_guard<std::mutex> lock(watched_mu_);
    auto it = watched_epoch_.find(host);
    return it != watched_epoch_.end() && it->second > epoch;
  }

  void Violation(const std::string& what) {
    if (violations_.size() < 20) violations_.push_back(what);
    ++violation_count_;
  }

  // One look at etcd and the shared file; false when etcd did not answer.
  bool Check() {
    auto v = registry_->Read();
    if (!v.ok()) return false;
    ++checks_;
    for (const auto& [name, h] : v->hosts) max_epoch_[name] = std::max(max_epoch_[name], h.epoch);
    auto d = v->devices.find(kDevice);
    if (d == v->devices.end()) return true;  // before the first host made it
    CheckCapacity(d->second);
    for (const auto& s : d->second.slices) CheckQuarantine(*v, s);
    CheckLeases(d->second);
    return true;
  }

  void CheckCapacity(const cluster::DeviceView& d) {
    std::map<SliceState, uint32_t> n;
    for (const auto& s : d.slices) n[s.state]++;
    const uint32_t sum = n[SliceState::kFree] + n[SliceState::kOwned] +
                         n[SliceState::kQuarantined] + n[SliceState::kFenced];
    if (sum != d.slices.size() || d.slices.size() != kSlices ||
        d.record.slice_bytes * d.slices.size() > kDeviceBytes - kHeader)
      Violation("capacity: " + std::to_string(sum) + " slices in states, " +
                std::to_string(d.slices.size()) + " listed, " + std::to_string(kSlices) +
                " on the device");
  }

  // A quarantined slice changes hands only after its host rejoined or was
  // fenced.
  void CheckQuarantine(const ClusterView& v, const cluster::SliceView& s) {
    auto q = quarantined_.find(s.index);
    if (s.state == SliceState::kQuarantined) {
      if (q == quarantined_.end() || q->second.owner != s.record.owner ||
          q->second.epoch != s.record.epoch)
        quarantined_[s.index] = {s.record.owner, s.record.epoch};
      return;
    }
    if (q == quarantined_.end()) return;
    const Held held = q->second;
    quarantined_.erase(q);
    const bool fenced = v.fences.count({held.owner, held.epoch}) != 0;
    bool rejoined = max_epoch_[held.owner] > held.epoch;
    if (!rejoined && !fenced && RejoinedBy(held.owner, held.epoch, v.revision)) {
      rejoined = true;
      ++rejoins_between_polls_;
    }
    if (!rejoined && !fenced)
      Violation("slice " + std::to_string(s.index) + " left quarantine under " + held.owner +
                " epoch " + std::to_string(held.epoch) + " (now " +
                cluster::SliceStateName(s.state) + " by " + s.record.owner +
                ") before a rejoin or a fence");
  }

  std::string ReadSlice(uint32_t index, size_t n) const {
    std::string buf(n, '\0');
    int fd = ::open(shared_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return "";
    ssize_t got = ::pread(fd, buf.data(), n, static_cast<off_t>(kHeader + index * kSlice));
    ::close(fd);
    return got == static_cast<ssize_t>(n) ? buf : "";
  }

  // Every lease held sits on a slice of its host, and its tag is there.
  void CheckLeases(const cluster::DeviceView& d) {
    for (const HeldLease& l : leases_) {
      const auto& s = d.slices[l.slice];
      const std::string host = HostName(l.host);
      if (s.mod_revision == 0 || s.record.owner != host ||
          (s.state != SliceState::kOwned && s.state != SliceState::kQuarantined)) {
        ++foreign_leases_;
        Violation("lease " + std::to_string(l.lease.info().id) + " of " + host + " sits on slice " +
                  std::to_string(l.slice) + ", " + cluster::SliceStateName(s.state) + " by '" +
                  s.record.owner + "'");
      }
      if (ReadSlice(l.slice, l.tag.size()) != l.tag ||
          std::memcmp(l.lease.data(), l.tag.data(), l.tag.size()) != 0) {
        ++stale_writes_;
        Violation("slice " + std::to_string(l.slice) + " under lease " +
                  std::to_string(l.lease.info().id) + " of " + host +
                  " was written by someone else");
      }
    }
  }

  // Polls Check() for `d`.
  void Watch(milliseconds d) {
    const auto end = steady_clock::now() + d;
    while (steady_clock::now() < end) {
      Check();
      std::this_thread::sleep_for(milliseconds(20));
    }
  }

  // Until every host is live and unfenced, owns claim_ahead slices beside
  // those under leases, agrees with etcd about them, and nothing is
  // quarantined; then churns the leases. The time it took, or -1.
  int64_t Settle(milliseconds limit = milliseconds(30000)) {
    const auto start = steady_clock::now();
    std::string why;
    while (steady_clock::now() - start < limit) {
      why = Settled();
      if (why.empty()) {
        Churn();
        return std::chrono::duration_cast<milliseconds>(steady_clock::now() - start).count();
      }
      std::this_thread::sleep_for(milliseconds(50));
    }
    Violation("did not settle within " + std::to_string(limit.count()) + " ms: " + why);
    return -1;
  }

  std::string Settled() {
    if (!Check()) return "etcd did not answer";
    auto v = registry_->Read();
    if (!v.ok()) return "etcd did not answer";
    auto d = v->devices.find(kDevice);
    if (d == v->devices.end()) return "no device record";
    std::map<std::string, uint32_t> owned;
    for (const auto& s : d->second.slices) {
      if (s.state == SliceState::kQuarantined) return "a slice is quarantined";
      if (s.state == SliceState::kOwned) owned[s.record.owner]++;
    }
    for (int i = 0; i < kHosts; ++i) {
      const std::string name = HostName(i);
      if (!v->hosts.count(name)) return name + " is not live";
      const size_t leased = LeasesOf(i);
      if (owned[name] < kClaimAhead + leased)
        return name + " owns " + std::to_string(owned[name]) + " with " + std::to_string(leased) +
               " leased";
      auto admin = testsupport::RawClient::Connect(hosts_[i]->socket(), "chaos", 2000);
      if (!admin.ok()) return name + ": no answer on its socket";
      auto a = testsupport::ReadAccounting(*admin);
      if (!a.ok()) return name + ": no STATS";
      if (a->Gauge("cluster_session_live") != 1 || a->Gauge("cluster_shared_fenced") != 0)
        return name + " is not live or still fenced by its own account";
      if (a->Gauge("cluster_slices_owned") != owned[name])
        return name + " counts " + std::to_string(a->Gauge("cluster_slices_owned")) +
               " owned slices, etcd " + std::to_string(owned[name]);
    }
    return "";
  }

  size_t LeasesOf(int host) const {
    size_t n = 0;
    for (const HeldLease& l : leases_) n += l.host == host;
    return n;
  }

  // Per host: the oldest lease beyond kLeasesPerHost - 1 goes, a new one
  // comes; it must read zero, and gets its tag. A host just restarted is
  // reconnected to (its leases handed back) by the first call.
  void Churn() {
    AllocOptions o;
    o.size_bytes = kSlice;
    o.tier_preference = {"shared"};
    o.strict = true;
    for (int i = 0; i < kHosts; ++i) {
      auto oldest = std::find_if(leases_.begin(), leases_.end(),
                                 [&](const HeldLease& l) { return l.host == i; });
      if (LeasesOf(i) >= kLeasesPerHost) {
        Lease gone = std::move(oldest->lease);
        leases_.erase(oldest);
        if (ClientStatus st = gone.Release(); !st.ok())
          Violation("release on " + HostName(i) + ": " + st.ToString());
      }
      ClientResult<Lease> l = clients_[i].Allocate(o);
      // A restarted daemon may still be in its grace period for a moment.
      for (int tries = 0; !l.ok() && l.status().code() == ErrorCode::kUnavailable && tries < 100;
           ++tries) {
        std::this_thread::sleep_for(milliseconds(50));
        l = clients_[i].Allocate(o);
      }
      if (!l.ok()) {
        Violation("a shared lease on settled " + HostName(i) + ": " + l.status().ToString());
        continue;
      }
      const uint64_t off = l->info().device_offset;
      const auto* p = static_cast<const unsigned char*>(l->data());
      if (std::any_of(p, p + l->size(), [](unsigned char c) { return c != 0; }))
        Violation("lease " + std::to_string(l->info().id) + " of " + HostName(i) +
                  " did not read zero");
      HeldLease h;
      h.host = i;
      h.slice = static_cast<uint32_t>((off - kHeader) / kSlice);
      h.tag = "cxlpool-chaos host=" + HostName(i) + " lease=" + std::to_string(l->info().id);
      std::memcpy(l->data(), h.tag.data(), h.tag.size());
      h.lease = std::move(*l);
      leases_.push_back(std::move(h));
      ++leases_taken_;
    }
  }

  testsupport::TempDir dir_{"chaos"};
  clustertest::NamespacedHosts c_;
  NetnsHost* ns_[kHosts] = {};
  EtcdCluster* etcd_ = nullptr;
  Daemon* hosts_[kHosts] = {};
  std::string shared_;
  std::unique_ptr<etcd::Client> client_;
  std::unique_ptr<cluster::SliceRegistry> registry_;
  std::unique_ptr<etcd::Watch> watch_;
  std::mutex watched_mu_;
  std::map<std::string, int64_t> watched_epoch_;  // per host, the latest epoch etcd ever had

  std::map<std::string, int64_t> max_epoch_;  // the latest live epoch seen per host
  std::map<uint32_t, Held> quarantined_;      // as first seen quarantined
  Client clients_[kHosts];
  std::vector<HeldLease> leases_;  // the clients' leases, oldest first
  uint64_t leases_taken_ = 0;
  uint64_t foreign_leases_ = 0;  // a lease on a slice not its host's
  std::vector<std::string> violations_;
  uint64_t violation_count_ = 0;
  uint64_t stale_writes_ = 0;
  uint64_t checks_ = 0;
  uint64_t rejoins_between_polls_ = 0;  // rejoins only the watch saw
};

TEST_F(ChaosTest, InvariantsHoldUnderRandomFaults) {
  const int faults = EnvInt("CXLPOOL_CHAOS_FAULTS", 12);
  const unsigned seed = static_cast<unsigned>(
      EnvInt("CXLPOOL_CHAOS_SEED", static_cast<int>(::time(nullptr) & 0x7fffffff)));
  std::cout << "[ chaos ] " << faults << " faults, seed " << seed
            << " (CXLPOOL_CHAOS_SEED reruns it)\n";
  std::mt19937 rng(seed);
  ASSERT_GE(Settle(), 0) << violations_.front() << "\n" << clustertest::Ctl(*etcd_, "cluster");
  std::map<std::string, int> kinds;
  std::vector<int64_t> settle_ms;
  for (int f = 0; f < faults && violations_.empty(); ++f) {
    const int h = static_cast<int>(rng() % kHosts);
    const int kind = static_cast<int>(rng() % 4);
    const milliseconds pause(200 + rng() % 800);
    switch (kind) {
      case 0:  // SIGKILL and restart
        kinds["kill"]++;
        hosts_[h]->Kill();
        Watch(pause);
        if (Status s = hosts_[h]->Restart(); !s.ok()) Violation("restart: " + s.ToString());
        break;
      case 1:  // SIGSTOP past the TTL
        kinds["stop"]++;
        ::kill(hosts_[h]->pid(), SIGSTOP);
        Watch(kPastTtl + pause);
        ::kill(hosts_[h]->pid(), SIGCONT);
        break;
      case 2: {  // a partition past the TTL; local grants go on
        kinds["partition"]++;
        if (Status s = ns_[h]->Partition(); !s.ok()) Violation("partition: " + s.ToString());
        Watch(kPastTtl);
        const auto t0 = steady_clock::now();
        auto [rc, out] = testsupport::RunShell(testsupport::CtlBinary() + " --socket " +
                                               hosts_[h]->socket() + " alloc --size 8M 2>&1");
        if (rc != 0 || steady_clock::now() - t0 > std::chrono::seconds(5))
          Violation("local grant on a partitioned host: " + out);
        Watch(pause);
        if (Status s = ns_[h]->Heal(); !s.ok()) Violation("heal: " + s.ToString());
        break;
      }
      default: {  // etcd's leader
        kinds["leader"]++;
        const int leader = etcd_->leader_index();
        if (leader < 0) break;
        if (Status s = etcd_->KillMember(leader); !s.ok())
          Violation("kill leader: " + s.ToString());
        Watch(pause);
        if (Status s = etcd_->RestartMember(leader); !s.ok())
          Violation("restart member: " + s.ToString());
        break;
      }
    }
    const int64_t ms = Settle();
    if (ms >= 0) settle_ms.push_back(ms);
  }
  std::sort(settle_ms.begin(), settle_ms.end());
  // The run stops at the first violation: say how many faults it reached.
  const int ran = kinds["kill"] + kinds["stop"] + kinds["partition"] + kinds["leader"];
  std::cout << "[ C5 ] faults " << ran << (ran < faults ? " of " + std::to_string(faults) : "")
            << " (kill " << kinds["kill"] << ", stop " << kinds["stop"] << ", partition "
            << kinds["partition"] << ", leader " << kinds["leader"] << "), " << checks_
            << " checks, " << leases_taken_ << " leases, " << violation_count_ << " violations, "
            << stale_writes_ << " stale writes, " << foreign_leases_
            << " leases off their host's slices; settled in median "
            << (settle_ms.empty() ? 0 : settle_ms[settle_ms.size() / 2]) << " ms, max "
            << (settle_ms.empty() ? 0 : settle_ms.back()) << " ms; " << rejoins_between_polls_
            << " rejoins seen only by the watch\n";
  for (const auto& v : violations_) ADD_FAILURE() << v;
  if (!violations_.empty()) std::cout << clustertest::Ctl(*etcd_, "cluster");
}

// The checker itself: a write into a slice under another host's lease, a
// quarantined slice handed to another host, and a leased slice recorded as
// another host's (forged in etcd, as a host that ignored its fence would)
// are all caught.
TEST_F(ChaosTest, CheckerCatchesStaleWritesAndBrokenQuarantine) {
  ASSERT_GE(Settle(), 0) << violations_.front();
  ASSERT_FALSE(leases_.empty());
  const uint32_t victim = leases_.front().slice;
  {
    int fd = ::open(shared_.c_str(), O_WRONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    const std::string junk = "written by a host that does not own the slice";
    ASSERT_EQ(::pwrite(fd, junk.data(), junk.size(), static_cast<off_t>(kHeader + victim * kSlice)),
              static_cast<ssize_t>(junk.size()));
    ::close(fd);
  }
  Check();
  EXPECT_EQ(stale_writes_, 1u);
  leases_.erase(leases_.begin());  // counted once

  // h0 stopped past its TTL: its slices are quarantined.
  ASSERT_EQ(::kill(hosts_[0]->pid(), SIGSTOP), 0);
  const auto end = steady_clock::now() + std::chrono::seconds(10);
  uint32_t quarantined = kSlices;
  while (quarantined == kSlices && steady_clock::now() < end) {
    Check();
    auto v = registry_->Read();
    if (v.ok())
      for (const auto& s : v->devices.at(kDevice).slices)
        if (s.state == SliceState::kQuarantined &&
            std::none_of(leases_.begin(), leases_.end(),
                         [&](const HeldLease& l) { return l.slice == s.index; }))
          quarantined = s.index;
    std::this_thread::sleep_for(milliseconds(50));
  }
  ASSERT_NE(quarantined, kSlices) << "h0's slices were never quarantined";
  const size_t before = violation_count_;
  auto v = registry_->Read();
  ASSERT_TRUE(v.ok());
  const auto h1 = v->hosts.find("h1");
  ASSERT_NE(h1, v->hosts.end());
  ASSERT_TRUE(client_
                  ->Put(cluster::Keys().Slice(kDevice, quarantined),
                        cluster::ToJson(cluster::SliceRecord{"h1", h1->second.epoch, 0}))
                  .ok());
  Check();
  EXPECT_EQ(violation_count_, before + 1);
  // A lease of h1 whose slice etcd gives to h2.
  auto mine =
      std::find_if(leases_.begin(), leases_.end(), [](const HeldLease& l) { return l.host == 1; });
  ASSERT_NE(mine, leases_.end());
  const auto h2 = v->hosts.find("h2");
  ASSERT_NE(h2, v->hosts.end());
  ASSERT_TRUE(client_
                  ->Put(cluster::Keys().Slice(kDevice, mine->slice),
                        cluster::ToJson(cluster::SliceRecord{"h2", h2->second.epoch, 0}))
                  .ok());
  Check();
  EXPECT_EQ(foreign_leases_, 1u);
  ::kill(hosts_[0]->pid(), SIGCONT);
}

}  // namespace
}  // namespace cxlpool
