// Hostile clients (issue 5, "Hostile clients"). Each attack runs against a
// fresh cxlpoold on a temp socket, and is followed by a good client that must
// still be served (connect, allocate, write, release), and by a check that
// the daemon is back to its baseline (no lease, no extra connection, no fd
// it did not have before):
//   * frames that never finish (cut header, cut payload, a 1 MiB promise);
//   * a flood of connections (held below and beyond max_connections, churn);
//   * too many fds on one message (200 on ALLOC, 100 and 253 on RECLAIM):
//     refused, the fds closed, the connection closed;
//   * a client that never reads its replies (with lease fds in them);
//   * releasing, stating, revoking, listing and attaching another tenant's
//     leases from another uid;
//   * growing a sealed lease fd (ftruncate up, write past the end,
//     fallocate, F_ADD_SEALS, reopening through /proc/self/fd);
//   * opening /proc/<daemon>/fd/*, map_files, mem, or pidfd_getfd as
//     another uid.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstring>

#include "cxlpool/proto/socket.h"
#include "test_support.h"

namespace cxlpool::testsupport {
namespace {

constexpr uid_t kTenantB = 4000;

class HostileTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    SkipWithoutDaemon();
    if (::geteuid() != 0) {
      Skip(
          "needs root: attacks run as other uids, and the baseline check lists every "
          "tenant's leases and the daemon's fd table");
    }
  }

  void SetUp() override {
    ASSERT_TRUE(daemon_
                    .Start(R"(
[daemon]
socket_mode = "0666"
log_level = "error"
[pools]
capacity = "256M"
[limits]
max_connections = 1024
max_connections_per_uid = 1000
reserved_connections = 16
)")
                    .ok());
    auto a = RawClient::Connect(daemon_.socket(), "stress-admin");
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    admin_ = std::move(*a);
    base_fds_ = CountFds(daemon_.pid());
  }

  // A good client: connects, allocates 2 MiB, writes it, releases it.
  ::testing::AssertionResult GoodClientServed() {
    if (!daemon_.Alive()) return ::testing::AssertionFailure() << "cxlpoold died";
    auto c = RawClient::Connect(daemon_.socket(), "stress-good");
    if (!c.ok()) return ::testing::AssertionFailure() << "connect: " << c.status().ToString();
    UniqueFd fd;
    auto l = c->Alloc(2 * kMiB, &fd);
    if (!l.ok()) return ::testing::AssertionFailure() << "alloc: " << l.status().ToString();
    void* p = ::mmap(nullptr, l->size_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (p == MAP_FAILED) return ::testing::AssertionFailure() << "mmap failed";
    std::memset(p, 0x5a, l->size_bytes());
    ::munmap(p, l->size_bytes());
    Status st = c->Release(l->id());
    if (!st.ok()) return ::testing::AssertionFailure() << "release: " << st.ToString();
    ++good_served_;
    return ::testing::AssertionSuccess();
  }

  // No lease, only the admin connection, and (polled) the daemon's fd count
  // back to what it was after start.
  ::testing::AssertionResult BackToBaseline() {
    std::string last;
    bool ok = PollUntil(
        [&] {
          auto a = ReadAccounting(admin_);
          if (!a.ok()) {
            last = a.status().ToString();
            return false;
          }
          last = a->Inconsistencies();
          if (!a->leases.empty()) last += std::to_string(a->leases.size()) + " leases left; ";
          if (a->Gauge("connections") != 1) {
            last += std::to_string(a->Gauge("connections")) + " connections open; ";
          }
          auto n = CountFds(daemon_.pid());
          if (base_fds_ && n != base_fds_) {
            last += "daemon fds " + std::to_string(n ? *n : 0) + ", baseline " +
                    std::to_string(*base_fds_) + "; ";
          }
          return last.empty();
        },
        20000, 10);
    if (ok) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << last;
  }

  // True once the daemon has closed `fd` (EOF or reset), within limit_ms.
  static bool ClosedByPeer(int fd, int limit_ms) {
    return PollUntil(
        [&] {
          struct pollfd p = {fd, POLLIN, 0};
          if (::poll(&p, 1, 0) <= 0) return false;
          char buf[4096];
          ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
          return n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR);
        },
        limit_ms, 10);
  }

  void TearDown() override {
    std::printf("hostile: %s: good client served %d times afterwards\n",
                ::testing::UnitTest::GetInstance()->current_test_info()->name(), good_served_);
  }

  Daemon daemon_;
  RawClient admin_;
  std::optional<size_t> base_fds_;
  int good_served_ = 0;
};

TEST_F(HostileTest, FramesThatNeverFinish) {
  std::vector<UniqueFd> hostile;
  for (int i = 0; i < 20; ++i) {  // 10 bytes of a header, before HELLO
    auto fd = wire::ConnectUnix(daemon_.socket());
    ASSERT_TRUE(fd.ok());
    std::string f = wire::EncodeFrame(proto::MSG_HELLO_REQUEST, 1, "");
    ASSERT_EQ(::send(fd->get(), f.data(), 10, MSG_NOSIGNAL), 10);
    hostile.push_back(std::move(*fd));
  }
  for (int i = 0; i < 20; ++i) {  // after HELLO: an ALLOC with 30 of 100 payload bytes
    auto c = RawClient::Connect(daemon_.socket(), "stress-cut");
    ASSERT_TRUE(c.ok());
    std::string f = wire::EncodeFrame(proto::MSG_ALLOC_REQUEST, 7, std::string(100, '\x08'));
    ASSERT_EQ(::send(c->fd(), f.data(), wire::kFrameHeaderSize + 30, MSG_NOSIGNAL),
              static_cast<ssize_t>(wire::kFrameHeaderSize + 30));
    hostile.push_back(UniqueFd(::dup(c->fd())));
  }
  for (int i = 0; i < 10; ++i) {  // promises the maximum payload, sends 1 KiB
    auto fd = wire::ConnectUnix(daemon_.socket());
    ASSERT_TRUE(fd.ok());
    std::string f = wire::EncodeFrame(proto::MSG_HELLO_REQUEST, 1,
                                      std::string(wire::kDefaultMaxFrameBytes, 'x'));
    ASSERT_EQ(::send(fd->get(), f.data(), 1024, MSG_NOSIGNAL), 1024);
    hostile.push_back(std::move(*fd));
  }
  // While all 50 hang, others are served at once.
  EXPECT_TRUE(GoodClientServed());
  EXPECT_TRUE(GoodClientServed());
  // The daemon drops every one of them (read deadline 5 s).
  int closed = 0;
  for (auto& fd : hostile) closed += ClosedByPeer(fd.get(), 20000) ? 1 : 0;
  EXPECT_EQ(closed, static_cast<int>(hostile.size())) << "unfinished frames kept connections open";
  hostile.clear();
  EXPECT_TRUE(GoodClientServed());
  EXPECT_TRUE(BackToBaseline());
  std::printf("hostile: %d unfinished-frame connections, %d closed by the daemon\n",
              static_cast<int>(50), closed);
}

TEST_F(HostileTest, FloodOfConnections) {
  // Phase 1: 900 connections held open (under max_connections = 1024; one
  // uid may hold 1000, and the last 16 are for uids that have none),
  // phase 2: 1500 more (beyond it), then churn. Runs in a child with a
  // raised fd limit; the parent checks service in between through pipes.
  int to_child[2], to_parent[2];
  ASSERT_EQ(::pipe(to_child), 0);
  ASSERT_EQ(::pipe(to_parent), 0);
  std::string socket = daemon_.socket();
  std::fflush(nullptr);
  pid_t flood = ::fork();
  ASSERT_GE(flood, 0);
  if (flood == 0) {
    struct rlimit rl = {8192, 8192};
    ::setrlimit(RLIMIT_NOFILE, &rl);
    if (::geteuid() == 0 && !BecomeUid(kNobody)) std::_Exit(90);
    std::vector<int> fds;
    auto open_n = [&](int n) {
      int opened = 0;
      for (int i = 0; i < n; ++i) {
        auto fd = wire::ConnectUnix(socket);
        if (!fd.ok()) continue;
        fds.push_back(fd->Release());
        ++opened;
      }
      return opened;
    };
    char go = 0;
    int32_t n1 = open_n(900);
    (void)!::write(to_parent[1], &n1, sizeof n1);
    (void)!::read(to_child[0], &go, 1);
    int32_t n2 = open_n(1500);
    // Count the ones the daemon closed at once (beyond its limit).
    int32_t refused = 0;
    PollUntil(
        [&] {
          refused = 0;
          for (int fd : fds) {
            struct pollfd p = {fd, POLLIN | POLLRDHUP, 0};
            if (::poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLRDHUP))) ++refused;
          }
          return static_cast<size_t>(refused) + 1024 >= fds.size();
        },
        10000, 50);
    int32_t msg[2] = {n2, refused};
    (void)!::write(to_parent[1], msg, sizeof msg);
    (void)!::read(to_child[0], &go, 1);
    for (int fd : fds) ::close(fd);
    for (int i = 0; i < 3000; ++i) {  // churn: connect and drop
      auto fd = wire::ConnectUnix(socket);
      (void)fd;
    }
    int32_t done = 1;
    (void)!::write(to_parent[1], &done, sizeof done);
    std::_Exit(0);
  }
  int32_t n1 = 0;
  ASSERT_EQ(::read(to_parent[0], &n1, sizeof n1), static_cast<ssize_t>(sizeof n1));
  EXPECT_EQ(n1, 900);
  // 900 idle connections: others are still served.
  EXPECT_TRUE(GoodClientServed());
  std::optional<uint64_t> conns;
  EXPECT_TRUE(PollUntil([&] {
    auto a = ReadAccounting(admin_);
    conns = a.ok() ? std::optional<uint64_t>(a->Gauge("connections")) : std::nullopt;
    return conns == 901u;
  })) << "connections "
      << conns.value_or(0) << ", want the 900 of the flood and the admin's";
  auto a = ReadAccounting(admin_);
  ASSERT_EQ(::write(to_child[1], "g", 1), 1);
  int32_t msg[2] = {0, 0};
  ASSERT_EQ(::read(to_parent[0], msg, sizeof msg), static_cast<ssize_t>(sizeof msg));
  a = ReadAccounting(admin_);
  ASSERT_TRUE(a.ok());
  uint64_t at_limit = a->Gauge("connections");
  EXPECT_LE(at_limit, 1024u) << "more connections admitted than max_connections";
  EXPECT_GE(static_cast<size_t>(msg[1]) + 1024, static_cast<size_t>(n1 + msg[0]))
      << "connections beyond the limit were not closed";
  EXPECT_TRUE(daemon_.Alive());
  ASSERT_EQ(::write(to_child[1], "g", 1), 1);
  int32_t done = 0;
  ASSERT_EQ(::read(to_parent[0], &done, sizeof done), static_cast<ssize_t>(sizeof done));
  int status = 0;
  ::waitpid(flood, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_TRUE(GoodClientServed());
  EXPECT_TRUE(BackToBaseline());
  std::printf(
      "hostile: flood held %d, then %d more (%d closed at once by the daemon, %llu "
      "admitted at the peak), then 3000 churned\n",
      n1, msg[0], msg[1], static_cast<unsigned long long>(at_limit));
}

// Sends one frame carrying `nfds` copies of `fd`.
Status SendWithFds(int sock, proto::MsgType type, uint64_t id, const std::string& payload, int fd,
                   int nfds) {
  std::vector<int> fds(nfds, fd);
  return wire::SendFrame(sock, type, id, payload, fds, 5000);
}

TEST_F(HostileTest, TooManyFdsOnOneMessage) {
  int mfd = static_cast<int>(::syscall(SYS_memfd_create, "stress-hostile-fd", MFD_CLOEXEC));
  ASSERT_GE(mfd, 0);
  UniqueFd memfd(mfd);
  ASSERT_EQ(::ftruncate(mfd, 4096), 0);
  struct Case {
    proto::MsgType type;
    int nfds;
  } cases[] = {{proto::MSG_ALLOC_REQUEST, 200},
               {proto::MSG_ALLOC_REQUEST, 1},
               {proto::MSG_STATS_REQUEST, 3},
               {proto::MSG_RECLAIM_REQUEST, 100},
               {proto::MSG_RECLAIM_REQUEST, 253}};
  uint64_t id = 1000;
  int refused = 0;
  for (const auto& k : cases) {
    auto c = RawClient::Connect(daemon_.socket(), "stress-fds");
    ASSERT_TRUE(c.ok());
    proto::AllocRequest ar;
    ar.set_size_bytes(kMiB);
    std::string payload = k.type == proto::MSG_ALLOC_REQUEST ? *wire::Encode(ar) : "";
    ASSERT_TRUE(SendWithFds(c->fd(), k.type, ++id, payload, mfd, k.nfds).ok());
    auto f = wire::RecvFrame(c->fd(), {}, 10000);
    ASSERT_TRUE(f.ok()) << "no answer to " << k.nfds << " fds on " << wire::MsgTypeName(k.type)
                        << ": " << f.status().ToString();
    EXPECT_EQ(f->type(), proto::MSG_ERROR_REPLY)
        << k.nfds << " fds on " << wire::MsgTypeName(k.type);
    EXPECT_EQ(f->request_id(), id);
    EXPECT_TRUE(f->fds.empty());
    proto::ErrorReply err;
    ASSERT_TRUE(wire::Decode(f->payload, &err).ok());
    EXPECT_TRUE(err.code() == proto::PROTOCOL || err.code() == proto::UNSUPPORTED)
        << err.code() << " " << err.message();
    EXPECT_FALSE(err.message().empty());
    refused += f->type() == proto::MSG_ERROR_REPLY;
    // The connection is closed after it (and another one is served).
    EXPECT_TRUE(ClosedByPeer(c->fd(), 10000)) << k.nfds << " fds on " << wire::MsgTypeName(k.type);
    EXPECT_TRUE(GoodClientServed());
  }
  // The daemon kept none of the fds: nothing in its fd table is our memfd.
  EXPECT_TRUE(PollUntil([&] {
    DIR* d = ::opendir(("/proc/" + std::to_string(daemon_.pid()) + "/fd").c_str());
    if (d == nullptr) return true;  // cannot look (no privilege): the fd count check below
    bool ours = false;
    while (dirent* e = ::readdir(d)) {
      char target[256] = {};
      std::string p = "/proc/" + std::to_string(daemon_.pid()) + "/fd/" + e->d_name;
      if (::readlink(p.c_str(), target, sizeof target - 1) > 0 &&
          std::strstr(target, "stress-hostile-fd") != nullptr) {
        ours = true;
      }
    }
    ::closedir(d);
    return !ours;
  })) << "cxlpoold still holds an fd a hostile client sent";
  EXPECT_TRUE(GoodClientServed());
  EXPECT_TRUE(BackToBaseline());
  std::printf("hostile: %d frames with too many fds refused\n", refused);
}

TEST_F(HostileTest, ClientThatNeverReadsReplies) {
  auto c = RawClient::Connect(daemon_.socket(), "stress-deaf");
  ASSERT_TRUE(c.ok());
  int fl = ::fcntl(c->fd(), F_GETFL);
  ASSERT_EQ(::fcntl(c->fd(), F_SETFL, fl | O_NONBLOCK), 0);
  proto::AllocRequest ar;
  ar.set_size_bytes(kMiB);
  std::string alloc = wire::EncodeFrame(proto::MSG_ALLOC_REQUEST, 1, *wire::Encode(ar));
  std::string topo = wire::EncodeFrame(proto::MSG_TOPOLOGY_REQUEST, 2, "");
  // Requests, never reading: 8 allocations (their replies carry lease fds),
  // then topology requests until the socket stays full or the daemon hangs up.
  uint64_t sent = 0;
  bool hung_up = false;
  for (int i = 0; i < 8; ++i) {
    ASSERT_EQ(::send(c->fd(), alloc.data(), alloc.size(), MSG_NOSIGNAL), (ssize_t)alloc.size());
    ++sent;
  }
  size_t off = 0;
  uint64_t full_since = 0;
  for (;;) {
    ssize_t n = ::send(c->fd(), topo.data() + off, topo.size() - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += static_cast<size_t>(n);
      if (off == topo.size()) {
        off = 0;
        ++sent;
      }
      full_since = 0;
      continue;
    }
    if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) {
      hung_up = true;
      break;
    }
    ASSERT_TRUE(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) << std::strerror(errno);
    if (full_since == 0) full_since = NowMicros();
    if (NowMicros() - full_since > 1000000) break;  // full for 1 s: the daemon stopped reading
    ::usleep(1000);
  }
  // While the deaf client sits there (possibly still holding 8 MiB in queued
  // replies), others are served.
  EXPECT_TRUE(GoodClientServed());
  EXPECT_TRUE(GoodClientServed());
  auto a = ReadAccounting(admin_);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->Overcommit(), "");
  uint64_t leased_while_deaf = a->Gauge("leased_bytes");
  c = RawClient();  // the client goes away without reading: everything comes back
  EXPECT_TRUE(GoodClientServed());
  EXPECT_TRUE(BackToBaseline());
  std::printf(
      "hostile: never-reading client sent %llu requests (%s); %llu MiB leased to it "
      "meanwhile, all returned\n",
      static_cast<unsigned long long>(sent),
      hung_up ? "the daemon hung up" : "the daemon stopped reading",
      static_cast<unsigned long long>(leased_while_deaf / kMiB));
}

TEST_F(HostileTest, OtherTenantsLeasesAreOutOfReach) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to act as other uids";
  auto owner = RawClient::Connect(daemon_.socket(), "stress-owner");
  ASSERT_TRUE(owner.ok());
  UniqueFd pfd, sfd;
  auto priv = owner->Alloc(2 * kMiB, &pfd);
  ASSERT_TRUE(priv.ok());
  auto shared = owner->Alloc(2 * kMiB, &sfd, "tenant-a-weights", {kTenantB});
  ASSERT_TRUE(shared.ok());
  auto* pm = static_cast<uint8_t*>(
      ::mmap(nullptr, 2 * kMiB, PROT_READ | PROT_WRITE, MAP_SHARED, pfd.get(), 0));
  ASSERT_NE(pm, MAP_FAILED);
  std::memset(pm, 0xa5, 2 * kMiB);
  uint64_t priv_id = priv->id(), sid = shared->id();
  std::string socket = daemon_.socket();

  int rc = RunInChild(
      [&] {
        auto c = RawClient::Connect(socket, "stress-thief");
        if (!c.ok()) return 1;
        if (c->hello().is_admin()) return 2;
        // Another tenant's lease answers as a lease that does not exist:
        // same code, same text.
        const uint64_t none = 987654321;
        auto same = [&](const Status& a, uint64_t id, const Status& b) {
          std::string t = a.message();
          auto at = t.find(std::to_string(id));
          if (at != std::string::npos)
            t.replace(at, std::to_string(id).size(), std::to_string(none));
          return a.code() == b.code() && t == b.message();
        };
        for (uint64_t id : {priv_id, sid}) {
          Status rel = c->Release(id);
          if (rel.code() != Code::kNotFound || !same(rel, id, c->Release(none))) return 3;
          proto::StatRequest sr;
          sr.set_lease_id(id);
          proto::StatReply so;
          Status st = c->Call(sr, &so);
          proto::StatRequest sn;
          sn.set_lease_id(none);
          if (st.code() != Code::kNotFound || !same(st, id, c->Call(sn, &so))) return 4;
          proto::RevokeRequest rv;
          rv.set_lease_id(id);
          proto::RevokeReply ro;
          if (c->Call(rv, &ro).code() != Code::kPermissionDenied) return 5;
        }
        // Guessing ids releases nothing.
        for (uint64_t id = 0; id < 512; ++id) {
          Status st = c->Release(id);
          if (st.ok()) return 6;
          if (st.code() != Code::kNotFound && st.code() != Code::kPermissionDenied) return 7;
        }
        UniqueFd fd;
        auto att = c->Attach("tenant-a-weights", &fd, 0u);  // named by its owner, root
        if (att.ok() || att.status().code() != Code::kNotFound) return 8;
        if (fd.get() >= 0) return 9;
        // The same answer as for a name that does not exist.
        auto none_att = c->Attach("tenant-a-weightz", &fd, 0u);
        std::string msg = att.status().message();
        msg.replace(msg.find("tenant-a-weights"), 16, "tenant-a-weightz");
        if (none_att.status().code() != Code::kNotFound || none_att.status().message() != msg) {
          return 9;
        }
        // Its own namespace has no such name either (and nobody else's lease
        // answers for it).
        if (c->Attach("tenant-a-weights", &fd).status().code() != Code::kNotFound) return 9;
        proto::ListLeasesRequest all;
        all.set_all(true);
        proto::ListLeasesReply lr;
        if (c->Call(all, &lr).code() != Code::kPermissionDenied) return 10;
        proto::ListLeasesReply mine;
        if (!c->Call(proto::ListLeasesRequest(), &mine).ok() || mine.leases_size() != 0) return 11;
        return 0;
      },
      kNobody);
  EXPECT_EQ(rc, 0) << "uid nobody reached another tenant's lease (step " << rc << ")";

  // Positive control: the uid on the ACL may attach, and its release drops
  // only its own reference.
  rc = RunInChild(
      [&] {
        auto c = RawClient::Connect(socket, "stress-tenant-b");
        if (!c.ok()) return 1;
        UniqueFd fd;
        auto att = c->Attach("tenant-a-weights", &fd, 0u);  // the owner (root) named
        if (!att.ok() || att->id() != sid || att->holders() != 2) return 2;
        if (att->owner_uid() != 0) return 2;  // the reply says whose lease it is
        if (!c->Release(sid).ok()) return 3;
        if (c->Release(sid).code() != Code::kNotFound) return 4;  // no longer held: not visible
        if (c->Release(priv_id).code() != Code::kNotFound) return 5;
        return 0;
      },
      kTenantB);
  EXPECT_EQ(rc, 0) << "ACL'd tenant (step " << rc << ")";

  auto a = ReadAccounting(admin_);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(a->leases.count(priv_id) && a->leases.count(sid)) << "a tenant's lease disappeared";
  EXPECT_EQ(a->leases[priv_id].holders(), 1u);
  EXPECT_EQ(a->leases[sid].holders(), 1u);
  bool intact = true;
  for (uint64_t i = 0; i < 2 * kMiB; i += 4096) intact &= pm[i] == 0xa5;
  EXPECT_TRUE(intact) << "the owner's memory changed";
  ::munmap(pm, 2 * kMiB);
  EXPECT_TRUE(GoodClientServed());
  owner = RawClient();
  EXPECT_TRUE(BackToBaseline());
}

// The checks on one lease fd; 0 when every attempt to grow it failed.
int TryToGrow(int fd, uint64_t size) {
  int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0 || !(seals & F_SEAL_GROW) || !(seals & F_SEAL_SEAL)) return 1;
  if (::ftruncate(fd, static_cast<off_t>(size + 4096)) == 0 || errno != EPERM) return 2;
  if (::ftruncate(fd, static_cast<off_t>(size * 2)) == 0) return 3;
  char b = 1;
  if (::pwrite(fd, &b, 1, static_cast<off_t>(size)) >= 0 || errno != EPERM) return 4;
  if (::fallocate(fd, 0, static_cast<off_t>(size), 4096) == 0) return 5;
  // Seals can be neither removed nor added (F_SEAL_SEAL): a client cannot
  // block the daemon's revoke with F_SEAL_SHRINK, nor freeze it with WRITE.
  if (::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) == 0 || errno != EPERM) return 6;
  if (::fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE) == 0) return 7;
  if (::fcntl(fd, F_GET_SEALS) != seals) return 8;
  // A new open file description of the same memfd carries the same seals.
  int again = ::open(("/proc/self/fd/" + std::to_string(fd)).c_str(), O_RDWR | O_CLOEXEC);
  if (again >= 0) {
    bool grew = ::ftruncate(again, static_cast<off_t>(size * 2)) == 0;
    ::close(again);
    if (grew) return 9;
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != size) return 10;
  // Writing inside the lease works; a mapping past its end faults.
  if (::pwrite(fd, &b, 1, static_cast<off_t>(size - 1)) != 1) return 11;
  return 0;
}

TEST_F(HostileTest, SealedLeaseFdCannotGrow) {
  auto c = RawClient::Connect(daemon_.socket(), "stress-grower");
  ASSERT_TRUE(c.ok());
  UniqueFd fd, sfd;
  auto l = c->Alloc(3 * kMiB, &fd);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(TryToGrow(fd.get(), l->size_bytes()), 0);
  auto s = c->Alloc(2 * kMiB, &sfd, "grow-me", {kNobody});
  ASSERT_TRUE(s.ok());
  std::string socket = daemon_.socket();
  const uint32_t owner_uid = ::geteuid();
  // Another process that attached the shared lease cannot grow it either.
  int rc = RunInChild(
      [&] {
        auto o = RawClient::Connect(socket, "stress-grower-2");
        if (!o.ok()) return 20;
        UniqueFd afd;
        auto a = o->Attach("grow-me", &afd, owner_uid);  // named by its owner
        if (!a.ok()) return 21;
        int r = TryToGrow(afd.get(), a->size_bytes());
        if (r != 0) return r;
        // Touching past the end of a mapping larger than the file: SIGBUS.
        pid_t p = ::fork();
        if (p == 0) {
          auto* m = static_cast<volatile char*>(::mmap(
              nullptr, a->size_bytes() + 4096, PROT_READ | PROT_WRITE, MAP_SHARED, afd.get(), 0));
          if (m == MAP_FAILED) std::_Exit(0);
          m[a->size_bytes()] = 1;
          std::_Exit(1);
        }
        int status = 0;
        ::waitpid(p, &status, 0);
        if (!(WIFSIGNALED(status) && WTERMSIG(status) == SIGBUS) &&
            !(WIFEXITED(status) && WEXITSTATUS(status) == 0))
          return 22;
        return 0;
      },
      ::geteuid() == 0 ? std::optional<uid_t>(kNobody) : std::nullopt);
  EXPECT_EQ(rc, 0) << "an attached lease fd could be grown (check " << rc << ")";
  auto a = ReadAccounting(admin_);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->leases[l->id()].size_bytes(), l->size_bytes());
  EXPECT_EQ(a->Overcommit(), "");
  EXPECT_TRUE(GoodClientServed());
  c = RawClient();
  EXPECT_TRUE(BackToBaseline());
}

TEST_F(HostileTest, DaemonFdsOutOfReachOfAnotherUid) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to switch to uid nobody";
  auto c = RawClient::Connect(daemon_.socket(), "stress-holder");
  ASSERT_TRUE(c.ok());
  UniqueFd fd;
  ASSERT_TRUE(c->Alloc(2 * kMiB, &fd).ok());
  pid_t d = daemon_.pid();
  std::string base = "/proc/" + std::to_string(d);
  // Control: the daemon does hold memfds (as root we may look), so the
  // attempts below have something to find.
  int memfds = 0;
  if (DIR* dir = ::opendir((base + "/fd").c_str())) {
    while (dirent* e = ::readdir(dir)) {
      char t[256] = {};
      if (::readlink((base + "/fd/" + e->d_name).c_str(), t, sizeof t - 1) > 0 &&
          std::strncmp(t, "/memfd:", 7) == 0)
        ++memfds;
    }
    ::closedir(dir);
  }
  EXPECT_GT(memfds, 0) << "the daemon holds no memfd; the attack below would prove nothing";
  int rc = RunInChild(
      [&] {
        int opened = 0;
        if (DIR* dir = ::opendir((base + "/fd").c_str())) {
          ::closedir(dir);
          return 1;  // even listing is refused
        }
        for (int n = 0; n < 1024; ++n) {
          int f = ::open((base + "/fd/" + std::to_string(n)).c_str(), O_RDWR);
          if (f >= 0) {
            ++opened;
            ::close(f);
          }
          f = ::open((base + "/fd/" + std::to_string(n)).c_str(), O_RDONLY);
          if (f >= 0) {
            ++opened;
            ::close(f);
          }
        }
        if (opened > 0) return 2;
        if (DIR* dir = ::opendir((base + "/map_files").c_str())) {
          ::closedir(dir);
          return 3;
        }
        int mem = ::open((base + "/mem").c_str(), O_RDONLY);
        if (mem >= 0) {
          ::close(mem);
          return 4;
        }
        int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, d, 0));
        if (pidfd >= 0) {
          for (int n = 0; n < 256; ++n) {
            int got = static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd, n, 0));
            if (got >= 0) return 5;
          }
          ::close(pidfd);
        }
        return 0;
      },
      kNobody);
  EXPECT_EQ(rc, 0) << "uid nobody reached the daemon's fds (check " << rc << ")";
  EXPECT_TRUE(GoodClientServed());
  c = RawClient();
  EXPECT_TRUE(BackToBaseline());
}

}  // namespace
}  // namespace cxlpool::testsupport
