// Backing: the memory behind one lease, and how a memfd lease is built.
//
// A memfd backing is built in this order, and every step is checked:
//   memfd_create(MFD_CLOEXEC|MFD_ALLOW_SEALING[|MFD_NOEXEC_SEAL][|MFD_HUGETLB])
//   ftruncate(size); mmap(MAP_SHARED) in the daemon;
//   mbind(MPOL_BIND, node) on that mapping BEFORE any page is faulted;
//   madvise(MADV_HUGEPAGE) when shmem THP applies;
//   pinning (resident, never swapped): mlock2(MLOCK_ONFAULT) of the daemon
//   mapping, so each page is locked as the prefault brings it in (one pass;
//   plain mlock afterwards where the kernel lacks mlock2);
//   madvise(MADV_POPULATE_WRITE) (fallback: touch every page), in steps
//   with a sched_yield() between them for background builds, or for a
//   request-path build of at least two chunks cut into chunks that idle
//   workers help with (MemfdSpec::offer_fill, pool/shared_fill.h); a build
//   with a stop flag (MemfdSpec::stop) checks it between steps and ends
//   with UNAVAILABLE once it is set (shutdown);
//   seal F_SEAL_GROW|F_SEAL_SEAL (shrinking stays possible for revoke).
// Reclaim() returns the memory even if a client leaked the fd:
// ftruncate(fd, 0), munmap, close. A backing is never reused afterwards.
//
// Thread safety: CreateMemfdBacking is reentrant (run it on a worker). A
// Backing object has one owner; Reclaim is not synchronised.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "cxlpool/common/fs.h"
#include "cxlpool/common/status.h"
#include "cxlpool/common/unique_fd.h"
#include "pool/shared_fill.h"

namespace cxlpool {

class Backing {
 public:
  virtual ~Backing() = default;
  virtual int fd() const = 0;
  virtual uint64_t size_bytes() const = 0;
  virtual uint64_t page_size() const = 0;
  // "memfd", "memfd-thp", "hugetlb-2m", "devdax"
  virtual const std::string& kind() const = 0;
  // The daemon's own mapping (null for devdax or after Reclaim).
  virtual void* daemon_addr() const { return nullptr; }
  // devdax: the DAX device ("dax0.1") and its device number (st_rdev of
  // /dev/dax0.1); "" and 0 for memfds. Journalled, to match fds handed back.
  virtual const std::string& dax_device() const {
    static const std::string kNone;
    return kNone;
  }
  virtual uint64_t device_number() const { return 0; }
  // A lease on a shared device's slice (pool/shared_slice_pool.h): where
  // the lease starts on the device its fd opens, and the slice; 0 and none
  // for every other backing.
  virtual uint64_t device_offset() const { return 0; }
  virtual std::optional<uint32_t> shared_slice() const { return std::nullopt; }
  // The fd's inode and st_dev as read when the backing was made (off the
  // event loop), for the journal; false when not known (then fstat the fd).
  virtual bool Identity(uint64_t* inode, uint64_t* dev) const {
    (void)inode;
    (void)dev;
    return false;
  }
  // Frees the memory now, whoever else holds the fd. Idempotent.
  virtual void Reclaim() = 0;
};

// How shmem transparent huge pages behave, from
// /sys/kernel/mm/transparent_hugepage/shmem_enabled (the bracketed word).
enum class ShmemThp { kNever, kAdvise, kAlways, kUnknown };
ShmemThp ReadShmemThp(const FileSystem& fs);

struct MemfdSpec {
  uint64_t size_bytes = 0;  // > 0; a multiple of the page size (2 MiB for hugetlb)
  int numa_node = -1;       // MPOL_BIND to this node; -1: no binding
  bool pin = true;          // mlock the daemon mapping
  bool thp = false;         // madvise(MADV_HUGEPAGE)
  bool hugetlb = false;     // MFD_HUGETLB with 2 MiB pages
  // false: leave the pages to be faulted on first touch (mlock, if `pin`,
  // still faults them).  // Only for in-process harnesses over a foreign topology, whose grants are
  // never touched: a production pool always prefaults.
  bool prefault = true;
  std::string name = "cxlpool";
  // Background builds (reserve refills): prefault in steps and sched_yield()
  // between them. A low-priority thread inside one long prefault is not
  // preempted for a task that was already runnable when it was picked (on a
  // PREEMPT_NONE kernel, not before the next tick): a client sharing its CPU
  // would wait for the whole build. A step is 64 KiB of small pages, or
  // one 2 MiB page for hugetlb and THP.
  bool yield_between_steps = false;
  // A prefault of at least two SharedFillChunk()s is shared
  // (pool/shared_fill.h): cold builds with idle workers, refills with the
  // other stock threads. This is called on the building thread with the fill
  // before it fills its own share, so that other threads can take chunks
  // (SharedFill::HelpOne); the build returns only once every chunk is
  // filled. With yield_between_steps each chunk is prefaulted in steps.
  // Empty: one thread prefaults all.
  FillOffer offer_fill;
  // Set (from any thread) to end the build early: at daemon shutdown a
  // refill or a cold build of many GiB must not hold the exit. Checked
  // before the prefault and between its steps (kStopStep at least every
  // 16 MiB, also for a request-path build, which otherwise prefaults in one
  // call); a stopped build fails with UNAVAILABLE and leaves nothing behind
  // (the memfd is unmapped and closed, its pages freed). Null: never stopped.
  std::shared_ptr<const std::atomic<bool>> stop;
};

// The most a build with a stop flag prefaults between two looks at it.
inline constexpr uint64_t kStopStep = 16ull << 20;

// Builds, places, prefaults, pins and seals one memfd. Errors: INVALID_ARGUMENT
// (size), RESOURCE_EXHAUSTED (no memory / memlock limit / no huge pages),
// PERMISSION_DENIED, IO, UNAVAILABLE (spec.stop was set). Nothing is leaked
// on failure.
Result<std::unique_ptr<Backing>> CreateMemfdBacking(const MemfdSpec& spec);

// The same build, for owners other than a Backing (pool/extent.h): the fd,
// the daemon's mapping of all of it, and what it turned out to be.
struct BuiltMemfd {
  UniqueFd fd;
  void* addr = nullptr;  // the daemon's mapping, size_bytes long
  uint64_t size_bytes = 0;
  uint64_t page_size = 0;
  std::string kind;  // "memfd", "memfd-thp", "hugetlb-2m"
};
Result<BuiltMemfd> BuildMemfd(const MemfdSpec& spec);

// Wraps a memfd the daemon already holds and has mapped at `addr` (a lease
// handed back after a restart) in the same Backing that CreateMemfdBacking
// returns: Reclaim truncates, unmaps and closes.
std::unique_ptr<Backing> WrapMemfdBacking(UniqueFd fd, void* addr, uint64_t size,
                                          uint64_t page_size, std::string kind);

// True when the running kernel accepts MFD_NOEXEC_SEAL (probed once).
bool KernelHasNoexecSeal();

}  // namespace cxlpool
