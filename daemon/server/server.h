// Server: the daemon's Unix-socket front door. It owns the listening socket
// and every connection, speaks the framing of docs/protocol.md, passes fds
// with their frames, and hands whole requests to a RequestHandler.
//
// One Boost.Asio io_context thread runs everything. Reads are
// async_wait(wait_read) followed by non-blocking recvmsg (so fds arrive with
// their bytes); writes are non-blocking sendmsg with the reply's fds, queued
// when the socket is full. server/server_impl.h lists the units behind this
// façade (listener, connection, reader, send queue, timers, admission).
//
// What one client may make the daemon hold is bounded by ServerLimits
// (server/limits.h), per connection, per uid and for the whole daemon, and
// every refusal names its `limits.` key, in the client's error and in
// stats().limit_hits:
//   * connections: over a limit, the connection is accepted, sent one
//     ERROR_REPLY (request id 0) naming the limit, and closed;
//   * requests in flight: per connection the server stops reading; per uid
//     and in all the request is answered RESOURCE_EXHAUSTED;
//   * queued reply bytes: a connection whose replies are queued is not read
//     from until they drain; beyond a limit the largest queue is dropped;
//   * fds: an fd over a limit is closed as it arrives, and the connection is
//     refused its frame and closed;
//   * daemon time: a uid over limits.max_busy_per_uid next to a lighter
//     active uid is not read from until its budget refills (backpressure,
//     no error; server/busy_budget.h), and one connection is served at
//     most kFramesPerTurn frames before the others get a turn;
//   * time: hello, idle (after HELLO, holding nothing: see
//     RequestHandler::HoldsResources), frame and send timeouts.
// A connection closed for a limit gets an ERROR_REPLY naming it first (a
// bad frame's reply echoes its request id, the others carry id 0) and is
// closed once that is sent, or after frame_timeout. Other misbehaviour: bad
// header => error reply and close; EOF mid-frame => close; unknown type =>
// error reply, keep serving; requests before a successful HELLO => refused
// with an error reply.
//
// The handler learns of a successful hello when it answers a HELLO request
// with MSG_HELLO_REPLY (the server reads the version from it), or when it
// calls MarkHelloDone. An error reply to HELLO closes the connection after
// the reply is sent. OnDisconnect is called exactly once per OnConnect, never
// from inside another handler callback (it is deferred to the loop).
//
// Thread safety: create, use and destroy the Server on the io_context's
// thread (or while that io_context is not running). The ReplyFn given to
// OnRequest may be called from any thread: off the loop it dups the reply's
// fds and posts the reply to the loop. The io_context must outlive the
// Server and every ReplyFn the handler keeps.
#pragma once

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "cxlpool/common/fs.h"
#include "cxlpool/common/status.h"
#include "cxlpool/common/unique_fd.h"
#include "cxlpool/proto/frame.h"
#include "server/busy_budget.h"
#include "server/handler.h"
#include "server/limits.h"

namespace cxlpool {

struct ServerOptions {
  // Where to listen: `socket_path` (the server creates the socket, mode
  // `socket_mode`, group `socket_group`, and removes a stale socket file only
  // if nothing listens on it) or `listen_fd` >= 0 (an already listening
  // AF_UNIX stream socket, e.g. from systemd; the server takes ownership).
  std::string socket_path;
  int listen_fd = -1;
  mode_t socket_mode = 0660;
  std::optional<gid_t> socket_group;
  int backlog = 128;

  // Largest reply payload (see docs/protocol.md); requests are bounded by
  // limits.max_request_bytes.
  uint32_t max_frame_bytes = wire::kDefaultMaxFrameBytes;  // payload, <= kHardMaxFrameBytes

  // What clients may make the server hold (server/limits.h).
  ServerLimits limits;

  // Where the daemon time each uid takes is charged (the server charges its
  // loop time; the lease manager its workers'). Borrowed; must outlive the
  // server. nullptr: the server keeps its own, from
  // limits.max_busy_per_uid.
  BusyBudget* busy = nullptr;

  // After accept fails for lack of fds (EMFILE/ENFILE), wait this long
  // before accepting again (never spin).
  std::chrono::milliseconds accept_backoff{100};

  // Reads /proc/<pid>/comm and /proc/<pid>/cgroup. nullptr: the real "/".
  const FileSystem* fs = nullptr;
};

struct ServerStats {
  uint64_t accepted = 0;  // connections admitted (OnConnect called)
  uint64_t accept_errors = 0;
  uint64_t frames_in = 0;
  uint64_t frames_out = 0;
  uint64_t protocol_errors = 0;  // bad header, truncated, bad fds, unknown type
  // Refusals and drops by the limit that caused them, keyed by its name
  // without "limits." ("max_connections_per_uid", "idle_timeout", ...).
  std::map<std::string, uint64_t> limit_hits;
  // Now.
  uint64_t connections = 0;
  uint64_t requests_in_flight = 0;  // also those of connections already closed
  uint64_t queued_bytes = 0;        // with kFrameOverhead per frame
  uint64_t fds_held = 0;            // received with unhandled frames, and queued

  uint64_t hits(const std::string& limit) const {
    auto it = limit_hits.find(limit);
    return it == limit_hits.end() ? 0 : it->second;
  }
};

class Server {
 public:
  // Opens (or adopts) the listening socket and starts accepting once `io`
  // runs. `handler` must outlive the Server.
  // INVALID_ARGUMENT: bad options (no path and no fd, fd not a listening
  // AF_UNIX stream socket, limits out of range); see wire::ListenUnix for
  // the socket errors (ALREADY_EXISTS, NOT_FOUND, PERMISSION_DENIED, IO).
  static Result<std::unique_ptr<Server>> Create(boost::asio::io_context& io, ServerOptions options,
                                                RequestHandler* handler);
  ~Server();  // Stop(), then any OnDisconnect still owed
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Graceful shutdown: stop accepting, remove the socket file the server
  // created, close every connection (OnDisconnect for each). Idempotent.
  void Stop();

  // Adds an already-connected AF_UNIX stream socket (a socketpair end, a
  // connection handed over) as if it had been accepted.
  // INVALID_ARGUMENT (not a connected stream socket), RESOURCE_EXHAUSTED
  // (connection limits), UNAVAILABLE (stopped).
  Result<ConnectionId> AddConnection(UniqueFd fd);

  // Server-initiated frame (request_id 0), e.g. MSG_LEASE_EVENT. Its fds are
  // borrowed (dup'ed when queued). NOT_FOUND: no such connection.
  // UNAVAILABLE: hello not done yet, or the connection was dropped because
  // its send queue overflowed. INVALID_ARGUMENT: payload or fds over limits.
  Status Push(ConnectionId conn, Reply reply);

  // Marks the hello done with the negotiated version (if the handler does
  // the negotiation without answering MSG_HELLO_REPLY itself).
  // NOT_FOUND: no such connection. INVALID_ARGUMENT: version out of range.
  Status MarkHelloDone(ConnectionId conn, uint32_t version);

  bool IsConnected(ConnectionId conn) const;
  // The negotiated version, or nullopt before hello (or no such connection).
  std::optional<uint32_t> NegotiatedVersion(ConnectionId conn) const;
  size_t connection_count() const;
  ServerStats stats() const;
  const ServerOptions& options() const;
  // The socket path, or "" when listening on an adopted fd.
  const std::string& socket_path() const;
  boost::asio::io_context& io_context();

  class Impl;

 private:
  explicit Server(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace cxlpool
