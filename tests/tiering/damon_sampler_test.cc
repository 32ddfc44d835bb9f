// DamonSampler against a fake DAMON sysfs tree (fake_damon.h), which fails
// closed: nothing here reads or writes the real /sys or /proc.
#include "tiering/damon_sampler.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <set>

#include "cxlpool/common/strings.h"
#include "fake_damon.h"

namespace cxlpool::tiering {
namespace {

constexpr uint64_t kMiB = 1ull << 20;
using fakes::FakeDamon;
using fakes::kAdmin;
using fakes::kCtx;
using fakes::kKd;

class DamonSamplerTest : public ::testing::Test {
 protected:
  DamonSamplerTest() {
    fd = ::memfd_create("sampled", MFD_CLOEXEC);
    EXPECT_EQ(::ftruncate(fd, static_cast<off_t>(8 * kMiB)), 0);
  }
  ~DamonSamplerTest() override { ::close(fd); }
  SampleTarget Target(uint64_t lease, uint32_t unit, uint64_t offset, uint64_t length) {
    SampleTarget t;
    t.lease_id = lease;
    t.unit = unit;
    t.fd = fd;
    t.offset = offset;
    t.length = length;
    return t;
  }
  FakeDamon k;
  int fd = -1;
};

TEST_F(DamonSamplerTest, AKdamondThatIsNotOursIsLeftAlone) {
  ASSERT_TRUE(k.WriteAt(std::string(kAdmin) + "/kdamonds/nr_kdamonds", 0, "1").ok());
  k.writes.clear();
  DamonSampler s(&k, &k, &k);
  Status st = s.Open();
  EXPECT_EQ(st.code(), Code::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("in use by someone else"), std::string::npos) << st.ToString();
  EXPECT_TRUE(k.writes.empty()) << k.writes.front();
}

// A killed daemon: its sampler had kdamond 0 running when it died, and its
// owner record names `pid` (this process's record, rewritten).
class LeftKdamondTest : public DamonSamplerTest {
 protected:
  LeftKdamondTest() {
    owner = ::testing::TempDir() + "damon-owner-" + std::to_string(::getpid());
    opts.owner_file = owner;
  }
  ~LeftKdamondTest() override { ::unlink(owner.c_str()); }
  FakeDamon Crashed(const std::string& record) {
    FakeDamon left;
    {
      DamonSampler s(&k, &k, &k, opts);
      EXPECT_TRUE(s.Open().ok());
      (void)s.Sample({Target(1, 0, 0, 2 * kMiB)});
      EXPECT_TRUE(k.running) << s.last_error();
      std::ifstream in(owner);
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      EXPECT_NE(text.find("pid " + std::to_string(::getpid()) + "\n"), std::string::npos) << text;
      left = k;  // the state the kernel keeps when the process dies here
    }
    EXPECT_FALSE(std::ifstream(owner).good()) << "a clean close removes the record";
    std::ofstream(owner) << record;
    left.writes.clear();
    return left;
  }
  std::string owner;
  DamonOptions opts;
};

TEST_F(LeftKdamondTest, AKdamondAKilledDaemonLeftIsStoppedRemovedAndMadeAfresh) {
  FakeDamon left = Crashed("pid 999999\nstart 5\nboot \n");
  ASSERT_TRUE(left.running);
  DamonSampler s(&left, &left, &left, opts);
  Status st = s.Open();
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_NE(s.reclaimed().find("cxlpoold pid 999999 (gone)"), std::string::npos) << s.reclaimed();
  ASSERT_GE(left.writes.size(), 3u);
  EXPECT_EQ(left.writes[0], kKd + "/state=off");
  EXPECT_EQ(left.writes[1], std::string(kAdmin) + "/kdamonds/nr_kdamonds=0");
  EXPECT_EQ(left.writes[2], std::string(kAdmin) + "/kdamonds/nr_kdamonds=1");
  EXPECT_FALSE(left.running);
  // The record names this process now, and the kdamond samples again.
  std::ifstream in(owner);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("pid " + std::to_string(::getpid()) + "\n"), std::string::npos) << text;
  (void)s.Sample({Target(1, 0, 0, 2 * kMiB)});
  EXPECT_TRUE(left.running) << s.last_error();
  s.Close();
  EXPECT_EQ(left.File(std::string(kAdmin) + "/kdamonds/nr_kdamonds"), "0");
  EXPECT_FALSE(std::ifstream(owner).good());
}

TEST_F(LeftKdamondTest, ALiveOwnerAnotherBootAnotherSetupOrAGarbledRecordIsLeftAlone) {
  struct Case {
    const char* name;
    std::string record;
    std::function<void(FakeDamon*)> tweak;
    const char* says;
  };
  const std::string stat = "4242 (cxlpoold) S 1 4242 4242 0 -1 0 0 0 0 0 0 0 0 0 20 0 3 0 77 0";
  const std::vector<Case> cases = {
      {"live owner", "pid 4242\nstart 77\nboot \n",
       [&](FakeDamon* f) { f->Put("/proc/4242/stat", stat); }, "pid 4242, which still runs"},
      {"another boot", "pid 999999\nstart 5\nboot aaaa\n",
       [](FakeDamon* f) { f->Put("/proc/sys/kernel/random/boot_id", "bbbb"); }, "another boot"},
      {"another setup", "pid 999999\nstart 5\nboot \n",
       [](FakeDamon* f) { f->Put(kCtx + "/schemes/0/action", "pageout"); },
       "not set up as cxlpoold sets it up"},
      {"garbled", "pid x\n", [](FakeDamon*) {}, "garbled"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    FakeDamon left = Crashed(c.record);
    c.tweak(&left);
    DamonSampler s(&left, &left, &left, opts);
    Status st = s.Open();
    EXPECT_EQ(st.code(), Code::kUnavailable) << st.ToString();
    EXPECT_NE(st.message().find("in use by someone else"), std::string::npos) << st.ToString();
    EXPECT_NE(st.message().find(c.says), std::string::npos) << st.ToString();
    EXPECT_TRUE(left.writes.empty()) << left.writes.front();
    EXPECT_TRUE(left.running);
    EXPECT_TRUE(s.reclaimed().empty());
  }
}

TEST_F(LeftKdamondTest, WithoutARecordALeftKdamondIsSomeoneElses) {
  FakeDamon left = Crashed("");
  ::unlink(owner.c_str());
  DamonSampler s(&left, &left, &left, opts);
  Status st = s.Open();
  EXPECT_EQ(st.code(), Code::kUnavailable) << st.ToString();
  EXPECT_EQ(st.message().find("owner record"), std::string::npos) << st.ToString();
  EXPECT_TRUE(left.writes.empty());
}

TEST_F(DamonSamplerTest, NoSysfsOrNoPaddrIsUnsupportedAndWhatWasMadeIsRemoved) {
  {
    FakeDamon bare;
    bare.RemoveSysfs();
    DamonSampler s(&bare, &bare, &bare);
    Status st = s.Open();
    EXPECT_EQ(st.code(), Code::kUnsupported) << st.ToString();
    EXPECT_NE(st.message().find("CONFIG_DAMON_SYSFS"), std::string::npos);
  }
  k.avail_operations = "vaddr fvaddr";
  {
    DamonSampler s(&k, &k, &k);
    Status st = s.Open();
    EXPECT_EQ(st.code(), Code::kUnsupported) << st.ToString();
    EXPECT_NE(st.message().find("paddr"), std::string::npos);
    EXPECT_FALSE(s.opened());
  }
  EXPECT_EQ(k.File(std::string(kAdmin) + "/kdamonds/nr_kdamonds"), "0");
}

TEST_F(DamonSamplerTest, AFailedWriteIsReturnedAndTheKdamondRemoved) {
  k.deny.insert(kCtx + "/schemes/0/action");
  DamonSampler s(&k, &k, &k);
  Status st = s.Open();
  EXPECT_EQ(st.code(), Code::kPermissionDenied) << st.ToString();
  EXPECT_EQ(k.File(std::string(kAdmin) + "/kdamonds/nr_kdamonds"), "0");
}

TEST_F(DamonSamplerTest, FirstRoundArmsThenTheTouchedUnitIsHotAndTheOtherCold) {
  DamonSampler s(&k, &k, &k);
  ASSERT_TRUE(s.Open().ok());
  EXPECT_EQ(k.File(kCtx + "/operations"), "paddr");
  EXPECT_EQ(k.File(kCtx + "/schemes/0/action"), "stat");
  const std::vector<SampleTarget> t = {Target(7, 0, 0, 4 * kMiB), Target(7, 1, 4 * kMiB, 4 * kMiB)};
  auto r = s.Sample(t);
  ASSERT_EQ(r.size(), 2u) << s.last_error();
  EXPECT_EQ(r[0].sampled + r[1].sampled, 0u);  // armed only
  EXPECT_TRUE(k.running);
  ASSERT_FALSE(k.monitored.empty());
  ASSERT_EQ(k.pagemap_reads.size(), 2u);
  // A holder (any process: paddr sees frames) touches unit 0's pages.
  k.touched.push_back(k.FramesOfRead(0));
  r = s.Sample(t);
  ASSERT_EQ(r.size(), 2u) << s.last_error();
  EXPECT_EQ(r[0].sampled, 1024u);
  EXPECT_EQ(r[0].accessed, 1024u);
  EXPECT_EQ(r[1].sampled, 1024u);
  EXPECT_EQ(r[1].accessed, 0u);
  EXPECT_TRUE(s.last_error().empty()) << s.last_error();
  // Nothing touched since: both cold, and nothing was committed again.
  size_t writes = k.writes.size();
  r = s.Sample(t);
  EXPECT_EQ(r[0].accessed + r[1].accessed, 0u);
  EXPECT_EQ(r[0].sampled, 1024u);
  for (size_t i = writes; i < k.writes.size(); ++i) {
    EXPECT_EQ(k.writes[i], kKd + "/state=update_schemes_tried_regions");
  }
}

TEST_F(DamonSamplerTest, MovedFramesAreArmedAgainAndCommitted) {
  DamonSampler s(&k, &k, &k);
  ASSERT_TRUE(s.Open().ok());
  const std::vector<SampleTarget> t = {Target(1, 0, 0, 2 * kMiB)};
  (void)s.Sample(t);
  auto before = k.monitored;
  k.shift += 1 << 20;  // the pages moved (a migration): other frames
  auto r = s.Sample(t);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].sampled, 0u);
  EXPECT_NE(k.monitored, before);
  EXPECT_NE(std::find(k.writes.begin(), k.writes.end(), kKd + "/state=commit"), k.writes.end());
  r = s.Sample(t);
  EXPECT_EQ(r[0].sampled, 512u);
}

TEST_F(DamonSamplerTest, ForgottenLeasesLeaveAndTheKdamondGoesAwayWithTheSampler) {
  {
    DamonSampler s(&k, &k, &k);
    ASSERT_TRUE(s.Open().ok());
    (void)s.Sample({Target(1, 0, 0, 2 * kMiB), Target(2, 0, 2 * kMiB, 2 * kMiB)});
    EXPECT_TRUE(k.running);
    s.Forget(1);
    auto r = s.Sample({Target(2, 0, 2 * kMiB, 2 * kMiB)});
    ASSERT_EQ(r.size(), 1u);
    EXPECT_EQ(r[0].lease_id, 2u);
    (void)s.Sample({});  // nothing left to watch: the kdamond goes
    EXPECT_FALSE(k.running);
    EXPECT_EQ(s.regions(), 0u);
    EXPECT_EQ(k.File(std::string(kAdmin) + "/kdamonds/nr_kdamonds"), "0");
    (void)s.Sample({Target(2, 0, 2 * kMiB, 2 * kMiB)});  // and comes back
    EXPECT_TRUE(k.running) << s.last_error();
    EXPECT_EQ(k.File(kCtx + "/operations"), "paddr");
  }
  EXPECT_FALSE(k.running);
  EXPECT_EQ(k.File(std::string(kAdmin) + "/kdamonds/nr_kdamonds"), "0");
}

TEST_F(DamonSamplerTest, ScatteredFramesAreCappedAtMaxRegions) {
  k.scatter = true;  // no two pages on neighbouring frames
  DamonOptions o;
  o.max_regions = 8;
  DamonSampler s(&k, &k, &k, o);
  ASSERT_TRUE(s.Open().ok());
  (void)s.Sample({Target(1, 0, 0, 4 * kMiB)});
  EXPECT_TRUE(k.running) << s.last_error();
  EXPECT_LE(k.monitored.size(), 8u);
  EXPECT_EQ(s.regions(), k.monitored.size());
}

TEST_F(DamonSamplerTest, HiddenFrameNumbersAreAnErrorNotASample) {
  k.hide_pfns = true;
  DamonSampler s(&k, &k, &k);
  ASSERT_TRUE(s.Open().ok());
  auto r = s.Sample({Target(1, 0, 0, 2 * kMiB)});
  EXPECT_TRUE(r.empty());
  EXPECT_NE(s.last_error().find("CAP_SYS_ADMIN"), std::string::npos) << s.last_error();
  EXPECT_FALSE(k.running);
}

TEST_F(DamonSamplerTest, ChooseSamplerSaysWhichAndWhy) {
  KernelAccess none;
  none.why =
      "no idle page tracking in this kernel; temperatures come from the holders' signals only";
  {
    KernelAccess a = none;
    EXPECT_EQ(ChooseSampler("off", &a, &k, &k, &k), nullptr);
    EXPECT_NE(a.why.find("\"off\""), std::string::npos);
  }
  {
    KernelAccess a = none;  // no DAMON sysfs detected
    EXPECT_EQ(ChooseSampler("auto", &a, &k, &k, &k), nullptr);
    EXPECT_NE(a.why.find("DAMON not driven: no DAMON sysfs"), std::string::npos) << a.why;
  }
  {
    KernelAccess a = none;
    a.damon_sysfs = true;  // but frame numbers hidden
    EXPECT_EQ(ChooseSampler("auto", &a, &k, &k, &k), nullptr);
    EXPECT_NE(a.why.find("CAP_SYS_ADMIN"), std::string::npos) << a.why;
  }
  {
    KernelAccess a = none;
    a.damon_sysfs = true;
    a.pagemap_pfns = true;
    auto s = ChooseSampler("auto", &a, &k, &k, &k);
    ASSERT_NE(s, nullptr) << a.why;
    EXPECT_STREQ(s->name(), "damon");
    EXPECT_EQ(a.sampler, "damon");
    EXPECT_NE(a.ToString().find("; driven by cxlpoold"), std::string::npos) << a.ToString();
    EXPECT_NE(a.ToString().find("operations vaddr,fvaddr,paddr"), std::string::npos)
        << a.ToString();
    // Idle, it holds no kdamond; with a lease to sample, it does.
    EXPECT_EQ(k.File(std::string(kAdmin) + "/kdamonds/nr_kdamonds"), "0");
    (void)s->Sample({Target(1, 0, 0, 2 * kMiB)});
    EXPECT_TRUE(k.running);
    // A second daemon then finds the kdamond in use and says so.
    KernelAccess b = none;
    b.damon_sysfs = true;
    b.pagemap_pfns = true;
    EXPECT_EQ(ChooseSampler("damon", &b, &k, &k, &k), nullptr);
    EXPECT_NE(b.why.find("in use by someone else"), std::string::npos) << b.why;
  }
}

}  // namespace
}  // namespace cxlpool::tiering
