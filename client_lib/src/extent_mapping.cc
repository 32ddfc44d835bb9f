#include "extent_mapping.h"

#include <sys/mman.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <utility>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace cxlpool {
namespace {

constexpr uint64_t kSmallPage = 4096;
constexpr uint64_t kHuge2M = 2ull << 20;
constexpr uint64_t kHuge1G = 1ull << 30;

bool PowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

uint64_t PageOf(uint64_t page_size) { return page_size == 0 ? kSmallPage : page_size; }

std::string Which(size_t i, size_t n) {
  return n == 1 ? std::string("lease fd") : "extent " + std::to_string(i) + "'s fd";
}

// A shared slice: one piece at a page-aligned offset that an off_t holds,
// inside its device (a character device, or a regular file that holds it).
bool SharedSliceFits(const ExtentMapping::Piece& p, const struct stat& st, size_t n,
                     uint64_t page) {
  const uint64_t max = static_cast<uint64_t>(INT64_MAX);
  if (n != 1 || p.device_offset % page != 0 || p.size > max || p.device_offset > max - p.size)
    return false;
  return S_ISCHR(st.st_mode) ||
         (S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) >= p.device_offset + p.size);
}

}  // namespace

ExtentMapping::ExtentMapping(ExtentMapping&& o) noexcept
    : addr_(std::exchange(o.addr_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      extents_(std::move(o.extents_)) {
  o.extents_.clear();
}

ExtentMapping& ExtentMapping::operator=(ExtentMapping&& o) noexcept {
  if (this != &o) {
    Unmap();
    addr_ = std::exchange(o.addr_, nullptr);
    size_ = std::exchange(o.size_, 0);
    extents_ = std::move(o.extents_);
    o.extents_.clear();
  }
  return *this;
}

void ExtentMapping::Unmap() {
  if (addr_ != nullptr) ::munmap(addr_, size_);
  addr_ = nullptr;
  size_ = 0;
  extents_.clear();  // closes the fds
}

uint64_t ExtentMapping::RangeAlignment(const std::vector<Piece>& pieces) {
  uint64_t align = kSmallPage, total = 0;
  bool gib_extent = false;
  for (const Piece& p : pieces) {
    align = std::max(align, PageOf(p.page_size));
    total += p.size;
    gib_extent = gib_extent || p.size >= kHuge1G;
  }
  if (gib_extent) return std::max(align, kHuge1G);
  if (total >= kHuge2M) return std::max(align, kHuge2M);
  return align;
}

Result<ExtentMapping> ExtentMapping::Map(std::vector<Piece> pieces, const std::string& backing,
                                         Populate populate) {
  if (pieces.empty()) return Status(Code::kInvalidArgument, "a lease without extents");
  const size_t n = pieces.size();
  uint64_t total = 0;
  for (size_t i = 0; i < n; ++i) {
    const Piece& p = pieces[i];
    if (!p.fd.valid()) return Status(Code::kInvalidArgument, "no " + Which(i, n));
    if (p.size == 0) return Status(Code::kInvalidArgument, Which(i, n) + ": size 0");
    const uint64_t page = PageOf(p.page_size);
    if (!PowerOfTwo(page) || p.size % page != 0 || total % page != 0) {
      return Status(Code::kInvalidArgument, Which(i, n) + ": " + std::to_string(p.size) +
                                                " bytes at offset " + std::to_string(total) +
                                                " do not fit its page size " +
                                                std::to_string(page));
    }
    if (total > UINT64_MAX - p.size) {
      return Status(Code::kInvalidArgument, "extent sizes overflow");
    }
    total += p.size;
    struct stat st {};
    if (::fstat(p.fd.get(), &st) != 0)
      return Status::FromErrno(errno, "fstat(" + Which(i, n) + ")");
    if (backing == "shared-slice") {
      if (!SharedSliceFits(p, st, n, page)) {
        return Status(Code::kProtocol,
                      "a shared slice is one extent at a page-aligned offset "
                      "inside its device; the daemon announced " +
                          std::to_string(n) + " extent(s), offset " +
                          std::to_string(p.device_offset));
      }
    } else if (p.device_offset != 0) {
      return Status(Code::kProtocol, "a device offset for a " + backing + " lease");
    } else if (S_ISREG(st.st_mode)) {
      if (static_cast<uint64_t>(st.st_size) != p.size) {
        return Status(Code::kProtocol, Which(i, n) + " is " + std::to_string(st.st_size) +
                                           " bytes but the daemon announced " +
                                           std::to_string(p.size));
      }
    } else if (!(S_ISCHR(st.st_mode) && backing == "devdax" && n == 1)) {
      return Status(Code::kProtocol,
                    Which(i, n) + " is neither a regular file nor a devdax device");
    }
  }
  const int populate_flag = populate == Populate::kMapPopulate ? MAP_POPULATE : 0;
  ExtentMapping m;
  if (n == 1) {
    void* addr = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED | populate_flag,
                        pieces[0].fd.get(), static_cast<off_t>(pieces[0].device_offset));
    if (addr == MAP_FAILED) {
      return Status::FromErrno(errno, "mmap(lease, " + std::to_string(total) + " bytes)");
    }
    m.addr_ = addr;
  } else {
    // Reserve the range, aligned, then put each extent in place.
    const uint64_t align = RangeAlignment(pieces);
    if (total > UINT64_MAX - align) return Status(Code::kInvalidArgument, "lease too large");
    const uint64_t span = total + align;
    void* raw =
        ::mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED) {
      return Status::FromErrno(errno,
                               "reserve " + std::to_string(total) + " bytes of address space");
    }
    const uintptr_t lo = reinterpret_cast<uintptr_t>(raw);
    const uintptr_t base = (lo + align - 1) & ~static_cast<uintptr_t>(align - 1);
    if (base > lo) ::munmap(raw, base - lo);
    if (lo + span > base + total) {
      ::munmap(reinterpret_cast<void*>(base + total), lo + span - (base + total));
    }
    m.addr_ = reinterpret_cast<void*>(base);
    uint64_t off = 0;
    for (size_t i = 0; i < n; ++i) {
      void* want = reinterpret_cast<void*>(base + off);
      void* got = ::mmap(want, pieces[i].size, PROT_READ | PROT_WRITE,
                         MAP_SHARED | MAP_FIXED | populate_flag, pieces[i].fd.get(), 0);
      if (got == MAP_FAILED) {
        int err = errno;
        ::munmap(m.addr_, total);
        m.addr_ = nullptr;
        return Status::FromErrno(err, "mmap(" + Which(i, n) + ", " +
                                          std::to_string(pieces[i].size) + " bytes at offset " +
                                          std::to_string(off) + ")");
      }
      off += pieces[i].size;
    }
  }
  m.size_ = total;
  if (populate == Populate::kPopulateWrite && ::madvise(m.addr_, total, MADV_POPULATE_WRITE) != 0) {
    int err = errno;
    m.Unmap();
    return Status::FromErrno(err, "MADV_POPULATE_WRITE of the lease");
  }
  uint64_t off = 0;
  m.extents_.reserve(n);
  for (Piece& p : pieces) {
    m.extents_.push_back(Extent{std::move(p.fd), off, p.size, PageOf(p.page_size)});
    off += p.size;
  }
  return m;
}

}  // namespace cxlpool
