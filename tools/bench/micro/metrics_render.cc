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

}  // namespace
