// Minimal leveled logging to stderr (journald picks it up under systemd,
// with the <N> priority prefix when CXLPOOL_LOG_JOURNAL_PREFIX is set).
//
//   CXLPOOL_LOG(kWarning) << "node " << id << ": no meminfo";
//
// Thread safety: each statement is written with one write(2); safe from any
// thread. SetLogLevel is not synchronised with concurrent logging.
#pragma once

#include <sstream>

namespace cxlpool {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
// Parses "debug"/"info"/"warning"/"error"; false if unknown.
bool ParseLogLevel(const std::string& s, LogLevel* out);

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();
  std::ostream& stream() { return os_; }

 private:
  LogLevel level_;
  std::ostringstream os_;
};

}  // namespace cxlpool

#define CXLPOOL_LOG(level)                                                 \
  if (::cxlpool::LogLevel::level < ::cxlpool::GetLogLevel()) {             \
  } else                                                                   \
    ::cxlpool::LogMessage(::cxlpool::LogLevel::level, __FILE__, __LINE__).stream()
