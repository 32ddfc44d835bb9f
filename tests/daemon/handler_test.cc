// DaemonHandler driven directly (no sockets): hello negotiation, alloc with
// the fd on the reply, garbage payloads, admin-only operations, revoke
// pushes a LeaseEvent to the holders, and OnDisconnect releases.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include "cxlpool/proto/codec.h"
#include "handler/daemon_handler.h"
#include "test_util.h"

namespace cxlpool {
namespace {

using testing::Harness;
using testing::TwoSocketCxl;

class HandlerTest : public ::testing::Test {
 protected:
  HandlerTest() : h_(TwoSocketCxl()) {
    HandlerOptions o;
    o.admin_gid = 4242;
    o.instance_id = "test";
    o.topology_is_local = false;
    handler_ = std::make_unique<DaemonHandler>(h_.mgr.get(), &proc_, o);
    handler_->SetPush([this](ConnectionId c, Reply r) {
      pushed_.emplace_back(c, std::move(r));
      return Status::Ok();
    });
    proc_.AddFile("/proc/300/status", "Name:\tx\nGroups:\t10 4242 \n");
  }
  void Connect(ConnectionId c, pid_t pid, uid_t uid) {
    PeerInfo p;
    p.pid = pid;
    p.uid = uid;
    p.gid = uid;
    p.comm = "t";
    handler_->OnConnect(c, p);
  }
  template <typename M>
  Reply Call(ConnectionId c, const M& msg) {
    Request r;
    r.type = wire::TypeOf<M>();
    r.request_id = 7;
    r.payload = *wire::Encode(msg);
    return CallRaw(c, std::move(r));
  }
  Reply CallRaw(ConnectionId c, Request r) {
    std::optional<Reply> out;
    handler_->OnRequest(c, std::move(r), [&](Reply x) { out = std::move(x); });
    h_.Drain();
    CXLPOOL_CHECK(out.has_value());
    return std::move(*out);
  }
  static Status ErrorOf(const Reply& r) {
    EXPECT_EQ(r.type, proto::MSG_ERROR_REPLY);
    proto::ErrorReply e;
    EXPECT_TRUE(wire::Decode(r.payload, &e).ok());
    return wire::FromErrorReply(e);
  }

  FakeFileSystem proc_;
  Harness h_;
  std::unique_ptr<DaemonHandler> handler_;
  std::vector<std::pair<ConnectionId, Reply>> pushed_;
};

TEST_F(HandlerTest, HelloNegotiatesAndReportsAdmin) {
  Connect(1, 200, 1000);
  Connect(2, 300, 1000);  // member of the admin group by supplementary gid
  proto::HelloRequest hello;
  hello.set_min_version(1);
  hello.set_max_version(5);
  Reply r = Call(1, hello);
  ASSERT_EQ(r.type, proto::MSG_HELLO_REPLY);
  proto::HelloReply out;
  ASSERT_TRUE(wire::Decode(r.payload, &out).ok());
  EXPECT_EQ(out.version(), wire::kMaxWireVersion);
  EXPECT_FALSE(out.is_admin());
  ASSERT_TRUE(wire::Decode(Call(2, hello).payload, &out).ok());
  EXPECT_TRUE(out.is_admin());
  hello.set_min_version(wire::kMaxWireVersion + 1);
  EXPECT_EQ(ErrorOf(Call(1, hello)).code(), Code::kProtocol);
}

TEST_F(HandlerTest, AllocCarriesTheFdAndLeaseInfo) {
  Connect(1, 200, 1000);
  proto::AllocRequest a;
  a.set_size_bytes(3 << 20);
  a.set_gpu("1");
  a.set_label("kv");
  Reply r = Call(1, a);
  ASSERT_EQ(r.type, proto::MSG_ALLOC_REPLY) << ErrorOf(r).ToString();
  ASSERT_EQ(r.fds.size(), 1u);
  struct stat st;
  ASSERT_EQ(fstat(r.fds[0], &st), 0);
  EXPECT_EQ(st.st_size, 3 << 20);
  proto::AllocReply out;
  ASSERT_TRUE(wire::Decode(r.payload, &out).ok());
  EXPECT_EQ(out.lease().numa_node(), 1);
  EXPECT_EQ(out.lease().kind(), "dram");
  EXPECT_EQ(out.lease().label(), "kv");
  EXPECT_EQ(out.lease().pool(), "node1");
  EXPECT_NE(out.lease().placement_reason().find("GPU 1"), std::string::npos);
  handler_->OnDisconnect(1);
  EXPECT_EQ(h_.mgr->Gauges()["leased_bytes"], 0u);
}

TEST_F(HandlerTest, BadInputGetsCodedErrors) {
  Connect(1, 200, 1000);
  Request garbage;
  garbage.type = proto::MSG_ALLOC_REQUEST;
  garbage.payload = "\xff\xff\xff\xff garbage";
  EXPECT_EQ(ErrorOf(CallRaw(1, std::move(garbage))).code(), Code::kProtocol);
  proto::AllocRequest a;
  EXPECT_EQ(ErrorOf(Call(1, a)).code(), Code::kInvalidArgument);  // size 0
  a.set_size_bytes(1 << 20);
  a.set_gpu("GPU-nope");
  EXPECT_EQ(ErrorOf(Call(1, a)).code(), Code::kNotFound);
  a.clear_gpu();
  a.set_numa_node(-3);
  EXPECT_EQ(ErrorOf(Call(1, a)).code(), Code::kInvalidArgument);
  a.set_numa_node(17);
  EXPECT_EQ(ErrorOf(Call(1, a)).code(), Code::kNotFound);
  a.clear_numa_node();
  a.set_size_bytes(1ull << 50);
  EXPECT_EQ(ErrorOf(Call(1, a)).code(), Code::kResourceExhausted);
  Request reply_type;
  reply_type.type = proto::MSG_ALLOC_REPLY;
  EXPECT_EQ(ErrorOf(CallRaw(1, std::move(reply_type))).code(), Code::kInvalidArgument);
  Status st = ErrorOf(Call(1, proto::RevokeRequest()));
  EXPECT_EQ(st.code(), Code::kPermissionDenied);
  EXPECT_FALSE(st.message().empty());
}

TEST_F(HandlerTest, AttachNamesTheOwnerAndTheReplySaysWhoOwnsIt) {
  Connect(1, 200, 1000);
  Connect(2, 201, 2000);
  proto::AllocRequest a;
  a.set_size_bytes(1 << 20);
  a.set_name("w");
  a.add_acl_uids(2000);
  ASSERT_EQ(Call(1, a).type, proto::MSG_ALLOC_REPLY);
  proto::AttachRequest at;
  at.set_name("w");
  // Without an owner: uid 2000's own namespace, which has no "w".
  Status none = ErrorOf(Call(2, at));
  EXPECT_EQ(none.code(), Code::kNotFound);
  at.set_owner_uid(1000);
  Reply r = Call(2, at);
  ASSERT_EQ(r.type, proto::MSG_ATTACH_REPLY);
  ASSERT_EQ(r.fds.size(), 1u);
  proto::AttachReply out;
  ASSERT_TRUE(wire::Decode(r.payload, &out).ok());
  EXPECT_EQ(out.lease().owner_uid(), 1000u);
  EXPECT_EQ(out.lease().name(), "w");
  // STAT of another tenant's lease: NOT_FOUND, as for no lease at all.
  Connect(3, 202, 3000);
  proto::StatRequest st;
  st.set_lease_id(out.lease().id());
  Status hidden = ErrorOf(Call(3, st));
  st.set_lease_id(out.lease().id() + 999);
  Status missing = ErrorOf(Call(3, st));
  EXPECT_EQ(hidden.code(), Code::kNotFound);
  EXPECT_EQ(missing.code(), Code::kNotFound);
  handler_->OnDisconnect(1);
  handler_->OnDisconnect(2);
}

TEST_F(HandlerTest, OtherTenantsQuotasAndUsageAreForAdmins) {
  for (uint32_t uid : {1000u, 2000u}) {
    QuotaRule q;
    q.scope = QuotaScope::kUid;
    q.id = uid;
    q.subject = std::to_string(uid);
    q.max_bytes = 64ull << 20;
    ASSERT_TRUE(h_.mgr->mutable_quotas()->SetLiveRule(q).ok());
  }
  Connect(1, 200, 1000);
  Connect(9, 201, 0);
  proto::QuotasReply mine, all;
  ASSERT_TRUE(wire::Decode(Call(1, proto::QuotasRequest()).payload, &mine).ok());
  ASSERT_TRUE(wire::Decode(Call(9, proto::QuotasRequest()).payload, &all).ok());
  ASSERT_EQ(mine.quotas_size(), 1);
  EXPECT_EQ(mine.quotas(0).subject(), "1000");
  EXPECT_EQ(all.quotas_size(), 2);
  proto::MetricsReply tenant, admin;
  ASSERT_TRUE(wire::Decode(Call(1, proto::MetricsRequest()).payload, &tenant).ok());
  ASSERT_TRUE(wire::Decode(Call(9, proto::MetricsRequest()).payload, &admin).ok());
  EXPECT_EQ(tenant.text().find("cxlpool_quota_max_bytes{"), std::string::npos);
  EXPECT_NE(tenant.text().find("cxlpool_pool_capacity_bytes{"), std::string::npos)
      << "aggregate families stay open";
  EXPECT_NE(admin.text().find("cxlpool_quota_max_bytes{scope=\"uid\",subject=\"2000\""),
            std::string::npos);
}

TEST_F(HandlerTest, RevokePushesLeaseEventToHolders) {
  Connect(1, 200, 1000);
  Connect(9, 201, 0);
  proto::AllocRequest a;
  a.set_size_bytes(1 << 20);
  proto::AllocReply out;
  ASSERT_TRUE(wire::Decode(Call(1, a).payload, &out).ok());
  proto::RevokeRequest rv;
  rv.set_lease_id(out.lease().id());
  EXPECT_EQ(Call(9, rv).type, proto::MSG_REVOKE_REPLY);
  ASSERT_EQ(pushed_.size(), 1u);
  EXPECT_EQ(pushed_[0].first, 1u);
  ASSERT_EQ(pushed_[0].second.type, proto::MSG_LEASE_EVENT);
  proto::LeaseEvent ev;
  ASSERT_TRUE(wire::Decode(pushed_[0].second.payload, &ev).ok());
  EXPECT_EQ(ev.lease_id(), out.lease().id());
  EXPECT_EQ(ev.event(), "revoked");
  proto::ReleaseRequest rel;
  rel.set_lease_id(out.lease().id());
  EXPECT_EQ(ErrorOf(Call(1, rel)).code(), Code::kRevoked);
}

// On a local topology an unplaced request goes near the CPU the caller last
// ran on (/proc/<pid>/stat field 39); a request naming a node goes there.
TEST_F(HandlerTest, UnplacedAllocGoesToTheCallersNode) {
  HandlerOptions o;
  o.instance_id = "local";
  o.topology_is_local = true;
  DaemonHandler local(h_.mgr.get(), &proc_, o);
  std::string stat = "600 (t x) S";
  for (int field = 4; field <= 38; ++field) stat += " 0";
  stat += " 3 0 0\n";  // field 39: cpu 3, on node 1
  proc_.AddFile("/proc/600/stat", stat);
  PeerInfo p;
  p.pid = 600;
  p.uid = 1000;
  p.gid = 1000;
  p.comm = "t";
  local.OnConnect(9, p);
  auto call = [&](const proto::AllocRequest& a) {
    Request r;
    r.type = wire::TypeOf<proto::AllocRequest>();
    r.request_id = 3;
    r.payload = *wire::Encode(a);
    std::optional<Reply> out;
    local.OnRequest(9, std::move(r), [&](Reply x) { out = std::move(x); });
    h_.Drain();
    CXLPOOL_CHECK(out.has_value());
    proto::AllocReply rep;
    EXPECT_EQ(out->type, proto::MSG_ALLOC_REPLY);
    EXPECT_TRUE(wire::Decode(out->payload, &rep).ok());
    return rep.lease();
  };
  proto::AllocRequest a;
  a.set_size_bytes(1 << 20);
  auto near = call(a);
  EXPECT_EQ(near.numa_node(), 1);
  EXPECT_NE(near.placement_reason().find("caller's NUMA node 1"), std::string::npos)
      << near.placement_reason();
  a.set_numa_node(0);
  EXPECT_EQ(call(a).numa_node(), 0);
  local.OnDisconnect(9);
  h_.Drain();
}

TEST_F(HandlerTest, PoolsStatsMetricsAndTopology) {
  Connect(1, 200, 1000);
  proto::PoolsReply pools;
  ASSERT_TRUE(wire::Decode(Call(1, proto::PoolsRequest()).payload, &pools).ok());
  ASSERT_EQ(pools.pools_size(), 4);
  EXPECT_EQ(pools.pools(2).kind(), "cxl");
  proto::TopologyReply topo;
  ASSERT_TRUE(wire::Decode(Call(1, proto::TopologyRequest()).payload, &topo).ok());
  EXPECT_NE(topo.json().find("\"numa_nodes\""), std::string::npos);
  proto::MetricsReply m;
  ASSERT_TRUE(wire::Decode(Call(1, proto::MetricsRequest()).payload, &m).ok());
  EXPECT_NE(m.text().find("cxlpool_pool_capacity_bytes{"), std::string::npos);
  proto::StatsReply s;
  ASSERT_TRUE(wire::Decode(Call(1, proto::StatsRequest()).payload, &s).ok());
  EXPECT_EQ(s.gauges().at("connections"), 1u);
}

TEST(StatusGroupsTest, Parses) {
  EXPECT_EQ(ParseStatusGroups("Uid:\t1\nGroups:\t4 24 27 \nX: 1\n"),
            (std::vector<gid_t>{4, 24, 27}));
  EXPECT_TRUE(ParseStatusGroups("Groups:\n").empty());
  EXPECT_TRUE(ParseStatusGroups("").empty());
}

}  // namespace
}  // namespace cxlpool
