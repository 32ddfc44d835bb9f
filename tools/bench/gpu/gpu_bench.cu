// gpu_bench.cu: the GPU mode of cxlpool-bench (issue 5), compiled and run by
// scripts/gpu-check.sh with nvcc, never by CMake. Each figure is measured
// next to its CUDA baseline in the same run and printed as a ratio:
//   G1/G2  H2D and D2H bandwidth from a registered lease vs cudaMallocHost
//          of the same size (goal >= 0.98x);
//   G3     request-to-registered 8 GiB lease vs cudaMallocHost(8 GiB)
//          (goal <= 0.5x);
//   G4     a kernel reading the lease through its device pointer (zero-copy)
//          vs the same read of a mapped cudaHostAlloc buffer (goal >= 0.95x).
//
//   gpu_bench --socket PATH [--bw-mib 1024] [--big-gib 8] [--device 0]
//
// Exit: 0 ran (goals met or not), 77 no GPU (says "no GPU" and why), 1 error.
// Single-threaded.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cxlpool/client.hpp"

namespace {

constexpr unsigned long long kMiB = 1ull << 20;
constexpr unsigned long long kGiB = 1ull << 30;

struct Row {
  std::string metric;
  double value, baseline;
  std::string unit, op;
  double goal;
  std::string note;
};
std::vector<Row> g_rows;

#define CUDA_OR_DIE(expr)                                                         \
  do {                                                                            \
    cudaError_t e_ = (expr);                                                      \
    if (e_ != cudaSuccess) {                                                      \
      std::fprintf(stderr, "gpu_bench: %s: %s\n", #expr, cudaGetErrorString(e_)); \
      std::exit(1);                                                               \
    }                                                                             \
  } while (0)

double NowMs() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Best-of-reps bandwidth of cudaMemcpy in GB/s.
double CopyGBs(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, int reps) {
  cudaEvent_t a, b;
  CUDA_OR_DIE(cudaEventCreate(&a));
  CUDA_OR_DIE(cudaEventCreate(&b));
  double best = 0;
  for (int i = 0; i < reps; ++i) {
    CUDA_OR_DIE(cudaEventRecord(a));
    CUDA_OR_DIE(cudaMemcpyAsync(dst, src, bytes, kind));
    CUDA_OR_DIE(cudaEventRecord(b));
    CUDA_OR_DIE(cudaEventSynchronize(b));
    float ms = 0;
    CUDA_OR_DIE(cudaEventElapsedTime(&ms, a, b));
    best = std::max(best, static_cast<double>(bytes) / (ms * 1e6));
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return best;
}

__global__ void SumKernel(const ulonglong2* __restrict__ p, size_t n, unsigned long long* out) {
  unsigned long long acc = 0;
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    ulonglong2 v = p[i];
    acc += v.x ^ v.y;
  }
  atomicAdd(out, acc);
}

// Best-of-reps zero-copy read bandwidth in GB/s through a device pointer.
double ZeroCopyGBs(const void* dptr, size_t bytes, int reps, unsigned long long* dsum) {
  cudaEvent_t a, b;
  CUDA_OR_DIE(cudaEventCreate(&a));
  CUDA_OR_DIE(cudaEventCreate(&b));
  int sms = 0;
  CUDA_OR_DIE(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  double best = 0;
  for (int i = 0; i < reps; ++i) {
    CUDA_OR_DIE(cudaEventRecord(a));
    SumKernel<<<sms * 8, 512>>>(static_cast<const ulonglong2*>(dptr), bytes / 16, dsum);
    CUDA_OR_DIE(cudaEventRecord(b));
    CUDA_OR_DIE(cudaEventSynchronize(b));
    CUDA_OR_DIE(cudaGetLastError());
    float ms = 0;
    CUDA_OR_DIE(cudaEventElapsedTime(&ms, a, b));
    best = std::max(best, static_cast<double>(bytes) / (ms * 1e6));
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return best;
}

cxlpool::ClientResult<cxlpool::Lease> Lease(cxlpool::Client& c, unsigned long long size, int dev) {
  cxlpool::AllocOptions o;
  o.size_bytes = size;
  o.near_gpu = dev;
  o.cuda_register = true;
  o.label = "gpu_bench";
  return c.Allocate(o);
}

void Print() {
  std::printf("| metric | cxlpool | baseline | unit | ratio | goal | verdict |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (const Row& r : g_rows) {
    double ratio = r.baseline > 0 ? r.value / r.baseline : 0;
    bool met = r.op == "le" ? ratio <= r.goal : ratio >= r.goal;
    std::printf("| %s | %.3g | %.3g | %s | %.3fx | %s %.2fx | %s |\n", r.metric.c_str(), r.value,
                r.baseline, r.unit.c_str(), ratio, r.op == "le" ? "<=" : ">=", r.goal,
                met ? "met" : "NOT met");
  }
  for (const Row& r : g_rows) {
    if (!r.note.empty()) std::printf("- %s: %s\n", r.metric.c_str(), r.note.c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string socket;
  unsigned long long bw_bytes = 1024 * kMiB, big = 8 * kGiB;
  int dev = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--socket" && i + 1 < argc) {
      socket = argv[++i];
    } else if (a == "--bw-mib" && i + 1 < argc) {
      bw_bytes = std::strtoull(argv[++i], nullptr, 10) * kMiB;
    } else if (a == "--big-gib" && i + 1 < argc) {
      big = std::strtoull(argv[++i], nullptr, 10) * kGiB;
    } else if (a == "--device" && i + 1 < argc) {
      dev = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr,
                   "usage: gpu_bench --socket PATH [--bw-mib N] [--big-gib N] [--device N]\n");
      return 1;
    }
  }
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count <= dev) {
    std::fprintf(stderr, "gpu_bench: no GPU: %s\n",
                 e != cudaSuccess ? cudaGetErrorString(e) : "device index out of range");
    return 77;
  }
  CUDA_OR_DIE(cudaSetDevice(dev));
  CUDA_OR_DIE(cudaFree(nullptr));  // create the primary context the client registers into
  auto client = cxlpool::Client::Connect(socket);
  if (!client.ok()) {
    std::fprintf(stderr, "gpu_bench: connect %s: %s\n", socket.c_str(),
                 client.status().ToString().c_str());
    return 1;
  }

  // G1/G2: copy bandwidth.
  {
    auto lease = Lease(*client, bw_bytes, dev);
    if (!lease.ok()) {
      std::fprintf(stderr, "gpu_bench: lease: %s\n", lease.status().ToString().c_str());
      return 1;
    }
    auto dptr = lease->device_ptr();
    if (!dptr.ok()) {
      std::fprintf(stderr, "gpu_bench: lease not registered with CUDA: %s\n",
                   dptr.status().ToString().c_str());
      return 1;
    }
    void* pinned = nullptr;
    void* devbuf = nullptr;
    CUDA_OR_DIE(cudaMallocHost(&pinned, bw_bytes));
    CUDA_OR_DIE(cudaMalloc(&devbuf, bw_bytes));
    std::memset(pinned, 1, bw_bytes);
    std::memset(lease->data(), 1, bw_bytes);
    CopyGBs(devbuf, pinned, bw_bytes, cudaMemcpyHostToDevice, 1);  // warm-up
    double h2d_l = CopyGBs(devbuf, lease->data(), bw_bytes, cudaMemcpyHostToDevice, 10);
    double h2d_p = CopyGBs(devbuf, pinned, bw_bytes, cudaMemcpyHostToDevice, 10);
    double d2h_l = CopyGBs(lease->data(), devbuf, bw_bytes, cudaMemcpyDeviceToHost, 10);
    double d2h_p = CopyGBs(pinned, devbuf, bw_bytes, cudaMemcpyDeviceToHost, 10);
    std::string note = "best of 10, " + std::to_string(bw_bytes / kMiB) + " MiB, lease on node " +
                       std::to_string(lease->numa_node()) + " (" + lease->info().backing + ")";
    g_rows.push_back({"H2D bandwidth", h2d_l, h2d_p, "GB/s", "ge", 0.98, note});
    g_rows.push_back({"D2H bandwidth", d2h_l, d2h_p, "GB/s", "ge", 0.98, ""});

    // G4: zero-copy read through the device pointer vs a mapped cudaHostAlloc.
    void* mapped = nullptr;
    void* mapped_d = nullptr;
    CUDA_OR_DIE(cudaHostAlloc(&mapped, bw_bytes, cudaHostAllocMapped));
    CUDA_OR_DIE(cudaHostGetDevicePointer(&mapped_d, mapped, 0));
    std::memset(mapped, 1, bw_bytes);
    unsigned long long* dsum = nullptr;
    CUDA_OR_DIE(cudaMalloc(&dsum, sizeof *dsum));
    ZeroCopyGBs(mapped_d, bw_bytes, 1, dsum);  // warm-up
    double zc_l = ZeroCopyGBs(reinterpret_cast<void*>(*dptr), bw_bytes, 5, dsum);
    double zc_m = ZeroCopyGBs(mapped_d, bw_bytes, 5, dsum);
    g_rows.push_back({"zero-copy kernel read", zc_l, zc_m, "GB/s", "ge", 0.95,
                      "vs cudaHostAlloc(cudaHostAllocMapped), best of 5"});
    CUDA_OR_DIE(cudaFree(dsum));
    CUDA_OR_DIE(cudaFreeHost(mapped));
    CUDA_OR_DIE(cudaFree(devbuf));
    CUDA_OR_DIE(cudaFreeHost(pinned));
    (void)lease->Release();
  }

  // G3: time to a registered big lease vs cudaMallocHost of the same size.
  {
    double t0 = NowMs();
    auto lease = Lease(*client, big, dev);
    double t1 = NowMs();
    bool registered = lease.ok() && lease->device_ptr().ok();
    if (!lease.ok() || !registered) {
      std::fprintf(stderr, "gpu_bench: %llu GiB lease: %s\n", big / kGiB,
                   lease.ok() ? lease->device_ptr().status().ToString().c_str()
                              : lease.status().ToString().c_str());
      return 1;
    }
    (void)lease->Release();
    void* pinned = nullptr;
    double t2 = NowMs();
    CUDA_OR_DIE(cudaMallocHost(&pinned, big));
    double t3 = NowMs();
    CUDA_OR_DIE(cudaFreeHost(pinned));
    g_rows.push_back({"registered " + std::to_string(big / kGiB) + " GiB ready", t1 - t0, t3 - t2,
                      "ms", "le", 0.5,
                      "request -> mapped + cuMemHostRegister'd lease vs cudaMallocHost"});
  }
  Print();
  return 0;
}
