// The tiering path end to end in one process: the daemon's pieces (server,
// handler, LeaseManager, the tiering engine with the real KernelMigrator) on
// a loop thread, and libcxlpool talking to it over a real Unix socket.
//
// The topology is a made-up DRAM node 0 and CXL node 1, with pools that do
// not bind (this machine may have one node): a lease granted "on node 1"
// really sits on node 0, so promoting it to node 0 is a real mbind(MOVE_ALL)
// whose result the kernel verifies page by page (move_pages), while the
// accounting, the wire messages, the pushes and the client's safe point are
// all the real ones. Long-term pins are io_uring fixed buffers
// (IORING_REGISTER_BUFFERS pins like cuMemHostRegister). Moves between real
// nodes run in the VM tier (tests/vm, guest/tiering-checks.sh).
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <future>
#include <set>
#include <thread>

#include "cxlpool/client.hpp"
#include "handler/daemon_handler.h"
#include "server/server.h"
#include "test_support.h"
#include "tiering/lease_adapter.h"
#include "tiering/migrator.h"
#include "uring_pin.h"  // tests/support

namespace cxlpool {
namespace {

using testsupport::PollUntil;
using testsupport::RawClient;
using testsupport::TempDir;

constexpr uint64_t kMiB = 1ull << 20;

NumaNode Node(int id, NodeKind kind, std::vector<int> cpus) {
  NumaNode n;
  n.id = id;
  n.kind = kind;
  n.memory_bytes = 256 * kMiB;
  n.cpus = std::move(cpus);
  n.distances = {{0, id == 0 ? 10 : 20}, {1, id == 1 ? 10 : 20}};
  return n;
}

class LiveDaemon {
 public:
  // `max_extent` set: leases are cut into extents of that size (daemon.max_extent).
  explicit LiveDaemon(tiering::TieringOptions opts, uint64_t max_extent = 0)
      : dir_("tiering-live") {
    topo_.numa_nodes.push_back(Node(0, NodeKind::kDram, {0, 1}));
    topo_.numa_nodes.push_back(Node(1, NodeKind::kCxl, {}));
    DaemonConfig cfg;
    cfg.pool_defaults.capacity.is_percent = true;
    cfg.pool_defaults.capacity.percent = 100;
    cfg.pool_defaults.pin = false;
    cfg.pool_defaults.thp = false;
    PoolBuildOptions po;
    po.bind = false;  // see the file comment
    auto pools = BuildPools(topo_, cfg, po, nullptr);
    CXLPOOL_CHECK(pools.ok());
    proc_ = MakeRootedFileSystem("/");
    mgr_ =
        std::make_unique<LeaseManager>(&topo_, std::move(*pools), QuotaTable(), io_.get_executor(),
                                       workers_.get_executor(), &SystemClock::Get());
    mgr_->SetMaxExtentBytes(max_extent);
    HandlerOptions ho;
    ho.instance_id = "live";
    ho.topology_is_local = false;
    handler_ = std::make_unique<DaemonHandler>(mgr_.get(), proc_.get(), ho);
    requests_ = std::make_unique<TieringRequests>(mgr_.get());
    table_ = std::make_unique<tiering::LeaseManagerTable>(mgr_.get(), /*local=*/true);
    migrator_ = tiering::MakeKernelMigrator();
    engine_ = std::make_unique<tiering::TieringEngine>(
        table_.get(), migrator_.get(), requests_.get(), &SystemClock::Get(), io_.get_executor(),
        mover_.get_executor(), opts);
    requests_->SetEngine(engine_.get());
    handler_->SetTiering(requests_.get());
    ServerOptions so;
    so.socket_path = dir_.path + "/cxlpool.sock";
    so.fs = proc_.get();
    auto srv = Server::Create(io_, so, handler_.get());
    CXLPOOL_CHECK(srv.ok());
    server_ = std::move(*srv);
    Server* s = server_.get();
    auto push = [s](ConnectionId c, Reply r) { return s->Push(c, std::move(r)); };
    handler_->SetPush(push);
    requests_->SetPush(push);
    engine_->Start();
    loop_ = std::thread([this] { io_.run(); });
  }
  ~LiveDaemon() {
    Run([this] {
      engine_->Stop();
      server_->Stop();
      mgr_->Shutdown();
      io_.stop();
      return 0;
    });
    loop_.join();
    mover_.join();
    workers_.join();
    requests_->SetEngine(nullptr);
    engine_.reset();
    server_.reset();
  }
  // Runs `fn` on the loop thread and waits for its result.
  template <typename F>
  auto Run(F fn) -> decltype(fn()) {
    std::promise<decltype(fn())> p;
    auto f = p.get_future();
    boost::asio::post(io_, [&] { p.set_value(fn()); });
    return f.get();
  }
  tiering::TieringReport Report() {
    return Run([this] { return engine_->Report(std::nullopt); });
  }
  std::string PoolOf(uint64_t id) {
    return Run([this, id] {
      auto f = table_->Find(id);
      return f ? f->units[0].pool : std::string("<gone>");
    });
  }
  // Every unit of the lease on `pool` and no move under way; with the units' pools.
  bool WholeOn(uint64_t id, const std::string& pool, size_t* units = nullptr) {
    return Run([this, id, pool, units] {
      auto f = table_->Find(id);
      if (!f) return false;
      if (units != nullptr) *units = f->units.size();
      for (const auto& u : f->units) {
        if (u.pool != pool) return false;
      }
      return f->moving_to.empty();
    });
  }
  std::string socket() const { return dir_.path + "/cxlpool.sock"; }

 private:
  TempDir dir_;
  Topology topo_;
  boost::asio::io_context io_;
  boost::asio::thread_pool workers_{1};
  boost::asio::thread_pool mover_{1};
  std::unique_ptr<FileSystem> proc_;
  std::unique_ptr<LeaseManager> mgr_;
  std::unique_ptr<DaemonHandler> handler_;
  std::unique_ptr<TieringRequests> requests_;
  std::unique_ptr<tiering::LeaseManagerTable> table_;
  std::unique_ptr<tiering::Migrator> migrator_;
  std::unique_ptr<tiering::TieringEngine> engine_;
  std::unique_ptr<Server> server_;
  std::thread loop_;
};

tiering::TieringOptions TestOptions() {
  tiering::TieringOptions o;
  o.interval_ns = 20'000'000;
  o.rate_limit_bytes_per_s = 0;
  o.cooperative_deadline_ms = 1500;
  o.policy.slow_reserve = 0;
  return o;
}

void Fill(Lease& l, uint8_t seed) {
  std::vector<uint8_t> buf(l.size());
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<uint8_t>(i * 131 + seed);
  ASSERT_TRUE(l.CopyIn(0, buf.data(), buf.size()).ok());
}

bool Intact(Lease& l, uint8_t seed) {
  std::vector<uint8_t> buf(l.size());
  if (!l.CopyOut(0, buf.data(), buf.size()).ok()) return false;
  for (size_t i = 0; i < buf.size(); ++i) {
    if (buf[i] != static_cast<uint8_t>(i * 131 + seed)) return false;
  }
  return true;
}

const tiering::MigrationRecord* LastRecord(const tiering::TieringReport& r) {
  return r.history.empty() ? nullptr : &r.history.back();
}

void SkipWithoutPins() {
  if (!tiering::HaveCapSysNice()) GTEST_SKIP() << "moving shared pages needs CAP_SYS_NICE";
}

TEST(TieringLiveTest, CopiedBytesPromoteALeaseInPlaceAndTheHolderIsTold) {
  SkipWithoutPins();
  LiveDaemon d(TestOptions());
  auto client = Client::Connect(d.socket());
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  AllocOptions ao;
  ao.size_bytes = 8 * kMiB;
  ao.numa_node = 1;
  auto lease = client->Allocate(ao);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_EQ(lease->numa_node(), 1);
  Fill(*lease, 3);
  Fill(*lease, 4);  // two passes: temperature 2 (hot at 1)
  ASSERT_TRUE(client->FlushSignals().ok());
  ASSERT_TRUE(PollUntil([&] { return d.PoolOf(lease->id()) == "node0"; }, 10000));
  auto rep = d.Report();
  const auto* last = LastRecord(rep);
  ASSERT_NE(last, nullptr);
  EXPECT_EQ(last->outcome, "moved");
  EXPECT_EQ(last->mode, "in-place");
  EXPECT_NE(last->detail.find("verified by move_pages: 2048 pages: node 0: 2048"),
            std::string::npos)
      << last->detail;
  EXPECT_NE(last->why.find("holders copied 16.0 MiB in"), std::string::npos) << last->why;
  // The holder learns it from a push (LeaseEvent "moved") with its next request.
  ASSERT_TRUE(PollUntil([&] {
    (void)client->ProcessEvents();
    return lease->numa_node() == 0;
  }));
  EXPECT_TRUE(Intact(*lease, 4));
  EXPECT_EQ(lease->tiering_stats().bytes_copied_in, 16 * kMiB);
}

TEST(TieringLiveTest, APinnedLeaseMovesAtTheHoldersSafePointAndIsPinnedAgain) {
  SkipWithoutPins();
  testing::UringPin pin;
  if (int e = pin.Open(); e != 0) GTEST_SKIP() << "no io_uring here: " << std::strerror(-e);
  LiveDaemon d(TestOptions());
  auto client = Client::Connect(d.socket());
  ASSERT_TRUE(client.ok());
  AllocOptions ao;
  ao.size_bytes = 8 * kMiB;
  ao.numa_node = 1;
  auto lease = client->Allocate(ao);
  ASSERT_TRUE(lease.ok());
  Fill(*lease, 9);
  ASSERT_EQ(pin.Register(lease->data(), lease->size()), 0);
  std::vector<MigrationPhase> phases;
  bool pinned_during_move = true;
  ASSERT_TRUE(lease
                  ->SetMigrationCallback([&](MigrationPhase p) {
                    phases.push_back(p);
                    if (p == MigrationPhase::kPrepare) {
                      pinned_during_move = false;
                      return pin.Unregister();
                    }
                    return pin.Register(lease->data(), lease->size());
                  })
                  .ok());
  Fill(*lease, 10);
  ASSERT_TRUE(client->FlushSignals().ok());
  // The daemon asks; nothing moves until the holder says so.
  ASSERT_TRUE(PollUntil([&] { return client->MigrationsPending().value() > 0; }, 10000));
  EXPECT_EQ(d.PoolOf(lease->id()), "node1");
  EXPECT_TRUE(pin.registered());
  auto n = client->SafePoint();
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, 1);
  EXPECT_EQ(phases,
            (std::vector<MigrationPhase>{MigrationPhase::kPrepare, MigrationPhase::kResume}));
  EXPECT_FALSE(pinned_during_move);
  EXPECT_TRUE(pin.registered());
  EXPECT_EQ(pin.registrations, 2);
  EXPECT_EQ(d.PoolOf(lease->id()), "node0");
  TieringStats st = lease->tiering_stats();
  EXPECT_EQ(st.migrations, 1u);
  EXPECT_EQ(st.numa_node, 0);
  EXPECT_GT(st.last_pause_ns, 0);
  EXPECT_NE(st.last_detail.find("moved"), std::string::npos) << st.last_detail;
  std::printf("cooperative pause (io_uring unregister -> move of 8 MiB -> register): %.3f ms\n",
              static_cast<double>(st.last_pause_ns) / 1e6);
  EXPECT_TRUE(Intact(*lease, 10));
  // The buffer registered again works: write it to a file with WRITE_FIXED.
  int f = ::memfd_create("out", MFD_CLOEXEC);
  ASSERT_GE(f, 0);
  ASSERT_EQ(pin.WriteFixed(f, lease->data(), 1 << 20), 1 << 20);
  std::vector<uint8_t> back(1 << 20);
  ASSERT_EQ(::pread(f, back.data(), back.size(), 0), static_cast<ssize_t>(back.size()));
  EXPECT_EQ(std::memcmp(back.data(), lease->data(), back.size()), 0);
  ::close(f);
  auto rep = d.Report();
  const auto* last = LastRecord(rep);
  ASSERT_NE(last, nullptr);
  EXPECT_EQ(last->mode, "cooperative");
  EXPECT_EQ(last->outcome, "moved");
  EXPECT_GT(last->pause_ns, 0);
  pin.Unregister();
}

TEST(TieringLiveTest, AHolderThatNeverReachesASafePointIsSkippedAndKeepsItsPin) {
  SkipWithoutPins();
  testing::UringPin pin;
  if (int e = pin.Open(); e != 0) GTEST_SKIP() << "no io_uring here: " << std::strerror(-e);
  tiering::TieringOptions o = TestOptions();
  o.cooperative_deadline_ms = 200;
  LiveDaemon d(o);
  auto client = Client::Connect(d.socket());
  AllocOptions ao;
  ao.size_bytes = 4 * kMiB;
  ao.numa_node = 1;
  auto lease = client->Allocate(ao);
  ASSERT_TRUE(lease.ok());
  ASSERT_EQ(pin.Register(lease->data(), lease->size()), 0);
  int calls = 0;
  ASSERT_TRUE(lease->SetMigrationCallback([&](MigrationPhase) { return ++calls, 0; }).ok());
  Fill(*lease, 1);
  Fill(*lease, 2);
  ASSERT_TRUE(client->FlushSignals().ok());
  ASSERT_TRUE(PollUntil(
      [&] {
        auto r = d.Report();
        return !r.history.empty() && r.history.back().outcome == "skipped";
      },
      10000));
  auto rep = d.Report();
  EXPECT_NE(rep.history.back().detail.find("did not reach a safe point within 200 ms"),
            std::string::npos)
      << rep.history.back().detail;
  EXPECT_EQ(d.PoolOf(lease->id()), "node1");
  // The cancellation reached the holder: nothing is pending any more, and a
  // late safe point does nothing (never unpins for a migration that is over).
  ASSERT_TRUE(PollUntil([&] { return client->MigrationsPending().value() == 0; }));
  EXPECT_EQ(client->SafePoint().value(), 0);
  EXPECT_EQ(calls, 0);
  EXPECT_TRUE(pin.registered());
  EXPECT_NE(rep.leases.at(0).cooperative_state.find("skipped"), std::string::npos);
  pin.Unregister();
}

TEST(TieringLiveTest, HintsOutsideTheLeaseAreRefusedByTheLibraryAndTheDaemon) {
  LiveDaemon d(TestOptions());
  auto client = Client::Connect(d.socket());
  AllocOptions ao;
  ao.size_bytes = 4 * kMiB;
  auto lease = client->Allocate(ao);
  ASSERT_TRUE(lease.ok());
  ClientStatus s = lease->Hint(4 * kMiB - 4096, 8192, TierHint::kHot);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(s.message().find("is outside lease"), std::string::npos) << s.message();
  EXPECT_EQ(lease->Hint(0, 0, TierHint::kCold).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(lease->Hint(0, 4096, static_cast<TierHint>(9)).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(lease->CopyIn(4 * kMiB, "x", 1).code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(lease->Hint(0, 4096, TierHint::kHot).ok());
  // The daemon judges for itself: a raw client holding its own lease.
  auto raw = RawClient::Connect(d.socket());
  ASSERT_TRUE(raw.ok());
  UniqueFd fd;
  auto info = raw->Alloc(4 * kMiB, &fd);
  ASSERT_TRUE(info.ok());
  proto::TieringSignalsRequest req;
  proto::RangeSignal* sig = req.add_signals();
  sig->set_lease_id(info->id());
  sig->set_offset(4 * kMiB);
  sig->set_length(1);
  sig->set_hint(proto::HINT_COLD);
  proto::TieringSignalsReply rep;
  Status st = raw->Call(req, &rep);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("is outside lease " + std::to_string(info->id())), std::string::npos)
      << st.message();
  // Someone else's lease: not held by this connection, the answer an id
  // that does not exist gets too.
  sig->set_lease_id(lease->id());
  sig->set_offset(0);
  st = raw->Call(req, &rep);
  EXPECT_EQ(st.code(), Code::kNotFound);
  EXPECT_EQ(st.message(),
            "lease " + std::to_string(lease->id()) + " is not held by this connection");
  // Two entries: judged one by one.
  sig->set_lease_id(info->id());
  proto::RangeSignal* ok = req.add_signals();
  ok->set_lease_id(info->id());
  ok->set_length(4096);
  ok->set_bytes_read(4096);
  ASSERT_TRUE(raw->Call(req, &rep).ok());
  EXPECT_EQ(rep.accepted(), 2u);
}

TEST(TieringLiveTest, AHolderDyingMidMigrationLeavesTheOthersMoveIntact) {
  SkipWithoutPins();
  LiveDaemon d(TestOptions());
  auto client = Client::Connect(d.socket());
  AllocOptions ao;
  ao.size_bytes = 8 * kMiB;
  ao.numa_node = 1;
  ao.name = "shared-kv";
  auto lease = client->Allocate(ao);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  Fill(*lease, 5);
  ASSERT_TRUE(lease->SetMigrationCallback([](MigrationPhase) { return 0; }).ok());
  // A second holder that declares a pin, then dies without answering.
  int go[2], ready[2];
  ASSERT_EQ(::pipe(go), 0);
  ASSERT_EQ(::pipe(ready), 0);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto c = Client::Connect(d.socket());
    if (!c.ok()) ::_exit(2);
    auto l = c->Attach("shared-kv");
    if (!l.ok()) ::_exit(3);
    if (!l->SetMigrationCallback([](MigrationPhase) { return 0; }).ok()) ::_exit(4);
    char x = 'r';
    if (::write(ready[1], &x, 1) != 1) ::_exit(5);
    // Waits to be asked, then dies holding the pin.
    for (int i = 0; i < 1000 && c->MigrationsPending().value() == 0; ++i) ::usleep(10000);
    ::_exit(0);
  }
  char x;
  ASSERT_EQ(::read(ready[0], &x, 1), 1);
  Fill(*lease, 6);
  ASSERT_TRUE(client->FlushSignals().ok());
  ASSERT_TRUE(PollUntil([&] { return client->MigrationsPending().value() > 0; }, 10000));
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  // The dead holder is not waited for: this holder's answer moves it.
  auto n = client->SafePoint();
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 1);
  EXPECT_EQ(d.PoolOf(lease->id()), "node0");
  EXPECT_EQ(lease->tiering_stats().migrations, 1u);
  EXPECT_TRUE(Intact(*lease, 6));
  ::close(go[0]);
  ::close(go[1]);
  ::close(ready[0]);
  ::close(ready[1]);
}

// A lease of several extents (2 MiB each): every extent is moved alone by the
// kernel migrator on its own memfd and verified page by page, while a thread
// of the holder keeps writing the whole range; the lease is accounted on the
// new pool once the last extent is there.
TEST(TieringLiveTest, AMultiExtentLeaseMovesExtentByExtentUnderConcurrentWrites) {
  SkipWithoutPins();
  LiveDaemon d(TestOptions(), 2 * kMiB);
  auto client = Client::Connect(d.socket());
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  AllocOptions ao;
  ao.size_bytes = 8 * kMiB;
  ao.numa_node = 1;
  auto lease = client->Allocate(ao);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  size_t units = 0;
  EXPECT_FALSE(d.WholeOn(lease->id(), "node0", &units));
  ASSERT_EQ(units, 4u);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> gen{0};
  auto* words = static_cast<uint64_t*>(lease->data());
  const size_t n = lease->size() / 8;
  std::thread writer([&] {
    while (!stop.load()) {
      const uint64_t g = gen.load() + 1;
      for (size_t i = 0; i < n; i += 512) words[i] = i ^ g;  // one word per page
      gen.store(g);
    }
  });
  Fill(*lease, 3);  // through the copy helpers: the bytes heat the lease
  Fill(*lease, 4);
  ASSERT_TRUE(client->FlushSignals().ok());
  const bool moved = PollUntil([&] { return d.WholeOn(lease->id(), "node0"); }, 20000);
  stop.store(true);
  writer.join();
  ASSERT_TRUE(moved);
  for (size_t i = 0; i < n; i += 512) ASSERT_EQ(words[i], i ^ gen.load()) << "word " << i;
  auto rep = d.Report();
  std::vector<const tiering::MigrationRecord*> done;
  for (const auto& r : rep.history) {
    if (r.lease_id == lease->id() && r.outcome == "moved") done.push_back(&r);
  }
  ASSERT_EQ(done.size(), 4u);
  for (uint32_t i = 0; i < 4; ++i) {
    EXPECT_EQ(done[i]->bytes, 2 * kMiB);
    EXPECT_EQ(done[i]->mode, "in-place");
    EXPECT_NE(done[i]->detail.find("verified by move_pages: 512 pages: node 0: 512"),
              std::string::npos)
        << done[i]->detail;
  }
  std::set<uint32_t> seen;
  for (const auto* r : done) seen.insert(r->unit);
  EXPECT_EQ(seen.size(), 4u);
  // The kernel agrees, extent by extent, on the holder's mapping.
  for (uint64_t off = 0; off < lease->size(); off += 2 * kMiB) {
    auto c = tiering::CountPages(static_cast<char*>(lease->data()) + off, 2 * kMiB, 4096);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_EQ(c->On(0), c->pages) << "extent at " << off << ": " << c->ToString();
  }
  ASSERT_TRUE(PollUntil([&] {
    (void)client->ProcessEvents();
    return lease->numa_node() == 0;
  }));
}

// The cooperative path covers every extent: the holder pins the lease (one
// io_uring fixed buffer per extent: uring_pin.h), is asked once for the
// whole range, and all four extents move in that one pause.
TEST(TieringLiveTest, APinnedMultiExtentLeaseMovesEveryExtentAtOneSafePoint) {
  SkipWithoutPins();
  testing::UringPin pin;
  if (int e = pin.Open(); e != 0) GTEST_SKIP() << "no io_uring here: " << std::strerror(-e);
  LiveDaemon d(TestOptions(), 2 * kMiB);
  auto client = Client::Connect(d.socket());
  ASSERT_TRUE(client.ok());
  AllocOptions ao;
  ao.size_bytes = 8 * kMiB;
  ao.numa_node = 1;
  auto lease = client->Allocate(ao);
  ASSERT_TRUE(lease.ok());
  Fill(*lease, 9);
  ASSERT_EQ(pin.Register(lease->data(), lease->size(), 2 * kMiB), 0);
  std::vector<MigrationPhase> phases;
  ASSERT_TRUE(lease
                  ->SetMigrationCallback([&](MigrationPhase p) {
                    phases.push_back(p);
                    return p == MigrationPhase::kPrepare
                               ? pin.Unregister()
                               : pin.Register(lease->data(), lease->size(), 2 * kMiB);
                  })
                  .ok());
  Fill(*lease, 10);
  ASSERT_TRUE(client->FlushSignals().ok());
  ASSERT_TRUE(PollUntil([&] { return client->MigrationsPending().value() > 0; }, 10000));
  EXPECT_FALSE(d.WholeOn(lease->id(), "node0"));
  auto n = client->SafePoint();
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, 1);
  EXPECT_EQ(phases,
            (std::vector<MigrationPhase>{MigrationPhase::kPrepare, MigrationPhase::kResume}));
  EXPECT_EQ(pin.registrations, 2);
  EXPECT_TRUE(d.WholeOn(lease->id(), "node0"));
  TieringStats st = lease->tiering_stats();
  EXPECT_EQ(st.migrations, 1u);
  EXPECT_EQ(st.numa_node, 0);
  std::printf(
      "cooperative pause, 4 extents (io_uring unregister -> 4 moves of 2 MiB -> register): "
      "%.3f ms\n",
      static_cast<double>(st.last_pause_ns) / 1e6);
  EXPECT_TRUE(Intact(*lease, 10));
  auto rep = d.Report();
  int coop = 0;
  for (const auto& r : rep.history) {
    if (r.mode == "cooperative" && r.outcome == "moved") ++coop;
  }
  EXPECT_EQ(coop, 4);
  pin.Unregister();
}

}  // namespace
}  // namespace cxlpool
