// The values the tiering engine is configured with and answers with: its
// options, who calls it, what it is told (RangeSignal) and what it reports
// (TieringReport, MigrationRecord, MigrationOutcome).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tiering/lease_table.h"
#include "tiering/policy.h"
#include "tiering/temperature.h"

namespace cxlpool::tiering {

struct TieringOptions {
  bool enabled = true;
  PolicyConfig policy;
  int64_t half_life_ns = 60'000'000'000;
  int64_t interval_ns = 1'000'000'000;           // one policy round
  uint64_t rate_limit_bytes_per_s = 1ull << 30;  // 0: unlimited
  uint32_t cooperative_deadline_ms = 2000;
  int64_t cooperative_retry_ns = 300'000'000'000;
  // A cooperative move of a range expected to pause its holders longer than
  // this (its size at the throughput measured so far) is not attempted.
  int64_t max_pause_ns = 2'000'000'000;
  // A hot / will_need hint sets the temperature to at least this many times
  // the hot threshold.
  double hint_boost = 2.0;
  // A will_need / dont_need hint that could not be acted on lapses after this.
  int64_t urgent_ttl_ns = 60'000'000'000;
  // On-demand rounds for urgent hints: at most one pending, at least this
  // far apart.
  int64_t urgent_interval_ns = 100'000'000;
  // Urgent hints (will_need, dont_need) a uid may send per second (0: no limit).
  uint32_t max_urgent_hints_per_uid = 1000;
  // Samples: one round at most this often; each adds share x length bytes.
  int64_t sample_interval_ns = 5'000'000'000;
  uint64_t step_bytes = 64ull << 20;
  size_t history = 256;
};

// The answer to a holder's OnMigrationReady.
struct MigrationOutcome {
  bool moved = false;
  int numa_node = -1;  // where the range is now (-1 unknown)
  uint64_t bytes = 0;
  int64_t move_ns = 0;
  std::string detail;
};

struct MigrationRecord {
  uint64_t migration_id = 0;
  int64_t unix_time = 0;
  uint64_t lease_id = 0;
  uint32_t unit = 0;
  uint64_t bytes = 0;
  std::string from_pool;
  std::string to_pool;
  std::string direction;  // "promote", "demote", "resume", "rollback"
  std::string mode;       // "in-place", "cooperative"
  std::string outcome;    // "moved", "rolled back", "split", "refused", "skipped", "failed", "gone"
  std::string why;        // the policy's reason
  std::string detail;     // what happened (the migrator's report, the error)
  int64_t move_ns = 0;
  int64_t pause_ns = 0;  // cooperative: first holder ready -> answers sent
};

struct UnitReport {
  uint32_t unit = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  std::string pool;
  int numa_node = -1;
  double temperature = 0;
  std::string verdict;
  uint64_t bytes_read = 0;  // signalled by holders, since start
  uint64_t bytes_written = 0;
  uint64_t hints = 0;
  uint64_t sampled_pages = 0;  // sampler
  uint64_t accessed_pages = 0;
  int64_t last_moved_unix = 0;
};

struct LeaseReport {
  uint64_t id = 0;
  std::string label;
  uint32_t owner_uid = 0;
  int32_t priority = 0;
  bool opted_out = false;
  bool cooperative = false;
  std::string cooperative_state;
  std::string moving;  // a move under way or left split
  std::vector<UnitReport> units;
};

struct TieringReport {
  bool enabled = false;
  std::string disabled_why;
  std::string sampler;
  std::string kernel;
  uint64_t rate_limit_bytes_per_s = 0;
  double hot_threshold = 0;
  double cold_threshold = 0;
  int64_t half_life_ns = 0;
  std::vector<std::string> pressure;
  std::string in_flight;
  std::vector<LeaseReport> leases;
  std::vector<MigrationRecord> history;  // oldest first
  std::map<std::string, uint64_t> counters;
};

// Who sent a request: its connection, its uid, whether it is an admin.
struct Caller {
  ConnId conn = 0;
  uid_t uid = static_cast<uid_t>(-1);
  bool admin = false;
};

// Bytes a holder copied through a range of a lease, or a hint for it.
struct RangeSignal {
  uint64_t lease_id = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
  std::optional<Hint> hint;
};

}  // namespace cxlpool::tiering
