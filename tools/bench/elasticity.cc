// C4, elasticity (issue 39): how much shared capacity a committed, skewed,
// time-shifting demand trace of 4 hosts needs at zero failed allocations,
// against static per-host partitions (each host sized for its own peak).
//
// The trace (tools/bench/traces/c4_demand.csv, scripts/gen-c4-trace.py) is
// each host's demand in slices per step. Four hosts, each its own etcd
// client and joined session on a real 3-member etcd with TLS, run it with
// the daemon's SliceStock policy (claim ahead 1, give back what stayed idle
// for 2 steps) on a shared device (a file) of C slices: per step, hosts
// whose demand fell Return slices, hosts whose demand rose Take, claiming
// through etcd when none is ready; a Take that finds nothing claimable is a
// failed allocation. Then time (a fake clock) advances a step and every host
// reconciles (claims ahead, gives back idle). The smallest C with no failure
// (binary search) is the figure; static partitions need the sum of the
// hosts' peaks.
#include <unistd.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <sstream>

#include "bench.h"
#include "bench_cluster.h"
#include "cxlpool/cluster/shared_device.h"
#include "cxlpool/cluster/slice_stock.h"
#include "cxlpool/common/clock.h"

namespace cxlpool::bench {

extern const char* const kC4DemandCsv;

namespace {

constexpr int kHosts = 4;
constexpr uint64_t kSlice = 2 * kMiB;
constexpr int64_t kStepNs = 15ll * 60 * 1000000000;  // a step is 15 minutes
using Trace = std::vector<std::array<uint32_t, kHosts>>;

Result<Trace> ParseTrace(const char* csv) {
  Trace t;
  std::istringstream in(csv);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream l(line);
    std::string cell;
    std::array<uint32_t, kHosts> row{};
    int col = 0;
    while (std::getline(l, cell, ',')) {
      if (col > kHosts) return Status(Code::kInvalidArgument, "C4 trace: too many columns");
      if (col > 0) row[col - 1] = static_cast<uint32_t>(std::stoul(cell));
      ++col;
    }
    if (col != kHosts + 1) return Status(Code::kInvalidArgument, "C4 trace: a short row");
    t.push_back(row);
  }
  if (t.empty()) return Status(Code::kInvalidArgument, "C4 trace: empty");
  return t;
}

struct RunResult {
  uint32_t failures = 0;
  uint32_t claimed = 0;
  uint32_t released = 0;
};

// Runs `trace` with the hosts' stocks on a fresh device of `capacity`
// slices (its own id, so earlier runs' slices do not count).
Result<RunResult> RunTrace(BenchHost* hosts, const Trace& trace, uint32_t capacity,
                           const std::string& dir, int run) {
  const std::string id = "bench-c4-" + std::to_string(run);
  const std::string path = dir + "/" + id + ".img";
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    if (!f) return Status(Code::kIo, "cannot create " + path);
  }
  if (::truncate(path.c_str(), static_cast<off_t>(cluster::SharedDevice::kHeaderBytes +
                                                  capacity * kSlice)) != 0) {
    return Status::FromErrno(errno, "truncate " + path);
  }
  auto dev = cluster::SharedDevice::Open(path, id);
  if (!dev.ok()) return dev.status();
  auto rec = hosts[0].registry->EnsureDevice(id, cluster::DeviceRecord{capacity * kSlice, kSlice});
  if (!rec.ok()) return rec.status();
  FakeClock clock;
  cluster::StockOptions so;
  so.claim_ahead = 1;
  so.idle_release =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::nanoseconds(2 * kStepNs));
  std::vector<std::unique_ptr<cluster::SliceStock>> stocks;
  for (int h = 0; h < kHosts; ++h) {
    stocks.push_back(std::make_unique<cluster::SliceStock>(hosts[h].registry.get(), dev->get(),
                                                           *rec, hosts[h].name, so, &clock));
  }
  RunResult res;
  auto reconcile = [&](int h) -> Result<uint32_t> {
    auto v = hosts[h].registry->Read();
    if (!v.ok()) return v.status();
    auto step = stocks[h]->Reconcile(*v, hosts[h].epoch);
    if (!step.ok()) return step.status();
    res.claimed += step->claimed;
    res.released += step->released;
    return step->claimed;
  };
  std::array<std::vector<uint32_t>, kHosts> used;
  for (int h = 0; h < kHosts; ++h) {
    if (auto c = reconcile(h); !c.ok()) return c.status();
  }
  for (const auto& demand : trace) {
    for (int h = 0; h < kHosts; ++h) {
      while (used[h].size() > demand[h]) {
        stocks[h]->Return(used[h].back());
        used[h].pop_back();
      }
    }
    for (int h = 0; h < kHosts; ++h) {
      while (used[h].size() < demand[h]) {
        auto g = stocks[h]->Take();
        if (g.ok()) {
          used[h].push_back(g->index);
          continue;
        }
        if (g.status().code() != Code::kResourceExhausted) return g.status();
        auto claimed = reconcile(h);
        if (!claimed.ok()) return claimed.status();
        if (*claimed == 0) {  // nothing claimable on the device: the allocation fails
          ++res.failures;
          break;
        }
      }
    }
    clock.AdvanceNs(kStepNs);
    for (int h = 0; h < kHosts; ++h) {
      if (auto c = reconcile(h); !c.ok()) return c.status();
    }
  }
  for (int h = 0; h < kHosts; ++h) {
    for (uint32_t i : used[h]) stocks[h]->Return(i);
    stocks[h]->ReleaseUnused(hosts[h].epoch);
  }
  ::unlink(path.c_str());
  return res;
}

}  // namespace

void RunC4(const Options& o, Report* r) {
  const char* metric = "shared capacity for the trace at zero failed allocations";
  auto full = ParseTrace(kC4DemandCsv);
  if (!full.ok()) return r->Skip("C4", metric, full.status().ToString());
  Trace trace;
  for (size_t i = 0; i < full->size(); i += o.quick ? 4 : 1) trace.push_back((*full)[i]);
  uint32_t static_need = 0, peak_sum = 0;
  for (int h = 0; h < kHosts; ++h) {
    uint32_t peak = 0;
    for (const auto& row : trace) peak = std::max(peak, row[h]);
    static_need += peak;
  }
  for (const auto& row : trace) peak_sum = std::max(peak_sum, row[0] + row[1] + row[2] + row[3]);

  auto e = testsupport::EtcdCluster::Start({});
  if (!e.ok()) return r->Skip("C4", metric, "etcd: " + e.status().ToString());
  const cluster::Keys keys("/bench/c4");
  BenchHost hosts[kHosts];
  for (int i = 0; i < kHosts; ++i) {
    if (Status s = JoinBenchHost(**e, keys, i, &hosts[i]); !s.ok())
      return r->Skip("C4", metric, s.ToString());
  }
  // The smallest capacity without a failed allocation, between the peak of
  // the summed demand (nothing can do with less) and static + claim-ahead.
  int run = 0;
  uint32_t lo = peak_sum, hi = static_need + kHosts;
  std::string error;
  RunResult at_hi;
  auto feasible = [&](uint32_t c, RunResult* out) -> bool {
    auto res = RunTrace(hosts, trace, c, (*e)->dir(), run++);
    if (!res.ok()) {
      error = res.status().ToString();
      return false;
    }
    if (out != nullptr) *out = *res;
    return res->failures == 0;
  };
  if (!feasible(hi, &at_hi)) {
    for (auto& h : hosts) h.session->Leave();
    return r->Skip("C4", metric,
                   error.empty() ? "fails even with static + claim-ahead capacity" : error);
  }
  RunResult best = at_hi;
  while (lo < hi && error.empty()) {
    const uint32_t mid = lo + (hi - lo) / 2;
    RunResult res;
    if (feasible(mid, &res)) {
      hi = mid;
      best = res;
    } else {
      lo = mid + 1;
    }
  }
  for (auto& h : hosts) h.session->Leave();
  if (!error.empty()) return r->Skip("C4", metric, error);
  const std::string note =
      std::to_string(trace.size()) + " steps of tools/bench/traces/c4_demand.csv" +
      (o.quick ? " (every 4th)" : "") + ", 4 hosts, claim ahead 1, idle give-back after 2 steps; " +
      std::to_string(run) +
      " runs of the binary search; at the minimum: " + std::to_string(best.claimed) + " claims, " +
      std::to_string(best.released) +
      " give-backs; baseline: static partitions, the sum of each host's peak";
  r->Add(MeasuredRow("C4", metric, hi, static_need, "slices", "le", 0.9, note));
  r->Add(MeasuredRow("C4", "peak of the summed demand (no policy can need less)", peak_sum,
                     static_need, "slices", "", 0, "the trace's floor"));
}

}  // namespace cxlpool::bench
