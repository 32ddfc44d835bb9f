// The topology model: what a node's memory, DAX/CXL devices and GPUs look
// like, as discovered from sysfs (through a FileSystem seam) and NVML.
//
// Absent facts are std::nullopt and serialise as JSON null, never omitted.
// This struct is a value: build it once (Discover), then read it from any
// thread.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace cxlpool {

enum class NodeKind { kDram, kCxl, kHbm, kNvm, kGpu, kUnknown };
const char* NodeKindName(NodeKind k);  // "dram", "cxl", "hbm", "nvm", "gpu", "unknown"
bool ParseNodeKind(const std::string& s, NodeKind* out);

// One HMAT access class (access0: any initiator, access1: CPU initiators).
struct AccessClass {
  int access_class = 0;
  std::vector<int> initiators;
  std::optional<uint64_t> read_bandwidth_mbps;
  std::optional<uint64_t> write_bandwidth_mbps;
  std::optional<uint64_t> read_latency_ns;
  std::optional<uint64_t> write_latency_ns;
};

// Whether a node can hold long-term pins. A long-term pin (FOLL_LONGTERM:
// cuMemHostRegister, RDMA memory registration, io_uring fixed buffers) first
// migrates every page it pins out of ZONE_MOVABLE, to a kernel zone of the
// page's own node when that has room, else of another node.
//   kYes     all of the node's online memory is in kernel zones: pins stay.
//   kPartly  both: pinned pages stay on the node only while its kernel zones
//            have room for them.
//   kNo      ZONE_MOVABLE only: a pin moves every page to another node.
//   kUnknown no zone facts (or no memory).
enum class LongTermPins { kUnknown, kYes, kPartly, kNo };
// "yes", "partly", "no"; nullptr for kUnknown (JSON null).
const char* LongTermPinsName(LongTermPins p);

struct NumaNode {
  int id = -1;
  std::vector<int> cpus;
  std::optional<uint64_t> memory_bytes;  // node meminfo MemTotal
  std::optional<uint64_t> free_bytes;    // node meminfo MemFree (at discovery)
  NodeKind kind = NodeKind::kUnknown;
  std::string kind_reason;  // human text: why this kind
  // CPU-less, and nothing found behind its memory (no CXL region, hmem,
  // nvdimm or GPU): kind unknown for want of any backing, not of a tier.
  bool backing_unidentified = false;
  // No /sys/devices/system/node (a kernel without CONFIG_NUMA): this is the
  // one node 0 assumed to hold every CPU and all of /proc/meminfo, so DRAM.
  bool sole_node_assumed = false;
  std::map<int, int> distances;     // SLIT row: node id -> distance
  std::optional<int> memory_tier;   // memory_tiering tier id
  std::optional<std::string> zone;  // "Normal", "Movable", ... (system-ram)
  // Online memory by zone: in kernel zones (DMA, DMA32, Normal) and in
  // ZONE_MOVABLE, from the memory blocks (count x block size) or, failing
  // them, /proc/zoneinfo (managed pages). nullopt when neither tells.
  std::optional<uint64_t> kernel_zone_bytes;
  std::optional<uint64_t> movable_bytes;
  std::vector<AccessClass> access;
  std::optional<uint64_t> hugepages_2m_total;
  std::optional<uint64_t> hugepages_2m_free;
  std::optional<uint64_t> hugepages_1g_total;
  std::optional<uint64_t> hugepages_1g_free;
};

struct DaxDevice {
  std::string name;  // "dax0.0"
  std::optional<uint64_t> size_bytes;
  std::optional<int> target_node;
  std::optional<std::string> mode;    // "devdax" or "system-ram"
  std::optional<std::string> source;  // "cxl", "hmem", "nvdimm"
  std::optional<std::string> region;  // owning dax region, e.g. "dax_region0"
  std::optional<bool> dynamic;        // region can be sub-divided (hmem, CXL RAM)
  std::optional<uint64_t> align_bytes;
};

struct CxlMemdev {
  std::string name;  // "mem0"
  std::optional<uint64_t> serial;
  std::optional<uint64_t> ram_bytes;
  std::optional<uint64_t> pmem_bytes;
  std::optional<int> numa_node;
};

struct CxlRegion {
  std::string name;  // "region0"
  std::optional<uint64_t> size_bytes;
  std::optional<std::string> type;  // "ram" or "pmem"
  std::vector<std::string> memdevs;
  std::vector<std::string> dax_devices;
  std::vector<int> numa_nodes;
};

struct NvLink {
  int link = 0;
  bool active = false;
  std::optional<std::string> remote_pci_bus_id;  // "dddd:bb:dd.f"
  std::optional<std::string> remote_type;        // "gpu", "switch", "cpu"
};

struct Gpu {
  int index = 0;
  std::optional<std::string> uuid;
  std::optional<std::string> name;
  std::string pci_bus_id;  // lower-case "dddd:bb:dd.f"
  std::optional<uint64_t> memory_bytes;
  std::optional<int> numa_node;    // CPU-side affinity node
  std::optional<int> memory_node;  // NUMA node holding its HBM (Grace Hopper)
  // Who said memory_node: "nvml" (nvmlDeviceGetNumaNodeId) or "driver"
  // (/proc/driver/nvidia/gpus/<bus id>/numa_status); "" when unset.
  std::string memory_node_source;
  std::vector<NvLink> nvlinks;
  // False when NVLink state is unknown (PCI scan, or NVML lacks the NVLink
  // entry points): JSON "nvlinks" is then null instead of [].
  bool nvlinks_known = false;
  std::string source;  // "nvml", "pci" or "driver" (listed only by the driver's procfs)
};

// From the zone facts: see LongTermPins.
LongTermPins LongTermPinsOf(const NumaNode& node);

// Why the daemon does not pool `node` unless its config says so, or
// nullopt when it pools it by default: GPU memory (never pooled), no
// memory, or a CPU-less node whose backing could not be identified (kind
// unknown; `[pools.node.N] enabled = true` pools it). One sentence.
std::optional<std::string> NotPooledReason(const NumaNode& node);

struct MemoryTier {
  int id = 0;
  std::vector<int> nodes;
};

struct Topology {
  static constexpr int kSchemaVersion = 1;
  std::vector<NumaNode> numa_nodes;
  std::vector<DaxDevice> dax_devices;
  std::vector<CxlMemdev> cxl_memdevs;
  std::vector<CxlRegion> cxl_regions;
  std::vector<Gpu> gpus;
  std::vector<MemoryTier> memory_tiers;
  // gpu index -> memory node ids, best first (see docs/topology-json.md).
  std::map<int, std::vector<int>> gpu_memory_preference;
  // Things that were missing or garbled; discovery went on without them.
  std::vector<std::string> warnings;

  const NumaNode* FindNode(int id) const;
  const Gpu* FindGpu(int index) const;
  // Finds a GPU by index ("0"), uuid ("GPU-...") or PCI bus id (any case,
  // with or without the 4-digit domain).
  const Gpu* FindGpuByName(const std::string& name) const;
  // How to online node `id`'s memory in a kernel zone so long-term pins stay
  // on it: the daxctl commands for the DAX devices onlined into it as system
  // RAM, else the memory-block sysfs write. One sentence, for refusals and
  // `cxlpoolctl doctor`.
  std::string KernelZoneRemedy(int id) const;
};

// Why nothing in `topo` can be pooled for want of facts: no NUMA node has a
// known memory size (its meminfo, or /proc/meminfo on a kernel without NUMA,
// is missing or has no MemTotal). nullopt when some node's size is known.
// One sentence, for the daemon's refusal to start with nothing to pool.
std::optional<std::string> NoMemorySizeKnown(const Topology& topo);

}  // namespace cxlpool
