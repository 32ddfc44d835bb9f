#include "cuda_driver.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <utility>

#include "cxlpool/common/log.h"

namespace cxlpool::cuda {
namespace {

std::string Hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

// Pushes a context for the scope of one driver sequence.
class ScopedCtx {
 public:
  ScopedCtx(const CudaApi& api, CUcontext ctx) : api_(api) {
    pushed_ = api_.cuCtxPushCurrent_v2(ctx) == kCudaSuccess;
  }
  ~ScopedCtx() {
    if (pushed_) {
      CUcontext popped = nullptr;
      api_.cuCtxPopCurrent_v2(&popped);
    }
  }
  bool pushed() const { return pushed_; }

 private:
  const CudaApi& api_;
  bool pushed_ = false;
};

}  // namespace

std::string CudaDriver::DefaultLibraryPath() {
  const char* env = std::getenv("CXLPOOL_CUDA_LIBRARY");
  if (env != nullptr && *env != '\0') return env;
  return "libcuda.so.1";
}

Result<std::unique_ptr<CudaDriver>> CudaDriver::Load(const std::string& path) {
  dlerror();
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = dlerror();
    return Status(Code::kUnsupported,
                  "cannot load the CUDA driver " + path + ": " + (err ? err : "dlopen failed"));
  }
  CudaApi api;
#define CXLPOOL_CUDA_RESOLVE(name, ret, params, required) \
  api.name = reinterpret_cast<ret(*) params>(dlsym(handle, #name));
  CXLPOOL_CUDA_ENTRY_POINTS(CXLPOOL_CUDA_RESOLVE)
#undef CXLPOOL_CUDA_RESOLVE
  auto r = Init(handle, api, path);
  if (!r.ok()) dlclose(handle);
  return r;
}

Result<std::unique_ptr<CudaDriver>> CudaDriver::FromApi(const CudaApi& api) {
  return Init(nullptr, api, "the CUDA test table");
}

Result<std::unique_ptr<CudaDriver>> CudaDriver::Init(void* handle, const CudaApi& api,
                                                     const std::string& what) {
#define CXLPOOL_CUDA_CHECK(name, ret, params, required)                        \
  if ((required) && api.name == nullptr) {                                     \
    return Status(Code::kUnsupported, what + " lacks the entry point " #name); \
  }
  CXLPOOL_CUDA_ENTRY_POINTS(CXLPOOL_CUDA_CHECK)
#undef CXLPOOL_CUDA_CHECK
  std::unique_ptr<CudaDriver> d(new CudaDriver(handle, api));
  CUresult r = api.cuInit(0);
  if (r != kCudaSuccess) {
    d->handle_ = nullptr;  // the caller closes the library
    return Status(Code::kUnavailable, "cuInit failed: " + d->ErrorText(r) +
                                          (r == kCudaErrorNoDevice ? " (no CUDA GPU)" : ""));
  }
  return d;
}

CudaDriver::~CudaDriver() {
  // The driver library is never unloaded while anything may still use it;
  // only a driver made by Load for a test is closed here.
  if (handle_ != nullptr) dlclose(handle_);
}

Result<const CudaDriver*> CudaDriver::Default() {
  static std::once_flag once;
  static Result<std::unique_ptr<CudaDriver>>* loaded = nullptr;
  std::call_once(once, [] {
    loaded = new Result<std::unique_ptr<CudaDriver>>(Load(DefaultLibraryPath()));
    if (loaded->ok()) loaded->value()->handle_ = nullptr;  // keep the library loaded for good
  });
  if (!loaded->ok()) return loaded->status();
  return static_cast<const CudaDriver*>(loaded->value().get());
}

std::string CudaDriver::ErrorText(CUresult r) const {
  const char* s = nullptr;
  if (api_.cuGetErrorString != nullptr && api_.cuGetErrorString(r, &s) == kCudaSuccess &&
      s != nullptr) {
    return "CUDA error " + std::to_string(r) + " (" + s + ")";
  }
  return "CUDA error " + std::to_string(r);
}

std::vector<RegisteredChunk> PlanChunks(uint64_t size, uint64_t max_chunk) {
  std::vector<RegisteredChunk> out;
  if (max_chunk == 0) return out;
  for (uint64_t off = 0; off < size; off += max_chunk) {
    RegisteredChunk c;
    c.offset = off;
    c.length = std::min(max_chunk, size - off);
    out.push_back(c);
  }
  return out;
}

CudaRegistration::~CudaRegistration() {
  if (registered()) {
    Status s = Unregister();
    if (!s.ok()) {
      CXLPOOL_LOG(kWarning) << "CUDA unregister: " << s.ToString();
    }
  }
}

CudaRegistration::CudaRegistration(CudaRegistration&& o) noexcept { *this = std::move(o); }

CudaRegistration& CudaRegistration::operator=(CudaRegistration&& o) noexcept {
  if (this != &o) {
    if (registered()) {
      Status s = Unregister();
      if (!s.ok()) {
        CXLPOOL_LOG(kWarning) << "CUDA unregister: " << s.ToString();
      }
    }
    driver_ = std::exchange(o.driver_, nullptr);
    ordinal_ = std::exchange(o.ordinal_, -1);
    device_ = o.device_;
    ctx_ = std::exchange(o.ctx_, nullptr);
    base_ = std::exchange(o.base_, nullptr);
    chunks_ = std::move(o.chunks_);
    o.chunks_.clear();
    contiguous_ = std::exchange(o.contiguous_, false);
  }
  return *this;
}

Status CudaRegistration::Unregister() {
  if (!registered()) return Status(Code::kNotFound, "not registered with CUDA");
  const CudaApi& api = driver_->api();
  std::string errors;
  {
    ScopedCtx scope(api, ctx_);
    if (!scope.pushed()) errors = "cuCtxPushCurrent_v2 failed; ";
    for (const RegisteredChunk& c : chunks_) {
      CUresult r = api.cuMemHostUnregister(static_cast<char*>(base_) + c.offset);
      if (r != kCudaSuccess) {
        errors += "cuMemHostUnregister(chunk at offset " + std::to_string(c.offset) +
                  "): " + driver_->ErrorText(r) + "; ";
      }
    }
  }
  CUresult r = api.cuDevicePrimaryCtxRelease_v2(device_);
  if (r != kCudaSuccess) errors += "cuDevicePrimaryCtxRelease_v2: " + driver_->ErrorText(r);
  driver_ = nullptr;
  ctx_ = nullptr;
  base_ = nullptr;
  chunks_.clear();
  contiguous_ = false;
  ordinal_ = -1;
  if (!errors.empty()) return Status(Code::kIo, errors);
  return Status::Ok();
}

Result<CudaRegistration> RegisterHostMemory(const CudaDriver& driver, int ordinal, void* base,
                                            uint64_t size, uint64_t max_chunk) {
  if (size == 0) return Status(Code::kInvalidArgument, "cannot register 0 bytes");
  if (ordinal < 0) return Status(Code::kInvalidArgument, "negative CUDA device index");
  if (max_chunk == 0 || max_chunk % 4096 != 0) {
    return Status(Code::kInvalidArgument, "chunk size must be a non-zero multiple of 4 KiB");
  }
  const CudaApi& api = driver.api();
  int count = 0;
  CUresult r = api.cuDeviceGetCount(&count);
  if (r != kCudaSuccess) {
    return Status(Code::kUnavailable, "cuDeviceGetCount: " + driver.ErrorText(r));
  }
  if (ordinal >= count) {
    return Status(Code::kUnavailable, "CUDA device " + std::to_string(ordinal) +
                                          " does not exist (" + std::to_string(count) +
                                          " device(s))");
  }
  CUdevice dev = 0;
  r = api.cuDeviceGet(&dev, ordinal);
  if (r != kCudaSuccess) {
    return Status(Code::kUnavailable,
                  "cuDeviceGet(" + std::to_string(ordinal) + "): " + driver.ErrorText(r));
  }
  CUcontext ctx = nullptr;
  r = api.cuDevicePrimaryCtxRetain(&ctx, dev);
  if (r != kCudaSuccess) {
    return Status(Code::kIo, "cuDevicePrimaryCtxRetain: " + driver.ErrorText(r));
  }

  std::vector<RegisteredChunk> chunks = PlanChunks(size, max_chunk);
  Status failure;
  size_t done = 0;
  {
    ScopedCtx scope(api, ctx);
    if (!scope.pushed()) {
      failure = Status(Code::kIo, "cuCtxPushCurrent_v2 failed");
    }
    for (; failure.ok() && done < chunks.size(); ++done) {
      RegisteredChunk& c = chunks[done];
      char* p = static_cast<char*>(base) + c.offset;
      r = api.cuMemHostRegister_v2(p, c.length,
                                   kMemHostRegisterDeviceMap | kMemHostRegisterPortable);
      if (r != kCudaSuccess) {
        failure =
            Status(Code::kIo, "cuMemHostRegister_v2(chunk " + std::to_string(done) + " of " +
                                  std::to_string(chunks.size()) + ", " + std::to_string(c.length) +
                                  " bytes at " + Hex(reinterpret_cast<uintptr_t>(p)) +
                                  "): " + driver.ErrorText(r));
        break;
      }
      CUdeviceptr dptr = 0;
      r = api.cuMemHostGetDevicePointer_v2(&dptr, p, 0);
      if (r != kCudaSuccess) {
        api.cuMemHostUnregister(p);
        failure = Status(Code::kIo, "cuMemHostGetDevicePointer_v2(chunk " + std::to_string(done) +
                                        "): " + driver.ErrorText(r));
        break;
      }
      c.device_ptr = dptr;
    }
    if (!failure.ok()) {
      for (size_t i = 0; i < done; ++i) {
        api.cuMemHostUnregister(static_cast<char*>(base) + chunks[i].offset);
      }
    }
  }
  if (!failure.ok()) {
    api.cuDevicePrimaryCtxRelease_v2(dev);
    return failure;
  }

  CudaRegistration reg;
  reg.driver_ = &driver;
  reg.ordinal_ = ordinal;
  reg.device_ = dev;
  reg.ctx_ = ctx;
  reg.base_ = base;
  reg.contiguous_ = true;
  for (const RegisteredChunk& c : chunks) {
    if (c.device_ptr != chunks.front().device_ptr + c.offset) reg.contiguous_ = false;
  }
  reg.chunks_ = std::move(chunks);
  return reg;
}

}  // namespace cxlpool::cuda
