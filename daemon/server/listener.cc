#include "server/listener.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "cxlpool/common/log.h"
#include "cxlpool/proto/socket.h"
#include "server/server.h"

namespace cxlpool {

namespace asio = boost::asio;
using asio::local::stream_protocol;
using boost::system::error_code;

namespace {
constexpr int kMaxAcceptsPerWakeup = 64;
}  // namespace

Listener::Listener(asio::io_context& io, std::chrono::milliseconds backoff,
                   ServerCounters* counters)
    : acceptor_(io), backoff_timer_(io), backoff_(backoff), counters_(counters) {}

Status Listener::Open(UniqueFd listen_fd, ServerOptions* options) {
  if (listen_fd.valid()) {
    CXLPOOL_RETURN_IF_ERROR(wire::CheckListeningUnixSocket(listen_fd.get()));
    int fl = ::fcntl(listen_fd.get(), F_GETFL);
    if (fl < 0 || ::fcntl(listen_fd.get(), F_SETFL, fl | O_NONBLOCK) != 0 ||
        ::fcntl(listen_fd.get(), F_SETFD, FD_CLOEXEC) != 0) {
      return Status::FromErrno(errno, "server: set listening fd non-blocking");
    }
    options->socket_path.clear();
  } else if (!options->socket_path.empty()) {
    wire::ListenOptions lo;
    lo.path = options->socket_path;
    lo.mode = options->socket_mode;
    lo.group = options->socket_group;
    lo.backlog = options->backlog;
    Result<UniqueFd> fd = wire::ListenUnix(lo);
    if (!fd.ok()) return fd.status();
    listen_fd = std::move(*fd);
    struct stat st;
    if (::stat(options->socket_path.c_str(), &st) == 0) {
      created_path_ = options->socket_path;
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
  return Status::Ok();
}

void Listener::Start(AcceptFn on_accept) {
  on_accept_ = std::move(on_accept);
  Wait();
}

void Listener::Stop() {
  if (stopped_) return;
  stopped_ = true;
  error_code ec;
  backoff_timer_.cancel();
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
}

void Listener::Wait() {
  if (stopped_) return;
  acceptor_.async_wait(
      stream_protocol::acceptor::wait_read, [weak = weak_from_this()](const error_code& ec) {
        auto self = weak.lock();
        if (!self || self->stopped_ || ec == asio::error::operation_aborted) {
          return;
        }
        if (ec) {
          CXLPOOL_LOG(kError) << "server: wait on listening socket: " << ec.message();
          self->counters_->AcceptError();
          self->BackOff();
          return;
        }
        self->AcceptReady();
      });
}

void Listener::BackOff() {
  backoff_timer_.expires_after(backoff_);
  backoff_timer_.async_wait([weak = weak_from_this()](const error_code& ec) {
    auto self = weak.lock();
    if (self && !ec) self->Wait();
  });
}

void Listener::AcceptReady() {
  // Keeps `this` alive across on_accept_ (a handler callback may Stop us).
  auto self = shared_from_this();
  for (int i = 0; i < kMaxAcceptsPerWakeup && !stopped_; ++i) {
    int fd = ::accept4(acceptor_.native_handle(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      int err = errno;
      if (err == EAGAIN || err == EWOULDBLOCK) break;
      if (err == EINTR || err == ECONNABORTED || err == EPROTO) continue;
      counters_->AcceptError();
      if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
        // The pending connection stays in the backlog; retrying now would
        // spin. Back off, then accept again.
        CXLPOOL_LOG(kWarning) << "server: accept: " << std::strerror(err) << "; retrying in "
                              << backoff_.count() << " ms";
        BackOff();
        return;
      }
      CXLPOOL_LOG(kError) << "server: accept: " << std::strerror(err);
      break;
    }
    on_accept_(UniqueFd(fd));
  }
  Wait();
}

}  // namespace cxlpool
