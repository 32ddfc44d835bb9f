// `cxlpoolctl leases [--all|--mine] [--json]`: live leases with owner, size,
// node (and the node it was placed on, when a pin moved its pages), label,
// age, shared name and holders. Admins see every tenant's leases
// by default; others see their own.
#include <time.h>

#include <algorithm>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "cxlpool/common/strings.h"
#include "daemon_client.h"
#include "table.h"

namespace cxlpool::ctl {
namespace {

struct LeasesOptions {
  ConnOptions conn;
  bool all = false;
  bool mine = false;
};

std::string Age(int64_t created_unix) {
  int64_t s = static_cast<int64_t>(::time(nullptr)) - created_unix;
  if (s < 0) s = 0;
  if (s < 120) return std::to_string(s) + "s";
  if (s < 7200) return std::to_string(s / 60) + "m";
  if (s < 172800) return std::to_string(s / 3600) + "h";
  return std::to_string(s / 86400) + "d";
}

nlohmann::ordered_json LeaseJson(const proto::LeaseInfo& l) {
  nlohmann::ordered_json j;
  j["id"] = l.id();
  j["pid"] = l.owner_pid();
  j["uid"] = l.owner_uid();
  j["gid"] = l.owner_gid();
  j["comm"] = l.owner_comm();
  j["cgroup"] = l.cgroup();
  j["size_bytes"] = l.size_bytes();
  j["requested_bytes"] = l.requested_bytes();
  // What rounding added (size_bytes - requested_bytes).
  j["waste_bytes"] =
      l.size_bytes() > l.requested_bytes() ? l.size_bytes() - l.requested_bytes() : 0;
  // The memfds it is made of, mapped back to back (1: one memfd).
  j["extents"] = std::max(1, l.extents_size());
  j["numa_node"] = l.numa_node();
  j["kind"] = l.kind();
  j["pool"] = l.pool();
  j["backing"] = l.backing();
  j["page_size"] = l.page_size();
  j["label"] = l.label();
  j["shared_name"] =
      l.name().empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(l.name());
  j["holders"] = l.holders();
  j["created_unix"] = l.created_unix();
  j["age_seconds"] = std::max<int64_t>(0, ::time(nullptr) - l.created_unix());
  j["placement_reason"] = l.placement_reason();
  if (l.backing() == "shared-slice") j["device_offset"] = l.device_offset();
  j["long_term_pin"] = l.long_term_pin();
  j["placed_numa_node"] = l.has_placed_numa_node() ? nlohmann::ordered_json(l.placed_numa_node())
                                                   : nlohmann::ordered_json(nullptr);
  j["moved_reason"] = l.moved_reason().empty() ? nlohmann::ordered_json(nullptr)
                                               : nlohmann::ordered_json(l.moved_reason());
  j["migration"] = l.migration().empty() ? nlohmann::ordered_json(nullptr)
                                         : nlohmann::ordered_json(l.migration());
  // Split between pools: how much is where, and each extent's pool.
  j["spread"] =
      l.spread().empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(l.spread());
  if (!l.spread().empty()) {
    nlohmann::ordered_json ex = nlohmann::ordered_json::array();
    for (const auto& e : l.extents()) {
      ex.push_back({{"size_bytes", e.size_bytes()},
                    {"pool", e.pool()},
                    {"numa_node", e.has_numa_node() ? nlohmann::ordered_json(e.numa_node())
                                                    : nlohmann::ordered_json(nullptr)}});
    }
    j["extent_pools"] = std::move(ex);
  }
  return j;
}

// "1", or "0 (moved from 2)" once a pin moved the pages.
// A shared device's slice: the pool ("shared:dax1.0").
std::string NodeCell(const proto::LeaseInfo& l) {
  if (l.numa_node() < 0) return l.pool().empty() ? "-" : l.pool();
  std::string s = std::to_string(l.numa_node());
  if (!l.spread().empty()) {
    // "0+2": every node it is on, the one holding most first.
    std::vector<int> nodes{l.numa_node()};
    for (const auto& e : l.extents()) {
      if (e.has_numa_node() && std::find(nodes.begin(), nodes.end(), e.numa_node()) == nodes.end())
        nodes.push_back(e.numa_node());
    }
    s.clear();
    for (int n : nodes) s += (s.empty() ? "" : "+") + std::to_string(n);
  }
  if (l.has_placed_numa_node()) s += " (moved from " + std::to_string(l.placed_numa_node()) + ")";
  return s;
}

int RunLeases(const LeasesOptions& o) {
  int rc = kExitOk;
  auto conn = OpenOrReport("leases", o.conn, &rc);
  if (!conn.ok()) return rc;
  proto::ListLeasesRequest req;
  req.set_all(o.all || (!o.mine && conn->hello().is_admin()));
  proto::ListLeasesReply rep;
  if (Status s = conn->Call(req, &rep); !s.ok()) return ReportError("leases", s, false);
  if (o.conn.json) {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    for (const auto& l : rep.leases()) out.push_back(LeaseJson(l));
    std::cout << JsonText(out) << "\n";
    return kExitOk;
  }
  Table t(
      {"ID", "PID", "UID", "COMMAND", "SIZE", "NODE", "KIND", "LABEL", "AGE", "SHARED", "HOLDERS"});
  for (const auto& l : rep.leases()) {
    t.Add({std::to_string(l.id()), std::to_string(l.owner_pid()), std::to_string(l.owner_uid()),
           OrDash(l.owner_comm()), HumanBytes(l.size_bytes()), NodeCell(l), l.kind(),
           OrDash(l.label()), Age(l.created_unix()), OrDash(l.name()),
           std::to_string(l.holders())});
  }
  std::cout << t.Render();
  for (const auto& l : rep.leases()) {
    if (!l.moved_reason().empty()) {
      std::cout << "lease " << l.id() << " moved: " << l.moved_reason() << "\n";
    }
    if (!l.spread().empty()) std::cout << "lease " << l.id() << " split: " << l.spread() << "\n";
    if (!l.migration().empty()) {
      std::cout << "lease " << l.id() << " moving " << l.migration() << "\n";
    }
  }
  return kExitOk;
}

}  // namespace

Command MakeLeasesCommand() {
  return {"leases", "List live leases (every tenant's for admins, else your own)",
          [](CLI::App* app) -> std::function<int()> {
            auto o = std::make_shared<LeasesOptions>();
            AddConnOptions(app, &o->conn);
            auto* all = app->add_flag("--all", o->all, "Every tenant's leases (admin only)");
            app->add_flag("--mine", o->mine, "Only your own leases")->excludes(all);
            return [o] { return RunLeases(*o); };
          }};
}

}  // namespace cxlpool::ctl
