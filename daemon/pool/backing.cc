#include "pool/backing.h"

#include <fcntl.h>
#include <numaif.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <vector>

#include "cxlpool/common/strings.h"

#ifndef MFD_NOEXEC_SEAL
#define MFD_NOEXEC_SEAL 0x0008U
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#ifndef MFD_HUGE_2MB
#define MFD_HUGE_2MB (21U << 26)
#endif

namespace cxlpool {

namespace {

constexpr uint64_t kSmallPage = 4096;
constexpr uint64_t kHugePage2M = 2ull << 20;
// A background build's prefault step in small pages: 16 pages, some 40 us
// of zeroing (1.6 GB/s on the build machine); the steps cost nothing
// measurable against one call (docs/benchmarks.md).
constexpr uint64_t kBackgroundStep = 64ull << 10;
constexpr unsigned kMlockOnFault = 1;  // MLOCK_ONFAULT (linux/mman.h)

class MemfdBacking final : public Backing {
 public:
  MemfdBacking(UniqueFd fd, void* addr, uint64_t size, uint64_t page, std::string kind)
      : fd_(std::move(fd)), addr_(addr), size_(size), page_(page), kind_(std::move(kind)) {
    struct stat st {};
    if (fd_.valid() && ::fstat(fd_.get(), &st) == 0) {
      inode_ = st.st_ino;
      dev_ = st.st_dev;
      have_identity_ = true;
    }
  }
  ~MemfdBacking() override { Reclaim(); }

  int fd() const override { return fd_.get(); }
  uint64_t size_bytes() const override { return size_; }
  uint64_t page_size() const override { return page_; }
  const std::string& kind() const override { return kind_; }
  void* daemon_addr() const override { return addr_; }
  bool Identity(uint64_t* inode, uint64_t* dev) const override {
    *inode = inode_;
    *dev = dev_;
    return have_identity_;
  }

  void Reclaim() override {
    if (fd_.valid()) {
      // Truncate first: the pages go back even if a client still holds the fd
      // or a mapping (its next access faults with SIGBUS).
      if (::ftruncate(fd_.get(), 0) != 0) {
        // Cannot happen for a memfd we created (F_SEAL_SHRINK is never set);
        // keep going so the mapping and fd are still released.
      }
    }
    if (addr_ != nullptr) {
      ::munmap(addr_, size_);
      addr_ = nullptr;
    }
    fd_.Reset();
  }

 private:
  UniqueFd fd_;
  void* addr_;
  uint64_t size_;
  uint64_t page_;
  std::string kind_;
  uint64_t inode_ = 0;
  uint64_t dev_ = 0;
  bool have_identity_ = false;
};

// munmaps on scope exit unless released.
struct MappingGuard {
  void* addr = nullptr;
  uint64_t size = 0;
  ~MappingGuard() {
    if (addr != nullptr) ::munmap(addr, size);
  }
};

Status BindToNode(void* addr, uint64_t size, int node) {
  std::vector<unsigned long> mask(static_cast<size_t>(node) / (8 * sizeof(unsigned long)) + 1, 0);
  mask[static_cast<size_t>(node) / (8 * sizeof(unsigned long))] |=
      1ul << (static_cast<unsigned>(node) % (8 * sizeof(unsigned long)));
  unsigned long maxnode = mask.size() * 8 * sizeof(unsigned long) + 1;
  if (::mbind(addr, size, MPOL_BIND, mask.data(), maxnode, 0) != 0) {
    int err = errno;
    return Status::FromErrno(err, "mbind(MPOL_BIND, node " + std::to_string(node) + ")");
  }
  return Status::Ok();
}

Status PrefaultRange(void* addr, uint64_t size, uint64_t page) {
  if (::madvise(addr, size, MADV_POPULATE_WRITE) == 0) return Status::Ok();
  int err = errno;
  if (err != EINVAL) {
    // ENOMEM / EFAULT: the node (or the huge page pool) ran out.
    return Status(Code::kResourceExhausted,
                  "prefault " + HumanBytes(size) + " (MADV_POPULATE_WRITE): " + std::strerror(err));
  }
  // Kernel before 5.14: touch every page. A shortage here would SIGBUS, so
  // this path is only taken for small pages where the kernel reclaims or OOMs.
  auto* p = static_cast<volatile char*>(addr);
  for (uint64_t off = 0; off < size; off += page) p[off] = 0;
  return Status::Ok();
}

bool StopRequested(const std::shared_ptr<const std::atomic<bool>>& stop) {
  return stop != nullptr && stop->load(std::memory_order_acquire);
}

Status Stopped(uint64_t size) {
  return Status(Code::kUnavailable,
                "build of " + HumanBytes(size) + " stopped: the daemon is shutting down");
}

// How a prefault is cut: `step` bytes at a time (0: one call), `stop`
// looked at before each step, a sched_yield() between steps when `yield`
// (background builds; the thread always has work next, so this is a
// preemption point, never a wait).
struct PrefaultSteps {
  uint64_t step = 0;
  bool yield = false;
  std::shared_ptr<const std::atomic<bool>> stop;
};

Status Prefault(void* addr, uint64_t size, uint64_t page, const PrefaultSteps& s) {
  if (StopRequested(s.stop)) return Stopped(size);
  if (s.step == 0 || s.step >= size) return PrefaultRange(addr, size, page);
  for (uint64_t off = 0; off < size; off += s.step) {
    if (off > 0) {
      if (StopRequested(s.stop)) return Stopped(size);
      if (s.yield) ::sched_yield();
    }
    CXLPOOL_RETURN_IF_ERROR(
        PrefaultRange(static_cast<char*>(addr) + off, std::min(s.step, size - off), page));
  }
  return Status::Ok();
}

int MemfdCreate(const std::string& name, unsigned flags) {
  static std::atomic<int> noexec{-1};  // -1 unknown, 0 no, 1 yes
  if (noexec.load() != 0) {
    int fd = ::memfd_create(name.c_str(), flags | MFD_NOEXEC_SEAL);
    if (fd >= 0) {
      noexec.store(1);
      return fd;
    }
    if (errno != EINVAL) return -1;
    noexec.store(0);
  }
  return ::memfd_create(name.c_str(), flags);
}

}  // namespace

bool KernelHasNoexecSeal() {
  static const bool has = [] {
    int fd = ::memfd_create("cxlpool-probe", MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_NOEXEC_SEAL);
    if (fd < 0) return false;
    ::close(fd);
    return true;
  }();
  return has;
}

ShmemThp ReadShmemThp(const FileSystem& fs) {
  auto text = fs.ReadTrimmed("/sys/kernel/mm/transparent_hugepage/shmem_enabled");
  if (!text.ok()) return ShmemThp::kUnknown;
  auto open = text->find('[');
  auto close = text->find(']');
  if (open == std::string::npos || close == std::string::npos || close < open) {
    return ShmemThp::kUnknown;
  }
  std::string mode = text->substr(open + 1, close - open - 1);
  if (mode == "advise") return ShmemThp::kAdvise;
  if (mode == "always" || mode == "within_size" || mode == "force") return ShmemThp::kAlways;
  if (mode == "never" || mode == "deny") return ShmemThp::kNever;
  return ShmemThp::kUnknown;
}

std::unique_ptr<Backing> WrapMemfdBacking(UniqueFd fd, void* addr, uint64_t size,
                                          uint64_t page_size, std::string kind) {
  return std::make_unique<MemfdBacking>(std::move(fd), addr, size, page_size, std::move(kind));
}

Result<BuiltMemfd> BuildMemfd(const MemfdSpec& spec) {
  const uint64_t page = spec.hugetlb ? kHugePage2M : kSmallPage;
  if (spec.size_bytes == 0 || spec.size_bytes % page != 0) {
    return Status(Code::kInvalidArgument, "backing size " + std::to_string(spec.size_bytes) +
                                              " is not a positive multiple of " + HumanBytes(page));
  }
  unsigned flags = MFD_CLOEXEC | MFD_ALLOW_SEALING;
  if (spec.hugetlb) flags |= MFD_HUGETLB | MFD_HUGE_2MB;
  if (StopRequested(spec.stop)) return Stopped(spec.size_bytes);
  UniqueFd fd(MemfdCreate(spec.name, flags));
  if (!fd.valid()) return Status::FromErrno(errno, "memfd_create");
  if (::ftruncate(fd.get(), static_cast<off_t>(spec.size_bytes)) != 0) {
    return Status::FromErrno(errno, "ftruncate memfd to " + HumanBytes(spec.size_bytes));
  }
  void* addr = ::mmap(nullptr, spec.size_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (addr == MAP_FAILED) return Status::FromErrno(errno, "mmap memfd");
  MappingGuard guard{addr, spec.size_bytes};
  if (spec.numa_node >= 0)
    CXLPOOL_RETURN_IF_ERROR(BindToNode(addr, spec.size_bytes, spec.numa_node));
  std::string kind = spec.hugetlb ? "hugetlb-2m" : "memfd";
  if (spec.thp && !spec.hugetlb) {
    if (::madvise(addr, spec.size_bytes, MADV_HUGEPAGE) == 0) kind = "memfd-thp";
  }
  PrefaultSteps steps;
  steps.stop = spec.stop;
  if (spec.yield_between_steps) {
    steps.step = (spec.hugetlb || kind == "memfd-thp") ? kHugePage2M : kBackgroundStep;
    steps.yield = true;
  } else if (spec.stop != nullptr) {
    steps.step = kStopStep;
  }
  auto pin_error = [&](int err) {
    Status st = Status::FromErrno(err, "mlock " + HumanBytes(spec.size_bytes) +
                                           " (pinning; raise RLIMIT_MEMLOCK or set pin = false)");
    return Status(Code::kResourceExhausted, st.message());
  };
  // Lock first, on fault, when the prefault follows: each page is locked as
  // it comes in, instead of a second pass over all of them (10-15% of a
  // 4 KiB-page build; cxlpool-bench ladder). Without a prefault a plain mlock
  // below faults everything in.
  bool locked = false;
  if (spec.pin && spec.prefault) {
    if (::syscall(SYS_mlock2, addr, spec.size_bytes, kMlockOnFault) == 0) {
      locked = true;
    } else if (errno != ENOSYS && errno != EINVAL) {
      return pin_error(errno);
    }
  }
  if (spec.prefault && spec.offer_fill && spec.size_bytes >= 2 * SharedFillChunk(spec.size_bytes)) {
    // Each chunk in steps too, when the build is a background one.
    auto fill = std::make_shared<SharedFill>(
        addr, spec.size_bytes, SharedFillChunk(spec.size_bytes),
        [page, steps](char* at, uint64_t len) { return Prefault(at, len, page, steps); });
    spec.offer_fill(fill);
    CXLPOOL_RETURN_IF_ERROR(fill->Run());  // every chunk done: the mapping may go
  } else if (spec.prefault) {
    CXLPOOL_RETURN_IF_ERROR(Prefault(addr, spec.size_bytes, page, steps));
  }
  if (spec.pin && !locked && ::mlock(addr, spec.size_bytes) != 0) return pin_error(errno);
  if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return Status::FromErrno(errno, "seal memfd");
  }
  guard.addr = nullptr;
  BuiltMemfd out;
  out.fd = std::move(fd);
  out.addr = addr;
  out.size_bytes = spec.size_bytes;
  out.page_size = page;
  out.kind = std::move(kind);
  return out;
}

Result<std::unique_ptr<Backing>> CreateMemfdBacking(const MemfdSpec& spec) {
  auto built = BuildMemfd(spec);
  if (!built.ok()) return built.status();
  return std::unique_ptr<Backing>(new MemfdBacking(std::move(built->fd), built->addr,
                                                   built->size_bytes, built->page_size,
                                                   std::move(built->kind)));
}

}  // namespace cxlpool
