// Tenant policy without a daemon: cgroup path rules and matching, cgroup
// quotas covering descendants (not siblings), priority classes and the pool
// reserve they must leave, persistence of live changes (round trip, deletes
// of config rules, garbled and unwritable store files), the config keys, and
// the lease manager refusing low classes first when a pool is short.
#include "lease/quota.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "config/config.h"
#include "test_util.h"

namespace cxlpool {
namespace {

using testing::Harness;
using testing::TestConfig;
using testing::TwoSocketCxl;

constexpr uint64_t kMiB = 1ull << 20;

QuotaRule Cgroup(const std::string& path, uint64_t max_bytes, int32_t priority = 0,
                 const std::string& tier = "") {
  QuotaRule r;
  r.scope = QuotaScope::kCgroup;
  r.subject = path;
  r.tier = tier;
  r.max_bytes = max_bytes;
  r.priority = priority;
  return r;
}

QuotaRule Uid(uint32_t uid, uint64_t max_bytes, uint64_t max_leases = 0, int32_t priority = 0) {
  QuotaRule r;
  r.scope = QuotaScope::kUid;
  r.id = uid;
  r.subject = std::to_string(uid);
  r.max_bytes = max_bytes;
  r.max_leases = max_leases;
  r.priority = priority;
  return r;
}

Tenant T(uid_t uid, const std::string& cgroup = "", gid_t gid = 100) {
  return Tenant{uid, gid, cgroup};
}

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/cxlpool-tenants-XXXXXX";
    CXLPOOL_CHECK(::mkdtemp(tmpl) != nullptr);
    path_ = tmpl;
  }
  ~TempDir() { (void)!std::system(("rm -rf '" + path_ + "'").c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(CgroupPathTest, NormalizesAndRejects) {
  EXPECT_EQ(*NormalizeCgroupPath("/system.slice//x.service/"), "/system.slice/x.service");
  EXPECT_EQ(*NormalizeCgroupPath("/"), "/");
  EXPECT_EQ(*NormalizeCgroupPath("///"), "/");
  EXPECT_EQ(NormalizeCgroupPath("system.slice").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(NormalizeCgroupPath("").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(NormalizeCgroupPath("/a/../b").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(NormalizeCgroupPath("/a/./b").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(NormalizeCgroupPath(std::string("/a\nb")).status().code(), Code::kInvalidArgument);
}

TEST(CgroupPathTest, CoversSelfAndDescendantsOnly) {
  EXPECT_TRUE(CgroupCovers("/a", "/a"));
  EXPECT_TRUE(CgroupCovers("/a", "/a/b/c"));
  EXPECT_FALSE(CgroupCovers("/a", "/ab"));
  EXPECT_FALSE(CgroupCovers("/a/b", "/a"));
  EXPECT_TRUE(CgroupCovers("/", "/anything"));
  EXPECT_FALSE(CgroupCovers("/", ""));  // unknown cgroup: no cgroup rule applies
}

TEST(QuotaTableTest, CgroupRuleCoversDescendantsNotSiblings) {
  QuotaTable q({Cgroup("/kubepods/pod1", 8 * kMiB)});
  Tenant a = T(1000, "/kubepods/pod1/ctr-a");
  Tenant b = T(1001, "/kubepods/pod1/ctr-b");
  Tenant sibling = T(1000, "/kubepods/pod10");
  ASSERT_TRUE(q.Check(a, "dram", 6 * kMiB).ok());
  q.Charge(a, "dram", 6 * kMiB);
  // A different container (and uid) in the same pod shares the pod's limit.
  Status st = q.Check(b, "cxl", 4 * kMiB);
  ASSERT_EQ(st.code(), Code::kResourceExhausted);
  EXPECT_NE(st.message().find("quota exceeded: cgroup /kubepods/pod1 (all tiers) max_bytes 8.0 "
                              "MiB, used 6.0 MiB, requested 4.0 MiB"),
            std::string::npos)
      << st.message();
  EXPECT_TRUE(q.Check(b, "cxl", 2 * kMiB).ok());
  // "/kubepods/pod10" is not below "/kubepods/pod1".
  EXPECT_TRUE(q.Check(sibling, "dram", 64 * kMiB).ok());
  EXPECT_EQ(q.Usage(QuotaScope::kCgroup, "/kubepods/pod1", "").first, 6 * kMiB);
  EXPECT_EQ(q.Usage(QuotaScope::kCgroup, "/kubepods", "dram").first, 6 * kMiB);
  q.Uncharge(a, "dram", 6 * kMiB);
  EXPECT_EQ(q.Usage(QuotaScope::kCgroup, "/kubepods/pod1", "").first, 0u);
  EXPECT_TRUE(q.Check(b, "cxl", 8 * kMiB).ok());
  // A rule added later sees the usage charged before it existed.
  q.Charge(a, "dram", 3 * kMiB);
  ASSERT_TRUE(q.SetLiveRule(Cgroup("/kubepods", 4 * kMiB, 0, "dram")).ok());
  EXPECT_EQ(q.Check(sibling, "dram", 2 * kMiB).code(), Code::kResourceExhausted);
  EXPECT_TRUE(q.Check(sibling, "cxl", 2 * kMiB).ok());
}

TEST(QuotaTableTest, PriorityIsTheHighestApplyingRule) {
  QuotaRule gid_rule;
  gid_rule.scope = QuotaScope::kGid;
  gid_rule.id = 200;
  gid_rule.subject = "200";
  gid_rule.priority = 3;
  QuotaTable q({Uid(1000, 0, 0, 1), gid_rule, Cgroup("/prod.slice", 0, 7)});
  EXPECT_EQ(q.PriorityOf(T(1000)), 1);
  EXPECT_EQ(q.PriorityOf(T(1000, "", 200)), 3);
  EXPECT_EQ(q.PriorityOf(T(5, "/prod.slice/svc.service")), 7);
  EXPECT_EQ(q.PriorityOf(T(5, "/dev.slice/svc.service")), 0);
  // A priority-only rule is a rule (listed), limits 0 = unlimited.
  EXPECT_EQ(q.Rules().size(), 3u);
}

TEST(QuotaTableTest, ReserveIsMonotoneAcrossClasses) {
  QuotaTable q;
  CapacitySpec twenty{true, 20, 0};
  CapacitySpec eight{false, 0, 8 * kMiB};
  CapacitySpec fifty{true, 50, 0};
  q.SetReserves({{0, twenty}, {2, eight}, {5, CapacitySpec{false, 0, 0}}});
  EXPECT_EQ(q.ReserveFor(0, 100 * kMiB), 20 * kMiB);
  EXPECT_EQ(q.ReserveFor(1, 100 * kMiB), 8 * kMiB);
  EXPECT_EQ(q.ReserveFor(2, 100 * kMiB), 8 * kMiB);
  EXPECT_EQ(q.ReserveFor(3, 100 * kMiB), 0u);
  // A class never leaves less than a class above it.
  q.SetReserves({{0, eight}, {4, fifty}});
  EXPECT_EQ(q.ReserveFor(0, 100 * kMiB), 50 * kMiB);
  EXPECT_EQ(q.ReserveFor(5, 100 * kMiB), 0u);
}

TEST(QuotaTableTest, CheckReserveNamesClassReserveAndRoom) {
  QuotaTable q({Uid(2000, 0, 0, 5)});
  q.SetReserves({{0, CapacitySpec{true, 25, 0}}});
  // 64 MiB pool, 40 MiB committed: 24 MiB uncommitted, class 0 keeps 16 MiB.
  EXPECT_TRUE(q.CheckReserve(T(1000), "node0", 64 * kMiB, 40 * kMiB, 8 * kMiB).ok());
  Status st = q.CheckReserve(T(1000), "node0", 64 * kMiB, 40 * kMiB, 9 * kMiB);
  ASSERT_EQ(st.code(), Code::kResourceExhausted);
  EXPECT_NE(st.message().find("priority: node0 keeps 16.0 MiB free for classes above 0"),
            std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("24.0 MiB uncommitted, requested 9.0 MiB"), std::string::npos);
  // Class 5 may use all of it.
  EXPECT_TRUE(q.CheckReserve(T(2000), "node0", 64 * kMiB, 40 * kMiB, 24 * kMiB).ok());
}

TEST(QuotaStoreTest, LiveRulesRoundTripAndWinOverConfig) {
  TempDir dir;
  std::string path = dir.path() + "/state/quotas.toml";  // parent created on write
  {
    QuotaTable q({Uid(1000, 4 * kMiB), Uid(1001, 4 * kMiB)});
    ASSERT_TRUE(q.OpenStore(path).ok());  // absent: no live rules
    ASSERT_TRUE(q.SetLiveRule(Uid(1000, 16 * kMiB, 3, 2)).ok());
    ASSERT_TRUE(q.SetLiveRule(Cgroup("/a b/\"q\"", 1 * kMiB, 4, "cxl")).ok());
    ASSERT_TRUE(q.SetLiveRule(Uid(1001, 0)).ok());  // deletes a config rule
    EXPECT_EQ(q.Rules().size(), 2u);
  }
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_NE(::access((path + ".tmp").c_str(), F_OK), 0) << "no temp file left behind";
  // A restart: same config, the store re-applied.
  QuotaTable q({Uid(1000, 4 * kMiB), Uid(1001, 4 * kMiB)});
  ASSERT_TRUE(q.OpenStore(path).ok());
  auto rules = q.Rules();
  ASSERT_EQ(rules.size(), 2u);
  bool saw_uid = false, saw_cg = false;
  for (const auto& u : rules) {
    if (u.rule.scope == QuotaScope::kUid) {
      saw_uid = true;
      EXPECT_EQ(u.rule.id, 1000u);
      EXPECT_EQ(u.rule.max_bytes, 16 * kMiB);
      EXPECT_EQ(u.rule.max_leases, 3u);
      EXPECT_EQ(u.rule.priority, 2);
    } else {
      saw_cg = true;
      EXPECT_EQ(u.rule.scope, QuotaScope::kCgroup);
      EXPECT_EQ(u.rule.subject, "/a b/\"q\"");
      EXPECT_EQ(u.rule.tier, "cxl");
      EXPECT_EQ(u.rule.priority, 4);
    }
  }
  EXPECT_TRUE(saw_uid && saw_cg);
  EXPECT_EQ(q.PriorityOf(T(1000)), 2);
  EXPECT_TRUE(q.Check(T(1001), "dram", 64 * kMiB).ok()) << "deleted rule stays deleted";
  // A config reload keeps the live changes on top.
  q.SetConfigRules({Uid(1000, 1 * kMiB), Uid(1002, 1 * kMiB)});
  EXPECT_EQ(q.Rules().size(), 3u);
  EXPECT_TRUE(q.Check(T(1000), "dram", 8 * kMiB).ok());
  EXPECT_FALSE(q.Check(T(1002), "dram", 8 * kMiB).ok());
}

TEST(QuotaStoreTest, GarbledStoreIsAnErrorNamingTheFile) {
  TempDir dir;
  std::string path = dir.path() + "/quotas.toml";
  for (const char* text : {"[[quota]\nuid = 1", "[[quota]]\nuid = 1\nmax_bytes = \"lots\"\n",
                           "[daemon]\nsocket = \"/x\"\n", "[[quota]]\ncgroup = \"rel\"\n"}) {
    std::ofstream(path) << text;
    QuotaTable q({Uid(1000, kMiB)});
    Status st = q.OpenStore(path);
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << text;
    EXPECT_NE(st.message().find(path), std::string::npos) << st.message();
    EXPECT_EQ(q.Rules().size(), 1u) << "config rules untouched";
  }
}

TEST(QuotaStoreTest, WriteFailureChangesNothing) {
  TempDir dir;
  std::string path = dir.path() + "/quotas.toml";
  ASSERT_EQ(::mkdir((path + ".tmp").c_str(), 0700), 0);  // the temp file cannot be created
  QuotaTable q;
  ASSERT_TRUE(q.OpenStore(path).ok());
  Status st = q.SetLiveRule(Uid(1000, kMiB));
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("quotas.toml.tmp"), std::string::npos) << st.message();
  EXPECT_TRUE(q.Rules().empty());
  EXPECT_EQ(q.SetLiveRule(Uid(1000, kMiB, 0, kMaxPriority + 1)).code(), Code::kInvalidArgument);
}

TEST(TenantConfigTest, ParsesCgroupPriorityReserveAndMetrics) {
  auto cfg = ParseConfig(R"(
[daemon]
state_dir = "/var/lib/x"
[[quota]]
cgroup = "/system.slice//infer.service/"
tier = "cxl"
max_bytes = "1G"
priority = 7
[[quota]]
cgroup = "/system.slice/other.service"
max_leases = 3
[priorities]
reserve = { 0 = "20%", 3 = "1G" }
[metrics]
http_listen = "127.0.0.1:9464"
)");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  ASSERT_EQ(cfg->quotas.size(), 2u);
  EXPECT_EQ(cfg->quotas[0].scope, QuotaScope::kCgroup);
  EXPECT_EQ(cfg->quotas[0].subject, "/system.slice/infer.service");
  EXPECT_EQ(cfg->quotas[0].priority, 7);
  EXPECT_EQ(cfg->state_dir, "/var/lib/x");
  ASSERT_EQ(cfg->priority_reserves.size(), 2u);
  EXPECT_TRUE(cfg->priority_reserves.at(0).is_percent);
  EXPECT_EQ(cfg->priority_reserves.at(3).bytes, 1ull << 30);
  EXPECT_EQ(cfg->metrics_http_listen, "127.0.0.1:9464");

  struct Bad {
    const char* text;
    const char* key;
  } bad[] = {
      {"[[quota]]\ncgroup = \"x\"\n", "quota[0].cgroup"},
      {"[[quota]]\ncgroup = \"/a\"\nuid = 1\n", "quota[0]: needs exactly one"},
      {"[[quota]]\nuid = 1\npriority = 1001\n", "quota[0].priority"},
      {"[[quota]]\ncgroup = \"/a\"\n[[quota]]\ncgroup = \"/a/\"\n", "quota[1]: duplicate"},
      {"[priorities]\nreserve = { x = \"1G\" }\n", "priorities.reserve.x"},
      {"[priorities]\nreserve = { 0 = \"120%\" }\n", "priorities.reserve.0"},
      {"[priorities]\nreserves = 1\n", "priorities.reserves: unknown key"},
      {"[metrics]\nhttp_listen = \"0.0.0.0:9464\"\n", "metrics.http_listen"},
      {"[metrics]\nhttp_listen = \"10.1.2.3:9464\"\n", "only served on loopback"},
      {"[metrics]\nhttp_listen = \"127.0.0.1\"\n", "metrics.http_listen"},
      {"[metrics]\nhttp_listen = \"127.0.0.1:0\"\n", "port must be 1..65535"},
      {"[daemon]\nstate_dir = \"rel\"\n", "daemon.state_dir"},
  };
  for (const auto& b : bad) {
    auto c = ParseConfig(b.text, "t.toml");
    ASSERT_FALSE(c.ok()) << b.text;
    EXPECT_EQ(c.status().code(), Code::kInvalidArgument);
    EXPECT_NE(c.status().message().find(b.key), std::string::npos) << c.status().message();
  }
  auto ep = ParseLoopbackEndpoint("[::1]:9000");
  ASSERT_TRUE(ep.ok());
  EXPECT_EQ(ep->address, "::1");
  EXPECT_EQ(ParseLoopbackEndpoint("localhost:1")->address, "127.0.0.1");
  EXPECT_EQ(DefaultStateDir(0, nullptr, nullptr), "/var/lib/cxlpool");
  EXPECT_EQ(DefaultStateDir(1000, "/x", "/home/u"), "/x/cxlpool");
  EXPECT_EQ(DefaultStateDir(1000, nullptr, "/home/u"), "/home/u/.local/state/cxlpool");
}

// The lease manager under pressure: class 0 is refused (reason "priority")
// while a higher class is still served from the same pool.
TEST(PriorityTest, LowClassRefusedFirstWhenPoolIsShort) {
  DaemonConfig cfg = TestConfig();
  cfg.quotas.push_back(Uid(2000, 0, 0, 5));
  cfg.priority_reserves[0] = CapacitySpec{true, 25, 0};  // 16 MiB of each 64 MiB pool
  Harness h(TwoSocketCxl(64 * kMiB), cfg);
  h.mgr->mutable_quotas()->SetReserves(cfg.priority_reserves);
  h.Connect(1, 1000, 1000);  // class 0
  h.Connect(2, 2000, 2000);  // class 5
  AllocParams p;
  p.numa_node = 0;
  p.strict = true;
  p.size_bytes = 40 * kMiB;
  ASSERT_TRUE(h.Alloc(1, p).ok());  // 24 MiB left, above the reserve
  p.size_bytes = 16 * kMiB;
  auto low = h.Alloc(1, p);  // would leave 8 MiB < 16 MiB
  ASSERT_FALSE(low.ok());
  EXPECT_EQ(low.status().code(), Code::kResourceExhausted);
  EXPECT_NE(low.status().message().find("keeps 16.0 MiB free for classes above 0"),
            std::string::npos)
      << low.status().message();
  auto high = h.Alloc(2, p);
  ASSERT_TRUE(high.ok()) << high.status().ToString();
  EXPECT_EQ(high->lease.numa_node, 0);
  EXPECT_EQ(h.mgr->Counters()["refusals_priority"], 1u);
  // Not strict: the low class falls back to a pool with room above its reserve.
  p.strict = false;
  auto fallback = h.Alloc(1, p);
  ASSERT_TRUE(fallback.ok()) << fallback.status().ToString();
  EXPECT_NE(fallback->lease.numa_node, 0);
}

TEST(PriorityTest, CgroupQuotaThroughTheLeaseManager) {
  DaemonConfig cfg = TestConfig();
  cfg.quotas.push_back(Cgroup("/tenants/a", 4 * kMiB));
  Harness h(TwoSocketCxl(), cfg);
  CallerInfo in_a;
  in_a.pid = 10;
  in_a.uid = 1000;
  in_a.gid = 1000;
  in_a.cgroup = "/tenants/a/job1";
  CallerInfo in_b = in_a;
  in_b.uid = 1001;
  in_b.cgroup = "/tenants/b";
  h.mgr->Connect(1, in_a);
  h.mgr->Connect(2, in_b);
  ASSERT_TRUE(h.Alloc(1, 3 * kMiB).ok());
  auto r = h.Alloc(1, 2 * kMiB);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("cgroup /tenants/a (all tiers) max_bytes 4.0 MiB"),
            std::string::npos)
      << r.status().message();
  EXPECT_EQ(h.mgr->Counters()["refusals_quota"], 1u);
  EXPECT_TRUE(h.Alloc(2, 8 * kMiB).ok());
  h.mgr->Disconnect(1);
  EXPECT_EQ(h.mgr->mutable_quotas()->Usage(QuotaScope::kCgroup, "/tenants/a", "").first, 0u);
  h.mgr->Disconnect(2);
}

}  // namespace
}  // namespace cxlpool
