// DaemonMetrics: cxlpoold's long-lived Prometheus registry. The handler feeds
// it events as they happen (grants with their latency, warm or cold, by
// pool); everything the lease manager already counts or can be read at any
// time (pool gauges, refusals by reason, reclaims by cause, the warm
// reserve, quota usage, process facts) is copied in when the text is rendered, so a
// scrape always shows the current state and nothing is counted twice.
//
// Families (all prefixed cxlpool_): pool_{capacity,leased,free,reclaiming}_bytes
// and pool_leases {pool,kind,tier}; reserve_bytes {pool,state},
// reserve_watermark_bytes {pool,mark}, reserve_below_low_seconds {pool}; leases, shared_leases,
// connections, pending_builds; grants_total {pool,kind,source}; grant_latency_seconds {pool,source}
// (histogram); refusals_total {reason}; reclaims_total {cause}; releases_total, attaches_total;
// warm_{builds,build_failures,hits, misses}_total (the warm reserve's);
// quota_{used,max}_{bytes,leases} {scope,subject,tier}; dumpable; memlock_limit_bytes; build_info
// {version,revision}; lease_events_total {event} for any other lease-manager counter. Every counter
// is exported from the start, at 0 (a pool's grant series with the first scrape); limits that are
// unlimited are +Inf. docs/daemon.md lists them with their meaning.
//
// Thread safety: none; the event-loop thread owns it (as it owns the lease
// manager it reads).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>

#include "cxlpool/common/clock.h"
#include "lease/lease_manager.h"
#include "metrics.h"

namespace cxlpool {

// Facts about this process that `cxlpoolctl doctor` checks.
struct ProcessFacts {
  bool dumpable = false;             // prctl(PR_GET_DUMPABLE)
  uint64_t memlock_limit_bytes = 0;  // RLIMIT_MEMLOCK soft; UINT64_MAX unlimited or CAP_IPC_LOCK
};
ProcessFacts ReadProcessFacts();

class DaemonMetrics {
 public:
  DaemonMetrics();
  // Its grant cells point into its own registry: a copy would update the
  // original's.
  DaemonMetrics(const DaemonMetrics&) = delete;
  DaemonMetrics& operator=(const DaemonMetrics&) = delete;

  // A lease was granted `latency_ns` after its request arrived.
  void OnGranted(const LeaseSnapshot& lease, int64_t latency_ns);

  // The exposition text: refreshes the read-at-scrape families from
  // `leases` and `facts`, then renders every family.
  // `tenants` false: the per-tenant families (cxlpool_quota_*) carry no
  // samples (what a non-admin gets over the socket).
  std::string Render(const LeaseManager& leases, const ProcessFacts& facts, bool tenants = true);

  const MetricsRegistry& registry() const { return reg_; }
  // Called by Render after its own families, to add families from outside
  // the lease manager (the server's limits).
  void SetExtra(std::function<void(MetricsRegistry*)> extra) { extra_ = std::move(extra); }

 private:
  MetricsRegistry reg_;
  std::function<void(MetricsRegistry*)> extra_;
  // grants_total and grant_latency_seconds cells by pool (a pool's kind never
  // changes), [0] cold, [1] warm: a grant updates both without building labels.
  struct GrantCells {
    MetricsRegistry::Cell grants, latency;
  };
  // The pool's cells, created (both sources, at 0) on first use.
  GrantCells& Cells(const std::string& pool, const std::string& kind, bool warm);
  std::unordered_map<std::string, std::array<GrantCells, 2>> grant_cells_;
};

}  // namespace cxlpool
