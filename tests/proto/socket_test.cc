// Listening sockets (stale files, live listeners, modes, path limits),
// inherited-fd checks, and peer credentials.
#include "cxlpool/proto/socket.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace cxlpool::wire {
namespace {

class SocketTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/cxlpool-sock-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST_F(SocketTest, ListenSetsModeAndAcceptsConnections) {
  ListenOptions lo;
  lo.path = dir_ + "/s.sock";
  lo.mode = 0660;
  lo.group = ::getgid();
  Result<UniqueFd> l = ListenUnix(lo);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  struct stat st;
  ASSERT_EQ(0, ::stat(lo.path.c_str(), &st));
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0660u);
  EXPECT_EQ(st.st_gid, ::getgid());
  EXPECT_TRUE(CheckListeningUnixSocket(l->get()).ok());
  EXPECT_TRUE(::fcntl(l->get(), F_GETFD) & FD_CLOEXEC);

  Result<UniqueFd> c = ConnectUnix(lo.path);
  ASSERT_TRUE(c.ok());
  Result<PeerCred> cred = GetPeerCred(c->get());
  ASSERT_TRUE(cred.ok());
  EXPECT_EQ(cred->uid, ::getuid());

  // A second listener on a live socket is refused, and the socket survives.
  Result<UniqueFd> again = ListenUnix(lo);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), Code::kAlreadyExists);
  EXPECT_TRUE(std::filesystem::exists(lo.path));
}

TEST_F(SocketTest, StaleSocketIsReplacedButOtherFilesAreNot) {
  ListenOptions lo;
  lo.path = dir_ + "/s.sock";
  {
    Result<UniqueFd> first = ListenUnix(lo);
    ASSERT_TRUE(first.ok());
  }  // closed: the file stays behind, nobody listens
  ASSERT_TRUE(std::filesystem::exists(lo.path));
  Result<UniqueFd> second = ListenUnix(lo);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_TRUE(ConnectUnix(lo.path).ok());

  ListenOptions reg;
  reg.path = dir_ + "/regular";
  std::ofstream(reg.path) << "keep me";
  Result<UniqueFd> r = ListenUnix(reg);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kAlreadyExists);
  std::ifstream in(reg.path);
  std::string text;
  std::getline(in, text);
  EXPECT_EQ(text, "keep me");
}

TEST_F(SocketTest, BadPathsAreClearErrors) {
  ListenOptions lo;
  lo.path = dir_ + "/" + std::string(200, 'x');
  EXPECT_EQ(ListenUnix(lo).status().code(), Code::kInvalidArgument);
  lo.path = dir_ + "/missing/dir/s.sock";
  EXPECT_EQ(ListenUnix(lo).status().code(), Code::kNotFound);
  lo.path = "";
  EXPECT_EQ(ListenUnix(lo).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ConnectUnix(dir_ + "/nothing").status().code(), Code::kNotFound);
}

TEST_F(SocketTest, InheritedFdMustBeAListeningUnixStreamSocket) {
  int sv[2];
  ASSERT_EQ(0, ::socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
  UniqueFd a(sv[0]), b(sv[1]);
  EXPECT_EQ(CheckListeningUnixSocket(a.get()).code(), Code::kInvalidArgument);
  int p[2];
  ASSERT_EQ(0, ::pipe(p));
  UniqueFd r(p[0]), w(p[1]);
  EXPECT_EQ(CheckListeningUnixSocket(r.get()).code(), Code::kInvalidArgument);
  UniqueFd dgram(::socket(AF_UNIX, SOCK_DGRAM, 0));
  EXPECT_EQ(CheckListeningUnixSocket(dgram.get()).code(), Code::kInvalidArgument);
}

TEST_F(SocketTest, PeerCredentialsAndPidfd) {
  int sv[2];
  ASSERT_EQ(0, ::socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
  UniqueFd a(sv[0]), b(sv[1]);
  Result<PeerCred> cred = GetPeerCred(a.get());
  ASSERT_TRUE(cred.ok());
  EXPECT_EQ(cred->pid, ::getpid());
  EXPECT_EQ(cred->uid, ::getuid());
  EXPECT_EQ(cred->gid, ::getgid());
  Result<UniqueFd> pidfd = GetPeerPidfd(a.get(), cred->pid);
  if (!pidfd.ok() && pidfd.status().code() == Code::kUnsupported) GTEST_SKIP() << "no pidfds";
  ASSERT_TRUE(pidfd.ok()) << pidfd.status().ToString();
  EXPECT_TRUE(::fcntl(pidfd->get(), F_GETFD) & FD_CLOEXEC);
}

}  // namespace
}  // namespace cxlpool::wire
