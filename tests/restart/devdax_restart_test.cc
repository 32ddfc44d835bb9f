// devdax leases across a daemon restart, on a fake DaxControl whose devices
// survive the lease manager (tests/daemon/test_util.h): a "daemon" is a
// LeaseManager built on the same fake regions; a crash is HandOver (nothing
// freed, nothing destroyed) and the next daemon Recovers the journal. Checks:
// the lease is accounted again (a dynamic region's carved sub-device counted
// back into the pool, a static device full), never granted twice, reclaimed
// by its holder's device fd or adopted from the fd store, rejected for a
// wrong fd without losing anything, and its device given back (sub-device
// destroyed, static device free) when it ends or its owner died meanwhile.
// Plus the real identification helpers (fstat S_ISCHR, sysfs dev files).
#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <memory>

#include "recovery.h"
#include "restart_fakes.h"
#include "test_util.h"

namespace cxlpool {
namespace {

using testing::FakeDaxControl;
using testing::FakeProbe;
using testing::FakeStore;
using testing::Harness;
using testing::TestConfig;
using testing::TwoSocketCxl;

constexpr uint64_t kMiB = 1ull << 20;
constexpr pid_t kOwner = 600;
constexpr uint64_t kStart = 77;

// dax_region0: dynamic, 64 MiB, 2 MiB alignment, node 2.
// dax_region1: static, its one device dax1.0 of 32 MiB, node 3.
void AddRegions(FakeDaxControl* dax) {
  dax->AddRegion("dax_region0", 0, 64 * kMiB, 2 * kMiB, /*dynamic=*/true, 2);
  dax->AddRegion("dax_region1", 1, 32 * kMiB, 2 * kMiB, /*dynamic=*/false, 3);
}

DaemonConfig DaxConfig() {
  DaemonConfig cfg = TestConfig();
  cfg.devdax.push_back({"dax_region0", std::nullopt});
  cfg.devdax.push_back({"dax_region1", std::nullopt});
  return cfg;
}

struct Fakes {
  FakeStore store;
  FakeProbe probe;
};
// One daemon's lease manager on the shared fake DAX regions. The fakes
// outlive the manager (bases are destroyed after Harness).
struct Daemon : Fakes, Harness {
  explicit Daemon(FakeDaxControl* dax) : Harness(TwoSocketCxl(), DaxConfig(), dax) {
    mgr->EnableRestart(&store, &probe, 1);
  }
  void ConnectPid(ConnId c, pid_t pid, uid_t uid = 1000) {
    probe.start[pid] = kStart;
    CallerInfo ci;
    ci.pid = pid;
    ci.uid = uid;
    ci.gid = uid;
    ci.start_time = kStart;
    mgr->Connect(c, ci);
  }
  Result<Granted> AllocDynamic(ConnId c, uint64_t size) {
    AllocParams p;
    p.size_bytes = size;
    p.tiers = {"devdax"};
    p.strict = true;
    return Alloc(c, p);
  }
  Result<Granted> AllocStatic(ConnId c) {
    AllocParams p;
    p.size_bytes = 1 * kMiB;
    p.numa_node = 3;
    p.tiers = {"devdax"};
    p.strict = true;
    return Alloc(c, p);
  }
  // A SIGKILL: nothing freed, nothing destroyed, the journal kept.
  void Crash() {
    mgr->HandOver();
    mgr.reset();
  }
};

UniqueFd Dup(int fd) { return UniqueFd(::fcntl(fd, F_DUPFD_CLOEXEC, 0)); }

LeaseManager::ReclaimItem Item(uint64_t id, uint64_t size, UniqueFd fd) {
  LeaseManager::ReclaimItem i;
  i.id = id;
  i.size_bytes = size;
  i.fds.push_back(std::move(fd));
  return i;
}

std::vector<LeaseManager::ReclaimItem> Items(LeaseManager::ReclaimItem a) {
  std::vector<LeaseManager::ReclaimItem> v;
  v.push_back(std::move(a));
  return v;
}

// What the client process keeps across the restart: the device fd and its
// mapping, with a pattern written into it.
struct ClientLease {
  uint64_t id = 0;
  uint64_t size = 0;
  UniqueFd fd;
  void* addr = nullptr;
  ~ClientLease() {
    if (addr != nullptr) ::munmap(addr, size);
  }
};
std::unique_ptr<ClientLease> Keep(const Granted& g) {
  auto c = std::make_unique<ClientLease>();
  c->id = g.lease.id;
  c->size = g.lease.size_bytes;
  c->fd = Dup(g.fd());
  void* a = ::mmap(nullptr, c->size, PROT_READ | PROT_WRITE, MAP_SHARED, c->fd.get(), 0);
  CXLPOOL_CHECK(a != MAP_FAILED);
  c->addr = a;
  std::memset(c->addr, static_cast<int>(c->id & 0x7f) + 1, c->size);
  return c;
}
bool PatternIntact(const ClientLease& c) {
  const auto* p = static_cast<const unsigned char*>(c.addr);
  const unsigned char want = static_cast<unsigned char>((c.id & 0x7f) + 1);
  return p[0] == want && p[c.size / 2] == want && p[c.size - 1] == want;
}

// A sealed memfd of `size` bytes: what a confused client might hand back.
UniqueFd SealedMemfd(uint64_t size) {
  UniqueFd fd(::memfd_create("not-dax", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  CXLPOOL_CHECK(fd.valid() && ::ftruncate(fd.get(), static_cast<off_t>(size)) == 0);
  CXLPOOL_CHECK(::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SEAL) == 0);
  return fd;
}

// The shared fake DAX regions (AddRegions), the daemon before the crash
// ("first", its owner pid kOwner connected as connection 1) and the daemon
// after it ("next"). Members outlive the daemons built on them.
class DevdaxRestartTest : public ::testing::Test {
 protected:
  DevdaxRestartTest() { AddRegions(&dax_); }
  Daemon& StartFirst() {
    first_ = std::make_unique<Daemon>(&dax_);
    first_->ConnectPid(1, kOwner);
    return *first_;
  }
  // Kills the first daemon; returns its journal.
  std::vector<DurableLease> CrashFirst() {
    std::vector<DurableLease> journal = first_->store.Journalled();
    first_->Crash();
    return journal;
  }
  // The next daemon on the same regions; its probe sees the owner alive (same
  // start time) or not at all (it died while the daemon was down).
  Daemon& StartNext(bool owner_alive) {
    next_ = std::make_unique<Daemon>(&dax_);
    if (owner_alive) next_->probe.start[kOwner] = kStart;
    return *next_;
  }

  FakeDaxControl dax_;
  std::unique_ptr<Daemon> first_, next_;
};

TEST_F(DevdaxRestartTest, GrantJournalsTheDeviceAndItsNumber) {
  Daemon& a = StartFirst();
  auto g = a.AllocDynamic(1, 3 * kMiB);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const DurableLease& d = a.store.leases.at(g->lease.id);
  EXPECT_EQ(d.backing, "devdax");
  EXPECT_EQ(d.dax_device, "dax0.1");
  EXPECT_EQ(d.dax_rdev, dax_.rdev.at("dax0.1"));
  EXPECT_EQ(d.size_bytes, 4 * kMiB);
  EXPECT_TRUE(a.store.stored_fds.count(g->lease.id)) << "pushed to the fd store like a memfd";
  // The journal record carries both fields across a daemon upgrade.
  DurableLease back = FromRecord(ToRecord(d));
  EXPECT_EQ(back.dax_device, "dax0.1");
  EXPECT_EQ(back.dax_rdev, d.dax_rdev);
}

TEST_F(DevdaxRestartTest, ClientReclaimAfterARestartIsAccountedAndNeverGrantedTwice) {
  Daemon& a = StartFirst();
  auto dyn = a.AllocDynamic(1, 3 * kMiB);
  ASSERT_TRUE(dyn.ok()) << dyn.status().ToString();
  auto stat = a.AllocStatic(1);
  ASSERT_TRUE(stat.ok()) << stat.status().ToString();
  EXPECT_EQ(stat->lease.pool, "dax1.0");
  auto c_dyn = Keep(*dyn);
  auto c_stat = Keep(*stat);
  std::vector<DurableLease> journal = CrashFirst();
  EXPECT_TRUE(dax_.destroyed.empty()) << "a crash destroys nothing";

  Daemon& b = StartNext(/*owner_alive=*/true);
  // Before recovery the region's free space lacks the carved sub-device.
  EXPECT_EQ(b.Pool("dax_region0").capacity_bytes, 60 * kMiB);
  auto r = b.mgr->Recover(journal, {}, std::chrono::seconds(60));
  EXPECT_EQ(r.awaiting, 2u);
  EXPECT_EQ(r.dropped, 0u);
  EXPECT_TRUE(b.mgr->in_grace());
  EXPECT_EQ(b.Pool("dax_region0").capacity_bytes, 64 * kMiB) << "sub-device counted back in";
  EXPECT_EQ(b.Pool("dax_region0").leased_bytes, 4 * kMiB);
  EXPECT_EQ(b.Pool("dax1.0").leased_bytes, 32 * kMiB);
  EXPECT_FALSE(b.mgr->GraceRefusal().ok());

  // Wrong fds for the dynamic lease: a memfd, another DAX device, a regular
  // file; and the right fd from a uid that may not hold it. Each rejected
  // with its reason; nothing is lost.
  b.ConnectPid(1, kOwner);
  b.ConnectPid(2, 700, 2000);
  std::vector<LeaseManager::ReclaimItem> bad;
  bad.push_back(Item(c_dyn->id, 4 * kMiB, SealedMemfd(4 * kMiB)));
  bad.push_back(Item(c_dyn->id, 4 * kMiB, Dup(c_stat->fd.get())));
  std::FILE* tmp = std::tmpfile();
  ASSERT_NE(tmp, nullptr);
  ASSERT_EQ(::ftruncate(::fileno(tmp), static_cast<off_t>(4 * kMiB)), 0);
  bad.push_back(Item(c_dyn->id, 4 * kMiB, Dup(::fileno(tmp))));
  bad.push_back(Item(c_dyn->id, 2 * kMiB, Dup(c_dyn->fd.get())));
  auto out = b.mgr->Reclaim(1, std::move(bad));
  std::fclose(tmp);
  EXPECT_TRUE(out.accepted.empty());
  ASSERT_EQ(out.rejected.size(), 4u);
  EXPECT_NE(out.rejected[0].second.find("not a DAX character device"), std::string::npos)
      << out.rejected[0].second;
  EXPECT_NE(out.rejected[1].second.find("not dax0.1"), std::string::npos) << out.rejected[1].second;
  EXPECT_NE(out.rejected[2].second.find("not a DAX character device"), std::string::npos)
      << out.rejected[2].second;
  EXPECT_NE(out.rejected[3].second.find("bytes"), std::string::npos) << out.rejected[3].second;
  auto foreign = b.mgr->Reclaim(2, Items(Item(c_dyn->id, 4 * kMiB, Dup(c_dyn->fd.get()))));
  ASSERT_EQ(foreign.rejected.size(), 1u);
  EXPECT_NE(foreign.rejected[0].second.find("not one this caller may hold"), std::string::npos);
  EXPECT_TRUE(b.mgr->in_grace());
  EXPECT_EQ(b.Pool("dax_region0").leased_bytes, 4 * kMiB);
  EXPECT_TRUE(dax_.destroyed.empty());

  // The holder's own device fds: accepted, grace over.
  std::vector<LeaseManager::ReclaimItem> good;
  good.push_back(Item(c_dyn->id, 4 * kMiB, Dup(c_dyn->fd.get())));
  good.push_back(Item(c_stat->id, 32 * kMiB, Dup(c_stat->fd.get())));
  auto ok = b.mgr->Reclaim(1, std::move(good));
  EXPECT_EQ(ok.accepted.size(), 2u);
  EXPECT_TRUE(ok.rejected.empty());
  EXPECT_FALSE(b.mgr->in_grace());
  EXPECT_TRUE(PatternIntact(*c_dyn));
  EXPECT_TRUE(PatternIntact(*c_stat));
  auto s = b.mgr->Stat(1, c_dyn->id);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->backing, "devdax");
  EXPECT_EQ(s->holders, 1u);
  // The daemon holds the device again (an ATTACH would send this fd).
  EXPECT_EQ(b.store.leases.at(c_dyn->id).dax_device, "dax0.1");

  // Never granted twice: a new dynamic lease gets a new sub-device, the
  // static device is taken.
  auto next = b.AllocDynamic(1, 2 * kMiB);
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_GT(next->lease.id, c_stat->id);
  EXPECT_EQ(b.store.leases.at(next->lease.id).dax_device, "dax0.2");
  EXPECT_EQ(b.AllocStatic(1).status().code(), Code::kResourceExhausted);

  // Released: the sub-device goes back to the region, the static device is free.
  ASSERT_TRUE(b.mgr->Release(1, c_dyn->id).ok());
  b.Drain();  // the device is given back on a worker
  EXPECT_EQ(dax_.destroyed, (std::vector<std::string>{"dax0.1"}));
  ASSERT_TRUE(b.mgr->Release(1, c_stat->id).ok());
  ASSERT_TRUE(b.mgr->Release(1, next->lease.id).ok());
  b.Drain();
  EXPECT_EQ(b.Pool("dax_region0").leased_bytes, 0u);
  EXPECT_EQ(b.Pool("dax1.0").leased_bytes, 0u);
  EXPECT_EQ(dax_.regions["dax_region0"].state.available_bytes, 64 * kMiB);
  EXPECT_EQ(b.Pool("dax_region0").capacity_bytes, 64 * kMiB);
  EXPECT_TRUE(b.store.leases.empty());
  EXPECT_TRUE(b.AllocStatic(1).ok());
}

TEST_F(DevdaxRestartTest, OwnerDeadWhileDownGivesTheDevicesBack) {
  Daemon& a = StartFirst();
  ASSERT_TRUE(a.AllocDynamic(1, 6 * kMiB).ok());
  ASSERT_TRUE(a.AllocStatic(1).ok());
  std::vector<DurableLease> journal = CrashFirst();

  Daemon& b = StartNext(/*owner_alive=*/false);  // pid 600 died meanwhile
  auto r = b.mgr->Recover(journal, {}, std::chrono::seconds(60));
  EXPECT_EQ(r.dropped, 2u);
  EXPECT_EQ(r.awaiting, 0u);
  EXPECT_FALSE(b.mgr->in_grace());
  EXPECT_EQ(dax_.destroyed, (std::vector<std::string>{"dax0.1"}));
  EXPECT_EQ(dax_.regions["dax_region0"].state.available_bytes, 64 * kMiB);
  EXPECT_EQ(b.Pool("dax_region0").capacity_bytes, 64 * kMiB);
  EXPECT_EQ(b.Pool("dax_region0").leased_bytes, 0u);
  EXPECT_EQ(b.Pool("dax1.0").leased_bytes, 0u);
  EXPECT_EQ(b.store.deleted.size(), 2u);
  b.ConnectPid(1, 601);
  EXPECT_TRUE(b.AllocStatic(1).ok()) << "the static device is free again";
  auto whole = b.AllocDynamic(1, 64 * kMiB);
  EXPECT_TRUE(whole.ok()) << "the whole region is free again: " << whole.status().ToString();
}

TEST_F(DevdaxRestartTest, FdStoreAdoptsTheDeviceAndClosesAWrongOne) {
  Daemon& a = StartFirst();
  auto dyn = a.AllocDynamic(1, 4 * kMiB);
  auto stat = a.AllocStatic(1);
  ASSERT_TRUE(dyn.ok() && stat.ok());
  auto c_dyn = Keep(*dyn);
  auto c_stat = Keep(*stat);
  // What systemd would hand back in LISTEN_FDS: lease-<id> for both, but
  // the static lease's entry is a memfd (mixed up): closed, not adopted.
  std::map<uint64_t, std::vector<UniqueFd>> stored;
  stored[c_dyn->id].push_back(Dup(dyn->fd()));
  stored[c_stat->id].push_back(SealedMemfd(32 * kMiB));
  std::vector<DurableLease> journal = CrashFirst();

  Daemon& b = StartNext(/*owner_alive=*/true);
  auto r = b.mgr->Recover(journal, std::move(stored), std::chrono::seconds(60));
  EXPECT_EQ(r.adopted, 1u);
  EXPECT_EQ(r.awaiting, 1u);
  EXPECT_TRUE(b.mgr->in_grace()) << "the static lease still awaits its holder";
  EXPECT_EQ(b.Pool("dax_region0").leased_bytes, 4 * kMiB);
  EXPECT_EQ(b.Pool("dax1.0").leased_bytes, 32 * kMiB);
  b.ConnectPid(1, kOwner);
  std::vector<LeaseManager::ReclaimItem> items;
  items.push_back(Item(c_dyn->id, 4 * kMiB, Dup(c_dyn->fd.get())));
  items.push_back(Item(c_stat->id, 32 * kMiB, Dup(c_stat->fd.get())));
  EXPECT_EQ(b.mgr->Reclaim(1, std::move(items)).accepted.size(), 2u);
  EXPECT_FALSE(b.mgr->in_grace());
  b.mgr->Disconnect(1);  // last holder gone: both freed
  b.Drain();
  EXPECT_EQ(dax_.destroyed, (std::vector<std::string>{"dax0.1"}));
  EXPECT_EQ(b.Pool("dax_region0").leased_bytes, 0u);
  EXPECT_EQ(b.Pool("dax1.0").leased_bytes, 0u);
}

TEST_F(DevdaxRestartTest, AStoredDevdaxLeaseWhoseHoldersDiedDestroysItsSubDevice) {
  Daemon& a = StartFirst();
  auto dyn = a.AllocDynamic(1, 4 * kMiB);
  ASSERT_TRUE(dyn.ok());
  std::map<uint64_t, std::vector<UniqueFd>> stored;
  stored[dyn->lease.id].push_back(Dup(dyn->fd()));
  std::vector<DurableLease> journal = CrashFirst();
  Daemon& b = StartNext(/*owner_alive=*/false);
  auto r = b.mgr->Recover(journal, std::move(stored), std::chrono::seconds(60));
  EXPECT_EQ(r.dropped, 1u);
  EXPECT_EQ(dax_.destroyed, (std::vector<std::string>{"dax0.1"}));
  EXPECT_EQ(b.Pool("dax_region0").capacity_bytes, 64 * kMiB);
  EXPECT_EQ(b.Pool("dax_region0").leased_bytes, 0u);
}

TEST_F(DevdaxRestartTest, ASubDeviceTheJournalLostIsDestroyedWhenFreeNeverSilentlyLost) {
  // Two sub-devices carved for leases; the journal then loses both records
  // (only the second lease's holder is still alive and maps it).
  Daemon& a = StartFirst();
  auto gone = a.AllocDynamic(1, 4 * kMiB);
  auto held = a.AllocDynamic(1, 6 * kMiB);
  ASSERT_TRUE(gone.ok() && held.ok());
  auto c_held = Keep(*held);
  const std::string held_dev = a.store.leases.at(held->lease.id).dax_device;
  CrashFirst();
  dax_.busy.insert(held_dev);  // its holder has it open

  Daemon& b = StartNext(/*owner_alive=*/true);
  b.mgr->Recover({}, {}, std::chrono::milliseconds(50));
  EXPECT_TRUE(b.mgr->in_grace()) << "the journal lost leases: the grace period runs its length";
  // The free one is destroyed; the held one is counted back and reserved:
  // never granted to anyone else while its holder maps it.
  EXPECT_EQ(dax_.destroyed, (std::vector<std::string>{"dax0.1"}));
  EXPECT_EQ(b.Pool("dax_region0").capacity_bytes, 64 * kMiB);
  EXPECT_EQ(b.Pool("dax_region0").leased_bytes, 6 * kMiB);
  auto counters = b.mgr->Counters();
  EXPECT_EQ(counters["dax_orphans"], 2u);
  EXPECT_EQ(counters["dax_orphans_destroyed"], 1u);
  EXPECT_EQ(b.mgr->Gauges()["journal_damaged"], 1u);
  b.ConnectPid(2, 601);
  EXPECT_EQ(b.Pool("dax_region0").capacity_bytes - b.Pool("dax_region0").free_bytes, 6 * kMiB)
      << "the held sub-device's bytes are not free";
  EXPECT_TRUE(PatternIntact(*c_held));

  // Its holder lets go; the end of the grace period destroys it.
  c_held.reset();
  dax_.busy.clear();
  b.io.restart();
  b.io.run_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(b.mgr->in_grace());
  EXPECT_EQ(dax_.destroyed, (std::vector<std::string>{"dax0.1", held_dev}));
  EXPECT_EQ(b.Pool("dax_region0").leased_bytes, 0u);
  EXPECT_EQ(b.mgr->Counters()["dax_orphans_destroyed"], 2u);
  EXPECT_TRUE(b.AllocDynamic(2, 64 * kMiB).ok()) << "the whole region is free again";
}

TEST_F(DevdaxRestartTest, DevicesTheJournalLostAreHeldAgainByTheirHoldersReclaim) {
  // A static device leased whole and a sub-device, both still mapped by
  // their holder; the journal then loses both records.
  Daemon& a = StartFirst();
  auto stat = a.AllocStatic(1);
  auto held = a.AllocDynamic(1, 6 * kMiB);
  ASSERT_TRUE(stat.ok() && held.ok());
  auto c_stat = Keep(*stat);
  auto c_held = Keep(*held);
  const std::string held_dev = a.store.leases.at(held->lease.id).dax_device;
  ASSERT_FALSE(a.store.reserved.empty());
  const uint64_t ids_floor = a.store.reserved.back();  // the id high-water mark survives
  CrashFirst();
  dax_.busy.insert(held_dev);

  Daemon& b = StartNext(/*owner_alive=*/true);
  b.mgr->EnableRestart(&b.store, &b.probe, ids_floor);
  b.mgr->Recover({}, {}, std::chrono::milliseconds(50));
  ASSERT_TRUE(b.mgr->in_grace()) << "the journal lost leases: nothing is granted yet";
  EXPECT_EQ(b.Pool("dax1.0").leased_bytes, 0u) << "nothing says the static device is held";

  // The holder reclaims both with its device fds: each is its lease again.
  b.ConnectPid(1, kOwner);
  std::vector<LeaseManager::ReclaimItem> items;
  items.push_back(Item(c_stat->id, 32 * kMiB, Dup(c_stat->fd.get())));
  items.push_back(Item(c_held->id, 6 * kMiB, Dup(c_held->fd.get())));
  auto out = b.mgr->Reclaim(1, std::move(items));
  ASSERT_EQ(out.accepted.size(), 2u) << (out.rejected.empty() ? "" : out.rejected[0].second);
  EXPECT_EQ(b.Pool("dax1.0").leased_bytes, 32 * kMiB) << "the static device is leased again";
  EXPECT_EQ(b.Pool("dax_region0").leased_bytes, 6 * kMiB);
  EXPECT_EQ(b.mgr->Counters()["unjournalled_dax_adopted"], 2u);
  auto s = b.mgr->Stat(1, c_stat->id);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->backing, "devdax");
  EXPECT_EQ(s->owner.uid, 1000u);
  // Journalled again, with its device.
  EXPECT_EQ(b.store.leases.at(c_stat->id).dax_device, "dax1.0");
  EXPECT_EQ(b.store.leases.at(c_held->id).dax_device, held_dev);
  EXPECT_TRUE(PatternIntact(*c_stat));
  EXPECT_TRUE(PatternIntact(*c_held));

  // The same device under another lost id is refused: it is this lease's now.
  b.ConnectPid(2, 601);
  auto twice = b.mgr->Reclaim(2, Items(Item(c_stat->id + 2, 32 * kMiB, Dup(c_stat->fd.get()))));
  ASSERT_EQ(twice.rejected.size(), 1u);
  // An id above the high-water mark was never granted: the refusal that
  // says nothing (the log has the reason). The device stays leased once.
  EXPECT_EQ(twice.rejected[0].second,
            "lease " + std::to_string(c_stat->id + 2) + " is not one this caller may hold");
  EXPECT_EQ(b.Pool("dax1.0").leased_bytes, 32 * kMiB);

  // After the grace period the static device is still not granted to anyone else.
  b.io.restart();
  b.io.run_for(std::chrono::milliseconds(300));
  ASSERT_FALSE(b.mgr->in_grace());
  EXPECT_EQ(b.AllocStatic(2).status().code(), Code::kResourceExhausted);
  EXPECT_EQ(b.Pool("dax1.0").leased_bytes, 32 * kMiB);

  // Released by its holder: the static device is free, the sub-device destroyed.
  ASSERT_TRUE(b.mgr->Release(1, c_stat->id).ok());
  c_held.reset();
  dax_.busy.clear();
  ASSERT_TRUE(b.mgr->Release(1, held->lease.id).ok());
  b.Drain();
  EXPECT_EQ(b.Pool("dax1.0").leased_bytes, 0u);
  EXPECT_EQ(b.Pool("dax_region0").leased_bytes, 0u);
  EXPECT_EQ(dax_.destroyed, (std::vector<std::string>{held_dev}));
  EXPECT_TRUE(b.AllocStatic(2).ok());
}

TEST_F(DevdaxRestartTest, AnAwaitedHolderThatExitsAfterTheGraceFreesTheSubDevice) {
  Daemon& a = StartFirst();
  auto dyn = a.AllocDynamic(1, 4 * kMiB);
  ASSERT_TRUE(dyn.ok());
  std::vector<DurableLease> journal = CrashFirst();
  Daemon& b = StartNext(/*owner_alive=*/true);
  UniqueFd exit_signal(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  b.probe.pidfds[kOwner] = exit_signal.get();
  // No grace period: the holder that has not reclaimed, still alive, is
  // watched at once (its pidfd) and its lease stays accounted.
  b.mgr->Recover(journal, {}, std::chrono::milliseconds(0));
  b.io.restart();
  b.io.poll();
  EXPECT_FALSE(b.mgr->in_grace());
  EXPECT_EQ(b.Pool("dax_region0").leased_bytes, 4 * kMiB);
  EXPECT_TRUE(dax_.destroyed.empty());
  uint64_t one = 1;
  ASSERT_EQ(::write(exit_signal.get(), &one, sizeof one), 8);
  b.io.restart();
  b.io.poll();
  EXPECT_EQ(b.Pool("dax_region0").leased_bytes, 0u);
  EXPECT_EQ(dax_.destroyed, (std::vector<std::string>{"dax0.1"}));
  EXPECT_TRUE(b.store.deleted.count(dyn->lease.id));
}

TEST_F(DevdaxRestartTest, ARecreatedDeviceOfTheSameNameIsNotTheLeases) {
  Daemon& a = StartFirst();
  auto dyn = a.AllocDynamic(1, 4 * kMiB);
  ASSERT_TRUE(dyn.ok());
  auto c = Keep(*dyn);
  std::vector<DurableLease> journal = CrashFirst();
  dax_.rdev["dax0.1"] = makedev(251, 99);  // an admin destroyed and re-created it
  Daemon& b = StartNext(/*owner_alive=*/true);
  b.mgr->Recover(journal, {}, std::chrono::seconds(60));
  b.ConnectPid(1, kOwner);
  auto out = b.mgr->Reclaim(1, Items(Item(c->id, 4 * kMiB, Dup(c->fd.get()))));
  ASSERT_EQ(out.rejected.size(), 1u);
  EXPECT_NE(out.rejected[0].second.find("destroyed and created again"), std::string::npos)
      << out.rejected[0].second;
  EXPECT_EQ(b.Pool("dax_region0").leased_bytes, 4 * kMiB) << "still accounted";
}

TEST_F(DevdaxRestartTest, AMemfdLeaseRefusesADaxDevice) {
  Daemon& a = StartFirst();
  auto mem = a.Alloc(1, 1 * kMiB, 0);
  auto dyn = a.AllocDynamic(1, 4 * kMiB);
  ASSERT_TRUE(mem.ok() && dyn.ok());
  auto c = Keep(*dyn);
  std::vector<DurableLease> journal = CrashFirst();
  Daemon& b = StartNext(/*owner_alive=*/true);
  b.mgr->Recover(journal, {}, std::chrono::seconds(60));
  b.ConnectPid(1, kOwner);
  auto out = b.mgr->Reclaim(1, Items(Item(mem->lease.id, 1 * kMiB, Dup(c->fd.get()))));
  ASSERT_EQ(out.rejected.size(), 1u);
  EXPECT_NE(out.rejected[0].second.find("not this lease's memfd"), std::string::npos)
      << out.rejected[0].second;
  EXPECT_EQ(b.Pool("node0").leased_bytes, 1 * kMiB);
}

// ---- the real identification (what LibDaxctlControl uses) ----------------

TEST(DaxIdentifyTest, CharDeviceNumberIsTheRdevOfACharacterDeviceOnly) {
  UniqueFd null(::open("/dev/null", O_RDWR | O_CLOEXEC));
  if (!null.valid()) GTEST_SKIP() << "no /dev/null";
  struct stat st {};
  ASSERT_EQ(::fstat(null.get(), &st), 0);
  auto n = CharDeviceNumber(null.get());
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, static_cast<uint64_t>(st.st_rdev));
  UniqueFd mem(::memfd_create("x", MFD_CLOEXEC));
  auto m = CharDeviceNumber(mem.get());
  EXPECT_EQ(m.status().code(), Code::kInvalidArgument);
  EXPECT_NE(m.status().message().find("not a DAX character device"), std::string::npos);
  EXPECT_EQ(CharDeviceNumber(-1).status().code(), Code::kInvalidArgument);
}

TEST(DaxIdentifyTest, SysfsDevFiles) {
  FakeFileSystem fs;
  fs.AddFile("/sys/bus/dax/devices/dax0.1/dev", "252:3\n");
  fs.AddFile("/sys/bus/dax/devices/dax0.2/dev", "garbage\n");
  auto n = ReadDaxDeviceNumber(fs, "dax0.1");
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, makedev(252, 3));
  EXPECT_EQ(DevNumberString(*n), "252:3");
  EXPECT_EQ(ReadDaxDeviceNumber(fs, "dax0.9").status().code(), Code::kNotFound);
  EXPECT_EQ(ReadDaxDeviceNumber(fs, "dax0.2").status().code(), Code::kIo);
  EXPECT_EQ(ReadDaxDeviceNumber(fs, "../dax0.1").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ReadDaxDeviceNumber(fs, "").status().code(), Code::kInvalidArgument);
  EXPECT_FALSE(ParseDevNumber("252").has_value());
  EXPECT_FALSE(ParseDevNumber("a:b").has_value());
  EXPECT_EQ(ParseDevNumber(" 1:3 "), makedev(1, 3));
}

}  // namespace
}  // namespace cxlpool
