// KernelMigrator on real memory of this machine: a prefaulted memfd built as
// the pools build leases, moved with mbind(MPOL_MF_MOVE_ALL) and verified
// page by page with move_pages. This machine may have a single NUMA node;
// then the move is to the node the pages are on, and the verification is
// still the kernel's. Moves between nodes run in the VM tier (tests/vm,
// guest/tiering-checks.sh). Bad ranges, a truncated file and a missing node
// are errors, never a SIGBUS.
#include "tiering/migrator.h"

#include <gtest/gtest.h>
#include <numa.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "pool/backing.h"

namespace cxlpool::tiering {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

std::unique_ptr<Backing> Build(uint64_t size, int node) {
  MemfdSpec spec;
  spec.size_bytes = size;
  spec.numa_node = node;
  spec.pin = false;
  auto b = CreateMemfdBacking(spec);
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  return b.ok() ? std::move(*b) : nullptr;
}

int SomeNodeWithMemory() {
  if (numa_available() < 0) return -1;
  for (int n = 0; n <= numa_max_node(); ++n) {
    long long free_bytes = 0;
    if (numa_node_size64(n, &free_bytes) > 0 && free_bytes > static_cast<long long>(64 * kMiB)) {
      return n;
    }
  }
  return -1;
}

TEST(MigratorTest, AMoveIsVerifiedPageByPageByTheKernel) {
  int node = SomeNodeWithMemory();
  if (node < 0) GTEST_SKIP() << "no NUMA node with 64 MiB free";
  auto b = Build(32 * kMiB, node);
  ASSERT_NE(b, nullptr);
  auto m = MakeKernelMigrator();
  MoveRequest req;
  req.fd = b->fd();
  req.length = 32 * kMiB;
  req.target_node = node;
  req.step_bytes = 8 * kMiB;
  auto r = m->Move(req);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->complete()) << r->ToString();
  EXPECT_EQ(r->after.pages, 32 * kMiB / 4096);
  EXPECT_EQ(r->after.On(node), r->after.pages);
  EXPECT_EQ(r->before.On(node), r->before.pages);
  EXPECT_EQ(r->after.absent, 0u);
  std::string text = r->ToString();
  EXPECT_NE(
      text.find("verified by move_pages: 8192 pages: node " + std::to_string(node) + ": 8192"),
      std::string::npos)
      << text;
  auto w = m->Where(b->fd(), 8 * kMiB, 4 * kMiB, 4096);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->On(node), 1024u);
}

TEST(MigratorTest, PagesMappedByAnotherProcessMoveAndTheirDataStaysIntact) {
  int node = SomeNodeWithMemory();
  if (node < 0) GTEST_SKIP() << "no NUMA node with 64 MiB free";
  if (!HaveCapSysNice()) GTEST_SKIP() << "MPOL_MF_MOVE_ALL needs CAP_SYS_NICE";
  const uint64_t size = 16 * kMiB;
  auto b = Build(size, node);
  ASSERT_NE(b, nullptr);
  auto* p =
      static_cast<uint64_t*>(::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, b->fd(), 0));
  ASSERT_NE(p, MAP_FAILED);
  const size_t words = size / sizeof(uint64_t);
  for (size_t i = 0; i < words; ++i) p[i] = i * 0x9e3779b97f4a7c15ull;
  // A second holder process maps the same memory and keeps touching it.
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto* q =
        static_cast<volatile uint64_t*>(::mmap(nullptr, size, PROT_READ, MAP_SHARED, b->fd(), 0));
    if (q == MAP_FAILED) ::_exit(2);
    uint64_t sum = 0;
    for (size_t i = 0; i < words; i += 512) sum += q[i];
    char c = 'r';
    if (::write(ready[1], &c, 1) != 1) ::_exit(3);
    for (;;) {
      for (size_t i = 0; i < words; i += 512) sum += q[i];
      if (sum == 42) ::_exit(4);
    }
  }
  char c;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  // This process writes while the pages move.
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> rounds{0};
  std::thread writer([&] {
    while (!stop.load()) {
      for (size_t i = 0; i < words; i += 4096 / sizeof(uint64_t)) {
        p[i] = i * 0x9e3779b97f4a7c15ull + rounds.load();
      }
      rounds.fetch_add(1);
    }
  });
  auto m = MakeKernelMigrator();
  MoveRequest req;
  req.fd = b->fd();
  req.length = size;
  req.target_node = node;
  req.step_bytes = 4 * kMiB;
  auto r = m->Move(req);
  stop.store(true);
  writer.join();
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->complete()) << r->ToString();
  // Every word is what was last written to it.
  const uint64_t last = rounds.load() - 1;
  size_t bad = 0;
  for (size_t i = 0; i < words; ++i) {
    uint64_t want = i * 0x9e3779b97f4a7c15ull;
    if (i % (4096 / sizeof(uint64_t)) == 0) want += last;
    if (p[i] != want) ++bad;
  }
  EXPECT_EQ(bad, 0u);
  ::munmap(p, size);
  ::close(ready[0]);
  ::close(ready[1]);
}

TEST(MigratorTest, PacingHoldsTheMoveToItsRate) {
  int node = SomeNodeWithMemory();
  if (node < 0) GTEST_SKIP() << "no NUMA node with 64 MiB free";
  auto b = Build(16 * kMiB, node);
  ASSERT_NE(b, nullptr);
  MoveRequest req;
  req.fd = b->fd();
  req.length = 16 * kMiB;
  req.target_node = node;
  req.step_bytes = 4 * kMiB;
  req.max_bytes_per_s = 64 * kMiB;  // 16 MiB: at least 3 steps' worth of 62.5 ms
  auto r = MakeKernelMigrator()->Move(req);
  ASSERT_TRUE(r.ok());
  EXPECT_GE(r->move_ns, 187'000'000);
  // A cancel between steps stops it.
  std::atomic<bool> cancel{true};
  req.cancel = &cancel;
  r = MakeKernelMigrator()->Move(req);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->cancelled);
}

TEST(MigratorTest, BadRangesTruncatedFilesAndMissingNodesAreErrors) {
  int node = SomeNodeWithMemory();
  if (node < 0) GTEST_SKIP() << "no NUMA node with 64 MiB free";
  auto b = Build(4 * kMiB, node);
  ASSERT_NE(b, nullptr);
  auto m = MakeKernelMigrator();
  MoveRequest req;
  req.fd = b->fd();
  req.length = 4 * kMiB;
  req.target_node = node;
  req.offset = 100;
  EXPECT_EQ(m->Move(req).status().code(), Code::kInvalidArgument);
  req.offset = 0;
  req.length = 0;
  EXPECT_EQ(m->Move(req).status().code(), Code::kInvalidArgument);
  req.length = 4 * kMiB;
  req.target_node = -1;
  EXPECT_EQ(m->Move(req).status().code(), Code::kInvalidArgument);
  req.fd = -1;
  req.target_node = node;
  EXPECT_EQ(m->Move(req).status().code(), Code::kInvalidArgument);
  // A node with no memory (the highest possible id): the kernel refuses.
  req.fd = b->fd();
  req.target_node = 1000;
  auto r = m->Move(req);
  EXPECT_FALSE(r.ok());
  // The file was truncated under the range (a revoke): NOT_FOUND, no SIGBUS.
  ASSERT_EQ(::ftruncate(b->fd(), 0), 0);
  req.target_node = node;
  r = m->Move(req);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kNotFound) << r.status().ToString();
  EXPECT_NE(r.status().message().find("truncated"), std::string::npos);
}

TEST(MigratorTest, CountPagesSaysWhatIsNotResident) {
  void* a = ::mmap(nullptr, 8 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(a, MAP_FAILED);
  std::memset(a, 1, 4 * 4096);  // half touched
  auto c = CountPages(a, 8 * 4096, 4096);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->pages, 8u);
  EXPECT_EQ(c->absent, 4u);
  uint64_t resident = 0;
  for (const auto& [n, k] : c->on_node) resident += k;
  EXPECT_EQ(resident, 4u);
  EXPECT_NE(c->ToString().find("absent: 4"), std::string::npos);
  EXPECT_EQ(CountPages(a, 0, 4096).status().code(), Code::kInvalidArgument);
  ::munmap(a, 8 * 4096);
}

}  // namespace
}  // namespace cxlpool::tiering
