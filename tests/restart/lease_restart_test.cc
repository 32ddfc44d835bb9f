// Restart support of the lease manager on a fake topology, with a fake
// LeaseStore (what would be journalled) and a fake ProcessProbe (who is
// alive, who holds which file): journalling of grants and frees, id
// batches, a refused grant when the journal fails, recovery (dead holders
// dropped, the rest awaiting, the grace period), RECLAIM checks, fd-store
// adoption, and the helpers of daemon/recovery. Real memfds stand in for
// lease memory.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <thread>

#include "lease/restart.h"
#include "recovery.h"
#include "restart_fakes.h"
#include "test_util.h"

namespace cxlpool {
namespace {

using testing::Harness;
using testing::TwoSocketCxl;

using testing::FakeProbe;
using testing::FakeStore;
using testing::Fds;

// A sealed memfd of `size` bytes and the journal record that matches it.
struct TestMemfd {
  UniqueFd fd;
  DurableLease rec;
};
TestMemfd MakeMemfd(uint64_t id, uint64_t size, pid_t owner, uid_t uid = 1000) {
  TestMemfd m;
  m.fd.Reset(::memfd_create("cxlpool-test", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  CXLPOOL_CHECK(m.fd.valid());
  CXLPOOL_CHECK(::ftruncate(m.fd.get(), static_cast<off_t>(size)) == 0);
  CXLPOOL_CHECK(::fcntl(m.fd.get(), F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SEAL) == 0);
  struct stat st {};
  CXLPOOL_CHECK(::fstat(m.fd.get(), &st) == 0);
  m.rec.id = id;
  m.rec.size_bytes = size;
  m.rec.requested_bytes = size;
  m.rec.page_size = 4096;
  m.rec.numa_node = 0;
  m.rec.pool = "node0";
  m.rec.kind = "dram";
  m.rec.backing = "memfd";
  m.rec.owner_pid = owner;
  m.rec.owner_uid = uid;
  m.rec.owner_gid = uid;
  m.rec.owner_start_time = 77;
  m.rec.inode = st.st_ino;
  m.rec.inode_dev = st.st_dev;
  m.rec.holders = {HolderId{owner, 77}};
  return m;
}

// A live process (start time 77) of uid/gid `uid`.
CallerInfo Caller(pid_t pid, uid_t uid = 1000) {
  CallerInfo ci;
  ci.pid = pid;
  ci.uid = uid;
  ci.gid = uid;
  ci.start_time = 77;
  return ci;
}

Pool* NamedPool(LeaseManager& mgr, const std::string& name) {
  for (Pool* p : mgr.pools()) {
    if (p->name() == name) return p;
  }
  return nullptr;
}

UniqueFd Dup(const UniqueFd& fd) { return UniqueFd(::fcntl(fd.get(), F_DUPFD_CLOEXEC, 0)); }

// The fakes outlive the manager (bases are destroyed after the derived part,
// in reverse order: Harness, and its manager, first).
struct Fakes {
  FakeStore store;
  FakeProbe probe;
};
struct RestartHarness : Fakes, Harness {
  RestartHarness() : Harness(TwoSocketCxl()) { mgr->EnableRestart(&store, &probe, 1); }
  // Connect as pid `pid` (start time 77, alive).
  void ConnectPid(ConnId c, pid_t pid, uid_t uid = 1000) {
    probe.start[pid] = 77;
    mgr->Connect(c, Caller(pid, uid));
  }
};

TEST(LeaseRestartTest, GrantsAreJournalledWithInodeAndHolderAndFreesDeleted) {
  RestartHarness h;
  h.ConnectPid(1, 500);
  auto g = h.Alloc(1, 1 << 20, 0);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  uint64_t id = g->lease.id;
  ASSERT_TRUE(h.store.leases.count(id));
  const DurableLease& d = h.store.leases[id];
  struct stat st {};
  ASSERT_EQ(::fstat(g->fd(), &st), 0);
  EXPECT_EQ(d.inode, st.st_ino);
  EXPECT_EQ(d.size_bytes, 1u << 20);
  EXPECT_EQ(d.pool, "node0");
  ASSERT_EQ(d.holders.size(), 1u);
  EXPECT_EQ(d.holders[0].pid, 500);
  EXPECT_EQ(d.holders[0].start_time, 77u);
  EXPECT_TRUE(h.store.stored_fds.count(id));
  // Ids are reserved ahead, in a batch.
  ASSERT_FALSE(h.store.reserved.empty());
  EXPECT_GT(h.store.reserved.front(), id);
  ASSERT_TRUE(h.mgr->Release(1, id).ok());
  EXPECT_TRUE(h.store.deleted.count(id));
  EXPECT_FALSE(h.store.leases.count(id));
}

TEST(LeaseRestartTest, AGrantThatCannotBeJournalledIsRefusedAndFreed) {
  RestartHarness h;
  h.ConnectPid(1, 500);
  h.store.fail_puts = true;
  auto g = h.Alloc(1, 1 << 20, 0);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), Code::kUnavailable);
  EXPECT_NE(g.status().message().find("journal"), std::string::npos);
  EXPECT_EQ(h.Pool("node0").leased_bytes, 0u);
  EXPECT_EQ(h.mgr->Gauges()["live_leases"], 0u);
}

TEST(LeaseRestartTest, SharedLeaseJournalsEveryHolder) {
  RestartHarness h;
  h.ConnectPid(1, 500);
  h.ConnectPid(2, 501);
  AllocParams p;
  p.size_bytes = 1 << 20;
  p.numa_node = 0;
  p.name = "weights";
  p.acl_uids = {1000};
  auto g = h.Alloc(1, p);
  ASSERT_TRUE(g.ok());
  ASSERT_TRUE(h.mgr->Attach(2, "weights").ok());
  auto& holders = h.store.leases[g->lease.id].holders;
  ASSERT_EQ(holders.size(), 2u);
  h.mgr->Disconnect(1);  // the creator goes; the lease stays with 501
  ASSERT_EQ(h.store.leases[g->lease.id].holders.size(), 1u);
  EXPECT_EQ(h.store.leases[g->lease.id].holders[0].pid, 501);
}

TEST(LeaseRestartTest, RecoverDropsDeadOwnersAwaitsLiveOnesAndHoldsGrantsInGrace) {
  RestartHarness h;
  h.probe.start[600] = 77;  // alive; 601 is dead
  TestMemfd live = MakeMemfd(10, 1 << 20, 600);
  TestMemfd dead = MakeMemfd(11, 2 << 20, 601);
  auto r = h.mgr->Recover({live.rec, dead.rec}, {}, std::chrono::seconds(60));
  EXPECT_EQ(r.journalled, 2u);
  EXPECT_EQ(r.awaiting, 1u);
  EXPECT_EQ(r.dropped, 1u);
  EXPECT_TRUE(h.store.deleted.count(11));
  EXPECT_TRUE(h.mgr->in_grace());
  // The awaited lease is accounted: its memory still exists in its holder.
  EXPECT_EQ(h.Pool("node0").leased_bytes, 1u << 20);
  h.ConnectPid(1, 600);
  // The handler refuses ALLOC and ATTACH with this while in grace.
  Status refusal = h.mgr->GraceRefusal();
  EXPECT_EQ(refusal.code(), Code::kUnavailable);
  EXPECT_NE(refusal.message().find("daemon restarting: reclaim in progress, retry in"),
            std::string::npos);

  // Wrong fd, wrong size, wrong uid: rejected one by one.
  TestMemfd other = MakeMemfd(10, 1 << 20, 600);
  std::vector<LeaseManager::ReclaimItem> bad(3);
  bad[0] = {10, 1 << 20, Fds(Dup(other.fd))};
  bad[1] = {10, 4096, Fds(Dup(live.fd))};
  bad[2] = {99, 4096, Fds(Dup(live.fd))};
  auto out = h.mgr->Reclaim(1, std::move(bad));
  EXPECT_TRUE(out.accepted.empty());
  ASSERT_EQ(out.rejected.size(), 3u);
  EXPECT_NE(out.rejected[0].second.find("not this lease's memfd"), std::string::npos);
  EXPECT_NE(out.rejected[1].second.find("bytes"), std::string::npos);
  // An id nobody was granted: the one answer that says nothing.
  EXPECT_EQ(out.rejected[2].second, "lease 99 is not one this caller may hold");
  h.ConnectPid(2, 700, 2000);
  std::vector<LeaseManager::ReclaimItem> foreign(1);
  foreign[0] = {10, 1 << 20, Fds(Dup(live.fd))};
  auto f = h.mgr->Reclaim(2, std::move(foreign));
  ASSERT_EQ(f.rejected.size(), 1u);
  EXPECT_NE(f.rejected[0].second.find("not one this caller may hold"), std::string::npos);
  EXPECT_TRUE(h.mgr->in_grace());

  // The right one: accepted, held by the connection, grace over.
  std::vector<LeaseManager::ReclaimItem> good(1);
  good[0] = {10, 1 << 20, Fds(Dup(live.fd))};
  auto ok = h.mgr->Reclaim(1, std::move(good));
  ASSERT_EQ(ok.accepted, std::vector<uint64_t>{10});
  EXPECT_FALSE(h.mgr->in_grace());
  EXPECT_TRUE(h.mgr->GraceRefusal().ok());
  auto g = h.Alloc(1, 4096, 0);
  ASSERT_TRUE(g.ok());
  EXPECT_GT(g->lease.id, 11u);  // ids never go back
  auto s = h.mgr->Stat(1, 10);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->holders, 1u);
  EXPECT_EQ(s->owner.pid, 600);
  // Releasing it frees the memory: the daemon truncates the memfd.
  ASSERT_TRUE(h.mgr->Release(1, 10).ok());
  h.Drain();  // the reclaim runs on a worker
  struct stat st {};
  ASSERT_EQ(::fstat(live.fd.get(), &st), 0);
  EXPECT_EQ(st.st_size, 0);
}

TEST(LeaseRestartTest, StoredFdIsAdoptedWithoutReclaimAndNoGrace) {
  RestartHarness h;
  h.probe.start[600] = 77;
  TestMemfd m = MakeMemfd(5, 1 << 20, 600);
  std::map<uint64_t, std::vector<UniqueFd>> stored;
  stored[5].push_back(Dup(m.fd));
  auto r = h.mgr->Recover({m.rec}, std::move(stored), std::chrono::seconds(60));
  EXPECT_EQ(r.adopted, 1u);
  EXPECT_EQ(r.awaiting, 0u);
  EXPECT_FALSE(h.mgr->in_grace());
  EXPECT_EQ(h.Pool("node0").leased_bytes, 1u << 20);
  // Its holder still comes back and takes a reference.
  h.ConnectPid(1, 600);
  std::vector<LeaseManager::ReclaimItem> items(1);
  items[0] = {5, 1 << 20, Fds(Dup(m.fd))};
  EXPECT_EQ(h.mgr->Reclaim(1, std::move(items)).accepted.size(), 1u);
  h.mgr->Disconnect(1);  // last holder gone: freed
  EXPECT_EQ(h.Pool("node0").leased_bytes, 0u);
}

TEST(LeaseRestartTest, AReadoptedSharedLeaseKeepsItsAclAndItsPlacementFacts) {
  // A grant journals the long-term pin.
  {
    RestartHarness g;
    g.ConnectPid(1, 500);
    AllocParams p;
    p.size_bytes = 1 << 20;
    p.numa_node = 0;
    p.long_term_pin = true;
    auto granted = g.Alloc(1, p);
    ASSERT_TRUE(granted.ok()) << granted.status().ToString();
    EXPECT_TRUE(g.store.leases[granted->lease.id].long_term_pin);
  }
  // A shared lease of uid 1000 that uid 2000 may attach, pinned, once found
  // on another node than it was placed on: the journal's record of it.
  RestartHarness h;
  h.probe.start[600] = 77;
  TestMemfd m = MakeMemfd(5, 1 << 20, 600);
  m.rec.name = "weights";
  m.rec.acl_uids = {2000};
  m.rec.long_term_pin = true;
  m.rec.placed_numa_node = 1;
  m.rec.moved_reason = "pages found on node 0, not node 1";
  m.rec.pages_numa_node = 0;
  std::map<uint64_t, std::vector<UniqueFd>> stored;
  stored[5].push_back(Dup(m.fd));
  auto r =
      h.mgr->Recover({FromRecord(ToRecord(m.rec))}, std::move(stored), std::chrono::seconds(60));
  ASSERT_EQ(r.adopted, 1u);
  h.ConnectPid(1, 600);  // the owner is back
  std::vector<LeaseManager::ReclaimItem> items(1);
  items[0] = {5, 1 << 20, Fds(Dup(m.fd))};
  ASSERT_EQ(h.mgr->Reclaim(1, std::move(items)).accepted.size(), 1u);
  EXPECT_FALSE(h.mgr->in_grace());

  // Outside the ACL: as if there were no such name. Inside: attached.
  h.ConnectPid(2, 700, 3000);
  auto denied = h.mgr->Attach(2, "weights", 1000);
  ASSERT_FALSE(denied.ok());
  EXPECT_EQ(denied.status().code(), Code::kNotFound);
  h.ConnectPid(3, 701, 2000);
  auto allowed = h.mgr->Attach(3, "weights", 1000);
  ASSERT_TRUE(allowed.ok()) << allowed.status().ToString();
  EXPECT_EQ(allowed->lease.id, 5u);

  auto s = h.mgr->Stat(1, 5);
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->long_term_pin);
  EXPECT_EQ(s->placed_numa_node, std::optional<int>(1));
  EXPECT_EQ(s->moved_reason, "pages found on node 0, not node 1");
  EXPECT_EQ(s->numa_node, 0);  // where its pages are
  // And the next record of it (the new holder) keeps them all.
  const DurableLease& again = h.store.leases[5];
  EXPECT_EQ(again.acl_uids, std::vector<uint32_t>{2000});
  EXPECT_TRUE(again.long_term_pin);
  EXPECT_EQ(again.placed_numa_node, std::optional<int>(1));
  EXPECT_EQ(again.moved_reason, m.rec.moved_reason);
  EXPECT_EQ(again.pages_numa_node, std::optional<int>(0));
}

TEST(LeaseRestartTest, AStoredLeaseWhoseHoldersAllDiedIsTruncated) {
  RestartHarness h;
  TestMemfd m = MakeMemfd(5, 1 << 20, 600);  // pid 600 unknown: dead
  std::map<uint64_t, std::vector<UniqueFd>> stored;
  stored[5].push_back(Dup(m.fd));
  auto r = h.mgr->Recover({m.rec}, std::move(stored), std::chrono::seconds(60));
  EXPECT_EQ(r.dropped, 1u);
  struct stat st {};
  ASSERT_EQ(::fstat(m.fd.get(), &st), 0);
  EXPECT_EQ(st.st_size, 0);
  EXPECT_EQ(h.Pool("node0").leased_bytes, 0u);
}

TEST(LeaseRestartTest, AGrantThatNeverReachedItsOwnerIsDroppedWhenTheOwnerComesBack) {
  RestartHarness h;
  h.probe.start[600] = 77;
  TestMemfd held = MakeMemfd(1, 1 << 20, 600);
  TestMemfd lost = MakeMemfd(2, 1 << 20, 600);  // reply lost in the crash
  h.probe.holds[{600, held.rec.inode}] = Holding::kYes;
  h.probe.holds[{600, lost.rec.inode}] = Holding::kNo;
  h.mgr->Recover({held.rec, lost.rec}, {}, std::chrono::seconds(60));
  h.ConnectPid(1, 600);  // back on a new connection: lease 2 is not with it
  EXPECT_TRUE(h.store.deleted.count(2));
  EXPECT_TRUE(h.mgr->in_grace());  // lease 1 still awaits
  std::vector<LeaseManager::ReclaimItem> items(1);
  items[0] = {1, 1 << 20, Fds(Dup(held.fd))};
  EXPECT_EQ(h.mgr->Reclaim(1, std::move(items)).accepted.size(), 1u);
  EXPECT_FALSE(h.mgr->in_grace());
  EXPECT_EQ(h.Pool("node0").leased_bytes, 1u << 20);
}

TEST(LeaseRestartTest, UnreclaimedLeaseOfALiveOwnerStaysAccountedAfterGrace) {
  RestartHarness h;
  h.probe.start[600] = 77;
  TestMemfd m = MakeMemfd(3, 1 << 20, 600);
  h.probe.holds[{600, m.rec.inode}] = Holding::kYes;
  h.mgr->Recover({m.rec}, {}, std::chrono::milliseconds(1));
  h.Drain();  // the grace timer fires
  EXPECT_FALSE(h.mgr->in_grace());
  EXPECT_EQ(h.Pool("node0").leased_bytes, 1u << 20);  // never double-granted
  // A reclaim after the grace period is still accepted.
  h.ConnectPid(1, 600);
  std::vector<LeaseManager::ReclaimItem> items(1);
  items[0] = {3, 1 << 20, Fds(Dup(m.fd))};
  EXPECT_EQ(h.mgr->Reclaim(1, std::move(items)).accepted.size(), 1u);
}

TEST(LeaseRestartTest, AWatchedHolderThatExitsIsStruckOffEvenAsAZombie) {
  RestartHarness h;
  h.probe.start[600] = 77;
  UniqueFd exit_signal(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  h.probe.pidfds[600] = exit_signal.get();
  TestMemfd m = MakeMemfd(8, 1 << 20, 600);
  h.probe.holds[{600, m.rec.inode}] = Holding::kYes;
  std::map<uint64_t, std::vector<UniqueFd>> stored;
  stored[8].push_back(Dup(m.fd));
  h.mgr->Recover({m.rec}, std::move(stored), std::chrono::seconds(60));
  EXPECT_EQ(h.Pool("node0").leased_bytes, 1u << 20);
  h.io.restart();
  h.io.poll();
  EXPECT_EQ(h.Pool("node0").leased_bytes, 1u << 20);  // still held, still counted
  // The process exits; /proc still shows it (a zombie): the pidfd decides.
  uint64_t one = 1;
  ASSERT_EQ(::write(exit_signal.get(), &one, sizeof one), 8);
  h.io.restart();
  h.io.poll();
  EXPECT_EQ(h.Pool("node0").leased_bytes, 0u);
  EXPECT_TRUE(h.store.deleted.count(8));
  struct stat st {};
  ASSERT_EQ(::fstat(m.fd.get(), &st), 0);
  EXPECT_EQ(st.st_size, 0);  // the daemon had the fd: truncated
}

TEST(LeaseRestartTest, HandOverKeepsTheMemoryAndTheJournal) {
  RestartHarness h;
  h.ConnectPid(1, 500);
  auto g = h.Alloc(1, 1 << 20, 0);
  ASSERT_TRUE(g.ok());
  UniqueFd mine(::fcntl(g->fd(), F_DUPFD_CLOEXEC, 0));
  uint64_t id = g->lease.id;
  h.mgr->HandOver();
  h.mgr->Disconnect(1);
  h.mgr->Shutdown();
  EXPECT_FALSE(h.store.deleted.count(id));
  struct stat st {};
  ASSERT_EQ(::fstat(mine.get(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), 1u << 20);  // not truncated
}

// ---- journal damage: leases the journal lost (docs/daemon.md) ----

// A sealed memfd as the daemon makes them, `touch`: its pages written.
UniqueFd LeaseLikeMemfd(uint64_t size, bool touch = false) {
  UniqueFd fd(::memfd_create("cxlpool-lost", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  CXLPOOL_CHECK(fd.valid() && ::ftruncate(fd.get(), static_cast<off_t>(size)) == 0);
  CXLPOOL_CHECK(::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SEAL) == 0);
  if (touch) {
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    CXLPOOL_CHECK(p != MAP_FAILED);
    std::memset(p, 0x5a, size);
    ::munmap(p, size);
  }
  return fd;
}

uint64_t FileSize(const UniqueFd& fd) {
  struct stat st {};
  CXLPOOL_CHECK(::fstat(fd.get(), &st) == 0);
  return static_cast<uint64_t>(st.st_size);
}

// ---- leases of several extents ----

struct MultiExtentGrant {
  DurableLease rec;
  std::vector<UniqueFd> fds;  // the holder's dups, in order
};
// A lease of 3 extents (2M + 2M + 1M) granted to pid 500 by a daemon that
// then hands over, as at SIGTERM.
MultiExtentGrant GrantThreeExtentsAndHandOver() {
  RestartHarness a;
  a.mgr->SetMaxExtentBytes(2 << 20);
  a.ConnectPid(1, 500);
  auto g = a.Alloc(1, 5 << 20, 0);
  CXLPOOL_CHECK(g.ok() && g->extents.size() == 3);
  MultiExtentGrant out;
  for (const auto& e : g->extents) out.fds.emplace_back(::fcntl(e.fd, F_DUPFD_CLOEXEC, 0));
  CXLPOOL_CHECK(a.store.stored_extents[g->lease.id] == 3);
  out.rec = a.store.leases.at(g->lease.id);
  a.mgr->HandOver();
  return out;
}

TEST(LeaseRestartTest, EveryExtentIsJournalledAndStored) {
  MultiExtentGrant m = GrantThreeExtentsAndHandOver();
  ASSERT_EQ(m.rec.extents.size(), 3u);
  EXPECT_EQ(m.rec.extents[0].size_bytes + m.rec.extents[1].size_bytes + m.rec.extents[2].size_bytes,
            m.rec.size_bytes);
  for (size_t i = 0; i < 3; ++i) {
    struct stat st {};
    ASSERT_EQ(::fstat(m.fds[i].get(), &st), 0);
    EXPECT_EQ(m.rec.extents[i].inode, st.st_ino) << i;
    EXPECT_EQ(m.rec.extents[i].size_bytes, static_cast<uint64_t>(st.st_size)) << i;
  }
  EXPECT_EQ(m.rec.inode, m.rec.extents[0].inode);
  // The journal's record keeps them across a daemon upgrade.
  DurableLease back = FromRecord(ToRecord(m.rec));
  EXPECT_EQ(back.extents, m.rec.extents);
  // An older record (no extent list) is one extent of the lease's size.
  DurableLease old = m.rec;
  old.extents.clear();
  ASSERT_EQ(ExtentsOf(old).size(), 1u);
  EXPECT_EQ(ExtentsOf(old)[0].size_bytes, m.rec.size_bytes);
}

TEST(LeaseRestartTest, AReclaimMustHandBackEveryExtentInOrder) {
  MultiExtentGrant m = GrantThreeExtentsAndHandOver();
  // Data across the extents' boundaries survives the restart.
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_EQ(::pwrite(m.fds[i].get(), "x", 1, 0), 1);
  }
  RestartHarness b;
  b.probe.start[500] = 77;
  auto r = b.mgr->Recover({m.rec}, {}, std::chrono::seconds(60));
  EXPECT_EQ(r.awaiting, 1u);
  const PoolSnapshot recovered = b.Pool("node0");
  EXPECT_EQ(recovered.leased_bytes, m.rec.size_bytes);
  b.ConnectPid(1, 500);
  auto item = [&](std::vector<size_t> order, std::vector<uint64_t> sizes = {}) {
    LeaseManager::ReclaimItem it;
    it.id = m.rec.id;
    it.size_bytes = m.rec.size_bytes;
    for (size_t i : order) it.fds.push_back(Dup(m.fds[i]));
    it.extent_sizes = std::move(sizes);
    std::vector<LeaseManager::ReclaimItem> v;
    v.push_back(std::move(it));
    return v;
  };
  auto why = [&](std::vector<LeaseManager::ReclaimItem> v) {
    auto out = b.mgr->Reclaim(1, std::move(v));
    return out.rejected.empty() ? std::string() : out.rejected[0].second;
  };
  EXPECT_NE(why(item({0, 1})).find("it has 3 extents, 2 fds"), std::string::npos);
  EXPECT_NE(why(item({0, 2, 1})).find("extent 1"), std::string::npos);
  EXPECT_NE(why(item({0, 1, 2}, {2 << 20, 1 << 20, 2 << 20})).find("extent 1 is"),
            std::string::npos);
  EXPECT_NE(why(item({0, 1, 2}, {2 << 20, 2 << 20})).find("3 extents, not 2"), std::string::npos);
  EXPECT_TRUE(b.mgr->in_grace());  // nothing was taken
  EXPECT_EQ(b.Pool("node0").leased_bytes, recovered.leased_bytes);
  auto ok = b.mgr->Reclaim(1, item({0, 1, 2}, {2 << 20, 2 << 20, 1 << 20}));
  ASSERT_EQ(ok.accepted.size(), 1u) << (ok.rejected.empty() ? "" : ok.rejected[0].second);
  EXPECT_FALSE(b.mgr->in_grace());
  auto st = b.mgr->Stat(1, m.rec.id);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->extents, 3u);
  // Released: every extent is truncated, the accounting is back to zero.
  ASSERT_TRUE(b.mgr->Release(1, m.rec.id).ok());
  b.Drain();
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(FileSize(m.fds[i]), 0u) << "extent " << i;
  EXPECT_EQ(b.Pool("node0").leased_bytes, 0u);
  EXPECT_EQ(b.Pool("node0").reclaiming_bytes, 0u);
}

// Each extent of a lease is accounted to its own pool: a lease the tiering
// engine moved in part stays split, and the journal says which extent is
// where. A daemon killed during the move of one extent comes back with the
// lease split as it was, that extent's room on the target reserved again,
// and the move finishes from where it was.
TEST(LeaseRestartTest, ASplitLeaseKilledDuringAnExtentMoveComesBackSplitAndFinishes) {
  DurableLease rec;
  std::vector<UniqueFd> fds;
  {
    RestartHarness a;
    a.mgr->SetMaxExtentBytes(2 << 20);
    a.ConnectPid(1, 500);
    auto g = a.Alloc(1, 5 << 20, 0);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    ASSERT_EQ(g->extents.size(), 3u);  // 2 + 2 + 1 MiB
    for (const auto& e : g->extents) fds.emplace_back(::fcntl(e.fd, F_DUPFD_CLOEXEC, 0));
    const uint64_t id = g->lease.id;
    Pool* node2 = NamedPool(*a.mgr, "node2");
    ASSERT_NE(node2, nullptr);
    ASSERT_TRUE(a.mgr->BeginExtentMove(id, 1, node2).ok());
    EXPECT_TRUE(a.store.leases.at(id).extent_pools.empty());  // nothing moved yet
    EXPECT_EQ(a.store.leases.at(id).migrating_extent, std::optional<uint32_t>(1));
    // Room for that extent only.
    EXPECT_EQ(a.Pool("node2").capacity_bytes - a.Pool("node2").free_bytes, 2u << 20);
    ASSERT_TRUE(a.mgr->CommitExtentMove(id, 1).ok());
    EXPECT_EQ(a.store.leases.at(id).extent_pools,
              (std::vector<std::string>{"node0", "node2", "node0"}));
    EXPECT_TRUE(a.store.leases.at(id).migrating_to_pool.empty());
    EXPECT_EQ(a.Pool("node0").leased_bytes, 3u << 20);
    EXPECT_EQ(a.Pool("node2").leased_bytes, 2u << 20);
    auto listed = a.mgr->LeaseForMigration(id);
    ASSERT_TRUE(listed.has_value());
    EXPECT_EQ(listed->lease.pool, "node0");  // holds most of it
    EXPECT_EQ(listed->lease.spread,
              "2 of 3 extents (3.0 MiB) on node0, 1 of 3 extents (2.0 MiB) on node2");
    EXPECT_EQ(listed->lease.extent_pools, (std::vector<std::string>{"node0", "node2", "node0"}));
    // The next extent's move is under way when the daemon is killed.
    ASSERT_TRUE(a.mgr->BeginExtentMove(id, 0, node2).ok());
    EXPECT_EQ(a.mgr->BeginExtentMove(id, 2, node2).code(), Code::kAlreadyExists);
    EXPECT_EQ(a.mgr->CommitExtentMove(id, 2).code(), Code::kInternal);  // not that extent's move
    rec = a.store.leases.at(id);
    EXPECT_EQ(rec.migrating_to_pool, "node2");
    EXPECT_EQ(rec.migrating_extent, std::optional<uint32_t>(0));
    EXPECT_EQ(rec.pool, "node0");
    EXPECT_EQ(a.Pool("node2").capacity_bytes - a.Pool("node2").free_bytes, 4u << 20);
    a.mgr->HandOver();  // killed here
  }
  // The journal record keeps the extents' places and the move across an upgrade.
  EXPECT_EQ(FromRecord(ToRecord(rec)).extent_pools, rec.extent_pools);
  EXPECT_EQ(FromRecord(ToRecord(rec)).migrating_extent, rec.migrating_extent);
  DurableLease whole = rec;
  whole.extent_pools.clear();
  whole.migrating_extent.reset();
  EXPECT_TRUE(FromRecord(ToRecord(whole)).extent_pools.empty());
  EXPECT_FALSE(FromRecord(ToRecord(whole)).migrating_extent.has_value());
  // An older daemon's record of a move (the lease moved whole: extents on
  // the target named by migrated_to_pool, no extent index) reads as those
  // extents accounted there and the move of the first one not there.
  {
    DurableLease old = rec;
    old.migrating_extent.reset();
    old.extent_pools = {"", "node2", ""};
    journal::LeaseRecord r = ToRecord(old);
    for (auto& e : *r.mutable_extents()) {
      e.set_migrated_to_pool(e.pool());
      e.clear_pool();
    }
    DurableLease read = FromRecord(r);
    EXPECT_EQ(read.extent_pools, old.extent_pools);
    EXPECT_EQ(FirstNotOn(read), 0u);
    read.extent_pools = {"node2", "node2", ""};
    EXPECT_EQ(FirstNotOn(read), 2u);
  }
  {
    RestartHarness b;
    b.probe.start[500] = 77;
    std::map<uint64_t, std::vector<UniqueFd>> stored;
    for (const auto& fd : fds) stored[rec.id].push_back(Dup(fd));
    auto r = b.mgr->Recover({rec}, std::move(stored), std::chrono::seconds(60));
    ASSERT_EQ(r.adopted, 1u);
    auto f = b.mgr->LeaseForMigration(rec.id);
    ASSERT_TRUE(f.has_value());
    ASSERT_NE(f->moving_to, nullptr);
    EXPECT_EQ(f->moving_to->name(), "node2");
    EXPECT_EQ(f->moving_extent, 0u);
    ASSERT_EQ(f->extent_pools.size(), 3u);
    EXPECT_EQ(f->extent_pools[1]->name(), "node2");
    EXPECT_NE(f->moving_note.find("extent 0 (2.0 MiB) may be on node0 and node2"),
              std::string::npos)
        << f->moving_note;
    EXPECT_EQ(b.Pool("node0").leased_bytes, 3u << 20);
    // node2: extent 1, and the room of extent 0's move (counted as leased).
    EXPECT_EQ(b.Pool("node2").leased_bytes, 4u << 20);
    EXPECT_EQ(b.Pool("node2").capacity_bytes - b.Pool("node2").free_bytes, 4u << 20);
    EXPECT_EQ(b.mgr->Counters().at("restart_interrupted_moves"), 1u);
    // The move goes on: extent 0, then extent 2 makes the lease whole on node2.
    ASSERT_TRUE(b.mgr->CommitExtentMove(rec.id, 0).ok());
    EXPECT_EQ(b.store.leases.at(rec.id).extent_pools,
              (std::vector<std::string>{"node2", "node2", "node0"}));
    EXPECT_EQ(b.store.leases.at(rec.id).pool, "node2");  // 4 of its 5 MiB
    EXPECT_EQ(b.Pool("node0").leased_bytes, 1u << 20);
    EXPECT_EQ(b.Pool("node2").leased_bytes, 4u << 20);
    Pool* node2 = NamedPool(*b.mgr, "node2");
    ASSERT_TRUE(b.mgr->BeginExtentMove(rec.id, 2, node2).ok());
    ASSERT_TRUE(b.mgr->CommitExtentMove(rec.id, 2).ok());
    EXPECT_EQ(b.Pool("node0").leased_bytes, 0u);
    EXPECT_EQ(b.Pool("node2").leased_bytes, 5u << 20);
    EXPECT_EQ(b.store.leases.at(rec.id).pool, "node2");
    EXPECT_TRUE(b.store.leases.at(rec.id).migrating_to_pool.empty());
    EXPECT_TRUE(b.store.leases.at(rec.id).extent_pools.empty());
    EXPECT_EQ(b.mgr->CommitExtentMove(rec.id, 0).code(), Code::kInternal);  // no move now
    b.mgr->HandOver();
  }
}

// The same through the real journal, with no fd store: the next daemon
// reads the split and the move back from the file, and keeps them when the
// holder hands the extents back (RECLAIM).
TEST(LeaseRestartTest, ASplitLeaseComesBackSplitThroughTheJournalFileAndItsHoldersReclaim) {
  char tmpl[] = "/tmp/cxlpool-split-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = std::string(tmpl) + "/state";
  uint64_t id = 0;
  std::vector<UniqueFd> fds;
  {
    auto store = JournalStore::Open(dir, nullptr);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    FakeProbe probe;
    Harness a(TwoSocketCxl());
    a.mgr->EnableRestart(store->get(), &probe, 1);
    a.mgr->SetMaxExtentBytes(2 << 20);
    probe.start[500] = 77;
    a.mgr->Connect(1, Caller(500));
    auto g = a.Alloc(1, 5 << 20, 0);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    id = g->lease.id;
    for (const auto& e : g->extents) fds.emplace_back(::fcntl(e.fd, F_DUPFD_CLOEXEC, 0));
    Pool* node2 = NamedPool(*a.mgr, "node2");
    ASSERT_TRUE(a.mgr->BeginExtentMove(id, 1, node2).ok());
    ASSERT_TRUE(a.mgr->CommitExtentMove(id, 1).ok());
    ASSERT_TRUE(a.mgr->BeginExtentMove(id, 0, node2).ok());
    a.mgr->HandOver();
  }
  auto store = JournalStore::Open(dir, nullptr);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  FakeProbe probe;
  probe.start[500] = 77;
  Harness b(TwoSocketCxl());
  b.mgr->EnableRestart(store->get(), &probe, 1);
  auto journalled = (*store)->JournalledLeases();
  ASSERT_EQ(journalled.size(), 1u);
  EXPECT_EQ(journalled[0].extent_pools, (std::vector<std::string>{"node0", "node2", "node0"}));
  EXPECT_EQ(journalled[0].migrating_extent, std::optional<uint32_t>(0));
  auto r = b.mgr->Recover(journalled, {}, std::chrono::seconds(60));
  EXPECT_EQ(r.awaiting, 1u);
  EXPECT_EQ(r.dropped, 0u);
  b.mgr->Connect(1, Caller(500));
  LeaseManager::ReclaimItem it;
  it.id = id;
  it.size_bytes = 5 << 20;
  for (const auto& fd : fds) it.fds.push_back(Dup(fd));
  std::vector<LeaseManager::ReclaimItem> v;
  v.push_back(std::move(it));
  auto out = b.mgr->Reclaim(1, std::move(v));
  ASSERT_EQ(out.accepted.size(), 1u) << (out.rejected.empty() ? "" : out.rejected[0].second);
  auto st = b.mgr->Stat(1, id);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->spread, "2 of 3 extents (3.0 MiB) on node0, 1 of 3 extents (2.0 MiB) on node2");
  EXPECT_NE(st->migration.find("to node2: extent 0"), std::string::npos) << st->migration;
  EXPECT_EQ(b.Pool("node0").leased_bytes, 3u << 20);
  EXPECT_EQ(b.Pool("node2").leased_bytes, 4u << 20);  // extent 1 and extent 0's room
  b.mgr->HandOver();
  std::filesystem::remove_all(tmpl);
}

// A split lease that ends gives each pool back its own bytes, and its
// tenant's charge in each tier.
TEST(LeaseRestartTest, ASplitLeaseReleasedGivesEachPoolItsBytesBack) {
  RestartHarness a;
  a.mgr->SetMaxExtentBytes(2 << 20);
  a.ConnectPid(1, 500);
  auto g = a.Alloc(1, 5 << 20, 0);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const uint64_t id = g->lease.id;
  Pool* node2 = NamedPool(*a.mgr, "node2");
  ASSERT_NE(node2, nullptr);
  ASSERT_TRUE(a.mgr->BeginExtentMove(id, 2, node2).ok());
  ASSERT_TRUE(a.mgr->CommitExtentMove(id, 2).ok());
  ASSERT_TRUE(a.mgr->BeginExtentMove(id, 0, node2).ok());  // still under way at the release
  EXPECT_EQ(a.Pool("node0").leased_bytes, 4u << 20);
  EXPECT_EQ(a.Pool("node2").leased_bytes, 3u << 20);  // extent 2, and extent 0's room
  ASSERT_TRUE(a.mgr->Release(1, id).ok());
  a.Drain();
  for (const char* name : {"node0", "node2"}) {
    EXPECT_EQ(a.Pool(name).leased_bytes, 0u) << name;
    EXPECT_EQ(a.Pool(name).reclaiming_bytes, 0u) << name;
    EXPECT_EQ(a.Pool(name).free_bytes, a.Pool(name).capacity_bytes) << name;
  }
  EXPECT_TRUE(a.mgr->LeaseForMigration(id) == std::nullopt);
}

TEST(LeaseRestartTest, TheFdStoreGivesBackAllExtentsOrNone) {
  MultiExtentGrant m = GrantThreeExtentsAndHandOver();
  {
    // All three stored: adopted at once.
    RestartHarness b;
    b.probe.start[500] = 77;
    std::map<uint64_t, std::vector<UniqueFd>> stored;
    for (const auto& fd : m.fds) stored[m.rec.id].push_back(Dup(fd));
    auto r = b.mgr->Recover({m.rec}, std::move(stored), std::chrono::seconds(60));
    EXPECT_EQ(r.adopted, 1u);
    EXPECT_FALSE(b.mgr->in_grace());
    b.mgr->HandOver();
  }
  {
    // One missing (a hole): none adopted, the lease awaits its holder.
    RestartHarness b;
    b.probe.start[500] = 77;
    std::map<uint64_t, std::vector<UniqueFd>> stored;
    stored[m.rec.id].push_back(Dup(m.fds[0]));
    stored[m.rec.id].emplace_back();
    stored[m.rec.id].push_back(Dup(m.fds[2]));
    auto r = b.mgr->Recover({m.rec}, std::move(stored), std::chrono::seconds(60));
    EXPECT_EQ(r.adopted, 0u);
    EXPECT_EQ(r.awaiting, 1u);
    for (const auto& fd : m.fds) EXPECT_GT(FileSize(fd), 0u);  // nothing truncated
    b.mgr->HandOver();
  }
}

LeaseManager::ReclaimItem Item(uint64_t id, const UniqueFd& fd, uint64_t size,
                               std::string pool = "node0",
                               std::optional<uid_t> owner = std::nullopt, std::string name = "") {
  LeaseManager::ReclaimItem it;
  it.id = id;
  it.size_bytes = size;
  it.fds.push_back(Dup(fd));
  it.pool = std::move(pool);
  it.owner_uid = owner;
  it.name = std::move(name);
  return it;
}

JournalHealth Lost() {
  JournalHealth j;
  j.damaged = true;
  j.may_have_lost_leases = true;
  j.description = "the journal is empty";
  return j;
}

struct DamagedHarness : Fakes, Harness {
  explicit DamagedHarness(DaemonConfig cfg = testing::TestConfig(), bool bind = false,
                          uint64_t node_bytes = 64ull << 20)
      : Harness(TwoSocketCxl(node_bytes), std::move(cfg), nullptr, true, bind) {
    mgr->EnableRestart(&store, &probe, 1000);  // the id mark: ids up to 999 were granted
  }
  void ConnectPid(ConnId c, pid_t pid, uid_t uid) {
    probe.start[pid] = 77;
    CallerInfo ci;
    ci.pid = pid;
    ci.uid = uid;
    ci.gid = uid;
    ci.start_time = 77;
    mgr->Connect(c, ci);
  }
};

TEST(JournalDamageTest, AReclaimedLeaseTheJournalLostIsAccountedAgain) {
  DamagedHarness h;
  auto r = h.mgr->Recover({}, {}, std::chrono::milliseconds(50), Lost());
  EXPECT_EQ(r.journalled, 0u);
  // Nothing awaits, but leases may have been lost: grants wait all the same.
  EXPECT_TRUE(h.mgr->in_grace());
  EXPECT_FALSE(h.mgr->GraceRefusal().ok());
  EXPECT_EQ(h.mgr->Gauges()["journal_damaged"], 1u);
  UniqueFd mem = LeaseLikeMemfd(1 << 20, true);
  h.ConnectPid(1, 600, 1000);
  std::vector<LeaseManager::ReclaimItem> items;
  items.push_back(Item(7, mem, 1 << 20, "node0", 1000u));
  auto out = h.mgr->Reclaim(1, std::move(items));
  ASSERT_EQ(out.accepted, std::vector<uint64_t>{7}) << out.rejected[0].second;
  EXPECT_EQ(h.Pool("node0").leased_bytes, 1u << 20);
  EXPECT_EQ(h.mgr->Counters()["unjournalled_adopted"], 1u);
  auto s = h.mgr->Stat(1, 7);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->owner.uid, 1000u);
  EXPECT_EQ(s->size_bytes, 1u << 20);
  EXPECT_NE(s->placement_reason.find("journal damage"), std::string::npos);
  // Journalled again (with its memfd for the fd store) and charged.
  ASSERT_TRUE(h.store.leases.count(7));
  EXPECT_TRUE(h.store.stored_fds.count(7));
  EXPECT_EQ(h.store.leases[7].owner_uid, 1000u);
  // Still in the grace period (it runs its full length after damage).
  EXPECT_TRUE(h.mgr->in_grace());
  // Ids go on above the mark, never reusing the one just reclaimed.
  h.Drain();  // the grace timer fires
  EXPECT_FALSE(h.mgr->in_grace());
  EXPECT_EQ(h.Pool("node0").leased_bytes, 1u << 20) << "held: kept after grace";
  auto g = h.Alloc(1, 4096, 0);
  ASSERT_TRUE(g.ok());
  EXPECT_GE(g->lease.id, 1000u);
  // Released: its memory is freed like any lease's.
  ASSERT_TRUE(h.mgr->Release(1, 7).ok());
  h.Drain();
  EXPECT_EQ(FileSize(mem), 0u);
  EXPECT_EQ(h.Pool("node0").leased_bytes, 4096u);
}

// Without journal damage an unknown id is one that ended (its memfd was
// truncated then) or was never granted: a RECLAIM of it is refused like any
// lease the caller may not see, its memfd is left alone, and no alarm is
// raised. After damage the door closes with the grace period.
TEST(JournalDamageTest, AnUnknownReclaimOutsideTheDamageWindowIsRefusedAlikeAndRaisesNoAlarm) {
  DamagedHarness h;
  h.mgr->Recover({}, {}, std::chrono::seconds(60), {});
  EXPECT_FALSE(h.mgr->in_grace());
  UniqueFd mem = LeaseLikeMemfd(1 << 20, true);
  h.ConnectPid(1, 600, 1000);
  std::vector<LeaseManager::ReclaimItem> items;
  items.push_back(Item(40, mem, 1 << 20, "node0", 1000u));    // below the id mark
  items.push_back(Item(5000, mem, 1 << 20, "node0", 1000u));  // never granted
  auto out = h.mgr->Reclaim(1, std::move(items));
  EXPECT_TRUE(out.accepted.empty());
  ASSERT_EQ(out.rejected.size(), 2u);
  EXPECT_EQ(out.rejected[0].second, "lease 40 is not one this caller may hold");
  EXPECT_EQ(out.rejected[1].second, "lease 5000 is not one this caller may hold");
  EXPECT_EQ(FileSize(mem), 1u << 20);
  EXPECT_EQ(h.mgr->Gauges()["journal_damaged"], 0u);
  EXPECT_EQ(h.Pool("node0").leased_bytes, 0u);

  DamagedHarness late;
  late.mgr->Recover({}, {}, std::chrono::milliseconds(10), Lost());
  late.Drain();  // the grace period ends
  ASSERT_FALSE(late.mgr->in_grace());
  late.ConnectPid(1, 600, 1000);
  std::vector<LeaseManager::ReclaimItem> after;
  after.push_back(Item(41, mem, 1 << 20, "node0", 1000u));
  out = late.mgr->Reclaim(1, std::move(after));
  ASSERT_EQ(out.rejected.size(), 1u);
  EXPECT_EQ(out.rejected[0].second, "lease 41 is not one this caller may hold");
  EXPECT_EQ(FileSize(mem), 1u << 20);
  EXPECT_EQ(late.Pool("node0").leased_bytes, 0u);
}

// The daemon never reads a byte of a memfd a holder hands back: a holder
// that shrinks its memfd at any point of the RECLAIM (after the size was
// read, while the pages are looked at) gets its lease accounted or refused,
// and the daemon lives on. A read of the page past the new end would be
// SIGBUS and end this test.
TEST(JournalDamageTest, AHolderShrinkingItsMemfdDuringAReclaimCannotCrashTheDaemon) {
  DamagedHarness h(testing::TestConfig(), false, 1ull << 30);
  h.mgr->Recover({}, {}, std::chrono::seconds(60), Lost());
  h.ConnectPid(1, 600, 1000);
  constexpr uint64_t kSize = 1 << 20;
  uint64_t accepted_bytes = 0;
  for (uint64_t i = 0; i < 200; ++i) {
    UniqueFd mem = LeaseLikeMemfd(kSize, true);
    std::atomic<bool> go{false};
    // The shrink lands at a different point of the RECLAIM each time.
    std::thread shrinker([&, spins = (i * 7919) % 20000] {
      while (!go.load(std::memory_order_acquire)) {
      }
      for (uint64_t k = 0; k < spins; ++k) asm volatile("" ::: "memory");
      CXLPOOL_CHECK(::ftruncate(mem.get(), 4096) == 0);
    });
    std::vector<LeaseManager::ReclaimItem> items;
    items.push_back(Item(100 + i, mem, kSize, "node0", 1000u));
    go.store(true, std::memory_order_release);
    auto out = h.mgr->Reclaim(1, std::move(items));
    shrinker.join();
    if (!out.accepted.empty()) accepted_bytes += h.mgr->Stat(1, 100 + i)->size_bytes;
  }
  EXPECT_EQ(h.Pool("node0").leased_bytes, accepted_bytes);
}

// A lease of several extents the journal lost is accounted again whole:
// every extent's memfd checked, each on the pool its pages are on, charged
// once, and released like any lease.
TEST(JournalDamageTest, ALeaseOfSeveralExtentsTheJournalLostIsAccountedWhole) {
  MultiExtentGrant m = GrantThreeExtentsAndHandOver();  // 2 + 2 + 1 MiB
  DamagedHarness h;
  // A short grace: a lease the journal lost stays while it runs (its other
  // holders may still come back), and goes at its end once released.
  h.mgr->Recover({}, {}, std::chrono::milliseconds(500), Lost());
  h.ConnectPid(1, 500, 1000);
  auto item = [&](std::vector<size_t> order) {
    LeaseManager::ReclaimItem it;
    it.id = m.rec.id;
    it.size_bytes = m.rec.size_bytes;
    it.pool = "node0";
    it.owner_uid = 1000u;
    for (size_t i : order) it.fds.push_back(Dup(m.fds[i]));
    std::vector<LeaseManager::ReclaimItem> v;
    v.push_back(std::move(it));
    return v;
  };
  // The same memfd twice is no lease: refused, and nothing is truncated.
  auto out = h.mgr->Reclaim(1, item({0, 0, 2}));
  ASSERT_EQ(out.rejected.size(), 1u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(FileSize(m.fds[i]), m.rec.extents[i].size_bytes);
  EXPECT_EQ(h.Pool("node0").leased_bytes, 0u);
  out = h.mgr->Reclaim(1, item({0, 1, 2}));
  ASSERT_EQ(out.accepted.size(), 1u) << out.rejected[0].second;
  EXPECT_EQ(h.Pool("node0").leased_bytes, 5u << 20);
  EXPECT_EQ(h.mgr->Counters()["unjournalled_adopted"], 1u);
  EXPECT_EQ(h.mgr->Counters()["unjournalled_revokes"], 0u);
  auto st = h.mgr->Stat(1, m.rec.id);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->extents, 3u);
  EXPECT_EQ(st->size_bytes, 5u << 20);
  // Journalled again with every extent, for the next restart.
  ASSERT_TRUE(h.store.leases.count(m.rec.id));
  EXPECT_EQ(h.store.leases[m.rec.id].extents, m.rec.extents);
  ASSERT_TRUE(h.mgr->Release(1, m.rec.id).ok());
  h.Drain();  // the grace period ends; the reclaim runs on a worker
  EXPECT_FALSE(h.mgr->in_grace());
  EXPECT_EQ(h.Pool("node0").leased_bytes, 0u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(FileSize(m.fds[i]), 0u) << "extent " << i;
}

// A RECLAIM of a forgotten id that carries a live lease's memfds (with or
// beside a memfd of its own) touches none of them: the live lease keeps
// every byte and its accounting.
TEST(JournalDamageTest, AReclaimOfAForgottenIdCarryingALiveLeasesFdsTouchesNothing) {
  MultiExtentGrant m = GrantThreeExtentsAndHandOver();
  DamagedHarness h;
  h.probe.start[500] = 77;
  h.mgr->Recover({m.rec}, {}, std::chrono::seconds(60), Lost());
  h.ConnectPid(2, 700, 2000);  // another tenant
  auto forged = [&](uint64_t id, std::vector<UniqueFd> fds) {
    LeaseManager::ReclaimItem it;
    it.id = id;
    it.size_bytes = 5 << 20;
    it.fds = std::move(fds);
    std::vector<LeaseManager::ReclaimItem> v;
    v.push_back(std::move(it));
    return h.mgr->Reclaim(2, std::move(v));
  };
  auto check_untouched = [&](const char* when) {
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(FileSize(m.fds[i]), m.rec.extents[i].size_bytes) << when << ", extent " << i;
    }
    EXPECT_EQ(h.Pool("node0").leased_bytes, 5u << 20) << when;
  };
  // While the lease awaits its holder (known from the journal only).
  std::vector<UniqueFd> all;
  for (const UniqueFd& fd : m.fds) all.push_back(Dup(fd));
  auto out = forged(7, std::move(all));
  ASSERT_EQ(out.rejected.size(), 1u);
  EXPECT_EQ(out.rejected[0].second, "lease 7 is not one this caller may hold");
  check_untouched("awaited");
  // Its holder is back: the lease is live, with its memory.
  h.ConnectPid(1, 500, 1000);
  std::vector<LeaseManager::ReclaimItem> own;
  LeaseManager::ReclaimItem it;
  it.id = m.rec.id;
  it.size_bytes = m.rec.size_bytes;
  for (const UniqueFd& fd : m.fds) it.fds.push_back(Dup(fd));
  own.push_back(std::move(it));
  ASSERT_EQ(h.mgr->Reclaim(1, std::move(own)).accepted.size(), 1u);
  UniqueFd mine = LeaseLikeMemfd(2 << 20, true);
  std::vector<UniqueFd> mixed;
  mixed.push_back(Dup(mine));
  mixed.push_back(Dup(m.fds[1]));
  mixed.push_back(Dup(m.fds[2]));
  out = forged(8, std::move(mixed));
  ASSERT_EQ(out.rejected.size(), 1u);
  EXPECT_EQ(out.rejected[0].second, "lease 8 is not one this caller may hold");
  EXPECT_EQ(FileSize(mine), 2u << 20) << "nothing is done to any fd of a refused item";
  check_untouched("live");
  auto st = h.mgr->Stat(1, m.rec.id);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->size_bytes, 5u << 20);
  EXPECT_EQ(h.mgr->Counters()["unjournalled_revokes"], 0u);
}

TEST(JournalDamageTest, SizeComesFromTheFdNotTheClient) {
  DamagedHarness h;
  h.mgr->Recover({}, {}, std::chrono::seconds(60), Lost());
  UniqueFd mem = LeaseLikeMemfd(2 << 20);
  h.ConnectPid(1, 600, 1000);
  std::vector<LeaseManager::ReclaimItem> items;
  items.push_back(Item(8, mem, 4096));  // the client says 4 KiB; the memfd is 2 MiB
  auto out = h.mgr->Reclaim(1, std::move(items));
  ASSERT_EQ(out.accepted.size(), 1u);
  EXPECT_EQ(h.Pool("node0").leased_bytes, 2u << 20);
}

TEST(JournalDamageTest, OneThatDoesNotFitIsRevokedNeverLeftUncounted) {
  DaemonConfig cfg = testing::TestConfig();
  cfg.quotas.push_back(testing::UidQuota(1000, 1 << 20));
  DamagedHarness h(cfg);
  h.mgr->Recover({}, {}, std::chrono::seconds(60), Lost());
  h.ConnectPid(1, 600, 1000);
  UniqueFd huge = LeaseLikeMemfd(128ull << 20);  // larger than any pool
  UniqueFd over = LeaseLikeMemfd(2 << 20);       // over uid 1000's quota
  std::vector<LeaseManager::ReclaimItem> items;
  items.push_back(Item(9, huge, 128ull << 20));
  items.push_back(Item(10, over, 2 << 20));
  auto out = h.mgr->Reclaim(1, std::move(items));
  EXPECT_TRUE(out.accepted.empty());
  ASSERT_EQ(out.rejected.size(), 2u);
  for (const auto& [id, why] : out.rejected) {
    EXPECT_NE(why.find("revoked"), std::string::npos) << why;
  }
  EXPECT_NE(out.rejected[1].second.find("quota"), std::string::npos) << out.rejected[1].second;
  EXPECT_EQ(FileSize(huge), 0u);
  EXPECT_EQ(FileSize(over), 0u);
  EXPECT_EQ(h.mgr->Counters()["unjournalled_revokes"], 2u);
  for (const auto& p : h.mgr->Pools()) EXPECT_EQ(p.leased_bytes, 0u) << p.name;
}

TEST(JournalDamageTest, WhatCannotBeALeaseIsRejectedAndLeftAlone) {
  DamagedHarness h;
  h.mgr->Recover({}, {}, std::chrono::seconds(60), Lost());
  h.ConnectPid(1, 600, 1000);
  UniqueFd beyond = LeaseLikeMemfd(1 << 20);
  UniqueFd unsealed(::memfd_create("plain", MFD_CLOEXEC));
  ASSERT_EQ(::ftruncate(unsealed.get(), 1 << 20), 0);
  std::vector<LeaseManager::ReclaimItem> items;
  items.push_back(Item(5000, beyond, 1 << 20));  // above the id mark: never granted
  items.push_back(Item(11, unsealed, 1 << 20));
  items.push_back(Item(0, beyond, 1 << 20));
  auto out = h.mgr->Reclaim(1, std::move(items));
  EXPECT_TRUE(out.accepted.empty());
  ASSERT_EQ(out.rejected.size(), 3u);
  // Alike, whatever the reason (the log has it).
  EXPECT_EQ(out.rejected[0].second, "lease 5000 is not one this caller may hold");
  EXPECT_EQ(out.rejected[1].second, "lease 11 is not one this caller may hold");
  EXPECT_EQ(out.rejected[2].second, "lease 0 is not one this caller may hold");
  EXPECT_EQ(FileSize(beyond), 1u << 20);
  EXPECT_EQ(FileSize(unsealed), 1u << 20);
  // The same memfd under a second id is not counted twice.
  UniqueFd mem = LeaseLikeMemfd(1 << 20);
  std::vector<LeaseManager::ReclaimItem> twice;
  twice.push_back(Item(12, mem, 1 << 20));
  twice.push_back(Item(13, mem, 1 << 20));
  out = h.mgr->Reclaim(1, std::move(twice));
  EXPECT_EQ(out.accepted, std::vector<uint64_t>{12});
  EXPECT_EQ(h.Pool("node0").leased_bytes, 1u << 20);
}

TEST(JournalDamageTest, PlacementIsCheckedWhereThePagesAre) {
  DamagedHarness h(testing::TestConfig(), /*bind=*/true);
  h.mgr->Recover({}, {}, std::chrono::seconds(60), Lost());
  h.ConnectPid(1, 600, 1000);
  UniqueFd mem = LeaseLikeMemfd(1 << 20, true);  // its pages are on this machine's node 0
  void* probe = ::mmap(nullptr, 1 << 20, PROT_READ, MAP_SHARED, mem.get(), 0);
  ASSERT_NE(probe, MAP_FAILED);
  bool kernel_tells = !ResidentNodes(probe, 1 << 20).empty();
  ::munmap(probe, 1 << 20);
  if (!kernel_tells) GTEST_SKIP() << "move_pages cannot tell where pages are here";
  std::vector<LeaseManager::ReclaimItem> items;
  items.push_back(Item(14, mem, 1 << 20, "node2"));  // the client claims the CXL node
  auto out = h.mgr->Reclaim(1, std::move(items));
  ASSERT_EQ(out.accepted.size(), 1u);
  auto s = h.mgr->Stat(1, 14);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->pool, "node0");
  EXPECT_EQ(h.Pool("node2").leased_bytes, 0u);
  EXPECT_EQ(h.Pool("node0").leased_bytes, 1u << 20);
}

TEST(JournalDamageTest, AnUnheldReadoptedLeaseLivesThroughGraceThenIsTakenBack) {
  DamagedHarness h;
  h.mgr->Recover({}, {}, std::chrono::milliseconds(30), Lost());
  h.ConnectPid(1, 600, 1000);
  UniqueFd mem = LeaseLikeMemfd(1 << 20);
  std::vector<LeaseManager::ReclaimItem> items;
  items.push_back(Item(15, mem, 1 << 20, "node0", 1000u));
  ASSERT_EQ(h.mgr->Reclaim(1, std::move(items)).accepted.size(), 1u);
  h.mgr->Disconnect(1);  // its other holders may still come: kept
  EXPECT_EQ(h.Pool("node0").leased_bytes, 1u << 20);
  EXPECT_EQ(FileSize(mem), 1u << 20);
  h.Drain();  // the grace timer fires
  EXPECT_FALSE(h.mgr->in_grace());
  EXPECT_EQ(h.Pool("node0").leased_bytes, 0u);
  EXPECT_EQ(FileSize(mem), 0u);
  EXPECT_EQ(h.mgr->Counters()["unjournalled_unclaimed"], 1u);
}

TEST(JournalDamageTest, FdStoreOrphanIsAccountedAndItsHolderBecomesTheOwner) {
  DamagedHarness h;
  UniqueFd mem = LeaseLikeMemfd(1 << 20);
  std::map<uint64_t, std::vector<UniqueFd>> stored;
  stored[1500].push_back(Dup(mem));  // above the mark: the store's names raise it
  auto r = h.mgr->Recover({}, std::move(stored), std::chrono::seconds(60), {});
  EXPECT_EQ(r.orphans, 1u);
  EXPECT_TRUE(h.mgr->in_grace()) << "orphans mean the journal lost leases";
  EXPECT_EQ(h.mgr->Gauges()["journal_damaged"], 1u);
  EXPECT_EQ(h.Pool("node0").leased_bytes, 1u << 20);
  EXPECT_FALSE(h.store.leases.count(1500)) << "not journalled before it has an owner";
  // The id taken from the store is never granted again.
  ASSERT_FALSE(h.store.reserved.empty());
  EXPECT_GT(h.store.reserved.back(), 1500u);
  h.ConnectPid(1, 600, 2000);
  std::vector<LeaseManager::ReclaimItem> items;
  items.push_back(Item(1500, mem, 1 << 20, "node0", 2000u, "weights"));
  ASSERT_EQ(h.mgr->Reclaim(1, std::move(items)).accepted.size(), 1u);
  auto s = h.mgr->Stat(1, 1500);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->owner.uid, 2000u);
  EXPECT_EQ(s->name, "weights");
  EXPECT_TRUE(h.store.leases.count(1500));
}

TEST(JournalDamageTest, AnUnclaimedOrphanIsTakenBackAtTheEndOfGrace) {
  DamagedHarness h;
  UniqueFd mem = LeaseLikeMemfd(1 << 20);
  std::map<uint64_t, std::vector<UniqueFd>> stored;
  stored[20].push_back(Dup(mem));
  h.mgr->Recover({}, std::move(stored), std::chrono::milliseconds(10), {});
  EXPECT_EQ(h.Pool("node0").leased_bytes, 1u << 20);
  h.Drain();
  EXPECT_EQ(h.Pool("node0").leased_bytes, 0u);
  EXPECT_EQ(FileSize(mem), 0u);
}

// A shared lease the journal lost: its attacher comes back first and holds
// it (charged to itself for now); when its owner comes back, the owner takes
// the charge and the name over, and the attacher keeps its reference.
TEST(JournalDamageTest, SharedLeaseGoesBackToItsOwnerWhoeverReclaimsFirst) {
  DamagedHarness h;
  h.mgr->Recover({}, {}, std::chrono::seconds(60), Lost());
  h.ConnectPid(1, 600, 1000);  // the owner
  h.ConnectPid(2, 700, 2000);  // the attacher
  UniqueFd mem = LeaseLikeMemfd(1 << 20);
  std::vector<LeaseManager::ReclaimItem> a;
  a.push_back(Item(30, mem, 1 << 20, "node0", 1000u, "model"));
  ASSERT_EQ(h.mgr->Reclaim(2, std::move(a)).accepted.size(), 1u);
  EXPECT_EQ(h.mgr->Stat(2, 30)->owner.uid, 2000u);
  EXPECT_EQ(h.mgr->Stat(2, 30)->name, "") << "the name is the owner's to give";
  std::vector<LeaseManager::ReclaimItem> o;
  o.push_back(Item(30, mem, 1 << 20, "node0", 1000u, "model"));
  ASSERT_EQ(h.mgr->Reclaim(1, std::move(o)).accepted.size(), 1u);
  auto s = h.mgr->Stat(1, 30);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->owner.uid, 1000u);
  EXPECT_EQ(s->name, "model");
  EXPECT_EQ(s->holders, 2u);
  EXPECT_EQ(h.Pool("node0").leased_bytes, 1u << 20);  // counted once
  // Someone else presenting the same memfd cannot take it over again.
  h.ConnectPid(3, 800, 3000);
  std::vector<LeaseManager::ReclaimItem> t;
  t.push_back(Item(30, mem, 1 << 20, "node0", 3000u, "model"));
  ASSERT_EQ(h.mgr->Reclaim(3, std::move(t)).accepted.size(), 1u);  // it does hold the memfd
  EXPECT_EQ(h.mgr->Stat(1, 30)->owner.uid, 1000u);
}

TEST(RecoveryHelpersTest, StateDirChoice) {
  StateDirChoice c;
  c.fallback = "/var/lib/cxlpool";
  EXPECT_EQ(ChooseStateDir(c), "/var/lib/cxlpool");
  c.state_directory_env = "/var/lib/cxlpool-sd:/other";
  EXPECT_EQ(ChooseStateDir(c), "/var/lib/cxlpool-sd");
  c.config = "/etc-state";
  EXPECT_EQ(ChooseStateDir(c), "/etc-state");
  c.flag = "/flag";
  EXPECT_EQ(ChooseStateDir(c), "/flag");
  StateDirChoice adhoc;
  adhoc.fallback = "/var/lib/cxlpool";
  adhoc.socket_from_flag = true;
  EXPECT_EQ(ChooseStateDir(adhoc), "");  // a test daemon never replays another's journal
}

TEST(RecoveryHelpersTest, RecordRoundTripKeepsHolders) {
  TestMemfd m = MakeMemfd(9, 4096, 321);
  m.rec.name = "kv";
  m.rec.acl_uids = {1, 2};
  m.rec.holders.push_back(HolderId{322, 5});
  DurableLease back = FromRecord(ToRecord(m.rec));
  EXPECT_EQ(back.id, 9u);
  EXPECT_EQ(back.inode, m.rec.inode);
  EXPECT_EQ(back.inode_dev, m.rec.inode_dev);
  EXPECT_EQ(back.name, "kv");
  EXPECT_EQ(back.acl_uids, m.rec.acl_uids);
  EXPECT_EQ(back.holders, m.rec.holders);
  // A record of an older daemon has none of the placement facts.
  EXPECT_FALSE(back.long_term_pin);
  EXPECT_FALSE(back.placed_numa_node.has_value());
  EXPECT_FALSE(back.pages_numa_node.has_value());
  EXPECT_EQ(back.moved_reason, "");
  m.rec.placed_numa_node = 0;  // node 0 is a value, not "unset"
  EXPECT_EQ(FromRecord(ToRecord(m.rec)).placed_numa_node, std::optional<int>(0));
}

TEST(RecoveryHelpersTest, LeaseFdsAreSortedFromTheRest) {
  std::vector<InheritedFd> fds;
  auto add = [&](const std::string& name) {
    InheritedFd f;
    f.fd.Reset(::eventfd(0, EFD_CLOEXEC));
    f.name = name;
    fds.push_back(std::move(f));
  };
  add("cxlpoold.socket");
  add("lease-7");
  add("lease-x");
  add("lease-7");
  // A lease of several extents: one name per extent, in any order.
  add("lease-9-extent-1");
  add("lease-9-extent-0");
  add("lease-9-extent-x");
  add("lease-11-extent-1");  // extent 0 never stored: a hole
  auto leases = TakeLeaseFds(&fds);
  ASSERT_EQ(leases.size(), 3u);
  ASSERT_EQ(leases[7].size(), 1u);
  EXPECT_TRUE(leases[7][0].valid());
  ASSERT_EQ(leases[9].size(), 2u);
  EXPECT_TRUE(leases[9][0].valid() && leases[9][1].valid());
  ASSERT_EQ(leases[11].size(), 2u);
  EXPECT_FALSE(leases[11][0].valid());
  EXPECT_TRUE(leases[11][1].valid());
  ASSERT_EQ(fds.size(), 1u);
  EXPECT_EQ(fds[0].name, "cxlpoold.socket");
  EXPECT_EQ(StoredFdName(7, 0, 1), "lease-7");
  EXPECT_EQ(StoredFdName(9, 1, 2), "lease-9-extent-1");
}

TEST(RecoveryHelpersTest, OneDaemonPerStateDirAndTheJournalReplays) {
  char tmpl[] = "/tmp/cxlpool-restart-unit-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  std::string dir = std::string(tmpl) + "/state";
  {
    auto a = JournalStore::Open(dir, nullptr);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    auto b = JournalStore::Open(dir, nullptr);
    ASSERT_FALSE(b.ok());
    EXPECT_EQ(b.status().code(), Code::kAlreadyExists);
    TestMemfd m = MakeMemfd(4, 4096, 1);
    ASSERT_TRUE((*a)->ReserveIds(1024).ok());
    ASSERT_TRUE((*a)->Put(m.rec, {}).ok());
  }
  auto c = JournalStore::Open(dir, nullptr);
  ASSERT_TRUE(c.ok());
  auto leases = (*c)->JournalledLeases();
  ASSERT_EQ(leases.size(), 1u);
  EXPECT_EQ(leases[0].id, 4u);
  EXPECT_EQ((*c)->next_id(), 1024u);
  EXPECT_FALSE(JournalStore::Open("relative/dir", nullptr).ok());
  std::filesystem::remove_all(tmpl);
}

}  // namespace
}  // namespace cxlpool
