#include "daemon_client.h"

#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <vector>

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

namespace {
std::vector<ConnOptions*>& CommandConnOptions() {
  static std::vector<ConnOptions*> all;
  return all;
}
std::string g_last_socket;  // the path OpenOrReport tried, for the advice
}  // namespace

void AddGlobalOptions(CLI::App* app, ConnOptions* global) {
  app->add_option("--socket", global->socket,
                  "Daemon socket (default: $CXLPOOL_SOCKET, else the daemon's default)")
      ->type_name("PATH");
  app->add_flag("--json", global->json, "Print JSON (every command)");
}

void AddConnOptions(CLI::App*, ConnOptions* o) { CommandConnOptions().push_back(o); }

void ApplyGlobalOptions(const ConnOptions& global) {
  for (ConnOptions* o : CommandConnOptions()) *o = global;
}

Result<DaemonConnection> OpenOrReport(const std::string& cmd, const ConnOptions& o, int* rc) {
  g_last_socket = ResolveSocketPath(o.socket);
  auto c = DaemonConnection::Open(g_last_socket);
  if (!c.ok()) *rc = ReportError(cmd, c.status(), true);
  return c;
}

std::string ConnectAdvice(Code code, const std::string& socket_path) {
  const std::string where = socket_path.empty() ? ResolveSocketPath("") : socket_path;
  switch (code) {
    case Code::kNotFound:
    case Code::kUnavailable:
      return "is cxlpoold running? It listens on " + where +
             " (tried). Start it with `systemctl start cxlpoold.socket` (or `cxlpoold "
             "--foreground`), or name its socket with --socket PATH or $CXLPOOL_SOCKET.";
    case Code::kPermissionDenied:
      return "you may not open " + where +
             ": join the group that owns it (`sudo usermod -aG cxlpool $USER`, then log in "
             "again) or run as root.";
    default:
      return "";
  }
}

int ReportError(const std::string& cmd, const Status& status, bool connecting) {
  std::cerr << "cxlpoolctl " << cmd << ": " << status.ToString() << "\n";
  if (connecting && (status.code() == Code::kUnavailable || status.code() == Code::kNotFound ||
                     status.code() == Code::kPermissionDenied)) {
    std::cerr << "  " << ConnectAdvice(status.code(), g_last_socket) << "\n";
    return kExitUnavailable;
  }
  if (status.code() == Code::kPermissionDenied) {
    std::cerr << "  this needs root or membership in the daemon's admin group "
                 "(daemon.admin_group; cxlpool-admin as packaged)\n";
  }
  return kExitFailure;
}

}  // namespace cxlpool::ctl
