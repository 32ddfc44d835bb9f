#include "cluster/cluster_metrics.h"

namespace cxlpool {

void ExportClusterMetrics(const ClusterStats& s, MetricsRegistry* reg) {
  reg->AddGauge("cxlpool_cluster_session_live",
                "1 while this host holds a live etcd session (cluster member), else 0.");
  reg->AddGauge("cxlpool_cluster_epoch", "This host's epoch (its fencing token); 0 when lost.");
  reg->AddCounter("cxlpool_cluster_session_losses_total",
                  "Sessions lost (expired, unreachable etcd for a whole TTL, record removed).");
  reg->AddCounter("cxlpool_cluster_joins_total", "Sessions started (each with a new epoch).");
  reg->AddGauge("cxlpool_cluster_shared_fenced",
                "1 while granting from shared slices is stopped because the session is lost.");
  reg->AddGauge("cxlpool_cluster_hosts", "Hosts with a live session, as last read.");
  reg->AddGauge("cxlpool_cluster_slices_owned", "Slices of shared devices this host owns.");
  reg->AddGauge("cxlpool_cluster_slices_used", "Owned slices that hold leases.");
  reg->AddGauge("cxlpool_cluster_slices_quarantined",
                "Slices in the cluster whose owner's session is gone and not fenced yet.");
  reg->AddGauge("cxlpool_cluster_invalid_records",
                "Records under the cluster's prefix that failed validation, as last read.");
  reg->AddCounter("cxlpool_cluster_reconcile_errors_total",
                  "Reconcile rounds that could not read etcd or set a device up.");
  reg->Set("cxlpool_cluster_session_live", s.live ? 1 : 0);
  reg->Set("cxlpool_cluster_epoch", static_cast<double>(s.epoch));
  reg->SetCounter("cxlpool_cluster_session_losses_total", {}, static_cast<double>(s.losses));
  reg->SetCounter("cxlpool_cluster_joins_total", {}, static_cast<double>(s.joins));
  reg->Set("cxlpool_cluster_shared_fenced", s.shared_fenced ? 1 : 0);
  reg->Set("cxlpool_cluster_hosts", s.hosts);
  reg->Set("cxlpool_cluster_slices_owned", s.slices_owned);
  reg->Set("cxlpool_cluster_slices_used", s.slices_used);
  reg->Set("cxlpool_cluster_slices_quarantined", s.slices_quarantined);
  reg->Set("cxlpool_cluster_invalid_records", s.invalid_records);
  reg->SetCounter("cxlpool_cluster_reconcile_errors_total", {},
                  static_cast<double>(s.reconcile_errors));
}

void ExportClusterStats(const ClusterStats& s, std::map<std::string, uint64_t>* counters,
                        std::map<std::string, uint64_t>* gauges) {
  (*gauges)["cluster_session_live"] = s.live;
  (*gauges)["cluster_epoch"] = static_cast<uint64_t>(s.epoch);
  (*gauges)["cluster_shared_fenced"] = s.shared_fenced;
  (*gauges)["cluster_hosts"] = s.hosts;
  (*gauges)["cluster_slices_owned"] = s.slices_owned;
  (*gauges)["cluster_slices_used"] = s.slices_used;
  (*gauges)["cluster_slices_quarantined"] = s.slices_quarantined;
  (*gauges)["cluster_insecure_remote"] = s.insecure_remote;
  (*counters)["cluster_session_losses"] = s.losses;
  (*counters)["cluster_joins"] = s.joins;
}

}  // namespace cxlpool
