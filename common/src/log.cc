#include "cxlpool/common/log.h"

#include <sys/stat.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>

namespace cxlpool {
namespace {

LogLevel InitialLevel() {
  LogLevel l = LogLevel::kInfo;
  if (const char* e = std::getenv("CXLPOOL_LOG_LEVEL")) ParseLogLevel(e, &l);
  return l;
}

enum class Destination { kStderr, kJournal, kSyslog };

Destination Detect() {
  return FdIsJournalStream(std::getenv("JOURNAL_STREAM"), STDERR_FILENO) ? Destination::kJournal
                                                                         : Destination::kStderr;
}

std::atomic<LogLevel> g_level{InitialLevel()};
Destination g_destination = Detect();

}  // namespace

void SetLogLevel(LogLevel level) { g_level = level; }
LogLevel GetLogLevel() { return g_level; }

bool ParseLogLevel(const std::string& s, LogLevel* out) {
  if (s == "debug")
    *out = LogLevel::kDebug;
  else if (s == "info")
    *out = LogLevel::kInfo;
  else if (s == "warning" || s == "warn")
    *out = LogLevel::kWarning;
  else if (s == "error")
    *out = LogLevel::kError;
  else
    return false;
  return true;
}

bool FdIsJournalStream(const char* journal_stream, int fd) {
  if (journal_stream == nullptr) return false;
  uintmax_t dev = 0, ino = 0;
  int end = 0;
  if (std::sscanf(journal_stream, "%ju:%ju%n", &dev, &ino, &end) != 2 ||
      journal_stream[end] != '\0') {
    return false;
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) return false;
  return static_cast<uintmax_t>(st.st_dev) == dev && static_cast<uintmax_t>(st.st_ino) == ino;
}

void DetectLogDestination() { g_destination = Detect(); }

void LogToSyslog(const char* ident) {
  ::openlog(ident, LOG_PID | LOG_NDELAY, LOG_DAEMON);
  g_destination = Destination::kSyslog;
}

bool LogIsJournal() { return g_destination == Destination::kJournal; }

LogMessage::LogMessage(LogLevel level, const char* file, int line) : level_(level) {
  static const char* kNames[] = {"D", "I", "W", "E"};
  static const char* kPrio[] = {"<7>", "<6>", "<4>", "<3>"};
  const char* base = std::strrchr(file, '/');
  if (g_destination == Destination::kJournal) {
    os_ << kPrio[static_cast<int>(level)];
  } else if (g_destination == Destination::kStderr) {
    struct timespec ts;
    ::clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    ::localtime_r(&ts.tv_sec, &tm);
    char stamp[40];
    size_t n = std::strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", &tm);
    std::snprintf(stamp + n, sizeof stamp - n, ".%03ld ", ts.tv_nsec / 1000000);
    os_ << stamp;
  }
  body_ = static_cast<size_t>(os_.tellp());
  os_ << kNames[static_cast<int>(level)] << " " << (base ? base + 1 : file) << ":" << line << "] ";
}

LogMessage::~LogMessage() {
  if (g_destination == Destination::kSyslog) {
    static const int kSyslogPrio[] = {LOG_DEBUG, LOG_INFO, LOG_WARNING, LOG_ERR};
    ::syslog(kSyslogPrio[static_cast<int>(level_)], "%s", os_.str().c_str() + body_);
    return;
  }
  os_ << '\n';
  std::string s = os_.str();
  ssize_t r = ::write(STDERR_FILENO, s.data(), s.size());
  (void)r;
}

}  // namespace cxlpool
