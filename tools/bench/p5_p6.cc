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

using Meminfo = std::map<std::string, uint64_t>;

// MemUsed without the page cache (FilePages counts Shmem too): the kernel
// reclaims cache to make room, which would hide what the pool took.
int64_t UsedNoCache(const Meminfo& m) {
  return Field(m, "MemUsed") - (Field(m, "FilePages") - Field(m, "Shmem"));
}

// b[k] - a[k]; 0 unless both readings have `k`.
int64_t Delta(const Meminfo& a, const Meminfo& b, const char* k) {
  return a.count(k) && b.count(k) ? Field(b, k) - Field(a, k) : 0;
}

// One reading of the daemon and the node: the pools, the node's meminfo and
// (when its pid is known) the daemon's /proc status.
struct P5Reading {
  proto::PoolsReply pools;
  Meminfo node;
  std::optional<Meminfo> daemon;
};

// Once the node counters have caught up with an idle daemon: reads. "", the
// POOLS error, or "node meminfo".
std::string ReadP5(const Options& o, WireClient& w, const Result<wire::PeerCred>& cred,
                   P5Reading* out) {
  SettleVmstat();
  auto p = w.GetPools();
  auto m = NodeMeminfo(o.node);
  if (!p.ok()) return p.status().ToString();
  if (!m.ok()) return "node meminfo";
  out->pools = std::move(*p);
  out->node = std::move(*m);
  if (cred.ok()) {
    if (auto st = ProcStatus(cred->pid); st.ok()) out->daemon = *st;
  }
  return "";
}

// The reserve as the daemon reports it on `node`: ready, building, retiring.
uint64_t ReserveOf(const proto::PoolsReply& p, int node) {
  uint64_t reserve = 0;
  for (const auto& pool : p.pools()) {
    if (pool.numa_node() != node) continue;
    const proto::PoolReserve& pr = pool.reserve();
    reserve += pr.ready_bytes() + pr.building_bytes() + pr.retiring_bytes();
  }
  return reserve;
}

// What the mix asked for, and what a power-of-two rounding allocator would
// have committed for it.
struct P5Mix {
  std::vector<uint64_t> sizes;
  uint64_t requested = 0, pow2 = 0;
  std::string Text() const {
    return std::to_string(sizes.size()) + " odd sizes, " + HumanSize(requested) +
           " requested in all";
  }
};

void AddP5Rows(const Options& o, const DaemonConfig& cfg, const P5Mix& mix, const Meminfo& pre,
               const P5Reading& idle, const P5Reading& held, Report* r) {
  auto row = [&](const std::string& metric, int64_t v, const std::string& op,
                 const std::string& note) {
    r->Add(MeasuredRow("P5", metric, MiB(v), MiB(static_cast<int64_t>(mix.requested)), "MiB", op,
                       1.01, note));
  };
  row("node Shmem delta / requested", Delta(idle.node, held.node, "Shmem"), "le",
      mix.Text() +
          "; from the idle daemon with its reserve built to the leases held, the reserve's "
          "refills done (what each lease costs beyond the reserve)");
  const uint64_t reserve = ReserveOf(idle.pools, o.node);
  row("node Shmem incl. reserve / requested", Delta(pre, held.node, "Shmem"), o.spawn() ? "le" : "",
      o.spawn() ? "from before the daemon started: leases, waste and the warm reserve (" +
                      HumanSize(reserve / kKiB * kKiB) + " warm as the daemon reports it, " +
                      HumanSize(cfg.reserve_bytes) + " configured)"
                : "a running daemon (--socket): no reading from before it started, so this is "
                  "the same as the row above");
  if (idle.daemon && held.daemon) {
    const Meminfo& d0 = *idle.daemon;
    const Meminfo& d1 = *held.daemon;
    r->Add(MeasuredRow(
        "P5", "daemon private memory (RssAnon + page tables) / requested",
        MiB(Field(d1, "RssAnon") + Field(d1, "VmPTE")), MiB(static_cast<int64_t>(mix.requested)),
        "MiB", "", 0,
        "the daemon's own heap and page tables with the leases held (its RssShmem, the "
        "leased and reserve pages it maps, is in the Shmem rows); growth over the idle "
        "daemon " +
            std::to_string((Field(d1, "RssAnon") - Field(d0, "RssAnon")) / 1024) + " KiB"));
  }
  int64_t used = UsedNoCache(held.node) - UsedNoCache(idle.node);
  row("node MemUsed-minus-cache delta / requested", used, used > 0 ? "le" : "",
      used > 0 ? "MemUsed moves with every process on the node (page cache, compilers): noisy "
                 "on a shared machine"
               : "MemUsed fell while the leases were made: other processes freed more than "
                 "the pool took, so this reading says nothing");
  int64_t leased = static_cast<int64_t>(PoolLeased(held.pools, o.node)) -
                   static_cast<int64_t>(PoolLeased(idle.pools, o.node));
  row("pool leased_bytes / requested", leased, "", "daemon accounting (4 KiB rounding)");
  row("pow2 allocator (PyTorch pinned) / requested", static_cast<int64_t>(mix.pow2), "",
      "what rounding each size up to a power of two would commit for the same mix");
}

}  // namespace

void RunP5(const Options& o, Report* r) {
  P5Mix mix;
  mix.sizes = OddSizes(o.quick ? 64 * kMiB : kGiB);
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
  P5Reading idle, held;
  std::string e = ReadP5(o, *w, cred, &idle);
  if (e.empty() && !m_pre.ok()) e = "node meminfo";
  if (!e.empty()) return r->Skip("P5", "committed", e);
  std::vector<uint64_t> ids;
  for (uint64_t s : mix.sizes) {
    auto l = w->Alloc(s, o.node);
    if (!l.ok())
      return r->Skip("P5", "committed",
                     "alloc " + std::to_string(s) + ": " + l.status().ToString());
    ids.push_back(l->id());
    mix.requested += s;
    mix.pow2 += Pow2Ceil(s);
  }
  // Refills of whatever the grants took from the reserve are done.
  if (Status s = w->WaitIdle(); !s.ok()) return r->Skip("P5", "committed", s.ToString());
  if (!ReadP5(o, *w, cred, &held).empty()) return r->Skip("P5", "committed", "meminfo/pools after");
  for (uint64_t id : ids) (void)w->Release(id);
  if (Status s = w->WaitIdle(); !s.ok()) return r->Skip("P5", "committed", s.ToString());
  SettleVmstat();
  auto m2 = NodeMeminfo(o.node);
  AddP5Rows(o, cfg, mix, *m_pre, idle, held, r);
  if (m2.ok()) {
    r->Add(MeasuredRow("P5", "Shmem still held after releasing all, over the idle daemon",
                       MiB(Delta(idle.node, *m2, "Shmem")), 0, "MiB", "", 0,
                       "should be ~0: released memory returns to the kernel or refills the "
                       "reserve up to where it was"));
  }
}

namespace {

constexpr uint64_t kP6Lease = 4 * kKiB;

// The daemon holds one fd and one mapping per lease: raises this process's
// RLIMIT_NOFILE (which the spawned daemon inherits) to `want`, or as far as
// the hard limit allows, with a note. Returns the limit in force.
rlimit RaiseFdLimit(rlim_t want, Report* r) {
  rlimit rl{};
  ::getrlimit(RLIMIT_NOFILE, &rl);
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
  return rl;
}

// `cycles` timed 4 KiB grants, each released at once.
Status MeasureCycles(WireClient& meas, int node, int cycles, Stats* g) {
  for (int i = 0; i < cycles; ++i) {
    uint64_t t0 = NowNs();
    auto l = meas.Alloc(kP6Lease, node);
    uint64_t t1 = NowNs();
    if (!l.ok()) return l.status();
    CXLPOOL_RETURN_IF_ERROR(meas.Release(l->id()));
    g->Add(t1 - t0);
  }
  return Status();
}

// Resident bytes that are not the leased pages themselves.
int64_t RssExtra(const Meminfo& s) { return Field(s, "VmRSS") - Field(s, "RssShmem"); }

// Grows `ids` to `n` live leases. "" or why the daemon refused one; then
// 64 leases are released again to make room for the measuring ones.
std::string FillTo(WireClient& fill, int node, uint64_t n, const std::string& limits,
                   std::vector<uint64_t>* ids) {
  std::string stop_reason;
  while (ids->size() < n) {
    auto l = fill.Alloc(kP6Lease, node);
    if (!l.ok()) {
      stop_reason = "lease " + std::to_string(ids->size() + 1) +
                    " refused: " + l.status().ToString() + limits;
      break;
    }
    ids->push_back(l->id());
  }
  if (!stop_reason.empty()) {
    for (int k = 0; k < 64 && !ids->empty(); ++k) {
      (void)fill.Release(ids->back());
      ids->pop_back();
    }
  }
  return stop_reason;
}

// One level's rows: grant p99 against the first level's (the goal at the
// last level, or where the fill stopped short), and RSS per lease.
struct P6Level {
  uint64_t target = 0, held = 0;
  bool last = false;
  std::string stop_reason;
};

void AddP6Rows(const P6Level& lv, uint64_t first_level, double p99_first, const Stats& g,
               int cycles, const Meminfo& idle, const Meminfo& now, Report* r) {
  std::string at = std::to_string(lv.held) + " live leases";
  const bool goal = lv.last || !lv.stop_reason.empty();
  std::string note = "baseline = p99 at " + std::to_string(first_level) + " leases; p50 " +
                     std::to_string(static_cast<int>(g.MedianUs())) +
                     " us; n=" + std::to_string(cycles) + " " + HumanSize(kP6Lease) +
                     " alloc+release";
  if (!lv.stop_reason.empty()) {
    note += "; STOPPED SHORT of " + std::to_string(lv.target) + ": " + lv.stop_reason;
  }
  r->Add(MeasuredRow("P6", "grant p99 at " + at, g.PercentileUs(0.99), p99_first, "us",
                     goal ? "le" : "", goal ? 2 : 0, note));
  if (lv.held == 0) return;
  const double held = static_cast<double>(lv.held);
  double per = static_cast<double>(RssExtra(now) - RssExtra(idle)) / held;
  double vm = static_cast<double>(Field(now, "VmRSS")) - static_cast<double>(Field(idle, "VmRSS"));
  r->Add(MeasuredRow(
      "P6", "daemon RSS per lease at " + at, per, 2048, "B", "le", 1,
      "baseline column = the 2 KiB budget; VmRSS - RssShmem growth over the idle daemon; "
      "VmRSS incl. the leased pages: " +
          std::to_string(static_cast<int>(vm / held)) +
          " B/lease; kernel VMAs and page tables are not in RSS"));
}

}  // namespace

void RunP6(const Options& o, Report* r) {
  std::vector<uint64_t> levels =
      o.quick ? std::vector<uint64_t>{100, 1000} : std::vector<uint64_t>{100, 10000, 100000};
  int cycles = o.quick ? 300 : 2000;
  rlimit rl = RaiseFdLimit(levels.back() + 4096, r);
  const std::string limits = " (daemon RLIMIT_NOFILE " + std::to_string(rl.rlim_cur) +
                             ", vm.max_map_count " + ReadFirstLine("/proc/sys/vm/max_map_count") +
                             "; the daemon holds one fd and one mapping per lease)";
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

  Stats warmup;
  if (Status s = MeasureCycles(*meas, o.node, cycles, &warmup); !s.ok()) {
    return r->Skip("P6", "scale", s.ToString());
  }
  auto s0 = ProcStatus(dpid);
  if (!s0.ok()) return r->Skip("P6", "scale", s0.status().ToString());

  std::vector<uint64_t> ids;
  double p99_first = 0;
  for (size_t li = 0; li < levels.size(); ++li) {
    P6Level lv;
    lv.target = levels[li];
    lv.last = li + 1 == levels.size();
    lv.stop_reason = FillTo(*fill, o.node, lv.target, limits, &ids);
    lv.held = ids.size();
    Stats g;
    if (Status s = MeasureCycles(*meas, o.node, cycles, &g); !s.ok()) {
      r->Skip("P6", "at " + std::to_string(lv.held) + " leases", s.ToString());
      break;
    }
    auto st = ProcStatus(dpid);
    if (!st.ok()) return r->Skip("P6", "scale", st.status().ToString());
    if (li == 0) p99_first = g.PercentileUs(0.99);
    AddP6Rows(lv, levels[0], p99_first, g, cycles, *s0, *st, r);
    if (!lv.stop_reason.empty()) break;
  }
}

}  // namespace cxlpool::bench
