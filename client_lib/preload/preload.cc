// libcxlpool_preload.so: serves the pinned host allocations of unmodified
// CUDA programs from cxlpool leases.
//
//   LD_PRELOAD=libcxlpool_preload.so python train.py
//
// Interposed (exported unversioned, so a preloaded definition satisfies the
// versioned references of the CUDA runtime that PyTorch wheels load, e.g.
// cudaHostAlloc@libcudart.so.12 or @libcudart.so.13):
//   runtime: cudaHostAlloc, cudaMallocHost, cudaFreeHost
//   driver:  cuMemHostAlloc, cuMemAllocHost, cuMemAllocHost_v2, cuMemFreeHost
//   lookups: cuGetProcAddress, cuGetProcAddress_v2, cudaGetDriverEntryPoint,
//            cudaGetDriverEntryPointByVersion (and their _ptsz forms): a
//            program that fetches the three driver calls by name instead of
//            through the PLT gets this library's versions.
//
// A served allocation is a lease of exactly the requested size (the daemon
// rounds to its page size), placed near the calling thread's current device
// (cudaGetDevice for runtime calls, cuCtxGetDevice for driver calls) and
// registered with CUDA there (cuMemHostRegister DEVICEMAP|PORTABLE, through
// libcxlpool), so it is pinned, portable and mapped like cudaHostAlloc's
// memory. cudaFreeHost / cuMemFreeHost of such a pointer releases the lease;
// any other pointer goes to the real call untouched.
//
// What is served, from the environment (read once):
//   CXLPOOL_PRELOAD=0            serve nothing (everything passes through)
//   CXLPOOL_PRELOAD_MIN_BYTES=N  serve requests of N bytes or more (default
//                                1M; K/M/G suffixes)
//   CXLPOOL_PRELOAD_LOG=0        no log lines on stderr
//   CXLPOOL_SOCKET               the daemon (libcxlpool's default otherwise)
// Write-combined requests (cudaHostAllocWriteCombined,
// CU_MEMHOSTALLOC_WRITECOMBINED) always pass through: a lease cannot be
// write-combined.
//
// Fallback: when the daemon is absent, refuses, is out of memory or quota,
// or the CUDA registration fails, the real call serves the request; each
// cause is logged once ("cxlpool-preload: ... falls back ..."). A daemon
// that was absent is tried again at most once a second.
//
// The real functions: dlsym(RTLD_NEXT) first; when the CUDA library was
// dlopen'ed RTLD_LOCAL (as PyTorch's extension modules load it) that finds
// nothing, so the loaded objects are searched (dl_iterate_phdr) for
// libcudart.so* / libcuda.so*, and the symbol is taken with dlvsym under the
// version named like the library's soname, else dlsym.
//
// Not served: programs whose CUDA runtime is linked statically
// (libcudart_static.a) reach the driver through entry points the runtime
// looks up on its own dlopen handle, which no preload sees.
//
// Thread safety: every entry point may be called from any thread; one mutex
// guards the table of served pointers and the connection. A thread-local
// depth counter sends calls made from inside this library (the real
// runtime calling the driver) straight through.
#include <dlfcn.h>
#include <link.h>
#include <time.h>

#include <atomic>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_map>

#include "cxlpool/client.hpp"
#include "cxlpool/common/thread_annotations.h"

#define PRELOAD_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

using cudaError_t = int;
using CUresult = int;
using CUdevice = int;
using cuuint64_t = uint64_t;

constexpr cudaError_t kCudaSuccess = 0;
constexpr unsigned int kCudaHostAllocWriteCombined = 0x04;
constexpr unsigned int kCuMemHostAllocWriteCombined = 0x04;
constexpr int kCudaErrorInitializationError = 3;  // runtime: no real function
constexpr int kCudaErrorNotInitialized = 3;       // driver: the same number

// ---- configuration ----

uint64_t ParseBytes(const char* s, uint64_t dflt) {
  if (s == nullptr || *s == '\0') return dflt;
  char* end = nullptr;
  unsigned long long v = std::strtoull(s, &end, 10);
  if (end == s) return dflt;
  switch (*end) {
    case 'k':
    case 'K':
      v <<= 10;
      break;
    case 'm':
    case 'M':
      v <<= 20;
      break;
    case 'g':
    case 'G':
      v <<= 30;
      break;
    default:
      break;
  }
  return v;
}

bool EnvOff(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && (std::strcmp(v, "0") == 0 || std::strcmp(v, "off") == 0 ||
                          std::strcmp(v, "false") == 0 || std::strcmp(v, "no") == 0);
}

struct Config {
  bool enabled = true;
  bool log = true;
  uint64_t min_bytes = 1ull << 20;
};

const Config& Cfg() {
  static const Config c = [] {
    Config x;
    x.enabled = !EnvOff("CXLPOOL_PRELOAD");
    x.log = !EnvOff("CXLPOOL_PRELOAD_LOG");
    x.min_bytes = ParseBytes(std::getenv("CXLPOOL_PRELOAD_MIN_BYTES"), 1ull << 20);
    if (x.min_bytes == 0) x.min_bytes = 1;
    return x;
  }();
  return c;
}

void Log(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void Log(const char* fmt, ...) {
  if (!Cfg().log) return;
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "cxlpool-preload: %s\n", buf);
}

// ---- calls made from inside go straight through ----

thread_local int t_depth = 0;
struct Inside {
  Inside() { ++t_depth; }
  ~Inside() { --t_depth; }
  Inside(const Inside&) = delete;
  Inside& operator=(const Inside&) = delete;
};

// ---- the real functions ----

struct FindCtx {
  const char* prefix;
  const char* name;
  void* self;
  void* found;
};

int FindInObject(struct dl_phdr_info* info, size_t, void* data) {
  auto* c = static_cast<FindCtx*>(data);
  if (info->dlpi_name == nullptr || info->dlpi_name[0] == '\0') return 0;
  const char* base = std::strrchr(info->dlpi_name, '/');
  base = base ? base + 1 : info->dlpi_name;
  if (std::strncmp(base, c->prefix, std::strlen(c->prefix)) != 0) return 0;
  void* h = ::dlopen(info->dlpi_name, RTLD_LAZY | RTLD_NOLOAD);
  if (h == nullptr) return 0;
  // libcudart.so.12 defines its symbols under the version "libcudart.so.12".
  void* p = ::dlvsym(h, c->name, base);
  if (p == nullptr) p = ::dlsym(h, c->name);
  ::dlclose(h);
  if (p != nullptr && p != c->self) {
    c->found = p;
    return 1;
  }
  return 0;
}

void* FindReal(const char* prefix, const char* name, void* self) {
  void* p = ::dlsym(RTLD_NEXT, name);
  if (p != nullptr && p != self) return p;
  FindCtx c{prefix, name, self, nullptr};
  ::dl_iterate_phdr(FindInObject, &c);
  return c.found;
}

// One real function, resolved on first use and kept.
template <typename Fn>
struct Real {
  const char* prefix;
  const char* name;
  std::atomic<void*> fn{nullptr};
  Fn Get(void* self) {
    void* p = fn.load(std::memory_order_acquire);
    if (p == nullptr) {
      p = FindReal(prefix, name, self);
      if (p != nullptr) fn.store(p, std::memory_order_release);
    }
    return reinterpret_cast<Fn>(p);
  }
};

using HostAllocFn = cudaError_t (*)(void**, size_t, unsigned int);
using MallocHostFn = cudaError_t (*)(void**, size_t);
using FreeHostFn = cudaError_t (*)(void*);
using GetDeviceFn = cudaError_t (*)(int*);
using CuHostAllocFn = CUresult (*)(void**, size_t, unsigned int);
using CuAllocHostFn = CUresult (*)(void**, size_t);
using CuAllocHostV1Fn = CUresult (*)(void**, unsigned int);
using CuFreeHostFn = CUresult (*)(void*);
using CuCtxGetDeviceFn = CUresult (*)(CUdevice*);
using CuGetProcFn = CUresult (*)(const char*, void**, int, cuuint64_t);
using CuGetProcV2Fn = CUresult (*)(const char*, void**, int, cuuint64_t, void*);
using GetEntryFn = cudaError_t (*)(const char*, void**, unsigned long long, void*);
using GetEntryByVersionFn = cudaError_t (*)(const char*, void**, unsigned int, unsigned long long,
                                            void*);

Real<HostAllocFn> real_cudaHostAlloc{"libcudart.so", "cudaHostAlloc"};
Real<MallocHostFn> real_cudaMallocHost{"libcudart.so", "cudaMallocHost"};
Real<FreeHostFn> real_cudaFreeHost{"libcudart.so", "cudaFreeHost"};
Real<GetDeviceFn> real_cudaGetDevice{"libcudart.so", "cudaGetDevice"};
Real<GetEntryFn> real_cudaGetDriverEntryPoint{"libcudart.so", "cudaGetDriverEntryPoint"};
Real<GetEntryFn> real_cudaGetDriverEntryPoint_ptsz{"libcudart.so", "cudaGetDriverEntryPoint_ptsz"};
Real<GetEntryByVersionFn> real_cudaGetDriverEntryPointByVersion{"libcudart.so",
                                                                "cudaGetDriverEntryPointByVersion"};
Real<GetEntryByVersionFn> real_cudaGetDriverEntryPointByVersion_ptsz{
    "libcudart.so", "cudaGetDriverEntryPointByVersion_ptsz"};
Real<CuHostAllocFn> real_cuMemHostAlloc{"libcuda.so", "cuMemHostAlloc"};
Real<CuAllocHostFn> real_cuMemAllocHost_v2{"libcuda.so", "cuMemAllocHost_v2"};
Real<CuAllocHostV1Fn> real_cuMemAllocHost{"libcuda.so", "cuMemAllocHost"};
Real<CuFreeHostFn> real_cuMemFreeHost{"libcuda.so", "cuMemFreeHost"};
Real<CuCtxGetDeviceFn> real_cuCtxGetDevice{"libcuda.so", "cuCtxGetDevice"};
Real<CuGetProcFn> real_cuGetProcAddress{"libcuda.so", "cuGetProcAddress"};
Real<CuGetProcV2Fn> real_cuGetProcAddress_v2{"libcuda.so", "cuGetProcAddress_v2"};

// ---- the served allocations ----

enum Cause { kNoDaemon, kRefused, kExhausted, kRegistration, kCauses };
const char* const kCauseText[kCauses] = {"no daemon", "the daemon refused",
                                         "the pool or quota is exhausted",
                                         "CUDA registration failed"};

uint64_t NowNs() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

struct Counters {
  uint64_t served = 0;
  uint64_t served_bytes = 0;
  uint64_t fallbacks = 0;
  uint64_t freed = 0;
};

class Server {
 public:
  // A lease of `size` bytes near `device`, registered there; nullptr means
  // "use the real call" (the cause was logged once).
  void* Serve(uint64_t size, int device, const char* call) EXCLUDES(mu_) {
    Inside inside;
    cxlpool::MutexLock l(mu_);
    if (!client_.connected()) {
      uint64_t now = NowNs();
      if (now < next_connect_ns_) return Fallback();
      cxlpool::ClientResult<cxlpool::Client> c = cxlpool::Client::Connect();
      if (!c.ok()) {
        next_connect_ns_ = now + 1000000000ull;
        LogOnce(kNoDaemon, call, size, c.status().ToString());
        return Fallback();
      }
      client_ = std::move(*c);
      if (!said_serving_) {
        said_serving_ = true;
        Log("serving pinned allocations of %llu bytes and more from cxlpool (daemon %s)",
            static_cast<unsigned long long>(Cfg().min_bytes), client_.server_version().c_str());
      }
    }
    cxlpool::AllocOptions o;
    o.size_bytes = size;
    o.near_gpu = device;
    o.label = std::string("preload:") + call;
    o.long_term_pin = true;  // registered with CUDA below
    // A daemon that does not see this GPU (no NVML in its namespace) still
    // serves, placed without the hint; registration is on `device` anyway.
    if (device < kMaxDevices && unknown_gpu_[device]) o.near_gpu = -1;
    cxlpool::ClientResult<cxlpool::Lease> lease = client_.Allocate(o);
    if (!lease.ok() && lease.status().code() == cxlpool::ErrorCode::kNotFound && o.near_gpu >= 0) {
      if (device < kMaxDevices) unknown_gpu_[device] = true;
      Log("the daemon does not know GPU %d (%s): its leases are placed without that hint", device,
          lease.status().message().c_str());
      o.near_gpu = -1;
      lease = client_.Allocate(o);
    }
    if (!lease.ok()) {
      cxlpool::ClientStatus s = lease.status();
      Cause cause = kRefused;
      if (s.code() == cxlpool::ErrorCode::kResourceExhausted) cause = kExhausted;
      if (s.code() == cxlpool::ErrorCode::kUnavailable) {
        cause = kNoDaemon;
        client_ = cxlpool::Client();  // reconnect on a later call
        next_connect_ns_ = NowNs() + 1000000000ull;
      }
      LogOnce(cause, call, size, s.ToString());
      return Fallback();
    }
    // Registered on the calling thread's device (PORTABLE: every context
    // sees it pinned, as with cudaHostAlloc).
    if (cxlpool::ClientStatus r = lease->CudaRegister(device); !r.ok()) {
      LogOnce(kRegistration, call, size, r.ToString());
      (void)lease->Release();
      return Fallback();
    }
    void* p = lease->data();
    ++counters_.served;
    counters_.served_bytes += size;
    leases_.emplace(p, std::move(*lease));
    return p;
  }

  // True when `p` was served here (and is now released).
  bool Free(void* p) EXCLUDES(mu_) {
    if (p == nullptr) return false;
    Inside inside;
    cxlpool::Lease lease;
    {
      cxlpool::MutexLock l(mu_);
      auto it = leases_.find(p);
      if (it == leases_.end()) return false;
      lease = std::move(it->second);
      leases_.erase(it);
      ++counters_.freed;
    }
    (void)lease.Release();
    return true;
  }

  Counters counters() EXCLUDES(mu_) {
    cxlpool::MutexLock l(mu_);
    return counters_;
  }

 private:
  void* Fallback() REQUIRES(mu_) {
    ++counters_.fallbacks;
    return nullptr;
  }
  void LogOnce(Cause c, const char* call, uint64_t size, const std::string& detail) REQUIRES(mu_) {
    if (logged_[c]) return;
    logged_[c] = true;
    Log("%s(%llu bytes) falls back to CUDA: %s (%s); said once for this cause", call,
        static_cast<unsigned long long>(size), kCauseText[c], detail.c_str());
  }

  static constexpr int kMaxDevices = 64;
  // Taken only by the CUDA entry points, never from a malloc or fork hook.
  cxlpool::Mutex mu_;
  cxlpool::Client client_ GUARDED_BY(mu_);
  bool unknown_gpu_[kMaxDevices] GUARDED_BY(mu_) = {};
  uint64_t next_connect_ns_ GUARDED_BY(mu_) = 0;
  bool said_serving_ GUARDED_BY(mu_) = false;
  bool logged_[kCauses] GUARDED_BY(mu_) = {};
  std::unordered_map<void*, cxlpool::Lease> leases_ GUARDED_BY(mu_);
  Counters counters_ GUARDED_BY(mu_);
};

// Never destroyed: CUDA programs free pinned memory from atexit handlers
// and static destructors, after this library's own would have run. The
// daemon takes back whatever is still leased when the process exits.
Server& TheServer() {
  static Server* s = new Server;
  return *s;
}

bool Wanted(size_t size) { return t_depth == 0 && Cfg().enabled && size >= Cfg().min_bytes; }

int RuntimeDevice(void* self) {
  GetDeviceFn get = real_cudaGetDevice.Get(self);
  if (get == nullptr) return -1;
  Inside inside;
  int d = -1;
  if (get(&d) != kCudaSuccess) return -1;
  return d;
}

int DriverDevice(void* self) {
  CuCtxGetDeviceFn get = real_cuCtxGetDevice.Get(self);
  if (get == nullptr) return -1;
  Inside inside;
  CUdevice d = -1;
  if (get(&d) != 0) return -1;
  return d;
}

}  // namespace

// ---- runtime API ----

PRELOAD_EXPORT cudaError_t cudaHostAlloc(void** p, size_t size, unsigned int flags) {
  auto self = reinterpret_cast<void*>(&cudaHostAlloc);
  if (p != nullptr && Wanted(size) && (flags & kCudaHostAllocWriteCombined) == 0) {
    int dev = RuntimeDevice(self);
    if (dev >= 0) {
      if (void* q = TheServer().Serve(size, dev, "cudaHostAlloc")) {
        *p = q;
        return kCudaSuccess;
      }
    }
  }
  HostAllocFn real = real_cudaHostAlloc.Get(self);
  if (real == nullptr) return kCudaErrorInitializationError;
  Inside inside;
  return real(p, size, flags);
}

PRELOAD_EXPORT cudaError_t cudaMallocHost(void** p, size_t size) {
  auto self = reinterpret_cast<void*>(&cudaMallocHost);
  if (p != nullptr && Wanted(size)) {
    int dev = RuntimeDevice(self);
    if (dev >= 0) {
      if (void* q = TheServer().Serve(size, dev, "cudaMallocHost")) {
        *p = q;
        return kCudaSuccess;
      }
    }
  }
  MallocHostFn real = real_cudaMallocHost.Get(self);
  if (real == nullptr) return kCudaErrorInitializationError;
  Inside inside;
  return real(p, size);
}

PRELOAD_EXPORT cudaError_t cudaFreeHost(void* p) {
  if (t_depth == 0 && TheServer().Free(p)) return kCudaSuccess;
  FreeHostFn real = real_cudaFreeHost.Get(reinterpret_cast<void*>(&cudaFreeHost));
  if (real == nullptr) return kCudaErrorInitializationError;
  Inside inside;
  return real(p);
}

// ---- driver API ----

PRELOAD_EXPORT CUresult cuMemHostAlloc(void** pp, size_t size, unsigned int flags) {
  auto self = reinterpret_cast<void*>(&cuMemHostAlloc);
  if (pp != nullptr && Wanted(size) && (flags & kCuMemHostAllocWriteCombined) == 0) {
    int dev = DriverDevice(self);
    if (dev >= 0) {
      if (void* q = TheServer().Serve(size, dev, "cuMemHostAlloc")) {
        *pp = q;
        return 0;
      }
    }
  }
  CuHostAllocFn real = real_cuMemHostAlloc.Get(self);
  if (real == nullptr) return kCudaErrorNotInitialized;
  Inside inside;
  return real(pp, size, flags);
}

PRELOAD_EXPORT CUresult cuMemAllocHost_v2(void** pp, size_t size) {
  auto self = reinterpret_cast<void*>(&cuMemAllocHost_v2);
  if (pp != nullptr && Wanted(size)) {
    int dev = DriverDevice(self);
    if (dev >= 0) {
      if (void* q = TheServer().Serve(size, dev, "cuMemAllocHost")) {
        *pp = q;
        return 0;
      }
    }
  }
  CuAllocHostFn real = real_cuMemAllocHost_v2.Get(self);
  if (real == nullptr) return kCudaErrorNotInitialized;
  Inside inside;
  return real(pp, size);
}

// The pre-3.2 entry point (32-bit size), still exported by libcuda.so.1.
PRELOAD_EXPORT CUresult cuMemAllocHost(void** pp, unsigned int size) {
  auto self = reinterpret_cast<void*>(&cuMemAllocHost);
  if (pp != nullptr && Wanted(size)) {
    int dev = DriverDevice(self);
    if (dev >= 0) {
      if (void* q = TheServer().Serve(size, dev, "cuMemAllocHost")) {
        *pp = q;
        return 0;
      }
    }
  }
  CuAllocHostV1Fn real = real_cuMemAllocHost.Get(self);
  if (real == nullptr) return kCudaErrorNotInitialized;
  Inside inside;
  return real(pp, size);
}

PRELOAD_EXPORT CUresult cuMemFreeHost(void* p) {
  if (t_depth == 0 && TheServer().Free(p)) return 0;
  CuFreeHostFn real = real_cuMemFreeHost.Get(reinterpret_cast<void*>(&cuMemFreeHost));
  if (real == nullptr) return kCudaErrorNotInitialized;
  Inside inside;
  return real(p);
}

// ---- entry-point lookups: hand out this library's versions ----

namespace {

// Our function for a driver symbol a lookup asked for, else nullptr.
// cudaVersion selects the ABI as the driver does: cuMemAllocHost means the
// _v2 (size_t) entry point from CUDA 3.2 on.
void* Substitute(const char* symbol, int cuda_version) {
  if (symbol == nullptr) return nullptr;
  if (std::strcmp(symbol, "cuMemHostAlloc") == 0) return reinterpret_cast<void*>(&cuMemHostAlloc);
  if (std::strcmp(symbol, "cuMemFreeHost") == 0) return reinterpret_cast<void*>(&cuMemFreeHost);
  if (std::strcmp(symbol, "cuMemAllocHost") == 0) {
    return cuda_version >= 3020 || cuda_version == 0 ? reinterpret_cast<void*>(&cuMemAllocHost_v2)
                                                     : reinterpret_cast<void*>(&cuMemAllocHost);
  }
  if (std::strcmp(symbol, "cuMemAllocHost_v2") == 0) {
    return reinterpret_cast<void*>(&cuMemAllocHost_v2);
  }
  return nullptr;
}

void MaybeSubstitute(int rc, const char* symbol, void** pfn, int cuda_version) {
  if (rc != 0 || pfn == nullptr || *pfn == nullptr) return;
  if (void* ours = Substitute(symbol, cuda_version)) *pfn = ours;
}

}  // namespace

PRELOAD_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int cuda_version,
                                         cuuint64_t flags) {
  CuGetProcFn real = real_cuGetProcAddress.Get(reinterpret_cast<void*>(&cuGetProcAddress));
  if (real == nullptr) return kCudaErrorNotInitialized;
  CUresult rc;
  {
    Inside inside;
    rc = real(symbol, pfn, cuda_version, flags);
  }
  MaybeSubstitute(rc, symbol, pfn, cuda_version);
  return rc;
}

PRELOAD_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cuda_version,
                                            cuuint64_t flags, void* status) {
  CuGetProcV2Fn real = real_cuGetProcAddress_v2.Get(reinterpret_cast<void*>(&cuGetProcAddress_v2));
  if (real == nullptr) return kCudaErrorNotInitialized;
  CUresult rc;
  {
    Inside inside;
    rc = real(symbol, pfn, cuda_version, flags, status);
  }
  MaybeSubstitute(rc, symbol, pfn, cuda_version);
  return rc;
}

namespace {

cudaError_t EntryPoint(Real<GetEntryFn>& r, void* self, const char* symbol, void** fp,
                       unsigned long long flags, void* status) {
  GetEntryFn real = r.Get(self);
  if (real == nullptr) return kCudaErrorInitializationError;
  cudaError_t rc;
  {
    Inside inside;
    rc = real(symbol, fp, flags, status);
  }
  MaybeSubstitute(rc, symbol, fp, 0);
  return rc;
}

cudaError_t EntryPointByVersion(Real<GetEntryByVersionFn>& r, void* self, const char* symbol,
                                void** fp, unsigned int version, unsigned long long flags,
                                void* status) {
  GetEntryByVersionFn real = r.Get(self);
  if (real == nullptr) return kCudaErrorInitializationError;
  cudaError_t rc;
  {
    Inside inside;
    rc = real(symbol, fp, version, flags, status);
  }
  MaybeSubstitute(rc, symbol, fp, static_cast<int>(version));
  return rc;
}

}  // namespace

PRELOAD_EXPORT cudaError_t cudaGetDriverEntryPoint(const char* symbol, void** fp,
                                                   unsigned long long flags, void* status) {
  return EntryPoint(real_cudaGetDriverEntryPoint, reinterpret_cast<void*>(&cudaGetDriverEntryPoint),
                    symbol, fp, flags, status);
}

PRELOAD_EXPORT cudaError_t cudaGetDriverEntryPoint_ptsz(const char* symbol, void** fp,
                                                        unsigned long long flags, void* status) {
  return EntryPoint(real_cudaGetDriverEntryPoint_ptsz,
                    reinterpret_cast<void*>(&cudaGetDriverEntryPoint_ptsz), symbol, fp, flags,
                    status);
}

PRELOAD_EXPORT cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fp,
                                                            unsigned int version,
                                                            unsigned long long flags,
                                                            void* status) {
  return EntryPointByVersion(real_cudaGetDriverEntryPointByVersion,
                             reinterpret_cast<void*>(&cudaGetDriverEntryPointByVersion), symbol, fp,
                             version, flags, status);
}

PRELOAD_EXPORT cudaError_t cudaGetDriverEntryPointByVersion_ptsz(const char* symbol, void** fp,
                                                                 unsigned int version,
                                                                 unsigned long long flags,
                                                                 void* status) {
  return EntryPointByVersion(real_cudaGetDriverEntryPointByVersion_ptsz,
                             reinterpret_cast<void*>(&cudaGetDriverEntryPointByVersion_ptsz),
                             symbol, fp, version, flags, status);
}

// ---- introspection (tests, the GPU check) ----

// served allocations, their requested bytes, fallbacks to the real call,
// served pointers freed. `out` holds 4 values.
PRELOAD_EXPORT void cxlpool_preload_counters(uint64_t* out) {
  if (out == nullptr) return;
  Counters c = TheServer().counters();
  out[0] = c.served;
  out[1] = c.served_bytes;
  out[2] = c.fallbacks;
  out[3] = c.freed;
}
