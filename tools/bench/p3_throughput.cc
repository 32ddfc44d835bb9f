// P3: alloc+release per second with 1..128 client processes against the bare
// fd echo server under the same load (same processes, same op count).
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "bench.h"

namespace cxlpool::bench {

namespace {

struct ChildResult {
  int32_t ok;
  int32_t pad;
  uint64_t start_ns;
  uint64_t end_ns;
};

constexpr uint64_t kOpSize = 4 * kKiB;

[[noreturn]] void ChildMain(bool bare, const std::string& sock, int node, int ops, int ready_w,
                            int go_r, int result_w) {
  ChildResult res{0, 0, 0, 0};
  auto finish = [&](int32_t ok) {
    res.ok = ok;
    (void)!::write(result_w, &res, sizeof res);
    ::_exit(ok ? 0 : 1);
  };
  char one = 1;
  if (bare) {
    auto c = BareClient::Connect(sock);
    (void)!::write(ready_w, &one, 1);
    char buf;
    (void)!::read(go_r, &buf, 1);  // EOF: go
    if (!c.ok()) finish(0);
    res.start_ns = NowNs();
    for (int i = 0; i < ops; ++i) {
      if (!c->GrantRoundTrip().ok() || !c->ReleaseRoundTrip().ok()) finish(0);
    }
  } else {
    auto c = WireClient::Connect(sock);
    (void)!::write(ready_w, &one, 1);
    char buf;
    (void)!::read(go_r, &buf, 1);
    if (!c.ok()) finish(0);
    res.start_ns = NowNs();
    for (int i = 0; i < ops; ++i) {
      auto l = c->Alloc(kOpSize, node);
      if (!l.ok() || !c->Release(l->id()).ok()) finish(0);
    }
  }
  res.end_ns = NowNs();
  finish(1);
  ::_exit(0);  // not reached: finish() exits
}

// ops/s over all clients, from the first start to the last end.
Result<double> RunClients(bool bare, const std::string& sock, int node, int clients, int ops) {
  int ready[2], go[2], result[2];
  if (::pipe2(ready, O_CLOEXEC) != 0) return Status::FromErrno(errno, "pipe");
  if (::pipe2(go, O_CLOEXEC) != 0) return Status::FromErrno(errno, "pipe");
  if (::pipe2(result, O_CLOEXEC) != 0) return Status::FromErrno(errno, "pipe");
  UniqueFd ready_r(ready[0]), ready_w(ready[1]), go_r(go[0]), go_w(go[1]), res_r(result[0]),
      res_w(result[1]);
  std::vector<pid_t> pids;
  for (int i = 0; i < clients; ++i) {
    pid_t p = ::fork();
    if (p < 0) break;
    if (p == 0) {
      ::close(go[1]);
      ChildMain(bare, sock, node, ops, ready[1], go[0], result[1]);
    }
    pids.push_back(p);
  }
  ready_w.Reset();
  res_w.Reset();
  go_r.Reset();
  size_t ready_count = 0;
  char buf[256];
  while (ready_count < pids.size()) {
    ssize_t n = ::read(ready_r.get(), buf, std::min(sizeof buf, pids.size() - ready_count));
    if (n <= 0) break;
    ready_count += static_cast<size_t>(n);
  }
  go_w.Reset();  // EOF releases every child at once
  uint64_t first = UINT64_MAX, last = 0;
  size_t good = 0, got = 0;
  ChildResult cr;
  while (::read(res_r.get(), &cr, sizeof cr) == static_cast<ssize_t>(sizeof cr)) {
    ++got;
    if (cr.ok) {
      ++good;
      first = std::min(first, cr.start_ns);
      last = std::max(last, cr.end_ns);
    }
  }
  for (pid_t p : pids) ::waitpid(p, nullptr, 0);
  if (pids.size() != static_cast<size_t>(clients)) {
    return Status(Code::kResourceExhausted,
                  "could fork only " + std::to_string(pids.size()) + " clients");
  }
  if (good != pids.size()) {
    return Status(Code::kUnavailable, std::to_string(pids.size() - good) + " of " +
                                          std::to_string(clients) + " clients failed");
  }
  if (last <= first) return Status(Code::kInternal, "empty time window");
  return static_cast<double>(clients) * ops * 1e9 / static_cast<double>(last - first);
}

}  // namespace

void RunP3(const Options& o, Report* r) {
  std::vector<int> levels = o.quick ? std::vector<int>{1, 8} : std::vector<int>{1, 8, 32, 128};
  int total = o.quick ? 400 : 8000;
  DaemonConfig cfg;
  DaemonProc daemon;
  auto sock = PhaseSocket(o, cfg, &daemon);
  if (!sock.ok()) return r->Skip("P3", "throughput", sock.status().ToString());
  BareServer bare;
  if (Status st = bare.Start(); !st.ok()) {
    return r->Skip("P3", "throughput", "bare server: " + st.ToString());
  }
  // The floor: the bare server doing the daemon's per-lease kernel work
  // (CreateMemfdBacking with the daemon's settings, then Reclaim).
  MemfdSpec spec = FloorSpec(kOpSize, o.node, cfg.pin, cfg.thp, "cxlpool-bench-floor");
  BareServer floor;
  Status floor_up = floor.Start(spec);
  for (int c : levels) {
    int ops = std::max(total / c, 10);
    std::string metric = "alloc+release/s, " + std::to_string(c) + " clients";
    auto b = RunClients(true, bare.socket(), o.node, c, ops);
    if (!b.ok()) {
      r->Skip("P3", metric, "bare: " + b.status().ToString());
      continue;
    }
    Result<double> f =
        floor_up.ok() ? RunClients(true, floor.socket(), o.node, c, ops) : Result<double>(floor_up);
    auto d = RunClients(false, *sock, o.node, c, ops);
    if (!d.ok()) {
      r->Skip("P3", metric, d.status().ToString());
      continue;
    }
    Row x;
    x.figure = "P3";
    x.metric = metric;
    x.value = *d;
    x.baseline = *b;
    x.unit = "ops/s";
    x.goal_op = "ge";
    x.goal = 0.5;
    x.note = std::to_string(ops) + " ops per client; op = " + HumanSize(kOpSize) +
             " cold alloc + release (bare: fd round trip + plain round trip)";
    if (f.ok() && *f > 0) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "; %.2fx the floor", *d / *f);
      x.note += buf;
    }
    r->Add(std::move(x));
    if (!f.ok()) {
      r->Skip("P3", metric + " floor", "bare server with memfd builds: " + f.status().ToString());
      continue;
    }
    Row fl;
    fl.figure = "P3";
    fl.metric = metric + " floor";
    fl.value = *f;
    fl.baseline = *b;
    fl.unit = "ops/s";
    fl.note =
        "floor = the bare server building and reclaiming a memfd per op with the daemon's "
        "own code (bound, prefaulted, pinned, sealed), one thread, no protocol";
    r->Add(std::move(fl));
  }
}

}  // namespace cxlpool::bench
