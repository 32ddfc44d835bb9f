// SharedSlicePool (pool/shared_slice_pool.h) on a fake SliceSource: a lease
// is one whole slice at its offset of the device, its slice goes back
// exactly once, failures give the slice back, and placement offers the pool
// only to requests that name the "shared" tier.
#include "pool/shared_slice_pool.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "lease/placement.h"
#include "test_util.h"

namespace cxlpool {
namespace {

constexpr uint64_t kSlice = 4ull << 20;

class FakeSource final : public SliceSource {
 public:
  Result<Slice> Take(const std::string& path) override {
    takes.push_back(path);
    if (!next.ok()) return next.status();
    return *next;
  }
  void Return(const std::string& path, uint32_t index) override {
    returns.emplace_back(path, index);
  }
  void Hold(const std::string& path, uint32_t index) override { holds.emplace_back(path, index); }

  Result<Slice> next = Slice{3, (2ull << 20) + 3 * kSlice, kSlice};
  std::vector<std::string> takes;
  std::vector<std::pair<std::string, uint32_t>> returns, holds;
};

class SharedSlicePoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/cxlpool-shared-XXXXXX";
    int fd = ::mkstemp(tmpl);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, 64ll << 20), 0);
    ::close(fd);
    path_ = tmpl;
    pool_ = std::make_unique<SharedSlicePool>(path_, kSlice, 60ull << 20, &source_);
  }
  void TearDown() override { ::unlink(path_.c_str()); }

  std::string path_;
  FakeSource source_;
  std::unique_ptr<SharedSlicePool> pool_;
};

TEST_F(SharedSlicePoolTest, ALeaseIsOneWholeSlice) {
  EXPECT_EQ(pool_->name(), "shared:" + path_.substr(path_.rfind('/') + 1));
  EXPECT_EQ(pool_->quota_tier(), "shared");
  EXPECT_EQ(pool_->numa_node(), -1);
  EXPECT_EQ(*pool_->RoundSize(1, false), kSlice);
  EXPECT_EQ(*pool_->RoundSize(kSlice, false), kSlice);
  EXPECT_EQ(pool_->RoundSize(0, false).status().code(), Code::kInvalidArgument);
  auto big = pool_->RoundSize(kSlice + 1, false);
  EXPECT_EQ(big.status().code(), Code::kResourceExhausted);
  EXPECT_NE(big.status().message().find("at most one slice"), std::string::npos);
  EXPECT_EQ(pool_->RoundSize(4096, true).status().code(), Code::kUnsupported);
}

TEST_F(SharedSlicePoolTest, BuildMapsTheSliceAndReclaimReturnsItOnce) {
  auto b = pool_->Build(kSlice, false);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ((*b)->kind(), "shared-slice");
  EXPECT_EQ((*b)->size_bytes(), kSlice);
  EXPECT_EQ((*b)->device_offset(), (2ull << 20) + 3 * kSlice);
  EXPECT_EQ((*b)->shared_slice(), 3u);
  ASSERT_GE((*b)->fd(), 0);
  EXPECT_TRUE(pool_->CheckFd((*b)->fd()).ok());
  uint64_t inode = 0, dev = 0;
  EXPECT_TRUE((*b)->Identity(&inode, &dev));
  EXPECT_TRUE(source_.returns.empty());
  (*b)->Reclaim();
  EXPECT_EQ((*b)->fd(), -1);
  b->reset();  // the destructor reclaims again: nothing more
  ASSERT_EQ(source_.returns.size(), 1u);
  EXPECT_EQ(source_.returns[0], std::make_pair(path_, 3u));
}

TEST_F(SharedSlicePoolTest, FailuresGiveTheSliceBack) {
  source_.next = Status(Code::kUnavailable, "fenced");
  EXPECT_EQ(pool_->Build(kSlice, false).status().code(), Code::kUnavailable);
  EXPECT_TRUE(source_.returns.empty());  // nothing was taken
  // The cluster cuts the device otherwise than the config says.
  source_.next = SliceSource::Slice{5, 0, kSlice / 2};
  auto mismatch = pool_->Build(kSlice, false);
  EXPECT_EQ(mismatch.status().code(), Code::kInvalidArgument);
  EXPECT_NE(mismatch.status().message().find("slice_size"), std::string::npos);
  ASSERT_EQ(source_.returns.size(), 1u);
  EXPECT_EQ(source_.returns.back().second, 5u);
  // The device cannot be opened.
  ::unlink(path_.c_str());
  source_.next = SliceSource::Slice{6, 0, kSlice};
  EXPECT_FALSE(pool_->Build(kSlice, false).ok());
  ASSERT_EQ(source_.returns.size(), 2u);
  EXPECT_EQ(source_.returns.back().second, 6u);
  // Only whole slices are built.
  EXPECT_EQ(pool_->Build(kSlice / 2, false).status().code(), Code::kInvalidArgument);
}

TEST_F(SharedSlicePoolTest, RecoveredHoldsItsSliceAndChecksHandedBackFds) {
  auto b = pool_->Recovered(7, (2ull << 20) + 7 * kSlice, kSlice);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_EQ(source_.holds.size(), 1u);
  EXPECT_EQ(source_.holds[0].second, 7u);
  EXPECT_EQ((*b)->shared_slice(), 7u);
  int same = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  int other = ::open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
  EXPECT_TRUE(pool_->CheckFd(same).ok());
  EXPECT_EQ(pool_->CheckFd(other).code(), Code::kInvalidArgument);
  ::close(same);
  ::close(other);
}

TEST_F(SharedSlicePoolTest, PlacementOffersItOnlyToTheSharedTier) {
  Topology topo = testing::TwoSocketCxl();
  PoolBuildOptions o;
  o.bind = false;
  auto built = BuildPools(topo, testing::TestConfig(), o, nullptr);
  ASSERT_TRUE(built.ok());
  std::vector<Pool*> pools;
  for (auto& p : *built) pools.push_back(p.get());
  pools.push_back(pool_.get());
  PlacementRequest r;
  auto c = PlanPlacement(topo, pools, r);
  ASSERT_TRUE(c.ok());
  for (const Candidate& x : *c) EXPECT_NE(x.pool, pool_.get());
  r.tiers = {"shared"};
  r.strict = true;
  c = PlanPlacement(topo, pools, r);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ(c->size(), 1u);
  EXPECT_EQ((*c)[0].pool, pool_.get());
  EXPECT_NE((*c)[0].reason.find("tier shared is preference #1"), std::string::npos)
      << (*c)[0].reason;
  r.tiers = {"shared", "dram"};  // then falls back to DRAM
  r.strict = false;
  c = PlanPlacement(topo, pools, r);
  ASSERT_TRUE(c.ok());
  ASSERT_GE(c->size(), 2u);
  EXPECT_EQ((*c)[0].pool, pool_.get());
  EXPECT_EQ((*c)[1].pool->kind(), "dram");
  r.long_term_pin = true;  // device memory does not migrate under a pin
  c = PlanPlacement(topo, pools, r);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)[0].pool, pool_.get());
}

}  // namespace
}  // namespace cxlpool
