#include "server/server.h"

#include <errno.h>
#include <fcntl.h>
#include <google/protobuf/stubs/logging.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cxlpool/common/log.h"
#include "cxlpool/common/proc.h"
#include "cxlpool/common/strings.h"
#include "cxlpool/proto/codec.h"
#include "cxlpool/proto/extents.h"
#include "cxlpool/proto/ipc.h"
#include "cxlpool/proto/socket.h"

namespace cxlpool {

namespace asio = boost::asio;
using asio::local::stream_protocol;
using boost::system::error_code;

namespace {

constexpr int kMaxAcceptsPerWakeup = 64;
// Frames one connection may have handled per wakeup before the other ready
// connections get a turn (it is read again on the loop's next pass).
constexpr int kFramesPerTurn = 8;

std::string FirstLine(std::string s) {
  size_t nl = s.find('\n');
  if (nl != std::string::npos) s.resize(nl);
  return s;
}

}  // namespace

namespace {

using SteadyClock = std::chrono::steady_clock;

// Names of the four shared resources' limits (server/limits.h).
constexpr ShareNames kConnNames{"max_connections", "max_connections_per_uid",
                                "reserved_connections", "connections"};
constexpr ShareNames kRequestNames{"max_requests", "max_requests_per_uid", "max_requests",
                                   "requests in flight"};
constexpr ShareNames kQueueNames{"max_queued_bytes", "max_queued_bytes_per_uid", "max_queued_bytes",
                                 "queued reply bytes"};
constexpr ShareNames kFdNames{"max_fds", "max_fds_per_uid", "max_fds", "fds"};

// A frame waiting in a send queue, with what it was charged.
struct Queued {
  wire::OutFrame frame;
  uint64_t cost = 0;  // bytes + kFrameOverhead
  size_t fds = 0;     // fds charged (0 once the kernel took them)
};

std::string Ms(std::chrono::milliseconds d) { return std::to_string(d.count()) + " ms"; }

// Charges the time from its construction to its end to `uid` (nothing when
// `budget` is nullptr).
class BusyCharge {
 public:
  BusyCharge(BusyBudget* budget, uid_t uid)
      : budget_(budget),
        uid_(uid),
        start_(budget ? SteadyClock::now() : SteadyClock::time_point()) {}
  ~BusyCharge() {
    if (budget_ == nullptr) return;
    const auto end = SteadyClock::now();
    budget_->Charge(uid_, end - start_, end);
  }
  BusyCharge(const BusyCharge&) = delete;
  BusyCharge& operator=(const BusyCharge&) = delete;

 private:
  BusyBudget* budget_;
  uid_t uid_;
  SteadyClock::time_point start_;
};

}  // namespace

struct Connection {
  Connection(asio::io_context& io, ConnectionId id_in, wire::RecvLimits limits)
      : id(id_in), socket(io), reader(limits), frame_timer(io), idle_timer(io), send_timer(io) {}

  ConnectionId id;
  stream_protocol::socket socket;
  PeerInfo peer;
  UniqueFd pidfd;
  wire::FrameReader reader;
  std::deque<Queued> queue;
  uint64_t queued_bytes = 0;  // sum of queue[].cost
  uint64_t reader_fds = 0;    // the reader's fds charged to fd_share_
  // A RECLAIM_REQUEST waiting for the EXTENT_FDS frames it announced (null:
  // none), the fds it holds (charged to fd_share_) and when the last of its
  // frames must have come (limits.frame_timeout after the first).
  std::unique_ptr<wire::ReclaimRequestAssembler> assembly;
  uint64_t assembly_fds = 0;
  SteadyClock::time_point assembly_deadline;
  // The limit (a kFdNames key) that set the reader's fd allowance below
  // max_fds_per_frame for the current read; nullptr when it did not.
  const char* fd_allowance_limit = nullptr;
  asio::steady_timer frame_timer;  // frame timeout; flush bound while closing
  uint64_t frame_timer_gen = 0;
  bool frame_timer_armed = false;
  asio::steady_timer idle_timer;  // hello timeout, then idle timeout
  asio::steady_timer send_timer;  // send timeout while replies are queued
  bool send_timer_armed = false;
  SteadyClock::time_point last_input;     // last frame received
  SteadyClock::time_point last_progress;  // last queued byte the client took
  bool reading = false;                   // an async_wait(wait_read) is outstanding
  bool parked = false;                    // not read: its uid is over limits.max_busy_per_uid
  bool writing = false;                   // an async_wait(wait_write) is outstanding
  bool closed = false;
  bool closing = false;  // close once the queue is flushed
  std::string closing_reason;
  bool hello_done = false;
  bool hello_pending = false;
  uint32_t version = 0;
  // The version frames to this client are written in: kHelloWireVersion
  // until the HELLO reply has been queued, then the negotiated one.
  uint16_t frame_version = wire::kHelloWireVersion;
  size_t inflight = 0;

  int fd() { return socket.native_handle(); }
  uid_t uid() const { return peer.uid; }
};

class Server::Impl : public std::enable_shared_from_this<Server::Impl> {
 public:
  Impl(asio::io_context& io, ServerOptions options, RequestHandler* handler)
      : io_(io),
        options_(std::move(options)),
        handler_(handler),
        acceptor_(io),
        backoff_timer_(io),
        throttle_timer_(io) {
    const ServerLimits& l = options_.limits;
    own_busy_ = BusyBudget(l.max_busy_per_uid);
    busy_ = options_.busy != nullptr ? options_.busy : &own_busy_;
    conn_share_ = FairShare(l.max_connections, l.max_connections_per_uid, l.reserved_connections);
    request_share_ = FairShare(l.max_requests, l.max_requests_per_uid, l.max_requests / 16);
    queue_share_ =
        FairShare(l.max_queued_bytes, l.max_queued_bytes_per_uid, l.max_queued_bytes / 16);
    fd_share_ = FairShare(l.max_fds, l.max_fds_per_uid, l.max_fds / 16);
  }

  Status Init();
  void Stop();
  void FlushDisconnectsNow();
  Result<ConnectionId> Admit(UniqueFd fd);
  Status Push(ConnectionId id, Reply reply);
  Status MarkHelloDone(ConnectionId id, uint32_t version);
  void CompleteRequest(ConnectionId id, uid_t uid, uint64_t request_id, uint16_t request_type,
                       Reply reply);
  // Runs owed OnDisconnects now, or posts that for when no handler callback
  // is on the stack.
  void ScheduleDisconnectFlush();
  ServerStats Stats() const;

  const Connection* Find(ConnectionId id) const {
    auto it = conns_.find(id);
    return it == conns_.end() ? nullptr : it->second.get();
  }

  asio::io_context& io_;
  ServerOptions options_;
  RequestHandler* handler_;
  std::unique_ptr<FileSystem> own_fs_;
  const FileSystem* fs_ = nullptr;
  stream_protocol::acceptor acceptor_;
  asio::steady_timer backoff_timer_;
  // Daemon time per uid (server/busy_budget.h) and the connections not read
  // because their uid is over it, with the timer that reads them again.
  BusyBudget own_busy_;
  BusyBudget* busy_ = nullptr;
  std::vector<std::shared_ptr<Connection>> parked_;
  asio::steady_timer throttle_timer_;
  bool throttle_timer_armed_ = false;
  SteadyClock::time_point throttle_timer_at_;
  std::string created_path_;
  ino_t created_ino_ = 0;
  dev_t created_dev_ = 0;
  bool stopped_ = false;
  ConnectionId next_id_ = 1;
  std::map<ConnectionId, std::shared_ptr<Connection>> conns_;
  FairShare conn_share_, request_share_, queue_share_, fd_share_;
  std::vector<ConnectionId> pending_disconnects_;
  bool disconnect_flush_posted_ = false;
  int callback_depth_ = 0;  // > 0 while inside a handler callback
  ServerStats stats_;
  // Limit warnings: at most one line per limit and second.
  struct LogGate {
    SteadyClock::time_point last;
    uint64_t suppressed = 0;
  };
  std::map<std::string, LogGate> log_gates_;

 private:
  const ServerLimits& limits() const { return options_.limits; }
  void StartAccept();
  void AcceptReady();
  void StartRead(const std::shared_ptr<Connection>& c);
  // Stops reading `c` until its uid's busy budget refills.
  void Park(const std::shared_ptr<Connection>& c, SteadyClock::time_point now);
  void ArmThrottleTimer(SteadyClock::time_point at);
  void OnThrottleTimer();
  void DoRead(const std::shared_ptr<Connection>& c);
  void HandleFrame(const std::shared_ptr<Connection>& c, wire::Frame frame);
  // A RECLAIM_REQUEST that announces EXTENT_FDS frames, and those frames:
  // the whole request once its last frame is in, nullopt until then or when
  // the connection was aborted for a frame that does not add up.
  std::optional<wire::Frame> Assemble(const std::shared_ptr<Connection>& c, wire::Frame frame);
  void DropAssembly(Connection* c);
  void SyncAssemblyFds(Connection* c);
  void ArmFrameTimer(const std::shared_ptr<Connection>& c, std::chrono::milliseconds after);
  void OnFrameTimer(const std::shared_ptr<Connection>& c);
  void CancelFrameTimer(Connection* c);
  void ArmIdleTimer(const std::shared_ptr<Connection>& c, std::chrono::milliseconds after);
  void OnIdleTimer(const std::shared_ptr<Connection>& c);
  void ArmSendTimer(const std::shared_ptr<Connection>& c, std::chrono::milliseconds after);
  void OnSendTimer(const std::shared_ptr<Connection>& c);
  // Sends at once what fits, queues the rest (within the queue limits);
  // false if the connection is (now) closed or closing.
  // `substituted` (when given) says whether the frame could not be made
  // (its fds not duplicated) and an ERROR_REPLY went in its place.
  bool Enqueue(const std::shared_ptr<Connection>& c, proto::MsgType type, uint64_t request_id,
               const std::string& payload, std::span<const int> fds, bool* substituted = nullptr);
  bool QueueChecked(const std::shared_ptr<Connection>& c, wire::OutFrame f);
  void QueueUnchecked(const std::shared_ptr<Connection>& c, wire::OutFrame f);
  void Uncharge(Connection* c, Queued& q);
  // Frees the queue except a frame already partly sent (the stream must stay
  // framed).
  void DiscardQueue(Connection* c);
  void QueueError(const std::shared_ptr<Connection>& c, uint64_t request_id, const Status& st);
  // Closes `c` for breaking `limit` (nullptr: a protocol error): counts the
  // hit, drops what is queued, sends `st` as an ERROR_REPLY, then closes.
  void Abort(const std::shared_ptr<Connection>& c, uint64_t request_id, const Status& st,
             const char* limit);
  void Flush(const std::shared_ptr<Connection>& c);
  void CloseAfterFlush(const std::shared_ptr<Connection>& c, std::string reason);
  void Drop(const std::shared_ptr<Connection>& c, const std::string& reason);
  void SetFdAllowance(Connection* c);
  void SyncReaderFds(Connection* c);
  void RefuseFds(const std::shared_ptr<Connection>& c);
  // The open connection (not closing) with the most bytes queued, of `uid`
  // only when given; nullptr if none has any.
  std::shared_ptr<Connection> LargestQueue(std::optional<uid_t> uid);
  void Hit(const char* limit) { ++stats_.limit_hits[limit]; }
  void LogLimit(const std::string& limit, const std::string& line);
  ReplyFn MakeReplyFn(ConnectionId id, uid_t uid, uint64_t request_id, uint16_t request_type);

  std::shared_ptr<Connection> Get(ConnectionId id) {
    auto it = conns_.find(id);
    return it == conns_.end() ? nullptr : it->second;
  }
  std::string Describe(const Connection& c) const {
    return "connection " + std::to_string(c.id) + " (pid " + std::to_string(c.peer.pid) + ", uid " +
           std::to_string(c.peer.uid) + ", " +
           (c.peer.comm.empty() ? std::string("?") : c.peer.comm) + ")";
  }
};

// ---- setup and shutdown ------------------------------------------------------

Status Server::Impl::Init() {
  // An adopted fd is ours from here on, also when Init fails.
  UniqueFd listen_fd(options_.listen_fd);
  options_.listen_fd = -1;
  if (handler_ == nullptr) return Status(Code::kInvalidArgument, "server: no request handler");
  if (options_.max_frame_bytes == 0 || options_.max_frame_bytes > wire::kHardMaxFrameBytes) {
    return Status(Code::kInvalidArgument,
                  "server: max_frame_bytes must be 1.." + std::to_string(wire::kHardMaxFrameBytes));
  }
  if (Status st = limits().Validate(options_.max_frame_bytes); !st.ok()) {
    return Status(st.code(), "server: " + st.message());
  }
  if (options_.fs == nullptr) {
    own_fs_ = MakeRootedFileSystem("/");
    fs_ = own_fs_.get();
  } else {
    fs_ = options_.fs;
  }

  if (listen_fd.valid()) {
    CXLPOOL_RETURN_IF_ERROR(wire::CheckListeningUnixSocket(listen_fd.get()));
    int fl = ::fcntl(listen_fd.get(), F_GETFL);
    if (fl < 0 || ::fcntl(listen_fd.get(), F_SETFL, fl | O_NONBLOCK) != 0 ||
        ::fcntl(listen_fd.get(), F_SETFD, FD_CLOEXEC) != 0) {
      return Status::FromErrno(errno, "server: set listening fd non-blocking");
    }
    options_.socket_path.clear();
  } else if (!options_.socket_path.empty()) {
    wire::ListenOptions lo;
    lo.path = options_.socket_path;
    lo.mode = options_.socket_mode;
    lo.group = options_.socket_group;
    lo.backlog = options_.backlog;
    Result<UniqueFd> fd = wire::ListenUnix(lo);
    if (!fd.ok()) return fd.status();
    listen_fd = std::move(*fd);
    struct stat st;
    if (::stat(options_.socket_path.c_str(), &st) == 0) {
      created_path_ = options_.socket_path;
      created_ino_ = st.st_ino;
      created_dev_ = st.st_dev;
    }
  } else {
    return Status(Code::kInvalidArgument, "server: neither socket_path nor listen_fd given");
  }
  error_code ec;
  acceptor_.assign(stream_protocol(), listen_fd.get(), ec);
  if (ec) return Status(Code::kIo, "server: adopt listening socket: " + ec.message());
  listen_fd.Release();
  StartAccept();
  CXLPOOL_LOG(kInfo) << "server: listening on "
                     << (options_.socket_path.empty() ? std::string("inherited fd")
                                                      : options_.socket_path);
  return Status::Ok();
}

void Server::Impl::Stop() {
  if (stopped_) return;
  stopped_ = true;
  error_code ec;
  backoff_timer_.cancel();
  throttle_timer_.cancel();
  parked_.clear();
  acceptor_.close(ec);
  if (!created_path_.empty()) {
    // Remove the socket file only if it is still the one we created.
    struct stat st;
    if (::lstat(created_path_.c_str(), &st) == 0 && st.st_ino == created_ino_ &&
        st.st_dev == created_dev_) {
      ::unlink(created_path_.c_str());
    }
    created_path_.clear();
  }
  std::vector<std::shared_ptr<Connection>> all;
  for (auto& [id, c] : conns_) all.push_back(c);
  for (auto& c : all) Drop(c, "server stopping");
  if (callback_depth_ == 0) FlushDisconnectsNow();
}

void Server::Impl::FlushDisconnectsNow() {
  while (!pending_disconnects_.empty()) {
    std::vector<ConnectionId> ids;
    ids.swap(pending_disconnects_);
    for (ConnectionId id : ids) {
      ++callback_depth_;
      handler_->OnDisconnect(id);
      --callback_depth_;
    }
  }
}

void Server::Impl::ScheduleDisconnectFlush() {
  if (callback_depth_ == 0) {
    FlushDisconnectsNow();
    return;
  }
  if (disconnect_flush_posted_) return;
  disconnect_flush_posted_ = true;
  asio::post(io_, [weak = weak_from_this()] {
    auto self = weak.lock();
    if (!self) return;  // the destructor flushed them
    self->disconnect_flush_posted_ = false;
    if (self->callback_depth_ == 0) self->FlushDisconnectsNow();
  });
}

void Server::Impl::LogLimit(const std::string& limit, const std::string& line) {
  LogGate& g = log_gates_[limit];
  const auto now = SteadyClock::now();
  if (g.last != SteadyClock::time_point() && now - g.last < std::chrono::seconds(1)) {
    ++g.suppressed;
    return;
  }
  CXLPOOL_LOG(kWarning) << "server: " << line << " (limits." << limit << ")"
                        << (g.suppressed > 0 ? "; " + std::to_string(g.suppressed) +
                                                   " more like it in the last second"
                                             : std::string());
  g.last = now;
  g.suppressed = 0;
}

// ---- accept ------------------------------------------------------------------

void Server::Impl::StartAccept() {
  if (stopped_) return;
  acceptor_.async_wait(
      stream_protocol::acceptor::wait_read, [weak = weak_from_this()](const error_code& ec) {
        auto self = weak.lock();
        if (!self || self->stopped_ || ec == asio::error::operation_aborted) {
          return;
        }
        if (ec) {
          CXLPOOL_LOG(kError) << "server: wait on listening socket: " << ec.message();
          ++self->stats_.accept_errors;
          self->backoff_timer_.expires_after(self->options_.accept_backoff);
          self->backoff_timer_.async_wait([weak](const error_code& e2) {
            auto s2 = weak.lock();
            if (s2 && !e2) s2->StartAccept();
          });
          return;
        }
        self->AcceptReady();
      });
}

void Server::Impl::AcceptReady() {
  for (int i = 0; i < kMaxAcceptsPerWakeup && !stopped_; ++i) {
    int fd = ::accept4(acceptor_.native_handle(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      int err = errno;
      if (err == EAGAIN || err == EWOULDBLOCK) break;
      if (err == EINTR || err == ECONNABORTED || err == EPROTO) continue;
      ++stats_.accept_errors;
      if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
        // The pending connection stays in the backlog; retrying now would
        // spin. Back off, then accept again.
        CXLPOOL_LOG(kWarning) << "server: accept: " << std::strerror(err) << "; retrying in "
                              << options_.accept_backoff.count() << " ms";
        backoff_timer_.expires_after(options_.accept_backoff);
        backoff_timer_.async_wait([weak = weak_from_this()](const error_code& ec) {
          auto self = weak.lock();
          if (self && !ec) self->StartAccept();
        });
        return;
      }
      CXLPOOL_LOG(kError) << "server: accept: " << std::strerror(err);
      break;
    }
    Result<ConnectionId> r = Admit(UniqueFd(fd));
    (void)r;  // refusals are counted and logged by Admit
  }
  StartAccept();
}

Result<ConnectionId> Server::Impl::Admit(UniqueFd fd) {
  if (stopped_) return Status(Code::kUnavailable, "server stopped");
  Result<wire::PeerCred> cred = wire::GetPeerCred(fd.get());
  if (!cred.ok()) return cred.status();
  if (FairShare::Verdict v = conn_share_.Check(cred->uid, 1); v != FairShare::Verdict::kOk) {
    const char* limit = LimitName(kConnNames, v);
    Hit(limit);
    Status st(Code::kResourceExhausted,
              "connection refused: " + Explain(conn_share_, kConnNames, v, cred->uid, 1));
    LogLimit(limit, st.message() + " (pid " + std::to_string(cred->pid) + ")");
    // The client reads this as the answer to its HELLO (request id 0: the
    // connection's own error), then EOF. Its socket buffer is empty, so the
    // frame fits; if not, the close alone has to say it.
    std::string frame = wire::EncodeFrame(proto::MSG_ERROR_REPLY, 0, wire::EncodeErrorPayload(st),
                                          wire::kHelloWireVersion);
    (void)!::send(fd.get(), frame.data(), frame.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    return st;
  }

  auto c = std::make_shared<Connection>(
      io_, next_id_,
      wire::RecvLimits{static_cast<uint32_t>(limits().max_request_bytes),
                       limits().max_fds_per_frame});
  c->peer.pid = cred->pid;
  c->peer.uid = cred->uid;
  c->peer.gid = cred->gid;
  Result<UniqueFd> pidfd = wire::GetPeerPidfd(fd.get(), cred->pid);
  if (pidfd.ok()) {
    c->pidfd = std::move(*pidfd);
    c->peer.pidfd = c->pidfd.get();
  } else {
    CXLPOOL_LOG(kDebug) << "server: no pidfd for pid " << cred->pid << ": "
                        << pidfd.status().ToString();
  }
  if (cred->pid > 0) {
    std::string proc = "/proc/" + std::to_string(cred->pid);
    if (auto comm = fs_->ReadFile(proc + "/comm"); comm.ok())
      c->peer.comm = SanitizeUtf8(FirstLine(*comm));
    if (auto cg = fs_->ReadFile(proc + "/cgroup"); cg.ok())
      c->peer.cgroup = SanitizeUtf8(ParseUnifiedCgroup(*cg));
  }
  error_code ec;
  c->socket.assign(stream_protocol(), fd.get(), ec);
  if (ec) return Status(Code::kIo, "adopt connection socket: " + ec.message());
  fd.Release();

  const ConnectionId id = next_id_++;
  conns_[id] = c;
  conn_share_.Add(c->uid(), 1);
  ++stats_.accepted;
  c->last_input = SteadyClock::now();
  CXLPOOL_LOG(kDebug) << "server: " << Describe(*c) << " connected";
  ++callback_depth_;
  handler_->OnConnect(id, c->peer);
  --callback_depth_;
  if (!c->closed && !c->hello_done) ArmIdleTimer(c, limits().hello_timeout);
  StartRead(c);
  ScheduleDisconnectFlush();
  return id;
}

// ---- timers ------------------------------------------------------------------

void Server::Impl::ArmIdleTimer(const std::shared_ptr<Connection>& c,
                                std::chrono::milliseconds after) {
  c->idle_timer.expires_after(after);
  c->idle_timer.async_wait([weak = weak_from_this(), c](const error_code& e) {
    auto self = weak.lock();
    if (!self || e || c->closed) return;
    self->OnIdleTimer(c);
    self->ScheduleDisconnectFlush();
  });
}

void Server::Impl::OnIdleTimer(const std::shared_ptr<Connection>& c) {
  if (c->closing) return;
  if (!c->hello_done) {
    Abort(c, 0,
          Status(Code::kUnavailable, "no successful HELLO within " + Ms(limits().hello_timeout) +
                                         " (limits.hello_timeout)"),
          "hello_timeout");
    return;
  }
  const auto idle = limits().idle_timeout;
  if (idle.count() == 0) return;
  const auto quiet =
      std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() - c->last_input);
  if (quiet < idle) {
    ArmIdleTimer(c, idle - quiet);
    return;
  }
  // Holding a lease, a request in flight, a reply queued or a frame begun is
  // not idle: a client that holds memory and says nothing keeps it.
  if (c->inflight > 0 || !c->queue.empty() || c->reader.mid_frame() ||
      handler_->HoldsResources(c->id)) {
    ArmIdleTimer(c, idle);
    return;
  }
  Abort(c, 0,
        Status(Code::kUnavailable, "closed after " + Ms(idle) +
                                       " without a request while holding no lease "
                                       "(limits.idle_timeout); connect again to continue"),
        "idle_timeout");
}

void Server::Impl::ArmSendTimer(const std::shared_ptr<Connection>& c,
                                std::chrono::milliseconds after) {
  c->send_timer_armed = true;
  c->send_timer.expires_after(after);
  c->send_timer.async_wait([weak = weak_from_this(), c](const error_code& e) {
    c->send_timer_armed = false;
    auto self = weak.lock();
    if (!self || e || c->closed) return;
    self->OnSendTimer(c);
    self->ScheduleDisconnectFlush();
  });
}

void Server::Impl::OnSendTimer(const std::shared_ptr<Connection>& c) {
  if (c->queue.empty() || c->closing) return;
  const auto limit = limits().send_timeout;
  const auto stuck =
      std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() - c->last_progress);
  if (stuck < limit) {
    ArmSendTimer(c, limit - stuck);
    return;
  }
  Abort(c, 0,
        Status(Code::kResourceExhausted,
               "replies not read for " + Ms(limit) + " (" + std::to_string(c->queued_bytes) +
                   " bytes queued; limits.send_timeout); read the socket"),
        "send_timeout");
}

void Server::Impl::ArmFrameTimer(const std::shared_ptr<Connection>& c,
                                 std::chrono::milliseconds after) {
  c->frame_timer_armed = true;
  uint64_t gen = ++c->frame_timer_gen;
  c->frame_timer.expires_after(after);
  c->frame_timer.async_wait([weak = weak_from_this(), c, gen](const error_code& ec) {
    auto self = weak.lock();
    if (!self || ec || c->closed || gen != c->frame_timer_gen || !c->frame_timer_armed) {
      return;
    }
    c->frame_timer_armed = false;
    self->OnFrameTimer(c);
    self->ScheduleDisconnectFlush();
  });
}

void Server::Impl::OnFrameTimer(const std::shared_ptr<Connection>& c) {
  const std::string within = Ms(limits().frame_timeout) + " (limits.frame_timeout)";
  if (c->closing) {
    // Its error reply (or the replies before it) not taken within the bound.
    Drop(c, c->closing_reason + "; error reply not read within " + within);
    return;
  }
  if (c->assembly && !c->reader.mid_frame()) {
    const uint64_t rid = c->assembly->request_id();
    const std::string left = std::to_string(c->assembly->frames_left());
    Abort(c, rid,
          Status(Code::kUnavailable, "RECLAIM_REQUEST's EXTENT_FDS frames (" + left +
                                         " still to come) not completed within " + within),
          "frame_timeout");
    return;
  }
  const wire::FrameHeader& h = c->reader.header();
  uint64_t rid = c->reader.have_header() && h.magic == wire::kFrameMagic ? h.request_id : 0;
  Abort(c, rid, Status(Code::kUnavailable, "frame not completed within " + within),
        "frame_timeout");
}

void Server::Impl::CancelFrameTimer(Connection* c) {
  if (!c->frame_timer_armed) return;
  c->frame_timer_armed = false;
  ++c->frame_timer_gen;
  c->frame_timer.cancel();
}

// ---- reading -----------------------------------------------------------------

// Reading stops while the connection's replies are queued (the client does
// not take them: it gets no more to not read), while it has its maximum of
// requests in flight, and once it is closing. Flush and CompleteRequest
// start it again.
void Server::Impl::StartRead(const std::shared_ptr<Connection>& c) {
  if (c->closed || c->closing || c->reading || c->parked || !c->queue.empty() ||
      c->inflight >= limits().max_requests_per_connection) {
    return;
  }
  c->reading = true;
  c->socket.async_wait(stream_protocol::socket::wait_read,
                       [weak = weak_from_this(), c](const error_code& ec) {
                         c->reading = false;
                         auto self = weak.lock();
                         if (!self || c->closed) return;
                         if (ec) {
                           self->Drop(c, "wait for input: " + ec.message());
                           return;
                         }
                         self->DoRead(c);
                         self->ScheduleDisconnectFlush();
                       });
}

void Server::Impl::Park(const std::shared_ptr<Connection>& c, SteadyClock::time_point now) {
  c->parked = true;
  parked_.push_back(c);
  Hit("max_busy_per_uid");
  LogLimit("max_busy_per_uid", "uid " + std::to_string(c->uid()) + " took more daemon time than " +
                                   Ms(limits().max_busy_per_uid) +
                                   " a second next to a lighter tenant: " + Describe(*c) +
                                   " is not read until its budget refills");
  ArmThrottleTimer(busy_->RefilledAt(c->uid(), now));
}

void Server::Impl::ArmThrottleTimer(SteadyClock::time_point at) {
  // At least 1 ms apart: a refill of a few microseconds is not worth a wakeup.
  at = std::max(at, SteadyClock::now() + std::chrono::milliseconds(1));
  if (throttle_timer_armed_ && throttle_timer_at_ <= at) return;
  throttle_timer_armed_ = true;
  throttle_timer_at_ = at;
  throttle_timer_.expires_at(at);
  throttle_timer_.async_wait([weak = weak_from_this()](const error_code& ec) {
    auto self = weak.lock();
    if (!self || ec == asio::error::operation_aborted) return;
    self->throttle_timer_armed_ = false;
    self->OnThrottleTimer();
    self->ScheduleDisconnectFlush();
  });
}

void Server::Impl::OnThrottleTimer() {
  if (stopped_) return;
  const auto now = SteadyClock::now();
  std::vector<std::shared_ptr<Connection>> parked;
  parked.swap(parked_);
  std::optional<SteadyClock::time_point> next;
  for (auto& c : parked) {
    if (c->closed) continue;
    if (busy_->Throttled(c->uid(), now)) {
      parked_.push_back(c);
      auto at = busy_->RefilledAt(c->uid(), now);
      if (!next || at < *next) next = at;
      continue;
    }
    c->parked = false;
    StartRead(c);
  }
  if (next) ArmThrottleTimer(*next);
}

void Server::Impl::SetFdAllowance(Connection* c) {
  const uint64_t avail = fd_share_.Available(c->uid());
  const uint64_t allowance = c->reader_fds + avail;
  c->fd_allowance_limit = nullptr;
  if (allowance < limits().max_fds_per_frame) {
    c->fd_allowance_limit = LimitName(kFdNames, fd_share_.Check(c->uid(), avail + 1));
  }
  c->reader.set_fd_allowance(allowance);
}

void Server::Impl::SyncReaderFds(Connection* c) {
  const uint64_t now = c->reader.fds_held();
  if (now > c->reader_fds) fd_share_.Add(c->uid(), now - c->reader_fds);
  if (now < c->reader_fds) fd_share_.Sub(c->uid(), c->reader_fds - now);
  c->reader_fds = now;
}

void Server::Impl::RefuseFds(const std::shared_ptr<Connection>& c) {
  const wire::FrameReader& r = c->reader;
  const wire::FrameHeader& h = r.header();
  const bool header = r.have_header() && h.magic == wire::kFrameMagic;
  const uint64_t rid = header ? h.request_id : 0;
  const size_t per_frame = limits().max_fds_per_frame;
  const size_t type_max =
      header ? std::min(per_frame, wire::MaxFdsForType(h.type, per_frame)) : per_frame;
  const std::string what = header ? wire::MsgTypeName(h.type) : std::string("a frame");
  const size_t refused = r.fds_refused();
  if (r.control_truncated() || refused > type_max || c->fd_allowance_limit == nullptr) {
    ++stats_.protocol_errors;
    if (type_max == 0) {
      Abort(c, rid,
            Status(Code::kProtocol, what + " may carry no fds; the " + std::to_string(refused) +
                                        " that arrived were closed"),
            nullptr);
    } else {
      Abort(c, rid,
            Status(Code::kProtocol, what + " carried more than " + std::to_string(type_max) +
                                        " fds (limits.max_fds_per_frame is " +
                                        std::to_string(per_frame) +
                                        "); all were closed as they arrived"),
            "max_fds_per_frame");
    }
    return;
  }
  FairShare::Verdict v = fd_share_.Check(c->uid(), refused);
  const char* limit = v == FairShare::Verdict::kOk ? c->fd_allowance_limit : LimitName(kFdNames, v);
  std::string why = v == FairShare::Verdict::kOk
                        ? std::string("the daemon's fd budget for clients was used up")
                        : Explain(fd_share_, kFdNames, v, c->uid(), refused);
  Abort(c, rid,
        Status(Code::kResourceExhausted,
               what + " refused: its fds were closed as they arrived: " + why),
        limit);
}

void Server::Impl::DoRead(const std::shared_ptr<Connection>& c) {
  int frames = 0;
  while (!c->closed && !c->closing && c->queue.empty() &&
         c->inflight < limits().max_requests_per_connection) {
    // A RECLAIM whose EXTENT_FDS frames are coming is read to its end first.
    if (!c->reader.mid_frame() && !c->assembly) {
      if (frames == kFramesPerTurn) {
        // Its turn is over: read it again after the other ready connections.
        StartRead(c);
        return;
      }
      const auto now = SteadyClock::now();
      if (busy_->Throttled(c->uid(), now)) {
        Park(c, now);
        return;
      }
    }
    SetFdAllowance(c.get());
    Result<wire::FrameReader::Progress> p = c->reader.Read(c->fd(), 0);
    SyncReaderFds(c.get());
    if (p.ok() && c->reader.fds_refused() > 0) {
      RefuseFds(c);
      return;
    }
    if (!p.ok()) {
      const Status& st = p.status();
      if (st.code() == Code::kProtocol) {
        ++stats_.protocol_errors;
        // Echo the request id only from a header that is ours (magic ok).
        const wire::FrameHeader& h = c->reader.header();
        uint64_t rid = c->reader.have_header() && h.magic == wire::kFrameMagic ? h.request_id : 0;
        std::string msg = st.message();
        const char* limit = nullptr;
        // The length is checked last: a bad magic, version or flags is that.
        if (c->reader.have_header() && h.magic == wire::kFrameMagic &&
            h.length > limits().max_request_bytes &&
            wire::ValidateFrameHeader(h, UINT32_MAX).ok()) {
          msg += " (limits.max_request_bytes)";
          limit = "max_request_bytes";
        }
        Abort(c, rid, Status(st.code(), msg), limit);
      } else {
        Drop(c, st.ToString());
      }
      return;
    }
    switch (*p) {
      case wire::FrameReader::Progress::kWouldBlock:
        if (c->reader.mid_frame() && !c->frame_timer_armed) {
          ArmFrameTimer(c, limits().frame_timeout);
        }
        if (c->assembly && !c->frame_timer_armed) {
          const auto left = c->assembly_deadline - SteadyClock::now();
          ArmFrameTimer(c, std::max(std::chrono::milliseconds(0),
                                    std::chrono::duration_cast<std::chrono::milliseconds>(left)));
        }
        StartRead(c);
        return;
      case wire::FrameReader::Progress::kEof:
        Drop(c, "peer closed the connection");
        return;
      case wire::FrameReader::Progress::kFrame:
        CancelFrameTimer(c.get());
        ++frames;
        HandleFrame(c, c->reader.TakeFrame());
        SyncReaderFds(c.get());  // the request's fds are closed by now
        SyncAssemblyFds(c.get());
        // Answered at once: CompleteRequest re-armed the wait for input, and
        // Asio's re-arm (EPOLL_CTL_MOD) reports input already queued. Reading
        // on would only cost a recvmsg that finds nothing (a client waiting
        // for its reply has sent nothing more).
        if (c->reading) return;
        break;
    }
  }
  // Paused (in-flight limit, replies queued) or closing: CompleteRequest and
  // Flush restart reading.
  if (!c->closed && !c->closing && c->inflight >= limits().max_requests_per_connection) {
    Hit("max_requests_per_connection");
  }
}

std::optional<wire::Frame> Server::Impl::Assemble(const std::shared_ptr<Connection>& c,
                                                  wire::Frame frame) {
  Status st;
  uint64_t rid = frame.header.request_id;
  if (!c->assembly) {
    if (c->version < wire::kExtentWireVersion) {
      st = Status(Code::kProtocol,
                  "RECLAIM_REQUEST announces EXTENT_FDS frames, which need "
                  "protocol version 2; this connection speaks " +
                      std::to_string(c->version));
    } else {
      c->assembly = std::make_unique<wire::ReclaimRequestAssembler>();
      c->assembly_deadline = SteadyClock::now() + limits().frame_timeout;
      st = c->assembly->Start(std::move(frame));
    }
  } else {
    rid = c->assembly->request_id();
    st = c->assembly->Add(std::move(frame));
  }
  if (!st.ok()) {
    ++stats_.protocol_errors;
    Abort(c, rid, Status(Code::kProtocol, st.message()), nullptr);
    return std::nullopt;
  }
  if (!c->assembly->complete()) {
    SyncAssemblyFds(c.get());
    return std::nullopt;
  }
  CancelFrameTimer(c.get());
  wire::Frame whole = c->assembly->TakeRequest();
  c->assembly.reset();  // its fds stay charged until the handler is done with them
  return whole;
}

void Server::Impl::DropAssembly(Connection* c) {
  c->assembly.reset();  // closes its fds
  SyncAssemblyFds(c);
}

void Server::Impl::SyncAssemblyFds(Connection* c) {
  const uint64_t now = c->assembly ? c->assembly->fds_held() : 0;
  if (now > c->assembly_fds) fd_share_.Add(c->uid(), now - c->assembly_fds);
  if (now < c->assembly_fds) fd_share_.Sub(c->uid(), c->assembly_fds - now);
  c->assembly_fds = now;
}

void Server::Impl::HandleFrame(const std::shared_ptr<Connection>& c, wire::Frame frame) {
  ++stats_.frames_in;
  c->last_input = SteadyClock::now();
  if (c->assembly || (c->hello_done && frame.header.version == c->version &&
                      wire::ReclaimRequestAssembler::AnnouncedFrames(frame) > 0)) {
    std::optional<wire::Frame> whole = Assemble(c, std::move(frame));
    if (!whole) return;
    frame = std::move(*whole);
  }
  const uint16_t type = frame.header.type;
  const uint64_t rid = frame.header.request_id;
  if (!wire::IsKnownType(type)) {
    ++stats_.protocol_errors;
    QueueError(c, rid, Status(Code::kUnsupported, "unknown message type " + std::to_string(type)));
    return;
  }
  if (!wire::IsRequestType(type)) {
    ++stats_.protocol_errors;
    QueueError(c, rid, Status(Code::kProtocol, wire::MsgTypeName(type) + " is not a request"));
    return;
  }
  if (!c->hello_done) {
    if (type != proto::MSG_HELLO_REQUEST) {
      QueueError(
          c, rid,
          Status(Code::kProtocol, wire::MsgTypeName(type) + " before a successful HELLO; send "
                                                            "MSG_HELLO_REQUEST first"));
      return;
    }
    if (c->hello_pending) {
      QueueError(c, rid, Status(Code::kProtocol, "a HELLO is already being answered"));
      return;
    }
  } else if (type == proto::MSG_HELLO_REQUEST) {
    QueueError(
        c, rid,
        Status(Code::kProtocol, "HELLO already done (version " + std::to_string(c->version) + ")"));
    return;
  } else if (frame.header.version != c->version) {
    QueueError(
        c, rid,
        Status(Code::kProtocol, "frame written in version " + std::to_string(frame.header.version) +
                                    "; this connection negotiated " + std::to_string(c->version)));
    return;
  }
  if (FairShare::Verdict v = request_share_.Check(c->uid(), 1); v != FairShare::Verdict::kOk) {
    const char* limit = LimitName(kRequestNames, v);
    Hit(limit);
    Status st(Code::kResourceExhausted, wire::MsgTypeName(type) + " refused: " +
                                            Explain(request_share_, kRequestNames, v, c->uid(), 1) +
                                            "; retry once replies arrive");
    LogLimit(limit, Describe(*c) + ": " + st.message());
    QueueError(c, rid, st);
    return;
  }
  if (type == proto::MSG_HELLO_REQUEST) c->hello_pending = true;
  request_share_.Add(c->uid(), 1);
  busy_->SetInFlight(c->uid(), request_share_.used(c->uid()), SteadyClock::now());
  ++c->inflight;
  Request req;
  req.type = static_cast<proto::MsgType>(type);
  req.request_id = rid;
  req.payload = std::move(frame.payload);
  req.fds = std::move(frame.fds);
  ReplyFn reply = MakeReplyFn(c->id, c->uid(), rid, type);
  const uid_t uid = c->uid();
  const auto start = SteadyClock::now();
  ++callback_depth_;
  handler_->OnRequest(c->id, std::move(req), std::move(reply));
  --callback_depth_;
  const auto end = SteadyClock::now();
  busy_->Charge(uid, end - start, end);
}

// ---- replies -----------------------------------------------------------------

namespace {

// Shared by every copy of one request's ReplyFn. If the last copy dies
// without a reply, the client still gets one (INTERNAL), so its request and
// the connection's in-flight slot are never lost.
struct ReplyState {
  std::weak_ptr<Server::Impl> impl;
  asio::io_context* io = nullptr;
  ConnectionId conn = 0;
  uid_t uid = 0;
  uint64_t request_id = 0;
  uint16_t request_type = 0;
  std::atomic<bool> replied{false};

  ~ReplyState() {
    if (replied.load()) return;
    asio::post(*io, [impl = impl, conn = conn, uid = uid, rid = request_id, type = request_type] {
      if (auto self = impl.lock()) {
        self->CompleteRequest(
            conn, uid, rid, type,
            MakeErrorReply(Status(Code::kInternal, "the daemon dropped this request unanswered")));
      }
    });
  }
};

}  // namespace

ReplyFn Server::Impl::MakeReplyFn(ConnectionId id, uid_t uid, uint64_t request_id,
                                  uint16_t request_type) {
  auto state = std::make_shared<ReplyState>();
  state->impl = weak_from_this();
  state->io = &io_;
  state->conn = id;
  state->uid = uid;
  state->request_id = request_id;
  state->request_type = request_type;
  return [state](Reply reply) {
    if (state->replied.exchange(true)) {
      CXLPOOL_LOG(kError) << "server: request " << state->request_id << " on connection "
                          << state->conn << " answered twice; second reply ignored";
      return;
    }
    if (state->io->get_executor().running_in_this_thread()) {
      if (auto self = state->impl.lock()) {
        self->CompleteRequest(state->conn, state->uid, state->request_id, state->request_type,
                              std::move(reply));
        self->ScheduleDisconnectFlush();
      }
      return;
    }
    // Off the loop: the fds are only borrowed until we return, so take
    // copies (of every frame's: a lease reply's EXTENT_FDS frames too).
    auto owned = std::make_shared<std::vector<UniqueFd>>();
    auto copy = [&owned](Reply* r) {
      for (int& fd : r->fds) {
        int d = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
        if (d < 0) return false;
        owned->emplace_back(d);
        fd = d;  // the copy, valid until the reply is sent
      }
      return true;
    };
    bool copied = copy(&reply);
    for (size_t i = 0; copied && i < reply.more.size(); ++i) copied = copy(&reply.more[i]);
    if (!copied) {
      reply = MakeErrorReply(Status::FromErrno(errno, "dup reply fd"));
      owned->clear();
    }
    asio::post(*state->io, [state, reply = std::move(reply), owned]() mutable {
      if (auto self = state->impl.lock()) {
        self->CompleteRequest(state->conn, state->uid, state->request_id, state->request_type,
                              std::move(reply));
        self->ScheduleDisconnectFlush();
      }
    });
  };
}

void Server::Impl::CompleteRequest(ConnectionId id, uid_t uid, uint64_t request_id,
                                   uint16_t request_type, Reply reply) {
  // Sending the reply is the uid's daemon time too (unless this runs inside
  // OnRequest, which is charged as a whole).
  BusyCharge charge(callback_depth_ == 0 ? busy_ : nullptr, uid);
  // The request counted against its uid until now, connection or not.
  request_share_.Sub(uid, 1);
  busy_->SetInFlight(uid, request_share_.used(uid), SteadyClock::now());
  std::shared_ptr<Connection> c = Get(id);
  if (!c || c->closed) return;  // the client is gone; nothing to answer
  if (c->inflight > 0) --c->inflight;

  // A reply the client could not accept is a daemon bug: say so instead.
  if (reply.payload.size() > options_.max_frame_bytes) {
    CXLPOOL_LOG(kError) << "server: " << wire::MsgTypeName(reply.type) << " reply of "
                        << reply.payload.size() << " bytes exceeds max_frame_bytes";
    reply = MakeErrorReply(Status(
        Code::kInternal,
        "reply too large for one frame (" + std::to_string(reply.payload.size()) + " bytes)"));
  } else if (reply.fds.size() >
             wire::MaxFdsForType(reply.type, limits().max_fds_per_frame, c->frame_version)) {
    CXLPOOL_LOG(kError) << "server: " << wire::MsgTypeName(reply.type) << " reply with "
                        << reply.fds.size() << " fds refused";
    reply = MakeErrorReply(Status(Code::kInternal, "daemon built a " +
                                                       wire::MsgTypeName(reply.type) + " with " +
                                                       std::to_string(reply.fds.size()) + " fds"));
  }

  bool close_after = false;
  if (request_type == proto::MSG_HELLO_REQUEST) {
    c->hello_pending = false;
    if (reply.type == proto::MSG_HELLO_REPLY) {
      proto::HelloReply hr;
      Status st = wire::Decode(reply.payload, &hr);
      if (st.ok() && hr.version() >= wire::kMinWireVersion &&
          hr.version() <= wire::kMaxWireVersion) {
        if (!c->hello_done) {
          c->hello_done = true;
          c->version = hr.version();
          if (limits().idle_timeout.count() > 0) {
            ArmIdleTimer(c, limits().idle_timeout);
          } else {
            c->idle_timer.cancel();
          }
        }
      } else {
        reply = MakeErrorReply(Status(Code::kInternal, "daemon built an invalid HelloReply"));
        close_after = true;
      }
    } else {
      close_after = !c->hello_done;  // a failed hello ends the connection
    }
  }
  bool substituted = false;
  bool queued = Enqueue(c, reply.type, request_id, reply.payload, reply.fds, &substituted);
  if (c->hello_done) c->frame_version = static_cast<uint16_t>(c->version);
  // The frames that follow it (a lease reply's EXTENT_FDS), at once and in
  // order; none after an error went in place of a frame. One that cannot
  // go leaves the client a reply it cannot finish: it reads the error (or
  // the closed connection) as the reply's failure, and gives the fds that
  // came back by closing the connection.
  for (size_t i = 0; queued && !substituted && i < reply.more.size(); ++i) {
    const Reply& m = reply.more[i];
    queued = Enqueue(c, m.type, request_id, m.payload, m.fds, &substituted);
  }
  if (!queued) return;
  if (close_after) {
    CloseAfterFlush(c, "HELLO failed");
    return;
  }
  StartRead(c);
}

bool Server::Impl::Enqueue(const std::shared_ptr<Connection>& c, proto::MsgType type,
                           uint64_t request_id, const std::string& payload,
                           std::span<const int> fds, bool* substituted) {
  if (c->closed || c->closing) return false;
  // Nothing queued ahead: send at once with the caller's fds, which are then
  // never duplicated (a lease grant's common case). Only a frame that has to
  // wait keeps duplicates of them.
  std::span<const int> borrowed;
  if (c->queue.empty() && !fds.empty() && fds.size() <= wire::kHardMaxFdsPerFrame) {
    borrowed = fds;
    fds = {};
  }
  Result<wire::OutFrame> f = wire::MakeOutFrame(type, request_id, payload, fds, c->frame_version);
  if (f.ok() && c->queue.empty()) {
    Result<bool> sent = wire::SendSome(c->fd(), &*f, borrowed);
    if (!sent.ok()) {
      Drop(c, sent.status().ToString());
      return false;
    }
    if (*sent) {
      ++stats_.frames_out;
      return true;
    }
    if (f->sent == 0 && !borrowed.empty()) {
      Status kept = wire::KeepFds(&*f, borrowed);
      if (!kept.ok()) f = kept;
    }
  }
  if (!f.ok()) {
    // Typically EMFILE while dup'ing the fds: the client gets the error
    // instead of a reply it cannot use.
    CXLPOOL_LOG(kError) << "server: " << Describe(*c) << ": " << f.status().ToString();
    if (substituted != nullptr) *substituted = true;
    f = wire::MakeOutFrame(proto::MSG_ERROR_REPLY, request_id, wire::EncodeErrorPayload(f.status()),
                           {}, c->frame_version);
    if (!f.ok()) {
      Drop(c, f.status().ToString());
      return false;
    }
  }
  return QueueChecked(c, std::move(*f));
}

std::shared_ptr<Connection> Server::Impl::LargestQueue(std::optional<uid_t> uid) {
  std::shared_ptr<Connection> best;
  for (auto& [id, c] : conns_) {
    if (c->closing || c->queued_bytes == 0 || (uid && c->uid() != *uid)) continue;
    if (!best || c->queued_bytes > best->queued_bytes) best = c;
  }
  return best;
}

bool Server::Impl::QueueChecked(const std::shared_ptr<Connection>& c, wire::OutFrame f) {
  if (f.sent > 0) {
    // Partly on the wire already (the queue was empty): the rest must
    // follow whatever happens, or the stream loses its framing.
    c->last_progress = SteadyClock::now();
    QueueUnchecked(c, std::move(f));
    return !c->closed;
  }
  const uint64_t cost = f.bytes.size() + kFrameOverhead;
  const size_t nfds = f.fds.size();
  if (nfds > 0) {
    if (FairShare::Verdict v = fd_share_.Check(c->uid(), nfds); v != FairShare::Verdict::kOk) {
      Abort(c, 0,
            Status(Code::kResourceExhausted,
                   "a reply's fds cannot wait for a client that does not read: " +
                       Explain(fd_share_, kFdNames, v, c->uid(), nfds)),
            LimitName(kFdNames, v));
      return false;
    }
  }
  const uint64_t per_conn = limits().max_queued_bytes_per_connection;
  if (c->queued_bytes + cost > per_conn) {
    Abort(c, 0,
          Status(Code::kResourceExhausted,
                 std::to_string(c->queued_bytes + cost) +
                     " reply bytes would be queued for a client that does not read; "
                     "limits.max_queued_bytes_per_connection is " +
                     std::to_string(per_conn)),
          "max_queued_bytes_per_connection");
    return false;
  }
  for (;;) {
    FairShare::Verdict v = queue_share_.Check(c->uid(), cost);
    if (v == FairShare::Verdict::kOk) break;
    // Make room by dropping the largest queue: the uid's own (per-uid
    // limit), or the daemon's. A client that reads has none.
    std::shared_ptr<Connection> victim = LargestQueue(
        v == FairShare::Verdict::kPerUid ? std::optional<uid_t>(c->uid()) : std::nullopt);
    const char* limit = LimitName(kQueueNames, v);
    Status st(Code::kResourceExhausted,
              "dropped: this connection held the largest queue of unread replies (" +
                  std::to_string(victim ? victim->queued_bytes : c->queued_bytes) +
                  " bytes) when " + Explain(queue_share_, kQueueNames, v, c->uid(), cost));
    if (!victim || victim == c) {
      Abort(c, 0, st, limit);
      return false;
    }
    Abort(victim, 0, st, limit);
  }
  if (c->queue.empty()) c->last_progress = SteadyClock::now();
  QueueUnchecked(c, std::move(f));
  return !c->closed;
}

void Server::Impl::QueueUnchecked(const std::shared_ptr<Connection>& c, wire::OutFrame f) {
  Queued q;
  q.cost = f.bytes.size() + kFrameOverhead;
  q.fds = f.fds.size();
  q.frame = std::move(f);
  c->queued_bytes += q.cost;
  queue_share_.Add(c->uid(), q.cost);
  fd_share_.Add(c->uid(), q.fds);
  c->queue.push_back(std::move(q));
  Flush(c);
}

void Server::Impl::Uncharge(Connection* c, Queued& q) {
  c->queued_bytes -= q.cost;
  queue_share_.Sub(c->uid(), q.cost);
  fd_share_.Sub(c->uid(), q.fds);
  q.cost = 0;
  q.fds = 0;
}

void Server::Impl::DiscardQueue(Connection* c) {
  size_t keep = !c->queue.empty() && c->queue.front().frame.sent > 0 ? 1 : 0;
  while (c->queue.size() > keep) {
    Uncharge(c, c->queue.back());
    c->queue.pop_back();  // closes its fds
  }
}

void Server::Impl::QueueError(const std::shared_ptr<Connection>& c, uint64_t request_id,
                              const Status& st) {
  CXLPOOL_LOG(kInfo) << "server: " << Describe(*c) << ": " << st.ToString();
  Enqueue(c, proto::MSG_ERROR_REPLY, request_id, wire::EncodeErrorPayload(st), {});
}

void Server::Impl::Abort(const std::shared_ptr<Connection>& c, uint64_t request_id,
                         const Status& st, const char* limit) {
  if (c->closed || c->closing) return;
  DropAssembly(c.get());  // a RECLAIM still coming in is refused with the connection
  if (limit != nullptr) {
    Hit(limit);
    LogLimit(limit, "closing " + Describe(*c) + ": " + st.message());
  } else {
    CXLPOOL_LOG(kInfo) << "server: closing " << Describe(*c) << ": " << st.ToString();
  }
  DiscardQueue(c.get());
  Result<wire::OutFrame> f = wire::MakeOutFrame(proto::MSG_ERROR_REPLY, request_id,
                                                wire::EncodeErrorPayload(st), {}, c->frame_version);
  if (!f.ok()) {
    Drop(c, st.message());
    return;
  }
  if (c->queue.empty()) c->last_progress = SteadyClock::now();
  c->closing = true;  // nothing more is read or queued
  c->closing_reason = st.message();
  QueueUnchecked(c, std::move(*f));  // Flush closes once the queue is out
  if (c->closed) return;
  // Do not wait forever for a client that does not read its error.
  CancelFrameTimer(c.get());
  ArmFrameTimer(c, limits().frame_timeout);
}

void Server::Impl::Flush(const std::shared_ptr<Connection>& c) {
  while (!c->closed && !c->queue.empty()) {
    Queued& q = c->queue.front();
    const size_t before = q.frame.sent;
    Result<bool> done = wire::SendSome(c->fd(), &q.frame);
    if (!done.ok()) {
      Drop(c, done.status().ToString());
      return;
    }
    if (q.frame.sent != before) c->last_progress = SteadyClock::now();
    if (q.fds > 0 && q.frame.fds.empty()) {  // the kernel took them
      fd_share_.Sub(c->uid(), q.fds);
      q.fds = 0;
    }
    if (!*done) {
      if (limits().send_timeout.count() > 0 && !c->send_timer_armed) {
        ArmSendTimer(c, limits().send_timeout);
      }
      if (!c->writing) {
        c->writing = true;
        c->socket.async_wait(stream_protocol::socket::wait_write,
                             [weak = weak_from_this(), c](const error_code& ec) {
                               c->writing = false;
                               auto self = weak.lock();
                               if (!self || c->closed) return;
                               if (ec) {
                                 self->Drop(c, "wait for output: " + ec.message());
                               } else {
                                 self->Flush(c);
                               }
                               self->ScheduleDisconnectFlush();
                             });
      }
      return;
    }
    Uncharge(c.get(), q);
    c->queue.pop_front();
    ++stats_.frames_out;
  }
  if (c->closed) return;
  if (c->closing) {
    if (c->queue.empty()) Drop(c, c->closing_reason);
    return;
  }
  StartRead(c);  // the queue drained: read requests again
}

void Server::Impl::CloseAfterFlush(const std::shared_ptr<Connection>& c, std::string reason) {
  if (c->closed || c->closing) return;
  c->closing = true;
  c->closing_reason = std::move(reason);
  if (c->queue.empty()) {
    Drop(c, c->closing_reason);
    return;
  }
  // Do not wait forever for a client that does not read its error.
  CancelFrameTimer(c.get());
  ArmFrameTimer(c, limits().frame_timeout);
}

void Server::Impl::Drop(const std::shared_ptr<Connection>& c, const std::string& reason) {
  if (c->closed) return;
  c->closed = true;
  CXLPOOL_LOG(kInfo) << "server: closing " << Describe(*c) << ": " << reason;
  error_code ec;
  c->socket.close(ec);  // outstanding waits complete with operation_aborted
  c->frame_timer_armed = false;
  c->frame_timer.cancel();
  c->idle_timer.cancel();
  c->send_timer.cancel();
  for (Queued& q : c->queue) Uncharge(c.get(), q);
  c->queue.clear();                                   // closes queued fds
  c->reader = wire::FrameReader(c->reader.limits());  // closes fds of a frame begun
  SyncReaderFds(c.get());
  DropAssembly(c.get());
  c->pidfd.Reset();
  c->peer.pidfd = -1;
  conn_share_.Sub(c->uid(), 1);
  conns_.erase(c->id);
  pending_disconnects_.push_back(c->id);
  ScheduleDisconnectFlush();
}

Status Server::Impl::Push(ConnectionId id, Reply reply) {
  std::shared_ptr<Connection> c = Get(id);
  if (!c || c->closed) return Status(Code::kNotFound, "no connection " + std::to_string(id));
  if (!c->hello_done) {
    return Status(Code::kUnavailable, "connection " + std::to_string(id) + " has not said HELLO");
  }
  if (reply.payload.size() > options_.max_frame_bytes) {
    return Status(Code::kInvalidArgument, "push payload over max_frame_bytes");
  }
  if (reply.fds.size() > wire::kHardMaxFdsPerFrame) {
    return Status(Code::kInvalidArgument, "too many fds on one push");
  }
  if (!Enqueue(c, reply.type, 0, reply.payload, reply.fds)) {
    return Status(Code::kUnavailable,
                  "connection " + std::to_string(id) + " dropped: it does not read its socket");
  }
  return Status::Ok();
}

Status Server::Impl::MarkHelloDone(ConnectionId id, uint32_t version) {
  std::shared_ptr<Connection> c = Get(id);
  if (!c || c->closed) return Status(Code::kNotFound, "no connection " + std::to_string(id));
  if (version < wire::kMinWireVersion || version > wire::kMaxWireVersion) {
    return Status(Code::kInvalidArgument,
                  "version " + std::to_string(version) + " is not one this server speaks");
  }
  if (!c->hello_done) {
    c->hello_done = true;
    c->version = version;
    c->frame_version = static_cast<uint16_t>(version);
    if (limits().idle_timeout.count() > 0) {
      ArmIdleTimer(c, limits().idle_timeout);
    } else {
      c->idle_timer.cancel();
    }
  }
  return Status::Ok();
}

ServerStats Server::Impl::Stats() const {
  ServerStats s = stats_;
  s.connections = conns_.size();
  s.requests_in_flight = request_share_.used();
  s.queued_bytes = queue_share_.used();
  s.fds_held = fd_share_.used();
  return s;
}

// ---- Server ------------------------------------------------------------------

namespace {

// Protobuf logs one line per undecodable string field it meets; a hostile
// client could flood the journal with them. Route them through our log, at
// most one line per second (the client already gets an error reply).
void RateLimitedProtobufLog(google::protobuf::LogLevel level, const char* filename, int line,
                            const std::string& message) {
  static std::atomic<int64_t> last_ns{0};
  static std::atomic<uint64_t> dropped{0};
  (void)level;
  int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                    std::chrono::steady_clock::now().time_since_epoch())
                    .count();
  int64_t prev = last_ns.load();
  if (now - prev < 1'000'000'000 || !last_ns.compare_exchange_strong(prev, now)) {
    ++dropped;
    return;
  }
  CXLPOOL_LOG(kWarning) << "protobuf " << filename << ":" << line << ": " << message << " ("
                        << dropped.exchange(0) << " similar lines dropped)";
}

}  // namespace

Result<std::unique_ptr<Server>> Server::Create(asio::io_context& io, ServerOptions options,
                                               RequestHandler* handler) {
  google::protobuf::SetLogHandler(&RateLimitedProtobufLog);
  auto impl = std::make_shared<Impl>(io, std::move(options), handler);
  CXLPOOL_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Server::Server(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() {
  impl_->Stop();
  impl_->FlushDisconnectsNow();
}

void Server::Stop() { impl_->Stop(); }

Result<ConnectionId> Server::AddConnection(UniqueFd fd) {
  int v = 0;
  socklen_t len = sizeof v;
  if (!fd || ::getsockopt(fd.get(), SOL_SOCKET, SO_DOMAIN, &v, &len) != 0 || v != AF_UNIX) {
    return Status(Code::kInvalidArgument, "AddConnection: not an AF_UNIX socket");
  }
  len = sizeof v;
  if (::getsockopt(fd.get(), SOL_SOCKET, SO_TYPE, &v, &len) != 0 || v != SOCK_STREAM) {
    return Status(Code::kInvalidArgument, "AddConnection: not a SOCK_STREAM socket");
  }
  int fl = ::fcntl(fd.get(), F_GETFL);
  if (fl < 0 || ::fcntl(fd.get(), F_SETFL, fl | O_NONBLOCK) != 0 ||
      ::fcntl(fd.get(), F_SETFD, FD_CLOEXEC) != 0) {
    return Status::FromErrno(errno, "AddConnection: fcntl");
  }
  return impl_->Admit(std::move(fd));
}

Status Server::Push(ConnectionId conn, Reply reply) {
  Status st = impl_->Push(conn, std::move(reply));
  impl_->ScheduleDisconnectFlush();
  return st;
}

Status Server::MarkHelloDone(ConnectionId conn, uint32_t version) {
  return impl_->MarkHelloDone(conn, version);
}

bool Server::IsConnected(ConnectionId conn) const { return impl_->Find(conn) != nullptr; }

std::optional<uint32_t> Server::NegotiatedVersion(ConnectionId conn) const {
  const Connection* c = impl_->Find(conn);
  if (c == nullptr || !c->hello_done) return std::nullopt;
  return c->version;
}

size_t Server::connection_count() const { return impl_->conns_.size(); }

ServerStats Server::stats() const { return impl_->Stats(); }

const ServerOptions& Server::options() const { return impl_->options_; }
const std::string& Server::socket_path() const { return impl_->options_.socket_path; }
asio::io_context& Server::io_context() { return impl_->io_; }

}  // namespace cxlpool
