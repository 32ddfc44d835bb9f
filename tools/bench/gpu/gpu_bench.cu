// gpu_bench.cu: the GPU mode of cxlpool-bench (issue 5), compiled and run by
// scripts/gpu-check.sh with nvcc, never by CMake. Each figure is measured
// next to its CUDA baseline in the same run and printed as a ratio:
//   G1/G2  H2D and D2H bandwidth from a registered lease vs cudaMallocHost
//          of the same size (goal >= 0.98x);
//   G3     request-to-registered 8 GiB lease vs cudaMallocHost(8 GiB)
//          (goal <= 0.5x), with its parts (grant + map, registration);
//   G4     a kernel reading the lease through its device pointer (zero-copy)
//          vs the same read of a mapped cudaHostAlloc buffer (goal >= 0.95x).
// Before timing anything it checks that the GPU sees the bytes the CPU
// wrote into the lease (a kernel's checksum through the device pointer, and
// an H2D + D2H round trip), and asks the kernel (move_pages) where the
// lease's pages are.
//
//   gpu_bench --socket PATH [--bw-mib 1024] [--big-gib 8] [--device 0]
//             [--hugetlb]
//
// Exit: 0 ran (goals met or not), 77 no GPU (says "no GPU" and why), 1 error
// (including a failed data check). Single-threaded.
#include <cuda_runtime.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "cxlpool/client.hpp"

namespace {

constexpr unsigned long long kMiB = 1ull << 20;
constexpr unsigned long long kGiB = 1ull << 30;

struct Row {
  std::string metric;
  double value, baseline;
  std::string unit, op;  // op: "le" or "ge"; "" for a row without a goal
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

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "gpu_bench: %s\n", what.c_str());
  std::exit(1);
}

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

void LaunchSum(const void* dptr, size_t bytes, unsigned long long* dsum) {
  static int sms = 0;
  if (sms == 0) CUDA_OR_DIE(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  SumKernel<<<sms * 8, 512>>>(static_cast<const ulonglong2*>(dptr), bytes / 16, dsum);
}

// Best-of-reps zero-copy read bandwidth in GB/s through a device pointer.
double ZeroCopyGBs(const void* dptr, size_t bytes, int reps, unsigned long long* dsum) {
  cudaEvent_t a, b;
  CUDA_OR_DIE(cudaEventCreate(&a));
  CUDA_OR_DIE(cudaEventCreate(&b));
  double best = 0;
  for (int i = 0; i < reps; ++i) {
    CUDA_OR_DIE(cudaEventRecord(a));
    LaunchSum(dptr, bytes, dsum);
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

// The GPU's checksum of [dptr, dptr+bytes) must equal the CPU's of host.
void CheckSum(const void* dptr, const void* host, size_t bytes, unsigned long long* dsum) {
  unsigned long long want = 0;
  const auto* h = static_cast<const unsigned long long*>(host);
  for (size_t i = 0; i + 1 < bytes / 8; i += 2) want += h[i] ^ h[i + 1];
  CUDA_OR_DIE(cudaMemset(dsum, 0, sizeof *dsum));
  LaunchSum(dptr, bytes, dsum);
  CUDA_OR_DIE(cudaGetLastError());
  unsigned long long got = 0;
  CUDA_OR_DIE(cudaMemcpy(&got, dsum, sizeof got, cudaMemcpyDeviceToHost));
  if (got != want) {
    Die("data check: the kernel's checksum through the lease's device pointer is " +
        std::to_string(got) + ", the CPU's " + std::to_string(want));
  }
}

// "node0=262144" for the pages of [p, p+bytes), one probe per 2 MiB, as the
// kernel reports them (move_pages with no target nodes).
std::string PageNodes(void* p, size_t bytes) {
  std::vector<void*> pages;
  for (size_t off = 0; off < bytes; off += 2 * kMiB) pages.push_back(static_cast<char*>(p) + off);
  std::vector<int> status(pages.size(), -1);
  long r = syscall(SYS_move_pages, 0, pages.size(), pages.data(), nullptr, status.data(), 0);
  if (r != 0) return std::string("move_pages failed: ") + std::strerror(errno);
  std::map<int, size_t> by;
  for (int s : status) ++by[s];
  std::string out;
  for (auto& [node, n] : by) {
    out += (out.empty() ? "" : " ") +
           (node >= 0 ? "node" + std::to_string(node) : "err" + std::to_string(-node)) + "=" +
           std::to_string(n);
  }
  return out + " (2 MiB probes)";
}

struct Opts {
  std::string socket;
  unsigned long long bw_bytes = 1024 * kMiB, big = 8 * kGiB;
  int dev = 0;
  bool hugetlb = false;
  bool daemon_sees_gpu = true;
};

cxlpool::ClientResult<cxlpool::Lease> Lease(cxlpool::Client& c, Opts& o, unsigned long long size,
                                            bool reg) {
  cxlpool::AllocOptions a;
  a.size_bytes = size;
  a.near_gpu = o.daemon_sees_gpu ? o.dev : -1;
  a.cuda_register = reg;
  a.hugetlb = o.hugetlb;
  a.label = "gpu_bench";
  auto l = c.Allocate(a);
  if (!l.ok() && o.daemon_sees_gpu && l.status().code() == cxlpool::ErrorCode::kNotFound) {
    // The daemon's topology has no such GPU (no NVML there): say so, and
    // go on with placement by node, registering on the same device.
    std::fprintf(stderr, "gpu_bench: WARNING: daemon: %s; leasing without near_gpu\n",
                 l.status().ToString().c_str());
    o.daemon_sees_gpu = false;
    a.near_gpu = -1;
    a.cuda_register = false;
    auto again = c.Allocate(a);
    if (again.ok() && reg) {
      cxlpool::ClientStatus s = again->CudaRegister(o.dev);
      if (!s.ok()) Die("register: " + s.ToString());
    }
    if (!again.ok())
      Die("lease of " + std::to_string(size) + " bytes: " + again.status().ToString());
    return again;
  }
  if (!l.ok()) Die("lease of " + std::to_string(size) + " bytes: " + l.status().ToString());
  return l;
}

std::string Describe(const cxlpool::Lease& l) {
  const cxlpool::LeaseInfo& i = l.info();
  return "node " + std::to_string(i.numa_node) + ", " + i.backing + ", page " +
         std::to_string(i.page_size / 1024) + " KiB, pages " + PageNodes(l.data(), l.size()) +
         "; " + i.placement_reason;
}

void Print() {
  std::printf("| metric | cxlpool | baseline | unit | ratio | goal | verdict |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (const Row& r : g_rows) {
    double ratio = r.baseline > 0 ? r.value / r.baseline : 0;
    if (r.op.empty()) {
      std::printf("| %s | %.4g | %.4g | %s | %.3fx | - | - |\n", r.metric.c_str(), r.value,
                  r.baseline, r.unit.c_str(), ratio);
      continue;
    }
    bool met = r.op == "le" ? ratio <= r.goal : ratio >= r.goal;
    std::printf("| %s | %.4g | %.4g | %s | %.3fx | %s %.2fx | %s |\n", r.metric.c_str(), r.value,
                r.baseline, r.unit.c_str(), ratio, r.op == "le" ? "<=" : ">=", r.goal,
                met ? "met" : "NOT met");
  }
  for (const Row& r : g_rows) {
    if (!r.note.empty()) std::printf("- %s: %s\n", r.metric.c_str(), r.note.c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  Opts o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--socket" && i + 1 < argc) {
      o.socket = argv[++i];
    } else if (a == "--bw-mib" && i + 1 < argc) {
      o.bw_bytes = std::strtoull(argv[++i], nullptr, 10) * kMiB;
    } else if (a == "--big-gib" && i + 1 < argc) {
      o.big = std::strtoull(argv[++i], nullptr, 10) * kGiB;
    } else if (a == "--device" && i + 1 < argc) {
      o.dev = std::atoi(argv[++i]);
    } else if (a == "--hugetlb") {
      o.hugetlb = true;
    } else {
      std::fprintf(stderr,
                   "usage: gpu_bench --socket PATH [--bw-mib N] [--big-gib N] [--device N] "
                   "[--hugetlb]\n");
      return 1;
    }
  }
  if (o.bw_bytes == 0 || o.big == 0 || o.bw_bytes % 16 != 0) Die("sizes must be > 0");
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count <= o.dev) {
    std::fprintf(stderr, "gpu_bench: no GPU: %s\n",
                 e != cudaSuccess ? cudaGetErrorString(e) : "device index out of range");
    return 77;
  }
  cudaDeviceProp prop{};
  CUDA_OR_DIE(cudaGetDeviceProperties(&prop, o.dev));
  int drv = 0;
  CUDA_OR_DIE(cudaDriverGetVersion(&drv));
  std::printf("gpu_bench: device %d: %s, PCI %04x:%02x:%02x, driver API %d\n", o.dev, prop.name,
              prop.pciDomainID, prop.pciBusID, prop.pciDeviceID, drv);
  CUDA_OR_DIE(cudaSetDevice(o.dev));
  CUDA_OR_DIE(cudaFree(nullptr));  // create the primary context the client registers into
  auto client = cxlpool::Client::Connect(o.socket);
  if (!client.ok()) Die("connect " + o.socket + ": " + client.status().ToString());

  unsigned long long* dsum = nullptr;
  CUDA_OR_DIE(cudaMalloc(&dsum, sizeof *dsum));

  // G1/G2/G4 on one registered lease of bw_bytes.
  {
    auto lease = Lease(*client, o, o.bw_bytes, true);
    auto dptr = lease->device_ptr();
    if (!dptr.ok()) Die("lease not registered with CUDA: " + dptr.status().ToString());
    std::printf("gpu_bench: bandwidth lease: %s\n", Describe(*lease).c_str());

    // The data check: CPU writes, GPU reads through the device pointer and
    // through a copy, and the copy comes back unchanged.
    auto* words = static_cast<unsigned long long*>(lease->data());
    for (size_t i = 0; i < o.bw_bytes / 8; ++i) words[i] = i * 0x9e3779b97f4a7c15ull + 1;
    CheckSum(reinterpret_cast<void*>(*dptr), lease->data(), o.bw_bytes, dsum);
    void* pinned = nullptr;
    void* devbuf = nullptr;
    CUDA_OR_DIE(cudaMallocHost(&pinned, o.bw_bytes));
    CUDA_OR_DIE(cudaMalloc(&devbuf, o.bw_bytes));
    CUDA_OR_DIE(cudaMemcpy(devbuf, lease->data(), o.bw_bytes, cudaMemcpyHostToDevice));
    std::memset(pinned, 0, o.bw_bytes);
    CUDA_OR_DIE(cudaMemcpy(pinned, devbuf, o.bw_bytes, cudaMemcpyDeviceToHost));
    if (std::memcmp(pinned, lease->data(), o.bw_bytes) != 0) {
      Die("data check: H2D from the lease then D2H does not give the lease's bytes back");
    }
    std::printf("gpu_bench: data check passed (kernel checksum via the device pointer, H2D+D2H)\n");

    CopyGBs(devbuf, pinned, o.bw_bytes, cudaMemcpyHostToDevice, 1);  // warm-up
    CopyGBs(devbuf, lease->data(), o.bw_bytes, cudaMemcpyHostToDevice, 1);
    double h2d_l = CopyGBs(devbuf, lease->data(), o.bw_bytes, cudaMemcpyHostToDevice, 10);
    double h2d_p = CopyGBs(devbuf, pinned, o.bw_bytes, cudaMemcpyHostToDevice, 10);
    double d2h_l = CopyGBs(lease->data(), devbuf, o.bw_bytes, cudaMemcpyDeviceToHost, 10);
    double d2h_p = CopyGBs(pinned, devbuf, o.bw_bytes, cudaMemcpyDeviceToHost, 10);
    std::string note = "best of 10, " + std::to_string(o.bw_bytes / kMiB) +
                       " MiB, vs cudaMallocHost; lease: " + lease->info().backing;
    g_rows.push_back({"H2D bandwidth", h2d_l, h2d_p, "GB/s", "ge", 0.98, note});
    g_rows.push_back({"D2H bandwidth", d2h_l, d2h_p, "GB/s", "ge", 0.98, ""});

    // G4: zero-copy read through the device pointer vs a mapped cudaHostAlloc.
    void* mapped = nullptr;
    void* mapped_d = nullptr;
    CUDA_OR_DIE(cudaHostAlloc(&mapped, o.bw_bytes, cudaHostAllocMapped));
    CUDA_OR_DIE(cudaHostGetDevicePointer(&mapped_d, mapped, 0));
    std::memcpy(mapped, lease->data(), o.bw_bytes);
    ZeroCopyGBs(mapped_d, o.bw_bytes, 1, dsum);  // warm-up
    ZeroCopyGBs(reinterpret_cast<void*>(*dptr), o.bw_bytes, 1, dsum);
    double zc_l = ZeroCopyGBs(reinterpret_cast<void*>(*dptr), o.bw_bytes, 5, dsum);
    double zc_m = ZeroCopyGBs(mapped_d, o.bw_bytes, 5, dsum);
    g_rows.push_back({"zero-copy kernel read", zc_l, zc_m, "GB/s", "ge", 0.95,
                      "vs cudaHostAlloc(cudaHostAllocMapped), best of 5"});
    CUDA_OR_DIE(cudaFreeHost(mapped));
    CUDA_OR_DIE(cudaFree(devbuf));
    CUDA_OR_DIE(cudaFreeHost(pinned));
    cxlpool::ClientStatus s = lease->Release();
    if (!s.ok()) Die("release: " + s.ToString());
  }

  // G3: request to a registered big lease vs cudaMallocHost of the same
  // size. The baseline goes first, twice, and the faster counts: a VM whose
  // memory is backed lazily by its host (virtio-mem, balloon) pays a first
  // touch that a warm host would not, and the daemon's stock was touched at
  // build time.
  {
    double base_ms[2];
    for (double& ms : base_ms) {
      void* pinned = nullptr;
      double t0 = NowMs();
      CUDA_OR_DIE(cudaMallocHost(&pinned, o.big));
      ms = NowMs() - t0;
      CUDA_OR_DIE(cudaFreeHost(pinned));
    }
    double base = std::min(base_ms[0], base_ms[1]);
    char base_note[96];
    std::snprintf(base_note, sizeof base_note,
                  "; cudaMallocHost %.0f ms then %.0f ms, the faster counts", base_ms[0],
                  base_ms[1]);

    double t1 = NowMs();
    auto lease = Lease(*client, o, o.big, false);
    double t2 = NowMs();
    cxlpool::ClientStatus s = lease->CudaRegister(o.dev);
    double t3 = NowMs();
    if (!s.ok()) Die(std::to_string(o.big / kGiB) + " GiB lease: register: " + s.ToString());
    auto dptr = lease->device_ptr();
    if (!dptr.ok()) Die("8 GiB lease has no device pointer: " + dptr.status().ToString());
    std::string what = std::to_string(o.big / kGiB) + " GiB";
    std::printf("gpu_bench: %s lease: %s\n", what.c_str(), Describe(*lease).c_str());
    // The GPU must see the last page the CPU wrote.
    size_t tail = 2 * kMiB;
    char* last = static_cast<char*>(lease->data()) + o.big - tail;
    std::memset(last, 0x5a, tail);
    CheckSum(reinterpret_cast<char*>(*dptr) + o.big - tail, last, tail, dsum);

    g_rows.push_back({"registered " + what + " ready", t3 - t1, base, "ms", "le", 0.5,
                      "request -> granted, mapped, populated and cuMemHostRegister'd vs "
                      "cudaMallocHost; lease: " +
                          lease->info().backing + base_note});
    g_rows.push_back({"  of which grant + map", t2 - t1, base, "ms", "", 0, ""});
    g_rows.push_back({"  of which registration", t3 - t2, base, "ms", "", 0, ""});
    cxlpool::ClientStatus r = lease->Release();
    if (!r.ok()) Die("release: " + r.ToString());
  }
  CUDA_OR_DIE(cudaFree(dsum));
  Print();
  return 0;
}
