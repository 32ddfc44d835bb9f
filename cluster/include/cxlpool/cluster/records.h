// What cxlpool keeps in etcd, and where (Keys). Every value is JSON; every
// value read back is untrusted: Parse* validates it whole (types, ranges,
// names, sizes) and returns INVALID_ARGUMENT naming the first bad field.
//
//   <prefix>/hosts/<host>                  HostRecord, on the host's session lease;
//                                          its create_revision is the host's epoch
//   <prefix>/devices/<device>              DeviceRecord: how a shared device is sliced
//   <prefix>/slices/<device>/<index>       SliceRecord: the owner and its epoch
//   <prefix>/fences/<host>/<epoch>         FenceRecord: an operator confirmed that
//                                          epoch of the host down
//
// Thread safety: values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cxlpool/cluster/names.h"
#include "cxlpool/common/status.h"

namespace cxlpool::cluster {

inline constexpr uint64_t kSliceAlign = 2ull << 20;  // slices are 2 MiB aligned
inline constexpr uint64_t kDefaultSliceBytes = 1ull << 30;
inline constexpr size_t kMaxRecordBytes = 256 * 1024;

class Keys {
 public:
  explicit Keys(std::string prefix = "/cxlpool/v1");
  const std::string& prefix() const { return prefix_; }
  std::string Hosts() const { return prefix_ + "/hosts/"; }
  std::string Host(std::string_view host) const;
  std::string Devices() const { return prefix_ + "/devices/"; }
  std::string Device(std::string_view device) const;
  std::string Slices() const { return prefix_ + "/slices/"; }
  std::string DeviceSlices(std::string_view device) const;
  std::string Slice(std::string_view device, uint32_t index) const;
  std::string Fences() const { return prefix_ + "/fences/"; }
  std::string Fence(std::string_view host, int64_t epoch) const;

  // The parts of a slice or fence key; nullopt for any other key.
  struct SliceId {
    std::string device;
    uint32_t index = 0;
  };
  std::optional<SliceId> ParseSlice(std::string_view key) const;
  std::optional<std::pair<std::string, int64_t>> ParseFence(std::string_view key) const;
  std::optional<std::string> ParseHost(std::string_view key) const;

 private:
  std::string prefix_;
};

struct PoolSummary {
  int node = -1;
  std::string kind;  // "memfd" / "devdax"
  std::string tier;  // "dram" / "cxl" / ...
  uint64_t capacity = 0;
  uint64_t leased = 0;
  uint64_t reserve = 0;
  uint64_t free = 0;
};

struct GpuSummary {
  int index = -1;
  std::string name;
  std::vector<int> nearest_nodes;
  bool busy = false;  // a client holds leases placed for it
};

struct SharedDeviceSummary {
  std::string id;
  std::string path;
  uint64_t size = 0;
  uint32_t slices_owned = 0;
  uint32_t slices_used = 0;  // owned slices holding leases
};

struct HostRecord {
  std::string host;
  std::string instance;  // the daemon's state directory's id: the same daemon after a restart
  std::string boot_id;   // the kernel's boot id: the same machine and boot
  std::string version;
  int64_t published_at = 0;    // wall seconds
  bool shared_fenced = false;  // granting from shared slices is stopped
  std::vector<PoolSummary> pools;
  std::vector<GpuSummary> gpus;
  std::vector<SharedDeviceSummary> shared_devices;
};

struct DeviceRecord {
  uint64_t size = 0;
  uint64_t slice_bytes = kDefaultSliceBytes;
  uint32_t slices() const { return slice_bytes ? static_cast<uint32_t>(size / slice_bytes) : 0; }
};

struct SliceRecord {
  std::string owner;
  int64_t epoch = 0;
  int64_t since = 0;  // wall seconds of the claim
};

struct FenceRecord {
  std::string host;
  int64_t epoch = 0;
  std::string by;  // who confirmed the host down ("root@admin1")
  int64_t at = 0;  // wall seconds
  std::string reason;
};

std::string ToJson(const HostRecord& r);
std::string ToJson(const DeviceRecord& r);
std::string ToJson(const SliceRecord& r);
std::string ToJson(const FenceRecord& r);
Result<HostRecord> ParseHostRecord(std::string_view json);
Result<DeviceRecord> ParseDeviceRecord(std::string_view json);
Result<SliceRecord> ParseSliceRecord(std::string_view json);
Result<FenceRecord> ParseFenceRecord(std::string_view json);

}  // namespace cxlpool::cluster
