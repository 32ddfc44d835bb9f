// P5: committed host memory per leased byte for a mix of odd sizes (node
// meminfo Shmem / MemUsed deltas), next to what a power-of-two rounding
// allocator (PyTorch's pinned CachingHostAllocator) would commit.
// P6: grant p99 and daemon RSS with 100 .. 100k live leases.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <vector>

#include "bench.h"
#include "cxlpool/proto/socket.h"

namespace cxlpool::bench {

namespace {

uint64_t Pow2Ceil(uint64_t v) {
  uint64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

// Deterministic odd sizes between 4 KiB and 64 MiB (log-uniform), none a
// multiple of the page size, adding up to at least `target`.
std::vector<uint64_t> OddSizes(uint64_t target) {
  std::vector<uint64_t> out = {1, 4097, kMiB + 1, 3 * kMiB + 12345, 10000000};
  uint64_t total = 0;
  for (uint64_t s : out) total += s;
  uint64_t x = 0x9e3779b97f4a7c15ull;
  while (total < target) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    double u = static_cast<double>(x % 1000000) / 1e6;
    auto s = static_cast<uint64_t>(std::exp(std::log(4096.0) + u * std::log(16384.0)));
    s = s - s % 4096 + 1 + (x >> 40) % 4095;
    out.push_back(s);
    total += s;
  }
  return out;
}

uint64_t PoolLeased(const proto::PoolsReply& p, int node) {
  uint64_t v = 0;
  for (const auto& pool : p.pools()) {
    if (pool.numa_node() == node && pool.backing() == "memfd") v += pool.leased_bytes();
  }
  return v;
}

double MiB(int64_t b) { return static_cast<double>(b) / static_cast<double>(kMiB); }

}  // namespace

void RunP5(const Options& o, Report* r) {
  uint64_t target = o.quick ? 64 * kMiB : kGiB;
  std::vector<uint64_t> sizes = OddSizes(target);
  DaemonConfig cfg;
  // The daemon keeps a warm reserve, as in production: its pages are
  // committed too, and counted in the "incl. reserve" row.
  cfg.reserve_bytes = o.quick ? 64 * kMiB : 256 * kMiB;
  // Node memory before the daemon exists (spawned daemons only): what the
  // daemon commits in all, its reserve included, is measured from here.
  SettleVmstat();
  auto m_pre = NodeMeminfo(o.node);
  DaemonProc daemon;
  auto sock = PhaseSocket(o, cfg, &daemon);
  if (!sock.ok()) return r->Skip("P5", "committed per leased byte", sock.status().ToString());
  auto w = WireClient::Connect(*sock);
  if (!w.ok()) return r->Skip("P5", "committed per leased byte", w.status().ToString());
  if (Status s = w->WaitIdle(); !s.ok()) return r->Skip("P5", "committed", s.ToString());
  auto cred = wire::GetPeerCred(w->fd());
  SettleVmstat();
  auto p0 = w->GetPools();
  auto m0 = NodeMeminfo(o.node);
  if (!p0.ok() || !m0.ok() || !m_pre.ok()) {
    return r->Skip("P5", "committed", !p0.ok() ? p0.status().ToString() : "node meminfo");
  }
  uint64_t reserve = 0;
  for (const auto& pool : p0->pools()) {
    if (pool.numa_node() != o.node) continue;
    const proto::PoolReserve& pr = pool.reserve();
    reserve += pr.ready_bytes() + pr.building_bytes() + pr.retiring_bytes();
  }
  std::optional<std::map<std::string, uint64_t>> d0;
  if (cred.ok()) {
    if (auto st = ProcStatus(cred->pid); st.ok()) d0 = *st;
  }
  uint64_t requested = 0, pow2 = 0;
  std::vector<uint64_t> ids;
  for (uint64_t s : sizes) {
    auto l = w->Alloc(s, o.node);
    if (!l.ok())
      return r->Skip("P5", "committed",
                     "alloc " + std::to_string(s) + ": " + l.status().ToString());
    ids.push_back(l->id());
    requested += s;
    pow2 += Pow2Ceil(s);
  }
  // Refills of whatever the grants took from the reserve are done.
  if (Status s = w->WaitIdle(); !s.ok()) return r->Skip("P5", "committed", s.ToString());
  SettleVmstat();
  auto p1 = w->GetPools();
  auto m1 = NodeMeminfo(o.node);
  if (!p1.ok() || !m1.ok()) return r->Skip("P5", "committed", "meminfo/pools after");
  std::optional<std::map<std::string, uint64_t>> d1;
  if (cred.ok()) {
    if (auto st = ProcStatus(cred->pid); st.ok()) d1 = *st;
  }
  for (uint64_t id : ids) (void)w->Release(id);
  if (Status s = w->WaitIdle(); !s.ok()) return r->Skip("P5", "committed", s.ToString());
  SettleVmstat();
  auto m2 = NodeMeminfo(o.node);

  auto delta = [](const std::map<std::string, uint64_t>& a,
                  const std::map<std::string, uint64_t>& b, const char* k) -> int64_t {
    auto ia = a.find(k), ib = b.find(k);
    if (ia == a.end() || ib == b.end()) return 0;
    return static_cast<int64_t>(ib->second) - static_cast<int64_t>(ia->second);
  };
  int64_t shmem = delta(*m0, *m1, "Shmem");
  int64_t shmem_all = delta(*m_pre, *m1, "Shmem");
  // MemUsed without the page cache (FilePages counts Shmem too): the kernel
  // reclaims cache to make room, which would hide what the pool took.
  auto used_no_cache = [](const std::map<std::string, uint64_t>& m) -> int64_t {
    auto get = [&](const char* k) {
      auto it = m.find(k);
      return it == m.end() ? int64_t{0} : static_cast<int64_t>(it->second);
    };
    return get("MemUsed") - (get("FilePages") - get("Shmem"));
  };
  int64_t used = used_no_cache(*m1) - used_no_cache(*m0);
  int64_t leased =
      static_cast<int64_t>(PoolLeased(*p1, o.node)) - static_cast<int64_t>(PoolLeased(*p0, o.node));
  std::string mix =
      std::to_string(sizes.size()) + " odd sizes, " + HumanSize(requested) + " requested in all";
  auto row = [&](const std::string& metric, int64_t v, const std::string& op,
                 const std::string& note) {
    Row x;
    x.figure = "P5";
    x.metric = metric;
    x.value = MiB(v);
    x.baseline = MiB(static_cast<int64_t>(requested));
    x.unit = "MiB";
    x.goal_op = op;
    x.goal = 1.01;
    x.note = note;
    r->Add(std::move(x));
  };
  row("node Shmem delta / requested", shmem, "le",
      mix +
          "; from the idle daemon with its reserve built to the leases held, the reserve's "
          "refills done (what each lease costs beyond the reserve)");
  row("node Shmem incl. reserve / requested", shmem_all, o.spawn() ? "le" : "",
      o.spawn() ? "from before the daemon started: leases, waste and the warm reserve (" +
                      HumanSize(reserve / kKiB * kKiB) + " warm as the daemon reports it, " +
                      HumanSize(cfg.reserve_bytes) + " configured)"
                : "a running daemon (--socket): no reading from before it started, so this is "
                  "the same as the row above");
  if (d0 && d1) {
    auto get = [](const std::map<std::string, uint64_t>& m, const char* k) {
      auto it = m.find(k);
      return it == m.end() ? int64_t{0} : static_cast<int64_t>(it->second);
    };
    Row d;
    d.figure = "P5";
    d.metric = "daemon private memory (RssAnon + page tables) / requested";
    d.value = MiB(get(*d1, "RssAnon") + get(*d1, "VmPTE"));
    d.baseline = MiB(static_cast<int64_t>(requested));
    d.unit = "MiB";
    d.note =
        "the daemon's own heap and page tables with the leases held (its RssShmem, the "
        "leased and reserve pages it maps, is in the Shmem rows); growth over the idle "
        "daemon " +
        std::to_string((get(*d1, "RssAnon") - get(*d0, "RssAnon")) / 1024) + " KiB";
    r->Add(std::move(d));
  }
  row("node MemUsed-minus-cache delta / requested", used, used > 0 ? "le" : "",
      used > 0 ? "MemUsed moves with every process on the node (page cache, compilers): noisy "
                 "on a shared machine"
               : "MemUsed fell while the leases were made: other processes freed more than "
                 "the pool took, so this reading says nothing");
  row("pool leased_bytes / requested", leased, "", "daemon accounting (4 KiB rounding)");
  row("pow2 allocator (PyTorch pinned) / requested", static_cast<int64_t>(pow2), "",
      "what rounding each size up to a power of two would commit for the same mix");
  if (m2.ok()) {
    Row back;
    back.figure = "P5";
    back.metric = "Shmem still held after releasing all, over the idle daemon";
    back.value = MiB(delta(*m0, *m2, "Shmem"));
    back.unit = "MiB";
    back.note =
        "should be ~0: released memory returns to the kernel or refills the reserve "
        "up to where it was";
    r->Add(std::move(back));
  }
}

void RunP6(const Options& o, Report* r) {
  std::vector<uint64_t> levels =
      o.quick ? std::vector<uint64_t>{100, 1000} : std::vector<uint64_t>{100, 10000, 100000};
  int cycles = o.quick ? 300 : 2000;
  constexpr uint64_t kLease = 4 * kKiB;
  // The daemon holds one fd and one mapping per lease.
  rlimit rl{};
  ::getrlimit(RLIMIT_NOFILE, &rl);
  rlim_t want = levels.back() + 4096;
  if (rl.rlim_cur < want) {
    rlimit nr{want, std::max(want, rl.rlim_max)};
    if (::setrlimit(RLIMIT_NOFILE, &nr) != 0) {
      int err = errno;
      nr.rlim_cur = rl.rlim_max;
      nr.rlim_max = rl.rlim_max;
      (void)::setrlimit(RLIMIT_NOFILE, &nr);
      r->notes.push_back("P6: RLIMIT_NOFILE could not be raised to " + std::to_string(want) + " (" +
                         std::strerror(err) +
                         "; no CAP_SYS_RESOURCE here), so the "
                         "spawned daemon runs with " +
                         std::to_string(rl.rlim_max) + " fds");
    }
  }
  ::getrlimit(RLIMIT_NOFILE, &rl);
  std::string max_map = ReadFirstLine("/proc/sys/vm/max_map_count");
  DaemonConfig cfg;
  DaemonProc daemon;
  auto sock = PhaseSocket(o, cfg, &daemon);
  if (!sock.ok()) return r->Skip("P6", "scale", sock.status().ToString());
  auto fill = WireClient::Connect(*sock);
  auto meas = WireClient::Connect(*sock);
  if (!fill.ok() || !meas.ok()) return r->Skip("P6", "scale", "connect failed");
  auto cred = wire::GetPeerCred(meas->fd());
  if (!cred.ok()) return r->Skip("P6", "scale", cred.status().ToString());
  pid_t dpid = cred->pid;

  auto measure = [&](Stats* g) -> Status {
    for (int i = 0; i < cycles; ++i) {
      uint64_t t0 = NowNs();
      auto l = meas->Alloc(kLease, o.node);
      uint64_t t1 = NowNs();
      if (!l.ok()) return l.status();
      CXLPOOL_RETURN_IF_ERROR(meas->Release(l->id()));
      g->Add(t1 - t0);
    }
    return Status();
  };
  auto rss_extra = [](const std::map<std::string, uint64_t>& s) -> int64_t {
    // Resident bytes that are not the leased pages themselves.
    auto get = [&](const char* k) {
      auto it = s.find(k);
      return it == s.end() ? int64_t{0} : static_cast<int64_t>(it->second);
    };
    return get("VmRSS") - get("RssShmem");
  };
  Stats warmup;
  if (Status s = measure(&warmup); !s.ok()) return r->Skip("P6", "scale", s.ToString());
  auto s0 = ProcStatus(dpid);
  if (!s0.ok()) return r->Skip("P6", "scale", s0.status().ToString());

  std::vector<uint64_t> ids;
  double p99_first = 0;
  std::string stop_reason;
  for (size_t li = 0; li < levels.size() && stop_reason.empty(); ++li) {
    uint64_t n = levels[li];
    while (ids.size() < n) {
      auto l = fill->Alloc(kLease, o.node);
      if (!l.ok()) {
        stop_reason = "lease " + std::to_string(ids.size() + 1) +
                      " refused: " + l.status().ToString() + " (daemon RLIMIT_NOFILE " +
                      std::to_string(rl.rlim_cur) + ", vm.max_map_count " + max_map +
                      "; the daemon holds one fd and one mapping per lease)";
        break;
      }
      ids.push_back(l->id());
    }
    if (!stop_reason.empty()) {
      // Make room for the measuring leases, then measure where we got to.
      for (int k = 0; k < 64 && !ids.empty(); ++k) {
        (void)fill->Release(ids.back());
        ids.pop_back();
      }
    }
    uint64_t held = ids.size();
    Stats g;
    if (Status s = measure(&g); !s.ok()) {
      r->Skip("P6", "at " + std::to_string(held) + " leases", s.ToString());
      break;
    }
    auto st = ProcStatus(dpid);
    if (!st.ok()) return r->Skip("P6", "scale", st.status().ToString());
    double p99 = g.PercentileUs(0.99);
    if (li == 0) p99_first = p99;
    std::string at = std::to_string(held) + " live leases";
    Row x;
    x.figure = "P6";
    x.metric = "grant p99 at " + at;
    x.value = p99;
    x.baseline = p99_first;
    x.unit = "us";
    if (li + 1 == levels.size() || !stop_reason.empty()) {
      x.goal_op = "le";
      x.goal = 2;
    }
    x.note = "baseline = p99 at " + std::to_string(levels[0]) + " leases; p50 " +
             std::to_string(static_cast<int>(g.MedianUs())) + " us; n=" + std::to_string(cycles) +
             " " + HumanSize(kLease) + " alloc+release";
    if (!stop_reason.empty())
      x.note += "; STOPPED SHORT of " + std::to_string(n) + ": " + stop_reason;
    r->Add(std::move(x));
    if (held > 0) {
      double per = static_cast<double>(rss_extra(*st) - rss_extra(*s0)) / static_cast<double>(held);
      auto vm = [&](const std::map<std::string, uint64_t>& m) {
        auto it = m.find("VmRSS");
        return it == m.end() ? 0.0 : static_cast<double>(it->second);
      };
      Row m;
      m.figure = "P6";
      m.metric = "daemon RSS per lease at " + at;
      m.value = per;
      m.baseline = 2048;
      m.unit = "B";
      m.goal_op = "le";
      m.goal = 1;
      m.note =
          "baseline column = the 2 KiB budget; VmRSS - RssShmem growth over the idle daemon; "
          "VmRSS incl. the leased pages: " +
          std::to_string(static_cast<int>((vm(*st) - vm(*s0)) / static_cast<double>(held))) +
          " B/lease; kernel VMAs and page tables are not in RSS";
      r->Add(std::move(m));
    }
  }
}

}  // namespace cxlpool::bench
