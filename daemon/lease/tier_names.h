// The one table of tier names: the tiers a lease is placed in (a placement's
// tier preference) and charged under (a quota rule's tier). A tier is the
// kind of a pooled node (topology's NodeKindName; GPU memory is never
// pooled, so "gpu" is not one) or "devdax" for the devdax pools.
//
// Thread safety: constants and pure functions.
#pragma once

#include <array>
#include <string>
#include <string_view>

namespace cxlpool {

inline constexpr std::array<std::string_view, 6> kTierNames = {"dram", "cxl",     "hbm",
                                                               "nvm",  "unknown", "devdax"};

inline bool IsTierName(std::string_view t) {
  for (std::string_view n : kTierNames) {
    if (t == n) return true;
  }
  return false;
}

// The tiers offered in messages: "dram, cxl, hbm, nvm, devdax" ("unknown",
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
