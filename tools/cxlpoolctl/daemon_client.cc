#include "daemon_client.h"

#include <unistd.h>

#include <cstdlib>
#include <iostream>

#include "commands.h"
#include "cxlpool/client.hpp"
#include "cxlpool/proto/socket.h"

namespace cxlpool::ctl {

Result<DaemonConnection> DaemonConnection::Open(const std::string& socket_path) {
  DaemonConnection c;
  c.path_ = socket_path;
  auto sock = wire::ConnectUnix(socket_path);
  if (!sock.ok()) return sock.status();
  c.sock_ = std::move(*sock);
  proto::HelloRequest hello;
  hello.set_min_version(wire::kMinWireVersion);
  hello.set_max_version(wire::kMaxWireVersion);
  hello.set_client_name("cxlpoolctl");
  CXLPOOL_RETURN_IF_ERROR(c.Call(hello, &c.hello_));
  return c;
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
