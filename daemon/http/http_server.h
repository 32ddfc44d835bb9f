// MetricsHttpServer: serves the daemon's Prometheus text on a loopback TCP
// port with Boost.Beast: GET (or HEAD) /metrics answers 200 with the text of
// `render`; other paths 404, other methods 405. It listens only on loopback
// addresses (127.0.0.0/8, ::1); anything else is refused at Create.
//
// Any local user can connect, so the endpoint bounds what one can take
// (MetricsHttpOptions, docs/service.md "Metrics over HTTP"):
// - at most `max_sessions` connections at once; when full, a new one takes
//   the place of the one that has waited longest for its request head (an
//   idle keep-alive or a slow sender), else it is closed;
// - a peer is the uid that owns the client's socket (TcpPeerUids); a known
//   peer has at most `max_sessions_per_peer` connections (more are closed at
//   accept) and `peer_rate_per_sec` requests a second with bursts of
//   `peer_burst` (more answer 429 with Retry-After and close);
// - the whole request head must arrive within `header_deadline`; no body;
//   an 8 KiB head limit.
// - it runs on a thread of its own (its own io_context); `render` runs on
//   the `loop` io_context (the daemon's event loop, which owns the state it
//   reads), at most once per `min_render_interval`: every scrape gets a text
//   rendered after its request arrived, and the scrapes that arrive while a
//   render is due or running share the next one. A scrape the loop does not
//   render for within `render_deadline` answers 503 with Retry-After.
//
// Thread safety: Create, FromListeningFd, port, stats and Stop may be called
// from any one thread at a time (the daemon calls them on its loop); the
// serving runs on the server's own thread. `render` must not block on the
// HTTP thread (it never waits for it).
#pragma once

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "cxlpool/common/status.h"

namespace cxlpool {

struct MetricsHttpOptions {
  int max_sessions = 16;
  int max_sessions_per_peer = 4;
  std::chrono::milliseconds header_deadline{2000};     // the whole request head
  std::chrono::milliseconds write_deadline{10000};     // one response
  std::chrono::milliseconds render_deadline{5000};     // the loop's render, else 503
  std::chrono::milliseconds min_render_interval{100};  // between render starts
  double peer_rate_per_sec = 10;                       // requests a second per peer
  double peer_burst = 20;
};

// Counters since Create, for tests and logs (read from any thread).
struct MetricsHttpStats {
  uint64_t sessions = 0;         // open now
  uint64_t waiting = 0;          // scrapes waiting for a render now
  uint64_t renders = 0;          // renders asked of the loop
  uint64_t refused = 0;          // connections closed at accept (full, or peer over its cap)
  uint64_t evicted = 0;          // sessions closed to make room for a new one
  uint64_t rate_limited = 0;     // 429 answers
  uint64_t header_timeouts = 0;  // connections closed at the header deadline
  uint64_t render_timeouts = 0;  // 503 answers (the loop did not render in time)
  uint64_t unknown_peers = 0;    // connections whose uid could not be found
};

class MetricsHttpServer {
 public:
  using RenderFn = std::function<std::string()>;

  // `listen`: "127.0.0.1:9464", "[::1]:9464", "localhost:9464"; port 0 (for
  // tests) picks a free one. INVALID_ARGUMENT for a non-loopback address or
  // bad options, UNAVAILABLE (with the errno text) when the port cannot be
  // bound. Serving starts at once; renders wait until `loop` runs.
  static Result<std::unique_ptr<MetricsHttpServer>> Create(boost::asio::io_context& loop,
                                                           const std::string& listen,
                                                           RenderFn render,
                                                           const MetricsHttpOptions& options = {});
  // Serves on an already listening TCP socket (systemd's
  // cxlpoold-metrics.socket, passed as "metrics"); takes ownership of `fd`.
  // INVALID_ARGUMENT when it is not a listening TCP socket on a loopback
  // address (the fd is closed then too), or for bad options.
  static Result<std::unique_ptr<MetricsHttpServer>> FromListeningFd(
      boost::asio::io_context& loop, int fd, RenderFn render,
      const MetricsHttpOptions& options = {});
  // Whether `fd` is a listening TCP (IPv4 or IPv6) socket.
  static bool IsListeningTcpSocket(int fd);
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  uint16_t port() const { return port_; }
  MetricsHttpStats stats() const;
  // Stops accepting, closes every connection and joins the HTTP thread. A
  // render already posted to the loop is dropped unrun or its text unused.
  void Stop();

  struct Impl;

 private:
  MetricsHttpServer(std::unique_ptr<boost::asio::io_context> io, std::shared_ptr<Impl> impl);
  static Result<std::unique_ptr<MetricsHttpServer>> Serve(
      std::unique_ptr<boost::asio::io_context> io, std::shared_ptr<Impl> impl);

  std::unique_ptr<boost::asio::io_context> io_;  // the HTTP thread's
  std::shared_ptr<Impl> impl_;
  uint16_t port_ = 0;
  std::thread thread_;
};

}  // namespace cxlpool
