// Topology -> JSON, schema_version 1 (docs/topology-json.md).
#include "cxlpool/topology/json.h"

#include <exception>

namespace cxlpool {
namespace {

using Json = nlohmann::ordered_json;

template <typename T>
Json Opt(const std::optional<T>& v) {
  return v ? Json(*v) : Json(nullptr);
}

Json NonEmpty(const std::string& s) { return s.empty() ? Json(nullptr) : Json(s); }

Json Hugepages(const std::optional<uint64_t>& total, const std::optional<uint64_t>& free) {
  Json j = Json::object();
  j["total"] = Opt(total);
  j["free"] = Opt(free);
  return j;
}

Json NodeJson(const Topology& topo, const NumaNode& n) {
  Json j = Json::object();
  j["id"] = n.id;
  j["cpus"] = n.cpus;
  j["memory_bytes"] = Opt(n.memory_bytes);
  j["free_bytes"] = Opt(n.free_bytes);
  j["kind"] = NodeKindName(n.kind);
  j["kind_reason"] = NonEmpty(n.kind_reason);
  Json d = Json::object();
  for (const auto& [id, dist] : n.distances) d[std::to_string(id)] = dist;
  j["distances"] = d;
  j["memory_tier"] = Opt(n.memory_tier);
  j["zone"] = Opt(n.zone);
  j["kernel_zone_bytes"] = Opt(n.kernel_zone_bytes);
  j["movable_bytes"] = Opt(n.movable_bytes);
  const char* pins = LongTermPinsName(LongTermPinsOf(n));
  j["long_term_pins"] = pins != nullptr ? Json(pins) : Json(nullptr);
  j["not_pooled_reason"] = Opt(NotPooledReason(n));
  Json access = Json::array();
  for (const auto& a : n.access) {
    Json aj = Json::object();
    aj["class"] = a.access_class;
    aj["initiators"] = a.initiators;
    aj["read_bandwidth_mbps"] = Opt(a.read_bandwidth_mbps);
    aj["write_bandwidth_mbps"] = Opt(a.write_bandwidth_mbps);
    aj["read_latency_ns"] = Opt(a.read_latency_ns);
    aj["write_latency_ns"] = Opt(a.write_latency_ns);
    access.push_back(std::move(aj));
  }
  j["access"] = access;
  Json huge = Json::object();
  huge["2m"] = Hugepages(n.hugepages_2m_total, n.hugepages_2m_free);
  huge["1g"] = Hugepages(n.hugepages_1g_total, n.hugepages_1g_free);
  j["hugepages"] = huge;
  Json local = Json::array();
  for (const auto& g : topo.gpus)
    if (g.numa_node && *g.numa_node == n.id) local.push_back(g.index);
  j["local_gpus"] = local;
  return j;
}

Json GpuJson(const Gpu& g) {
  Json j = Json::object();
  j["index"] = g.index;
  j["uuid"] = Opt(g.uuid);
  j["name"] = Opt(g.name);
  j["pci_bus_id"] = NonEmpty(g.pci_bus_id);
  j["memory_bytes"] = Opt(g.memory_bytes);
  j["numa_node"] = Opt(g.numa_node);
  j["memory_node"] = Opt(g.memory_node);
  j["memory_node_source"] = NonEmpty(g.memory_node_source);
  j["source"] = NonEmpty(g.source);
  if (!g.nvlinks_known) {
    j["nvlinks"] = nullptr;
  } else {
    Json links = Json::array();
    for (const auto& l : g.nvlinks) {
      Json lj = Json::object();
      lj["link"] = l.link;
      lj["active"] = l.active;
      lj["remote_pci_bus_id"] = Opt(l.remote_pci_bus_id);
      lj["remote_type"] = Opt(l.remote_type);
      links.push_back(std::move(lj));
    }
    j["nvlinks"] = links;
  }
  return j;
}

}  // namespace

Json TopologyToJson(const Topology& topo) {
  Json j = Json::object();
  j["schema_version"] = Topology::kSchemaVersion;
  Json nodes = Json::array();
  for (const auto& n : topo.numa_nodes) nodes.push_back(NodeJson(topo, n));
  j["numa_nodes"] = nodes;

  Json dax = Json::array();
  for (const auto& d : topo.dax_devices) {
    Json dj = Json::object();
    dj["name"] = d.name;
    dj["size_bytes"] = Opt(d.size_bytes);
    dj["target_node"] = Opt(d.target_node);
    dj["mode"] = Opt(d.mode);
    dj["source"] = Opt(d.source);
    dj["region"] = Opt(d.region);
    dj["dynamic"] = Opt(d.dynamic);
    dj["align_bytes"] = Opt(d.align_bytes);
    dax.push_back(std::move(dj));
  }
  j["dax_devices"] = dax;

  Json memdevs = Json::array();
  for (const auto& m : topo.cxl_memdevs) {
    Json mj = Json::object();
    mj["name"] = m.name;
    mj["serial"] = Opt(m.serial);
    mj["ram_bytes"] = Opt(m.ram_bytes);
    mj["pmem_bytes"] = Opt(m.pmem_bytes);
    mj["numa_node"] = Opt(m.numa_node);
    memdevs.push_back(std::move(mj));
  }
  Json regions = Json::array();
  for (const auto& r : topo.cxl_regions) {
    Json rj = Json::object();
    rj["name"] = r.name;
    rj["size_bytes"] = Opt(r.size_bytes);
    rj["type"] = Opt(r.type);
    rj["memdevs"] = r.memdevs;
    rj["dax_devices"] = r.dax_devices;
    rj["numa_nodes"] = r.numa_nodes;
    regions.push_back(std::move(rj));
  }
  Json cxl = Json::object();
  cxl["memdevs"] = memdevs;
  cxl["regions"] = regions;
  j["cxl"] = cxl;

  Json gpus = Json::array();
  for (const auto& g : topo.gpus) gpus.push_back(GpuJson(g));
  j["gpus"] = gpus;

  Json tiers = Json::array();
  for (const auto& t : topo.memory_tiers) {
    Json tj = Json::object();
    tj["id"] = t.id;
    tj["nodes"] = t.nodes;
    tiers.push_back(std::move(tj));
  }
  j["memory_tiers"] = tiers;

  Json pref = Json::object();
  for (const auto& [gpu, order] : topo.gpu_memory_preference) pref[std::to_string(gpu)] = order;
  j["gpu_memory_preference"] = pref;
  j["warnings"] = topo.warnings;
  return j;
}

std::string TopologyToJsonString(const Topology& topo, int indent) {
  try {
    return TopologyToJson(topo).dump(indent, ' ', false, Json::error_handler_t::replace) + "\n";
  } catch (const std::exception&) {
    // Only allocation failure can get here; keep the promise of no throw.
    return "{\"schema_version\": 1, \"error\": \"serialisation failed\"}\n";
  }
}

}  // namespace cxlpool
