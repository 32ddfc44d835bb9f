// ServerCounters: the server's running counts (ServerStats without the
// levels that Admission knows) and its limit warnings, at most one log line
// per limit and second.
//
// Thread safety: single-owner (the server's event-loop thread).
#pragma once

#include <chrono>
#include <map>
#include <string>

#include "server/server.h"

namespace cxlpool {

class ServerCounters {
 public:
  void AcceptError() { ++stats_.accept_errors; }
  void Accepted() { ++stats_.accepted; }
  void FrameIn() { ++stats_.frames_in; }
  void FrameOut() { ++stats_.frames_out; }
  void ProtocolError() { ++stats_.protocol_errors; }
  // A refusal or drop for `limit` (its key without "limits.").
  void Hit(const char* limit) { ++stats_.limit_hits[limit]; }
  // Logs `line` as a warning naming the limit, unless one for the same limit
  // went out less than a second ago (then counts it for the next line).
  void LogLimit(const std::string& limit, const std::string& line);

  const ServerStats& stats() const { return stats_; }

 private:
  struct LogGate {
    std::chrono::steady_clock::time_point last;
    uint64_t suppressed = 0;
  };
  ServerStats stats_;
  std::map<std::string, LogGate> log_gates_;
};

}  // namespace cxlpool
