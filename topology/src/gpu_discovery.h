// Private pieces of GPU discovery (gpu_discovery.cc), exposed for the unit
// tests in tests/gpu. DiscoverGpus() in cxlpool/topology/discover.h is the
// public entry point; nothing else should call these.
//
// Thread safety: reentrant functions; they share no state.
#pragma once

#include <optional>
#include <string>
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
std::vector<Gpu> ScanPciGpus(const FileSystem& fs, std::vector<std::string>* warnings);

// The sysfs numa_node of a PCI function ("0000:17:00.0"); nullopt when the
// file is missing, garbled (warning) or -1.
std::optional<int> PciNumaNode(const FileSystem& fs, const std::string& bus_id,
                               std::vector<std::string>* warnings);

// Every GPU NVML reports. `topo` supplies the CPU lists used to turn a CPU
// affinity mask into a node. Error only when the device count is unknown.
Result<std::vector<Gpu>> ScanNvmlGpus(const NvmlLibrary& nvml, const FileSystem& fs,
                                      const Topology& topo, std::vector<std::string>* warnings);

// Marks each GPU's memory_node as kind gpu (with a kind_reason).
void MarkGpuMemoryNodes(Topology* topo);

}  // namespace cxlpool
