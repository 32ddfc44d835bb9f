// HostArena against a real daemon and the fake CUDA driver: requests of
// small_max and more are exact-size leases registered on their device,
// smaller ones share slab leases (carved, merged on free, reused), empty
// slabs beyond the spare go back to the daemon, a failed registration leaves
// no lease behind, and a GPU the daemon does not know is served without the
// placement hint.
#include "host_arena.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <vector>

#include "test_support.h"

namespace cxlpool::hostalloc {
namespace {

using testsupport::kMiB;

class HostArenaTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { testsupport::SkipWithoutDaemon(); }

  void SetUp() override {
    Status st = daemon_.Start(R"(
[daemon]
socket_mode = "0600"
log_level = "warning"
[pools]
capacity = "128M"
)");
    ASSERT_TRUE(st.ok()) << st.ToString();
  }

  std::unique_ptr<HostArena> Make(ArenaOptions o) {
    auto c = Client::Connect(daemon_.socket());
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return std::make_unique<HostArena>(std::move(*c), std::move(o));
  }

  // Live leases and their sizes, from the daemon.
  std::map<uint64_t, uint64_t> Leases() {
    std::map<uint64_t, uint64_t> out;
    auto admin = testsupport::RawClient::Connect(daemon_.socket());
    if (!admin.ok()) return out;
    auto acc = testsupport::ReadAccounting(*admin);
    if (!acc.ok()) return out;
    for (const auto& [id, l] : acc->leases) out[id] = l.requested_bytes();
    return out;
  }

  testsupport::Daemon daemon_;
};

TEST_F(HostArenaTest, LargeRequestsAreExactLeasesAndFreeReturnsThem) {
  ArenaOptions o;
  o.cuda_register = false;
  auto arena = Make(o);
  auto a = arena->Allocate(3 * kMiB + 17, -1);
  auto b = arena->Allocate(kMiB, -1);
  ASSERT_TRUE(a.ok() && b.ok());
  std::memset(*a, 1, 3 * kMiB + 17);
  EXPECT_TRUE(arena->Owns(*a));
  EXPECT_NE(arena->LeaseIdOf(*a), arena->LeaseIdOf(*b));
  auto leases = Leases();
  ASSERT_EQ(leases.size(), 2u);
  std::multiset<uint64_t> sizes;
  for (auto& [id, req] : leases) sizes.insert(req);
  EXPECT_EQ(sizes, (std::multiset<uint64_t>{kMiB, 3 * kMiB + 17}));
  ArenaStats s = arena->stats();
  EXPECT_EQ(s.requested_bytes, 4 * kMiB + 17);
  EXPECT_EQ(s.large_leases, 2u);
  EXPECT_LE(s.leased_bytes, 4 * kMiB + 17 + 2 * 4096) << "exact sizes, page rounded";
  EXPECT_TRUE(arena->Free(*a));
  EXPECT_FALSE(arena->Free(*a)) << "a second free of the same pointer is refused";
  EXPECT_FALSE(arena->Owns(*a));
  EXPECT_TRUE(testsupport::PollUntil([&] { return Leases().size() == 1; }));
  int stack_var = 0;
  EXPECT_FALSE(arena->Free(&stack_var));
  EXPECT_TRUE(arena->Free(*b));
  EXPECT_TRUE(testsupport::PollUntil([&] { return Leases().empty(); }));
  EXPECT_EQ(arena->Allocate(0, -1).status().code(), ErrorCode::kInvalidArgument);
}

TEST_F(HostArenaTest, SmallRequestsShareSlabsAndAreReused) {
  ArenaOptions o;
  o.cuda_register = false;
  o.slab_bytes = 2 * kMiB;
  o.small_max = 256 * 1024;
  o.keep_empty_slabs = 1;
  auto arena = Make(o);
  std::vector<void*> ps;
  for (int i = 0; i < 16; ++i) {  // 16 x 100 KiB (rounded to 512 B) fit one 2 MiB slab
    auto p = arena->Allocate(100 * 1024 + i, -1);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    std::memset(*p, i, 100 * 1024 + i);
    ps.push_back(*p);
  }
  EXPECT_EQ(arena->stats().slabs, 1u);
  EXPECT_EQ(Leases().size(), 1u);
  for (void* p : ps) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % o.align, 0u);
    EXPECT_EQ(arena->LeaseIdOf(p), arena->LeaseIdOf(ps[0]));
  }
  // Distinct, non-overlapping blocks: each kept its own fill.
  for (int i = 0; i < 16; ++i) EXPECT_EQ(static_cast<unsigned char*>(ps[i])[100 * 1024 - 1], i);
  // Freeing two neighbours makes room for one block of both sizes together.
  ASSERT_TRUE(arena->Free(ps[3]));
  ASSERT_TRUE(arena->Free(ps[4]));
  auto merged = arena->Allocate(200 * 1024, -1);
  ASSERT_TRUE(merged.ok());
  EXPECT_EQ(arena->stats().slabs, 1u) << "the merged hole must be reused";
  // A 21st block does not fit: a second slab.
  std::vector<void*> more;
  for (int i = 0; i < 6; ++i) more.push_back(*arena->Allocate(100 * 1024, -1));
  EXPECT_EQ(arena->stats().slabs, 2u);
  // Free everything: one empty slab stays as the spare, the other goes.
  for (size_t i = 0; i < ps.size(); ++i) {
    if (i == 3 || i == 4) continue;
    EXPECT_TRUE(arena->Free(ps[i]));
  }
  EXPECT_TRUE(arena->Free(*merged));
  for (void* p : more) EXPECT_TRUE(arena->Free(p));
  EXPECT_EQ(arena->stats().slabs, 1u);
  EXPECT_EQ(arena->stats().requested_bytes, 0u);
  EXPECT_TRUE(testsupport::PollUntil([&] { return Leases().size() == 1; }));
  arena->ReleaseEmptySlabs();
  EXPECT_EQ(arena->stats().slabs, 0u);
  EXPECT_TRUE(testsupport::PollUntil([&] { return Leases().empty(); }));
}

TEST_F(HostArenaTest, RegistersOnTheDeviceEvenWhenTheDaemonDoesNotKnowTheGpu) {
  // The daemon here sees no GPU, so near_gpu = 0 is NOT_FOUND for it; the
  // arena retries without the hint and registers on device 0 itself.
  ArenaOptions o;
  auto arena = Make(o);
  auto p = arena->Allocate(2 * kMiB, 0);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  auto q = arena->Allocate(4096, 0);
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  EXPECT_EQ(Leases().size(), 2u);
  // The fake driver (loaded by libcxlpool) saw both leases registered.
  void* fake = ::dlopen(std::getenv("CXLPOOL_CUDA_LIBRARY"), RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(fake, nullptr);
  auto registered = reinterpret_cast<uint64_t (*)()>(::dlsym(fake, "fake_cuda_registered_bytes"));
  ASSERT_NE(registered, nullptr);
  EXPECT_GE(registered(), 2 * kMiB + 2 * kMiB) << "the large lease and the slab";
  EXPECT_TRUE(arena->Free(*p));
  EXPECT_TRUE(arena->Free(*q));
  arena->ReleaseEmptySlabs();
  EXPECT_EQ(registered(), 0u) << "released leases are unregistered";
  ::dlclose(fake);
}

TEST_F(HostArenaTest, FailedRegistrationLeavesNoLease) {
  ::setenv("CXLPOOL_CUDA_LIBRARY", "/nonexistent/libcuda.so.1", 1);
  // The process-wide driver is loaded once; this test runs in its own
  // process (ctest runs the binary per test with --gtest_filter below).
  ArenaOptions o;
  auto arena = Make(o);
  auto p = arena->Allocate(2 * kMiB, 0);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("CUDA registration on device 0 failed"), std::string::npos)
      << p.status().message();
  EXPECT_EQ(arena->stats().failures, 1u);
  EXPECT_TRUE(testsupport::PollUntil([&] { return Leases().empty(); }));
  // Without require_registration the lease is kept, unregistered.
  o.require_registration = false;
  auto lax = Make(o);
  auto r = lax->Allocate(2 * kMiB, 0);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(lax->Free(*r));
}

}  // namespace
}  // namespace cxlpool::hostalloc
