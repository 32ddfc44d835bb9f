// The warm reserve of one pool: extents of the pool's ladder, built ahead
// of time, measured in bytes with a low and a high watermark; and the
// refiller that builds and retires them off the event loop.
//
// ExtentReserve (the state; event-loop thread only):
//   * Take(requested) cuts a lease (extent_cut.h) and hands over the reserve
//     extents of the cut, the tail one shrunk to fit; the pieces to build on
//     the request path are the caller's (BuildSpec).
//   * Return(extents) takes extents back from an ended lease or a refused
//     grant. An extent that was never exposed and keeps its built size goes
//     back to stock (below the high watermark); every other one is retired:
//     truncated (holders SIGBUS), unmapped, closed, never reused. The
//     memory comes back as fresh memfds built by the refill, whose pages the
//     kernel zeroes on the way in. That is the scrub: no byte a holder wrote
//     can reach the next one, since no file that left the daemon is ever
//     handed out again, and every page of a fresh file is zeroed before
//     anyone can map it (docs/architecture.md, "Why a released extent is never handed out again").
//   * Refill starts when ready + building is at or below the low watermark and
//     goes on up to the high one, spread over the granules by per-granule
//     targets: enough small extents for tails and small leases, up to one
//     level's worth of each middle granule, the rest in the largest. Ready
//     stock above the high watermark (after a Reconfigure) is retired.
//     Three failed builds in a row disable a granule until a build of it
//     succeeds or Reconfigure. A granule below the largest that is down to
//     half its target is topped up whatever the watermarks (PlanRefill):
//     the pieces every cut ends in never run out while larger extents keep
//     the bytes above the low watermark.
//   * Small extents: a few prebuilt extents of each small class below the
//     smallest granule (extent_cut.h, SmallClasses: 4 KiB .. 1 MiB), so a
//     lease (or tail) under 2 MiB is one of them shrunk to its exact size,
//     with no build on the request path. A class down to half its target
//     is topped up, whatever the watermarks (they are cheap). They come on
//     top of the watermarks (limit_bytes: under 8 MiB more on the default
//     ladder; none in a reserve below 32 MiB), so a reserve of N bytes holds
//     a lease of N bytes in whole granules; their bytes count as ready like
//     any other.
//
// ReserveRefiller (the work): builds run on the `stock` executor (the
// daemon's low-priority stock threads: reniced and SCHED_IDLE, see
// lease/thread_priority.h), prefaulting in steps with a yield between them
// (MemfdSpec::yield_between_steps), so a waiting client's work preempts
// them. With several stock threads, a large build's prefault is shared
// (pool/shared_fill.h): a thread with no build of its own fills chunks of
// another's, so one 1 GiB refill runs on every stock thread. Retirements run on `retire` (the
// daemon's ordinary workers: a truncation frees capacity a grant may be waiting for). Results are
// posted back to `loop`, where all reserve state lives.
//
// Accounting: the reserve's own bytes are ready + building + retiring, all
// of them used memory of the pool (pinned; nobody else can use it).
//
// Stopping: DropAll (shutdown, hand-over) sets the reserve's stop flag,
// which every build of its spec carries (MemfdSpec::stop): a refill in
// the middle of a large prefault ends within a step, and builds still
// queued on the stock threads end before they create a memfd, so the
// daemon's exit never waits for a refill.
//
// The kernel's limit: a reserve is bounded not only by its pool's capacity
// (the numbers of the sysfs root, which may be a captured tree of another
// machine) but by what the running kernel can give. At start the daemon
// caps all reserves together to MemAvailable of the real /proc/meminfo
// less a margin (ClampReservesToKernel); the cap holds through reloads and
// capacity changes.
//
// Thread safety: ExtentReserve and ReserveRefiller belong to the event-loop
// thread. The refiller's owner must join the stock and retire executors
// before destroying it (completions still queued for the loop are then
// dropped, and their extents retired where they are).
#pragma once

#include <atomic>
#include <boost/asio/any_io_executor.hpp>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cxlpool/common/clock.h"
#include "cxlpool/common/fs.h"
#include "cxlpool/common/status.h"
#include "pool/backing.h"
#include "pool/extent.h"
#include "pool/extent_cut.h"
#include "pool/pool_options.h"

namespace cxlpool {

struct ReserveSettings {
  ExtentLadder ladder = ExtentLadder::Default();
  uint64_t low_bytes = 0;   // refill starts at or below this (ready + building)
  uint64_t high_bytes = 0;  // ... and runs up to this; stock above it is retired
  CutPolicy cut;
  // Prebuilt small extents per small class (see above); 0: none.
  uint32_t small_per_class = 4;
};

// Watermarks as bytes or a percentage of the pool's `capacity`, resolved
// and rounded down to the smallest granule. INVALID_ARGUMENT when low > high.
Result<ReserveSettings> ResolveReserve(const CapacitySpec& low, const CapacitySpec& high,
                                       uint64_t capacity,
                                       ExtentLadder ladder = ExtentLadder::Default());

class ExtentReserve {
 public:
  // `base`: how this pool's extents are built (node, pin, thp, hugetlb,
  // prefault, name); its size is set per build.
  ExtentReserve(std::string pool_name, ReserveSettings settings, MemfdSpec base);
  ~ExtentReserve();
  ExtentReserve(const ExtentReserve&) = delete;
  ExtentReserve& operator=(const ExtentReserve&) = delete;

  const std::string& pool_name() const { return name_; }
  // The watermarks in force: the configured ones, lowered to the cap.
  const ReserveSettings& settings() const { return settings_; }
  // At most this many bytes (limit_bytes()) whatever the watermarks say;
  // UINT64_MAX: no cap. Lowers the watermarks now (ready stock above the
  // new limit is retired) and at every Reconfigure; the low one in
  // proportion to the high one.
  void SetCap(uint64_t bytes);
  uint64_t cap_bytes() const { return cap_bytes_; }
  // Set by DropAll; every build of BuildSpec carries it (MemfdSpec::stop),
  // and so do the pool's request-path builds (MemfdPool::Build).
  bool stop_requested() const { return stop_->load(); }
  std::shared_ptr<const std::atomic<bool>> build_stop() const { return stop_; }
  uint64_t page_size() const { return base_.hugetlb ? (2ull << 20) : 4096; }
  bool hugetlb() const { return base_.hugetlb; }

  // ---- what is there ----
  uint64_t ready_bytes() const { return ready_bytes_; }
  uint64_t building_bytes() const { return building_bytes_; }
  uint64_t retiring_bytes() const { return retiring_bytes_; }
  uint64_t used_bytes() const { return ready_bytes_ + building_bytes_ + retiring_bytes_; }
  uint32_t ready_count(size_t level) const;
  std::vector<uint32_t> ready_counts() const;
  // How many extents of each granule the refill aims for.
  const std::vector<uint32_t>& targets() const { return targets_; }
  // The small classes (extent_cut.h: SmallClasses), their ready extents and
  // targets (all 0 where the reserve is too small to keep them).
  const std::vector<uint64_t>& small_classes() const { return small_classes_; }
  std::vector<uint32_t> small_ready_counts() const;
  const std::vector<uint32_t>& small_targets() const { return small_targets_; }
  // Ready extents of every size.
  uint64_t ready_extents() const;
  // What the reserve holds at most: the high watermark in ladder extents,
  // plus the small extents' targets on top.
  uint64_t small_target_bytes() const { return small_target_bytes_; }
  uint64_t limit_bytes() const { return settings_.high_bytes + small_target_bytes_; }
  bool refilling() const { return refilling_; }
  // Since when (the clock's MonotonicNs) ready bytes have been below the low
  // watermark without a break; nullopt while they are not (or there is no
  // low watermark). A long stretch means refills cannot keep up with
  // grants, keep failing, or the pool has no room for them.
  std::optional<int64_t> below_low_since_ns() const { return below_low_since_ns_; }
  // The time source of below_low_since_ns (default: SystemClock); must
  // outlive the reserve.
  void set_clock(const Clock* clock);

  // ---- grants ----
  struct Taken {
    CutPlan plan;
    // One per kReserve piece of plan.pieces, in order, each already of its
    // piece's size (the tail piece shrunk).
    std::vector<std::unique_ptr<Extent>> extents;
  };
  // How Take would cut `requested` now (nothing is taken); PlanCut's errors.
  Result<CutPlan> Plan(uint64_t requested) const;
  // INVALID_ARGUMENT from PlanCut; IO if shrinking the tail piece failed
  // (that extent is retired; nothing else is taken).
  Result<Taken> Take(uint64_t requested);
  // The spec of an extent of `bytes` for this pool; `background` for refills.
  MemfdSpec BuildSpec(uint64_t bytes, bool background) const;
  // Extents back from a lease or a refused grant (see above).
  void Return(std::vector<std::unique_ptr<Extent>> extents);

  // ---- refill and retire (the refiller calls these) ----
  // Granules to build now, already counted as building; never more than
  // `room` bytes (what the pool may still commit).
  std::vector<uint64_t> PlanRefill(uint64_t room);
  void Built(std::unique_ptr<Extent> extent);  // a refill build finished
  void BuildFailed(uint64_t granule);
  // Extents waiting to be retired, moved out (their bytes count as retiring
  // until Retired).
  std::vector<std::unique_ptr<Extent>> TakeRetiring();
  void Retired(uint64_t bytes);
  // Retires ready stock, largest first, until `bytes` are on their way out
  // or nothing is left (a lease needs the room). Returns the bytes queued.
  uint64_t Evict(uint64_t bytes);
  // New watermarks or ladder (reload): new targets, failures forgotten;
  // ready stock above the new high watermark, or of a granule the new
  // ladder lacks, is retired.
  void Reconfigure(ReserveSettings settings);
  // Shutdown: every ready extent is retired; no more refills; builds in
  // flight or queued stop (they fail with UNAVAILABLE and land as
  // BuildFailed, or nowhere once the loop has stopped).
  void DropAll();

 private:
  struct Level {
    uint64_t granule = 0;
    std::deque<std::unique_ptr<Extent>> ready;
    uint32_t building = 0;
    uint32_t failures = 0;
  };
  void ComputeTargets();
  // settings_ lowered to cap_bytes_, then ComputeTargets.
  void ApplyCapAndTargets();
  void Retire(std::unique_ptr<Extent> e);
  void TrimAboveHigh();
  // The ladder level or small class of extents of `bytes`; null if none.
  Level* LevelOf(uint64_t bytes);
  void MakeSmall(std::deque<Level> old);
  // After every change of ready bytes or watermarks: starts or ends the
  // stretch below the low watermark.
  void NoteLevel();

  std::string name_;
  ReserveSettings configured_;  // as given, before the cap
  ReserveSettings settings_;
  MemfdSpec base_;
  std::deque<Level> levels_;  // a deque: Level is move-only
  std::vector<uint32_t> targets_;
  std::vector<uint64_t> small_classes_;
  std::deque<Level> small_;  // one per small class
  std::vector<uint32_t> small_targets_;
  uint64_t small_target_bytes_ = 0;
  std::vector<std::unique_ptr<Extent>> to_retire_;
  uint64_t ready_bytes_ = 0;
  uint64_t building_bytes_ = 0;
  uint64_t retiring_bytes_ = 0;
  bool refilling_ = false;
  bool stopped_ = false;
  uint64_t cap_bytes_ = UINT64_MAX;
  // Shared with every build in flight (MemfdSpec::stop), which may outlive
  // the reserve on a stock thread.
  std::shared_ptr<std::atomic<bool>> stop_ = std::make_shared<std::atomic<bool>>(false);
  const Clock* clock_ = &SystemClock::Get();
  std::optional<int64_t> below_low_since_ns_;
};

// What the running kernel can give the reserves, from its /proc/meminfo
// (read through `proc`, the real machine's file system whatever the sysfs
// root): MemAvailable (MemFree on a kernel without it) less a margin of a
// sixteenth of MemTotal, at least 256 MiB. NOT_FOUND / IO when the file
// cannot be read, INVALID_ARGUMENT when it has neither field.
struct KernelRoom {
  uint64_t available = 0;  // MemAvailable (or MemFree)
  uint64_t margin = 0;
  uint64_t room() const { return available > margin ? available - margin : 0; }
};
Result<KernelRoom> ReadKernelRoom(const FileSystem& proc);

// Caps `reserves` (SetCap) so that their limit_bytes() add up to at most
// `room.room()`: each keeps the same share of the room it had of the total;
// nothing changes when they fit. Logs one warning naming the total, the
// room and why. Returns the number of reserves capped.
size_t ClampReserves(const std::vector<ExtentReserve*>& reserves, const KernelRoom& room);

// ReadKernelRoom, then ClampReserves; a file that cannot be read is logged
// and caps nothing. Returns the number of reserves capped.
size_t ClampReservesToKernel(const std::vector<ExtentReserve*>& reserves, const FileSystem& proc);

// Builds one extent (a seam: tests wrap Extent::Create to watch which
// thread builds, or to fail).
using ExtentFactory = std::function<Result<std::unique_ptr<Extent>>(const MemfdSpec&)>;

class ReserveRefiller {
 public:
  using Executor = boost::asio::any_io_executor;
  struct Options {
    Executor loop;   // where `reserve` lives
    Executor stock;  // refill builds (low priority)
    // The threads behind `stock`: above 1, the prefault of a refill build
    // of at least two SharedFillChunk()s is shared with the others.
    uint32_t stock_threads = 1;
    Executor retire;  // truncations
    // The bytes the pool may still commit (capacity - used); called on the
    // loop before each refill plan.
    std::function<uint64_t()> room;
    ExtentFactory factory;                  // default Extent::Create
    std::function<void()> on_freed;         // after retired bytes were given back
    std::function<void(bool ok)> on_built;  // after each refill build, ok or failed
  };
  ReserveRefiller(ExtentReserve* reserve, Options options);
  ~ReserveRefiller();
  ReserveRefiller(const ReserveRefiller&) = delete;
  ReserveRefiller& operator=(const ReserveRefiller&) = delete;

  // Starts what the reserve wants now: refill builds and retirements.
  // Called after every change (take, return, reload); cheap when idle.
  void Kick();
  // No new work from now on (shutdown); builds in flight are retired as
  // they land.
  void Stop();

  uint32_t pending_builds() const { return pending_builds_; }
  uint32_t pending_retires() const { return pending_retires_; }

 private:
  ExtentReserve* reserve_;
  Options options_;
  bool stopped_ = false;
  uint32_t pending_builds_ = 0;
  uint32_t pending_retires_ = 0;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace cxlpool
