#include "tiering/migration_log.h"

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <utility>

#include "cxlpool/common/log.h"

namespace cxlpool::tiering {

std::string Ms(int64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f ms", static_cast<double>(ns) / 1e6);
  return buf;
}

std::string Secs(int64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", static_cast<double>(ns) / 1e9);
  return buf;
}

void MigrationLog::Record(MigrationRecord r) {
  const std::string outcome = r.outcome;
  std::ostringstream line;
  line << "tiering: " << outcome << " (" << r.mode << " " << r.direction << ", migration "
       << r.migration_id << "): " << r.why << ": " << r.detail
       << (r.move_ns > 0 ? " [" + Ms(r.move_ns) + "]" : "");
  history_.push_back(std::move(r));
  while (history_.size() > std::max<size_t>(history_limit_, 1)) history_.pop_front();
  Count("migrations_" + std::string(outcome == "rolled back" ? "rolled_back" : outcome));
  if (outcome == "moved") {
    CXLPOOL_LOG(kInfo) << line.str();
  } else {
    CXLPOOL_LOG(kWarning) << line.str();
  }
}

void MigrationLog::SetLastPause(int64_t pause_ns) {
  if (!history_.empty()) history_.back().pause_ns = pause_ns;
}

}  // namespace cxlpool::tiering
