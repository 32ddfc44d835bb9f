// Doctor: checks a node for settings that make cxlpool slow, unsafe or
// unable to do its job, and says how to fix each one.
//
// Every check reads through the FileSystem seam (so fake roots test it) plus a
// few facts the caller gathers from the live system or the daemon
// (DoctorInputs). Nothing here changes the machine.
//
// Thread safety: pure function of its inputs.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cxlpool/common/fs.h"
#include "cxlpool/topology/topology.h"

namespace cxlpool {

enum class Severity { kOk, kInfo, kWarning, kError };
const char* SeverityName(Severity s);  // "ok", "info", "warning", "error"

struct Finding {
  std::string check;  // stable id: "thp_shmem", "cxl_movable", ...
  Severity severity = Severity::kOk;
  std::string summary;  // one line
  std::string remedy;   // what to do; empty when severity is ok
};

struct SocketFacts {
  bool exists = false;
  bool is_socket = false;
  mode_t mode = 0;  // permission bits
  uid_t uid = 0;
  gid_t gid = 0;
  std::string group_name;  // of gid, if resolvable
};

struct DoctorInputs {
  std::string socket_path;
  SocketFacts socket;
  std::string expected_socket_group = "cxlpool";
  // The caller's RLIMIT_MEMLOCK soft limit; nullopt = unlimited.
  std::optional<uint64_t> client_memlock_bytes;
  // From the daemon, when it answered.
  bool daemon_reachable = false;
  std::optional<bool> daemon_dumpable;
  std::optional<uint64_t> daemon_memlock_bytes;  // nullopt = unlimited or unknown
  uint64_t pool_capacity_bytes = 0;              // sum over pools
  // Nodes the daemon has a pool on (when it answered).
  std::optional<std::vector<int>> pooled_nodes;
  // The daemon's STATS gauge journal_damaged (and what was skipped): its
  // lease journal was damaged or lost at its last start. nullopt: not said.
  std::optional<bool> daemon_journal_damaged;
  uint64_t daemon_journal_skipped_bytes = 0;
  uint64_t daemon_journal_dropped_tail_bytes = 0;
  // Each memfd pool's warm reserve (when the daemon answered POOLS).
  struct Reserve {
    std::string pool;
    uint64_t capacity_bytes = 0;
    uint64_t ready_bytes = 0;
    uint64_t building_bytes = 0;
    uint64_t low_bytes = 0;
    uint64_t high_bytes = 0;
    // PoolReserve.below_low_ms: how long ready bytes have been below the
    // low watermark (nullopt: not below, or a daemon that does not say).
    std::optional<uint64_t> below_low_ms;
    uint64_t free_bytes = 0;  // the pool's (PoolInfo.free_bytes)
  };
  // A reserve below its low watermark for longer than this is a warning
  // (check "reserve_below_low").
  static constexpr uint64_t kReserveBelowLowWarnMs = 60'000;
  std::optional<std::vector<Reserve>> reserves;
  // The daemon's cluster gauges (STATS cluster_*), when it is a cluster
  // member; nullopt: no [cluster], or the daemon did not answer.
  struct Cluster {
    bool session_live = false;
    bool shared_fenced = false;
    uint64_t slices_quarantined = 0;
    bool insecure_remote = false;  // etcd off loopback without TLS
  };
  std::optional<Cluster> cluster;
};

// Runs every check. `topo` supplies node kinds and zones (DiscoverTopology:
// GPU memory nodes included).
std::vector<Finding> RunDoctor(const FileSystem& fs, const Topology& topo, const DoctorInputs& in);

// Worst severity among findings (kOk when empty).
Severity WorstSeverity(const std::vector<Finding>& findings);

// Gathers SocketFacts for a real path with lstat.
SocketFacts StatSocket(const std::string& path);

}  // namespace cxlpool
