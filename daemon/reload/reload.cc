#include "reload/reload.h"

#include "cxlpool/common/log.h"
#include "cxlpool/common/strings.h"

namespace cxlpool {

namespace {

const NumaNode* FindNode(const Topology& topo, int id) {
  for (const auto& n : topo.numa_nodes) {
    if (n.id == id) return &n;
  }
  return nullptr;
}

}  // namespace

ReloadReport ApplyConfig(const DaemonConfig& next, const Topology& topo, LeaseManager* leases,
                         DaemonConfig* current, const ReloadOptions& options) {
  ReloadReport r;
  auto restart = [&](const char* key, bool changed) {
    if (changed) r.kept.push_back(std::string(key) + " changed: needs a restart, kept");
  };
  restart("daemon.socket", next.socket_path != current->socket_path);
  restart("daemon.socket_group", next.socket_group != current->socket_group);
  restart("daemon.socket_mode", next.socket_mode != current->socket_mode);
  restart("daemon.admin_group", next.admin_gid != current->admin_gid);
  restart("daemon.workers", next.workers != current->workers);
  restart("daemon.stock_workers", next.stock_workers != current->stock_workers);
  restart("daemon.stock_nice", next.stock_nice != current->stock_nice);
  restart("daemon.stock_idle", next.stock_idle != current->stock_idle);
  restart("daemon.state_dir", next.state_dir != current->state_dir);
  restart("metrics.http_listen", next.metrics_http_listen != current->metrics_http_listen);
  restart("devdax", next.devdax.size() != current->devdax.size());
  restart("limits", next.limits != current->limits);
  restart("cluster", next.cluster != current->cluster);

  QuotaTable* q = leases->mutable_quotas();
  q->SetConfigRules(next.quotas);
  q->SetReserves(next.priority_reserves);
  r.applied.push_back("quotas: " + std::to_string(next.quotas.size()) + " config rule(s), " +
                      std::to_string(q->LiveRules().size()) + " live change(s), " +
                      std::to_string(next.priority_reserves.size()) + " priority reserve(s)");

  if (!options.log_level_from_flag && next.log_level != current->log_level) {
    SetLogLevel(next.log_level);
    r.applied.push_back("log level");
  }

  if (next.memory_watch_interval != current->memory_watch_interval) {
    r.applied.push_back("daemon.memory_watch_interval " +
                        std::to_string(current->memory_watch_interval.count()) + " ms -> " +
                        std::to_string(next.memory_watch_interval.count()) + " ms");
  }

  bool refill = false;
  for (Pool* pool : leases->pools()) {
    if (std::string(pool->backing()) != "memfd") continue;
    int id = pool->numa_node();
    const PoolConfig& was = current->ForNode(id);
    const PoolConfig& now = next.ForNode(id);
    if (!now.enabled) {
      r.kept.push_back(pool->name() + ": disabling a pool needs a restart, kept");
      continue;
    }
    if (now.pin != was.pin || now.thp != was.thp || now.hugetlb != was.hugetlb) {
      r.kept.push_back(pool->name() + ": pin/thp/hugetlb changed: needs a restart, kept");
    }
    const NumaNode* node = FindNode(topo, id);
    if (options.memory != nullptr) {
      if (options.memory->ApplyForReload(pool, now.capacity, &r.applied, &r.kept)) refill = true;
    } else if (node != nullptr && node->memory_bytes) {
      uint64_t cap = now.capacity.Resolve(*node->memory_bytes);
      if (cap != pool->capacity()) {
        uint64_t old = pool->capacity();
        if (pool->SetCapacity(cap)) {
          r.applied.push_back(pool->name() + " capacity " + HumanBytes(old) + " -> " +
                              HumanBytes(cap));
          refill = true;
        } else {
          r.kept.push_back(pool->name() + " capacity " + HumanBytes(cap) + " refused: " +
                           HumanBytes(pool->used_bytes()) + " in use; kept " + HumanBytes(old));
        }
      }
    }
    if (auto* mp = dynamic_cast<MemfdPool*>(pool);
        mp != nullptr && (now.reserve_low.ToString() != mp->config().reserve_low.ToString() ||
                          now.reserve_high.ToString() != mp->config().reserve_high.ToString())) {
      Status st = mp->SetReserveWatermarks(now.reserve_low, now.reserve_high);
      if (st.ok()) {
        r.applied.push_back(pool->name() + " reserve " +
                            HumanBytes(mp->reserve()->settings().low_bytes) + " low, " +
                            HumanBytes(mp->reserve()->settings().high_bytes) + " high");
        refill = true;
      } else {
        r.kept.push_back(pool->name() + " reserve refused: " + st.message());
      }
    }
  }
  if (refill) leases->StartRefills();

  // What was not applied stays as it runs.
  DaemonConfig merged = next;
  merged.socket_path = current->socket_path;
  merged.socket_group = current->socket_group;
  merged.socket_mode = current->socket_mode;
  merged.admin_group = current->admin_group;
  merged.admin_gid = current->admin_gid;
  merged.workers = current->workers;
  merged.stock_workers = current->stock_workers;
  merged.stock_nice = current->stock_nice;
  merged.stock_idle = current->stock_idle;
  merged.state_dir = current->state_dir;
  merged.metrics_http_listen = current->metrics_http_listen;
  merged.devdax = current->devdax;
  merged.limits = current->limits;
  if (options.log_level_from_flag) merged.log_level = current->log_level;
  *current = std::move(merged);
  return r;
}

Result<ReloadReport> ReloadConfigFile(const std::string& path, const Topology& topo,
                                      LeaseManager* leases, DaemonConfig* current,
                                      const ReloadOptions& options) {
  auto next = path.empty() ? ParseConfig(DefaultConfigText(), "<default>") : LoadConfigFile(path);
  if (!next.ok()) return next.status();
  return ApplyConfig(*next, topo, leases, current, options);
}

}  // namespace cxlpool
