// `cxlpoolctl doctor [--json] [--sysfs-root DIR] [--socket PATH]`: lists what
// on this node makes cxlpool slow, unsafe or unable to work, each finding
// with a remedy. Exit code: 0 when nothing is worse than info, 1 when a
// finding is a warning or an error (like `brew doctor`: a provisioning
// script or health check fails on something to fix; --json's "worst" tells
// the two apart).
#include <sys/resource.h>

#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "cxlpool/common/fs.h"
#include "cxlpool/topology/discover.h"
#include "daemon_client.h"
#include "doctor.h"
#include "table.h"

namespace cxlpool::ctl {
namespace {

struct DoctorOptions {
  ConnOptions conn;
  std::string sysfs_root;
  std::string socket_group = "cxlpool";
};

int RunDoctor(const DoctorOptions& o) {
  auto fs = MakeRootedFileSystem(o.sysfs_root.empty() ? FsRootFromEnv("/") : o.sysfs_root);
  // GPUs too: a GPU's memory node is never pooled, and only they tell.
  Topology topo = DiscoverTopology(*fs);

  DoctorInputs in;
  in.socket_path = ResolveSocketPath(o.conn.socket);
  in.socket = StatSocket(in.socket_path);
  in.expected_socket_group = o.socket_group;
  rlimit rl{};
  if (::getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
    in.client_memlock_bytes = rl.rlim_cur;
  }
  auto conn = DaemonConnection::Open(in.socket_path);
  if (conn.ok()) {
    in.daemon_reachable = true;
    proto::StatsReply stats;
    if (conn->Call(proto::StatsRequest(), &stats).ok()) {
      if (auto it = stats.gauges().find("dumpable"); it != stats.gauges().end()) {
        in.daemon_dumpable = it->second != 0;
      }
      if (auto it = stats.gauges().find("memlock_limit_bytes"); it != stats.gauges().end()) {
        if (it->second != UINT64_MAX) in.daemon_memlock_bytes = it->second;
      }
      if (auto it = stats.gauges().find("cluster_session_live"); it != stats.gauges().end()) {
        auto get = [&](const char* k) {
          auto g = stats.gauges().find(k);
          return g == stats.gauges().end() ? uint64_t{0} : g->second;
        };
        in.cluster = DoctorInputs::Cluster{it->second != 0, get("cluster_shared_fenced") != 0,
                                           get("cluster_slices_quarantined"),
                                           get("cluster_insecure_remote") != 0};
      }
      if (auto it = stats.gauges().find("journal_damaged"); it != stats.gauges().end()) {
        in.daemon_journal_damaged = it->second != 0;
        auto get = [&](const char* k) {
          auto g = stats.gauges().find(k);
          return g == stats.gauges().end() ? uint64_t{0} : g->second;
        };
        in.daemon_journal_skipped_bytes = get("journal_skipped_bytes");
        in.daemon_journal_dropped_tail_bytes = get("journal_dropped_tail_bytes");
      }
    }
    proto::PoolsReply pools;
    if (conn->Call(proto::PoolsRequest(), &pools).ok()) {
      in.pooled_nodes.emplace();
      in.reserves.emplace();
      for (const auto& p : pools.pools()) {
        if (p.has_reserve()) {
          const proto::PoolReserve& r = p.reserve();
          DoctorInputs::Reserve d{p.name(),           p.capacity_bytes(), r.ready_bytes(),
                                  r.building_bytes(), r.low_bytes(),      r.high_bytes()};
          if (r.has_below_low_ms()) d.below_low_ms = r.below_low_ms();
          d.free_bytes = p.free_bytes();
          in.reserves->push_back(std::move(d));
        }
        if (p.backing() != "devdax") in.pool_capacity_bytes += p.capacity_bytes();
        if (p.backing() != "devdax") in.pooled_nodes->push_back(p.numa_node());
      }
    }
  }
  std::vector<Finding> findings = cxlpool::RunDoctor(*fs, topo, in);
  if (o.conn.json) {
    nlohmann::ordered_json out;
    out["worst"] = SeverityName(WorstSeverity(findings));
    out["findings"] = nlohmann::ordered_json::array();
    for (const auto& f : findings) {
      out["findings"].push_back({{"check", f.check},
                                 {"severity", SeverityName(f.severity)},
                                 {"summary", f.summary},
                                 {"remedy", f.remedy.empty() ? nlohmann::ordered_json(nullptr)
                                                             : nlohmann::ordered_json(f.remedy)}});
    }
    std::cout << JsonText(out) << "\n";
  } else {
    for (const auto& f : findings) {
      std::cout << "[" << SeverityName(f.severity) << "] " << f.check << ": " << f.summary << "\n";
      if (!f.remedy.empty() && f.severity != Severity::kOk) {
        std::cout << "    remedy: " << f.remedy << "\n";
      }
    }
  }
  return WorstSeverity(findings) >= Severity::kWarning ? kExitFailure : kExitOk;
}

}  // namespace

Command MakeDoctorCommand() {
  return {"doctor",
          "Check this node's settings for cxlpool and say how to fix each problem (exit 1 "
          "when a finding is a warning or an error)",
          [](CLI::App* app) -> std::function<int()> {
            auto o = std::make_shared<DoctorOptions>();
            AddConnOptions(app, &o->conn);
            app->add_option("--sysfs-root", o->sysfs_root,
                            "Read /sys and /proc under DIR (default: $CXLPOOL_FSROOT, else /)")
                ->type_name("DIR");
            app->add_option("--socket-group", o->socket_group,
                            "Group the socket should belong to (default: cxlpool)");
            return [o] { return RunDoctor(*o); };
          }};
}

}  // namespace cxlpool::ctl
