// Shared pieces of the stress tests (tests/stress/): a real cxlpoold process
// on a temporary socket (pid tracked, never killall), a blocking protocol
// client over cxlpool_ipc, the daemon's accounting as one snapshot, node and
// process memory counters, and helpers to run code in a forked child (as
// another uid where asked).
//
// Thread safety: none of this is meant to be shared between threads; the
// stress tests fork processes instead. A RawClient is a single-owner value.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "cxlpool.pb.h"
#include "cxlpool/common/status.h"
#include "cxlpool/common/unique_fd.h"
#include "cxlpool/proto/codec.h"
#include "cxlpool/proto/ipc.h"

namespace cxlpool::stress {

inline constexpr uint64_t kKiB = 1ull << 10;
inline constexpr uint64_t kMiB = 1ull << 20;
inline constexpr uid_t kNobody = 65534;

// $CXLPOOL_BINARY_DIR/daemon/cxlpoold (the build tree's daemon).
std::string DaemonBinary();
// Exits 77 (ctest: skipped) with `why` on stderr.
[[noreturn]] void Skip(const std::string& why);
// Exits 77 unless the daemon binary exists and node0's meminfo is readable.
void SkipWithoutDaemon();

// A blocking protocol client. Server pushes (LeaseEvent) are counted and
// dropped. Every wait is bounded by `timeout_ms`.
class RawClient {
 public:
  static Result<RawClient> Connect(const std::string& socket, const std::string& name = "stress",
                                   int timeout_ms = 10000);

  template <typename Req, typename Rep>
  Status Call(const Req& req, Rep* out, std::vector<UniqueFd>* fds_out = nullptr,
              const std::vector<int>& send_fds = {});

  // A private lease (name empty) or a shared one; `fd` gets the lease's fd.
  Result<proto::LeaseInfo> Alloc(uint64_t size, UniqueFd* fd, const std::string& name = "",
                                 const std::vector<uint32_t>& acl_uids = {});
  Result<proto::LeaseInfo> Attach(const std::string& name, UniqueFd* fd);
  Status Release(uint64_t id);

  int fd() const { return sock_.get(); }
  const proto::HelloReply& hello() const { return hello_; }
  uint64_t pushes() const { return pushes_; }

 private:
  UniqueFd sock_;
  uint64_t next_id_ = 1;
  int timeout_ms_ = 10000;
  uint64_t pushes_ = 0;
  proto::HelloReply hello_;
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

// One cxlpoold child process.
class Daemon {
 public:
  Daemon() = default;
  ~Daemon();  // SIGKILL + reap if still running; removes the temp dir
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Makes a temp dir (mode 0755) with cxlpoold.toml = `config`, starts the
  // daemon in the foreground on <dir>/cxlpool.sock and waits (10 s at most)
  // until it answers HELLO.
  Status Start(const std::string& config, const std::vector<std::string>& extra_args = {});
  // Starts again in the same dir with the same config and args.
  Status Restart();
  // SIGTERM; OK if it exited 0.
  Status Stop();
  // SIGKILL and reap.
  void Kill();
  // True if the process is still running (reaps it if it exited).
  bool Alive();

  pid_t pid() const { return pid_; }
  const std::string& socket() const { return socket_; }
  const std::string& dir() const { return dir_; }

 private:
  Status Spawn();
  std::string dir_;
  std::string socket_;
  std::vector<std::string> args_;
  pid_t pid_ = -1;
};

// Sum of `field` (e.g. "Shmem", "MemFree") over every node's
// /sys/devices/system/node/node*/meminfo, in bytes; nullopt if unreadable.
std::optional<uint64_t> NodeMeminfoBytes(const std::string& field);
// A "VmLck:"-style field of /proc/<pid>/status in bytes; nullopt if unreadable.
std::optional<uint64_t> ProcStatusBytes(pid_t pid, const std::string& field);
// Entries in /proc/<pid>/fd; nullopt if it cannot be listed.
std::optional<size_t> CountFds(pid_t pid);

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
  uint64_t id = next_id_++;
  CXLPOOL_RETURN_IF_ERROR(wire::SendMessage(sock_.get(), req, id, send_fds, timeout_ms_));
  for (;;) {
    auto f = wire::RecvFrame(sock_.get(), {}, timeout_ms_);
    if (!f.ok()) return f.status();
    if (f->type() == proto::MSG_LEASE_EVENT) {
      ++pushes_;
      continue;
    }
    if (f->request_id() != id) {
      return Status(Code::kProtocol, "reply for request " + std::to_string(f->request_id()) +
                                         ", expected " + std::to_string(id));
    }
    Status st = wire::DecodeReply(*f, out);
    if (st.ok() && fds_out != nullptr) *fds_out = std::move(f->fds);
    return st;
  }
}

}  // namespace cxlpool::stress
