#include "server/counters.h"

#include "cxlpool/common/log.h"

namespace cxlpool {

void ServerCounters::LogLimit(const std::string& limit, const std::string& line) {
  LogGate& g = log_gates_[limit];
  const auto now = std::chrono::steady_clock::now();
  if (g.last != std::chrono::steady_clock::time_point() && now - g.last < std::chrono::seconds(1)) {
    ++g.suppressed;
    return;
  }
  CXLPOOL_LOG(kWarning) << "server: " << line << " (limits." << limit << ")"
                        << (g.suppressed > 0 ? "; " + std::to_string(g.suppressed) +
                                                   " more like it in the last second"
                                             : std::string());
  g.last = now;
  g.suppressed = 0;
}

}  // namespace cxlpool
