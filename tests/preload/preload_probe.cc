// The program the preload tests run under LD_PRELOAD=libcxlpool_preload.so:
// an unmodified "CUDA program" linked against the fake runtime
// (libcudart.so.12, versioned symbols) and the fake driver (libcuda.so.1).
// argv[1] picks a scenario; it prints key=value lines the test reads.
//   runtime    cudaHostAlloc / cudaMallocHost above and below the threshold,
//              a write-combined request, frees, a foreign pointer's free
//   driver     cuMemHostAlloc, cuMemAllocHost(_v2), the same through
//              cuGetProcAddress_v2 and cudaGetDriverEntryPoint, frees
//   repeat N   N cudaHostAlloc of 4 MiB held together, then freed
// $PROBE_LEASES_CMD, when set, is run while the allocations are held and its
// output printed on one line as leases=...
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern "C" {
int cudaHostAlloc(void** p, size_t size, unsigned int flags);
int cudaMallocHost(void** p, size_t size);
int cudaFreeHost(void* p);
int cudaGetDriverEntryPoint(const char* symbol, void** fp, unsigned long long flags, void* status);
int fake_cudart_live_allocs();
int fake_cudart_foreign_frees();

struct CUctx_st;
int cuInit(unsigned int flags);
int cuDevicePrimaryCtxRetain(CUctx_st** ctx, int dev);
int cuCtxPushCurrent_v2(CUctx_st* ctx);
int cuMemHostAlloc(void** pp, size_t bytes, unsigned int flags);
int cuMemAllocHost_v2(void** pp, size_t bytes);
int cuMemFreeHost(void* p);
int cuGetProcAddress_v2(const char* symbol, void** pfn, int version, unsigned long long flags,
                        void* status);
uint64_t fake_cuda_registered_bytes();
int fake_cuda_host_allocs();
}

namespace {

constexpr size_t kBig = (4u << 20) + 100;  // not page aligned: sizes are exact

void Counters() {
  auto fn = reinterpret_cast<void (*)(uint64_t*)>(dlsym(RTLD_DEFAULT, "cxlpool_preload_counters"));
  if (fn == nullptr) {
    std::printf("preloaded=0\n");
    return;
  }
  uint64_t c[4] = {};
  fn(c);
  std::printf("preloaded=1\nserved=%llu\nserved_bytes=%llu\nfallbacks=%llu\nfreed=%llu\n",
              (unsigned long long)c[0], (unsigned long long)c[1], (unsigned long long)c[2],
              (unsigned long long)c[3]);
}

void Leases() {
  const char* cmd = std::getenv("PROBE_LEASES_CMD");
  if (cmd == nullptr) return;
  std::string out;
  if (FILE* p = ::popen(cmd, "r")) {
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
    ::pclose(p);
  }
  for (char& ch : out) {
    if (ch == '\n') ch = ' ';
  }
  std::printf("leases=%s\n", out.c_str());
}

void Touch(void* p, size_t n) {
  std::memset(p, 0x5a, n);
  if (static_cast<unsigned char*>(p)[n - 1] != 0x5a) std::printf("touch_failed=1\n");
}

int Runtime() {
  void* big = nullptr;
  void* small = nullptr;
  void* wc = nullptr;
  std::printf("big_rc=%d\n", cudaHostAlloc(&big, kBig, 0x02 /* cudaHostAllocMapped */));
  Touch(big, kBig);
  std::printf("live_after_big=%d\n", fake_cudart_live_allocs());
  std::printf("registered=%llu\n", (unsigned long long)fake_cuda_registered_bytes());
  std::printf("small_rc=%d\n", cudaMallocHost(&small, 64 << 10));
  Touch(small, 64 << 10);
  std::printf("wc_rc=%d\n", cudaHostAlloc(&wc, kBig, 0x04 /* cudaHostAllocWriteCombined */));
  std::printf("live_after_all=%d\n", fake_cudart_live_allocs());
  Leases();
  std::printf("free_big=%d\n", cudaFreeHost(big));
  std::printf("free_small=%d\n", cudaFreeHost(small));
  std::printf("free_wc=%d\n", cudaFreeHost(wc));
  static char foreign[64];
  std::printf("free_foreign=%d\n", cudaFreeHost(foreign));
  std::printf("foreign_frees=%d\n", fake_cudart_foreign_frees());
  std::printf("live_end=%d\nregistered_end=%llu\n", fake_cudart_live_allocs(),
              (unsigned long long)fake_cuda_registered_bytes());
  Counters();
  return 0;
}

int Driver() {
  CUctx_st* ctx = nullptr;
  if (cuInit(0) != 0 || cuDevicePrimaryCtxRetain(&ctx, 0) != 0 || cuCtxPushCurrent_v2(ctx) != 0) {
    std::printf("context=failed\n");
    return 1;
  }
  void* a = nullptr;
  void* b = nullptr;
  void* c = nullptr;
  void* d = nullptr;
  void* small = nullptr;
  std::printf("hostalloc_rc=%d\n", cuMemHostAlloc(&a, kBig, 0x02));
  std::printf("allochost_rc=%d\n", cuMemAllocHost_v2(&b, kBig));
  using HostAllocFn = int (*)(void**, size_t, unsigned int);
  using AllocHostFn = int (*)(void**, size_t);
  void* fn = nullptr;
  std::printf("getproc_rc=%d\n", cuGetProcAddress_v2("cuMemHostAlloc", &fn, 12000, 0, nullptr));
  std::printf("getproc_is_export=%d\n", fn == reinterpret_cast<void*>(&cuMemHostAlloc));
  std::printf("getproc_alloc_rc=%d\n", fn ? reinterpret_cast<HostAllocFn>(fn)(&c, kBig, 0) : -1);
  void* fn2 = nullptr;
  std::printf("entry_rc=%d\n", cudaGetDriverEntryPoint("cuMemAllocHost", &fn2, 0, nullptr));
  std::printf("entry_alloc_rc=%d\n", fn2 ? reinterpret_cast<AllocHostFn>(fn2)(&d, kBig) : -1);
  std::printf("small_rc=%d\n", cuMemHostAlloc(&small, 4096, 0));
  for (void* p : {a, b, c, d}) {
    if (p != nullptr) Touch(p, kBig);
  }
  std::printf("driver_allocs=%d\n", fake_cuda_host_allocs());
  Leases();
  int frees = 0;
  for (void* p : {a, b, c, d, small}) frees += cuMemFreeHost(p) == 0;
  static char foreign[64];
  std::printf("frees_ok=%d\nfree_foreign=%d\n", frees, cuMemFreeHost(foreign));
  std::printf("driver_allocs_end=%d\nregistered_end=%llu\n", fake_cuda_host_allocs(),
              (unsigned long long)fake_cuda_registered_bytes());
  Counters();
  return 0;
}

int Repeat(int n) {
  std::vector<void*> held;
  for (int i = 0; i < n; ++i) {
    void* p = nullptr;
    int rc = cudaHostAlloc(&p, 4u << 20, 0);
    std::printf("alloc%d_rc=%d\n", i, rc);
    if (rc == 0) {
      Touch(p, 4u << 20);
      held.push_back(p);
    }
  }
  std::printf("live=%d\n", fake_cudart_live_allocs());
  Leases();
  int frees = 0;
  for (void* p : held) frees += cudaFreeHost(p) == 0;
  std::printf("frees_ok=%d\nlive_end=%d\n", frees, fake_cudart_live_allocs());
  Counters();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IONBF, 0);
  std::string s = argc > 1 ? argv[1] : "";
  if (s == "runtime") return Runtime();
  if (s == "driver") return Driver();
  if (s == "repeat" && argc > 2) return Repeat(std::atoi(argv[2]));
  std::fprintf(stderr, "usage: preload_probe runtime|driver|repeat N\n");
  return 2;
}
