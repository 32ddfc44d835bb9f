// Private pieces of GPU discovery (gpu_discovery.cc), exposed for the unit
// tests in tests/topology. DiscoverGpus() in cxlpool/topology/discover.h is the
// public entry point; nothing else should call these.
//
// Thread safety: reentrant functions; they share no state.
#pragma once

#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "cxlpool/common/fs.h"
#include "cxlpool/topology/discover.h"
#include "cxlpool/topology/topology.h"
#include "nvml_loader.h"

namespace cxlpool {

// Which NVML library DiscoverGpus would load: options.nvml_library, else
// $CXLPOOL_NVML_LIBRARY, else "libnvidia-ml.so.1" when fs.IsThisSystem().
// nullopt: none (foreign root without an explicit library, or !use_nvml).
struct NvmlChoice {
  std::string path;
  bool is_explicit = false;  // named by the options or the environment
};
std::optional<NvmlChoice> ChooseNvmlLibrary(const FileSystem& fs, const DiscoverOptions& options);

// NVIDIA (vendor 0x10de) display-class (0x03xxxx) PCI functions under
// /sys/bus/pci/devices, indexed in bus order. Problems go to *warnings.
// `driver_bus_ids`: functions the NVIDIA driver has bound (its procfs lists
// them); such a function is a GPU even when its class attribute is missing.
std::vector<Gpu> ScanPciGpus(const FileSystem& fs, std::vector<std::string>* warnings,
                             const std::set<std::string>& driver_bus_ids = {});

// One GPU the NVIDIA driver lists under /proc/driver/nvidia/gpus/<bus id>.
struct DriverGpu {
  std::string pci_bus_id;  // normalised, lower case
  // From numa_status: the NUMA node that is this GPU's memory (coherent
  // systems: Grace Hopper, NVLink-attached POWER9), nullopt for "Node: -1"
  // or when the file is missing or garbled.
  std::optional<int> memory_node;
  std::string numa_status;  // "online", "offline", ...; "" when not given
  std::string path;         // the numa_status file, for messages
};

// What numa_status says: "Node:      2\nStatus:    online\n..." (the
// driver's nv-procfs.c). INVALID_ARGUMENT when there is no "Node:" line, its
// value is not an integer in -1..1<<20, or it appears twice.
struct NumaStatus {
  std::optional<int> node;  // nullopt: -1 (no NUMA memory)
  std::string status;
};
Result<NumaStatus> ParseNumaStatus(std::string_view text);

// Reads /proc/driver/nvidia/gpus through the seam. A missing directory (no
// driver, or not captured) is silent; a truncated or garbled numa_status is
// a warning and that GPU's memory node stays unknown.
std::vector<DriverGpu> ScanDriverGpus(const FileSystem& fs, std::vector<std::string>* warnings);

// Links the driver's memory nodes to the GPUs (by bus id): a GPU without a
// memory node takes the driver's (memory_node_source "driver"); a GPU whose
// NVML node differs keeps NVML's, with a warning. A node that sysfs lacks,
// or that has CPUs, is never taken (warning). A driver GPU missing from
// topo->gpus still marks its node (MarkGpuMemoryNodes).
void ApplyDriverMemoryNodes(const std::vector<DriverGpu>& driver, Topology* topo);

// The sysfs numa_node of a PCI function ("0000:17:00.0"); nullopt when the
// file is missing, garbled (warning) or -1.
std::optional<int> PciNumaNode(const FileSystem& fs, const std::string& bus_id,
                               std::vector<std::string>* warnings);

// Every GPU NVML reports. `topo` supplies the CPU lists used to turn a CPU
// affinity mask into a node. Error only when the device count is unknown.
Result<std::vector<Gpu>> ScanNvmlGpus(const NvmlLibrary& nvml, const FileSystem& fs,
                                      const Topology& topo, std::vector<std::string>* warnings);

// Marks each GPU's memory_node, and each node the driver names for a GPU
// topo->gpus lacks, as kind gpu (with a kind_reason naming the source).
void MarkGpuMemoryNodes(Topology* topo, const std::vector<DriverGpu>& driver = {});

}  // namespace cxlpool
