#include "cxlpool/cluster/slice_registry.h"

namespace cxlpool::cluster {

using etcd::Compare;
using etcd::TxnOp;

Result<ClusterView> SliceRegistry::Read() {
  auto r = etcd_->GetPrefix(keys_.prefix() + "/");
  if (!r.ok()) return r.status();
  return ClusterView::FromKvs(keys_, r->kvs, r->revision);
}

Result<DeviceRecord> SliceRegistry::EnsureDevice(const std::string& id,
                                                 const DeviceRecord& wanted) {
  CXLPOOL_RETURN_IF_ERROR(CheckName("device", id));
  const std::string key = keys_.Device(id);
  auto txn =
      etcd_->Txn({Compare::Absent(key)}, {TxnOp::Put(key, ToJson(wanted))}, {TxnOp::Get(key)});
  if (!txn.ok()) return txn.status();
  if (txn->succeeded) return wanted;
  if (txn->gets.empty() || txn->gets[0].kvs.empty())
    return Status(Code::kUnavailable, "device " + id + ": record vanished, retry");
  auto recorded = ParseDeviceRecord(txn->gets[0].kvs[0].value);
  if (!recorded.ok()) return recorded.status();
  if (recorded->size > wanted.size)
    return Status(Code::kInvalidArgument,
                  "device " + id + ": recorded as " + std::to_string(recorded->size) +
                      " bytes, this host sees " + std::to_string(wanted.size));
  return recorded;
}

Result<int64_t> SliceRegistry::Claim(const SliceView& s, const std::string& host, int64_t epoch,
                                     int64_t now) {
  const std::string key = keys_.Slice(s.device, s.index);
  std::vector<Compare> guard{Compare::CreateRevision(keys_.Host(host), epoch)};
  if (s.state == SliceState::kFree) {
    guard.push_back(Compare::Absent(key));
  } else if (s.state == SliceState::kFenced) {
    guard.push_back(Compare::ModRevision(key, s.mod_revision));
    guard.push_back(Compare::Present(keys_.Fence(s.record.owner, s.record.epoch)));
    // And the fenced epoch is not the owner's live session.
    guard.push_back({keys_.Host(s.record.owner),
                     Compare::Target::kCreateRevision,
                     Compare::Result::kNotEqual,
                     s.record.epoch,
                     {}});
  } else {
    return Status(Code::kInvalidArgument, std::string("slice ") + key + " is " +
                                              SliceStateName(s.state) + ", not claimable");
  }
  auto txn = etcd_->Txn(guard, {TxnOp::Put(key, ToJson(SliceRecord{host, epoch, now}))});
  if (!txn.ok()) return txn.status();
  return txn->succeeded ? txn->revision : 0;
}

Result<bool> SliceRegistry::Release(const SliceView& s, const std::string& host, int64_t epoch) {
  if (s.record.owner != host || s.record.epoch != epoch)
    return Status(Code::kInvalidArgument, "slice " + keys_.Slice(s.device, s.index) +
                                              " is not owned by this epoch of " + host);
  const std::string key = keys_.Slice(s.device, s.index);
  auto txn = etcd_->Txn(
      {Compare::CreateRevision(keys_.Host(host), epoch), Compare::ModRevision(key, s.mod_revision)},
      {TxnOp::Delete(key)});
  if (!txn.ok()) return txn.status();
  return txn->succeeded;
}

Result<int64_t> SliceRegistry::Readopt(const SliceView& s, const std::string& host, int64_t epoch,
                                       int64_t now) {
  if (s.record.owner != host || s.record.epoch >= epoch)
    return Status(Code::kInvalidArgument, "slice " + keys_.Slice(s.device, s.index) +
                                              " is not an earlier epoch's of " + host);
  const std::string key = keys_.Slice(s.device, s.index);
  auto txn = etcd_->Txn(
      {Compare::CreateRevision(keys_.Host(host), epoch), Compare::ModRevision(key, s.mod_revision)},
      {TxnOp::Put(key, ToJson(SliceRecord{host, epoch, now}))});
  if (!txn.ok()) return txn.status();
  return txn->succeeded ? txn->revision : 0;
}

Result<bool> SliceRegistry::Fence(const FenceRecord& fence) {
  CXLPOOL_RETURN_IF_ERROR(CheckName("host", fence.host));
  if (fence.epoch <= 0) return Status(Code::kInvalidArgument, "fence: epoch must be positive");
  if (fence.by.empty()) return Status(Code::kInvalidArgument, "fence: who confirms it?");
  const std::string key = keys_.Fence(fence.host, fence.epoch);
  // A host with any session is not down: after a rejoin its earlier epoch's
  // slices may still carry its leases until it re-adopts them.
  auto txn = etcd_->Txn({Compare::Absent(keys_.Host(fence.host)), Compare::Absent(key)},
                        {TxnOp::Put(key, ToJson(fence))},
                        {TxnOp::Get(keys_.Host(fence.host)), TxnOp::Get(key)});
  if (!txn.ok()) return txn.status();
  if (txn->succeeded) return true;
  // Already fenced is done, not a failure.
  if (txn->gets.size() == 2 && !txn->gets[1].kvs.empty()) return true;
  return false;
}

}  // namespace cxlpool::cluster
