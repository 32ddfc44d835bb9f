// CPU-side access sampling: what the kernel offers for seeing which pages
// of a lease the CPUs touch, detected at start, and the sampler built on it.
//
// The GPU's DMA reads and writes of host memory never set a page-table
// accessed bit, so sampling only sees CPU accesses; the engine adds it to
// the holders' own signals (bytes copied, hints), never in place of them.
//
// Two kernel interfaces exist:
//  - Idle page tracking (/sys/kernel/mm/page_idle/bitmap, CONFIG_IDLE_PAGE_
//    TRACKING): one bit per page frame. Writing a 1 marks the frame idle and
//    clears the accessed bit in every page table that maps it (the kernel
//    walks the reverse map), so a later read shows whether ANY holder
//    touched it since. The frame numbers come from /proc/self/pagemap over
//    the sampler's own mapping of the lease, which shows them only with
//    CAP_SYS_ADMIN. This is the sampler implemented here (IdlePageSampler).
//  - DAMON (/sys/kernel/mm/damon/admin, CONFIG_DAMON_SYSFS). Its "paddr"
//    operations check page frames' accessed bits through the reverse map,
//    so they see every holder too; DamonSampler (damon_sampler.h) drives a
//    kdamond of its own with them, where no other kdamond exists (a kdamond
//    is machine-wide state, e.g. DAMON_RECLAIM's). "vaddr" would watch one
//    process's page tables, so it would see a lease through one holder only.
// Detection is read-only; reads go through the FileSystem seam (ReadAt for
// the binary files), the bitmap writes through KernelFileWriter, so tests run
// the sampler against fakes that fail closed.
//
// Thread safety: DetectKernelAccess is reentrant. An IdlePageSampler belongs
// to one thread at a time (the engine's tiering thread).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cxlpool/common/fs.h"
#include "cxlpool/common/status.h"

namespace cxlpool::tiering {

struct KernelAccess {
  // DAMON
  bool damon_sysfs = false;                   // /sys/kernel/mm/damon/admin exists
  std::vector<std::string> damon_operations;  // kdamond 0's avail_operations
  uint32_t damon_kdamonds = 0;                // kdamonds/nr_kdamonds
  uint32_t damon_running = 0;                 // of them with state "on"
  bool damon_driven = false;                  // a DamonSampler of ours runs (ChooseSampler)
  // Idle page tracking
  bool page_idle = false;           // the bitmap exists
  bool page_idle_readable = false;  // its first word could be read
  bool pagemap_pfns = false;        // /proc/self/pagemap shows frame numbers
  // What the engine samples with: "idle_page", "damon" or "none", and why.
  std::string sampler = "none";
  std::string why;

  // One line for the log: "kernel access sampling: idle_page (...); DAMON: ..."
  std::string ToString() const;
};

// `sys` reads /sys, `proc` reads /proc/self (both FileSystems rooted at the
// real "/" in the daemon). `pfn_probe_addr` is a resident page of this
// process whose pagemap entry shows whether frame numbers are visible (null:
// not probed, pagemap_pfns stays false).
KernelAccess DetectKernelAccess(const FileSystem& sys, const FileSystem& proc,
                                const void* pfn_probe_addr);
// The same, probing with a page of its own.
KernelAccess DetectKernelAccess(const FileSystem& sys, const FileSystem& proc);

// Writes of kernel control files (the page_idle bitmap).
class KernelFileWriter {
 public:
  virtual ~KernelFileWriter() = default;
  // Writes `data` at `offset` (one pwrite). NOT_FOUND, PERMISSION_DENIED, IO.
  virtual Status WriteAt(const std::string& path, uint64_t offset, const std::string& data) = 0;
};
// pwrite(2) on the real file system.
std::unique_ptr<KernelFileWriter> MakeKernelFileWriter();

struct SampleTarget {
  uint64_t lease_id = 0;
  uint32_t unit = 0;
  int fd = -1;  // borrowed for the call; the sampler maps the range itself
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t page_size = 4096;
};

struct SampleResult {
  uint64_t lease_id = 0;
  uint32_t unit = 0;
  uint64_t sampled = 0;   // pages whose idle bit was read this round
  uint64_t accessed = 0;  // of them, touched since the last round
  double AccessedShare() const {
    return sampled == 0 ? 0 : static_cast<double>(accessed) / static_cast<double>(sampled);
  }
};

class AccessSampler {
 public:
  virtual ~AccessSampler() = default;
  virtual const char* name() const = 0;
  // One round. A target seen for the first time (or whose page frames
  // changed: it moved) is only armed (sampled 0); the next round reports.
  virtual std::vector<SampleResult> Sample(const std::vector<SampleTarget>& targets) = 0;
  // Drops whatever the sampler holds for the lease (its mapping).
  virtual void Forget(uint64_t lease_id) = 0;
};

// A sampler's own read-only MAP_SHARED mapping of one sampled range,
// populated so that /proc/self/pagemap shows its frames; unmapped when
// destroyed. Move-only.
class SampledMapping {
 public:
  SampledMapping() = default;
  // IO ("mmap for sampling: ...", "populate for sampling: ..."),
  // INVALID_ARGUMENT (no fd, empty range).
  static Result<SampledMapping> Map(const SampleTarget& t);
  ~SampledMapping();
  SampledMapping(SampledMapping&& o) noexcept;
  SampledMapping& operator=(SampledMapping&& o) noexcept;
  SampledMapping(const SampledMapping&) = delete;
  SampledMapping& operator=(const SampledMapping&) = delete;

  void* addr() const { return addr_; }
  uint64_t length() const { return length_; }
  // The same range of the lease as `t` (else it is mapped again).
  bool Covers(const SampleTarget& t) const { return offset_ == t.offset && length_ == t.length; }

 private:
  void* addr_ = nullptr;
  uint64_t length_ = 0;
  uint64_t offset_ = 0;
};

// Erases the entries of a map keyed by (lease id, unit) that belong to
// `lease_id`; true if there were any.
template <typename Map>
bool EraseLease(Map* m, uint64_t lease_id) {
  bool any = false;
  for (auto it = m->begin(); it != m->end();) {
    if (it->first.first == lease_id) {
      it = m->erase(it);
      any = true;
    } else {
      ++it;
    }
  }
  return any;
}

// The entry of `m` (keyed by (lease id, unit); its values have a
// `SampledMapping map`) for `t`, mapped anew when it is missing or covers
// another range of the lease. Null when `t` has nothing to map, or when the
// mapping failed (`error` then says why).
template <typename Map>
typename Map::mapped_type* TrackTarget(Map* m, const SampleTarget& t, std::string* error) {
  const auto key = std::make_pair(t.lease_id, t.unit);
  auto it = m->find(key);
  if (it != m->end() && !it->second.map.Covers(t)) {
    m->erase(it);
    it = m->end();
  }
  if (it == m->end()) {
    if (t.fd < 0 || t.length == 0) return nullptr;
    auto mapped = SampledMapping::Map(t);
    if (!mapped.ok()) {
      *error = mapped.status().message();
      return nullptr;
    }
    typename Map::mapped_type entry;
    entry.map = std::move(*mapped);
    it = m->emplace(key, std::move(entry)).first;
  }
  return &it->second;
}

// Samples up to `pages_per_target` pages of each range, spread evenly.
class IdlePageSampler final : public AccessSampler {
 public:
  IdlePageSampler(const FileSystem* sys, const FileSystem* proc, KernelFileWriter* writer,
                  uint32_t pages_per_target = 256);
  ~IdlePageSampler() override;
  const char* name() const override { return "idle_page"; }
  std::vector<SampleResult> Sample(const std::vector<SampleTarget>& targets) override;
  void Forget(uint64_t lease_id) override;
  // Errors of the last round (a failed read or write), for the report.
  const std::string& last_error() const { return last_error_; }

 private:
  struct Tracked {
    SampledMapping map;
    std::vector<uint64_t> pfns;  // per sampled page, as armed last round (0: none)
  };
  // The frame number of the page at `addr` from /proc/self/pagemap, 0 if
  // not present or not visible.
  Result<uint64_t> Pfn(const void* addr) const;

  const FileSystem* sys_;
  const FileSystem* proc_;
  KernelFileWriter* writer_;
  uint32_t pages_per_target_;
  std::map<std::pair<uint64_t, uint32_t>, Tracked> tracked_;
  std::string last_error_;
};

// The pagemap entry of a page: present bit 63, frame number bits 0-54.
inline uint64_t PagemapPfn(uint64_t entry) {
  return (entry >> 63) & 1 ? entry & ((uint64_t{1} << 55) - 1) : 0;
}

}  // namespace cxlpool::tiering
