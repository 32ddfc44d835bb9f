// DaemonMetrics through the handler (no sockets): grants by pool and source
// with their latency (a clock that steps 3 ms per read makes it exact),
// refusals by reason, reclaims by cause, the warm reserve, quota usage, pool
// gauges, the doctor's dumpable/memlock gauges in STATS and in the text, a
// registry that lives across scrapes, and promtool on the whole text.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>

#include "cxlpool/proto/codec.h"
#include "handler/daemon_handler.h"
#include "test_util.h"

namespace cxlpool {
namespace {

using testing::Harness;
using testing::TestConfig;
using testing::TwoSocketCxl;

constexpr uint64_t kMiB = 1ull << 20;

// Every read is 3 ms after the previous one.
class StepClock final : public Clock {
 public:
  int64_t MonotonicNs() const override { return now_ += 3'000'000; }
  int64_t WallSeconds() const override { return 1'700'000'000; }

 private:
  mutable std::atomic<int64_t> now_{0};
};

DaemonConfig Config() {
  DaemonConfig c = TestConfig(2 * kMiB);  // a warm reserve of one 2 MiB extent per pool
  c.quotas.push_back(testing::UidQuota(1000, 1 * kMiB, "cxl"));
  return c;
}

class DaemonMetricsTest : public ::testing::Test {
 protected:
  DaemonMetricsTest() : h_(TwoSocketCxl(), Config()) {
    HandlerOptions o;
    o.instance_id = "test";
    o.topology_is_local = false;
    o.clock = &clock_;
    handler_ = std::make_unique<DaemonHandler>(h_.mgr.get(), &proc_, o);
    h_.mgr->StartRefills();
    h_.Drain();
    PeerInfo p;
    p.pid = 200;
    p.uid = 1000;
    p.gid = 1000;
    handler_->OnConnect(1, p);
  }
  template <typename M>
  Reply Call(const M& msg) {
    Request r;
    r.type = wire::TypeOf<M>();
    r.request_id = 1;
    r.payload = *wire::Encode(msg);
    std::optional<Reply> out;
    handler_->OnRequest(1, std::move(r), [&](Reply x) { out = std::move(x); });
    h_.Drain();
    CXLPOOL_CHECK(out.has_value());
    return std::move(*out);
  }
  proto::LeaseInfo Alloc(uint64_t size, int node, const std::string& tier = "") {
    proto::AllocRequest a;
    a.set_size_bytes(size);
    a.set_numa_node(node);
    if (!tier.empty()) a.add_tier_preference(tier);
    a.set_strict(true);
    Reply r = Call(a);
    proto::AllocReply out;
    if (r.type == proto::MSG_ALLOC_REPLY) {
      EXPECT_TRUE(wire::Decode(r.payload, &out).ok());
    }
    return out.lease();
  }
  static bool Has(const std::string& text, const std::string& line) {
    return text.find(line + "\n") != std::string::npos;
  }

  StepClock clock_;
  FakeFileSystem proc_;
  Harness h_;
  std::unique_ptr<DaemonHandler> handler_;
};

TEST_F(DaemonMetricsTest, GrantsRefusalsReclaimsAndGauges) {
  proto::LeaseInfo warm = Alloc(2 * kMiB, 0);  // the reserve's extent
  ASSERT_TRUE(warm.from_warm_stock());
  proto::LeaseInfo cold = Alloc(3 * kMiB, 0);  // the refilled extent and 1 MiB built
  ASSERT_NE(cold.id(), 0u);
  ASSERT_FALSE(cold.from_warm_stock());
  EXPECT_EQ(Alloc(2 * kMiB, 2, "cxl").id(), 0u);  // quota (1 MiB on cxl)
  EXPECT_EQ(Alloc(0, 0).id(), 0u);                // invalid
  EXPECT_EQ(Alloc(kMiB, 9).id(), 0u);             // no node 9
  proto::ReleaseRequest rel;
  rel.set_lease_id(cold.id());
  ASSERT_EQ(Call(rel).type, proto::MSG_RELEASE_REPLY);

  std::string text = handler_->MetricsText();
  EXPECT_TRUE(Has(text, R"(cxlpool_grants_total{kind="dram",pool="node0",source="warm"} 1)"))
      << text;
  EXPECT_TRUE(Has(text, R"(cxlpool_grants_total{kind="dram",pool="node0",source="cold"} 1)"));
  // One step of the clock: 3 ms, in the 5 ms bucket and not the 2.5 ms one.
  EXPECT_TRUE(Has(
      text, R"(cxlpool_grant_latency_seconds_bucket{pool="node0",source="cold",le="0.0025"} 0)"));
  EXPECT_TRUE(Has(
      text, R"(cxlpool_grant_latency_seconds_bucket{pool="node0",source="cold",le="0.005"} 1)"));
  EXPECT_TRUE(Has(text, R"(cxlpool_grant_latency_seconds_sum{pool="node0",source="cold"} 0.003)"));
  EXPECT_TRUE(Has(text, R"(cxlpool_grant_latency_seconds_count{pool="node0",source="warm"} 1)"));
  EXPECT_TRUE(Has(text, R"(cxlpool_refusals_total{reason="quota"} 1)"));
  EXPECT_TRUE(Has(text, R"(cxlpool_refusals_total{reason="invalid"} 1)"));
  EXPECT_TRUE(Has(text, R"(cxlpool_refusals_total{reason="not_found"} 1)"));
  EXPECT_TRUE(Has(text, R"(cxlpool_refusals_total{reason="priority"} 0)"));
  EXPECT_TRUE(Has(text, R"(cxlpool_reclaims_total{cause="release"} 1)"));
  EXPECT_TRUE(Has(text, R"(cxlpool_reclaims_total{cause="disconnect"} 0)"));
  EXPECT_TRUE(Has(text, "cxlpool_warm_hits_total 1"));
  EXPECT_TRUE(Has(text, "cxlpool_warm_misses_total 1"));
  EXPECT_TRUE(Has(text, "cxlpool_warm_builds_total 6"))
      << "4 pools + a refill after each grant that took from the reserve";
  EXPECT_TRUE(Has(text, "cxlpool_warm_build_failures_total 0"));
  EXPECT_TRUE(Has(text, "cxlpool_leases 1"));
  EXPECT_TRUE(
      Has(text, R"(cxlpool_pool_leased_bytes{kind="dram",pool="node0",tier="unknown"} 2097152)"));
  EXPECT_TRUE(Has(text, R"(cxlpool_reserve_bytes{pool="node0",state="ready"} 2097152)"));
  EXPECT_TRUE(Has(text, R"(cxlpool_reserve_below_low_seconds{pool="node0"} 0)"));
  EXPECT_EQ(text.find("cxlpool_pool_warm_bytes"), std::string::npos) << "removed with warm stock";
  EXPECT_TRUE(
      Has(text, R"(cxlpool_pool_capacity_bytes{kind="cxl",pool="node2",tier="unknown"} 67108864)"));
  EXPECT_TRUE(
      Has(text, R"(cxlpool_quota_max_bytes{scope="uid",subject="1000",tier="cxl"} 1048576)"));
  EXPECT_TRUE(Has(text, R"(cxlpool_quota_used_bytes{scope="uid",subject="1000",tier="cxl"} 0)"));
  ProcessFacts facts = ReadProcessFacts();
  EXPECT_TRUE(Has(text, "cxlpool_dumpable " + std::to_string(facts.dumpable ? 1 : 0)));
  EXPECT_NE(text.find("# TYPE cxlpool_memlock_limit_bytes gauge\n"), std::string::npos);

  // Disconnect reclaims the warm lease; the registry keeps what it counted.
  handler_->OnDisconnect(1);
  text = handler_->MetricsText();
  EXPECT_TRUE(Has(text, R"(cxlpool_reclaims_total{cause="disconnect"} 1)"));
  EXPECT_TRUE(Has(text, R"(cxlpool_grants_total{kind="dram",pool="node0",source="cold"} 1)"));
  EXPECT_TRUE(Has(text, "cxlpool_leases 0"));
  // Its memory is reclaimed on a worker: counted until then, free after.
  EXPECT_TRUE(Has(
      text, R"(cxlpool_pool_reclaiming_bytes{kind="dram",pool="node0",tier="unknown"} 2097152)"))
      << text;
  EXPECT_TRUE(Has(text, "cxlpool_pending_reclaims 1"));
  h_.Drain();
  text = handler_->MetricsText();
  EXPECT_TRUE(
      Has(text, R"(cxlpool_pool_reclaiming_bytes{kind="dram",pool="node0",tier="unknown"} 0)"));
  EXPECT_TRUE(Has(text, "cxlpool_pending_reclaims 0"));
  EXPECT_TRUE(Has(text, "cxlpool_waiting_allocs 0"));
  EXPECT_EQ(handler_->metrics().registry().HistogramCount("cxlpool_grant_latency_seconds",
                                                          {{"pool", "node0"}, {"source", "cold"}}),
            1u);
}

TEST_F(DaemonMetricsTest, StatsCarryTheDoctorsGauges) {
  Reply r = Call(proto::StatsRequest());
  ASSERT_EQ(r.type, proto::MSG_STATS_REPLY);
  proto::StatsReply s;
  ASSERT_TRUE(wire::Decode(r.payload, &s).ok());
  ProcessFacts facts = ReadProcessFacts();
  ASSERT_TRUE(s.gauges().count("dumpable"));
  ASSERT_TRUE(s.gauges().count("memlock_limit_bytes"));
  EXPECT_EQ(s.gauges().at("dumpable"), facts.dumpable ? 1u : 0u);
  EXPECT_EQ(s.gauges().at("memlock_limit_bytes"), facts.memlock_limit_bytes);
  EXPECT_GT(facts.memlock_limit_bytes, 0u);
  // Over the wire too.
  Reply m = Call(proto::MetricsRequest());
  ASSERT_EQ(m.type, proto::MSG_METRICS_REPLY);
  proto::MetricsReply text;
  ASSERT_TRUE(wire::Decode(m.payload, &text).ok());
  EXPECT_NE(text.text().find("cxlpool_memlock_limit_bytes "), std::string::npos);
}

TEST_F(DaemonMetricsTest, PromtoolAcceptsTheDaemonsText) {
  if (std::system("command -v promtool >/dev/null 2>&1") != 0) GTEST_SKIP() << "no promtool";
  Alloc(2 * kMiB, 0);
  Alloc(3 * kMiB, 1);
  Alloc(2 * kMiB, 2, "cxl");
  std::string path = "/tmp/cxlpool-dmetrics-" + std::to_string(getpid()) + ".prom";
  std::ofstream(path) << handler_->MetricsText();
  int rc = std::system(("promtool check metrics < " + path + " 2>&1").c_str());
  std::remove(path.c_str());
  ASSERT_TRUE(WIFEXITED(rc));
  EXPECT_EQ(WEXITSTATUS(rc), 0);
}

TEST(DaemonMetricsReserveTest, ReserveBytesByStateAndWatermarks) {
  DaemonConfig c = TestConfig();
  c.pool_defaults.reserve_low = CapacitySpec{false, 0, 2 * kMiB};
  c.pool_defaults.reserve_high = CapacitySpec{false, 0, 4 * kMiB};
  Harness h(TwoSocketCxl(), c);
  StepClock clock;
  FakeFileSystem proc;
  HandlerOptions o;
  o.instance_id = "test";
  o.topology_is_local = false;
  o.clock = &clock;
  DaemonHandler handler(h.mgr.get(), &proc, o);
  h.mgr->StartRefills();
  h.Drain();
  std::string text = handler.MetricsText();
  auto has = [&](const std::string& line) { return text.find(line + "\n") != std::string::npos; };
  EXPECT_TRUE(has(R"(cxlpool_reserve_bytes{pool="node0",state="ready"} 4194304)")) << text;
  EXPECT_TRUE(has(R"(cxlpool_reserve_bytes{pool="node0",state="building"} 0)"));
  EXPECT_TRUE(has(R"(cxlpool_reserve_bytes{pool="node0",state="retiring"} 0)"));
  EXPECT_TRUE(has(R"(cxlpool_reserve_watermark_bytes{mark="low",pool="node0"} 2097152)"));
  EXPECT_TRUE(has(R"(cxlpool_reserve_watermark_bytes{mark="high",pool="node0"} 4194304)"));
}

}  // namespace
}  // namespace cxlpool
