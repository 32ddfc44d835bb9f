#include "cxlpool/common/fs.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

namespace cxlpool {
namespace {

TEST(FakeFileSystemTest, FailsClosed) {
  FakeFileSystem fs;
  fs.AddFile("/sys/devices/system/node/online", "0-1\n");
  EXPECT_EQ(*fs.ReadTrimmed("/sys/devices/system/node/online"), "0-1");
  auto r = fs.ReadFile("/sys/devices/system/node/possible");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kNotFound);
  EXPECT_FALSE(fs.IsThisSystem());
}

TEST(FakeFileSystemTest, ListDirAndSymlinks) {
  FakeFileSystem fs;
  fs.AddFile("/sys/devices/platform/mem0/serial", "0x10\n");
  fs.AddSymlink("/sys/bus/cxl/devices/mem0", "../../../devices/platform/mem0");
  auto names = fs.ListDir("/sys/bus/cxl/devices");
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(names->size(), 1u);
  EXPECT_EQ(*fs.ReadTrimmed("/sys/bus/cxl/devices/mem0/serial"), "0x10");
  EXPECT_EQ(*fs.Canonical("/sys/bus/cxl/devices/mem0"), "/sys/devices/platform/mem0");
  EXPECT_TRUE(fs.IsDir("/sys/bus/cxl/devices/mem0"));
}

TEST(FakeFileSystemTest, InjectedFailure) {
  FakeFileSystem fs;
  fs.AddFile("/proc/meminfo", "MemTotal: 1 kB\n");
  fs.FailPath("/proc/meminfo", Status(Code::kPermissionDenied, "injected"));
  EXPECT_EQ(fs.ReadFile("/proc/meminfo").status().code(), Code::kPermissionDenied);
}

TEST(RootedFileSystemTest, AbsoluteLinksStayInsideRoot) {
  char tmpl[] = "/tmp/cxlpool-fs-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  std::string root = tmpl;
  ASSERT_EQ(system(("mkdir -p " + root + "/sys/real && mkdir -p " + root + "/sys/bus").c_str()), 0);
  std::ofstream(root + "/sys/real/value") << "42\n";
  // An absolute link must resolve against the root, not the real '/'.
  ASSERT_EQ(symlink("/sys/real", (root + "/sys/bus/dev").c_str()), 0);
  auto fs = MakeRootedFileSystem(root);
  EXPECT_FALSE(fs->IsThisSystem());
  EXPECT_EQ(*fs->ReadTrimmed("/sys/bus/dev/value"), "42");
  EXPECT_EQ(*fs->Canonical("/sys/bus/dev/value"), "/sys/real/value");
  EXPECT_EQ(fs->ReadFile("/sys/bus/nothing").status().code(), Code::kNotFound);
  ASSERT_EQ(system(("rm -rf " + root).c_str()), 0);
}

TEST(PathTest, JoinAndBase) {
  EXPECT_EQ(JoinPath("/sys/a", "b"), "/sys/a/b");
  EXPECT_EQ(JoinPath("/sys/a/", "/b"), "/sys/a/b");
  EXPECT_EQ(BaseName("/sys/bus/dax/devices/dax0.0"), "dax0.0");
}

}  // namespace
}  // namespace cxlpool
