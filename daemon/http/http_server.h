// MetricsHttpServer: serves the daemon's Prometheus text on a loopback TCP
// port with Boost.Beast: GET (or HEAD) /metrics answers 200 with the text of
// `render`; other paths 404, other methods 405. It listens only on loopback
// addresses (127.0.0.0/8, ::1); anything else is refused at Create. Each
// connection has a 10 s deadline per request, an 8 KiB header limit and no
// body; at most 16 are open at once (more are closed on accept).
//
// Thread safety: runs on the io_context it is given; `render` is called on
// that thread (the daemon's event loop, which owns the state it reads).
// Create, port and Stop must be called on that thread too (or before it runs).
#pragma once

#include <boost/asio/io_context.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "cxlpool/common/status.h"

namespace cxlpool {

class MetricsHttpServer {
 public:
  using RenderFn = std::function<std::string()>;

  // `listen`: "127.0.0.1:9464", "[::1]:9464", "localhost:9464"; port 0 (for
  // tests) picks a free one. INVALID_ARGUMENT for a non-loopback address,
  // UNAVAILABLE (with the errno text) when the port cannot be bound.
  static Result<std::unique_ptr<MetricsHttpServer>> Create(boost::asio::io_context& io,
                                                           const std::string& listen,
                                                           RenderFn render);
  // Serves on an already listening TCP socket (systemd's
  // cxlpoold-metrics.socket, passed as "metrics"); takes ownership of `fd`.
  // INVALID_ARGUMENT when it is not a listening TCP socket on a loopback
  // address (the fd is closed then too).
  static Result<std::unique_ptr<MetricsHttpServer>> FromListeningFd(boost::asio::io_context& io,
                                                                    int fd, RenderFn render);
  // Whether `fd` is a listening TCP (IPv4 or IPv6) socket.
  static bool IsListeningTcpSocket(int fd);
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  uint16_t port() const;
  // Stops accepting; open connections finish their request or time out.
  void Stop();

  struct Impl;

 private:
  explicit MetricsHttpServer(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace cxlpool
