// `cxlpoolctl stats [--json]`: the daemon's counters (grants, refusals,
// releases, reclaims, ...) and gauges (live leases, leased bytes, ...).
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "daemon_client.h"
#include "table.h"

namespace cxlpool::ctl {
namespace {

int RunStats(const ConnOptions& o) {
  int rc = kExitOk;
  auto conn = OpenOrReport("stats", o, &rc);
  if (!conn.ok()) return rc;
  proto::StatsReply rep;
  if (Status s = conn->Call(proto::StatsRequest(), &rep); !s.ok()) {
    return ReportError("stats", s, false);
  }
  // Protobuf maps are unordered; print sorted.
  std::map<std::string, uint64_t> counters(rep.counters().begin(), rep.counters().end());
  std::map<std::string, uint64_t> gauges(rep.gauges().begin(), rep.gauges().end());
  if (o.json) {
    nlohmann::ordered_json j;
    j["server_version"] = conn->hello().server_version();
    j["instance_id"] = conn->hello().instance_id();
    j["counters"] = counters;
    j["gauges"] = gauges;
    std::cout << JsonText(j) << "\n";
    return kExitOk;
  }
  std::cout << conn->hello().server_version() << " (instance " << conn->hello().instance_id()
            << ")\n";
  Table t({"STAT", "TYPE", "VALUE"});
  for (const auto& [k, v] : counters) t.Add({k, "counter", std::to_string(v)});
  for (const auto& [k, v] : gauges) t.Add({k, "gauge", std::to_string(v)});
  std::cout << t.Render();
  return kExitOk;
}

}  // namespace

Command MakeStatsCommand() {
  return {"stats", "Show the daemon's counters and gauges",
          [](CLI::App* app) -> std::function<int()> {
            auto o = std::make_shared<ConnOptions>();
            AddConnOptions(app, o.get());
            return [o] { return RunStats(*o); };
          }};
}

}  // namespace cxlpool::ctl
