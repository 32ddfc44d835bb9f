#include "cluster/host_summary.h"

namespace cxlpool {

cluster::HostRecord SummarizeHost(const std::vector<PoolSnapshot>& pools, const Topology& topo) {
  cluster::HostRecord r;
  for (const auto& p : pools) {
    // A shared device is the rack's, not this host's: its record lists it
    // (shared_devices) with the slices this host owns and uses.
    if (p.backing == "shared-slice") continue;
    cluster::PoolSummary s;
    s.node = p.numa_node < 0 ? 0 : p.numa_node;
    s.kind = p.backing;
    s.tier = p.kind;
    s.capacity = p.capacity_bytes;
    s.leased = std::min(p.leased_bytes, p.capacity_bytes);
    s.reserve = p.reserve_ready_bytes;
    s.free = std::min(p.free_bytes, p.capacity_bytes);
    r.pools.push_back(std::move(s));
  }
  for (const auto& g : topo.gpus) {
    cluster::GpuSummary s;
    s.index = g.index;
    s.name = g.name.value_or("");
    if (auto it = topo.gpu_memory_preference.find(g.index); it != topo.gpu_memory_preference.end())
      for (size_t i = 0; i < it->second.size() && i < 4; ++i)
        s.nearest_nodes.push_back(it->second[i]);
    r.gpus.push_back(std::move(s));
  }
  return r;
}

}  // namespace cxlpool
