#include "tiering/sampler.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>
#include <utility>

#include "cxlpool/common/strings.h"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

namespace cxlpool::tiering {

namespace {
constexpr char kDamonAdmin[] = "/sys/kernel/mm/damon/admin";
constexpr char kIdleBitmap[] = "/sys/kernel/mm/page_idle/bitmap";
constexpr char kPagemap[] = "/proc/self/pagemap";

uint64_t Le64(const std::string& s, size_t at = 0) {
  uint64_t v = 0;
  for (size_t i = 0; i < 8 && at + i < s.size(); ++i) {
    v |= static_cast<uint64_t>(static_cast<unsigned char>(s[at + i])) << (8 * i);
  }
  return v;
}

std::string Le64Bytes(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

class RealWriter final : public KernelFileWriter {
 public:
  Status WriteAt(const std::string& path, uint64_t offset, const std::string& data) override {
    int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) return Status::FromErrno(errno, "open " + path + " for writing");
    ssize_t n;
    do {
      n = ::pwrite(fd, data.data(), data.size(), static_cast<off_t>(offset));
    } while (n < 0 && errno == EINTR);
    int err = errno;
    ::close(fd);
    if (n < 0) return Status::FromErrno(err, "pwrite " + path);
    if (static_cast<size_t>(n) != data.size()) return Status(Code::kIo, "short write to " + path);
    return Status::Ok();
  }
};
}  // namespace

std::unique_ptr<KernelFileWriter> MakeKernelFileWriter() { return std::make_unique<RealWriter>(); }

std::string KernelAccess::ToString() const {
  std::string s = "kernel access sampling: " + sampler + " (" + why + "); DAMON: ";
  if (!damon_sysfs) {
    s += "absent";
  } else {
    std::string ops;
    for (const auto& o : damon_operations) ops += (ops.empty() ? "" : ",") + o;
    s += "sysfs present, operations " + (ops.empty() ? std::string("?") : ops) + ", " +
         std::to_string(damon_kdamonds) + " kdamond(s), " + std::to_string(damon_running) +
         " running" +
         (damon_driven ? "; driven by cxlpoold (its own kdamond, paddr)"
                       : "; not driven by cxlpoold");
  }
  s += "; idle page tracking: ";
  if (!page_idle) {
    s += "absent (CONFIG_IDLE_PAGE_TRACKING)";
  } else {
    s += page_idle_readable ? "readable" : "not readable";
  }
  // Both samplers need the frame numbers; under systemd CAP_SYS_ADMIN comes
  // from the opt-in drop-in cxlpoold-sampling.conf (docs/service.md).
  s += std::string("; pagemap PFNs ") +
       (pagemap_pfns ? "visible" : "hidden (needs CAP_SYS_ADMIN: cxlpoold-sampling.conf)");
  return s;
}

KernelAccess DetectKernelAccess(const FileSystem& sys, const FileSystem& proc,
                                const void* pfn_probe_addr) {
  KernelAccess k;
  k.damon_sysfs = sys.IsDir(kDamonAdmin);
  if (k.damon_sysfs) {
    std::string kd = std::string(kDamonAdmin) + "/kdamonds";
    if (auto n = sys.ReadTrimmed(kd + "/nr_kdamonds"); n.ok()) {
      k.damon_kdamonds = static_cast<uint32_t>(ParseU64(*n).value_or(0));
    }
    for (uint32_t i = 0; i < k.damon_kdamonds && i < 64; ++i) {
      std::string base = kd + "/" + std::to_string(i);
      if (auto st = sys.ReadTrimmed(base + "/state"); st.ok() && *st == "on") ++k.damon_running;
      if (i == 0) {
        if (auto ops = sys.ReadTrimmed(base + "/contexts/0/avail_operations"); ops.ok()) {
          k.damon_operations = SplitWhitespace(*ops);
        }
      }
    }
  }
  k.page_idle = sys.Exists(kIdleBitmap);
  if (k.page_idle) {
    auto w = sys.ReadAt(kIdleBitmap, 0, 8);
    k.page_idle_readable = w.ok() && w->size() == 8;
  }
  if (pfn_probe_addr != nullptr) {
    uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    uint64_t vpn = reinterpret_cast<uintptr_t>(pfn_probe_addr) / page;
    auto e = proc.ReadAt(kPagemap, vpn * 8, 8);
    k.pagemap_pfns = e.ok() && e->size() == 8 && PagemapPfn(Le64(*e)) != 0;
  }
  if (k.page_idle && k.page_idle_readable && k.pagemap_pfns) {
    k.sampler = "idle_page";
    k.why =
        "the page_idle bitmap with frame numbers from /proc/self/pagemap sees every holder's "
        "CPU accesses";
  } else if (k.page_idle && !k.page_idle_readable) {
    k.why = "the page_idle bitmap exists but cannot be read (root only)";
  } else if (k.page_idle) {
    k.why = "/proc/self/pagemap hides frame numbers (CAP_SYS_ADMIN needed)";
  } else {
    k.why = "no idle page tracking in this kernel";
  }
  if (k.sampler == "none") k.why += "; temperatures come from the holders' signals only";
  return k;
}

KernelAccess DetectKernelAccess(const FileSystem& sys, const FileSystem& proc) {
  long page = ::sysconf(_SC_PAGESIZE);
  void* p = ::mmap(nullptr, static_cast<size_t>(page), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return DetectKernelAccess(sys, proc, nullptr);
  static_cast<volatile char*>(p)[0] = 1;
  KernelAccess k = DetectKernelAccess(sys, proc, p);
  ::munmap(p, static_cast<size_t>(page));
  return k;
}

// ---------------------------------------------------------------- sampler

Result<SampledMapping> SampledMapping::Map(const SampleTarget& t) {
  if (t.fd < 0 || t.length == 0) return Status(Code::kInvalidArgument, "nothing to map");
  void* a = ::mmap(nullptr, t.length, PROT_READ, MAP_SHARED, t.fd, static_cast<off_t>(t.offset));
  if (a == MAP_FAILED) {
    return Status(Code::kIo, std::string("mmap for sampling: ") + std::strerror(errno));
  }
  // Page-table entries of our own, so that pagemap shows the frames.
  if (::madvise(a, t.length, MADV_POPULATE_READ) != 0) {
    int err = errno;
    ::munmap(a, t.length);
    return Status(Code::kIo, std::string("populate for sampling: ") + std::strerror(err));
  }
  SampledMapping m;
  m.addr_ = a;
  m.length_ = t.length;
  m.offset_ = t.offset;
  return m;
}

SampledMapping::~SampledMapping() {
  if (addr_ != nullptr) ::munmap(addr_, length_);
}

SampledMapping::SampledMapping(SampledMapping&& o) noexcept
    : addr_(std::exchange(o.addr_, nullptr)), length_(o.length_), offset_(o.offset_) {}

SampledMapping& SampledMapping::operator=(SampledMapping&& o) noexcept {
  std::swap(addr_, o.addr_);
  std::swap(length_, o.length_);
  std::swap(offset_, o.offset_);
  return *this;
}

IdlePageSampler::IdlePageSampler(const FileSystem* sys, const FileSystem* proc,
                                 KernelFileWriter* writer, uint32_t pages_per_target)
    : sys_(sys),
      proc_(proc),
      writer_(writer),
      pages_per_target_(pages_per_target == 0 ? 1 : pages_per_target) {}

IdlePageSampler::~IdlePageSampler() = default;

void IdlePageSampler::Forget(uint64_t lease_id) { EraseLease(&tracked_, lease_id); }

Result<uint64_t> IdlePageSampler::Pfn(const void* addr) const {
  uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  uint64_t vpn = reinterpret_cast<uintptr_t>(addr) / page;
  auto e = proc_->ReadAt(kPagemap, vpn * 8, 8);
  if (!e.ok()) return e.status();
  if (e->size() != 8) return Status(Code::kIo, "short read of /proc/self/pagemap");
  return PagemapPfn(Le64(*e));
}

std::vector<SampleResult> IdlePageSampler::Sample(const std::vector<SampleTarget>& targets) {
  std::vector<SampleResult> out;
  last_error_.clear();
  // Frames to mark idle after reading, by bitmap word.
  std::map<uint64_t, uint64_t> arm;
  std::map<uint64_t, uint64_t> words;  // bitmap words read this round
  auto word = [&](uint64_t pfn) -> Result<uint64_t> {
    uint64_t w = pfn / 64;
    if (auto it = words.find(w); it != words.end()) return it->second;
    auto r = sys_->ReadAt(kIdleBitmap, w * 8, 8);
    if (!r.ok()) return r.status();
    if (r->size() != 8) return Status(Code::kIo, "short read of the page_idle bitmap");
    uint64_t v = Le64(*r);
    words[w] = v;
    return v;
  };
  for (const auto& t : targets) {
    SampleResult res{t.lease_id, t.unit, 0, 0};
    Tracked* found = TrackTarget(&tracked_, t, &last_error_);
    if (found == nullptr) continue;
    Tracked& tr = *found;
    uint64_t pages = tr.map.length() / 4096;
    uint64_t n = std::min<uint64_t>(pages, pages_per_target_);
    std::vector<uint64_t> pfns(n, 0);
    for (uint64_t i = 0; i < n; ++i) {
      uint64_t page = n == 1 ? 0 : i * (pages - 1) / (n - 1);
      auto pfn = Pfn(static_cast<char*>(tr.map.addr()) + page * 4096);
      if (!pfn.ok()) {
        last_error_ = pfn.status().ToString();
        break;
      }
      pfns[i] = *pfn;
    }
    bool armed = tr.pfns.size() == n;
    for (uint64_t i = 0; i < n; ++i) {
      uint64_t pfn = pfns[i];
      if (pfn == 0) continue;
      if (armed && tr.pfns[i] == pfn) {
        auto w = word(pfn);
        if (!w.ok()) {
          last_error_ = w.status().ToString();
          continue;
        }
        ++res.sampled;
        if (((*w >> (pfn % 64)) & 1) == 0) ++res.accessed;  // idle bit cleared: touched
      }
      arm[pfn / 64] |= uint64_t{1} << (pfn % 64);
    }
    tr.pfns = std::move(pfns);
    out.push_back(res);
  }
  for (const auto& [w, bits] : arm) {
    Status st = writer_->WriteAt(kIdleBitmap, w * 8, Le64Bytes(bits));
    if (!st.ok()) {
      last_error_ = st.ToString();
      break;
    }
  }
  return out;
}

}  // namespace cxlpool::tiering
