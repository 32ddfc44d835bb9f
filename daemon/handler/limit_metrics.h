// The server's limits (server/limits.h) as metrics and STATS entries: how
// often each limit refused or closed something, what each is set to, and
// what clients make the server hold now. docs/daemon.md ("Limits") lists
// every name.
//
// Families: cxlpool_limit_hits_total {limit}, cxlpool_limit {limit} (the
// configured value; timeouts in seconds), cxlpool_client_requests_in_flight,
// cxlpool_client_queued_bytes, cxlpool_client_fds, cxlpool_protocol_errors_total.
// STATS: counters limit_hits_<limit> and protocol_errors, gauges
// requests_in_flight, queued_reply_bytes and client_fds.
//
// Thread safety: none; call on the event-loop thread that owns the server.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "metrics.h"
#include "server/limits.h"
#include "server/server.h"

namespace cxlpool {

// Every limit by its `limits.` key (without the prefix) and its value, in the
// order docs/daemon.md lists them.
std::vector<std::pair<std::string, double>> LimitValues(const ServerLimits& limits);

void ExportLimitMetrics(const ServerStats& stats, const ServerLimits& limits, MetricsRegistry* reg);
void ExportLimitStats(const ServerStats& stats, std::map<std::string, uint64_t>* counters,
                      std::map<std::string, uint64_t>* gauges);

}  // namespace cxlpool
