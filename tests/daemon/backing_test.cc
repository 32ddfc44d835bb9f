// Kernel-verified memfd backing on this machine's node 0: pages really are on
// the node (move_pages on the daemon mapping and on a second, client-like
// mapping of the fd; get_mempolicy on the daemon mapping), the fd is sealed
// against growth but can be truncated, reclaim returns the memory even when
// the fd leaked, and pinning shows in VmLck.
#include "pool/backing.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <numaif.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <memory>
#include <string>
#include <thread>

#include "cxlpool/common/fs.h"

namespace cxlpool {
namespace {

constexpr uint64_t kSize = 8ull << 20;

bool Node0HasMemory() { return ::access("/sys/devices/system/node/node0/meminfo", R_OK) == 0; }

uint64_t VmLckKb() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmLck:", 0) == 0) return std::stoull(line.substr(6));
  }
  return 0;
}

// Every page of [addr, addr+len) as move_pages reports it (status = node).
std::vector<int> PageNodes(void* addr, uint64_t len) {
  long page = ::sysconf(_SC_PAGESIZE);
  std::vector<void*> pages;
  for (uint64_t off = 0; off < len; off += static_cast<uint64_t>(page)) {
    pages.push_back(static_cast<char*>(addr) + off);
  }
  std::vector<int> status(pages.size(), -1);
  long rc = ::move_pages(0, pages.size(), pages.data(), nullptr, status.data(), 0);
  if (rc != 0) return {};
  return status;
}

class BackingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!Node0HasMemory()) GTEST_SKIP() << "no NUMA node 0 here";
  }
};

TEST_F(BackingTest, PagesAreOnTheBoundNodeInDaemonAndClientMappings) {
  MemfdSpec spec;
  spec.size_bytes = kSize;
  spec.numa_node = 0;
  spec.pin = false;
  auto b = CreateMemfdBacking(spec);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  void* daemon = (*b)->daemon_addr();
  ASSERT_NE(daemon, nullptr);

  int mode = -1;
  unsigned long mask[16] = {0};
  ASSERT_EQ(::get_mempolicy(&mode, mask, sizeof(mask) * 8, daemon, MPOL_F_ADDR), 0)
      << std::strerror(errno);
  EXPECT_EQ(mode, MPOL_BIND);
  EXPECT_EQ(mask[0], 1ul) << "bound to node 0 only";

  auto nodes = PageNodes(daemon, kSize);
  ASSERT_EQ(nodes.size(), kSize / ::sysconf(_SC_PAGESIZE)) << "every page is resident";
  for (int n : nodes) ASSERT_EQ(n, 0);

  // A client maps the fd it received (here: the same fd, a fresh mapping).
  void* client =
      ::mmap(nullptr, kSize, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, (*b)->fd(), 0);
  ASSERT_NE(client, MAP_FAILED);
  nodes = PageNodes(client, kSize);
  ASSERT_FALSE(nodes.empty());
  for (int n : nodes) ASSERT_EQ(n, 0);
  static_cast<char*>(client)[123] = 42;
  EXPECT_EQ(static_cast<char*>(daemon)[123], 42) << "same memory";
  ::munmap(client, kSize);
}

// Background (reserve refill) builds prefault step by step (yielding between steps). Sizes
// that are no multiple of a step, smaller than one, and of many steps: every
// page must still be resident on the bound node.
TEST_F(BackingTest, StepwisePrefaultLeavesEveryPageResidentOnTheNode) {
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  for (uint64_t size :
       std::initializer_list<uint64_t>{3 * page, 5 * (64ull << 10) + 3 * page, 4ull << 20}) {
    MemfdSpec spec;
    spec.size_bytes = size;
    spec.numa_node = 0;
    spec.pin = false;
    spec.yield_between_steps = true;
    auto b = CreateMemfdBacking(spec);
    ASSERT_TRUE(b.ok()) << size << ": " << b.status().ToString();
    auto nodes = PageNodes((*b)->daemon_addr(), size);
    ASSERT_EQ(nodes.size(), size / page) << size << ": every page is resident";
    for (int n : nodes) ASSERT_EQ(n, 0) << size;
  }
}

// A request-path build of at least two chunks offers its prefault
// (MemfdSpec::offer_fill): a helper that takes a chunk at the offer and a
// thread that takes the rest alongside the owner leave every page resident
// on the bound node (move_pages); a build of one chunk is not offered.
TEST_F(BackingTest, ASharedPrefaultLeavesEveryPageResidentOnTheNode) {
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t size = 12 * (2ull << 20) + 3 * page;  // 13 chunks of 2 MiB, the last 3 pages
  std::shared_ptr<SharedFill> offered;
  std::thread helper;
  MemfdSpec spec;
  spec.size_bytes = size;
  spec.numa_node = 0;
  spec.pin = false;
  spec.offer_fill = [&](const std::shared_ptr<SharedFill>& fill) {
    offered = fill;
    EXPECT_TRUE(fill->HelpOne());  // the first chunk, before the owner starts
    helper = std::thread([fill] {
      while (fill->HelpOne()) {
      }
    });
  };
  auto b = CreateMemfdBacking(spec);
  if (helper.joinable()) helper.join();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_NE(offered, nullptr) << "the prefault was offered";
  EXPECT_EQ(offered->chunks(), 13u);
  EXPECT_GE(offered->helped(), 1u);
  EXPECT_TRUE(offered->exhausted());
  auto nodes = PageNodes((*b)->daemon_addr(), size);
  ASSERT_EQ(nodes.size(), size / page) << "every page is resident";
  for (int n : nodes) ASSERT_EQ(n, 0);

  bool small_offered = false;
  spec.size_bytes = 3ull << 20;  // under two chunks
  spec.offer_fill = [&](const std::shared_ptr<SharedFill>&) { small_offered = true; };
  auto small = CreateMemfdBacking(spec);
  ASSERT_TRUE(small.ok()) << small.status().ToString();
  EXPECT_FALSE(small_offered);
  nodes = PageNodes((*small)->daemon_addr(), spec.size_bytes);
  ASSERT_EQ(nodes.size(), spec.size_bytes / page);
  for (int n : nodes) ASSERT_EQ(n, 0);
}

// prefault = false (in-process harnesses): no page is resident after the
// build, and the node binding still places the pages touched later.
TEST_F(BackingTest, WithoutPrefaultPagesComeOnFirstTouchOnTheBoundNode) {
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  MemfdSpec spec;
  spec.size_bytes = 64 * page;
  spec.numa_node = 0;
  spec.pin = false;
  spec.prefault = false;
  auto b = CreateMemfdBacking(spec);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  auto* addr = static_cast<char*>((*b)->daemon_addr());
  auto nodes = PageNodes(addr, spec.size_bytes);
  ASSERT_EQ(nodes.size(), 64u);
  for (int n : nodes) EXPECT_EQ(n, -ENOENT) << "not faulted in";
  addr[0] = 1;
  addr[10 * page] = 1;
  nodes = PageNodes(addr, spec.size_bytes);
  EXPECT_EQ(nodes[0], 0);
  EXPECT_EQ(nodes[10], 0);
  EXPECT_EQ(nodes[1], -ENOENT);
}

TEST_F(BackingTest, SealedAgainstGrowthButShrinkableAndReclaimTruncatesLeakedFd) {
  MemfdSpec spec;
  spec.size_bytes = kSize;
  spec.numa_node = 0;
  spec.pin = false;
  auto b = CreateMemfdBacking(spec);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  int fd = (*b)->fd();
  int seals = ::fcntl(fd, F_GET_SEALS);
  EXPECT_TRUE(seals & F_SEAL_GROW);
  EXPECT_TRUE(seals & F_SEAL_SEAL);
  EXPECT_FALSE(seals & F_SEAL_SHRINK);
  errno = 0;
  EXPECT_NE(::ftruncate(fd, kSize * 2), 0);
  EXPECT_EQ(errno, EPERM) << "growing a sealed memfd fails with EPERM";
  EXPECT_NE(::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0) << "no further seals (F_SEAL_SEAL)";
  EXPECT_TRUE(::fcntl(fd, F_GETFD) & FD_CLOEXEC) << "CLOEXEC";

  UniqueFd leaked(::dup(fd));
  (*b)->Reclaim();
  struct stat st;
  ASSERT_EQ(::fstat(leaked.get(), &st), 0);
  EXPECT_EQ(st.st_size, 0) << "memory returned although a client kept the fd";
  EXPECT_EQ(st.st_blocks, 0);
  (*b)->Reclaim();  // idempotent
}

TEST_F(BackingTest, IdentityIsTheFdsInodeReadAtBuild) {
  MemfdSpec spec;
  spec.size_bytes = kSize;
  spec.pin = false;
  auto b = CreateMemfdBacking(spec);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  uint64_t ino = 0, dev = 0;
  ASSERT_TRUE((*b)->Identity(&ino, &dev));
  struct stat st {};
  ASSERT_EQ(::fstat((*b)->fd(), &st), 0);
  EXPECT_EQ(ino, st.st_ino);
  EXPECT_EQ(dev, st.st_dev);
  // A wrapped memfd (a lease adopted after a restart) knows it too.
  UniqueFd other(::memfd_create("identity", MFD_CLOEXEC));
  ASSERT_TRUE(other.valid());
  struct stat ost {};
  ASSERT_EQ(::fstat(other.get(), &ost), 0);
  auto w = WrapMemfdBacking(std::move(other), nullptr, kSize, 4096, "memfd");
  ASSERT_TRUE(w->Identity(&ino, &dev));
  EXPECT_EQ(ino, ost.st_ino);
  EXPECT_NE(ino, st.st_ino);
}

TEST_F(BackingTest, PinnedMappingShowsInVmLck) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizers intercept mlock as a no-op, so VmLck cannot move";
#endif
  struct rlimit rl;
  ASSERT_EQ(::getrlimit(RLIMIT_MEMLOCK, &rl), 0);
  if (::geteuid() != 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < 2 * kSize) {
    GTEST_SKIP() << "RLIMIT_MEMLOCK too small to pin " << kSize << " bytes without privilege";
  }
  uint64_t before = VmLckKb();
  MemfdSpec spec;
  spec.size_bytes = kSize;
  spec.numa_node = 0;
  spec.pin = true;
  auto b = CreateMemfdBacking(spec);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_GE(VmLckKb(), before + kSize / 1024);
  (*b)->Reclaim();
  EXPECT_EQ(VmLckKb(), before);
}

TEST_F(BackingTest, BadSizesAreRefused) {
  MemfdSpec spec;
  spec.size_bytes = 0;
  EXPECT_EQ(CreateMemfdBacking(spec).status().code(), Code::kInvalidArgument);
  spec.size_bytes = 5000;
  EXPECT_EQ(CreateMemfdBacking(spec).status().code(), Code::kInvalidArgument);
  spec.size_bytes = 4096;
  spec.numa_node = 4000;  // no such node: mbind fails cleanly
  spec.pin = false;
  EXPECT_FALSE(CreateMemfdBacking(spec).ok());
}

TEST(ShmemThpTest, ReadsTheBracketedMode) {
  FakeFileSystem fs;
  const char* path = "/sys/kernel/mm/transparent_hugepage/shmem_enabled";
  fs.AddFile(path, "always within_size [advise] never deny force\n");
  EXPECT_EQ(ReadShmemThp(fs), ShmemThp::kAdvise);
  fs.AddFile(path, "always within_size advise [never] deny force\n");
  EXPECT_EQ(ReadShmemThp(fs), ShmemThp::kNever);
  fs.AddFile(path, "garbage");
  EXPECT_EQ(ReadShmemThp(fs), ShmemThp::kUnknown);
  FakeFileSystem empty;
  EXPECT_EQ(ReadShmemThp(empty), ShmemThp::kUnknown);
}

}  // namespace
}  // namespace cxlpool
