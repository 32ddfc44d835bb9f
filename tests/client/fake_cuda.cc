// A fake CUDA driver (libcuda.so.1 stand-in) for the client tests: it
// exports the entry points libcxlpool resolves, records every call, touches
// no memory, and is steered by fake_cuda_* control functions that a test
// reaches with dlsym on the same library.
//
// Host allocation (cuMemHostAlloc, cuMemAllocHost(_v2), cuMemFreeHost) maps
// anonymous memory and counts it; cuGetProcAddress(_v2) hands out internal
// addresses of those, not the exported names (as the real driver does).
//
// Behaviour: N devices (default 1); registration requires a pushed context;
// a single cuMemHostRegister_v2 of max_register_bytes or more fails with
// CUDA_ERROR_INVALID_VALUE (default 512 GiB, like recent drivers); device
// pointers equal host pointers (unified addressing) unless non-contiguous
// mode gives each chunk its own far-apart device address.
//
// Thread safety: one mutex around all state.
#include <sys/mman.h>

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace {

using CUresult = int;
using CUdevice = int;
struct CUctx_st {
  int device;
};
using CUcontext = CUctx_st*;
using CUdeviceptr = unsigned long long;  // NOLINT: the driver's type

std::mutex g_mu;
std::vector<std::string> g_calls;
std::string g_call_copy;
int g_device_count = 1;
CUresult g_init_result = 0;
uint64_t g_max_register = 512ull << 30;
int g_fail_register_at = -1;  // the n-th (0-based) register call fails
int g_register_calls = 0;
bool g_noncontiguous = false;
int g_noncontiguous_counter = 0;
CUctx_st g_ctx[8];
int g_retained[8] = {};
std::vector<CUcontext> g_stack;
struct Reg {
  uint64_t size;
  CUdeviceptr dptr;
};
std::map<uintptr_t, Reg> g_regs;            // by host address
std::map<uintptr_t, size_t> g_host_allocs;  // cuMemHostAlloc'd, by address

void Record(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void Record(const char* fmt, ...) {
  char buf[256];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  g_calls.emplace_back(buf);
}

}  // namespace

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

// ---- control ----
FAKE_EXPORT void fake_cuda_reset() {
  std::lock_guard<std::mutex> l(g_mu);
  g_calls.clear();
  g_device_count = 1;
  g_init_result = 0;
  g_max_register = 512ull << 30;
  g_fail_register_at = -1;
  g_register_calls = 0;
  g_noncontiguous = false;
  g_noncontiguous_counter = 0;
  for (int& r : g_retained) r = 0;
  g_stack.clear();
  g_regs.clear();
}
// Host allocations the driver itself made (cuMemHostAlloc/cuMemAllocHost)
// and has not freed.
FAKE_EXPORT int fake_cuda_host_allocs() {
  std::lock_guard<std::mutex> l(g_mu);
  return static_cast<int>(g_host_allocs.size());
}
FAKE_EXPORT void fake_cuda_set_device_count(int n) {
  std::lock_guard<std::mutex> l(g_mu);
  g_device_count = n;
}
FAKE_EXPORT void fake_cuda_set_init_result(int r) {
  std::lock_guard<std::mutex> l(g_mu);
  g_init_result = r;
}
FAKE_EXPORT void fake_cuda_set_max_register_bytes(uint64_t n) {
  std::lock_guard<std::mutex> l(g_mu);
  g_max_register = n;
}
FAKE_EXPORT void fake_cuda_fail_register_at(int n) {
  std::lock_guard<std::mutex> l(g_mu);
  g_fail_register_at = n;
}
FAKE_EXPORT void fake_cuda_set_noncontiguous(int on) {
  std::lock_guard<std::mutex> l(g_mu);
  g_noncontiguous = on != 0;
}
FAKE_EXPORT int fake_cuda_call_count() {
  std::lock_guard<std::mutex> l(g_mu);
  return static_cast<int>(g_calls.size());
}
// The i-th recorded call, e.g. "cuMemHostRegister_v2 0x7f.. 68719476736 3".
// The pointer is valid until the next fake_cuda_* call.
FAKE_EXPORT const char* fake_cuda_call(int i) {
  std::lock_guard<std::mutex> l(g_mu);
  if (i < 0 || i >= static_cast<int>(g_calls.size())) return nullptr;
  g_call_copy = g_calls[i];
  return g_call_copy.c_str();
}
FAKE_EXPORT uint64_t fake_cuda_registered_bytes() {
  std::lock_guard<std::mutex> l(g_mu);
  uint64_t n = 0;
  for (const auto& [addr, r] : g_regs) n += r.size;
  return n;
}
FAKE_EXPORT int fake_cuda_retained_contexts() {
  std::lock_guard<std::mutex> l(g_mu);
  int n = 0;
  for (int r : g_retained) n += r;
  return n;
}
FAKE_EXPORT int fake_cuda_context_depth() {
  std::lock_guard<std::mutex> l(g_mu);
  return static_cast<int>(g_stack.size());
}

// ---- the driver API ----
FAKE_EXPORT CUresult cuInit(unsigned int flags) {
  std::lock_guard<std::mutex> l(g_mu);
  Record("cuInit %u", flags);
  return g_init_result;
}
FAKE_EXPORT CUresult cuDeviceGetCount(int* count) {
  std::lock_guard<std::mutex> l(g_mu);
  Record("cuDeviceGetCount");
  *count = g_device_count;
  return 0;
}
FAKE_EXPORT CUresult cuDeviceGet(CUdevice* dev, int ordinal) {
  std::lock_guard<std::mutex> l(g_mu);
  Record("cuDeviceGet %d", ordinal);
  if (ordinal < 0 || ordinal >= g_device_count || ordinal >= 8) return 101;
  *dev = ordinal;
  return 0;
}
FAKE_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice dev) {
  std::lock_guard<std::mutex> l(g_mu);
  Record("cuDevicePrimaryCtxRetain %d", dev);
  if (dev < 0 || dev >= 8) return 101;
  g_ctx[dev].device = dev;
  ++g_retained[dev];
  *ctx = &g_ctx[dev];
  return 0;
}
FAKE_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  std::lock_guard<std::mutex> l(g_mu);
  Record("cuDevicePrimaryCtxRelease_v2 %d", dev);
  if (dev < 0 || dev >= 8 || g_retained[dev] == 0) return 201;
  --g_retained[dev];
  return 0;
}
FAKE_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
  std::lock_guard<std::mutex> l(g_mu);
  Record("cuCtxPushCurrent_v2 %d", ctx ? ctx->device : -1);
  if (ctx == nullptr) return 201;
  g_stack.push_back(ctx);
  return 0;
}
FAKE_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext* ctx) {
  std::lock_guard<std::mutex> l(g_mu);
  Record("cuCtxPopCurrent_v2");
  if (g_stack.empty()) return 201;
  if (ctx != nullptr) *ctx = g_stack.back();
  g_stack.pop_back();
  return 0;
}
FAKE_EXPORT CUresult cuMemHostRegister_v2(void* p, size_t bytes, unsigned int flags) {
  std::lock_guard<std::mutex> l(g_mu);
  Record("cuMemHostRegister_v2 %p %zu %u", p, bytes, flags);
  const int call = g_register_calls++;
  if (g_stack.empty()) return 201;
  if (bytes == 0 || bytes >= g_max_register) return 1;
  if (call == g_fail_register_at) return 2;
  const auto a = reinterpret_cast<uintptr_t>(p);
  for (const auto& [base, r] : g_regs) {
    if (a < base + r.size && base < a + bytes) return 712;
  }
  CUdeviceptr dptr = a;
  if (g_noncontiguous) dptr = (0x100000000000ull) + (uint64_t(g_noncontiguous_counter++) << 42);
  g_regs[a] = Reg{bytes, dptr};
  return 0;
}
FAKE_EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr* dptr, void* p, unsigned int flags) {
  std::lock_guard<std::mutex> l(g_mu);
  Record("cuMemHostGetDevicePointer_v2 %p %u", p, flags);
  auto it = g_regs.find(reinterpret_cast<uintptr_t>(p));
  if (it == g_regs.end()) return 1;
  *dptr = it->second.dptr;
  return 0;
}
FAKE_EXPORT CUresult cuMemHostUnregister(void* p) {
  std::lock_guard<std::mutex> l(g_mu);
  Record("cuMemHostUnregister %p", p);
  if (g_stack.empty()) return 201;
  auto it = g_regs.find(reinterpret_cast<uintptr_t>(p));
  if (it == g_regs.end()) return 713;
  g_regs.erase(it);
  return 0;
}
FAKE_EXPORT CUresult cuGetErrorString(CUresult e, const char** s) {
  switch (e) {
    case 0:
      *s = "no error";
      return 0;
    case 1:
      *s = "invalid argument";
      return 0;
    case 2:
      *s = "out of memory";
      return 0;
    case 100:
      *s = "no CUDA-capable device is detected";
      return 0;
    case 101:
      *s = "invalid device ordinal";
      return 0;
    case 201:
      *s = "invalid device context";
      return 0;
    case 712:
      *s = "part or all of the requested memory range is already mapped";
      return 0;
    case 713:
      *s = "pointer does not correspond to a registered memory region";
      return 0;
    default:
      *s = nullptr;
      return 1;
  }
}

// ---- host allocation by the driver (the preload shim's real calls) ----
namespace {
CUresult HostAlloc(void** pp, size_t bytes, unsigned int flags, const char* what) {
  std::lock_guard<std::mutex> l(g_mu);
  Record("%s %zu %u", what, bytes, flags);
  if (g_stack.empty()) return 201;
  if (pp == nullptr || bytes == 0) return 1;
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return 2;
  g_host_allocs[reinterpret_cast<uintptr_t>(p)] = bytes;
  *pp = p;
  return 0;
}
}  // namespace

namespace {
// What the entry points do; cuGetProcAddress hands out these internal
// addresses, as the real driver does, so that no interposition of the
// exported names can reach them.
CUresult MemHostAlloc(void** pp, size_t bytes, unsigned int flags) {
  return HostAlloc(pp, bytes, flags, "cuMemHostAlloc");
}
CUresult MemAllocHostV2(void** pp, size_t bytes) {
  return HostAlloc(pp, bytes, 0, "cuMemAllocHost_v2");
}
CUresult MemAllocHost(void** pp, unsigned int bytes) {
  return HostAlloc(pp, bytes, 0, "cuMemAllocHost");
}
CUresult MemFreeHost(void* p) {
  std::lock_guard<std::mutex> l(g_mu);
  Record("cuMemFreeHost %p", p);
  auto it = g_host_allocs.find(reinterpret_cast<uintptr_t>(p));
  if (it == g_host_allocs.end()) return 1;
  ::munmap(p, it->second);
  g_host_allocs.erase(it);
  return 0;
}
}  // namespace

FAKE_EXPORT CUresult cuMemHostAlloc(void** pp, size_t bytes, unsigned int flags) {
  return MemHostAlloc(pp, bytes, flags);
}
FAKE_EXPORT CUresult cuMemAllocHost_v2(void** pp, size_t bytes) {
  return MemAllocHostV2(pp, bytes);
}
FAKE_EXPORT CUresult cuMemAllocHost(void** pp, unsigned int bytes) {
  return MemAllocHost(pp, bytes);
}
FAKE_EXPORT CUresult cuMemFreeHost(void* p) { return MemFreeHost(p); }
FAKE_EXPORT CUresult cuCtxGetDevice(CUdevice* dev) {
  std::lock_guard<std::mutex> l(g_mu);
  if (g_stack.empty()) return 201;
  *dev = g_stack.back()->device;
  return 0;
}
// Entry points by name, as the driver hands them out: the library's own
// exports (cuMemAllocHost means the _v2 one from CUDA 3.2 on).
namespace {
CUresult ProcAddress(const char* symbol, void** pfn, int version) {
  if (symbol == nullptr || pfn == nullptr) return 1;
  std::string name = symbol;
  if (name == "cuMemAllocHost" && version >= 3020) name = "cuMemAllocHost_v2";
  struct Entry {
    const char* n;
    void* f;
  };
  static const Entry kTable[] = {
      {"cuMemHostAlloc", reinterpret_cast<void*>(&MemHostAlloc)},
      {"cuMemAllocHost_v2", reinterpret_cast<void*>(&MemAllocHostV2)},
      {"cuMemAllocHost", reinterpret_cast<void*>(&MemAllocHost)},
      {"cuMemFreeHost", reinterpret_cast<void*>(&MemFreeHost)},
  };
  for (const Entry& e : kTable) {
    if (name == e.n) {
      *pfn = e.f;
      return 0;
    }
  }
  *pfn = nullptr;
  return 500;  // CUDA_ERROR_NOT_FOUND
}
}  // namespace
FAKE_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int version,
                                      unsigned long long flags) {
  (void)flags;
  return ProcAddress(symbol, pfn, version);
}
FAKE_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version,
                                         unsigned long long flags, void* status) {
  (void)flags;
  if (status != nullptr) std::memset(status, 0, sizeof(int));
  return ProcAddress(symbol, pfn, version);
}
