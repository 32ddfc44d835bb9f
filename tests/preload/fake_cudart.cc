// A fake CUDA runtime (libcudart.so.12 stand-in) for the preload shim's
// tests. Like the real one it defines its symbols under the version node
// "libcudart.so.12" (fake_cudart.map), so a program linked against it
// references cudaHostAlloc@libcudart.so.12, the case the shim must
// interpose. Host allocations are plain anonymous mappings the fake records;
// cudaFreeHost of any other pointer fails with cudaErrorInvalidValue and is
// counted. cudaGetDriverEntryPoint resolves from the libcuda.so.1 this
// process loaded (the fake driver of tests/client). Steered and read with
// fake_cudart_* functions.
//
// Thread safety: one mutex around all state; the current device is
// per thread, as in the real runtime.
#include <dlfcn.h>
#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

std::mutex g_mu;
std::map<uintptr_t, size_t> g_allocs;
int g_device_count = 1;
int g_host_alloc_calls = 0;
int g_foreign_frees = 0;
thread_local int t_device = 0;

}  // namespace

FAKE_EXPORT int fake_cudart_live_allocs() {
  std::lock_guard<std::mutex> l(g_mu);
  return static_cast<int>(g_allocs.size());
}
FAKE_EXPORT int fake_cudart_host_alloc_calls() {
  std::lock_guard<std::mutex> l(g_mu);
  return g_host_alloc_calls;
}
FAKE_EXPORT int fake_cudart_foreign_frees() {
  std::lock_guard<std::mutex> l(g_mu);
  return g_foreign_frees;
}
FAKE_EXPORT void fake_cudart_set_device_count(int n) {
  std::lock_guard<std::mutex> l(g_mu);
  g_device_count = n;
}

FAKE_EXPORT int cudaGetDeviceCount(int* n) {
  std::lock_guard<std::mutex> l(g_mu);
  *n = g_device_count;
  return g_device_count > 0 ? 0 : 100;
}
FAKE_EXPORT int cudaGetDevice(int* d) {
  std::lock_guard<std::mutex> l(g_mu);
  if (g_device_count == 0) return 100;  // cudaErrorNoDevice
  *d = t_device;
  return 0;
}
FAKE_EXPORT int cudaSetDevice(int d) {
  std::lock_guard<std::mutex> l(g_mu);
  if (d < 0 || d >= g_device_count) return 101;  // cudaErrorInvalidDevice
  t_device = d;
  return 0;
}
FAKE_EXPORT int cudaHostAlloc(void** p, size_t size, unsigned int /*flags*/) {
  std::lock_guard<std::mutex> l(g_mu);
  ++g_host_alloc_calls;
  if (g_device_count == 0) return 100;
  if (p == nullptr || size == 0) return 1;
  void* q = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (q == MAP_FAILED) return 2;  // cudaErrorMemoryAllocation
  g_allocs[reinterpret_cast<uintptr_t>(q)] = size;
  *p = q;
  return 0;
}
FAKE_EXPORT int cudaMallocHost(void** p, size_t size) { return cudaHostAlloc(p, size, 0); }
FAKE_EXPORT int cudaFreeHost(void* p) {
  std::lock_guard<std::mutex> l(g_mu);
  auto it = g_allocs.find(reinterpret_cast<uintptr_t>(p));
  if (it == g_allocs.end()) {
    ++g_foreign_frees;
    return 1;  // cudaErrorInvalidValue
  }
  ::munmap(p, it->second);
  g_allocs.erase(it);
  return 0;
}
FAKE_EXPORT const char* cudaGetErrorString(int e) { return e == 0 ? "no error" : "fake error"; }

namespace {
int Entry(const char* symbol, void** fp) {
  void* h = ::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (h == nullptr) return 3;
  *fp = ::dlsym(h, symbol);
  ::dlclose(h);
  return *fp != nullptr ? 0 : 500;
}
}  // namespace

FAKE_EXPORT int cudaGetDriverEntryPoint(const char* symbol, void** fp, unsigned long long,
                                        void* status) {
  if (status != nullptr) *static_cast<int*>(status) = 0;
  return Entry(symbol, fp);
}
FAKE_EXPORT int cudaGetDriverEntryPointByVersion(const char* symbol, void** fp, unsigned int,
                                                 unsigned long long, void* status) {
  if (status != nullptr) *static_cast<int*>(status) = 0;
  return Entry(symbol, fp);
}
