// The DLPack structs (https://dmlc.github.io/dlpack, v1.0 ABI), declared
// here so that the module needs no dlpack.h. Only what a CPU producer uses:
// the legacy DLManagedTensor ("dltensor" capsules) and the versioned
// DLManagedTensorVersioned ("dltensor_versioned", DLPack >= 1.0).
//
// Thread safety: declarations only.
#pragma once

#include <cstdint>

namespace cxlpool::pydlpack {

inline constexpr int32_t kDLCPU = 1;
inline constexpr uint8_t kDLUInt = 1;
inline constexpr uint32_t kMajorVersion = 1;
inline constexpr uint32_t kMinorVersion = 0;
inline constexpr uint64_t kFlagReadOnly = 1ull << 0;

struct DLDevice {
  int32_t device_type;
  int32_t device_id;
};

struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};

struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // NULL: compact row-major
  uint64_t byte_offset;
};

struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};

struct DLPackVersion {
  uint32_t major;
  uint32_t minor;
};

struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned* self);
  uint64_t flags;
  DLTensor dl_tensor;
};

}  // namespace cxlpool::pydlpack
