#include "handler/daemon_metrics.h"

#include <linux/capability.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <limits>

#include "cxlpool/common/strings.h"
#include "cxlpool/common/version.h"

namespace cxlpool {

namespace {

constexpr const char* kGrants = "cxlpool_grants_total";
constexpr const char* kLatency = "cxlpool_grant_latency_seconds";
constexpr const char* kRefusals = "cxlpool_refusals_total";
constexpr const char* kReclaims = "cxlpool_reclaims_total";
constexpr const char* kEvents = "cxlpool_lease_events_total";
constexpr const char* kRecovered = "cxlpool_unjournalled_leases_total";

// Lease-manager counters and the family (and label) each is exported as.
struct CounterMap {
  const char* counter;
  const char* family;
  const char* label;      // label value ("" for an unlabelled family)
  const char* help = "";  // the unlabelled family's HELP text
};
constexpr CounterMap kCounterMap[] = {
    {"disconnect_reclaims", kReclaims, "disconnect"},
    {"revokes", kReclaims, "revoke"},
    {"restart_drops", kReclaims, "owner_death"},
    {"frees", kReclaims, "release"},
    {"shutdown_frees", kReclaims, "shutdown"},
    {"journal_failures", kReclaims, "journal_failure"},
    {"unjournalled_unclaimed", kReclaims, "unclaimed_after_damage"},
    {"unjournalled_adopted", kRecovered, "adopted"},
    {"fd_store_orphans", kRecovered, "orphan"},
    {"unjournalled_revokes", kRecovered, "revoked"},
    {"dax_orphans", kRecovered, "dax_orphan"},
    {"dax_orphans_destroyed", kRecovered, "dax_orphan_destroyed"},
    {"unjournalled_dax_adopted", kRecovered, "dax_adopted"},
    {"acl_refusals", kRefusals, "acl"},
    {"releases", "cxlpool_releases_total", "",
     "RELEASE requests handled: a holder let go of a lease (the lease ends with its last "
     "holder)."},
    {"attaches", "cxlpool_attaches_total", "",
     "ATTACH requests granted: a process joined a shared named lease."},
    {"reserve_builds", "cxlpool_warm_builds_total", "",
     "Warm reserve extents built and prefaulted ahead of requests (stock threads)."},
    {"reserve_build_failures", "cxlpool_warm_build_failures_total", "",
     "Warm reserve builds that failed; three in a row disable that extent size until one "
     "succeeds or a reload."},
    {"reserve_hits", "cxlpool_warm_hits_total", "",
     "Grants made wholly of warm reserve extents (nothing built on the request path)."},
    {"warm_misses", "cxlpool_warm_misses_total", "",
     "Grants that built some or all of their memory on the request path (the warm reserve "
     "did not cover them)."},
    {"leases_moved", "cxlpool_leases_moved_total", "",
     "Leases whose pages a holder's long-term pin moved to another node, confirmed by the "
     "daemon's move_pages."},
};

// Every refusal reason a refusal can carry (cxlpool_refusals_total).
constexpr const char* kRefusalReasons[] = {"capacity",     "quota",  "priority",    "invalid",
                                           "not_found",    "exists", "unavailable", "permission",
                                           "build_failed", "acl",    "internal"};

// The other lease-manager counters, exported as cxlpool_lease_events_total
// {event}. Listed so that each is at 0 from the start; a counter missing here
// still appears (from its first count on).
constexpr const char* kLeaseEvents[] = {
    "abandoned_builds",     "abandoned_waits",  "build_failures",    "moved_reports",
    "pin_settle_fallbacks", "reclaim_rejects",  "reclaims",          "reclaims_done",
    "restart_adopted",      "restart_awaiting", "waits_for_reclaim",
};

// A limit where 0 means none, as Prometheus spells it: +Inf.
double LimitValue(uint64_t v) {
  return v == 0 ? std::numeric_limits<double>::infinity() : static_cast<double>(v);
}

// The label of a labelled family in kCounterMap.
const char* LabelName(const char* family) {
  if (family == kReclaims) return "cause";
  if (family == kRecovered) return "outcome";
  return "reason";
}

std::string TierLabel(const std::optional<int>& t) {
  return t ? std::to_string(*t) : std::string("unknown");
}

}  // namespace

namespace {
// With CAP_IPC_LOCK in the effective set, mlock ignores RLIMIT_MEMLOCK.
bool HasCapIpcLock() {
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  if (::syscall(SYS_capget, &hdr, data) != 0) return false;
  return (data[0].effective >> CAP_IPC_LOCK) & 1u;
}
}  // namespace

ProcessFacts ReadProcessFacts() {
  ProcessFacts f;
  f.dumpable = ::prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) > 0;
  struct rlimit rl;
  if (HasCapIpcLock()) {
    f.memlock_limit_bytes = std::numeric_limits<uint64_t>::max();
  } else if (::getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
    f.memlock_limit_bytes = rl.rlim_cur == RLIM_INFINITY ? std::numeric_limits<uint64_t>::max()
                                                         : static_cast<uint64_t>(rl.rlim_cur);
  }
  return f;
}

DaemonMetrics::DaemonMetrics() {
  reg_.AddGauge("cxlpool_pool_capacity_bytes", "Capacity of each pool.");
  reg_.AddGauge("cxlpool_pool_leased_bytes", "Bytes leased (and being built) per pool.");
  reg_.AddGauge("cxlpool_pool_free_bytes",
                "Bytes neither leased, reclaiming nor in the warm reserve per pool.");
  reg_.AddGauge("cxlpool_pool_leases", "Live leases per pool.");
  reg_.AddGauge("cxlpool_reserve_bytes",
                "Warm reserve bytes per pool, by state (ready, building, retiring); all used.");
  reg_.AddGauge("cxlpool_reserve_watermark_bytes",
                "Warm reserve watermarks per pool (mark: low, where refills start; high, "
                "where they stop).");
  reg_.AddGauge("cxlpool_reserve_below_low_seconds",
                "Seconds the warm reserve's ready bytes have been below its low watermark without "
                "a break, per pool (0 when they are not).");
  reg_.AddGauge("cxlpool_pool_reclaiming_bytes",
                "Bytes of released leases still being reclaimed per pool (not free yet).");
  reg_.AddGauge("cxlpool_leases", "Live leases.");
  reg_.AddGauge("cxlpool_shared_leases", "Live shared (named) leases.");
  reg_.AddGauge("cxlpool_connections", "Connected clients.");
  reg_.AddGauge("cxlpool_pending_builds", "Backings being built (leases and reserve refills).");
  reg_.AddGauge("cxlpool_pending_reclaims", "Released backings being reclaimed on workers.");
  reg_.AddGauge("cxlpool_waiting_allocs", "Allocations waiting for reclaims in flight.");
  reg_.AddGauge(
      "cxlpool_journal_damaged",
      "1 if the lease journal was found damaged or lost at start, or a holder reclaimed a "
      "lease it did not know (see the log).");
  reg_.AddGauge("cxlpool_journal_skipped_bytes",
                "Bytes of damaged journal records replay went past at start.");
  reg_.AddGauge("cxlpool_journal_dropped_tail_bytes",
                "Bytes of torn or unreadable journal tail dropped at start.");
  reg_.AddCounter(kRecovered,
                  "Leases the journal did not know, by outcome: accounted again (adopted: from a "
                  "reclaim; orphan: from the fd store) or revoked (could not be accounted); "
                  "dax_orphan: a DAX sub-device no journalled lease names (held reserved), "
                  "dax_orphan_destroyed: one of those destroyed once nothing held it.");
  reg_.AddCounter(kGrants,
                  "Leases granted, by pool and source (warm: wholly from the warm reserve; cold: "
                  "built at least in part on the request path).");
  reg_.AddHistogram(kLatency, "Time from an ALLOC request to its grant, by pool and source.",
                    MetricsRegistry::LatencyBuckets());
  reg_.AddCounter(kRefusals,
                  "ALLOC and ATTACH requests refused, by reason: capacity (no pool has room), "
                  "quota, priority (room kept for higher classes), invalid, not_found, exists, "
                  "unavailable (grace period, shutting down), permission, build_failed, acl, "
                  "internal.");
  reg_.AddCounter(kReclaims,
                  "Leases ended, by cause: release (last holder let go), disconnect (holders "
                  "gone), revoke (admin), owner_death (holder gone across a restart), shutdown, "
                  "journal_failure, unclaimed_after_damage.");
  reg_.AddCounter(kEvents,
                  "Other lease-manager events, by name: reclaims and reclaim_rejects (leases "
                  "handed back after a restart), restart_adopted and restart_awaiting (journalled "
                  "leases found in the fd store or awaited from clients), build_failures, "
                  "abandoned_builds and abandoned_waits (requests whose client left), "
                  "waits_for_reclaim, reclaims_done.");
  for (const auto& m : kCounterMap) {
    if (m.label[0] == '\0') reg_.AddCounter(m.family, m.help);
  }
  reg_.AddGauge("cxlpool_quota_used_bytes", "Bytes charged against each quota rule.");
  reg_.AddGauge("cxlpool_quota_max_bytes", "Byte limit of each quota rule (+Inf: unlimited).");
  reg_.AddGauge("cxlpool_quota_used_leases", "Leases charged against each quota rule.");
  reg_.AddGauge("cxlpool_quota_max_leases", "Lease limit of each quota rule (+Inf: unlimited).");
  reg_.AddGauge("cxlpool_dumpable",
                "1 if the daemon is dumpable, which exposes lease fds through /proc (0 expected).");
  reg_.AddGauge("cxlpool_memlock_limit_bytes",
                "The daemon's RLIMIT_MEMLOCK soft limit (+Inf: unlimited or CAP_IPC_LOCK).");
  reg_.AddGauge("cxlpool_build_info",
                "Always 1; the labels name the running daemon's version and source revision.");
  reg_.Set("cxlpool_build_info", {{"version", ProjectVersion()}, {"revision", GitRevision()}}, 1);
  // Every counter at 0 from the start, before its first event.
  for (const char* r : kRefusalReasons) reg_.SetCounter(kRefusals, {{"reason", r}}, 0);
  for (const auto& m : kCounterMap) {
    if (m.label[0] == '\0') {
      reg_.SetCounter(m.family, {}, 0);
    } else {
      reg_.SetCounter(m.family, {{LabelName(m.family), m.label}}, 0);
    }
  }
  for (const char* e : kLeaseEvents) reg_.SetCounter(kEvents, {{"event", e}}, 0);
}

DaemonMetrics::GrantCells& DaemonMetrics::Cells(const std::string& pool, const std::string& kind,
                                                bool warm) {
  auto it = grant_cells_.find(pool);
  if (it == grant_cells_.end()) {
    std::array<GrantCells, 2> cells;
    for (int w = 0; w < 2; ++w) {
      const char* source = w ? "warm" : "cold";
      cells[w].grants =
          reg_.CounterCell(kGrants, {{"pool", pool}, {"kind", kind}, {"source", source}});
      cells[w].latency = reg_.HistogramCell(kLatency, {{"pool", pool}, {"source", source}});
    }
    it = grant_cells_.emplace(pool, cells).first;
  }
  return it->second[warm ? 1 : 0];
}

void DaemonMetrics::OnGranted(const LeaseSnapshot& lease, int64_t latency_ns) {
  GrantCells& c = Cells(lease.pool, lease.kind, lease.from_warm_stock);
  c.grants.Increment();
  c.latency.Observe(latency_ns > 0 ? static_cast<double>(latency_ns) / 1e9 : 0.0);
}

std::string DaemonMetrics::Render(const LeaseManager& leases, const ProcessFacts& facts,
                                  bool tenants) {
  static constexpr const char* kPoolGauges[] = {
      "cxlpool_pool_capacity_bytes", "cxlpool_pool_leased_bytes", "cxlpool_pool_free_bytes",
      "cxlpool_pool_leases", "cxlpool_pool_reclaiming_bytes"};
  for (const char* g : kPoolGauges) reg_.BeginGaugeRefresh(g);
  for (const auto& p : leases.Pools()) {
    (void)Cells(p.name, p.kind, false);  // both grant series exist (at 0) from the start
    Labels l{{"pool", p.name}, {"kind", p.kind}, {"tier", TierLabel(p.memory_tier)}};
    reg_.Set("cxlpool_pool_capacity_bytes", l, static_cast<double>(p.capacity_bytes));
    reg_.Set("cxlpool_pool_leased_bytes", l, static_cast<double>(p.leased_bytes));
    reg_.Set("cxlpool_pool_free_bytes", l, static_cast<double>(p.free_bytes));
    reg_.Set("cxlpool_pool_leases", l, static_cast<double>(p.lease_count));
    reg_.Set("cxlpool_pool_reclaiming_bytes", l, static_cast<double>(p.reclaiming_bytes));
  }
  for (const char* g : kPoolGauges) reg_.EndGaugeRefresh(g);
  static constexpr const char* kReserveGauges[] = {"cxlpool_reserve_bytes",
                                                   "cxlpool_reserve_watermark_bytes",
                                                   "cxlpool_reserve_below_low_seconds"};
  for (const char* g : kReserveGauges) reg_.BeginGaugeRefresh(g);
  for (const auto& p : leases.Pools()) {
    if (p.backing != "memfd") continue;
    auto set = [&](const char* g, const char* key, const char* value, uint64_t v) {
      reg_.Set(g, Labels{{"pool", p.name}, {key, value}}, static_cast<double>(v));
    };
    set("cxlpool_reserve_bytes", "state", "ready", p.reserve_ready_bytes);
    set("cxlpool_reserve_bytes", "state", "building", p.reserve_building_bytes);
    set("cxlpool_reserve_bytes", "state", "retiring", p.reserve_retiring_bytes);
    set("cxlpool_reserve_watermark_bytes", "mark", "low", p.reserve_low_bytes);
    set("cxlpool_reserve_watermark_bytes", "mark", "high", p.reserve_high_bytes);
    reg_.Set("cxlpool_reserve_below_low_seconds", Labels{{"pool", p.name}},
             static_cast<double>(p.reserve_below_low_ms.value_or(0)) / 1000.0);
  }
  for (const char* g : kReserveGauges) reg_.EndGaugeRefresh(g);
  auto gauges = leases.Gauges();
  auto gauge = [&](const char* key) {
    auto it = gauges.find(key);
    return it == gauges.end() ? 0.0 : static_cast<double>(it->second);
  };
  reg_.Set("cxlpool_leases", gauge("live_leases"));
  reg_.Set("cxlpool_shared_leases", gauge("shared_leases"));
  reg_.Set("cxlpool_connections", gauge("connections"));
  reg_.Set("cxlpool_pending_builds", gauge("pending_builds"));
  reg_.Set("cxlpool_pending_reclaims", gauge("pending_reclaims"));
  reg_.Set("cxlpool_waiting_allocs", gauge("waiting_allocs"));
  reg_.Set("cxlpool_journal_damaged", gauge("journal_damaged"));
  reg_.Set("cxlpool_journal_skipped_bytes", gauge("journal_skipped_bytes"));
  reg_.Set("cxlpool_journal_dropped_tail_bytes", gauge("journal_dropped_tail_bytes"));

  for (const auto& [name, value] : leases.Counters()) {
    double v = static_cast<double>(value);
    if (StartsWith(name, "refusals_")) {
      reg_.SetCounter(kRefusals, {{"reason", name.substr(9)}}, v);
      continue;
    }
    const CounterMap* hit = nullptr;
    for (const auto& m : kCounterMap) {
      if (name == m.counter) hit = &m;
    }
    if (hit == nullptr) {
      // grants and refusals have their own labelled families.
      if (name != "grants" && name != "refusals") reg_.SetCounter(kEvents, {{"event", name}}, v);
    } else if (hit->label[0] == '\0') {
      reg_.SetCounter(hit->family, {}, v);
    } else {
      reg_.SetCounter(hit->family, {{LabelName(hit->family), hit->label}}, v);
    }
  }

  static constexpr const char* kQuotaGauges[] = {
      "cxlpool_quota_used_bytes", "cxlpool_quota_max_bytes", "cxlpool_quota_used_leases",
      "cxlpool_quota_max_leases"};
  for (const char* g : kQuotaGauges) reg_.BeginGaugeRefresh(g);
  for (const auto& q : tenants ? leases.Quotas() : std::vector<QuotaUsage>()) {
    Labels l{{"scope", QuotaScopeName(q.rule.scope)},
             {"subject", q.rule.subject},
             {"tier", q.rule.tier.empty() ? "all" : q.rule.tier}};
    reg_.Set("cxlpool_quota_used_bytes", l, static_cast<double>(q.used_bytes));
    reg_.Set("cxlpool_quota_max_bytes", l, LimitValue(q.rule.max_bytes));
    reg_.Set("cxlpool_quota_used_leases", l, static_cast<double>(q.used_leases));
    reg_.Set("cxlpool_quota_max_leases", l, LimitValue(q.rule.max_leases));
  }
  for (const char* g : kQuotaGauges) reg_.EndGaugeRefresh(g);

  reg_.Set("cxlpool_dumpable", facts.dumpable ? 1 : 0);
  reg_.Set("cxlpool_memlock_limit_bytes",
           facts.memlock_limit_bytes == std::numeric_limits<uint64_t>::max()
               ? std::numeric_limits<double>::infinity()
               : static_cast<double>(facts.memlock_limit_bytes));
  if (extra_) extra_(&reg_);
  return reg_.Render();
}

}  // namespace cxlpool
