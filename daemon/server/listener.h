// Listener: the server's listening socket. It creates the socket file (or
// adopts an already listening fd), accepts in batches and hands each new
// connection on, backs off when accept runs out of fds, and on Stop closes
// the socket and removes the file it created (only if it is still that one).
//
// Thread safety: the io_context's thread.
#pragma once

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "cxlpool/common/status.h"
#include "cxlpool/common/unique_fd.h"
#include "server/counters.h"

namespace cxlpool {

struct ServerOptions;

class Listener : public std::enable_shared_from_this<Listener> {
 public:
  using AcceptFn = std::function<void(UniqueFd)>;

  // `counters` (borrowed) counts accept errors.
  Listener(boost::asio::io_context& io, std::chrono::milliseconds backoff,
           ServerCounters* counters);
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  // Listens on `listen_fd` when valid (an already listening socket; then
  // clears options->socket_path), else creates options->socket_path.
  Status Open(UniqueFd listen_fd, ServerOptions* options);
  // Accepts until Stop, handing each connection to `on_accept`.
  void Start(AcceptFn on_accept);
  // Idempotent.
  void Stop();

 private:
  void Wait();
  void AcceptReady();
  void BackOff();

  boost::asio::local::stream_protocol::acceptor acceptor_;
  boost::asio::steady_timer backoff_timer_;
  const std::chrono::milliseconds backoff_;
  ServerCounters* counters_;
  AcceptFn on_accept_;
  bool stopped_ = false;
  std::string created_path_;
  ino_t created_ino_ = 0;
  dev_t created_dev_ = 0;
};

}  // namespace cxlpool
