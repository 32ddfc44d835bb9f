// Config reload (SIGHUP): re-reads the configuration file and applies what
// can change without dropping a lease. Live: quota rules (with the state
// directory's live changes kept on top), priority reserves, pool capacities
// (resolved against each node's MemTotal now when a NodeMemoryWatch is
// given, else the one discovered at start; refused for a pool whose leases
// already use more), reserve watermarks, the memory watch interval and the
// log level. Everything else (socket, groups, workers, state directory,
// pinning/THP/hugetlb, enabled nodes, devdax, metrics endpoint) needs a
// restart: a changed value is reported and the running one kept. A config
// that does not parse changes nothing.
//
// Thread safety: call on the event-loop thread (it touches the lease
// manager and its pools).
#pragma once

#include <string>
#include <vector>

#include "config/config.h"
#include "cxlpool/common/status.h"
#include "cxlpool/topology/topology.h"
#include "lease/lease_manager.h"
#include "pool/node_memory_watch.h"

namespace cxlpool {

struct ReloadReport {
  std::vector<std::string> applied;  // "quotas: 3 rules", "node0 capacity 1.0 GiB -> 2.0 GiB"
  std::vector<std::string> kept;     // changes that need a restart, or were refused
};

struct ReloadOptions {
  bool log_level_from_flag = false;  // --log-level wins over the file
  // Re-reads each node's MemTotal for its pool's capacity (and records the
  // result, so its next Check does not redo it). Null: `topo`'s MemTotal.
  NodeMemoryWatch* memory = nullptr;
};

// Applies `next` over the running `current` (which it then replaces).
ReloadReport ApplyConfig(const DaemonConfig& next, const Topology& topo, LeaseManager* leases,
                         DaemonConfig* current, const ReloadOptions& options = {});

// Reads `path` ("" = the embedded default) and applies it. On a read or parse
// error nothing changes and the error (naming the file and key) is returned.
Result<ReloadReport> ReloadConfigFile(const std::string& path, const Topology& topo,
                                      LeaseManager* leases, DaemonConfig* current,
                                      const ReloadOptions& options = {});

}  // namespace cxlpool
