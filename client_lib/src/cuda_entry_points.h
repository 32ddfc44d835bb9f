// The CUDA driver API entry points libcxlpool uses, as one X-macro list, and
// the driver types they need, declared here so that no cuda.h is required.
//
// X(name, return type, parameter list, required)
//   required: the library refuses to use a driver that lacks the symbol.
// The versioned names (_v2) are the ones libcuda.so.1 exports for the 64-bit
// ABI; cuda.h maps the plain names onto them.
//
// Thread safety: declarations only.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cxlpool::cuda {

using CUresult = int;
using CUdevice = int;
using CUcontext = struct CUctx_st*;
using CUdeviceptr = unsigned long long;  // NOLINT: the driver's own 64-bit type

inline constexpr CUresult kCudaSuccess = 0;
inline constexpr CUresult kCudaErrorInvalidValue = 1;
inline constexpr CUresult kCudaErrorOutOfMemory = 2;
inline constexpr CUresult kCudaErrorNotInitialized = 3;
inline constexpr CUresult kCudaErrorNoDevice = 100;
inline constexpr CUresult kCudaErrorInvalidDevice = 101;
inline constexpr CUresult kCudaErrorInvalidContext = 201;
inline constexpr CUresult kCudaErrorHostMemoryAlreadyRegistered = 712;
inline constexpr CUresult kCudaErrorHostMemoryNotRegistered = 713;

inline constexpr unsigned int kMemHostRegisterPortable = 0x01;
inline constexpr unsigned int kMemHostRegisterDeviceMap = 0x02;

}  // namespace cxlpool::cuda

// clang-format off
#define CXLPOOL_CUDA_ENTRY_POINTS(X)                                                        \
  X(cuInit, CUresult, (unsigned int flags), true)                                           \
  X(cuDeviceGetCount, CUresult, (int* count), true)                                         \
  X(cuDeviceGet, CUresult, (CUdevice* device, int ordinal), true)                           \
  X(cuDevicePrimaryCtxRetain, CUresult, (CUcontext* ctx, CUdevice device), true)            \
  X(cuDevicePrimaryCtxRelease_v2, CUresult, (CUdevice device), true)                        \
  X(cuCtxPushCurrent_v2, CUresult, (CUcontext ctx), true)                                   \
  X(cuCtxPopCurrent_v2, CUresult, (CUcontext* ctx), true)                                   \
  X(cuMemHostRegister_v2, CUresult, (void* p, size_t bytes, unsigned int flags), true)      \
  X(cuMemHostGetDevicePointer_v2, CUresult,                                                 \
    (CUdeviceptr* dptr, void* p, unsigned int flags), true)                                 \
  X(cuMemHostUnregister, CUresult, (void* p), true)                                         \
  X(cuGetErrorString, CUresult, (CUresult error, const char** str), false)
// clang-format on
