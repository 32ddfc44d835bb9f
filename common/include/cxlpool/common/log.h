// Leveled logging for the daemon and the tools.
//
//   CXLPOOL_LOG(kWarning) << "node " << id << ": no meminfo";
//
// Where a line goes and how it looks depends on the process's stderr, found
// once at start (and again by DetectLogDestination):
//   - stderr is the journal (systemd sets $JOURNAL_STREAM to the stream's
//     "device:inode", and stderr's fstat matches): "<4>W app.cc:88] text",
//     the sd-daemon priority prefix (sd-daemon(3)) and no timestamp, since
//     journald stamps each entry itself; `journalctl -p warning` filters on it;
//   - anything else (a terminal, a file, a pipe): "2026-01-05 12:34:56.789
//     W app.cc:88] text", local time with milliseconds;
//   - after LogToSyslog(): syslog(3) with the level's priority (the
//     daemon's background mode, whose stderr is /dev/null).
//
// Thread safety: each statement is written with one write(2) (or one
// syslog call); safe from any thread. SetLogLevel, DetectLogDestination and
// LogToSyslog are not synchronised with concurrent logging: call them at
// start, before other threads log.
#pragma once

#include <sstream>
#include <string>

namespace cxlpool {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
// Parses "debug"/"info"/"warning"/"error"; false if unknown.
bool ParseLogLevel(const std::string& s, LogLevel* out);

// True when `journal_stream` ($JOURNAL_STREAM, "dev:ino" in decimal) names
// the file `fd` is open on. False for null, garbage or another file.
bool FdIsJournalStream(const char* journal_stream, int fd);

// Re-reads $JOURNAL_STREAM against stderr (done once automatically).
void DetectLogDestination();
// From now on lines go to syslog(3) as `ident` (facility LOG_DAEMON).
void LogToSyslog(const char* ident);
// Whether lines carry sd-daemon priority prefixes (stderr is the journal).
bool LogIsJournal();

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();
  std::ostream& stream() { return os_; }

 private:
  LogLevel level_;
  size_t body_ = 0;  // where the text after the prefix starts (for syslog)
  std::ostringstream os_;
};

}  // namespace cxlpool

#define CXLPOOL_LOG(level)                                     \
  if (::cxlpool::LogLevel::level < ::cxlpool::GetLogLevel()) { \
  } else                                                       \
    ::cxlpool::LogMessage(::cxlpool::LogLevel::level, __FILE__, __LINE__).stream()
