// Restart under systemd, without systemd as PID 1:
//   * fd store: the test plays systemd. It owns a NOTIFY_SOCKET and collects
//     every FDSTORE=1 fd cxlpoold pushes ("lease-<id>"), SIGKILLs the daemon
//     and starts the next one with LISTEN_FDS/LISTEN_PID/LISTEN_FDNAMES (set
//     in the child before exec, fds from 3). The lease is adopted at start,
//     with no grace period and no client reclaim; when its holder exits the
//     daemon (watching the holder's pidfd) frees it.
//   * socket activation: systemd-socket-activate listens, execs cxlpoold on
//     the first connection, and that client allocates.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <map>
#include <vector>

#include "cxlpool/proto/socket.h"
#include "restart_util.h"

namespace cxlpool::restart {
namespace {

using testsupport::kMiB;
using testsupport::PollUntil;
using testsupport::RawClient;

// A fake systemd notification socket collecting stored fds by name.
class FakeNotify {
 public:
  explicit FakeNotify(const std::string& path) : path_(path) {
    fd_.Reset(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
    ok_ = fd_.valid() && ::bind(fd_.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  }
  bool ok() const { return ok_; }
  // Reads every pending datagram: FDSTORE adds, FDSTOREREMOVE drops.
  void Drain() {
    for (;;) {
      char buf[4096];
      alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int) * 16)];
      iovec iov{buf, sizeof buf - 1};
      msghdr m{};
      m.msg_iov = &iov;
      m.msg_iovlen = 1;
      m.msg_control = ctl;
      m.msg_controllen = sizeof ctl;
      ssize_t n = ::recvmsg(fd_.get(), &m, MSG_CMSG_CLOEXEC);
      if (n < 0) return;
      buf[n] = '\0';
      std::string text(buf);
      std::vector<UniqueFd> fds;
      for (cmsghdr* c = CMSG_FIRSTHDR(&m); c != nullptr; c = CMSG_NXTHDR(&m, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < k; ++i) {
          int f;
          std::memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof f);
          fds.emplace_back(f);
        }
      }
      std::string name;
      auto at = text.find("FDNAME=");
      if (at != std::string::npos) name = text.substr(at + 7, text.find('\n', at) - at - 7);
      if (text.find("FDSTOREREMOVE=1") != std::string::npos) {
        store.erase(name);
      } else if (text.find("FDSTORE=1") != std::string::npos && !fds.empty()) {
        store[name] = std::move(fds.front());
      }
      if (text.find("READY=1") != std::string::npos) ++ready;
    }
  }
  const std::string& path() const { return path_; }
  std::map<std::string, UniqueFd> store;
  int ready = 0;

 private:
  std::string path_;
  UniqueFd fd_;
  bool ok_ = false;
};

// Starts cxlpoold as systemd would: NOTIFY_SOCKET, and `pass` as fds 3.. with
// their names in LISTEN_FDNAMES (LISTEN_PID set in the child).
pid_t SpawnLikeSystemd(const std::vector<std::string>& args, const std::string& notify,
                       const std::vector<std::pair<std::string, int>>& pass) {
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid != 0) return pid;
  ::setenv("NOTIFY_SOCKET", notify.c_str(), 1);
  if (!pass.empty()) {
    // Move the fds out of the way first, then to 3, 4, ...
    std::vector<int> high;
    for (const auto& [name, fd] : pass) high.push_back(::fcntl(fd, F_DUPFD, 100));
    std::string names;
    for (size_t i = 0; i < high.size(); ++i) {
      ::dup2(high[i], 3 + static_cast<int>(i));
      names += (i ? ":" : "") + pass[i].first;
    }
    ::setenv("LISTEN_FDS", std::to_string(pass.size()).c_str(), 1);
    ::setenv("LISTEN_FDNAMES", names.c_str(), 1);
    ::setenv("LISTEN_PID", std::to_string(::getpid()).c_str(), 1);
  }
  std::vector<char*> argv;
  std::string bin = testsupport::DaemonBinary();
  argv.push_back(bin.data());
  std::vector<std::string> copy = args;
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  ::execv(bin.c_str(), argv.data());
  std::_Exit(127);
}

void KillAndReap(pid_t& pid) {
  if (pid > 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    pid = -1;
  }
}
// Kills and reaps `pid` when the test ends, also on a failed ASSERT (a
// process left running would keep ctest waiting on its output).
struct ReapAtExit {
  pid_t& pid;
  ~ReapAtExit() { KillAndReap(pid); }
};

bool WaitHello(const std::string& sock) {
  return PollUntil([&] { return RawClient::Connect(sock, "probe", 2000).ok(); }, 10000, 5);
}

// A cxlpoold to start the way systemd would: its config in a temp dir, a
// socket there, a state directory, and a fake notification socket. Killed
// and reaped when it goes, also on a failed ASSERT.
struct SystemdDaemon {
  explicit SystemdDaemon(const char* config) : notify(dir.path + "/notify") {
    conf = dir.path + "/cxlpoold.toml";
    FILE* f = std::fopen(conf.c_str(), "w");
    written = f != nullptr && std::fputs(config, f) >= 0;
    if (f != nullptr) written = std::fclose(f) == 0 && written;
    sock = dir.path + "/cxlpool.sock";
    args = {"--foreground",      "--socket",       sock, "--config", conf, "--state-dir",
            dir.path + "/state", "--grace-period", "60s"};
  }
  ~SystemdDaemon() { KillAndReap(pid); }
  bool ok() const { return !dir.path.empty() && written && notify.ok(); }
  // (Re)starts it with the fd store entries `pass` handed over, and waits
  // until it answers HELLO.
  bool Start(const std::vector<std::pair<std::string, int>>& pass = {}) {
    KillAndReap(pid);
    pid = SpawnLikeSystemd(args, notify.path(), pass);
    return pid > 0 && WaitHello(sock);
  }
  void Kill() { KillAndReap(pid); }
  // The daemon's accounting, once it is out of its grace period (all its
  // memory back). UNAVAILABLE while in it.
  Result<testsupport::Accounting> ReadOutOfGrace() const {
    auto admin = RawClient::Connect(sock, "fdstore-check");
    if (!admin.ok()) return admin.status();
    if (admin->hello().in_grace_period()) {
      return Status(Code::kUnavailable, "still in its grace period");
    }
    return testsupport::ReadAccounting(*admin);
  }
  // Waits until the daemon holds no lease and none of `names` is left in
  // its fd store; `*last` says what was seen last.
  bool WaitAllGone(const std::vector<std::string>& names, std::string* last) {
    return PollUntil(
        [&] {
          auto admin = RawClient::Connect(sock, "fdstore-check");
          if (!admin.ok()) return false;
          auto a = testsupport::ReadAccounting(*admin);
          if (!a.ok()) return false;
          notify.Drain();
          size_t stored = 0;
          for (const auto& n : names) stored += notify.store.count(n);
          *last = std::to_string(a->leases.size()) + " leases, store has " + std::to_string(stored);
          return a->leases.empty() && a->Gauge("leased_bytes") == 0 && stored == 0;
        },
        10000, 5);
  }
  pid_t pid = -1;
  TempDir dir{"restart"};
  FakeNotify notify;
  std::string conf;
  std::string sock;
  std::vector<std::string> args;
  bool written = false;
};

TEST(RestartSystemdTest, FdStoreGivesLeasesBackWithoutAnyClientReclaim) {
  testsupport::SkipWithoutDaemon();
  SystemdDaemon s(kRestartConfig);
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(s.Start());
  const std::string& sock = s.sock;
  FakeNotify& notify = s.notify;

  // A holder that never reclaims (raw protocol, no library).
  std::optional<RawClient> c;
  UniqueFd fd;
  void* map = nullptr;
  Helper holder([&](char cmd) -> uint64_t {
    if (cmd == 'a') {
      auto n = RawClient::Connect(sock, "fdstore-holder");
      if (!n.ok()) return 0;
      c.emplace(std::move(*n));
      auto l = c->Alloc(2 * kMiB, &fd);
      if (!l.ok()) return 0;
      map = ::mmap(nullptr, l->size_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
      if (map == MAP_FAILED) return 0;
      Fill(map, l->size_bytes(), 0xF5);
      return l->id();
    }
    if (cmd == 'v') return Intact(map, 2 * kMiB, 0xF5) ? 1 : 0;
    return 0;
  });
  auto id = holder.Ask('a');
  ASSERT_TRUE(id && *id);
  const std::string name = "lease-" + std::to_string(*id);
  ASSERT_TRUE(PollUntil(
      [&] {
        notify.Drain();
        return notify.store.count(name) > 0;
      },
      10000, 2))
      << "cxlpoold did not push " << name << " to the fd store";
  EXPECT_GE(notify.ready, 1);

  ASSERT_TRUE(s.Start({{name, notify.store[name].get()}}));
  {
    auto a = s.ReadOutOfGrace();  // the memory is already back
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    ASSERT_TRUE(a->leases.count(*id));
    EXPECT_EQ(a->leases.at(*id).owner_pid(), static_cast<uint32_t>(holder.pid()));
    EXPECT_EQ(a->Counter("restart_adopted"), 1u);
    EXPECT_EQ(a->Gauge("leased_bytes"), 2 * kMiB);
    EXPECT_EQ(a->Inconsistencies(), "");
  }
  EXPECT_EQ(holder.Ask('v'), 1u);
  // The holder exits without ever reclaiming: the daemon sees it go (pidfd)
  // and frees the lease, removing it from the fd store too.
  holder.Kill();
  std::string last;
  EXPECT_TRUE(s.WaitAllGone({name}, &last)) << last;
  s.Kill();
}

// A lease of three extents (daemon.max_extent = 2M): one store entry per
// extent, named lease-<id>-extent-<i>; all three handed back at start adopt
// the lease at once; when its holder exits, all three leave the store.
TEST(RestartSystemdTest, FdStoreKeepsEveryExtentOfALease) {
  testsupport::SkipWithoutDaemon();
  SystemdDaemon s(kExtentConfig);
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(s.Start());
  const std::string& sock = s.sock;
  FakeNotify& notify = s.notify;
  std::optional<RawClient> c;
  std::vector<UniqueFd> fds;
  Helper holder([&](char cmd) -> uint64_t {
    if (cmd == 'a') {
      auto n = RawClient::Connect(sock, "fdstore-holder");
      if (!n.ok()) return 0;
      c.emplace(std::move(*n));
      proto::AllocRequest req;
      req.set_size_bytes(6 * kMiB);
      proto::AllocReply rep;
      if (!c->Call(req, &rep, &fds).ok() || fds.size() != 3) return 0;
      return rep.lease().id();
    }
    return 0;
  });
  auto id = holder.Ask('a');
  ASSERT_TRUE(id && *id);
  std::vector<std::string> names;
  for (int i = 0; i < 3; ++i) {
    names.push_back("lease-" + std::to_string(*id) + "-extent-" + std::to_string(i));
  }
  ASSERT_TRUE(PollUntil(
      [&] {
        notify.Drain();
        for (const auto& n : names) {
          if (!notify.store.count(n)) return false;
        }
        return true;
      },
      10000, 2))
      << "cxlpoold did not push every extent to the fd store";
  // Handed back out of order: the names say which extent each fd is.
  ASSERT_TRUE(s.Start({{names[2], notify.store[names[2]].get()},
                       {names[0], notify.store[names[0]].get()},
                       {names[1], notify.store[names[1]].get()}}));
  {
    auto a = s.ReadOutOfGrace();
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    ASSERT_TRUE(a->leases.count(*id));
    EXPECT_EQ(a->leases.at(*id).extents_size(), 3);
    EXPECT_EQ(a->Counter("restart_adopted"), 1u);
    EXPECT_EQ(a->Gauge("leased_bytes"), 6 * kMiB);
    EXPECT_EQ(a->Inconsistencies(), "");
  }
  holder.Kill();
  std::string last;
  EXPECT_TRUE(s.WaitAllGone(names, &last)) << last;
  s.Kill();
}

TEST(RestartSystemdTest, SocketActivationServesTheFirstClient) {
  testsupport::SkipWithoutDaemon();
  const char* activate = "/usr/bin/systemd-socket-activate";
  if (::access(activate, X_OK) != 0) testsupport::Skip("no /usr/bin/systemd-socket-activate");
  TempDir dir("restart");
  std::string conf = dir.path + "/cxlpoold.toml";
  FILE* f = std::fopen(conf.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs(kRestartConfig, f);
  std::fclose(f);
  const std::string sock = dir.path + "/activated.sock";
  std::string bin = testsupport::DaemonBinary();
  std::string state = dir.path + "/state";
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::execl(activate, activate, "-l", sock.c_str(), bin.c_str(), "--foreground", "--config",
            conf.c_str(), "--state-dir", state.c_str(), static_cast<char*>(nullptr));
    std::_Exit(127);
  }
  ASSERT_GT(pid, 0);
  ReapAtExit reap{pid};
  // The socket exists before the daemon does; the first connection starts
  // it. Connecting is retried only while the socket does not accept yet
  // (not bound or not listening: refused connections start nothing).
  Result<UniqueFd> conn = Status(Code::kUnavailable, "not tried");
  ASSERT_TRUE(PollUntil([&] { return (conn = wire::ConnectUnix(sock)).ok(); }, 10000, 2))
      << conn.status().ToString();
  auto c = RawClient::Handshake(std::move(*conn), "activated-client", 20000);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  UniqueFd fd;
  auto l = c->Alloc(kMiB, &fd);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->size_bytes(), kMiB);
  ASSERT_TRUE(c->Release(l->id()).ok());
  c = Result<RawClient>(Status(Code::kUnavailable, "closed"));
  KillAndReap(pid);
}

}  // namespace
}  // namespace cxlpool::restart
