// Private pieces of the memory side of topology discovery (DiscoverMemory):
// strict sysfs/procfs value parsers and the per-subsystem discovery passes
// (NUMA nodes, memory tiers, DAX, CXL, node kinds). Exposed here so unit
// tests can drive each pass and parser on its own with a FakeFileSystem.
//
// Every pass reads only through the FileSystem seam, never aborts on bad
// input, and reports missing or garbled facts as lines in Topology::warnings.
// Where each fact comes from is written down in docs/topology-kinds.md.
//
// Thread safety: pure functions over their arguments; no shared state.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cxlpool/common/fs.h"
#include "cxlpool/common/status.h"
#include "cxlpool/common/strings.h"
#include "cxlpool/topology/topology.h"

namespace cxlpool::memory_internal {

inline constexpr char kNodeDir[] = "/sys/devices/system/node";
inline constexpr char kMemoryTieringDir[] = "/sys/devices/virtual/memory_tiering";
inline constexpr char kDaxDevicesDir[] = "/sys/bus/dax/devices";
inline constexpr char kCxlDevicesDir[] = "/sys/bus/cxl/devices";
inline constexpr char kNdDevicesDir[] = "/sys/bus/nd/devices";
inline constexpr char kZoneinfoPath[] = "/proc/zoneinfo";
inline constexpr char kMemoryDir[] = "/sys/devices/system/memory";
inline constexpr char kMeminfoPath[] = "/proc/meminfo";
inline constexpr char kCpuinfoPath[] = "/proc/cpuinfo";

// ---- parsers (strict: trailing garbage is an error) -----------------------

// A sysfs integer: decimal, or 0x-prefixed hex ("0x40000000"). INVALID_ARGUMENT
// on anything else (empty, junk, negative).
Result<uint64_t> ParseSysfsU64(std::string_view text);

// A node id as sysfs prints it: "2", or "-1" (NUMA_NO_NODE) -> nullopt.
// INVALID_ARGUMENT on junk or ids beyond 1<<20.
Result<std::optional<int>> ParseNodeId(std::string_view text);

// "nodeN" / "memoryN" / "regionN": the number after `prefix`, nullopt when
// the name is not exactly prefix + decimal digits.
std::optional<int> NumberedName(std::string_view name, std::string_view prefix);

// One SLIT row ("10 21 21") from nodeN/distance. The i-th value belongs to
// the i-th online node (the kernel prints one per online node, in order), so
// `online` must list the online node ids ascending. INVALID_ARGUMENT on a
// junk value, a value over 255, or a count that differs from online.size().
Result<std::map<int, int>> ParseDistanceRow(std::string_view text, const std::vector<int>& online);

// Linux cpumask ("00000000,0000ff0f") as in nodeN/cpumap: comma-separated
// 32-bit hex words, most significant first. INVALID_ARGUMENT on junk.
Result<std::vector<int>> ParseCpuMask(std::string_view text);

// /proc/zoneinfo -> node id -> zone name -> managed pages ("present" when a
// kernel prints no "managed" line). Zones with no pages are kept (as 0).
// INVALID_ARGUMENT if no "Node N, zone NAME" header parses at all.
Result<std::map<int, std::map<std::string, uint64_t>>> ParseZoneinfo(std::string_view text);

// /proc/cpuinfo -> the CPU numbers of its "processor : N" lines, ascending
// (x86, ARM, POWER and most others print one per online CPU). INVALID_ARGUMENT
// when a processor line has no number, or there is none at all.
Result<std::vector<int>> ParseCpuinfoProcessors(std::string_view text);

// The zone holding the most (blocks or pages); zones with 0 are ignored;
// ties go to the name that sorts first. nullopt when all are 0 / empty.
std::optional<std::string> DominantZone(const std::map<std::string, uint64_t>& counts);

// Orders device names the way people count: "mem2" < "mem10",
// "dax0.1" < "dax0.10". Runs of digits compare as numbers.
bool NaturalLess(const std::string& a, const std::string& b);

// A short, printable rendering of untrusted file contents for a warning:
// non-printable bytes become \xNN, long text is cut with "...".
std::string Printable(std::string_view text, size_t max_len = 40);

// Reads sysfs attributes for the passes and turns every problem into one
// warning line "<path>: <what went wrong>" in topo->warnings.
class SysfsReader {
 public:
  SysfsReader(const FileSystem& fs, Topology* topo) : fs_(fs), topo_(topo) {}
  const FileSystem& fs() const { return fs_; }
  void Warn(std::string line);

  // Contents trimmed as a sysfs value (TrimSysfsValue: trailing NUL
  // padding goes with the whitespace). A missing file is nullopt, with a warning only when
  // `required`; any other read error is nullopt with a warning.
  std::optional<std::string> Read(const std::string& path, bool required);
  // Read + ParseSysfsU64; garbage is nullopt with a warning.
  std::optional<uint64_t> ReadU64(const std::string& path, bool required);
  // Read + ParseNodeId; "-1" is nullopt silently, garbage with a warning.
  std::optional<int> ReadNodeId(const std::string& path, bool required);
  // Read + ParseCpuList (also node lists); garbage is nullopt with a warning.
  std::optional<std::vector<int>> ReadList(const std::string& path, bool required,
                                           int max_id = kMaxCpuListId);

 private:
  const FileSystem& fs_;
  Topology* topo_;
};

// Parent directory of a machine path ("/a/b/c" -> "/a/b").
std::string DirName(std::string_view path);

// ---- discovery passes ------------------------------------------------------

// NUMA nodes: ids (nodeN/ + online), cpus (cpulist, else cpumap), meminfo
// (MemTotal/MemFree), SLIT row, HMAT access0/access1, hugepages 2M/1G and the
// zone of the node's online memory (memory blocks, else /proc/zoneinfo),
// with its bytes in kernel zones and in ZONE_MOVABLE. Without /sys/devices/system/node
// (CONFIG_NUMA=n) one node 0 (sole_node_assumed) is built with every online CPU
// (/sys/devices/system/cpu/online, else the cpuN directories, else /proc/cpuinfo)
// and /proc/meminfo, with a warning.
void DiscoverNumaNodes(const FileSystem& fs, Topology* topo);

// memory_tiering/memory_tierN/nodelist -> topo->memory_tiers and each node's
// memory_tier. An absent memory_tiering directory (kernel < 6.1) is silent.
void DiscoverMemoryTiers(const FileSystem& fs, Topology* topo);

// A DAX device plus where it lives in the device tree (canonical path), which
// the CXL pass uses to find the devices under each region.
struct DaxFound {
  DaxDevice dev;
  std::string canonical;
};

// /sys/bus/dax/devices: name, size, target_node, mode (bound driver: kmem ->
// system-ram, device_dax -> devdax), source (cxl/hmem/nvdimm from the
// canonical path), owning dax region, align, and whether the region is
// dynamic (its dax_region/create attribute exists). Appends to
// topo->dax_devices and returns the same devices with their canonical paths.
std::vector<DaxFound> DiscoverDax(const FileSystem& fs, Topology* topo);

// /sys/bus/cxl/devices: memdevs (memN) and regions (regionN) with member
// memdevs (targetN -> endpoint decoder -> endpoint -> uport memdev), DAX
// devices (under the region, or for pmem regions under the nvdimm region
// with the same physical range) and resulting NUMA nodes (target nodes of
// member DAX devices in system-ram mode). Absent /sys/bus/cxl is silent.
void DiscoverCxl(const FileSystem& fs, const std::vector<DaxFound>& dax, Topology* topo);

// Sets kind and kind_reason of every node from what backs it; rules in
// docs/topology-kinds.md. Needs nodes, DAX devices and CXL regions filled.
void ClassifyNodes(Topology* topo);

// The read bandwidth (MB/s) HMAT reports for a node: access1 (CPU
// initiators) when present, else access0. nullopt when neither has it.
std::optional<uint64_t> HmatReadBandwidth(const NumaNode& node);

}  // namespace cxlpool::memory_internal
