// ladder and recycle: the measurements behind the pool's extent design
// (issue 18, docs/benchmarks.md).
//
// ladder: what one extent of each granule costs to build (memfd_create,
//   ftruncate, mmap, mbind, mlock2 on fault, populate, seal), against the same process
//   populating the same size of anonymous memory itself; what mapping a
//   1 GiB lease cut into N extents into one reserved range costs the client,
//   against one extent; and what passing N fds over a Unix socket costs.
// recycle: making an extent's memory safe for a new tenant, against a plain
//   memset of the same memory: a fresh extent (truncate the old memfd, build
//   a new one: what the pool does), and for the record user-space zeroing
//   (memset, rep stosb, non-temporal stores) and kernel re-population of the
//   same file (fallocate PUNCH_HOLE, MADV_REMOVE), which the pool must not
//   use for a file that has left the daemon (docs/daemon.md).
//
// Shared-memory THP: memfds get huge pages only when
// /sys/kernel/mm/transparent_hugepage/shmem_enabled allows them. When it
// does not and the bench runs as root, the THP rows use a tmpfs mounted with
// huge=always in a private mount namespace of the bench (same shmem code,
// no system setting changed); otherwise they are left out with a note.
#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "bench.h"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#ifndef MFD_HUGE_2MB
#define MFD_HUGE_2MB (21U << 26)
#endif

namespace cxlpool::bench {

namespace {

// Where THP extents come from in this run: memfd (shmem_enabled allows it)
// or a huge=always tmpfs the bench mounted privately; empty: no THP.
struct ThpSource {
  bool memfd = false;
  std::string tmpfs_dir;
  std::string note;
  bool available() const { return memfd || !tmpfs_dir.empty(); }
};

ThpSource FindThp() {
  ThpSource s;
  std::string mode = ReadFirstLine("/sys/kernel/mm/transparent_hugepage/shmem_enabled");
  auto open = mode.find('['), close = mode.find(']');
  std::string cur =
      open != std::string::npos && close > open ? mode.substr(open + 1, close - open - 1) : "";
  if (cur == "advise" || cur == "always" || cur == "within_size" || cur == "force") {
    s.memfd = true;
    s.note = "THP rows: memfd with MADV_HUGEPAGE (shmem_enabled " + cur + ")";
    return s;
  }
  if (cur == "deny") {
    s.note = "THP rows left out: shmem_enabled is deny";
    return s;
  }
  if (::geteuid() != 0) {
    s.note = "THP rows left out: shmem_enabled is " + cur + " and the bench is not root";
    return s;
  }
  // A private mount namespace: the tmpfs is seen by this process (and what
  // it spawns) only, and goes away with it.
  if (::unshare(CLONE_NEWNS) != 0 ||
      ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    s.note = std::string("THP rows left out: private mount namespace: ") + std::strerror(errno);
    return s;
  }
  char tmpl[] = "/tmp/cxlpool-bench-thp-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr ||
      ::mount("tmpfs", tmpl, "tmpfs", MS_NOSUID | MS_NODEV, "huge=always,mode=0700") != 0) {
    s.note = std::string("THP rows left out: tmpfs huge=always: ") + std::strerror(errno);
    return s;
  }
  s.tmpfs_dir = tmpl;
  s.note = "THP rows: shmem_enabled is " + cur +
           ", so they use O_TMPFILE files of a tmpfs mounted huge=always in the bench's own "
           "mount namespace (same shmem code as a memfd; such files cannot be sealed)";
  return s;
}

// One extent built the way the pool builds it, step by step.
struct Steps {
  uint64_t create = 0, size = 0, map = 0, bind = 0, populate = 0, lock = 0, seal = 0;
  uint64_t Total() const { return create + size + map + bind + populate + lock + seal; }
};

struct TestExtent {
  UniqueFd fd;
  void* addr = nullptr;
  uint64_t size = 0;
  TestExtent() = default;
  TestExtent(TestExtent&& o) noexcept
      : fd(std::move(o.fd)), addr(std::exchange(o.addr, nullptr)), size(o.size) {}
  TestExtent& operator=(TestExtent&& o) noexcept {
    std::swap(fd, o.fd);
    std::swap(addr, o.addr);
    std::swap(size, o.size);
    return *this;
  }
  ~TestExtent() {
    if (addr != nullptr) ::munmap(addr, size);
  }
};

struct Builder {
  Pages kind = Pages::k4K;
  const ThpSource* thp = nullptr;
  int node = 0;
  bool pin = true;

  uint64_t page() const { return kind == Pages::kHugetlb ? 2 * kMiB : 4 * kKiB; }

  Result<TestExtent> Build(uint64_t size, Steps* t) const {
    TestExtent e;
    e.size = size;
    uint64_t t0 = NowNs();
    int fd = -1;
    bool sealable = true;
    if (kind == Pages::kThp && !thp->memfd) {
      fd = ::open(thp->tmpfs_dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
      sealable = false;
    } else {
      unsigned flags = MFD_CLOEXEC | MFD_ALLOW_SEALING;
      if (kind == Pages::kHugetlb) flags |= MFD_HUGETLB | MFD_HUGE_2MB;
      fd = ::memfd_create("cxlpool-bench-extent", flags);
    }
    if (fd < 0) return Status::FromErrno(errno, "create extent file");
    e.fd.Reset(fd);
    uint64_t t1 = NowNs();
    if (::ftruncate(fd, static_cast<off_t>(size)) != 0)
      return Status::FromErrno(errno, "ftruncate");
    uint64_t t2 = NowNs();
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return Status::FromErrno(errno, "mmap");
    e.addr = p;
    uint64_t t3 = NowNs();
    CXLPOOL_RETURN_IF_ERROR(BindToNode(p, size, node));
    if (kind == Pages::kThp) ::madvise(p, size, MADV_HUGEPAGE);
    // Pinned as the pool pins (pool/backing.cc BuildMemfd): locked on fault,
    // so the prefault locks each page as it brings it in.
    uint64_t t4 = NowNs();
    if (pin && ::syscall(SYS_mlock2, p, size, 1 /* MLOCK_ONFAULT */) != 0) {
      return Status::FromErrno(errno, "mlock2");
    }
    uint64_t t5 = NowNs();
    if (::madvise(p, size, MADV_POPULATE_WRITE) != 0) {
      return Status::FromErrno(errno, "MADV_POPULATE_WRITE");
    }
    uint64_t t6 = NowNs();
    if (sealable && ::fcntl(fd, F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SEAL) != 0) {
      return Status::FromErrno(errno, "seal");
    }
    uint64_t t7 = NowNs();
    if (t != nullptr) *t = Steps{t1 - t0, t2 - t1, t3 - t2, t4 - t3, t6 - t5, t5 - t4, t7 - t6};
    return e;
  }

  // The same process doing it alone: anonymous memory, bound, populated.
  Result<uint64_t> LocalNs(uint64_t size) const { return PopulateYourselfNs(size, node, kind); }
};

// Median of `v` (empty: 0).
uint64_t Median(std::vector<uint64_t> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double GBs(uint64_t bytes, uint64_t ns) {
  return ns == 0 ? 0 : static_cast<double>(bytes) / static_cast<double>(ns);
}

std::string Us(uint64_t ns) { return std::to_string((ns + 500) / 1000) + " us"; }

std::vector<Pages> Kinds(const ThpSource& thp, int node, uint64_t need_huge_bytes, Report* r) {
  std::vector<Pages> kinds = {Pages::k4K};
  if (thp.available()) kinds.push_back(Pages::kThp);
  uint64_t free_huge = FreeHugepages(node);
  if (free_huge * 2 * kMiB >= need_huge_bytes) {
    kinds.push_back(Pages::kHugetlb);
  } else {
    r->notes.push_back("hugetlb rows left out: node " + std::to_string(node) + " has " +
                       std::to_string(free_huge) + " free 2 MiB pages, " +
                       std::to_string(need_huge_bytes / (2 * kMiB)) + " needed");
  }
  return kinds;
}

// ---- ladder ----

void LadderBuildRows(const Options& o, const Builder& b, const std::vector<uint64_t>& sizes,
                     int reps, Report* r) {
  for (uint64_t size : sizes) {
    if (size % b.page() != 0) continue;
    std::vector<uint64_t> build, local, fixed;
    Steps last;
    std::string error;
    for (int i = 0; i < reps && error.empty(); ++i) {
      Steps s;
      {
        auto e = b.Build(size, &s);
        if (!e.ok()) {
          error = e.status().ToString();
          break;
        }
        // The release: truncate first (as a revoke would), then close.
        (void)!::ftruncate(e->fd.get(), 0);
      }
      build.push_back(s.Total());
      fixed.push_back(s.Total() - s.populate - s.lock);
      last = s;
      auto l = b.LocalNs(size);
      if (!l.ok()) {
        error = "baseline: " + l.status().ToString();
        break;
      }
      local.push_back(*l);
    }
    std::string metric = "build " + HumanSize(size) + " " + PagesName(b.kind);
    if (!error.empty()) {
      r->notes.push_back("ladder " + metric + ": " + error);
      continue;
    }
    Row x;
    x.figure = "ladder";
    x.metric = metric;
    x.value = static_cast<double>(Median(build)) / 1000.0;
    x.baseline = static_cast<double>(Median(local)) / 1000.0;
    x.unit = "us";
    char buf[160];
    std::snprintf(buf, sizeof buf,
                  "median of %d; %.2f GB/s; fixed part (all but populate and lock) ", reps,
                  GBs(size, Median(build)));
    x.note = buf + Us(Median(fixed)) + "; last: populate " + Us(last.populate) + ", mlock " +
             Us(last.lock) + ", mmap+bind " + Us(last.map + last.bind) + "; baseline: anonymous " +
             "mmap + mbind + MADV_POPULATE_WRITE of the same size";
    (void)o;
    r->Add(std::move(x));
  }
}

// Maps `extents` back to back into one reserved range and populates them
// the way `how` says; returns ns for reserve + map + populate.
enum class MapHow { kMapPopulate, kPopulateRead, kPopulateWrite };
const char* HowName(MapHow h) {
  switch (h) {
    case MapHow::kMapPopulate:
      return "MAP_POPULATE";
    case MapHow::kPopulateRead:
      return "MADV_POPULATE_READ";
    case MapHow::kPopulateWrite:
      return "MADV_POPULATE_WRITE";
  }
  return "?";
}

Result<uint64_t> MapInto(const std::vector<TestExtent>& extents, MapHow how, uint64_t align) {
  uint64_t total = 0;
  for (const auto& e : extents) total += e.size;
  uint64_t t0 = NowNs();
  void* raw =
      ::mmap(nullptr, total + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return Status::FromErrno(errno, "reserve");
  uintptr_t base = (reinterpret_cast<uintptr_t>(raw) + align - 1) & ~(align - 1);
  uint64_t off = 0;
  Status st;
  int flags = MAP_SHARED | MAP_FIXED | (how == MapHow::kMapPopulate ? MAP_POPULATE : 0);
  for (const auto& e : extents) {
    void* p = ::mmap(reinterpret_cast<void*>(base + off), e.size, PROT_READ | PROT_WRITE, flags,
                     e.fd.get(), 0);
    if (p == MAP_FAILED) {
      st = Status::FromErrno(errno, "mmap MAP_FIXED");
      break;
    }
    if (how != MapHow::kMapPopulate) {
      int advice = how == MapHow::kPopulateRead ? MADV_POPULATE_READ : MADV_POPULATE_WRITE;
      if (::madvise(p, e.size, advice) != 0) {
        st = Status::FromErrno(errno, HowName(how));
        break;
      }
    }
    off += e.size;
  }
  uint64_t t1 = NowNs();
  // Touch one byte per page afterwards (outside the timing) to be sure the
  // range is usable as one buffer.
  if (st.ok()) {
    auto* c = reinterpret_cast<volatile char*>(base);
    for (uint64_t i = 0; i < total; i += 2 * kMiB) c[i] = 1;
  }
  ::munmap(raw, total + align);
  if (!st.ok()) return st;
  return t1 - t0;
}

// Sends `fds` over a socketpair in frames of at most 253 and receives them.
Result<uint64_t> PassFds(const std::vector<int>& fds) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    return Status::FromErrno(errno, "socketpair");
  }
  UniqueFd a(sv[0]), b(sv[1]);
  constexpr size_t kPer = 253;
  uint64_t t0 = NowNs();
  size_t received = 0;
  for (size_t i = 0; i < fds.size(); i += kPer) {
    size_t n = std::min(kPer, fds.size() - i);
    char byte = 0;
    iovec iov{&byte, 1};
    alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int) * kPer)];
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = ctl;
    m.msg_controllen = CMSG_SPACE(sizeof(int) * n);
    cmsghdr* c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * n);
    std::memcpy(CMSG_DATA(c), fds.data() + i, sizeof(int) * n);
    if (::sendmsg(a.get(), &m, MSG_NOSIGNAL) != 1) return Status::FromErrno(errno, "sendmsg");
    alignas(cmsghdr) char rctl[CMSG_SPACE(sizeof(int) * kPer)];
    msghdr rm{};
    iovec riov{&byte, 1};
    rm.msg_iov = &riov;
    rm.msg_iovlen = 1;
    rm.msg_control = rctl;
    rm.msg_controllen = sizeof rctl;
    if (::recvmsg(b.get(), &rm, MSG_CMSG_CLOEXEC) != 1) return Status::FromErrno(errno, "recvmsg");
    for (cmsghdr* rc = CMSG_FIRSTHDR(&rm); rc != nullptr; rc = CMSG_NXTHDR(&rm, rc)) {
      size_t k = (rc->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t j = 0; j < k; ++j) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(rc) + j * sizeof(int), sizeof fd);
        ::close(fd);
        ++received;
      }
    }
  }
  uint64_t t1 = NowNs();
  if (received != fds.size()) return Status(Code::kInternal, "lost fds");
  return t1 - t0;
}

void LadderMapRows(const Builder& b, uint64_t total, const std::vector<uint64_t>& granules,
                   int reps, Report* r) {
  // Baseline: the whole lease as one extent, mapped with MAP_POPULATE (what
  // the client library does today).
  std::vector<TestExtent> one;
  {
    auto e = b.Build(total, nullptr);
    if (!e.ok()) {
      r->notes.push_back(std::string("ladder map ") + PagesName(b.kind) + ": " +
                         e.status().ToString());
      return;
    }
    one.push_back(std::move(*e));
  }
  std::vector<uint64_t> base;
  for (int i = 0; i < reps; ++i) {
    auto t = MapInto(one, MapHow::kMapPopulate, kGiB);
    if (!t.ok()) {
      r->notes.push_back("ladder map baseline: " + t.status().ToString());
      return;
    }
    base.push_back(*t);
  }
  uint64_t base_ns = Median(base);
  // Variants of populating one extent (not cut).
  for (MapHow how : {MapHow::kPopulateRead, MapHow::kPopulateWrite}) {
    std::vector<uint64_t> v;
    for (int i = 0; i < reps; ++i) {
      auto t = MapInto(one, how, kGiB);
      if (t.ok()) v.push_back(*t);
    }
    if (v.empty()) continue;
    Row x;
    x.figure = "ladder";
    x.metric =
        "map " + HumanSize(total) + " " + PagesName(b.kind) + " as 1 extent, " + HowName(how);
    x.value = static_cast<double>(Median(v)) / 1000.0;
    x.baseline = static_cast<double>(base_ns) / 1000.0;
    x.unit = "us";
    x.note = "baseline: the same extent mapped with MAP_POPULATE";
    r->Add(std::move(x));
  }
  one.clear();
  for (uint64_t g : granules) {
    if (g >= total || g % b.page() != 0) continue;
    std::vector<TestExtent> cut;
    Status st;
    for (uint64_t off = 0; off < total && st.ok(); off += g) {
      auto e = b.Build(g, nullptr);
      if (!e.ok()) {
        st = e.status();
        break;
      }
      cut.push_back(std::move(*e));
    }
    if (!st.ok()) {
      r->notes.push_back("ladder map " + HumanSize(g) + ": " + st.ToString());
      continue;
    }
    for (MapHow how : {MapHow::kMapPopulate, MapHow::kPopulateRead}) {
      std::vector<uint64_t> v;
      for (int i = 0; i < reps; ++i) {
        auto t = MapInto(cut, how, kGiB);
        if (t.ok()) v.push_back(*t);
      }
      if (v.empty()) continue;
      Row x;
      x.figure = "ladder";
      x.metric = "map " + HumanSize(total) + " " + PagesName(b.kind) + " as " +
                 std::to_string(cut.size()) + " x " + HumanSize(g) + ", " + HowName(how);
      x.value = static_cast<double>(Median(v)) / 1000.0;
      x.baseline = static_cast<double>(base_ns) / 1000.0;
      x.unit = "us";
      char buf[96];
      std::snprintf(buf, sizeof buf, "%.1f us per extent over the 1-extent MAP_POPULATE baseline",
                    (static_cast<double>(Median(v)) - static_cast<double>(base_ns)) / 1000.0 /
                        static_cast<double>(cut.size()));
      x.note = buf;
      r->Add(std::move(x));
    }
    if (b.kind == Pages::k4K) {
      std::vector<int> raw;
      for (const auto& e : cut) raw.push_back(e.fd.get());
      std::vector<int> single = {raw.front()};
      std::vector<uint64_t> many, lone;
      for (int i = 0; i < reps; ++i) {
        auto t = PassFds(raw);
        auto t1 = PassFds(single);
        if (t.ok()) many.push_back(*t);
        if (t1.ok()) lone.push_back(*t1);
      }
      Row x;
      x.figure = "ladder";
      x.metric = "pass " + std::to_string(raw.size()) + " fds (frames of 253)";
      x.value = static_cast<double>(Median(many)) / 1000.0;
      x.baseline = static_cast<double>(Median(lone)) / 1000.0;
      x.unit = "us";
      x.note = "socketpair send + receive + close; baseline one fd";
      r->Add(std::move(x));
    }
  }
}

// ---- recycle ----

#if defined(__x86_64__)
void ZeroNonTemporal(void* p, uint64_t len) {
  auto* d = static_cast<__m128i*>(p);
  const __m128i z = _mm_setzero_si128();
  for (uint64_t i = 0; i < len / 16; i += 4) {
    _mm_stream_si128(d + i, z);
    _mm_stream_si128(d + i + 1, z);
    _mm_stream_si128(d + i + 2, z);
    _mm_stream_si128(d + i + 3, z);
  }
  _mm_sfence();
}
void ZeroRepStosb(void* p, uint64_t len) {
  void* d = p;
  uint64_t n = len;
  asm volatile("rep stosb" : "+D"(d), "+c"(n) : "a"(0) : "memory");
}
#endif

void RecycleRows(const Options& o, const Builder& b, uint64_t size, int reps, Report* r) {
  std::string kind = PagesName(b.kind);
  auto e = b.Build(size, nullptr);
  if (!e.ok()) {
    r->notes.push_back("recycle " + kind + ": " + e.status().ToString());
    return;
  }
  char* mem = static_cast<char*>(e->addr);
  // The baseline: memset of the same, resident memory.
  auto timed = [&](const std::function<Status()>& fn) -> Result<uint64_t> {
    std::memset(mem, 0xA5, size);  // a previous holder's bytes (outside the timing)
    uint64_t t0 = NowNs();
    Status st = fn();
    uint64_t t1 = NowNs();
    if (!st.ok()) return st;
    return t1 - t0;
  };
  auto median_of = [&](const std::function<Status()>& fn) -> Result<uint64_t> {
    std::vector<uint64_t> v;
    for (int i = 0; i < reps; ++i) {
      auto t = timed(fn);
      if (!t.ok()) return t.status();
      v.push_back(*t);
    }
    return Median(v);
  };
  auto memset_ns = median_of([&] {
    std::memset(mem, 0, size);
    return Status();
  });
  if (!memset_ns.ok()) return;
  auto add = [&](const std::string& what, Result<uint64_t> ns, bool goal, const std::string& note) {
    std::string metric = "scrub " + HumanSize(size) + " " + kind + ": " + what;
    if (!ns.ok()) {
      r->notes.push_back("recycle " + metric + ": " + ns.status().ToString());
      return;
    }
    Row x;
    x.figure = "recycle";
    x.metric = metric;
    x.value = GBs(size, *ns);
    x.baseline = GBs(size, *memset_ns);
    x.unit = "GB/s";
    if (goal) {
      x.goal_op = "ge";
      x.goal = 0.8;
    }
    x.note = note;
    r->Add(std::move(x));
  };
  add("memset (itself)", *memset_ns, false,
      "baseline for every row: memset(0) of the same resident memory, median of " +
          std::to_string(reps));
#if defined(__x86_64__)
  add("rep stosb", median_of([&] {
        ZeroRepStosb(mem, size);
        return Status();
      }),
      false, "");
  add("non-temporal stores", median_of([&] {
        ZeroNonTemporal(mem, size);
        return Status();
      }),
      false, "SSE2 movntdq + sfence");
#endif
  int fd = e->fd.get();
  add("fallocate PUNCH_HOLE + repopulate", median_of([&] {
        if (::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0,
                        static_cast<off_t>(size)) != 0) {
          return Status::FromErrno(errno, "fallocate PUNCH_HOLE");
        }
        if (::madvise(mem, size, MADV_POPULATE_WRITE) != 0) {
          return Status::FromErrno(errno, "MADV_POPULATE_WRITE");
        }
        return Status();
      }),
      false, "same file: not usable for a new tenant once the file has left the daemon");
  // MADV_REMOVE is refused on a locked mapping: unlock, remove, populate,
  // lock again.
  add("MADV_REMOVE + repopulate", median_of([&] {
        if (b.pin) ::munlock(mem, size);
        if (::madvise(mem, size, MADV_REMOVE) != 0) return Status::FromErrno(errno, "MADV_REMOVE");
        if (::madvise(mem, size, MADV_POPULATE_WRITE) != 0) {
          return Status::FromErrno(errno, "MADV_POPULATE_WRITE");
        }
        if (b.pin && ::mlock(mem, size) != 0) return Status::FromErrno(errno, "mlock");
        return Status();
      }),
      false, "same file: as PUNCH_HOLE (munlock first: MADV_REMOVE refuses a locked mapping)");
  // What the pool does: the old extent is truncated (its holders SIGBUS,
  // its pages go back to the node) and closed; a fresh memfd takes its
  // place, bound, populated (the kernel zeroes each page), pinned, sealed.
  std::vector<uint64_t> trunc_ns;
  auto fresh = median_of([&]() -> Status {
    uint64_t t0 = NowNs();
    (void)!::ftruncate(e->fd.get(), 0);
    *e = TestExtent();
    trunc_ns.push_back(NowNs() - t0);
    auto n = b.Build(size, nullptr);
    if (!n.ok()) return n.status();
    *e = std::move(*n);
    mem = static_cast<char*>(e->addr);
    return Status();
  });
  add("fresh extent (truncate old, build new)", fresh, true,
      "what the pool does; of which truncate + unmap + close " + Us(Median(trunc_ns)) +
          " (median); the old file never reaches the memory again");
  (void)o;
}

// Found once per run: the private mount (if any) serves both figures.
const ThpSource& Thp(Report* r) {
  static const ThpSource thp = FindThp();
  static bool noted = false;
  if (!noted) r->notes.push_back("ladder/recycle: " + thp.note);
  noted = true;
  return thp;
}

}  // namespace

void RunLadder(const Options& o, Report* r) {
  const ThpSource& thp = Thp(r);
  const int reps = o.quick ? 2 : 5;
  const std::vector<uint64_t> sizes =
      o.quick ? std::vector<uint64_t>{4 * kKiB, 2 * kMiB, 8 * kMiB, 32 * kMiB}
              : std::vector<uint64_t>{4 * kKiB,  64 * kKiB, 2 * kMiB,   8 * kMiB,
                                      32 * kMiB, 64 * kMiB, 256 * kMiB, kGiB};
  const uint64_t map_total = o.quick ? 32 * kMiB : kGiB;
  const std::vector<uint64_t> granules =
      o.quick ? std::vector<uint64_t>{2 * kMiB, 8 * kMiB}
              : std::vector<uint64_t>{2 * kMiB, 32 * kMiB, 256 * kMiB};
  for (Pages k : Kinds(thp, o.node, 2 * map_total, r)) {
    Builder b{k, &thp, o.node, o.pin};
    LadderBuildRows(o, b, sizes, reps, r);
    LadderMapRows(b, map_total, granules, reps, r);
  }
}

void RunRecycle(const Options& o, Report* r) {
  const ThpSource& thp = Thp(r);
  const uint64_t size = o.quick ? 32 * kMiB : kGiB;
  const int reps = o.quick ? 2 : 5;
  for (Pages k : Kinds(thp, o.node, 2 * size, r)) {
    Builder b{k, &thp, o.node, o.pin};
    RecycleRows(o, b, size, reps, r);
  }
}

}  // namespace cxlpool::bench
