// Drives the systemd integration through a fake NOTIFY_SOCKET: a datagram
// socket bound in a temp folder, read back by the test, SCM_RIGHTS included.
#include "sd.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>

#include <cstdlib>
#include <cstring>

namespace cxlpool {
namespace {

struct Datagram {
  std::string text;
  std::vector<int> fds;
};

class FakeNotifySocket {
 public:
  FakeNotifySocket() {
    char tmpl[] = "/tmp/cxlpool-notify-XXXXXX";
    dir_ = mkdtemp(tmpl);
    path_ = dir_ + "/notify";
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path_.c_str(), sizeof a.sun_path - 1);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    int one = 1;
    setsockopt(fd_, SOL_SOCKET, SO_PASSCRED, &one, sizeof one);
    setenv("NOTIFY_SOCKET", path_.c_str(), 1);
  }
  ~FakeNotifySocket() {
    unsetenv("NOTIFY_SOCKET");
    close(fd_);
    unlink(path_.c_str());
    rmdir(dir_.c_str());
  }
  Datagram Receive() {
    Datagram d;
    char buf[4096];
    alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(int) * 8) + CMSG_SPACE(sizeof(ucred))];
    iovec iov{buf, sizeof buf};
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = cbuf;
    m.msg_controllen = sizeof cbuf;
    ssize_t n = recvmsg(fd_, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0) return d;
    d.text.assign(buf, static_cast<size_t>(n));
    for (cmsghdr* c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
        size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        int* p = reinterpret_cast<int*>(CMSG_DATA(c));
        d.fds.assign(p, p + k);
      }
    }
    return d;
  }

 private:
  std::string dir_, path_;
  int fd_ = -1;
};

TEST(NotifierTest, DisabledWithoutNotifySocket) {
  unsetenv("NOTIFY_SOCKET");
  Notifier n;
  EXPECT_FALSE(n.enabled());
  EXPECT_EQ(n.Ready("x").code(), Code::kUnavailable);
}

TEST(NotifierTest, SendsReadyStatusWatchdogStopping) {
  FakeNotifySocket sock;
  Notifier n;
  ASSERT_TRUE(n.enabled());
  ASSERT_TRUE(n.Ready("serving 2 pools").ok());
  EXPECT_EQ(sock.Receive().text, "READY=1\nSTATUS=serving 2 pools");
  ASSERT_TRUE(n.SetStatus("3 leases").ok());
  EXPECT_EQ(sock.Receive().text, "STATUS=3 leases");
  ASSERT_TRUE(n.Watchdog().ok());
  EXPECT_EQ(sock.Receive().text, "WATCHDOG=1");
  ASSERT_TRUE(n.Stopping("bye").ok());
  EXPECT_EQ(sock.Receive().text, "STOPPING=1\nSTATUS=bye");
}

TEST(NotifierTest, StoresFdWithName) {
  FakeNotifySocket sock;
  Notifier n;
  int mfd = memfd_create("lease", MFD_CLOEXEC);
  ASSERT_GE(mfd, 0);
  ASSERT_EQ(ftruncate(mfd, 12345), 0);
  ASSERT_TRUE(n.StoreFd(mfd, "lease-17").ok());
  Datagram d = sock.Receive();
  EXPECT_EQ(d.text, "FDSTORE=1\nFDNAME=lease-17");
  ASSERT_EQ(d.fds.size(), 1u);
  struct stat a, b;
  ASSERT_EQ(fstat(mfd, &a), 0);
  ASSERT_EQ(fstat(d.fds[0], &b), 0);
  EXPECT_EQ(a.st_ino, b.st_ino);  // the same memfd reached the store
  EXPECT_EQ(b.st_size, 12345);
  close(d.fds[0]);
  close(mfd);
  EXPECT_EQ(n.StoreFd(3, "bad name!").code(), Code::kInvalidArgument);
  ASSERT_TRUE(n.RemoveFd("lease-17").ok());
  EXPECT_EQ(sock.Receive().text, "FDSTOREREMOVE=1\nFDNAME=lease-17");
}

TEST(NotifierTest, WatchdogIntervalFromEnv) {
  setenv("WATCHDOG_USEC", "30000000", 1);
  setenv("WATCHDOG_PID", std::to_string(getpid()).c_str(), 1);
  Notifier n;
  EXPECT_EQ(n.watchdog_interval_usec(), 15000000u);
  unsetenv("WATCHDOG_USEC");
  unsetenv("WATCHDOG_PID");
}

// LISTEN_FDS is only honoured for our own pid; run it in a child so the fds
// 3.. do not collide with the test runner's.
TEST(ListenFdsTest, TakesNamedFds) {
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) _exit(10);
    int m = memfd_create("x", 0);
    if (dup2(sv[0], 3) < 0 || dup2(m, 4) < 0) _exit(11);
    setenv("LISTEN_PID", std::to_string(getpid()).c_str(), 1);
    setenv("LISTEN_FDS", "2", 1);
    setenv("LISTEN_FDNAMES", "cxlpoold.socket:lease-5", 1);
    auto fds = TakeListenFds();
    if (fds.size() != 2) _exit(12);
    if (fds[0].name != "cxlpoold.socket" || fds[1].name != "lease-5") _exit(13);
    if (fds[0].fd.get() != 3 || fds[1].fd.get() != 4) _exit(14);
    if (!(fcntl(3, F_GETFD) & FD_CLOEXEC)) _exit(15);
    if (getenv("LISTEN_FDS") != nullptr) _exit(16);
    if (IsListeningUnixSocket(3)) _exit(17);  // a socketpair end is not listening
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(ListenFdsTest, NoneOutsideSystemd) {
  unsetenv("LISTEN_FDS");
  unsetenv("LISTEN_PID");
  EXPECT_TRUE(TakeListenFds().empty());
}

}  // namespace
}  // namespace cxlpool
