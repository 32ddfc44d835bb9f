// TIER: the tiering engine's figures (docs/benchmarks.md, "Tiering").
//
// T1  migration throughput: the engine's mover (KernelMigrator: mbind
//     MPOL_MF_MOVE_ALL on its own mapping, then move_pages over every page to
//     verify) moving a prefaulted memfd that two other processes map, as a
//     lease is, from one node to another; against the kernel's own
//     migrate_pages(2) of the same amount of memory mapped by one process
//     only, and move_pages(2) with a target node of the same pages. Same run,
//     alternating, medians. Needs two NUMA nodes with memory.
// T2  the application-visible pause of a cooperative migration: a real
//     cxlpoold on this machine's DRAM and CXL (or any two) nodes, a lease
//     pinned with io_uring fixed buffers (as CUDA pins), moved back and forth
//     by will_need / dont_need hints, each move answered at a safe point;
//     p50/p99 of "pins dropped -> pinned again", against an unpinned move of
//     the same bytes. Needs two nodes with memfd pools of kinds dram and cxl.
// T3  a KV-block trace: blocks with a Zipf popularity that shifts over time,
//     more blocks than fit in DRAM, served through the real TieringEngine
//     (policy, heat, rate limit) against static first-fit placement. Tier
//     speeds are modelled (QEMU does not model CXL's speed, and this machine
//     may have one node): from HMAT when the machine has it, else named
//     defaults. Reported: the time ratio and the share of accesses from DRAM.
#include <fcntl.h>
#include <numa.h>
#include <numaif.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <thread>

#include "bench.h"
#include "cxlpool/client.hpp"
#include "cxlpool/common/clock.h"
#include "cxlpool/common/log.h"
#include "cxlpool/common/strings.h"
#include "tiering/engine.h"
#include "tiering/migrator.h"
#include "uring_pin.h"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

namespace cxlpool::bench {
namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::vector<int> NodesWithMemory(uint64_t need) {
  std::vector<int> out;
  if (numa_available() < 0) return out;
  for (int n = 0; n <= numa_max_node(); ++n) {
    long long free_bytes = 0;
    if (numa_node_size64(n, &free_bytes) > 0 && free_bytes > static_cast<long long>(need)) {
      out.push_back(n);
    }
  }
  return out;
}

// The other node to move to: a CPU-less one when there is one.
int OtherNode(const std::vector<int>& nodes, int from) {
  int pick = -1;
  for (int n : nodes) {
    if (n == from) continue;
    struct bitmask* cpus = numa_allocate_cpumask();
    bool has_cpus = numa_node_to_cpus(n, cpus) == 0 && numa_bitmask_weight(cpus) > 0;
    numa_free_cpumask(cpus);
    if (!has_cpus) return n;
    if (pick < 0) pick = n;
  }
  return pick;
}

bool ShmemThpAdvised() {
  std::string m = ReadFirstLine("/sys/kernel/mm/transparent_hugepage/shmem_enabled");
  return m.find("[advise]") != std::string::npos || m.find("[always]") != std::string::npos;
}

// Drops CAP_SYS_NICE from this process (a child's), so migrate_pages(2)
// moves only what it alone maps, as an unprivileged application's would.
void DropSysNice() {
  struct {
    uint32_t version;
    int pid;
  } hdr{0x20080522, 0};  // _LINUX_CAPABILITY_VERSION_3
  struct {
    uint32_t effective, permitted, inheritable;
  } data[2]{};
  if (::syscall(SYS_capget, &hdr, data) != 0) return;
  data[0].effective &= ~(1u << 23);
  data[0].permitted &= ~(1u << 23);
  (void)::syscall(SYS_capset, &hdr, data);
}

// A memfd of `size` bound to `node` and prefaulted, mapped by nobody else.
Result<UniqueFd> MemfdOn(uint64_t size, int node, bool thp) {
  MemfdSpec spec;
  spec.size_bytes = size;
  spec.numa_node = node;
  spec.pin = false;
  spec.thp = thp;
  // Built as a pool builds one, without a Backing (whose end truncates the
  // file): the build's own mapping goes, the file and its pages stay.
  auto b = BuildMemfd(spec);
  if (!b.ok()) return b.status();
  ::munmap(b->addr, b->size_bytes);
  return std::move(b->fd);
}

// A holder process mapping the whole memfd until `Stop`.
struct Holder {
  pid_t pid = -1;
  int stop_fd = -1;
  static Holder Start(int fd, uint64_t size) {
    int p[2], r[2];
    Holder h;
    if (::pipe(p) != 0 || ::pipe(r) != 0) return h;
    pid_t c = ::fork();
    if (c == 0) {
      ::close(p[1]);
      ::close(r[0]);
      void* a = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
      if (a == MAP_FAILED || ::madvise(a, size, MADV_POPULATE_READ) != 0) ::_exit(2);
      char x = 'r';
      if (::write(r[1], &x, 1) != 1) ::_exit(3);
      (void)!::read(p[0], &x, 1);  // until the parent closes it
      ::_exit(0);
    }
    ::close(p[0]);
    ::close(r[1]);
    char x;
    if (c < 0 || ::read(r[0], &x, 1) != 1) {
      ::close(r[0]);
      ::close(p[1]);
      return h;
    }
    ::close(r[0]);
    h.pid = c;
    h.stop_fd = p[1];
    return h;
  }
  void Stop() {
    if (pid <= 0) return;
    ::close(stop_fd);
    ::waitpid(pid, nullptr, 0);
    pid = -1;
  }
};

// migrate_pages(2) in a child that maps the memfd alone; its time in ns.
Result<int64_t> KernelMigratePages(int fd, uint64_t size, int from, int to) {
  int r[2];
  if (::pipe(r) != 0) return Status::FromErrno(errno, "pipe");
  pid_t c = ::fork();
  if (c < 0) return Status::FromErrno(errno, "fork");
  if (c == 0) {
    ::close(r[0]);
    DropSysNice();
    void* a = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    int64_t ns = -1;
    if (a != MAP_FAILED && ::madvise(a, size, MADV_POPULATE_READ) == 0) {
      unsigned long oldm[16] = {}, newm[16] = {};
      oldm[from / 64] |= 1ul << (from % 64);
      newm[to / 64] |= 1ul << (to % 64);
      uint64_t t0 = NowNs();
      long rc = ::syscall(SYS_migrate_pages, 0, 1024, oldm, newm);
      ns = rc < 0 ? -errno : static_cast<int64_t>(NowNs() - t0);
    }
    (void)!::write(r[1], &ns, sizeof ns);
    ::_exit(0);
  }
  ::close(r[1]);
  int64_t ns = 0;
  ssize_t n = ::read(r[0], &ns, sizeof ns);
  ::close(r[0]);
  ::waitpid(c, nullptr, 0);
  if (n != sizeof ns) return Status(Code::kIo, "migrate_pages child died");
  if (ns < 0) return Status::FromErrno(static_cast<int>(-ns), "migrate_pages");
  return ns;
}

// move_pages(2) with target nodes over the same pages (this process maps them).
Result<int64_t> KernelMovePages(int fd, uint64_t size, uint64_t page, int to, uint64_t* on_target) {
  void* a = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  if (a == MAP_FAILED) return Status::FromErrno(errno, "mmap");
  if (::madvise(a, size, MADV_POPULATE_READ) != 0) {
    ::munmap(a, size);
    return Status::FromErrno(errno, "populate");
  }
  const size_t n = size / page;
  std::vector<void*> pages(n);
  std::vector<int> nodes(n, to), status(n, -1);
  for (size_t i = 0; i < n; ++i) pages[i] = static_cast<char*>(a) + i * page;
  uint64_t t0 = NowNs();
  long rc = ::move_pages(0, n, pages.data(), nodes.data(), status.data(), MPOL_MF_MOVE_ALL);
  int64_t ns = static_cast<int64_t>(NowNs() - t0);
  *on_target = 0;
  for (int s : status) *on_target += s == to ? 1 : 0;
  ::munmap(a, size);
  if (rc < 0) return Status::FromErrno(errno, "move_pages");
  return ns;
}

double Gbps(uint64_t bytes, double ns) { return ns > 0 ? static_cast<double>(bytes) / ns : 0; }

void RunT1(const Options& o, Report* r) {
  const uint64_t size = o.quick ? 32 * kMiB : 512 * kMiB;
  std::vector<int> nodes = NodesWithMemory(2 * size);
  int from = o.node, to = OtherNode(nodes, o.node);
  if (to < 0 || std::find(nodes.begin(), nodes.end(), from) == nodes.end()) {
    r->Skip("T1", "migration throughput",
            "needs two NUMA nodes with " + HumanSize(2 * size) +
                " free (this machine: " + std::to_string(nodes.size()) +
                "); the VM tier runs it (tests/vm, guest/tiering-checks.sh)");
    return;
  }
  if (!tiering::HaveCapSysNice()) {
    r->Skip("T1", "migration throughput", "needs CAP_SYS_NICE (MPOL_MF_MOVE_ALL)");
    return;
  }
  const bool thp = ShmemThpAdvised();
  const uint64_t page = 4096;
  auto migrator = tiering::MakeKernelMigrator();
  std::vector<double> engine_ns, engine_total_ns, mig_ns, mp_ns;
  uint64_t incomplete = 0;
  std::string failure;
  const int reps = o.quick ? 3 : 7;
  for (int rep = 0; rep < reps && failure.empty(); ++rep) {
    // The engine: a lease-like memfd mapped by the daemon's side (the
    // migrator) and a holder process.
    auto fd = MemfdOn(size, from, thp);
    if (!fd.ok()) {
      failure = fd.status().ToString();
      break;
    }
    Holder h = Holder::Start(fd->get(), size);
    tiering::MoveRequest req;
    req.fd = fd->get();
    req.length = size;
    req.page_size = page;
    req.target_node = to;
    req.count_before = false;
    auto m = migrator->Move(req);
    h.Stop();
    if (!m.ok()) {
      failure = m.status().ToString();
      break;
    }
    if (!m->complete()) ++incomplete;
    engine_ns.push_back(static_cast<double>(m->move_ns));
    engine_total_ns.push_back(static_cast<double>(m->map_ns + m->move_ns + m->verify_ns));
    // migrate_pages(2): a fresh memfd that only the child maps.
    auto fd2 = MemfdOn(size, from, thp);
    if (!fd2.ok()) {
      failure = fd2.status().ToString();
      break;
    }
    auto k = KernelMigratePages(fd2->get(), size, from, to);
    if (!k.ok()) {
      failure = k.status().ToString();
      break;
    }
    auto where = migrator->Where(fd2->get(), 0, size, page);
    if (where.ok() && where->On(to) != where->pages) ++incomplete;
    mig_ns.push_back(static_cast<double>(*k));
    // move_pages(2) with targets: the same pages, this process mapping them.
    auto fd3 = MemfdOn(size, from, thp);
    if (!fd3.ok()) {
      failure = fd3.status().ToString();
      break;
    }
    uint64_t on = 0;
    auto mp = KernelMovePages(fd3->get(), size, page, to, &on);
    if (!mp.ok()) {
      failure = mp.status().ToString();
      break;
    }
    if (on != size / page) ++incomplete;
    mp_ns.push_back(static_cast<double>(*mp));
  }
  if (!failure.empty()) {
    r->Skip("T1", "migration throughput", failure);
    return;
  }
  std::string what = HumanSize(size) + " node " + std::to_string(from) + " -> " +
                     std::to_string(to) + (thp ? ", shmem THP" : ", 4 KiB pages");
  Row a;
  a.figure = "T1";
  a.metric = "migration vs migrate_pages(2), " + what;
  a.value = Gbps(size, Median(engine_ns));
  a.baseline = Gbps(size, Median(mig_ns));
  a.unit = "GB/s";
  a.goal_op = "ge";
  a.goal = 1.0;
  a.note =
      "engine: mbind MOVE_ALL of a memfd 2 processes map; kernel: migrate_pages of one "
      "process that alone maps it; medians of " +
      std::to_string(reps) +
      (incomplete ? "; " + std::to_string(incomplete) + " run(s) left pages behind" : "");
  r->Add(a);
  Row b = a;
  b.metric = "migration vs move_pages(2) with targets, " + what;
  b.baseline = Gbps(size, Median(mp_ns));
  b.note = "the same pages, one move_pages call with a node per page";
  r->Add(b);
  Row c = a;
  c.metric = "migration incl. map + verify (move_pages per page) vs migrate_pages(2)";
  c.value = Gbps(size, Median(engine_total_ns));
  c.goal_op = "";
  c.note = "what a move costs the engine end to end, verification included";
  r->Add(c);
}

// ---- T2: a real daemon, a pinned lease, safe points ----

struct PoolPick {
  int fast = -1;
  int slow = -1;
};

PoolPick DramAndCxl(WireClient& w) {
  PoolPick p;
  auto pools = w.GetPools();
  if (!pools.ok()) return p;
  for (const auto& x : pools->pools()) {
    if (x.backing() != "memfd") continue;
    if (x.kind() == "dram" && p.fast < 0) p.fast = x.numa_node();
    if ((x.kind() == "cxl" || x.kind() == "nvm") && p.slow < 0) p.slow = x.numa_node();
  }
  return p;
}

void RunT2(const Options& o, Report* r) {
  if (!o.spawn()) {
    r->Skip("T2", "cooperative pause", "needs a spawned daemon with its own [tiering] settings");
    return;
  }
  testing::UringPin pin;
  if (int e = pin.Open(); e != 0) {
    r->Skip("T2", "cooperative pause", std::string("no io_uring: ") + std::strerror(-e));
    return;
  }
  DaemonConfig cfg;
  cfg.pin = o.pin;
  cfg.extra_toml =
      "[tiering]\ninterval = \"10ms\"\nmin_residency = \"0s\"\nrate_limit_mbps = 0\n"
      "cooperative_deadline = \"10s\"\nmax_pause = \"60s\"\n";
  DaemonProc d;
  if (Status s = d.Start(o.daemon_path, cfg); !s.ok()) {
    r->Skip("T2", "cooperative pause", s.ToString());
    return;
  }
  auto w = WireClient::Connect(d.socket());
  PoolPick pp = w.ok() ? DramAndCxl(*w) : PoolPick{};
  if (pp.fast < 0 || pp.slow < 0) {
    r->Skip("T2", "cooperative pause",
            "needs a DRAM and a CXL memfd pool (this machine has no CXL node); the VM tier "
            "runs it; tiering_live_test prints the same-node floor");
    return;
  }
  const uint64_t size = o.quick ? 8 * kMiB : 64 * kMiB;
  auto client = Client::Connect(d.socket());
  if (!client.ok()) {
    r->Skip("T2", "cooperative pause", client.status().ToString());
    return;
  }
  AllocOptions ao;
  ao.size_bytes = size;
  ao.numa_node = pp.slow;
  ao.strict = true;
  auto lease = client->Allocate(ao);
  if (!lease.ok()) {
    r->Skip("T2", "cooperative pause", lease.status().ToString());
    return;
  }
  if (pin.Register(lease->data(), lease->size()) != 0) {
    r->Skip("T2", "cooperative pause", "IORING_REGISTER_BUFFERS failed");
    return;
  }
  (void)lease->SetMigrationCallback([&](MigrationPhase p) {
    return p == MigrationPhase::kPrepare ? pin.Unregister()
                                         : pin.Register(lease->data(), lease->size());
  });
  Stats pauses;
  const int moves = o.quick ? 6 : 40;
  int done = 0, misplaced = 0;
  for (int i = 0; i < moves; ++i) {
    const bool up = i % 2 == 0;
    (void)lease->Hint(0, size, up ? TierHint::kWillNeed : TierHint::kDontNeed);
    (void)client->FlushSignals();
    uint64_t t0 = NowNs();
    auto pending = [&] {
      auto n = client->MigrationsPending();
      return n.ok() ? *n : 0;
    };
    while (pending() == 0 && NowNs() - t0 < 10'000'000'000ull) {
      ::usleep(500);
    }
    auto n = client->SafePoint();
    if (!n.ok() || *n != 1) break;
    TieringStats st = lease->tiering_stats();
    pauses.Add(static_cast<uint64_t>(st.last_pause_ns));
    auto c = tiering::CountPages(lease->data(), size, 4096);
    if (!c.ok() || c->On(up ? pp.fast : pp.slow) != c->pages) ++misplaced;
    ++done;
  }
  pin.Unregister();
  if (done == 0) {
    r->Skip("T2", "cooperative pause", "no migration was asked within 10 s");
    return;
  }
  // The baseline: an unpinned move of the same bytes between the same nodes.
  auto migrator = tiering::MakeKernelMigrator();
  std::vector<double> base;
  for (int i = 0; i < 5; ++i) {
    auto fd = MemfdOn(size, pp.slow, ShmemThpAdvised());
    if (!fd.ok()) break;
    tiering::MoveRequest req;
    req.fd = fd->get();
    req.length = size;
    req.target_node = pp.fast;
    req.count_before = false;
    auto m = migrator->Move(req);
    if (m.ok()) base.push_back(static_cast<double>(m->move_ns) / 1000);
  }
  std::string what = HumanSize(size) + " between node " + std::to_string(pp.slow) + " (cxl) and " +
                     std::to_string(pp.fast) + " (dram)";
  Row p50;
  p50.figure = "T2";
  p50.metric = "cooperative pause p50, " + what;
  p50.value = pauses.PercentileUs(0.5);
  p50.baseline = Median(base);
  p50.unit = "us";
  p50.note = std::to_string(done) +
             " moves at safe points (io_uring unregister, move, "
             "register); baseline: the same move unpinned" +
             (misplaced ? "; " + std::to_string(misplaced) + " left pages off the target" : "");
  r->Add(p50);
  Row p99 = p50;
  p99.metric = "cooperative pause p99, " + what;
  p99.value = pauses.PercentileUs(0.99);
  r->Add(p99);
}

// ---- T3: the KV-block trace ----

struct TierSpeed {
  double latency_ns = 0;
  double gbps = 0;  // GB/s
  std::string source;
};

// HMAT read latency / bandwidth of `node` as seen from its initiators.
std::optional<TierSpeed> HmatSpeed(int node) {
  std::string base =
      "/sys/devices/system/node/node" + std::to_string(node) + "/access0/initiators/";
  auto lat = ParseU64(ReadFirstLine(base + "read_latency"));
  auto bw = ParseU64(ReadFirstLine(base + "read_bandwidth"));
  if (!lat || !bw || *lat == 0 || *bw == 0) return std::nullopt;
  return TierSpeed{static_cast<double>(*lat), static_cast<double>(*bw) / 1000.0,
                   "HMAT of node " + std::to_string(node)};
}

// A LeaseTable of simulated blocks: each block a lease of one unit.
class SimTable final : public tiering::LeaseTable {
 public:
  SimTable(uint64_t block, uint32_t blocks, uint64_t fast_cap, uint64_t slow_cap)
      : block_(block), on_fast_(blocks, false) {
    pools_[0] = {"node0", 0, "dram", true, fast_cap, fast_cap};
    pools_[1] = {"node1", 1, "cxl", true, slow_cap, slow_cap};
  }
  void Place(uint32_t b, bool fast) {
    on_fast_[b] = fast;
    pools_[fast ? 0 : 1].free_bytes -= block_;
  }
  bool fast(uint32_t b) const { return on_fast_[b]; }
  std::vector<tiering::LeaseFacts> Leases() const override {
    std::vector<tiering::LeaseFacts> v;
    v.reserve(on_fast_.size());
    for (uint32_t b = 0; b < on_fast_.size(); ++b) v.push_back(Facts(b));
    return v;
  }
  std::optional<tiering::LeaseFacts> Find(uint64_t id) const override {
    if (id == 0 || id > on_fast_.size()) return std::nullopt;
    return Facts(static_cast<uint32_t>(id - 1));
  }
  std::vector<tiering::PoolFacts> Pools() const override { return {pools_[0], pools_[1]}; }
  Result<tiering::UnitMemory> OpenUnit(uint64_t, uint32_t) override {
    return tiering::UnitMemory{};
  }
  Status BeginMove(uint64_t id, uint32_t, const std::string& to) override {
    auto& p = pools_[to == "node0" ? 0 : 1];
    if (p.free_bytes < block_) return Status(Code::kResourceExhausted, "full");
    p.free_bytes -= block_;
    moving_[id] = to == "node0";
    return Status::Ok();
  }
  Status CommitMove(uint64_t id, uint32_t) override {
    bool to_fast = moving_.at(id);
    moving_.erase(id);
    pools_[to_fast ? 1 : 0].free_bytes += block_;
    on_fast_[id - 1] = to_fast;
    ++moves;
    return Status::Ok();
  }
  Status AbortMove(uint64_t id, uint32_t, const std::string&) override {
    auto it = moving_.find(id);
    if (it == moving_.end()) return Status::Ok();
    pools_[it->second ? 0 : 1].free_bytes += block_;
    moving_.erase(it);
    return Status::Ok();
  }
  uint64_t moves = 0;

 private:
  tiering::LeaseFacts Facts(uint32_t b) const {
    tiering::LeaseFacts f;
    f.id = b + 1;
    f.size_bytes = block_;
    f.backing = "memfd";
    f.holders = {1};
    tiering::UnitFacts u;
    u.length = block_;
    u.pool = on_fast_[b] ? "node0" : "node1";
    u.numa_node = on_fast_[b] ? 0 : 1;
    f.units.push_back(u);
    f.promote_pool = "node0";
    f.demote_pool = "node1";
    return f;
  }
  uint64_t block_;
  std::vector<bool> on_fast_;
  tiering::PoolFacts pools_[2];
  std::map<uint64_t, bool> moving_;
};

// Moves nothing: the simulation charges the copy's time itself.
class SimMigrator final : public tiering::Migrator {
 public:
  Result<tiering::MoveReport> Move(const tiering::MoveRequest& req) override {
    tiering::MoveReport m;
    m.target_node = req.target_node;
    m.bytes = req.length;
    m.after.pages = req.length / 4096;
    m.after.on_node[req.target_node] = m.after.pages;
    bytes += req.length;
    return m;
  }
  Result<tiering::PageCount> Where(int, uint64_t, uint64_t, uint64_t) override {
    return tiering::PageCount{};
  }
  uint64_t bytes = 0;
};

class NoHolders final : public tiering::HolderChannel {
 public:
  Status Ask(tiering::ConnId, const tiering::MigrationAsk&) override {
    return Status(Code::kUnavailable, "no holders in the simulation");
  }
  void Tell(tiering::ConnId, const tiering::MigrationNotice&) override {}
  void Moved(tiering::ConnId, uint64_t, int, const std::string&) override {}
};

struct TraceResult {
  double seconds = 0;
  uint64_t fast_hits = 0;
  uint64_t accesses = 0;
  uint64_t moved_bytes = 0;
};

struct Trace {
  uint32_t blocks = 512;
  uint64_t block = 2 * kMiB;
  uint64_t access = 256 * kKiB;  // bytes of a block one decode step reads
  uint32_t fast_blocks = 160;    // DRAM holds this many
  uint64_t accesses = 400000;
  uint64_t phase = 40000;  // popularity shifts every this many accesses
  double zipf = 1.1;
  TierSpeed fast, slow;
  double copy_gbps = 0;  // migration copy speed (min of the two)
};

TraceResult RunTrace(const Trace& t, bool engine) {
  SimTable table(t.block, t.blocks, uint64_t{t.fast_blocks} * t.block,
                 uint64_t{t.blocks} * t.block);
  for (uint32_t b = 0; b < t.blocks; ++b) table.Place(b, b < t.fast_blocks);  // first fit
  SimMigrator migrator;
  NoHolders holders;
  FakeClock clock;
  boost::asio::io_context io;
  tiering::TieringOptions opt;
  opt.interval_ns = 10'000'000;    // 10 ms rounds
  opt.half_life_ns = 200'000'000;  // 0.2 s: a few popularity phases per second
  opt.policy.min_residency_ns = 100'000'000;
  opt.rate_limit_bytes_per_s = 4ull << 30;
  std::unique_ptr<tiering::TieringEngine> e;
  if (engine) {
    e = std::make_unique<tiering::TieringEngine>(&table, &migrator, &holders, &clock,
                                                 io.get_executor(), io.get_executor(), opt);
  }
  // Zipf ranks over a permutation that changes every phase.
  std::vector<double> cdf(t.blocks);
  double sum = 0;
  for (uint32_t i = 0; i < t.blocks; ++i) {
    sum += 1.0 / std::pow(static_cast<double>(i + 1), t.zipf);
    cdf[i] = sum;
  }
  std::mt19937_64 rng(42);
  std::uniform_real_distribution<double> u01(0, sum);
  std::vector<uint32_t> perm(t.blocks);
  for (uint32_t i = 0; i < t.blocks; ++i) perm[i] = i;
  TraceResult res;
  double now_ns = 0;
  double next_round = opt.interval_ns;
  std::vector<uint64_t> pending(t.blocks, 0);  // bytes read since the last batch
  uint64_t moved_charged = 0;
  for (uint64_t a = 0; a < t.accesses; ++a) {
    if (a % t.phase == 0) std::shuffle(perm.begin(), perm.end(), rng);
    uint32_t rank =
        static_cast<uint32_t>(std::lower_bound(cdf.begin(), cdf.end(), u01(rng)) - cdf.begin());
    uint32_t b = perm[std::min(rank, t.blocks - 1)];
    const bool fast = table.fast(b);
    const TierSpeed& s = fast ? t.fast : t.slow;
    now_ns += s.latency_ns + static_cast<double>(t.access) / s.gbps;
    res.fast_hits += fast ? 1 : 0;
    ++res.accesses;
    pending[b] += t.access;
    if (engine && now_ns >= next_round) {
      // One batch per round, as the client library's flusher sends it.
      std::vector<tiering::TieringEngine::Signal> batch;
      for (uint32_t i = 0; i < t.blocks; ++i) {
        if (pending[i] == 0) continue;
        batch.push_back({i + 1u, 0, t.block, pending[i], 0, std::nullopt});
        pending[i] = 0;
      }
      clock.AdvanceNs(static_cast<int64_t>(now_ns) - clock.MonotonicNs() + 1'000'000'000);
      (void)e->OnSignals({1, 0, false}, batch);
      e->Tick();
      io.restart();
      io.poll();
      // The copies take memory bandwidth from the workload: charged in full.
      uint64_t fresh = migrator.bytes - moved_charged;
      moved_charged = migrator.bytes;
      now_ns += static_cast<double>(fresh) / t.copy_gbps;
      next_round = now_ns + opt.interval_ns;
    }
  }
  res.seconds = now_ns / 1e9;
  res.moved_bytes = migrator.bytes;
  return res;
}

void RunT3(const Options& o, Report* r) {
  Trace t;
  if (o.quick) t.accesses = 80000, t.phase = 10000;
  // Tier speeds: this machine's HMAT for a DRAM and a CXL node when it has
  // them, else defaults from published CXL 1.1/2.0 expander measurements.
  std::optional<TierSpeed> fast, slow;
  for (int n : NodesWithMemory(0)) {
    struct bitmask* cpus = numa_allocate_cpumask();
    bool has_cpus = numa_node_to_cpus(n, cpus) == 0 && numa_bitmask_weight(cpus) > 0;
    numa_free_cpumask(cpus);
    auto s = HmatSpeed(n);
    if (!s) continue;
    if (has_cpus && !fast) fast = s;
    if (!has_cpus && !slow) slow = s;
  }
  if (fast && slow && fast->gbps > slow->gbps) {
    t.fast = *fast;
    t.slow = *slow;
  } else {
    t.fast = {110, 40, "default DRAM: 110 ns, 40 GB/s per stream"};
    t.slow = {250, 16, "default CXL: 250 ns, 16 GB/s per stream"};
  }
  t.copy_gbps = std::min(t.fast.gbps, t.slow.gbps);
  // Every migration would be logged at info; the figure reports the totals.
  const LogLevel level = GetLogLevel();
  SetLogLevel(LogLevel::kWarning);
  TraceResult stat = RunTrace(t, false);
  TraceResult eng = RunTrace(t, true);
  SetLogLevel(level);
  std::string what = std::to_string(t.blocks) + " blocks of " + HumanSize(t.block) + ", DRAM " +
                     std::to_string(t.fast_blocks) + " blocks, Zipf " +
                     std::to_string(t.zipf).substr(0, 3) + " shifting every " +
                     std::to_string(t.phase) + " accesses";
  Row a;
  a.figure = "T3";
  a.metric = "KV trace time, engine vs first-fit (" + what + ")";
  a.value = eng.seconds * 1000;
  a.baseline = stat.seconds * 1000;
  a.unit = "ms";
  a.goal_op = "le";
  a.goal = 1.0;
  a.note = "modelled tiers (" + t.fast.source + "; " + t.slow.source + "); the real " +
           "TieringEngine and policy with default thresholds, migrations charged at " +
           std::to_string(static_cast<int>(t.copy_gbps)) + " GB/s (" + HumanSize(eng.moved_bytes) +
           " moved)";
  r->Add(a);
  Row b;
  b.figure = "T3";
  b.metric = "share of accesses served from DRAM, engine vs first-fit";
  b.value = 100.0 * static_cast<double>(eng.fast_hits) / static_cast<double>(eng.accesses);
  b.baseline = 100.0 * static_cast<double>(stat.fast_hits) / static_cast<double>(stat.accesses);
  b.unit = "%";
  b.goal_op = "ge";
  b.goal = 1.0;
  b.note = "DRAM holds " + std::to_string(100 * t.fast_blocks / t.blocks) + "% of the blocks";
  r->Add(b);
}

}  // namespace

void RunTier(const Options& o, Report* r) {
  RunT1(o, r);
  RunT2(o, r);
  RunT3(o, r);
}

}  // namespace cxlpool::bench
