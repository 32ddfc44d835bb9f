// The translation unit on its own: requests decoded into core values (and
// refused with the texts clients see), answers encoded as frames.
#include "handler/translate.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "cxlpool/proto/codec.h"
#include "handler/translate_tiering.h"

namespace cxlpool {
namespace {

template <typename M>
Request RequestOf(const M& msg) {
  Request r;
  r.type = wire::TypeOf<M>();
  r.payload = *wire::Encode(msg);
  return r;
}

UniqueFd Memfd() {
  return UniqueFd(static_cast<int>(::syscall(SYS_memfd_create, "translate-test", MFD_CLOEXEC)));
}

TEST(TranslateTest, GarbageIsRefusedWithTheMessageName) {
  Request r;
  r.type = proto::MSG_POOLS_REQUEST;
  r.payload = std::string("\xff\xff\xff", 3);
  Status st = DecodeEmpty(r);
  EXPECT_EQ(st.code(), Code::kProtocol);
  EXPECT_EQ(st.message().rfind(wire::MsgTypeName(proto::MSG_POOLS_REQUEST) + ": ", 0), 0u)
      << st.message();
}

TEST(TranslateTest, AllocKeepsANegativeNodeForTheCheck) {
  proto::AllocRequest in;
  in.set_size_bytes(4096);
  in.set_numa_node(-2);
  in.add_tier_preference("cxl");
  AllocParams p;
  ASSERT_TRUE(DecodeAlloc(RequestOf(in), &p).ok());
  EXPECT_EQ(p.size_bytes, 4096u);
  EXPECT_EQ(p.tiers, std::vector<std::string>{"cxl"});
  Status st = CheckAllocParams(p);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_EQ(st.message(), "numa_node -2 is negative");
  p.numa_node.reset();
  EXPECT_TRUE(CheckAllocParams(p).ok());
}

TEST(TranslateTest, QuotaRules) {
  QuotaSpec q;
  q.scope = "uid";
  q.subject = "1000";
  q.tier = "cxl";
  q.priority = 7;
  auto rule = ToQuotaRule(q);
  ASSERT_TRUE(rule.ok()) << rule.status().ToString();
  EXPECT_EQ(rule->scope, QuotaScope::kUid);
  EXPECT_EQ(rule->id, 1000u);
  EXPECT_EQ(rule->priority, 7);
  q.scope = "user";
  EXPECT_EQ(ToQuotaRule(q).status().message(), "quota scope 'user' (want uid, gid or cgroup)");
  q.scope = "gid";
  q.tier = "flash";
  EXPECT_EQ(ToQuotaRule(q).status().message(), "unknown tier 'flash'");
  q.tier = "";
  q.priority = kMaxPriority + 1;
  EXPECT_EQ(ToQuotaRule(q).status().code(), Code::kInvalidArgument);
}

TEST(TranslateTest, ReclaimPairsFdsWithExtentsInOrder) {
  proto::ReclaimRequest in;
  proto::LeaseInfo* a = in.add_leases();
  a->set_id(1);
  a->set_size_bytes(8192);
  a->add_extents()->set_size_bytes(4096);
  a->add_extents()->set_size_bytes(4096);
  proto::LeaseInfo* b = in.add_leases();
  b->set_id(2);
  b->set_size_bytes(4096);
  b->set_owner_uid(1000);
  Request r = RequestOf(in);
  for (int i = 0; i < 3; ++i) r.fds.push_back(Memfd());
  std::vector<LeaseManager::ReclaimItem> items;
  ASSERT_TRUE(DecodeReclaim(r, &items).ok());
  ASSERT_EQ(items.size(), 2u);
  EXPECT_EQ(items[0].fds.size(), 2u);
  EXPECT_EQ(items[0].extent_sizes, (std::vector<uint64_t>{4096, 4096}));
  EXPECT_EQ(items[1].fds.size(), 1u);
  EXPECT_EQ(items[1].owner_uid, std::optional<uid_t>(1000));
  for (const auto& item : items) {
    for (const auto& fd : item.fds) EXPECT_TRUE(fd.valid());
  }
}

TEST(TranslateTest, ReclaimRefusesAFrameThatDoesNotAddUp) {
  proto::ReclaimRequest in;
  proto::LeaseInfo* a = in.add_leases();
  a->set_id(5);
  a->set_size_bytes(8192);
  a->add_extents()->set_size_bytes(4096);
  std::vector<LeaseManager::ReclaimItem> items;
  Status st = DecodeReclaim(RequestOf(in), &items);
  EXPECT_EQ(st.message(),
            "RECLAIM_REQUEST: lease 5's extents add up to 4096 bytes, not its size 8192");
  a->mutable_extents(0)->set_size_bytes(8192);
  st = DecodeReclaim(RequestOf(in), &items);
  EXPECT_EQ(st.message(),
            "RECLAIM_REQUEST lists 1 leases of 1 extents but carries 0 fds; send one fd per "
            "extent of each lease, in order");
  EXPECT_TRUE(items.empty());
}

TEST(TranslateTest, StatsLaterKeysOverride) {
  StatsAnswer a;
  a.gauges = {{"dumpable", 1}, {"dumpable", 0}};
  a.counters = {{"grants", 3}};
  Reply r = EncodeStatsReply(a);
  ASSERT_EQ(r.type, proto::MSG_STATS_REPLY);
  proto::StatsReply out;
  ASSERT_TRUE(wire::Decode(r.payload, &out).ok());
  EXPECT_EQ(out.gauges().at("dumpable"), 0u);
  EXPECT_EQ(out.counters().at("grants"), 3u);
}

TEST(TranslateTest, SignalsWithAnUnknownHintAreRefusedByIndex) {
  proto::TieringSignalsRequest in;
  in.add_signals()->set_lease_id(1);
  proto::RangeSignal* s = in.add_signals();
  s->set_lease_id(2);
  s->set_hint(static_cast<proto::TieringHint>(99));
  SignalBatch batch;
  ASSERT_TRUE(DecodeSignals(RequestOf(in), 4096, &batch).ok());
  EXPECT_EQ(batch.total, 2u);
  ASSERT_EQ(batch.good.size(), 1u);
  EXPECT_EQ(batch.index, std::vector<size_t>{0});
  ASSERT_EQ(batch.bad.size(), 1u);
  EXPECT_EQ(batch.bad[0].first, 1u);
  proto::TieringSignalsReply out;
  ASSERT_TRUE(wire::Decode(EncodeSignalsReply(batch).payload, &out).ok());
  EXPECT_EQ(out.accepted(), 1u);
  ASSERT_EQ(out.rejected_size(), 1);
  EXPECT_EQ(out.rejected(0).index(), 1u);
  SignalBatch over;
  Status st = DecodeSignals(RequestOf(in), 1, &over);
  EXPECT_EQ(st.message(), "TIERING_SIGNALS_REQUEST carries 2 signals; at most 1 per frame");
}

}  // namespace
}  // namespace cxlpool
