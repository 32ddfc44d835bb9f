// The client side of tiering (docs/protocol.md, "Tiering"): copy helpers
// that count bytes per range, hints, the batched signal sender, per-lease
// settings, and the cooperative migration's safe point. ClientCore and
// LeaseState methods; their locks and threads are described in
// client_core.h.
#include <fcntl.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "client_core.h"
#include "cxlpool/common/log.h"
#include "cxlpool/proto/codec.h"

namespace cxlpool::detail {
namespace {

constexpr int kMaxSignalsPerFrame = 4096;

uint64_t EnvU64(const char* name, uint64_t fallback, uint64_t max) {
  const char* e = std::getenv(name);
  if (e == nullptr || *e == '\0') return fallback;
  char* end = nullptr;
  unsigned long long v = std::strtoull(e, &end, 10);
  if (end == e || *end != '\0' || v > max) return fallback;
  return v;
}

uint64_t SignalIntervalMs() { return EnvU64("CXLPOOL_SIGNAL_INTERVAL_MS", 1000, 3600000); }
uint64_t SignalThreshold() { return EnvU64("CXLPOOL_SIGNAL_THRESHOLD", 256ull << 20, UINT64_MAX); }

Status OutsideLease(const char* what, uint64_t id, uint64_t offset, uint64_t len, uint64_t size) {
  return Status(Code::kInvalidArgument, std::string(what) + " [" + std::to_string(offset) + ", " +
                                            std::to_string(offset) + " + " + std::to_string(len) +
                                            ") is outside lease " + std::to_string(id) + " (size " +
                                            std::to_string(size) + " bytes)");
}

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

// ---------------------------------------------------------------- ClientCore

bool ClientCore::HandlePush(const wire::Frame& frame) {
  if (frame.request_id() != 0) return false;
  if (frame.type() == proto::MSG_LEASE_EVENT) {
    HandleEvent(frame);
    return true;
  }
  if (frame.type() == proto::MSG_MIGRATION_EVENT) {
    HandleMigrationEvent(frame);
    return true;
  }
  return false;
}

void ClientCore::HandleMigrationEvent(const wire::Frame& frame) {
  proto::MigrationEvent ev;
  Status s = wire::Decode(frame.payload, &ev);
  if (!s.ok()) {
    CXLPOOL_LOG(kWarning) << "ignoring undecodable migration event: " << s.ToString();
    return;
  }
  MutexLock lock(tier_mu_);
  if (ev.phase() == "prepare") {
    PendingMigration p;
    p.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ev.deadline_ms());
    p.ev = std::move(ev);
    migrations_.push_back(std::move(p));
  } else if (ev.phase() == "cancelled") {
    migrations_.erase(std::remove_if(migrations_.begin(), migrations_.end(),
                                     [&](const PendingMigration& p) {
                                       return p.ev.migration_id() == ev.migration_id();
                                     }),
                      migrations_.end());
    CXLPOOL_LOG(kDebug) << "migration " << ev.migration_id() << " of lease " << ev.lease_id()
                        << " cancelled: " << ev.reason();
  }
}

void ClientCore::StartFlusher() {
  if (flusher_started_.exchange(true)) return;
  flusher_ = std::thread([this] { FlushLoop(); });
}

void ClientCore::FlushLoop() {
  const auto interval = std::chrono::milliseconds(SignalIntervalMs());
  while (!stop_.stopping()) {
    {
      MutexLock lock(tier_mu_);
      const auto until = std::chrono::steady_clock::now() + interval;
      while (!stop_.stopping() && !flush_now_) {
        if (lock.WaitUntil(tier_cv_, until) == std::cv_status::timeout) break;
      }
    }
    if (stop_.stopping()) return;
    Status s = FlushSignals();
    if (!s.ok()) {
      CXLPOOL_LOG(kDebug) << "tiering signals not sent: " << s.ToString();
    }
  }
}

void ClientCore::SignalsRecorded(uint64_t bytes) {
  if (signals_off_.load(std::memory_order_relaxed) || bytes == 0) return;
  StartFlusher();
  static const uint64_t threshold = SignalThreshold();
  uint64_t before = unsent_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  if (before < threshold && before + bytes >= threshold) {
    MutexLock lock(tier_mu_);
    flush_now_ = true;
    tier_cv_.notify_all();
  }
}

void ClientCore::QueueHint(uint64_t lease_id, uint64_t offset, uint64_t len, int hint) {
  if (signals_off_.load()) return;
  {
    MutexLock lock(tier_mu_);
    proto::RangeSignal s;
    s.set_lease_id(lease_id);
    s.set_offset(offset);
    s.set_length(len);
    s.set_hint(static_cast<proto::TieringHint>(hint));
    hints_.push_back(std::move(s));
    flush_now_ = true;
    tier_cv_.notify_all();
  }
  StartFlusher();
}

Status ClientCore::FlushSignals() {
  if (signals_off_.load()) return Status::Ok();
  MutexLock flush(flush_mu_);
  std::vector<proto::RangeSignal> batch;
  std::vector<proto::RangeSignal> hints;
  {
    MutexLock lock(tier_mu_);
    hints.swap(hints_);
    flush_now_ = false;
  }
  unsent_bytes_.store(0, std::memory_order_relaxed);
  std::vector<SignalRecorder::Range> ranges;
  leases_.ForAll([&](uint64_t id, LeaseState* lease) {
    ranges.clear();
    lease->signals().Drain(&ranges);
    for (const auto& r : ranges) {
      proto::RangeSignal s;
      s.set_lease_id(id);
      s.set_offset(r.offset);
      s.set_length(r.length);
      s.set_bytes_read(r.bytes_read);
      s.set_bytes_written(r.bytes_written);
      batch.push_back(std::move(s));
    }
    return true;
  });
  // Hints last: the most recent word of the application wins.
  for (auto& h : hints) batch.push_back(std::move(h));
  if (batch.empty()) return Status::Ok();
  return SendSignals(batch);
}

Status ClientCore::SendSignals(const std::vector<proto::RangeSignal>& batch) {
  for (size_t at = 0; at < batch.size(); at += kMaxSignalsPerFrame) {
    proto::TieringSignalsRequest req;
    size_t end = std::min(batch.size(), at + kMaxSignalsPerFrame);
    for (size_t i = at; i < end; ++i) *req.add_signals() = batch[i];
    Result<wire::Frame> f = Status(Code::kInternal, "not sent");
    {
      MutexLock lock(mu_);
      f = conn_.CallMessage(req);
    }
    proto::TieringSignalsReply rep;
    Status st = f.ok() ? wire::DecodeReply(*f, &rep) : f.status();
    if (st.code() == Code::kUnsupported) {
      signals_off_.store(true);
      CXLPOOL_LOG(kInfo) << "cxlpoold takes no tiering signals (" << st.message()
                         << "); not sending them any more";
      return Status::Ok();
    }
    if (!st.ok()) {
      // One entry that was refused comes back as the frame's error.
      if (end - at == 1 && st.code() != Code::kUnavailable && st.code() != Code::kIo) {
        CXLPOOL_LOG(kWarning) << "tiering signal refused: " << st.ToString();
        continue;
      }
      return st;  // the connection is gone: signals are best effort
    }
    signal_batches_.fetch_add(1);
    for (const auto& r : rep.rejected()) {
      CXLPOOL_LOG(kWarning) << "tiering signal refused: " << r.message();
    }
  }
  return Status::Ok();
}

Status ClientCore::SetLeaseTiering(uint64_t lease_id, std::optional<bool> pin_tier,
                                   std::optional<bool> cooperative_pin) {
  proto::TieringLeaseRequest req;
  req.set_lease_id(lease_id);
  if (pin_tier) req.set_pin_tier(*pin_tier);
  if (cooperative_pin) req.set_cooperative_pin(*cooperative_pin);
  MutexLock lock(mu_);
  Result<wire::Frame> f = conn_.CallMessage(req);
  if (!f.ok()) return f.status();
  proto::TieringLeaseReply rep;
  return wire::DecodeReply(*f, &rep);
}

void ClientCore::ResendTieringLocked() {
  struct Setting {
    uint64_t id;
    bool pinned;
    bool coop;
  };
  std::vector<Setting> settings;
  leases_.ForAll([&](uint64_t id, LeaseState* lease) {
    if (!lease->revoked() && (lease->tier_pinned() || lease->cooperative())) {
      settings.push_back(Setting{id, lease->tier_pinned(), lease->cooperative()});
    }
    return true;
  });
  for (const Setting& s : settings) {
    proto::TieringLeaseRequest req;
    req.set_lease_id(s.id);
    if (s.pinned) req.set_pin_tier(true);
    if (s.coop) req.set_cooperative_pin(true);
    Result<wire::Frame> f = conn_.CallMessage(req);
    proto::TieringLeaseReply rep;
    Status st = f.ok() ? wire::DecodeReply(*f, &rep) : f.status();
    if (!st.ok() && st.code() != Code::kUnsupported) {
      CXLPOOL_LOG(kWarning) << "lease " << s.id << ": tiering settings not restored after the "
                            << "reconnect: " << st.ToString();
    }
  }
}

int ClientCore::MigrationsPending() {
  (void)ProcessEvents();
  MutexLock lock(tier_mu_);
  const auto now = std::chrono::steady_clock::now();
  int n = 0;
  for (const auto& p : migrations_) n += p.deadline > now ? 1 : 0;
  return n;
}

Result<int> ClientCore::SafePoint() {
  (void)ProcessEvents();  // asks that arrived since the last request
  std::vector<PendingMigration> todo;
  {
    MutexLock lock(tier_mu_);
    todo.swap(migrations_);
  }
  int handled = 0;
  for (PendingMigration& p : todo) {
    const uint64_t mid = p.ev.migration_id();
    const uint64_t lease_id = p.ev.lease_id();
    if (std::chrono::steady_clock::now() >= p.deadline) {
      CXLPOOL_LOG(kInfo) << "migration " << mid << " of lease " << lease_id
                         << ": its deadline passed before this safe point; the daemon skips it";
      continue;
    }
    std::vector<LeaseState*> leases;
    leases_.ForId(lease_id, [&](LeaseState* l) { leases.push_back(l); });
    const int64_t t0 = NowNs();
    bool ready = true;
    std::string why;
    std::vector<LeaseState*> dropped;
    for (LeaseState* l : leases) {
      if (!l->DropPins(&why)) {
        ready = false;
        break;
      }
      dropped.push_back(l);
    }
    proto::MigrationReadyRequest req;
    req.set_migration_id(mid);
    req.set_lease_id(lease_id);
    req.set_ready(ready);
    req.set_reason(why);
    Result<wire::Frame> f = Status(Code::kInternal, "not sent");
    {
      MutexLock lock(mu_);
      f = conn_.CallMessage(req);  // answered once the pages moved
    }
    proto::MigrationReadyReply rep;
    Status st = f.ok() ? wire::DecodeReply(*f, &rep) : f.status();
    const bool moved = st.ok() && rep.moved();
    const int node = st.ok() ? rep.numa_node() : -1;
    const std::string detail = st.ok() ? rep.detail() : st.ToString();
    for (LeaseState* l : dropped) l->RestorePins(moved, node, detail);
    const int64_t pause = NowNs() - t0;
    for (LeaseState* l : dropped) l->RecordPause(pause);
    CXLPOOL_LOG(kInfo) << "migration " << mid << " of lease " << lease_id << ": "
                       << (moved ? "moved to node " + std::to_string(node) : "not moved") << " ("
                       << detail << "); pins dropped for " << pause / 1000 << " us";
    ++handled;
  }
  return handled;
}

// ---------------------------------------------------------------- LeaseState

Status LeaseState::CopyIn(uint64_t offset, const void* src, size_t len) {
  if (released_) return Status(Code::kUnavailable, "lease already released");
  if (revoked())
    return Status(Code::kRevoked, "lease " + std::to_string(info_.id) + " was revoked");
  if (len == 0) return Status::Ok();
  if (src == nullptr) return Status(Code::kInvalidArgument, "source is NULL");
  if (offset >= size() || len > size() - offset) {
    return OutsideLease("copy into", info_.id, offset, len, size());
  }
  std::memcpy(static_cast<char*>(data()) + offset, src, len);
  core_->SignalsRecorded(signals_.Record(offset, len, /*write=*/true));
  return Status::Ok();
}

Status LeaseState::CopyOut(uint64_t offset, void* dst, size_t len) {
  if (released_) return Status(Code::kUnavailable, "lease already released");
  if (revoked())
    return Status(Code::kRevoked, "lease " + std::to_string(info_.id) + " was revoked");
  if (len == 0) return Status::Ok();
  if (dst == nullptr) return Status(Code::kInvalidArgument, "destination is NULL");
  if (offset >= size() || len > size() - offset) {
    return OutsideLease("copy out of", info_.id, offset, len, size());
  }
  std::memcpy(dst, static_cast<const char*>(data()) + offset, len);
  core_->SignalsRecorded(signals_.Record(offset, len, /*write=*/false));
  return Status::Ok();
}

Status LeaseState::NoteAccess(uint64_t offset, uint64_t len, uint64_t bytes_read,
                              uint64_t bytes_written) {
  if (released_) return Status(Code::kUnavailable, "lease already released");
  if (len == 0) return Status(Code::kInvalidArgument, "empty range");
  if (offset >= size() || len > size() - offset) {
    return OutsideLease("access to", info_.id, offset, len, size());
  }
  core_->SignalsRecorded(signals_.Note(offset, len, bytes_read, bytes_written));
  return Status::Ok();
}

Status LeaseState::Hint(uint64_t offset, uint64_t len, int hint) {
  if (released_) return Status(Code::kUnavailable, "lease already released");
  if (hint < 1 || hint > 4) {
    return Status(Code::kInvalidArgument,
                  "unknown hint " + std::to_string(hint) +
                      " (CXLPOOL_HINT_HOT, _COLD, _WILL_NEED or _DONT_NEED)");
  }
  if (len == 0) return Status(Code::kInvalidArgument, "hint for an empty range");
  if (offset >= size() || len > size() - offset) {
    return OutsideLease("hint for", info_.id, offset, len, size());
  }
  core_->QueueHint(info_.id, offset, len, hint);
  return Status::Ok();
}

Status LeaseState::PinTier(bool pinned) {
  if (released_) return Status(Code::kUnavailable, "lease already released");
  Status s = core_->SetLeaseTiering(info_.id, pinned, std::nullopt);
  if (s.ok()) tier_pinned_ = pinned;
  return s;
}

Status LeaseState::SetMigrationCallback(std::function<int(int)> cb) {
  if (released_) return Status(Code::kUnavailable, "lease already released");
  migration_cb_ = std::move(cb);
  DeclareCooperative();
  return Status::Ok();
}

void LeaseState::DeclareCooperative() {
  if (core_ == nullptr) return;
  const bool want = cooperative();
  if (want == declared_cooperative_) return;
  Status s = core_->SetLeaseTiering(info_.id, std::nullopt, want);
  if (s.ok()) {
    declared_cooperative_ = want;
  } else if (s.code() != Code::kUnsupported) {
    CXLPOOL_LOG(kWarning) << "lease " << info_.id << ": could not tell cxlpoold about its "
                          << "long-term pin: " << s.ToString();
  }
}

bool LeaseState::DropPins(std::string* why) {
  if (migration_cb_ != nullptr) {
    int rc = migration_cb_(1);
    if (rc != 0) {
      *why = "the application declined (its callback returned " + std::to_string(rc) + ")";
      ++tiering_.declined;
      return false;
    }
  }
  if (cuda_.registered()) {
    cuda_device_before_ = cuda_.device();
    device_ptrs_before_.clear();
    for (const auto& c : cuda_.chunks()) device_ptrs_before_.push_back(c.device_ptr);
    Status s = cuda_.Unregister();
    if (!s.ok()) {
      if (migration_cb_ != nullptr) (void)migration_cb_(2);
      cuda_device_before_ = -1;
      *why = "CUDA unregister failed: " + s.message();
      ++tiering_.declined;
      return false;
    }
  }
  return true;
}

void LeaseState::RecordPause(int64_t pause_ns) {
  tiering_.last_pause_ns = pause_ns;
  tiering_.max_pause_ns = std::max(tiering_.max_pause_ns, pause_ns);
}

void LeaseState::RestorePins(bool moved, int numa_node, const std::string& detail) {
  if (moved) {
    ++tiering_.migrations;
    if (numa_node >= 0) node_.store(numa_node, std::memory_order_relaxed);
  }
  if (cuda_device_before_ >= 0) {
    const int device = cuda_device_before_;
    cuda_device_before_ = -1;
    Result<const cuda::CudaDriver*> driver = cuda::CudaDriver::Default();
    Result<cuda::CudaRegistration> reg =
        driver.ok() ? cuda::RegisterHostMemory(**driver, device, mapping_.data(), mapping_.size())
                    : Result<cuda::CudaRegistration>(driver.status());
    if (!reg.ok()) {
      cuda_status_ = reg.status();
      CXLPOOL_LOG(kError) << "lease " << info_.id << ": CUDA registration after a migration "
                          << "failed: " << reg.status().ToString();
    } else {
      cuda_ = std::move(*reg);
      cuda_status_ = Status::Ok();
      bool same = cuda_.chunks().size() == device_ptrs_before_.size();
      for (size_t i = 0; same && i < cuda_.chunks().size(); ++i) {
        same = cuda_.chunks()[i].device_ptr == device_ptrs_before_[i];
      }
      if (!same) {
        ++tiering_.device_ptr_changed;
        CXLPOOL_LOG(kWarning) << "lease " << info_.id << ": the device pointer changed when it "
                              << "was registered again after a migration";
      }
      // Pinned again where the move put the pages: as after any CUDA
      // registration, the kernel is asked whether the pin moved them
      // (ZONE_MOVABLE), and the daemon is told (LEASE_MOVED).
      Placement placement;
      if (Status v = VerifyPlacement("cuda_register", &placement); !v.ok()) {
        CXLPOOL_LOG(kWarning) << "lease " << info_.id << ": placement check after registering "
                              << "again: " << v.ToString();
      } else if (placement.moved) {
        CXLPOOL_LOG(kWarning) << "lease " << info_.id << ": registered again after a migration "
                              << "to node " << placement.placed_numa_node << ", its pages are on "
                              << "node " << placement.numa_node << "; the daemon was told";
      }
    }
  }
  if (migration_cb_ != nullptr) (void)migration_cb_(2);
  tiering_.last_detail = detail;
}

}  // namespace cxlpool::detail
