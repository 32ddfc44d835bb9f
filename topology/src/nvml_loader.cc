#include "nvml_loader.h"

#include <dlfcn.h>

#include <cstdio>

#include "cxlpool/common/strings.h"

namespace cxlpool {

Result<std::unique_ptr<NvmlLibrary>> NvmlLibrary::Open(const std::string& path) {
  if (path.empty()) return Status(Code::kInvalidArgument, "NVML library path is empty");
  std::unique_ptr<NvmlLibrary> lib(new NvmlLibrary());
  lib->path_ = path;
  dlerror();
  lib->handle_ = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib->handle_ == nullptr) {
    const char* err = dlerror();
    return Status(Code::kNotFound,
                  "cannot load NVML library " + path + ": " + (err ? err : "unknown error"));
  }
  std::string missing_required;
#define CXLPOOL_NVML_RESOLVE(name, required, ret, params)                    \
  lib->name = reinterpret_cast<ret(*) params>(::dlsym(lib->handle_, #name)); \
  if (lib->name == nullptr && (required)) {                                  \
    missing_required += missing_required.empty() ? #name : ", " #name;       \
  }
  CXLPOOL_NVML_ENTRY_POINTS(CXLPOOL_NVML_RESOLVE)
#undef CXLPOOL_NVML_RESOLVE
  if (!missing_required.empty()) {
    return Status(Code::kUnsupported,
                  "NVML library " + path + " lacks required entry points: " + missing_required);
  }
  nvmlReturn_t r = lib->nvmlInit_v2();
  if (r != NVML_SUCCESS) {
    return Status(Code::kUnavailable, "nvmlInit_v2 failed: " + lib->ErrorString(r));
  }
  lib->initialized_ = true;
  return lib;
}

NvmlLibrary::~NvmlLibrary() {
  if (initialized_ && nvmlShutdown != nullptr) nvmlShutdown();
  if (handle_ != nullptr) ::dlclose(handle_);
}

std::string NvmlLibrary::ErrorString(nvmlReturn_t r) const {
  std::string code = "NVML error " + std::to_string(static_cast<int>(r));
  if (nvmlErrorString != nullptr) {
    const char* s = nvmlErrorString(r);
    if (s != nullptr && *s != '\0') return std::string(s) + " (" + code + ")";
  }
  return code;
}

Code NvmlCodeToCode(nvmlReturn_t r) {
  switch (r) {
    case NVML_SUCCESS:
      return Code::kOk;
    case NVML_ERROR_INVALID_ARGUMENT:
    case NVML_ERROR_INSUFFICIENT_SIZE:
      return Code::kInvalidArgument;
    case NVML_ERROR_NOT_SUPPORTED:
    case NVML_ERROR_FUNCTION_NOT_FOUND:
      return Code::kUnsupported;
    case NVML_ERROR_NO_PERMISSION:
      return Code::kPermissionDenied;
    case NVML_ERROR_NOT_FOUND:
    case NVML_ERROR_LIBRARY_NOT_FOUND:
      return Code::kNotFound;
    case NVML_ERROR_UNINITIALIZED:
    case NVML_ERROR_DRIVER_NOT_LOADED:
    case NVML_ERROR_TIMEOUT:
    case NVML_ERROR_GPU_IS_LOST:
    case NVML_ERROR_RESET_REQUIRED:
    case NVML_ERROR_IN_USE:
      return Code::kUnavailable;
    case NVML_ERROR_MEMORY:
      return Code::kResourceExhausted;
    default:
      return Code::kIo;
  }
}

Result<std::string> NormalizePciBusId(const std::string& bus_id) {
  // [domain:]bus:device.function, hex.
  std::string s(Trim(bus_id));
  auto bad = [&] { return Status(Code::kInvalidArgument, "bad PCI bus id '" + bus_id + "'"); };
  std::vector<std::string> parts = Split(s, ':');
  if (parts.size() == 2) parts.insert(parts.begin(), "0");
  if (parts.size() != 3) return bad();
  auto dot = parts[2].find('.');
  if (dot == std::string::npos) return bad();
  std::string dev_s = parts[2].substr(0, dot);
  std::string fn_s = parts[2].substr(dot + 1);
  auto hex = [](const std::string& x, size_t max_len) -> std::optional<uint64_t> {
    if (x.empty() || x.size() > max_len) return std::nullopt;
    for (char c : x)
      if (!std::isxdigit(static_cast<unsigned char>(c))) return std::nullopt;
    return ParseU64(x, 16);
  };
  auto domain = hex(parts[0], 8);
  auto bus = hex(parts[1], 2);
  auto dev = hex(dev_s, 2);
  auto fn = hex(fn_s, 1);
  if (!domain || !bus || !dev || !fn || *dev > 0x1f || *fn > 7) return bad();
  char buf[32];
  std::snprintf(buf, sizeof buf, "%04llx:%02llx:%02llx.%llx",
                static_cast<unsigned long long>(*domain), static_cast<unsigned long long>(*bus),
                static_cast<unsigned long long>(*dev), static_cast<unsigned long long>(*fn));
  return std::string(buf);
}

}  // namespace cxlpool
