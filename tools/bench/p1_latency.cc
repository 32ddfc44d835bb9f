// P1: grant latency p50/p99/p999 of alloc (+release) from the warm reserve and
// cold, against a bare AF_UNIX round trip that passes one fd, sampled
// interleaved with the daemon's samples on the same socket type.
#include <string>
#include <vector>

#include "bench.h"

namespace cxlpool::bench {

namespace {

struct SizePlan {
  uint64_t size;
  int warm_samples;
  int cold_samples;
};

// Fewer samples than this in a placement class: no like-for-like row.
constexpr size_t kMinPlacementSamples = 10;

// "bare on one CPU 93% of 2300" (of the samples whose placement is known).
std::string SameCpuShare(const std::string& who, const Stats& same, const Stats& cross) {
  size_t known = same.size() + cross.size();
  if (known == 0) return who + ": CPU placement unknown";
  int pct = static_cast<int>(100.0 * static_cast<double>(same.size()) / known + 0.5);
  return who + " on one CPU with the client " + std::to_string(pct) + "% of " +
         std::to_string(known);
}

// Latency samples also filed by CPU placement: whether the reply was sent on
// the CPU that received it. In a VM a cross-CPU wake-up costs an
// inter-processor interrupt (about 10 us here), and the scheduler puts the
// two processes of the bare pair on one CPU in some runs and not in others.
struct PlacedStats {
  Stats all, same, cross;
  void Add(uint64_t ns, std::optional<bool> same_cpu) {
    all.Add(ns);
    if (same_cpu) (*same_cpu ? same : cross).Add(ns);
  }
};

// The baseline: timed grant round trips to the bare server, each followed by
// an untimed release round trip, pooled over the whole figure.
class BareSampler {
 public:
  explicit BareSampler(BareClient* client) : c_(client) {}
  Status Sample() {
    uint64_t t0 = NowNs();
    CXLPOOL_RETURN_IF_ERROR(c_->GrantRoundTrip());
    uint64_t ns = NowNs() - t0;
    grant_.Add(ns, c_->last_same_cpu());
    return c_->ReleaseRoundTrip();
  }
  const PlacedStats& grant() const { return grant_; }

 private:
  BareClient* c_;
  PlacedStats grant_;
};

// One size's samples. `error` set: the size failed, no rows but a skip.
struct SizeResult {
  uint64_t size = 0;
  PlacedStats warm;  // grants wholly from the warm reserve
  Stats warm_release, cold;
  int warm_misses = 0;
  std::string error;
};

// One daemon sample right after one bare sample: ALLOC timed, RELEASE timed.
struct Grant {
  uint64_t grant_ns = 0, release_ns = 0;
  bool from_warm_stock = false;
};

// "" or what failed, as the figure's skip note says it.
std::string SampleGrant(WireClient& w, BareSampler& bare, uint64_t size, int node, Grant* g) {
  if (Status s = bare.Sample(); !s.ok()) return "bare: " + s.ToString();
  uint64_t t0 = NowNs();
  auto l = w.Alloc(size, node);
  uint64_t t1 = NowNs();
  if (!l.ok()) return l.status().ToString();
  Status rel = w.Release(l->id());
  uint64_t t2 = NowNs();
  if (!rel.ok()) return "release: " + rel.ToString();
  g->grant_ns = t1 - t0;
  g->release_ns = t2 - t1;
  g->from_warm_stock = l->from_warm_stock();
  return "";
}

// Warm: the daemon idle (its reserve refilled) before each sample; grants
// not wholly from the reserve are dropped and counted as misses.
std::string MeasureWarm(WireClient& w, BareSampler& bare, const SizePlan& p, int node,
                        SizeResult* res) {
  for (int i = 0; i < p.warm_samples; ++i) {
    if (Status s = w.WaitIdle(); !s.ok()) return s.ToString();
    Grant g;
    if (std::string e = SampleGrant(w, bare, p.size, node, &g); !e.empty()) return e;
    if (!g.from_warm_stock) {
      ++res->warm_misses;
      continue;
    }
    res->warm.Add(g.grant_ns, w.LoopOnMyCpu());
    res->warm_release.Add(g.release_ns);
  }
  return "";
}

// Cold: one page more than the warm class, so no stock can serve it.
std::string MeasureCold(WireClient& w, BareSampler& bare, const SizePlan& p, int node,
                        SizeResult* res) {
  for (int i = 0; i < p.cold_samples; ++i) {
    Grant g;
    if (std::string e = SampleGrant(w, bare, p.size + 4 * kKiB, node, &g); !e.empty()) return e;
    if (!g.from_warm_stock) res->cold.Add(g.grant_ns);
  }
  return "";
}

void ReportWarm(const SizeResult& res, const PlacedStats& bare, Report* r) {
  const std::string sz = HumanSize(res.size);
  if (res.warm.all.size() == 0) {
    r->Skip("P1", "grant " + sz + " warm",
            "no grant came wholly from the warm reserve (" + std::to_string(res.warm_misses) +
                " misses): the daemon's reserve is too small");
    return;
  }
  auto row = [&](const std::string& what, double v, double b, const std::string& op, double goal,
                 const std::string& note) {
    r->Add(MeasuredRow("P1", "grant " + sz + " warm " + what, v, b, "us", op, goal, note));
  };
  std::string n = "n=" + std::to_string(res.warm.all.size()) + " warm grants (" +
                  std::to_string(res.warm_misses) +
                  " misses dropped), bare n=" + std::to_string(bare.all.size()) + "; release p50 " +
                  std::to_string(static_cast<int>(res.warm_release.MedianUs())) + " us; " +
                  SameCpuShare("bare", bare.same, bare.cross) + ", " +
                  SameCpuShare("daemon loop", res.warm.same, res.warm.cross);
  row("p50", res.warm.all.MedianUs(), bare.all.PercentileUs(0.5), "le", 2, n);
  // Like for like: daemon grants and bare round trips whose two ends were
  // on different CPUs (the usual case for a daemon serving many clients).
  if (res.warm.cross.size() >= kMinPlacementSamples && bare.cross.size() >= kMinPlacementSamples) {
    row("p50, cross-CPU pairs", res.warm.cross.MedianUs(), bare.cross.MedianUs(), "", 0,
        "daemon n=" + std::to_string(res.warm.cross.size()) +
            ", bare n=" + std::to_string(bare.cross.size()));
  }
  row("p99", res.warm.all.PercentileUs(0.99), bare.all.PercentileUs(0.99), "le", 10, "");
  row("p999", res.warm.all.PercentileUs(0.999), bare.all.PercentileUs(0.999), "", 0,
      res.warm.all.size() < 1000 ? "fewer than 1000 samples: p999 is the maximum" : "");
}

void ReportCold(const SizeResult& res, const PlacedStats& bare, Report* r) {
  if (res.cold.size() == 0) return;
  const std::string sz = HumanSize(res.size);
  r->Add(MeasuredRow("P1", "grant " + sz + " cold p50", res.cold.MedianUs(),
                     bare.all.PercentileUs(0.5), "us", "", 0,
                     "cold = " + sz +
                         " + 4 KiB (no warm class), n=" + std::to_string(res.cold.size()) +
                         "; builds and prefaults the memfd on the request path"));
  r->Add(MeasuredRow("P1", "grant " + sz + " cold p99", res.cold.PercentileUs(0.99),
                     bare.all.PercentileUs(0.99), "us"));
}

}  // namespace

void RunP1(const Options& o, Report* r) {
  std::vector<SizePlan> plan =
      o.quick
          ? std::vector<SizePlan>{{2 * kMiB, 200, 100}, {8 * kMiB, 50, 20}, {32 * kMiB, 20, 10}}
          : std::vector<SizePlan>{{2 * kMiB, 2000, 1000}, {64 * kMiB, 200, 100}, {kGiB, 20, 10}};
  DaemonConfig cfg;
  // A warm reserve of one lease of each size, refilled after every grant.
  for (const SizePlan& p : plan) cfg.reserve_bytes += p.size;
  DaemonProc daemon;
  auto sock = PhaseSocket(o, cfg, &daemon);
  if (!sock.ok()) return r->Skip("P1", "grant latency", sock.status().ToString());
  BareServer bare_server;
  Status st = bare_server.Start();
  if (!st.ok()) return r->Skip("P1", "grant latency", "bare server: " + st.ToString());
  auto bc = BareClient::Connect(bare_server.socket());
  if (!bc.ok()) return r->Skip("P1", "grant latency", "bare client: " + bc.status().ToString());
  auto w = WireClient::Connect(*sock);
  if (!w.ok()) return r->Skip("P1", "grant latency", w.status().ToString());

  // Warm-up of both paths (not recorded), then a block of bare samples.
  BareSampler bare(&*bc);
  for (int i = 0; i < 50; ++i) {
    if (Status s = bc->GrantRoundTrip(); !s.ok()) return r->Skip("P1", "bare", s.ToString());
  }
  for (int i = 0; i < 20; ++i) {
    auto l = w->Alloc(4 * kKiB, o.node);
    if (!l.ok()) return r->Skip("P1", "grant latency", "warm-up alloc: " + l.status().ToString());
    (void)w->Release(l->id());
  }
  for (int i = 0; i < (o.quick ? 300 : 2000); ++i) {
    if (Status s = bare.Sample(); !s.ok()) return r->Skip("P1", "bare", s.ToString());
  }

  std::vector<SizeResult> results;
  for (const SizePlan& p : plan) {
    SizeResult res;
    res.size = p.size;
    res.error = MeasureWarm(*w, bare, p, o.node, &res);
    if (res.error.empty()) res.error = MeasureCold(*w, bare, p, o.node, &res);
    results.push_back(std::move(res));
  }

  // The bare baseline pools every sample of the figure, so rows come last.
  for (const SizeResult& res : results) {
    if (!res.error.empty()) {
      r->Skip("P1", "grant " + HumanSize(res.size), "failed: " + res.error);
      continue;
    }
    ReportWarm(res, bare.grant(), r);
    ReportCold(res, bare.grant(), r);
  }
}

}  // namespace cxlpool::bench
