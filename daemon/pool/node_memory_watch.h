// NodeMemoryWatch: keeps each NUMA-node (memfd) pool's capacity in step with
// its node's MemTotal when memory is onlined or offlined after the daemon
// started (CXL memory onlined as system RAM, virtio-mem, a balloon, memory
// hot-remove). A capacity written as a percent ("90%") follows MemTotal; one
// written in bytes ("64G") is clamped to it.
//
// MemTotal is read through the FileSystem seam from
// /sys/devices/system/node/node<N>/meminfo (/proc/meminfo for node 0 when
// the kernel has no NUMA node directory, as topology discovery does), with
// the shared ParseMeminfo. Devdax pools are never touched.
//
// A shrink below what a pool has in use (leases, builds and reclaims in
// flight) is refused by Pool::SetCapacity: the old capacity is kept, a
// warning is logged once per MemTotal change, and every later Check retries
// it (memory may have been freed). An unreadable or garbled meminfo leaves
// the pool alone (one warning until it reads again).
//
// Thread safety: not thread-safe; call on the event-loop thread (it changes
// pool accounting). `fs` must outlive the watch.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "cxlpool/common/fs.h"
#include "cxlpool/common/status.h"
#include "cxlpool/topology/topology.h"
#include "pool/pool.h"
#include "pool/pool_options.h"

namespace cxlpool {

// What one Check did, also logged by it.
struct MemoryWatchReport {
  // "node0: MemTotal 4.3 GiB -> 22.0 GiB, capacity 3.9 GiB -> 19.8 GiB"
  std::vector<std::string> applied;
  // Refusals and unreadable meminfo files (each reported once per change).
  std::vector<std::string> warnings;
  bool resized = false;  // some capacity changed: the owner restarts reserve refills
  bool grew = false;     // ... and some grew
};

class NodeMemoryWatch {
 public:
  // `topo`: the MemTotal each pool's capacity was resolved against at start.
  NodeMemoryWatch(const FileSystem* fs, const Topology& topo);

  // The periodic check: for every memfd pool whose node's MemTotal differs
  // from the one its capacity was last resolved against (or whose last
  // resize was refused), resolves that node's configured capacity in
  // `config` against the new MemTotal and applies it. Logs every line of
  // the report (info / warning). When a capacity changed (report.resized)
  // the caller restarts reserve refills: growth leaves room for them, and a
  // shrink may have retired ready extents.
  MemoryWatchReport Check(const PoolsConfig& config, const std::vector<Pool*>& pools);

  // For a config reload: resolves `spec` for `pool` against its node's
  // MemTotal read now (the last known one when the read fails) and applies
  // it even when MemTotal did not change. Appends "node1 capacity A -> B"
  // (with the MemTotal change, if any) to `applied`, refusals and read
  // errors to `kept`. True when the capacity changed (the caller restarts
  // reserve refills). Devdax pools: false, nothing done.
  bool ApplyForReload(Pool* pool, const CapacitySpec& spec, std::vector<std::string>* applied,
                      std::vector<std::string>* kept);

  // Node `node`'s MemTotal now. NOT_FOUND / PERMISSION_DENIED / IO from the
  // read; INVALID_ARGUMENT when the file has no parsable MemTotal line.
  Result<uint64_t> ReadMemTotal(int node) const;

  // The MemTotal node `node`'s pool capacity was last resolved against.
  std::optional<uint64_t> applied_total(int node) const;

 private:
  struct NodeState {
    std::optional<uint64_t> applied_total;
    std::optional<uint64_t> refusal_warned;  // the MemTotal whose refusal was logged
    bool unreadable_warned = false;
  };

  const FileSystem* fs_;
  std::map<int, NodeState> nodes_;
};

}  // namespace cxlpool
