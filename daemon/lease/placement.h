// Placement: which pools may serve an allocation, best first, and why.
//
// The rule (docs/daemon.md, "Placement"):
//  1. A NUMA node named in the request: that node's pools first (memfd, then
//     devdax), then the other memfd pools by SLIT distance from it.
//     A GPU named (index, uuid or PCI bus id): the nodes of the topology's
//     gpu_memory_preference for it, in order, then the other memfd pools by
//     distance from the GPU's CPU-side node. Naming both is INVALID_ARGUMENT.
//     Neither: the memfd pools by SLIT distance from the caller's home node
//     (the node of the CPU it last ran on), ties by node id.
//  2. A tier preference list ("dram", "cxl", "hbm", "nvm", "devdax") reorders
//     the candidates by tier, stable; unlisted tiers go last. "devdax"
//     matches devdax pools, which otherwise only serve requests that name
//     their node.
//  3. Strict: only the single best candidate (of the listed tiers) is
//     acceptable; the allocation fails rather than falls back.
//  4. A lease that will be pinned long-term (CUDA registration, RDMA,
//     io_uring fixed buffers) is never placed where the pin would move its
//     pages off the node: a pool whose node has only ZONE_MOVABLE memory
//     (LongTermPins kNo) is skipped, or refused (UNSUPPORTED, naming the
//     node, the zone and the remedy) when it is the strict choice. A node
//     with both kinds (kPartly) is a candidate whose build must first move
//     the pages into its kernel zones (Candidate::settle). The node's
//     [pools.node.N] long_term_pins overrides: "allow" places such leases
//     anyway (the pin will move them; the client's check reports it),
//     "refuse" never. devdax memory does not migrate.
// Admission then walks the candidates in order; the first with room wins.
//
// Thread safety: pure functions over their arguments.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "cxlpool/common/status.h"
#include "cxlpool/topology/topology.h"
#include "pool/pool.h"

namespace cxlpool {

struct PlacementRequest {
  std::optional<int> numa_node;
  std::string gpu;                 // "" none
  std::vector<std::string> tiers;  // preference order
  bool strict = false;
  std::optional<int> home_node;  // the caller's node, if known
  bool long_term_pin = false;    // the holder will pin it long-term (rule 4)
  // Pools not to consider (a build there already failed for this request).
  std::vector<const Pool*> exclude;
};

struct Candidate {
  Pool* pool = nullptr;
  std::string reason;  // why this pool is where it is in the order
  // Long-term pin on a node with both kernel and movable zones: the build
  // moves the pages into the kernel zones and checks they stayed on the
  // node before the grant (lease/longterm_pin.h).
  bool settle = false;
};

// Errors: NOT_FOUND (no such GPU or node), INVALID_ARGUMENT (unknown tier
// name, GPU and node both named), UNSUPPORTED (a named node that exists but
// has no pool: why, and the [pools.node.N] key that pools it where one does;
// a long-term pin where the only acceptable pool cannot hold one).
Result<std::vector<Candidate>> PlanPlacement(const Topology& topo, const std::vector<Pool*>& pools,
                                             const PlacementRequest& req);

// The NUMA node of `cpu` in the topology, or nullopt.
std::optional<int> NodeOfCpu(const Topology& topo, int cpu);
// The only NUMA node with CPUs, or nullopt when there are none or several.
std::optional<int> OnlyCpuNode(const Topology& topo);

// Why `pool` cannot hold a long-term pinned lease (rule 4), or nullopt
// when it can. One sentence naming the node, its zones and the remedy.
std::optional<std::string> LongTermPinRefusal(const Topology& topo, const Pool* pool);

// Reads the CPU a process last ran on (/proc/<pid>/stat field 39) through
// `proc` (a FileSystem rooted at "/").
std::optional<int> LastCpuOf(const FileSystem& proc, pid_t pid);

}  // namespace cxlpool
