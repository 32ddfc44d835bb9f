// SliceRegistry: the writes that change who owns what, each one etcd
// transaction guarded so that it holds only against the state it was decided
// on. Every write by a host also requires that host's session to be live with
// the epoch it writes (its host key's create_revision): a host whose session
// expired cannot claim, keep or free anything, whatever it believes.
//
// Each write returns true (Claim and Readopt: the slice key's new
// mod_revision, the guard of the next write on it) when it applied, false (0)
// when its guard failed (the state moved: reread and decide again), or an
// error when etcd did not answer. A timed-out write may have applied: rereading tells.
//
// Thread safety: as etcd::Client (any thread).
#pragma once

#include <string>

#include "cxlpool/cluster/cluster_view.h"
#include "cxlpool/cluster/etcd_client.h"
#include "cxlpool/cluster/records.h"

namespace cxlpool::cluster {

class SliceRegistry {
 public:
  SliceRegistry(etcd::Client* etcd, Keys keys) : etcd_(etcd), keys_(std::move(keys)) {}

  const Keys& keys() const { return keys_; }
  etcd::Client* etcd() const { return etcd_; }

  // Everything under the prefix, at one revision.
  Result<ClusterView> Read();

  // The device's slicing: creates its record when no host has yet, else
  // returns the one recorded (which wins over `wanted`). INVALID_ARGUMENT
  // when the recorded one does not fit this host's view of the device
  // (`wanted.size` smaller than the recorded size).
  Result<DeviceRecord> EnsureDevice(const std::string& id, const DeviceRecord& wanted);

  // `s` (free or fenced, as read) for `host` at `epoch`.
  Result<int64_t> Claim(const SliceView& s, const std::string& host, int64_t epoch, int64_t now);
  // An owned slice of `host` back to free.
  Result<bool> Release(const SliceView& s, const std::string& host, int64_t epoch);
  // A slice `host` owned under an earlier epoch, now under `epoch`.
  Result<int64_t> Readopt(const SliceView& s, const std::string& host, int64_t epoch, int64_t now);

  // Records that `epoch` of `host` is down, confirmed by an operator: its
  // quarantined slices become claimable. False while the host has any live
  // session (that epoch or a later one): a live host is not down, and after
  // a rejoin it re-adopts its earlier epoch's slices itself.
  Result<bool> Fence(const FenceRecord& fence);

 private:
  etcd::Client* etcd_;
  Keys keys_;
};

}  // namespace cxlpool::cluster
