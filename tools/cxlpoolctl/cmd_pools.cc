// `cxlpoolctl pools [--json]`: each pool's node, kind, tier, capacity, leased,
// warm reserve, free bytes, page size and backing, and what a long-term pin
// does on its node (the node's zones).
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "cxlpool/common/strings.h"
#include "daemon_client.h"
#include "table.h"

namespace cxlpool::ctl {
namespace {

nlohmann::ordered_json PoolJson(const proto::PoolInfo& p) {
  nlohmann::ordered_json j;
  j["name"] = p.name();
  j["numa_node"] = p.numa_node() >= 0 ? nlohmann::ordered_json(p.numa_node()) : nullptr;
  j["kind"] = p.kind();
  j["memory_tier"] = p.has_memory_tier() ? nlohmann::ordered_json(p.memory_tier()) : nullptr;
  j["capacity_bytes"] = p.capacity_bytes();
  j["leased_bytes"] = p.leased_bytes();
  j["free_bytes"] = p.free_bytes();
  j["page_size"] = p.page_size();
  j["backing"] = p.backing();
  j["dynamic_region"] = p.dynamic_region();
  j["lease_count"] = p.lease_count();
  j["reclaiming_bytes"] = p.reclaiming_bytes();
  auto opt = [](bool has, uint64_t v) {
    return has ? nlohmann::ordered_json(v) : nlohmann::ordered_json(nullptr);
  };
  j["kernel_zone_bytes"] = opt(p.has_kernel_zone_bytes(), p.kernel_zone_bytes());
  j["movable_bytes"] = opt(p.has_movable_bytes(), p.movable_bytes());
  j["long_term_pins"] = p.long_term_pins().empty() ? nlohmann::ordered_json(nullptr)
                                                   : nlohmann::ordered_json(p.long_term_pins());
  j["long_term_pin_policy"] = p.long_term_pin_policy();
  if (p.has_reserve()) {
    const proto::PoolReserve& r = p.reserve();
    j["reserve"] = {{"ready_bytes", r.ready_bytes()},
                    {"building_bytes", r.building_bytes()},
                    {"retiring_bytes", r.retiring_bytes()},
                    {"low_bytes", r.low_bytes()},
                    {"high_bytes", r.high_bytes()},
                    {"below_low_ms", r.has_below_low_ms() ? nlohmann::ordered_json(r.below_low_ms())
                                                          : nlohmann::ordered_json(nullptr)}};
  } else {
    j["reserve"] = nullptr;
  }
  return j;
}

// "ready/high" of the warm reserve ("+building" while it refills), or "-".
std::string ReserveCell(const proto::PoolInfo& p) {
  if (!p.has_reserve()) return "-";
  const proto::PoolReserve& r = p.reserve();
  std::string s = HumanBytes(r.ready_bytes()) + "/" + HumanBytes(r.high_bytes());
  if (r.building_bytes() > 0) s += " +" + HumanBytes(r.building_bytes());
  return s;
}

// "yes", "partly", "no" or "?", and the node's override when it has one.
std::string PinsCell(const proto::PoolInfo& p) {
  if (p.backing() == "devdax") return "yes";  // device memory does not migrate
  std::string s = p.long_term_pins().empty() ? "?" : p.long_term_pins();
  if (!p.long_term_pin_policy().empty() && p.long_term_pin_policy() != "auto") {
    s += " (" + p.long_term_pin_policy() + ")";
  }
  return s;
}

int RunPools(const ConnOptions& o) {
  int rc = kExitOk;
  auto conn = OpenOrReport("pools", o, &rc);
  if (!conn.ok()) return rc;
  proto::PoolsReply rep;
  if (Status s = conn->Call(proto::PoolsRequest(), &rep); !s.ok()) {
    return ReportError("pools", s, false);
  }
  if (o.json) {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    for (const auto& p : rep.pools()) out.push_back(PoolJson(p));
    std::cout << JsonText(out) << "\n";
    return kExitOk;
  }
  Table t({"POOL", "NODE", "KIND", "TIER", "CAPACITY", "LEASED", "RESERVE", "FREE", "PAGE",
           "BACKING", "LEASES", "MOVABLE", "LT-PINS"});
  for (const auto& p : rep.pools()) {
    std::string backing = p.backing();
    if (p.backing() == "devdax") backing += p.dynamic_region() ? " (dynamic)" : " (static, whole)";
    t.Add({p.name(), p.numa_node() >= 0 ? std::to_string(p.numa_node()) : "-", p.kind(),
           p.has_memory_tier() ? std::to_string(p.memory_tier()) : "-",
           HumanBytes(p.capacity_bytes()), HumanBytes(p.leased_bytes()), ReserveCell(p),
           HumanBytes(p.free_bytes()), HumanBytes(p.page_size()), backing,
           std::to_string(p.lease_count()),
           p.has_movable_bytes() ? HumanBytes(p.movable_bytes()) : "-", PinsCell(p)});
  }
  std::cout << t.Render();
  std::cout << "LT-PINS: does a long-term pin (CUDA registration, RDMA) keep pages on the node: "
               "yes; partly (only in its kernel zones); no (ZONE_MOVABLE only: such leases go "
               "elsewhere)\n";
  std::cout << "RESERVE: warm reserve extents ready / high watermark (+ being built); used "
               "memory, not free\n";
  return kExitOk;
}

}  // namespace

Command MakePoolsCommand() {
  return {"pools", "Show the daemon's pools: capacity, leased, warm reserve, free",
          [](CLI::App* app) -> std::function<int()> {
            auto o = std::make_shared<ConnOptions>();
            AddConnOptions(app, o.get());
            return [o] { return RunPools(*o); };
          }};
}

}  // namespace cxlpool::ctl
