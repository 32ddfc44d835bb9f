// `cxlpoolctl metrics [--json]`: the daemon's Prometheus text exposition, as
// a node-exporter textfile collector or a scrape wrapper would consume it.
// With --json, the same families as one JSON array:
//   [{"name": "cxlpool_leases", "type": "gauge", "help": "...",
//     "samples": [{"name": "cxlpool_leases", "labels": {}, "value": 0}]}, ...]
// A value that JSON cannot hold (+Inf, -Inf, NaN) is that string.
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string_view>

#include "commands.h"
#include "cxlpool/common/strings.h"
#include "daemon_client.h"
#include "table.h"

namespace cxlpool::ctl {
namespace {

// `name{a="x",b="y"} value` -> name, labels, value; false if garbled.
bool ParseSample(std::string_view line, std::string* name, nlohmann::ordered_json* labels,
                 nlohmann::ordered_json* value) {
  size_t i = 0;
  while (i < line.size() && line[i] != '{' && line[i] != ' ') ++i;
  *name = std::string(line.substr(0, i));
  *labels = nlohmann::ordered_json::object();
  if (i < line.size() && line[i] == '{') {
    ++i;
    while (i < line.size() && line[i] != '}') {
      size_t eq = line.find('=', i);
      if (eq == std::string_view::npos || eq + 1 >= line.size() || line[eq + 1] != '"') {
        return false;
      }
      std::string key(line.substr(i, eq - i));
      std::string v;
      for (i = eq + 2; i < line.size() && line[i] != '"'; ++i) {
        if (line[i] == '\\' && i + 1 < line.size()) {
          ++i;
          v += line[i] == 'n' ? '\n' : line[i];
        } else {
          v += line[i];
        }
      }
      if (i >= line.size()) return false;
      (*labels)[key] = v;
      ++i;  // closing quote
      if (i < line.size() && line[i] == ',') ++i;
    }
    if (i >= line.size()) return false;
    ++i;  // '}'
  }
  std::string_view rest = Trim(line.substr(i));
  if (rest.empty() || name->empty()) return false;
  if (rest == "+Inf" || rest == "-Inf" || rest == "NaN") {
    *value = std::string(rest);
    return true;
  }
  std::string text(rest);
  char* end = nullptr;
  double d = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || *end != '\0') return false;
  if (d == std::floor(d) && std::fabs(d) < 9e15) {
    *value = static_cast<int64_t>(d);
  } else {
    *value = d;
  }
  return true;
}

// Prometheus text format 0.0.4 -> JSON families.
Result<nlohmann::ordered_json> ExpositionToJson(const std::string& text) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  std::map<std::string, size_t> index;
  auto family = [&](const std::string& name) -> nlohmann::ordered_json& {
    auto it = index.find(name);
    if (it == index.end()) {
      it = index.emplace(name, out.size()).first;
      out.push_back({{"name", name},
                     {"type", "untyped"},
                     {"help", ""},
                     {"samples", nlohmann::ordered_json::array()}});
    }
    return out[it->second];
  };
  std::string last;  // the family the samples belong to (from # TYPE)
  for (const std::string& raw : Split(text, '\n')) {
    std::string_view line = raw;
    if (line.empty()) continue;
    if (StartsWith(line, "# HELP ") || StartsWith(line, "# TYPE ")) {
      std::string_view body = line.substr(7);
      size_t sp = body.find(' ');
      std::string name(body.substr(0, sp));
      std::string rest = sp == std::string_view::npos ? "" : std::string(body.substr(sp + 1));
      family(name)[StartsWith(line, "# HELP ") ? "help" : "type"] = rest;
      last = name;
      continue;
    }
    if (line[0] == '#') continue;
    std::string name;
    nlohmann::ordered_json labels, value;
    if (!ParseSample(line, &name, &labels, &value)) {
      return Status(Code::kProtocol, "garbled metrics line: " + raw);
    }
    // Histogram lines (_bucket, _sum, _count) belong to their family.
    std::string fam = !last.empty() && StartsWith(name, last) ? last : name;
    family(fam)["samples"].push_back({{"name", name}, {"labels", labels}, {"value", value}});
  }
  return out;
}

int RunMetrics(const ConnOptions& o) {
  int rc = kExitOk;
  auto conn = OpenOrReport("metrics", o, &rc);
  if (!conn.ok()) return rc;
  proto::MetricsReply rep;
  if (Status s = conn->Call(proto::MetricsRequest(), &rep); !s.ok()) {
    return ReportError("metrics", s, false);
  }
  if (!o.json) {
    std::cout << rep.text();
    return kExitOk;
  }
  auto j = ExpositionToJson(rep.text());
  if (!j.ok()) return ReportError("metrics", j.status(), false);
  std::cout << JsonText(*j) << "\n";
  return kExitOk;
}

}  // namespace

Command MakeMetricsCommand() {
  return {"metrics", "Print the daemon's metrics (Prometheus text format; --json: as JSON)",
          [](CLI::App* app) -> std::function<int()> {
            auto o = std::make_shared<ConnOptions>();
            AddConnOptions(app, o.get());
            return [o] { return RunMetrics(*o); };
          }};
}

}  // namespace cxlpool::ctl
