// DamonSampler: CPU-side access sampling of leases through DAMON's sysfs
// interface (/sys/kernel/mm/damon/admin, CONFIG_DAMON_SYSFS), for kernels
// without idle page tracking (Debian's among them).
//
// It drives one kdamond of its own with the "paddr" operations: DAMON then
// checks the accessed bits of the page frames through the kernel's reverse
// map, so it sees every holder's CPU accesses, whichever process maps the
// lease (the "vaddr" operations watch one process's page tables, so they
// would see a lease through one holder only, at addresses the daemon does not
// know). The frames come from /proc/self/pagemap over the sampler's own
// read-only mapping of each lease (frame numbers need CAP_SYS_ADMIN); runs of
// contiguous frames become the target's monitoring regions, one scheme with
// the "stat" action matches every region, and each round asks the kdamond
// for its regions ("update_schemes_tried_regions") and reads their
// nr_accesses (sampling intervals out of an aggregation interval in which
// DAMON found the region accessed). A unit's pages in regions with
// nr_accesses > 0 count as accessed.
//
// A kdamond is machine-wide state: writing nr_kdamonds while any kdamond
// runs fails, and another user's kdamond must never be changed. So the
// sampler only starts where there is no kdamond at all (nr_kdamonds 0); it
// then creates kdamond 0, and removes it again whenever it has nothing to
// watch and when it is destroyed. Anything else is a clear refusal from
// Open, which the daemon logs and shows in `cxlpoolctl tiering`.
//
// A daemon killed while it samples cannot remove its kdamond. So while one
// runs, an owner record (DamonOptions::owner_file, in the state directory)
// names the process that made it: pid, start time and boot id. Open takes
// back a lone kdamond 0 only when the record names a process of this boot
// that is gone and the kdamond is still set up exactly as the sampler sets
// it up (paddr, one target, one "stat" scheme); it stops and removes it,
// then starts afresh, and says so (reclaimed()). A live owner (a second
// daemon) or any other kdamond is left alone.
//
// Every sysfs read goes through the FileSystem seam and every write through
// KernelFileWriter, so tests drive the sampler against a fake DAMON that
// fails closed (tests/tiering/damon_sampler_test.cc).
//
// Thread safety: one thread at a time (the engine's tiering thread), like
// IdlePageSampler.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cxlpool/common/fs.h"
#include "cxlpool/common/status.h"
#include "tiering/sampler.h"

namespace cxlpool::tiering {

struct DamonOptions {
  uint64_t sample_us = 5000;     // DAMON's sampling interval
  uint64_t aggr_us = 100000;     // aggregation interval: nr_accesses counts up to aggr/sample
  uint64_t update_us = 1000000;  // operations update interval
  uint32_t max_regions = 4096;   // monitoring regions at most (runs of contiguous frames)
  // The owner record ("" = none: a kdamond left by a killed daemon then
  // stays until an administrator removes it).
  std::string owner_file;
};

class DamonSampler final : public AccessSampler {
 public:
  // Creates and starts nothing; see Open.
  DamonSampler(const FileSystem* sys, const FileSystem* proc, KernelFileWriter* writer,
               DamonOptions options = {});
  ~DamonSampler() override;  // Close()
  DamonSampler(const DamonSampler&) = delete;
  DamonSampler& operator=(const DamonSampler&) = delete;

  // Claims kdamond 0: requires DAMON's sysfs, no kdamond already there (not
  // ours to change; one a killed cxlpoold left is taken back, see above),
  // and "paddr" among the operations. Nothing runs until
  // the first Sample with a target. UNSUPPORTED (no DAMON sysfs, no paddr),
  // UNAVAILABLE (DAMON in use by someone else), PERMISSION_DENIED / IO
  // (a write failed; what was created is removed again).
  Status Open();
  // Stops and removes the kdamond (if ours); Sample opens it again when it
  // has targets.
  void Close();
  bool opened() const { return opened_; }

  const char* name() const override { return "damon"; }
  std::vector<SampleResult> Sample(const std::vector<SampleTarget>& targets) override;
  void Forget(uint64_t lease_id) override;
  // Errors of the last round, for the report.
  const std::string& last_error() const { return last_error_; }
  // Regions committed to the kdamond (for tests and the report).
  size_t regions() const { return committed_.size(); }
  // What Open took back ("" when nothing): "kdamond 0 left by cxlpoold pid N
  // (gone)".
  const std::string& reclaimed() const { return reclaimed_; }
  // The context's avail_operations as Open read them (empty before; they
  // can only be read while a kdamond exists).
  const std::vector<std::string>& operations() const { return operations_; }

 private:
  struct Run {  // physical [start, end), of one unit
    uint64_t start = 0, end = 0;
  };
  struct Tracked {
    SampledMapping map;
    std::vector<Run> runs;  // as committed
    bool armed = false;     // its runs were committed in an earlier round
  };
  using Key = std::pair<uint64_t, uint32_t>;

  std::string Kd() const;   // .../kdamonds/0
  std::string Ctx() const;  // .../kdamonds/0/contexts/0
  Status Write(const std::string& path, const std::string& value);
  // Whether the lone kdamond 0 is one a gone process of ours left: its
  // description, or why not (NOT_FOUND: no owner record).
  Result<std::string> LeftByUs() const;
  void WriteOwner();
  void RemoveOwner() const;
  Result<std::vector<Run>> Frames(const Tracked& t) const;
  // Writes the regions (sorted, merged) and starts or commits the kdamond.
  Status Commit(std::vector<Run> regions);
  Status Stop();
  // The kdamond's regions now: start, end, nr_accesses.
  Result<std::vector<std::pair<Run, uint32_t>>> TriedRegions();

  const FileSystem* sys_;
  const FileSystem* proc_;
  KernelFileWriter* writer_;
  DamonOptions options_;
  bool opened_ = false;
  bool running_ = false;
  bool dirty_ = false;  // tracked units changed outside Sample: commit again
  std::vector<Run> committed_;
  std::map<Key, Tracked> tracked_;
  std::string last_error_;
  std::string reclaimed_;
  std::vector<std::string> operations_;
};

// The sampler for `mode` ("auto", "idle_page", "damon", "off") on this
// machine, as `access` (DetectKernelAccess) found it: idle page tracking
// where it is usable ("auto" prefers it: it reads every sampled page's own
// bit), else DAMON where its sysfs is there, frame numbers are visible and
// Open succeeds. Updates access->sampler and access->why to say which and
// why, including why DAMON was not driven. `sys` and `proc` read the real
// /sys and /proc (the caller checks that the root is this system);
// `writer` outlives the sampler. Null: no sampler.
std::unique_ptr<AccessSampler> ChooseSampler(const std::string& mode, KernelAccess* access,
                                             const FileSystem* sys, const FileSystem* proc,
                                             KernelFileWriter* writer,
                                             const DamonOptions& damon = {});

}  // namespace cxlpool::tiering
