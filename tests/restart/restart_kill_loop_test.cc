// The kill loop: cxlpoold is SIGKILLed at random moments and started again
// (same socket, config and state dir), kCycles times, while kWorkers client
// processes allocate, write, verify and release through libcxlpool — the
// library notices each restart (failed call or its watcher), reconnects and
// hands its leases back; the application code below never does.
//
// After every restart the workers pause at an operation boundary and report
// what they hold; the invariant checker then demands, within a bounded poll:
//   * no lease lost: every lease a worker holds is listed, with one holder
//     and the worker as owner, and none of them was marked revoked;
//   * none granted twice: no id ever handed out twice (a shared bitmap of
//     every id granted), and the daemon lists nothing nobody holds;
//   * every client keeps its memory (pattern checked before each release and
//     at each pause) or gets a clear error (non-empty message);
//   * the daemon's accounting agrees with itself (Accounting::Inconsistencies).
// It reports cycles, grants and the reclaim latency after each restart.
// CXLPOOL_RESTART_SELFTEST=1 runs the same loop against a daemon without a
// journal (no --state-dir): the checker must then find lost leases, and the
// test passes only if it does (proof that the checker can fail).
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <random>
#include <set>

#include "cxlpool/client.hpp"
#include "restart_util.h"

namespace cxlpool::restart {
namespace {

using testsupport::Accounting;
using testsupport::Daemon;
using testsupport::kKiB;
using testsupport::kRestartConfig;
using testsupport::SharedBlock;
using testsupport::TempDir;
using testsupport::Workers;

constexpr int kWorkers = 4;
constexpr int kCycles = 60;
constexpr int kMaxHeld = 6;
constexpr uint64_t kIdBits = 1ull << 20;

struct Slot {
  std::atomic<uint32_t> ack;
  std::atomic<uint32_t> ready;  // connected once
  uint32_t held_count;
  uint64_t held[kMaxHeld];
  std::atomic<uint64_t> grants, releases, errors;
  char failure[256];
};

struct Shared {
  std::atomic<uint32_t> pause;
  std::atomic<uint64_t> granted_twice;
  Slot slots[kWorkers];
  std::atomic<uint64_t> granted[kIdBits / 64];
};

[[noreturn]] void WorkerMain(Shared* sh, int me, const std::string& socket, uint64_t seed) {
  Slot& slot = sh->slots[me];
  auto fail = [&](const std::string& what) {
    std::snprintf(slot.failure, sizeof slot.failure, "worker %d: %s", me, what.c_str());
    std::_Exit(1);
  };
  ::setenv("CXLPOOL_RECONNECT_TIMEOUT_MS", "30000", 1);
  std::mt19937_64 rng(seed);
  auto client = cxlpool::Client::Connect(socket);
  if (!client.ok()) fail("connect: " + client.status().ToString());
  slot.ready.store(1);
  std::vector<cxlpool::Lease> held;
  for (;;) {
    uint32_t epoch = sh->pause.load(std::memory_order_acquire);
    if (epoch != 0 && slot.ack.load() != epoch) {
      slot.held_count = 0;
      for (auto& l : held) {
        if (l.revoked()) fail("lease " + std::to_string(l.id()) + " lost (revoked at reclaim)");
        if (!Intact(l.data(), l.size(), l.id())) {
          fail("lease " + std::to_string(l.id()) + " lost its content");
        }
        slot.held[slot.held_count++] = l.id();
      }
      slot.ack.store(epoch, std::memory_order_release);
      while (sh->pause.load(std::memory_order_acquire) == epoch) ::usleep(200);
      continue;
    }
    bool alloc = held.empty() || (held.size() < kMaxHeld && rng() % 2 == 0);
    if (alloc) {
      cxlpool::AllocOptions o;
      o.size_bytes = 4 * kKiB * (1 + rng() % 64);
      auto l = client->Allocate(o);
      if (!l.ok()) {
        if (l.status().message().empty()) fail("alloc error without a message");
        if (l.status().code() != cxlpool::ErrorCode::kUnavailable) {
          fail("alloc: " + l.status().ToString());
        }
        slot.errors.fetch_add(1);  // a clear error; try again
        continue;
      }
      uint64_t id = l->id();
      if (id < kIdBits) {
        uint64_t bit = 1ull << (id % 64);
        if (sh->granted[id / 64].fetch_or(bit) & bit) sh->granted_twice.fetch_add(1);
      }
      Fill(l->data(), l->size(), id);
      held.push_back(std::move(*l));
      slot.grants.fetch_add(1);
    } else {
      size_t i = rng() % held.size();
      cxlpool::Lease l = std::move(held[i]);
      held.erase(held.begin() + static_cast<long>(i));
      if (!Intact(l.data(), l.size(), l.id())) {
        fail("lease " + std::to_string(l.id()) + " content changed");
      }
      auto st = l.Release();
      if (!st.ok()) fail("release " + std::to_string(l.id()) + ": " + st.ToString());
      slot.releases.fetch_add(1);
    }
  }
}

TEST(RestartKillLoopTest, NoLeaseLostOrGrantedTwiceAcrossSigkillsWithTheLibrary) {
  testsupport::SkipWithoutDaemon();
  TempDir state("restart");
  ASSERT_FALSE(state.path.empty());
  const char* self = std::getenv("CXLPOOL_RESTART_SELFTEST");
  const bool selftest = self != nullptr && std::string(self) == "1";
  Daemon daemon;
  std::vector<std::string> args = {"--state-dir", state.path, "--grace-period", "20s"};
  if (selftest) args.clear();
  ASSERT_TRUE(daemon.Start(kRestartConfig, args).ok());
  SharedBlock<Shared> block;
  ASSERT_NE(block.get(), nullptr);
  Shared* sh = block.get();
  std::mt19937_64 rng{std::random_device{}()};
  const std::string socket = daemon.socket();
  Workers workers;
  for (int i = 0; i < kWorkers; ++i) {
    uint64_t seed = rng();
    workers.Fork([&, i, seed] { WorkerMain(sh, i, socket, seed); });
  }
  auto failure_of = [&](int i) { return std::string(sh->slots[i].failure); };
  // Every worker connects before the first kill (a first connect is not a
  // reconnect: the library does not retry it).
  ASSERT_EQ(workers.WaitAll([&](int i) { return sh->slots[i].ready.load() != 0; }, failure_of,
                            30000, "workers did not connect"),
            "");
  std::vector<uint64_t> latency_ms;
  uint64_t leases_checked = 0;
  std::string failure;
  uint32_t epoch = 0;
  const uint64_t started = testsupport::NowMicros();
  int cycles = 0;
  for (; cycles < kCycles && failure.empty(); ++cycles) {
    ::usleep(static_cast<useconds_t>(rng() % 30000));
    daemon.Kill();
    Status st = daemon.Restart();
    uint64_t t0 = testsupport::NowMicros();
    if (!st.ok()) {
      failure = "restart " + std::to_string(cycles + 1) + ": " + st.ToString();
      break;
    }
    sh->pause.store(++epoch, std::memory_order_release);
    failure = workers.WaitAll(
        [&](int i) { return sh->slots[i].ack.load(std::memory_order_acquire) == epoch; },
        failure_of, 60000, "workers did not pause");
    if (!failure.empty()) break;
    std::map<uint64_t, int> want;  // id -> worker
    std::set<uint64_t> held;
    for (int i = 0; i < kWorkers; ++i) {
      for (uint32_t k = 0; k < sh->slots[i].held_count; ++k) {
        uint64_t id = sh->slots[i].held[k];
        if (want.count(id)) failure += "lease " + std::to_string(id) + " held by two workers; ";
        want[id] = i;
        held.insert(id);
      }
    }
    std::string last;
    bool ok = testsupport::PollUntilAccountingAgrees(
        socket, "kill-loop-checker",
        [&](const Accounting& a, std::ostream& d) {
          for (const auto& [id, w] : want) {
            auto it = a.leases.find(id);
            if (it != a.leases.end() &&
                (it->second.holders() != 1 ||
                 it->second.owner_pid() != static_cast<uint32_t>(workers.pid(w)))) {
              d << "lease " << id << " has " << it->second.holders() << " holders, owner "
                << it->second.owner_pid() << "; ";
            }
          }
          testsupport::CompareLeases(a, held, d);
        },
        selftest ? 2000 : 30000, &last);
    latency_ms.push_back((testsupport::NowMicros() - t0) / 1000);
    leases_checked += want.size();
    if (!ok) failure += "after restart " + std::to_string(cycles + 1) + ": " + last;
    if (sh->granted_twice.load() != 0) failure += " a lease id was granted twice;";
    sh->pause.store(0, std::memory_order_release);
  }
  workers.KillAll();
  uint64_t grants = 0, releases = 0, errors = 0;
  for (auto& s : sh->slots) {
    grants += s.grants;
    releases += s.releases;
    errors += s.errors;
  }
  std::sort(latency_ms.begin(), latency_ms.end());
  uint64_t median = latency_ms.empty() ? 0 : latency_ms[latency_ms.size() / 2];
  uint64_t worst = latency_ms.empty() ? 0 : latency_ms.back();
  std::printf(
      "restart kill loop: %d SIGKILL+restart cycles in %llu s, %llu grants, %llu releases, "
      "%llu leases checked held across restarts, %llu clear errors, reclaim after restart: "
      "median %llu ms, worst %llu ms\n",
      cycles, static_cast<unsigned long long>((testsupport::NowMicros() - started) / 1000000),
      static_cast<unsigned long long>(grants), static_cast<unsigned long long>(releases),
      static_cast<unsigned long long>(leases_checked), static_cast<unsigned long long>(errors),
      static_cast<unsigned long long>(median), static_cast<unsigned long long>(worst));
  if (selftest) {
    std::printf("self-test: the checker reported: %s\n", failure.c_str());
    EXPECT_FALSE(failure.empty()) << "without a journal the checker must find lost leases";
    return;
  }
  EXPECT_TRUE(failure.empty()) << failure;
  EXPECT_EQ(cycles, kCycles);
  EXPECT_EQ(sh->granted_twice.load(), 0u);
  EXPECT_GT(grants, static_cast<uint64_t>(kCycles));
}

}  // namespace
}  // namespace cxlpool::restart
