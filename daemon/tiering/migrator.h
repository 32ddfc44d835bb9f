// Migrator: the seam through which the tiering engine moves a range of a
// lease's memory to another NUMA node, and asks the kernel where it is.
//
// KernelMigrator moves pages in place: the holders keep their mappings,
// their virtual addresses stay valid, and no byte is copied by anyone but the
// kernel. For a range of a memfd it
//   1. maps the range itself (MAP_SHARED, read-only: it never touches the
//      memory) and faults the page-table entries in (MADV_POPULATE_READ;
//      a truncated or shrunk file is an error here, never a SIGBUS);
//   2. mbind(MPOL_BIND, target, MPOL_MF_MOVE_ALL | MPOL_MF_STRICT) in steps
//      of `step_bytes`, paced to `max_bytes_per_s`. On a shmem mapping this
//      also replaces the file's shared policy for the range, so pages the
//      kernel allocates later (swap-in, compaction) stay on the target;
//      MPOL_MF_MOVE_ALL moves pages mapped by other processes too, which
//      needs CAP_SYS_NICE (PERMISSION_DENIED without it);
//   3. asks move_pages(2) (no target nodes: it only reports) where every
//      page of the range is, and reports the count per node.
// A move is complete only when that count says every page is on the
// target; a page the kernel could not move (a long-term pin holds it, the
// target is full) stays where it was and shows in the count.
//
// Thread safety: KernelMigrator is stateless; Move and Where may run on
// any thread, concurrently. Run them off the event loop: a move costs about
// as much as copying the range.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "cxlpool/common/status.h"

namespace cxlpool::tiering {

// Where the kernel says pages are.
struct PageCount {
  uint64_t pages = 0;               // pages asked about
  std::map<int, uint64_t> on_node;  // node -> pages there
  uint64_t absent = 0;              // not resident / not mapped (-ENOENT, -EFAULT)
  uint64_t errors = 0;              // any other per-page status
  int first_error = 0;              // errno of the first such page, 0 none

  uint64_t On(int node) const;
  // "262144 pages: node 0: 262100, node 1: 44"
  std::string ToString() const;
};

// Where the pages of [addr, addr + len) of this process are, one query per
// `page_size` (move_pages with no nodes). INVALID_ARGUMENT (len or page_size
// 0, not aligned), UNSUPPORTED (no NUMA in the kernel), IO.
Result<PageCount> CountPages(const void* addr, uint64_t len, uint64_t page_size);

struct MoveRequest {
  int fd = -1;  // the memfd holding the range (borrowed for the call)
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t page_size = 4096;  // the backing's page size (2 MiB for hugetlb)
  int target_node = -1;
  uint64_t max_bytes_per_s = 0;               // pacing; 0 none
  uint64_t step_bytes = 64ull << 20;          // one mbind call each
  bool count_before = true;                   // also count where the pages were first
  const std::atomic<bool>* cancel = nullptr;  // checked between steps
};

struct MoveReport {
  int target_node = -1;
  uint64_t bytes = 0;
  PageCount before;  // when count_before
  PageCount after;
  int64_t map_ns = 0;     // mapping and populating the range
  int64_t move_ns = 0;    // the mbind steps (and the pacing sleeps)
  int64_t verify_ns = 0;  // move_pages over every page
  int move_errno = 0;     // the last mbind error (EIO: some pages did not move)
  bool cancelled = false;

  bool complete() const { return after.pages > 0 && after.On(target_node) == after.pages; }
  // "moved 1.0 GiB to node 1 in 212 ms (4.8 GiB/s); verified: 262144 pages: node 1: 262144"
  std::string ToString() const;
};

class Migrator {
 public:
  virtual ~Migrator() = default;
  // Moves the range to req.target_node and reports where it is afterwards
  // (the report is returned even when not every page moved: check
  // complete()). Errors: INVALID_ARGUMENT (bad range, node), NOT_FOUND (the
  // file is shorter than the range: truncated, revoked), PERMISSION_DENIED
  // (no CAP_SYS_NICE), UNSUPPORTED (no NUMA), IO.
  virtual Result<MoveReport> Move(const MoveRequest& req) = 0;
  // Where the range's pages are now, without moving them. Errors as Move.
  virtual Result<PageCount> Where(int fd, uint64_t offset, uint64_t length, uint64_t page_size) = 0;
};

std::unique_ptr<Migrator> MakeKernelMigrator();

// CAP_SYS_NICE in this process's effective set (MPOL_MF_MOVE_ALL needs it).
bool HaveCapSysNice();

}  // namespace cxlpool::tiering
