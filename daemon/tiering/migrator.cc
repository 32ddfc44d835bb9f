#include "tiering/migrator.h"

#include <linux/capability.h>
#include <numaif.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "cxlpool/common/proc.h"
#include "cxlpool/common/strings.h"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

namespace cxlpool::tiering {

uint64_t PageCount::On(int node) const {
  auto it = on_node.find(node);
  return it == on_node.end() ? 0 : it->second;
}

std::string PageCount::ToString() const {
  std::string s = std::to_string(pages) + " pages:";
  bool first = true;
  for (const auto& [node, n] : on_node) {
    s +=
        std::string(first ? " " : ", ") + "node " + std::to_string(node) + ": " + std::to_string(n);
    first = false;
  }
  if (absent != 0) s += std::string(first ? " " : ", ") + "absent: " + std::to_string(absent);
  if (errors != 0) {
    s += ", errors: " + std::to_string(errors) + " (" + std::strerror(first_error) + ")";
  }
  return s;
}

namespace {

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string Rate(uint64_t bytes, int64_t ns) {
  if (ns <= 0) return "-";
  double bps = static_cast<double>(bytes) * 1e9 / static_cast<double>(ns);
  return HumanBytes(static_cast<uint64_t>(bps)) + "/s";
}

std::string Ms(int64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f ms", static_cast<double>(ns) / 1e6);
  return buf;
}

// The highest node number the kernel may know (mask sizes).
constexpr int kMaxNodes = 1024;

class Mapped {
 public:
  Mapped() = default;
  ~Mapped() {
    if (addr_ != nullptr) ::munmap(addr_, len_);
  }
  Mapped(const Mapped&) = delete;
  Mapped& operator=(const Mapped&) = delete;

  // Maps [offset, offset + len) of fd read-only and faults its PTEs in.
  Status Map(int fd, uint64_t offset, uint64_t len) {
    len_ = len;
    void* a = ::mmap(nullptr, len, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(offset));
    if (a == MAP_FAILED) return Status::FromErrno(errno, "mmap of the lease range");
    addr_ = a;
    if (::madvise(a, len, MADV_POPULATE_READ) == 0) return Status::Ok();
    int err = errno;
    if (err == EFAULT) {
      return Status(Code::kNotFound,
                    "the lease's file is shorter than the range (truncated: revoked or shrunk)");
    }
    if (err != EINVAL) return Status::FromErrno(err, "madvise(MADV_POPULATE_READ)");
    // A kernel before 5.14: map again with MAP_POPULATE (errors are
    // silent there; the page count afterwards shows what is missing).
    ::munmap(a, len);
    addr_ = nullptr;
    a = ::mmap(nullptr, len, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, static_cast<off_t>(offset));
    if (a == MAP_FAILED) return Status::FromErrno(errno, "mmap(MAP_POPULATE) of the lease range");
    addr_ = a;
    return Status::Ok();
  }
  char* addr() const { return static_cast<char*>(addr_); }

 private:
  void* addr_ = nullptr;
  uint64_t len_ = 0;
};

Status CheckRange(int fd, uint64_t offset, uint64_t length, uint64_t page_size) {
  if (fd < 0) return Status(Code::kInvalidArgument, "no fd for the range");
  if (page_size == 0 || (page_size & (page_size - 1)) != 0) {
    return Status(Code::kInvalidArgument,
                  "page size " + std::to_string(page_size) + " is not a power of two");
  }
  if (length == 0 || length % page_size != 0 || offset % page_size != 0) {
    return Status(Code::kInvalidArgument,
                  "range [" + std::to_string(offset) + ", +" + std::to_string(length) +
                      ") is empty or not aligned to its " + HumanBytes(page_size) + " pages");
  }
  if (offset > UINT64_MAX - length) return Status(Code::kInvalidArgument, "range overflows");
  return Status::Ok();
}

class KernelMigrator final : public Migrator {
 public:
  Result<MoveReport> Move(const MoveRequest& req) override {
    CXLPOOL_RETURN_IF_ERROR(CheckRange(req.fd, req.offset, req.length, req.page_size));
    if (req.target_node < 0 || req.target_node >= kMaxNodes) {
      return Status(Code::kInvalidArgument, "target node " + std::to_string(req.target_node));
    }
    MoveReport rep;
    rep.target_node = req.target_node;
    rep.bytes = req.length;
    int64_t t0 = NowNs();
    Mapped m;
    CXLPOOL_RETURN_IF_ERROR(m.Map(req.fd, req.offset, req.length));
    if (req.count_before) {
      auto before = CountPages(m.addr(), req.length, req.page_size);
      if (!before.ok()) return before.status();
      rep.before = std::move(*before);
    }
    int64_t t1 = NowNs();
    rep.map_ns = t1 - t0;

    std::vector<unsigned long> mask(kMaxNodes / (8 * sizeof(unsigned long)), 0);
    mask[static_cast<size_t>(req.target_node) / (8 * sizeof(unsigned long))] |=
        1ul << (static_cast<unsigned>(req.target_node) % (8 * sizeof(unsigned long)));
    uint64_t step = req.step_bytes == 0 ? req.length : req.step_bytes;
    step = (step + req.page_size - 1) / req.page_size * req.page_size;
    for (uint64_t done = 0; done < req.length;) {
      if (req.cancel != nullptr && req.cancel->load()) {
        rep.cancelled = true;
        break;
      }
      uint64_t n = std::min(step, req.length - done);
      long rc = ::mbind(m.addr() + done, n, MPOL_BIND, mask.data(), kMaxNodes + 1,
                        MPOL_MF_MOVE_ALL | MPOL_MF_STRICT);
      if (rc != 0) {
        int err = errno;
        if (err == EPERM) {
          return Status(Code::kPermissionDenied,
                        "mbind(MPOL_MF_MOVE_ALL) needs CAP_SYS_NICE to move pages other "
                        "processes map (give the daemon CAP_SYS_NICE)");
        }
        if (err == ENOSYS) return Status(Code::kUnsupported, "the kernel has no NUMA (mbind)");
        if (err != EIO && err != EBUSY && err != ENOMEM) {
          return Status::FromErrno(
              err, "mbind(MPOL_BIND, node " + std::to_string(req.target_node) + ", MOVE_ALL)");
        }
        rep.move_errno = err;  // some pages stayed; the count says which
      }
      done += n;
      if (req.max_bytes_per_s != 0 && done < req.length) {
        int64_t due = t1 + static_cast<int64_t>(static_cast<double>(done) * 1e9 /
                                                static_cast<double>(req.max_bytes_per_s));
        int64_t now = NowNs();
        if (due > now) std::this_thread::sleep_for(std::chrono::nanoseconds(due - now));
      }
    }
    // A transient failure (a page locked or busy while a holder writes it):
    // the whole range is asked again, twice at most; mbind skips the pages
    // already on the target, so only the ones that stayed are moved.
    for (int retry = 0; retry < 2 && rep.move_errno != 0 && !rep.cancelled; ++retry) {
      if (::mbind(m.addr(), req.length, MPOL_BIND, mask.data(), kMaxNodes + 1,
                  MPOL_MF_MOVE_ALL | MPOL_MF_STRICT) == 0) {
        rep.move_errno = 0;
      } else if (errno != EIO && errno != EBUSY && errno != ENOMEM) {
        break;
      }
    }
    int64_t t2 = NowNs();
    rep.move_ns = t2 - t1;
    auto after = CountPages(m.addr(), req.length, req.page_size);
    if (!after.ok()) return after.status();
    rep.after = std::move(*after);
    rep.verify_ns = NowNs() - t2;
    return rep;
  }

  Result<PageCount> Where(int fd, uint64_t offset, uint64_t length, uint64_t page_size) override {
    CXLPOOL_RETURN_IF_ERROR(CheckRange(fd, offset, length, page_size));
    Mapped m;
    CXLPOOL_RETURN_IF_ERROR(m.Map(fd, offset, length));
    return CountPages(m.addr(), length, page_size);
  }
};

}  // namespace

std::string MoveReport::ToString() const {
  std::string s = std::string(complete() ? "moved " : "tried to move ") + HumanBytes(bytes) +
                  " to node " + std::to_string(target_node) + " in " + Ms(move_ns) + " (" +
                  Rate(bytes, move_ns) + ")";
  if (cancelled) s += ", cancelled";
  if (move_errno != 0) s += std::string(", mbind: ") + std::strerror(move_errno);
  if (before.pages != 0) s += "; before: " + before.ToString();
  return s + "; verified by move_pages: " + after.ToString();
}

Result<PageCount> CountPages(const void* addr, uint64_t len, uint64_t page_size) {
  if (len == 0 || page_size == 0 || len % page_size != 0 ||
      reinterpret_cast<uintptr_t>(addr) % 4096 != 0) {
    return Status(Code::kInvalidArgument, "CountPages: empty or unaligned range");
  }
  PageCount out;
  constexpr size_t kBatch = 16384;
  std::vector<void*> pages;
  std::vector<int> status;
  pages.reserve(kBatch);
  status.resize(kBatch);
  const char* base = static_cast<const char*>(addr);
  for (uint64_t off = 0; off < len;) {
    pages.clear();
    while (off < len && pages.size() < kBatch) {
      pages.push_back(const_cast<char*>(base + off));
      off += page_size;
    }
    long rc = ::move_pages(0, pages.size(), pages.data(), nullptr, status.data(), 0);
    if (rc != 0) {
      int err = errno;
      if (err == ENOSYS) return Status(Code::kUnsupported, "the kernel has no NUMA (move_pages)");
      return Status::FromErrno(err, "move_pages (query)");
    }
    for (size_t i = 0; i < pages.size(); ++i) {
      int st = status[i];
      ++out.pages;
      if (st >= 0) {
        ++out.on_node[st];
      } else if (st == -ENOENT || st == -EFAULT) {
        ++out.absent;
      } else {
        if (out.errors == 0) out.first_error = -st;
        ++out.errors;
      }
    }
  }
  return out;
}

std::unique_ptr<Migrator> MakeKernelMigrator() { return std::make_unique<KernelMigrator>(); }

bool HaveCapSysNice() { return HaveEffectiveCapability(CAP_SYS_NICE); }

}  // namespace cxlpool::tiering
