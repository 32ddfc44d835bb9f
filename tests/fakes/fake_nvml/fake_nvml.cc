// A fake libnvidia-ml: exports the NVML C entry points cxlpool uses and
// answers from a JSON board description named by $CXLPOOL_FAKE_NVML_BOARD
// (format in README.md beside this file). Built in three variants (see
// CMakeLists.txt): full; "minimal" without the NVLink, NUMA-node-id, memory
// affinity and scoped CPU affinity entry points; and "nocount" without the
// required nvmlDeviceGetCount_v2.
//
// It behaves like NVML where that matters to callers: calls before
// nvmlInit_v2 return UNINITIALIZED, unknown handles and out-of-range indices
// or links return INVALID_ARGUMENT, short buffers INSUFFICIENT_SIZE, facts the
// board marks "unsupported" NOT_SUPPORTED. No exception leaves this library.
//
// Thread safety: one mutex guards the board, as NVML is thread-safe.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cxlpool/common/strings.h"
#include "nvml_types.h"

#define FAKE_NVML_API extern "C" __attribute__((visibility("default")))

struct FakeLink {
  bool active = false;
  std::string remote_bus_id;
  nvmlIntNvLinkDeviceType_t remote_type = NVML_NVLINK_DEVICE_TYPE_UNKNOWN;
};

// The opaque NVML handle type; handles point at these.
struct nvmlDevice_st {
  std::string uuid, name, bus_id;
  unsigned int pci_device_id = 0;
  unsigned long long memory_total = 0, memory_free = 0;
  std::vector<int> memory_affinity;  // NUMA nodes
  std::vector<int> cpu_affinity;     // CPUs
  std::optional<unsigned int> numa_node_id;
  std::map<unsigned int, FakeLink> links;
  std::set<std::string> unsupported;
};

namespace {

struct Board {
  std::vector<std::unique_ptr<nvmlDevice_st>> devices;
};

std::mutex g_mu;
int g_init_count = 0;
std::unique_ptr<Board> g_board;

nvmlReturn_t ParseError(const std::string& s) {
  static const std::map<std::string, nvmlReturn_t> kNames = {
      {"uninitialized", NVML_ERROR_UNINITIALIZED},
      {"invalid_argument", NVML_ERROR_INVALID_ARGUMENT},
      {"not_supported", NVML_ERROR_NOT_SUPPORTED},
      {"no_permission", NVML_ERROR_NO_PERMISSION},
      {"driver_not_loaded", NVML_ERROR_DRIVER_NOT_LOADED},
      {"lib_rm_version_mismatch", NVML_ERROR_LIB_RM_VERSION_MISMATCH},
      {"unknown", NVML_ERROR_UNKNOWN}};
  auto it = kNames.find(s);
  return it == kNames.end() ? NVML_ERROR_UNKNOWN : it->second;
}

nvmlIntNvLinkDeviceType_t ParseRemoteType(const std::string& s) {
  if (s == "gpu") return NVML_NVLINK_DEVICE_TYPE_GPU;
  if (s == "switch") return NVML_NVLINK_DEVICE_TYPE_SWITCH;
  if (s == "cpu" || s == "ibmnpu") return NVML_NVLINK_DEVICE_TYPE_IBMNPU;
  return NVML_NVLINK_DEVICE_TYPE_UNKNOWN;
}

std::vector<int> ParseList(const nlohmann::json& j) {
  if (j.is_string()) {
    auto r = cxlpool::ParseCpuList(j.get<std::string>());
    return r.ok() ? r.value() : std::vector<int>{};
  }
  if (j.is_array()) return j.get<std::vector<int>>();
  return {};
}

// Loads the board; returns the error nvmlInit_v2 should report.
nvmlReturn_t LoadBoard() {
  const char* path = std::getenv("CXLPOOL_FAKE_NVML_BOARD");
  if (path == nullptr || *path == '\0') return NVML_ERROR_DRIVER_NOT_LOADED;
  std::ifstream in(path);
  if (!in) return NVML_ERROR_DRIVER_NOT_LOADED;
  try {
    nlohmann::json j = nlohmann::json::parse(in);
    if (j.contains("init_error") && j["init_error"].is_string()) {
      return ParseError(j["init_error"].get<std::string>());
    }
    auto board = std::make_unique<Board>();
    for (const auto& g : j.at("gpus")) {
      auto d = std::make_unique<nvmlDevice_st>();
      d->uuid = g.value("uuid", "");
      d->name = g.value("name", "");
      d->bus_id = g.value("pci_bus_id", "");
      if (g.contains("pci_device_id")) {
        d->pci_device_id = static_cast<unsigned int>(
            std::stoul(g["pci_device_id"].get<std::string>(), nullptr, 16));
      }
      d->memory_total = g.value("memory_total_bytes", 0ull);
      d->memory_free = g.value("memory_free_bytes", d->memory_total);
      if (g.contains("memory_affinity")) d->memory_affinity = ParseList(g["memory_affinity"]);
      if (g.contains("cpu_affinity")) d->cpu_affinity = ParseList(g["cpu_affinity"]);
      if (g.contains("numa_node_id") && g["numa_node_id"].is_number_unsigned()) {
        d->numa_node_id = g["numa_node_id"].get<unsigned int>();
      }
      if (g.contains("nvlinks")) {
        for (const auto& l : g["nvlinks"]) {
          FakeLink link;
          link.active = l.value("active", false);
          link.remote_bus_id = l.value("remote_pci_bus_id", "");
          link.remote_type = ParseRemoteType(l.value("remote_type", ""));
          d->links[l.at("link").get<unsigned int>()] = link;
        }
      }
      if (g.contains("unsupported")) {
        for (const auto& u : g["unsupported"]) d->unsupported.insert(u.get<std::string>());
      }
      board->devices.push_back(std::move(d));
    }
    g_board = std::move(board);
    return NVML_SUCCESS;
  } catch (const std::exception&) {
    return NVML_ERROR_UNKNOWN;  // garbled board: like a broken driver
  }
}

// Checks init and handle validity; sets *err when the call must fail.
bool Valid(nvmlDevice_t dev, nvmlReturn_t* err) {
  if (g_init_count == 0 || !g_board) {
    *err = NVML_ERROR_UNINITIALIZED;
    return false;
  }
  for (const auto& d : g_board->devices)
    if (d.get() == dev) return true;
  *err = NVML_ERROR_INVALID_ARGUMENT;
  return false;
}

bool Unsupported(nvmlDevice_t dev, const char* fact) { return dev->unsupported.count(fact) > 0; }

nvmlReturn_t CopyString(const std::string& s, char* out, unsigned int length) {
  if (out == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (s.size() + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
  std::memcpy(out, s.c_str(), s.size() + 1);
  return NVML_SUCCESS;
}

void FillPci(const std::string& bus_id, unsigned int device_id, nvmlPciInfo_t* pci) {
  std::memset(pci, 0, sizeof *pci);
  std::snprintf(pci->busId, sizeof pci->busId, "%s", bus_id.c_str());
  unsigned int domain = 0, bus = 0, dev = 0, fn = 0;
  if (std::sscanf(bus_id.c_str(), "%x:%x:%x.%x", &domain, &bus, &dev, &fn) == 4) {
    pci->domain = domain;
    pci->bus = bus;
    pci->device = dev;
    std::snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04x:%02x:%02x.%x", domain & 0xffff,
                  bus, dev, fn);
  }
  pci->pciDeviceId = device_id;
}

nvmlReturn_t FillMask(const std::vector<int>& bits, unsigned int words, unsigned long* out) {
  if (out == nullptr || words == 0) return NVML_ERROR_INVALID_ARGUMENT;
  std::memset(out, 0, words * sizeof(unsigned long));
  const unsigned int per = 8 * sizeof(unsigned long);
  for (int b : bits) {
    if (b < 0) continue;
    if (static_cast<unsigned int>(b) / per >= words) return NVML_ERROR_INSUFFICIENT_SIZE;
    out[b / per] |= 1ul << (b % per);
  }
  return NVML_SUCCESS;
}

#define FAKE_CHECK_DEVICE(dev)            \
  std::lock_guard<std::mutex> lock(g_mu); \
  nvmlReturn_t err = NVML_SUCCESS;        \
  if (!Valid(dev, &err)) return err

}  // namespace

FAKE_NVML_API nvmlReturn_t nvmlInit_v2(void) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_init_count == 0) {
    nvmlReturn_t r = LoadBoard();
    if (r != NVML_SUCCESS) return r;
  }
  ++g_init_count;
  return NVML_SUCCESS;
}

FAKE_NVML_API nvmlReturn_t nvmlShutdown(void) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_init_count == 0) return NVML_ERROR_UNINITIALIZED;
  if (--g_init_count == 0) g_board.reset();
  return NVML_SUCCESS;
}

FAKE_NVML_API const char* nvmlErrorString(nvmlReturn_t r) {
  switch (r) {
    case NVML_SUCCESS:
      return "Success";
    case NVML_ERROR_UNINITIALIZED:
      return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT:
      return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED:
      return "Not Supported";
    case NVML_ERROR_NO_PERMISSION:
      return "Insufficient Permissions";
    case NVML_ERROR_INSUFFICIENT_SIZE:
      return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED:
      return "Driver Not Loaded";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH:
      return "RM has detected an NVML/RM version mismatch.";
    default:
      return "Unknown Error";
  }
}

#ifndef FAKE_NVML_NO_COUNT
FAKE_NVML_API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* count) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_init_count == 0 || !g_board) return NVML_ERROR_UNINITIALIZED;
  if (count == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *count = static_cast<unsigned int>(g_board->devices.size());
  return NVML_SUCCESS;
}
#endif

FAKE_NVML_API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* dev) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_init_count == 0 || !g_board) return NVML_ERROR_UNINITIALIZED;
  if (dev == nullptr || index >= g_board->devices.size()) return NVML_ERROR_INVALID_ARGUMENT;
  *dev = g_board->devices[index].get();
  return NVML_SUCCESS;
}

FAKE_NVML_API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t dev, char* uuid, unsigned int length) {
  FAKE_CHECK_DEVICE(dev);
  if (Unsupported(dev, "uuid")) return NVML_ERROR_NOT_SUPPORTED;
  return CopyString(dev->uuid, uuid, length);
}

FAKE_NVML_API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t dev, char* name, unsigned int length) {
  FAKE_CHECK_DEVICE(dev);
  if (Unsupported(dev, "name")) return NVML_ERROR_NOT_SUPPORTED;
  return CopyString(dev->name, name, length);
}

FAKE_NVML_API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t dev, nvmlPciInfo_t* pci) {
  FAKE_CHECK_DEVICE(dev);
  if (pci == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (Unsupported(dev, "pci")) return NVML_ERROR_NOT_SUPPORTED;
  FillPci(dev->bus_id, dev->pci_device_id, pci);
  return NVML_SUCCESS;
}

FAKE_NVML_API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t* mem) {
  FAKE_CHECK_DEVICE(dev);
  if (mem == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (Unsupported(dev, "memory")) return NVML_ERROR_NOT_SUPPORTED;
  mem->total = dev->memory_total;
  mem->free = dev->memory_free;
  mem->used = dev->memory_total - std::min(dev->memory_free, dev->memory_total);
  return NVML_SUCCESS;
}

FAKE_NVML_API nvmlReturn_t nvmlDeviceGetCpuAffinity(nvmlDevice_t dev, unsigned int size,
                                                    unsigned long* set) {
  FAKE_CHECK_DEVICE(dev);
  if (Unsupported(dev, "cpu_affinity") || dev->cpu_affinity.empty()) {
    return NVML_ERROR_NOT_SUPPORTED;
  }
  return FillMask(dev->cpu_affinity, size, set);
}

#ifndef FAKE_NVML_MINIMAL
FAKE_NVML_API nvmlReturn_t nvmlDeviceGetCpuAffinityWithinScope(nvmlDevice_t dev, unsigned int size,
                                                               unsigned long* set,
                                                               nvmlAffinityScope_t scope) {
  FAKE_CHECK_DEVICE(dev);
  if (scope > NVML_AFFINITY_SCOPE_SOCKET) return NVML_ERROR_INVALID_ARGUMENT;
  if (Unsupported(dev, "cpu_affinity") || dev->cpu_affinity.empty()) {
    return NVML_ERROR_NOT_SUPPORTED;
  }
  return FillMask(dev->cpu_affinity, size, set);
}

FAKE_NVML_API nvmlReturn_t nvmlDeviceGetMemoryAffinity(nvmlDevice_t dev, unsigned int size,
                                                       unsigned long* set,
                                                       nvmlAffinityScope_t scope) {
  FAKE_CHECK_DEVICE(dev);
  if (scope > NVML_AFFINITY_SCOPE_SOCKET) return NVML_ERROR_INVALID_ARGUMENT;
  if (Unsupported(dev, "memory_affinity") || dev->memory_affinity.empty()) {
    return NVML_ERROR_NOT_SUPPORTED;
  }
  return FillMask(dev->memory_affinity, size, set);
}

FAKE_NVML_API nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t dev, unsigned int* node) {
  FAKE_CHECK_DEVICE(dev);
  if (node == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (Unsupported(dev, "numa_node_id") || !dev->numa_node_id) return NVML_ERROR_NOT_SUPPORTED;
  *node = *dev->numa_node_id;
  return NVML_SUCCESS;
}

namespace {
// The board's link, or the NVML error for a link it does not have.
const FakeLink* FindLink(nvmlDevice_t dev, unsigned int link, nvmlReturn_t* err) {
  if (link >= NVML_NVLINK_MAX_LINKS) {
    *err = NVML_ERROR_INVALID_ARGUMENT;
    return nullptr;
  }
  auto it = dev->links.find(link);
  if (Unsupported(dev, "nvlink") || it == dev->links.end()) {
    *err = NVML_ERROR_NOT_SUPPORTED;
    return nullptr;
  }
  return &it->second;
}
}  // namespace

FAKE_NVML_API nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t dev, unsigned int link,
                                                    nvmlEnableState_t* active) {
  FAKE_CHECK_DEVICE(dev);
  if (active == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  const FakeLink* l = FindLink(dev, link, &err);
  if (l == nullptr) return err;
  *active = l->active ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
  return NVML_SUCCESS;
}

FAKE_NVML_API nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t dev, unsigned int link,
                                                               nvmlPciInfo_t* pci) {
  FAKE_CHECK_DEVICE(dev);
  if (pci == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  const FakeLink* l = FindLink(dev, link, &err);
  if (l == nullptr) return err;
  if (!l->active || l->remote_bus_id.empty()) return NVML_ERROR_NOT_SUPPORTED;
  FillPci(l->remote_bus_id, 0, pci);
  return NVML_SUCCESS;
}

FAKE_NVML_API nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t dev, unsigned int link,
                                                               nvmlIntNvLinkDeviceType_t* type) {
  FAKE_CHECK_DEVICE(dev);
  if (type == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  const FakeLink* l = FindLink(dev, link, &err);
  if (l == nullptr) return err;
  if (!l->active) return NVML_ERROR_NOT_SUPPORTED;
  *type = l->remote_type;
  return NVML_SUCCESS;
}
#endif  // FAKE_NVML_MINIMAL
