// The cluster layer's figures (issue 39), each against a real 3-member etcd
// cluster with TLS on loopback (tests/support/etcd_cluster.h):
//
//   C1: a slice claim's latency (SliceRegistry::Claim, one guarded etcd
//       transaction) at 200 claims/s from 4 hosts, each its own etcd client
//       and session, against a plain transaction (one compare, one put) sent
//       by the same hosts in the same ticks, so both see the same load.
//   C2: P1u's cxlpool_alloc of 2 MiB with the daemon in a cluster (session,
//       watch, a shared device with slices claimed ahead) against the same
//       daemon configuration without [cluster], samples interleaved.
//   C3: a dead host's slices: how long after its SIGKILL the cluster sees
//       them quarantined (against the session TTL + 1 s), and how long
//       until they are free again after it restarts or after an operator's
//       confirmed fence (against 2 s).
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <ctime>
#include <functional>
#include <mutex>
#include <thread>

#include "bench.h"
#include "bench_cluster.h"
#include "cxlpool/cluster/session.h"
#include "cxlpool/cluster/slice_registry.h"
#include "cxlpool/cxlpool.h"
#include "etcd_cluster.h"

namespace cxlpool::bench {

namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;
using testsupport::EtcdCluster;

}  // namespace

// ---------------------------------------------------------------- C1

void RunC1(const Options& o, Report* r) {
  const char* metric = "slice claim p99 at 200 claims/s from 4 hosts";
  constexpr int kHosts = 4;
  constexpr int kSlicesPerHost = 8;
  const milliseconds period(1000 * kHosts / 200);  // each host's tick: 200/s in all
  const int ticks = o.quick ? 50 : 1000;           // per host: 200 or 4000 claims in all
  auto e = EtcdCluster::Start({});
  if (!e.ok()) return r->Skip("C1", metric, "etcd: " + e.status().ToString());
  const cluster::Keys keys("/bench/c1");
  BenchHost hosts[kHosts];
  for (int i = 0; i < kHosts; ++i) {
    if (Status s = JoinBenchHost(**e, keys, i, &hosts[i]); !s.ok())
      return r->Skip("C1", metric, s.ToString());
  }
  const std::string device = "bench-c1";
  auto d = hosts[0].registry->EnsureDevice(
      device, cluster::DeviceRecord{uint64_t{kHosts * kSlicesPerHost} * (2 * kMiB), 2 * kMiB});
  if (!d.ok()) return r->Skip("C1", metric, d.status().ToString());

  std::mutex mu;
  Stats claim_ns, txn_ns;
  std::string error;
  auto run_host = [&](int h) {
    BenchHost& host = hosts[h];
    const std::string scratch = "/bench/c1-plain/" + host.name;
    int64_t scratch_rev = 0;
    auto put = host.etcd->Put(scratch, "0");
    if (put.ok()) scratch_rev = *put;
    Stats mine_claim, mine_txn;
    std::string err;
    // Hosts start a quarter period apart, so the claims arrive evenly.
    auto next = steady_clock::now() + period * h / kHosts;
    for (int t = 0; t < ticks && err.empty(); ++t) {
      std::this_thread::sleep_until(next);
      next += period;
      cluster::SliceView s;
      s.device = device;
      s.index = static_cast<uint32_t>(h + kHosts * (t % kSlicesPerHost));
      uint64_t t0 = NowNs();
      auto rev = host.registry->Claim(s, host.name, host.epoch, 0);
      uint64_t t1 = NowNs();
      if (!rev.ok() || *rev == 0) {
        err = "claim: " + (rev.ok() ? std::string("guard failed") : rev.status().ToString());
        break;
      }
      mine_claim.Add(t1 - t0);
      s.state = cluster::SliceState::kOwned;
      s.record = cluster::SliceRecord{host.name, host.epoch, 0};
      s.mod_revision = *rev;
      auto released = host.registry->Release(s, host.name, host.epoch);
      if (!released.ok() || !*released) {
        err = "release: " +
              (released.ok() ? std::string("guard failed") : released.status().ToString());
        break;
      }
      t0 = NowNs();
      auto txn = host.etcd->Txn({etcd::Compare::ModRevision(scratch, scratch_rev)},
                                {etcd::TxnOp::Put(scratch, std::to_string(t))});
      t1 = NowNs();
      if (!txn.ok() || !txn->succeeded) {
        err = "plain txn: " + (txn.ok() ? std::string("guard failed") : txn.status().ToString());
        break;
      }
      scratch_rev = txn->revision;
      mine_txn.Add(t1 - t0);
    }
    std::lock_guard<std::mutex> l(mu);
    if (!err.empty() && error.empty()) error = host.name + ": " + err;
    claim_ns.Merge(mine_claim);
    txn_ns.Merge(mine_txn);
  };
  std::vector<std::thread> threads;
  for (int h = 0; h < kHosts; ++h) threads.emplace_back(run_host, h);
  for (auto& t : threads) t.join();
  for (auto& h : hosts) h.session->Leave();
  if (!error.empty()) return r->Skip("C1", metric, error);
  const std::string n = "n=" + std::to_string(claim_ns.size()) + " claims, each released after; ";
  r->Add(MeasuredRow("C1", metric, claim_ns.PercentileUs(0.99), txn_ns.PercentileUs(0.99), "us",
                     "le", 1.5,
                     n + "baseline: a plain etcd transaction (1 compare, 1 put) by the same hosts "
                         "in the same ticks; 3-member etcd with TLS on loopback"));
  r->Add(MeasuredRow("C1", "slice claim p50", claim_ns.MedianUs(), txn_ns.MedianUs(), "us"));
}

// ---------------------------------------------------------------- C2

namespace {

// A shared device for C2's daemon: a file of `bytes`.
Result<std::string> SharedFile(const std::string& dir, uint64_t bytes) {
  std::string path = dir + "/shared.img";
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Status(Code::kIo, "cannot create " + path);
  int rc = ::ftruncate(fd, static_cast<off_t>(bytes));
  ::close(fd);
  if (rc != 0) return Status(Code::kIo, "cannot size " + path);
  return path;
}

constexpr int kSessionTtlS = 2;

std::string ClusterToml(const EtcdCluster& e, const std::string& shared,
                        const std::string& host = "bench-c2") {
  std::string eps;
  for (const auto& ep : e.endpoints()) eps.append(eps.empty() ? "\"" : ", \"").append(ep) += "\"";
  std::string t = "[cluster]\nendpoints = [";
  t.append(eps).append("]\nhost = \"").append(host).append("\"\nsession_ttl = \"");
  t.append(std::to_string(kSessionTtlS)).append("s\"\n");
  t.append("publish_interval = \"200ms\"\nca = \"").append(e.ca_file());
  t.append("\"\ncert = \"").append(e.client_cert_file());
  t.append("\"\nkey = \"").append(e.client_key_file());
  t.append("\"\n[[cluster.shared]]\npath = \"").append(shared);
  t.append("\"\nid = \"bench-c2\"\nslice_size = \"4M\"\nclaim_ahead = 2\n");
  return t;
}

// Polls `ctl`'s STATS until the daemon is in the cluster and owns its slices.
Status WaitJoined(WireClient& ctl) {
  for (int i = 0; i < 300; ++i) {
    auto st = ctl.GetStats();
    if (!st.ok()) return st.status();
    auto live = st->gauges().find("cluster_session_live");
    auto owned = st->gauges().find("cluster_slices_owned");
    if (live != st->gauges().end() && live->second == 1 && owned != st->gauges().end() &&
        owned->second >= 2)
      return Status::Ok();
    std::this_thread::sleep_for(milliseconds(50));
  }
  return Status(Code::kUnavailable, "the clustered daemon did not join within 15 s");
}

}  // namespace

void RunC2(const Options& o, Report* r) {
  const char* metric = "cxlpool_alloc 2 MiB with the cluster on, p50";
  if (!o.spawn()) return r->Skip("C2", metric, "needs spawned daemons (not --socket)");
  constexpr uint64_t kSize = 2 * kMiB;
  const int n = o.quick ? 200 : 2000;
  auto e = EtcdCluster::Start({});
  if (!e.ok()) return r->Skip("C2", metric, "etcd: " + e.status().ToString());
  auto shared = SharedFile((*e)->dir(), 64 * kMiB);
  if (!shared.ok()) return r->Skip("C2", metric, shared.status().ToString());
  DaemonConfig off_cfg;
  off_cfg.reserve_bytes = 64 * kMiB;
  DaemonConfig on_cfg = off_cfg;
  on_cfg.extra_toml = ClusterToml(**e, *shared);
  DaemonProc off, on;
  if (Status s = off.Start(o.daemon_path, off_cfg); !s.ok())
    return r->Skip("C2", metric, s.ToString());
  if (Status s = on.Start(o.daemon_path, on_cfg); !s.ok())
    return r->Skip("C2", metric, s.ToString());
  auto off_ctl = WireClient::Connect(off.socket());
  auto on_ctl = WireClient::Connect(on.socket());
  if (!off_ctl.ok() || !on_ctl.ok())
    return r->Skip("C2", metric, "cannot connect a control client");
  if (Status s = WaitJoined(*on_ctl); !s.ok()) return r->Skip("C2", metric, s.ToString());
  cxlpool_client* c_off = nullptr;
  cxlpool_client* c_on = nullptr;
  if (cxlpool_connect(off.socket().c_str(), &c_off) != 0 ||
      cxlpool_connect(on.socket().c_str(), &c_on) != 0) {
    if (c_off) cxlpool_disconnect(c_off);
    return r->Skip("C2", metric, "cxlpool_connect failed");
  }
  cxlpool_alloc_opts opts;
  cxlpool_alloc_opts_init(&opts);
  opts.size_bytes = kSize;
  opts.numa_node = o.node;
  opts.flags = CXLPOOL_ALLOC_STRICT;
  opts.label = "cxlpool-bench C2";
  Stats on_ns, off_ns;
  std::string error;
  auto sample = [&](cxlpool_client* c, WireClient& ctl, Stats* st) {
    if (Status s = ctl.WaitIdle(); !s.ok()) {
      error = s.ToString();
      return;
    }
    cxlpool_lease* l = nullptr;
    uint64_t t0 = NowNs();
    int rc = cxlpool_alloc(c, &opts, &l);
    uint64_t t1 = NowNs();
    if (rc != 0) {
      error = std::string("cxlpool_alloc: ") + cxlpool_strerror(rc);
      return;
    }
    static_cast<volatile char*>(cxlpool_lease_ptr(l))[0] = 1;
    st->Add(t1 - t0);
    (void)cxlpool_release(l);
  };
  for (int i = 0; i < n && error.empty(); ++i) {
    // Alternate which goes first, so neither always follows the other's release.
    if (i % 2 == 0) {
      sample(c_on, *on_ctl, &on_ns);
      if (error.empty()) sample(c_off, *off_ctl, &off_ns);
    } else {
      sample(c_off, *off_ctl, &off_ns);
      if (error.empty()) sample(c_on, *on_ctl, &on_ns);
    }
  }
  cxlpool_disconnect(c_on);
  cxlpool_disconnect(c_off);
  if (!error.empty()) return r->Skip("C2", metric, error);
  r->Add(MeasuredRow("C2", metric, on_ns.MedianUs(), off_ns.MedianUs(), "us", "le", 1.05,
                     "n=" + std::to_string(on_ns.size()) +
                         " interleaved; on: a session on a 3-member etcd with TLS, a watch and a "
                         "shared device with 2 slices claimed ahead; off: the same daemon "
                         "configuration without [cluster]"));
  r->Add(MeasuredRow("C2", "cxlpool_alloc 2 MiB with the cluster on, p99", on_ns.PercentileUs(0.99),
                     off_ns.PercentileUs(0.99), "us"));
}

// ---------------------------------------------------------------- C3

namespace {

// The slices of `device` that `host` holds in `v`, by state.
size_t SlicesOf(const cluster::ClusterView& v, const std::string& device, const std::string& host,
                cluster::SliceState state) {
  auto d = v.devices.find(device);
  if (d == v.devices.end()) return 0;
  size_t n = 0;
  for (const auto& s : d->second.slices) n += s.state == state && s.record.owner == host;
  return n;
}

// Polls etcd (every 10 ms, 20 s at most) until `done(view)`; the time it
// took from `since`, or an error naming `what`.
Result<milliseconds> TimeUntil(cluster::SliceRegistry& reg, steady_clock::time_point since,
                               const std::function<bool(const cluster::ClusterView&)>& done,
                               const std::string& what) {
  const auto until = steady_clock::now() + std::chrono::seconds(20);
  std::string last;
  while (steady_clock::now() < until) {
    auto v = reg.Read();
    if (v.ok() && done(*v)) {
      return std::chrono::duration_cast<milliseconds>(steady_clock::now() - since);
    }
    if (!v.ok()) last = ": " + v.status().ToString();
    std::this_thread::sleep_for(milliseconds(10));
  }
  return Status(Code::kUnavailable, what + " not seen within 20 s" + last);
}

}  // namespace

void RunC3(const Options& o, Report* r) {
  const char* metric = "quarantine seen after SIGKILL, worst";
  if (!o.spawn()) return r->Skip("C3", metric, "needs spawned daemons (not --socket)");
  const int rounds = o.quick ? 1 : 5;
  const std::string device = "bench-c2";  // ClusterToml's shared device id
  const std::string victim_name = "bench-c3-victim", other_name = "bench-c3-other";
  auto e = EtcdCluster::Start({});
  if (!e.ok()) return r->Skip("C3", metric, "etcd: " + e.status().ToString());
  auto shared = SharedFile((*e)->dir(), 64 * kMiB);
  if (!shared.ok()) return r->Skip("C3", metric, shared.status().ToString());
  DaemonConfig victim_cfg, other_cfg;
  victim_cfg.extra_toml = ClusterToml(**e, *shared, victim_name);
  other_cfg.extra_toml = ClusterToml(**e, *shared, other_name);
  DaemonProc victim, other;
  if (Status s = other.Start(o.daemon_path, other_cfg); !s.ok())
    return r->Skip("C3", metric, s.ToString());
  if (Status s = victim.Start(o.daemon_path, victim_cfg); !s.ok())
    return r->Skip("C3", metric, s.ToString());
  auto client = etcd::Client::Connect(EtcdOptions(**e));
  if (!client.ok()) return r->Skip("C3", metric, client.status().ToString());
  cluster::SliceRegistry reg(client->get(), cluster::Keys());
  using cluster::SliceState;
  auto joined = [&](const cluster::ClusterView& v) {
    return v.LiveEpoch(victim_name) != 0 &&
           SlicesOf(v, device, victim_name, SliceState::kOwned) >= 2 &&
           SlicesOf(v, device, other_name, SliceState::kOwned) >= 2;
  };
  auto quarantined = [&](const cluster::ClusterView& v) {
    return SlicesOf(v, device, victim_name, SliceState::kQuarantined) >= 2;
  };
  Stats seen_ns, restart_ns, fence_ns;
  std::string error;
  auto fail = [&](const Status& s) {
    error = s.ToString();
    return false;
  };
  // One round: SIGKILL, quarantine; restart, free again; SIGKILL, fence,
  // free again; restart for the next round.
  auto round = [&]() -> bool {
    auto up = TimeUntil(reg, steady_clock::now(), joined, "both hosts joined with 2 slices each");
    if (!up.ok()) return fail(up.status());
    auto kill = steady_clock::now();
    victim.Kill();
    auto seen = TimeUntil(reg, kill, quarantined, "the victim's slices quarantined");
    if (!seen.ok()) return fail(seen.status());
    seen_ns.Add(static_cast<uint64_t>(std::chrono::nanoseconds(*seen).count()));
    auto restart = steady_clock::now();
    if (Status s = victim.Restart(o.daemon_path, victim_cfg); !s.ok()) return fail(s);
    auto back = TimeUntil(
        reg, restart,
        [&](const cluster::ClusterView& v) { return v.CountSlices(SliceState::kQuarantined) == 0; },
        "the quarantine's end after the restart");
    if (!back.ok()) return fail(back.status());
    restart_ns.Add(static_cast<uint64_t>(std::chrono::nanoseconds(*back).count()));

    up = TimeUntil(reg, steady_clock::now(), joined, "the restarted host with 2 slices");
    if (!up.ok()) return fail(up.status());
    victim.Kill();
    int64_t dead_epoch = 0;
    auto gone = TimeUntil(
        reg, steady_clock::now(),
        [&](const cluster::ClusterView& v) {
          if (!quarantined(v)) return false;
          for (const auto& s : v.devices.at(device).slices)
            if (s.record.owner == victim_name && s.state == SliceState::kQuarantined)
              dead_epoch = s.record.epoch;
          return true;
        },
        "the victim's slices quarantined again");
    if (!gone.ok()) return fail(gone.status());
    auto fence = steady_clock::now();
    auto f = reg.Fence(cluster::FenceRecord{victim_name, dead_epoch, "cxlpool-bench@localhost",
                                            static_cast<int64_t>(::time(nullptr)), "C3"});
    if (!f.ok()) return fail(f.status());
    if (!*f) return fail(Status(Code::kInternal, "etcd refused the fence of a dead epoch"));
    auto freed = TimeUntil(
        reg, fence,
        [&](const cluster::ClusterView& v) {
          return SlicesOf(v, device, victim_name, SliceState::kQuarantined) == 0;
        },
        "the fenced slices claimable");
    if (!freed.ok()) return fail(freed.status());
    fence_ns.Add(static_cast<uint64_t>(std::chrono::nanoseconds(*freed).count()));
    if (Status s = victim.Restart(o.daemon_path, victim_cfg); !s.ok()) return fail(s);
    return true;
  };
  for (int i = 0; i < rounds && error.empty(); ++i) round();
  if (!error.empty()) return r->Skip("C3", metric, error);
  const std::string n = "n=" + std::to_string(seen_ns.size()) + " rounds; ";
  constexpr double kMs = 1000.0;
  r->Add(MeasuredRow("C3", metric, seen_ns.PercentileUs(1.0) / kMs, (kSessionTtlS + 1) * kMs, "ms",
                     "le", 1.0,
                     n + "SIGKILL to etcd showing every slice of the host quarantined; "
                         "baseline: the session TTL (2 s) + 1 s, the issue's bound"));
  r->Add(MeasuredRow("C3", "slices free again after a restart, worst",
                     restart_ns.PercentileUs(1.0) / kMs, 2 * kMs, "ms", "le", 1.0,
                     n + "exec of the restarted daemon to no slice quarantined (it revokes its "
                         "old session and re-adopts or frees); baseline: 2 s, the issue's bound"));
  r->Add(
      MeasuredRow("C3", "slices free again after a confirmed fence, worst",
                  fence_ns.PercentileUs(1.0) / kMs, 2 * kMs, "ms", "le", 1.0,
                  n + "the operator's fence transaction to the slices claimable; baseline: 2 s"));
}

}  // namespace cxlpool::bench
