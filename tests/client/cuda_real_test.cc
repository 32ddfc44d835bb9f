// CUDA registration against the real driver (libcuda.so.1): a 3 MiB
// anonymous mapping registered in 1 MiB chunks, each chunk's device pointer
// checked, contiguity reported (unified addressing makes it contiguous), and
// everything unregistered. Exits 77 without a driver or GPU. Label: gpu.
#include <sys/mman.h>

#include <cstdio>
#include <cstring>

#include "cuda_driver.h"

int main() {
  using namespace cxlpool;
  auto driver = cuda::CudaDriver::Load("libcuda.so.1");
  if (!driver.ok()) {
    std::fprintf(stderr, "no CUDA: %s: skipping\n", driver.status().ToString().c_str());
    return 77;
  }
  constexpr uint64_t kSize = 3u << 20;
  void* p = mmap(nullptr, kSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE,
                 -1, 0);
  if (p == MAP_FAILED) return 1;
  std::memset(p, 0x5a, kSize);
  auto reg = cuda::RegisterHostMemory(**driver, 0, p, kSize, 1u << 20);
  if (!reg.ok()) {
    std::fprintf(stderr, "register: %s\n", reg.status().ToString().c_str());
    return 1;
  }
  int rc = 0;
  if (reg->chunks().size() != 3) rc = 1;
  for (const auto& c : reg->chunks()) {
    std::printf("chunk offset=%llu length=%llu device_ptr=0x%llx\n",
                static_cast<unsigned long long>(c.offset),
                static_cast<unsigned long long>(c.length),
                static_cast<unsigned long long>(c.device_ptr));
    if (c.device_ptr == 0) rc = 1;
  }
  std::printf("contiguous=%d\n", reg->contiguous() ? 1 : 0);
  cxlpool::Status s = reg->Unregister();
  if (!s.ok()) {
    std::fprintf(stderr, "unregister: %s\n", s.ToString().c_str());
    rc = 1;
  }
  munmap(p, kSize);
  return rc;
}
