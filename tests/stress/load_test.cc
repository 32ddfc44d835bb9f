// Load near capacity with quotas on (issue 5, "Load").
//
// 256 client processes, 64 under each of four uids, hammer a daemon whose
// pool (40 MiB) is far smaller than what they ask for together, and whose
// per-uid quotas (16 MiB, 48 leases each) add up to more than the pool. Two
// independent observers check that nothing is ever overcommitted:
//   * the clients themselves: a shared counter of bytes held is raised after
//     a grant arrives and lowered before the release is sent, so it is never
//     above what the daemon has really granted; every raise checks it against
//     the capacity, and a per-uid counter against the quota;
//   * the parent, which polls Pools, Stats and Quotas throughout and checks
//     every reply (leased + reserve + reclaiming <= capacity, used <= quota).
// A third of the requests are of a size the warm reserve (2-4 MiB of 2 MiB
// extents) serves from one shrunk extent, so grants from it, its refills
// and its retirements run in the middle of the load.
// Every refusal must be RESOURCE_EXHAUSTED and name the limit.
// The parent's Stats round trip during the load is the event-loop stall
// measure: its maximum (and p50/p99) is printed, not asserted: absolute
// times on a shared 2-core machine are noise.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstring>
#include <random>

#include "test_support.h"

namespace cxlpool::testsupport {
namespace {

constexpr int kClients = 256;
constexpr int kUids = 4;
constexpr uid_t kFirstUid = 20001;
constexpr int kOpsPerClient = 64;
constexpr int kMaxHeld = 3;
constexpr uint64_t kCapacity = 40 * kMiB;
constexpr uint64_t kQuotaBytes = 16 * kMiB;
constexpr uint64_t kQuotaLeases = 48;
constexpr uint64_t kReserveSize = 768 * kKiB;  // one 2 MiB reserve extent, shrunk

struct Shared {
  std::atomic<int> connected;
  std::atomic<int> go;
  std::atomic<uint64_t> held_bytes;
  std::atomic<uint64_t> max_held_bytes;
  std::atomic<uint64_t> uid_bytes[kUids];
  std::atomic<uint64_t> uid_leases[kUids];
  std::atomic<uint64_t> grants;
  std::atomic<uint64_t> refused_pool;
  std::atomic<uint64_t> refused_quota;
  std::atomic<uint64_t> violations;
  char violation[512];
};

void AtomicMax(std::atomic<uint64_t>& m, uint64_t v) {
  uint64_t cur = m.load();
  while (v > cur && !m.compare_exchange_weak(cur, v)) {
  }
}

// One client process. Exit codes: 0 ok, 1 connect failed, 2 unexpected
// answer, 3 overcommit seen.
int ClientMain(Shared* sh, int index, const std::string& socket, uint64_t seed) {
  int u = index % kUids;
  std::mt19937_64 rng(seed);
  auto violation = [&](const std::string& what) {
    if (sh->violations.fetch_add(1) == 0) {
      std::snprintf(sh->violation, sizeof sh->violation, "client %d (uid %u): %s", index,
                    kFirstUid + u, what.c_str());
    }
    return 3;
  };
  auto c = RawClient::Connect(socket, "stress-load", 60000);
  sh->connected.fetch_add(1);
  if (!c.ok()) {
    std::fprintf(stderr, "client %d: %s\n", index, c.status().ToString().c_str());
    return 1;
  }
  while (sh->go.load() == 0) ::usleep(1000);
  struct H {
    uint64_t id, size;
    UniqueFd fd;
  };
  std::vector<H> held;
  auto release = [&](size_t i) -> int {
    H h = std::move(held[i]);
    held.erase(held.begin() + static_cast<long>(i));
    // Lowered before the release is sent: the counter never exceeds what the
    // daemon holds for us.
    sh->held_bytes.fetch_sub(h.size);
    sh->uid_bytes[u].fetch_sub(h.size);
    sh->uid_leases[u].fetch_sub(1);
    Status st = c->Release(h.id);
    if (!st.ok()) {
      std::fprintf(stderr, "client %d: release %llu: %s\n", index,
                   static_cast<unsigned long long>(h.id), st.ToString().c_str());
      return 2;
    }
    return 0;
  };
  for (int op = 0; op < kOpsPerClient; ++op) {
    if (held.size() >= kMaxHeld || (!held.empty() && rng() % 3 == 0)) {
      if (int rc = release(rng() % held.size()); rc != 0) return rc;
      continue;
    }
    uint64_t want = rng() % 3 == 0 ? kReserveSize : 64 * kKiB * (1 + rng() % 16);
    H h;
    auto l = c->Alloc(want, &h.fd);
    if (!l.ok()) {
      const std::string& m = l.status().message();
      if (l.status().code() != Code::kResourceExhausted) {
        std::fprintf(stderr, "client %d: alloc: %s\n", index, l.status().ToString().c_str());
        return 2;
      }
      if (m.find("quota exceeded") != std::string::npos) {
        if (m.find("max_bytes") == std::string::npos && m.find("max_leases") == std::string::npos)
          return violation("quota refusal without its limit: " + m);
        sh->refused_quota.fetch_add(1);
      } else if (m.find("free of") != std::string::npos) {
        sh->refused_pool.fetch_add(1);
      } else {
        return violation("refusal names no limit: " + m);
      }
      continue;
    }
    h.id = l->id();
    h.size = l->size_bytes();
    struct stat st;
    if (::fstat(h.fd.get(), &st) != 0 || static_cast<uint64_t>(st.st_size) != h.size) {
      return violation("lease fd size differs from the reply's size");
    }
    uint64_t total = sh->held_bytes.fetch_add(h.size) + h.size;
    uint64_t ub = sh->uid_bytes[u].fetch_add(h.size) + h.size;
    uint64_t ul = sh->uid_leases[u].fetch_add(1) + 1;
    sh->grants.fetch_add(1);
    AtomicMax(sh->max_held_bytes, total);
    if (total > kCapacity) {
      return violation("clients hold " + std::to_string(total) + " B > capacity " +
                       std::to_string(kCapacity));
    }
    if (ub > kQuotaBytes || ul > kQuotaLeases) {
      return violation("uid holds " + std::to_string(ub) + " B in " + std::to_string(ul) +
                       " leases, quota " + std::to_string(kQuotaBytes) + " B / " +
                       std::to_string(kQuotaLeases));
    }
    void* p = ::mmap(nullptr, h.size, PROT_READ | PROT_WRITE, MAP_SHARED, h.fd.get(), 0);
    if (p == MAP_FAILED) return violation("mmap of a granted lease failed");
    static_cast<volatile char*>(p)[0] = 1;
    static_cast<volatile char*>(p)[h.size - 1] = 1;
    ::munmap(p, h.size);
    held.push_back(std::move(h));
  }
  while (!held.empty()) {
    if (int rc = release(held.size() - 1); rc != 0) return rc;
  }
  return 0;
}

TEST(LoadTest, ManyClientsNearCapacityNeverOvercommit) {
  SkipWithoutDaemon();
  if (::geteuid() != 0) Skip("needs root to run clients under four uids with quotas");
  std::string config =
      "[daemon]\nsocket_mode = \"0666\"\nlog_level = \"error\"\n"
      "[pools]\ncapacity = " +
      std::to_string(kCapacity) + "\nreserve_low = \"2M\"\nreserve_high = \"4M\"\n";
  for (int u = 0; u < kUids; ++u) {
    config += "[[quota]]\nuid = " + std::to_string(kFirstUid + u) +
              "\nmax_bytes = " + std::to_string(kQuotaBytes) +
              "\nmax_leases = " + std::to_string(kQuotaLeases) + "\n";
  }
  Daemon daemon;
  ASSERT_TRUE(daemon.Start(config).ok());
  auto probe = RawClient::Connect(daemon.socket(), "stress-probe", 60000);
  ASSERT_TRUE(probe.ok());

  void* mem =
      ::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  auto* sh = new (mem) Shared();
  std::mt19937_64 rng{std::random_device{}()};
  std::vector<pid_t> pids;
  std::fflush(nullptr);
  for (int i = 0; i < kClients; ++i) {
    uint64_t seed = rng();
    pid_t p = ::fork();
    ASSERT_GE(p, 0);
    if (p == 0) {
      if (!BecomeUid(kFirstUid + i % kUids)) std::_Exit(90);
      std::_Exit(ClientMain(sh, i, daemon.socket(), seed));
    }
    pids.push_back(p);
  }
  ASSERT_TRUE(PollUntil([&] { return sh->connected.load() == kClients; }, 120000, 5))
      << sh->connected.load() << " of " << kClients << " clients connected";
  {
    auto a = ReadAccounting(*probe);
    ASSERT_TRUE(a.ok());
    EXPECT_EQ(a->Gauge("connections"), static_cast<uint64_t>(kClients + 1));
  }
  sh->go = 1;

  // Observe while the clients work: a Stats round trip every iteration (the
  // stall probe), the full overcommit check every 4th.
  std::vector<uint64_t> rtts;
  uint64_t observations = 0;
  std::string broken;
  int running = kClients;
  std::vector<int> exit_codes;
  for (uint64_t iter = 0; running > 0; ++iter) {
    uint64_t t0 = NowMicros();
    proto::StatsReply sr;
    Status st = probe->Call(proto::StatsRequest(), &sr);
    ASSERT_TRUE(st.ok()) << st.ToString();
    rtts.push_back(NowMicros() - t0);
    if (iter % 4 == 0) {
      auto a = ReadAccounting(*probe);
      ASSERT_TRUE(a.ok()) << a.status().ToString();
      ++observations;
      std::string o = a->Overcommit();
      if (!o.empty() && broken.empty()) broken = o;
    }
    int status = 0;
    for (pid_t& p : pids) {  // only our clients: never reap the daemon here
      if (p > 0 && ::waitpid(p, &status, WNOHANG) == p) {
        p = -1;
        --running;
        exit_codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
      }
    }
    ASSERT_TRUE(daemon.Alive()) << "cxlpoold died under load";
  }
  EXPECT_TRUE(broken.empty()) << "daemon reported overcommit: " << broken;
  EXPECT_EQ(sh->violations.load(), 0u) << sh->violation;
  int bad = 0;
  for (int rc : exit_codes) bad += rc != 0;
  EXPECT_EQ(bad, 0) << bad << " clients failed (see stderr)";

  // Everything comes back.
  std::string last;
  EXPECT_TRUE(PollUntil([&] {
    auto a = ReadAccounting(*probe);
    if (!a.ok()) return false;
    last = a->Inconsistencies();
    for (const auto& q : a->quotas) {
      if (q.used_bytes() != 0 || q.used_leases() != 0) last += "quota still used; ";
    }
    return last.empty() && a->leases.empty() && a->Gauge("leased_bytes") == 0 &&
           a->Gauge("reclaiming_bytes") == 0;
  })) << last;
  auto a = ReadAccounting(*probe);
  ASSERT_TRUE(a.ok());

  std::sort(rtts.begin(), rtts.end());
  auto pct = [&](double q) { return rtts[static_cast<size_t>(q * (rtts.size() - 1))] / 1000.0; };
  std::printf(
      "load: %d clients (%d uids), capacity %llu MiB, quota %llu MiB/%llu leases per uid; "
      "grants %llu (daemon %llu), refusals pool %llu quota %llu; peak held by clients %.1f MiB; "
      "%llu overcommit observations, none broken\n",
      kClients, kUids, static_cast<unsigned long long>(kCapacity / kMiB),
      static_cast<unsigned long long>(kQuotaBytes / kMiB),
      static_cast<unsigned long long>(kQuotaLeases),
      static_cast<unsigned long long>(sh->grants.load()),
      static_cast<unsigned long long>(a->Counter("grants")),
      static_cast<unsigned long long>(sh->refused_pool.load()),
      static_cast<unsigned long long>(sh->refused_quota.load()),
      sh->max_held_bytes.load() / double(kMiB), static_cast<unsigned long long>(observations));
  std::printf(
      "load: event-loop stall probe (Stats round trip, %zu samples): p50 %.2f ms, p99 %.2f "
      "ms, max %.2f ms\n",
      rtts.size(), pct(0.5), pct(0.99), rtts.back() / 1000.0);
  EXPECT_GT(sh->grants.load(), 0u);
  EXPECT_GT(sh->refused_pool.load() + sh->refused_quota.load(), 0u)
      << "the load never reached a limit; the test proves nothing";
  EXPECT_EQ(sh->grants.load(), a->Counter("grants"));
  ::munmap(mem, sizeof(Shared));
}

}  // namespace
}  // namespace cxlpool::testsupport
