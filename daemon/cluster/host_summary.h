// What this host tells the cluster about itself: its pools (per node: kind,
// tier, capacity, leased, reserve, free) and GPUs with their nearest nodes.
//
// Thread safety: a pure function.
#pragma once

#include <vector>

#include "cxlpool/cluster/records.h"
#include "cxlpool/topology/topology.h"
#include "lease/lease_types.h"

namespace cxlpool {

cluster::HostRecord SummarizeHost(const std::vector<PoolSnapshot>& pools, const Topology& topo);

}  // namespace cxlpool
