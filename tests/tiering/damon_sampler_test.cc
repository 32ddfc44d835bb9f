// DamonSampler against a fake DAMON sysfs tree (FakeDamon): the directories
// appear as the kernel makes them when nr_* files are written, "on" checks
// the regions as the kernel does, "update_schemes_tried_regions" fills
// tried_regions from the committed regions (split where the accesses
// change, as DAMON's adaptive regions would be) with nr_accesses from what a
// fake holder touched. Frame numbers come from a fake pagemap. Everything fails closed:
// a path the fake did not make is NOT_FOUND, for reads and for writes, and
// nothing here reads or writes the real /sys or /proc.
#include "tiering/damon_sampler.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "cxlpool/common/strings.h"

namespace cxlpool::tiering {
namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr char kAdmin[] = "/sys/kernel/mm/damon/admin";
const std::string kKd = std::string(kAdmin) + "/kdamonds/0";
const std::string kCtx = kKd + "/contexts/0";

std::string Le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

class FakeDamon final : public FileSystem, public KernelFileWriter {
 public:
  FakeDamon() {
    dirs_ = {"/sys/kernel/mm/damon", kAdmin, std::string(kAdmin) + "/kdamonds"};
    files_[std::string(kAdmin) + "/kdamonds/nr_kdamonds"] = "0";
  }

  // ---- FileSystem
  Result<std::string> ReadFile(std::string_view path) const override {
    std::string p(path);
    if (p == "/proc/self/pagemap") return Status(Code::kInvalidArgument, "binary");
    auto it = files_.find(p);
    if (it == files_.end()) return Status(Code::kNotFound, "fake: no " + p);
    return it->second + "\n";
  }
  Result<std::string> ReadAt(std::string_view path, uint64_t offset, size_t len) const override {
    if (path != "/proc/self/pagemap")
      return Status(Code::kNotFound, "fake: no " + std::string(path));
    if (offset % 8 != 0 || len % 8 != 0) return Status(Code::kInvalidArgument, "unaligned");
    pagemap_reads.push_back({offset / 8, len / 8});
    std::string out;
    for (uint64_t i = 0; i < len / 8; ++i) {
      uint64_t vpn = offset / 8 + i;
      uint64_t pfn = hide_pfns ? 0 : scatter ? (vpn * 3 + shift) : (vpn + shift);
      out += Le64((uint64_t{1} << 63) | (pfn & ((uint64_t{1} << 50) - 1)));
    }
    return out;
  }
  Result<std::vector<std::string>> ListDir(std::string_view path) const override {
    std::string p(path);
    if (!dirs_.count(p)) return Status(Code::kNotFound, "fake: no dir " + p);
    std::set<std::string> names;
    for (const auto& [f, v] : files_) {
      if (f.rfind(p + "/", 0) == 0)
        names.insert(f.substr(p.size() + 1, f.find('/', p.size() + 1) - p.size() - 1));
    }
    for (const auto& d : dirs_) {
      if (d.rfind(p + "/", 0) == 0)
        names.insert(d.substr(p.size() + 1, d.find('/', p.size() + 1) - p.size() - 1));
    }
    return std::vector<std::string>(names.begin(), names.end());
  }
  Result<std::string> ReadLink(std::string_view) const override {
    return Status(Code::kInvalidArgument, "fake: no links");
  }
  bool Exists(std::string_view path) const override {
    return files_.count(std::string(path)) || dirs_.count(std::string(path));
  }
  bool IsDir(std::string_view path) const override { return dirs_.count(std::string(path)) != 0; }
  const std::string& root() const override { return root_; }

  // ---- KernelFileWriter
  Status WriteAt(const std::string& path, uint64_t offset, const std::string& data) override {
    writes.push_back(path + "=" + data);
    if (offset != 0) return Status(Code::kInvalidArgument, "offset");
    if (!files_.count(path)) return Status(Code::kNotFound, "fake: no " + path);
    if (deny.count(path)) return Status(Code::kPermissionDenied, "open " + path + ": EACCES");
    const std::string dir = path.substr(0, path.rfind('/'));
    const std::string name = path.substr(path.rfind('/') + 1);
    if (name == "nr_kdamonds") {
      if (running) return Status(Code::kIo, "EBUSY");
      RemoveUnder(dir + "/0");
      if (data == "1") {
        Dir(kKd);
        Dir(kKd + "/contexts");
        files_[kKd + "/state"] = "off";
        files_[kKd + "/contexts/nr_contexts"] = "0";
      }
    } else if (name == "nr_contexts" && data == "1") {
      Dir(kCtx);
      files_[kCtx + "/avail_operations"] = avail_operations;
      files_[kCtx + "/operations"] = "vaddr";
      for (const char* f : {"intervals/sample_us", "intervals/aggr_us", "intervals/update_us",
                            "nr_regions/min", "nr_regions/max"}) {
        files_[kCtx + "/monitoring_attrs/" + f] = "0";
      }
      Dir(kCtx + "/monitoring_attrs");
      Dir(kCtx + "/monitoring_attrs/intervals");
      Dir(kCtx + "/monitoring_attrs/nr_regions");
      Dir(kCtx + "/targets");
      Dir(kCtx + "/schemes");
      files_[kCtx + "/targets/nr_targets"] = "0";
      files_[kCtx + "/schemes/nr_schemes"] = "0";
    } else if (name == "nr_targets" && data == "1") {
      Dir(kCtx + "/targets/0");
      Dir(kCtx + "/targets/0/regions");
      files_[kCtx + "/targets/0/regions/nr_regions"] = "0";
    } else if (name == "nr_regions" && dir == kCtx + "/targets/0/regions") {
      RemoveUnder(dir + "/");
      Dir(dir);
      for (uint64_t i = 0; i < ParseU64(data).value_or(0); ++i) {
        Dir(dir + "/" + std::to_string(i));
        files_[dir + "/" + std::to_string(i) + "/start"] = "0";
        files_[dir + "/" + std::to_string(i) + "/end"] = "0";
      }
    } else if (name == "nr_schemes" && data == "1") {
      const std::string s = kCtx + "/schemes/0";
      Dir(s);
      Dir(s + "/tried_regions");
      files_[s + "/action"] = "stat";
      for (const char* k : {"sz", "nr_accesses", "age"}) {
        files_[s + "/access_pattern/" + k + "/min"] = "0";
        files_[s + "/access_pattern/" + k + "/max"] = "0";
      }
    } else if (name == "state") {
      return State(data);
    }
    files_[path] = data;
    return Status::Ok();
  }

  // The regions the kdamond monitors (as last turned on / committed).
  std::vector<std::pair<uint64_t, uint64_t>> monitored;
  // Physical byte ranges a holder touched since the last report.
  std::vector<std::pair<uint64_t, uint64_t>> touched;
  std::string avail_operations = "vaddr fvaddr paddr";
  std::set<std::string> deny;
  mutable std::vector<std::pair<uint64_t, uint64_t>> pagemap_reads;  // vpn, pages
  std::vector<std::string> writes;
  uint64_t shift = 100000;
  bool scatter = false;
  bool hide_pfns = false;
  bool running = false;

  void RemoveSysfs() {
    dirs_.clear();
    files_.clear();
  }
  std::string File(const std::string& p) const {
    auto it = files_.find(p);
    return it == files_.end() ? "<none>" : it->second;
  }
  // The physical range the k-th pagemap read covered (one read per unit).
  std::pair<uint64_t, uint64_t> FramesOfRead(size_t k) const {
    auto [vpn, n] = pagemap_reads.at(k);
    return {(vpn + shift) * 4096, (vpn + n + shift) * 4096};
  }

 private:
  void Dir(const std::string& d) { dirs_.insert(d); }
  void RemoveUnder(const std::string& prefix) {
    for (auto it = files_.begin(); it != files_.end();) {
      it = it->first.rfind(prefix, 0) == 0 ? files_.erase(it) : std::next(it);
    }
    for (auto it = dirs_.begin(); it != dirs_.end();) {
      it = it->rfind(prefix, 0) == 0 ? dirs_.erase(it) : std::next(it);
    }
  }
  Status State(const std::string& v) {
    if (v == "on" || v == "commit") {
      if ((v == "on") == running) return Status(Code::kInvalidArgument, "EINVAL: state");
      if (File(kCtx + "/operations") != "paddr") return Status(Code::kInvalidArgument, "ops");
      std::vector<std::pair<uint64_t, uint64_t>> regs;
      const std::string base = kCtx + "/targets/0/regions";
      uint64_t n = ParseU64(File(base + "/nr_regions")).value_or(0);
      for (uint64_t i = 0; i < n; ++i) {
        uint64_t s = ParseU64(File(base + "/" + std::to_string(i) + "/start")).value_or(0);
        uint64_t e = ParseU64(File(base + "/" + std::to_string(i) + "/end")).value_or(0);
        if (s >= e || (!regs.empty() && s < regs.back().second)) {
          return Status(Code::kInvalidArgument, "EINVAL: regions not sorted or empty");
        }
        regs.push_back({s, e});
      }
      monitored = regs;
      running = true;
      files_[kKd + "/state"] = "on";
      return Status::Ok();
    }
    if (v == "off") {
      running = false;
      monitored.clear();
      files_[kKd + "/state"] = "off";
      return Status::Ok();
    }
    if (v == "update_schemes_tried_regions") {
      if (!running) return Status(Code::kInvalidArgument, "EINVAL: not running");
      const std::string tr = kCtx + "/schemes/0/tried_regions";
      RemoveUnder(tr + "/");
      Dir(tr);
      files_[tr + "/total_bytes"] = "0";
      int k = 0;
      for (auto [s, e] : monitored) {
        // Split where the accesses change, as DAMON's adaptive regions do.
        std::set<uint64_t> cuts = {s, e};
        for (auto [ts, te] : touched) {
          if (ts > s && ts < e) cuts.insert(ts);
          if (te > s && te < e) cuts.insert(te);
        }
        for (auto c = cuts.begin(); std::next(c) != cuts.end(); ++c) {
          uint64_t a = *c, b = *std::next(c);
          bool hit = false;
          for (auto [ts, te] : touched) hit = hit || (ts < b && a < te);
          const std::string d = tr + "/" + std::to_string(k++);
          Dir(d);
          files_[d + "/start"] = std::to_string(a);
          files_[d + "/end"] = std::to_string(b);
          files_[d + "/nr_accesses"] = hit ? "18" : "0";
          files_[d + "/age"] = "3";
        }
      }
      touched.clear();
      return Status::Ok();
    }
    return Status(Code::kInvalidArgument, "EINVAL: state " + v);
  }

  std::map<std::string, std::string> files_;
  std::set<std::string> dirs_;
  std::string root_ = "<fake-damon>";
};

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
    (void)s.Sample({});  // nothing left to watch: the kdamond stops
    EXPECT_FALSE(k.running);
    EXPECT_EQ(s.regions(), 0u);
    (void)s.Sample({Target(2, 0, 2 * kMiB, 2 * kMiB)});
    EXPECT_TRUE(k.running);
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
    // A second daemon finds the kdamond in use and says so.
    KernelAccess b = none;
    b.damon_sysfs = true;
    b.pagemap_pfns = true;
    EXPECT_EQ(ChooseSampler("damon", &b, &k, &k, &k), nullptr);
    EXPECT_NE(b.why.find("in use by someone else"), std::string::npos) << b.why;
  }
}

}  // namespace
}  // namespace cxlpool::tiering
