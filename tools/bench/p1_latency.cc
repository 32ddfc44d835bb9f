// P1: grant latency p50/p99/p999 of alloc (+release) from the warm reserve and
// cold, against a bare AF_UNIX round trip that passes one fd, sampled
// interleaved with the daemon's samples on the same socket type.
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
  BareServer bare;
  Status st = bare.Start();
  if (!st.ok()) return r->Skip("P1", "grant latency", "bare server: " + st.ToString());
  auto bc = BareClient::Connect(bare.socket());
  if (!bc.ok()) return r->Skip("P1", "grant latency", "bare client: " + bc.status().ToString());
  auto w = WireClient::Connect(*sock);
  if (!w.ok()) return r->Skip("P1", "grant latency", w.status().ToString());

  // Every sample is also filed by CPU placement: whether the reply was sent
  // on the CPU that received it. In a VM a cross-CPU wake-up costs an
  // inter-processor interrupt (about 10 us here), and the scheduler puts the
  // two processes of the bare pair on one CPU in some runs and not in others.
  Stats bare_grant, bare_same, bare_cross;
  auto bare_sample = [&]() -> Status {
    uint64_t t0 = NowNs();
    CXLPOOL_RETURN_IF_ERROR(bc->GrantRoundTrip());
    uint64_t ns = NowNs() - t0;
    bare_grant.Add(ns);
    if (auto same = bc->last_same_cpu()) (*same ? bare_same : bare_cross).Add(ns);
    return bc->ReleaseRoundTrip();
  };
  // Warm-up of both paths (not recorded), then a block of bare samples.
  for (int i = 0; i < 50; ++i) {
    if (Status s = bc->GrantRoundTrip(); !s.ok()) return r->Skip("P1", "bare", s.ToString());
  }
  for (int i = 0; i < 20; ++i) {
    auto l = w->Alloc(4 * kKiB, o.node);
    if (!l.ok()) return r->Skip("P1", "grant latency", "warm-up alloc: " + l.status().ToString());
    (void)w->Release(l->id());
  }
  for (int i = 0; i < (o.quick ? 300 : 2000); ++i) {
    if (Status s = bare_sample(); !s.ok()) return r->Skip("P1", "bare", s.ToString());
  }

  struct Result1 {
    uint64_t size;
    Stats warm, warm_release, cold;
    Stats warm_same, warm_cross;  // by CPU placement, as bare_same / bare_cross
    int warm_misses = 0;
    std::string error;
  };
  std::vector<Result1> results;
  for (const SizePlan& p : plan) {
    Result1 res;
    res.size = p.size;
    for (int i = 0; i < p.warm_samples && res.error.empty(); ++i) {
      if (Status s = w->WaitIdle(); !s.ok()) {
        res.error = s.ToString();
        break;
      }
      if (Status s = bare_sample(); !s.ok()) {
        res.error = "bare: " + s.ToString();
        break;
      }
      uint64_t t0 = NowNs();
      auto l = w->Alloc(p.size, o.node);
      uint64_t t1 = NowNs();
      if (!l.ok()) {
        res.error = l.status().ToString();
        break;
      }
      Status rel = w->Release(l->id());
      uint64_t t2 = NowNs();
      if (!rel.ok()) {
        res.error = "release: " + rel.ToString();
        break;
      }
      if (!l->from_warm_stock()) {
        ++res.warm_misses;
        continue;
      }
      res.warm.Add(t1 - t0);
      res.warm_release.Add(t2 - t1);
      if (auto same = w->LoopOnMyCpu()) (*same ? res.warm_same : res.warm_cross).Add(t1 - t0);
    }
    // Cold: one page more than the warm class, so no stock can serve it.
    for (int i = 0; i < p.cold_samples && res.error.empty(); ++i) {
      if (Status s = bare_sample(); !s.ok()) {
        res.error = "bare: " + s.ToString();
        break;
      }
      uint64_t t0 = NowNs();
      auto l = w->Alloc(p.size + 4 * kKiB, o.node);
      uint64_t t1 = NowNs();
      if (!l.ok()) {
        res.error = l.status().ToString();
        break;
      }
      if (Status s = w->Release(l->id()); !s.ok()) {
        res.error = "release: " + s.ToString();
        break;
      }
      if (!l->from_warm_stock()) res.cold.Add(t1 - t0);
    }
    results.push_back(std::move(res));
  }

  const double b50 = bare_grant.PercentileUs(0.5), b99 = bare_grant.PercentileUs(0.99),
               b999 = bare_grant.PercentileUs(0.999);
  for (const Result1& res : results) {
    std::string sz = HumanSize(res.size);
    if (!res.error.empty()) {
      r->Skip("P1", "grant " + sz, "failed: " + res.error);
      continue;
    }
    if (res.warm.size() == 0) {
      r->Skip("P1", "grant " + sz + " warm",
              "no grant came wholly from the warm reserve (" + std::to_string(res.warm_misses) +
                  " misses): the daemon's reserve is too small");
    } else {
      auto row = [&](const std::string& what, double v, double b, const std::string& op,
                     double goal, const std::string& note) {
        Row x;
        x.figure = "P1";
        x.metric = "grant " + sz + " warm " + what;
        x.value = v;
        x.baseline = b;
        x.unit = "us";
        x.goal_op = op;
        x.goal = goal;
        x.note = note;
        r->Add(std::move(x));
      };
      std::string n = "n=" + std::to_string(res.warm.size()) + " warm grants (" +
                      std::to_string(res.warm_misses) +
                      " misses dropped), bare n=" + std::to_string(bare_grant.size()) +
                      "; release p50 " +
                      std::to_string(static_cast<int>(res.warm_release.MedianUs())) + " us; " +
                      SameCpuShare("bare", bare_same, bare_cross) + ", " +
                      SameCpuShare("daemon loop", res.warm_same, res.warm_cross);
      row("p50", res.warm.MedianUs(), b50, "le", 2, n);
      // Like for like: daemon grants and bare round trips whose two ends were
      // on different CPUs (the usual case for a daemon serving many clients).
      if (res.warm_cross.size() >= kMinPlacementSamples &&
          bare_cross.size() >= kMinPlacementSamples) {
        row("p50, cross-CPU pairs", res.warm_cross.MedianUs(), bare_cross.MedianUs(), "", 0,
            "daemon n=" + std::to_string(res.warm_cross.size()) +
                ", bare n=" + std::to_string(bare_cross.size()));
      }
      row("p99", res.warm.PercentileUs(0.99), b99, "le", 10, "");
      row("p999", res.warm.PercentileUs(0.999), b999, "", 0,
          res.warm.size() < 1000 ? "fewer than 1000 samples: p999 is the maximum" : "");
    }
    if (res.cold.size() > 0) {
      Row c50;
      c50.figure = "P1";
      c50.metric = "grant " + sz + " cold p50";
      c50.value = res.cold.MedianUs();
      c50.baseline = b50;
      c50.unit = "us";
      c50.note = "cold = " + sz + " + 4 KiB (no warm class), n=" + std::to_string(res.cold.size()) +
                 "; builds and prefaults the memfd on the request path";
      r->Add(c50);
      Row c99 = c50;
      c99.metric = "grant " + sz + " cold p99";
      c99.value = res.cold.PercentileUs(0.99);
      c99.baseline = b99;
      c99.note.clear();
      r->Add(c99);
    }
  }
}

}  // namespace cxlpool::bench
