// ClientCore and LeaseState: what stands behind cxlpool::Client and
// cxlpool::Lease (and so behind the C ABI's handles).
//
// ClientCore owns the connection: the socket, the frame reader, request ids
// and the hello outcome. Requests are blocking and serialised by one mutex;
// server pushes (LeaseEvent) that arrive while waiting for a reply, or that
// ProcessEvents drains, mark the affected leases revoked.
//
// Daemon restarts: a core made by Connect(path) reconnects when a call finds
// the connection broken (EOF, EPIPE, ECONNRESET), or when its watcher thread
// (one per core, started with the first lease, stopped in the destructor)
// sees the daemon go. Reconnecting retries with backoff for a bounded time
// ($CXLPOOL_RECONNECT_TIMEOUT_MS, default 60000), says hello, and hands every
// live lease's fd back (RECLAIM); the interrupted call is then retried once.
// Leases keep their fd and mapping throughout. A lease the new daemon
// rejects is marked revoked and the reason logged. ALLOC/ATTACH refused
// with "daemon restarting" (grace period) are retried within the same bound.
//
// LeaseState owns a lease's fds and mapping (ExtentMapping) and its CUDA
// registration, independent of the connection: it holds a shared_ptr to the
// core only to send the release request, so the mapping survives a broken
// connection (and a later reconnect can hand the fd back to the daemon).
//
// A release while the daemon is gone does not wait for it: the lease is
// handed back and released by the reconnect.
//
// Thread safety: ClientCore is safe to use from several threads (mu_ guards
// the connection, leases_mu_ the registry of live leases; leases_mu_ is never
// held while taking mu_; reconnect_mu_ is taken before mu_, and mu_ is not
// held while waiting for the daemon to come back). A LeaseState is single-owner; only `revoked` is
// touched by other threads.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "cuda_driver.h"
#include "cxlpool.pb.h"
#include "cxlpool/client.hpp"
#include "cxlpool/common/status.h"
#include "cxlpool/common/unique_fd.h"
#include "cxlpool/proto/codec.h"
#include "cxlpool/proto/ipc.h"
#include "extent_mapping.h"
#include "signals.h"

namespace cxlpool {
namespace detail {

class LeaseState;

// The largest request an older daemon reads (its limits.max_request_bytes),
// when its HELLO reply does not say.
inline constexpr uint64_t kDaemonRequestBytes = 64u << 10;

// What a RECLAIM hands back of one lease: dups of its extents' fds, in
// mapping order, and their sizes (one extent: the lease's size).
struct HandBack {
  uint64_t size = 0;
  std::vector<UniqueFd> fds;
  std::vector<uint64_t> extent_sizes;
  // Dups of every extent's fd of `m`. IO-like errors from fcntl.
  static Result<HandBack> Of(const ExtentMapping& m);
};

class ClientCore : public std::enable_shared_from_this<ClientCore> {
 public:
  // Connects to a Unix socket path and says hello.
  // Errors: INVALID_ARGUMENT (path too long), NOT_FOUND, PERMISSION_DENIED,
  // UNAVAILABLE, PROTOCOL, IO.
  static Result<std::shared_ptr<ClientCore>> Connect(const std::string& path);
  // Test and activation hook: an already-connected stream socket.
  static Result<std::shared_ptr<ClientCore>> FromSocket(UniqueFd sock, const std::string& peer);
  ~ClientCore();  // stops the watcher thread

  // Sends an AllocRequest (private or named) and maps the reply's fd.
  Result<std::unique_ptr<LeaseState>> Allocate(const proto::AllocRequest& req);
  // The shared lease `name` of `owner_uid` (nullopt: the caller's own uid).
  Result<std::unique_ptr<LeaseState>> Attach(const std::string& name,
                                             std::optional<uint32_t> owner_uid);
  // ReleaseRequest for one lease id. After a reconnect the lease (its `fd`
  // and `size`) is handed back first, so the new daemon can free it. With
  // the daemon gone, OK at once: the reconnect hands it back and releases
  // it (or, if none succeeds, the daemon's restart drops it).
  // `mapping`: the lease's extents (null once revoked: nothing to hand back).
  Status Release(uint64_t lease_id, const ExtentMapping* mapping);
  // Reconnects now (and reclaims every lease), even if the connection looks
  // fine. UNAVAILABLE when the core was not made from a socket path or the
  // daemon did not come back in time.
  Status Reconnect();
  // Non-blocking drain of pushed events; the number handled.
  Result<int> ProcessEvents();
  // MSG_LEASE_MOVED: the holder's census of a lease whose pages it found off
  // their node; the reply carries the daemon's own view.
  Result<proto::LeaseMovedReply> ReportMoved(const proto::LeaseMovedRequest& req);

  uint32_t protocol_version() const { return version_; }
  const std::string& server_version() const { return server_version_; }
  // Times a new connection was made and the leases handed back.
  uint64_t reconnects() const { return reconnects_.load(); }

  void Track(LeaseState* lease);
  void Untrack(LeaseState* lease);

  // ---- tiering (tiering_client.cc; docs/protocol.md, "Tiering") ----
  // Bytes were recorded on a lease: starts the flusher thread on first use
  // and wakes it once $CXLPOOL_SIGNAL_THRESHOLD bytes wait (default 256 MiB);
  // otherwise it sends every $CXLPOOL_SIGNAL_INTERVAL_MS (default 1000).
  void SignalsRecorded(uint64_t bytes);
  // A hint for the next batch; the flusher sends it at once.
  void QueueHint(uint64_t lease_id, uint64_t offset, uint64_t len, int hint);
  // Sends every lease's recorded ranges and the queued hints now. OK when
  // the daemon has no tiering (UNSUPPORTED: signals are off from then on).
  Status FlushSignals();
  // TIERING_LEASE: pinned to its tier, or this process drops its long-term
  // pins at a safe point. Errors of the daemon (NOT_FOUND, ...).
  Status SetLeaseTiering(uint64_t lease_id, std::optional<bool> pin_tier,
                         std::optional<bool> cooperative_pin);
  // Migrations the daemon asked this process for, not answered yet.
  int MigrationsPending();
  // Answers them: drops the pins of each lease concerned (CUDA
  // registration, the application's callback), tells the daemon, waits
  // for the move, pins again. The number answered.
  Result<int> SafePoint();
  uint64_t signal_batches() const { return signal_batches_.load(); }

 private:
  struct PendingMigration {
    proto::MigrationEvent ev;
    std::chrono::steady_clock::time_point deadline;
  };
  void StartFlusher();
  void FlushLoop();
  void HandleMigrationEvent(const wire::Frame& frame);
  // mu_ held: after a reconnect, the per-lease settings again.
  void ResendTieringLocked();
  // A server push (LeaseEvent, MigrationEvent) dispatched; false: not a push.
  bool HandlePush(const wire::Frame& frame);

  ClientCore(UniqueFd sock, std::string peer) : sock_(std::move(sock)), peer_(std::move(peer)) {}
  // What a hello told us of a connection.
  struct HelloOutcome {
    uint32_t version = 0;
    std::string server_version;
    std::string instance_id;
    uint32_t max_payload_bytes = wire::kDefaultMaxFrameBytes;
    size_t request_fds_per_frame = wire::kDefaultMaxFdsPerFrame;
    uint64_t max_request_bytes = kDaemonRequestBytes;
  };
  // A release the daemon could not be told of because it was gone: the
  // next reconnect hands the lease back and releases it; a reconnect that
  // gives up closes it.
  struct DeferredRelease {
    uint64_t lease_id = 0;
    HandBack back;  // dups of the lease's extents' fds
  };
  Status Hello();
  Status HelloLocked();  // mu_ held
  // Hello on `sock` (no member touched: safe without mu_).
  static Status HelloOn(int sock, uint64_t request_id, HelloOutcome* out);
  void ApplyHelloLocked(const HelloOutcome& o);
  // `lock` holds mu_ on entry and on return: a fresh connection, hello,
  // RECLAIM of every live lease, then the deferred releases. mu_ is
  // released while waiting for the daemon (up to the reconnect timeout), so
  // other threads' releases are not held up; reconnect_mu_ keeps one
  // reconnect at a time, and a thread that waited on it takes the
  // connection another thread made.
  Status Reestablish(std::unique_lock<std::mutex>& lock);
  Status ReclaimLocked();
  // mu_ held: the deferred releases, handed back and released.
  Status FlushDeferredLocked();
  // mu_ held via `lock`: Call, and once more after a reconnect if the
  // connection was lost.
  Result<wire::Frame> CallRecovering(std::unique_lock<std::mutex>& lock, proto::MsgType type,
                                     const std::string& payload);
  template <typename Req>
  Result<wire::Frame> CallMessageRecovering(std::unique_lock<std::mutex>& lock, const Req& req);
  // Sleeps up to `ms`; false when the core is being destroyed.
  bool Nap(int ms);
  void StartWatcher();
  void WatchLoop();
  // mu_ held: registers `fd` (or -1: none) as the watched socket.
  void WatchFdLocked(int fd);
  // mu_ held: the watched socket's epoll interest for the current state.
  void ArmWatchLocked();
  // mu_ held for its life: a request and its reply, read by the caller;
  // the watcher is not woken by it.
  class CallScope {
   public:
    explicit CallScope(ClientCore* core);
    ~CallScope();
    CallScope(const CallScope&) = delete;
    CallScope& operator=(const CallScope&) = delete;

   private:
    ClientCore* core_;
  };
  // Sends one request and waits for the reply with the same request id,
  // handling events on the way. Any failure leaves the connection broken.
  Result<wire::Frame> Call(proto::MsgType type, const std::string& payload,
                           std::span<const int> fds = {});
  // The same for a RECLAIM_REQUEST with one fd per extent of each lease it
  // lists, on as many frames as the daemon's per-frame fd limit needs
  // (wire::PlanReclaimRequest). INVALID_ARGUMENT (nothing sent) when it
  // cannot be sent: several leases over one frame's fds, or a payload over
  // the daemon's max_request_bytes.
  Result<wire::Frame> CallReclaim(const proto::ReclaimRequest& req, std::span<const int> fds);
  // The reply to request `id`, handling events on the way.
  Result<wire::Frame> AwaitReply(uint64_t id);
  // mu_ held: hands one lease back (RECLAIM); true if the daemon took it.
  Result<bool> ReclaimOne(uint64_t lease_id, const HandBack& back);
  // What a RECLAIM entry says of a lease: everything the daemon told us
  // (hints for a daemon whose journal lost it), and its extents.
  static void ToReclaimInfo(const LeaseInfo& l, const HandBack& back, proto::LeaseInfo* out);
  template <typename Req>
  Result<wire::Frame> CallMessage(const Req& req);
  Status Broken(Status s);
  void HandleEvent(const wire::Frame& frame);
  // mu_ held: reads the reply's EXTENT_FDS frames, if any, and maps every
  // extent as one range.
  Result<std::unique_ptr<LeaseState>> MapReply(wire::Frame frame);
  // mu_ held: the next frame on the connection, whatever it is.
  Result<wire::Frame> ReadFrame();

  std::mutex mu_;  // guards everything below up to leases_mu_
  UniqueFd sock_;
  std::string peer_;
  wire::FrameReader reader_;
  uint64_t next_request_id_ = 1;
  Status broken_;  // non-OK once the connection is unusable
  uint32_t version_ = 0;
  std::string server_version_;
  uint32_t max_payload_bytes_ = wire::kDefaultMaxFrameBytes;
  // What the daemon takes on one request (HelloReply.max_fds_per_frame and
  // max_request_bytes).
  size_t request_fds_per_frame_ = wire::kDefaultMaxFdsPerFrame;
  uint64_t max_request_bytes_ = kDaemonRequestBytes;
  std::string socket_path_;  // empty: cannot reconnect (FromSocket)
  std::string instance_id_;
  uint64_t generation_ = 0;  // bumped by every reconnect
  std::atomic<uint64_t> reconnects_{0};
  std::vector<DeferredRelease> deferred_;

  // Serialises reconnects; taken before mu_, never while holding it.
  std::mutex reconnect_mu_;

  std::mutex watcher_mu_;  // guards starting the watcher
  std::thread watcher_;
  UniqueFd stop_fd_;  // eventfd: written when the core is destroyed
  // The watcher waits on watch_ep_ (epoll: stop_fd_, and watch_fd_, its dup
  // of the socket). While a call is in flight the socket's entry asks for
  // hang-ups only, so a reply wakes the caller alone (CallScope).
  UniqueFd watch_ep_;
  int watch_fd_ = -1;     // guarded by mu_; the dup registered in watch_ep_
  int calls_active_ = 0;  // guarded by mu_
  std::atomic<bool> stopping_{false};

  std::mutex leases_mu_;
  std::multimap<uint64_t, LeaseState*> leases_;  // live leases by id

  // Tiering. tier_mu_ is never held while taking mu_ or leases_mu_.
  std::mutex tier_mu_;
  std::condition_variable tier_cv_;
  std::vector<proto::RangeSignal> hints_;     // guarded by tier_mu_
  std::vector<PendingMigration> migrations_;  // guarded by tier_mu_
  bool flush_now_ = false;                    // guarded by tier_mu_
  std::mutex flush_mu_;                       // one flush at a time
  std::thread flusher_;
  std::atomic<bool> flusher_started_{false};
  std::atomic<uint64_t> unsent_bytes_{0};
  std::atomic<bool> signals_off_{false};
  std::atomic<uint64_t> signal_batches_{0};
};

class LeaseState {
 public:
  LeaseState(std::shared_ptr<ClientCore> core, ExtentMapping mapping, LeaseInfo info);
  ~LeaseState();  // Release(), errors ignored
  LeaseState(const LeaseState&) = delete;
  LeaseState& operator=(const LeaseState&) = delete;

  void* data() const { return mapping_.data(); }
  uint64_t size() const { return mapping_.size(); }
  const LeaseInfo& info() const { return info_; }
  // The lease's fd; -1 for a lease of several extents (mapping().extents()).
  int fd() const { return mapping_.fd(); }
  const ExtentMapping& mapping() const { return mapping_; }
  bool revoked() const { return revoked_.load(std::memory_order_acquire); }
  void MarkRevoked() { revoked_.store(true, std::memory_order_release); }

  // Registers, then checks the placement (VerifyPlacement; its failure is
  // logged, not returned: the registration stands).
  Status CudaRegister(int device);
  Status CudaUnregister();
  Result<uint64_t> DevicePtr() const;
  // move_pages census of the mapping; when the pages left the node the
  // lease is accounted to, tells the daemon and takes its updated info.
  // `*out` is filled even when telling the daemon fails. `cause` names the
  // pin in the report ("cuda_register", "verify").
  Status VerifyPlacement(const std::string& cause, Placement* out);
  const cuda::CudaRegistration& cuda() const { return cuda_; }

  // Unregister, unmap, tell the daemon; idempotent (a second call is OK).
  Status Release();

  // ---- tiering (tiering_client.cc) ----
  // Copies into / out of the lease and counts the bytes for the daemon.
  // INVALID_ARGUMENT (NULL with len > 0, a range outside the lease),
  // REVOKED, UNAVAILABLE (released).
  Status CopyIn(uint64_t offset, const void* src, size_t len);
  Status CopyOut(uint64_t offset, void* dst, size_t len);
  Status NoteAccess(uint64_t offset, uint64_t len, uint64_t bytes_read, uint64_t bytes_written);
  Status Hint(uint64_t offset, uint64_t len, int hint);
  Status PinTier(bool pinned);
  // The application's own long-term pin of the lease (io_uring fixed
  // buffers, RDMA): called with 1 (prepare: drop it; non-zero return
  // declines) and 2 (resume: pin again) at a safe point. Null: none.
  Status SetMigrationCallback(std::function<int(int phase)> cb);
  SignalRecorder& signals() { return signals_; }
  // Cooperative migration, at the safe point (ClientCore::SafePoint).
  // Drops the pins; false with `why` when the callback declined.
  bool DropPins(std::string* why);
  void RestorePins(bool moved, int numa_node, const std::string& detail);
  // The pause the holder saw: pins dropped -> pinned again.
  void RecordPause(int64_t pause_ns);
  // Where the lease's pages are: the grant's node, then the last move the
  // daemon reported (LeaseEvent "moved", or a cooperative migration).
  int numa_node() const { return node_.load(std::memory_order_relaxed); }
  void SetNode(int node) { node_.store(node, std::memory_order_relaxed); }
  bool cooperative() const { return cuda_.registered() || migration_cb_ != nullptr; }
  struct TieringCounters {
    uint64_t migrations = 0;
    uint64_t declined = 0;
    int64_t last_pause_ns = 0;
    int64_t max_pause_ns = 0;
    uint32_t device_ptr_changed = 0;
    std::string last_detail;
  };
  const TieringCounters& tiering() const { return tiering_; }
  bool tier_pinned() const { return tier_pinned_; }

 private:
  // Tells the daemon whether this process now holds a long-term pin.
  void DeclareCooperative();

  std::shared_ptr<ClientCore> core_;
  ExtentMapping mapping_;
  LeaseInfo info_;
  cuda::CudaRegistration cuda_;
  Status cuda_status_{Code::kNotFound, "the lease is not registered with CUDA"};
  std::atomic<bool> revoked_{false};
  bool released_ = false;
  std::atomic<int> node_{-1};
  SignalRecorder signals_;
  std::function<int(int)> migration_cb_;
  bool declared_cooperative_ = false;
  bool tier_pinned_ = false;
  // CUDA registration dropped for a migration: the device to register again
  // on, and the device pointers it had (they must come back the same).
  int cuda_device_before_ = -1;
  std::vector<uint64_t> device_ptrs_before_;
  TieringCounters tiering_;
};

template <typename Req>
Result<wire::Frame> ClientCore::CallMessage(const Req& req) {
  Result<std::string> payload = wire::Encode(req, max_payload_bytes_);
  if (!payload.ok()) return payload.status();
  return Call(wire::TypeOf<Req>(), *payload);
}

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
