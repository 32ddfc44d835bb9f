// A library that uses the CUDA runtime, loaded by preload_local_probe with
// dlopen(RTLD_LOCAL) the way Python loads PyTorch's extension modules: the
// runtime (the fake libcudart.so.12) is then in this library's local scope
// only, so the preload shim's dlsym(RTLD_NEXT) cannot see it and it must
// find the real functions among the loaded objects.
#include <cstddef>
#include <cstdio>

extern "C" {
int cudaHostAlloc(void** p, size_t size, unsigned int flags);
int cudaFreeHost(void* p);
int fake_cudart_live_allocs();
int fake_cudart_foreign_frees();

__attribute__((visibility("default"))) int preload_user_run() {
  void* big = nullptr;
  void* small = nullptr;
  std::printf("big_rc=%d\n", cudaHostAlloc(&big, 4u << 20, 0));
  std::printf("small_rc=%d\n", cudaHostAlloc(&small, 4096, 0));
  std::printf("live=%d\n", fake_cudart_live_allocs());
  std::printf("free_big=%d\n", cudaFreeHost(big));
  std::printf("free_small=%d\n", cudaFreeHost(small));
  static char foreign[16];
  std::printf("free_foreign=%d\n", cudaFreeHost(foreign));
  std::printf("foreign_frees=%d\n", fake_cudart_foreign_frees());
  std::printf("live_end=%d\n", fake_cudart_live_allocs());
  return 0;
}
}
