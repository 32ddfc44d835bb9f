// Shared pieces of the restart integration tests (tests/restart/): a temp
// state directory, a forked helper process driven over pipes (one command
// byte in, a 64-bit answer out, every wait bounded), the test config, and
// the lease pattern. Real daemons come from tests/stress/stress_util.h.
//
// Thread safety: none; the tests fork processes instead of threads.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>

#include "stress_util.h"

namespace cxlpool::restart {

inline const char* kConfig = R"(
[daemon]
socket_mode = "0666"
log_level = "warning"
[pools]
capacity = "256M"
warm_stock = []
)";

struct TempDir {
  TempDir() {
    char tmpl[] = "/tmp/cxlpool-restart-XXXXXX";
    if (::mkdtemp(tmpl) != nullptr) path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path.empty()) std::filesystem::remove_all(path, ec);
  }
  std::string path;
};

// The pattern written into a lease: `tag` at every 4 KiB.
inline void Fill(void* m, uint64_t size, uint64_t tag) {
  auto* p = static_cast<uint8_t*>(m);
  for (uint64_t off = 0; off + sizeof tag <= size; off += 4096)
    std::memcpy(p + off, &tag, sizeof tag);
}
inline bool Intact(const void* m, uint64_t size, uint64_t tag) {
  auto* p = static_cast<const uint8_t*>(m);
  for (uint64_t off = 0; off + sizeof tag <= size; off += 4096) {
    if (std::memcmp(p + off, &tag, sizeof tag) != 0) return false;
  }
  return true;
}

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

}  // namespace cxlpool::restart
