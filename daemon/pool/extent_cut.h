// Extent ladder and lease cut: which extents make up a lease.
//
// The ladder is a short list of granule sizes (default 2 MiB, 32 MiB,
// 1 GiB: docs/benchmarks.md, "ladder and recycle", has the measurements
// behind it). A lease of `requested` bytes is first rounded up to the pool's page
// size (the only waste: under 4 KiB, or under 2 MiB for hugetlb pools),
// then cut, largest granule first, into whole granules the reserve has
// ready; what the reserve cannot cover becomes one extent built on the
// request path (with the tail); a tail below the smallest granule is one
// prebuilt small extent (SmallClasses: powers of two from the page size up
// to half the smallest granule) of the tail's class or the one above it,
// shrunk to the tail; else one reserve extent of the smallest granule shrunk
// to the tail; or, under CutPolicy::shrink_tail_min, an extent built at exact
// size (truncating most of a prefaulted 2 MiB costs more than building a
// small one). So a lease smaller than the smallest granule is always one
// exact-size memfd, and shrinking frees less than three times what it keeps.
//
// Every piece but the last is a multiple of the smallest granule, and the
// pieces come largest first, so each starts at an offset aligned to 2 MiB
// (a 1 GiB piece at 1 GiB): THP and hugetlb map them with huge pages. A
// lease from a full reserve has at most (size / largest) + sum over the
// other granules of (next / granule - 1) + 1 pieces: with the default
// ladder, one per GiB plus 47.
//
// Thread safety: pure values and functions.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "cxlpool/common/status.h"

namespace cxlpool {

class ExtentLadder {
 public:
  // 1..8 granules, ascending, each a multiple of 2 MiB and of the one below.
  // INVALID_ARGUMENT (naming the granule) otherwise.
  static Result<ExtentLadder> Make(std::vector<uint64_t> granules);
  // 2 MiB, 32 MiB, 1 GiB.
  static ExtentLadder Default();

  const std::vector<uint64_t>& granules() const { return granules_; }
  size_t levels() const { return granules_.size(); }
  uint64_t smallest() const { return granules_.front(); }
  uint64_t largest() const { return granules_.back(); }
  std::optional<size_t> IndexOf(uint64_t granule) const;

 private:
  std::vector<uint64_t> granules_;
};

struct CutPolicy {
  // A tail of at least this many bytes comes from a shrunk reserve extent;
  // a smaller one is built at its exact size (cxlpool-bench ladder: freeing
  // the unused rest of a 2 MiB extent of 4 KiB pages costs ~65 us per MiB,
  // building costs ~230 us per MiB kept; they cross near 450 KiB).
  uint64_t shrink_tail_min = 512ull << 10;
  // Pieces the reserve may give beyond one per largest granule of the lease
  // (falling back to smaller granules when the large ones run out); the rest
  // of the lease is built.
  uint32_t extra_pieces = 64;
};

// The sizes of the reserve's small extents for a pool of `page_size` pages:
// page_size, 2 x page_size, ... below the smallest granule (4 KiB .. 1 MiB
// on the default ladder); none for hugetlb pools (every lease is a multiple
// of the smallest granule's page).
std::vector<uint64_t> SmallClasses(uint64_t page_size, const ExtentLadder& ladder);

struct CutPiece {
  enum class Source { kReserve, kBuild };
  Source source = Source::kBuild;
  // kReserve: the granule (or small class) taken; the piece may be shrunk.
  uint64_t granule = 0;
  uint64_t bytes = 0;  // the extent's size in the lease
};

struct CutPlan {
  uint64_t requested_bytes = 0;
  uint64_t lease_bytes = 0;      // requested, rounded up to the page size
  std::vector<CutPiece> pieces;  // in lease order
  uint64_t reserve_bytes = 0;    // lease bytes from the reserve
  uint64_t build_bytes = 0;      // lease bytes built on the request path
  uint64_t dropped_bytes = 0;    // reserve bytes shrunk away (back to the kernel)

  uint64_t waste_bytes() const { return lease_bytes - requested_bytes; }
  size_t reserve_pieces() const;
};

// Cuts a lease of `requested` bytes for a pool of `page_size` pages, with
// `ready[i]` extents of ladder granule i in the reserve and `small_ready[i]`
// of SmallClasses(page_size, ladder)[i] (empty: no small extents).
// INVALID_ARGUMENT: requested 0 or too large, page_size not a power of two
// of at least 4 KiB or larger than the smallest granule, ready.size() !=
// ladder levels, small_ready longer than the small classes.
Result<CutPlan> PlanCut(uint64_t requested, uint64_t page_size, const ExtentLadder& ladder,
                        std::span<const uint32_t> ready, const CutPolicy& policy = {},
                        std::span<const uint32_t> small_ready = {});

}  // namespace cxlpool
