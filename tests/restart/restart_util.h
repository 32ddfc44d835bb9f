// Shared pieces of the restart integration tests (tests/restart/): a forked
// helper process driven over pipes (one command byte in, a 64-bit answer
// out, every wait bounded). Real daemons, temp dirs, the test config and the
// lease pattern come from tests/support (test_support.h, kill_loop.h).
//
// Thread safety: none; the tests fork processes instead of threads.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>

#include "kill_loop.h"
#include "test_support.h"

namespace cxlpool::restart {

using testsupport::Fill;
using testsupport::Intact;
using testsupport::kRestartConfig;
using testsupport::TempDir;

// kRestartConfig with request-path builds cut into 2 MiB extents
// (daemon.max_extent): a lease of 2n MiB is n memfds.
inline constexpr const char* kExtentConfig = R"(
[daemon]
socket_mode = "0666"
log_level = "warning"
max_extent = "2M"
[pools]
capacity = "256M"
)";

// A helper process. Its body gets the command it was sent and returns the
// answer; command 'q' ends it (exit 0).
class Helper {
 public:
  using Body = std::function<uint64_t(char cmd)>;
  explicit Helper(Body body) {
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) return;
    std::fflush(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(in[1]);
      ::close(out[0]);
      for (;;) {
        char c = 0;
        if (::read(in[0], &c, 1) != 1 || c == 'q') std::_Exit(0);
        uint64_t v = body(c);
        if (::write(out[1], &v, sizeof v) != sizeof v) std::_Exit(3);
      }
    }
    ::close(in[0]);
    ::close(out[1]);
    to_ = in[1];
    from_ = out[0];
  }
  ~Helper() {
    Kill();
    if (to_ >= 0) ::close(to_);
    if (from_ >= 0) ::close(from_);
  }
  Helper(const Helper&) = delete;
  Helper& operator=(const Helper&) = delete;

  // Sends `cmd` and waits (at most `timeout_ms`) for the answer.
  std::optional<uint64_t> Ask(char cmd, int timeout_ms = 30000) {
    if (::write(to_, &cmd, 1) != 1) return std::nullopt;
    pollfd p{from_, POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) != 1) return std::nullopt;
    uint64_t v = 0;
    if (::read(from_, &v, sizeof v) != sizeof v) return std::nullopt;
    return v;
  }
  void Kill() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int to_ = -1;
  int from_ = -1;
};

// What the daemon on `socket` accounts now, read as an admin client named
// `who`.
inline Result<testsupport::Accounting> Snapshot(const std::string& socket,
                                                const std::string& who = "restart-checker") {
  auto admin = testsupport::RawClient::Connect(socket, who);
  if (!admin.ok()) return admin.status();
  return testsupport::ReadAccounting(*admin);
}

// Whether the daemon on `socket` says, in its HELLO reply, that it is in its
// restart grace period.
inline bool InGrace(const std::string& socket) {
  auto c = testsupport::RawClient::Connect(socket, "restart-probe");
  return c.ok() && c->hello().in_grace_period();
}

// Waits (up to `limit_ms`) until the daemon on `socket` holds lease `id`
// for one holder again (owned by `owner`, unless 0), out of its grace period
// and with accounting that agrees; `*last` says what was seen last.
// `grace_may_run`: the grace period may still run (after journal damage it
// runs its full length whatever is reclaimed).
inline bool HeldAgainByOne(const std::string& socket, uint64_t id, pid_t owner, std::string* last,
                           int limit_ms = 20000, bool grace_may_run = false) {
  return testsupport::PollUntil(
      [&] {
        auto a = Snapshot(socket);
        if (!a.ok()) return false;
        auto it = a->leases.find(id);
        if (it == a->leases.end()) {
          *last = "lease not listed";
          return false;
        }
        *last = "holders " + std::to_string(it->second.holders());
        return it->second.holders() == 1 &&
               (owner == 0 || it->second.owner_pid() == static_cast<uint32_t>(owner)) &&
               (grace_may_run || !InGrace(socket)) && a->Inconsistencies().empty();
      },
      limit_ms, 5);
}

}  // namespace cxlpool::restart
