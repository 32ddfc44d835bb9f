// DAX devices from /sys/bus/dax/devices. Declared in memory_internal.h;
// sources documented in docs/topology-kinds.md.
#include <algorithm>

#include "cxlpool/common/strings.h"
#include "memory_internal.h"

namespace cxlpool::memory_internal {
namespace {

bool IsNdBus(std::string_view c) { return NumberedName(c, "ndbus").has_value(); }

bool HasComponent(std::string_view canonical, bool (*pred)(std::string_view)) {
  for (const auto& c : Split(canonical, '/')) {
    if (pred(c)) return true;
  }
  return false;
}

// Where the DAX device's memory comes from, read off its place in the device
// tree (the canonical path of /sys/bus/dax/devices/daxX.Y):
//   .../ACPI0017:00/root0/decoder0.0/region0/dax_region0/dax0.0     -> cxl
//   .../ACPI0017:00/root0/nvdimm-bridge0/ndbus1/region2/dax2.0/...   -> cxl
//   .../platform/hmem.0/dax1.0                                       -> hmem
//   .../ACPI0012:00/ndbus0/region0/dax0.0/dax0.0                     -> nvdimm
// CXL is checked first: CXL pmem reaches DAX through an nvdimm bus too.
std::optional<std::string> SourceFromPath(std::string_view canonical) {
  auto is_cxl = [](std::string_view c) {
    return StartsWith(c, "ACPI0017:") || StartsWith(c, "nvdimm-bridge") ||
           StartsWith(c, "cxl_acpi") || StartsWith(c, "cxl_host_bridge");
  };
  auto is_hmem = [](std::string_view c) { return StartsWith(c, "hmem"); };
  if (HasComponent(canonical, +is_cxl)) return "cxl";
  if (HasComponent(canonical, +is_hmem)) return "hmem";
  if (HasComponent(canonical, &IsNdBus)) return "nvdimm";
  return std::nullopt;
}

}  // namespace

std::vector<DaxFound> DiscoverDax(const FileSystem& fs, Topology* topo) {
  SysfsReader rd(fs, topo);
  std::vector<DaxFound> found;
  auto names = fs.ListDir(kDaxDevicesDir);
  if (!names.ok()) {
    if (names.status().code() != Code::kNotFound) {
      rd.Warn(std::string(kDaxDevicesDir) + ": " + names.status().ToString());
    }
    return found;
  }
  std::vector<std::string> sorted = names.value();
  std::sort(sorted.begin(), sorted.end(), NaturalLess);
  for (const auto& name : sorted) {
    std::string link = JoinPath(kDaxDevicesDir, name);
    auto canon = fs.Canonical(link);
    if (!canon.ok() || !fs.IsDir(*canon)) {
      rd.Warn(link + ": dangling or not a device directory" +
              (canon.ok() ? " (-> " + *canon + ")" : ": " + canon.status().ToString()));
      continue;
    }
    DaxFound f;
    f.canonical = *canon;
    DaxDevice& d = f.dev;
    d.name = name;
    d.size_bytes = rd.ReadU64(JoinPath(*canon, "size"), /*required=*/true);
    d.target_node = rd.ReadNodeId(JoinPath(*canon, "target_node"), /*required=*/false);
    d.align_bytes = rd.ReadU64(JoinPath(*canon, "align"), /*required=*/false);

    // The bound driver decides the mode: kmem hot-plugs the range as system
    // RAM into target_node; device_dax exposes it as /dev/daxX.Y.
    if (auto drv = fs.ReadLink(JoinPath(*canon, "driver")); drv.ok()) {
      std::string driver = BaseName(*drv);
      if (driver == "kmem") {
        d.mode = "system-ram";
      } else if (driver == "device_dax") {
        d.mode = "devdax";
      } else {
        rd.Warn(link + ": bound to unexpected driver '" + Printable(driver) + "'");
      }
    }
    d.source = SourceFromPath(*canon);

    // The parent device carries the dax_region attribute group.
    std::string parent = DirName(*canon);
    std::string region_attrs = JoinPath(parent, "dax_region");
    if (fs.IsDir(region_attrs)) {
      if (auto id = rd.ReadU64(JoinPath(region_attrs, "id"), /*required=*/false)) {
        d.region = "dax_region" + std::to_string(*id);
      }
      // The kernel hides create/seed/delete/available_size on static regions
      // (nvdimm namespaces); dynamic ones (hmem, CXL RAM) can be sub-divided.
      d.dynamic = fs.Exists(JoinPath(region_attrs, "create"));
    } else if (d.source) {
      // No attribute group to look at: nvdimm namespaces are static.
      d.dynamic = !HasComponent(*canon, &IsNdBus);
    }
    if (!d.region && NumberedName(BaseName(parent), "dax_region")) d.region = BaseName(parent);
    found.push_back(std::move(f));
  }
  for (const auto& f : found) topo->dax_devices.push_back(f.dev);
  return found;
}

}  // namespace cxlpool::memory_internal
