// Forked tenant processes for the tests that pit one uid against another
// (tests/stress): a Channel of newline-separated messages between parent and
// child, and a Tenant, a child that runs a body as another uid.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>

#include "cxlpool/common/unique_fd.h"

namespace cxlpool::testsupport {

// Newline-separated messages over a pair of pipes between parent and child.
class Channel {
 public:
  Channel();
  // Child side.
  void Tell(const std::string& line) { Write(up_w_.get(), line); }
  std::string Hear(int timeout_ms = 120000) { return Read(down_r_.get(), &down_buf_, timeout_ms); }
  // Parent side.
  void Say(const std::string& line) { Write(down_w_.get(), line); }
  std::string Listen(int timeout_ms = 120000) { return Read(up_r_.get(), &up_buf_, timeout_ms); }

 private:
  static void Write(int fd, const std::string& line);
  // The next line; "<timeout>" after `timeout_ms`, "<eof>" when the other
  // side is gone.
  static std::string Read(int fd, std::string* buf, int timeout_ms);
  UniqueFd down_r_, down_w_, up_r_, up_w_;
  std::string down_buf_, up_buf_;
};

// A forked process as `uid` (RLIMIT_NOFILE 65536, killed with its parent)
// running `body(channel)`, whose return value is its exit status; killed and
// reaped at destruction if still running. Needs root to change uid (the
// child exits 90 when it cannot).
class Tenant {
 public:
  Tenant(uid_t uid, const std::function<int(Channel&)>& body);
  ~Tenant();
  Tenant(const Tenant&) = delete;
  Tenant& operator=(const Tenant&) = delete;
  Channel& channel() { return channel_; }
  // Reaps it: its exit status, or 128 + the signal that ended it.
  int Wait();

 private:
  Channel channel_;
  pid_t pid_ = -1;
};

}  // namespace cxlpool::testsupport
