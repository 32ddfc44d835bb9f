// MigrationLog: the engine's record of what it did. A bounded history of
// migrations, oldest first, each with its reason and outcome, logged as it is
// recorded; and the counters (`cxlpoolctl tiering`, the metrics).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <string>

#include "tiering/engine_types.h"

namespace cxlpool::tiering {

class MigrationLog {
 public:
  // Keeps the last `history` records (at least one).
  explicit MigrationLog(size_t history) : history_limit_(history) {}

  void Count(const std::string& key, uint64_t by = 1) { counters_[key] += by; }
  const std::map<std::string, uint64_t>& counters() const { return counters_; }

  // Appends `r` (dropping the oldest beyond the limit), counts
  // migrations_<outcome> and logs it: info when moved, else a warning.
  void Record(MigrationRecord r);
  // The pause the last recorded migration held its holders for.
  void SetLastPause(int64_t pause_ns);
  const std::deque<MigrationRecord>& history() const { return history_; }

 private:
  size_t history_limit_;
  std::deque<MigrationRecord> history_;
  std::map<std::string, uint64_t> counters_;
};

// "1.5 ms", "2.0 s": durations in the engine's texts.
std::string Ms(int64_t ns);
std::string Secs(int64_t ns);

}  // namespace cxlpool::tiering
