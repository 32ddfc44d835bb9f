// ExtentMapping: the client's view of a lease, its extents (one fd each)
// mapped MAP_SHARED, PROT_READ|PROT_WRITE, back to back into one contiguous
// range, populated, after checking with fstat that every fd is what the
// daemon announced.
//
// A lease of one extent is mapped where the kernel puts it (one mmap, as
// every lease was before extents). A lease of several is mapped into one
// reserved range: mmap(PROT_NONE, MAP_NORESERVE) of the size plus slack, cut
// to a base aligned to the largest page size that can map it (the extents'
// own page size, at least 2 MiB for a lease of 2 MiB or more, 1 GiB when an
// extent is that large: THP and hugetlb then map with huge pages), then
// mmap(MAP_FIXED) of each extent at its offset. So data() is one buffer, and
// CUDA registers it in chunks as it would one mapping (cuda_driver.h).
//
// The mapping owns the fds as well as the range: they stay open for the
// life of the lease so that they can be handed back to a restarted daemon
// (reclaim). Nothing here refers to the connection the fds came from.
//
// Thread safety: like a unique_ptr; one owner at a time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cxlpool/common/status.h"
#include "cxlpool/common/unique_fd.h"

namespace cxlpool {

class ExtentMapping {
 public:
  // One extent to map, in lease order.
  struct Piece {
    UniqueFd fd;
    uint64_t size = 0;       // exactly the fd's size (fstat), or the device's span
    uint64_t page_size = 0;  // 0: 4 KiB
    // Where the piece starts in its fd: a shared device's slice
    // (backing "shared-slice"); 0 for every other lease.
    uint64_t device_offset = 0;
  };
  struct Extent {
    UniqueFd fd;
    uint64_t offset = 0;
    uint64_t size = 0;
    uint64_t page_size = 0;
  };
  // How mapped pages are made present before Map returns.
  enum class Populate { kMapPopulate, kPopulateWrite, kNone };

  ExtentMapping() = default;
  ~ExtentMapping() { Unmap(); }
  ExtentMapping(ExtentMapping&& o) noexcept;
  ExtentMapping& operator=(ExtentMapping&& o) noexcept;
  ExtentMapping(const ExtentMapping&) = delete;
  ExtentMapping& operator=(const ExtentMapping&) = delete;

  // Maps `pieces` (at least one) in order. Each fd must be a regular file
  // (memfd, hugetlbfs) of exactly its size, or, when `backing` is "devdax"
  // and there is one piece, a character device (whose size fstat cannot
  // tell). A "shared-slice" lease is one piece at its device_offset of a
  // character device, or of a regular file that holds it (tests, labs). Errors: INVALID_ARGUMENT
  // (no piece, size 0, bad fd, page size not a power of two, sizes that overflow), PROTOCOL (an
  // fd's size or type does not match the daemon's reply), RESOURCE_EXHAUSTED / IO (mmap). On error
  // nothing stays mapped and every fd is closed.
  static Result<ExtentMapping> Map(std::vector<Piece> pieces, const std::string& backing,
                                   Populate populate = Populate::kMapPopulate);
  // The alignment Map gives the range of a multi-extent lease.
  static uint64_t RangeAlignment(const std::vector<Piece>& pieces);

  void* data() const { return addr_; }
  uint64_t size() const { return size_; }
  bool mapped() const { return addr_ != nullptr; }
  const std::vector<Extent>& extents() const { return extents_; }
  // The fd of a one-extent lease; -1 for a lease of several (reclaim of
  // those hands back every extent's fd: extents()).
  int fd() const { return extents_.size() == 1 ? extents_.front().fd.get() : -1; }

  // munmap the range and close every fd; idempotent.
  void Unmap();

 private:
  void* addr_ = nullptr;
  uint64_t size_ = 0;
  std::vector<Extent> extents_;
};

}  // namespace cxlpool
