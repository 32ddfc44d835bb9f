// cxlpool-vm-tier: the VM tier's tiering client (C++ API). Where the pages
// are is asked of the kernel (move_pages on this process's mapping), never
// taken from the daemon.
//
//   cxlpool-vm-tier move --size B --node C --expect-node D [--threads N]
//                        [--pinned] [--hint will_need|dont_need] [--timeout S]
//       Lease strictly on node C (checked), fill it with a pattern, start N
//       threads that read, check and rewrite their share of it through the
//       copy helpers the whole time (the bytes heat the lease), optionally
//       pin it with io_uring fixed buffers that a migration callback drops
//       and restores at this process's safe points, and wait until every page
//       is on node D. Then every thread's checks must have held and the
//       pattern must be intact. Prints "MOVED node=D pages=N migrations=M
//       pause_ns=P".
//       --extent E: the lease is made of extents of E bytes (daemon.max_extent):
//       each one's pages are counted alone (move_pages) and must all be on D.
//       --plain: the threads read and write the mapping with plain loads and
//       stores instead, so the daemon hears of the heat only from the
//       kernel's access sampling (tiering.sampling = "damon").
//       --then-hint H --then-expect F: once on D, the threads stop (their
//       last writes are checked at the end), hint H goes for the whole lease,
//       and every page (every extent) must reach F too.
//   cxlpool-vm-tier hold --size B --node C [--threads N] [--expect-node D]
//       As move, without waiting: prints "READY <id>" and keeps working (and
//       answering safe points) until a line arrives on stdin; the daemon may
//       be killed and restarted meanwhile. Then: the data intact, the lease
//       not revoked, and every page on D when given. A line "extents
//       S0:N0,S1:N1,..." says where each extent (of S bytes, in lease order)
//       must be instead (a lease split between pools): each one's pages
//       counted alone (move_pages) must all be on its node.
// Common: --socket PATH. Exit 0 when the check holds, 1 otherwise (reason on
// stderr), 2 on bad usage.
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cxlpool/client.hpp"
#include "tiering/migrator.h"
#include "uring_pin.h"

namespace {

using cxlpool::Client;
using cxlpool::Lease;

struct Args {
  std::string cmd;
  std::string socket;
  uint64_t size = 16ull << 20;
  int node = -1;
  int expect = -1;
  int threads = 2;
  bool pinned = false;
  bool plain = false;
  std::string hint;
  int timeout_s = 240;
  uint64_t extent = 0;
  std::string then_hint;
  int then_expect = -1;
};

int Usage() {
  std::fprintf(stderr,
               "usage: cxlpool-vm-tier move|hold --size B --node C [--expect-node D] "
               "[--threads N] [--plain] [--pinned] [--hint will_need|dont_need] [--timeout S] "
               "[--extent E] [--then-hint H --then-expect F] [--socket P]\n");
  return 2;
}

uint64_t Word(uint64_t index, uint64_t gen) { return index * 0x9e3779b97f4a7c15ull ^ gen; }

// Where this process's mapping of the lease is: node -> pages.
cxlpool::tiering::PageCount Where(const Lease& l) {
  auto c = cxlpool::tiering::CountPages(l.data(), l.size(), 4096);
  return c.ok() ? *c : cxlpool::tiering::PageCount{};
}

bool AllOn(const Lease& l, int node) {
  auto c = Where(l);
  return c.pages > 0 && c.On(node) == c.pages;
}

// Each extent of `extent` bytes counted alone: "0: node 2: 512; 1: ...";
// `all_on` is set when every page of every extent is on `node`.
std::string PerExtent(const Lease& l, uint64_t extent, int node, bool* all_on) {
  std::string s;
  *all_on = extent != 0;
  auto* base = static_cast<char*>(l.data());
  for (uint64_t off = 0, i = 0; extent != 0 && off < l.size(); off += extent, ++i) {
    const uint64_t len = std::min<uint64_t>(extent, l.size() - off);
    auto c = cxlpool::tiering::CountPages(base + off, len, 4096);
    if (!c.ok() || c->pages == 0 || c->On(node) != c->pages) *all_on = false;
    s += (s.empty() ? "" : "; ") + std::to_string(i) + ": " +
         (c.ok() ? c->ToString() : c.status().ToString());
  }
  return s;
}

// Waits until every page is on `node` (answering safe points meanwhile).
bool WaitAllOn(Client& client, const Lease& l, int node,
               std::chrono::steady_clock::time_point deadline, int timeout_s, std::string* why) {
  for (;;) {
    (void)client.SafePoint();
    (void)client.ProcessEvents();
    if (AllOn(l, node)) return true;
    if (std::chrono::steady_clock::now() >= deadline) {
      *why = "pages not all on node " + std::to_string(node) + " after " +
             std::to_string(timeout_s) + " s: " + Where(l).ToString();
      return false;
    }
    ::usleep(20000);
  }
}

cxlpool::TierHint HintOf(const std::string& h) {
  return h == "will_need" ? cxlpool::TierHint::kWillNeed
         : h == "hot"     ? cxlpool::TierHint::kHot
         : h == "cold"    ? cxlpool::TierHint::kCold
                          : cxlpool::TierHint::kDontNeed;
}

// One thread's share: read it back, check the generation it last wrote,
// write the next one. Through the copy helpers, so the daemon is told, or
// (plain) with loads and stores the daemon can only see through the kernel.
struct Worker {
  Lease* lease = nullptr;
  bool plain = false;
  uint64_t offset = 0;
  uint64_t length = 0;
  std::atomic<bool>* stop = nullptr;
  std::atomic<uint64_t> rounds{0};
  std::atomic<uint64_t> bad{0};
  std::string first_error;
  void Run() {
    const size_t words = length / 8;
    std::vector<uint64_t> out(words), back(words);
    uint64_t gen = 0;
    while (!stop->load()) {
      ++gen;
      for (size_t i = 0; i < words; ++i) out[i] = Word(offset / 8 + i, gen);
      if (plain) {
        auto* p = reinterpret_cast<volatile uint64_t*>(static_cast<char*>(lease->data()) + offset);
        for (size_t i = 0; i < words; ++i) p[i] = out[i];
        for (size_t i = 0; i < words; ++i) back[i] = p[i];
      } else if (!lease->CopyIn(offset, out.data(), length).ok() ||
                 !lease->CopyOut(offset, back.data(), length).ok()) {
        bad.fetch_add(1);
        if (first_error.empty()) first_error = "a copy failed";
        return;
      }
      for (size_t i = 0; i < words; ++i) {
        if (back[i] != out[i]) {
          bad.fetch_add(1);
          if (first_error.empty()) {
            first_error = "word " + std::to_string(offset / 8 + i) + " read back wrong";
          }
          break;
        }
      }
      rounds.fetch_add(1);
    }
    gen_final = gen;
  }
  uint64_t gen_final = 0;
};

bool StdinLine(int wait_ms) {
  pollfd p{0, POLLIN, 0};
  return ::poll(&p, 1, wait_ms) > 0;
}

int Run(const Args& a) {
  auto client = Client::Connect(a.socket);
  if (!client.ok()) {
    std::fprintf(stderr, "connect: %s\n", client.status().ToString().c_str());
    return 1;
  }
  cxlpool::AllocOptions ao;
  ao.size_bytes = a.size;
  ao.numa_node = a.node;
  ao.strict = true;
  ao.label = "vm-tier";
  auto lease = client->Allocate(ao);
  if (!lease.ok()) {
    std::fprintf(stderr, "alloc: %s\n", lease.status().ToString().c_str());
    return 1;
  }
  if (!AllOn(*lease, a.node)) {
    std::fprintf(stderr, "lease not on node %d at first: %s\n", a.node,
                 Where(*lease).ToString().c_str());
    return 1;
  }
  cxlpool::testing::UringPin pin;
  if (a.pinned) {
    if (int e = pin.Open(); e != 0) {
      std::fprintf(stderr, "io_uring: %s\n", std::strerror(-e));
      return 1;
    }
    if (int e = pin.Register(lease->data(), lease->size(), a.extent); e != 0) {
      std::fprintf(stderr, "IORING_REGISTER_BUFFERS: %s\n", std::strerror(-e));
      return 1;
    }
    Lease* l = &*lease;
    const uint64_t piece = a.extent;  // one fixed buffer per extent (uring_pin.h)
    (void)lease->SetMigrationCallback([&pin, l, piece](cxlpool::MigrationPhase p) {
      return p == cxlpool::MigrationPhase::kPrepare ? pin.Unregister()
                                                    : pin.Register(l->data(), l->size(), piece);
    });
  }
  std::atomic<bool> stop{false};
  std::vector<std::unique_ptr<Worker>> workers;
  std::vector<std::thread> threads;
  const int n = a.threads > 0 ? a.threads : 0;
  if (n == 0) {
    // One fill, checked at the end.
    std::vector<uint64_t> buf(a.size / 8);
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = Word(i, 1);
    if (!lease->CopyIn(0, buf.data(), a.size).ok()) return 1;
  }
  for (int i = 0; i < n; ++i) {
    auto w = std::make_unique<Worker>();
    w->lease = &*lease;
    w->plain = a.plain;
    w->length = a.size / static_cast<uint64_t>(n) / 4096 * 4096;
    w->offset = w->length * static_cast<uint64_t>(i);
    w->stop = &stop;
    workers.push_back(std::move(w));
  }
  for (auto& w : workers) threads.emplace_back([&w] { w->Run(); });
  if (a.hint == "will_need") {
    (void)lease->Hint(0, a.size, cxlpool::TierHint::kWillNeed);
  } else if (a.hint == "dont_need") {
    (void)lease->Hint(0, a.size, cxlpool::TierHint::kDontNeed);
  }
  (void)client->FlushSignals();
  bool ok = true;
  std::string why;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(a.timeout_s);
  if (a.cmd == "hold") {
    std::printf("READY %llu\n", static_cast<unsigned long long>(lease->id()));
    std::fflush(stdout);
    while (!StdinLine(20)) {
      (void)client->SafePoint();
      (void)client->ProcessEvents();
    }
  } else {
    ok = WaitAllOn(*client, *lease, a.expect, deadline, a.timeout_s, &why);
  }
  int final_node = a.expect;
  std::vector<std::pair<uint64_t, int>> split;  // hold: "extents S0:N0,..." on stdin
  if (a.cmd == "hold") {
    char line[8192] = {};
    if (std::fgets(line, sizeof line, stdin) != nullptr && std::strncmp(line, "extents ", 8) == 0) {
      for (char* p = line + 8; *p != '\0' && *p != '\n';) {
        char* end = nullptr;
        const uint64_t size = std::strtoull(p, &end, 10);
        if (end == p || *end != ':') break;
        p = end + 1;
        const int node = static_cast<int>(std::strtol(p, &end, 10));
        if (end == p) break;
        split.emplace_back(size, node);
        p = *end == ',' ? end + 1 : end;
      }
      final_node = -1;
    }
  }
  // --extent: each extent's pages counted alone, printed, and all on `node`.
  auto extents_on = [&](int node) {
    if (!ok || a.extent == 0 || node < 0) return;
    bool each = false;
    std::string per = PerExtent(*lease, a.extent, node, &each);
    std::printf("EXTENTS node=%d [%s]\n", node, per.c_str());
    if (!each) {
      ok = false;
      why = "not every extent is whole on node " + std::to_string(node) + ": " + per;
    }
  };
  extents_on(a.expect);
  stop.store(true);
  for (auto& t : threads) t.join();
  if (ok && a.then_expect >= 0) {
    // The way back, with the threads stopped (their last writes are checked below).
    (void)lease->Hint(0, a.size, HintOf(a.then_hint));
    (void)client->FlushSignals();
    final_node = a.then_expect;
    const auto back_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(a.timeout_s);
    ok = WaitAllOn(*client, *lease, a.then_expect, back_deadline, a.timeout_s, &why);
    extents_on(a.then_expect);
  }
  if (ok && !split.empty()) {
    // Each extent on the node the daemon accounts it to.
    auto* base = static_cast<char*>(lease->data());
    std::string per;
    uint64_t off = 0;
    for (size_t i = 0; ok && i < split.size(); ++i) {
      const auto [len, node] = split[i];
      if (len == 0 || off + len > a.size) {
        ok = false;
        why = "extent " + std::to_string(i) + " of " + std::to_string(len) + " bytes at " +
              std::to_string(off) + " is outside the lease";
        break;
      }
      auto c = cxlpool::tiering::CountPages(base + off, len, 4096);
      per += (per.empty() ? "" : "; ") + std::to_string(i) + ": " +
             (c.ok() ? c->ToString() : c.status().ToString());
      if (!c.ok() || c->pages == 0 || c->On(node) != c->pages) {
        ok = false;
        why = "extent " + std::to_string(i) + " is not whole on node " + std::to_string(node) +
              ": " + (c.ok() ? c->ToString() : c.status().ToString());
      }
      off += len;
    }
    if (ok && off != a.size) {
      ok = false;
      why = "the extents given cover " + std::to_string(off) + " of " + std::to_string(a.size) +
            " bytes";
    }
    std::printf("EXTENTS split [%s]\n", per.c_str());
  }
  uint64_t rounds = 0;
  for (auto& w : workers) {
    rounds += w->rounds.load();
    if (w->bad.load() != 0) {
      ok = false;
      why = "a worker saw bad data: " + w->first_error;
    }
  }
  // The whole lease, as the workers (or the fill) left it.
  std::vector<uint64_t> back(a.size / 8);
  if (!lease->CopyOut(0, back.data(), a.size).ok()) {
    ok = false;
    why = "final read failed";
  } else {
    for (auto& w : workers) {
      for (uint64_t i = w->offset / 8; i < (w->offset + w->length) / 8; ++i) {
        if (back[i] != Word(i, w->gen_final)) {
          ok = false;
          why = "word " + std::to_string(i) + " lost its last write";
          break;
        }
      }
    }
    if (n == 0) {
      for (size_t i = 0; i < back.size(); ++i) {
        if (back[i] != Word(i, 1)) {
          ok = false;
          why = "word " + std::to_string(i) + " changed";
          break;
        }
      }
    }
  }
  if (lease->revoked()) {
    ok = false;
    why = "the lease was revoked";
  }
  if (final_node >= 0 && !AllOn(*lease, final_node)) {
    ok = false;
    why = "pages not on node " + std::to_string(final_node) + ": " + Where(*lease).ToString();
  }
  cxlpool::TieringStats st = lease->tiering_stats();
  if (a.pinned && (st.migrations == 0 || !pin.registered())) {
    ok = false;
    why = "pinned lease: " + std::to_string(st.migrations) + " cooperative migrations, pin " +
          (pin.registered() ? "restored" : "NOT restored");
  }
  std::printf("%s node=%d pages=%llu migrations=%llu pause_ns=%lld rounds=%llu where=[%s]\n",
              ok ? "MOVED" : "FAILED", lease->numa_node(),
              static_cast<unsigned long long>(Where(*lease).pages),
              static_cast<unsigned long long>(st.migrations),
              static_cast<long long>(st.last_pause_ns), static_cast<unsigned long long>(rounds),
              Where(*lease).ToString().c_str());
  if (!ok) std::fprintf(stderr, "cxlpool-vm-tier: %s\n", why.c_str());
  pin.Unregister();
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return Usage();
  Args a;
  a.cmd = argv[1];
  if (a.cmd != "move" && a.cmd != "hold") return Usage();
  const char* env = std::getenv("CXLPOOL_SOCKET");
  a.socket = env != nullptr ? env : "/run/cxlpool/cxlpool.sock";
  for (int i = 2; i < argc; ++i) {
    std::string k = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (k == "--socket") {
      a.socket = next();
    } else if (k == "--size") {
      a.size = std::strtoull(next().c_str(), nullptr, 0);
    } else if (k == "--node") {
      a.node = std::atoi(next().c_str());
    } else if (k == "--expect-node") {
      a.expect = std::atoi(next().c_str());
    } else if (k == "--threads") {
      a.threads = std::atoi(next().c_str());
    } else if (k == "--plain") {
      a.plain = true;
    } else if (k == "--pinned") {
      a.pinned = true;
    } else if (k == "--hint") {
      a.hint = next();
    } else if (k == "--timeout") {
      a.timeout_s = std::atoi(next().c_str());
    } else if (k == "--extent") {
      a.extent = std::strtoull(next().c_str(), nullptr, 0);
    } else if (k == "--then-hint") {
      a.then_hint = next();
    } else if (k == "--then-expect") {
      a.then_expect = std::atoi(next().c_str());
    } else {
      return Usage();
    }
  }
  if (a.node < 0 || a.size == 0 || a.size % 4096 != 0) return Usage();
  if (a.cmd == "move" && a.expect < 0) return Usage();
  if (a.extent % 4096 != 0 || (a.then_expect >= 0 && a.then_hint.empty())) return Usage();
  return Run(a);
}
