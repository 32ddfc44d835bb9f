// What one scrape of /metrics (or `cxlpoolctl stats --metrics`) costs the
// event loop: the registry rendered to Prometheus text, with the daemon's
// own families and a realistic number of pools that have granted.
#include <benchmark/benchmark.h>

#include <string>

#include "handler/daemon_metrics.h"

namespace {

// `pools` pools, each with cold and warm grants on record (so both grant
// series and their latency histograms exist, as after a day of service).
void Fill(cxlpool::DaemonMetrics* m, int pools) {
  for (int p = 0; p < pools; ++p) {
    for (bool warm : {false, true}) {
      cxlpool::LeaseSnapshot l;
      l.pool = "node" + std::to_string(p);
      l.kind = p % 2 == 0 ? "dram" : "cxl";
      l.memory_tier = p % 2 == 0 ? 4 : 22;
      l.from_warm_stock = warm;
      m->OnGranted(l, warm ? 40'000 : 2'000'000);
    }
  }
}

void BM_RenderRegistry(benchmark::State& state) {
  cxlpool::DaemonMetrics m;
  Fill(&m, static_cast<int>(state.range(0)));
  size_t bytes = 0;
  for (auto _ : state) {
    std::string text = m.registry().Render();
    bytes = text.size();
    benchmark::DoNotOptimize(text);
  }
  state.counters["bytes"] = static_cast<double>(bytes);
}
BENCHMARK(BM_RenderRegistry)->Arg(1)->Arg(4)->Arg(16);

// Re-publishing the six pool gauges of `pools` pools, as every scrape does:
// a refresh that updates the children in place, against clearing the
// families and setting them again (what DaemonMetrics did before).
void RepublishPoolGauges(benchmark::State& state, bool refresh) {
  static constexpr const char* kGauges[] = {"a_bytes", "b_bytes", "c_bytes",
                                            "d_bytes", "e_bytes", "f_bytes"};
  cxlpool::MetricsRegistry r;
  for (const char* g : kGauges) r.AddGauge(g, "Gauge.");
  const int pools = static_cast<int>(state.range(0));
  double value = 0;
  for (auto _ : state) {
    for (const char* g : kGauges) {
      if (refresh) {
        r.BeginGaugeRefresh(g);
      } else {
        r.ClearGauge(g);
      }
    }
    for (int p = 0; p < pools; ++p) {
      cxlpool::Labels l{{"pool", "node" + std::to_string(p)}, {"kind", "dram"}, {"tier", "4"}};
      for (const char* g : kGauges) r.Set(g, l, value);
    }
    if (refresh) {
      for (const char* g : kGauges) r.EndGaugeRefresh(g);
    }
    value += 1;
  }
}
void BM_RepublishPoolGauges_Refresh(benchmark::State& state) { RepublishPoolGauges(state, true); }
void BM_RepublishPoolGauges_ClearAndSet(benchmark::State& state) {
  RepublishPoolGauges(state, false);
}
BENCHMARK(BM_RepublishPoolGauges_Refresh)->Arg(4)->Arg(16);
BENCHMARK(BM_RepublishPoolGauges_ClearAndSet)->Arg(4)->Arg(16);

}  // namespace
