// Server::Impl: what runs the server's connections on the loop. The units
// it wires (server/listener.h, connection.h, conn_reader.h, send_queue.h,
// conn_timers.h, admission.h, counters.h) each keep their own state; Impl
// decides what happens between them, in one file per job:
//   server.cc       setup, shutdown and the Server façade
//   connections.cc  admitting, closing and aborting connections; pushes
//   reading.cc      reading frames, busy-budget parking, dispatch to the handler
//   replies.cc      replies and pushes into the send queues, flushing them
//   timeouts.cc     the hello, idle, frame and send timeouts
//
// Thread safety: the io_context's thread, except the ReplyFns it makes.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cxlpool/common/fs.h"
#include "server/admission.h"
#include "server/connection.h"
#include "server/counters.h"
#include "server/listener.h"
#include "server/server.h"

namespace cxlpool {

class Server::Impl : public std::enable_shared_from_this<Server::Impl> {
 public:
  using Clock = std::chrono::steady_clock;

  Impl(boost::asio::io_context& io, ServerOptions options, RequestHandler* handler);

  Status Init();
  void Stop();
  void FlushDisconnectsNow();
  // Runs owed OnDisconnects now, or posts that for when no handler callback
  // is on the stack.
  void ScheduleDisconnectFlush();

  Result<ConnectionId> Admit(UniqueFd fd);
  Status Push(ConnectionId id, Reply reply);
  Status MarkHelloDone(ConnectionId id, uint32_t version);
  void CompleteRequest(ConnectionId id, uid_t uid, uint64_t request_id, uint16_t request_type,
                       Reply reply);

  const Connection* Find(ConnectionId id) const;
  size_t connection_count() const { return conns_.size(); }
  ServerStats Stats() const;
  const ServerOptions& options() const { return options_; }
  boost::asio::io_context& io() { return io_; }

 private:
  using ConnPtr = std::shared_ptr<Connection>;
  const ServerLimits& limits() const { return options_.limits; }
  ConnPtr Get(ConnectionId id);
  // Runs `fn` as a handler callback (OnDisconnects wait until it returns).
  template <typename F>
  void Callback(F&& fn) {
    ++callback_depth_;
    fn();
    --callback_depth_;
  }

  // reading.cc
  void StartRead(const ConnPtr& c);
  void DoRead(const ConnPtr& c);
  // Handles what one Read brought; false when reading `c` must stop.
  bool OnReadProgress(const ConnPtr& c, const Result<wire::FrameReader::Progress>& p);
  void OnReadError(const ConnPtr& c, const Status& st);
  void RefuseFds(const ConnPtr& c);
  // Stops reading `c` until its uid's busy budget refills.
  void Park(const ConnPtr& c, Clock::time_point now);
  void ArmThrottleTimer(Clock::time_point at);
  void OnThrottleTimer();
  void HandleFrame(const ConnPtr& c, wire::Frame frame);
  // The refusal a request frame gets before it reaches the handler, if any.
  std::optional<Status> Gate(const Connection& c, const wire::Frame& frame);
  void Dispatch(const ConnPtr& c, wire::Frame frame);

  // replies.cc
  ReplyFn MakeReplyFn(ConnectionId id, uid_t uid, uint64_t request_id, uint16_t request_type);
  // A reply the client could not accept, as the error the client gets.
  void CheckReply(const Connection& c, Reply* reply) const;
  // The HELLO reply's effect on `c`; true when the connection ends after it.
  bool OnHelloReply(const ConnPtr& c, Reply* reply);
  // Sends at once what fits, queues the rest (within the queue limits);
  // false if the connection is (now) closed or closing. `substituted` (when
  // given) says whether the frame could not be made (its fds not
  // duplicated) and an ERROR_REPLY went in its place.
  bool Enqueue(const ConnPtr& c, proto::MsgType type, uint64_t request_id,
               const std::string& payload, std::span<const int> fds, bool* substituted = nullptr);
  bool QueueChecked(const ConnPtr& c, wire::OutFrame f);
  // Makes room for `cost` queued bytes of `c`'s uid, dropping the largest
  // queues; false when `c` itself was dropped.
  bool MakeQueueRoom(const ConnPtr& c, uint64_t cost);
  void QueueUnchecked(const ConnPtr& c, wire::OutFrame f);
  void QueueError(const ConnPtr& c, uint64_t request_id, const Status& st);
  void Flush(const ConnPtr& c);
  void WaitWritable(const ConnPtr& c);
  // The open connection (not closing) with the most bytes queued, of `uid`
  // only when given; nullptr if none has any.
  ConnPtr LargestQueue(std::optional<uid_t> uid);

  // connections.cc
  // Closes `c` for breaking `limit` (nullptr: a protocol error): counts the
  // hit, drops what is queued, sends `st` as an ERROR_REPLY, then closes.
  void Abort(const ConnPtr& c, uint64_t request_id, const Status& st, const char* limit);
  void CloseAfterFlush(const ConnPtr& c, std::string reason);
  void Drop(const ConnPtr& c, const std::string& reason);

  // timeouts.cc
  // What a timer of `c` runs: `on`, unless the server or `c` is gone.
  ConnectionTimers::Fn OnLoop(const ConnPtr& c, void (Impl::*on)(const ConnPtr&));
  void ArmIdleTimer(const ConnPtr& c, std::chrono::milliseconds after);
  void OnIdleTimer(const ConnPtr& c);
  void ArmIdleAfterHello(const ConnPtr& c);
  void ArmSendTimer(const ConnPtr& c, std::chrono::milliseconds after);
  void OnSendTimer(const ConnPtr& c);
  void ArmFrameTimer(const ConnPtr& c, std::chrono::milliseconds after);
  void OnFrameTimer(const ConnPtr& c);
  // Bounds the wait for a closing connection's last frames.
  void ArmCloseTimer(const ConnPtr& c);

  boost::asio::io_context& io_;
  ServerOptions options_;
  RequestHandler* handler_;
  std::unique_ptr<FileSystem> own_fs_;
  const FileSystem* fs_ = nullptr;
  ServerCounters counters_;
  std::shared_ptr<Listener> listener_;
  Admission admission_;
  // Connections not read because their uid is over its busy budget, and the
  // timer that reads them again.
  std::vector<ConnPtr> parked_;
  boost::asio::steady_timer throttle_timer_;
  bool throttle_timer_armed_ = false;
  Clock::time_point throttle_timer_at_;
  bool stopped_ = false;
  ConnectionId next_id_ = 1;
  std::map<ConnectionId, ConnPtr> conns_;
  std::vector<ConnectionId> pending_disconnects_;
  bool disconnect_flush_posted_ = false;
  int callback_depth_ = 0;  // > 0 while inside a handler callback
};

// "250 ms".
inline std::string Ms(std::chrono::milliseconds d) { return std::to_string(d.count()) + " ms"; }

}  // namespace cxlpool
