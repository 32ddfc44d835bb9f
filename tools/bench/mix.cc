// Issue 18's figures measured through the daemon, each against a baseline in
// the same run (docs/benchmarks.md):
//
// P2any / P2_4k / P2cold: a mix of request sizes, log-uniform over 4 KiB ..
//   --max-size (2 GiB) and never page-aligned, each granted, mapped and
//   populated by libcxlpool's Client::Allocate, against the same process
//   doing mmap + mbind + MADV_POPULATE_WRITE of the same size with the same
//   page size. P2any with huge-page extents (THP where shmem allows it, else
//   hugetlb where the node has the free 2 MiB pages) and the reserve warm,
//   P2_4k with 4 KiB extents, P2cold with no reserve (everything built on the
//   request path).
//   Rows: the median ratio per size band (< 2 MiB, 2..64 MiB, >= 64 MiB) and
//   the whole mix's sum of times.
// P1u: cxlpool_alloc of 2 MiB (the C ABI) returning a usable pointer,
//   against a floor: a bare server that hands over one prebuilt, prefaulted
//   memfd, which the bench maps with the client library's own ExtentMapping.
// recycled: a lease granted from the reserve and released at once, until the
//   reserve holds again what it held before (the daemon scrubbing or
//   rebuilding that memory), against a memset of the same size on the node.
#include <numaif.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "bench.h"
#include "cxlpool/client.hpp"
#include "cxlpool/cxlpool.h"
#include "extent_mapping.h"

namespace cxlpool::bench {

namespace {

// The warm reserve each figure runs with: large enough for the biggest
// request of the mix and its refill (P2any, P2_4k), for P1u's 2 MiB, for
// one recycled lease.
uint64_t MixReserve(uint64_t max_size) { return std::max<uint64_t>(2 * max_size, 64 * kMiB); }

// `n` deterministic sizes, log-uniform over [4 KiB, max], none a multiple of
// 4 KiB, in random order.
std::vector<uint64_t> MixSizes(int n, uint64_t max) {
  std::vector<uint64_t> out;
  uint64_t x = 0x2545f4914f6cdd1dull;
  const double lo = std::log(4096.0), hi = std::log(static_cast<double>(max));
  for (int i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    double u = static_cast<double>(x % 1000003) / 1000003.0;
    auto s = static_cast<uint64_t>(std::exp(lo + u * (hi - lo)));
    s = std::clamp<uint64_t>(s, 4 * kKiB, max - 4 * kKiB);
    s = s - s % 4096 + 1 + (x >> 40) % 4095;  // 1..4095 bytes past a page
    out.push_back(s);
  }
  return out;
}

struct Band {
  const char* name;
  uint64_t lo, hi;  // [lo, hi)
  double goal;      // 0: reported, no goal
};

struct MixSpec {
  const char* figure;
  Pages pages;
  bool warm;
  std::vector<Band> bands;
  double sum_goal;  // 0: none
};

double MedianOf(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// The mix's sizes and the daemon it runs against. What the leases can
// really get when the figure asks for huge pages: THP extents where shmem
// allows them; else hugetlb extents where the node has the free 2 MiB pages
// for the whole run (the reserve, the largest lease built beside it, the
// baseline's own); else 4 KiB pages.
struct MixPlan {
  uint64_t max = 0;
  int count = 0;
  bool thp = false;
  DaemonConfig cfg;
  uint64_t huge_need = 0, huge_free = 0;
  Pages lease_pages = Pages::k4K;
};

MixPlan PlanMix(const Options& o, const MixSpec& spec) {
  MixPlan m;
  m.max = o.max_size ? o.max_size : (o.quick ? 256 * kMiB : 2 * kGiB);
  m.count = o.mix_count ? o.mix_count : (o.quick ? 24 : 200);
  m.thp = spec.pages == Pages::kThp;
  m.cfg.thp = m.thp;
  m.cfg.reserve_bytes = spec.warm ? MixReserve(m.max) : 0;
  m.huge_need = (m.cfg.reserve_bytes + 2 * m.max) / (2 * kMiB);
  m.huge_free = FreeHugepages(o.node);
  if (m.thp && ShmemThpAllowed()) {
    m.lease_pages = Pages::kThp;
  } else if (m.thp && m.huge_free >= m.huge_need) {
    m.lease_pages = Pages::kHugetlb;
    m.cfg.hugetlb = true;
  }
  return m;
}

struct Sample {
  uint64_t size, lease_ns, self_ns;
};

// What the mix measured: one sample per request, and what backed them.
struct MixRun {
  std::vector<Sample> samples;
  int warm = 0;
  uint64_t pmd = 0, huge_sized = 0, hugetlb_backed = 0;
};

// One request of the mix: Client::Allocate timed (granted, mapped,
// populated), then the same size populated by the process itself.
// "" or what failed.
std::string MeasureOne(const Options& o, const MixSpec& spec, const MixPlan& m, uint64_t size,
                       WireClient& ctl, cxlpool::Client& client, MixRun* run) {
  if (Status s = ctl.WaitIdle(); !s.ok()) return s.ToString();
  auto before = ctl.GetStats();
  if (!before.ok()) return before.status().ToString();
  cxlpool::AllocOptions opts;
  opts.size_bytes = size;
  opts.numa_node = o.node;
  opts.strict = true;
  opts.label = std::string("cxlpool-bench ") + spec.figure;
  uint64_t t0 = NowNs();
  auto lease = client.Allocate(opts);
  uint64_t t1 = NowNs();
  if (!lease.ok()) return "allocate " + std::to_string(size) + ": " + lease.status().ToString();
  // Usable as one buffer, end to end (outside the timing).
  auto* c = static_cast<volatile char*>(lease->data());
  c[0] = 1;
  c[size - 1] = 1;
  auto after = ctl.GetStats();
  // A grant wholly from the warm reserve.
  auto hits = [](const proto::StatsReply& x) { return CounterOf(x, "reserve_hits"); };
  if (after.ok() && hits(*after) > hits(*before)) ++run->warm;
  if (m.lease_pages == Pages::kHugetlb) {
    if (lease->info().backing == "hugetlb-2m") ++run->hugetlb_backed;
  } else if (m.thp && size >= 2 * kMiB) {
    ++run->huge_sized;
    auto pm = SmapsField(lease->data(), lease->size(), "ShmemPmdMapped");
    if (pm.ok() && *pm > 0) ++run->pmd;
  }
  (void)lease->Release();
  if (Status s = ctl.WaitIdle(); !s.ok()) return s.ToString();
  auto self = PopulateYourselfNs(size, o.node, m.lease_pages);
  if (!self.ok()) return "baseline: " + self.status().ToString();
  run->samples.push_back({size, t1 - t0, *self});
  return "";
}

// The note's account of the page size both sides ran on, and why.
std::string PagesNote(const MixPlan& m) {
  const std::string shmem_thp =
      "shmem_enabled " + ReadFirstLine("/sys/kernel/mm/transparent_hugepage/shmem_enabled");
  if (m.lease_pages == Pages::kThp) return "THP on both sides (baseline MADV_HUGEPAGE)";
  if (m.lease_pages == Pages::kHugetlb) {
    return "hugetlb on both sides: shmem THP is not allowed here (" + shmem_thp +
           "), the node had " + std::to_string(m.huge_free) + " free 2 MiB pages (" +
           std::to_string(m.huge_need) +
           " needed), so the pool is hugetlb = true (every lease a multiple of 2 MiB) "
           "and the baseline MAP_HUGETLB of the size rounded up to 2 MiB";
  }
  if (m.thp) {
    return "4 KiB pages on both sides: shmem THP is not allowed here (" + shmem_thp +
           ") and the node has " + std::to_string(m.huge_free) + " of the " +
           std::to_string(m.huge_need) +
           " free 2 MiB pages a hugetlb run needs, so THP extents fall back and the "
           "baseline matches them";
  }
  return "4 KiB pages on both sides (thp = false, baseline MADV_NOHUGEPAGE)";
}

// Per band: the median of the per-request ratios (sizes within a band differ
// by up to 512x; its baseline column is 1), each side's median time in the note.
void AddBandRows(const MixSpec& spec, const MixPlan& m, const MixRun& run, Report* r) {
  for (const Band& b : spec.bands) {
    std::vector<double> ratios;
    std::vector<double> lease_ms, self_ms;
    for (const Sample& s : run.samples) {
      if (s.size < b.lo || s.size >= b.hi || s.self_ns == 0) continue;
      ratios.push_back(static_cast<double>(s.lease_ns) / static_cast<double>(s.self_ns));
      lease_ms.push_back(static_cast<double>(s.lease_ns) / 1e6);
      self_ms.push_back(static_cast<double>(s.self_ns) / 1e6);
    }
    std::string metric = std::string("ready, median per request ") + b.name;
    if (ratios.empty()) {
      r->notes.push_back(std::string(spec.figure) + " " + metric + ": no request in this band (" +
                         std::to_string(m.count) + " sizes up to " + HumanSize(m.max) + ")");
      continue;
    }
    char buf[200];
    std::snprintf(buf, sizeof buf,
                  "median of %zu per-request ratios (lease / populate yourself); medians %.3f ms "
                  "vs %.3f ms",
                  ratios.size(), MedianOf(lease_ms), MedianOf(self_ms));
    r->Add(MeasuredRow(spec.figure, metric, MedianOf(ratios), 1, "x", b.goal > 0 ? "le" : "",
                       b.goal > 0 ? b.goal : 0, buf));
  }
}

// The whole mix: the sum of the lease times against the sum of the baseline's.
void AddSumRow(const MixSpec& spec, const MixPlan& m, const MixRun& run, Report* r) {
  uint64_t sum_lease = 0, sum_self = 0, requested = 0;
  for (const Sample& s : run.samples) {
    sum_lease += s.lease_ns;
    sum_self += s.self_ns;
    requested += s.size;
  }
  const size_t n = run.samples.size();
  std::string common = std::to_string(run.warm) + "/" + std::to_string(n) + " warm hits; reserve " +
                       HumanSize(m.cfg.reserve_bytes);
  if (m.lease_pages == Pages::kHugetlb) {
    common += "; " + std::to_string(run.hugetlb_backed) + "/" + std::to_string(n) +
              " leases backed hugetlb-2m";
  } else if (m.thp && run.huge_sized > 0) {
    common += "; " + std::to_string(run.pmd) + "/" + std::to_string(run.huge_sized) +
              " leases of 2 MiB or more PMD-mapped";
  }
  std::string note = std::to_string(n) + " sizes log-uniform 4 KiB.." + HumanSize(m.max) +
                     ", none page-aligned, " + HumanSize(requested / kMiB * kMiB) + " in all; " +
                     PagesNote(m) + "; " + common;
  r->Add(MeasuredRow(spec.figure, "ready, whole mix (sum of times)",
                     static_cast<double>(sum_lease) / 1e6, static_cast<double>(sum_self) / 1e6,
                     "ms", spec.sum_goal > 0 ? "le" : "", spec.sum_goal > 0 ? spec.sum_goal : 0,
                     note));
}

void RunMix(const Options& o, const MixSpec& spec, Report* r) {
  const MixPlan m = PlanMix(o, spec);
  if (m.max < 64 * kKiB) return r->Skip(spec.figure, "mix", "--max-size below 64 KiB");
  if (!o.spawn() && (m.thp || !spec.warm)) {
    return r->Skip(spec.figure, "mix",
                   "a running daemon (--socket) has one configuration; measured as P2_4k");
  }
  DaemonProc daemon;
  auto sock = PhaseSocket(o, m.cfg, &daemon);
  if (!sock.ok()) return r->Skip(spec.figure, "mix", sock.status().ToString());
  auto ctl = WireClient::Connect(*sock);
  if (!ctl.ok()) return r->Skip(spec.figure, "mix", ctl.status().ToString());
  auto client = cxlpool::Client::Connect(*sock);
  if (!client.ok()) return r->Skip(spec.figure, "mix", client.status().ToString());
  MixRun run;
  for (uint64_t size : MixSizes(m.count, m.max)) {
    std::string error = MeasureOne(o, spec, m, size, *ctl, *client, &run);
    if (!error.empty()) return r->Skip(spec.figure, "mix", error);
  }
  AddBandRows(spec, m, run, r);
  AddSumRow(spec, m, run, r);
}

constexpr uint64_t kNoLimit = ~0ull;

}  // namespace

void RunP2Any(const Options& o, Report* r) {
  RunMix(o,
         {"P2any",
          Pages::kThp,
          true,
          {{"< 2 MiB", 0, 2 * kMiB, 1.5},
           {"2..64 MiB", 2 * kMiB, 64 * kMiB, 0.3},
           {">= 64 MiB", 64 * kMiB, kNoLimit, 0.05}},
          0.1},
         r);
}

void RunP2Small(const Options& o, Report* r) {
  RunMix(o,
         {"P2_4k",
          Pages::k4K,
          true,
          {{"< 2 MiB", 0, 2 * kMiB, 0},
           {"2..64 MiB", 2 * kMiB, 64 * kMiB, 0},
           {">= 64 MiB", 64 * kMiB, kNoLimit, 0.15}},
          0},
         r);
}

void RunP2Cold(const Options& o, Report* r) {
  RunMix(o,
         {"P2cold",
          Pages::kThp,
          false,
          {{"< 2 MiB", 0, 2 * kMiB, 1.2},
           {"2..64 MiB", 2 * kMiB, 64 * kMiB, 1.2},
           {">= 64 MiB", 64 * kMiB, kNoLimit, 1.2}},
          0},
         r);
}

// ---------------------------------------------------------------- P1u

void RunP1u(const Options& o, Report* r) {
  constexpr uint64_t kSize = 2 * kMiB;
  const int n = o.quick ? 200 : 2000;
  DaemonConfig cfg;
  cfg.reserve_bytes = MixReserve(kSize);
  DaemonProc daemon;
  auto sock = PhaseSocket(o, cfg, &daemon);
  if (!sock.ok()) return r->Skip("P1u", "cxlpool_alloc 2 MiB", sock.status().ToString());
  MemfdSpec spec = FloorSpec(kSize, o.node, o.pin, cfg.thp, "cxlpool-bench-p1u");
  BareServer floor;
  if (Status s = floor.StartPrebuilt(spec); !s.ok()) {
    return r->Skip("P1u", "cxlpool_alloc 2 MiB", "floor server: " + s.ToString());
  }
  auto fc = BareClient::Connect(floor.socket());
  if (!fc.ok()) return r->Skip("P1u", "cxlpool_alloc 2 MiB", fc.status().ToString());
  auto ctl = WireClient::Connect(*sock);
  if (!ctl.ok()) return r->Skip("P1u", "cxlpool_alloc 2 MiB", ctl.status().ToString());
  cxlpool_client* c = nullptr;
  if (int rc = cxlpool_connect(sock->c_str(), &c); rc != 0) {
    return r->Skip("P1u", "cxlpool_alloc 2 MiB",
                   std::string("cxlpool_connect: ") + cxlpool_strerror(rc));
  }
  cxlpool_alloc_opts opts;
  cxlpool_alloc_opts_init(&opts);
  opts.size_bytes = kSize;
  opts.numa_node = o.node;
  opts.flags = CXLPOOL_ALLOC_STRICT;
  opts.label = "cxlpool-bench P1u";

  // One floor sample: the fd round trip, then the client's own mapping code.
  auto floor_sample = [&](Stats* st) -> Status {
    uint64_t t0 = NowNs();
    auto fd = fc->GrantFd();
    if (!fd.ok()) return fd.status();
    std::vector<ExtentMapping::Piece> pieces;
    pieces.push_back({std::move(*fd), kSize, 0});
    auto m = ExtentMapping::Map(std::move(pieces), "memfd");
    uint64_t t1 = NowNs();
    if (!m.ok()) return m.status();
    static_cast<volatile char*>(m->data())[0] = 1;
    st->Add(t1 - t0);
    m->Unmap();
    return fc->ReleaseRoundTrip();
  };
  Stats lease_ns, floor_ns, ignored;
  int warm = 0;
  std::string error;
  for (int i = 0; i < 20 && error.empty(); ++i) {  // warm-up, not recorded
    if (Status s = floor_sample(&ignored); !s.ok()) error = "floor: " + s.ToString();
  }
  for (int i = 0; i < n && error.empty(); ++i) {
    if (Status s = ctl->WaitIdle(); !s.ok()) {
      error = s.ToString();
      break;
    }
    if (Status s = floor_sample(&floor_ns); !s.ok()) {
      error = "floor: " + s.ToString();
      break;
    }
    cxlpool_lease* l = nullptr;
    uint64_t t0 = NowNs();
    int rc = cxlpool_alloc(c, &opts, &l);
    uint64_t t1 = NowNs();
    if (rc != 0) {
      error = std::string("cxlpool_alloc: ") + cxlpool_strerror(rc) + ": " +
              cxlpool_last_error_message();
      break;
    }
    static_cast<volatile char*>(cxlpool_lease_ptr(l))[0] = 1;
    lease_ns.Add(t1 - t0);
    (void)cxlpool_release(l);
  }
  if (Status s = ctl->WaitIdle(); s.ok()) {
    auto st = ctl->GetStats();
    if (st.ok()) {
      warm = static_cast<int>(CounterOf(*st, "reserve_hits"));
    }
  }
  cxlpool_disconnect(c);
  if (!error.empty()) return r->Skip("P1u", "cxlpool_alloc 2 MiB", error);
  auto row = [&](const char* q, double v, double b, double goal, const std::string& note) {
    Row x;
    x.figure = "P1u";
    x.metric = std::string("cxlpool_alloc 2 MiB to a usable pointer ") + q;
    x.value = v;
    x.baseline = b;
    x.unit = "us";
    x.goal_op = "le";
    x.goal = goal;
    x.note = note;
    r->Add(std::move(x));
  };
  row("p50", lease_ns.MedianUs(), floor_ns.MedianUs(), 1.5,
      "n=" + std::to_string(lease_ns.size()) + " interleaved with the floor; " +
          std::to_string(warm) + " warm hits in the daemon's counters; floor: a bare server " +
          "handing over one prebuilt, prefaulted 2 MiB memfd (" + (spec.thp ? "THP" : "4 KiB") +
          " asked), mapped with the client's ExtentMapping; reserve " +
          HumanSize(cfg.reserve_bytes));
  row("p99", lease_ns.PercentileUs(0.99), floor_ns.PercentileUs(0.99), 5, "");
}

// ---------------------------------------------------------------- recycled

namespace {

// The reserve's ready bytes on `node`.
uint64_t WarmBytes(const proto::PoolsReply& p, int node) {
  uint64_t v = 0;
  for (const auto& pool : p.pools()) {
    if (pool.numa_node() == node) v += pool.reserve().ready_bytes();
  }
  return v;
}

void RecycledRows(const Options& o, Pages pages, uint64_t size, int reps, Report* r) {
  const char* kind = PagesName(pages);
  const std::string metric = "release to reserve again, " + HumanSize(size) + " " + kind;
  DaemonConfig cfg;
  cfg.thp = pages == Pages::kThp;
  cfg.reserve_bytes = MixReserve(size);
  DaemonProc daemon;
  auto sock = PhaseSocket(o, cfg, &daemon);
  if (!sock.ok()) return r->Skip("recycled", metric, sock.status().ToString());
  auto w = WireClient::Connect(*sock);
  if (!w.ok()) return r->Skip("recycled", metric, w.status().ToString());
  // The baseline's memory: resident, on the node, the same page size.
  const Pages base_pages = pages == Pages::kThp && ShmemThpAllowed() ? Pages::kThp : Pages::k4K;
  void* mem = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return r->Skip("recycled", metric, "mmap baseline failed");
  (void)BindToNode(mem, size, o.node);
  ::madvise(mem, size, base_pages == Pages::kThp ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  PopulateWrite(mem, size, 4 * kKiB);
  std::vector<uint64_t> cycle, set;
  int warm = 0;
  std::string error;
  for (int i = 0; i < reps && error.empty(); ++i) {
    if (Status s = w->WaitIdle(); !s.ok()) {
      error = s.ToString();
      break;
    }
    auto p0 = w->GetPools();
    if (!p0.ok()) {
      error = p0.status().ToString();
      break;
    }
    const uint64_t before = WarmBytes(*p0, o.node);
    uint64_t t0 = NowNs();
    auto l = w->Alloc(size, o.node);
    if (!l.ok()) {
      error = "alloc: " + l.status().ToString();
      break;
    }
    if (l->from_warm_stock()) ++warm;
    if (Status s = w->Release(l->id()); !s.ok()) {
      error = "release: " + s.ToString();
      break;
    }
    // Back where it was: nothing building or reclaiming, the reserve full.
    for (;;) {
      if (Status s = w->WaitIdle(); !s.ok()) {
        error = s.ToString();
        break;
      }
      auto p1 = w->GetPools();
      if (!p1.ok()) {
        error = p1.status().ToString();
        break;
      }
      if (WarmBytes(*p1, o.node) >= before) break;
      if (NowNs() - t0 > 120ull * 1000000000ull) {
        error = "the reserve did not come back within 120 s";
        break;
      }
      ::usleep(1000);
    }
    uint64_t t1 = NowNs();
    cycle.push_back(t1 - t0);
    std::memset(mem, 0xA5, size);  // a previous holder's bytes
    uint64_t m0 = NowNs();
    std::memset(mem, 0, size);
    set.push_back(NowNs() - m0);
  }
  ::munmap(mem, size);
  if (!error.empty()) return r->Skip("recycled", metric, error);
  std::sort(cycle.begin(), cycle.end());
  std::sort(set.begin(), set.end());
  uint64_t c = cycle[cycle.size() / 2], m = set[set.size() / 2];
  Row x;
  x.figure = "recycled";
  x.metric = metric;
  x.value = static_cast<double>(size) / static_cast<double>(c);
  x.baseline = static_cast<double>(size) / static_cast<double>(m);
  x.unit = "GB/s";
  x.goal_op = "ge";
  x.goal = 0.8;
  x.note = "median of " + std::to_string(reps) + ": grant from the reserve (" +
           std::to_string(warm) + " warm), release at once, until no build or reclaim is " +
           "pending and the node's warm bytes are back; baseline memset(0) of the same size, " +
           "resident, bound to node " + std::to_string(o.node) +
           (base_pages == Pages::kThp ? ", THP" : ", 4 KiB pages") + "; reserve " +
           HumanSize(cfg.reserve_bytes);
  r->Add(std::move(x));
}

}  // namespace

void RunRecycled(const Options& o, Report* r) {
  const uint64_t size = o.quick ? 32 * kMiB : kGiB;
  const int reps = o.quick ? 3 : 5;
  RecycledRows(o, Pages::kThp, size, reps, r);
  RecycledRows(o, Pages::k4K, size, reps, r);
}

}  // namespace cxlpool::bench
