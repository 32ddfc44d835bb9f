// CudaDriver: the CUDA driver API loaded with dlopen, and host-memory
// registration of a lease in chunks.
//
// The driver library is libcuda.so.1, or the path in $CXLPOOL_CUDA_LIBRARY
// (tests point it at a fake that records calls). A CudaDriver can also be
// built from a table of function pointers (a test hook, no library at all).
//
// Registration: cuMemHostRegister_v2 (DEVICEMAP|PORTABLE) on the device's
// primary context, in chunks of at most kMaxRegisterChunkBytes, because
// single calls of 512 GiB and more fail on recent drivers. Each chunk has its
// own device pointer; device pointers are guaranteed contiguous only inside a
// chunk, so the registration records every chunk's pointer and whether they
// happen to be contiguous (the norm with unified addressing). The primary
// context stays retained while the registration lives: dropping the last
// reference would destroy the context and the registration with it.
//
// Thread safety: a CudaDriver is immutable after Load and safe to share;
// the driver itself is thread-safe. A CudaRegistration is owned by one lease
// and must not be used concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cuda_entry_points.h"
#include "cxlpool/common/status.h"

namespace cxlpool::cuda {

inline constexpr uint64_t kMaxRegisterChunkBytes = 64ull << 30;

struct CudaApi {
#define CXLPOOL_CUDA_FIELD(name, ret, params, required) ret(*name) params = nullptr;
  CXLPOOL_CUDA_ENTRY_POINTS(CXLPOOL_CUDA_FIELD)
#undef CXLPOOL_CUDA_FIELD
};

class CudaDriver {
 public:
  // dlopen(path), resolve every entry point, cuInit(0).
  // Errors: UNSUPPORTED (library or a required entry point missing),
  // UNAVAILABLE (cuInit failed: no device, driver/kernel module mismatch).
  static Result<std::unique_ptr<CudaDriver>> Load(const std::string& path);
  // Test hook: a driver made of the given functions (required ones must be
  // set, else UNSUPPORTED); cuInit is called like Load does.
  static Result<std::unique_ptr<CudaDriver>> FromApi(const CudaApi& api);

  // The process-wide driver: loaded once, on first use, from
  // $CXLPOOL_CUDA_LIBRARY or "libcuda.so.1". The outcome (driver or error)
  // is kept for the life of the process; the library is never unloaded.
  static Result<const CudaDriver*> Default();
  // The library path Default() uses.
  static std::string DefaultLibraryPath();

  ~CudaDriver();
  CudaDriver(const CudaDriver&) = delete;
  CudaDriver& operator=(const CudaDriver&) = delete;

  const CudaApi& api() const { return api_; }
  // "CUDA_ERROR_x (text)" from cuGetErrorString, or "CUDA error N".
  std::string ErrorText(CUresult r) const;

 private:
  CudaDriver(void* handle, const CudaApi& api) : handle_(handle), api_(api) {}
  static Result<std::unique_ptr<CudaDriver>> Init(void* handle, const CudaApi& api,
                                                  const std::string& what);
  void* handle_ = nullptr;
  CudaApi api_;
};

// One registered chunk: its device pointer and where it lies in the range.
struct RegisteredChunk {
  uint64_t device_ptr = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

// [offset, length) pieces of a range of `size` bytes, each at most
// `max_chunk` bytes. Pure; max_chunk must be > 0.
std::vector<RegisteredChunk> PlanChunks(uint64_t size, uint64_t max_chunk);

class CudaRegistration {
 public:
  CudaRegistration() = default;
  // Unregisters if still registered (errors are logged).
  ~CudaRegistration();
  CudaRegistration(CudaRegistration&& o) noexcept;
  CudaRegistration& operator=(CudaRegistration&& o) noexcept;

  bool registered() const { return driver_ != nullptr; }
  int device() const { return ordinal_; }
  const std::vector<RegisteredChunk>& chunks() const { return chunks_; }
  // True when chunk i's device pointer == chunk 0's + chunk i's offset.
  bool contiguous() const { return contiguous_; }

  // cuMemHostUnregister every chunk, release the primary context.
  // Errors: IO (the driver refused; every chunk is still attempted).
  Status Unregister();

 private:
  friend Result<CudaRegistration> RegisterHostMemory(const CudaDriver&, int, void*, uint64_t,
                                                     uint64_t);
  const CudaDriver* driver_ = nullptr;
  int ordinal_ = -1;
  CUdevice device_ = 0;
  CUcontext ctx_ = nullptr;
  void* base_ = nullptr;
  std::vector<RegisteredChunk> chunks_;
  bool contiguous_ = false;
};

// Registers [base, base+size) with CUDA on device `ordinal`.
// On failure nothing stays registered and the context is released.
// Errors: INVALID_ARGUMENT (size 0, ordinal < 0, max_chunk 0 or not a
// multiple of 4 KiB), UNAVAILABLE (no such device), IO (a driver call
// failed; the message names the call and the chunk).
Result<CudaRegistration> RegisterHostMemory(const CudaDriver& driver, int ordinal, void* base,
                                            uint64_t size,
                                            uint64_t max_chunk = kMaxRegisterChunkBytes);

}  // namespace cxlpool::cuda
