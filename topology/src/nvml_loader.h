// NvmlLibrary: NVML loaded with dlopen, never linked, so cxlpool runs (and
// falls back to a PCI scan) on machines without the NVIDIA driver.
//
// CXLPOOL_NVML_ENTRY_POINTS is the one list of entry points: it declares the
// function pointers and drives dlsym. "Required" entry points must all be
// present or the library is refused; an optional one that is missing stays
// null and the fact it answers is "unsupported" (null in JSON). Tests may
// overwrite a pointer after Open() to inject a failure (the test hook).
//
// Thread safety: Open/destroy from one thread. The NVML calls themselves are
// thread-safe per NVML's documentation, but cxlpool calls them from the one
// discovery thread only.
#pragma once

#include <memory>
#include <string>

#include "cxlpool/common/status.h"
#include "nvml_types.h"

// X(name, required, return type, parameter list)
#define CXLPOOL_NVML_ENTRY_POINTS(X)                                                               \
  X(nvmlInit_v2, true, nvmlReturn_t, (void))                                                       \
  X(nvmlShutdown, true, nvmlReturn_t, (void))                                                      \
  X(nvmlDeviceGetCount_v2, true, nvmlReturn_t, (unsigned int* count))                              \
  X(nvmlDeviceGetHandleByIndex_v2, true, nvmlReturn_t, (unsigned int index, nvmlDevice_t* device)) \
  X(nvmlErrorString, false, const char*, (nvmlReturn_t result))                                    \
  X(nvmlDeviceGetUUID, false, nvmlReturn_t,                                                        \
    (nvmlDevice_t device, char* uuid, unsigned int length))                                        \
  X(nvmlDeviceGetName, false, nvmlReturn_t,                                                        \
    (nvmlDevice_t device, char* name, unsigned int length))                                        \
  X(nvmlDeviceGetPciInfo_v3, false, nvmlReturn_t, (nvmlDevice_t device, nvmlPciInfo_t * pci))      \
  X(nvmlDeviceGetMemoryInfo, false, nvmlReturn_t, (nvmlDevice_t device, nvmlMemory_t * memory))    \
  X(nvmlDeviceGetNumaNodeId, false, nvmlReturn_t, (nvmlDevice_t device, unsigned int* node))       \
  X(nvmlDeviceGetMemoryAffinity, false, nvmlReturn_t,                                              \
    (nvmlDevice_t device, unsigned int node_set_size, unsigned long* node_set,                     \
     nvmlAffinityScope_t scope))                                                                   \
  X(nvmlDeviceGetCpuAffinityWithinScope, false, nvmlReturn_t,                                      \
    (nvmlDevice_t device, unsigned int cpu_set_size, unsigned long* cpu_set,                       \
     nvmlAffinityScope_t scope))                                                                   \
  X(nvmlDeviceGetCpuAffinity, false, nvmlReturn_t,                                                 \
    (nvmlDevice_t device, unsigned int cpu_set_size, unsigned long* cpu_set))                      \
  X(nvmlDeviceGetNvLinkState, false, nvmlReturn_t,                                                 \
    (nvmlDevice_t device, unsigned int link, nvmlEnableState_t* is_active))                        \
  X(nvmlDeviceGetNvLinkRemotePciInfo_v2, false, nvmlReturn_t,                                      \
    (nvmlDevice_t device, unsigned int link, nvmlPciInfo_t* pci))                                  \
  X(nvmlDeviceGetNvLinkRemoteDeviceType, false, nvmlReturn_t,                                      \
    (nvmlDevice_t device, unsigned int link, nvmlIntNvLinkDeviceType_t* type))

namespace cxlpool {

class NvmlLibrary {
 public:
  // dlopen(path), dlsym every entry point, then nvmlInit_v2.
  // NOT_FOUND: the library cannot be loaded (dlerror text in the message).
  // UNSUPPORTED: a required entry point is missing.
  // UNAVAILABLE: nvmlInit_v2 failed (e.g. driver not loaded).
  static Result<std::unique_ptr<NvmlLibrary>> Open(const std::string& path);

  // nvmlShutdown, then dlclose.
  ~NvmlLibrary();
  NvmlLibrary(const NvmlLibrary&) = delete;
  NvmlLibrary& operator=(const NvmlLibrary&) = delete;

  // nvmlErrorString when present, else "NVML error <n>".
  std::string ErrorString(nvmlReturn_t r) const;

  // The path as given to Open().
  const std::string& path() const { return path_; }

  // One pointer per entry point, e.g. nvmlDeviceGetUUID; null = unsupported.
#define CXLPOOL_NVML_DECLARE(name, required, ret, params) ret(*name) params = nullptr;
  CXLPOOL_NVML_ENTRY_POINTS(CXLPOOL_NVML_DECLARE)
#undef CXLPOOL_NVML_DECLARE

 private:
  NvmlLibrary() = default;
  void* handle_ = nullptr;
  bool initialized_ = false;
  std::string path_;
};

// Maps an NVML return code to a cxlpool Code (NOT_SUPPORTED -> kUnsupported,
// NO_PERMISSION -> kPermissionDenied, ...).
Code NvmlCodeToCode(nvmlReturn_t r);

// "00000000:3B:00.0" (any case, 4..8-digit domain, optional domain) ->
// "0000:3b:00.0". INVALID_ARGUMENT on anything else.
Result<std::string> NormalizePciBusId(const std::string& bus_id);

}  // namespace cxlpool
