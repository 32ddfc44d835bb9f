// bench.h: the shared pieces of cxlpool-bench, the benchmark harness of
// issue 5 (P1..P6). Every figure is measured next to its baseline in the same
// run and reported as a ratio against a goal (docs/benchmarks.md).
//
//   * Options / Report / Row: what to run and what came out (table or JSON).
//   * Stats: percentiles over latency samples.
//   * DaemonProc: a cxlpoold the bench spawns on a temp socket with a temp
//     config (a ChildProc: pid tracked, SIGTERM then SIGKILL at exit,
//     PR_SET_PDEATHSIG).
//   * WireClient: the grant path without the client library's mapping, over
//     the shared blocking client (wire::BlockingClient).
//   * BareServer / BareClient: the baseline, a trivial AF_UNIX stream server
//     in its own process that answers each request with one memfd fd.
//
// Errors are values (Status / Result); nothing here throws.
//
// Thread safety: none of these types is shared between threads. The bench is
// single-threaded; it forks client processes only while no other thread runs.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "child_proc.h"
#include "cxlpool.pb.h"
#include "cxlpool/common/status.h"
#include "cxlpool/common/unique_fd.h"
#include "cxlpool/proto/blocking_client.h"
#include "pool/backing.h"

namespace cxlpool::bench {

constexpr uint64_t kKiB = 1ull << 10;
constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kGiB = 1ull << 30;

struct Options {
  std::vector<std::string> only;  // empty: all of P1..P7
  bool quick = false;
  bool json = false;
  int node = 0;
  std::string daemon_path;  // cxlpoold to spawn
  std::string socket;       // use a running daemon instead
  std::string command_line;
  // Spawned daemons pin (mlock) leases; off when we may not lock memory
  // (not root and RLIMIT_MEMLOCK below 2 GiB), noted in the report.
  bool pin = true;
  // The any-size mixes (P2any, P2_4k, P2cold): largest request and number of
  // requests; 0 means the figure's default (2 GiB and 200; --quick 256 MiB
  // and 24).
  uint64_t max_size = 0;
  int mix_count = 0;

  bool Wants(const std::string& p) const;
  bool spawn() const { return socket.empty(); }
};

// One measured figure next to its baseline.
struct Row {
  std::string figure;   // "P1"
  std::string metric;   // "grant 2 MiB warm p50"
  double value = 0;     // cxlpool
  double baseline = 0;  // the baseline measured in the same run
  std::string unit;     // "us", "ms", "GB/s", "ops/s", "x", "KiB"
  // "le": ratio <= goal is good, "ge": ratio >= goal, "": informational.
  std::string goal_op;
  double goal = 0;
  std::string note;
  bool skipped = false;  // value/baseline meaningless; note says why

  double Ratio() const { return baseline > 0 ? value / baseline : 0; }
  // "met", "NOT met", "info" or "skipped".
  std::string Verdict() const;
};

// A measured row; an empty `goal_op` makes it informational.
Row MeasuredRow(const std::string& figure, const std::string& metric, double value, double baseline,
                const std::string& unit, const std::string& goal_op = "", double goal = 0,
                const std::string& note = "");

struct Report {
  std::vector<Row> rows;
  std::vector<std::string> notes;  // machine facts, limits met on the way
  void Add(Row r) { rows.push_back(std::move(r)); }
  void Skip(const std::string& figure, const std::string& metric, const std::string& why);
  std::string Table() const;
  std::string Json(const Options& o) const;  // one JSON document
};

// Latency samples in nanoseconds.
class Stats {
 public:
  void Add(uint64_t ns) { v_.push_back(ns); }
  void Merge(const Stats& o) {
    v_.insert(v_.end(), o.v_.begin(), o.v_.end());
    sorted_ = false;
  }
  size_t size() const { return v_.size(); }
  // Nearest-rank percentile (q in [0,1]) in microseconds; 0 when empty.
  double PercentileUs(double q) const;
  double MedianUs() const { return PercentileUs(0.5); }

 private:
  mutable std::vector<uint64_t> v_;
  mutable bool sorted_ = false;
};

uint64_t NowNs();  // CLOCK_MONOTONIC, comparable across processes

// ---- the daemon under test ----

struct DaemonConfig {
  bool thp = true;
  bool hugetlb = false;
  bool pin = true;
  std::string capacity = "90%";
  // The pool's warm reserve in bytes, for the figures that measure a warm or
  // an exhausted reserve (P1u, P2any, P2_4k, P2cold, recycled, P5). How it
  // reaches the daemon's config is ReserveToml (daemon_proc.cc), the one place
  // that knows the daemon's reserve keys. 0: no reserve (P2cold).
  uint64_t reserve_bytes = 0;
  int workers = 2;
  std::string extra_toml;  // appended to the config (e.g. a [tiering] table)
};

class DaemonProc {
 public:
  DaemonProc() = default;
  ~DaemonProc();  // Stop()
  DaemonProc(const DaemonProc&) = delete;
  DaemonProc& operator=(const DaemonProc&) = delete;

  // Writes the config into a fresh temp dir, starts `binary --config F
  // --socket S --foreground`, waits until it accepts and its warm reserve is
  // built. UNAVAILABLE (did not come up; its log tail is in the message), IO.
  Status Start(const std::string& binary, const DaemonConfig& cfg);
  // SIGKILL (a crash): the temp dir, its state directory and socket path
  // stay for Restart.
  void Kill();
  // Starts the daemon again in the same dir (config rewritten from `cfg`),
  // as Start waits for it.
  Status Restart(const std::string& binary, const DaemonConfig& cfg);
  // SIGTERM, wait up to 10 s, then SIGKILL; removes the temp dir.
  void Stop();
  pid_t pid() const { return child_.pid(); }
  const std::string& socket() const { return socket_; }
  std::string LogTail() const;

 private:
  // Writes the config, forks and execs the daemon in child_'s dir, waits.
  Status Launch(const std::string& binary, const DaemonConfig& cfg);

  ChildProc child_{10000};
  std::string socket_;
};

// ---- a blocking protocol client ----

class WireClient {
 public:
  static Result<WireClient> Connect(const std::string& socket_path);

  // ALLOC; the lease fd is closed unless `fd` is given (the daemon keeps the
  // lease alive for this connection either way). A lease of several extents
  // is refused with PROTOCOL when `fd` is given.
  Result<proto::LeaseInfo> Alloc(uint64_t size, int node, bool hugetlb = false,
                                 UniqueFd* fd = nullptr);
  Status Release(uint64_t id);
  Result<proto::StatsReply> GetStats();
  Result<proto::PoolsReply> GetPools();
  // Waits (polling STATS) until no backing is being built (the warm reserve ready)
  // and no released lease is still being reclaimed.
  Status WaitIdle(int timeout_ms = 120000);
  int fd() const { return client_.fd(); }
  // Whether the daemon's event loop (its main thread) last ran on the CPU
  // this thread is on now: /proc/<daemon>/stat's processor against
  // sched_getcpu(). Read after a sample, outside its timing; nullopt when
  // either is unknown (no peer pid, /proc unreadable).
  std::optional<bool> LoopOnMyCpu() const;

 private:
  explicit WireClient(wire::BlockingClient c) : client_(std::move(c)) {}
  wire::BlockingClient client_;  // proto/blocking_client.h
};

// ---- the baseline: a bare fd-passing AF_UNIX server ----

// Requests are 16 bytes {u32 op, u32 0, u64 id}; op 1 is answered with 16
// bytes and one fd (a 4 KiB memfd, the same one every time: the kernel
// installs a new descriptor in the receiver), op 2 with 16 bytes and no fd.
// One epoll thread in its own process, like the daemon's single event loop.
//
// With a MemfdSpec, op 1 instead builds a new memfd with the daemon's own
// CreateMemfdBacking (bound, prefaulted, pinned, sealed) and op 2 reclaims
// the connection's oldest one (truncate, unmap, close): the kernel work of a
// cold grant and its release, with no protocol, journal or threads around
// it. P3 reports it as the floor under the daemon's throughput.
// The spec a floor server builds its memfds with: `size` bytes bound to
// `node`, pinned if `pin`, THP if `thp`, named `name` (the daemon's own
// settings for the figure it is the floor of).
MemfdSpec FloorSpec(uint64_t size, int node, bool pin, bool thp, const char* name);

class BareServer {
 public:
  BareServer() = default;
  ~BareServer();
  BareServer(const BareServer&) = delete;
  BareServer& operator=(const BareServer&) = delete;
  // Forks; returns once the socket accepts.
  Status Start(std::optional<MemfdSpec> build = std::nullopt);
  // The P1u floor: op 1 hands over one memfd built (bound, prefaulted,
  // pinned, sealed) before the first request, the same file every time, so a
  // grant costs the round trip and the client's mapping only.
  Status StartPrebuilt(const MemfdSpec& spec);
  void Stop();
  const std::string& socket() const { return socket_; }

 private:
  Status Fork(std::optional<MemfdSpec> build, bool prebuilt);
  ChildProc child_{2000};
  std::string socket_;
};

class BareClient {
 public:
  static Result<BareClient> Connect(const std::string& socket_path);
  // One round trip that brings back an fd (closed at once), the shape of a
  // grant. IO/PROTOCOL on failure.
  Status GrantRoundTrip();
  // The same round trip, keeping the fd it brings back.
  Result<UniqueFd> GrantFd();
  // One round trip without fd, the shape of a release.
  Status ReleaseRoundTrip();
  // Whether the last reply was sent on the CPU it was received on (the
  // server puts its sched_getcpu() in the reply). A pair sharing one CPU
  // wakes each other without an inter-processor interrupt, which in a VM
  // makes its round trip several times faster; nullopt when unknown.
  std::optional<bool> last_same_cpu() const;

 private:
  Status RoundTrip(uint32_t op, bool expect_fd, UniqueFd* keep = nullptr);
  UniqueFd sock_;
  uint64_t next_id_ = 1;
  int last_server_cpu_ = -1;
  int last_client_cpu_ = -1;
};

// ---- node facts ----

// /sys/devices/system/node/node<N>/meminfo, in bytes ("Shmem", "MemUsed").
Result<std::map<std::string, uint64_t>> NodeMeminfo(int node);
// /proc/<pid>/status fields in bytes ("VmRSS", "RssAnon", "RssShmem", ...).
Result<std::map<std::string, uint64_t>> ProcStatus(pid_t pid);
// One field of such a map, signed for deltas; 0 when absent.
int64_t Field(const std::map<std::string, uint64_t>& m, const std::string& k);
double MiB(int64_t bytes);  // bytes as MiB
// Sum of a smaps field (kB -> bytes) over the mappings overlapping [addr,
// addr+len) of this process.
Result<uint64_t> SmapsField(const void* addr, uint64_t len, const std::string& field);
std::string ReadFirstLine(const std::string& path);  // "" if unreadable
// mbind(MPOL_BIND) of [p, p+len) to `node`.
Status BindToNode(void* p, uint64_t len, int node);
// MADV_POPULATE_WRITE, else a write to every `page`.
void PopulateWrite(void* p, uint64_t len, uint64_t page);
// The page kinds the figures compare with the same kind on both sides.
enum class Pages { k4K, kThp, kHugetlb };
const char* PagesName(Pages p);  // "4k", "thp", "hugetlb"
// A STATS counter, 0 when the daemon does not have it.
uint64_t CounterOf(const proto::StatsReply& s, const std::string& k);
// The baseline of the "ready" figures, the client doing it alone: anonymous
// mmap (MAP_HUGETLB for hugetlb, `size` rounded up to 2 MiB) of `size`, mbind to `node`,
// MADV_HUGEPAGE or MADV_NOHUGEPAGE, MADV_POPULATE_WRITE; unmapped afterwards. Its ns.
Result<uint64_t> PopulateYourselfNs(uint64_t size, int node, Pages pages);
// Whether memfds (shmem) may get transparent huge pages: shmem_enabled is
// advise, always, within_size or force.
bool ShmemThpAllowed();
// Free 2 MiB hugepages of `node` (0 when unreadable).
uint64_t FreeHugepages(int node);
// Per-node meminfo counters are per-CPU deltas folded every
// vm.stat_interval seconds: sleeps two intervals so they have caught up.
void SettleVmstat();
std::string HumanSize(uint64_t bytes);  // "2 MiB", "1 GiB", "4100 KiB"

// ---- the figures ----

void RunP1(const Options& o, Report* r);
void RunP2(const Options& o, Report* r);
void RunP3(const Options& o, Report* r);
void RunP4(const Options& o, Report* r);
void RunP5(const Options& o, Report* r);
void RunP6(const Options& o, Report* r);
void RunP7(const Options& o, Report* r);  // pinned committed bytes (p7_pinned.cc)
// Issue 18's extent measurements (extents.cc): per-granule build, map and
// fd-passing costs, and scrubbing against memset.
void RunLadder(const Options& o, Report* r);
void RunRecycle(const Options& o, Report* r);
// Issue 18's figures through the daemon (mix.cc): P2any / P2_4k / P2cold,
// any-size leases ready in the client against populating them yourself, with
// the reserve warm (THP, then 4 KiB pages) and exhausted; P1u, cxlpool_alloc
// of 2 MiB against a bare server's prebuilt memfd; recycled, a released
// lease's memory back in the reserve against a memset of it.
void RunP2Any(const Options& o, Report* r);
void RunP2Small(const Options& o, Report* r);
void RunP2Cold(const Options& o, Report* r);
void RunP1u(const Options& o, Report* r);
void RunRecycled(const Options& o, Report* r);
// Tiering (tiering.cc): T1 migration throughput against the kernel's own
// migrate_pages/move_pages of the same memory, T2 the cooperative pause,
// T3 a KV-block trace with shifting Zipf popularity, engine vs first-fit.
void RunTier(const Options& o, Report* r);
// The cluster layer (cluster.cc), each on a real 3-member etcd with TLS: C1,
// a slice claim's p99 at 200 claims/s from 4 hosts against a plain etcd
// transaction; C2, P1u's cxlpool_alloc with the cluster on against off; C3,
// a dead host's slices quarantined, then free after a restart or a fence.
void RunC1(const Options& o, Report* r);
void RunC2(const Options& o, Report* r);
void RunC3(const Options& o, Report* r);
// C4 (elasticity.cc): the shared capacity a committed demand trace of 4 hosts
// needs at zero failed allocations against static per-host partitions.
void RunC4(const Options& o, Report* r);
// Remote access on the UCX seam (remote.cc): R1 checked write/read
// bandwidth and R2 4 KiB read p50 against ucx_perftest on the same
// transport (R3, a remote lease's setup, waits for the daemons to lend).
void RunRemote(const Options& o, Report* r);

// The socket to talk to for a phase: the running daemon's, or a daemon the
// phase spawns with `cfg` (kept in *owned). Errors are reported by the caller.
Result<std::string> PhaseSocket(const Options& o, const DaemonConfig& cfg, DaemonProc* owned);

}  // namespace cxlpool::bench
