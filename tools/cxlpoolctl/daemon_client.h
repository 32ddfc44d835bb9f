// DaemonConnection: cxlpoolctl's blocking connection to cxlpoold for the
// admin and inspection requests (pools, leases, stats, revoke, quotas,
// metrics, topology). Lease allocation goes through libcxlpool instead.
//
// Thread safety: none; the CLI is single-threaded.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "cxlpool.pb.h"
#include "cxlpool/common/status.h"
#include "cxlpool/common/unique_fd.h"
#include "cxlpool/proto/codec.h"
#include "cxlpool/proto/ipc.h"

namespace cxlpool::ctl {

class DaemonConnection {
 public:
  // Connects and says hello. NOT_FOUND (no socket), PERMISSION_DENIED,
  // UNAVAILABLE, PROTOCOL.
  static Result<DaemonConnection> Open(const std::string& socket_path);

  // One request, one reply of type Rep (or the daemon's error).
  template <typename Req, typename Rep>
  Status Call(const Req& req, Rep* rep) {
    uint64_t id = next_id_++;
    CXLPOOL_RETURN_IF_ERROR(wire::SendMessage(sock_.get(), req, id, {}, kTimeoutMs));
    for (;;) {
      auto frame = wire::RecvFrame(sock_.get(), {}, kTimeoutMs);
      if (!frame.ok()) return frame.status();
      if (frame->request_id() == 0) continue;  // a server push (lease event): not ours
      if (frame->request_id() != id) {
        return Status(Code::kProtocol, "reply for request " + std::to_string(frame->request_id()) +
                                           ", expected " + std::to_string(id));
      }
      return wire::DecodeReply(*frame, rep);
    }
  }

  const proto::HelloReply& hello() const { return hello_; }
  const std::string& path() const { return path_; }

 private:
  static constexpr int kTimeoutMs = 30000;
  UniqueFd sock_;
  std::string path_;
  uint64_t next_id_ = 1;
  proto::HelloReply hello_;
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
