// LeaseManagerTable and LeaseManager's move accounting on a fake two-socket
// topology with CXL (tests/daemon/test_util.h): what the engine is told of
// each lease (targets near its GPU, why it cannot move), and that a move
// between pools never overcommits, moves the quota charge with the bytes,
// is journalled, survives a lease ending in the middle, and comes back after
// a restart exactly as it was; a move back after a restart is journalled
// like a forward move, so the next restart goes on with it, and a
// cooperative one pauses its holder once for the whole lease (the engine
// over this table, on a fake migrator, or the kernel's verified by move_pages).
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
// no room there for a move that was under way.
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

// Daemon 1 of the move-back tests: a lease of three 2 MiB extents on node0
// whose move to node2 got two extents there when the daemon was killed.
// Returns the lease id; `fds` keeps its extents (the fd store).
uint64_t HalfMoveToNode2(FakeStore& store, FakeProbe& probe,
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
  CXLPOOL_CHECK(table.CommitMove(id, 1).ok());
  h.mgr->HandOver();  // SIGKILL
  return id;
}

// A lease half moved to node2 by a killed daemon 1 (HalfMoveToNode2), with
// the journal and fd store it left.
struct HalfMoved {
  HalfMoved() {
    probe.start[101] = 0;
    id = HalfMoveToNode2(store, probe, fds);
  }
  FakeStore store;
  FakeProbe probe;
  std::map<uint64_t, std::vector<int>> fds;
  uint64_t id = 0;
};

// Daemon 2 over `m`'s journal and fd store, in `h` (node2 with no room).
void RestartWithNoRoomOnNode2(Harness& h, HalfMoved& m) {
  h.mgr->SetMaxExtentBytes(2 * kMiB);
  RestartWithMemory(h, m.store, m.probe, 200, m.fds);
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
// place in the mapping); a move reserves the whole lease on the target, each
// extent's commit puts that extent there, the last one moves the accounting.
// Half moved, every step's accounting is true and says how far it got.
TEST(LeaseAdapterTest, EachExtentIsAUnitAndTheLeaseIsAccountedWholeAtEveryStep) {
  Harness h(TwoSocketCxl(16 * kMiB));
  h.mgr->SetMaxExtentBytes(2 * kMiB);
  h.Connect(1);
  LeaseManagerTable table(h.mgr.get(), true);
  auto g = h.Alloc(1, 5 * kMiB, 0);
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
  // Begin: the whole lease's room is reserved and charged on node2.
  ASSERT_TRUE(table.BeginMove(id, 1, "node2").ok());
  EXPECT_EQ(Used(h.Pool("node0")), 5 * kMiB);
  EXPECT_EQ(Used(h.Pool("node2")), 5 * kMiB);
  EXPECT_EQ(QuotaUse(h, "cxl").first, 5 * kMiB);
  ASSERT_TRUE(table.CommitMove(id, 1).ok());
  f = table.Find(id);
  EXPECT_EQ(f->moving_to, "node2");
  EXPECT_EQ(f->units[0].pool, "node0");
  EXPECT_EQ(f->units[1].pool, "node2");
  EXPECT_EQ(f->units[1].numa_node, 2);
  EXPECT_EQ(f->moving_unit, 0u);
  EXPECT_NE(f->moving_note.find("1 of 3 extents on node2"), std::string::npos) << f->moving_note;
  EXPECT_EQ(Used(h.Pool("node0")), 5 * kMiB);  // still accounted there
  EXPECT_EQ(Used(h.Pool("node2")), 5 * kMiB);
  EXPECT_EQ(h.Pool("node2").lease_count, 0u);
  auto info = h.mgr->Stat(1, id);  // what cxlpoolctl leases shows
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->pool, "node0");
  EXPECT_NE(info->migration.find("to node2: 1 of 3 extents on node2"), std::string::npos)
      << info->migration;
  // The next extent does not finish: the lease stays half moved, the room held.
  ASSERT_TRUE(table.AbortMove(id, 0, "").ok());
  f = table.Find(id);
  EXPECT_EQ(f->moving_to, "node2");
  EXPECT_NE(f->moving_note.find(
                "1 of 3 extents on node2 (node 2); the move of the others did not finish"),
            std::string::npos)
      << f->moving_note;
  EXPECT_EQ(Used(h.Pool("node2")), 5 * kMiB);
  EXPECT_EQ(h.mgr->Counters()["pool_moves_partial"], 1u);
  EXPECT_EQ(table.BeginMove(id, 0, "node3").code(), Code::kAlreadyExists);
  // The others follow; the last one moves the bytes and the charge.
  ASSERT_TRUE(table.CommitMove(id, 0).ok());
  EXPECT_EQ(table.Find(id)->moving_unit, 2u);
  EXPECT_EQ(Used(h.Pool("node0")), 5 * kMiB);
  ASSERT_TRUE(table.CommitMove(id, 2).ok());
  f = table.Find(id);
  EXPECT_TRUE(f->moving_to.empty());
  for (const auto& u : f->units) EXPECT_EQ(u.pool, "node2");
  EXPECT_EQ(Used(h.Pool("node0")), 0u);
  EXPECT_EQ(Used(h.Pool("node2")), 5 * kMiB);
  EXPECT_EQ(h.Pool("node2").lease_count, 1u);
  EXPECT_EQ(QuotaUse(h, "dram").first, 0u);
  EXPECT_EQ(QuotaUse(h, "cxl").first, 5 * kMiB);
  EXPECT_EQ(h.mgr->Counters()["leases_moved"], 1u);
  EXPECT_EQ(h.mgr->Counters()["pool_move_extents_done"], 3u);
  // A move that ends before any extent moved gives the room back.
  ASSERT_TRUE(table.BeginMove(id, 0, "node0").ok());
  ASSERT_TRUE(table.AbortMove(id, 0, "").ok());
  EXPECT_EQ(Used(h.Pool("node0")), 0u);
  // A lease ending half moved: both pools whole again.
  ASSERT_TRUE(table.BeginMove(id, 2, "node3").ok());
  ASSERT_TRUE(table.CommitMove(id, 2).ok());
  ASSERT_TRUE(h.mgr->Release(1, id).ok());
  h.Drain();
  for (const auto& p : h.mgr->Pools()) EXPECT_EQ(Used(p), 0u) << p.name;
  EXPECT_EQ(QuotaUse(h, "cxl").first, 0u);
}

// A restart where the target of a half-finished move of several extents has
// no room now: every extent goes back to the pool that accounts the lease.
TEST(LeaseAdapterTest, AHalfMovedMultiExtentLeaseWithNoRoomAfterARestartMovesBack) {
  HalfMoved m;
  auto& [store, probe, fds, id] = m;
  EXPECT_EQ(store.leases.at(id).extent_pools, (std::vector<std::string>{"node2", "node2", ""}));
  Harness h(TwoSocketCxl(16 * kMiB), Node2Of2MiB());
  Restart(h, store, probe, 200);
  LeaseManagerTable table(h.mgr.get(), true);
  auto f = table.Find(id);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->moving_to, "node0");
  EXPECT_EQ(f->moving_unit, 0u);  // every extent is moved back
  ASSERT_EQ(f->units.size(), 3u);
  EXPECT_EQ(Used(h.Pool("node2")), 0u);
  EXPECT_EQ(Used(h.Pool("node0")), 6 * kMiB);
  h.mgr->HandOver();
  CloseAll(fds);
}

// A daemon killed between extents of a move back (the restart before found
// no room on the target) forgets nothing: the move back is journalled like
// a forward move (migrating_to_pool: the lease's own pool, each extent back
// with migrated_to_pool, the pool the pages come from), the next daemon goes
// on from the first extent not back, and at the end the accounting (pool
// bytes, the lease's pool and node, no migration) is where move_pages finds
// every page.
TEST(LeaseAdapterTest, ADaemonKilledDuringAMoveBackGoesOnWithItAfterTheNextRestart) {
  HalfMoved m;
  auto& [store, probe, fds, id] = m;
  // Daemon 2: no room on node2, so every extent moves back; killed after
  // the first one is back.
  {
    Harness h(TwoSocketCxl(16 * kMiB), Node2Of2MiB());
    RestartWithNoRoomOnNode2(h, m);
    LeaseManagerTable table(h.mgr.get(), true);
    auto f = table.Find(id);
    ASSERT_TRUE(f.has_value());
    EXPECT_EQ(f->moving_to, "node0");
    EXPECT_TRUE(f->moving_back);
    EXPECT_EQ(f->not_movable, "");
    // Journalled at once: a restart now resumes the move back.
    EXPECT_EQ(store.leases.at(id).migrating_to_pool, "node0");
    EXPECT_EQ(store.leases.at(id).migrating_back_from_pool, "node2");
    FakeMigrator migrator;
    FakeChannel channel;
    auto engine = MakeEngine(h, &table, &migrator, &channel);
    migrator.on_move = [&] { engine->Stop(); };  // the daemon dies during extent 0
    engine->Tick();
    h.Drain();
    ASSERT_EQ(migrator.requests.size(), 1u);
    EXPECT_EQ(migrator.requests[0].target_node, 0);
    auto rep = engine->Report(std::nullopt);
    ASSERT_FALSE(rep.history.empty());
    EXPECT_EQ(rep.history.back().direction, "rollback");
    EXPECT_EQ(rep.history.back().outcome, "moved");
    EXPECT_EQ(store.leases.at(id).extent_pools, (std::vector<std::string>{"node0", "", ""}));
    EXPECT_EQ(store.leases.at(id).migrating_to_pool, "node0");
    engine.reset();
    h.mgr->HandOver();
  }
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
  ASSERT_EQ(f->units.size(), 3u);
  EXPECT_TRUE(f->units[0].on_target);
  EXPECT_FALSE(f->units[1].on_target);
  EXPECT_NE(f->moving_note.find("a move back from node2 was interrupted by a daemon restart with "
                                "1 of 3 extents on node0"),
            std::string::npos)
      << f->moving_note;
  auto info = h.mgr->Stat(1, id);  // cxlpoolctl leases: not silently whole
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->pool, "node0");
  EXPECT_NE(info->migration.find("to node0: a move back from node2"), std::string::npos)
      << info->migration;
  EXPECT_EQ(Used(h.Pool("node0")), 6 * kMiB);
  EXPECT_EQ(Used(h.Pool("node2")), 0u);
  if (!tiering::HaveCapSysNice()) {
    CloseAll(fds);
    GTEST_SKIP() << "the kernel migrator needs CAP_SYS_NICE (the journal checks passed)";
  }
  {
    std::unique_ptr<tiering::Migrator> kernel = tiering::MakeKernelMigrator();
    FakeChannel channel;
    auto engine = MakeEngine(h, &table, kernel.get(), &channel);
    engine->Tick();
    h.Drain();
    auto rep = engine->Report(std::nullopt);
    ASSERT_GE(rep.history.size(), 2u);
    for (size_t i = rep.history.size() - 2; i < rep.history.size(); ++i) {
      EXPECT_EQ(rep.history[i].direction, "rollback");
      EXPECT_EQ(rep.history[i].outcome, "moved") << rep.history[i].detail;
    }
    EXPECT_EQ(rep.history[rep.history.size() - 2].unit, 1u);
    EXPECT_EQ(rep.history.back().unit, 2u);
  }
  f = table.Find(id);
  EXPECT_TRUE(f->moving_to.empty()) << f->moving_note;
  info = h.mgr->Stat(1, id);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->pool, "node0");
  EXPECT_EQ(info->migration, "");
  EXPECT_EQ(store.leases.at(id).migrating_to_pool, "");
  EXPECT_EQ(Used(h.Pool("node0")), 6 * kMiB);
  EXPECT_EQ(Used(h.Pool("node2")), 0u);
  EXPECT_EQ(h.mgr->Counters()["pool_moves_back_done"], 1u);
  // Where the kernel says every page of every extent is: the lease's node.
  for (int fd : fds.at(id)) {
    void* p = ::mmap(nullptr, 2 * kMiB, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
    ASSERT_NE(p, MAP_FAILED);
    auto census = CensusPages(p, 2 * kMiB, 4096);
    ::munmap(p, 2 * kMiB);
    ASSERT_TRUE(census.ok()) << census.status().ToString();
    EXPECT_EQ(census->on_node[info->numa_node], 512u) << census->ToString();
  }
  CloseAll(fds);
}

// A cooperative move back (the holder pins the lease, e.g. io_uring fixed
// buffers) pauses the holder once for the whole lease, as a forward move
// does; a holder that declines leaves the move back in place (it is not
// dropped with pages still elsewhere), to be asked again after
// cooperative_retry.
TEST(LeaseAdapterTest, ACooperativeMoveBackPausesTheHolderOnceForTheWholeLease) {
  HalfMoved m;
  auto& [store, probe, fds, id] = m;
  Harness h(TwoSocketCxl(16 * kMiB), Node2Of2MiB());
  RestartWithNoRoomOnNode2(h, m);
  // The holder comes back and hands its lease back.
  h.Connect(1);
  std::vector<LeaseManager::ReclaimItem> items(1);
  items[0].id = id;
  items[0].size_bytes = 6 * kMiB;
  for (int fd : fds.at(id)) {
    items[0].fds.emplace_back(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
    items[0].extent_sizes.push_back(2 * kMiB);
  }
  ASSERT_EQ(h.mgr->Reclaim(1, std::move(items)).accepted.size(), 1u);
  LeaseManagerTable table(h.mgr.get(), true);
  FakeMigrator migrator;
  FakeChannel channel;
  auto engine = MakeEngine(h, &table, &migrator, &channel);
  ASSERT_TRUE(engine->SetLeaseOptions(1, id, std::nullopt, true, false).ok());
  engine->Tick();
  h.Drain();
  ASSERT_EQ(channel.asks.size(), 1u);
  EXPECT_TRUE(migrator.requests.empty());
  // The holder declines: nothing moves, and the move back stays.
  std::optional<Result<tiering::MigrationOutcome>> answer;
  engine->OnMigrationReady(1, channel.asks[0].second.migration_id, false, "busy",
                           [&](Result<tiering::MigrationOutcome> o) { answer.emplace(o); });
  h.Drain();
  ASSERT_TRUE(answer.has_value() && answer->ok());
  EXPECT_FALSE((*answer)->moved);
  auto f = table.Find(id);
  EXPECT_EQ(f->moving_to, "node0") << "a declined move back was dropped";
  EXPECT_NE(f->moving_note.find("did not finish; it is tried again"), std::string::npos)
      << f->moving_note;
  EXPECT_NE(h.mgr->Stat(1, id)->migration, "");
  // After cooperative_retry: asked again, for the whole lease.
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
  EXPECT_EQ((*answer)->numa_node, 0);
  EXPECT_EQ((*answer)->bytes, 6 * kMiB);
  EXPECT_EQ(channel.asks.size(), 2u);  // one pause for all three extents
  ASSERT_EQ(migrator.requests.size(), 3u);
  for (const auto& r : migrator.requests) EXPECT_EQ(r.target_node, 0);
  auto rep = engine->Report(std::nullopt);
  ASSERT_GE(rep.history.size(), 3u);
  for (size_t i = rep.history.size() - 3; i < rep.history.size(); ++i) {
    EXPECT_EQ(rep.history[i].mode, "cooperative");
    EXPECT_EQ(rep.history[i].direction, "rollback");
    EXPECT_EQ(rep.history[i].outcome, "moved");
  }
  f = table.Find(id);
  EXPECT_TRUE(f->moving_to.empty()) << f->moving_note;
  EXPECT_EQ(Used(h.Pool("node0")), 6 * kMiB);
  EXPECT_EQ(Used(h.Pool("node2")), 0u);
  EXPECT_EQ(store.leases.at(id).migrating_to_pool, "");
  engine.reset();
  CloseAll(fds);
}

}  // namespace
}  // namespace cxlpool
