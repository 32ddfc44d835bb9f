// The GPU x memory-node preference (rule documented in docs/topology-json.md).
#include <algorithm>
#include <limits>
#include <set>

#include "cxlpool/topology/discover.h"

namespace cxlpool {
namespace {

struct Key {
  int distance;        // SLIT from the GPU's local node; INT_MAX unknown
  uint64_t bandwidth;  // HMAT MB/s from that initiator; 0 unknown
  uint64_t latency;    // HMAT ns from that initiator; UINT64_MAX unknown
  int id;
  bool operator<(const Key& o) const {
    if (distance != o.distance) return distance < o.distance;
    if (bandwidth != o.bandwidth) return bandwidth > o.bandwidth;
    if (latency != o.latency) return latency < o.latency;
    return id < o.id;
  }
};

// The access class of `target` whose initiators include `initiator`
// (access0 before access1), or null.
const AccessClass* ClassFor(const NumaNode& target, int initiator) {
  const AccessClass* best = nullptr;
  for (const auto& a : target.access) {
    if (std::find(a.initiators.begin(), a.initiators.end(), initiator) == a.initiators.end()) {
      continue;
    }
    if (best == nullptr || a.access_class < best->access_class) best = &a;
  }
  return best;
}

}  // namespace

void ComputeGpuMemoryPreference(Topology* topo) {
  topo->gpu_memory_preference.clear();
  std::set<int> gpu_memory_nodes;
  for (const auto& g : topo->gpus)
    if (g.memory_node) gpu_memory_nodes.insert(*g.memory_node);
  for (const auto& n : topo->numa_nodes)
    if (n.kind == NodeKind::kGpu) gpu_memory_nodes.insert(n.id);

  for (const auto& g : topo->gpus) {
    const NumaNode* local = g.numa_node ? topo->FindNode(*g.numa_node) : nullptr;
    std::vector<Key> keys;
    for (const auto& n : topo->numa_nodes) {
      if (!n.memory_bytes || *n.memory_bytes == 0) continue;  // no memory to lease
      if (gpu_memory_nodes.count(n.id)) continue;             // any GPU's own HBM
      Key k{std::numeric_limits<int>::max(), 0, std::numeric_limits<uint64_t>::max(), n.id};
      if (local != nullptr) {
        if (auto it = local->distances.find(n.id); it != local->distances.end() && it->second > 0) {
          k.distance = it->second;
        }
        if (const AccessClass* a = ClassFor(n, local->id)) {
          auto bw = a->read_bandwidth_mbps ? a->read_bandwidth_mbps : a->write_bandwidth_mbps;
          auto lat = a->read_latency_ns ? a->read_latency_ns : a->write_latency_ns;
          if (bw) k.bandwidth = *bw;
          if (lat) k.latency = *lat;
        }
      }
      keys.push_back(k);
    }
    std::sort(keys.begin(), keys.end());
    std::vector<int>& order = topo->gpu_memory_preference[g.index];
    for (const auto& k : keys) order.push_back(k.id);
  }
}

}  // namespace cxlpool
