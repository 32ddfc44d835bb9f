// HostArena: pinned host memory for frameworks, served from cxlpool leases.
//
// The allocation policy behind cxlpool.torch's PyTorch host allocator and
// cxlpool-bench's P7 figure:
//   * a request of small_max bytes or more gets its own lease of exactly
//     that size (the daemon rounds it up to its page size, nothing more),
//     placed near the given GPU (without that hint when the daemon does not
//     know the GPU) and registered with CUDA on it;
//   * smaller requests are carved out of slab leases (slab_bytes each, one
//     set per device) at `align` granularity, first fit, neighbours merged on
//     free;
//   * Free returns a large block's lease to the daemon at once; a slab goes
//     back once it is empty, except keep_empty_slabs per device that stay
//     for reuse (ReleaseEmptySlabs drops those too).
// A PyTorch CachingHostAllocator instead rounds every request up to a power
// of two and keeps what was freed.
//
// Errors are values: Allocate returns the daemon's refusal (quota, full
// pool), UNAVAILABLE when it is gone, or the CUDA registration's error when
// registration is required and failed.
//
// Thread safety: every member may be called from any thread; one mutex
// guards the block tables. Daemon round trips (a new lease, a release) run
// outside it.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "cxlpool/client.hpp"
#include "cxlpool/common/thread_annotations.h"

namespace cxlpool::hostalloc {

struct ArenaOptions {
  uint64_t small_max = 1ull << 20;   // requests below this are sub-allocated
  uint64_t slab_bytes = 2ull << 20;  // size of one slab lease (>= small_max)
  uint64_t align = 512;              // sub-allocation granularity (power of two)
  bool cuda_register = true;         // register every lease on its device (device >= 0)
  // A lease whose registration failed is released and the allocation fails
  // with the registration's error (pinned memory that is not pinned would
  // be a silent slowdown).
  bool require_registration = true;
  int keep_empty_slabs = 1;  // per device
  std::string label = "hostalloc";
  std::vector<std::string> tier_preference;
};

struct ArenaStats {
  uint64_t requested_bytes = 0;  // live blocks, as asked for
  uint64_t leased_bytes = 0;     // bytes of every live lease (large + slabs)
  uint64_t large_leases = 0;
  uint64_t slabs = 0;
  uint64_t small_blocks = 0;
  uint64_t allocations = 0;  // total served
  uint64_t failures = 0;     // total refused
};

class HostArena {
 public:
  HostArena(Client client, ArenaOptions options);
  ~HostArena();  // releases every lease (live blocks become invalid)
  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;

  // `size` bytes near GPU `device` (-1: no GPU: no placement hint, no
  // registration). size 0: INVALID_ARGUMENT.
  ClientResult<void*> Allocate(uint64_t size, int device) EXCLUDES(mu_);
  // Frees a pointer Allocate returned. False (and nothing happens) for any
  // other pointer.
  bool Free(void* ptr) EXCLUDES(mu_);
  // True for a pointer Allocate returned and Free has not taken back.
  bool Owns(const void* ptr) const EXCLUDES(mu_);
  // The lease id behind a live pointer, 0 if not ours.
  uint64_t LeaseIdOf(const void* ptr) const EXCLUDES(mu_);
  // Releases the empty slabs kept for reuse.
  void ReleaseEmptySlabs() EXCLUDES(mu_);
  ArenaStats stats() const EXCLUDES(mu_);
  const ArenaOptions& options() const { return options_; }

 private:
  struct Slab {
    Lease lease;
    int device = -1;
    uint64_t used = 0;
    std::map<uint64_t, uint64_t> free;  // offset -> length, merged
  };
  struct LargeBlock {
    Lease lease;
    uint64_t requested = 0;
  };
  struct SmallBlock {
    Slab* slab = nullptr;
    uint64_t offset = 0;
    uint64_t length = 0;
    uint64_t requested = 0;
  };

  // A daemon round trip: never under mu_.
  ClientResult<Lease> NewLease(uint64_t size, int device, const char* what) EXCLUDES(mu_);
  // A block of `length` in an existing slab of `device`.
  void* CarveLocked(uint64_t length, uint64_t requested, int device) REQUIRES(mu_);
  static bool TakeRange(Slab* s, uint64_t length, uint64_t* offset);
  static void ReturnRange(Slab* s, uint64_t offset, uint64_t length);

  static constexpr int kMaxDevices = 64;
  const ArenaOptions options_;
  Client client_;
  std::atomic<bool> unknown_gpu_[kMaxDevices] = {};
  mutable Mutex mu_;
  std::unordered_map<const void*, LargeBlock> large_ GUARDED_BY(mu_);
  std::unordered_map<const void*, SmallBlock> small_ GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Slab>> slabs_ GUARDED_BY(mu_);  // the Slabs too
  uint64_t requested_bytes_ GUARDED_BY(mu_) = 0;
  uint64_t allocations_ GUARDED_BY(mu_) = 0;
  uint64_t failures_ GUARDED_BY(mu_) = 0;
};

}  // namespace cxlpool::hostalloc
