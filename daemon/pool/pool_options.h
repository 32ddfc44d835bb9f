// What the pool library is built from: the settings of the node pools and
// the devdax pools ([pools], [pools.node.N], [[devdax]] of the daemon's
// configuration, which config/ reads into these structs).
//
// Thread safety: values.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace cxlpool {

// A capacity written as bytes ("64G", 1073741824) or percent ("90%").
struct CapacitySpec {
  bool is_percent = true;
  double percent = 90.0;  // when is_percent, in (0, 100]
  uint64_t bytes = 0;     // when !is_percent

  // The capacity on a node with `node_bytes` of memory: never more than the
  // node has.
  uint64_t Resolve(uint64_t node_bytes) const {
    if (!is_percent) return std::min(bytes, node_bytes);
    double b = std::floor(static_cast<double>(node_bytes) * percent / 100.0);
    uint64_t v = b <= 0 ? 0 : static_cast<uint64_t>(b);
    return std::min(v, node_bytes);
  }
  std::string ToString() const {
    if (!is_percent) return std::to_string(bytes);
    std::ostringstream os;
    os << percent << "%";
    return os.str();
  }
};

// Leases that will be long-term pinned (CUDA registration, RDMA, io_uring
// fixed buffers) on a node: kAuto decides from the node's zones (never
// where a pin would move the pages off the node); kAllow places them even
// on ZONE_MOVABLE memory (an admin override: the pin then migrates them,
// and the client's check reports where to); kRefuse never places them.
enum class LongTermPinPolicy { kAuto, kAllow, kRefuse };

// "auto", "allow", "refuse".
inline const char* LongTermPinPolicyName(LongTermPinPolicy p) {
  switch (p) {
    case LongTermPinPolicy::kAuto:
      return "auto";
    case LongTermPinPolicy::kAllow:
      return "allow";
    case LongTermPinPolicy::kRefuse:
      return "refuse";
  }
  return "auto";
}

// Settings of a NUMA-node pool. Per-node overrides start from the defaults.
struct PoolConfig {
  bool enabled = true;
  // `enabled` was written in this node's own table. A node of unknown kind
  // is pooled only then (NotPooledReason in topology.h).
  bool enabled_explicitly = false;
  LongTermPinPolicy long_term_pins = LongTermPinPolicy::kAuto;
  CapacitySpec capacity;
  bool pin = true;
  bool thp = true;
  bool hugetlb = false;
  // The warm reserve of extents (pool/extent_reserve.h): refilled in the
  // background when ready + building falls to `reserve_low`, up to
  // `reserve_high`; bytes or percent of the pool's capacity. Default 0: none.
  CapacitySpec reserve_low{false, 0, 0};
  CapacitySpec reserve_high{false, 0, 0};
};

// A devdax pool on a DAX region ("dax_region0") or a static device ("dax0.0").
struct DevdaxPoolConfig {
  std::string region;
  std::optional<uint64_t> align;  // sub-device alignment; default: the region's
};

// Every pool's settings: what BuildPools and NodeMemoryWatch read.
struct PoolsConfig {
  PoolConfig pool_defaults;
  std::map<int, PoolConfig> node_pools;  // node id -> effective settings
  std::vector<DevdaxPoolConfig> devdax;

  // The effective settings of node `id`'s pool.
  const PoolConfig& ForNode(int id) const {
    auto it = node_pools.find(id);
    return it == node_pools.end() ? pool_defaults : it->second;
  }
};

}  // namespace cxlpool
