// Kernel access sampling through the FileSystem seam: what is detected on
// trees with and without DAMON and idle page tracking, and the idle-page
// sampler against a fake kernel (a pagemap that gives frame numbers for the
// sampler's own mapping, a page_idle bitmap whose bits the fake "holder"
// clears by touching pages). Fakes fail closed: anything not configured is
// NOT_FOUND, never a read of the real /proc or /sys.
#include "tiering/sampler.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <functional>
#include <map>
#include <set>

namespace cxlpool::tiering {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

std::string Le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}
uint64_t FromLe64(const std::string& s) {
  uint64_t v = 0;
  for (size_t i = 0; i < 8; ++i)
    v |= static_cast<uint64_t>(static_cast<unsigned char>(s[i])) << (8 * i);
  return v;
}

// A file system whose binary files answer through functions.
class FakeKernel final : public FileSystem {
 public:
  using ReadAtFn = std::function<Result<std::string>(uint64_t offset, size_t len)>;
  Result<std::string> ReadFile(std::string_view path) const override {
    auto it = files.find(std::string(path));
    if (it == files.end()) return Status(Code::kNotFound, "fake: no " + std::string(path));
    return it->second;
  }
  Result<std::string> ReadAt(std::string_view path, uint64_t offset, size_t len) const override {
    auto it = binary.find(std::string(path));
    if (it == binary.end()) return Status(Code::kNotFound, "fake: no " + std::string(path));
    return it->second(offset, len);
  }
  Result<std::vector<std::string>> ListDir(std::string_view) const override {
    return Status(Code::kNotFound, "fake: no dirs");
  }
  Result<std::string> ReadLink(std::string_view) const override {
    return Status(Code::kInvalidArgument, "fake: no links");
  }
  bool Exists(std::string_view path) const override {
    return files.count(std::string(path)) || binary.count(std::string(path)) ||
           dirs.count(std::string(path));
  }
  bool IsDir(std::string_view path) const override { return dirs.count(std::string(path)) != 0; }
  const std::string& root() const override { return root_; }

  std::map<std::string, std::string> files;
  std::map<std::string, ReadAtFn> binary;
  std::set<std::string> dirs;

 private:
  std::string root_ = "<fake-kernel>";
};

// The idle bitmap: bit set = idle. Writes set bits (as the kernel does).
struct FakeBitmap final : public KernelFileWriter {
  Status WriteAt(const std::string& path, uint64_t offset, const std::string& data) override {
    if (path != "/sys/kernel/mm/page_idle/bitmap") return Status(Code::kNotFound, path);
    if (fail) return Status(Code::kPermissionDenied, "open " + path + ": EACCES");
    if (offset % 8 != 0 || data.size() != 8) return Status(Code::kInvalidArgument, "unaligned");
    words[offset / 8] |= FromLe64(data);
    ++writes;
    return Status::Ok();
  }
  Result<std::string> Read(uint64_t offset, size_t len) const {
    if (offset % 8 != 0 || len != 8) return Status(Code::kInvalidArgument, "unaligned");
    auto it = words.find(offset / 8);
    return Le64(it == words.end() ? 0 : it->second);
  }
  // A holder touches the page of frame `pfn`: its idle bit clears.
  void Touch(uint64_t pfn) { words[pfn / 64] &= ~(uint64_t{1} << (pfn % 64)); }
  std::map<uint64_t, uint64_t> words;
  int writes = 0;
  bool fail = false;
};

TEST(KernelAccessTest, DamonIsReportedAndNotDrivenIdlePagesNeedFrameNumbers) {
  FakeKernel sys, proc;
  sys.dirs.insert("/sys/kernel/mm/damon/admin");
  sys.files["/sys/kernel/mm/damon/admin/kdamonds/nr_kdamonds"] = "1\n";
  sys.files["/sys/kernel/mm/damon/admin/kdamonds/0/state"] = "on\n";
  sys.files["/sys/kernel/mm/damon/admin/kdamonds/0/contexts/0/avail_operations"] = "paddr\n";
  KernelAccess k = DetectKernelAccess(sys, proc, nullptr);
  EXPECT_TRUE(k.damon_sysfs);
  EXPECT_EQ(k.damon_kdamonds, 1u);
  EXPECT_EQ(k.damon_running, 1u);
  EXPECT_EQ(k.damon_operations, std::vector<std::string>{"paddr"});
  EXPECT_FALSE(k.page_idle);
  EXPECT_EQ(k.sampler, "none");
  std::string line = k.ToString();
  EXPECT_NE(line.find("DAMON: sysfs present, operations paddr, 1 kdamond(s), 1 running"),
            std::string::npos)
      << line;
  EXPECT_NE(line.find("idle page tracking: absent"), std::string::npos) << line;
  EXPECT_NE(line.find("pagemap PFNs hidden (needs CAP_SYS_ADMIN: cxlpoold-sampling.conf)"),
            std::string::npos)
      << line;
  EXPECT_NE(line.find("signals only"), std::string::npos) << line;

  // Idle page tracking present, but pagemap hides frame numbers (no CAP_SYS_ADMIN).
  FakeBitmap bitmap;
  sys.binary["/sys/kernel/mm/page_idle/bitmap"] = [&](uint64_t o, size_t n) {
    return bitmap.Read(o, n);
  };
  proc.binary["/proc/self/pagemap"] = [](uint64_t, size_t) {
    return Result<std::string>(Le64(uint64_t{1} << 63));  // present, PFN 0
  };
  int probe = 0;
  k = DetectKernelAccess(sys, proc, &probe);
  EXPECT_TRUE(k.page_idle && k.page_idle_readable);
  EXPECT_FALSE(k.pagemap_pfns);
  EXPECT_EQ(k.sampler, "none");
  EXPECT_NE(k.why.find("CAP_SYS_ADMIN"), std::string::npos) << k.why;
  // With frame numbers: the idle-page sampler.
  proc.binary["/proc/self/pagemap"] = [](uint64_t, size_t) {
    return Result<std::string>(Le64((uint64_t{1} << 63) | 12345));
  };
  k = DetectKernelAccess(sys, proc, &probe);
  EXPECT_TRUE(k.pagemap_pfns);
  EXPECT_EQ(k.sampler, "idle_page");
  // Nothing at all.
  FakeKernel empty;
  k = DetectKernelAccess(empty, empty, &probe);
  EXPECT_FALSE(k.damon_sysfs || k.page_idle || k.pagemap_pfns);
  EXPECT_NE(k.ToString().find("DAMON: absent"), std::string::npos);
}

TEST(KernelAccessTest, ThisMachineIsDescribedWithoutTouchingAnything) {
  auto fs = MakeRootedFileSystem("/");
  KernelAccess k = DetectKernelAccess(*fs, *fs);
  // Whatever the kernel has, the line names both interfaces.
  std::string line = k.ToString();
  EXPECT_NE(line.find("DAMON"), std::string::npos);
  EXPECT_NE(line.find("idle page tracking"), std::string::npos);
  std::printf("%s\n", line.c_str());
}

class IdlePageSamplerTest : public ::testing::Test {
 protected:
  IdlePageSamplerTest() {
    // Frame numbers for every page this process maps: derived from the
    // virtual page number, so the sampler's own mapping gets stable frames.
    proc.binary["/proc/self/pagemap"] = [this](uint64_t offset, size_t len) -> Result<std::string> {
      if (len != 8 || offset % 8 != 0) return Status(Code::kInvalidArgument, "unaligned");
      uint64_t vpn = offset / 8;
      ++pagemap_reads;
      return Le64((uint64_t{1} << 63) | ((vpn + shift) & ((uint64_t{1} << 40) - 1)));
    };
    sys.binary["/sys/kernel/mm/page_idle/bitmap"] = [this](uint64_t o, size_t n) {
      return bitmap.Read(o, n);
    };
    fd = ::memfd_create("sampled", MFD_CLOEXEC);
    EXPECT_EQ(::ftruncate(fd, static_cast<off_t>(4 * kMiB)), 0);
  }
  ~IdlePageSamplerTest() override { ::close(fd); }
  // Frames the sampler saw for its targets are known only through the
  // bitmap writes: touch every frame that was armed (all bits that are set).
  void TouchAll() {
    for (auto& [w, bits] : bitmap.words) bits = 0;
  }
  void TouchSome(int every) {
    int i = 0;
    for (auto& [w, bits] : bitmap.words) {
      for (int b = 0; b < 64; ++b) {
        if (((bits >> b) & 1) && (i++ % every) == 0) bits &= ~(uint64_t{1} << b);
      }
    }
  }
  SampleTarget Target(uint64_t lease = 1) {
    SampleTarget t;
    t.lease_id = lease;
    t.fd = fd;
    t.length = 4 * kMiB;
    return t;
  }

  FakeKernel sys, proc;
  FakeBitmap bitmap;
  uint64_t shift = 1000;
  int pagemap_reads = 0;
  int fd = -1;
};

TEST_F(IdlePageSamplerTest, FirstRoundArmsThenReportsTheShareTouched) {
  IdlePageSampler s(&sys, &proc, &bitmap, 64);
  auto r = s.Sample({Target()});
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].sampled, 0u);  // armed only
  EXPECT_GT(bitmap.writes, 0);
  // Nobody touched anything: every sampled page is still idle.
  r = s.Sample({Target()});
  EXPECT_EQ(r[0].sampled, 64u);
  EXPECT_EQ(r[0].accessed, 0u);
  // A holder touches every page.
  TouchAll();
  r = s.Sample({Target()});
  EXPECT_EQ(r[0].sampled, 64u);
  EXPECT_EQ(r[0].accessed, 64u);
  EXPECT_DOUBLE_EQ(r[0].AccessedShare(), 1.0);
  // ... a quarter of them.
  TouchSome(4);
  r = s.Sample({Target()});
  EXPECT_EQ(r[0].accessed, 16u);
  EXPECT_EQ(s.last_error(), "");
}

TEST_F(IdlePageSamplerTest, FramesThatChangedAreArmedAgainNotCounted) {
  IdlePageSampler s(&sys, &proc, &bitmap, 32);
  s.Sample({Target()});
  shift += 7;  // the range moved: new frames
  TouchAll();
  auto r = s.Sample({Target()});
  EXPECT_EQ(r[0].sampled, 0u);
  r = s.Sample({Target()});
  EXPECT_EQ(r[0].sampled, 32u);
  EXPECT_EQ(r[0].accessed, 0u);
}

TEST_F(IdlePageSamplerTest, ErrorsAreReportedAndForgetDropsTheMapping) {
  IdlePageSampler s(&sys, &proc, &bitmap, 16);
  bitmap.fail = true;
  s.Sample({Target()});
  EXPECT_NE(s.last_error().find("EACCES"), std::string::npos) << s.last_error();
  bitmap.fail = false;
  s.Forget(1);
  auto r = s.Sample({Target()});
  EXPECT_EQ(r[0].sampled, 0u);  // a new target again
  // A pagemap that cannot be read: no sample, an error.
  proc.binary.clear();
  r = s.Sample({Target()});
  EXPECT_NE(s.last_error().find("NOT_FOUND"), std::string::npos) << s.last_error();
}

}  // namespace
}  // namespace cxlpool::tiering
