// The cluster's state as metrics and STATS entries (docs/cluster.md lists
// them): whether the session is live and its epoch, joins and losses,
// whether shared devices are fenced, this host's slices, the cluster's
// quarantined slices and hosts, and records that failed validation.
//
// Thread safety: pure functions of a ClusterStats value.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "cluster/cluster_member.h"
#include "metrics.h"

namespace cxlpool {

void ExportClusterMetrics(const ClusterStats& stats, MetricsRegistry* reg);
void ExportClusterStats(const ClusterStats& stats, std::map<std::string, uint64_t>* counters,
                        std::map<std::string, uint64_t>* gauges);

}  // namespace cxlpool
