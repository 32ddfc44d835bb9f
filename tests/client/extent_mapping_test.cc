// The client's mapping of a lease made of extents (client_lib/src/
// extent_mapping.h), with real memfds and no daemon: the extents become one
// contiguous buffer in order, aligned for huge pages, with nothing of the
// reservation left around it; writes through the buffer land in the right
// memfd; unmapping leaves no mapping and no fd behind; bad pieces are
// refused with nothing mapped; and CUDA registers such a range in chunks
// (fake libcuda) exactly as it would one mapping.
#include "extent_mapping.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "cuda_driver.h"

namespace cxlpool {
namespace {

constexpr uint64_t kKiB = 1ull << 10;
constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kGiB = 1ull << 30;

UniqueFd Memfd(uint64_t size, unsigned char fill) {
  UniqueFd fd(::memfd_create("extent-mapping-test", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  EXPECT_TRUE(fd.valid());
  EXPECT_EQ(::ftruncate(fd.get(), static_cast<off_t>(size)), 0);
  if (fill != 0) {
    std::vector<unsigned char> buf(size, fill);
    EXPECT_EQ(::pwrite(fd.get(), buf.data(), buf.size(), 0), static_cast<ssize_t>(size));
  }
  return fd;
}

// Mappings of this process that overlap [lo, hi).
int MappingsIn(uintptr_t lo, uintptr_t hi) {
  std::ifstream in("/proc/self/maps");
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    uintptr_t a = 0, b = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx", &a, &b) == 2 && a < hi && b > lo) ++n;
  }
  return n;
}

// A PROT_NONE mapping that ends at `lo` or starts at `hi`: what would be
// left of a reservation that was not trimmed.
bool ReservationLeftAround(uintptr_t lo, uintptr_t hi) {
  std::ifstream in("/proc/self/maps");
  std::string line;
  while (std::getline(in, line)) {
    uintptr_t a = 0, b = 0;
    char perms[8] = {};
    if (std::sscanf(line.c_str(), "%lx-%lx %7s", &a, &b, perms) == 3 &&
        std::string(perms) == "---p" && (b == lo || a == hi)) {
      return true;
    }
  }
  return false;
}

int OpenFds() {
  int n = 0;
  for (int fd = 0; fd < 4096; ++fd) n += ::fcntl(fd, F_GETFD) >= 0;
  return n;
}

std::vector<ExtentMapping::Piece> Pieces(const std::vector<uint64_t>& sizes) {
  std::vector<ExtentMapping::Piece> out;
  unsigned char fill = 1;
  for (uint64_t s : sizes) out.push_back({Memfd(s, fill++), s, 4096});
  return out;
}

TEST(ExtentMapping, ExtentsBecomeOneBufferInOrder) {
  const std::vector<uint64_t> sizes = {8 * kMiB, 2 * kMiB, 2 * kMiB, 100 * kKiB};
  const int fds_before = OpenFds();
  auto m = ExtentMapping::Map(Pieces(sizes), "memfd");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const uint64_t total = 12 * kMiB + 100 * kKiB;
  EXPECT_EQ(m->size(), total);
  ASSERT_EQ(m->extents().size(), 4u);
  EXPECT_EQ(m->fd(), -1) << "a lease of several extents has no single fd";
  const uintptr_t base = reinterpret_cast<uintptr_t>(m->data());
  EXPECT_EQ(base % (2 * kMiB), 0u) << "aligned for huge pages";
  EXPECT_EQ(MappingsIn(base, base + total), 4) << "one mapping per extent";
  EXPECT_FALSE(ReservationLeftAround(base, base + total)) << "the slack was given back";
  // Each extent's bytes where they belong.
  const auto* p = static_cast<const unsigned char*>(m->data());
  uint64_t off = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_EQ(m->extents()[i].offset, off);
    EXPECT_EQ(p[off], i + 1);
    EXPECT_EQ(p[off + sizes[i] - 1], i + 1);
    off += sizes[i];
  }
  // Writes through the buffer reach the memfds.
  std::memset(static_cast<char*>(m->data()) + 10 * kMiB - 1, 0xEE, 2);
  unsigned char a = 0, b = 0;
  ASSERT_EQ(::pread(m->extents()[1].fd.get(), &a, 1, 2 * kMiB - 1), 1);
  ASSERT_EQ(::pread(m->extents()[2].fd.get(), &b, 1, 0), 1);
  EXPECT_EQ(a, 0xEE);
  EXPECT_EQ(b, 0xEE);
  EXPECT_EQ(OpenFds(), fds_before + 4);
  m->Unmap();
  EXPECT_FALSE(m->mapped());
  EXPECT_EQ(MappingsIn(base, base + total), 0);
  EXPECT_EQ(OpenFds(), fds_before);
  m->Unmap();  // idempotent
}

TEST(ExtentMapping, OneExtentIsOneMmapWithItsFd) {
  std::vector<ExtentMapping::Piece> one;
  one.push_back({Memfd(3 * 4096, 7), 3 * 4096, 4096});
  const int raw = one[0].fd.get();
  auto m = ExtentMapping::Map(std::move(one), "memfd");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->fd(), raw);
  EXPECT_EQ(static_cast<unsigned char*>(m->data())[3 * 4096 - 1], 7);
  ExtentMapping moved = std::move(*m);
  EXPECT_FALSE(m->mapped());
  EXPECT_TRUE(moved.mapped());
}

// A 1 GiB extent gets a 1 GiB-aligned range (hugetlb-1G, PUD-mapped THP);
// nothing is populated here (Populate::kNone), so no memory is used.
TEST(ExtentMapping, AGiBExtentGetsAGiBAlignedRange) {
  std::vector<ExtentMapping::Piece> pieces;
  pieces.push_back({Memfd(kGiB, 0), kGiB, 4096});
  pieces.push_back({Memfd(2 * kMiB, 0), 2 * kMiB, 4096});
  EXPECT_EQ(ExtentMapping::RangeAlignment(pieces), kGiB);
  auto m = ExtentMapping::Map(std::move(pieces), "memfd", ExtentMapping::Populate::kNone);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(m->data()) % kGiB, 0u);
  std::vector<ExtentMapping::Piece> small = Pieces({64 * kKiB, 64 * kKiB});
  EXPECT_EQ(ExtentMapping::RangeAlignment(small), 4096u) << "no slack for a small lease";
}

TEST(ExtentMapping, BadPiecesAreRefusedWithNothingMapped) {
  const int fds_before = OpenFds();
  auto expect = [&](std::vector<ExtentMapping::Piece> pieces, Code code, const std::string& needle,
                    const std::string& backing = "memfd") {
    auto m = ExtentMapping::Map(std::move(pieces), backing);
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.status().code(), code) << m.status().ToString();
    EXPECT_NE(m.status().message().find(needle), std::string::npos) << m.status().message();
    EXPECT_EQ(OpenFds(), fds_before) << needle;
  };
  expect({}, Code::kInvalidArgument, "without extents");
  {
    auto p = Pieces({2 * kMiB, 2 * kMiB});
    p[1].size = 4 * kMiB;  // the daemon says 4 MiB, the memfd has 2
    expect(std::move(p), Code::kProtocol, "extent 1's fd is 2097152 bytes");
  }
  {
    auto p = Pieces({2 * kMiB, 8192});
    p[1].page_size = 2 * kMiB;
    expect(std::move(p), Code::kInvalidArgument, "page size");
  }
  {
    auto p = Pieces({2 * kMiB});
    p.push_back({UniqueFd(), 4096, 4096});
    expect(std::move(p), Code::kInvalidArgument, "no extent 1's fd");
  }
  {
    std::vector<ExtentMapping::Piece> p = Pieces({4096});
    p.push_back({UniqueFd(::open("/dev/null", O_RDWR | O_CLOEXEC)), 4096, 4096});
    expect(std::move(p), Code::kProtocol, "neither a regular file", "devdax");
  }
}

// A shared device's slice: one fd of the whole device (here a file),
// mapped at the slice's offset; an offset that leaves the device, a second
// extent, or an offset on any other backing is refused.
TEST(ExtentMapping, ASharedSliceIsMappedAtItsDeviceOffset) {
  UniqueFd dev = Memfd(16 * kMiB, 0);
  const char tag[] = "slice 3";
  ASSERT_EQ(::pwrite(dev.get(), tag, sizeof tag, 6 * kMiB), static_cast<ssize_t>(sizeof tag));
  std::vector<ExtentMapping::Piece> one;
  one.push_back({UniqueFd(::dup(dev.get())), 2 * kMiB, 2 * kMiB, 6 * kMiB});
  auto m = ExtentMapping::Map(std::move(one), "shared-slice");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(std::memcmp(m->data(), tag, sizeof tag), 0);
  std::memset(static_cast<char*>(m->data()) + 4096, 0x77, 16);
  unsigned char back = 0;
  ASSERT_EQ(::pread(dev.get(), &back, 1, 6 * kMiB + 4096), 1);
  EXPECT_EQ(back, 0x77);  // written through to the device

  const int fds_before = OpenFds();
  auto refused = [&](uint64_t offset, const std::string& backing, size_t extents = 1) {
    std::vector<ExtentMapping::Piece> p;
    for (size_t i = 0; i < extents; ++i)
      p.push_back({UniqueFd(::dup(dev.get())), 2 * kMiB, 2 * kMiB, offset});
    auto r = ExtentMapping::Map(std::move(p), backing);
    EXPECT_EQ(OpenFds(), fds_before);
    return !r.ok() && r.status().code() == Code::kProtocol;
  };
  EXPECT_TRUE(refused(16 * kMiB, "shared-slice"));          // past the device's end
  EXPECT_TRUE(refused(4096, "shared-slice"));               // not on a page boundary
  EXPECT_TRUE(refused(uint64_t{1} << 63, "shared-slice"));  // past what an off_t holds
  EXPECT_TRUE(refused(2 * kMiB, "shared-slice", 2));
  EXPECT_TRUE(refused(2 * kMiB, "memfd"));
}

// CUDA registration of a multi-extent range: the same chunks as for one
// mapping of that size (the fake libcuda records the calls).
TEST(ExtentMapping, CudaRegistersTheRangeInChunks) {
  const char* fake = std::getenv("CXLPOOL_FAKE_CUDA");
  if (fake == nullptr) GTEST_SKIP() << "no fake CUDA library";
  auto driver = cuda::CudaDriver::Load(fake);
  ASSERT_TRUE(driver.ok()) << driver.status().ToString();
  auto m = ExtentMapping::Map(Pieces({8 * kMiB, 8 * kMiB, 2 * kMiB, 2 * kMiB, 4096}), "memfd");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const uint64_t chunk = 6 * kMiB;  // chunks that straddle extents
  auto reg = cuda::RegisterHostMemory(**driver, 0, m->data(), m->size(), chunk);
  ASSERT_TRUE(reg.ok()) << reg.status().ToString();
  const auto& chunks = reg->chunks();
  auto plan = cuda::PlanChunks(m->size(), chunk);
  ASSERT_EQ(chunks.size(), plan.size());
  uint64_t covered = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    EXPECT_EQ(chunks[i].offset, plan[i].offset);
    EXPECT_EQ(chunks[i].length, plan[i].length);
    covered += chunks[i].length;
  }
  EXPECT_EQ(covered, m->size());
  EXPECT_TRUE(reg->contiguous());
  EXPECT_TRUE(reg->Unregister().ok());
}

}  // namespace
}  // namespace cxlpool
