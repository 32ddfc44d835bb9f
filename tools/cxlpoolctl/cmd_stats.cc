// `cxlpoolctl stats [--json]`: the daemon's counters (grants, refusals,
// releases, reclaims, ...) and gauges (live leases, leased bytes, ...); bytes
// in binary units and "unlimited" for no limit (raw numbers with --json).
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "cxlpool/common/strings.h"
#include "daemon_client.h"
#include "table.h"

namespace cxlpool::ctl {
namespace {

// The human view of one value: "unlimited" for UINT64_MAX (no limit), byte
// figures (names ending in _bytes) in binary units, counts as they are.
// --json keeps the raw numbers.
std::string HumanValue(const std::string& name, uint64_t v) {
  if (v == UINT64_MAX) return "unlimited";
  if (EndsWith(name, "_bytes")) return HumanBytes(v);
  return std::to_string(v);
}

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
  for (const auto& [k, v] : counters) t.Add({k, "counter", HumanValue(k, v)});
  for (const auto& [k, v] : gauges) t.Add({k, "gauge", HumanValue(k, v)});
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
