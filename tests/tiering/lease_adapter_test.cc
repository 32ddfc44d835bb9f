// LeaseManagerTable and LeaseManager's move accounting on a fake two-socket
// topology with CXL (tests/daemon/test_util.h): what the engine is told of
// each lease (targets near its GPU, why it cannot move), and that a move
// between pools never overcommits, moves the quota charge with the bytes,
// is journalled, survives a lease ending in the middle, and comes back after
// a restart exactly as it was. Each extent of a lease is accounted to its
// own pool (a lease may stay split): a move is of one extent, a split lease
// comes back split after a restart, an interrupted extent move with no room
// left becomes a move back of that extent (journalled like a forward move,
// so the next restart goes on with it), and a cooperative move pauses its
// holder once for the whole lease (the engine over this table, on a fake
// migrator, or the kernel's verified by move_pages).
#include "tiering/lease_adapter.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <map>

#include "cxlpool/common/page_census.h"
#include "fake_migrator.h"
#include "restart_fakes.h"
#include "test_util.h"
#include "tiering/engine.h"
#include "tiering/migrator.h"

namespace cxlpool {
namespace {

using testing::FakeProbe;
using testing::FakeStore;
using testing::Harness;
using testing::TestConfig;
using testing::TwoSocketCxl;
using tiering::LeaseFacts;
using tiering::LeaseManagerTable;

constexpr uint64_t kMiB = 1ull << 20;

uint64_t Used(const PoolSnapshot& p) { return p.capacity_bytes - p.free_bytes; }

std::pair<uint64_t, uint64_t> QuotaUse(Harness& h, const std::string& tier) {
  return h.mgr->mutable_quotas()->Usage(QuotaScope::kUid, "1000", tier);
}

// The next daemon: restart enabled on `store` and `probe` (ids from
// `next_id`), the journal recovered with no grace period.
void Restart(Harness& h, FakeStore& store, FakeProbe& probe, uint64_t next_id) {
  h.mgr->EnableRestart(&store, &probe, next_id);
  h.mgr->Recover(store.Journalled(), {}, std::chrono::seconds(0));
}

// The test config with node2 (the CXL node) cut to 2 MiB: a restart finds
// no room there for a move that was under way (beyond one 2 MiB extent
// already accounted there).
DaemonConfig Node2Of2MiB() {
  DaemonConfig cfg = TestConfig();
  cfg.node_pools[2] = cfg.pool_defaults;
  cfg.node_pools[2].capacity.is_percent = false;
  cfg.node_pools[2].capacity.bytes = 2 * kMiB;
  return cfg;
}

// A daemon whose fd store kept every extent of the leases in `fds`: their
// memory is back at once (adopted), as under systemd.
void RestartWithMemory(Harness& h, FakeStore& store, FakeProbe& probe, uint64_t next_id,
                       const std::map<uint64_t, std::vector<int>>& fds) {
  h.mgr->EnableRestart(&store, &probe, next_id);
  std::map<uint64_t, std::vector<UniqueFd>> stored;
  for (const auto& [id, v] : fds) {
    for (int fd : v) stored[id].emplace_back(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
  }
  h.mgr->Recover(store.Journalled(), std::move(stored), std::chrono::seconds(0));
}

// Moves every page as asked (the harness's memory stays where it is); counts.
class FakeMigrator final : public tiering::Migrator {
 public:
  Result<tiering::MoveReport> Move(const tiering::MoveRequest& req) override {
    requests.push_back(req);
    if (on_move) on_move();
    return tiering::fakes::CompleteMove(req);
  }
  Result<tiering::PageCount> Where(int, uint64_t, uint64_t length, uint64_t page) override {
    return tiering::fakes::PagesNowhere(length, page);
  }
  std::vector<tiering::MoveRequest> requests;
  std::function<void()> on_move;
};

// What the holders are told: every pause asked for, every notice.
class FakeChannel final : public tiering::HolderChannel {
 public:
  Status Ask(tiering::ConnId c, const tiering::MigrationAsk& a) override {
    asks.emplace_back(c, a);
    return Status::Ok();
  }
  void Tell(tiering::ConnId c, const tiering::MigrationNotice& n) override {
    tells.emplace_back(c, n);
  }
  void Moved(tiering::ConnId, uint64_t, int, const std::string&) override { ++moved; }
  std::vector<std::pair<tiering::ConnId, tiering::MigrationAsk>> asks;
  std::vector<std::pair<tiering::ConnId, tiering::MigrationNotice>> tells;
  int moved = 0;
};

tiering::TieringOptions EngineOptions() {
  tiering::TieringOptions o;
  o.rate_limit_bytes_per_s = 0;
  o.policy.slow_reserve = 0;
  o.cooperative_deadline_ms = 2000;
  o.cooperative_retry_ns = 300'000'000'000;
  return o;
}

std::unique_ptr<tiering::TieringEngine> MakeEngine(Harness& h, LeaseManagerTable* table,
                                                   tiering::Migrator* migrator,
                                                   tiering::HolderChannel* channel) {
  return std::make_unique<tiering::TieringEngine>(table, migrator, channel, &h.clock,
                                                  h.io.get_executor(), h.io.get_executor(),
                                                  EngineOptions());
}

// Connection 1 as the tiering engine sees it: the caller the lease manager
// knows (the owner of the leases it allocated).
tiering::Caller OwnerConn(Harness& h) {
  const CallerInfo* c = h.mgr->Caller(1);
  return tiering::Caller{1, c != nullptr ? c->uid : static_cast<uid_t>(-1), false};
}

// Daemon 1 of the restart tests: a lease of three 2 MiB extents on node0
// whose extent 0 the tiering engine moved to node2 (the lease is split: 4
// MiB on node0, 2 MiB on node2), killed during the move of extent 1 there.
// Returns the lease id; `fds` keeps its extents (the fd store).
uint64_t SplitAndKilledMovingExtent1(FakeStore& store, FakeProbe& probe,
                                     std::map<uint64_t, std::vector<int>>& fds) {
  Harness h(TwoSocketCxl(16 * kMiB));
  h.mgr->SetMaxExtentBytes(2 * kMiB);
  h.mgr->EnableRestart(&store, &probe, 1);
  h.Connect(1);
  LeaseManagerTable table(h.mgr.get(), true);
  auto g = h.Alloc(1, 6 * kMiB, 0);
  CXLPOOL_CHECK(g.ok() && g->extents.size() == 3);
  const uint64_t id = g->lease.id;
  for (const auto& e : g->extents) fds[id].push_back(::fcntl(e.fd, F_DUPFD_CLOEXEC, 0));
  CXLPOOL_CHECK(table.BeginMove(id, 0, "node2").ok());
  CXLPOOL_CHECK(table.CommitMove(id, 0).ok());
  CXLPOOL_CHECK(table.BeginMove(id, 1, "node2").ok());
  h.mgr->HandOver();  // SIGKILL
  return id;
}

// A split lease whose daemon 1 was killed during the move of one extent
// (SplitAndKilledMovingExtent1), with the journal and fd store it left.
struct Interrupted {
  Interrupted() {
    probe.start[101] = 0;
    id = SplitAndKilledMovingExtent1(store, probe, fds);
  }
  FakeStore store;
  FakeProbe probe;
  std::map<uint64_t, std::vector<int>> fds;
  uint64_t id = 0;
};

// What daemon 1 journalled: each extent's pool, and the move of extent 1.
void ExpectJournalledSplitWithExtent1Moving(const DurableLease& d) {
  EXPECT_EQ(d.pool, "node0");  // 4 of its 6 MiB
  EXPECT_EQ(d.extent_pools, (std::vector<std::string>{"node2", "node0", "node0"}));
  EXPECT_EQ(d.migrating_to_pool, "node2");
  EXPECT_EQ(d.migrating_extent, std::optional<uint32_t>(1));
  EXPECT_EQ(d.migrating_back_from_pool, "");
}

// The pool (and the node) each unit of a lease is accounted to, in order.
std::vector<std::string> UnitPools(const LeaseFacts& f) {
  std::vector<std::string> out;
  for (const auto& u : f.units) out.push_back(u.pool);
  return out;
}

std::vector<int> UnitNodes(const LeaseFacts& f) {
  std::vector<int> out;
  for (const auto& u : f.units) out.push_back(u.numa_node);
  return out;
}

// The split after the move goes on: extents 0 and 1 on node2, extent 2 on
// node0, each pool and each tier with exactly its bytes.
void ExpectTwoOnNode2OneOnNode0(Harness& h, const LeaseFacts& f) {
  EXPECT_EQ(UnitPools(f), (std::vector<std::string>{"node2", "node2", "node0"}));
  EXPECT_EQ(h.Pool("node0").leased_bytes, 2 * kMiB);
  EXPECT_EQ(h.Pool("node2").leased_bytes, 4 * kMiB);
  EXPECT_EQ(Used(h.Pool("node0")), 2 * kMiB);
  EXPECT_EQ(Used(h.Pool("node2")), 4 * kMiB);
  EXPECT_EQ(QuotaUse(h, "dram").first, 2 * kMiB);
  EXPECT_EQ(QuotaUse(h, "cxl").first, 4 * kMiB);
}

// One engine round moves exactly one 2 MiB extent (its own memfd, from
// offset 0) to `node`.
bool OneRoundMovesOneExtentTo(Harness& h, tiering::TieringEngine& engine,
                              const FakeMigrator& migrator, int node) {
  engine.Tick();
  h.Drain();
  EXPECT_EQ(migrator.requests.size(), 1u);
  if (migrator.requests.size() != 1) return false;
  EXPECT_EQ(migrator.requests[0].target_node, node);
  EXPECT_EQ(migrator.requests[0].offset, 0u);
  EXPECT_EQ(migrator.requests[0].length, 2 * kMiB);
  return migrator.requests[0].target_node == node && migrator.requests[0].length == 2 * kMiB;
}

// The holder (conn 1) comes back after a restart and hands its lease of
// 2 MiB extents back (RECLAIM), so that it holds it again.
void HolderReclaims(Harness& h, uint64_t id, const std::vector<int>& fds) {
  h.Connect(1);
  std::vector<LeaseManager::ReclaimItem> items(1);
  items[0].id = id;
  items[0].size_bytes = fds.size() * 2 * kMiB;
  for (int fd : fds) {
    items[0].fds.emplace_back(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
    items[0].extent_sizes.push_back(2 * kMiB);
  }
  CXLPOOL_CHECK(h.mgr->Reclaim(1, std::move(items)).accepted.size() == 1);
}

void CloseAll(std::map<uint64_t, std::vector<int>>& fds) {
  for (auto& [id, v] : fds) {
    for (int fd : v) ::close(fd);
  }
  fds.clear();
}

TEST(LeaseAdapterTest, TargetsFollowTheGpuAndReasonsSayWhyNot) {
  Harness h(TwoSocketCxl());
  h.Connect(1);
  LeaseManagerTable table(h.mgr.get(), /*local=*/true);
  AllocParams near1;
  near1.size_bytes = 4 * kMiB;
  near1.gpu = "1";
  near1.tiers = {"cxl"};
  auto a = h.Alloc(1, near1);  // near GPU 1, on CXL: node3
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->lease.numa_node, 3);
  auto b = h.Alloc(1, 4 * kMiB, 0);  // node0, no GPU
  ASSERT_TRUE(b.ok());
  auto fa = table.Find(a->lease.id);
  ASSERT_TRUE(fa.has_value());
  EXPECT_EQ(fa->promote_pool, "node1");  // the DRAM nearest GPU 1
  EXPECT_EQ(fa->demote_pool, "node3");
  ASSERT_EQ(fa->units.size(), 1u);
  EXPECT_EQ(fa->units[0].length, 4 * kMiB);
  EXPECT_EQ(fa->units[0].pool, "node3");
  EXPECT_EQ(fa->holders, std::vector<tiering::ConnId>{1});
  EXPECT_EQ(fa->not_movable, "");
  auto fb = table.Find(b->lease.id);
  EXPECT_EQ(fb->promote_pool, "node0");
  EXPECT_EQ(fb->demote_pool, "node2");  // the CXL nearest node0
  // A foreign topology: nothing moves, and it says why.
  LeaseManagerTable foreign(h.mgr.get(), /*local=*/false);
  EXPECT_NE(foreign.Find(b->lease.id)->not_movable.find("not this machine's"), std::string::npos);
  EXPECT_EQ(table.Pools().size(), 4u);  // the GPU's memory is never pooled
  auto unit = table.OpenUnit(b->lease.id, 0);
  ASSERT_TRUE(unit.ok());
  EXPECT_TRUE(unit->fd.valid());
  EXPECT_EQ(table.OpenUnit(b->lease.id, 1).status().code(), Code::kNotFound);
  EXPECT_EQ(table.OpenUnit(999, 0).status().code(), Code::kNotFound);
}

// Placement rule 4 holds for moves too: a long-term pinned lease is never
// moved where its next pin would move the pages off again (a CXL node with
// only ZONE_MOVABLE memory), nor to a mixed node (mbind cannot pick its
// kernel zones); an unpinned lease still is.
TEST(LeaseAdapterTest, APinnedLeaseIsNeverMovedWhereItsPinWouldMoveItAgain) {
  Topology t = TwoSocketCxl(64 * kMiB);
  for (auto& n : t.numa_nodes) {
    n.kernel_zone_bytes = 64 * kMiB;
    n.movable_bytes = 0;
  }
  t.numa_nodes[2].kernel_zone_bytes = 0;  // node 2: movable only
  t.numa_nodes[2].movable_bytes = 64 * kMiB;
  Harness h(t);
  h.Connect(1);
  LeaseManagerTable table(h.mgr.get(), /*local=*/true);
  AllocParams pinned;
  pinned.size_bytes = 4 * kMiB;
  pinned.numa_node = 0;
  pinned.long_term_pin = true;
  auto a = h.Alloc(1, pinned);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto b = h.Alloc(1, 4 * kMiB, 0);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(table.Find(b->lease.id)->demote_pool, "node2");  // the CXL nearest node0
  EXPECT_EQ(table.Find(a->lease.id)->demote_pool, "node3");  // its pin stays there
  EXPECT_EQ(table.Find(a->lease.id)->promote_pool, "node0");
  t.numa_nodes[3].kernel_zone_bytes = 16 * kMiB;  // node 3: mixed
  t.numa_nodes[3].movable_bytes = 48 * kMiB;
  Harness mixed(t);
  mixed.Connect(1);
  LeaseManagerTable mixed_table(mixed.mgr.get(), /*local=*/true);
  auto c = mixed.Alloc(1, pinned);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(mixed_table.Find(c->lease.id)->demote_pool, "");  // no CXL keeps its pin
}

TEST(LeaseAdapterTest, AMoveCountsInBothPoolsUntilCommittedThenOnlyTheNewOne) {
  Harness h(TwoSocketCxl(16 * kMiB));
  h.Connect(1);
  LeaseManagerTable table(h.mgr.get(), true);
  auto g = h.Alloc(1, 4 * kMiB, 0);
  ASSERT_TRUE(g.ok());
  const uint64_t id = g->lease.id;
  EXPECT_EQ(QuotaUse(h, "dram").first, 4 * kMiB);
  ASSERT_TRUE(table.BeginMove(id, 0, "node2").ok());
  EXPECT_EQ(Used(h.Pool("node0")), 4 * kMiB);
  EXPECT_EQ(Used(h.Pool("node2")), 4 * kMiB);  // reserved
  EXPECT_EQ(QuotaUse(h, "cxl").first, 4 * kMiB);
  EXPECT_EQ(table.Find(id)->moving_to, "node2");
  EXPECT_EQ(table.BeginMove(id, 0, "node3").code(), Code::kAlreadyExists);
  ASSERT_TRUE(table.CommitMove(id, 0).ok());
  EXPECT_EQ(Used(h.Pool("node0")), 0u);
  EXPECT_EQ(Used(h.Pool("node2")), 4 * kMiB);
  EXPECT_EQ(h.Pool("node2").lease_count, 1u);
  EXPECT_EQ(h.Pool("node0").lease_count, 0u);
  EXPECT_EQ(QuotaUse(h, "dram").first, 0u);
  EXPECT_EQ(QuotaUse(h, "cxl").first, 4 * kMiB);
  auto snap = h.mgr->Stat(1, id);
  ASSERT_TRUE(snap.ok());
  EXPECT_EQ(snap->pool, "node2");
  EXPECT_EQ(snap->numa_node, 2);
  EXPECT_EQ(snap->kind, "cxl");
  // Said as for a move a long-term pin made (LeaseManager::Rehome).
  EXPECT_EQ(snap->placed_numa_node, std::optional<int>(0));
  EXPECT_NE(snap->moved_reason.find("the tiering engine moved its pages from node 0 to node 2"),
            std::string::npos)
      << snap->moved_reason;
  EXPECT_EQ(h.mgr->Counters()["leases_moved"], 1u);
  EXPECT_TRUE(table.Find(id)->moving_to.empty());
  EXPECT_EQ(table.CommitMove(id, 0).code(), Code::kInternal);
  // Release: everything returns to zero.
  ASSERT_TRUE(h.mgr->Release(1, id).ok());
  h.Drain();
  for (const auto& p : h.mgr->Pools()) EXPECT_EQ(Used(p), 0u) << p.name;
}

// One mover at a time: a holder reporting pages elsewhere (LEASE_MOVED,
// LeaseManager::CheckMoved) while the engine moves the lease changes
// nothing; the engine's commit accounts the lease once. The harness's pools
// do not bind, so a lease accounted to CXL node 2 really sits on this
// machine's node 0, as after a move.
TEST(LeaseAdapterTest, APinReportDuringATieringMoveIsLeftToThatMove) {
  Harness h(TwoSocketCxl(16 * kMiB));
  h.Connect(1);
  LeaseManagerTable table(h.mgr.get(), true);
  auto g = h.Alloc(1, 4 * kMiB, 2);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const uint64_t id = g->lease.id;
  ASSERT_TRUE(table.BeginMove(id, 0, "node0").ok());
  auto during = h.mgr->CheckMoved(1, id);
  if (!during.ok() && during.status().code() == Code::kUnsupported) {
    GTEST_SKIP() << during.status().ToString();
  }
  ASSERT_TRUE(during.ok()) << during.status().ToString();
  EXPECT_FALSE(during->moved);
  EXPECT_EQ(Used(h.Pool("node2")), 4 * kMiB);
  EXPECT_EQ(Used(h.Pool("node0")), 4 * kMiB);  // reserved by the move
  EXPECT_EQ(h.mgr->Counters()["leases_moved"], 0u);
  ASSERT_TRUE(table.CommitMove(id, 0).ok());
  EXPECT_EQ(Used(h.Pool("node2")), 0u);
  EXPECT_EQ(Used(h.Pool("node0")), 4 * kMiB);
  EXPECT_EQ(h.mgr->Counters()["leases_moved"], 1u);
  auto after = h.mgr->CheckMoved(1, id);
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  EXPECT_FALSE(after->moved);  // where it is accounted now
  EXPECT_EQ(after->lease.pool, "node0");
  EXPECT_EQ(after->lease.placed_numa_node, std::optional<int>(2));
  EXPECT_EQ(h.mgr->Counters()["leases_moved"], 1u);
}

// A split lease whose pages are not where its pools say (the harness's pools
// do not bind: extent 1, accounted to CXL node 2 after its move, is really on
// this machine's node 0): the holder's report names the group that is off,
// and the lease is accounted where its pages are, whole again.
TEST(LeaseAdapterTest, APinReportOnASplitLeaseNamesTheExtentsThatAreElsewhere) {
  Harness h(TwoSocketCxl(16 * kMiB));
  h.mgr->SetMaxExtentBytes(2 * kMiB);
  h.Connect(1);
  LeaseManagerTable table(h.mgr.get(), true);
  auto g = h.Alloc(1, 5 * kMiB, 0);  // extents of 2, 2 and 1 MiB
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const uint64_t id = g->lease.id;
  ASSERT_TRUE(table.BeginMove(id, 1, "node2").ok());
  ASSERT_TRUE(table.CommitMove(id, 1).ok());
  ASSERT_EQ(h.mgr->Stat(1, id)->extent_pools,
            (std::vector<std::string>{"node0", "node2", "node0"}));
  auto moved = h.mgr->CheckMoved(1, id);
  if (!moved.ok() && moved.status().code() == Code::kUnsupported) {
    GTEST_SKIP() << moved.status().ToString();
  }
  ASSERT_TRUE(moved.ok()) << moved.status().ToString();
  if (moved->lease.numa_node != 0) GTEST_SKIP() << "the pages are not on node 0 here";
  EXPECT_TRUE(moved->moved);
  const std::string& why = moved->lease.moved_reason;
  EXPECT_NE(why.find("pages moved: 1 of 3 extents (2.0 MiB) accounted to node2 are on node 0; "
                     "most of the lease is on node 0 (daemon's move_pages:"),
            std::string::npos)
      << why;
  EXPECT_EQ(why.find("from node 0 to node 0"), std::string::npos) << why;
  EXPECT_EQ(moved->lease.pool, "node0");
  EXPECT_TRUE(moved->lease.extent_pools.empty()) << "whole again, where its pages are";
  EXPECT_EQ(Used(h.Pool("node2")), 0u);
  EXPECT_EQ(Used(h.Pool("node0")), 5 * kMiB);
}

TEST(LeaseAdapterTest, AbortReleasesTheReservationOrKeepsItWithASplitNote) {
  Harness h(TwoSocketCxl(16 * kMiB));
  h.Connect(1);
  LeaseManagerTable table(h.mgr.get(), true);
  auto g = h.Alloc(1, 4 * kMiB, 0);
  const uint64_t id = g->lease.id;
  ASSERT_TRUE(table.BeginMove(id, 0, "node2").ok());
  ASSERT_TRUE(table.AbortMove(id, 0, "").ok());
  EXPECT_EQ(Used(h.Pool("node2")), 0u);
  EXPECT_EQ(QuotaUse(h, "cxl").first, 0u);
  EXPECT_TRUE(table.Find(id)->moving_to.empty());
  ASSERT_TRUE(table.BeginMove(id, 0, "node2").ok());
  ASSERT_TRUE(table.AbortMove(id, 0, "split: 12 pages on node 2").ok());
  EXPECT_EQ(Used(h.Pool("node2")), 4 * kMiB);  // the pages there are accounted
  EXPECT_EQ(table.Find(id)->moving_note, "split: 12 pages on node 2");
  EXPECT_EQ(table.Find(id)->moving_to, "node2");
  // The lease ends while split: both pools are whole again once reclaimed.
  ASSERT_TRUE(h.mgr->Release(1, id).ok());
  h.Drain();
  EXPECT_EQ(Used(h.Pool("node0")), 0u);
  EXPECT_EQ(Used(h.Pool("node2")), 0u);
  EXPECT_EQ(QuotaUse(h, "cxl").first, 0u);
  EXPECT_TRUE(table.AbortMove(id, 0, "").ok());  // gone: nothing to undo
  EXPECT_EQ(table.CommitMove(id, 0).code(), Code::kNotFound);
}

TEST(LeaseAdapterTest, MovesAreRefusedForRoomQuotaAndSamePool) {
  DaemonConfig cfg = TestConfig();
  cfg.quotas.push_back(testing::UidQuota(1000, 2 * kMiB, "cxl"));
  Harness h(TwoSocketCxl(16 * kMiB), cfg);
  h.Connect(1);
  LeaseManagerTable table(h.mgr.get(), true);
  auto g = h.Alloc(1, 4 * kMiB, 0);
  ASSERT_TRUE(g.ok());
  const uint64_t id = g->lease.id;
  Status q = table.BeginMove(id, 0, "node2");
  EXPECT_EQ(q.code(), Code::kResourceExhausted);
  EXPECT_NE(q.message().find("node2: "), std::string::npos) << q.message();
  EXPECT_NE(q.message().find("quota"), std::string::npos) << q.message();
  EXPECT_EQ(table.BeginMove(id, 0, "node0").code(), Code::kInvalidArgument);
  EXPECT_EQ(table.BeginMove(id, 0, "node9").code(), Code::kNotFound);
  // No room on node1 (filled by another lease).
  ASSERT_TRUE(h.Alloc(1, 14 * kMiB, 1).ok());
  Status room = table.BeginMove(id, 0, "node1");
  EXPECT_EQ(room.code(), Code::kResourceExhausted);
  EXPECT_NE(room.message().find("node1 has 2.0 MiB free of 16.0 MiB"), std::string::npos)
      << room.message();
  for (const auto& p : h.mgr->Pools()) {
    EXPECT_LE(p.leased_bytes + p.reclaiming_bytes, p.capacity_bytes) << p.name;
  }
}

TEST(LeaseAdapterTest, TheJournalKeepsAnUnfinishedMoveAndARestartAccountsItAgain) {
  FakeStore store;
  FakeProbe probe;
  probe.start[101] = 0;  // the holder (Harness: pid 100 + conn)
  uint64_t id = 0;
  {
    Harness h(TwoSocketCxl(16 * kMiB));
    h.mgr->EnableRestart(&store, &probe, 1);
    h.Connect(1);
    LeaseManagerTable table(h.mgr.get(), true);
    auto g = h.Alloc(1, 4 * kMiB, 0);
    ASSERT_TRUE(g.ok());
    id = g->lease.id;
    ASSERT_TRUE(table.BeginMove(id, 0, "node2").ok());
    EXPECT_EQ(store.leases.at(id).migrating_to_pool, "node2");
    EXPECT_EQ(store.leases.at(id).pool, "node0");
    h.mgr->HandOver();  // the daemon is killed mid-migration
  }
  // The next daemon: the lease is on node0 on paper, with room on node2
  // reserved again for the move that was under way.
  {
    Harness h(TwoSocketCxl(16 * kMiB));
    Restart(h, store, probe, 100);
    LeaseManagerTable table(h.mgr.get(), true);
    auto f = table.Find(id);
    ASSERT_TRUE(f.has_value());
    EXPECT_EQ(f->units[0].pool, "node0");
    EXPECT_EQ(f->moving_to, "node2");
    EXPECT_NE(f->moving_note.find("interrupted by a daemon restart"), std::string::npos);
    EXPECT_NE(f->not_movable.find("not back since the daemon restarted"), std::string::npos);
    EXPECT_EQ(Used(h.Pool("node0")), 4 * kMiB);
    EXPECT_EQ(Used(h.Pool("node2")), 4 * kMiB);
    EXPECT_EQ(h.mgr->Counters().at("restart_interrupted_moves"), 1u);
    h.mgr->HandOver();
  }
  // A restart where node2 has no room left: the move is finished backwards.
  {
    Harness h(TwoSocketCxl(16 * kMiB), Node2Of2MiB());
    Restart(h, store, probe, 200);
    LeaseManagerTable table(h.mgr.get(), true);
    auto f = table.Find(id);
    ASSERT_TRUE(f.has_value());
    EXPECT_EQ(f->moving_to, "node0");
    EXPECT_NE(f->moving_note.find("has no room now"), std::string::npos) << f->moving_note;
    EXPECT_EQ(Used(h.Pool("node2")), 0u);
    h.mgr->HandOver();
  }
}

// A lease of several extents: one unit per extent (its own memfd, at its
// place in the mapping), each accounted to its own pool. A move reserves
// room for its extent only on the target and charges that extent's bytes
// in the target's tier; its commit moves that extent's bytes and charge
// off its old pool, and the lease stays split (accounted to the pool
// holding most of it) until every extent is on one pool. Every step is
// journalled: each extent's pool, and which extent's move is under way. A
// split lease that ends gives each pool its own bytes back.
TEST(LeaseAdapterTest, EachExtentIsAUnitAccountedToItsOwnPoolAtEveryStep) {
  FakeStore store;
  FakeProbe probe;
  probe.start[101] = 0;
  Harness h(TwoSocketCxl(16 * kMiB));
  h.mgr->SetMaxExtentBytes(2 * kMiB);
  h.mgr->EnableRestart(&store, &probe, 1);
  h.Connect(1);
  LeaseManagerTable table(h.mgr.get(), true);
  auto g = h.Alloc(1, 5 * kMiB, 0);  // extents of 2, 2 and 1 MiB
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  ASSERT_EQ(g->extents.size(), 3u);
  const uint64_t id = g->lease.id;
  auto f = table.Find(id);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->not_movable, "");
  ASSERT_EQ(f->units.size(), 3u);
  uint64_t offset = 0;
  for (uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(f->units[i].offset, offset);
    EXPECT_EQ(f->units[i].length, g->extents[i].size_bytes);
    EXPECT_EQ(f->units[i].pool, "node0");
    offset += f->units[i].length;
    // Each unit opens its own extent's memfd, from its start.
    auto mem = table.OpenUnit(id, i);
    ASSERT_TRUE(mem.ok()) << mem.status().ToString();
    struct stat a {
    }, b{};
    ASSERT_EQ(::fstat(mem->fd.get(), &a), 0);
    ASSERT_EQ(::fstat(g->extents[i].fd, &b), 0);
    EXPECT_EQ(a.st_ino, b.st_ino) << i;
    EXPECT_EQ(mem->file_offset, 0u);
  }
  EXPECT_EQ(table.OpenUnit(id, 3).status().code(), Code::kNotFound);
  EXPECT_EQ(table.BeginMove(id, 3, "node2").code(), Code::kNotFound);
  EXPECT_TRUE(store.leases.at(id).extent_pools.empty());
  EXPECT_EQ(h.Pool("node0").lease_count, 1u);
  EXPECT_EQ(QuotaUse(h, "dram"), std::make_pair(5 * kMiB, uint64_t{1}));
  // Begin: room for extent 1 (2 MiB) only, reserved on node2 and charged in cxl.
  ASSERT_TRUE(table.BeginMove(id, 1, "node2").ok());
  EXPECT_EQ(Used(h.Pool("node0")), 5 * kMiB);
  EXPECT_EQ(Used(h.Pool("node2")), 2 * kMiB);
  EXPECT_EQ(h.Pool("node2").lease_count, 0u);  // its room only
  EXPECT_EQ(QuotaUse(h, "dram").first, 5 * kMiB);
  EXPECT_EQ(QuotaUse(h, "cxl"), std::make_pair(2 * kMiB, uint64_t{0}));
  f = table.Find(id);
  EXPECT_EQ(f->moving_to, "node2");
  EXPECT_EQ(f->moving_unit, 1u);
  EXPECT_FALSE(f->moving_back);
  EXPECT_EQ(store.leases.at(id).migrating_to_pool, "node2");
  EXPECT_EQ(store.leases.at(id).migrating_extent, std::optional<uint32_t>(1));
  EXPECT_TRUE(store.leases.at(id).extent_pools.empty());
  EXPECT_EQ(h.mgr->Stat(1, id)->migration, "to node2: extent 1");
  // One move per lease at a time; a commit or an abort names its extent.
  EXPECT_EQ(table.BeginMove(id, 0, "node3").code(), Code::kAlreadyExists);
  EXPECT_EQ(table.BeginMove(id, 1, "node3").code(), Code::kAlreadyExists);
  EXPECT_EQ(table.CommitMove(id, 0).code(), Code::kInternal);
  EXPECT_TRUE(table.AbortMove(id, 0, "").ok());  // not that extent's move: nothing undone
  EXPECT_EQ(table.Find(id)->moving_to, "node2");
  EXPECT_EQ(Used(h.Pool("node2")), 2 * kMiB);
  // Commit: extent 1's bytes and charge leave node0; the lease is split.
  ASSERT_TRUE(table.CommitMove(id, 1).ok());
  EXPECT_EQ(Used(h.Pool("node0")), 3 * kMiB);
  EXPECT_EQ(Used(h.Pool("node2")), 2 * kMiB);
  EXPECT_EQ(h.Pool("node0").leased_bytes, 3 * kMiB);
  EXPECT_EQ(h.Pool("node2").leased_bytes, 2 * kMiB);
  // Each pool and each tier counts the split lease once; all tiers once too.
  EXPECT_EQ(h.Pool("node0").lease_count, 1u);
  EXPECT_EQ(h.Pool("node2").lease_count, 1u);
  EXPECT_EQ(QuotaUse(h, "dram"), std::make_pair(3 * kMiB, uint64_t{1}));
  EXPECT_EQ(QuotaUse(h, "cxl"), std::make_pair(2 * kMiB, uint64_t{1}));
  EXPECT_EQ(QuotaUse(h, ""), std::make_pair(5 * kMiB, uint64_t{1}));
  f = table.Find(id);
  EXPECT_TRUE(f->moving_to.empty());
  EXPECT_EQ(UnitPools(*f), (std::vector<std::string>{"node0", "node2", "node0"}));
  EXPECT_EQ(UnitNodes(*f), (std::vector<int>{0, 2, 0}));
  auto info = h.mgr->Stat(1, id);  // what cxlpoolctl leases shows
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->pool, "node0");  // holds most of it
  EXPECT_EQ(info->numa_node, 0);
  EXPECT_EQ(info->kind, "dram");
  EXPECT_EQ(info->spread, "2 of 3 extents (3.0 MiB) on node0, 1 of 3 extents (2.0 MiB) on node2");
  EXPECT_EQ(info->extent_pools, (std::vector<std::string>{"node0", "node2", "node0"}));
  EXPECT_EQ(info->extent_nodes, (std::vector<int>{0, 2, 0}));
  EXPECT_EQ(info->migration, "");
  EXPECT_NE(info->moved_reason.find("the tiering engine moved extent 1 (2.0 MiB) from node 0 to "
                                    "node 2; 2 of 3 extents (3.0 MiB) on node0"),
            std::string::npos)
      << info->moved_reason;
  EXPECT_EQ(store.leases.at(id).pool, "node0");
  EXPECT_EQ(store.leases.at(id).extent_pools,
            (std::vector<std::string>{"node0", "node2", "node0"}));
  EXPECT_EQ(store.leases.at(id).migrating_to_pool, "");
  EXPECT_FALSE(store.leases.at(id).migrating_extent.has_value());
  EXPECT_EQ(h.mgr->Counters()["pool_move_extents_done"], 1u);
  EXPECT_EQ(h.mgr->Counters()["leases_moved"], 0u);  // not whole anywhere
  EXPECT_EQ(table.CommitMove(id, 1).code(), Code::kInternal);
  // A move of one extent that ends with nothing moved: its room and charge go.
  ASSERT_TRUE(table.BeginMove(id, 0, "node2").ok());
  EXPECT_EQ(Used(h.Pool("node2")), 4 * kMiB);
  EXPECT_EQ(QuotaUse(h, "cxl").first, 4 * kMiB);
  ASSERT_TRUE(table.AbortMove(id, 0, "").ok());
  EXPECT_EQ(Used(h.Pool("node0")), 3 * kMiB);
  EXPECT_EQ(Used(h.Pool("node2")), 2 * kMiB);
  EXPECT_EQ(QuotaUse(h, "cxl").first, 2 * kMiB);
  EXPECT_TRUE(table.Find(id)->moving_to.empty());
  EXPECT_EQ(store.leases.at(id).migrating_to_pool, "");
  EXPECT_EQ(h.mgr->Counters()["pool_moves_aborted"], 1u);
  // Left split with a note: the room and the charge stay, and the note is
  // what the lease says until a later move of that extent finishes.
  ASSERT_TRUE(table.BeginMove(id, 0, "node2").ok());
  ASSERT_TRUE(table.AbortMove(id, 0, "split: 12 pages on node 2").ok());
  EXPECT_EQ(Used(h.Pool("node2")), 4 * kMiB);
  EXPECT_EQ(h.Pool("node2").lease_count, 1u);
  EXPECT_EQ(QuotaUse(h, "cxl").first, 4 * kMiB);
  f = table.Find(id);
  EXPECT_EQ(f->moving_to, "node2");
  EXPECT_EQ(f->moving_unit, 0u);
  EXPECT_EQ(f->moving_note, "split: 12 pages on node 2");
  EXPECT_EQ(h.mgr->Stat(1, id)->migration, "to node2: extent 0; split: 12 pages on node 2");
  EXPECT_EQ(store.leases.at(id).migrating_to_pool, "node2");
  EXPECT_EQ(store.leases.at(id).migrating_extent, std::optional<uint32_t>(0));
  EXPECT_EQ(h.mgr->Counters()["pool_moves_split"], 1u);
  EXPECT_EQ(table.BeginMove(id, 2, "node2").code(), Code::kAlreadyExists);
  // It finishes: 4 of the 5 MiB are on node2, so the lease is accounted there.
  ASSERT_TRUE(table.CommitMove(id, 0).ok());
  EXPECT_EQ(Used(h.Pool("node0")), 1 * kMiB);
  EXPECT_EQ(Used(h.Pool("node2")), 4 * kMiB);
  EXPECT_EQ(QuotaUse(h, "dram").first, 1 * kMiB);
  EXPECT_EQ(QuotaUse(h, "cxl").first, 4 * kMiB);
  info = h.mgr->Stat(1, id);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->pool, "node2");
  EXPECT_EQ(info->numa_node, 2);
  EXPECT_EQ(info->kind, "cxl");
  EXPECT_EQ(info->spread, "2 of 3 extents (4.0 MiB) on node2, 1 of 3 extents (1.0 MiB) on node0");
  EXPECT_EQ(info->extent_pools, (std::vector<std::string>{"node2", "node2", "node0"}));
  EXPECT_EQ(info->migration, "");
  EXPECT_EQ(store.leases.at(id).pool, "node2");
  EXPECT_EQ(store.leases.at(id).extent_pools,
            (std::vector<std::string>{"node2", "node2", "node0"}));
  EXPECT_EQ(h.mgr->Counters()["pool_move_extents_done"], 2u);
  EXPECT_EQ(h.mgr->Counters()["leases_moved"], 0u);
  // The last extent: the lease is whole on node2.
  ASSERT_TRUE(table.BeginMove(id, 2, "node2").ok());
  EXPECT_EQ(Used(h.Pool("node2")), 5 * kMiB);
  EXPECT_EQ(QuotaUse(h, "cxl").first, 5 * kMiB);
  EXPECT_EQ(h.mgr->Stat(1, id)->migration, "to node2: extent 2");
  ASSERT_TRUE(table.CommitMove(id, 2).ok());
  f = table.Find(id);
  EXPECT_TRUE(f->moving_to.empty());
  EXPECT_EQ(UnitPools(*f), (std::vector<std::string>{"node2", "node2", "node2"}));
  EXPECT_EQ(Used(h.Pool("node0")), 0u);
  EXPECT_EQ(Used(h.Pool("node2")), 5 * kMiB);
  EXPECT_EQ(h.Pool("node0").lease_count, 0u);
  EXPECT_EQ(h.Pool("node2").lease_count, 1u);
  EXPECT_EQ(QuotaUse(h, "dram"), std::make_pair(uint64_t{0}, uint64_t{0}));
  EXPECT_EQ(QuotaUse(h, "cxl"), std::make_pair(5 * kMiB, uint64_t{1}));
  EXPECT_EQ(QuotaUse(h, ""), std::make_pair(5 * kMiB, uint64_t{1}));
  info = h.mgr->Stat(1, id);
  EXPECT_EQ(info->pool, "node2");
  EXPECT_EQ(info->spread, "");
  EXPECT_TRUE(info->extent_pools.empty());
  EXPECT_TRUE(info->extent_nodes.empty());
  EXPECT_EQ(store.leases.at(id).pool, "node2");
  EXPECT_TRUE(store.leases.at(id).extent_pools.empty());
  EXPECT_EQ(h.mgr->Counters()["leases_moved"], 1u);
  EXPECT_EQ(h.mgr->Counters()["pool_move_extents_done"], 3u);
  // Split between tiers again (extent 2 on node0), with a move of extent 0
  // to node1 under way when the lease ends: each pool gets its own bytes
  // back (one reclaim each), and each tier its charge.
  ASSERT_TRUE(table.BeginMove(id, 2, "node0").ok());
  ASSERT_TRUE(table.CommitMove(id, 2).ok());
  ASSERT_TRUE(table.BeginMove(id, 0, "node1").ok());
  EXPECT_EQ(Used(h.Pool("node0")), 1 * kMiB);
  EXPECT_EQ(Used(h.Pool("node1")), 2 * kMiB);
  EXPECT_EQ(Used(h.Pool("node2")), 4 * kMiB);
  EXPECT_EQ(QuotaUse(h, "dram").first, 3 * kMiB);
  EXPECT_EQ(QuotaUse(h, "cxl").first, 4 * kMiB);
  ASSERT_TRUE(h.mgr->Release(1, id).ok());
  EXPECT_EQ(h.Pool("node0").reclaiming_bytes, 1 * kMiB);
  EXPECT_EQ(h.Pool("node2").reclaiming_bytes, 4 * kMiB);
  EXPECT_EQ(Used(h.Pool("node1")), 0u);  // the move's room
  EXPECT_EQ(QuotaUse(h, "dram").first, 0u);
  EXPECT_EQ(QuotaUse(h, "cxl").first, 0u);
  h.Drain();
  for (const auto& p : h.mgr->Pools()) {
    EXPECT_EQ(Used(p), 0u) << p.name;
    EXPECT_EQ(p.reclaiming_bytes, 0u) << p.name;
    EXPECT_EQ(p.lease_count, 0u) << p.name;
  }
  EXPECT_EQ(QuotaUse(h, ""), std::make_pair(uint64_t{0}, uint64_t{0}));
  EXPECT_EQ(store.leases.count(id), 0u);
  EXPECT_EQ(table.CommitMove(id, 0).code(), Code::kNotFound);
}

// A restart brings a split lease back split (each pool reserves its own
// extents' bytes again, the tenant charged in each tier), and the move of
// the extent that was under way with room reserved again on its target
// for that extent only; the engine finishes that one move and nothing
// else. A split lease released by the next daemon gives each pool its bytes.
TEST(LeaseAdapterTest, ASplitLeaseComesBackSplitWithItsExtentMoveAndTheEngineFinishesIt) {
  Interrupted m;
  auto& [store, probe, fds, id] = m;
  ExpectJournalledSplitWithExtent1Moving(store.leases.at(id));
  Harness h(TwoSocketCxl(16 * kMiB));
  h.mgr->SetMaxExtentBytes(2 * kMiB);
  RestartWithMemory(h, store, probe, 200, fds);
  LeaseManagerTable table(h.mgr.get(), true);
  auto f = table.Find(id);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->not_movable, "");  // its memory is back (the fd store)
  EXPECT_EQ(UnitPools(*f), (std::vector<std::string>{"node2", "node0", "node0"}));
  EXPECT_EQ(UnitNodes(*f), (std::vector<int>{2, 0, 0}));
  EXPECT_EQ(f->moving_to, "node2");
  EXPECT_EQ(f->moving_unit, 1u);
  EXPECT_FALSE(f->moving_back);
  EXPECT_EQ(f->moving_note,
            "interrupted by a daemon restart; extent 1 (2.0 MiB) may be on node0 and node2 until "
            "the move is finished");
  EXPECT_EQ(Used(h.Pool("node0")), 4 * kMiB);
  EXPECT_EQ(Used(h.Pool("node2")), 4 * kMiB);  // extent 0 + extent 1's room
  EXPECT_EQ(h.Pool("node0").lease_count, 1u);
  EXPECT_EQ(h.Pool("node2").lease_count, 1u);
  EXPECT_EQ(QuotaUse(h, "dram"), std::make_pair(4 * kMiB, uint64_t{1}));
  EXPECT_EQ(QuotaUse(h, "cxl"), std::make_pair(4 * kMiB, uint64_t{1}));
  EXPECT_EQ(QuotaUse(h, ""), std::make_pair(8 * kMiB, uint64_t{1}));
  EXPECT_EQ(h.mgr->Counters()["restart_interrupted_moves"], 1u);
  h.Connect(1);  // the owner asks (cxlpoolctl leases)
  auto info = h.mgr->Stat(1, id);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->pool, "node0");
  EXPECT_EQ(info->spread, "2 of 3 extents (4.0 MiB) on node0, 1 of 3 extents (2.0 MiB) on node2");
  EXPECT_EQ(info->migration,
            "to node2: extent 1; interrupted by a daemon restart; extent 1 (2.0 MiB) may be on "
            "node0 and node2 until the move is finished");
  // The engine finishes that move (extent 1 only) before anything new.
  FakeMigrator migrator;
  FakeChannel channel;
  auto engine = MakeEngine(h, &table, &migrator, &channel);
  ASSERT_TRUE(OneRoundMovesOneExtentTo(h, *engine, migrator, 2));
  auto rep = engine->Report(std::nullopt);
  ASSERT_EQ(rep.history.size(), 1u);
  EXPECT_EQ(rep.history[0].direction, "resume");
  EXPECT_EQ(rep.history[0].unit, 1u);
  EXPECT_EQ(rep.history[0].bytes, 2 * kMiB);
  EXPECT_EQ(rep.history[0].from_pool, "node0");
  EXPECT_EQ(rep.history[0].to_pool, "node2");
  EXPECT_EQ(rep.history[0].outcome, "moved") << rep.history[0].detail;
  f = table.Find(id);
  EXPECT_TRUE(f->moving_to.empty()) << f->moving_note;
  ExpectTwoOnNode2OneOnNode0(h, *f);
  EXPECT_EQ(h.mgr->Stat(1, id)->pool, "node2");
  EXPECT_EQ(store.leases.at(id).pool, "node2");
  EXPECT_EQ(store.leases.at(id).extent_pools,
            (std::vector<std::string>{"node2", "node2", "node0"}));
  EXPECT_EQ(store.leases.at(id).migrating_to_pool, "");
  EXPECT_FALSE(store.leases.at(id).migrating_extent.has_value());
  EXPECT_EQ(h.mgr->Counters()["pool_move_extents_done"], 1u);
  EXPECT_EQ(h.mgr->Counters()["leases_moved"], 0u);
  engine.reset();
  // The holder comes back and lets go: each pool gets its own bytes back.
  HolderReclaims(h, id, fds.at(id));
  ASSERT_TRUE(h.mgr->Release(1, id).ok());
  EXPECT_EQ(h.Pool("node0").reclaiming_bytes, 2 * kMiB);
  EXPECT_EQ(h.Pool("node2").reclaiming_bytes, 4 * kMiB);
  EXPECT_EQ(QuotaUse(h, "dram").first, 0u);
  EXPECT_EQ(QuotaUse(h, "cxl").first, 0u);
  h.Drain();
  for (const auto& p : h.mgr->Pools()) {
    EXPECT_EQ(Used(p), 0u) << p.name;
    EXPECT_EQ(p.lease_count, 0u) << p.name;
  }
  EXPECT_EQ(store.leases.count(id), 0u);
  CloseAll(fds);
}

// A restart where the target of the extent move under way has no room now
// (node2 holds only the extent already there): that extent, and only that
// one, is moved back to the pool accounting it, journalled at once; the
// split stays as it was. The engine's move back is of that extent alone.
TEST(LeaseAdapterTest, AnExtentMoveWithNoRoomAfterARestartMovesThatExtentBack) {
  Interrupted m;
  auto& [store, probe, fds, id] = m;
  Harness h(TwoSocketCxl(16 * kMiB), Node2Of2MiB());
  h.mgr->SetMaxExtentBytes(2 * kMiB);
  RestartWithMemory(h, store, probe, 200, fds);
  LeaseManagerTable table(h.mgr.get(), true);
  auto f = table.Find(id);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(UnitPools(*f), (std::vector<std::string>{"node2", "node0", "node0"}));
  EXPECT_EQ(f->moving_to, "node0");
  EXPECT_EQ(f->moving_unit, 1u);
  EXPECT_TRUE(f->moving_back);
  EXPECT_EQ(f->not_movable, "");
  EXPECT_EQ(f->moving_note,
            "a move of extent 1 (2.0 MiB) to node2 was interrupted by a daemon restart and it has "
            "no room now; its pages may be split until they are moved back");
  EXPECT_EQ(h.Pool("node0").leased_bytes, 4 * kMiB);
  EXPECT_EQ(h.Pool("node2").leased_bytes, 2 * kMiB);
  EXPECT_EQ(Used(h.Pool("node0")), 4 * kMiB);
  EXPECT_EQ(Used(h.Pool("node2")), 2 * kMiB);  // no room for extent 1 reserved
  EXPECT_EQ(QuotaUse(h, "dram").first, 4 * kMiB);
  EXPECT_EQ(QuotaUse(h, "cxl").first, 2 * kMiB);
  EXPECT_EQ(h.mgr->Counters()["restart_interrupted_moves"], 1u);
  // Journalled at once: a restart now goes on with the move back.
  EXPECT_EQ(store.leases.at(id).migrating_to_pool, "node0");
  EXPECT_EQ(store.leases.at(id).migrating_back_from_pool, "node2");
  EXPECT_EQ(store.leases.at(id).migrating_extent, std::optional<uint32_t>(1));
  EXPECT_EQ(store.leases.at(id).extent_pools,
            (std::vector<std::string>{"node2", "node0", "node0"}));
  h.Connect(1);
  EXPECT_EQ(h.mgr->Stat(1, id)->migration,
            "to node0: extent 1; a move of extent 1 (2.0 MiB) to node2 was interrupted by a "
            "daemon restart and it has no room now; its pages may be split until they are moved "
            "back");
  FakeMigrator migrator;
  FakeChannel channel;
  auto engine = MakeEngine(h, &table, &migrator, &channel);
  ASSERT_TRUE(OneRoundMovesOneExtentTo(h, *engine, migrator, 0));
  auto rep = engine->Report(std::nullopt);
  ASSERT_EQ(rep.history.size(), 1u);
  EXPECT_EQ(rep.history[0].direction, "rollback");
  EXPECT_EQ(rep.history[0].unit, 1u);
  EXPECT_EQ(rep.history[0].to_pool, "node0");
  EXPECT_EQ(rep.history[0].outcome, "moved") << rep.history[0].detail;
  EXPECT_EQ(channel.moved, 0);  // the lease is accounted where it was
  f = table.Find(id);
  EXPECT_TRUE(f->moving_to.empty()) << f->moving_note;
  EXPECT_FALSE(f->moving_back);
  EXPECT_EQ(UnitPools(*f), (std::vector<std::string>{"node2", "node0", "node0"}));
  EXPECT_EQ(Used(h.Pool("node0")), 4 * kMiB);
  EXPECT_EQ(Used(h.Pool("node2")), 2 * kMiB);
  EXPECT_EQ(QuotaUse(h, "dram").first, 4 * kMiB);
  EXPECT_EQ(QuotaUse(h, "cxl").first, 2 * kMiB);
  EXPECT_EQ(h.mgr->Stat(1, id)->migration, "");
  EXPECT_EQ(store.leases.at(id).migrating_to_pool, "");
  EXPECT_EQ(store.leases.at(id).migrating_back_from_pool, "");
  EXPECT_FALSE(store.leases.at(id).migrating_extent.has_value());
  EXPECT_EQ(store.leases.at(id).extent_pools,
            (std::vector<std::string>{"node2", "node0", "node0"}));
  EXPECT_EQ(h.mgr->Counters()["pool_moves_back_done"], 1u);
  EXPECT_EQ(h.mgr->Counters()["pool_move_extents_done"], 0u);
  engine.reset();
  h.mgr->HandOver();
  CloseAll(fds);
}

// A daemon killed during the move back of an extent (the restart before
// found no room on its target) forgets nothing: the move back is journalled
// like a forward move (migrating_to_pool: the extent's own pool,
// migrating_back_from_pool: where the pages come from, migrating_extent),
// the next daemon goes on with it, and at the end the accounting (pool
// bytes, each extent's pool, no migration) is where move_pages finds every
// page of that extent.
TEST(LeaseAdapterTest, ADaemonKilledDuringAnExtentMoveBackGoesOnWithItAfterTheNextRestart) {
  Interrupted m;
  auto& [store, probe, fds, id] = m;
  // Daemon 2: no room on node2, so extent 1 moves back; killed during it.
  {
    Harness h(TwoSocketCxl(16 * kMiB), Node2Of2MiB());
    h.mgr->SetMaxExtentBytes(2 * kMiB);
    RestartWithMemory(h, store, probe, 200, fds);
    LeaseManagerTable table(h.mgr.get(), true);
    FakeMigrator migrator;
    FakeChannel channel;
    auto engine = MakeEngine(h, &table, &migrator, &channel);
    migrator.on_move = [&] { h.mgr->HandOver(); };  // SIGKILL during the move back
    engine->Tick();
    h.Drain();
    ASSERT_EQ(migrator.requests.size(), 1u);
    EXPECT_EQ(migrator.requests[0].target_node, 0);
    auto rep = engine->Report(std::nullopt);
    ASSERT_EQ(rep.history.size(), 1u);
    EXPECT_EQ(rep.history[0].direction, "rollback");
    EXPECT_EQ(rep.history[0].unit, 1u);
    EXPECT_EQ(rep.history[0].outcome, "gone") << rep.history[0].detail;
    engine.reset();
  }
  EXPECT_EQ(store.leases.at(id).migrating_to_pool, "node0");
  EXPECT_EQ(store.leases.at(id).migrating_back_from_pool, "node2");
  EXPECT_EQ(store.leases.at(id).migrating_extent, std::optional<uint32_t>(1));
  EXPECT_EQ(store.leases.at(id).extent_pools,
            (std::vector<std::string>{"node2", "node0", "node0"}));
  // Daemon 3 (still no room on node2): the move back is not forgotten.
  Harness h(TwoSocketCxl(16 * kMiB), Node2Of2MiB());
  h.mgr->SetMaxExtentBytes(2 * kMiB);
  RestartWithMemory(h, store, probe, 300, fds);
  h.Connect(1);  // the owner asks (cxlpoolctl leases)
  LeaseManagerTable table(h.mgr.get(), true);
  auto f = table.Find(id);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->moving_to, "node0");
  EXPECT_TRUE(f->moving_back);
  EXPECT_EQ(f->moving_unit, 1u);
  EXPECT_EQ(UnitPools(*f), (std::vector<std::string>{"node2", "node0", "node0"}));
  EXPECT_EQ(f->moving_note,
            "a move of extent 1 (2.0 MiB) back to node0 from node2 was interrupted by a daemon "
            "restart; its pages may be on node2 until they are moved back");
  EXPECT_EQ(h.mgr->Counters()["restart_interrupted_moves"], 1u);
  auto info = h.mgr->Stat(1, id);  // cxlpoolctl leases: not silently whole
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->pool, "node0");
  EXPECT_EQ(info->extent_pools, (std::vector<std::string>{"node2", "node0", "node0"}));
  EXPECT_EQ(info->migration,
            "to node0: extent 1; a move of extent 1 (2.0 MiB) back to node0 from node2 was "
            "interrupted by a daemon restart; its pages may be on node2 until they are moved back");
  EXPECT_EQ(Used(h.Pool("node0")), 4 * kMiB);
  EXPECT_EQ(Used(h.Pool("node2")), 2 * kMiB);
  EXPECT_EQ(QuotaUse(h, "dram").first, 4 * kMiB);
  EXPECT_EQ(QuotaUse(h, "cxl").first, 2 * kMiB);
  // Finished by the kernel where it may move pages (the accounting alone,
  // on a fake migrator, where it may not).
  const bool kernel_moves = tiering::HaveCapSysNice();
  std::unique_ptr<tiering::Migrator> kernel;
  FakeMigrator fake;
  if (kernel_moves) kernel = tiering::MakeKernelMigrator();
  {
    FakeChannel channel;
    auto engine = MakeEngine(
        h, &table, kernel_moves ? kernel.get() : static_cast<tiering::Migrator*>(&fake), &channel);
    engine->Tick();
    h.Drain();
    auto rep = engine->Report(std::nullopt);
    ASSERT_EQ(rep.history.size(), 1u);
    EXPECT_EQ(rep.history[0].direction, "rollback");
    EXPECT_EQ(rep.history[0].unit, 1u);
    EXPECT_EQ(rep.history[0].outcome, "moved") << rep.history[0].detail;
  }
  if (!kernel_moves) {
    EXPECT_EQ(fake.requests.size(), 1u);
  }
  f = table.Find(id);
  EXPECT_TRUE(f->moving_to.empty()) << f->moving_note;
  EXPECT_EQ(UnitPools(*f), (std::vector<std::string>{"node2", "node0", "node0"}));
  info = h.mgr->Stat(1, id);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->pool, "node0");
  EXPECT_EQ(info->migration, "");
  EXPECT_EQ(store.leases.at(id).migrating_to_pool, "");
  EXPECT_EQ(store.leases.at(id).migrating_back_from_pool, "");
  EXPECT_FALSE(store.leases.at(id).migrating_extent.has_value());
  EXPECT_EQ(Used(h.Pool("node0")), 4 * kMiB);
  EXPECT_EQ(Used(h.Pool("node2")), 2 * kMiB);
  EXPECT_EQ(h.mgr->Counters()["pool_moves_back_done"], 1u);
  if (!kernel_moves) {
    CloseAll(fds);
    GTEST_SKIP() << "the kernel migrator needs CAP_SYS_NICE (the journal and accounting checks "
                    "passed)";
  }
  // Where the kernel says every page of extent 1 is: node 0, which accounts it.
  void* p = ::mmap(nullptr, 2 * kMiB, PROT_READ, MAP_SHARED | MAP_POPULATE, fds.at(id)[1], 0);
  ASSERT_NE(p, MAP_FAILED);
  auto census = CensusPages(p, 2 * kMiB, 4096);
  ::munmap(p, 2 * kMiB);
  ASSERT_TRUE(census.ok()) << census.status().ToString();
  EXPECT_EQ(census->on_node[info->extent_nodes[1]], 512u) << census->ToString();
  CloseAll(fds);
}

// A cooperative move back of one extent (the holder pins the lease, e.g.
// io_uring fixed buffers) pauses the holder once, for the whole lease (it
// pins it as one range), and moves that extent only; a holder that
// declines leaves the move back in place (it is not dropped with pages
// still elsewhere), to be asked again after cooperative_retry.
TEST(LeaseAdapterTest, ACooperativeMoveBackOfAnExtentPausesTheHolderForTheWholeLease) {
  Interrupted m;
  auto& [store, probe, fds, id] = m;
  Harness h(TwoSocketCxl(16 * kMiB), Node2Of2MiB());
  h.mgr->SetMaxExtentBytes(2 * kMiB);
  RestartWithMemory(h, store, probe, 200, fds);
  HolderReclaims(h, id, fds.at(id));
  LeaseManagerTable table(h.mgr.get(), true);
  FakeMigrator migrator;
  FakeChannel channel;
  auto engine = MakeEngine(h, &table, &migrator, &channel);
  ASSERT_TRUE(engine->SetLeaseOptions(OwnerConn(h), id, std::nullopt, true).ok());
  engine->Tick();
  h.Drain();
  ASSERT_EQ(channel.asks.size(), 1u);
  EXPECT_EQ(channel.asks[0].second.offset, 0u);
  EXPECT_EQ(channel.asks[0].second.length, 6 * kMiB);
  EXPECT_EQ(channel.asks[0].second.target_node, 0);
  EXPECT_TRUE(migrator.requests.empty());
  // The holder declines: nothing moves, and the move back stays.
  std::optional<Result<tiering::MigrationOutcome>> answer;
  engine->OnMigrationReady(1, channel.asks[0].second.migration_id, false, "busy",
                           [&](Result<tiering::MigrationOutcome> o) { answer.emplace(o); });
  h.Drain();
  ASSERT_TRUE(answer.has_value() && answer->ok());
  EXPECT_FALSE((*answer)->moved);
  EXPECT_TRUE(migrator.requests.empty());
  auto f = table.Find(id);
  EXPECT_EQ(f->moving_to, "node0") << "a declined move back was dropped";
  EXPECT_EQ(f->moving_unit, 1u);
  EXPECT_TRUE(f->moving_back);
  EXPECT_EQ(f->moving_note,
            "moving extent 1 (2.0 MiB) back to node0 from node2 did not finish; it is tried again");
  EXPECT_EQ(h.mgr->Stat(1, id)->migration,
            "to node0: extent 1; moving extent 1 (2.0 MiB) back to node0 from node2 did not "
            "finish; it is tried again");
  EXPECT_EQ(h.mgr->Counters()["pool_moves_back_unfinished"], 1u);
  EXPECT_EQ(h.mgr->Counters()["pool_moves_aborted"], 0u);
  EXPECT_EQ(store.leases.at(id).migrating_to_pool, "node0");
  EXPECT_EQ(store.leases.at(id).migrating_back_from_pool, "node2");
  EXPECT_EQ(store.leases.at(id).migrating_extent, std::optional<uint32_t>(1));
  EXPECT_EQ(Used(h.Pool("node0")), 4 * kMiB);
  EXPECT_EQ(Used(h.Pool("node2")), 2 * kMiB);
  // Before cooperative_retry: not asked again.
  engine->Tick();
  h.Drain();
  EXPECT_EQ(channel.asks.size(), 1u);
  // After it: asked again, for the whole lease.
  h.clock.AdvanceNs(301'000'000'000);
  engine->Tick();
  h.Drain();
  ASSERT_EQ(channel.asks.size(), 2u);
  const tiering::MigrationAsk ask = channel.asks[1].second;
  EXPECT_EQ(ask.offset, 0u);
  EXPECT_EQ(ask.length, 6 * kMiB);
  EXPECT_EQ(ask.target_node, 0);
  answer.reset();
  engine->OnMigrationReady(1, ask.migration_id, true, "",
                           [&](Result<tiering::MigrationOutcome> o) { answer.emplace(o); });
  h.Drain();
  engine->Tick();  // nothing left to move: no further pause
  h.Drain();
  ASSERT_TRUE(answer.has_value() && answer->ok()) << answer->status().ToString();
  EXPECT_TRUE((*answer)->moved) << (*answer)->detail;
  EXPECT_EQ((*answer)->numa_node, -1);    // extent 0 stays on node2: on no one node
  EXPECT_EQ((*answer)->bytes, 2 * kMiB);  // extent 1 only
  EXPECT_EQ(channel.asks.size(), 2u);
  ASSERT_EQ(migrator.requests.size(), 1u);
  EXPECT_EQ(migrator.requests[0].target_node, 0);
  EXPECT_EQ(migrator.requests[0].length, 2 * kMiB);
  EXPECT_EQ(channel.moved, 0);
  auto rep = engine->Report(std::nullopt);
  ASSERT_FALSE(rep.history.empty());
  EXPECT_EQ(rep.history.back().mode, "cooperative");
  EXPECT_EQ(rep.history.back().direction, "rollback");
  EXPECT_EQ(rep.history.back().unit, 1u);
  EXPECT_EQ(rep.history.back().outcome, "moved");
  f = table.Find(id);
  EXPECT_TRUE(f->moving_to.empty()) << f->moving_note;
  EXPECT_EQ(UnitPools(*f), (std::vector<std::string>{"node2", "node0", "node0"}));
  EXPECT_EQ(Used(h.Pool("node0")), 4 * kMiB);
  EXPECT_EQ(Used(h.Pool("node2")), 2 * kMiB);
  EXPECT_EQ(QuotaUse(h, "dram").first, 4 * kMiB);
  EXPECT_EQ(QuotaUse(h, "cxl").first, 2 * kMiB);
  EXPECT_EQ(store.leases.at(id).migrating_to_pool, "");
  EXPECT_FALSE(store.leases.at(id).migrating_extent.has_value());
  EXPECT_EQ(h.mgr->Counters()["pool_moves_back_done"], 1u);
  engine.reset();
  CloseAll(fds);
}

// A cooperative demotion of a pinned lease of several extents: its holder
// is paused once for the whole lease, and in that pause each extent the
// policy sends to the same pool is begun on its own (room and charge for
// it alone), so an extent refused there (the tenant's cxl quota is full)
// stays where it is and the lease stays split, each extent accounted
// where its pages are.
TEST(LeaseAdapterTest, ACooperativeDemotionBeginsEachExtentOnItsOwnInOnePause) {
  DaemonConfig cfg = TestConfig();
  cfg.quotas.push_back(testing::UidQuota(1000, 4 * kMiB, "cxl"));
  Harness h(TwoSocketCxl(16 * kMiB), cfg);
  h.mgr->SetMaxExtentBytes(2 * kMiB);
  h.Connect(1);
  LeaseManagerTable table(h.mgr.get(), true);
  auto g = h.Alloc(1, 6 * kMiB, 0);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  ASSERT_EQ(g->extents.size(), 3u);
  const uint64_t id = g->lease.id;
  FakeMigrator migrator;
  FakeChannel channel;
  auto engine = MakeEngine(h, &table, &migrator, &channel);
  ASSERT_TRUE(engine->SetLeaseOptions(OwnerConn(h), id, std::nullopt, true).ok());
  tiering::TieringEngine::Signal s;
  s.lease_id = id;
  s.offset = 0;
  s.length = 6 * kMiB;
  s.hint = tiering::Hint::kDontNeed;
  ASSERT_TRUE(engine->OnSignals(OwnerConn(h), {s}).empty());
  engine->Tick();
  h.Drain();
  ASSERT_EQ(channel.asks.size(), 1u);
  const tiering::MigrationAsk ask = channel.asks[0].second;
  EXPECT_EQ(ask.offset, 0u);
  EXPECT_EQ(ask.length, 6 * kMiB);
  EXPECT_EQ(ask.target_node, 2);
  // Only the first extent is begun before the pause: its room alone.
  EXPECT_EQ(table.Find(id)->moving_to, "node2");
  EXPECT_EQ(table.Find(id)->moving_unit, 0u);
  EXPECT_EQ(Used(h.Pool("node2")), 2 * kMiB);
  EXPECT_EQ(QuotaUse(h, "cxl").first, 2 * kMiB);
  std::optional<Result<tiering::MigrationOutcome>> answer;
  engine->OnMigrationReady(1, ask.migration_id, true, "",
                           [&](Result<tiering::MigrationOutcome> o) { answer.emplace(o); });
  h.Drain();
  ASSERT_TRUE(answer.has_value() && answer->ok()) << answer->status().ToString();
  EXPECT_EQ((*answer)->bytes, 4 * kMiB);  // extents 0 and 1
  // Not all the pause was for moved, and the lease is on no one node now.
  EXPECT_FALSE((*answer)->moved);
  EXPECT_EQ((*answer)->numa_node, -1);
  EXPECT_EQ(channel.asks.size(), 1u);  // one pause
  ASSERT_EQ(migrator.requests.size(), 2u);
  for (const auto& r : migrator.requests) {
    EXPECT_EQ(r.target_node, 2);
    EXPECT_EQ(r.length, 2 * kMiB);
  }
  auto f = table.Find(id);
  EXPECT_TRUE(f->moving_to.empty()) << f->moving_note;
  ExpectTwoOnNode2OneOnNode0(h, *f);
  auto info = h.mgr->Stat(1, id);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->pool, "node2");
  EXPECT_EQ(info->spread, "2 of 3 extents (4.0 MiB) on node2, 1 of 3 extents (2.0 MiB) on node0");
  EXPECT_EQ(h.mgr->Counters()["pool_move_extents_done"], 2u);
  EXPECT_EQ(h.mgr->Counters()["leases_moved"], 0u);
  EXPECT_EQ(channel.moved, 1);  // told once: the lease is accounted to node2 now
  // The history: each extent moved in the pause, and extent 2 refused.
  auto rep = engine->Report(std::nullopt);
  std::vector<uint32_t> moved_units;
  bool refused_2 = false;
  for (const auto& r : rep.history) {
    EXPECT_EQ(r.lease_id, id);
    if (r.outcome == "moved") {
      EXPECT_EQ(r.mode, "cooperative");
      EXPECT_EQ(r.direction, "demote");
      moved_units.push_back(r.unit);  // once each
    }
    if (r.outcome == "refused") {
      EXPECT_EQ(r.unit, 2u);
      refused_2 = true;
      EXPECT_NE(r.detail.find("quota"), std::string::npos) << r.detail;
    }
  }
  EXPECT_EQ(moved_units, (std::vector<uint32_t>{0, 1}));
  EXPECT_TRUE(refused_2);
  // Released split: each pool and each tier whole again.
  engine.reset();
  ASSERT_TRUE(h.mgr->Release(1, id).ok());
  h.Drain();
  for (const auto& p : h.mgr->Pools()) EXPECT_EQ(Used(p), 0u) << p.name;
  EXPECT_EQ(QuotaUse(h, "dram").first, 0u);
  EXPECT_EQ(QuotaUse(h, "cxl").first, 0u);
}

}  // namespace
}  // namespace cxlpool
