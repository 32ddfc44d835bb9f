// DamonSampler on this machine's kernel: a holder process touches one range
// of a memfd over and over and leaves another alone; with no client signal
// at all, DAMON (paddr, a kdamond the sampler creates) shows the first hot
// and the second cold. Runs only where DAMON's sysfs has paddr, no kdamond
// exists yet (one that does is someone else's and is left alone), and
// /proc/self/pagemap shows frame numbers (root); exits 77 otherwise, saying
// which.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "tiering/damon_sampler.h"

namespace cxlpool::tiering {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

[[noreturn]] void Skip(const std::string& why) {
  std::fprintf(stderr, "skipped: %s\n", why.c_str());
  std::exit(77);
}

TEST(DamonLiveTest, AHolderTouchingARangeMakesItHotWithNoClientSignal) {
  auto fs = MakeRootedFileSystem("/");
  KernelAccess access = DetectKernelAccess(*fs, *fs);
  if (!access.damon_sysfs) Skip("no DAMON sysfs interface in this kernel");
  if (!access.pagemap_pfns) Skip("pagemap hides frame numbers (needs CAP_SYS_ADMIN)");
  auto writer = MakeKernelFileWriter();
  DamonOptions o;
  o.sample_us = 5000;
  o.aggr_us = 100000;
  DamonSampler s(fs.get(), fs.get(), writer.get(), o);
  if (Status st = s.Open(); !st.ok()) Skip("DAMON cannot be driven here: " + st.ToString());

  int fd = ::memfd_create("damon-live", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(16 * kMiB)), 0);
  void* p = ::mmap(nullptr, 16 * kMiB, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_NE(p, MAP_FAILED);
  std::memset(p, 1, 16 * kMiB);
  pid_t holder = ::fork();
  ASSERT_GE(holder, 0);
  if (holder == 0) {  // touches the first 8 MiB, never the second
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    auto* c = static_cast<volatile char*>(p);
    for (;;) {
      for (uint64_t i = 0; i < 8 * kMiB; i += 4096) c[i] = static_cast<char>(c[i] + 1);
    }
  }
  ::munmap(p, 16 * kMiB);
  SampleTarget hot{1, 0, fd, 0, 8 * kMiB, 4096}, cold{1, 1, fd, 8 * kMiB, 8 * kMiB, 4096};
  auto r = s.Sample({hot, cold});
  EXPECT_TRUE(s.last_error().empty()) << s.last_error();
  // Up to 20 s: under TCG on a busy machine a kdamond has been seen to
  // report nothing for the first 5 s; a working one is done in a round or two.
  double hot_share = 0, cold_share = 1;
  uint64_t sampled = 0;
  int rounds = 0;
  for (; rounds < 40; ++rounds) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    r = s.Sample({hot, cold});
    ASSERT_EQ(r.size(), 2u) << s.last_error();
    hot_share = r[0].AccessedShare();
    cold_share = r[1].AccessedShare();
    sampled = r[0].sampled;
    if (r[0].sampled > 0 && hot_share > 0.5 && cold_share < 0.2) break;
  }
  ::kill(holder, SIGKILL);
  ::waitpid(holder, nullptr, 0);
  ::close(fd);
  EXPECT_GT(hot_share, 0.5) << "DAMON did not see the holder's accesses (" << rounds
                            << " rounds of 0.5 s, " << sampled << " samples of the hot range)";
  EXPECT_LT(cold_share, 0.2) << "DAMON saw accesses nobody made";
}

}  // namespace
}  // namespace cxlpool::tiering
