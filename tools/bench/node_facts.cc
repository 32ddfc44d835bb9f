// Node and process facts the figures read (meminfo, /proc status, smaps,
// hugepages, THP), and the baseline's own populate. See bench.h.
#include <numaif.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "bench.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace cxlpool::bench {

void SettleVmstat() {
  std::string v = ReadFirstLine("/proc/sys/vm/stat_interval");
  int s = v.empty() ? 1 : std::max(1, std::atoi(v.c_str()));
  ::usleep(static_cast<useconds_t>(2 * s) * 1000000u + 200000u);
}

std::string ReadFirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return "";
  return line;
}

Status BindToNode(void* p, uint64_t len, int node) {
  unsigned long mask[16] = {};
  if (node < 0 || node >= static_cast<int>(sizeof(mask) * 8)) {
    return Status(Code::kInvalidArgument, "node out of range");
  }
  mask[node / (8 * sizeof(unsigned long))] |= 1ul << (node % (8 * sizeof(unsigned long)));
  if (::mbind(p, len, MPOL_BIND, mask, sizeof(mask) * 8, 0) != 0) {
    return Status::FromErrno(errno, "mbind");
  }
  return Status();
}

void PopulateWrite(void* p, uint64_t len, uint64_t page) {
  if (::madvise(p, len, MADV_POPULATE_WRITE) == 0) return;
  auto* c = static_cast<volatile char*>(p);
  for (uint64_t off = 0; off < len; off += page) c[off] = 0;
}

const char* PagesName(Pages p) {
  switch (p) {
    case Pages::k4K:
      return "4k";
    case Pages::kThp:
      return "thp";
    case Pages::kHugetlb:
      return "hugetlb";
  }
  return "?";
}

uint64_t CounterOf(const proto::StatsReply& s, const std::string& k) {
  auto it = s.counters().find(k);
  return it == s.counters().end() ? 0 : it->second;
}

Result<uint64_t> PopulateYourselfNs(uint64_t size, int node, Pages pages) {
  // A hugetlb mapping is whole 2 MiB pages (and munmap of a part fails).
  if (pages == Pages::kHugetlb) size = (size + 2 * kMiB - 1) / (2 * kMiB) * (2 * kMiB);
  uint64_t t0 = NowNs();
  int flags = MAP_PRIVATE | MAP_ANONYMOUS | (pages == Pages::kHugetlb ? MAP_HUGETLB : 0);
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, flags, -1, 0);
  if (p == MAP_FAILED) return Status::FromErrno(errno, "mmap baseline");
  Status st = BindToNode(p, size, node);
  if (st.ok() && pages != Pages::kHugetlb) {
    ::madvise(p, size, pages == Pages::kThp ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  }
  if (st.ok()) PopulateWrite(p, size, pages == Pages::kHugetlb ? 2 * kMiB : 4 * kKiB);
  uint64_t t1 = NowNs();
  ::munmap(p, size);
  if (!st.ok()) return st;
  return t1 - t0;
}

bool ShmemThpAllowed() {
  std::string mode = ReadFirstLine("/sys/kernel/mm/transparent_hugepage/shmem_enabled");
  auto open = mode.find('['), close = mode.find(']');
  std::string cur =
      open != std::string::npos && close > open ? mode.substr(open + 1, close - open - 1) : "";
  return cur == "advise" || cur == "always" || cur == "within_size" || cur == "force";
}

uint64_t FreeHugepages(int node) {
  std::string v = ReadFirstLine("/sys/devices/system/node/node" + std::to_string(node) +
                                "/hugepages/hugepages-2048kB/free_hugepages");
  return v.empty() ? 0 : std::strtoull(v.c_str(), nullptr, 10);
}

namespace {

// "Key:   123 kB" lines -> bytes; `prefix` is stripped first ("Node 0 ").
std::map<std::string, uint64_t> ParseKb(std::istream& in, const std::string& prefix) {
  std::map<std::string, uint64_t> out;
  std::string line;
  while (std::getline(in, line)) {
    if (!prefix.empty() && line.rfind(prefix, 0) == 0) line = line.substr(prefix.size());
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    std::istringstream rest(line.substr(colon + 1));
    uint64_t v = 0;
    std::string unit;
    if (!(rest >> v)) continue;
    rest >> unit;
    out[key] = unit == "kB" ? v * 1024 : v;
  }
  return out;
}

}  // namespace

Result<std::map<std::string, uint64_t>> NodeMeminfo(int node) {
  std::string path = "/sys/devices/system/node/node" + std::to_string(node) + "/meminfo";
  std::ifstream in(path);
  if (!in) return Status(Code::kNotFound, "cannot read " + path);
  return ParseKb(in, "Node " + std::to_string(node) + " ");
}

Result<std::map<std::string, uint64_t>> ProcStatus(pid_t pid) {
  std::string path = "/proc/" + std::to_string(pid) + "/status";
  std::ifstream in(path);
  if (!in) return Status(Code::kNotFound, "cannot read " + path);
  return ParseKb(in, "");
}

Result<uint64_t> SmapsField(const void* addr, uint64_t len, const std::string& field) {
  std::ifstream in("/proc/self/smaps");
  if (!in) return Status(Code::kNotFound, "cannot read /proc/self/smaps");
  uintptr_t lo = reinterpret_cast<uintptr_t>(addr), hi = lo + len;
  uint64_t total = 0;
  bool inside = false, found = false;
  std::string line;
  while (std::getline(in, line)) {
    uintptr_t a = 0, b = 0;
    if (std::sscanf(line.c_str(), "%" SCNxPTR "-%" SCNxPTR, &a, &b) == 2 &&
        line.find(':') > line.find(' ')) {
      inside = a < hi && b > lo;
      continue;
    }
    if (inside && line.rfind(field + ":", 0) == 0) {
      uint64_t kb = 0;
      std::sscanf(line.c_str() + field.size() + 1, "%" SCNu64, &kb);
      total += kb * 1024;
      found = true;
    }
  }
  if (!found) return Status(Code::kNotFound, "no " + field + " for that mapping in smaps");
  return total;
}

int64_t Field(const std::map<std::string, uint64_t>& m, const std::string& k) {
  auto it = m.find(k);
  return it == m.end() ? int64_t{0} : static_cast<int64_t>(it->second);
}

double MiB(int64_t bytes) { return static_cast<double>(bytes) / static_cast<double>(kMiB); }

}  // namespace cxlpool::bench
