// DiscoverMemory: NUMA nodes, memory tiers, DAX, CXL and node kinds, read
// through the FileSystem seam. Sources of each fact: docs/topology-kinds.md.
#include <algorithm>
#include <set>

#include "cxlpool/common/strings.h"
#include "cxlpool/topology/discover.h"
#include "memory_internal.h"

namespace cxlpool {
namespace memory_internal {
namespace {

std::string NodePath(int id) { return JoinPath(kNodeDir, "node" + std::to_string(id)); }

// The ids of the nodeN directories, ascending.
std::optional<std::vector<int>> ListNodeDirs(SysfsReader& rd) {
  auto names = rd.fs().ListDir(kNodeDir);
  if (!names.ok()) {
    if (names.status().code() != Code::kNotFound) {
      rd.Warn(std::string(kNodeDir) + ": " + names.status().ToString());
    }
    return std::nullopt;
  }
  std::vector<int> ids;
  for (const auto& n : names.value()) {
    if (auto id = NumberedName(n, "node")) ids.push_back(*id);
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

void ReadCpus(SysfsReader& rd, const std::string& dir, NumaNode* node) {
  auto cpus = rd.ReadList(JoinPath(dir, "cpulist"), /*required=*/true);
  if (cpus) {
    node->cpus = *cpus;
    return;
  }
  // cpumap carries the same set as a hex mask (hwloc reads this one).
  std::string map_path = JoinPath(dir, "cpumap");
  auto text = rd.Read(map_path, /*required=*/false);
  if (!text) return;
  auto mask = ParseCpuMask(*text);
  if (!mask.ok()) {
    rd.Warn(map_path + ": " + mask.status().message());
    return;
  }
  node->cpus = mask.value();
  rd.Warn(dir + ": cpus taken from cpumap because cpulist was unusable");
}

void ReadMeminfo(SysfsReader& rd, const std::string& dir, NumaNode* node) {
  std::string path = JoinPath(dir, "meminfo");
  auto text = rd.Read(path, /*required=*/true);
  if (!text) return;
  auto info = ParseMeminfo(*text);
  auto total = info.find("MemTotal");
  auto free = info.find("MemFree");
  if (total == info.end()) {
    rd.Warn(path + ": no parsable MemTotal line ('" + Printable(*text) + "')");
  } else {
    node->memory_bytes = total->second;
  }
  if (free == info.end()) {
    if (total != info.end()) rd.Warn(path + ": no parsable MemFree line");
  } else {
    node->free_bytes = free->second;
  }
}

void ReadDistances(SysfsReader& rd, const std::string& dir, const std::vector<int>& online,
                   NumaNode* node) {
  std::string path = JoinPath(dir, "distance");
  auto text = rd.Read(path, /*required=*/true);
  if (!text) return;
  auto row = ParseDistanceRow(*text, online);
  if (!row.ok()) {
    rd.Warn(path + ": " + row.status().message());
    return;
  }
  node->distances = std::move(row).value();
}

void ReadHugepages(SysfsReader& rd, const std::string& dir, NumaNode* node) {
  struct Size {
    const char* name;
    std::optional<uint64_t>* total;
    std::optional<uint64_t>* free;
  };
  for (const Size& s :
       {Size{"hugepages-2048kB", &node->hugepages_2m_total, &node->hugepages_2m_free},
        Size{"hugepages-1048576kB", &node->hugepages_1g_total, &node->hugepages_1g_free}}) {
    std::string hp = JoinPath(JoinPath(dir, "hugepages"), s.name);
    if (!rd.fs().IsDir(hp)) continue;  // size not supported by this kernel/arch
    *s.total = rd.ReadU64(JoinPath(hp, "nr_hugepages"), /*required=*/true);
    *s.free = rd.ReadU64(JoinPath(hp, "free_hugepages"), /*required=*/true);
  }
}

void ReadAccessClasses(SysfsReader& rd, const std::string& dir, NumaNode* node) {
  for (int k = 0; k <= 1; ++k) {
    std::string access = JoinPath(dir, "access" + std::to_string(k));
    if (!rd.fs().IsDir(access)) continue;
    std::string init = JoinPath(access, "initiators");
    AccessClass ac;
    ac.access_class = k;
    auto names = rd.fs().ListDir(init);
    if (!names.ok()) {
      rd.Warn(init + ": " + names.status().ToString());
    } else {
      for (const auto& n : names.value()) {
        auto id = NumberedName(n, "node");
        if (!id) continue;
        if (!rd.fs().IsDir(JoinPath(init, n))) {
          rd.Warn(JoinPath(init, n) + ": dangling initiator link; ignored");
          continue;
        }
        ac.initiators.push_back(*id);
      }
      std::sort(ac.initiators.begin(), ac.initiators.end());
    }
    ac.read_bandwidth_mbps = rd.ReadU64(JoinPath(init, "read_bandwidth"), false);
    ac.write_bandwidth_mbps = rd.ReadU64(JoinPath(init, "write_bandwidth"), false);
    ac.read_latency_ns = rd.ReadU64(JoinPath(init, "read_latency"), false);
    ac.write_latency_ns = rd.ReadU64(JoinPath(init, "write_latency"), false);
    node->access.push_back(std::move(ac));
  }
}

// Zones from the node's memory blocks: nodeN/memoryM -> memory block; for
// an online block, valid_zones names the zone it was onlined to ("none" when
// it straddles zones; kept as "none"). Returns block counts per zone;
// `unreadable` counts blocks whose state or valid_zones could not be read.
std::map<std::string, uint64_t> ZonesFromBlocks(const FileSystem& fs, const std::string& dir,
                                                size_t* blocks, size_t* unreadable) {
  std::map<std::string, uint64_t> zones;
  *blocks = 0;
  *unreadable = 0;
  auto names = fs.ListDir(dir);
  if (!names.ok()) return zones;
  for (const auto& n : names.value()) {
    if (!NumberedName(n, "memory")) continue;
    ++*blocks;
    auto canon = fs.Canonical(JoinPath(dir, n));
    if (!canon.ok()) {
      ++*unreadable;
      continue;
    }
    auto state = fs.ReadTrimmed(JoinPath(*canon, "state"));
    auto valid = fs.ReadTrimmed(JoinPath(*canon, "valid_zones"));
    if (!state.ok() || !valid.ok()) {
      ++*unreadable;
      continue;
    }
    if (*state != "online") continue;
    auto words = SplitWhitespace(*valid);
    // Older kernels list the current zone first, then the zones it could move to.
    if (words.empty()) continue;
    ++zones[words[0]];
  }
  return zones;
}

// Zones that take the kernel's own (unmovable) allocations, and so keep
// long-term pinned pages. ZONE_DEVICE is not system RAM at all.
bool IsKernelZone(const std::string& zone) {
  return zone != "Movable" && zone != "Device" && zone != "none";
}

class ZoneinfoCache {
 public:
  explicit ZoneinfoCache(SysfsReader& rd) : rd_(rd) {}
  const std::map<std::string, uint64_t>* ForNode(int id) {
    if (!loaded_) {
      loaded_ = true;
      if (auto text = rd_.Read(kZoneinfoPath, /*required=*/false)) {
        auto parsed = ParseZoneinfo(*text);
        if (parsed.ok()) {
          zones_ = std::move(parsed).value();
        } else {
          rd_.Warn(std::string(kZoneinfoPath) + ": " + parsed.status().message());
        }
      }
    }
    auto it = zones_.find(id);
    return it == zones_.end() ? nullptr : &it->second;
  }
  // /sys/devices/system/memory/block_size_bytes (hex, no 0x), read once.
  std::optional<uint64_t> BlockSize() {
    if (!block_size_loaded_) {
      block_size_loaded_ = true;
      const std::string path = std::string(kMemoryDir) + "/block_size_bytes";
      if (auto text = rd_.Read(path, /*required=*/false)) {
        auto v = ParseU64(*text, 16);
        if (v && *v > 0) {
          block_size_ = *v;
        } else {
          rd_.Warn(path + ": not a hex block size: '" + Printable(*text) + "'");
        }
      }
    }
    return block_size_;
  }

 private:
  SysfsReader& rd_;
  bool loaded_ = false;
  std::map<int, std::map<std::string, uint64_t>> zones_;
  bool block_size_loaded_ = false;
  std::optional<uint64_t> block_size_;
};

// The page size behind a node's /proc/zoneinfo page counts: MemTotal is the
// sum of its zones' managed pages, so their ratio is the page size when it
// divides exactly into a power of two; else 4 KiB.
uint64_t ZoneinfoPageSize(const NumaNode& node, const std::map<std::string, uint64_t>& zones) {
  uint64_t pages = 0;
  for (const auto& [name, count] : zones) pages += count;
  if (!node.memory_bytes || pages == 0 || *node.memory_bytes % pages != 0) return 4096;
  uint64_t size = *node.memory_bytes / pages;
  bool power_of_two = size != 0 && (size & (size - 1)) == 0;
  return power_of_two && size >= 4096 && size <= (1u << 20) ? size : 4096;
}

void ReadZone(SysfsReader& rd, ZoneinfoCache& zoneinfo, const std::string& dir, NumaNode* node) {
  size_t blocks = 0, unreadable = 0;
  auto counts = ZonesFromBlocks(rd.fs(), dir, &blocks, &unreadable);
  if (unreadable > 0) {
    rd.Warn(dir + ": " + std::to_string(unreadable) + " of " + std::to_string(blocks) +
            " memory blocks unreadable (dangling link or missing state/valid_zones)");
  }
  const bool straddles = counts.count("none") > 0;
  std::map<std::string, uint64_t> named = counts;
  named.erase("none");
  node->zone = DominantZone(named);
  if (node->memory_bytes.has_value() && *node->memory_bytes == 0) {
    node->kernel_zone_bytes = 0;
    node->movable_bytes = 0;
    return;
  }
  // Bytes per zone from the blocks, when every online block names one zone.
  if (!named.empty() && !straddles) {
    if (auto bs = zoneinfo.BlockSize()) {
      uint64_t kernel = 0, movable = 0;
      for (const auto& [zone, n] : named) {
        if (zone == "Movable") {
          movable += n * *bs;
        } else if (IsKernelZone(zone)) {
          kernel += n * *bs;
        }
      }
      node->kernel_zone_bytes = kernel;
      node->movable_bytes = movable;
      return;
    }
  }
  // No usable memory blocks (not captured, CONFIG_MEMORY_HOTPLUG=n, or a
  // block straddling zones): managed pages per zone in /proc/zoneinfo.
  const auto* z = zoneinfo.ForNode(node->id);
  if (z == nullptr) return;
  if (!node->zone) node->zone = DominantZone(*z);
  const uint64_t page = ZoneinfoPageSize(*node, *z);
  uint64_t kernel = 0, movable = 0;
  for (const auto& [zone, pages] : *z) {
    if (zone == "Movable") {
      movable += pages * page;
    } else if (IsKernelZone(zone)) {
      kernel += pages * page;
    }
  }
  node->kernel_zone_bytes = kernel;
  node->movable_bytes = movable;
}

constexpr char kCpuDir[] = "/sys/devices/system/cpu";

// Every online CPU of a kernel without NUMA nodes in sysfs: cpu/online, else
// the cpuN directories (one whose cpuN/online reads 0 is offline; the boot
// CPU usually has no such file), else /proc/cpuinfo's processor lines. Old
// kernels have no cpu/online (hwloc's 2i386-2c-nohugepage capture).
std::vector<int> OnlineCpusWithoutNuma(SysfsReader& rd) {
  const std::string online = JoinPath(kCpuDir, "online");
  if (auto cpus = rd.ReadList(online, /*required=*/false); cpus && !cpus->empty()) return *cpus;
  std::vector<int> ids;
  if (auto names = rd.fs().ListDir(kCpuDir); names.ok()) {
    for (const auto& n : names.value()) {
      auto id = NumberedName(n, "cpu");
      if (!id) continue;
      auto state = rd.Read(JoinPath(JoinPath(kCpuDir, n), "online"), /*required=*/false);
      if (!state || *state != "0") ids.push_back(*id);
    }
  }
  std::sort(ids.begin(), ids.end());
  if (!ids.empty()) return ids;
  if (auto text = rd.Read(kCpuinfoPath, /*required=*/false)) {
    auto cpus = ParseCpuinfoProcessors(*text);
    if (cpus.ok()) return std::move(cpus).value();
    rd.Warn(std::string(kCpuinfoPath) + ": " + cpus.status().message());
  }
  rd.Warn("no CPUs found (" + online + ", " + kCpuDir + "/cpuN, " + kCpuinfoPath + ")");
  return ids;
}

// CONFIG_NUMA=n: one node 0 holding every CPU and all of /proc/meminfo.
void BuildSingleNode(SysfsReader& rd, Topology* topo) {
  rd.Warn(std::string(kNodeDir) + ": missing; assuming a single NUMA node 0");
  NumaNode node;
  node.id = 0;
  node.sole_node_assumed = true;
  node.cpus = OnlineCpusWithoutNuma(rd);
  if (auto text = rd.Read(kMeminfoPath, /*required=*/true)) {
    auto info = ParseMeminfo(*text);
    if (info.count("MemTotal")) {
      node.memory_bytes = info["MemTotal"];
    } else {
      rd.Warn(std::string(kMeminfoPath) + ": no parsable MemTotal line ('" + Printable(*text) +
              "')");
    }
    if (info.count("MemFree")) node.free_bytes = info["MemFree"];
  }
  node.distances[0] = 10;
  topo->numa_nodes.push_back(std::move(node));
}

}  // namespace

void DiscoverNumaNodes(const FileSystem& fs, Topology* topo) {
  SysfsReader rd(fs, topo);
  auto dirs = ListNodeDirs(rd);
  if (!dirs) {
    BuildSingleNode(rd, topo);
    return;
  }
  // The kernel's online list is the authority (it orders the SLIT rows, and
  // hwloc trusts it too); directories only fill in when it is unreadable.
  std::vector<int> ids;
  // SLIT rows have one value per online node, even one whose directory is
  // missing from a capture; they are matched against this list.
  std::vector<int> online_ids;
  std::string online_path = JoinPath(kNodeDir, "online");
  if (auto online = rd.ReadList(online_path, /*required=*/true, kMaxNodeListId);
      online && !online->empty()) {
    online_ids = *online;
    for (int id : *online) {
      if (std::binary_search(dirs->begin(), dirs->end(), id)) {
        ids.push_back(id);
      } else {
        rd.Warn(online_path + ": node " + std::to_string(id) + " is online but " + NodePath(id) +
                " is missing");
      }
    }
  } else {
    ids = *dirs;
    online_ids = ids;
  }
  auto has_cpu = rd.ReadList(JoinPath(kNodeDir, "has_cpu"), /*required=*/false, kMaxNodeListId);

  ZoneinfoCache zoneinfo(rd);
  for (int id : ids) {
    NumaNode node;
    node.id = id;
    std::string dir = NodePath(id);
    ReadCpus(rd, dir, &node);
    if (has_cpu && node.cpus.empty() && std::binary_search(has_cpu->begin(), has_cpu->end(), id)) {
      rd.Warn(dir + ": listed in has_cpu but no cpus could be read");
    }
    ReadMeminfo(rd, dir, &node);
    ReadDistances(rd, dir, online_ids, &node);
    ReadAccessClasses(rd, dir, &node);
    ReadHugepages(rd, dir, &node);
    ReadZone(rd, zoneinfo, dir, &node);
    topo->numa_nodes.push_back(std::move(node));
  }
}

void DiscoverMemoryTiers(const FileSystem& fs, Topology* topo) {
  SysfsReader rd(fs, topo);
  auto names = fs.ListDir(kMemoryTieringDir);
  if (!names.ok()) {
    if (names.status().code() != Code::kNotFound) {
      rd.Warn(std::string(kMemoryTieringDir) + ": " + names.status().ToString());
    }
    return;
  }
  std::vector<MemoryTier> tiers;
  for (const auto& n : names.value()) {
    auto id = NumberedName(n, "memory_tier");
    if (!id) continue;
    auto nodes =
        rd.ReadList(JoinPath(JoinPath(kMemoryTieringDir, n), "nodelist"), true, kMaxNodeListId);
    if (!nodes) continue;
    tiers.push_back(MemoryTier{*id, *nodes});
  }
  std::sort(tiers.begin(), tiers.end(),
            [](const MemoryTier& a, const MemoryTier& b) { return a.id < b.id; });
  for (const auto& t : tiers) {
    for (int n : t.nodes) {
      for (auto& node : topo->numa_nodes) {
        if (node.id != n) continue;
        if (node.memory_tier) {
          rd.Warn(std::string(kMemoryTieringDir) + ": node " + std::to_string(n) +
                  " is in memory_tier" + std::to_string(*node.memory_tier) + " and memory_tier" +
                  std::to_string(t.id) + "; keeping the first");
        } else {
          node.memory_tier = t.id;
        }
      }
    }
  }
  topo->memory_tiers = std::move(tiers);
}

std::optional<uint64_t> HmatReadBandwidth(const NumaNode& node) {
  std::optional<uint64_t> bw;
  for (const auto& ac : node.access) {
    if (ac.access_class == 1 && ac.read_bandwidth_mbps) return ac.read_bandwidth_mbps;
    if (ac.access_class == 0 && ac.read_bandwidth_mbps) bw = ac.read_bandwidth_mbps;
  }
  return bw;
}

}  // namespace memory_internal

void DiscoverMemory(const FileSystem& fs, Topology* topo) {
  memory_internal::DiscoverNumaNodes(fs, topo);
  memory_internal::DiscoverMemoryTiers(fs, topo);
  auto dax = memory_internal::DiscoverDax(fs, topo);
  memory_internal::DiscoverCxl(fs, dax, topo);
  memory_internal::ClassifyNodes(topo);
}

}  // namespace cxlpool
