// ClusterView: everything under the cluster's prefix read at one revision,
// validated, with each slice's state derived from the hosts and fences.
//
// A slice's state (docs/cluster.md has the picture):
//   free         no slice key: anyone may claim it
//   owned        its owner's session is live with the epoch the slice records
//   quarantined  the recorded epoch is not the owner's live one (the session
//                expired or the host rejoined): that host may still be
//                writing, so no one else may claim it; the owner re-adopts or
//                frees it when it rejoins
//   fenced       quarantined, and an operator confirmed that epoch down
//                (a fence record): anyone may claim it, and zeroes it first
//
// Records that fail validation are left out and listed in `invalid`, with
// the reason; they never count as free capacity.
//
// Thread safety: a value.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "cxlpool/cluster/etcd_client.h"
#include "cxlpool/cluster/records.h"

namespace cxlpool::cluster {

enum class SliceState { kFree, kOwned, kQuarantined, kFenced };
const char* SliceStateName(SliceState s);

struct HostView {
  HostRecord record;
  int64_t epoch = 0;  // the host key's create_revision
  int64_t lease = 0;
};

struct SliceView {
  std::string device;
  uint32_t index = 0;
  SliceState state = SliceState::kFree;
  SliceRecord record;        // empty when free
  int64_t mod_revision = 0;  // 0 when free
};

struct DeviceView {
  std::string id;
  DeviceRecord record;
  std::vector<SliceView> slices;  // every index, in order
};

struct ClusterView {
  int64_t revision = 0;
  std::map<std::string, HostView> hosts;
  std::map<std::string, DeviceView> devices;
  std::map<std::pair<std::string, int64_t>, FenceRecord> fences;
  std::vector<std::string> invalid;  // "key: reason"

  static ClusterView FromKvs(const Keys& keys, const std::vector<etcd::KeyValue>& kvs,
                             int64_t revision);
  // The state a slice with this record is in, given the hosts and fences.
  SliceState Classify(const SliceRecord& r) const;
  // The live epoch of `host`; 0 when it has no session.
  int64_t LiveEpoch(const std::string& host) const;
  size_t CountSlices(SliceState s) const;
};

}  // namespace cxlpool::cluster
