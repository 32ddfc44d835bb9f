// SharedSlicePool: leases on a CXL device that several hosts of the rack
// share ([[cluster.shared]], docs/cluster.md). Each lease is one slice this
// host owns: the client gets the device's fd and maps the slice at its
// offset on the device (LeaseInfo.device_offset). The slices come from a
// SliceSource (the cluster member's slice stock in the daemon, a fake in
// tests): owned by this host under its live epoch, zeroed since they last
// changed hands or held a lease.
//
// A lease is at most one slice and takes a whole one (the device's slice
// size, 1 GiB unless configured): RoundSize says so. Its capacity is the
// device's slices, all of them; what this host owns now is the cluster's
// business, so a build fails (RESOURCE_EXHAUSTED, UNAVAILABLE while the host
// is fenced) when no owned slice is ready within the source's wait, and
// placement moves on to the next candidate.
//
// An fd of the device reaches all of it, not only the lease's slice: a
// devdax device cannot be cut per range. So leases here are served only to
// callers who ask for the "shared" tier, and an operator gives that tier
// (quota rules, docs/cluster.md) only to tenants trusted with the device.
//
// Thread safety: as Pool. Build and backings' Reclaim on worker threads;
// the SliceSource must be thread safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "cxlpool/common/status.h"
#include "cxlpool/common/unique_fd.h"
#include "pool/pool.h"

namespace cxlpool {

class SliceSource {
 public:
  struct Slice {
    uint32_t index = 0;
    uint64_t device_offset = 0;  // where it starts on the device (header included)
    uint64_t length = 0;
  };
  virtual ~SliceSource() = default;
  // An owned, zeroed, unused slice of the shared device at `path`.
  // UNAVAILABLE: this host is fenced or has not joined yet;
  // RESOURCE_EXHAUSTED: none became ready within the source's bounded wait.
  virtual Result<Slice> Take(const std::string& path) = 0;
  // A lease on slice `index` ended: the source zeroes it before it hands
  // it out again.
  virtual void Return(const std::string& path, uint32_t index) = 0;
  // A lease recovered from the journal sits on slice `index` (a restart):
  // the source keeps it for that lease.
  virtual void Hold(const std::string& path, uint32_t index) = 0;
};

class SharedSlicePool final : public Pool {
 public:
  // Pool name "shared:<file name of path>", quota tier "shared", node kind
  // "cxl", no NUMA node (-1). `capacity`: the device's slices, in bytes.
  SharedSlicePool(std::string path, uint64_t slice_bytes, uint64_t capacity, SliceSource* source);

  static std::string PoolName(const std::string& path);

  const char* backing() const override { return "shared-slice"; }
  uint64_t page_size() const override { return kAlign; }
  // One slice, whatever was asked up to its size.
  Result<uint64_t> RoundSize(uint64_t requested, bool hugetlb) const override;
  Result<std::unique_ptr<Backing>> Build(uint64_t size, bool hugetlb,
                                         const FillOffer& offer = {}) const override;

  const std::string& path() const { return path_; }
  uint64_t slice_bytes() const { return slice_bytes_; }
  // Slice `index` stays this host's for a recovered lease's holders (a
  // restart), whether or not the lease is kept.
  void Hold(uint32_t index) const { source_->Hold(path_, index); }
  // The backing of a journalled lease on slice `index` at `device_offset`
  // (a restart): the source holds the slice again; the daemon reopens the
  // device itself.
  Result<std::unique_ptr<Backing>> Recovered(uint32_t index, uint64_t device_offset,
                                             uint64_t size) const;
  // Is `fd` this pool's device (a holder handing a lease back)? The same
  // character device, or the same file (tests and labs).
  Status CheckFd(int fd) const;

  static constexpr uint64_t kAlign = 2ull << 20;

 private:
  Result<std::unique_ptr<Backing>> Wrap(SliceSource::Slice s, uint64_t size) const;
  const std::string path_;
  const uint64_t slice_bytes_;
  SliceSource* source_;
};

}  // namespace cxlpool
