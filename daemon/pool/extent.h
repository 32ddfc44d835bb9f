// Extent: one piece of a lease. A sealed, prefaulted, pinned memfd of one
// granule of the pool's ladder (or of exact size for a small tail), bound
// to the pool's node, THP or hugetlb where the pool has them; built by the
// same steps as any memfd backing (pool/backing.h: BuildMemfd).
//
// Life of an extent (docs/architecture.md, "Extents and the warm reserve"):
//   built  -> in the reserve (the fd never left the daemon; it reads zeros)
//          -> taken for a lease -> MarkExposed() when its fd is handed out
//          -> Retire(): truncated to 0 (every holder's next access SIGBUSes;
//             F_SEAL_GROW keeps anyone from growing it again), unmapped,
//             closed. Its pages go back to the node; the reserve is refilled
//             with fresh memfds, whose pages the kernel zeroes as they are
//             faulted in.
// An extent that was exposed is never given to anyone else: a file that has
// left the daemon may still be open or mapped anywhere (dup'ed, inherited,
// passed on, in a socket queue), and growing it back would show the next
// holder's bytes to all of those. One that never left (reserve stock, or a
// grant refused before its reply went out) may go back to the reserve.
//
// The daemon never reads or writes an extent's memory through its own
// mapping after the extent was exposed: a holder may shrink the file (only
// growing is sealed, so that revoke can truncate), and the daemon would take
// the SIGBUS.
//
// Thread safety: Create is reentrant (run it on a worker). An Extent has one
// owner at a time; it may move between threads with its owner.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "cxlpool/common/status.h"
#include "cxlpool/common/unique_fd.h"
#include "pool/backing.h"

namespace cxlpool {

class Extent {
 public:
  // Builds one extent of spec.size_bytes (BuildMemfd's errors).
  static Result<std::unique_ptr<Extent>> Create(const MemfdSpec& spec);
  ~Extent() { Retire(); }
  Extent(const Extent&) = delete;
  Extent& operator=(const Extent&) = delete;

  int fd() const { return fd_.get(); }
  // The memfd's size now (after ShrinkTo: the shrunk size; 0 once retired).
  uint64_t size_bytes() const { return size_; }
  // The size it was built at.
  uint64_t built_bytes() const { return built_; }
  uint64_t page_size() const { return page_; }
  const std::string& kind() const { return kind_; }  // "memfd", "memfd-thp", "hugetlb-2m"
  int numa_node() const { return node_; }
  // The daemon's mapping (null once retired). Never touch it once exposed.
  void* daemon_addr() const { return addr_; }
  // st_ino / st_dev of the memfd, read when it was built (for the journal).
  uint64_t inode() const { return inode_; }
  uint64_t device() const { return dev_; }

  // The fd was handed to someone other than the daemon (a reply, the fd
  // store): from now on the extent can only be retired.
  void MarkExposed() { exposed_ = true; }
  bool exposed() const { return exposed_; }
  bool retired() const { return !fd_.valid(); }

  // Shrinks a never-exposed extent to `size` bytes (a multiple of the page
  // size, 0 < size <= size_bytes()): the pages beyond go back to the kernel
  // at once (ftruncate). INVALID_ARGUMENT when exposed, retired or `size`
  // does not fit; IO when the kernel refuses.
  Status ShrinkTo(uint64_t size);

  // Truncates to 0, unmaps and closes. Idempotent; the cost is the kernel
  // freeing the pages (a few ms per GiB of huge pages, some 0.3 s per GiB of
  // 4 KiB pages), so retire big extents off the event loop.
  void Retire();

 private:
  Extent() = default;
  UniqueFd fd_;
  void* addr_ = nullptr;
  uint64_t map_bytes_ = 0;  // the daemon mapping's length (the built size)
  uint64_t size_ = 0;
  uint64_t built_ = 0;
  uint64_t page_ = 0;
  std::string kind_;
  int node_ = -1;
  uint64_t inode_ = 0;
  uint64_t dev_ = 0;
  bool exposed_ = false;
};

// A lease's view of an extent taken from the reserve: marks it exposed (its
// fd is about to leave the daemon) and serves it as a Backing; Reclaim
// retires it (never back to the reserve).
std::unique_ptr<Backing> LeaseBacking(std::unique_ptr<Extent> extent);

}  // namespace cxlpool
