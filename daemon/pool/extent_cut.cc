#include "pool/extent_cut.h"

#include <algorithm>

#include "cxlpool/common/strings.h"

namespace cxlpool {
namespace {
constexpr uint64_t k2M = 2ull << 20;
constexpr size_t kMaxLevels = 8;
bool PowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }
}  // namespace

Result<ExtentLadder> ExtentLadder::Make(std::vector<uint64_t> granules) {
  if (granules.empty() || granules.size() > kMaxLevels) {
    return Status(Code::kInvalidArgument,
                  "an extent ladder has 1 to 8 granules, not " + std::to_string(granules.size()));
  }
  for (size_t i = 0; i < granules.size(); ++i) {
    uint64_t g = granules[i];
    if (g == 0 || g % k2M != 0) {
      return Status(Code::kInvalidArgument,
                    "granule " + HumanBytes(g) + " is not a positive multiple of 2 MiB");
    }
    if (i > 0 && (g <= granules[i - 1] || g % granules[i - 1] != 0)) {
      return Status(Code::kInvalidArgument, "granule " + HumanBytes(g) +
                                                " is not a larger multiple of the one below (" +
                                                HumanBytes(granules[i - 1]) + ")");
    }
  }
  ExtentLadder l;
  l.granules_ = std::move(granules);
  return l;
}

ExtentLadder ExtentLadder::Default() {
  ExtentLadder l;
  l.granules_ = {2ull << 20, 32ull << 20, 1ull << 30};
  return l;
}

std::optional<size_t> ExtentLadder::IndexOf(uint64_t granule) const {
  for (size_t i = 0; i < granules_.size(); ++i) {
    if (granules_[i] == granule) return i;
  }
  return std::nullopt;
}

size_t CutPlan::reserve_pieces() const {
  size_t n = 0;
  for (const CutPiece& p : pieces) n += p.source == CutPiece::Source::kReserve;
  return n;
}

std::vector<uint64_t> SmallClasses(uint64_t page_size, const ExtentLadder& ladder) {
  std::vector<uint64_t> out;
  if (page_size < 4096 || !PowerOfTwo(page_size)) return out;
  for (uint64_t c = page_size; c < ladder.smallest(); c *= 2) out.push_back(c);
  return out;
}

Result<CutPlan> PlanCut(uint64_t requested, uint64_t page_size, const ExtentLadder& ladder,
                        std::span<const uint32_t> ready, const CutPolicy& policy,
                        std::span<const uint32_t> small_ready) {
  if (requested == 0) return Status(Code::kInvalidArgument, "size must be greater than 0");
  if (page_size < 4096 || !PowerOfTwo(page_size) || page_size > ladder.smallest()) {
    return Status(Code::kInvalidArgument,
                  "page size " + std::to_string(page_size) + " does not fit the ladder");
  }
  if (ready.size() != ladder.levels()) {
    return Status(Code::kInvalidArgument, "reserve counts for " + std::to_string(ready.size()) +
                                              " granules, the ladder has " +
                                              std::to_string(ladder.levels()));
  }
  const std::vector<uint64_t> small = SmallClasses(page_size, ladder);
  if (small_ready.size() > small.size()) {
    return Status(Code::kInvalidArgument,
                  "reserve counts for " + std::to_string(small_ready.size()) +
                      " small classes, the pool has " + std::to_string(small.size()));
  }
  if (requested > UINT64_MAX - page_size) {
    return Status(Code::kInvalidArgument, "size too large");
  }
  CutPlan plan;
  plan.requested_bytes = requested;
  plan.lease_bytes = (requested + page_size - 1) / page_size * page_size;
  const auto& g = ladder.granules();
  const uint64_t smallest = ladder.smallest();
  uint64_t tail = plan.lease_bytes % smallest;
  uint64_t rem = plan.lease_bytes - tail;
  std::vector<uint32_t> left(ready.begin(), ready.end());
  const uint64_t budget = rem / ladder.largest() + policy.extra_pieces;
  for (size_t i = g.size(); i-- > 0;) {
    while (rem >= g[i] && left[i] > 0 && plan.pieces.size() < budget) {
      plan.pieces.push_back({CutPiece::Source::kReserve, g[i], g[i]});
      plan.reserve_bytes += g[i];
      rem -= g[i];
      --left[i];
    }
  }
  if (rem > 0) {
    // What the reserve could not cover, tail included: one extent built now.
    plan.pieces.push_back({CutPiece::Source::kBuild, 0, rem + tail});
    plan.build_bytes = rem + tail;
  } else if (tail > 0) {
    // The small class that holds the tail, or the one above it: shrinking
    // frees less than 3 x the tail, cheaper than building it (freeing a page
    // costs about a quarter of building one; cxlpool-bench ladder).
    size_t c = 0;
    while (c < small.size() && small[c] < tail) ++c;
    size_t pick = small.size();
    for (size_t i = c; i < std::min(c + 2, small_ready.size()); ++i) {
      if (small_ready[i] > 0) {
        pick = i;
        break;
      }
    }
    if (pick < small.size()) {
      plan.pieces.push_back({CutPiece::Source::kReserve, small[pick], tail});
      plan.reserve_bytes += tail;
      plan.dropped_bytes = small[pick] - tail;
    } else if (tail >= policy.shrink_tail_min && left[0] > 0) {
      plan.pieces.push_back({CutPiece::Source::kReserve, smallest, tail});
      plan.reserve_bytes += tail;
      plan.dropped_bytes = smallest - tail;
    } else {
      plan.pieces.push_back({CutPiece::Source::kBuild, 0, tail});
      plan.build_bytes = tail;
    }
  }
  return plan;
}

}  // namespace cxlpool
