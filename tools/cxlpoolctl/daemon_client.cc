#include "daemon_client.h"

#include <unistd.h>

#include <cstdlib>
#include <iostream>

#include "commands.h"
#include "cxlpool/client.hpp"

namespace cxlpool::ctl {

Result<DaemonConnection> DaemonConnection::Open(const std::string& socket_path) {
  Result<wire::BlockingClient> c =
      wire::BlockingClient::Connect(socket_path, {.name = "cxlpoolctl", .timeout_ms = 30000});
  if (!c.ok()) return c.status();
  return DaemonConnection(std::move(*c), socket_path);
}

std::string ResolveSocketPath(const std::string& flag) {
  if (!flag.empty()) return flag;
  return Client::DefaultSocketPath();  // the library's rule, $CXLPOOL_SOCKET first
}

void AddConnOptions(CLI::App* app, ConnOptions* o) {
  app->add_option("--socket", o->socket,
                  "Daemon socket (default: $CXLPOOL_SOCKET, else the daemon's default)")
      ->type_name("PATH");
  app->add_flag("--json", o->json, "Print JSON");
}

Result<DaemonConnection> OpenOrReport(const std::string& cmd, const ConnOptions& o, int* rc) {
  auto c = DaemonConnection::Open(ResolveSocketPath(o.socket));
  if (!c.ok()) *rc = ReportError(cmd, c.status(), true);
  return c;
}

int ReportError(const std::string& cmd, const Status& status, bool connecting) {
  std::cerr << "cxlpoolctl " << cmd << ": " << status.ToString() << "\n";
  if (connecting && (status.code() == Code::kUnavailable || status.code() == Code::kNotFound ||
                     status.code() == Code::kPermissionDenied)) {
    return kExitUnavailable;
  }
  return kExitFailure;
}

}  // namespace cxlpool::ctl
