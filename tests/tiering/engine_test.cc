// TieringEngine against fakes of its seams: a lease table with accounting,
// a migrator that moves (or fails to) as told, a holder channel that records
// pushes, a FakeClock, and one io_context for the loop and the mover.
// Signals -> temperature -> decision -> move -> accounting, the cooperative
// protocol with its deadline, rollbacks, splits, resumes, the rate limit.
#include "tiering/engine.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <functional>
#include <map>

#include "fake_damon.h"
#include "fake_migrator.h"
#include "tiering/damon_sampler.h"

namespace cxlpool::tiering {
namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kGiB = 1ull << 30;
constexpr int64_t kSec = 1'000'000'000;

class FakeTable final : public LeaseTable {
 public:
  FakeTable() {
    AddPool("node0", 0, "dram", kGiB);
    AddPool("node2", 2, "cxl", kGiB);
  }
  void AddPool(std::string name, int node, std::string kind, uint64_t cap) {
    PoolFacts p;
    p.name = name;
    p.numa_node = node;
    p.kind = std::move(kind);
    p.movable = true;
    p.capacity_bytes = cap;
    p.free_bytes = cap;
    pools[name] = p;
  }
  LeaseFacts& AddLease(uint64_t id, const std::string& pool, uint64_t size,
                       std::vector<ConnId> holders) {
    LeaseFacts f;
    f.id = id;
    f.size_bytes = size;
    f.backing = "memfd";
    f.owner_uid = 1000;
    f.holders = holders;
    for (ConnId c : holders) f.holder_pids.push_back(static_cast<pid_t>(100 + c));
    UnitFacts u;
    u.length = size;
    u.pool = pool;
    u.numa_node = pools.at(pool).numa_node;
    f.units.push_back(u);
    f.promote_pool = "node0";
    f.demote_pool = "node2";
    pools.at(pool).free_bytes -= size;
    leases[id] = f;
    return leases[id];
  }
  // A lease of `n` extents of `each` bytes, each accounted on its own as
  // the daemon does (LeaseManagerTable): a move reserves room for one unit
  // on the target and its commit puts that unit there.
  LeaseFacts& AddExtentLease(uint64_t id, const std::string& pool, uint32_t n, uint64_t each,
                             std::vector<ConnId> holders) {
    LeaseFacts& f = AddLease(id, pool, n * each, std::move(holders));
    f.units.clear();
    for (uint32_t i = 0; i < n; ++i) {
      UnitFacts u;
      u.offset = i * each;
      u.length = each;
      u.pool = pool;
      u.numa_node = pools.at(pool).numa_node;
      f.units.push_back(u);
    }
    return f;
  }
  uint32_t UnitsOn(uint64_t id, const std::string& pool) const {
    uint32_t k = 0;
    for (const UnitFacts& u : leases.at(id).units) k += u.pool == pool ? 1 : 0;
    return k;
  }
  std::vector<LeaseFacts> Leases() const override {
    ++scans;
    std::vector<LeaseFacts> v;
    for (const auto& [id, f] : leases) v.push_back(f);
    return v;
  }
  std::optional<LeaseFacts> Find(uint64_t id) const override {
    auto it = leases.find(id);
    if (it == leases.end()) return std::nullopt;
    return it->second;
  }
  std::vector<PoolFacts> Pools() const override {
    std::vector<PoolFacts> v;
    for (const auto& [n, p] : pools) v.push_back(p);
    return v;
  }
  Result<UnitMemory> OpenUnit(uint64_t id, uint32_t unit) override {
    if (!leases.count(id) || unit >= leases.at(id).units.size()) {
      return Status(Code::kNotFound, "no lease");
    }
    UnitMemory m;
    m.fd.Reset(::memfd_create("fake-unit", MFD_CLOEXEC));
    opened.push_back(unit);
    // The unit's size, so that a sampler can map it.
    if (::ftruncate(m.fd.get(), static_cast<off_t>(leases.at(id).units[unit].length)) != 0) {
      return Status::FromErrno(errno, "ftruncate");
    }
    return m;
  }
  Status BeginMove(uint64_t id, uint32_t unit, const std::string& to) override {
    ++begins;
    if (!begin_error.ok()) return begin_error;
    LeaseFacts& f = leases.at(id);
    if (!f.moving_to.empty()) return Status(Code::kAlreadyExists, "moving");
    uint64_t len = f.units[unit].length;
    if (pools.at(to).free_bytes < len) return Status(Code::kResourceExhausted, "no room");
    pools.at(to).free_bytes -= len;
    f.moving_to = to;
    f.moving_unit = unit;
    return Status::Ok();
  }
  Status CommitMove(uint64_t id, uint32_t unit) override {
    auto it = leases.find(id);
    if (it == leases.end()) return Status(Code::kNotFound, "ended");
    LeaseFacts& f = it->second;
    if (f.moving_to.empty() || f.moving_unit != unit) return Status(Code::kInternal, "no move");
    UnitFacts& u = f.units[unit];
    if (f.moving_to != u.pool) pools.at(u.pool).free_bytes += u.length;
    u.pool = f.moving_to;
    u.numa_node = pools.at(u.pool).numa_node;
    f.moving_to.clear();
    f.moving_note.clear();
    ++commits;
    return Status::Ok();
  }
  Status AbortMove(uint64_t id, uint32_t unit, const std::string& note) override {
    auto it = leases.find(id);
    if (it == leases.end()) return Status::Ok();
    LeaseFacts& f = it->second;
    if (f.moving_to.empty()) return Status::Ok();
    ++aborts;
    if (note.empty()) {
      if (f.moving_to != f.units[unit].pool)
        pools.at(f.moving_to).free_bytes += f.units[unit].length;
      f.moving_to.clear();
    } else {
      f.moving_note = note;
    }
    return Status::Ok();
  }
  const std::string& PoolOf(uint64_t id) { return leases.at(id).units[0].pool; }

  std::map<uint64_t, LeaseFacts> leases;
  std::map<std::string, PoolFacts> pools;
  std::vector<uint32_t> opened;  // OpenUnit's units, in order
  mutable int scans = 0;         // Leases() calls: full rounds
  Status begin_error;
  int begins = 0, commits = 0, aborts = 0;
};

// Moves as `behave` says; by default every page lands on the target.
class FakeMigrator final : public Migrator {
 public:
  Result<MoveReport> Move(const MoveRequest& req) override {
    requests.push_back(req);
    if (behave) return behave(req);
    return Complete(req);
  }
  Result<PageCount> Where(int, uint64_t, uint64_t length, uint64_t page) override {
    return fakes::PagesNowhere(length, page);
  }
  static MoveReport Complete(const MoveRequest& req) { return fakes::CompleteMove(req); }
  static MoveReport Partial(const MoveRequest& req, int other_node, uint64_t stuck) {
    MoveReport r = Complete(req);
    r.after.on_node[req.target_node] -= stuck;
    r.after.on_node[other_node] = stuck;
    r.move_errno = EBUSY;
    return r;
  }
  std::vector<MoveRequest> requests;
  std::function<Result<MoveReport>(const MoveRequest&)> behave;
};

class FakeChannel final : public HolderChannel {
 public:
  Status Ask(ConnId conn, const MigrationAsk& ask) override {
    asks.emplace_back(conn, ask);
    return ask_error;
  }
  void Tell(ConnId conn, const MigrationNotice& n) override { tells.emplace_back(conn, n); }
  void Moved(ConnId conn, uint64_t lease, int node, const std::string& pool) override {
    moved.push_back({conn, lease, node, pool});
  }
  struct MovedNote {
    ConnId conn;
    uint64_t lease;
    int node;
    std::string pool;
  };
  std::vector<MovedNote> moved;
  std::vector<std::pair<ConnId, MigrationAsk>> asks;
  std::vector<std::pair<ConnId, MigrationNotice>> tells;
  Status ask_error;
};

class EngineTest : public ::testing::Test {
 protected:
  // A holder's answer to a cooperative migration: moved to node 0, `bytes`.
  static void ExpectMovedToNode0(const std::optional<Result<MigrationOutcome>>& answer,
                                 uint64_t bytes) {
    ASSERT_TRUE(answer.has_value());
    ASSERT_TRUE(answer->ok()) << answer->status().ToString();
    EXPECT_TRUE((*answer)->moved);
    EXPECT_EQ((*answer)->numa_node, 0);
    EXPECT_EQ((*answer)->bytes, bytes);
  }
  void Make(TieringOptions o = Defaults()) {
    engine = std::make_unique<TieringEngine>(&table, &migrator, &channel, &clock, io.get_executor(),
                                             io.get_executor(), o);
  }
  static TieringOptions Defaults() {
    TieringOptions o;
    o.half_life_ns = 60 * kSec;
    o.rate_limit_bytes_per_s = 0;
    o.policy.min_residency_ns = 30 * kSec;
    o.policy.slow_reserve = 0;
    o.cooperative_deadline_ms = 2000;
    o.cooperative_retry_ns = 300 * kSec;
    return o;
  }
  void Drain() {
    for (int i = 0; i < 100; ++i) {
      io.restart();
      if (io.poll() == 0) return;
    }
  }
  // Connection `conn`'s caller: uid 1000 (FakeTable's leases' owner) unless
  // said; connection 8 is another tenant's (uid 2000) by default.
  static Caller From(ConnId conn, std::optional<uid_t> uid = std::nullopt, bool admin = false) {
    return Caller{conn, uid.value_or(conn == 8 ? 2000 : 1000), admin};
  }
  // Copies `times` full passes into lease `id` through connection `conn`.
  std::vector<std::pair<size_t, Status>> Copy(ConnId conn, uint64_t id, double times) {
    TieringEngine::Signal s;
    s.lease_id = id;
    s.offset = 0;
    s.length = table.leases.at(id).size_bytes;
    s.bytes_written = static_cast<uint64_t>(times * static_cast<double>(s.length));
    return engine->OnSignals(From(conn), {s});
  }
  Status Hint(ConnId conn, uint64_t id, uint64_t off, uint64_t len, tiering::Hint h) {
    TieringEngine::Signal s;
    s.lease_id = id;
    s.offset = off;
    s.length = len;
    s.hint = h;
    auto r = engine->OnSignals(From(conn), {s});
    return r.empty() ? Status::Ok() : r[0].second;
  }
  MigrationRecord Last() { return history().back(); }
  std::vector<MigrationRecord> history() { return engine->Report(std::nullopt).history; }
  std::string Verdict(uint64_t id, size_t unit = 0) {
    for (const auto& l : engine->Report(std::nullopt).leases)
      if (l.id == id) return l.units.at(unit).verdict;
    return "<no lease>";
  }

  boost::asio::io_context io;
  FakeClock clock;
  FakeTable table;
  FakeMigrator migrator;
  FakeChannel channel;
  fakes::FakeDamon damon;  // outlives the engine, which may own a sampler over it
  std::unique_ptr<TieringEngine> engine;
};

TEST_F(EngineTest, CopiedBytesHeatALeaseAndItIsPromotedThenAccounted) {
  Make();
  table.AddLease(1, "node2", 64 * kMiB, {7});
  EXPECT_TRUE(Copy(7, 1, 3.0).empty());
  auto rep = engine->Report(std::nullopt);
  ASSERT_EQ(rep.leases.size(), 1u);
  EXPECT_NEAR(rep.leases[0].units[0].temperature, 3.0, 1e-6);
  EXPECT_EQ(rep.leases[0].units[0].bytes_written, 192 * kMiB);
  engine->Tick();
  EXPECT_TRUE(engine->busy());
  EXPECT_EQ(table.leases.at(1).moving_to, "node0");  // reserved before the move
  Drain();
  EXPECT_FALSE(engine->busy());
  ASSERT_EQ(migrator.requests.size(), 1u);
  EXPECT_EQ(migrator.requests[0].target_node, 0);
  EXPECT_EQ(migrator.requests[0].length, 64 * kMiB);
  EXPECT_EQ(table.PoolOf(1), "node0");
  EXPECT_EQ(table.pools.at("node2").free_bytes, kGiB);
  EXPECT_EQ(table.pools.at("node0").free_bytes, kGiB - 64 * kMiB);
  const MigrationRecord r = Last();
  EXPECT_EQ(r.outcome, "moved");
  EXPECT_EQ(r.direction, "promote");
  EXPECT_EQ(r.mode, "in-place");
  EXPECT_NE(r.why.find("hot (temperature 3.00 >= hot 1.00"), std::string::npos) << r.why;
  EXPECT_NE(r.why.find("holders copied 192.0 MiB in"), std::string::npos) << r.why;
  EXPECT_EQ(engine->counters().at("bytes_promoted"), 64 * kMiB);
  // The holder is told where its pages are now.
  ASSERT_EQ(channel.moved.size(), 1u);
  EXPECT_EQ(channel.moved[0].conn, 7u);
  EXPECT_EQ(channel.moved[0].node, 0);
  EXPECT_EQ(channel.moved[0].pool, "node0");
  // It stays now: hot, and where it belongs.
  engine->Tick();
  Drain();
  EXPECT_EQ(migrator.requests.size(), 1u);
  EXPECT_NE(Verdict(1).find("moved"), std::string::npos) << Verdict(1);
}

// With no client signal at all: a holder touches the lease's pages, DAMON
// (paddr, through the fake sysfs) sees it, the temperature rises and the
// lease is promoted, the reason naming the sampler.
TEST_F(EngineTest, DamonSamplesHeatALeaseWithNoClientSignalAndItIsPromoted) {
  TieringOptions o = Defaults();
  o.sample_interval_ns = kSec;
  Make(o);
  auto sampler = std::make_unique<DamonSampler>(&damon, &damon, &damon);
  ASSERT_TRUE(sampler->Open().ok());
  engine->SetSampler(std::move(sampler));
  table.AddLease(1, "node2", 8 * kMiB, {7});
  engine->Tick();  // the first round arms: DAMON starts on the lease's frames
  Drain();
  ASSERT_TRUE(damon.running);
  ASSERT_FALSE(damon.pagemap_reads.empty());
  EXPECT_EQ(migrator.requests.size(), 0u);
  for (int round = 0; round < 4 && migrator.requests.empty(); ++round) {
    damon.touched.push_back(damon.FramesOfRead(0));  // the holder, every page
    clock.AdvanceNs(kSec);
    engine->Tick();
    Drain();
  }
  ASSERT_EQ(migrator.requests.size(), 1u) << Verdict(1);
  EXPECT_EQ(migrator.requests[0].target_node, 0);
  EXPECT_EQ(table.PoolOf(1), "node0");
  const MigrationRecord r = Last();
  EXPECT_EQ(r.direction, "promote");
  EXPECT_NE(r.why.find("sampler saw"), std::string::npos) << r.why;
  auto rep = engine->Report(std::nullopt);
  ASSERT_EQ(rep.leases.size(), 1u);
  EXPECT_EQ(rep.leases[0].units[0].bytes_written, 0u);  // no holder signal at all
  EXPECT_EQ(rep.leases[0].units[0].bytes_read, 0u);
}

TEST_F(EngineTest, HeatDecaysAndAColdLeaseIsDemotedUnderPressure) {
  Make();
  table.AddLease(1, "node0", 960 * kMiB, {7});  // 64 MiB free of 1 GiB: pressure
  Copy(7, 1, 0.5);
  engine->Tick();
  Drain();
  EXPECT_TRUE(migrator.requests.empty());
  EXPECT_NE(Verdict(1).find("between cold"), std::string::npos) << Verdict(1);
  clock.AdvanceNs(4 * 60 * kSec);  // four half-lives: 0.5 -> 0.03
  engine->Tick();
  Drain();
  ASSERT_EQ(migrator.requests.size(), 1u);
  EXPECT_EQ(migrator.requests[0].target_node, 2);
  EXPECT_EQ(table.PoolOf(1), "node2");
  EXPECT_EQ(Last().direction, "demote");
  EXPECT_NE(Last().why.find("node0 is under pressure"), std::string::npos) << Last().why;
}

TEST_F(EngineTest, SignalsOutsideTheLeaseOrFromStrangersAreRefusedClearly) {
  Make();
  table.AddLease(1, "node2", 64 * kMiB, {7});
  Status st = Hint(7, 1, 60 * kMiB, 8 * kMiB, tiering::Hint::kHot);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("hint for [62914560, 62914560 + 8388608) is outside lease 1 "
                              "(size 67108864 bytes)"),
            std::string::npos)
      << st.message();
  EXPECT_EQ(Hint(7, 1, 0, 0, tiering::Hint::kHot).code(), Code::kInvalidArgument);
  // Overflowing offset + length is outside too, not wrapped around.
  EXPECT_EQ(Hint(7, 1, 8, UINT64_MAX, tiering::Hint::kHot).code(), Code::kInvalidArgument);
  // Another's lease and no lease at all: one answer, which says nothing of the id.
  Status stranger = Hint(8, 1, 0, 4096, tiering::Hint::kHot);
  Status unknown = Hint(7, 1234, 0, 4096, tiering::Hint::kHot);
  EXPECT_EQ(stranger.code(), Code::kNotFound);
  EXPECT_EQ(unknown.code(), Code::kNotFound);
  EXPECT_EQ(stranger.message(), "lease 1 is not held by this connection");
  EXPECT_EQ(unknown.message(), "lease 1234 is not held by this connection");
  // A batch: the good entries count, the bad ones come back with their index.
  TieringEngine::Signal good{1, 0, 4096, 4096, 0, std::nullopt};
  TieringEngine::Signal bad{1, 64 * kMiB, 1, 0, 0, tiering::Hint::kCold};
  auto rej = engine->OnSignals(From(7), {good, bad, good});
  ASSERT_EQ(rej.size(), 1u);
  EXPECT_EQ(rej[0].first, 1u);
  EXPECT_EQ(engine->counters().at("signals"), 2u);
  EXPECT_EQ(engine->counters().at("signals_rejected"), 3u);
}

TEST_F(EngineTest, HintsWillNeedPromotesNowAndColdNeedsTheWholeUnit) {
  Make();
  table.AddLease(1, "node2", 64 * kMiB, {7});
  table.AddLease(2, "node0", 64 * kMiB, {7});
  Copy(7, 2, 0.5);
  // cold on half of lease 2: a part of the unit may be in use; nothing happens.
  ASSERT_TRUE(Hint(7, 2, 0, 32 * kMiB, tiering::Hint::kCold).ok());
  EXPECT_NEAR(engine->Report(std::nullopt).leases[1].units[0].temperature, 0.5, 1e-6);
  // dont_need on all of it: temperature 0, demoted now although there is no pressure.
  ASSERT_TRUE(Hint(7, 2, 0, 64 * kMiB, tiering::Hint::kDontNeed).ok());
  // will_need on a page of lease 1: the unit it touches is promoted.
  ASSERT_TRUE(Hint(7, 1, 4096, 4096, tiering::Hint::kWillNeed).ok());
  engine->Tick();
  Drain();
  engine->Tick();
  Drain();
  EXPECT_EQ(table.PoolOf(1), "node0");
  EXPECT_EQ(table.PoolOf(2), "node2");
  auto h = history();
  ASSERT_EQ(h.size(), 2u);
  EXPECT_NE(h[0].why.find("will_need hint"), std::string::npos) << h[0].why;
  EXPECT_NE(h[1].why.find("dont_need hint"), std::string::npos) << h[1].why;
  EXPECT_EQ(engine->counters().at("hints_will_need"), 1u);
}

TEST_F(EngineTest, OptedOutLeasesStayPut) {
  Make();
  table.AddLease(1, "node2", 64 * kMiB, {7});
  ASSERT_TRUE(engine->SetLeaseOptions(From(7), 1, true, std::nullopt).ok());
  EXPECT_EQ(engine->SetLeaseOptions(From(8), 1, true, std::nullopt).code(), Code::kNotFound);
  EXPECT_TRUE(engine->SetLeaseOptions(From(8, std::nullopt, true), 1, true, std::nullopt).ok());
  Copy(7, 1, 10);
  engine->Tick();
  Drain();
  EXPECT_TRUE(migrator.requests.empty());
  EXPECT_EQ(Verdict(1), "opted out: pinned to its tier");
  EXPECT_TRUE(engine->Report(std::nullopt).leases[0].opted_out);
  ASSERT_TRUE(engine->SetLeaseOptions(From(7), 1, false, std::nullopt).ok());
  engine->Tick();
  Drain();
  EXPECT_EQ(table.PoolOf(1), "node0");
}

TEST_F(EngineTest, APartialMoveIsRolledBackAndTheAccountingIsUntouched) {
  Make();
  table.AddLease(1, "node2", 64 * kMiB, {7});
  int calls = 0;
  migrator.behave = [&](const MoveRequest& req) -> Result<MoveReport> {
    if (calls++ == 0) return FakeMigrator::Partial(req, 2, 12);  // 12 pages stay busy
    return FakeMigrator::Complete(req);                          // the way back works
  };
  Copy(7, 1, 3);
  engine->Tick();
  Drain();
  ASSERT_EQ(migrator.requests.size(), 2u);
  EXPECT_EQ(migrator.requests[1].target_node, 2);  // back where it is accounted
  EXPECT_EQ(table.PoolOf(1), "node2");
  EXPECT_TRUE(table.leases.at(1).moving_to.empty());
  EXPECT_EQ(table.pools.at("node0").free_bytes, kGiB);
  EXPECT_EQ(Last().outcome, "rolled back");
  EXPECT_NE(Last().detail.find("node 2: 12"), std::string::npos) << Last().detail;
}

TEST_F(EngineTest, AMoveThatCannotBeUndoneLeavesASplitNoteAndIsFinishedLater) {
  Make();
  table.AddLease(1, "node2", 64 * kMiB, {7});
  bool stuck = true;
  migrator.behave = [&](const MoveRequest& req) -> Result<MoveReport> {
    if (stuck) return FakeMigrator::Partial(req, req.target_node == 0 ? 2 : 0, 5);
    return FakeMigrator::Complete(req);
  };
  Copy(7, 1, 3);
  engine->Tick();
  Drain();
  EXPECT_EQ(Last().outcome, "split");
  // The accounting says so: still on node2, room still reserved on node0.
  EXPECT_EQ(table.PoolOf(1), "node2");
  EXPECT_EQ(table.leases.at(1).moving_to, "node0");
  EXPECT_NE(table.leases.at(1).moving_note.find("split"), std::string::npos);
  EXPECT_EQ(table.pools.at("node0").free_bytes, kGiB - 64 * kMiB);
  EXPECT_NE(engine->Report(std::nullopt).leases[0].moving.find("split"), std::string::npos);
  // Not retried at once.
  size_t n = migrator.requests.size();
  engine->Tick();
  Drain();
  EXPECT_EQ(migrator.requests.size(), n);
  // Once the pages can move, the unfinished move is finished.
  stuck = false;
  clock.AdvanceNs(31 * kSec);
  engine->Tick();
  Drain();
  EXPECT_EQ(table.PoolOf(1), "node0");
  EXPECT_TRUE(table.leases.at(1).moving_to.empty());
  EXPECT_EQ(Last().direction, "resume");
  EXPECT_EQ(Last().outcome, "moved");
}

TEST_F(EngineTest, AMoveBegunBeforeARestartIsResumedFirst) {
  Make();
  LeaseFacts& f = table.AddLease(1, "node2", 64 * kMiB, {7});
  f.moving_to = "node0";  // as the journal had it
  f.moving_note = "interrupted by a daemon restart";
  table.pools.at("node0").free_bytes -= 64 * kMiB;
  engine->Tick();
  Drain();
  EXPECT_EQ(table.begins, 0);  // the reservation is there already
  ASSERT_EQ(migrator.requests.size(), 1u);
  EXPECT_EQ(table.PoolOf(1), "node0");
  EXPECT_EQ(Last().direction, "resume");
  EXPECT_NE(Last().why.find("interrupted by a daemon restart"), std::string::npos);
  EXPECT_EQ(table.pools.at("node2").free_bytes, kGiB);
}

TEST_F(EngineTest, ARefusedMoveIsRecordedAndNotRetriedAtOnce) {
  Make();
  table.AddLease(1, "node2", 64 * kMiB, {7});
  table.begin_error = Status(Code::kResourceExhausted, "quota uid 1000 dram: 0 B left");
  Copy(7, 1, 3);
  engine->Tick();
  Drain();
  EXPECT_EQ(Last().outcome, "refused");
  EXPECT_NE(Last().detail.find("quota uid 1000"), std::string::npos);
  EXPECT_NE(Verdict(1).find("was refused: quota uid 1000"), std::string::npos) << Verdict(1);
  engine->Tick();
  Drain();
  EXPECT_EQ(table.begins, 1);
}

TEST_F(EngineTest, WithoutCapSysNiceMovesTurnOffAndSaySo) {
  Make();
  table.AddLease(1, "node2", 64 * kMiB, {7});
  migrator.behave = [](const MoveRequest&) -> Result<MoveReport> {
    return Status(Code::kPermissionDenied, "mbind(MPOL_MF_MOVE_ALL) needs CAP_SYS_NICE");
  };
  Copy(7, 1, 3);
  engine->Tick();
  Drain();
  EXPECT_EQ(Last().outcome, "failed");
  EXPECT_EQ(table.PoolOf(1), "node2");
  EXPECT_TRUE(table.leases.at(1).moving_to.empty());
  EXPECT_NE(engine->Report(std::nullopt).disabled_why.find("CAP_SYS_NICE"), std::string::npos);
  engine->Tick();
  Drain();
  EXPECT_EQ(migrator.requests.size(), 1u);
  EXPECT_NE(Verdict(1).find("moves are off"), std::string::npos) << Verdict(1);
}

TEST_F(EngineTest, TheRateLimitSpacesMovesOut) {
  TieringOptions o = Defaults();
  o.rate_limit_bytes_per_s = 64 * kMiB;  // burst: one second = one lease
  Make(o);
  table.AddLease(1, "node2", 64 * kMiB, {7});
  table.AddLease(2, "node2", 64 * kMiB, {7});
  Copy(7, 1, 5);
  Copy(7, 2, 4);
  engine->Tick();
  Drain();
  ASSERT_EQ(migrator.requests.size(), 1u);
  EXPECT_EQ(migrator.requests[0].max_bytes_per_s, 64 * kMiB);  // paced in place
  EXPECT_EQ(table.PoolOf(1), "node0");
  EXPECT_NE(Verdict(2).find("waits for the rate limit"), std::string::npos) << Verdict(2);
  clock.AdvanceNs(kSec / 2);
  engine->Tick();
  Drain();
  EXPECT_EQ(migrator.requests.size(), 1u);
  clock.AdvanceNs(kSec / 2 + kSec / 100);
  engine->Tick();
  Drain();
  EXPECT_EQ(migrator.requests.size(), 2u);
  EXPECT_EQ(table.PoolOf(2), "node0");
}

// ---- cooperative migration ------------------------------------------------

TEST_F(EngineTest, CooperativeMoveWaitsForTheHolderAndAnswersAfterTheMove) {
  Make();
  table.AddLease(1, "node2", 64 * kMiB, {7});
  ASSERT_TRUE(engine->SetLeaseOptions(From(7), 1, std::nullopt, true).ok());
  Copy(7, 1, 3);
  engine->Tick();
  Drain();
  // Asked, nothing moved yet.
  ASSERT_EQ(channel.asks.size(), 1u);
  EXPECT_EQ(channel.asks[0].first, 7u);
  const MigrationAsk& ask = channel.asks[0].second;
  EXPECT_EQ(ask.lease_id, 1u);
  EXPECT_EQ(ask.target_node, 0);
  EXPECT_EQ(ask.deadline_ms, 2000u);
  EXPECT_EQ(ask.length, 64 * kMiB);
  EXPECT_TRUE(migrator.requests.empty());
  EXPECT_NE(Verdict(1).find("waiting for 1 holder(s) to reach a safe point"), std::string::npos)
      << Verdict(1);
  // The holder is at its safe point.
  clock.AdvanceNs(300'000'000);
  // What is in flight, and since when.
  EXPECT_EQ(engine->Report(std::nullopt)
                .in_flight.rfind("migration 1 (lease 1 unit 0, begun 0.3 s ago): ", 0),
            0u)
      << engine->Report(std::nullopt).in_flight;
  std::optional<Result<MigrationOutcome>> answer;
  engine->OnMigrationReady(7, ask.migration_id, true, "",
                           [&](Result<MigrationOutcome> o) { answer.emplace(std::move(o)); });
  EXPECT_FALSE(answer.has_value());  // answered after the move
  Drain();
  ASSERT_NO_FATAL_FAILURE(ExpectMovedToNode0(answer, 64 * kMiB));
  ASSERT_EQ(migrator.requests.size(), 1u);
  EXPECT_EQ(migrator.requests[0].max_bytes_per_s, 0u);  // a pause: as fast as it goes
  EXPECT_EQ(table.PoolOf(1), "node0");
  EXPECT_EQ(Last().mode, "cooperative");
  EXPECT_EQ(Last().outcome, "moved");
  // A second answer to a migration that is over.
  engine->OnMigrationReady(7, ask.migration_id, true, "",
                           [&](Result<MigrationOutcome> o) { answer.emplace(std::move(o)); });
  EXPECT_EQ(answer->status().code(), Code::kNotFound);
}

TEST_F(EngineTest, AHolderThatDoesNotAnswerIsSkippedNeverForced) {
  Make();
  table.AddLease(1, "node2", 64 * kMiB, {7});
  ASSERT_TRUE(engine->SetLeaseOptions(From(7), 1, std::nullopt, true).ok());
  Copy(7, 1, 3);
  engine->Tick();
  Drain();
  ASSERT_EQ(channel.asks.size(), 1u);
  uint64_t mid = channel.asks[0].second.migration_id;
  clock.AdvanceNs(2001'000'000);
  engine->Tick();
  Drain();
  EXPECT_TRUE(migrator.requests.empty());  // never moved under a pin
  EXPECT_FALSE(engine->busy());
  EXPECT_EQ(table.PoolOf(1), "node2");
  EXPECT_TRUE(table.leases.at(1).moving_to.empty());
  EXPECT_EQ(table.pools.at("node0").free_bytes, kGiB);
  ASSERT_EQ(channel.tells.size(), 1u);
  EXPECT_EQ(channel.tells[0].second.phase, "cancelled");
  EXPECT_EQ(Last().outcome, "skipped");
  EXPECT_NE(Last().detail.find("holder pid 107 did not reach a safe point within 2000 ms"),
            std::string::npos)
      << Last().detail;
  EXPECT_NE(Verdict(1).find("next try in"), std::string::npos) << Verdict(1);
  // A late answer is told the migration is over (and pins again).
  std::optional<Result<MigrationOutcome>> answer;
  engine->OnMigrationReady(7, mid, true, "", [&](auto o) { answer.emplace(std::move(o)); });
  EXPECT_EQ(answer->status().code(), Code::kNotFound);
  // After cooperative_retry it is asked again.
  clock.AdvanceNs(301 * kSec);
  Copy(7, 1, 3);
  engine->Tick();
  Drain();
  EXPECT_EQ(channel.asks.size(), 2u);
}

TEST_F(EngineTest, ADecliningHolderCancelsForEveryone) {
  Make();
  table.AddLease(1, "node2", 64 * kMiB, {7, 8});
  ASSERT_TRUE(engine->SetLeaseOptions(From(7), 1, std::nullopt, true).ok());
  ASSERT_TRUE(engine->SetLeaseOptions(From(8), 1, std::nullopt, true).ok());
  Copy(7, 1, 3);
  engine->Tick();
  Drain();
  ASSERT_EQ(channel.asks.size(), 2u);
  uint64_t mid = channel.asks[0].second.migration_id;
  std::optional<Result<MigrationOutcome>> a7, a8;
  engine->OnMigrationReady(7, mid, true, "", [&](auto o) { a7.emplace(std::move(o)); });
  EXPECT_FALSE(a7.has_value());
  engine->OnMigrationReady(8, mid, false, "inside a kernel launch",
                           [&](auto o) { a8.emplace(std::move(o)); });
  ASSERT_TRUE(a7 && a8);
  EXPECT_FALSE((*a7)->moved);
  EXPECT_NE((*a7)->detail.find("holder pid 108 declined: inside a kernel launch"),
            std::string::npos)
      << (*a7)->detail;
  EXPECT_TRUE(migrator.requests.empty());
  EXPECT_EQ(Last().outcome, "skipped");
}

TEST_F(EngineTest, AHolderThatGoesAwayIsNotWaitedFor) {
  Make();
  table.AddLease(1, "node2", 64 * kMiB, {7, 8});
  ASSERT_TRUE(engine->SetLeaseOptions(From(7), 1, std::nullopt, true).ok());
  ASSERT_TRUE(engine->SetLeaseOptions(From(8), 1, std::nullopt, true).ok());
  Copy(7, 1, 3);
  engine->Tick();
  Drain();
  uint64_t mid = channel.asks.at(0).second.migration_id;
  std::optional<Result<MigrationOutcome>> a7;
  engine->OnMigrationReady(7, mid, true, "", [&](auto o) { a7.emplace(std::move(o)); });
  // Holder 8 dies mid-migration: its pins went with it.
  table.leases.at(1).holders = {7};
  engine->OnDisconnect(8);
  Drain();
  ASSERT_TRUE(a7.has_value());
  EXPECT_TRUE((*a7)->moved);
  EXPECT_EQ(table.PoolOf(1), "node0");
}

TEST_F(EngineTest, ALeaseThatEndsDuringAMoveLeavesNothingBehind) {
  Make();
  table.AddLease(1, "node2", 64 * kMiB, {7});
  migrator.behave = [&](const MoveRequest& req) -> Result<MoveReport> {
    // The lease is released while its pages move (the table frees it and
    // drops the reservation, as LeaseManager::Free does).
    table.pools.at("node0").free_bytes += 64 * kMiB;
    table.pools.at("node2").free_bytes += 64 * kMiB;
    table.leases.erase(1);
    return FakeMigrator::Complete(req);
  };
  Copy(7, 1, 3);
  engine->Tick();
  Drain();
  EXPECT_EQ(Last().outcome, "gone");
  EXPECT_EQ(table.pools.at("node0").free_bytes, kGiB);
  EXPECT_EQ(table.pools.at("node2").free_bytes, kGiB);
  EXPECT_TRUE(engine->Report(std::nullopt).leases.empty());
}

TEST_F(EngineTest, TooBigForOnePauseIsNotAttempted) {
  TieringOptions o = Defaults();
  o.max_pause_ns = 10'000'000;  // 10 ms at the assumed 2 GB/s: 20 MB
  Make(o);
  table.AddLease(1, "node2", 64 * kMiB, {7});
  ASSERT_TRUE(engine->SetLeaseOptions(From(7), 1, std::nullopt, true).ok());
  Copy(7, 1, 3);
  engine->Tick();
  Drain();
  EXPECT_TRUE(channel.asks.empty());
  EXPECT_NE(Verdict(1).find("would pause its holders about"), std::string::npos) << Verdict(1);
}

TEST_F(EngineTest, ReportsOnlyTheOwnersLeasesWhenAsked) {
  Make();
  table.AddLease(1, "node2", 64 * kMiB, {7});
  table.AddLease(2, "node2", 64 * kMiB, {8}).owner_uid = 2000;
  engine->Tick();
  EXPECT_EQ(engine->Report(std::nullopt).leases.size(), 2u);
  auto mine = engine->Report(2000u);
  ASSERT_EQ(mine.leases.size(), 1u);
  EXPECT_EQ(mine.leases[0].id, 2u);
}

// ---- leases of several extents: each extent is a unit, moved alone ----

TEST_F(EngineTest, AMultiExtentLeaseIsPromotedExtentByExtentEachAccountedOnItsOwn) {
  Make();
  table.AddExtentLease(1, "node2", 4, 16 * kMiB, {7});
  Copy(7, 1, 3.0);
  auto rep = engine->Report(std::nullopt);
  ASSERT_EQ(rep.leases.at(0).units.size(), 4u);
  for (const auto& u : rep.leases[0].units) EXPECT_NEAR(u.temperature, 3.0, 1e-6);
  // What the accounting says while each extent moves.
  std::vector<std::pair<uint32_t, uint64_t>> seen;  // units on node0, node0 free
  migrator.behave = [&](const MoveRequest& req) -> Result<MoveReport> {
    seen.emplace_back(table.UnitsOn(1, "node0"), table.pools.at("node0").free_bytes);
    EXPECT_EQ(table.leases.at(1).moving_to, "node0");
    return FakeMigrator::Complete(req);
  };
  engine->Tick();
  Drain();
  ASSERT_EQ(migrator.requests.size(), 4u);
  for (const MoveRequest& r : migrator.requests) {
    EXPECT_EQ(r.length, 16 * kMiB);  // one extent each, its own fd
    EXPECT_EQ(r.target_node, 0);
  }
  EXPECT_EQ(table.opened, (std::vector<uint32_t>{0, 1, 2, 3}));
  ASSERT_EQ(seen.size(), 4u);
  for (uint32_t i = 0; i < 4; ++i) {
    EXPECT_EQ(seen[i].first, i);                            // i extents there before the (i+1)th
    EXPECT_EQ(seen[i].second, kGiB - (i + 1) * 16 * kMiB);  // room for each one as it goes
  }
  EXPECT_EQ(table.UnitsOn(1, "node0"), 4u);
  EXPECT_TRUE(table.leases.at(1).moving_to.empty());
  EXPECT_EQ(table.pools.at("node2").free_bytes, kGiB);
  EXPECT_EQ(table.pools.at("node0").free_bytes, kGiB - 64 * kMiB);
  auto h = history();
  ASSERT_EQ(h.size(), 4u);
  for (uint32_t i = 0; i < 4; ++i) {
    EXPECT_EQ(h[i].unit, i);
    EXPECT_EQ(h[i].outcome, "moved");
    EXPECT_EQ(h[i].direction, "promote");
    EXPECT_EQ(h[i].bytes, 16 * kMiB);
  }
  // The holder is told once, when most of the lease is there.
  ASSERT_EQ(channel.moved.size(), 1u);
  EXPECT_EQ(channel.moved[0].node, 0);
  EXPECT_EQ(engine->counters().at("bytes_promoted"), 64 * kMiB);
}

// The VM tier's case: DRAM capped at 8 MiB, a will_need lease of 8 x 2 MiB
// on CXL. Each extent is accounted on its own: the extents that fit move,
// no move is refused, and the lease stays split, saying why the rest stays.
TEST_F(EngineTest, AMultiExtentLeaseTooBigForTheFreeRoomMovesWhatFitsAndStaysSplit) {
  table.pools.at("node0").capacity_bytes = 8 * kMiB;
  table.pools.at("node0").free_bytes = 8 * kMiB;
  Make();
  table.AddExtentLease(1, "node2", 8, 2 * kMiB, {7});
  ASSERT_TRUE(Hint(7, 1, 0, 16 * kMiB, tiering::Hint::kWillNeed).ok());
  for (int i = 0; i < 5; ++i) {
    engine->Tick();
    Drain();
    clock.AdvanceNs(kSec);
  }
  const uint32_t fast = table.UnitsOn(1, "node0");
  EXPECT_GE(fast, 1u);
  EXPECT_LE(fast, 4u);
  EXPECT_EQ(fast + table.UnitsOn(1, "node2"), 8u);
  EXPECT_EQ(table.begins, table.commits);  // none refused
  EXPECT_TRUE(table.leases.at(1).moving_to.empty());
  EXPECT_EQ(table.pools.at("node0").free_bytes, 8 * kMiB - fast * 2 * kMiB);
  EXPECT_EQ(table.pools.at("node2").free_bytes, kGiB - (8 - fast) * 2 * kMiB);
  EXPECT_NE(Verdict(1, 7).find("node0"), std::string::npos) << Verdict(1, 7);
}

TEST_F(EngineTest, AColdMultiExtentLeaseIsDemotedExtentByExtent) {
  Make();
  table.AddExtentLease(1, "node0", 3, 32 * kMiB, {7});
  ASSERT_TRUE(Hint(7, 1, 0, 96 * kMiB, tiering::Hint::kDontNeed).ok());
  engine->Tick();
  Drain();
  ASSERT_EQ(migrator.requests.size(), 3u);
  for (const MoveRequest& r : migrator.requests) EXPECT_EQ(r.target_node, 2);
  EXPECT_EQ(table.UnitsOn(1, "node2"), 3u);
  EXPECT_EQ(table.pools.at("node0").free_bytes, kGiB);
  for (const auto& r : history()) EXPECT_EQ(r.direction, "demote") << r.why;
}

// Each extent is accounted on its own: a dont_need for one extent while
// another is still in use demotes that one only, and the lease stays split.
TEST_F(EngineTest, AColdExtentOfALeaseWithAWarmOneIsDemotedAlone) {
  Make();
  table.AddExtentLease(1, "node0", 2, 32 * kMiB, {7});
  TieringEngine::Signal s;
  s.lease_id = 1;
  s.offset = 32 * kMiB;
  s.length = 32 * kMiB;
  s.bytes_written = 16 * kMiB;  // unit 1: temperature 0.5, between cold and hot
  ASSERT_TRUE(engine->OnSignals(From(7), {s}).empty());
  ASSERT_TRUE(Hint(7, 1, 0, 32 * kMiB, tiering::Hint::kDontNeed).ok());
  engine->Tick();
  Drain();
  ASSERT_EQ(migrator.requests.size(), 1u);
  EXPECT_EQ(migrator.requests[0].target_node, 2);
  EXPECT_EQ(table.leases.at(1).units[0].pool, "node2");
  EXPECT_EQ(table.leases.at(1).units[1].pool, "node0");
  EXPECT_EQ(table.pools.at("node0").free_bytes, kGiB - 32 * kMiB);
  auto rep = engine->Report(std::nullopt);
  EXPECT_EQ(rep.leases[0].units[0].pool, "node2");
  EXPECT_EQ(rep.leases[0].units[1].pool, "node0");
  // Once the other extent is done with too, it follows.
  ASSERT_TRUE(Hint(7, 1, 32 * kMiB, 32 * kMiB, tiering::Hint::kDontNeed).ok());
  engine->Tick();
  Drain();
  EXPECT_EQ(migrator.requests.size(), 2u);
  EXPECT_EQ(table.UnitsOn(1, "node2"), 2u);
}

TEST_F(EngineTest, OneExtentFailingLeavesTheLeaseSplitAndSaysSoThenFinishesLater) {
  Make();
  table.AddExtentLease(1, "node2", 4, 16 * kMiB, {7});
  int calls = 0;
  bool busy = true;
  migrator.behave = [&](const MoveRequest& req) -> Result<MoveReport> {
    ++calls;
    if (calls == 3 && busy) return FakeMigrator::Partial(req, 2, 7);  // extent 2: 7 pages busy
    return FakeMigrator::Complete(req);  // the others, and extent 2's way back
  };
  Copy(7, 1, 3);
  engine->Tick();
  Drain();
  ASSERT_EQ(migrator.requests.size(), 5u);
  EXPECT_EQ(migrator.requests[3].target_node, 2);  // extent 2 moved back whole
  bool rolled_back = false;
  for (const auto& r : history()) {
    if (r.unit == 2) rolled_back = rolled_back || r.outcome == "rolled back";
  }
  EXPECT_TRUE(rolled_back);
  // Three of four on node0, each accounted there; extent 2 on node2.
  EXPECT_EQ(table.UnitsOn(1, "node0"), 3u);
  EXPECT_TRUE(table.leases.at(1).moving_to.empty());
  EXPECT_EQ(table.pools.at("node0").free_bytes, kGiB - 48 * kMiB);
  EXPECT_EQ(table.pools.at("node2").free_bytes, kGiB - 16 * kMiB);
  auto rep = engine->Report(std::nullopt);
  EXPECT_EQ(rep.leases[0].units[1].pool, "node0");
  EXPECT_EQ(rep.leases[0].units[2].pool, "node2");
  EXPECT_EQ(rep.leases[0].units[2].numa_node, 2);
  EXPECT_NE(Verdict(1, 2).find("did not finish and was undone"), std::string::npos)
      << Verdict(1, 2);
  // Not retried at once; after min_residency it goes.
  engine->Tick();
  Drain();
  EXPECT_EQ(migrator.requests.size(), 5u);
  busy = false;
  clock.AdvanceNs(31 * kSec);
  engine->Tick();
  Drain();
  ASSERT_EQ(migrator.requests.size(), 6u);
  EXPECT_EQ(table.UnitsOn(1, "node0"), 4u);
  EXPECT_TRUE(table.leases.at(1).moving_to.empty());
  EXPECT_EQ(table.pools.at("node2").free_bytes, kGiB);
  EXPECT_EQ(Last().outcome, "moved");
  EXPECT_EQ(Last().direction, "promote");
}

TEST_F(EngineTest, StoppingMidLeaseLeavesItSplitAndAccountedAsItIs) {
  Make();
  table.AddExtentLease(1, "node2", 4, 16 * kMiB, {7});
  int calls = 0;
  migrator.behave = [&](const MoveRequest& req) -> Result<MoveReport> {
    if (++calls == 2) engine->Stop();  // the daemon stops during extent 1
    return FakeMigrator::Complete(req);
  };
  Copy(7, 1, 3);
  engine->Tick();
  Drain();
  EXPECT_EQ(migrator.requests.size(), 2u);  // no new extent after Stop
  EXPECT_EQ(table.UnitsOn(1, "node0"), 2u);
  EXPECT_TRUE(table.leases.at(1).moving_to.empty());
  EXPECT_EQ(table.pools.at("node0").free_bytes, kGiB - 32 * kMiB);
  EXPECT_EQ(table.pools.at("node2").free_bytes, kGiB - 32 * kMiB);
  // A new engine (a restart) moves the rest once they are hot again.
  migrator.behave = nullptr;
  Make();
  Copy(7, 1, 3);
  engine->Tick();
  Drain();
  ASSERT_EQ(migrator.requests.size(), 4u);
  EXPECT_EQ(table.UnitsOn(1, "node0"), 4u);
  EXPECT_TRUE(table.leases.at(1).moving_to.empty());
  EXPECT_EQ(table.pools.at("node2").free_bytes, kGiB);
}

TEST_F(EngineTest, ACooperativeMultiExtentLeaseMovesEveryExtentInOnePause) {
  Make();
  table.AddExtentLease(1, "node2", 4, 16 * kMiB, {7});
  ASSERT_TRUE(engine->SetLeaseOptions(From(7), 1, std::nullopt, true).ok());
  Copy(7, 1, 3);
  engine->Tick();
  Drain();
  ASSERT_EQ(channel.asks.size(), 1u);
  const MigrationAsk ask = channel.asks[0].second;
  EXPECT_EQ(ask.offset, 0u);  // the holder pins the lease as one range
  EXPECT_EQ(ask.length, 64 * kMiB);
  EXPECT_TRUE(migrator.requests.empty());
  std::optional<Result<MigrationOutcome>> answer;
  engine->OnMigrationReady(7, ask.migration_id, true, "",
                           [&](Result<MigrationOutcome> o) { answer.emplace(std::move(o)); });
  Drain();
  ASSERT_NO_FATAL_FAILURE(ExpectMovedToNode0(answer, 64 * kMiB));
  ASSERT_EQ(migrator.requests.size(), 4u);
  EXPECT_EQ(channel.asks.size(), 1u);  // one ask, one pause
  EXPECT_EQ(table.UnitsOn(1, "node0"), 4u);
  EXPECT_TRUE(table.leases.at(1).moving_to.empty());
  auto h = history();
  ASSERT_EQ(h.size(), 4u);
  for (const auto& r : h) {
    EXPECT_EQ(r.mode, "cooperative");
    EXPECT_EQ(r.outcome, "moved");
  }
}

TEST_F(EngineTest, ACooperativeMultiExtentMoveFailingMidwayAnswersHalfMoved) {
  Make();
  table.AddExtentLease(1, "node2", 3, 16 * kMiB, {7});
  ASSERT_TRUE(engine->SetLeaseOptions(From(7), 1, std::nullopt, true).ok());
  int calls = 0;
  migrator.behave = [&](const MoveRequest& req) -> Result<MoveReport> {
    if (++calls == 2) return FakeMigrator::Partial(req, 2, 3);
    return FakeMigrator::Complete(req);
  };
  Copy(7, 1, 3);
  engine->Tick();
  Drain();
  ASSERT_EQ(channel.asks.size(), 1u);
  std::optional<Result<MigrationOutcome>> answer;
  engine->OnMigrationReady(7, channel.asks[0].second.migration_id, true, "",
                           [&](Result<MigrationOutcome> o) { answer.emplace(std::move(o)); });
  Drain();
  ASSERT_TRUE(answer.has_value() && answer->ok());
  EXPECT_FALSE((*answer)->moved);
  EXPECT_EQ((*answer)->numa_node, -1);  // half moved: no one node
  EXPECT_EQ((*answer)->bytes, 16 * kMiB);
  // The one that moved is accounted there; the failed one went back and is
  // not tried again before min_residency; the next round asks for the one
  // not tried yet (room reserved for it alone).
  EXPECT_EQ(table.leases.at(1).units[0].pool, "node0");
  EXPECT_EQ(table.leases.at(1).units[1].pool, "node2");
  EXPECT_EQ(table.leases.at(1).moving_to, "node0");
  EXPECT_EQ(table.leases.at(1).moving_unit, 2u);
  EXPECT_EQ(channel.asks.size(), 2u);
  EXPECT_EQ(table.pools.at("node0").free_bytes, kGiB - 32 * kMiB);
}

// Issue 37, item 4: a holder that attached to another tenant's lease (not
// its owner, not an admin) cannot change its tiering options, and its hints
// are signals of its own use, never steering the owner's lease; the owner
// and an admin still can.
TEST_F(EngineTest, OnlyTheOwnerOrAnAdminChangesTieringOptionsAndSteersWithHints) {
  Make();
  table.AddLease(1, "node0", 64 * kMiB, {7, 8});  // owner uid 1000 on 7; uid 2000 attached on 8
  table.AddLease(2, "node2", 64 * kMiB, {7, 8});
  ASSERT_TRUE(engine->SetLeaseOptions(From(7), 1, true, std::nullopt).ok());
  Status st = engine->SetLeaseOptions(From(8), 1, false, std::nullopt);
  EXPECT_EQ(st.code(), Code::kPermissionDenied);
  EXPECT_NE(st.message().find("only the owner of lease 1 (uid 1000) or an admin"),
            std::string::npos)
      << st.message();
  EXPECT_TRUE(engine->Report(std::nullopt).leases[0].opted_out);
  // Its own pin it may still declare (and take back).
  EXPECT_TRUE(engine->SetLeaseOptions(From(8), 1, std::nullopt, true).ok());
  EXPECT_TRUE(engine->SetLeaseOptions(From(8), 1, std::nullopt, false).ok());
  // A stranger and an unknown id: one answer.
  Status stranger = engine->SetLeaseOptions(From(10, 3000), 1, false, std::nullopt);
  Status unknown = engine->SetLeaseOptions(From(10, 3000), 99, false, std::nullopt);
  EXPECT_EQ(stranger.code(), Code::kNotFound);
  EXPECT_EQ(unknown.code(), Code::kNotFound);
  EXPECT_EQ(stranger.message(), "lease 1 is not one this caller may change");
  EXPECT_EQ(unknown.message(), "lease 99 is not one this caller may change");
  // An admin that does not hold it, and the owner on another connection, may.
  EXPECT_TRUE(engine->SetLeaseOptions(From(9, 0, true), 1, false, std::nullopt).ok());
  EXPECT_FALSE(engine->Report(std::nullopt).leases[0].opted_out);
  EXPECT_TRUE(engine->SetLeaseOptions(From(11, 1000), 1, true, std::nullopt).ok());
  EXPECT_TRUE(engine->SetLeaseOptions(From(11, 1000), 1, false, std::nullopt).ok());

  // The attached holder's dont_need on lease 1 and will_need on lease 2 are
  // taken, counted, and move nothing.
  ASSERT_TRUE(Hint(8, 1, 0, 64 * kMiB, tiering::Hint::kDontNeed).ok());
  ASSERT_TRUE(Hint(8, 2, 0, 64 * kMiB, tiering::Hint::kWillNeed).ok());
  engine->Tick();
  Drain();
  EXPECT_TRUE(migrator.requests.empty());
  EXPECT_EQ(table.PoolOf(1), "node0");
  EXPECT_EQ(table.PoolOf(2), "node2");
  EXPECT_EQ(engine->counters().at("hints_as_signals"), 2u);
  const auto leases = engine->Report(std::nullopt).leases;
  EXPECT_EQ(leases[0].units[0].hints, 1u);
  // will_need from another holder: warm, between the thresholds.
  EXPECT_GT(leases[1].units[0].temperature, Defaults().policy.cold_threshold);
  EXPECT_LT(leases[1].units[0].temperature, Defaults().policy.hot_threshold);
  EXPECT_NE(Verdict(2).find("hysteresis"), std::string::npos) << Verdict(2);

  // The same hints from the owner move both leases.
  ASSERT_TRUE(Hint(7, 1, 0, 64 * kMiB, tiering::Hint::kDontNeed).ok());
  ASSERT_TRUE(Hint(7, 2, 0, 64 * kMiB, tiering::Hint::kWillNeed).ok());
  engine->Tick();
  Drain();
  engine->Tick();
  Drain();
  EXPECT_EQ(table.PoolOf(1), "node2");
  EXPECT_EQ(table.PoolOf(2), "node0");
}

// Issue 37, item 2: an urgent hint queues its lease and asks for an
// on-demand round; the requests coalesce into one round at a time, at
// least urgent_interval apart, that looks only at the queued leases (never
// a full scan of every tenant's), charges its time to the sender's uid,
// and acts on the hint without waiting for the periodic round.
TEST_F(EngineTest, UrgentHintsCoalesceIntoBoundedRoundsOverTheHintedLeasesOnly) {
  TieringOptions o = Defaults();
  o.interval_ns = 3600 * kSec;      // no periodic round during the test
  o.urgent_interval_ns = kSec / 5;  // real time: the timer waits it out
  Make(o);
  for (uint64_t id = 100; id < 400; ++id) table.AddLease(id, "node2", 1 * kMiB, {9});
  table.AddLease(1, "node0", 64 * kMiB, {7});
  table.AddLease(2, "node2", 64 * kMiB, {7});
  std::map<uid_t, int64_t> charged;
  engine->SetBusyCharge([&](uid_t uid, std::chrono::nanoseconds d) { charged[uid] += d.count(); });
  engine->Start();
  // A burst of will_need on a lease already on DRAM: one round, one lease.
  for (int i = 0; i < 50; ++i) ASSERT_TRUE(Hint(7, 1, 0, 4096, tiering::Hint::kWillNeed).ok());
  EXPECT_EQ(engine->urgent_queued(), 1u);
  Drain();
  EXPECT_EQ(engine->counters().at("urgent_rounds"), 1u);
  EXPECT_EQ(table.scans, 0) << "an urgent hint started a round over every lease";
  EXPECT_NE(Verdict(1).find("will_need: already on the fast pool"), std::string::npos)
      << Verdict(1);
  ASSERT_EQ(charged.count(1000), 1u);
  EXPECT_GT(charged[1000], 0);
  // The next one waits for urgent_interval after that round: queued, not run yet.
  ASSERT_TRUE(Hint(7, 2, 0, 4096, tiering::Hint::kWillNeed).ok());
  Drain();
  EXPECT_EQ(engine->counters().at("urgent_rounds"), 1u);
  EXPECT_EQ(engine->urgent_queued(), 1u);
  EXPECT_EQ(table.PoolOf(2), "node2");
  // ... and runs once it passed, and moves the lease without a periodic round.
  const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (table.PoolOf(2) != "node0" && std::chrono::steady_clock::now() < limit) {
    io.restart();
    io.run_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(table.PoolOf(2), "node0");
  EXPECT_EQ(engine->counters().at("urgent_rounds"), 2u);
  EXPECT_NE(history().back().why.find("will_need hint"), std::string::npos) << history().back().why;
  engine->Stop();
}

TEST_F(EngineTest, AFloodOfUrgentHintsFromOneUidIsRefusedNamingTheLimit) {
  TieringOptions o = Defaults();
  o.max_urgent_hints_per_uid = 10;
  Make(o);
  table.AddLease(1, "node0", 64 * kMiB, {7, 8});
  table.AddLease(3, "node0", 64 * kMiB, {8});
  table.leases.at(3).owner_uid = 2000;
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(Hint(7, 1, 0, 4096, tiering::Hint::kWillNeed).ok());
  Status st = Hint(7, 1, 0, 4096, tiering::Hint::kDontNeed);
  EXPECT_EQ(st.code(), Code::kResourceExhausted);
  EXPECT_NE(st.message().find("uid 1000 sent more than 10 will_need/dont_need hints in a second "
                              "(tiering.max_urgent_hints_per_uid)"),
            std::string::npos)
      << st.message();
  EXPECT_EQ(engine->counters().at("urgent_hints_refused"), 1u);
  // Hints that start no round are not counted; nor are another holder's
  // (signals); another uid has its own bucket.
  EXPECT_TRUE(Hint(7, 1, 0, 4096, tiering::Hint::kHot).ok());
  EXPECT_TRUE(Hint(8, 1, 0, 4096, tiering::Hint::kWillNeed).ok());
  EXPECT_TRUE(Hint(8, 3, 0, 4096, tiering::Hint::kWillNeed).ok());
  // The bucket refills with time.
  clock.AdvanceNs(kSec);
  EXPECT_TRUE(Hint(7, 1, 0, 4096, tiering::Hint::kWillNeed).ok());
}

}  // namespace
}  // namespace cxlpool::tiering
