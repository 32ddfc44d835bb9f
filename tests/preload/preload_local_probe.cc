// Loads $PROBE_USER_LIB (preload_user.cc) with dlopen(RTLD_LOCAL) and runs
// it; this program itself links no CUDA library. Prints what the library
// prints and the preload shim's counters.
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

int main() {
  std::setvbuf(stdout, nullptr, _IONBF, 0);
  const char* lib = std::getenv("PROBE_USER_LIB");
  void* h = lib ? ::dlopen(lib, RTLD_NOW | RTLD_LOCAL) : nullptr;
  if (h == nullptr) {
    std::printf("dlopen=%s\n", ::dlerror());
    return 1;
  }
  std::printf("runtime_global=%d\n", ::dlsym(RTLD_DEFAULT, "fake_cudart_live_allocs") != nullptr);
  auto run = reinterpret_cast<int (*)()>(::dlsym(h, "preload_user_run"));
  if (run == nullptr || run() != 0) return 1;
  auto counters =
      reinterpret_cast<void (*)(uint64_t*)>(::dlsym(RTLD_DEFAULT, "cxlpool_preload_counters"));
  if (counters != nullptr) {
    uint64_t c[4] = {};
    counters(c);
    std::printf("served=%llu\nfallbacks=%llu\nfreed=%llu\n", (unsigned long long)c[0],
                (unsigned long long)c[2], (unsigned long long)c[3]);
  }
  return 0;
}
