// The pool's extent layer on this machine's node 0 (pool/extent.h,
// extent_cut.h, extent_reserve.h): an extent is a sealed, pinned memfd
// whose every page the kernel places on the bound node (move_pages,
// get_mempolicy); a retired extent is inert for whoever still holds it
// (SIGBUS, cannot grow); the cut of a lease into extents (exact size,
// bounded pieces, aligned offsets); the reserve's watermarks, targets and
// recycling; and, through the refiller on real threads, no leak between
// tenants: a lease rebuilt from recycled memory reads all zeros, also for
// another uid, and refills run on the low-priority stock threads.
#include "pool/extent.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <numaif.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/thread_pool.hpp>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "lease/thread_priority.h"
#include "pool/extent_cut.h"
#include "pool/extent_reserve.h"
#include "pool/shared_fill.h"

namespace cxlpool {
namespace {

constexpr uint64_t kKiB = 1ull << 10;
constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kGiB = 1ull << 30;

bool Node0HasMemory() { return ::access("/sys/devices/system/node/node0/meminfo", R_OK) == 0; }

// Every page of [addr, addr+len) as move_pages reports it (status = node);
// empty when the call fails.
std::vector<int> PageNodes(const void* addr, uint64_t len) {
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  std::vector<void*> pages;
  for (uint64_t off = 0; off < len; off += page) {
    pages.push_back(const_cast<char*>(static_cast<const char*>(addr)) + off);
  }
  std::vector<int> status(pages.size(), -1);
  if (::move_pages(0, pages.size(), pages.data(), nullptr, status.data(), 0) != 0) return {};
  return status;
}

// The kB of `field` ("Locked", "Rss") in /proc/self/smaps for the mapping
// that starts at `addr`.
uint64_t SmapsKb(const void* addr, const std::string& field) {
  std::ifstream in("/proc/self/smaps");
  std::string line;
  bool inside = false;
  const uintptr_t want = reinterpret_cast<uintptr_t>(addr);
  while (std::getline(in, line)) {
    uintptr_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') > 12) {
      inside = lo == want;
      continue;
    }
    if (inside && line.rfind(field + ":", 0) == 0)
      return std::stoull(line.substr(field.size() + 1));
  }
  return 0;
}

// Every page of `fd` (of `size` bytes), mapped as a client would, is on
// node 0, and reads `expect` throughout.
void ExpectClientView(int fd, uint64_t size, unsigned char expect) {
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  ASSERT_NE(p, MAP_FAILED) << std::strerror(errno);
  auto nodes = PageNodes(p, size);
  ASSERT_EQ(nodes.size(), size / static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)));
  for (int n : nodes) ASSERT_EQ(n, 0);
  const auto* c = static_cast<const unsigned char*>(p);
  for (uint64_t i = 0; i < size; ++i) {
    if (c[i] != expect) {
      ::munmap(p, size);
      FAIL() << "byte " << i << " of " << size << " is " << int(c[i]) << ", expected "
             << int(expect);
    }
  }
  ::munmap(p, size);
}

MemfdSpec Spec(uint64_t size) {
  MemfdSpec s;
  s.size_bytes = size;
  s.numa_node = 0;
  s.pin = true;
  s.name = "cxlpool-extent-test";
  return s;
}

class ExtentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!Node0HasMemory()) GTEST_SKIP() << "no NUMA node 0 here";
  }
};

TEST_F(ExtentTest, IsSealedPinnedZeroAndOnTheBoundNode) {
  auto e = Extent::Create(Spec(4 * kMiB));
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  Extent& x = **e;
  EXPECT_EQ(x.size_bytes(), 4 * kMiB);
  EXPECT_EQ(x.built_bytes(), 4 * kMiB);
  EXPECT_EQ(x.page_size(), 4096u);
  EXPECT_EQ(x.kind(), "memfd");
  EXPECT_FALSE(x.exposed());
  struct stat st {};
  ASSERT_EQ(::fstat(x.fd(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), 4 * kMiB);
  EXPECT_EQ(st.st_ino, x.inode());
  int seals = ::fcntl(x.fd(), F_GET_SEALS);
  EXPECT_TRUE(seals & F_SEAL_GROW);
  EXPECT_TRUE(seals & F_SEAL_SEAL);
  EXPECT_FALSE(seals & F_SEAL_SHRINK) << "revoke must be able to truncate";
  EXPECT_NE(::ftruncate(x.fd(), 8 * kMiB), 0) << "growing a sealed extent must fail";
  // Pinned as it was faulted in (mlock2 MLOCK_ONFAULT + prefault).
  EXPECT_EQ(SmapsKb(x.daemon_addr(), "Locked"), 4 * kMiB / kKiB);
  // The kernel's view of placement: the policy and every page.
  int mode = -1;
  unsigned long mask[16] = {0};
  ASSERT_EQ(::get_mempolicy(&mode, mask, sizeof(mask) * 8, x.daemon_addr(), MPOL_F_ADDR), 0);
  EXPECT_EQ(mode, MPOL_BIND);
  EXPECT_EQ(mask[0], 1ul);
  auto nodes = PageNodes(x.daemon_addr(), 4 * kMiB);
  ASSERT_EQ(nodes.size(), 4 * kMiB / 4096) << "every page is resident";
  for (int n : nodes) ASSERT_EQ(n, 0);
  ExpectClientView(x.fd(), 4 * kMiB, 0);
}

TEST_F(ExtentTest, ShrinkFreesTheRestAndOnlyBeforeExposure) {
  auto e = Extent::Create(Spec(2 * kMiB));
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  Extent& x = **e;
  EXPECT_EQ(x.ShrinkTo(0).code(), Code::kInvalidArgument);
  EXPECT_EQ(x.ShrinkTo(4 * kMiB).code(), Code::kInvalidArgument);
  EXPECT_EQ(x.ShrinkTo(100 * kKiB + 1).code(), Code::kInvalidArgument);
  ASSERT_TRUE(x.ShrinkTo(100 * kKiB).ok());
  struct stat st {};
  ASSERT_EQ(::fstat(x.fd(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), 100 * kKiB);
  EXPECT_EQ(x.size_bytes(), 100 * kKiB);
  EXPECT_EQ(x.built_bytes(), 2 * kMiB);
  EXPECT_LE(static_cast<uint64_t>(st.st_blocks) * 512, 100 * kKiB) << "the rest went back";
  ExpectClientView(x.fd(), 100 * kKiB, 0);
  x.MarkExposed();
  EXPECT_EQ(x.ShrinkTo(64 * kKiB).code(), Code::kInvalidArgument);
}

// What a holder keeps after a retire: an fd of size 0 that cannot grow, and
// a mapping whose next access is SIGBUS.
TEST_F(ExtentTest, RetiredExtentIsInertForItsHolders) {
  auto e = Extent::Create(Spec(2 * kMiB));
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  UniqueFd holder(::fcntl((*e)->fd(), F_DUPFD_CLOEXEC, 0));
  void* map = ::mmap(nullptr, 2 * kMiB, PROT_READ | PROT_WRITE, MAP_SHARED, holder.get(), 0);
  ASSERT_NE(map, MAP_FAILED);
  std::memset(map, 0x5A, 2 * kMiB);
  (*e)->MarkExposed();
  (*e)->Retire();
  EXPECT_TRUE((*e)->retired());
  (*e)->Retire();  // idempotent
  struct stat st {};
  ASSERT_EQ(::fstat(holder.get(), &st), 0);
  EXPECT_EQ(st.st_size, 0);
  EXPECT_NE(::ftruncate(holder.get(), 2 * kMiB), 0) << "nobody can grow it back";
  EXPECT_EQ(errno, EPERM);
  EXPECT_NE(::fallocate(holder.get(), 0, 0, 2 * kMiB), 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::signal(SIGBUS, SIG_DFL);  // not a sanitizer's handler: the signal itself
    volatile char c = static_cast<volatile char*>(map)[4096];
    (void)c;
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGBUS) << "status " << status;
  ::munmap(map, 2 * kMiB);
}

// ---- the cut ---------------------------------------------------------------

TEST(ExtentLadderTest, ValidatesGranules) {
  EXPECT_TRUE(ExtentLadder::Make({2 * kMiB, 32 * kMiB, kGiB}).ok());
  EXPECT_FALSE(ExtentLadder::Make({}).ok());
  EXPECT_FALSE(ExtentLadder::Make({kMiB}).ok()) << "not a multiple of 2 MiB";
  EXPECT_FALSE(ExtentLadder::Make({4 * kMiB, 2 * kMiB}).ok()) << "not ascending";
  EXPECT_FALSE(ExtentLadder::Make({4 * kMiB, 6 * kMiB}).ok()) << "6 MiB is no multiple of 4";
  ExtentLadder d = ExtentLadder::Default();
  EXPECT_EQ(d.granules(), (std::vector<uint64_t>{2 * kMiB, 32 * kMiB, kGiB}));
  EXPECT_EQ(d.IndexOf(32 * kMiB), 1u);
  EXPECT_FALSE(d.IndexOf(8 * kMiB));
}

// Checks the invariants of every cut: sizes add up, every piece but the
// last is a multiple of 2 MiB, largest granules first (so offsets align).
void ExpectWellFormed(const CutPlan& p, uint64_t page) {
  uint64_t sum = 0, reserve = 0, build = 0;
  for (size_t i = 0; i < p.pieces.size(); ++i) {
    const CutPiece& c = p.pieces[i];
    ASSERT_GT(c.bytes, 0u);
    ASSERT_EQ(c.bytes % page, 0u);
    if (i + 1 < p.pieces.size()) {
      ASSERT_EQ(c.bytes % (2 * kMiB), 0u) << "piece " << i;
    }
    if (c.source == CutPiece::Source::kReserve && c.granule >= kGiB) {
      ASSERT_EQ(sum % kGiB, 0u) << "a 1 GiB extent at offset " << sum;
    }
    if (c.source == CutPiece::Source::kReserve) {
      reserve += c.bytes;
      ASSERT_LE(c.bytes, c.granule);
    } else {
      build += c.bytes;
    }
    sum += c.bytes;
  }
  EXPECT_EQ(sum, p.lease_bytes);
  EXPECT_EQ(reserve, p.reserve_bytes);
  EXPECT_EQ(build, p.build_bytes);
  EXPECT_GE(p.lease_bytes, p.requested_bytes);
  EXPECT_LT(p.waste_bytes(), page);
}

TEST(ExtentCutTest, SmallLeasesAreOneExactSizeMemfd) {
  const ExtentLadder l = ExtentLadder::Default();
  const std::vector<uint32_t> full = {100, 100, 100};
  for (uint64_t size : std::vector<uint64_t>{1, 4096, 5000, 100 * kKiB, 508 * kKiB - 1}) {
    auto p = PlanCut(size, 4096, l, full);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    ExpectWellFormed(*p, 4096);
    ASSERT_EQ(p->pieces.size(), 1u) << size;
    EXPECT_EQ(p->pieces[0].source, CutPiece::Source::kBuild) << "below shrink_tail_min: built";
    EXPECT_EQ(p->pieces[0].bytes, (size + 4095) / 4096 * 4096);
  }
  // From 512 KiB up to 2 MiB: one reserve extent of 2 MiB, shrunk.
  auto p = PlanCut(kMiB + 1, 4096, l, full);
  ASSERT_TRUE(p.ok());
  ExpectWellFormed(*p, 4096);
  ASSERT_EQ(p->pieces.size(), 1u);
  EXPECT_EQ(p->pieces[0].source, CutPiece::Source::kReserve);
  EXPECT_EQ(p->pieces[0].granule, 2 * kMiB);
  EXPECT_EQ(p->pieces[0].bytes, kMiB + 4096);
  EXPECT_EQ(p->dropped_bytes, kMiB - 4096);
  EXPECT_EQ(p->waste_bytes(), 4095u);
  // An empty reserve builds it.
  p = PlanCut(kMiB + 1, 4096, l, std::vector<uint32_t>{0, 0, 0});
  ASSERT_TRUE(p.ok());
  ASSERT_EQ(p->pieces.size(), 1u);
  EXPECT_EQ(p->pieces[0].source, CutPiece::Source::kBuild);
}

TEST(ExtentCutTest, SmallLeasesComeFromPrebuiltSmallExtents) {
  const ExtentLadder l = ExtentLadder::Default();
  const std::vector<uint64_t> classes = SmallClasses(4096, l);
  ASSERT_EQ(classes.size(), 9u);
  EXPECT_EQ(classes.front(), 4 * kKiB);
  EXPECT_EQ(classes.back(), kMiB);
  EXPECT_TRUE(SmallClasses(2 * kMiB, l).empty());
  const std::vector<uint32_t> full = {100, 100, 100};
  const std::vector<uint32_t> small(9, 4);
  for (uint64_t size : std::vector<uint64_t>{1, 4096, 5000, 100 * kKiB, 508 * kKiB - 1, kMiB}) {
    auto p = PlanCut(size, 4096, l, full, {}, small);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    ExpectWellFormed(*p, 4096);
    ASSERT_EQ(p->pieces.size(), 1u) << size;
    const CutPiece& c = p->pieces[0];
    EXPECT_EQ(c.source, CutPiece::Source::kReserve) << size << ": nothing to build";
    EXPECT_EQ(c.bytes, (size + 4095) / 4096 * 4096);
    EXPECT_GE(c.granule, c.bytes);
    EXPECT_LT(c.granule, 2 * c.bytes) << "the class that holds it";
    EXPECT_EQ(p->build_bytes, 0u);
    EXPECT_EQ(p->dropped_bytes, c.granule - c.bytes);
  }
  // Its class empty: the one above; both empty: built (or, from 512 KiB,
  // a shrunk 2 MiB extent), as without small extents.
  std::vector<uint32_t> holes(9, 4);
  holes[5] = 0;  // 128 KiB
  auto p = PlanCut(100 * kKiB, 4096, l, full, {}, holes);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->pieces[0].granule, 256 * kKiB);
  holes[6] = 0;
  p = PlanCut(100 * kKiB, 4096, l, full, {}, holes);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->pieces[0].source, CutPiece::Source::kBuild);
  // The tail of a large lease too.
  p = PlanCut(4 * kMiB + 20 * kKiB, 4096, l, full, {}, small);
  ASSERT_TRUE(p.ok());
  ExpectWellFormed(*p, 4096);
  ASSERT_EQ(p->pieces.size(), 3u);
  EXPECT_EQ(p->pieces[2].granule, 32 * kKiB);
  EXPECT_EQ(p->pieces[2].bytes, 20 * kKiB);
  EXPECT_EQ(p->build_bytes, 0u);
  EXPECT_EQ(PlanCut(1, 4096, l, full, {}, std::vector<uint32_t>(10, 1)).status().code(),
            Code::kInvalidArgument);
}

TEST(ExtentCutTest, LargeLeaseFromAFullReserve) {
  const ExtentLadder l = ExtentLadder::Default();
  const uint64_t size = 3 * kGiB + 40 * kMiB + 3 * kMiB + 100 * kKiB;
  auto p = PlanCut(size, 4096, l, std::vector<uint32_t>{100, 100, 100});
  ASSERT_TRUE(p.ok());
  ExpectWellFormed(*p, 4096);
  std::vector<uint64_t> sizes;
  for (const auto& c : p->pieces) sizes.push_back(c.bytes);
  const uint64_t tail = kMiB + 100 * kKiB;
  EXPECT_EQ(sizes, (std::vector<uint64_t>{kGiB, kGiB, kGiB, 32 * kMiB, 2 * kMiB, 2 * kMiB, 2 * kMiB,
                                          2 * kMiB, 2 * kMiB, tail}));
  EXPECT_EQ(p->build_bytes, 0u);
  EXPECT_EQ(p->reserve_pieces(), 10u);
}

TEST(ExtentCutTest, WhatTheReserveLacksIsBuiltAsOneExtentWithTheTail) {
  const ExtentLadder l = ExtentLadder::Default();
  // No 1 GiB extents, two of 32 MiB, none of 2 MiB.
  auto p =
      PlanCut(kGiB + 64 * kMiB + 6 * kMiB + 12 * kKiB, 4096, l, std::vector<uint32_t>{0, 2, 0});
  ASSERT_TRUE(p.ok());
  ExpectWellFormed(*p, 4096);
  ASSERT_EQ(p->pieces.size(), 3u);
  EXPECT_EQ(p->pieces[0].granule, 32 * kMiB);
  EXPECT_EQ(p->pieces[1].granule, 32 * kMiB);
  EXPECT_EQ(p->pieces[2].source, CutPiece::Source::kBuild);
  EXPECT_EQ(p->pieces[2].bytes, kGiB + 6 * kMiB + 12 * kKiB);
  // Falling back to small granules is bounded: a 2 GiB lease from 2 MiB
  // stock takes at most 2 + 64 pieces; the rest is built.
  p = PlanCut(2 * kGiB, 4096, l, std::vector<uint32_t>{1000, 0, 0});
  ASSERT_TRUE(p.ok());
  ExpectWellFormed(*p, 4096);
  EXPECT_EQ(p->reserve_pieces(), 66u);
  EXPECT_EQ(p->build_bytes, 2 * kGiB - 66 * 2 * kMiB);
}

TEST(ExtentCutTest, HugetlbPoolsRoundToTwoMiB) {
  auto p = PlanCut(5 * kMiB, 2 * kMiB, ExtentLadder::Default(), std::vector<uint32_t>{8, 0, 0});
  ASSERT_TRUE(p.ok());
  ExpectWellFormed(*p, 2 * kMiB);
  EXPECT_EQ(p->lease_bytes, 6 * kMiB);
  EXPECT_EQ(p->waste_bytes(), kMiB);
  EXPECT_EQ(p->pieces.size(), 3u);
  EXPECT_EQ(p->dropped_bytes, 0u);
}

// Many sizes, log-uniform from 4 KiB to 64 GiB, not page-aligned, from a full
// reserve: well formed, exact to the page, and never more pieces than one
// per GiB plus 47.
TEST(ExtentCutTest, PiecesAreBoundedOverManySizes) {
  const ExtentLadder l = ExtentLadder::Default();
  const std::vector<uint32_t> full = {1000, 1000, 1000};
  uint64_t x = 88172645463325252ull;
  for (int i = 0; i < 2000; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    const double exp = 12.0 + static_cast<double>(x % 1000000) / 1000000.0 * 24.0;
    const uint64_t size = static_cast<uint64_t>(std::pow(2.0, exp)) + (x % 4093);
    auto p = PlanCut(size, 4096, l, full);
    ASSERT_TRUE(p.ok()) << size;
    ExpectWellFormed(*p, 4096);
    EXPECT_LE(p->pieces.size(), size / kGiB + 47) << size;
    const uint64_t tail = p->lease_bytes % (2 * kMiB);
    EXPECT_EQ(p->build_bytes == 0, tail == 0 || tail >= 512 * kKiB) << size;
  }
}

TEST(ExtentCutTest, RejectsBadArguments) {
  const ExtentLadder l = ExtentLadder::Default();
  const std::vector<uint32_t> full = {1, 1, 1};
  EXPECT_EQ(PlanCut(0, 4096, l, full).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(PlanCut(UINT64_MAX, 4096, l, full).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(PlanCut(1, 3000, l, full).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(PlanCut(1, 4 * kMiB, l, full).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(PlanCut(1, 4096, l, std::vector<uint32_t>{1}).status().code(), Code::kInvalidArgument);
}

// ---- the reserve (no threads: the test plays the refiller) -------------------

ReserveSettings Small(uint64_t low, uint64_t high) {
  ReserveSettings s;
  s.ladder = *ExtentLadder::Make({2 * kMiB, 8 * kMiB});
  s.low_bytes = low;
  s.high_bytes = high;
  return s;
}

MemfdSpec Base() {
  MemfdSpec b = Spec(0);
  return b;
}

// Builds what PlanRefill asked for, inline.
void RefillInline(ExtentReserve& r, uint64_t room = UINT64_MAX) {
  for (uint64_t g : r.PlanRefill(room)) {
    auto e = Extent::Create(r.BuildSpec(g, true));
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    r.Built(std::move(*e));
  }
}

TEST(ExtentReserveTargetsTest, SpreadOverTheDefaultLadder) {
  ReserveSettings s;
  s.high_bytes = 4 * kGiB;
  ExtentReserve r("node0", s, Base());
  // The high watermark in ladder extents; four small extents of each class
  // on top of it.
  EXPECT_EQ(r.targets(), (std::vector<uint32_t>{16, 31, 3}));
  EXPECT_EQ(r.small_classes().size(), 9u);  // 4 KiB .. 1 MiB
  EXPECT_EQ(r.small_targets(), std::vector<uint32_t>(9, 4));
  EXPECT_EQ(r.small_target_bytes(), 4 * (kMiB * 2 - 4 * kKiB));
  EXPECT_EQ(r.limit_bytes(), 4 * kGiB + r.small_target_bytes());
  s.high_bytes = 256 * kMiB;
  ExtentReserve r2("node0", s, Base());
  EXPECT_EQ(r2.targets(), (std::vector<uint32_t>{16, 7, 0}));
  uint64_t granules = 0, small = 0;
  for (size_t i = 0; i < 3; ++i) granules += r2.targets()[i] * s.ladder.granules()[i];
  for (size_t i = 0; i < 9; ++i) small += r2.small_targets()[i] * r2.small_classes()[i];
  EXPECT_EQ(granules, 256 * kMiB);
  EXPECT_EQ(small, r2.small_target_bytes());
  EXPECT_LT(small, 8 * kMiB);
  s.high_bytes = 0;
  ExtentReserve r3("node0", s, Base());
  EXPECT_EQ(r3.targets(), (std::vector<uint32_t>{0, 0, 0}));
  EXPECT_EQ(r3.small_targets(), std::vector<uint32_t>(9, 0));
  // Too small a reserve for them: none (they would be more than a quarter
  // of its 2 MiB extents).
  s.high_bytes = 12 * kMiB;
  ExtentReserve r4("node0", s, Base());
  EXPECT_EQ(r4.small_targets(), std::vector<uint32_t>(9, 0));
  EXPECT_EQ(r4.targets(), (std::vector<uint32_t>{6, 0, 0}));
  EXPECT_EQ(r4.limit_bytes(), 12 * kMiB);
  // hugetlb pools have none (every lease is whole 2 MiB pages).
  MemfdSpec huge = Base();
  huge.hugetlb = true;
  s.high_bytes = 4 * kGiB;
  ExtentReserve r5("node0", s, huge);
  EXPECT_TRUE(r5.small_classes().empty());
  EXPECT_EQ(r5.targets(), (std::vector<uint32_t>{16, 31, 3}));
}

TEST(ExtentReserveSettingsTest, WatermarksInBytesOrPercent) {
  CapacitySpec low{true, 10.0, 0}, high{false, 0, 300 * kMiB + 5};
  auto s = ResolveReserve(low, high, kGiB);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->low_bytes, 102 * kMiB);  // 10% of 1 GiB, down to 2 MiB
  EXPECT_EQ(s->high_bytes, 300 * kMiB);
  CapacitySpec big{true, 50.0, 0};
  EXPECT_EQ(ResolveReserve(big, high, kGiB).status().code(), Code::kInvalidArgument);
}

class ExtentReserveTest : public ExtentTest {};

TEST_F(ExtentReserveTest, RefillsBetweenWatermarksWithinRoom) {
  ExtentReserve r("node0", Small(16 * kMiB, 32 * kMiB), Base());
  // 32 MiB high on {2, 8}: 2 x 2 MiB (an eighth), 3 x 8 MiB, and the 4 MiB
  // left over as two more small extents.
  EXPECT_EQ(r.targets(), (std::vector<uint32_t>{4, 3}));
  auto plan = r.PlanRefill(5 * kMiB);
  uint64_t planned = 0;
  for (uint64_t g : plan) planned += g;
  EXPECT_EQ(planned, 4 * kMiB) << "never more than the room";
  EXPECT_EQ(r.building_bytes(), planned);
  for (uint64_t g : plan) r.BuildFailed(g);
  EXPECT_EQ(r.building_bytes(), 0u);
  RefillInline(r);
  EXPECT_EQ(r.ready_bytes(), 32 * kMiB);
  EXPECT_EQ(r.ready_counts(), (std::vector<uint32_t>{4, 3}));
  EXPECT_TRUE(r.PlanRefill(UINT64_MAX).empty());
  EXPECT_FALSE(r.refilling());
  // Take 8 MiB and 2 MiB: above the low watermark (22 MiB left), with 3 of
  // 4 extents of 2 MiB and 2 of 3 of 8 MiB: no refill yet.
  auto t = r.Take(10 * kMiB);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->extents.size(), 2u);
  EXPECT_EQ(r.ready_bytes(), 22 * kMiB);
  EXPECT_TRUE(r.PlanRefill(UINT64_MAX).empty());
  // 2 MiB more: still above the low watermark (20 MiB), but the 2 MiB
  // extents are down to half their target: those two are built again; the
  // largest granule waits for the watermark.
  auto t1 = r.Take(2 * kMiB);
  ASSERT_TRUE(t1.ok());
  EXPECT_EQ(r.ready_bytes(), 20 * kMiB);
  auto top_up = r.PlanRefill(UINT64_MAX);
  EXPECT_EQ(top_up, (std::vector<uint64_t>{2 * kMiB, 2 * kMiB}));
  EXPECT_FALSE(r.refilling());
  for (uint64_t g : top_up) {
    auto e = Extent::Create(r.BuildSpec(g, true));
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    r.Built(std::move(*e));
  }
  EXPECT_TRUE(r.PlanRefill(UINT64_MAX).empty());
  EXPECT_EQ(r.ready_counts(), (std::vector<uint32_t>{4, 2}));
  EXPECT_EQ(r.ready_bytes(), 24 * kMiB);
  for (auto& e : t1->extents) t->extents.push_back(std::move(e));
  // Take 8 MiB more: 16 MiB left, at low: refill back to high.
  auto t2 = r.Take(8 * kMiB);
  ASSERT_TRUE(t2.ok());
  RefillInline(r);
  EXPECT_EQ(r.ready_bytes(), 32 * kMiB);
  // Exposed extents come back retired; never-exposed ones go back to stock
  // only below the high watermark.
  for (auto& e : t->extents) e->MarkExposed();
  r.Return(std::move(t->extents));
  EXPECT_EQ(r.retiring_bytes(), 12 * kMiB);
  r.Return(std::move(t2->extents));
  EXPECT_EQ(r.retiring_bytes(), 20 * kMiB) << "full: the unexposed ones retire too";
  auto out = r.TakeRetiring();
  EXPECT_EQ(out.size(), 4u);
  for (auto& e : out) {
    uint64_t b = e->size_bytes();
    e->Retire();
    r.Retired(b);
  }
  EXPECT_EQ(r.retiring_bytes(), 0u);
}

// A stream of 2 MiB leases with larger extents keeping the bytes above the
// low watermark (a PyTorch pinned block after another): the 2 MiB extents
// are topped up as they run out, and no lease is built on the request path.
TEST_F(ExtentReserveTest, AStreamOfSmallLeasesKeepsFindingItsGranule) {
  ReserveSettings s;  // the default ladder
  s.low_bytes = 16 * kMiB;
  s.high_bytes = 64 * kMiB;
  ExtentReserve r("node0", s, Base());
  ASSERT_EQ(r.targets(), (std::vector<uint32_t>{16, 1, 0}));
  RefillInline(r);
  ASSERT_EQ(r.ready_counts(), (std::vector<uint32_t>{16, 1, 0}));
  EXPECT_TRUE(r.PlanRefill(UINT64_MAX).empty());
  ASSERT_FALSE(r.refilling()) << "full: the next refill waits for the low watermark";
  for (int i = 0; i < 40; ++i) {
    auto t = r.Take(2 * kMiB);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    EXPECT_EQ(t->plan.build_bytes, 0u) << "lease " << i << " built on the request path";
    EXPECT_GT(r.ready_bytes(), s.low_bytes) << "the watermark alone never starts a refill here";
    for (auto& e : t->extents) e->MarkExposed();
    r.Return(std::move(t->extents));
    for (auto& e : r.TakeRetiring()) {
      const uint64_t b = e->size_bytes();
      e->Retire();
      r.Retired(b);
    }
    RefillInline(r);
  }
  EXPECT_EQ(r.ready_counts()[1], 1u) << "the 32 MiB extent was never cut";
  EXPECT_FALSE(r.refilling());
}

TEST_F(ExtentReserveTest, UnexposedExtentsGoBackToStockUnchanged) {
  ExtentReserve r("node0", Small(0, 16 * kMiB), Base());
  RefillInline(r, 0);
  EXPECT_EQ(r.ready_bytes(), 0u) << "no room, no refill";
  RefillInline(r);
  ASSERT_EQ(r.ready_bytes(), 16 * kMiB);
  auto t = r.Take(8 * kMiB);
  ASSERT_TRUE(t.ok());
  ASSERT_EQ(t->extents.size(), 1u);
  const uint64_t inode = t->extents[0]->inode();
  r.Return(std::move(t->extents));  // a grant refused before its reply left
  EXPECT_EQ(r.ready_bytes(), 16 * kMiB);
  EXPECT_EQ(r.retiring_bytes(), 0u);
  auto again = r.Take(8 * kMiB);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->extents[0]->inode(), inode) << "the same memfd, never exposed";
}

TEST_F(ExtentReserveTest, TailIsShrunkAndNeverReturnsToStock) {
  ExtentReserve r("node0", Small(0, 16 * kMiB), Base());
  RefillInline(r);
  auto t = r.Take(2 * kMiB + kMiB);  // 2 MiB + a 1 MiB tail from a shrunk 2 MiB
  ASSERT_TRUE(t.ok());
  ASSERT_EQ(t->extents.size(), 2u);
  EXPECT_EQ(t->extents[1]->size_bytes(), kMiB);
  EXPECT_EQ(t->plan.dropped_bytes, kMiB);
  r.Return(std::move(t->extents));
  EXPECT_EQ(r.retiring_bytes(), kMiB) << "the shrunk one cannot grow back";
}

TEST_F(ExtentReserveTest, SmallLeaseIsAShrunkPrebuiltExtentWithNoBuild) {
  ReserveSettings s;  // the default ladder
  s.low_bytes = 0;
  s.high_bytes = 64 * kMiB;
  ExtentReserve r("node0", s, Base());
  ASSERT_EQ(r.small_targets(), std::vector<uint32_t>(9, 4));
  RefillInline(r);
  ASSERT_EQ(r.small_ready_counts(), std::vector<uint32_t>(9, 4));
  const uint64_t ready = r.ready_bytes();
  // 100 KiB and a byte: 26 pages, from a prebuilt 128 KiB extent.
  auto t = r.Take(100 * kKiB + 1);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_EQ(t->extents.size(), 1u);
  EXPECT_EQ(t->plan.build_bytes, 0u) << "nothing built on the request path";
  Extent& e = *t->extents[0];
  EXPECT_EQ(e.built_bytes(), 128 * kKiB);
  EXPECT_EQ(e.size_bytes(), 26 * 4096u);
  struct stat st {};
  ASSERT_EQ(::fstat(e.fd(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), 26 * 4096u) << "exactly sized";
  const int seals = ::fcntl(e.fd(), F_GET_SEALS);
  EXPECT_EQ(seals & (F_SEAL_GROW | F_SEAL_SEAL), F_SEAL_GROW | F_SEAL_SEAL);
  EXPECT_EQ(::ftruncate(e.fd(), 128 * kKiB), -1) << "cannot grow back to what was cut off";
  ExpectClientView(e.fd(), e.size_bytes(), 0);
  EXPECT_EQ(r.ready_bytes(), ready - 128 * kKiB);
  // Far above the low watermark (0), the class is topped up once it is down
  // to half its target (3 left: not yet; 2 left: two builds).
  EXPECT_TRUE(r.PlanRefill(UINT64_MAX).empty());
  auto t2 = r.Take(100 * kKiB);
  ASSERT_TRUE(t2.ok());
  auto plan = r.PlanRefill(UINT64_MAX);
  EXPECT_EQ(plan, (std::vector<uint64_t>{128 * kKiB, 128 * kKiB}));
  for (uint64_t g : plan) {
    auto built = Extent::Create(r.BuildSpec(g, true));
    ASSERT_TRUE(built.ok());
    r.Built(std::move(*built));
  }
  r.Return(std::move(t2->extents));  // shrunk, never exposed: still retired
  EXPECT_EQ(r.small_ready_counts()[5], 4u);
  EXPECT_EQ(r.retiring_bytes(), 100 * kKiB);
  // An exposed small extent is retired, never restocked.
  e.MarkExposed();
  r.Return(std::move(t->extents));
  EXPECT_EQ(r.retiring_bytes(), 100 * kKiB + 26 * 4096u);
  EXPECT_EQ(r.small_ready_counts()[5], 4u);
  // Eviction takes them last: every ladder extent (16 x 2 MiB, 32 MiB) first.
  EXPECT_EQ(r.Evict(ready - 8 * kMiB), 64 * kMiB);
  EXPECT_EQ(r.small_ready_counts()[5], 4u);
  r.DropAll();
  EXPECT_EQ(r.ready_bytes(), 0u);
}

TEST_F(ExtentReserveTest, AReserveOfNBytesHoldsALeaseOfNBytes) {
  ReserveSettings s;  // the default ladder
  s.low_bytes = 64 * kMiB;
  s.high_bytes = 64 * kMiB;
  ExtentReserve r("node0", s, Base());
  RefillInline(r);
  ASSERT_EQ(r.small_ready_counts(), std::vector<uint32_t>(9, 4));
  EXPECT_EQ(r.ready_bytes(), r.limit_bytes());
  EXPECT_GT(r.ready_bytes(), 64 * kMiB) << "the small extents are on top";
  EXPECT_TRUE(r.PlanRefill(UINT64_MAX).empty()) << "full";
  auto t = r.Take(64 * kMiB);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->plan.build_bytes, 0u) << "wholly from the reserve";
  EXPECT_EQ(t->plan.reserve_bytes, 64 * kMiB);
  EXPECT_EQ(r.ready_bytes(), r.small_target_bytes()) << "the small extents stay";
  // low == high: any grant of ladder extents starts a refill back to full.
  auto plan = r.PlanRefill(UINT64_MAX);
  uint64_t planned = 0;
  for (uint64_t g : plan) planned += g;
  EXPECT_EQ(planned, 64 * kMiB);
  for (uint64_t g : plan) {
    auto e = Extent::Create(r.BuildSpec(g, true));
    ASSERT_TRUE(e.ok());
    r.Built(std::move(*e));
  }
  EXPECT_EQ(r.ready_bytes(), r.limit_bytes());
  auto t2 = r.Take(2 * kMiB);
  ASSERT_TRUE(t2.ok());
  EXPECT_EQ(r.PlanRefill(UINT64_MAX), (std::vector<uint64_t>{2 * kMiB}));
  // An extent that never left the daemon goes back to stock only while the
  // reserve is below its limit: the refill above already took its place.
  r.Return(std::move(t2->extents));
  EXPECT_EQ(r.retiring_bytes(), 2 * kMiB);
  r.Return(std::move(t->extents));
  EXPECT_EQ(r.retiring_bytes(), 66 * kMiB);
}

TEST_F(ExtentReserveTest, EvictReconfigureAndFailures) {
  ExtentReserve r("node0", Small(0, 24 * kMiB), Base());
  RefillInline(r);
  ASSERT_EQ(r.ready_bytes(), 24 * kMiB);
  EXPECT_EQ(r.Evict(9 * kMiB), 16 * kMiB) << "largest first: two 8 MiB";
  EXPECT_EQ(r.ready_bytes(), 8 * kMiB);
  (void)r.TakeRetiring();
  r.Retired(16 * kMiB);
  r.Reconfigure(Small(0, 4 * kMiB));
  EXPECT_EQ(r.ready_bytes(), 4 * kMiB) << "trimmed to the new high watermark";
  EXPECT_EQ(r.retiring_bytes(), 4 * kMiB);
  // Three failed builds of a granule disable it.
  r.Reconfigure(Small(16 * kMiB, 16 * kMiB));
  for (int i = 0; i < 3; ++i) {
    for (uint64_t g : r.PlanRefill(UINT64_MAX)) r.BuildFailed(g);
  }
  EXPECT_TRUE(r.PlanRefill(UINT64_MAX).empty());
  r.Reconfigure(Small(16 * kMiB, 16 * kMiB));
  EXPECT_FALSE(r.PlanRefill(UINT64_MAX).empty()) << "a new setting re-arms it";
}

// ---- the refiller on real threads: priorities and no leak between tenants ----

struct Harness {
  explicit Harness(int stock_threads = 1) : stock(stock_threads) {}
  boost::asio::io_context loop;
  boost::asio::thread_pool stock;
  boost::asio::thread_pool retire{1};
  std::mutex mu;
  std::vector<bool> built_idle;  // was each build on a SCHED_IDLE, nice-19 thread?
  bool Run(const std::function<bool()>& done, int limit_ms = 20000) {
    auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(limit_ms);
    while (!done()) {
      if (std::chrono::steady_clock::now() > end) return false;
      loop.run_for(std::chrono::milliseconds(5));
      loop.restart();
    }
    return true;
  }
  ~Harness() {
    stock.join();
    retire.join();
  }
};

TEST_F(ExtentReserveTest, RecycledMemoryReadsZerosForTheNextTenant) {
  Harness h;
  ASSERT_TRUE(SetPoolPriority(h.stock, 1, 19, true).ok());
  ExtentReserve r("node0", Small(8 * kMiB, 16 * kMiB), Base());
  ReserveRefiller::Options o;
  o.loop = h.loop.get_executor();
  o.stock = h.stock.get_executor();
  o.retire = h.retire.get_executor();
  o.factory = [&h](const MemfdSpec& spec) {
    auto idle = ThreadIsIdle();
    auto nice = ThreadNice();
    {
      std::lock_guard<std::mutex> l(h.mu);
      h.built_idle.push_back(idle.ok() && *idle && nice.ok() && *nice == 19 &&
                             spec.yield_between_steps);
    }
    return Extent::Create(spec);
  };
  ReserveRefiller f(&r, o);
  f.Kick();
  // The builds run on a SCHED_IDLE thread, which runs only when a CPU is idle:
  // beside one CPU hog on 2 CPUs the fill takes 12 s instead of 0.1 s. The
  // bound is for a hang, not for speed.
  const int idle_limit_ms = 120000;
  ASSERT_TRUE(h.Run([&] { return r.ready_bytes() == 16 * kMiB && f.pending_builds() == 0; },
                    idle_limit_ms));

  // Tenant A: 11 MiB + 600 KiB (8 MiB + 2 MiB + a shrunk tail + ...).
  const uint64_t size = 11 * kMiB + 600 * kKiB;
  auto a = r.Take(size);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  std::set<uint64_t> a_inodes;
  std::vector<UniqueFd> a_fds;
  for (auto& e : a->extents) {
    e->MarkExposed();  // handed to tenant A
    a_inodes.insert(e->inode());
    a_fds.emplace_back(::fcntl(e->fd(), F_DUPFD_CLOEXEC, 0));
    void* p = ::mmap(nullptr, e->size_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, e->fd(), 0);
    ASSERT_NE(p, MAP_FAILED);
    std::memset(p, 0xA5, e->size_bytes());  // A's secrets
    ::munmap(p, e->size_bytes());
  }
  // Built on the request path: the pieces the reserve did not cover.
  for (const CutPiece& c : a->plan.pieces) {
    if (c.source == CutPiece::Source::kBuild) {
      EXPECT_LT(c.bytes, 512 * kKiB);
    }
  }
  r.Return(std::move(a->extents));  // A's lease ends
  f.Kick();
  ASSERT_TRUE(h.Run(
      [&] {
        return f.pending_retires() == 0 && f.pending_builds() == 0 && r.retiring_bytes() == 0 &&
               r.ready_bytes() == 16 * kMiB;
      },
      idle_limit_ms));
  for (const UniqueFd& fd : a_fds) {
    struct stat st {};
    ASSERT_EQ(::fstat(fd.get(), &st), 0);
    EXPECT_EQ(st.st_size, 0) << "A's extents are truncated, whoever still holds them";
  }

  // Tenant B takes the same size: fresh memfds only, every byte zero and on
  // node 0, also when read by another uid.
  auto b = r.Take(size);
  ASSERT_TRUE(b.ok());
  for (auto& e : b->extents) {
    EXPECT_EQ(a_inodes.count(e->inode()), 0u) << "a file that left the daemon came back";
    ExpectClientView(e->fd(), e->size_bytes(), 0);
  }
  if (::geteuid() == 0) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(3);
      for (auto& e : b->extents) {
        void* p = ::mmap(nullptr, e->size_bytes(), PROT_READ, MAP_SHARED, e->fd(), 0);
        if (p == MAP_FAILED) ::_exit(4);
        const auto* c = static_cast<const unsigned char*>(p);
        for (uint64_t i = 0; i < e->size_bytes(); ++i) {
          if (c[i] != 0) ::_exit(5);
        }
      }
      ::_exit(0);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "another uid saw bytes";
  }
  {
    std::lock_guard<std::mutex> l(h.mu);
    ASSERT_FALSE(h.built_idle.empty());
    for (bool ok : h.built_idle) EXPECT_TRUE(ok) << "a refill ran outside the stock threads";
  }
  f.Stop();
  ASSERT_TRUE(h.Run([&] { return f.pending_retires() == 0 && f.pending_builds() == 0; }));
  EXPECT_EQ(r.ready_bytes(), 0u);
  EXPECT_EQ(r.retiring_bytes(), 0u);
}

ReserveRefiller::Options RefillerOn(Harness& h, uint32_t stock_threads) {
  ReserveRefiller::Options o;
  o.loop = h.loop.get_executor();
  o.stock = h.stock.get_executor();
  o.stock_threads = stock_threads;
  o.retire = h.retire.get_executor();
  return o;
}

TEST_F(ExtentReserveTest, ALargeRefillIsPrefaultedByEveryStockThread) {
  Harness h(2);
  // One 8 MiB extent: four 2 MiB chunks (SharedFillChunk).
  ExtentReserve r("node0", Small(8 * kMiB, 8 * kMiB), Base());
  ReserveRefiller::Options o = RefillerOn(h, 2);
  std::mutex mu;
  uint64_t helped = 0;
  int offered = 0;
  o.factory = [&](const MemfdSpec& spec) {
    MemfdSpec s = spec;
    EXPECT_TRUE(s.yield_between_steps);
    if (!spec.offer_fill) return Extent::Create(s);
    s.offer_fill = [&, offer = spec.offer_fill](const std::shared_ptr<SharedFill>& fill) {
      offer(fill);
      // The owner waits until the other stock thread took a chunk, so the
      // test does not hang on which thread runs first.
      auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (fill->helped() == 0 && !fill->exhausted() && std::chrono::steady_clock::now() < end) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      std::lock_guard<std::mutex> l(mu);
      ++offered;
      helped += fill->helped();
    };
    return Extent::Create(s);
  };
  ReserveRefiller f(&r, o);
  f.Kick();
  ASSERT_TRUE(h.Run([&] { return r.ready_bytes() == 8 * kMiB && f.pending_builds() == 0; }));
  {
    std::lock_guard<std::mutex> l(mu);
    EXPECT_EQ(offered, 1) << "the 8 MiB refill shares its prefault";
    EXPECT_GE(helped, 1u) << "the other stock thread filled a chunk";
  }
  auto t = r.Take(8 * kMiB);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_EQ(t->extents.size(), 1u);
  const Extent& e = *t->extents[0];
  ExpectClientView(e.fd(), e.size_bytes(), 0);
  unsigned long mask = 0;
  int mode = -1;
  ASSERT_EQ(::get_mempolicy(&mode, &mask, 64, e.daemon_addr(), MPOL_F_ADDR), 0);
  EXPECT_EQ(mode, MPOL_BIND);
  EXPECT_EQ(mask, 1ul) << "bound to node 0 before any chunk was filled";
  r.Return(std::move(t->extents));
  f.Stop();
  ASSERT_TRUE(h.Run([&] { return f.pending_retires() == 0 && f.pending_builds() == 0; }));
}

TEST_F(ExtentReserveTest, OneStockThreadFillsItsRefillAlone) {
  Harness h(1);
  ExtentReserve r("node0", Small(8 * kMiB, 8 * kMiB), Base());
  ReserveRefiller::Options o = RefillerOn(h, 1);
  std::atomic<int> offers{0};
  o.factory = [&](const MemfdSpec& spec) {
    if (spec.offer_fill) ++offers;
    return Extent::Create(spec);
  };
  ReserveRefiller f(&r, o);
  f.Kick();
  ASSERT_TRUE(h.Run([&] { return r.ready_bytes() == 8 * kMiB && f.pending_builds() == 0; }));
  EXPECT_EQ(offers.load(), 0) << "no other stock thread to share with";
  f.Stop();
  ASSERT_TRUE(h.Run([&] { return f.pending_retires() == 0 && f.pending_builds() == 0; }));
}

}  // namespace
}  // namespace cxlpool
