#include "server/server.h"

#include <errno.h>
#include <fcntl.h>
#include <google/protobuf/stubs/logging.h>
#include <sys/socket.h>

#include <atomic>
#include <boost/asio/post.hpp>
#include <chrono>
#include <utility>

#include "cxlpool/common/log.h"
#include "server/server_impl.h"

namespace cxlpool {

namespace asio = boost::asio;

// ---- setup and shutdown ------------------------------------------------------

Server::Impl::Impl(asio::io_context& io, ServerOptions options, RequestHandler* handler)
    : io_(io),
      options_(std::move(options)),
      handler_(handler),
      listener_(std::make_shared<Listener>(io, options_.accept_backoff, &counters_)),
      admission_(options_.limits, options_.busy),
      throttle_timer_(io) {}

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
  CXLPOOL_RETURN_IF_ERROR(listener_->Open(std::move(listen_fd), &options_));
  listener_->Start([weak = weak_from_this()](UniqueFd fd) {
    if (auto self = weak.lock()) {
      Result<ConnectionId> r = self->Admit(std::move(fd));
      (void)r;  // refusals are counted and logged by Admit
    }
  });
  CXLPOOL_LOG(kInfo) << "server: listening on "
                     << (options_.socket_path.empty() ? std::string("inherited fd")
                                                      : options_.socket_path);
  return Status::Ok();
}

void Server::Impl::Stop() {
  if (stopped_) return;
  stopped_ = true;
  listener_->Stop();
  throttle_timer_.cancel();
  parked_.clear();
  std::vector<ConnPtr> all;
  for (auto& [id, c] : conns_) all.push_back(c);
  for (auto& c : all) Drop(c, "server stopping");
  if (callback_depth_ == 0) FlushDisconnectsNow();
}

void Server::Impl::FlushDisconnectsNow() {
  while (!pending_disconnects_.empty()) {
    std::vector<ConnectionId> ids;
    ids.swap(pending_disconnects_);
    for (ConnectionId id : ids) Callback([&] { handler_->OnDisconnect(id); });
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

ServerStats Server::Impl::Stats() const {
  ServerStats s = counters_.stats();
  s.connections = conns_.size();
  s.requests_in_flight = admission_.requests();
  s.queued_bytes = admission_.queued_bytes();
  s.fds_held = admission_.fds();
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
  if (c == nullptr || !c->hello_done()) return std::nullopt;
  return c->version();
}

size_t Server::connection_count() const { return impl_->connection_count(); }

ServerStats Server::stats() const { return impl_->Stats(); }

const ServerOptions& Server::options() const { return impl_->options(); }
const std::string& Server::socket_path() const { return impl_->options().socket_path; }
asio::io_context& Server::io_context() { return impl_->io(); }

}  // namespace cxlpool
