// CXL memdevs and regions from /sys/bus/cxl/devices. Declared in
// memory_internal.h; the sysfs layout followed here is the kernel's
// Documentation/ABI/testing/sysfs-bus-cxl, described in docs/topology-kinds.md.
#include <algorithm>
#include <set>

#include "cxlpool/common/strings.h"
#include "memory_internal.h"

namespace cxlpool::memory_internal {
namespace {

// Canonical directory of a device on the CXL bus, or nullopt with a warning.
std::optional<std::string> DeviceDir(SysfsReader& rd, const std::string& name) {
  std::string link = JoinPath(kCxlDevicesDir, name);
  auto canon = rd.fs().Canonical(link);
  if (!canon.ok() || !rd.fs().IsDir(*canon)) {
    rd.Warn(link + ": dangling or not a device directory");
    return std::nullopt;
  }
  return *canon;
}

CxlMemdev ReadMemdev(SysfsReader& rd, const std::string& name, const std::string& dir) {
  CxlMemdev m;
  m.name = name;
  m.serial = rd.ReadU64(JoinPath(dir, "serial"), /*required=*/false);
  m.ram_bytes = rd.ReadU64(JoinPath(dir, "ram/size"), /*required=*/true);
  m.pmem_bytes = rd.ReadU64(JoinPath(dir, "pmem/size"), /*required=*/true);
  m.numa_node = rd.ReadNodeId(JoinPath(dir, "numa_node"), /*required=*/false);
  return m;
}

// "decoderX.Y"
bool IsDecoderName(std::string_view name) {
  if (!StartsWith(name, "decoder")) return false;
  auto parts = Split(name.substr(7), '.');
  return parts.size() == 2 && ParseU64(parts[0]) && ParseU64(parts[1]) &&
         Trim(parts[0]) == parts[0] && Trim(parts[1]) == parts[1];
}

// regionZ/targetN holds an endpoint decoder name ("decoder5.0"). The decoder
// sits under its endpoint port (endpointX/decoder5.0), and the endpoint's
// 'uport' link points at the memdev (…/0000:36:00.0/mem0).
std::optional<std::string> MemdevOfDecoder(SysfsReader& rd, const std::string& target_path,
                                           const std::string& decoder) {
  if (!IsDecoderName(decoder)) {
    rd.Warn(target_path + ": not a decoder name '" + Printable(decoder) + "'");
    return std::nullopt;
  }
  auto dec = rd.fs().Canonical(JoinPath(kCxlDevicesDir, decoder));
  if (!dec.ok() || !rd.fs().IsDir(*dec)) {
    rd.Warn(target_path + ": decoder '" + Printable(decoder) + "' not found");
    return std::nullopt;
  }
  std::string endpoint = DirName(*dec);
  auto uport = rd.fs().Canonical(JoinPath(endpoint, "uport"));
  if (!uport.ok() || !rd.fs().IsDir(*uport)) {
    rd.Warn(endpoint + "/uport: missing or dangling; cannot name the memdev behind " + decoder);
    return std::nullopt;
  }
  std::string mem = BaseName(*uport);
  if (!NumberedName(mem, "mem")) {
    rd.Warn(endpoint + "/uport: points at '" + Printable(mem) + "', not a memdev");
    return std::nullopt;
  }
  return mem;
}

std::optional<std::string> RegionType(SysfsReader& rd, const std::string& dir) {
  std::string path = JoinPath(dir, "mode");
  if (auto mode = rd.Read(path, /*required=*/false)) {
    if (*mode == "ram" || *mode == "pmem") return *mode;
    rd.Warn(path + ": unexpected mode '" + Printable(*mode) + "'");
    return std::nullopt;
  }
  // Kernels before 6.3 have no 'mode': the child device tells.
  if (auto kids = rd.fs().ListDir(dir); kids.ok()) {
    for (const auto& k : kids.value()) {
      if (NumberedName(k, "pmem_region")) return "pmem";
      if (NumberedName(k, "dax_region")) return "ram";
    }
  }
  return std::nullopt;
}

// A CXL pmem region reaches DAX through the nvdimm bridge: pmem_regionZ ->
// an nd region on the bridge's ndbus that decodes the same physical range.
std::optional<std::string> NdRegionFor(const FileSystem& fs, uint64_t start, uint64_t size) {
  auto names = fs.ListDir(kNdDevicesDir);
  if (!names.ok()) return std::nullopt;
  for (const auto& n : names.value()) {
    if (!NumberedName(n, "region")) continue;
    auto canon = fs.Canonical(JoinPath(kNdDevicesDir, n));
    if (!canon.ok()) continue;
    auto res = fs.ReadTrimmed(JoinPath(*canon, "resource"));
    auto sz = fs.ReadTrimmed(JoinPath(*canon, "size"));
    if (!res.ok() || !sz.ok()) continue;
    auto r = ParseSysfsU64(*res);
    auto s = ParseSysfsU64(*sz);
    if (r.ok() && s.ok() && *r == start && *s == size) return *canon;
  }
  return std::nullopt;
}

bool Under(const std::string& path, const std::string& dir) {
  return path.size() > dir.size() && StartsWith(path, dir) && path[dir.size()] == '/';
}

}  // namespace

void DiscoverCxl(const FileSystem& fs, const std::vector<DaxFound>& dax, Topology* topo) {
  SysfsReader rd(fs, topo);
  auto names = fs.ListDir(kCxlDevicesDir);
  if (!names.ok()) {
    if (names.status().code() != Code::kNotFound) {
      rd.Warn(std::string(kCxlDevicesDir) + ": " + names.status().ToString());
    }
    return;
  }
  std::vector<std::string> sorted = names.value();
  std::sort(sorted.begin(), sorted.end(), NaturalLess);

  for (const auto& name : sorted) {
    if (!NumberedName(name, "mem")) continue;
    if (auto dir = DeviceDir(rd, name)) topo->cxl_memdevs.push_back(ReadMemdev(rd, name, *dir));
  }

  for (const auto& name : sorted) {
    if (!NumberedName(name, "region")) continue;
    auto dir = DeviceDir(rd, name);
    if (!dir) continue;
    CxlRegion r;
    r.name = name;
    r.size_bytes = rd.ReadU64(JoinPath(*dir, "size"), /*required=*/true);
    r.type = RegionType(rd, *dir);

    // Members, in interleave position order (target0, target1, ...).
    std::vector<std::pair<int, std::string>> targets;
    if (auto kids = fs.ListDir(*dir); kids.ok()) {
      for (const auto& k : kids.value()) {
        if (auto pos = NumberedName(k, "target")) targets.emplace_back(*pos, k);
      }
    }
    std::sort(targets.begin(), targets.end());
    for (const auto& [pos, t] : targets) {
      std::string path = JoinPath(*dir, t);
      auto decoder = rd.Read(path, /*required=*/true);
      if (!decoder || decoder->empty()) continue;  // position not programmed
      if (auto mem = MemdevOfDecoder(rd, path, *decoder)) r.memdevs.push_back(*mem);
    }

    // DAX devices: below the region in the device tree (RAM: dax_regionZ),
    // or for pmem below the nd region that decodes the same range.
    std::vector<const DaxFound*> members;
    for (const auto& f : dax) {
      if (Under(f.canonical, *dir)) members.push_back(&f);
    }
    if (members.empty() && r.type == "pmem" && r.size_bytes) {
      auto start = rd.ReadU64(JoinPath(*dir, "resource"), /*required=*/false);
      if (start) {
        if (auto nd = NdRegionFor(fs, *start, *r.size_bytes)) {
          for (const auto& f : dax) {
            if (Under(f.canonical, *nd)) members.push_back(&f);
          }
        }
      }
    }
    std::set<int> nodes;
    for (const DaxFound* f : members) {
      r.dax_devices.push_back(f->dev.name);
      if (f->dev.mode == "system-ram" && f->dev.target_node) nodes.insert(*f->dev.target_node);
    }
    r.numa_nodes.assign(nodes.begin(), nodes.end());
    topo->cxl_regions.push_back(std::move(r));
  }
}

}  // namespace cxlpool::memory_internal
