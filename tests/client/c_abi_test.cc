// Runs the C scenarios (c_abi_scenario.c, compiled as C) against the fake
// server. This binary links the shared libcxlpool, so it also proves the
// exported surface is enough for a C program. ctest points
// CXLPOOL_CUDA_LIBRARY at a library that does not exist.
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

#include "c_abi_scenario.h"
#include "fake_server.h"

namespace cxlpool {
namespace {

class TempSocket {
 public:
  TempSocket() {
    char dir[] = "/tmp/cxlpool-cabi-XXXXXX";
    if (mkdtemp(dir) != nullptr) dir_ = dir;
    path_ = dir_ + "/cxlpool.sock";
  }
  ~TempSocket() {
    unlink(path_.c_str());
    rmdir(dir_.c_str());
  }
  const std::string& path() const { return path_; }

 private:
  std::string dir_;
  std::string path_;
};

TEST(CAbiTest, Offline) {
  char why[512] = "";
  EXPECT_EQ(cxlpool_c_offline_scenario(why, sizeof(why)), 0) << why;
}

TEST(CAbiTest, AllocWriteInfoRelease) {
  TempSocket sock;
  testing::FakeServer server;
  ASSERT_TRUE(server.StartListening(sock.path()).ok());
  char why[512] = "";
  int rc = cxlpool_c_alloc_scenario(sock.path().c_str(), 1, why, sizeof(why));
  ASSERT_EQ(rc, 0) << why;  // a failed scenario leaks its client: do not wait for it
  server.Join();
  EXPECT_EQ(server.live_leases(), 0);
  ASSERT_EQ(server.allocs().size(), 2u);
  EXPECT_EQ(server.allocs()[0].label(), "c-abi-test");
  EXPECT_FALSE(server.allocs()[0].has_numa_node());
  EXPECT_TRUE(server.allocs()[0].gpu().empty());
  EXPECT_EQ(server.releases().size(), 2u);
}

TEST(CAbiTest, StructSizeFlagsAndSharedLeases) {
  TempSocket sock;
  testing::FakeServer server;
  ASSERT_TRUE(server.StartListening(sock.path()).ok());
  char why[512] = "";
  int rc = cxlpool_c_struct_size_scenario(sock.path().c_str(), why, sizeof(why));
  ASSERT_EQ(rc, 0) << why;
  server.Join();
  // Exactly the three valid allocations reached the server (V1-sized, newer
  // with a zero tail, and the shared one), plus the refused duplicate name.
  EXPECT_EQ(server.allocs().size(), 4u);
  EXPECT_TRUE(server.allocs()[0].gpu().empty()) << "a V1 struct's later fields were read";
  EXPECT_EQ(server.allocs()[2].name(), "c-shared");
  EXPECT_EQ(server.allocs()[2].acl_uids_size(), 1);
}

}  // namespace
}  // namespace cxlpool
