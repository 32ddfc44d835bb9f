#include "cxlpool/common/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

namespace cxlpool {
namespace {

LogLevel InitialLevel() {
  LogLevel l = LogLevel::kInfo;
  if (const char* e = std::getenv("CXLPOOL_LOG_LEVEL")) ParseLogLevel(e, &l);
  return l;
}

std::atomic<LogLevel> g_level{InitialLevel()};

}  // namespace

void SetLogLevel(LogLevel level) { g_level = level; }
LogLevel GetLogLevel() { return g_level; }

bool ParseLogLevel(const std::string& s, LogLevel* out) {
  if (s == "debug") *out = LogLevel::kDebug;
  else if (s == "info") *out = LogLevel::kInfo;
  else if (s == "warning" || s == "warn") *out = LogLevel::kWarning;
  else if (s == "error") *out = LogLevel::kError;
  else return false;
  return true;
}

LogMessage::LogMessage(LogLevel level, const char* file, int line) : level_(level) {
  static const char* kNames[] = {"D", "I", "W", "E"};
  static const char* kPrio[] = {"<7>", "<6>", "<4>", "<3>"};
  static const bool journal = std::getenv("CXLPOOL_LOG_JOURNAL_PREFIX") != nullptr;
  const char* base = std::strrchr(file, '/');
  if (journal) os_ << kPrio[static_cast<int>(level)];
  os_ << kNames[static_cast<int>(level)] << " " << (base ? base + 1 : file) << ":" << line << "] ";
}

LogMessage::~LogMessage() {
  os_ << '\n';
  std::string s = os_.str();
  ssize_t r = ::write(STDERR_FILENO, s.data(), s.size());
  (void)r;
  (void)level_;
}

}  // namespace cxlpool
