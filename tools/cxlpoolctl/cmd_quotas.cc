// `cxlpoolctl quotas [--json]`: every quota with its usage.
// `cxlpoolctl quota set (--uid U | --gid G | --cgroup PATH) [--tier KIND]
//      [--max-bytes SIZE] [--max-leases N] [--priority P]` (admin): changes a
// quota live; the daemon persists it in its state directory.
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "cxlpool/common/strings.h"
#include "daemon_client.h"
#include "table.h"

namespace cxlpool::ctl {
namespace {

std::string Limit(uint64_t v, bool bytes) {
  if (v == 0) return "unlimited";
  return bytes ? HumanBytes(v) : std::to_string(v);
}

int RunQuotas(const ConnOptions& o) {
  int rc = kExitOk;
  auto conn = OpenOrReport("quotas", o, &rc);
  if (!conn.ok()) return rc;
  proto::QuotasReply rep;
  if (Status s = conn->Call(proto::QuotasRequest(), &rep); !s.ok()) {
    return ReportError("quotas", s, false);
  }
  if (o.json) {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    for (const auto& q : rep.quotas()) {
      out.push_back({{"scope", q.scope()},
                     {"subject", q.subject()},
                     {"tier", q.tier().empty() ? nlohmann::ordered_json(nullptr)
                                               : nlohmann::ordered_json(q.tier())},
                     {"max_bytes", q.max_bytes()},
                     {"max_leases", q.max_leases()},
                     {"priority", q.priority()},
                     {"used_bytes", q.used_bytes()},
                     {"used_leases", q.used_leases()}});
    }
    std::cout << JsonText(out) << "\n";
    return kExitOk;
  }
  Table t({"SCOPE", "SUBJECT", "TIER", "MAX BYTES", "USED BYTES", "MAX LEASES", "USED LEASES",
           "PRIORITY"});
  for (const auto& q : rep.quotas()) {
    t.Add({q.scope(), q.subject(), q.tier().empty() ? "all" : q.tier(), Limit(q.max_bytes(), true),
           HumanBytes(q.used_bytes()), Limit(q.max_leases(), false),
           std::to_string(q.used_leases()), std::to_string(q.priority())});
  }
  std::cout << t.Render();
  return kExitOk;
}

struct QuotaSetOptions {
  ConnOptions conn;
  std::string uid, gid, cgroup, tier, max_bytes;
  uint64_t max_leases = 0;
  int32_t priority = 0;
};

int RunQuotaSet(const QuotaSetOptions& o) {
  proto::QuotaSetRequest req;
  proto::Quota* q = req.mutable_quota();
  if (!o.uid.empty()) q->set_scope("uid"), q->set_subject(o.uid);
  if (!o.gid.empty()) q->set_scope("gid"), q->set_subject(o.gid);
  if (!o.cgroup.empty()) q->set_scope("cgroup"), q->set_subject(o.cgroup);
  q->set_tier(o.tier);
  if (!o.max_bytes.empty()) {
    auto b = ParseByteSize(o.max_bytes);
    if (!b.ok()) {
      std::cerr << "cxlpoolctl quota set: --max-bytes: " << b.status().message() << "\n";
      return kExitUsage;
    }
    q->set_max_bytes(*b);
  }
  q->set_max_leases(o.max_leases);
  q->set_priority(o.priority);
  int rc = kExitOk;
  auto conn = OpenOrReport("quota set", o.conn, &rc);
  if (!conn.ok()) return rc;
  proto::QuotaSetReply rep;
  if (Status s = conn->Call(req, &rep); !s.ok()) return ReportError("quota set", s, false);
  if (o.conn.json) {
    std::cout << JsonText(nlohmann::ordered_json{{"scope", q->scope()},
                                                 {"subject", q->subject()},
                                                 {"tier", q->tier()},
                                                 {"max_bytes", q->max_bytes()},
                                                 {"max_leases", q->max_leases()},
                                                 {"priority", q->priority()}},
                          -1)
              << "\n";
  } else {
    std::cout << "quota " << q->scope() << " " << q->subject() << " "
              << (q->tier().empty() ? "all tiers" : q->tier()) << ": "
              << Limit(q->max_bytes(), true) << ", " << Limit(q->max_leases(), false)
              << " leases, priority " << q->priority() << "\n";
  }
  return kExitOk;
}

}  // namespace

Command MakeQuotasCommand() {
  return {"quotas", "Show tenant quotas (per uid, gid, cgroup and tier) and their usage",
          [](CLI::App* app) -> std::function<int()> {
            auto o = std::make_shared<ConnOptions>();
            AddConnOptions(app, o.get());
            return [o] { return RunQuotas(*o); };
          }};
}

Command MakeQuotaCommand() {
  return {"quota", "Change tenant quotas (admin): `quota set ...`",
          [](CLI::App* app) -> std::function<int()> {
            app->require_subcommand(1);
            CLI::App* set = app->add_subcommand("set", "Set (or replace) one quota; persisted");
            auto o = std::make_shared<QuotaSetOptions>();
            AddConnOptions(set, &o->conn);
            auto* u = set->add_option("--uid", o->uid, "User id or name");
            auto* g = set->add_option("--gid", o->gid, "Group id or name");
            auto* c = set->add_option("--cgroup", o->cgroup, "cgroup path, e.g. /system.slice/x");
            u->excludes(g)->excludes(c);
            g->excludes(c);
            set->add_option("--tier", o->tier, "Node kind (dram, cxl, ...); default: all tiers");
            set->add_option("--max-bytes", o->max_bytes, "Byte limit, e.g. 64G (0: unlimited)");
            set->add_option("--max-leases", o->max_leases, "Lease count limit (0: unlimited)");
            set->add_option("--priority", o->priority,
                            "Priority class: lower numbers are refused first when short");
            return [o, u, g, c]() -> int {
              if (u->count() + g->count() + c->count() != 1) {
                std::cerr << "cxlpoolctl quota set: give exactly one of --uid, --gid, --cgroup\n";
                return kExitUsage;
              }
              return RunQuotaSet(*o);
            };
          }};
}

}  // namespace cxlpool::ctl
