// P2: time until 1 GiB is ready to use in the client (granted, mapped,
// populated: libcxlpool's Allocate, which maps with MAP_POPULATE) against the
// client doing it alone (anonymous mmap + mbind + MADV_POPULATE_WRITE), for
// 4 KiB, THP and hugetlb backing. Also P4 (bandwidth of leased memory).
#include <numaif.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "bench.h"
#include "cxlpool/client.hpp"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace cxlpool::bench {

namespace {

void RunVariant(const Options& o, Pages b, uint64_t size, int samples, Report* r) {
  std::string metric = "ready " + HumanSize(size) + " " + PagesName(b);
  std::string thp_mode = ReadFirstLine("/sys/kernel/mm/transparent_hugepage/shmem_enabled");
  if (b == Pages::kHugetlb) {
    uint64_t need = size / (2 * kMiB) * 2;  // the lease and the reserve's refill
    uint64_t have = FreeHugepages(o.node);
    if (have < need) {
      return r->Skip("P2", metric,
                     "node " + std::to_string(o.node) + " has " + std::to_string(have) +
                         " free 2 MiB hugepages, " + std::to_string(need) +
                         " needed (lease + warm refill); set vm.nr_hugepages to run it");
    }
  }
  if (!o.spawn() && b != Pages::k4K) {
    return r->Skip("P2", metric,
                   "a running daemon (--socket) has one backing configuration; measured as 4k row");
  }
  DaemonConfig cfg;
  cfg.thp = b == Pages::kThp;
  cfg.hugetlb = b == Pages::kHugetlb;
  // A warm reserve of the lease's size, refilled after every grant: the
  // lease is cut from it whole.
  cfg.reserve_bytes = (size + 2 * kMiB - 1) / (2 * kMiB) * (2 * kMiB);
  DaemonProc daemon;
  auto sock = PhaseSocket(o, cfg, &daemon);
  if (!sock.ok()) return r->Skip("P2", metric, sock.status().ToString());
  auto ctl = WireClient::Connect(*sock);
  if (!ctl.ok()) return r->Skip("P2", metric, ctl.status().ToString());
  auto client = cxlpool::Client::Connect(*sock);
  if (!client.ok()) return r->Skip("P2", metric, client.status().ToString());

  Stats lease_ns, self_ns;
  int warm = 0;
  uint64_t pmd_min = UINT64_MAX;
  std::string backing;
  for (int i = 0; i < samples; ++i) {
    if (Status s = ctl->WaitIdle(); !s.ok()) return r->Skip("P2", metric, s.ToString());
    auto before = ctl->GetStats();
    if (!before.ok()) return r->Skip("P2", metric, before.status().ToString());
    cxlpool::AllocOptions opts;
    opts.size_bytes = size;
    opts.numa_node = o.node;
    opts.strict = true;
    opts.hugetlb = b == Pages::kHugetlb;
    opts.label = "cxlpool-bench P2";
    uint64_t t0 = NowNs();
    auto lease = client->Allocate(opts);
    uint64_t t1 = NowNs();
    if (!lease.ok()) return r->Skip("P2", metric, "allocate: " + lease.status().ToString());
    auto after = ctl->GetStats();
    if (!after.ok()) return r->Skip("P2", metric, after.status().ToString());
    if (CounterOf(*after, "reserve_hits") > CounterOf(*before, "reserve_hits")) {
      ++warm;
    }
    backing = lease->info().backing;
    if (b == Pages::kThp) {
      auto pmd = SmapsField(lease->data(), lease->size(), "ShmemPmdMapped");
      pmd_min = std::min<uint64_t>(pmd_min, pmd.ok() ? *pmd : 0);
    }
    lease_ns.Add(t1 - t0);
    (void)lease->Release();
    // The baseline runs on a quiet daemon: the release reclaimed, the refill
    // built (and the hugepages it needs back in the pool).
    if (Status s = ctl->WaitIdle(); !s.ok()) return r->Skip("P2", metric, s.ToString());
    auto self = PopulateYourselfNs(size, o.node, b);
    if (!self.ok()) return r->Skip("P2", metric, "baseline: " + self.status().ToString());
    self_ns.Add(*self);
  }
  Row x;
  x.figure = "P2";
  x.metric = metric;
  x.value = lease_ns.MedianUs() / 1000.0;
  x.baseline = self_ns.MedianUs() / 1000.0;
  x.unit = "ms";
  if (b != Pages::k4K) {
    x.goal_op = "le";
    x.goal = 0.02;
  }
  x.note = "median of " + std::to_string(samples) + "; " + std::to_string(warm) + "/" +
           std::to_string(samples) + " from the warm reserve; backing " + backing;
  if (b == Pages::kThp) {
    if (pmd_min == 0 || backing != "memfd-thp") {
      x.note += "; THP FELL BACK to 4 KiB pages (ShmemPmdMapped " + std::to_string(pmd_min / kKiB) +
                " kB; shmem_enabled: " + thp_mode + ")";
    } else {
      x.note += "; ShmemPmdMapped " + HumanSize(pmd_min);
    }
  }
  r->Add(std::move(x));
}

}  // namespace

void RunP2(const Options& o, Report* r) {
  uint64_t size = o.quick ? 64 * kMiB : kGiB;
  int samples = o.quick ? 3 : 5;
  for (Pages b : {Pages::k4K, Pages::kThp, Pages::kHugetlb}) RunVariant(o, b, size, samples, r);
}

// ---------------------------------------------------------------- P4

namespace {

double MemcpyGBs(char* buf, uint64_t size) {
  uint64_t half = size / 2;
  uint64_t t0 = NowNs();
  std::memcpy(buf + half, buf, half);
  uint64_t t1 = NowNs();
  return 2.0 * static_cast<double>(half) / static_cast<double>(t1 - t0);  // bytes/ns == GB/s
}

double TriadGBs(char* buf, uint64_t size) {
  uint64_t n = size / 3 / sizeof(double);
  auto* a = reinterpret_cast<double*>(buf);
  double* bb = a + n;
  double* c = bb + n;
  const double s = 3.0;
  uint64_t t0 = NowNs();
  for (uint64_t i = 0; i < n; ++i) a[i] = bb[i] + s * c[i];
  uint64_t t1 = NowNs();
  volatile double sink = a[n / 2];
  (void)sink;
  return 3.0 * static_cast<double>(n * sizeof(double)) / static_cast<double>(t1 - t0);
}

void Fill(char* buf, uint64_t size) {
  auto* d = reinterpret_cast<double*>(buf);
  for (uint64_t i = 0; i < size / sizeof(double); ++i) d[i] = static_cast<double>(i & 1023);
}

}  // namespace

void RunP4(const Options& o, Report* r) {
  uint64_t size = o.quick ? 64 * kMiB : kGiB;
  int reps = o.quick ? 3 : 7;
  DaemonConfig cfg;
  cfg.thp = false;  // 4 KiB pages on both sides: malloc'd memory below gets MADV_NOHUGEPAGE
  DaemonProc daemon;
  auto sock = PhaseSocket(o, cfg, &daemon);
  if (!sock.ok()) return r->Skip("P4", "bandwidth", sock.status().ToString());
  auto client = cxlpool::Client::Connect(*sock);
  if (!client.ok()) return r->Skip("P4", "bandwidth", client.status().ToString());
  cxlpool::AllocOptions opts;
  opts.size_bytes = size;
  opts.numa_node = o.node;
  opts.strict = true;
  opts.label = "cxlpool-bench P4";
  auto lease = client->Allocate(opts);
  if (!lease.ok()) return r->Skip("P4", "bandwidth", "allocate: " + lease.status().ToString());
  char* mem = static_cast<char*>(std::malloc(size + 2 * kMiB));
  if (mem == nullptr) return r->Skip("P4", "bandwidth", "malloc failed");
  char* aligned = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(mem) + 4095) & ~4095ull);
  ::madvise(aligned, size, MADV_NOHUGEPAGE);
  Status bind = BindToNode(aligned, size, o.node);
  char* leased = static_cast<char*>(lease->data());
  // A plain memfd of our own (no cxlpool), to tell shmem-vs-anonymous page
  // effects apart from anything the pool does.
  char* plain = nullptr;
  int pfd = ::memfd_create("cxlpool-bench-p4", MFD_CLOEXEC);
  if (pfd >= 0 && ::ftruncate(pfd, static_cast<off_t>(size)) == 0) {
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, pfd, 0);
    if (p != MAP_FAILED) {
      plain = static_cast<char*>(p);
      (void)BindToNode(plain, size, o.node);
      ::madvise(plain, size, MADV_NOHUGEPAGE);
    }
  }
  if (pfd >= 0) ::close(pfd);
  Fill(aligned, size);
  Fill(leased, size);
  if (plain != nullptr) Fill(plain, size);
  double cl = 0, cm = 0, cp = 0, tl = 0, tm = 0, tp = 0;
  for (int i = 0; i < reps; ++i) {  // alternate, so drift hits all alike
    cl = std::max(cl, MemcpyGBs(leased, size));
    cm = std::max(cm, MemcpyGBs(aligned, size));
    if (plain != nullptr) cp = std::max(cp, MemcpyGBs(plain, size));
    tl = std::max(tl, TriadGBs(leased, size));
    tm = std::max(tm, TriadGBs(aligned, size));
    if (plain != nullptr) tp = std::max(tp, TriadGBs(plain, size));
  }
  std::free(mem);
  if (plain != nullptr) ::munmap(plain, size);
  std::string note = "best of " + std::to_string(reps) + ", one thread, " + HumanSize(size) +
                     " lease (" + lease->info().backing + ") vs malloc" +
                     (bind.ok() ? " mbind to node " + std::to_string(o.node)
                                : " (mbind failed: " + bind.message() + ")") +
                     ", 4 KiB pages on all sides";
  auto row = [&](const std::string& metric, double v, double b, bool goal, const std::string& n) {
    Row x;
    x.figure = "P4";
    x.metric = metric;
    x.value = v;
    x.baseline = b;
    x.unit = "GB/s";
    if (goal) {
      x.goal_op = "ge";
      x.goal = 0.98;
    }
    x.note = n;
    r->Add(std::move(x));
  };
  row("memcpy bandwidth", cl, cm, true, note);
  row("triad bandwidth", tl, tm, true, "");
  if (plain != nullptr) {
    row("memcpy, plain memfd (no cxlpool) vs malloc", cp, cm, false,
        "reference: the same shmem pages without the pool");
    row("triad, plain memfd (no cxlpool) vs malloc", tp, tm, false, "");
  }
}

}  // namespace cxlpool::bench
