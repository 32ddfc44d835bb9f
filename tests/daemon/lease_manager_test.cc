// LeaseManager on fake topologies: admission never exceeds capacity, quotas
// refuse with the limit and usage, shared leases are reference counted,
// disconnect releases everything, revoke, warm reserve accounting, devdax.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <boost/asio/thread_pool.hpp>
#include <cstring>

#include "cxlpool/common/page_census.h"
#include "test_util.h"

namespace cxlpool {
namespace {

using testing::FakeDaxControl;
using testing::Harness;
using testing::TestConfig;
using testing::TwoSocketCxl;

constexpr uint64_t kMiB = 1ull << 20;

off_t FdSize(int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0) return -1;
  return st.st_size;
}

// Revokes and runs the loop until the reclaim has answered.
Result<std::vector<ConnId>> RevokeNow(Harness& h, ConnId conn, uint64_t id) {
  std::optional<Result<std::vector<ConnId>>> out;
  h.mgr->Revoke(conn, id, [&](Result<std::vector<ConnId>> r) { out.emplace(std::move(r)); });
  h.Drain();
  CXLPOOL_CHECK(out.has_value());
  return std::move(*out);
}

// Used bytes never exceed any pool's capacity, reclaiming included.
void ExpectNoOvercommit(Harness& h) {
  for (const auto& p : h.mgr->Pools()) {
    EXPECT_EQ(p.capacity_bytes,
              p.leased_bytes + p.reserve_bytes() + p.reclaiming_bytes + p.free_bytes)
        << p.name;
    EXPECT_LE(p.leased_bytes + p.reserve_bytes() + p.reclaiming_bytes, p.capacity_bytes) << p.name;
  }
}

TEST(LeaseManagerTest, AdmissionNeverExceedsCapacity) {
  Harness h(TwoSocketCxl(16 * kMiB));
  h.Connect(1);
  std::vector<uint64_t> ids;
  for (int i = 0; i < 4; ++i) {
    auto g = h.Alloc(1, 4 * kMiB, 0);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    EXPECT_EQ(g->lease.numa_node, 0);
    EXPECT_EQ(FdSize(g->fd()), static_cast<off_t>(4 * kMiB));
    ids.push_back(g->lease.id);
  }
  EXPECT_EQ(h.Pool("node0").free_bytes, 0u);
  // Strict on a full node: refused, naming the pool and its room.
  AllocParams p;
  p.size_bytes = 4 * kMiB;
  p.numa_node = 0;
  p.strict = true;
  auto g = h.Alloc(1, p);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), Code::kResourceExhausted);
  EXPECT_NE(g.status().message().find("node0: 0 B free of 16.0 MiB"), std::string::npos)
      << g.status().message();
  // Not strict: falls back to the nearest node with room (node2, distance 14).
  p.strict = false;
  g = h.Alloc(1, p);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->lease.numa_node, 2);
  EXPECT_NE(g->lease.placement_reason.find("fell back from node0"), std::string::npos)
      << g->lease.placement_reason;
  // Bigger than any pool: refused.
  auto big = h.Alloc(1, 17 * kMiB);
  EXPECT_EQ(big.status().code(), Code::kResourceExhausted);
  // Zero: invalid.
  EXPECT_EQ(h.Alloc(1, 0).status().code(), Code::kInvalidArgument);
  // Release one and the room is back once it is reclaimed.
  ASSERT_TRUE(h.mgr->Release(1, ids[0]).ok());
  h.Drain();
  EXPECT_EQ(h.Pool("node0").free_bytes, 4 * kMiB);
  EXPECT_EQ(h.mgr->Release(1, ids[0]).code(), Code::kNotFound);
}

TEST(LeaseManagerTest, RefusesCleanlyAtTheDaemonsFdAndMapLimits) {
  Harness h(TwoSocketCxl());
  h.Connect(1);
  // 128 fds are reserved for the daemon itself, one per connection.
  h.mgr->SetDaemonLimits({.max_fds = 128 + 1 + 2, .max_maps = UINT64_MAX});
  ASSERT_TRUE(h.Alloc(1, 4096).ok());
  ASSERT_TRUE(h.Alloc(1, 4096).ok());
  auto r = h.Alloc(1, 4096);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kResourceExhausted);
  EXPECT_NE(r.status().message().find("RLIMIT_NOFILE is 131"), std::string::npos)
      << r.status().message();
  h.mgr->SetDaemonLimits({.max_fds = UINT64_MAX, .max_maps = 1024 + 2});
  r = h.Alloc(1, 4096);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("vm.max_map_count"), std::string::npos);
  EXPECT_EQ(h.mgr->Counters().at("refusals_daemon_limit"), 2u);
}

TEST(LeaseManagerTest, SizesRoundToPages) {
  Harness h(TwoSocketCxl());
  h.Connect(1);
  auto g = h.Alloc(1, 5000);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->lease.requested_bytes, 5000u);
  EXPECT_EQ(g->lease.size_bytes, 8192u);
  EXPECT_EQ(h.Pool("node0").leased_bytes, 8192u);
}

TEST(LeaseManagerTest, DisconnectReleasesEverythingAndTruncates) {
  Harness h(TwoSocketCxl());
  h.Connect(1);
  h.Connect(2);
  auto a = h.Alloc(1, 4 * kMiB, 0);
  auto b = h.Alloc(1, 2 * kMiB, 1);
  auto c = h.Alloc(2, 1 * kMiB, 0);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  // A client that leaked the fd: keep a dup of it.
  UniqueFd leaked(::dup(a->fd()));
  h.mgr->Disconnect(1);
  h.Drain();
  EXPECT_EQ(h.Pool("node0").leased_bytes, 1 * kMiB);
  EXPECT_EQ(h.Pool("node1").leased_bytes, 0u);
  EXPECT_EQ(FdSize(leaked.get()), 0) << "reclaim must truncate even a leaked fd";
  EXPECT_EQ(h.mgr->Gauges()["live_leases"], 1u);
  EXPECT_EQ(h.mgr->Counters()["disconnect_reclaims"], 2u);
  h.mgr->Disconnect(2);
  EXPECT_EQ(h.mgr->Gauges()["leased_bytes"], 0u);
  EXPECT_EQ(h.mgr->Gauges()["connections"], 0u);
}

TEST(LeaseManagerTest, QuotasRefuseNamingLimitAndUsage) {
  DaemonConfig cfg = TestConfig();
  cfg.quotas.push_back(testing::UidQuota(1000, 6 * kMiB, "dram"));
  QuotaRule n;
  n.scope = QuotaScope::kGid;
  n.id = 2000;
  n.subject = "2000";
  n.max_leases = 1;
  cfg.quotas.push_back(n);
  Harness h(TwoSocketCxl(), cfg);
  h.Connect(1, 1000, 1000);
  h.Connect(2, 3000, 2000);
  ASSERT_TRUE(h.Alloc(1, 4 * kMiB, 0).ok());
  AllocParams p;
  p.size_bytes = 4 * kMiB;
  p.tiers = {"dram"};
  p.strict = true;
  auto g = h.Alloc(1, p);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), Code::kResourceExhausted);
  EXPECT_NE(
      g.status().message().find(
          "quota exceeded: uid 1000 tier dram max_bytes 6.0 MiB, used 4.0 MiB, requested 4.0 MiB"),
      std::string::npos)
      << g.status().message();
  // The dram quota does not cover CXL: fallback lands there.
  p.strict = false;
  p.tiers = {"dram", "cxl"};
  g = h.Alloc(1, p);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->lease.kind, "cxl");
  // Lease count quota per gid.
  ASSERT_TRUE(h.Alloc(2, kMiB).ok());
  auto r = h.Alloc(2, kMiB);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("gid 2000 (all tiers) max_leases 1, used 1"),
            std::string::npos)
      << r.status().message();
  // Usage is reported and returns to zero.
  bool seen = false;
  for (const auto& u : h.mgr->Quotas()) {
    if (u.rule.scope == QuotaScope::kUid) {
      EXPECT_EQ(u.used_bytes, 4 * kMiB);
      seen = true;
    }
  }
  EXPECT_TRUE(seen);
  h.mgr->Disconnect(1);
  h.mgr->Disconnect(2);
  for (const auto& u : h.mgr->Quotas()) EXPECT_EQ(u.used_bytes, 0u);
}

TEST(LeaseManagerTest, SharedLeaseRefcountsAndAcl) {
  Harness h(TwoSocketCxl());
  h.Connect(1, 1000, 1000);
  h.Connect(2, 1001, 500);   // in ACL by gid
  h.Connect(3, 1002, 1002);  // not in ACL
  AllocParams p;
  p.size_bytes = 2 * kMiB;
  p.name = "weights";
  p.acl_gids = {500};
  auto g = h.Alloc(1, p);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(h.Alloc(1, p).status().code(), Code::kAlreadyExists);
  auto a = h.mgr->Attach(2, "weights", 1000);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->lease.id, g->lease.id);
  EXPECT_EQ(a->lease.owner.uid, 1000u);  // the attach says whose lease it is
  EXPECT_EQ(a->fd(), g->fd());           // the same memfd
  EXPECT_EQ(a->lease.holders, 2u);
  // Not in the ACL and no such name: one answer, word for word.
  auto refused = h.mgr->Attach(3, "weights", 1000);
  auto missing = h.mgr->Attach(3, "nope", 1000);
  EXPECT_EQ(refused.status().code(), Code::kNotFound);
  EXPECT_EQ(missing.status().code(), Code::kNotFound);
  EXPECT_EQ(refused.status().message().find("weights"), missing.status().message().find("nope"));
  EXPECT_EQ(h.mgr->Attach(3, "x", 1000).status().message(),
            h.mgr->Attach(3, "x", 1000).status().message());
  // The creator lets go: still alive for the other holder.
  ASSERT_TRUE(h.mgr->Release(1, g->lease.id).ok());
  EXPECT_EQ(h.Pool("node0").leased_bytes, 2 * kMiB);
  auto s = h.mgr->Stat(2, g->lease.id);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->holders, 1u);
  // The last holder disconnects: freed, name reusable at once.
  h.mgr->Disconnect(2);
  EXPECT_EQ(h.Pool("node0").leased_bytes, 0u);
  EXPECT_TRUE(h.Alloc(1, p).ok());
}

TEST(LeaseManagerTest, RevokeIsAdminOnlyAndReportsHolders) {
  Harness h(TwoSocketCxl());
  h.Connect(1, 1000, 1000);
  h.Connect(9, 0, 0, /*admin=*/true);
  auto g = h.Alloc(1, 2 * kMiB);
  ASSERT_TRUE(g.ok());
  UniqueFd client_copy(::dup(g->fd()));
  EXPECT_EQ(RevokeNow(h, 1, g->lease.id).status().code(), Code::kPermissionDenied);
  auto holders = RevokeNow(h, 9, g->lease.id);
  ASSERT_TRUE(holders.ok());
  EXPECT_EQ(*holders, (std::vector<ConnId>{1}));
  EXPECT_EQ(FdSize(client_copy.get()), 0);
  EXPECT_EQ(h.Pool("node0").leased_bytes, 0u);
  EXPECT_EQ(h.mgr->Release(1, g->lease.id).code(), Code::kRevoked);
  EXPECT_EQ(h.mgr->Stat(1, g->lease.id).status().code(), Code::kRevoked);
  // Someone who never could see it is not told it existed.
  h.Connect(2, 2000, 2000);
  auto hidden = h.mgr->Stat(2, g->lease.id).status();
  EXPECT_EQ(hidden.code(), Code::kNotFound);
  EXPECT_EQ(hidden.message(), "no lease " + std::to_string(g->lease.id));
  EXPECT_EQ(h.mgr->Stat(2, 987654).status().message(), "no lease 987654");
  EXPECT_EQ(h.mgr->Release(2, g->lease.id).code(), Code::kNotFound);
}

TEST(LeaseManagerTest, ListAndStatVisibility) {
  Harness h(TwoSocketCxl());
  h.Connect(1, 1000, 1000);
  h.Connect(2, 1001, 1001);
  h.Connect(9, 0, 0, true);
  auto a = h.Alloc(1, kMiB);
  auto b = h.Alloc(2, kMiB);
  ASSERT_TRUE(a.ok() && b.ok());
  auto own = h.mgr->List(1, false);
  ASSERT_TRUE(own.ok());
  ASSERT_EQ(own->size(), 1u);
  EXPECT_EQ((*own)[0].id, a->lease.id);
  EXPECT_EQ(h.mgr->List(1, true).status().code(), Code::kPermissionDenied);
  auto all = h.mgr->List(9, true);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 2u);
  // Another tenant's lease and no lease at all: the same code and text.
  const uint64_t none = b->lease.id + 1000;
  auto text = [](const Status& st, uint64_t id) {
    std::string t = st.ToString();
    auto at = t.find(std::to_string(id));
    return at == std::string::npos ? t : t.replace(at, std::to_string(id).size(), "N");
  };
  EXPECT_EQ(h.mgr->Stat(1, b->lease.id).status().code(), Code::kNotFound);
  EXPECT_EQ(text(h.mgr->Stat(1, b->lease.id).status(), b->lease.id),
            text(h.mgr->Stat(1, none).status(), none));
  EXPECT_TRUE(h.mgr->Stat(9, b->lease.id).ok());
  EXPECT_EQ(h.mgr->Release(1, b->lease.id).code(), Code::kNotFound);
  EXPECT_EQ(text(h.mgr->Release(1, b->lease.id), b->lease.id), text(h.mgr->Release(1, none), none));
  EXPECT_TRUE(h.mgr->Stat(2, b->lease.id).ok());
}

TEST(LeaseManagerTest, NamesLiveInTheirOwnersNamespace) {
  Harness h(TwoSocketCxl());
  h.Connect(1, 1000, 1000);  // the victim
  h.Connect(2, 2000, 2000);  // a squatter
  AllocParams p;
  p.size_bytes = kMiB;
  p.name = "model-weights";
  // The squatter takes the name first, with an ACL naming its victim.
  AllocParams squat = p;
  squat.acl_uids = {1000};
  auto s = h.Alloc(2, squat);
  ASSERT_TRUE(s.ok());
  // The victim's create is not refused: its own namespace is empty.
  auto v = h.Alloc(1, p);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_NE(v->lease.id, s->lease.id);
  // Its attach finds its own lease, never the squatter's.
  auto mine = h.mgr->Attach(1, "model-weights");
  ASSERT_TRUE(mine.ok());
  EXPECT_EQ(mine->lease.id, v->lease.id);
  EXPECT_EQ(mine->lease.owner.uid, 1000u);
  // Naming the other owner reaches the other lease (the ACL allows it).
  auto theirs = h.mgr->Attach(1, "model-weights", 2000);
  ASSERT_TRUE(theirs.ok());
  EXPECT_EQ(theirs->lease.id, s->lease.id);
  EXPECT_EQ(theirs->lease.owner.uid, 2000u);
  // A second create in one's own namespace is refused, naming only that.
  auto again = h.Alloc(1, p);
  EXPECT_EQ(again.status().code(), Code::kAlreadyExists);
  EXPECT_NE(again.status().message().find("uid 1000"), std::string::npos);
  // The squatter cannot reach the victim's lease by name.
  EXPECT_EQ(h.mgr->Attach(2, "model-weights", 1000).status().code(), Code::kNotFound);
}

TEST(LeaseManagerTest, QuotasOfOtherTenantsAreForAdmins) {
  DaemonConfig cfg = TestConfig();
  cfg.quotas.push_back(testing::UidQuota(1000, 64 * kMiB));
  cfg.quotas.push_back(testing::UidQuota(2000, 64 * kMiB));
  QuotaRule g;
  g.scope = QuotaScope::kGid;
  g.id = 1000;
  g.subject = "1000";
  g.max_bytes = 128 * kMiB;
  cfg.quotas.push_back(g);
  Harness h(TwoSocketCxl(), cfg);
  h.Connect(1, 1000, 1000);
  h.Connect(2, 2000, 2000);
  h.Connect(9, 0, 0, true);
  EXPECT_EQ(h.mgr->QuotasVisibleTo(9).size(), 3u);
  auto mine = h.mgr->QuotasVisibleTo(1);
  ASSERT_EQ(mine.size(), 2u);  // its uid rule and its group's
  for (const auto& q : mine) EXPECT_EQ(q.rule.id, 1000u);
  auto other = h.mgr->QuotasVisibleTo(2);
  ASSERT_EQ(other.size(), 1u);
  EXPECT_EQ(other[0].rule.id, 2000u);
}

DaemonConfig ReserveConfig(uint64_t low, uint64_t high) {
  DaemonConfig c = TestConfig();
  c.pool_defaults.reserve_low = CapacitySpec{false, 0, low};
  c.pool_defaults.reserve_high = CapacitySpec{false, 0, high};
  return c;
}

// Every byte of `fd`'s `size` bytes, mapped: true when all are `value`.
bool AllBytesAre(int fd, uint64_t size, unsigned char value) {
  void* m = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) return false;
  const auto* b = static_cast<const unsigned char*>(m);
  bool all = std::all_of(b, b + size, [value](unsigned char c) { return c == value; });
  munmap(m, size);
  return all;
}

TEST(LeaseManagerReserveTest, AnySizeIsServedFromTheReserveWithoutABuild) {
  Harness h(TwoSocketCxl(64 * kMiB), ReserveConfig(8 * kMiB, 16 * kMiB));
  h.Connect(1);
  h.mgr->StartRefills();
  h.Drain();
  auto pool = h.Pool("node0");
  EXPECT_EQ(pool.reserve_ready_bytes, 16 * kMiB);
  EXPECT_EQ(pool.reserve_low_bytes, 8 * kMiB);
  EXPECT_EQ(pool.reserve_high_bytes, 16 * kMiB);
  EXPECT_EQ(pool.free_bytes, 48 * kMiB) << "the reserve is used memory";
  // 5 MiB + 8 KiB: two 2 MiB extents and a tail of one shrunk to 1 MiB + 8 KiB,
  // answered on the request path (no build).
  const uint64_t size = 5 * kMiB + 8192;
  auto out = h.AllocOnRequestPath(1, size, 0);
  ASSERT_TRUE(out.has_value()) << "a reserve grant answers on the request path";
  ASSERT_TRUE(out->ok()) << out->status().ToString();
  const Granted& g = **out;
  EXPECT_EQ(g.lease.size_bytes, size);
  ASSERT_EQ(g.extents.size(), 3u);
  EXPECT_EQ(FdSize(g.extents[0].fd), static_cast<off_t>(2 * kMiB));
  EXPECT_EQ(FdSize(g.extents[1].fd), static_cast<off_t>(2 * kMiB));
  EXPECT_EQ(FdSize(g.extents[2].fd), static_cast<off_t>(kMiB + 8192));
  EXPECT_EQ(h.mgr->pending_builds(), 0u);
  EXPECT_EQ(h.mgr->Counters()["reserve_hits"], 1u);
  pool = h.Pool("node0");
  EXPECT_EQ(pool.leased_bytes, size);
  ExpectNoOvercommit(h);
  // Below the low watermark now (16 - 6 = 10 > 8: not yet); a second grant
  // takes it below, and the refill brings it back to the high one.
  auto more = h.Alloc(1, 6 * kMiB, 0);
  ASSERT_TRUE(more.ok()) << more.status().ToString();
  h.Drain();
  EXPECT_EQ(h.Pool("node0").reserve_ready_bytes, 16 * kMiB);
  ExpectNoOvercommit(h);
  // Beyond what the reserve has: the reserve's extents plus one built piece.
  auto big = h.Alloc(1, 20 * kMiB, 0);
  ASSERT_TRUE(big.ok()) << big.status().ToString();
  EXPECT_GT(big->extents.size(), 1u);
  uint64_t sum = 0;
  for (const auto& e : big->extents) sum += static_cast<uint64_t>(FdSize(e.fd));
  EXPECT_EQ(sum, 20 * kMiB);
  EXPECT_EQ(h.mgr->Counters()["reserve_partial_hits"], 1u);
  // A small lease below the shrink threshold stays one exact-size memfd.
  auto small = h.Alloc(1, 100 * 1024, 0);
  ASSERT_TRUE(small.ok());
  ASSERT_EQ(small->extents.size(), 1u);
  EXPECT_EQ(FdSize(small->fd()), static_cast<off_t>(100 * 1024)) << "built at its exact size";
  h.mgr->Disconnect(1);
  h.Drain();
  pool = h.Pool("node0");
  EXPECT_EQ(pool.leased_bytes, 0u);
  EXPECT_EQ(pool.reserve_retiring_bytes, 0u);
  EXPECT_EQ(pool.reserve_ready_bytes, 16 * kMiB);
  ExpectNoOvercommit(h);
}

TEST(LeaseManagerReserveTest, SmallLeaseIsAPrebuiltSmallExtentShrunkOnTheRequestPath) {
  Harness h(TwoSocketCxl(128 * kMiB), ReserveConfig(32 * kMiB, 64 * kMiB));
  h.Connect(1);
  h.mgr->StartRefills();
  h.Drain();
  const uint64_t ready = h.Pool("node0").reserve_ready_bytes;
  ASSERT_GT(ready, 60 * kMiB);
  // 100 KiB: one small extent of 128 KiB shrunk to 100 KiB, sealed, on the
  // request path, with no build anywhere.
  auto out = h.AllocOnRequestPath(1, 100 * 1024, 0);
  ASSERT_TRUE(out.has_value()) << "a small lease answers on the request path";
  ASSERT_TRUE(out->ok()) << out->status().ToString();
  const Granted& g = **out;
  ASSERT_EQ(g.extents.size(), 1u);
  EXPECT_EQ(FdSize(g.extents[0].fd), static_cast<off_t>(100 * 1024)) << "exactly sized";
  const int seals = fcntl(g.extents[0].fd, F_GET_SEALS);
  EXPECT_EQ(seals & (F_SEAL_GROW | F_SEAL_SEAL), F_SEAL_GROW | F_SEAL_SEAL);
  EXPECT_TRUE(AllBytesAre(g.extents[0].fd, 100 * 1024, 0));
  EXPECT_EQ(h.mgr->pending_builds(), 0u);
  EXPECT_EQ(h.mgr->Counters()["reserve_hits"], 1u);
  EXPECT_EQ(h.mgr->Counters()["warm_misses"], 0u) << "nothing built for it";
  EXPECT_EQ(h.Pool("node0").reserve_ready_bytes, ready - 128 * kMiB / 1024);
  // Far above the low watermark, the class is topped up once it is down to
  // half its target (4): a second lease of its size.
  h.Drain();
  EXPECT_EQ(h.Pool("node0").reserve_ready_bytes, ready - 128 * kMiB / 1024);
  auto second = h.Alloc(1, 120 * 1024, 0);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(h.mgr->Counters()["reserve_hits"], 2u);
  h.Drain();
  EXPECT_EQ(h.Pool("node0").reserve_ready_bytes, ready);
  h.mgr->Disconnect(1);
  h.Drain();
  EXPECT_EQ(h.Pool("node0").leased_bytes, 0u);
  EXPECT_EQ(h.Pool("node0").reserve_retiring_bytes, 0u);
  ExpectNoOvercommit(h);
}

// POOLS says how long a reserve has been below its low watermark (what the
// doctor warns about): from the first moment ready bytes fall below it, on
// the manager's clock, until a refill brings them back.
TEST(LeaseManagerReserveTest, PoolsSayHowLongTheReserveWasBelowLow) {
  Harness h(TwoSocketCxl(64 * kMiB), ReserveConfig(4 * kMiB, 8 * kMiB));
  h.Connect(1);
  ASSERT_TRUE(h.Pool("node0").reserve_below_low_ms.has_value()) << "empty at start";
  EXPECT_EQ(*h.Pool("node0").reserve_below_low_ms, 0u);
  h.clock.AdvanceNs(90'000'000'000);
  EXPECT_EQ(h.Pool("node0").reserve_below_low_ms.value_or(0), 90'000u);
  h.mgr->StartRefills();
  h.Drain();
  ASSERT_EQ(h.Pool("node0").reserve_ready_bytes, 8 * kMiB);
  EXPECT_FALSE(h.Pool("node0").reserve_below_low_ms.has_value()) << "refilled";
  // Above low after a grant (8 - 2 = 6 MiB): still fine.
  auto a = h.AllocOnRequestPath(1, 2 * kMiB, 0);
  ASSERT_TRUE(a.has_value() && a->ok());
  EXPECT_FALSE(h.Pool("node0").reserve_below_low_ms.has_value());
  // Below it (6 - 4 = 2 MiB) until the refill lands; the clock starts again.
  auto b = h.AllocOnRequestPath(1, 4 * kMiB, 0);
  ASSERT_TRUE(b.has_value() && b->ok());
  h.clock.AdvanceNs(1'500'000'000);
  EXPECT_EQ(h.Pool("node0").reserve_below_low_ms.value_or(0), 1'500u);
  h.Drain();
  EXPECT_FALSE(h.Pool("node0").reserve_below_low_ms.has_value());
  // A reserve with no low watermark is never below it.
  Harness none(TwoSocketCxl(64 * kMiB), TestConfig());
  EXPECT_FALSE(none.Pool("node0").reserve_below_low_ms.has_value());
}

TEST(LeaseManagerReserveTest, NoByteOfOneTenantReachesTheNext) {
  Harness h(TwoSocketCxl(32 * kMiB), ReserveConfig(16 * kMiB, 16 * kMiB));
  h.Connect(1, 1000);
  h.Connect(2, 2000);
  h.mgr->StartRefills();
  h.Drain();
  ASSERT_EQ(h.Pool("node0").reserve_ready_bytes, 16 * kMiB);
  auto a = h.Alloc(1, 16 * kMiB, 0);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  std::vector<ino_t> first;
  for (const auto& e : a->extents) {
    const uint64_t n = static_cast<uint64_t>(FdSize(e.fd));
    void* m = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, e.fd, 0);
    ASSERT_NE(m, MAP_FAILED);
    memset(m, 0xA5, n);
    munmap(m, n);
    struct stat st;
    ASSERT_EQ(fstat(e.fd, &st), 0);
    first.push_back(st.st_ino);
  }
  ASSERT_TRUE(h.mgr->Release(1, a->lease.id).ok());
  h.Drain();  // retired, refilled with fresh memfds
  ASSERT_EQ(h.Pool("node0").reserve_ready_bytes, 16 * kMiB);
  auto b = h.Alloc(2, 16 * kMiB, 0);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  for (const auto& e : b->extents) {
    struct stat st;
    ASSERT_EQ(fstat(e.fd, &st), 0);
    EXPECT_EQ(std::count(first.begin(), first.end(), st.st_ino), 0)
        << "an exposed extent was handed out again";
    EXPECT_TRUE(AllBytesAre(e.fd, static_cast<uint64_t>(FdSize(e.fd)), 0));
  }
}

TEST(LeaseManagerReserveTest, AdmissionRetiresReadyReserveToMakeRoom) {
  Harness h(TwoSocketCxl(16 * kMiB), ReserveConfig(8 * kMiB, 8 * kMiB));
  h.Connect(1);
  h.mgr->StartRefills();
  h.Drain();
  ASSERT_EQ(h.Pool("node0").reserve_ready_bytes, 8 * kMiB);
  // One built lease that needs all 16 MiB with one_extent: the reserve makes room.
  AllocParams p{.size_bytes = 16 * kMiB, .numa_node = 0, .strict = true};
  p.one_extent = true;
  auto g = h.Alloc(1, std::move(p));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->extents.size(), 1u);
  EXPECT_EQ(h.Pool("node0").reserve_bytes(), 0u);
  ExpectNoOvercommit(h);
  ASSERT_TRUE(h.mgr->Release(1, g->lease.id).ok());
  h.Drain();
  EXPECT_EQ(h.Pool("node0").reserve_ready_bytes, 8 * kMiB) << "refilled once the room is back";
  ExpectNoOvercommit(h);
}

TEST(LeaseManagerTest, DisconnectDuringBuildReleasesTheResult) {
  Harness h(TwoSocketCxl());
  h.Connect(1);
  std::optional<Result<Granted>> out;
  AllocParams p;
  p.size_bytes = kMiB;
  h.mgr->Allocate(1, p, [&](Result<Granted> g) { out.emplace(std::move(g)); });
  EXPECT_FALSE(out.has_value());
  EXPECT_EQ(h.Pool("node0").leased_bytes, kMiB) << "reserved while building";
  h.mgr->Disconnect(1);
  h.Drain();
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(out->status().code(), Code::kUnavailable);
  EXPECT_EQ(h.Pool("node0").leased_bytes, 0u);
  EXPECT_EQ(h.mgr->Gauges()["live_leases"], 0u);
}

TEST(LeaseManagerTest, DevdaxDynamicRegionCarvesAndDestroys) {
  FakeDaxControl dax;
  dax.AddRegion("dax_region0", 0, 64 * kMiB, 2 * kMiB, /*dynamic=*/true, 2);
  dax.AddRegion("dax_region1", 1, 32 * kMiB, 2 * kMiB, /*dynamic=*/false, 3);
  DaemonConfig cfg = TestConfig();
  cfg.devdax.push_back({"dax_region0", std::nullopt});
  cfg.devdax.push_back({"dax_region1", std::nullopt});
  Harness h(TwoSocketCxl(), cfg, &dax);
  h.Connect(1);
  auto pools = h.mgr->Pools();
  ASSERT_EQ(pools.size(), 6u);
  EXPECT_EQ(pools[4].name, "dax_region0");
  EXPECT_TRUE(pools[4].dynamic_region);
  EXPECT_EQ(pools[5].name, "dax1.0");
  EXPECT_FALSE(pools[5].dynamic_region);
  AllocParams p;
  p.size_bytes = 3 * kMiB;
  p.tiers = {"devdax"};
  p.strict = true;
  auto g = h.Alloc(1, p);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->lease.backing, "devdax");
  EXPECT_EQ(g->lease.size_bytes, 4 * kMiB) << "rounded up to the 2 MiB alignment";
  EXPECT_EQ(g->lease.requested_bytes, 3 * kMiB);
  EXPECT_EQ(dax.regions["dax_region0"].state.devices.size(), 1u);
  ASSERT_TRUE(h.mgr->Release(1, g->lease.id).ok());
  h.Drain();
  EXPECT_EQ(dax.destroyed, (std::vector<std::string>{"dax0.1"}));
  // Static region: leased whole, once.
  p.numa_node = 3;
  p.tiers = {"devdax"};
  auto s = h.Alloc(1, p);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->lease.pool, "dax1.0");
  EXPECT_EQ(s->lease.size_bytes, 32 * kMiB);
  auto again = h.Alloc(1, p);
  EXPECT_EQ(again.status().code(), Code::kResourceExhausted);
  // Carving failure surfaces as an error and frees the reservation.
  dax.fail_create = true;
  p.numa_node.reset();
  auto f = h.Alloc(1, p);
  EXPECT_FALSE(f.ok());
  EXPECT_EQ(h.Pool("dax_region0").leased_bytes, 0u);
}

TEST(LeaseManagerTest, MissingDevdaxRegionIsAStartupError) {
  FakeDaxControl dax;
  DaemonConfig cfg = TestConfig();
  cfg.devdax.push_back({"dax_region7", std::nullopt});
  Topology t = TwoSocketCxl();
  PoolBuildOptions o;
  o.bind = false;
  o.dax = &dax;
  auto pools = BuildPools(t, cfg, o, nullptr);
  ASSERT_FALSE(pools.ok());
  EXPECT_NE(pools.status().message().find("devdax[0].region"), std::string::npos);
}

// ---- asynchronous release (reclaim on a worker) -------------------------------

TEST(LeaseManagerReclaimTest, ReleaseReturnsBeforeTheReclaimAndCountsItUntilDone) {
  Harness h(TwoSocketCxl(16 * kMiB));
  h.Connect(1);
  auto g = h.Alloc(1, 4 * kMiB, 0);
  ASSERT_TRUE(g.ok());
  UniqueFd client_copy(::dup(g->fd()));
  ASSERT_TRUE(h.mgr->Release(1, g->lease.id).ok());
  // Release has answered; the worker has not run yet (the harness's loop and
  // workers share one io_context that nobody ran since).
  EXPECT_EQ(FdSize(client_copy.get()), static_cast<off_t>(4 * kMiB)) << "not truncated yet";
  auto pool = h.Pool("node0");
  EXPECT_EQ(pool.leased_bytes, 0u);
  EXPECT_EQ(pool.lease_count, 0u);
  EXPECT_EQ(pool.reclaiming_bytes, 4 * kMiB);
  EXPECT_EQ(pool.free_bytes, 12 * kMiB) << "reclaiming bytes are not free";
  EXPECT_EQ(h.mgr->pending_reclaims(), 1u);
  EXPECT_EQ(h.mgr->Gauges()["reclaiming_bytes"], 4 * kMiB);
  EXPECT_EQ(h.mgr->Gauges()["live_leases"], 0u) << "the table forgets it at once";
  EXPECT_EQ(h.mgr->Release(1, g->lease.id).code(), Code::kNotFound);
  ExpectNoOvercommit(h);
  h.Drain();
  EXPECT_EQ(FdSize(client_copy.get()), 0);
  pool = h.Pool("node0");
  EXPECT_EQ(pool.reclaiming_bytes, 0u);
  EXPECT_EQ(pool.free_bytes, 16 * kMiB);
  EXPECT_EQ(h.mgr->pending_reclaims(), 0u);
  EXPECT_EQ(h.mgr->Gauges()["reclaiming_bytes"], 0u);
  EXPECT_EQ(h.mgr->Counters()["reclaims_done"], 1u);
}

TEST(LeaseManagerReclaimTest, QuotaIsFreeAtOnce) {
  DaemonConfig cfg = TestConfig();
  cfg.quotas.push_back(testing::UidQuota(1000, 4 * kMiB));
  Harness h(TwoSocketCxl(), cfg);
  h.Connect(1);
  auto g = h.Alloc(1, 4 * kMiB, 0);
  ASSERT_TRUE(g.ok());
  ASSERT_TRUE(h.mgr->Release(1, g->lease.id).ok());
  for (const auto& u : h.mgr->Quotas()) EXPECT_EQ(u.used_bytes, 0u);
  EXPECT_EQ(h.Pool("node0").reclaiming_bytes, 4 * kMiB);
  h.Drain();
}

TEST(LeaseManagerReclaimTest, AllocThatNeedsReclaimingBytesWaitsThenSucceeds) {
  Harness h(TwoSocketCxl(16 * kMiB));
  h.Connect(1);
  h.Connect(2);
  std::vector<uint64_t> ids;
  for (int i = 0; i < 4; ++i) {
    auto g = h.Alloc(1, 4 * kMiB, 0);
    ASSERT_TRUE(g.ok());
    ids.push_back(g->lease.id);
  }
  ASSERT_TRUE(h.mgr->Release(1, ids[0]).ok());
  ASSERT_TRUE(h.mgr->Release(1, ids[1]).ok());
  EXPECT_EQ(h.Pool("node0").reclaiming_bytes, 8 * kMiB);
  // Would not fit even once the reclaims finish: refused at once, as before.
  AllocParams too_big;
  too_big.size_bytes = 12 * kMiB;
  too_big.numa_node = 0;
  too_big.strict = true;
  std::optional<Result<Granted>> refused;
  h.mgr->Allocate(2, too_big, [&](Result<Granted> g) { refused.emplace(std::move(g)); });
  ASSERT_TRUE(refused.has_value()) << "answered on the request path";
  EXPECT_EQ(refused->status().code(), Code::kResourceExhausted);
  // Fits once they finish: waits (not refused, and not moved to another
  // node), then is built.
  AllocParams p;
  p.size_bytes = 8 * kMiB;
  p.numa_node = 0;
  std::optional<Result<Granted>> out;
  h.mgr->Allocate(2, p, [&](Result<Granted> g) { out.emplace(std::move(g)); });
  EXPECT_FALSE(out.has_value());
  EXPECT_EQ(h.mgr->waiting_allocs(), 1u);
  EXPECT_EQ(h.mgr->Gauges()["waiting_allocs"], 1u);
  ExpectNoOvercommit(h);
  // Run the loop one handler at a time: no state in between overcommits.
  for (int i = 0; i < 100 && !out.has_value(); ++i) {
    h.io.restart();
    h.io.run_one();
    ExpectNoOvercommit(h);
  }
  h.Drain();
  ASSERT_TRUE(out.has_value());
  ASSERT_TRUE(out->ok()) << out->status().ToString();
  EXPECT_EQ((*out)->lease.pool, "node0");
  EXPECT_EQ(h.mgr->waiting_allocs(), 0u);
  auto pool = h.Pool("node0");
  EXPECT_EQ(pool.leased_bytes, 16 * kMiB);
  EXPECT_EQ(pool.reclaiming_bytes, 0u);
  EXPECT_EQ(h.mgr->Counters()["waits_for_reclaim"], 1u);
  EXPECT_EQ(h.mgr->Counters()["refusals"], 1u);
  ExpectNoOvercommit(h);
}

// Fills node0 (16 MiB) from connection 1, releases it, and asks for the
// same 16 MiB from `waiter` before the reclaim has run: that alloc waits.
// Its answer lands in `out`.
void AllocWaitingForReclaim(Harness& h, ConnId waiter, std::optional<Result<Granted>>* out) {
  auto g = h.Alloc(1, 16 * kMiB, 0);
  ASSERT_TRUE(g.ok());
  ASSERT_TRUE(h.mgr->Release(1, g->lease.id).ok());
  h.mgr->Allocate(waiter, AllocParams{.size_bytes = 16 * kMiB, .numa_node = 0},
                  [out](Result<Granted> r) { out->emplace(std::move(r)); });
  ASSERT_FALSE(out->has_value());
}

TEST(LeaseManagerReclaimTest, WaitingAllocIsAnsweredWhenItsConnectionCloses) {
  Harness h(TwoSocketCxl(16 * kMiB));
  h.Connect(1);
  h.Connect(2);
  std::optional<Result<Granted>> out;
  ASSERT_NO_FATAL_FAILURE(AllocWaitingForReclaim(h, 2, &out));
  h.mgr->Disconnect(2);
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(out->status().code(), Code::kUnavailable);
  h.Drain();
  EXPECT_EQ(h.Pool("node0").free_bytes, 16 * kMiB);
  EXPECT_EQ(h.mgr->Gauges()["live_leases"], 0u);
}

TEST(LeaseManagerReclaimTest, ShutdownRefusesWaitingAllocs) {
  Harness h(TwoSocketCxl(16 * kMiB));
  h.Connect(1);
  std::optional<Result<Granted>> out;
  ASSERT_NO_FATAL_FAILURE(AllocWaitingForReclaim(h, 1, &out));
  h.mgr->Shutdown();
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(out->status().code(), Code::kUnavailable);
  h.Drain();
  EXPECT_EQ(h.Pool("node0").reclaiming_bytes, 0u);
}

TEST(LeaseManagerReclaimTest, DisconnectWithManyLeases) {
  Harness h(TwoSocketCxl(64 * kMiB));
  h.Connect(1);
  h.Connect(2);
  std::vector<UniqueFd> copies;
  for (int i = 0; i < 200; ++i) {
    auto g = h.Alloc(1, 64 * 1024, i % 2);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    copies.emplace_back(::dup(g->fd()));
  }
  auto other = h.Alloc(2, kMiB, 0);
  ASSERT_TRUE(other.ok());
  h.mgr->Disconnect(1);
  EXPECT_EQ(h.mgr->pending_reclaims(), 200u);
  EXPECT_EQ(h.mgr->Gauges()["reclaiming_bytes"], 200 * 64 * 1024u);
  EXPECT_EQ(h.mgr->Gauges()["leased_bytes"], kMiB);
  EXPECT_EQ(h.mgr->Counters()["disconnect_reclaims"], 200u);
  ExpectNoOvercommit(h);
  h.Drain();
  for (const auto& fd : copies) ASSERT_EQ(FdSize(fd.get()), 0);
  EXPECT_EQ(h.mgr->pending_reclaims(), 0u);
  EXPECT_EQ(h.mgr->Gauges()["reclaiming_bytes"], 0u);
  EXPECT_EQ(h.Pool("node0").free_bytes, 63 * kMiB);
  EXPECT_EQ(h.Pool("node1").free_bytes, 64 * kMiB);
  EXPECT_EQ(h.Pool("node0").lease_count, 1u);
}

TEST(LeaseManagerReclaimTest, RevokeAnswersOnlyAfterTheTruncate) {
  Harness h(TwoSocketCxl());
  h.Connect(1);
  h.Connect(9, 0, 0, /*admin=*/true);
  auto g = h.Alloc(1, 2 * kMiB);
  ASSERT_TRUE(g.ok());
  UniqueFd client_copy(::dup(g->fd()));
  std::optional<Result<std::vector<ConnId>>> out;
  h.mgr->Revoke(9, g->lease.id, [&](Result<std::vector<ConnId>> r) {
    // The holders are told from here: the memory must already be gone.
    EXPECT_EQ(FdSize(client_copy.get()), 0);
    out.emplace(std::move(r));
  });
  EXPECT_FALSE(out.has_value());
  EXPECT_EQ(h.mgr->Release(1, g->lease.id).code(), Code::kRevoked) << "revoked at once";
  h.Drain();
  ASSERT_TRUE(out.has_value());
  ASSERT_TRUE(out->ok());
  EXPECT_EQ(**out, (std::vector<ConnId>{1}));
}

TEST(LeaseManagerReclaimTest, WarmRefillStartsAfterTheGrantIsAnswered) {
  Harness h(TwoSocketCxl(16 * kMiB), TestConfig(2 * kMiB));
  h.Connect(1);
  h.mgr->StartRefills();
  h.Drain();
  ASSERT_EQ(h.Pool("node0").reserve_ready_bytes, 2 * kMiB);
  std::optional<uint64_t> builds_at_reply;
  AllocParams p;
  p.size_bytes = 2 * kMiB;
  p.numa_node = 0;
  h.mgr->Allocate(1, p, [&](Result<Granted> g) {
    ASSERT_TRUE(g.ok());
    EXPECT_TRUE(g->lease.from_warm_stock);
    builds_at_reply = h.Pool("node0").reserve_building_bytes;
  });
  ASSERT_TRUE(builds_at_reply.has_value());
  EXPECT_EQ(*builds_at_reply, 0u) << "no refill posted before the reply";
  EXPECT_EQ(h.Pool("node0").reserve_building_bytes, 2 * kMiB) << "refill posted right after";
  h.Drain();
  EXPECT_EQ(h.Pool("node0").reserve_ready_bytes, 2 * kMiB);
}

TEST(LeaseManagerReclaimTest, ReserveRefillWaitsForWaitingAllocs) {
  // A refill must not take the room an allocation is waiting for.
  Harness h(TwoSocketCxl(16 * kMiB), TestConfig(4 * kMiB));
  h.Connect(1);
  h.mgr->StartRefills();
  h.Drain();
  auto a = h.Alloc(1, 4 * kMiB, 0);  // the warm one; its refill lands
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(a->lease.from_warm_stock);
  auto b = h.Alloc(1, 8 * kMiB, 0);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(h.Pool("node0").free_bytes, 0u);
  ASSERT_TRUE(h.mgr->Release(1, a->lease.id).ok());
  ASSERT_TRUE(h.mgr->Release(1, b->lease.id).ok());
  // Needs the whole pool: the ready reserve is retired and both reclaims must
  // finish. After the first one a refill would fit, and would take the room.
  std::optional<Result<Granted>> out;
  h.mgr->Allocate(1, AllocParams{.size_bytes = 16 * kMiB, .numa_node = 0, .strict = true},
                  [&](Result<Granted> r) { out.emplace(std::move(r)); });
  EXPECT_FALSE(out.has_value());
  h.Drain();
  ASSERT_TRUE(out.has_value());
  ASSERT_TRUE(out->ok()) << out->status().ToString();
  EXPECT_EQ(h.Pool("node0").leased_bytes, 16 * kMiB);
  ExpectNoOvercommit(h);
}

TEST(LeaseManagerReclaimTest, DestroyedManagerStillReclaimsOnItsWorkers) {
  Topology topo = TwoSocketCxl();
  PoolBuildOptions o;
  o.bind = false;
  DaemonConfig cfg = TestConfig();
  auto pools = BuildPools(topo, cfg, o, nullptr);
  ASSERT_TRUE(pools.ok());
  boost::asio::io_context loop;
  boost::asio::thread_pool workers(1);
  FakeClock clock;
  auto mgr = std::make_unique<LeaseManager>(&topo, std::move(*pools), QuotaTable(cfg.quotas),
                                            loop.get_executor(), workers.get_executor(), &clock);
  CallerInfo ci;
  ci.pid = 101;
  ci.uid = 1000;
  ci.gid = 1000;
  mgr->Connect(1, ci);
  std::vector<UniqueFd> copies;
  std::vector<uint64_t> ids;
  for (int i = 0; i < 8; ++i) {
    std::optional<Result<Granted>> out;
    mgr->Allocate(1, AllocParams{.size_bytes = kMiB},
                  [&](Result<Granted> g) { out.emplace(std::move(g)); });
    while (!out.has_value()) {
      loop.restart();
      loop.run_one();
    }
    ASSERT_TRUE(out->ok()) << out->status().ToString();
    copies.emplace_back(::dup((*out)->fd()));
    ids.push_back((*out)->lease.id);
  }
  for (size_t i = 0; i < 4; ++i) ASSERT_TRUE(mgr->Release(1, ids[i]).ok());
  mgr.reset();  // the rest are freed by its Shutdown
  workers.join();
  for (const auto& fd : copies) EXPECT_EQ(FdSize(fd.get()), 0) << "memory not leaked";
  loop.restart();
  loop.run();  // late completions find the manager gone and do nothing
}

}  // namespace
}  // namespace cxlpool

namespace cxlpool {
namespace {

// A manager whose loop and workers are separate io_contexts that run only
// when a test says so, with leases up to 64 KiB built and reclaimed inline.
struct InlineManager {
  Topology topo = testing::TwoSocketCxl(16 * kMiB);
  boost::asio::io_context loop;
  boost::asio::io_context workers;
  FakeClock clock;
  CallerInfo ci;
  std::unique_ptr<LeaseManager> mgr;

  InlineManager() {
    PoolBuildOptions o;
    o.bind = false;
    auto pools = BuildPools(topo, testing::TestConfig(), o, nullptr);
    CXLPOOL_CHECK(pools.ok());
    mgr = std::make_unique<LeaseManager>(&topo, std::move(*pools),
                                         QuotaTable(std::vector<QuotaRule>{}), loop.get_executor(),
                                         workers.get_executor(), &clock);
    mgr->SetInlineMax(64 * 1024);
    ci.pid = 100;
    ci.uid = 1000;
    ci.gid = 1000;
    mgr->Connect(1, ci);
  }
  void RunLoop() {
    loop.restart();
    loop.run();
  }
  PoolSnapshot Node0() const {
    for (const auto& p : mgr->Pools())
      if (p.name == "node0") return p;
    return PoolSnapshot{};
  }
  // The grant if it came within one run of the loop (no worker ran).
  std::optional<Result<Granted>> Alloc(uint64_t size) {
    std::optional<Result<Granted>> out;
    AllocParams p;
    p.size_bytes = size;
    p.numa_node = 0;
    mgr->Allocate(1, p, [&](Result<Granted> g) { out.emplace(std::move(g)); });
    RunLoop();
    return out;
  }
};

// Leases up to the inline size are built and reclaimed on the loop thread:
// with workers that never run, a small lease is still granted and reclaimed;
// a larger one waits for the workers.
TEST(LeaseManagerInlineTest, SmallLeasesNeverWaitForAWorker) {
  InlineManager m;
  LeaseManager& mgr = *m.mgr;
  auto small = m.Alloc(64 * 1024);
  ASSERT_TRUE(small.has_value()) << "built on the loop";
  ASSERT_TRUE(small->ok()) << small->status().ToString();
  struct stat st;
  ASSERT_EQ(fstat((*small)->fd(), &st), 0);
  EXPECT_EQ(st.st_size, 64 * 1024);
  EXPECT_EQ(mgr.pending_builds(), 0u);
  auto big = m.Alloc(64 * 1024 + 4096);
  EXPECT_FALSE(big.has_value()) << "over the inline size: a worker builds it";
  EXPECT_EQ(mgr.pending_builds(), 1u);
  m.workers.run();
  m.RunLoop();
  EXPECT_EQ(mgr.pending_builds(), 0u);
  ASSERT_TRUE(mgr.Release(1, (*small)->lease.id).ok());
  m.RunLoop();
  EXPECT_EQ(mgr.pending_reclaims(), 0u) << "reclaimed on the loop";
  EXPECT_EQ(m.Node0().reclaiming_bytes, 0u);
  EXPECT_EQ(m.Node0().leased_bytes, 64 * 1024 + 4096u);
  mgr.Disconnect(1);  // the big one: a worker reclaims it
  m.RunLoop();
  EXPECT_EQ(mgr.pending_reclaims(), 1u);
  EXPECT_EQ(m.Node0().reclaiming_bytes, 64 * 1024 + 4096u);
  m.workers.restart();
  m.workers.run();
  m.RunLoop();
  EXPECT_EQ(mgr.pending_reclaims(), 0u);
  EXPECT_EQ(m.Node0().leased_bytes + m.Node0().reclaiming_bytes, 0u);

  // Under load (another build or reclaim in flight) small ones go to the
  // workers too, so the loop keeps serving while they run in parallel.
  mgr.Connect(1, m.ci);
  m.workers.restart();
  auto big2 = m.Alloc(64 * 1024 + 4096);
  EXPECT_FALSE(big2.has_value()) << (big2 && !big2->ok() ? big2->status().ToString() : "");
  auto small2 = m.Alloc(4096);
  EXPECT_FALSE(small2.has_value()) << "a build is in flight: a worker builds the small one";
  EXPECT_EQ(mgr.pending_builds(), 2u);
  m.workers.run();
  m.RunLoop();
  EXPECT_EQ(mgr.pending_builds(), 0u);
  auto small3 = m.Alloc(4096);
  ASSERT_TRUE(small3.has_value()) << "idle again: built on the loop";
  ASSERT_TRUE(small3->ok());
  mgr.Disconnect(1);  // three leases: none of the reclaims waits behind another on the loop
  m.RunLoop();
  EXPECT_GE(mgr.pending_reclaims(), 2u) << "only the first small reclaim may run on the loop";
  m.workers.restart();
  m.workers.run();
  m.RunLoop();
  EXPECT_EQ(mgr.pending_reclaims(), 0u);
  EXPECT_EQ(m.Node0().leased_bytes + m.Node0().reclaiming_bytes, 0u);
  mgr.Shutdown();
}

// A cold build on a worker offers its prefault to the other workers: one
// helper per other worker, through the BuildQueue under the owner's uid
// (build_helpers), each taking one chunk per turn. Here the owner's worker
// runs alone first, so it fills every chunk and the helper finds none; with
// one worker, or a lease of one chunk, nothing is offered.
TEST(LeaseManagerInlineTest, AColdBuildOffersItsPrefaultToTheOtherWorkers) {
  InlineManager m;
  LeaseManager& mgr = *m.mgr;
  mgr.SetBuildConcurrency(2);
  auto count = [&](const char* name) {
    auto c = mgr.Counters();
    return c.count(name) ? c.at(name) : 0;
  };
  auto build = [&]() -> Result<Granted> {
    std::optional<Result<Granted>> out;
    AllocParams p;
    p.size_bytes = 8 * kMiB;  // 4 chunks of 2 MiB
    p.numa_node = 0;
    mgr.Allocate(1, p, [&](Result<Granted> g) { out.emplace(std::move(g)); });
    m.RunLoop();
    EXPECT_FALSE(out.has_value()) << "a worker builds it";
    m.workers.restart();
    EXPECT_EQ(m.workers.run_one(), 1u);  // the owner's build, alone
    m.RunLoop();                         // the offer, then the grant
    m.workers.restart();
    m.workers.run();  // the helper
    m.RunLoop();
    CXLPOOL_CHECK(out.has_value());
    return std::move(*out);
  };
  auto g = build();
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(count("build_helpers"), 1u);
  EXPECT_EQ(count("build_helper_chunks"), 0u) << "the owner took every chunk first";
  // The pages are there for the client: map the fd and check with mincore.
  const size_t len = g->lease.size_bytes;
  void* at = ::mmap(nullptr, len, PROT_READ, MAP_SHARED, g->fd(), 0);
  ASSERT_NE(at, MAP_FAILED);
  std::vector<unsigned char> in(len / 4096);
  ASSERT_EQ(::mincore(at, len, in.data()), 0);
  for (unsigned char c : in) ASSERT_TRUE(c & 1);
  ::munmap(at, len);
  ASSERT_TRUE(mgr.Release(1, g->lease.id).ok());
  m.workers.restart();
  m.workers.run();
  m.RunLoop();

  mgr.SetBuildConcurrency(1);
  auto alone = build();
  ASSERT_TRUE(alone.ok()) << alone.status().ToString();
  EXPECT_EQ(count("build_helpers"), 1u) << "one worker: no helper";
  mgr.Shutdown();
}

// The reply to a RELEASE goes out as Release() returns; the truncation (on
// the loop for a small lease) waits for the loop's next turn, so it never
// delays that reply. Shutdown starts what is still deferred at once.
TEST(LeaseManagerInlineTest, ReclaimStartsOnTheLoopsNextTurnOrAtShutdown) {
  InlineManager m;  // its workers never run: small leases need none
  LeaseManager& mgr = *m.mgr;
  auto a = m.Alloc(64 * 1024);
  auto b = m.Alloc(64 * 1024);
  ASSERT_TRUE(a.has_value() && a->ok() && b.has_value() && b->ok());
  UniqueFd a_copy(::dup((*a)->fd())), b_copy(::dup((*b)->fd()));

  ASSERT_TRUE(mgr.Release(1, (*a)->lease.id).ok());
  EXPECT_EQ(FdSize(a_copy.get()), 64 * 1024) << "not on the request path";
  EXPECT_EQ(mgr.pending_reclaims(), 1u);
  m.RunLoop();
  EXPECT_EQ(FdSize(a_copy.get()), 0) << "on the loop's next turn, no worker needed";
  EXPECT_EQ(mgr.pending_reclaims(), 0u);

  ASSERT_TRUE(mgr.Release(1, (*b)->lease.id).ok());
  EXPECT_EQ(FdSize(b_copy.get()), 64 * 1024);
  mgr.Shutdown();  // the loop never turns again
  EXPECT_EQ(FdSize(b_copy.get()), 0) << "shutdown starts deferred reclaims";
}

// ---- long-term pins: the accounting follows the pages ----------------------

// The harness's pools do not bind (bind = false), so on this machine every
// lease's pages are wherever the kernel put them: a lease accounted to CXL
// node 2 really sits on one of this machine's nodes. CheckMoved asks
// move_pages about the daemon's own mapping, exactly as after a real move.
TEST(LeaseManagerMovedTest, AccountingFollowsThePagesTheDaemonSees) {
  Harness h(TwoSocketCxl(64 * kMiB), [] {
    DaemonConfig c = TestConfig();
    c.quotas.push_back(testing::UidQuota(1000, 64 * kMiB, "cxl"));
    c.quotas.push_back(testing::UidQuota(1000, 64 * kMiB, "dram"));
    return c;
  }());
  h.Connect(1);
  h.Connect(2, 2000);
  AllocParams p;
  p.size_bytes = 4 * kMiB;
  p.numa_node = 2;
  p.strict = true;
  p.long_term_pin = true;
  auto g = h.Alloc(1, p);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_TRUE(g->lease.long_term_pin);
  const uint64_t id = g->lease.id;
  // Where the kernel really has them (this machine's node), asked directly.
  void* map = ::mmap(nullptr, 4 * kMiB, PROT_READ, MAP_SHARED | MAP_POPULATE, g->fd(), 0);
  ASSERT_NE(map, MAP_FAILED);
  auto census = CensusPages(map, 4 * kMiB, 4096);
  ::munmap(map, 4 * kMiB);
  if (!census.ok() && census.status().code() == Code::kUnsupported) {
    GTEST_SKIP() << census.status().ToString();
  }
  ASSERT_TRUE(census.ok()) << census.status().ToString();
  ASSERT_TRUE(census->MajorityNode().has_value());
  const int real = *census->MajorityNode();
  ASSERT_NE(real, 2) << "this machine has a node 2: the test needs pages off node 2";

  // Only a holder may report; another tenant's lease does not exist for it.
  EXPECT_EQ(h.mgr->CheckMoved(2, id).status().code(), Code::kNotFound);
  EXPECT_EQ(h.mgr->CheckMoved(1, id + 100).status().code(), Code::kNotFound);
  auto moved = h.mgr->CheckMoved(1, id);
  ASSERT_TRUE(moved.ok()) << moved.status().ToString();
  EXPECT_TRUE(moved->moved);
  EXPECT_EQ(moved->lease.numa_node, real);
  EXPECT_EQ(moved->lease.placed_numa_node, 2);
  EXPECT_EQ(moved->lease.pool, "node" + std::to_string(real));
  EXPECT_NE(
      moved->lease.moved_reason.find("pages moved from node 2 to node " + std::to_string(real)),
      std::string::npos)
      << moved->lease.moved_reason;
  EXPECT_EQ(h.Pool("node2").leased_bytes, 0u);
  EXPECT_EQ(h.Pool("node2").lease_count, 0u);
  EXPECT_EQ(h.Pool("node" + std::to_string(real)).leased_bytes, 4 * kMiB);
  EXPECT_EQ(h.mgr->Counters()["leases_moved"], 1u);
  // The tenant's quota moved from the cxl tier to the dram tier.
  for (const auto& q : h.mgr->Quotas()) {
    EXPECT_EQ(q.used_bytes, q.rule.tier == "dram" ? 4 * kMiB : 0u) << q.rule.tier;
  }
  // Asked again: nothing more to move.
  auto again = h.mgr->CheckMoved(1, id);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->moved);
  EXPECT_EQ(h.mgr->Counters()["leases_moved"], 1u);
  // Released from the pool that accounts it now.
  ASSERT_TRUE(h.mgr->Release(1, id).ok());
  h.Drain();
  ExpectNoOvercommit(h);
  EXPECT_EQ(h.Pool("node" + std::to_string(real)).leased_bytes, 0u);
}

TEST(LeaseManagerMovedTest, AMovedLeaseMayTakeItsNewPoolPastCapacity) {
  Harness h(TwoSocketCxl(8 * kMiB));
  h.Connect(1);
  // Fill the real node's pool, then move a CXL lease onto it.
  auto fill = h.Alloc(1, 8 * kMiB, 0);
  ASSERT_TRUE(fill.ok()) << fill.status().ToString();
  auto g = h.Alloc(1, 4 * kMiB, 2);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  auto moved = h.mgr->CheckMoved(1, g->lease.id);
  if (!moved.ok() && moved.status().code() == Code::kUnsupported) GTEST_SKIP();
  ASSERT_TRUE(moved.ok()) << moved.status().ToString();
  if (moved->lease.numa_node != 0) GTEST_SKIP() << "pages not on node 0 here";
  EXPECT_TRUE(moved->moved);
  EXPECT_EQ(h.Pool("node0").leased_bytes, 12 * kMiB);
  EXPECT_EQ(h.Pool("node0").free_bytes, 0u);  // never negative
  AllocParams strict;
  strict.size_bytes = 4 * kMiB;
  strict.numa_node = 0;
  strict.strict = true;
  auto more = h.Alloc(1, strict);
  EXPECT_FALSE(more.ok());  // full: admission counts what moved in
  EXPECT_EQ(more.status().code(), Code::kResourceExhausted);
}

TEST(LeaseManagerMovedTest, DevdaxLeasesCannotBeChecked) {
  FakeDaxControl dax;
  dax.AddRegion("dax_region0", 0, 64 * kMiB, 2 * kMiB, true, 2);
  DaemonConfig cfg = TestConfig();
  cfg.devdax.push_back({"dax_region0", std::nullopt});
  Harness h(TwoSocketCxl(), cfg, &dax);
  h.Connect(1);
  AllocParams p;
  p.size_bytes = 2 * kMiB;
  p.tiers = {"devdax"};
  p.strict = true;
  auto g = h.Alloc(1, p);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(h.mgr->CheckMoved(1, g->lease.id).status().code(), Code::kUnsupported);
}

// A mixed node (kernel and movable zones) whose kernel zones have too little
// free memory: the build's pre-check fails (no io_uring needed), a
// non-strict request falls back, a strict one is refused naming the node.
TEST(LeaseManagerMovedTest, MixedNodeWithoutKernelZoneRoomFallsBackOrRefuses) {
  Topology t = TwoSocketCxl(64 * kMiB);
  for (auto& n : t.numa_nodes) {
    n.kernel_zone_bytes = 64 * kMiB;
    n.movable_bytes = 0;
  }
  t.numa_nodes[2].kernel_zone_bytes = 16 * kMiB;
  t.numa_nodes[2].movable_bytes = 48 * kMiB;
  Harness h(t);
  FakeFileSystem proc;
  proc.AddFile("/proc/zoneinfo",
               "Node 2, zone   Normal\n  pages free     256\n        min      16\n"
               "        low      32\n        high     48\nNode 2, zone  Movable\n"
               "  pages free     12288\n        low      0\n");
  h.mgr->SetPinSettle(&proc);
  h.Connect(1);
  AllocParams p;
  p.size_bytes = 4 * kMiB;
  p.numa_node = 2;
  p.long_term_pin = true;
  auto g = h.Alloc(1, p);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->lease.numa_node, 0);
  EXPECT_NE(g->lease.placement_reason.find("fell back from node2: node 2's kernel zones have"),
            std::string::npos)
      << g->lease.placement_reason;
  EXPECT_EQ(h.mgr->Counters()["pin_settle_fallbacks"], 1u);
  EXPECT_EQ(h.Pool("node2").leased_bytes, 0u);
  p.strict = true;
  auto s = h.Alloc(1, p);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Code::kResourceExhausted);
  EXPECT_NE(s.status().message().find("the lease needs 4.0 MiB there"), std::string::npos)
      << s.status().ToString();
  ExpectNoOvercommit(h);
  // Without the pin the same node serves it (from ZONE_MOVABLE).
  p.long_term_pin = false;
  auto plain = h.Alloc(1, p);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_EQ(plain->lease.numa_node, 2);
}

// A lease cut into extents: one memfd per piece, in order, adding up to the
// lease; released or revoked, every extent goes and the accounting is back.
TEST(LeaseManagerTest, ALeaseOfSeveralExtentsIsGrantedAndEndsWhole) {
  Harness h(TwoSocketCxl(64 * kMiB));
  h.mgr->SetMaxExtentBytes(2 * kMiB);
  h.Connect(1);
  h.Connect(9, 0, 0, true);
  const PoolSnapshot before = h.Pool("node0");
  auto g = h.Alloc(1, 5 * kMiB + 1, 0);  // rounded to the page: 5 MiB + 4 KiB
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  ASSERT_EQ(g->extents.size(), 3u);
  EXPECT_EQ(g->fd(), -1);  // no single fd
  EXPECT_EQ(g->lease.extents, 3u);
  const uint64_t sizes[3] = {2 * kMiB, 2 * kMiB, 1 * kMiB + 4096};
  uint64_t sum = 0;
  std::vector<UniqueFd> copies;
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(g->extents[i].size_bytes, sizes[i]) << i;
    EXPECT_EQ(FdSize(g->extents[i].fd), static_cast<off_t>(sizes[i])) << i;
    sum += g->extents[i].size_bytes;
    copies.emplace_back(::dup(g->extents[i].fd));
  }
  EXPECT_EQ(sum, g->lease.size_bytes);
  EXPECT_EQ(h.Pool("node0").leased_bytes, before.leased_bytes + sum);
  // Limits count every extent's fd: a second lease still fits.
  auto small = h.Alloc(1, 1 * kMiB, 0);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(small->extents.size(), 1u);
  ASSERT_TRUE(h.mgr->Release(1, small->lease.id).ok());
  // Revoke truncates every extent, not only the first.
  auto holders = RevokeNow(h, 9, g->lease.id);
  ASSERT_TRUE(holders.ok()) << holders.status().ToString();
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(FdSize(copies[i].get()), 0) << "extent " << i;
  h.Drain();
  EXPECT_EQ(h.Pool("node0").leased_bytes, before.leased_bytes);
  EXPECT_EQ(h.Pool("node0").reclaiming_bytes, 0u);
  ExpectNoOvercommit(h);

  // Released by disconnect: every extent truncated too.
  auto d = h.Alloc(1, 6 * kMiB, 0);
  ASSERT_TRUE(d.ok());
  ASSERT_EQ(d->extents.size(), 3u);
  std::vector<UniqueFd> kept;
  for (const auto& e : d->extents) kept.emplace_back(::dup(e.fd));
  h.mgr->Disconnect(1);
  h.Drain();
  for (const auto& fd : kept) EXPECT_EQ(FdSize(fd.get()), 0);
  EXPECT_EQ(h.Pool("node0").leased_bytes, before.leased_bytes);
}

}  // namespace
}  // namespace cxlpool
