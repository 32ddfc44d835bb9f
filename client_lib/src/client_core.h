// ClientCore: what stands behind cxlpool::Client (and so behind the C
// ABI's client handle): one session with cxlpoold and the leases granted
// over it.
//
// The session is a Connection (connection.h), guarded by mu_: requests are
// blocking and serialised; the server pushes (LeaseEvent, MigrationEvent)
// that arrive while waiting for a reply, or that ProcessEvents drains, are
// dispatched to the leases (LeaseRegistry) and the tiering state.
//
// Daemon restarts: a core made by Connect(path) reconnects when a call finds
// the connection broken (EOF, EPIPE, ECONNRESET), or when its EventWatcher
// (started with the first lease) sees the daemon go. The Reconnector dials
// with backoff for a bounded time ($CXLPOOL_RECONNECT_TIMEOUT_MS), without
// mu_; then, under mu_, LeaseReturns hands every live lease's fds back
// (RECLAIM) and releases those whose release came while the daemon was
// gone, and the per-lease tiering settings are sent again. The interrupted
// call is retried once. Leases keep their fd and mapping throughout; a
// lease the new daemon rejects is marked revoked and the reason logged.
// ALLOC/ATTACH refused with "daemon restarting" (grace period) are retried
// within the same bound. A release while the daemon is gone does not wait
// for it: the lease is handed back and released by the reconnect.
//
// Threads: the event watcher (EventWatcher) and the tiering flusher; both
// stop on the core's StopSignal and are joined in the destructor.
//
// Locks, in the order they are taken: mu_ (the connection, the reconnect
// in progress, the deferred releases), then the lease registry's, the
// watcher's or tier_mu_ (the tiering queues); flush_mu_ (one signal flush
// at a time) is taken before mu_. mu_ is not held while waiting for the
// daemon to come back.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "connection.h"
#include "cxlpool.pb.h"
#include "cxlpool/client.hpp"
#include "cxlpool/common/status.h"
#include "cxlpool/common/thread_annotations.h"
#include "cxlpool/common/unique_fd.h"
#include "event_watcher.h"
#include "lease_registry.h"
#include "lease_state.h"
#include "reconnector.h"
#include "stop_signal.h"

namespace cxlpool {
namespace detail {

class ClientCore : public std::enable_shared_from_this<ClientCore> {
 public:
  // Connects to a Unix socket path and says hello.
  // Errors: INVALID_ARGUMENT (path too long), NOT_FOUND, PERMISSION_DENIED,
  // UNAVAILABLE, PROTOCOL, IO.
  static Result<std::shared_ptr<ClientCore>> Connect(const std::string& path);
  // Test and activation hook: an already-connected stream socket.
  static Result<std::shared_ptr<ClientCore>> FromSocket(UniqueFd sock, const std::string& peer);
  ~ClientCore();  // stops and joins the watcher and the flusher

  // Sends an AllocRequest (private or named) and maps the reply's fd.
  Result<std::unique_ptr<LeaseState>> Allocate(const proto::AllocRequest& req) EXCLUDES(mu_);
  // The shared lease `name` of `owner_uid` (nullopt: the caller's own uid).
  Result<std::unique_ptr<LeaseState>> Attach(const std::string& name,
                                             std::optional<uint32_t> owner_uid) EXCLUDES(mu_);
  // ReleaseRequest for one lease id. After a reconnect the lease (its `fd`
  // and `size`) is handed back first, so the new daemon can free it. With
  // the daemon gone, OK at once: the reconnect hands it back and releases
  // it (or, if none succeeds, the daemon's restart drops it).
  // `mapping`: the lease's extents (null once revoked: nothing to hand back).
  Status Release(uint64_t lease_id, const ExtentMapping* mapping) EXCLUDES(mu_);
  // Reconnects now (and reclaims every lease), even if the connection looks
  // fine. UNAVAILABLE when the core was not made from a socket path or the
  // daemon did not come back in time.
  Status Reconnect() EXCLUDES(mu_);
  // Non-blocking drain of pushed events; the number handled.
  Result<int> ProcessEvents() EXCLUDES(mu_);
  // MSG_LEASE_MOVED: the holder's census of a lease whose pages it found off
  // their node; the reply carries the daemon's own view.
  Result<proto::LeaseMovedReply> ReportMoved(const proto::LeaseMovedRequest& req) EXCLUDES(mu_);

  uint32_t protocol_version() EXCLUDES(mu_);
  std::string server_version() EXCLUDES(mu_);
  // Times a new connection was made and the leases handed back.
  uint64_t reconnects() const { return reconnects_.load(); }

  void Track(LeaseState* lease);
  void Untrack(LeaseState* lease);

  // ---- tiering (tiering_client.cc; docs/protocol.md, "Tiering") ----
  // Bytes were recorded on a lease: starts the flusher thread on first use
  // and wakes it once $CXLPOOL_SIGNAL_THRESHOLD bytes wait (default 256 MiB);
  // otherwise it sends every $CXLPOOL_SIGNAL_INTERVAL_MS (default 1000).
  void SignalsRecorded(uint64_t bytes) EXCLUDES(tier_mu_);
  // A hint for the next batch; the flusher sends it at once.
  void QueueHint(uint64_t lease_id, uint64_t offset, uint64_t len, int hint) EXCLUDES(tier_mu_);
  // Sends every lease's recorded ranges and the queued hints now. OK when
  // the daemon has no tiering (UNSUPPORTED: signals are off from then on).
  Status FlushSignals() EXCLUDES(mu_, tier_mu_);
  // TIERING_LEASE: pinned to its tier, or this process drops its long-term
  // pins at a safe point. Errors of the daemon (NOT_FOUND, ...).
  Status SetLeaseTiering(uint64_t lease_id, std::optional<bool> pin_tier,
                         std::optional<bool> cooperative_pin) EXCLUDES(mu_);
  // Migrations the daemon asked this process for, not answered yet.
  int MigrationsPending() EXCLUDES(mu_, tier_mu_);
  // Answers them: drops the pins of each lease concerned (CUDA
  // registration, the application's callback), tells the daemon, waits
  // for the move, pins again. The number answered.
  Result<int> SafePoint() EXCLUDES(mu_, tier_mu_);
  uint64_t signal_batches() const { return signal_batches_.load(); }

 private:
  struct PendingMigration {
    proto::MigrationEvent ev;
    std::chrono::steady_clock::time_point deadline;
  };
  ClientCore(UniqueFd sock, const std::string& peer, std::string socket_path);

  // ---- events (the push hook of the connection) ----
  // A server push (LeaseEvent, MigrationEvent) dispatched; false: not a push.
  bool HandlePush(const wire::Frame& frame);
  void HandleEvent(const wire::Frame& frame);
  void HandleMigrationEvent(const wire::Frame& frame) EXCLUDES(tier_mu_);
  EventWatcher::Hooks WatcherHooks();

  // ---- reconnecting ----
  // A fresh connection, hello, RECLAIM of every live lease, the tiering
  // settings, then the deferred releases. `lock` holds mu_ on entry and on
  // return; it is released while dialing (up to the reconnect timeout), so
  // other threads' calls fail fast; one thread dials at a time, and a thread
  // that waited for another's dial takes its connection.
  Status Reestablish(MutexLock& lock) REQUIRES(mu_);
  // After a reconnect, the per-lease tiering settings again.
  void ResendTieringLocked() REQUIRES(mu_);
  // Call, and once more after a reconnect if the connection was lost.
  Result<wire::Frame> CallRecovering(MutexLock& lock, proto::MsgType type,
                                     const std::string& payload) REQUIRES(mu_);
  template <typename Req>
  Result<wire::Frame> CallMessageRecovering(MutexLock& lock, const Req& req) REQUIRES(mu_);

  // ---- granting ----
  // An ALLOC or ATTACH: asked again through the grace period after a
  // restart, the reply mapped, the lease tracked.
  template <typename Req, typename Rep>
  Result<std::unique_ptr<LeaseState>> Grant(const Req& req) EXCLUDES(mu_);
  // Reads the reply's EXTENT_FDS frames, if any, and maps every extent as
  // one range.
  Result<std::unique_ptr<LeaseState>> MapReply(wire::Frame frame) REQUIRES(mu_);
  // A release refused after a reconnect: the lease handed back alone, then
  // released.
  Status ReleaseAfterReconnect(const proto::ReleaseRequest& req, const ExtentMapping& mapping)
      REQUIRES(mu_);

  // ---- tiering (tiering_client.cc) ----
  void StartFlusher();
  void FlushLoop() EXCLUDES(tier_mu_);
  Status SendSignals(const std::vector<proto::RangeSignal>& batch) EXCLUDES(mu_);

  StopSignal stop_;
  const Reconnector reconnector_;
  LeaseRegistry leases_;

  Mutex mu_;
  Connection conn_ GUARDED_BY(mu_);
  bool dialing_ GUARDED_BY(mu_) = false;  // a thread dials, without mu_
  std::condition_variable dialed_;        // dialing_ went false
  LeaseReturns returns_ GUARDED_BY(mu_);
  std::atomic<uint64_t> reconnects_{0};

  // Tiering.
  Mutex tier_mu_;
  std::condition_variable tier_cv_;
  std::vector<proto::RangeSignal> hints_ GUARDED_BY(tier_mu_);
  std::vector<PendingMigration> migrations_ GUARDED_BY(tier_mu_);
  bool flush_now_ GUARDED_BY(tier_mu_) = false;
  Mutex flush_mu_;  // one flush at a time
  std::thread flusher_;
  std::atomic<bool> flusher_started_{false};
  std::atomic<uint64_t> unsent_bytes_{0};
  std::atomic<bool> signals_off_{false};
  std::atomic<uint64_t> signal_batches_{0};

  // Last: its thread reaches every member above through the hooks, and is
  // joined before they go.
  EventWatcher watcher_;
};

// Conversions between the library's internal Status and the public types.
ClientStatus ToClientStatus(const Status& s);
LeaseInfo FromProto(const proto::LeaseInfo& info);
// The default socket path rule (see Client::DefaultSocketPath).
std::string DefaultSocketPath();
// The rule without $CXLPOOL_SOCKET, for a given effective uid.
std::string DefaultSocketPathFor(uid_t euid, const char* xdg_runtime_dir);

}  // namespace detail

// Lets the C ABI and tests build public objects around a core.
struct ClientAccess {
  static Client Wrap(std::shared_ptr<detail::ClientCore> core) { return Client(std::move(core)); }
  static const std::shared_ptr<detail::ClientCore>& Core(const Client& c) { return c.core_; }
  static detail::LeaseState* State(const Lease& l) { return l.state_.get(); }
};

}  // namespace cxlpool
