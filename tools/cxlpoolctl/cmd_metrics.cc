// `cxlpoolctl metrics`: the daemon's Prometheus text exposition, as a
// node-exporter textfile collector or a scrape wrapper would consume it.
#include <iostream>

#include "commands.h"
#include "daemon_client.h"

namespace cxlpool::ctl {
namespace {

int RunMetrics(const ConnOptions& o) {
  int rc = kExitOk;
  auto conn = OpenOrReport("metrics", o, &rc);
  if (!conn.ok()) return rc;
  proto::MetricsReply rep;
  if (Status s = conn->Call(proto::MetricsRequest(), &rep); !s.ok()) {
    return ReportError("metrics", s, false);
  }
  std::cout << rep.text();
  return kExitOk;
}

}  // namespace

Command MakeMetricsCommand() {
  return {"metrics", "Print the daemon's metrics (Prometheus text format)",
          [](CLI::App* app) -> std::function<int()> {
            auto o = std::make_shared<ConnOptions>();
            app->add_option("--socket", o->socket, "Daemon socket")->type_name("PATH");
            return [o] { return RunMetrics(*o); };
          }};
}

}  // namespace cxlpool::ctl
