// The shared test-support library (cxlpool_test_support) of the tests that
// run real daemons (tests/integration, tests/tenants, tests/restart,
// tests/stress): a real cxlpoold process on a temporary socket (pid tracked,
// never killall), a blocking protocol client over cxlpool_ipc, the daemon's
// accounting as one snapshot, node and process memory counters, helpers to
// run code in a forked child (as another uid where asked), bounded polls,
// temp dirs and shell commands. kill_loop.h adds the pieces of the daemon
// SIGKILL+restart loops.
//
// Thread safety: none of this is meant to be shared between threads; the
// tests fork processes instead. A RawClient and a Daemon are single-owner
// values.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cxlpool.pb.h"
#include "cxlpool/common/status.h"
#include "cxlpool/common/unique_fd.h"
#include "cxlpool/proto/blocking_client.h"
#include "cxlpool/proto/codec.h"
#include "cxlpool/proto/ipc.h"

namespace cxlpool::testsupport {

inline constexpr uint64_t kKiB = 1ull << 10;
inline constexpr uint64_t kMiB = 1ull << 20;
inline constexpr uid_t kNobody = 65534;

// $CXLPOOL_BINARY_DIR/daemon/cxlpoold (the build tree's daemon).
std::string DaemonBinary();
// $CXLPOOL_BINARY_DIR/tools/cxlpoolctl (the build tree's admin CLI).
std::string CtlBinary();
// Exits 77 (ctest: skipped) with `why` on stderr.
[[noreturn]] void Skip(const std::string& why);
// Exits 77 unless the daemon binary exists and node0's meminfo is readable.
void SkipWithoutDaemon();
// True when running as root (tests that switch uids need it).
bool IsRoot();

// A blocking protocol client: wire::BlockingClient (proto/blocking_client.h)
// under the API the tests use. Server pushes (LeaseEvent) that arrive while
// a call waits for its reply are counted and kept aside for NextEvent().
// Every wait is bounded by `timeout_ms`. A default-constructed (or
// reassigned) RawClient holds no connection: assigning RawClient() closes.
class RawClient {
 public:
  RawClient() = default;
  static Result<RawClient> Connect(const std::string& socket, const std::string& name = "stress",
                                   int timeout_ms = 10000);
  // HELLO over a socket that is already connected (e.g. to a listener that
  // hands the connection on, as systemd-socket-activate does).
  static Result<RawClient> Handshake(UniqueFd sock, const std::string& name = "stress",
                                     int timeout_ms = 10000);

  // A lease reply's `fds_out` holds one fd per extent, in order.
  template <typename Req, typename Rep>
  Status Call(const Req& req, Rep* out, std::vector<UniqueFd>* fds_out = nullptr,
              const std::vector<int>& send_fds = {});

  // A private lease (name empty) or a shared one; `fd` gets the lease's fd
  // (PROTOCOL for a lease of several extents).
  Result<proto::LeaseInfo> Alloc(uint64_t size, UniqueFd* fd, const std::string& name = "",
                                 const std::vector<uint32_t>& acl_uids = {});
  // The shared lease `name` of `owner_uid` (nullopt: the caller's own uid).
  Result<proto::LeaseInfo> Attach(const std::string& name, UniqueFd* fd,
                                  std::optional<uint32_t> owner_uid = std::nullopt);
  Status Release(uint64_t id);

  // The next server push: one kept aside by an earlier call, else the next
  // frame read from the socket (bounded by the client's timeout).
  Result<proto::LeaseEvent> NextEvent();

  int fd() const { return c_ ? c_->fd() : -1; }
  const proto::HelloReply& hello() const { return c_ ? c_->hello() : kNoHello; }
  bool is_admin() const { return hello().is_admin(); }
  uint64_t pushes() const { return c_ ? c_->pushes() : 0; }

 private:
  static const proto::HelloReply kNoHello;
  static Status NotConnected() { return Status(Code::kUnavailable, "RawClient: not connected"); }
  std::optional<wire::BlockingClient> c_;
};

// The daemon's accounting, from one admin connection: every lease
// (ListLeases all), the Stats counters and gauges, the pools and the quotas.
struct Accounting {
  std::map<uint64_t, proto::LeaseInfo> leases;
  std::map<std::string, uint64_t> counters;
  std::map<std::string, uint64_t> gauges;
  std::vector<proto::PoolInfo> pools;
  std::vector<proto::Quota> quotas;

  uint64_t Gauge(const std::string& k) const;
  uint64_t Counter(const std::string& k) const;
  // Sum of size_bytes over `leases`.
  uint64_t LeaseBytes() const;
  // Invariants that hold within each reply, even under load: no pool uses
  // more than its capacity (leased + being built + warm + reclaiming), the gauges' totals
  // neither, and no quota rule is above its limit. Empty when none is broken.
  std::string Overcommit() const;
  // Overcommit() plus agreement between the replies (lease list, gauges,
  // pools); only meaningful while no client is active.
  std::string Inconsistencies() const;
};
Result<Accounting> ReadAccounting(RawClient& admin);

// One cxlpoold child process in its own temp dir.
class Daemon {
 public:
  Daemon() = default;
  ~Daemon();  // SIGKILL + reap if still running; removes the temp dir and all in it
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Makes the temp dir (mode 0755) if there is none yet, so that a config
  // can name paths inside it (dir()) before Start.
  Status MakeDir();
  // MakeDir, writes cxlpoold.toml = `config`, starts the daemon in the
  // foreground on <dir>/cxlpool.sock and waits (10 s at most) until it
  // answers HELLO.
  Status Start(const std::string& config, const std::vector<std::string>& extra_args = {});
  // Starts again in the same dir with the same config file and args;
  // SIGKILLs the running one first, if any.
  Status Restart();
  // Rewrites <dir>/cxlpoold.toml (e.g. before a SIGHUP).
  Status WriteConfig(const std::string& config);
  // SIGTERM; OK if it exited 0.
  Status Stop();
  // SIGKILL and reap.
  void Kill();
  // True if the process is still running (reaps it if it exited).
  bool Alive();
  // True while a started process has not been stopped, killed or reaped
  // (does not look at the process).
  bool started() const { return pid_ > 0; }

  // When set before Start, the daemon runs as `prefix... cxlpoold args...`
  // (prefix[0] looked up in $PATH), e.g. NetnsHost::Prefix(); the prefix
  // must exec the daemon in its own process, so pid() stays the daemon's.
  void set_exec_prefix(std::vector<std::string> prefix) { prefix_ = std::move(prefix); }
  // When set before Start, the daemon's stderr is appended to log_path().
  void set_log_to_file(bool on) { log_to_file_ = on; }
  std::string log_path() const { return dir_ + "/cxlpoold.log"; }
  // What the daemon logged so far (log_to_file only; empty otherwise).
  std::string Log() const;

  pid_t pid() const { return pid_; }
  const std::string& socket() const { return socket_; }
  const std::string& dir() const { return dir_; }
  std::string config_path() const { return dir_ + "/cxlpoold.toml"; }

 private:
  Status Spawn();
  std::string dir_;
  std::string socket_;
  std::vector<std::string> args_;
  std::vector<std::string> prefix_;
  bool log_to_file_ = false;
  pid_t pid_ = -1;
};

// A temp dir (/tmp/cxlpool-<tag>-XXXXXX), removed with everything in it at
// destruction. `path` is empty if it could not be made.
struct TempDir {
  explicit TempDir(const std::string& tag = "test");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string path;
};

// The whole content of a file; empty if it cannot be read.
std::string ReadFileOrEmpty(const std::string& path);

// Runs `cmd` with /bin/sh; returns its exit code (-1 if it did not exit)
// and its stdout (add 2>&1 to the command for stderr too).
std::pair<int, std::string> RunShell(const std::string& cmd);

// Sum of `field` (e.g. "Shmem", "MemFree") over every node's
// /sys/devices/system/node/node*/meminfo, in bytes; nullopt if unreadable.
std::optional<uint64_t> NodeMeminfoBytes(const std::string& field);
// A "VmLck:"-style field of /proc/<pid>/status in bytes; nullopt if unreadable.
std::optional<uint64_t> ProcStatusBytes(pid_t pid, const std::string& field);
// Entries in /proc/<pid>/fd; nullopt if it cannot be listed.
std::optional<size_t> CountFds(pid_t pid);
// Each thread of `pid` on one line, "tid comm state wchan" (from
// /proc/<pid>/task/<tid>/{stat,wchan}): where a stalled process waits.
std::string ThreadStates(pid_t pid);

// Forks; the child switches to `uid` (gid = uid) when given, runs `fn` and
// _exits with its value. Returns the exit code, or 128 + signal.
int RunInChild(const std::function<int()>& fn, std::optional<uid_t> uid = std::nullopt);
// Switches the calling process to uid/gid `uid` (drops supplementary groups).
bool BecomeUid(uid_t uid);

// A polled wait: calls `done` every `step_ms` until it returns true or
// `limit_ms` passes. No fixed sleeps in the tests, only bounded polls.
bool PollUntil(const std::function<bool()>& done, int limit_ms = 10000, int step_ms = 2);

// Monotonic microseconds.
uint64_t NowMicros();

template <typename Req, typename Rep>
Status RawClient::Call(const Req& req, Rep* out, std::vector<UniqueFd>* fds_out,
                       const std::vector<int>& send_fds) {
  if (!c_) return NotConnected();
  return c_->Call(req, out, fds_out, send_fds);
}

}  // namespace cxlpool::testsupport
