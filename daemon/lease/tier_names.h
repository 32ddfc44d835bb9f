// The one table of tier names: the tiers a lease is placed in (a placement's
// tier preference) and charged under (a quota rule's tier). A tier is the
// kind of a pooled node (topology's NodeKindName; GPU memory is never
// pooled, so "gpu" is not one), "devdax" for the devdax pools or "shared"
// for the slices of CXL devices the rack's hosts share.
//
// Thread safety: constants and pure functions.
#pragma once

#include <array>
#include <string>
#include <string_view>

namespace cxlpool {

inline constexpr std::array<std::string_view, 7> kTierNames = {"dram",    "cxl",    "hbm",   "nvm",
                                                               "unknown", "devdax", "shared"};

inline bool IsTierName(std::string_view t) {
  for (std::string_view n : kTierNames) {
    if (t == n) return true;
  }
  return false;
}

// The tiers offered in messages: "dram, cxl, hbm, nvm, devdax, shared" ("unknown",
// the kind of an unclassified node, is accepted but not suggested).
inline std::string TierNamesHint() {
  std::string out;
  for (std::string_view n : kTierNames) {
    if (n == "unknown") continue;
    if (!out.empty()) out += ", ";
    out += n;
  }
  return out;
}

}  // namespace cxlpool
