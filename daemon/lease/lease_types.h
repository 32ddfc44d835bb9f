// The lease layer's values: who a caller is (CallerInfo), what an ALLOC asks
// for (AllocParams), and what the lease manager reports of a lease or a pool
// (LeaseSnapshot, Granted and its AllocDone, PoolSnapshot). Nothing here knows protobuf.
//
// Thread safety: plain values.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cxlpool/common/status.h"
#include "lease/quota.h"

namespace cxlpool {

class Pool;

using ConnId = uint64_t;  // the server's ConnectionId

struct CallerInfo {
  pid_t pid = -1;
  uid_t uid = static_cast<uid_t>(-1);
  gid_t gid = static_cast<gid_t>(-1);
  std::vector<gid_t> groups;  // supplementary groups (for shared-lease ACLs)
  std::string comm;
  std::string cgroup;
  bool is_admin = false;
  uint64_t start_time = 0;  // /proc/<pid>/stat field 22 (restart: pid reuse); 0 unknown
};

// The key of a shared name in names_: one namespace per owner uid.
inline std::string NameKey(uid_t owner, const std::string& name) {
  return std::to_string(owner) + "/" + name;
}

// The tenant a caller's leases are charged to (quotas, priority class).
inline Tenant TenantOf(const CallerInfo& c) {
  auto cg = NormalizeCgroupPath(c.cgroup);
  return Tenant{c.uid, c.gid, cg.ok() ? *cg : std::string()};
}

struct AllocParams {
  uint64_t size_bytes = 0;
  std::optional<int> numa_node;
  std::string gpu;
  std::vector<std::string> tiers;
  bool strict = false;
  bool hugetlb = false;
  std::string label;
  std::string name;  // shared name; "" private
  std::vector<uint32_t> acl_uids;
  std::vector<uint32_t> acl_gids;
  std::optional<int> home_node;  // the caller's node (placement without GPU/node)
  bool long_term_pin = false;    // the holder will pin it long-term (lease/placement.h rule 4)
  // The client takes one fd per lease (protocol version 1): never cut into
  // extents.
  bool one_extent = false;
  // Set by Allocate itself when a build on a mixed node could not keep the
  // lease in its kernel zones: those pools are skipped, and why is named.
  std::vector<const Pool*> exclude_pools;
  std::string fell_back_from;
};

struct LeaseSnapshot {
  uint64_t id = 0;
  uint64_t size_bytes = 0;
  uint64_t requested_bytes = 0;
  int numa_node = -1;
  std::string kind;
  std::optional<int> memory_tier;
  std::string label;
  std::string name;
  CallerInfo owner;
  int64_t created_unix = 0;
  uint32_t holders = 0;  // references (connections x attaches)
  std::string backing;
  uint64_t page_size = 0;
  uint64_t device_offset = 0;  // shared-slice: where it starts on the device's fd
  uint32_t extents = 1;        // memfds the lease is made of, mapped back to back
  // A lease of several extents: each one's size, in mapping order (empty
  // for one).
  std::vector<uint64_t> extent_bytes;
  // A lease split between pools (the tiering engine moved some of its
  // extents): each extent's pool and node, parallel to extent_bytes, and
  // how much is where ("3 of 16 extents (6 MiB) on node0, ..."); empty when
  // every extent is on `pool`.
  std::vector<std::string> extent_pools;
  std::vector<int> extent_nodes;
  std::string spread;
  bool from_warm_stock = false;  // every extent came from the warm reserve
  std::string placement_reason;
  std::string pool;
  bool long_term_pin = false;
  // Set once the lease's pages were found off the node it was placed on
  // (CheckMoved): where it was placed, and what the daemon saw. numa_node,
  // kind and pool are then where the pages are now.
  std::optional<int> placed_numa_node;
  std::string moved_reason;
  // A move between pools under way or left unfinished (tiering): where to
  // and of what ("to node0: interrupted by a daemon restart; extent 3 ..."); "" none.
  std::string migration;
};

// One extent of a granted lease: its fd (borrowed) and its size and page
// size; it is mapped at the sum of the sizes of the extents before it.
struct GrantedExtent {
  int fd = -1;
  uint64_t size_bytes = 0;
  uint64_t page_size = 0;
};

// A granted (or attached) lease and its extents' fds, borrowed: valid until
// the lease ends; send them before returning to the loop. One extent for a
// lease built whole and for devdax; several, in mapping order, otherwise.
struct Granted {
  LeaseSnapshot lease;
  std::vector<GrantedExtent> extents;
  // The fd of a one-extent lease; -1 for a lease of several.
  int fd() const { return extents.size() == 1 ? extents.front().fd : -1; }
};
// Called exactly once with an allocation's outcome.
using AllocDone = std::function<void(Result<Granted>)>;

struct PoolSnapshot {
  std::string name;
  int numa_node = -1;
  std::string kind;
  std::optional<int> memory_tier;
  uint64_t capacity_bytes = 0;
  uint64_t leased_bytes = 0;
  uint64_t free_bytes = 0;
  uint64_t page_size = 0;
  std::string backing;
  bool dynamic_region = false;
  uint32_t lease_count = 0;
  uint64_t reclaiming_bytes = 0;  // ended leases still being reclaimed (not free yet)
  // The warm reserve of extents (memfd pools; pool/extent_reserve.h): ready
  // to grant, being built, being retired (all of it used, not free), and
  // its watermarks.
  uint64_t reserve_ready_bytes = 0;
  uint64_t reserve_building_bytes = 0;
  uint64_t reserve_retiring_bytes = 0;
  uint64_t reserve_low_bytes = 0;
  uint64_t reserve_high_bytes = 0;
  // Set while ready bytes are below the low watermark: for how long.
  std::optional<uint64_t> reserve_below_low_ms;
  uint64_t reserve_bytes() const {
    return reserve_ready_bytes + reserve_building_bytes + reserve_retiring_bytes;
  }
  // The node's zones (memfd pools, when the topology knows them) and what a
  // long-term pin does there ("yes", "partly", "no"; "" unknown).
  std::optional<uint64_t> kernel_zone_bytes;
  std::optional<uint64_t> movable_bytes;
  std::string long_term_pins;
  std::string long_term_pin_policy;  // "auto", "allow", "refuse"
};

}  // namespace cxlpool
