#include "server/connection.h"

#include <utility>

namespace cxlpool {

Connection::Connection(boost::asio::io_context& io, ConnectionId id, PeerInfo peer, UniqueFd pidfd,
                       wire::RecvLimits limits, Admission* admission)
    : id_(id),
      socket_(io),
      peer_(std::move(peer)),
      pidfd_(std::move(pidfd)),
      reader_(limits, admission, peer_.uid),
      queue_(admission, peer_.uid),
      timers_(io) {
  peer_.pidfd = pidfd_.get();
}

std::string Connection::Describe() const {
  return "connection " + std::to_string(id_) + " (pid " + std::to_string(peer_.pid) + ", uid " +
         std::to_string(peer_.uid) + ", " + (peer_.comm.empty() ? std::string("?") : peer_.comm) +
         ")";
}

void Connection::StartClosing(std::string reason) {
  closing_ = true;
  closing_reason_ = std::move(reason);
}

void Connection::Close() {
  closed_ = true;
  boost::system::error_code ec;
  socket_.close(ec);  // outstanding waits complete with operation_aborted
  timers_.CancelAll();
  queue_.Clear();   // closes queued fds
  reader_.Reset();  // closes fds of a frame begun and of a RECLAIM being assembled
  pidfd_.Reset();
  peer_.pidfd = -1;
}

void Connection::SetHelloDone(uint32_t version) {
  hello_done_ = true;
  version_ = version;
}

void Connection::UseNegotiatedFrameVersion() {
  if (hello_done_) frame_version_ = static_cast<uint16_t>(version_);
}

void Connection::RemoveInflight() {
  if (inflight_ > 0) --inflight_;
}

}  // namespace cxlpool
