// The limits as metrics: every limit is exported by its key, timeouts in
// seconds, and a timeout that is off ("0") is +Inf like every other
// unlimited value; the hit counters follow ServerStats.
#include "handler/limit_metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>

namespace cxlpool {
namespace {

TEST(LimitMetricsTest, TimeoutsAreSecondsAndOffIsInfinite) {
  ServerLimits l;
  l.idle_timeout = std::chrono::milliseconds(0);
  l.send_timeout = std::chrono::milliseconds(1500);
  l.hello_timeout = std::chrono::milliseconds(30000);
  MetricsRegistry reg;
  ServerStats stats;
  stats.limit_hits["max_connections_per_uid"] = 7;
  ExportLimitMetrics(stats, l, &reg);

  EXPECT_TRUE(std::isinf(reg.Value("cxlpool_limit", {{"limit", "idle_timeout"}})));
  EXPECT_DOUBLE_EQ(reg.Value("cxlpool_limit", {{"limit", "send_timeout"}}), 1.5);
  EXPECT_DOUBLE_EQ(reg.Value("cxlpool_limit", {{"limit", "hello_timeout"}}), 30.0);
  EXPECT_DOUBLE_EQ(reg.Value("cxlpool_limit", {{"limit", "max_fds_per_frame"}}),
                   static_cast<double>(l.max_fds_per_frame));
  EXPECT_DOUBLE_EQ(reg.Value("cxlpool_limit_hits_total", {{"limit", "max_connections_per_uid"}}),
                   7.0);
  EXPECT_DOUBLE_EQ(reg.Value("cxlpool_limit_hits_total", {{"limit", "max_fds"}}), 0.0);

  const std::string text = reg.Render();
  EXPECT_NE(text.find("cxlpool_limit{limit=\"idle_timeout\"} +Inf"), std::string::npos) << text;
  EXPECT_EQ(text.find("cxlpool_limit{limit=\"send_timeout\"} +Inf"), std::string::npos) << text;
}

TEST(LimitMetricsTest, EveryLimitHasOneValue) {
  const auto values = LimitValues(ServerLimits{});
  std::set<std::string> names;
  for (const auto& [name, v] : values) {
    EXPECT_TRUE(names.insert(name).second) << name << " twice";
    EXPECT_FALSE(std::isnan(v)) << name;
  }
  EXPECT_TRUE(names.count("send_timeout"));
  EXPECT_TRUE(names.count("max_connections"));
}

}  // namespace
}  // namespace cxlpool
