#include "metrics.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

namespace cxlpool {
namespace {

MetricsRegistry Sample() {
  MetricsRegistry r;
  r.AddCounter("cxlpool_grants_total", "Leases granted.");
  r.AddCounter("cxlpool_refusals_total", "Requests refused, by reason.");
  r.AddGauge("cxlpool_pool_leased_bytes", "Bytes leased per pool.");
  r.AddHistogram("cxlpool_grant_latency_seconds", "Grant latency.",
                 MetricsRegistry::LatencyBuckets());
  r.Increment("cxlpool_grants_total", {{"pool", "node0"}});
  r.Increment("cxlpool_grants_total", {{"pool", "node0"}});
  r.Increment("cxlpool_refusals_total", {{"reason", "quota \"bytes\"\n"}});
  r.Set("cxlpool_pool_leased_bytes", {{"pool", "node0"}, {"kind", "dram"}}, 2097152);
  r.Observe("cxlpool_grant_latency_seconds", {{"source", "warm"}}, 0.00003);
  r.Observe("cxlpool_grant_latency_seconds", {{"source", "warm"}}, 0.2);
  return r;
}

TEST(MetricsTest, RendersExposition) {
  std::string text = Sample().Render();
  EXPECT_NE(text.find("# TYPE cxlpool_grants_total counter\n"), std::string::npos);
  EXPECT_NE(text.find("cxlpool_grants_total{pool=\"node0\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("cxlpool_pool_leased_bytes{kind=\"dram\",pool=\"node0\"} 2097152\n"),
            std::string::npos);
  EXPECT_NE(text.find("reason=\"quota \\\"bytes\\\"\\n\""), std::string::npos);
  EXPECT_NE(text.find("cxlpool_grant_latency_seconds_bucket{source=\"warm\",le=\"5e-05\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("cxlpool_grant_latency_seconds_bucket{source=\"warm\",le=\"+Inf\"} 2\n"),
            std::string::npos);
  EXPECT_NE(text.find("cxlpool_grant_latency_seconds_count{source=\"warm\"} 2\n"),
            std::string::npos);
}

// The whole text, byte for byte, for families without labels (a histogram
// whose bucket lines carry only le), with one label, and with a HELP that
// needs escaping.
TEST(MetricsTest, RendersExactText) {
  MetricsRegistry r;
  r.AddHistogram("b_seconds", "Two\nlines \\ \"q\".", {0.5, 2});
  r.AddCounter("a_total", "Plain.");
  r.AddGauge("c_bytes", "Gauge.");
  r.Observe("b_seconds", 1.25);
  r.Increment("a_total", {}, 3);
  r.Set("c_bytes", {{"pool", "x\\y"}}, 0.125);
  EXPECT_EQ(r.Render(),
            "# HELP a_total Plain.\n"
            "# TYPE a_total counter\n"
            "a_total 3\n"
            "# HELP b_seconds Two\\nlines \\\\ \"q\".\n"
            "# TYPE b_seconds histogram\n"
            "b_seconds_bucket{le=\"0.5\"} 0\n"
            "b_seconds_bucket{le=\"2\"} 1\n"
            "b_seconds_bucket{le=\"+Inf\"} 1\n"
            "b_seconds_sum 1.25\n"
            "b_seconds_count 1\n"
            "# HELP c_bytes Gauge.\n"
            "# TYPE c_bytes gauge\n"
            "c_bytes{pool=\"x\\\\y\"} 0.125\n");
}

TEST(MetricsTest, ValuesAndClear) {
  MetricsRegistry r = Sample();
  EXPECT_EQ(r.Value("cxlpool_grants_total", {{"pool", "node0"}}), 2);
  EXPECT_EQ(r.HistogramCount("cxlpool_grant_latency_seconds", {{"source", "warm"}}), 2u);
  r.ClearGauge("cxlpool_pool_leased_bytes");
  EXPECT_EQ(r.Render().find("cxlpool_pool_leased_bytes{"), std::string::npos);
}

// A refresh keeps the children set again (updated in place), drops the
// ones not set, and leaves other gauge families alone.
TEST(MetricsTest, GaugeRefreshDropsOnlyTheChildrenNotSetAgain) {
  MetricsRegistry r;
  r.AddGauge("g_bytes", "G.");
  r.AddGauge("h_bytes", "H.");
  r.Set("g_bytes", {{"pool", "a"}}, 1);
  r.Set("g_bytes", {{"pool", "b"}}, 2);
  r.Set("h_bytes", {{"pool", "a"}}, 3);
  r.BeginGaugeRefresh("g_bytes");
  r.Set("g_bytes", {{"pool", "b"}}, 20);
  r.Set("g_bytes", {{"pool", "c"}}, 30);
  r.EndGaugeRefresh("g_bytes");
  EXPECT_EQ(r.Render(),
            "# HELP g_bytes G.\n"
            "# TYPE g_bytes gauge\n"
            "g_bytes{pool=\"b\"} 20\n"
            "g_bytes{pool=\"c\"} 30\n"
            "# HELP h_bytes H.\n"
            "# TYPE h_bytes gauge\n"
            "h_bytes{pool=\"a\"} 3\n");
  r.BeginGaugeRefresh("g_bytes");  // nothing live any more
  r.EndGaugeRefresh("g_bytes");
  EXPECT_EQ(r.Render().find("g_bytes{"), std::string::npos);
}

// Whole numbers print without a point or exponent up to 1e15; the rest
// with nine significant digits, as %.9g.
TEST(MetricsTest, ValueFormatting) {
  MetricsRegistry r;
  r.AddGauge("v", "V.");
  const std::pair<double, const char*> cases[] = {
      {0, "0"},
      {-3, "-3"},
      {123456789012345, "123456789012345"},
      {1e15, "1e+15"},
      {18446744073709551615.0, "1.84467441e+19"},
      {0.1, "0.1"},
      {1.0 / 3, "0.333333333"},
      {2.5e-5, "2.5e-05"},
      {-1.5, "-1.5"},
  };
  for (const auto& [value, text] : cases) {
    r.Set("v", value);
    EXPECT_EQ(r.Render(), std::string("# HELP v V.\n# TYPE v gauge\nv ") + text + "\n") << value;
  }
}

// Cells kept by a hot path update the same children as the label-based
// calls, stay valid as other children are added, and survive a move of the
// registry (the daemon's metrics object is built, then moved into place).
TEST(MetricsTest, CellsUpdateTheirChild) {
  MetricsRegistry r = Sample();
  MetricsRegistry::Cell grants = r.CounterCell("cxlpool_grants_total", {{"pool", "node0"}});
  MetricsRegistry::Cell latency =
      r.HistogramCell("cxlpool_grant_latency_seconds", {{"source", "cold"}});
  for (int i = 0; i < 50; ++i) {  // more children: a node-based map keeps the cells valid
    r.Increment("cxlpool_grants_total", {{"pool", "node" + std::to_string(i + 1)}});
  }
  grants.Increment();
  grants.Increment(2);
  latency.Observe(0.00003);
  MetricsRegistry moved = std::move(r);
  latency.Observe(20.0);
  EXPECT_EQ(moved.Value("cxlpool_grants_total", {{"pool", "node0"}}), 5);
  EXPECT_EQ(moved.HistogramCount("cxlpool_grant_latency_seconds", {{"source", "cold"}}), 2u);
  std::string text = moved.Render();
  EXPECT_NE(text.find("cxlpool_grant_latency_seconds_bucket{source=\"cold\",le=\"5e-05\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("cxlpool_grant_latency_seconds_bucket{source=\"cold\",le=\"+Inf\"} 2\n"),
            std::string::npos);
  // A default cell ignores updates.
  MetricsRegistry::Cell none;
  none.Increment();
  none.Observe(1.0);
}

TEST(MetricsDeathTest, MisuseCrashesWithMessage) {
  MetricsRegistry r;
  EXPECT_DEATH(r.AddCounter("bad name", "x"), "check failed");
  r.AddCounter("c_total", "x");
  EXPECT_DEATH(r.Set("c_total", {}, 1), "check failed");
  EXPECT_DEATH(r.HistogramCell("c_total", {}), "check failed");
  EXPECT_DEATH(r.CounterCell("c_total", {{"bad label", "x"}}), "check failed");
  EXPECT_DEATH(r.CounterCell("c_total", {}).Increment(-1), "check failed");
}

// promtool (Debian package prometheus) is the reference linter.
TEST(MetricsTest, PromtoolAcceptsIt) {
  if (std::system("command -v promtool >/dev/null 2>&1") != 0) GTEST_SKIP() << "no promtool";
  std::string path = "/tmp/cxlpool-metrics-" + std::to_string(getpid()) + ".prom";
  std::ofstream(path) << Sample().Render();
  int rc = std::system(("promtool check metrics < " + path + " 2>&1").c_str());
  std::remove(path.c_str());
  ASSERT_TRUE(WIFEXITED(rc));
  EXPECT_EQ(WEXITSTATUS(rc), 0);
}

}  // namespace
}  // namespace cxlpool
