// Client SIGKILL at random points (issue 5, "Crash, fault and load tests").
//
// A real cxlpoold runs on a temp socket. kWorkers client processes loop
// forever over random operations: allocate private leases (some from the
// warm reserve), create shared named leases, attach to other workers' named
// leases, write and verify the memory, release. The parent kills one worker
// at a random moment (SIGKILL, a random delay into its work), then pauses the
// others at their next operation boundary, and checks that the daemon's
// accounting equals exactly what the live workers hold: the same lease ids,
// the same holder counts, gauges and pools in agreement, nothing of the dead
// worker left. Then a fresh worker takes the dead one's place.
//
// At the end of each batch every worker is killed and the daemon must be back
// to its baseline: no lease, the node's Shmem back within a tolerance, the
// daemon's VmLck and fd count exactly back.
//
// Prints: kills (and in which phase each landed), grants, attaches,
// releases, disconnect reclaims, node Shmem deltas.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstring>
#include <random>
#include <set>
#include <sstream>

#include "test_support.h"

namespace cxlpool::testsupport {
namespace {

constexpr int kWorkers = 6;
constexpr int kMaxHeld = 8;
constexpr int kBatches = 4;
constexpr int kKillsPerBatch = 260;  // 4 x 260 = 1040 random kills
// A size the warm reserve serves from one shrunk 2 MiB extent.
constexpr uint64_t kReserveSize = 768 * kKiB;
constexpr uint64_t kReserveBytes = 4 * kMiB;
// The node's Shmem may move for reasons outside this test (other processes
// on the machine); a leak of the leases churned here would be far larger.
constexpr uint64_t kShmemTolerance = 32 * kMiB;
// A worker's wait for one reply. This test checks accounting, not latency,
// on 2 cores it shares with other tests; a reply the daemon never sends
// still fails it, with the daemon's threads and gauges (Diagnose).
constexpr int kWorkerTimeoutMs = 30000;
constexpr int kPauseLimitMs = kWorkerTimeoutMs + 15000;

enum Phase : uint32_t {
  kIdle = 0,
  kConnecting,
  kAllocating,
  kAllocatingNamed,
  kAttaching,
  kReleasing,
  kTouching,
  kPhases
};
const char* const kPhaseNames[kPhases] = {"between-ops", "connecting", "alloc",   "alloc-named",
                                          "attach",      "release",    "touching"};

struct Slot {
  std::atomic<uint32_t> ack;    // last pause epoch this worker acknowledged
  std::atomic<uint32_t> phase;  // Phase
  std::atomic<uint64_t> token;  // published shared lease: name "kill-<token>", 0: none
  std::atomic<uint64_t> ops;    // operations completed
  uint32_t held_count;          // valid while paused
  uint64_t held[kMaxHeld];      // lease ids held (one reference each)
  char failure[256];            // set before a worker exits on its own
};

struct Shared {
  std::atomic<uint32_t> pause;  // nonzero: the epoch workers must acknowledge
  std::atomic<uint64_t> next_token;
  Slot slots[kWorkers];
};

struct Held {
  uint64_t id = 0;
  uint64_t size = 0;
  UniqueFd fd;
  uint8_t* map = nullptr;
  bool owner = false;     // we allocated it (we wrote the pattern)
  uint64_t token = 0;     // nonzero: the shared lease we published
  uint64_t attached = 0;  // nonzero: the token of the shared lease we attached
};

std::string NameOf(uint64_t token) { return "kill-" + std::to_string(token); }

// The worker: runs until killed. Exits 1 (with slot.failure set) on any
// answer the daemon must not give.
[[noreturn]] void WorkerMain(Shared* sh, int me, const std::string& socket, uint64_t seed) {
  Slot& slot = sh->slots[me];
  auto fail = [&](const std::string& what) {
    std::snprintf(slot.failure, sizeof slot.failure, "worker %d (pid %d): %s", me, ::getpid(),
                  what.c_str());
    std::_Exit(1);
  };
  std::mt19937_64 rng(seed);
  slot.phase = kConnecting;
  auto c = RawClient::Connect(socket, "stress-kill-worker", kWorkerTimeoutMs);
  if (!c.ok()) fail("connect: " + c.status().ToString());
  std::vector<Held> held;

  auto unmap = [](Held& h) {
    if (h.map != nullptr) ::munmap(h.map, h.size);
    h.map = nullptr;
  };
  for (;;) {
    slot.phase = kIdle;
    uint32_t epoch = sh->pause.load(std::memory_order_acquire);
    if (epoch != 0 && slot.ack.load() != epoch) {
      slot.held_count = static_cast<uint32_t>(held.size());
      for (size_t i = 0; i < held.size(); ++i) slot.held[i] = held[i].id;
      slot.ack.store(epoch, std::memory_order_release);
      while (sh->pause.load(std::memory_order_acquire) == epoch) ::usleep(200);
      continue;
    }
    int dice = static_cast<int>(rng() % 100);
    if (held.size() >= kMaxHeld) dice = 99;
    if (held.empty() && dice >= 70) dice = 0;
    if (dice < 50) {  // allocate, private or shared
      bool named = dice >= 35 && std::none_of(held.begin(), held.end(),
                                              [](const Held& h) { return h.token != 0; });
      uint64_t size = (rng() % 4 == 0) ? kReserveSize : 4 * kKiB * (1 + rng() % 256);
      uint64_t token = named ? sh->next_token.fetch_add(1) : 0;
      slot.phase = named ? kAllocatingNamed : kAllocating;
      Held h;
      auto l = c->Alloc(size, &h.fd, named ? NameOf(token) : "");
      if (!l.ok()) fail("alloc " + std::to_string(size) + ": " + l.status().ToString());
      slot.phase = kTouching;
      h.id = l->id();
      h.size = l->size_bytes();
      h.owner = true;
      if (h.size < size) fail("lease smaller than asked");
      void* p = ::mmap(nullptr, h.size, PROT_READ | PROT_WRITE, MAP_SHARED, h.fd.get(), 0);
      if (p == MAP_FAILED) fail("mmap lease: " + std::string(std::strerror(errno)));
      h.map = static_cast<uint8_t*>(p);
      std::memset(h.map, static_cast<int>(h.id & 0xff), h.size);
      std::memcpy(h.map, &h.id, sizeof h.id);
      if (named) {
        h.token = token;
        slot.token.store(token, std::memory_order_release);  // others may attach now
      }
      held.push_back(std::move(h));
    } else if (dice < 70) {  // attach another worker's shared lease
      int other = static_cast<int>(rng() % kWorkers);
      uint64_t token = sh->slots[other].token.load(std::memory_order_acquire);
      if (other == me || token == 0) continue;
      if (std::any_of(held.begin(), held.end(), [&](const Held& x) { return x.attached == token; }))
        continue;  // one reference per worker keeps the model simple
      slot.phase = kAttaching;
      Held h;
      auto l = c->Attach(NameOf(token), &h.fd);
      if (!l.ok()) {
        // Gone (its creator released it or died) or not built yet: fine.
        Code code = l.status().code();
        if (code == Code::kNotFound || code == Code::kUnavailable) continue;
        fail("attach: " + l.status().ToString());
      }
      h.id = l->id();
      h.size = l->size_bytes();
      h.attached = token;
      if (std::any_of(held.begin(), held.end(), [&](const Held& x) { return x.id == h.id; })) {
        fail("attach returned lease " + std::to_string(h.id) + " which this worker holds");
      }
      slot.phase = kTouching;
      void* p = ::mmap(nullptr, h.size, PROT_READ, MAP_SHARED, h.fd.get(), 0);
      if (p == MAP_FAILED) fail("mmap attached lease: " + std::string(std::strerror(errno)));
      h.map = static_cast<uint8_t*>(p);
      uint64_t seen = 0;
      std::memcpy(&seen, h.map, sizeof seen);
      if (seen != h.id) {
        fail("attached lease " + std::to_string(h.id) + " shows id " + std::to_string(seen) +
             ": not the creator's memory");
      }
      held.push_back(std::move(h));
    } else {  // release one
      size_t i = rng() % held.size();
      Held& h = held[i];
      slot.phase = kTouching;
      if (h.owner) {
        for (uint64_t off = sizeof h.id; off < h.size; off += 4096 - 8) {
          if (h.map[off] != static_cast<uint8_t>(h.id & 0xff)) {
            fail("lease " + std::to_string(h.id) + " content changed at offset " +
                 std::to_string(off));
          }
        }
      }
      if (h.token != 0) slot.token.store(0, std::memory_order_release);
      unmap(h);
      slot.phase = kReleasing;
      Status st = c->Release(h.id);
      if (!st.ok()) fail("release " + std::to_string(h.id) + ": " + st.ToString());
      held.erase(held.begin() + static_cast<long>(i));
    }
    slot.ops.fetch_add(1);
  }
}

class ClientKillTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    SkipWithoutDaemon();
    if (::geteuid() != 0) Skip("needs root: the checker lists every tenant's leases (admin)");
  }

  void SetUp() override {
    void* p =
        ::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(p, MAP_FAILED);
    sh_ = new (p) Shared();
    sh_->next_token = 1;
    ASSERT_TRUE(daemon_
                    .Start(R"(
[daemon]
socket_mode = "0666"
log_level = "warning"
[pools]
capacity = "512M"
reserve_low = "4M"
reserve_high = "4M"
)")
                    .ok());
  }

  void TearDown() override {
    for (int i = 0; i < kWorkers; ++i) KillWorker(i);
    if (sh_ != nullptr) ::munmap(sh_, sizeof(Shared));
  }

  void SpawnWorker(int i) {
    Slot& s = sh_->slots[i];
    s.ack = 0;
    s.phase = kConnecting;
    s.token = 0;
    s.ops = 0;
    s.held_count = 0;
    s.failure[0] = 0;
    uint64_t seed = rng_();
    std::string socket = daemon_.socket();
    pid_t p = ::fork();
    if (p == 0) WorkerMain(sh_, i, socket, seed);
    pids_[i] = p;
  }

  // SIGKILLs worker i and reaps it. False (with the reason) if it had
  // already ended on its own.
  bool KillWorker(int i, std::string* why = nullptr) {
    if (pids_[i] <= 0) return true;
    ::kill(pids_[i], SIGKILL);
    int status = 0;
    ::waitpid(pids_[i], &status, 0);
    pids_[i] = -1;
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) return true;
    if (why != nullptr) {
      *why = "worker " + std::to_string(i) + " ended by itself (status " + std::to_string(status) +
             "): " + sh_->slots[i].failure;
    }
    return false;
  }

  // Asks every live worker to stop at its next operation boundary.
  ::testing::AssertionResult Pause() {
    uint32_t epoch = ++epoch_;
    sh_->pause.store(epoch, std::memory_order_release);
    bool all = PollUntil(
        [&] {
          for (int i = 0; i < kWorkers; ++i) {
            if (pids_[i] <= 0) continue;
            if (sh_->slots[i].ack.load(std::memory_order_acquire) != epoch) {
              if (::waitpid(pids_[i], nullptr, WNOHANG) == pids_[i]) {
                failure_ = std::string("worker exited: ") + sh_->slots[i].failure;
                pids_[i] = -1;
                return true;
              }
              return false;
            }
          }
          return true;
        },
        kPauseLimitMs, 1);
    if (!failure_.empty()) return ::testing::AssertionFailure() << failure_ << "\n" << Diagnose();
    if (!all) {
      return ::testing::AssertionFailure()
             << "workers did not pause within " << kPauseLimitMs / 1000 << " s\n"
             << Diagnose();
    }
    return ::testing::AssertionSuccess();
  }

  // Where the daemon stands when a worker waited too long: its threads
  // (state, kernel wait channel) and, from a fresh admin connection, the
  // gauges of work in flight.
  std::string Diagnose() {
    std::ostringstream d;
    d << "cxlpoold threads (tid comm state wchan):\n" << ThreadStates(daemon_.pid());
    auto admin = RawClient::Connect(daemon_.socket(), "stress-diagnose", 5000);
    if (!admin.ok()) {
      d << "admin connect: " << admin.status().ToString();
      return d.str();
    }
    auto a = ReadAccounting(*admin);
    if (!a.ok()) {
      d << "accounting: " << a.status().ToString();
      return d.str();
    }
    d << "leases " << a->leases.size() << ";";
    for (const auto& [k, v] : a->gauges) d << " " << k << "=" << v;
    return d.str();
  }
  void Resume() { sh_->pause.store(0, std::memory_order_release); }

  // What the paused workers hold: lease id -> references.
  std::map<uint64_t, uint32_t> Expected() const {
    std::map<uint64_t, uint32_t> want;
    for (int i = 0; i < kWorkers; ++i) {
      if (pids_[i] <= 0) continue;
      const Slot& s = sh_->slots[i];
      for (uint32_t k = 0; k < s.held_count; ++k) ++want[s.held[k]];
    }
    return want;
  }

  // Empty when the daemon's accounting equals `want`; else the difference.
  static std::string Diff(const Accounting& a, const std::map<uint64_t, uint32_t>& want) {
    std::ostringstream d;
    d << a.Inconsistencies();
    for (const auto& [id, n] : want) {
      auto it = a.leases.find(id);
      if (it == a.leases.end()) {
        d << "lease " << id << " held by live workers is gone; ";
      } else if (it->second.holders() != n) {
        d << "lease " << id << " has " << it->second.holders() << " holders, live workers hold "
          << n << "; ";
      }
    }
    for (const auto& [id, l] : a.leases) {
      if (!want.count(id)) {
        d << "lease " << id << " (owner pid " << l.owner_pid() << ", " << l.holders()
          << " holders) is held by no live worker; ";
      }
    }
    return d.str();
  }

  // Polls until the daemon's accounting equals what the workers hold.
  ::testing::AssertionResult AccountingMatches(RawClient& admin) {
    auto want = Expected();
    std::string last;
    bool ok = PollUntil(
        [&] {
          auto a = ReadAccounting(admin);
          if (!a.ok()) {
            last = "accounting: " + a.status().ToString();
            return false;
          }
          last = Diff(*a, want);
          return last.empty();
        },
        10000, 1);
    if (ok) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << last;
  }

  Daemon daemon_;
  Shared* sh_ = nullptr;
  pid_t pids_[kWorkers] = {-1, -1, -1, -1, -1, -1};
  uint32_t epoch_ = 0;
  std::string failure_;
  std::mt19937_64 rng_{std::random_device{}()};
};

TEST_F(ClientKillTest, AccountingAndMemoryReturnAfterEveryKill) {
  auto admin = RawClient::Connect(daemon_.socket(), "stress-admin");
  ASSERT_TRUE(admin.ok()) << admin.status().ToString();
  ASSERT_TRUE(admin->hello().is_admin()) << "the checker needs admin (run as root)";
  pid_t dpid = daemon_.pid();

  // Baseline: the warm reserve built, nothing leased.
  uint64_t warm = 0;
  ASSERT_TRUE(PollUntil(
      [&] {
        auto a = ReadAccounting(*admin);
        if (!a.ok() || a->Gauge("pending_builds") != 0) return false;
        warm = a->Gauge("reserve_bytes");
        return warm == kReserveBytes && a->Gauge("reserve_ready_bytes") == warm &&
               a->leases.empty();
      },
      20000, 5))
      << "the warm reserve never settled";
  auto base_shmem = NodeMeminfoBytes("Shmem");
  auto base_vmlck = ProcStatusBytes(dpid, "VmLck");
  auto base_fds = CountFds(dpid);
  std::printf("baseline: node Shmem %.1f MiB, daemon VmLck %.1f MiB, daemon fds %zd\n",
              base_shmem ? *base_shmem / double(kMiB) : -1.0,
              base_vmlck ? *base_vmlck / double(kMiB) : -1.0,
              base_fds ? static_cast<ssize_t>(*base_fds) : -1);

  int kills = 0, end_kills = 0;
  uint64_t kill_phase[kPhases] = {};
  uint64_t worst_shmem_delta = 0;
  uint64_t ops_done = 0;
  std::uniform_int_distribution<int> delay_us(0, 4000);
  for (int batch = 0; batch < kBatches; ++batch) {
    for (int i = 0; i < kWorkers; ++i) SpawnWorker(i);
    for (int k = 0; k < kKillsPerBatch; ++k) {
      int victim = static_cast<int>(rng_() % kWorkers);
      ::usleep(static_cast<useconds_t>(delay_us(rng_)));
      uint32_t phase = sh_->slots[victim].phase.load();
      std::string why;
      ASSERT_TRUE(KillWorker(victim, &why)) << why;
      ops_done += sh_->slots[victim].ops.load();
      ++kills;
      ++kill_phase[phase < kPhases ? phase : 0];
      ASSERT_TRUE(Pause());
      ASSERT_TRUE(daemon_.Alive()) << "cxlpoold died after kill " << kills;
      ASSERT_TRUE(AccountingMatches(*admin))
          << "after kill " << kills << " (victim in phase " << kPhaseNames[phase] << ")";
      Resume();
      SpawnWorker(victim);
    }
    // Batch end: everyone goes; the daemon must be back to its baseline.
    ASSERT_TRUE(Pause());
    for (int i = 0; i < kWorkers; ++i) {
      ops_done += sh_->slots[i].ops.load();
      std::string why;
      ASSERT_TRUE(KillWorker(i, &why)) << why;
      ++end_kills;
    }
    Resume();
    ASSERT_TRUE(AccountingMatches(*admin)) << "after batch " << batch;
    std::string last;
    bool settled = PollUntil(
        [&] {
          auto a = ReadAccounting(*admin);
          if (!a.ok()) return false;
          last = "reserve " + std::to_string(a->Gauge("reserve_bytes")) + " (ready " +
                 std::to_string(a->Gauge("reserve_ready_bytes")) + ") pending " +
                 std::to_string(a->Gauge("pending_builds")) + " reclaiming " +
                 std::to_string(a->Gauge("reclaiming_bytes")) + " connections " +
                 std::to_string(a->Gauge("connections"));
          return a->Gauge("pending_builds") == 0 && a->Gauge("reserve_bytes") == warm &&
                 a->Gauge("reserve_ready_bytes") == warm && a->Gauge("reclaiming_bytes") == 0 &&
                 a->Gauge("connections") == 1;
        },
        20000, 5);
    ASSERT_TRUE(settled) << "daemon did not settle after batch " << batch << ": " << last;
    if (base_vmlck) {
      std::optional<uint64_t> v;
      EXPECT_TRUE(PollUntil([&] { return (v = ProcStatusBytes(dpid, "VmLck")) == base_vmlck; }))
          << "daemon VmLck " << (v ? *v : 0) << " B, baseline " << *base_vmlck << " B";
    }
    if (base_fds) {
      std::optional<size_t> n;
      EXPECT_TRUE(PollUntil([&] { return (n = CountFds(dpid)) == base_fds; }))
          << "daemon holds " << (n ? *n : 0) << " fds, baseline " << *base_fds;
    }
    if (base_shmem) {
      uint64_t delta = 0;
      bool back = PollUntil(
          [&] {
            auto now = NodeMeminfoBytes("Shmem");
            if (!now) return false;
            delta = *now > *base_shmem ? *now - *base_shmem : 0;
            return delta <= kShmemTolerance;
          },
          10000, 20);
      worst_shmem_delta = std::max(worst_shmem_delta, delta);
      EXPECT_TRUE(back) << "node Shmem still " << delta / kMiB << " MiB above baseline after batch "
                        << batch;
    }
  }

  auto a = ReadAccounting(*admin);
  ASSERT_TRUE(a.ok());
  std::printf(
      "client-kill: %d random kills (+%d at batch ends), %llu worker ops; daemon: grants %llu, "
      "reserve_hits %llu, attaches %llu, releases %llu, frees %llu, disconnect_reclaims %llu; "
      "worst node Shmem delta at batch end %.1f MiB (tolerance %llu MiB)\n",
      kills, end_kills, static_cast<unsigned long long>(ops_done),
      static_cast<unsigned long long>(a->Counter("grants")),
      static_cast<unsigned long long>(a->Counter("reserve_hits")),
      static_cast<unsigned long long>(a->Counter("attaches")),
      static_cast<unsigned long long>(a->Counter("releases")),
      static_cast<unsigned long long>(a->Counter("frees")),
      static_cast<unsigned long long>(a->Counter("disconnect_reclaims")),
      worst_shmem_delta / double(kMiB), static_cast<unsigned long long>(kShmemTolerance / kMiB));
  std::printf("client-kill: kill landed in phase:");
  for (int p = 0; p < static_cast<int>(kPhases); ++p) {
    std::printf(" %s=%llu", kPhaseNames[p], static_cast<unsigned long long>(kill_phase[p]));
  }
  std::printf("\n");
  EXPECT_GE(kills, 1000);
  EXPECT_GT(a->Counter("disconnect_reclaims"), 0u) << "no kill ever left a lease to reclaim";
  EXPECT_GT(a->Counter("attaches"), 0u) << "no shared lease was ever attached";
}

}  // namespace
}  // namespace cxlpool::testsupport
