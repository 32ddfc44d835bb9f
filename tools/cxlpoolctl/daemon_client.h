// DaemonConnection: cxlpoolctl's blocking connection to cxlpoold for the
// admin and inspection requests (pools, leases, stats, revoke, quotas,
// metrics, topology). Lease allocation goes through libcxlpool instead.
//
// Thread safety: none; the CLI is single-threaded.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <utility>

#include "cxlpool.pb.h"
#include "cxlpool/common/status.h"
#include "cxlpool/proto/blocking_client.h"

namespace cxlpool::ctl {

class DaemonConnection {
 public:
  // Connects and says hello. NOT_FOUND (no socket), PERMISSION_DENIED,
  // UNAVAILABLE, PROTOCOL.
  static Result<DaemonConnection> Open(const std::string& socket_path);

  // One request, one reply of type Rep (or the daemon's error); pushes
  // (lease events) on the way are not ours and are skipped.
  template <typename Req, typename Rep>
  Status Call(const Req& req, Rep* rep) {
    return client_.Call(req, rep);
  }

  const proto::HelloReply& hello() const { return client_.hello(); }
  const std::string& path() const { return path_; }

 private:
  DaemonConnection(wire::BlockingClient client, std::string path)
      : client_(std::move(client)), path_(std::move(path)) {}
  wire::BlockingClient client_;  // the tools' and tests' one wire client
  std::string path_;
};

// Options every daemon command takes.
struct ConnOptions {
  std::string socket;
  bool json = false;
};
// Adds --socket and --json to `app`.
void AddConnOptions(CLI::App* app, ConnOptions* o);

// Opens the connection for command `cmd`, printing any error; nullopt-like:
// returns the exit code through `rc` when it fails.
Result<DaemonConnection> OpenOrReport(const std::string& cmd, const ConnOptions& o, int* rc);

// --socket, else $CXLPOOL_SOCKET, else the daemon's default for this user.
std::string ResolveSocketPath(const std::string& flag);

// Prints "cxlpoolctl <cmd>: <status>" and maps it to an exit code
// (UNAVAILABLE / NOT_FOUND socket -> kExitUnavailable, else kExitFailure).
int ReportError(const std::string& cmd, const Status& status, bool connecting);

}  // namespace cxlpool::ctl
