// The C ABI scenario (c_abi_scenario.c) against a real cxlpoold on a temp
// socket: the daemon's pid is tracked and it is stopped with SIGTERM, never
// by name. Exits 77 when the daemon has not been built.
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "c_abi_scenario.h"

namespace {

bool Accepting(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
  bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

}  // namespace

int main() {
  const char* bin = std::getenv("CXLPOOL_BINARY_DIR");
  const std::string daemon = std::string(bin ? bin : ".") + "/daemon/cxlpoold";
  if (access(daemon.c_str(), X_OK) != 0) {
    std::fprintf(stderr, "%s not built: skipping\n", daemon.c_str());
    return 77;
  }
  char dir[] = "/tmp/cxlpool-daemon-cabi-XXXXXX";
  if (mkdtemp(dir) == nullptr) return 1;
  const std::string sock = std::string(dir) + "/cxlpool.sock";

  pid_t pid = fork();
  if (pid < 0) return 1;
  if (pid == 0) {
    execl(daemon.c_str(), daemon.c_str(), "--foreground", "--socket", sock.c_str(), "--log-level",
          "warning", static_cast<char*>(nullptr));
    _exit(127);
  }
  // Wait until the daemon accepts connections or exits; no fixed sleep
  // decides the outcome (the 60 s bound only stops a hang).
  bool up = false;
  for (int i = 0; i < 6000 && !up; ++i) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      std::fprintf(stderr, "cxlpoold exited before listening (status 0x%x)\n", status);
      rmdir(dir);
      return 1;
    }
    up = Accepting(sock);
    if (!up) usleep(10000);
  }
  int rc = 1;
  if (up) {
    char why[512] = "";
    int line = cxlpool_c_alloc_scenario(sock.c_str(), 0, why, sizeof(why));
    if (line != 0) {
      std::fprintf(stderr, "c_abi_scenario.c:%d: %s\n", line, why);
    } else {
      std::printf("C ABI scenario passed against cxlpoold\n");
      rc = 0;
    }
  } else {
    std::fprintf(stderr, "cxlpoold never accepted on %s\n", sock.c_str());
  }
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  unlink(sock.c_str());
  rmdir(dir);
  return rc;
}
