// The real cxlpoold on a temporary socket (pid tracked; never killall) with
// several client processes: a SIGKILLed client's leases come back; a shared
// lease is seen by two processes; revoke pushes an event and the client's
// mapping SIGBUSes; quota refusals; hostile frames, then a good client is
// served; a non-admin uid is refused admin operations and cannot open lease
// fds through /proc/<daemon>/fd; only the stock threads run reniced and idle.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "cxlpool/proto/codec.h"
#include "cxlpool/proto/ipc.h"
#include "cxlpool/proto/socket.h"
#include "test_support.h"

namespace cxlpool {
namespace {

using testsupport::IsRoot;
using testsupport::kMiB;
using testsupport::kNobody;
using testsupport::RunInChild;

// A blocking protocol client; server pushes (LeaseEvent) are kept aside.
Result<testsupport::RawClient> Connect(const std::string& path) {
  return testsupport::RawClient::Connect(path, "integration-test");
}

class DaemonTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { testsupport::SkipWithoutDaemon(); }

  void SetUp() override {
    Status st = daemon_.Start(R"(
[daemon]
socket_mode = "0666"
log_level = "warning"
[pools]
capacity = "64M"
[[quota]]
uid = 4321
max_leases = 2
[[quota]]
uid = 4322
max_bytes = "4M"
)");
    ASSERT_TRUE(st.ok()) << st.ToString();
    socket_ = daemon_.socket();
  }

  void TearDown() override {
    if (daemon_.started()) {
      Status st = daemon_.Stop();
      EXPECT_TRUE(st.ok()) << st.ToString();
      EXPECT_NE(::access(socket_.c_str(), F_OK), 0) << "socket removed at exit";
    }
  }

  // The daemon's gauges, through an admin connection.
  std::map<std::string, uint64_t> Gauges() {
    auto c = Connect(socket_);
    EXPECT_TRUE(c.ok());
    proto::StatsReply r;
    EXPECT_TRUE(c->Call(proto::StatsRequest(), &r).ok());
    return {r.gauges().begin(), r.gauges().end()};
  }
  // Polls (no fixed sleeps) until leased bytes reach `want`, up to 10 s.
  bool WaitLeased(uint64_t want) {
    return testsupport::PollUntil([&] { return Gauges()["leased_bytes"] == want; }, 10000, 10);
  }

  testsupport::Daemon daemon_;
  std::string socket_;
};

// Every thread of a running daemon, as the kernel reports it
// (/proc/<pid>/task/<tid>/stat: nice field 19, policy field 41): the
// `stock_workers` threads named cxlpool-stock are reniced and SCHED_IDLE,
// every other thread keeps the daemon's own priority.
TEST(DaemonThreadsTest, OnlyTheStockThreadsAreRenicedAndIdle) {
  testsupport::SkipWithoutDaemon();
  testsupport::Daemon d;
  Status st = d.Start(R"(
[daemon]
log_level = "warning"
workers = 2
stock_workers = 3
stock_nice = 12
stock_idle = true
[pools]
capacity = "64M"
)");
  ASSERT_TRUE(st.ok()) << st.ToString();
  struct Task {
    std::string comm;
    int nice = 0;
    int policy = -1;
  };
  std::map<long, Task> tasks;
  const std::string dir = "/proc/" + std::to_string(d.pid()) + "/task";
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    std::ifstream c(e.path() / "comm");
    Task t;
    std::getline(c, t.comm);
    std::ifstream sf(e.path() / "stat");
    std::string line((std::istreambuf_iterator<char>(sf)), std::istreambuf_iterator<char>());
    std::istringstream rest(line.substr(line.rfind(')') + 2));
    std::vector<std::string> f((std::istream_iterator<std::string>(rest)),
                               std::istream_iterator<std::string>());
    ASSERT_GE(f.size(), 39u) << line;
    t.nice = std::stoi(f[16]);
    t.policy = std::stoi(f[38]);
    tasks[std::stol(e.path().filename().string())] = t;
  }
  ASSERT_EQ(tasks.count(d.pid()), 1u);
  const int base = tasks[d.pid()].nice;
  int stock = 0;
  for (const auto& [tid, t] : tasks) {
    if (t.comm == "cxlpool-stock") {
      ++stock;
      EXPECT_EQ(t.nice, 12) << "stock thread " << tid;
      EXPECT_EQ(t.policy, SCHED_IDLE) << "stock thread " << tid;
    } else if (t.comm == "cxlpool-tier") {
      // The tiering engine's mover: background work at the stock nice, but
      // not SCHED_IDLE (a move under way holds room on two pools).
      EXPECT_EQ(t.nice, 12) << "tiering thread " << tid;
      EXPECT_EQ(t.policy, SCHED_OTHER) << "tiering thread " << tid;
    } else {
      EXPECT_EQ(t.nice, base) << t.comm << " thread " << tid;
      EXPECT_EQ(t.policy, SCHED_OTHER) << t.comm << " thread " << tid;
    }
  }
  EXPECT_EQ(stock, 3) << "one named thread per stock worker";
  EXPECT_GE(tasks.size(), 6u) << "the loop, 2 workers and 3 stock threads";
  EXPECT_TRUE(d.Stop().ok());
}

TEST_F(DaemonTest, SigkilledClientsLeasesReturnToZero) {
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t child = ::fork();
  if (child == 0) {
    ::close(ready[0]);
    auto c = Connect(socket_);
    if (!c.ok()) std::_Exit(1);
    UniqueFd a, b;
    if (!c->Alloc(8 * kMiB, &a).ok() || !c->Alloc(4 * kMiB, &b).ok()) std::_Exit(2);
    (void)!::write(ready[1], "r", 1);
    for (;;) ::pause();
  }
  ::close(ready[1]);
  char x = 0;
  ASSERT_EQ(::read(ready[0], &x, 1), 1) << "client failed to allocate";
  ::close(ready[0]);
  EXPECT_EQ(Gauges()["leased_bytes"], 12 * kMiB);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  EXPECT_TRUE(WaitLeased(0)) << "leased bytes after SIGKILL: " << Gauges()["leased_bytes"];
  EXPECT_EQ(Gauges()["live_leases"], 0u);
}

TEST_F(DaemonTest, SharedLeaseSeenByTwoProcesses) {
  int go[2], done[2];
  ASSERT_EQ(::pipe(go), 0);
  ASSERT_EQ(::pipe(done), 0);
  pid_t owner = ::fork();
  if (owner == 0) {
    auto c = Connect(socket_);
    UniqueFd fd;
    if (!c.ok() || !c->Alloc(2 * kMiB, &fd, "shared-weights").ok()) std::_Exit(1);
    void* p = ::mmap(nullptr, 2 * kMiB, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (p == MAP_FAILED) std::_Exit(2);
    std::strcpy(static_cast<char*>(p) + 4096, "hello from the owner");
    (void)!::write(go[1], "g", 1);
    char x;
    (void)!::read(done[0], &x, 1);  // hold the lease until the reader is done
    std::_Exit(0);
  }
  char x = 0;
  ASSERT_EQ(::read(go[0], &x, 1), 1);
  int rc = RunInChild([&] {
    auto c = Connect(socket_);
    if (!c.ok()) return 1;
    proto::AttachRequest a;
    a.set_name("shared-weights");
    proto::AttachReply r;
    std::vector<UniqueFd> fds;
    if (!c->Call(a, &r, &fds).ok() || fds.size() != 1) return 2;
    if (r.lease().holders() != 2) return 3;
    void* p = ::mmap(nullptr, 2 * kMiB, PROT_READ, MAP_SHARED, fds[0].get(), 0);
    if (p == MAP_FAILED) return 4;
    return std::strcmp(static_cast<char*>(p) + 4096, "hello from the owner") == 0 ? 0 : 5;
  });
  EXPECT_EQ(rc, 0);
  (void)!::write(done[1], "d", 1);
  ::waitpid(owner, nullptr, 0);
  EXPECT_TRUE(WaitLeased(0));
}

TEST_F(DaemonTest, RevokePushesEventAndClientMappingFaults) {
  if (!IsRoot()) GTEST_SKIP() << "revoke needs an admin; this test runs its admin as root";
  auto admin = Connect(socket_);
  ASSERT_TRUE(admin.ok());
  ASSERT_TRUE(admin->is_admin());
  int go[2], id_pipe[2];
  ASSERT_EQ(::pipe(go), 0);
  ASSERT_EQ(::pipe(id_pipe), 0);
  pid_t victim = ::fork();
  if (victim == 0) {
    auto c = Connect(socket_);
    UniqueFd fd;
    auto l = c.ok() ? c->Alloc(2 * kMiB, &fd) : Result<proto::LeaseInfo>(c.status());
    if (!l.ok()) std::_Exit(1);
    auto* p = static_cast<volatile char*>(
        ::mmap(nullptr, 2 * kMiB, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0));
    p[0] = 1;
    uint64_t id = l->id();
    (void)!::write(id_pipe[1], &id, sizeof id);
    auto ev = c->NextEvent();  // blocks until the daemon pushes the revoke
    if (!ev.ok() || ev->event() != "revoked" || ev->lease_id() != id) std::_Exit(3);
    p[4096] = 2;  // the memory is gone: SIGBUS
    std::_Exit(4);
  }
  uint64_t id = 0;
  ASSERT_EQ(::read(id_pipe[0], &id, sizeof id), static_cast<ssize_t>(sizeof id));
  proto::RevokeRequest rv;
  rv.set_lease_id(id);
  proto::RevokeReply rr;
  ASSERT_TRUE(admin->Call(rv, &rr).ok());
  int status = 0;
  ::waitpid(victim, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status)) << "exit " << WEXITSTATUS(status);
  EXPECT_EQ(WTERMSIG(status), SIGBUS);
  EXPECT_TRUE(WaitLeased(0));
}

TEST_F(DaemonTest, QuotaRefusalsNameLimitAndUsage) {
  if (!IsRoot()) GTEST_SKIP() << "needs root to act as the quota'd uids";
  int rc = RunInChild(
      [&] {
        auto c = Connect(socket_);
        if (!c.ok()) return 1;
        UniqueFd a, b, d;
        if (!c->Alloc(kMiB, &a).ok() || !c->Alloc(kMiB, &b).ok()) return 2;
        auto r = c->Alloc(kMiB, &d);
        if (r.ok() || r.status().code() != Code::kResourceExhausted) return 3;
        if (r.status().message().find("uid 4321 (all tiers) max_leases 2, used 2") ==
            std::string::npos) {
          std::fprintf(stderr, "message: %s\n", r.status().message().c_str());
          return 4;
        }
        return 0;
      },
      4321);
  EXPECT_EQ(rc, 0);
  rc = RunInChild(
      [&] {
        auto c = Connect(socket_);
        if (!c.ok()) return 1;
        UniqueFd a;
        auto r = c->Alloc(6 * kMiB, &a);
        if (r.ok()) return 2;
        return r.status().message().find("max_bytes 4.0 MiB, used 0 B, requested 6.0 MiB") !=
                       std::string::npos
                   ? 0
                   : 3;
      },
      4322);
  EXPECT_EQ(rc, 0);
  EXPECT_TRUE(WaitLeased(0));
}

TEST_F(DaemonTest, HostileFramesThenAGoodClientIsServed) {
  {  // garbage bytes
    auto fd = wire::ConnectUnix(socket_);
    ASSERT_TRUE(fd.ok());
    const char junk[64] = "this is not a cxlpool frame header at all....";
    ASSERT_EQ(::send(fd->get(), junk, sizeof junk, MSG_NOSIGNAL),
              static_cast<ssize_t>(sizeof junk));
    auto f = wire::RecvFrame(fd->get(), {}, 5000);  // an error reply, then close
    if (f.ok()) {
      EXPECT_EQ(f->type(), proto::MSG_ERROR_REPLY);
    }
  }
  {  // oversize length
    auto fd = wire::ConnectUnix(socket_);
    ASSERT_TRUE(fd.ok());
    std::string frame = wire::EncodeFrame(proto::MSG_HELLO_REQUEST, 1, "");
    uint32_t huge = 0x7fffffff;
    std::memcpy(frame.data() + 12, &huge, 4);
    (void)!::send(fd->get(), frame.data(), frame.size(), MSG_NOSIGNAL);
    (void)wire::RecvFrame(fd->get(), {}, 5000);
  }
  {  // truncated frame, then the client vanishes
    auto fd = wire::ConnectUnix(socket_);
    ASSERT_TRUE(fd.ok());
    std::string frame = wire::EncodeFrame(proto::MSG_HELLO_REQUEST, 1, std::string(100, 'x'));
    (void)!::send(fd->get(), frame.data(), 40, MSG_NOSIGNAL);
  }
  {  // a valid frame with a garbage payload after hello
    auto c = Connect(socket_);
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE(wire::SendFrame(c->fd(), proto::MSG_ALLOC_REQUEST, 9, "\xff\xff\xff\xff").ok());
    auto f = wire::RecvFrame(c->fd(), {}, 5000);
    ASSERT_TRUE(f.ok());
    proto::AllocReply r;
    Status st = wire::DecodeReply(*f, &r);
    EXPECT_FALSE(st.ok());
    EXPECT_FALSE(st.message().empty());
    UniqueFd lease;
    auto bad = c->Alloc(0, &lease);
    EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
    auto huge = c->Alloc(1ull << 40, &lease);
    EXPECT_EQ(huge.status().code(), Code::kResourceExhausted);
  }
  auto good = Connect(socket_);
  ASSERT_TRUE(good.ok());
  UniqueFd fd;
  auto l = good->Alloc(3 * kMiB, &fd);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  struct stat st;
  ASSERT_EQ(::fstat(fd.get(), &st), 0);
  EXPECT_EQ(st.st_size, static_cast<off_t>(3 * kMiB));
  EXPECT_EQ(l->numa_node(), 0);
}

TEST_F(DaemonTest, NonAdminIsRefusedAdminOps) {
  if (!IsRoot()) GTEST_SKIP() << "needs root to switch to uid nobody";
  int rc = RunInChild(
      [&] {
        auto c = Connect(socket_);
        if (!c.ok()) return 1;
        if (c->is_admin()) return 2;
        proto::RevokeRequest rv;
        rv.set_lease_id(1);
        proto::RevokeReply rr;
        if (c->Call(rv, &rr).code() != Code::kPermissionDenied) return 3;
        proto::ListLeasesRequest all;
        all.set_all(true);
        proto::ListLeasesReply lr;
        if (c->Call(all, &lr).code() != Code::kPermissionDenied) return 4;
        proto::QuotaSetRequest qs;
        qs.mutable_quota()->set_scope("uid");
        qs.mutable_quota()->set_subject("65534");
        qs.mutable_quota()->set_max_bytes(1ull << 40);
        proto::QuotaSetReply qr;
        if (c->Call(qs, &qr).code() != Code::kPermissionDenied) return 5;
        return 0;
      },
      kNobody);
  EXPECT_EQ(rc, 0);
}

TEST_F(DaemonTest, OtherUidCannotOpenLeaseFdsThroughProc) {
  if (!IsRoot()) GTEST_SKIP() << "needs root to switch to uid nobody";
  auto c = Connect(socket_);
  ASSERT_TRUE(c.ok());
  UniqueFd fd;
  ASSERT_TRUE(c->Alloc(2 * kMiB, &fd).ok());
  std::string fd_dir = "/proc/" + std::to_string(daemon_.pid()) + "/fd";
  int rc = RunInChild(
      [&] {
        int opened = 0, tried = 0;
        for (int n = 0; n < 256; ++n) {
          std::string path = fd_dir + "/" + std::to_string(n);
          ++tried;
          int f = ::open(path.c_str(), O_RDWR);
          if (f >= 0) {
            ++opened;
            ::close(f);
          } else if (errno != EACCES && errno != ENOENT && errno != EPERM) {
            return 10;
          }
        }
        return opened == 0 && tried > 0 ? 0 : 1;
      },
      kNobody);
  EXPECT_EQ(rc, 0) << "uid nobody opened a daemon fd through " << fd_dir;
}

}  // namespace
}  // namespace cxlpool
