// Connection: one client of the server. It owns the socket, the peer's
// credentials and pidfd, the reader (with RECLAIM reassembly), the send
// queue and the timers, and keeps the connection's state: whether a read or
// write wait is outstanding, hello, requests in flight, closing and closed.
// What happens on the socket is decided by the server; Connection keeps it
// consistent (Close releases everything at once).
//
// Thread safety: the io_context's thread.
#pragma once

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "cxlpool/common/unique_fd.h"
#include "cxlpool/proto/frame.h"
#include "server/admission.h"
#include "server/conn_reader.h"
#include "server/conn_timers.h"
#include "server/handler.h"
#include "server/send_queue.h"

namespace cxlpool {

class Connection {
 public:
  using Clock = std::chrono::steady_clock;
  using Socket = boost::asio::local::stream_protocol::socket;

  // `peer.pidfd` is set from `pidfd`, which the connection owns.
  Connection(boost::asio::io_context& io, ConnectionId id, PeerInfo peer, UniqueFd pidfd,
             wire::RecvLimits limits, Admission* admission);
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  ConnectionId id() const { return id_; }
  const PeerInfo& peer() const { return peer_; }
  uid_t uid() const { return peer_.uid; }
  Socket& socket() { return socket_; }
  int fd() { return socket_.native_handle(); }
  ConnectionReader& reader() { return reader_; }
  SendQueue& queue() { return queue_; }
  ConnectionTimers& timers() { return timers_; }
  // "connection 7 (pid 1234, uid 1000, comm)" for log lines.
  std::string Describe() const;

  // Closing: nothing more is read or queued; closed once the queue is out.
  bool closing() const { return closing_; }
  const std::string& closing_reason() const { return closing_reason_; }
  void StartClosing(std::string reason);
  // Closed: the socket, its timers, queue, reader and pidfd are released.
  bool closed() const { return closed_; }
  void Close();

  // Outstanding async waits on the socket, and parked: not read while its
  // uid is over limits.max_busy_per_uid.
  bool reading() const { return reading_; }
  void set_reading(bool on) { reading_ = on; }
  bool writing() const { return writing_; }
  void set_writing(bool on) { writing_ = on; }
  bool parked() const { return parked_; }
  void set_parked(bool on) { parked_ = on; }

  // Hello: pending while a HELLO is with the handler; done once a version is
  // negotiated. Frames to the client are written in kHelloWireVersion until
  // the HELLO reply is queued, then in the negotiated version.
  bool hello_pending() const { return hello_pending_; }
  void set_hello_pending(bool on) { hello_pending_ = on; }
  bool hello_done() const { return hello_done_; }
  uint32_t version() const { return version_; }
  void SetHelloDone(uint32_t version);
  uint16_t frame_version() const { return frame_version_; }
  void UseNegotiatedFrameVersion();

  // Requests handed to the handler and not answered.
  size_t inflight() const { return inflight_; }
  void AddInflight() { ++inflight_; }
  void RemoveInflight();

  // When the last frame came in (the idle timeout counts from it).
  Clock::time_point last_input() const { return last_input_; }
  void set_last_input(Clock::time_point t) { last_input_ = t; }

 private:
  const ConnectionId id_;
  Socket socket_;
  PeerInfo peer_;
  UniqueFd pidfd_;
  ConnectionReader reader_;
  SendQueue queue_;
  ConnectionTimers timers_;
  Clock::time_point last_input_;
  bool reading_ = false;
  bool writing_ = false;
  bool parked_ = false;
  bool closing_ = false;
  std::string closing_reason_;
  bool closed_ = false;
  bool hello_pending_ = false;
  bool hello_done_ = false;
  uint32_t version_ = 0;
  uint16_t frame_version_ = wire::kHelloWireVersion;
  size_t inflight_ = 0;
};

}  // namespace cxlpool
