// [tiering]: the settings of the engine that moves hot ranges of leases to
// DRAM and cold ones to CXL (docs/daemon.md, "Tiering"). config/ reads the
// table into this struct; TieringOptionsFrom (tiering/lease_adapter.h)
// turns it into the engine's options.
//
// Thread safety: a value.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace cxlpool {

struct TieringConfig {
  bool enabled = true;
  std::chrono::milliseconds interval{1000};    // one policy round
  std::chrono::milliseconds half_life{60000};  // of the access heat
  double hot_threshold = 1.0;                  // temperature (passes per half-life)
  double cold_threshold = 0.1;
  std::chrono::milliseconds min_residency{30000};  // no second move sooner
  double dram_low_watermark = 10;                  // percent of a DRAM pool free: pressure below
  double dram_high_watermark = 20;                 // demotions aim for this
  double cxl_reserve = 2;                          // percent a CXL pool keeps free
  uint64_t rate_limit_mbps = 1024;                 // MiB/s of migration, 0: unlimited
  std::chrono::milliseconds cooperative_deadline{2000};
  std::chrono::milliseconds cooperative_retry{300000};
  std::chrono::milliseconds max_pause{2000};
  // Urgent hints: on-demand rounds at least hint_interval apart; at most
  // max_urgent_hints_per_uid a second per uid (0: no limit).
  std::chrono::milliseconds hint_interval{100};
  uint64_t max_urgent_hints_per_uid = 1000;
  // "auto": idle page tracking when usable, else DAMON; "idle_page", "damon"
  // (only that one); "off"
  std::string sampling = "auto";
};

}  // namespace cxlpool
