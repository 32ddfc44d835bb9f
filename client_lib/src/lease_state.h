// LeaseState: what stands behind cxlpool::Lease (and the C ABI's lease
// handle). It owns a lease's fds and mapping (ExtentMapping) and its CUDA
// registration, independent of the connection: it holds a shared_ptr to
// the core only to send requests (release, tiering), so the mapping
// survives a broken connection (and a later reconnect can hand the fd back
// to the daemon).
//
// Thread safety: single-owner; only `revoked` and the NUMA node are touched
// by other threads (the core's event handling).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cuda_driver.h"
#include "cxlpool/client.hpp"
#include "cxlpool/common/status.h"
#include "extent_mapping.h"
#include "signals.h"

namespace cxlpool::detail {

class ClientCore;

class LeaseState {
 public:
  LeaseState(std::shared_ptr<ClientCore> core, ExtentMapping mapping, LeaseInfo info);
  ~LeaseState();  // Release(), errors ignored
  LeaseState(const LeaseState&) = delete;
  LeaseState& operator=(const LeaseState&) = delete;

  void* data() const { return mapping_.data(); }
  uint64_t size() const { return mapping_.size(); }
  const LeaseInfo& info() const { return info_; }
  // The lease's fd; -1 for a lease of several extents (mapping().extents()).
  int fd() const { return mapping_.fd(); }
  const ExtentMapping& mapping() const { return mapping_; }
  bool revoked() const { return revoked_.load(std::memory_order_acquire); }
  void MarkRevoked() { revoked_.store(true, std::memory_order_release); }

  // Registers, then checks the placement (VerifyPlacement; its failure is
  // logged, not returned: the registration stands).
  Status CudaRegister(int device);
  Status CudaUnregister();
  Result<uint64_t> DevicePtr() const;
  // move_pages census of the mapping; when the pages left the node the
  // lease is accounted to, tells the daemon and takes its updated info.
  // `*out` is filled even when telling the daemon fails. `cause` names the
  // pin in the report ("cuda_register", "verify").
  Status VerifyPlacement(const std::string& cause, Placement* out);
  const cuda::CudaRegistration& cuda() const { return cuda_; }

  // Unregister, unmap, tell the daemon; idempotent (a second call is OK).
  Status Release();

  // ---- tiering (tiering_client.cc) ----
  // Copies into / out of the lease and counts the bytes for the daemon.
  // INVALID_ARGUMENT (NULL with len > 0, a range outside the lease),
  // REVOKED, UNAVAILABLE (released).
  Status CopyIn(uint64_t offset, const void* src, size_t len);
  Status CopyOut(uint64_t offset, void* dst, size_t len);
  Status NoteAccess(uint64_t offset, uint64_t len, uint64_t bytes_read, uint64_t bytes_written);
  Status Hint(uint64_t offset, uint64_t len, int hint);
  Status PinTier(bool pinned);
  // The application's own long-term pin of the lease (io_uring fixed
  // buffers, RDMA): called with 1 (prepare: drop it; non-zero return
  // declines) and 2 (resume: pin again) at a safe point. Null: none.
  Status SetMigrationCallback(std::function<int(int phase)> cb);
  SignalRecorder& signals() { return signals_; }
  // Cooperative migration, at the safe point (ClientCore::SafePoint).
  // Drops the pins; false with `why` when the callback declined.
  bool DropPins(std::string* why);
  void RestorePins(bool moved, int numa_node, const std::string& detail);
  // The pause the holder saw: pins dropped -> pinned again.
  void RecordPause(int64_t pause_ns);
  // Where the lease's pages are: the grant's node, then the last move the
  // daemon reported (LeaseEvent "moved", or a cooperative migration).
  int numa_node() const { return node_.load(std::memory_order_relaxed); }
  void SetNode(int node) { node_.store(node, std::memory_order_relaxed); }
  bool cooperative() const { return cuda_.registered() || migration_cb_ != nullptr; }
  struct TieringCounters {
    uint64_t migrations = 0;
    uint64_t declined = 0;
    int64_t last_pause_ns = 0;
    int64_t max_pause_ns = 0;
    uint32_t device_ptr_changed = 0;
    std::string last_detail;
  };
  const TieringCounters& tiering() const { return tiering_; }
  bool tier_pinned() const { return tier_pinned_; }

 private:
  // Tells the daemon whether this process now holds a long-term pin.
  void DeclareCooperative();

  std::shared_ptr<ClientCore> core_;
  ExtentMapping mapping_;
  LeaseInfo info_;
  cuda::CudaRegistration cuda_;
  Status cuda_status_{Code::kNotFound, "the lease is not registered with CUDA"};
  std::atomic<bool> revoked_{false};
  bool released_ = false;
  std::atomic<int> node_{-1};
  SignalRecorder signals_;
  std::function<int(int)> migration_cb_;
  bool declared_cooperative_ = false;
  bool tier_pinned_ = false;
  // CUDA registration dropped for a migration: the device to register again
  // on, and the device pointers it had (they must come back the same).
  int cuda_device_before_ = -1;
  std::vector<uint64_t> device_ptrs_before_;
  TieringCounters tiering_;
};

}  // namespace cxlpool::detail
