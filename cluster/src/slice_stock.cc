#include "cxlpool/cluster/slice_stock.h"

#include "cxlpool/common/log.h"

namespace cxlpool::cluster {

SliceStock::SliceStock(SliceRegistry* registry, SharedDevice* device, DeviceRecord record,
                       std::string host, StockOptions options, const Clock* clock,
                       std::set<uint32_t> used_after_restart, std::function<bool()> certainly_live)
    : registry_(registry),
      device_(device),
      record_(record),
      host_(std::move(host)),
      options_(options),
      clock_(clock),
      certainly_live_(std::move(certainly_live)),
      used_after_restart_(std::move(used_after_restart)) {}

Result<ReconcileStep> SliceStock::Reconcile(const ClusterView& view, int64_t epoch) {
  ReconcileStep step;
  if (epoch == 0) {
    Fence();
    return step;
  }
  if (view.devices.count(device_->id()) == 0)
    return Status(Code::kNotFound, "shared device " + device_->id() + " has no record in etcd");
  uint64_t fences_before;
  {
    MutexLock lock(mu_);
    fences_before = fences_;
  }
  Drop(view, epoch, &step);
  Readopt(view, epoch, &step);
  AdoptStray(view, epoch);
  FindLost(view, &step);
  {
    MutexLock lock(mu_);
    // A loss declared while this round ran keeps the stock fenced.
    if (fences_ != fences_before) return step;
    epoch_ = epoch;
  }
  // Returned slices are zeroed here, before another Take may hand them out.
  std::vector<uint32_t> dirty;
  {
    MutexLock lock(mu_);
    for (const auto& [index, o] : owned_)
      if (!o.used && !o.zeroed) dirty.push_back(index);
  }
  for (uint32_t index : dirty) {
    if (!device_->Zero(uint64_t{index} * record_.slice_bytes, record_.slice_bytes).ok()) continue;
    MutexLock lock(mu_);
    auto it = owned_.find(index);
    if (it != owned_.end() && !it->second.used) it->second.zeroed = true;
  }
  Claim(view, epoch, &step);
  ReleaseIdle(epoch, &step);
  return step;
}

// Slices we hold that the view says are not ours at this epoch: after a
// rejoin they are re-adopted below; otherwise someone fenced us.
void SliceStock::Drop(const ClusterView& view, int64_t epoch, ReconcileStep* step) {
  const auto& slices = view.devices.at(device_->id()).slices;
  MutexLock lock(mu_);
  for (auto it = owned_.begin(); it != owned_.end();) {
    const SliceView* s = it->first < slices.size() ? &slices[it->first] : nullptr;
    const bool ours_now = s != nullptr && s->record.owner == host_ && s->record.epoch == epoch;
    const bool ours_before = s != nullptr && s->record.owner == host_ && s->record.epoch < epoch;
    if (ours_now) {
      ++it;
      continue;
    }
    if (ours_before) {
      if (it->second.used) used_after_restart_.insert(it->first);
    } else {
      CXLPOOL_LOG(kError) << "cluster: slice " << device_->id() << "/" << it->first
                          << " is no longer owned by " << host_ << " (fenced by an operator?)"
                          << (it->second.used ? "; the lease on it is revoked" : "");
      if (it->second.used) {
        step->lost.push_back(it->first);
        lost_.insert(it->first);
      }
      ++step->dropped;
    }
    it = owned_.erase(it);
  }
}

void SliceStock::Readopt(const ClusterView& view, int64_t epoch, ReconcileStep* step) {
  for (const auto& s : view.devices.at(device_->id()).slices) {
    if (s.mod_revision == 0 || s.record.owner != host_ || s.record.epoch >= epoch) continue;
    bool keep;
    {
      MutexLock lock(mu_);
      keep = used_after_restart_.count(s.index) != 0;
    }
    auto rev = registry_->Readopt(s, host_, epoch, clock_->WallSeconds());
    if (!rev.ok()) return;  // etcd did not answer: the next round tries again
    if (*rev == 0) {
      ++step->races;
      continue;
    }
    if (keep) {
      MutexLock lock(mu_);
      // Its lease may have ended while the transaction ran (Return found
      // nothing owned to mark): then it is stock, zeroed before use.
      if (used_after_restart_.erase(s.index) != 0) {
        owned_[s.index] = Owned{true, true, 0, *rev};
      } else {
        owned_[s.index] = Owned{false, false, clock_->MonotonicNs(), *rev};
      }
      ++step->readopted;
      continue;
    }
    SliceView now = s;
    now.record.epoch = epoch;
    now.mod_revision = *rev;
    auto released = registry_->Release(now, host_, epoch);
    if (released.ok() && *released) {
      ++step->freed_stale;
    } else {
      // Still ours at this epoch: keep it as stock (zeroed before use).
      MutexLock lock(mu_);
      owned_[s.index] = Owned{false, false, clock_->MonotonicNs(), *rev};
    }
  }
}

// Slices the view says are ours at this epoch but the stock does not hold:
// a claim or re-adoption whose answer was lost (a timeout after etcd applied
// it). Taken as stock, zeroed before use (or as used when the journal says).
void SliceStock::AdoptStray(const ClusterView& view, int64_t epoch) {
  MutexLock lock(mu_);
  for (const auto& s : view.devices.at(device_->id()).slices) {
    if (s.mod_revision == 0 || s.record.owner != host_ || s.record.epoch != epoch) continue;
    if (owned_.count(s.index)) continue;
    const bool used = used_after_restart_.erase(s.index) != 0;
    owned_[s.index] = Owned{used, used, clock_->MonotonicNs(), s.mod_revision};
  }
}

// Slices our leases sat on before a restart or a rejoin that someone else
// owns now, or that nobody does: not ours to re-adopt, and not our leases'.
void SliceStock::FindLost(const ClusterView& view, ReconcileStep* step) {
  const auto& slices = view.devices.at(device_->id()).slices;
  MutexLock lock(mu_);
  for (auto it = used_after_restart_.begin(); it != used_after_restart_.end();) {
    const SliceView* s = *it < slices.size() ? &slices[*it] : nullptr;
    if (s != nullptr && s->mod_revision != 0 && s->record.owner == host_) {
      ++it;
      continue;
    }
    CXLPOOL_LOG(kError) << "cluster: slice " << device_->id() << "/" << *it << " held a lease of "
                        << host_ << " but is "
                        << (s == nullptr || s->mod_revision == 0 ? std::string("free")
                                                                 : "owned by " + s->record.owner)
                        << " now; the lease on it is revoked";
    step->lost.push_back(*it);
    lost_.insert(*it);
    it = used_after_restart_.erase(it);
  }
}

void SliceStock::Claim(const ClusterView& view, int64_t epoch, ReconcileStep* step) {
  for (const auto& s : view.devices.at(device_->id()).slices) {
    {
      MutexLock lock(mu_);
      if (epoch_ != epoch || ReadyCount() >= options_.claim_ahead) return;
    }
    if (s.state != SliceState::kFree && s.state != SliceState::kFenced) continue;
    {
      MutexLock lock(mu_);
      if (lost_.count(s.index)) continue;  // a revoked lease may still hold it
    }
    auto rev = registry_->Claim(s, host_, epoch, clock_->WallSeconds());
    if (!rev.ok()) return;  // etcd did not answer: the next round tries again
    if (*rev == 0) {
      ++step->races;
      continue;
    }
    // Zeroed before any lease of ours can see what the last owner left.
    const bool zeroed =
        device_->Zero(uint64_t{s.index} * record_.slice_bytes, record_.slice_bytes).ok();
    MutexLock lock(mu_);
    owned_[s.index] = Owned{false, zeroed, clock_->MonotonicNs(), *rev};
    ++step->claimed;
  }
}

void SliceStock::ReleaseIdle(int64_t epoch, ReconcileStep* step) {
  const int64_t now = clock_->MonotonicNs();
  const int64_t idle_ns = std::chrono::nanoseconds(options_.idle_release).count();
  std::vector<std::pair<uint32_t, int64_t>> candidates;
  {
    MutexLock lock(mu_);
    uint32_t ready = ReadyCount();
    for (const auto& [index, o] : owned_) {
      if (ready <= options_.claim_ahead) break;
      if (o.used || !o.zeroed || now - o.free_since_ns < idle_ns) continue;
      candidates.emplace_back(index, o.mod_revision);
      --ready;
    }
  }
  for (auto [index, rev] : candidates) {
    {
      MutexLock lock(mu_);
      auto it = owned_.find(index);
      if (it == owned_.end() || it->second.used) continue;
      it->second.zeroed = false;  // out of Take's reach while it goes
    }
    auto r = ReleaseOwned(index, rev, epoch);
    MutexLock lock(mu_);
    if (r.ok() && *r) {
      owned_.erase(index);
      ++step->released;
    } else {
      ++step->races;
    }
  }
}

Result<bool> SliceStock::ReleaseOwned(uint32_t index, int64_t mod_revision, int64_t epoch) {
  SliceView s;
  s.device = device_->id();
  s.index = index;
  s.record = SliceRecord{host_, epoch, 0};
  s.mod_revision = mod_revision;
  return registry_->Release(s, host_, epoch);
}

Result<SliceGrant> SliceStock::Take() {
  MutexLock lock(mu_);
  if (epoch_ == 0 || (certainly_live_ && !certainly_live_()))
    return Status(Code::kUnavailable, "cluster session lost: no grants from shared device " +
                                          device_->id() + " until it rejoins");
  for (auto& [index, o] : owned_) {
    if (o.used || !o.zeroed) continue;
    o.used = true;
    return SliceGrant{device_->id(), index,
                      SharedDevice::DeviceOffset(uint64_t{index} * record_.slice_bytes),
                      record_.slice_bytes, epoch_};
  }
  return Status(Code::kResourceExhausted, "no ready slice of shared device " + device_->id());
}

void SliceStock::Return(uint32_t index) {
  MutexLock lock(mu_);
  if (lost_.count(index)) return;
  used_after_restart_.erase(index);  // ended while a rejoin was re-adopting it
  auto it = owned_.find(index);
  if (it == owned_.end()) return;
  it->second.used = false;
  it->second.zeroed = false;  // the next Reconcile zeroes it
  it->second.free_since_ns = clock_->MonotonicNs();
}

void SliceStock::ForgetLost(uint32_t index) {
  MutexLock lock(mu_);
  lost_.erase(index);
}

uint32_t SliceStock::ReleaseUnused(int64_t epoch) {
  std::vector<std::pair<uint32_t, int64_t>> unused;
  {
    MutexLock lock(mu_);
    for (const auto& [index, o] : owned_)
      if (!o.used) unused.emplace_back(index, o.mod_revision);
  }
  uint32_t n = 0;
  for (auto [index, rev] : unused) {
    auto r = ReleaseOwned(index, rev, epoch);
    if (!r.ok() || !*r) continue;
    MutexLock lock(mu_);
    owned_.erase(index);
    ++n;
  }
  return n;
}

void SliceStock::Fence() {
  MutexLock lock(mu_);
  epoch_ = 0;
  ++fences_;
}

bool SliceStock::fenced() const {
  MutexLock lock(mu_);
  return epoch_ == 0;
}

uint32_t SliceStock::owned() const {
  MutexLock lock(mu_);
  return static_cast<uint32_t>(owned_.size());
}

uint32_t SliceStock::used() const {
  MutexLock lock(mu_);
  uint32_t n = 0;
  for (const auto& [i, o] : owned_) n += o.used;
  return n;
}

std::set<uint32_t> SliceStock::used_slices() const {
  MutexLock lock(mu_);
  std::set<uint32_t> out = used_after_restart_;
  for (const auto& [i, o] : owned_)
    if (o.used) out.insert(i);
  return out;
}

uint32_t SliceStock::ReadyCount() const {
  uint32_t n = 0;
  for (const auto& [i, o] : owned_) n += !o.used && o.zeroed;
  return n;
}

}  // namespace cxlpool::cluster
