// Reconnector: how a core made from a socket path finds its daemon again
// after a restart. Dial connects and says hello, retrying with backoff for
// up to $CXLPOOL_RECONNECT_TIMEOUT_MS (default 60000); it runs without the
// connection lock, so other threads' calls fail fast (a release is
// deferred) instead of waiting for the daemon.
//
// LeaseReturns: what a fresh connection is handed back. After a reconnect
// every live lease goes back to the daemon (RECLAIM, batched by the
// daemon's per-frame fd limit), then the releases deferred while the
// daemon was gone are handed back and released.
//
// Thread safety: a Reconnector is immutable once made and safe from any
// thread. LeaseReturns has no lock of its own: ClientCore keeps it under
// its connection lock, as the Connection it works on.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "connection.h"
#include "cxlpool/client.hpp"
#include "cxlpool/common/status.h"
#include "cxlpool/common/unique_fd.h"
#include "extent_mapping.h"
#include "stop_signal.h"

namespace cxlpool::detail {

class LeaseRegistry;

// The longest backoff between two tries (reconnects, grace-period retries).
inline constexpr int kMaxBackoffMs = 1000;

// The daemon is in its post-restart grace period: try again shortly.
bool DaemonRestarting(const Status& s);

class Reconnector {
 public:
  // `socket_path` empty: the core cannot reconnect (FromSocket).
  Reconnector(std::string socket_path, const StopSignal& stop)
      : path_(std::move(socket_path)), stop_(stop) {}

  bool enabled() const { return !path_.empty(); }
  const std::string& path() const { return path_; }
  // $CXLPOOL_RECONNECT_TIMEOUT_MS, read at each use.
  static int TimeoutMs();
  // The end of a retry window that starts now.
  static std::chrono::steady_clock::time_point Deadline();

  struct Dialed {
    UniqueFd sock;
    proto::HelloReply hello;
  };
  // A fresh connection that said hello (request `hello_id`). UNAVAILABLE
  // when the daemon did not come back in time ("did not come back within")
  // or the core is closing.
  Result<Dialed> Dial(uint64_t hello_id) const;

 private:
  const std::string path_;
  const StopSignal& stop_;
};

// Connects to a Unix socket path. INVALID_ARGUMENT (path empty or too
// long), NOT_FOUND, UNAVAILABLE, PERMISSION_DENIED, IO.
Result<UniqueFd> ConnectSocket(const std::string& path);

// What a RECLAIM hands back of one lease: dups of its extents' fds, in
// mapping order, and their sizes (one extent: the lease's size).
struct HandBack {
  uint64_t size = 0;
  std::vector<UniqueFd> fds;
  std::vector<uint64_t> extent_sizes;
  // Dups of every extent's fd of `m`. IO-like errors from fcntl.
  static Result<HandBack> Of(const ExtentMapping& m);
};

class LeaseReturns {
 public:
  // RECLAIM of every live, unrevoked lease of `leases` on `conn`; the
  // leases the daemon rejects are marked revoked (the reason logged).
  Status ReclaimAll(Connection& conn, const LeaseRegistry& leases);
  // One lease handed back alone; true if the daemon took it.
  static Result<bool> ReclaimOne(Connection& conn, uint64_t lease_id, const HandBack& back);
  // A release the daemon could not be told of because it was gone: the
  // next reconnect hands the lease back and releases it.
  Status Defer(uint64_t lease_id, const ExtentMapping& mapping);
  // The deferred releases, handed back and released on `conn`.
  Status FlushDeferred(Connection& conn);
  // The reconnect gave up (`why`): nobody to hand them back to.
  void DropDeferred(const Status& why);

 private:
  struct DeferredRelease {
    uint64_t lease_id = 0;
    HandBack back;  // dups of the lease's extents' fds
  };
  std::vector<DeferredRelease> deferred_;
};

}  // namespace cxlpool::detail
