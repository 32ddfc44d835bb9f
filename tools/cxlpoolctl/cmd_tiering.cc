// `cxlpoolctl tiering [--all] [--history N] [--json]`: the tiering engine's
// view of each lease (temperature per range, where it is, why it moves or
// stays), the pools' pressure, and the migrations done with their reasons.
// `--pin ID` / `--unpin ID` (admin): keep a lease in its tier, or let it move.
#include <ctime>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "cxlpool/common/strings.h"
#include "daemon_client.h"
#include "table.h"

namespace cxlpool::ctl {
namespace {

struct TieringOptions {
  ConnOptions conn;
  bool all = false;
  size_t history = 20;
  uint64_t pin = 0;
  uint64_t unpin = 0;
};

std::string Temp(double t) {
  char buf[32];
  std::snprintf(buf, sizeof buf, t >= 100 ? "%.0f" : t >= 0.01 || t == 0 ? "%.2f" : "%.2g", t);
  return buf;
}

std::string When(int64_t unix_time) {
  if (unix_time <= 0) return "-";
  std::time_t t = static_cast<std::time_t>(unix_time);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

std::string Ms(uint64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f ms", static_cast<double>(ns) / 1e6);
  return buf;
}

nlohmann::ordered_json ReportJson(const proto::TieringReportReply& r, size_t history) {
  nlohmann::ordered_json j;
  j["enabled"] = r.enabled();
  j["moves_off"] = r.disabled_why().empty() ? nullptr : nlohmann::ordered_json(r.disabled_why());
  j["sampler"] = r.sampler();
  j["kernel"] = r.kernel();
  j["rate_limit_bytes_per_s"] = r.rate_limit_bytes_per_s();
  j["hot_threshold"] = r.hot_threshold();
  j["cold_threshold"] = r.cold_threshold();
  j["half_life_ms"] = r.half_life_ms();
  j["pressure"] = nlohmann::ordered_json::array();
  for (const auto& p : r.pressure()) j["pressure"].push_back(p);
  j["in_flight"] = r.in_flight().empty() ? nullptr : nlohmann::ordered_json(r.in_flight());
  j["leases"] = nlohmann::ordered_json::array();
  for (const auto& l : r.leases()) {
    nlohmann::ordered_json lj;
    lj["lease_id"] = l.lease_id();
    lj["label"] = l.label();
    lj["owner_uid"] = l.owner_uid();
    lj["priority"] = l.priority();
    lj["pinned_tier"] = l.pinned_tier();
    lj["cooperative"] = l.cooperative();
    lj["cooperative_state"] = l.cooperative_state();
    lj["moving"] = l.moving().empty() ? nullptr : nlohmann::ordered_json(l.moving());
    lj["units"] = nlohmann::ordered_json::array();
    for (const auto& u : l.units()) {
      nlohmann::ordered_json uj;
      uj["unit"] = u.unit();
      uj["offset"] = u.offset();
      uj["length"] = u.length();
      uj["pool"] = u.pool();
      uj["numa_node"] = u.numa_node();
      uj["temperature"] = u.temperature();
      uj["verdict"] = u.verdict();
      uj["bytes_read"] = u.bytes_read();
      uj["bytes_written"] = u.bytes_written();
      uj["hints"] = u.hints();
      uj["sampled_pages"] = u.sampled_pages();
      uj["accessed_pages"] = u.accessed_pages();
      uj["last_moved_unix"] =
          u.last_moved_unix() > 0 ? nlohmann::ordered_json(u.last_moved_unix()) : nullptr;
      lj["units"].push_back(std::move(uj));
    }
    j["leases"].push_back(std::move(lj));
  }
  j["migrations"] = nlohmann::ordered_json::array();
  size_t from = r.history_size() > static_cast<int>(history) ? r.history_size() - history : 0;
  for (int i = static_cast<int>(from); i < r.history_size(); ++i) {
    const auto& h = r.history(i);
    nlohmann::ordered_json hj;
    hj["migration_id"] = h.migration_id();
    hj["unix_time"] = h.unix_time();
    hj["lease_id"] = h.lease_id();
    hj["unit"] = h.unit();
    hj["bytes"] = h.bytes();
    hj["from_pool"] = h.from_pool();
    hj["to_pool"] = h.to_pool();
    hj["direction"] = h.direction();
    hj["mode"] = h.mode();
    hj["outcome"] = h.outcome();
    hj["why"] = h.why();
    hj["detail"] = h.detail();
    hj["move_ns"] = h.move_ns();
    hj["pause_ns"] = h.pause_ns();
    j["migrations"].push_back(std::move(hj));
  }
  j["counters"] = nlohmann::ordered_json::object();
  for (const auto& [k, v] : r.counters()) j["counters"][k] = v;
  return j;
}

void PrintReport(const proto::TieringReportReply& r, size_t history) {
  std::cout << "tiering: " << (r.enabled() ? "on" : "off");
  if (!r.disabled_why().empty()) std::cout << " (moves off: " << r.disabled_why() << ")";
  std::cout << "; rate limit "
            << (r.rate_limit_bytes_per_s() == 0 ? std::string("none")
                                                : HumanBytes(r.rate_limit_bytes_per_s()) + "/s")
            << "; hot >= " << Temp(r.hot_threshold()) << ", cold <= " << Temp(r.cold_threshold())
            << ", half-life " << r.half_life_ms() / 1000.0 << " s; sampler " << r.sampler() << "\n";
  if (!r.kernel().empty()) std::cout << "  " << r.kernel() << "\n";
  for (const auto& p : r.pressure()) std::cout << "  " << p << "\n";
  if (!r.in_flight().empty()) std::cout << "  in flight: " << r.in_flight() << "\n";
  std::cout << "\n";
  Table t({"LEASE", "UNIT", "RANGE", "POOL", "TEMP", "COPIED IN", "OUT", "WHY"});
  for (const auto& l : r.leases()) {
    for (const auto& u : l.units()) {
      std::string why = u.verdict();
      if (l.pinned_tier()) why = "[pinned to its tier] " + why;
      if (!l.moving().empty()) why += " [move " + l.moving() + "]";
      t.Add({std::to_string(l.lease_id()), std::to_string(u.unit()),
             HumanBytes(u.offset()) + "-" + HumanBytes(u.offset() + u.length()), u.pool(),
             Temp(u.temperature()), HumanBytes(u.bytes_written()), HumanBytes(u.bytes_read()),
             OrDash(why)});
    }
  }
  std::cout << t.Render();
  std::cout << "\nmigrations (last " << history << "):\n";
  Table m({"TIME", "ID", "LEASE", "BYTES", "FROM", "TO", "MODE", "OUTCOME", "TOOK", "WHY"});
  size_t from = r.history_size() > static_cast<int>(history) ? r.history_size() - history : 0;
  for (int i = static_cast<int>(from); i < r.history_size(); ++i) {
    const auto& h = r.history(i);
    std::string took = h.move_ns() > 0 ? Ms(h.move_ns()) : "-";
    if (h.pause_ns() > 0) took += " (pause " + Ms(h.pause_ns()) + ")";
    m.Add({When(h.unix_time()), std::to_string(h.migration_id()), std::to_string(h.lease_id()),
           HumanBytes(h.bytes()), h.from_pool(), h.to_pool(), h.mode() + " " + h.direction(),
           h.outcome(), took, h.why() + (h.outcome() == "moved" ? "" : "; " + h.detail())});
  }
  std::cout << m.Render();
}

int RunPin(DaemonConnection& conn, uint64_t id, bool pinned, const ConnOptions& o) {
  proto::TieringLeaseRequest req;
  req.set_lease_id(id);
  req.set_pin_tier(pinned);
  proto::TieringLeaseReply rep;
  if (Status s = conn.Call(req, &rep); !s.ok()) return ReportError("tiering", s, false);
  if (o.json) {
    nlohmann::ordered_json j;
    j["lease_id"] = id;
    j["pinned_tier"] = pinned;
    std::cout << JsonText(j) << "\n";
  } else {
    std::cout << "lease " << id << (pinned ? " stays in its tier\n" : " may move again\n");
  }
  return kExitOk;
}

int RunTiering(const TieringOptions& o) {
  int rc = kExitOk;
  auto conn = OpenOrReport("tiering", o.conn, &rc);
  if (!conn.ok()) return rc;
  if (o.pin != 0) return RunPin(*conn, o.pin, true, o.conn);
  if (o.unpin != 0) return RunPin(*conn, o.unpin, false, o.conn);
  proto::TieringReportRequest req;
  req.set_all(o.all);
  proto::TieringReportReply rep;
  if (Status s = conn->Call(req, &rep); !s.ok()) return ReportError("tiering", s, false);
  if (o.conn.json) {
    std::cout << JsonText(ReportJson(rep, o.history)) << "\n";
  } else {
    PrintReport(rep, o.history);
  }
  return kExitOk;
}

}  // namespace

Command MakeTieringCommand() {
  return {"tiering",
          "Show each lease's temperature and tier, and the migrations done, with reasons",
          [](CLI::App* app) -> std::function<int()> {
            auto o = std::make_shared<TieringOptions>();
            AddConnOptions(app, &o->conn);
            app->add_flag("--all", o->all, "Every tenant's leases (admin)");
            app->add_option("--history", o->history, "Migrations to show (default 20)")
                ->check(CLI::Range(0, 100000));
            auto* pin =
                app->add_option("--pin", o->pin, "Keep lease ID in its tier: never moved (admin)")
                    ->check(CLI::Range(uint64_t{1}, UINT64_MAX));
            app->add_option("--unpin", o->unpin, "Let lease ID move again (admin)")
                ->check(CLI::Range(uint64_t{1}, UINT64_MAX))
                ->excludes(pin);
            return [o] { return RunTiering(*o); };
          }};
}

}  // namespace cxlpool::ctl
