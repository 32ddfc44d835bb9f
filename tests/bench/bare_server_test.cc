// The bench's baselines are measuring instruments, so they get tests too.
// BareServer: in its plain mode every grant hands out the same memfd; with a
// MemfdSpec (P3's floor) every grant is a new memfd built by the daemon's
// own CreateMemfdBacking (sealed against growth, pages on the node, checked
// here through the kernel), and a release reclaims the connection's oldest
// grant (its size drops to 0 even though the client still holds the fd).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <numaif.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "bench.h"

namespace cxlpool::bench {
namespace {

bool Node0HasMemory() { return ::access("/sys/devices/system/node/node0/meminfo", R_OK) == 0; }

// Sends one 16-byte request {op, 0, id} and returns the fd that came back
// (-1 if none); fails the test on a short or missing reply.
int Ask(int sock, uint32_t op, uint64_t id) {
  unsigned char req[16] = {};
  std::memcpy(req, &op, 4);
  std::memcpy(req + 8, &id, 8);
  EXPECT_EQ(::send(sock, req, sizeof req, MSG_NOSIGNAL), 16);
  unsigned char rep[16];
  iovec iov{rep, sizeof rep};
  alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int))];
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = ctl;
  mh.msg_controllen = sizeof ctl;
  EXPECT_EQ(::recvmsg(sock, &mh, MSG_CMSG_CLOEXEC), 16);
  cmsghdr* cm = CMSG_FIRSTHDR(&mh);
  if (cm == nullptr || cm->cmsg_type != SCM_RIGHTS) return -1;
  int fd;
  std::memcpy(&fd, CMSG_DATA(cm), sizeof fd);
  return fd;
}

UniqueFd ConnectTo(const std::string& path) {
  auto c = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::memcpy(sa.sun_path, path.c_str(), path.size() + 1);
  EXPECT_EQ(::connect(c, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0) << std::strerror(errno);
  return UniqueFd(c);
}

ino_t Inode(int fd) {
  struct stat st {};
  EXPECT_EQ(::fstat(fd, &st), 0);
  return st.st_ino;
}

off_t SizeOf(int fd) {
  struct stat st {};
  EXPECT_EQ(::fstat(fd, &st), 0);
  return st.st_size;
}

TEST(BareServerTest, PlainModeHandsOutTheSameMemfdEveryTime) {
  BareServer s;
  ASSERT_TRUE(s.Start().ok());
  UniqueFd c = ConnectTo(s.socket());
  UniqueFd a(Ask(c.get(), 1, 1));
  EXPECT_EQ(Ask(c.get(), 2, 2), -1) << "a release reply carries no fd";
  UniqueFd b(Ask(c.get(), 1, 3));
  ASSERT_TRUE(a.valid() && b.valid());
  EXPECT_EQ(Inode(a.get()), Inode(b.get()));
  EXPECT_EQ(SizeOf(a.get()), 4096) << "a release leaves the shared memfd alone";
}

TEST(BareServerTest, FloorModeBuildsAndReclaimsAMemfdPerGrant) {
  if (!Node0HasMemory()) GTEST_SKIP() << "no NUMA node 0 here";
  MemfdSpec spec;
  spec.size_bytes = 16 * 4096;
  spec.numa_node = 0;
  spec.pin = false;  // RLIMIT_MEMLOCK may be small where tests run
  spec.name = "bare-server-test";
  BareServer s;
  ASSERT_TRUE(s.Start(spec).ok());
  UniqueFd c = ConnectTo(s.socket());
  UniqueFd first(Ask(c.get(), 1, 1));
  UniqueFd second(Ask(c.get(), 1, 2));
  ASSERT_TRUE(first.valid() && second.valid());
  EXPECT_NE(Inode(first.get()), Inode(second.get())) << "every grant is a new memfd";
  EXPECT_EQ(SizeOf(first.get()), static_cast<off_t>(spec.size_bytes));
  int seals = ::fcntl(first.get(), F_GET_SEALS);
  EXPECT_TRUE(seals >= 0 && (seals & F_SEAL_GROW)) << "sealed like a daemon lease";

  // Pages were prefaulted on node 0: ask the kernel, through our own mapping.
  void* p = ::mmap(nullptr, spec.size_bytes, PROT_READ, MAP_SHARED, first.get(), 0);
  ASSERT_NE(p, MAP_FAILED);
  std::vector<void*> pages;
  for (uint64_t off = 0; off < spec.size_bytes; off += 4096) {
    pages.push_back(static_cast<char*>(p) + off);
  }
  // Map the (already resident) pages into our page tables, then ask.
  for (void* q : pages) (void)*static_cast<volatile char*>(q);
  std::vector<int> status(pages.size(), -1);
  ASSERT_EQ(::move_pages(0, pages.size(), pages.data(), nullptr, status.data(), 0), 0);
  for (int st : status) EXPECT_EQ(st, 0);
  ::munmap(p, spec.size_bytes);

  // A release reclaims the oldest grant: its memory is gone although this
  // client still holds the fd; the newer one is untouched.
  EXPECT_EQ(Ask(c.get(), 2, 3), -1);
  EXPECT_EQ(SizeOf(first.get()), 0);
  EXPECT_EQ(SizeOf(second.get()), static_cast<off_t>(spec.size_bytes));
  EXPECT_EQ(Ask(c.get(), 2, 4), -1);
  EXPECT_EQ(SizeOf(second.get()), 0);
}

TEST(BareServerTest, FloorModeThatCannotBuildEndsTheConnection) {
  MemfdSpec spec;
  spec.size_bytes = 4095;  // not a page multiple: CreateMemfdBacking refuses
  BareServer s;
  ASSERT_TRUE(s.Start(spec).ok());
  UniqueFd c = ConnectTo(s.socket());
  unsigned char req[16] = {1};
  ASSERT_EQ(::send(c.get(), req, sizeof req, MSG_NOSIGNAL), 16);
  char buf[16];
  EXPECT_EQ(::recv(c.get(), buf, sizeof buf, 0), 0) << "a failed build must not look like a grant";
}

// The bare pair reports its CPU placement, which P1 files every sample by:
// a server and client pinned to one CPU are "same", pinned apart "cross".
// The server process inherits the affinity the test has when it forks.
class Pinned {
 public:
  Pinned() { EXPECT_EQ(::sched_getaffinity(0, sizeof saved_, &saved_), 0); }
  ~Pinned() { ::sched_setaffinity(0, sizeof saved_, &saved_); }
  const cpu_set_t& allowed() const { return saved_; }
  static bool PinTo(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    return ::sched_setaffinity(0, sizeof s, &s) == 0;
  }

 private:
  cpu_set_t saved_;
};

std::vector<int> AllowedCpus(const cpu_set_t& s) {
  std::vector<int> out;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &s)) out.push_back(c);
  return out;
}

TEST(BareServerTest, ReportsWhetherTheReplyCrossedCpus) {
  Pinned restore;
  std::vector<int> cpus = AllowedCpus(restore.allowed());
  ASSERT_FALSE(cpus.empty());
  {
    ASSERT_TRUE(Pinned::PinTo(cpus[0]));
    BareServer server;
    ASSERT_TRUE(server.Start().ok());
    auto c = BareClient::Connect(server.socket());
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_FALSE(c->last_same_cpu().has_value()) << "nothing measured yet";
    for (int i = 0; i < 5; ++i) {
      ASSERT_TRUE(c->GrantRoundTrip().ok());
      ASSERT_TRUE(c->last_same_cpu().has_value());
      EXPECT_TRUE(*c->last_same_cpu());
    }
  }
  if (cpus.size() < 2) GTEST_SKIP() << "one CPU allowed: no cross-CPU pair to make";
  ASSERT_TRUE(Pinned::PinTo(cpus[0]));
  BareServer server;  // forked while pinned to cpus[0]
  ASSERT_TRUE(server.Start().ok());
  ASSERT_TRUE(Pinned::PinTo(cpus[1]));
  auto c = BareClient::Connect(server.socket());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(c->ReleaseRoundTrip().ok());
    ASSERT_TRUE(c->last_same_cpu().has_value());
    EXPECT_FALSE(*c->last_same_cpu());
  }
}

}  // namespace
}  // namespace cxlpool::bench
