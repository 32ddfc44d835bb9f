// Fuzz target: topology discovery over a fuzzed fake sysfs tree. The input is
// a list of records "<path-index> <content>\0"; each picks one of the sysfs
// and procfs paths discovery reads (the NVIDIA driver's numa_status among
// them) and gives it arbitrary content, so every parser sees garbage,
// truncation and binary junk. In a content, the two bytes "\\0" stand for a
// NUL byte (records are NUL-separated), so seeds can hold NUL-padded values
// such as "0-31\n\0". Discovery must never crash, and the JSON must always
// serialise.
#include <cstdint>
#include <string>
#include <vector>

#include "cxlpool/common/fs.h"
#include "cxlpool/topology/discover.h"
#include "cxlpool/topology/json.h"

namespace {

const std::vector<std::string>& Paths() {
  static const std::vector<std::string> kPaths = {
      "/sys/devices/system/node/online",
      "/sys/devices/system/node/possible",
      "/sys/devices/system/node/has_memory",
      "/sys/devices/system/node/has_cpu",
      "/sys/devices/system/node/node0/cpulist",
      "/sys/devices/system/node/node0/meminfo",
      "/sys/devices/system/node/node0/distance",
      "/sys/devices/system/node/node1/cpulist",
      "/sys/devices/system/node/node1/meminfo",
      "/sys/devices/system/node/node1/distance",
      "/sys/devices/system/node/node1/access0/initiators/read_bandwidth",
      "/sys/devices/system/node/node1/access0/initiators/read_latency",
      "/sys/devices/system/node/node1/access0/initiators/write_bandwidth",
      "/sys/devices/system/node/node1/access0/initiators/write_latency",
      "/sys/devices/system/node/node1/access1/initiators/read_bandwidth",
      "/sys/devices/system/node/node1/hugepages/hugepages-2048kB/nr_hugepages",
      "/sys/devices/system/node/node1/hugepages/hugepages-2048kB/free_hugepages",
      "/sys/devices/system/memory/memory32/valid_zones",
      "/sys/devices/system/memory/memory32/state",
      "/sys/devices/system/memory/block_size_bytes",
      "/proc/zoneinfo",
      "/sys/devices/virtual/memory_tiering/memory_tier4/nodelist",
      "/sys/devices/virtual/memory_tiering/memory_tier22/nodelist",
      "/sys/bus/dax/devices/dax0.0/size",
      "/sys/bus/dax/devices/dax0.0/target_node",
      "/sys/bus/dax/devices/dax0.0/numa_node",
      "/sys/bus/dax/devices/dax0.0/align",
      "/sys/bus/cxl/devices/mem0/serial",
      "/sys/bus/cxl/devices/mem0/ram/size",
      "/sys/bus/cxl/devices/mem0/pmem/size",
      "/sys/bus/cxl/devices/mem0/numa_node",
      "/sys/bus/cxl/devices/region0/size",
      "/sys/bus/cxl/devices/region0/mode",
      "/sys/bus/cxl/devices/region0/target0",
      "/sys/bus/pci/devices/0000:01:00.0/vendor",
      "/sys/bus/pci/devices/0000:01:00.0/class",
      "/sys/bus/pci/devices/0000:01:00.0/numa_node",
      "/sys/kernel/mm/transparent_hugepage/shmem_enabled",
      // Appended: earlier seeds keep their indices.
      "/proc/driver/nvidia/gpus/0000:01:00.0/numa_status",
      "/proc/driver/nvidia/gpus/0000:02:00.0/numa_status",
      "/sys/devices/system/node/node2/cpulist",
      "/sys/devices/system/node/node2/meminfo",
      "/sys/devices/system/memory/memory40/valid_zones",
      "/sys/devices/system/memory/memory40/state",
  };
  return kPaths;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  cxlpool::FakeFileSystem fs;
  // A sane skeleton, so the fuzzer reaches the deeper parsers.
  fs.AddFile("/sys/devices/system/node/online", "0-1\n");
  fs.AddSymlink("/sys/devices/system/node/node1/memory32", "../../memory/memory32");
  fs.AddSymlink("/sys/devices/system/node/node1/access0/initiators/node0", "../../../node0");
  fs.AddSymlink("/sys/bus/dax/devices/dax0.0",
                "../../../devices/platform/cxl/region0/dax_region0/dax0.0");
  fs.AddSymlink("/sys/bus/dax/devices/dax0.0/driver", "../../../../../../bus/dax/drivers/kmem");
  fs.AddSymlink("/sys/devices/system/node/node2/memory40", "../../memory/memory40");
  fs.AddDir("/proc/driver/nvidia/gpus/0000:01:00.0");
  fs.AddDir("/proc/driver/nvidia/gpus/0000:02:00.0");
  std::string in(reinterpret_cast<const char*>(data), size);
  size_t pos = 0;
  while (pos < in.size()) {
    size_t end = in.find('\0', pos);
    if (end == std::string::npos) end = in.size();
    std::string rec = in.substr(pos, end - pos);
    pos = end + 1;
    size_t sp = rec.find(' ');
    if (sp == std::string::npos || sp == 0 || sp > 3) continue;
    unsigned idx = 0;
    for (size_t i = 0; i < sp; ++i) idx = idx * 10 + static_cast<unsigned>(rec[i] - '0') % 10;
    std::string content = rec.substr(sp + 1);
    for (size_t at = content.find("\\0"); at != std::string::npos;
         at = content.find("\\0", at + 1)) {
      content.replace(at, 2, 1, '\0');
    }
    fs.AddFile(Paths()[idx % Paths().size()], content);
  }
  cxlpool::DiscoverOptions opts;
  opts.use_nvml = false;
  cxlpool::Topology topo = cxlpool::DiscoverTopology(fs, opts);
  std::string json = cxlpool::TopologyToJsonString(topo);
  if (json.empty()) __builtin_trap();
  return 0;
}
