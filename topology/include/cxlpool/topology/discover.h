// Topology discovery: reads sysfs/procfs through a FileSystem seam, and GPUs
// through NVML (dlopen) or, failing that, a PCI scan of the same tree.
//
// Nothing here throws or aborts on bad input: missing, empty or garbled files
// add a line to Topology::warnings and discovery carries on with what it has.
//
// Foreign roots: when fs.IsThisSystem() is false, the real NVML is never
// loaded (it would describe this machine, not the tree); only a library named
// explicitly (options.nvml_library or $CXLPOOL_NVML_LIBRARY) is used.
//
// Thread safety: functions are reentrant; they share no state.
#pragma once

#include <string>

#include "cxlpool/common/fs.h"
#include "cxlpool/topology/topology.h"

namespace cxlpool {

struct DiscoverOptions {
  // Try NVML at all. False: PCI scan only.
  bool use_nvml = true;
  // NVML library to dlopen; empty: $CXLPOOL_NVML_LIBRARY, else
  // "libnvidia-ml.so.1" (the latter only on this system's root).
  std::string nvml_library;
};

// Everything: memory, DAX, CXL, tiers, GPUs, and the GPU x node preference.
Topology DiscoverTopology(const FileSystem& fs, const DiscoverOptions& options = {});

// Memory side only: NUMA nodes (cpus, meminfo, distances, tier, zone, HMAT,
// hugepages, kind), DAX devices, CXL memdevs/regions and memory tiers.
void DiscoverMemory(const FileSystem& fs, Topology* topo);

// GPUs: NVML when loadable (see above), else sysfs PCI scan (vendor 0x10de,
// display class). Also marks GPU-memory NUMA nodes (kind gpu).
void DiscoverGpus(const FileSystem& fs, const DiscoverOptions& options, Topology* topo);

// Fills topo->gpu_memory_preference; rule in docs/topology-json.md.
void ComputeGpuMemoryPreference(Topology* topo);

}  // namespace cxlpool
