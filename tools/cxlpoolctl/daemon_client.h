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

// The global options (--socket, --json): cxlpoolctl's main app owns them,
// so they go before or after the command word (`cxlpoolctl --json pools`,
// `cxlpoolctl pools --json`).
struct ConnOptions {
  std::string socket;
  bool json = false;
};
// Declares the global options on the main app.
void AddGlobalOptions(CLI::App* app, ConnOptions* global);
// A command that reads the global options: `o` is filled in from them after
// parsing (ApplyGlobalOptions), before the command runs.
void AddConnOptions(CLI::App* app, ConnOptions* o);
void ApplyGlobalOptions(const ConnOptions& global);

// Opens the connection for command `cmd`, printing any error; nullopt-like:
// returns the exit code through `rc` when it fails.
Result<DaemonConnection> OpenOrReport(const std::string& cmd, const ConnOptions& o, int* rc);

// --socket, else $CXLPOOL_SOCKET, else the daemon's default for this user.
std::string ResolveSocketPath(const std::string& flag);

// Prints "cxlpoolctl <cmd>: <status>" and maps it to an exit code
// (UNAVAILABLE / NOT_FOUND / PERMISSION_DENIED while connecting ->
// kExitUnavailable, else kExitFailure). A connection failure also says what
// to do: whether cxlpoold runs, which socket was tried and how to choose
// another, or which group opens the socket.
int ReportError(const std::string& cmd, const Status& status, bool connecting);
// The advice for a failure to reach the daemon on `socket_path` ("" if
// `code` is not one of a connection's).
std::string ConnectAdvice(Code code, const std::string& socket_path);

}  // namespace cxlpool::ctl
