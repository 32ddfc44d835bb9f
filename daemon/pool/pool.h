// Pools: one per NUMA node with memory (GPU memory, and memory of unknown kind
// unless enabled, excluded: BuildPools) and one per
// configured devdax region. A pool knows its capacity, does the accounting
// for admission control, builds backings, and (memfd pools) owns a warm
// reserve of prefaulted extents (pool/extent_reserve.h).
//
// Accounting: used = reserved (builds in flight for leases) + leased + the
// extent reserve's bytes (ready, building, retiring; memfd pools only) +
// reclaiming (ended leases whose memory a worker is still truncating and
// unmapping). Admission never lets used exceed capacity; it retires ready
// reserve extents to make room for a lease.
//
// Thread safety: accounting and reserve methods belong to the event-loop
// thread. RoundSize/Build and the getters of fixed facts are const and safe
// on worker threads; Build never touches accounting.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cxlpool/common/fs.h"
#include "cxlpool/topology/topology.h"
#include "pool/backing.h"
#include "pool/devdax.h"
#include "pool/extent_reserve.h"
#include "pool/pool_options.h"

namespace cxlpool {

class Pool {
 public:
  // `quota_tier`: what its leases are charged under (lease/quota.h): the
  // node kind for memfd pools, "devdax" for devdax pools.
  Pool(std::string name, int numa_node, std::string kind, std::optional<int> tier,
       uint64_t capacity, std::string quota_tier);
  virtual ~Pool();
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  const std::string& name() const { return name_; }
  int numa_node() const { return numa_node_; }
  const std::string& kind() const { return kind_; }  // node kind: dram, cxl, ...
  // The tier quotas charge this pool's leases under (fixed at construction).
  const std::string& quota_tier() const { return quota_tier_; }
  std::optional<int> memory_tier() const { return tier_; }
  virtual const char* backing() const = 0;  // "memfd" / "devdax"
  virtual uint64_t page_size() const = 0;
  virtual bool dynamic_region() const { return false; }
  // [pools.node.N] long_term_pins (placement rule 4); devdax: kAuto.
  virtual LongTermPinPolicy long_term_pin_policy() const { return LongTermPinPolicy::kAuto; }

  // The size a lease of `requested` bytes really gets (page or alignment
  // rounding). INVALID_ARGUMENT on 0 or overflow, RESOURCE_EXHAUSTED when it
  // can never fit.
  virtual Result<uint64_t> RoundSize(uint64_t requested, bool hugetlb) const = 0;
  // Builds one backing of `size` (already rounded) for a request. Worker
  // threads. A memfd pool hands a large build's prefault to `offer`
  // (MemfdSpec::offer_fill) so idle workers can help; others ignore it.
  virtual Result<std::unique_ptr<Backing>> Build(uint64_t size, bool hugetlb,
                                                 const FillOffer& offer = {}) const = 0;

  // ---- accounting (event-loop thread) ----
  uint64_t capacity() const { return capacity_; }
  uint64_t leased_bytes() const { return leased_; }
  uint64_t reserved_bytes() const { return reserved_; }
  uint64_t reclaiming_bytes() const { return reclaiming_; }
  // The extent reserve's own bytes (ready + building + retiring); 0 without one.
  uint64_t reserve_bytes() const;
  uint64_t used_bytes() const { return leased_ + reserved_ + reclaiming_ + reserve_bytes(); }
  // 0 when a moved-in lease (MoveLeaseIn) took the pool past its capacity.
  uint64_t free_bytes() const { return used_bytes() >= capacity_ ? 0 : capacity_ - used_bytes(); }
  uint32_t lease_count() const { return lease_count_; }

  // Reserves room for a lease being built. False (nothing changed) if it
  // would exceed capacity even after retiring ready reserve extents.
  bool TryReserve(uint64_t bytes);
  void CancelReserve(uint64_t bytes);
  // The build succeeded: reserved -> leased. `new_lease` false: more bytes
  // of a lease the pool counts already (an extent of a split lease moved in).
  void CommitReserve(uint64_t bytes, bool new_lease = true);
  // A lease ended: its bytes move from leased to reclaiming and stay used
  // until its reclaim finishes on a worker; then ReleaseLeased frees them.
  void BeginReclaim(uint64_t bytes);
  void ReleaseLeased(uint64_t bytes);  // reclaiming -> free
  // A lease's pages left this pool's node (its holder's long-term pin
  // migrated them): its bytes move to the pool of the node holding them
  // now. MoveLeaseIn counts them even beyond the capacity: they are there
  // already; admission then sees the pool as full. `whole_lease` false:
  // some of the lease's bytes stay (or were) here already (one extent of a
  // lease split between pools), so the pool's lease count stays.
  void MoveLeaseOut(uint64_t bytes, bool whole_lease = true);
  void MoveLeaseIn(uint64_t bytes, bool whole_lease = true);
  // Does a build of `bytes` that TryReserve just refused fit once every
  // reclaim in flight has finished (and ready reserve extents are retired)? False
  // when nothing is being reclaimed: waiting would not help.
  bool FitsAfterReclaims(uint64_t bytes) const;
  // A new capacity (config reload). False, nothing changed, when leases,
  // builds and reclaims in flight already use more; ready reserve extents are retired to fit.
  bool SetCapacity(uint64_t capacity);

  // ---- the extent reserve (event-loop thread) ----
  // Retires ready reserve extents (largest first) until `bytes` fit; true if they do.
  bool MakeRoom(uint64_t bytes);
  // Retires, here on the loop, the reserve extents queued for retirement
  // (never exposed ones: stock, or a grant's extents that did not go out).
  void RetireReserveNow();
  // The pool's warm reserve of extents, or null (devdax pools).
  virtual ExtentReserve* reserve() { return nullptr; }
  virtual const ExtentReserve* reserve() const { return nullptr; }

 protected:
  // After a capacity change (percent watermarks follow it).
  virtual void CapacityChanged() {}

 private:
  std::string name_;
  int numa_node_;
  std::string kind_;
  std::optional<int> tier_;
  std::string quota_tier_;
  uint64_t capacity_;
  uint64_t leased_ = 0;
  uint64_t reserved_ = 0;
  uint64_t reclaiming_ = 0;
  uint32_t lease_count_ = 0;
};

// A NUMA node's pool of memfds.
class MemfdPool final : public Pool {
 public:
  struct Options {
    bool bind = true;      // mbind to the node (false for a foreign topology)
    bool prefault = true;  // MemfdSpec::prefault
    ShmemThp shmem_thp = ShmemThp::kUnknown;
    const FileSystem* fs = nullptr;  // live hugepage counters; may be null
  };
  MemfdPool(const NumaNode& node, uint64_t capacity, const PoolConfig& cfg, Options opts);

  const char* backing() const override { return "memfd"; }
  uint64_t page_size() const override { return cfg_.hugetlb ? (2ull << 20) : 4096; }
  Result<uint64_t> RoundSize(uint64_t requested, bool hugetlb) const override;
  Result<std::unique_ptr<Backing>> Build(uint64_t size, bool hugetlb,
                                         const FillOffer& offer = {}) const override;
  ExtentReserve* reserve() override { return reserve_.get(); }
  const ExtentReserve* reserve() const override { return reserve_.get(); }
  // New watermarks (config reload); INVALID_ARGUMENT (nothing changed) when
  // low > high. Ready stock above the new high watermark is retired.
  Status SetReserveWatermarks(const CapacitySpec& low, const CapacitySpec& high);
  LongTermPinPolicy long_term_pin_policy() const override { return cfg_.long_term_pins; }
  const PoolConfig& config() const { return cfg_; }
  // Its memory is bound to its node (false for a foreign topology).
  bool binds() const { return opts_.bind; }

 private:
  // Free 2 MiB pages on the node right now (from sysfs), or 0.
  uint64_t FreeHugepages() const;
  void CapacityChanged() override;
  PoolConfig cfg_;
  Options opts_;
  std::unique_ptr<ExtentReserve> reserve_;
};

// A devdax pool: a dynamic region carved per lease, or a static device
// leased whole.
class DevdaxPool final : public Pool {
 public:
  DevdaxPool(DaxControl* control, const DaxRegionState& region, std::string kind,
             std::optional<int> tier, uint64_t align);

  const char* backing() const override { return "devdax"; }
  uint64_t page_size() const override { return align_; }
  bool dynamic_region() const override { return dynamic_; }
  Result<uint64_t> RoundSize(uint64_t requested, bool hugetlb) const override;
  Result<std::unique_ptr<Backing>> Build(uint64_t size, bool hugetlb,
                                         const FillOffer& offer = {}) const override;

  // ---- restart (lease/lease_restart.cc) ----
  // The device a journalled lease of this pool holds: `journalled` for a
  // dynamic region's sub-device; a static pool's own device (older journals
  // did not record it).
  std::string LeaseDevice(const std::string& journalled) const;
  // Does `device` exist now (the seam's DeviceNumber)?
  bool DeviceExists(const std::string& device) const;
  // Its device number now (st_rdev of /dev/<device>).
  Result<uint64_t> CurrentDeviceNumber(const std::string& device) const;
  // A dynamic region's capacity is what was not carved at start. A
  // sub-device the previous daemon carved for a journalled lease is counted
  // back in (the lease then reserves it again, or is dropped and destroys it).
  void CountCarvedAtStart(uint64_t bytes);
  // The backing of a recovered lease: `fd` invalid while it awaits its
  // holder's RECLAIM, else a device fd checked with CheckFd. A carved
  // sub-device is destroyed when the backing is reclaimed.
  std::unique_ptr<DevdaxBacking> Recovered(const std::string& device, uint64_t size, uint64_t rdev,
                                           UniqueFd fd) const;
  // Is `fd` the device `device` (journalled device number `rdev`)? See CheckDaxFd.
  Status CheckFd(int fd, const std::string& device, uint64_t rdev) const;
  // A dynamic region's sub-devices now, with their sizes (the region's seed,
  // of size 0, left out): what the journal names is checked against them.
  std::vector<std::pair<std::string, uint64_t>> CarvedDevices() const;
  // Destroys a sub-device no lease holds (one the journal lost). Fails
  // while a process still has it open.
  Status DestroyDevice(const std::string& device) const;

 private:
  DaxControl* control_;
  std::string region_;
  std::string device_;  // static: the device leased whole
  bool dynamic_;
  uint64_t align_;
};

struct PoolBuildOptions {
  bool bind = true;                // the topology is this machine's
  bool prefault = true;            // false: grants are faulted on first touch
                                   // (in-process harnesses only)
  const FileSystem* fs = nullptr;  // THP mode and hugepage counters
  DaxControl* dax = nullptr;       // required when config.devdax is not empty
};

// One MemfdPool per node with memory (not kind gpu, not disabled, and not
// of unknown kind unless its [pools.node.N] table says enabled = true), then
// one DevdaxPool per config.devdax entry. INVALID_ARGUMENT / NOT_FOUND when
// a configured devdax region does not exist. `warnings` gets overrides for
// nodes that do not exist, and each node left out with why and how to
// include it.
Result<std::vector<std::unique_ptr<Pool>>> BuildPools(const Topology& topo,
                                                      const PoolsConfig& config,
                                                      const PoolBuildOptions& options,
                                                      std::vector<std::string>* warnings);

}  // namespace cxlpool
