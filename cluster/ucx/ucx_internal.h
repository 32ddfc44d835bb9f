// What ucx_transfer.cc and checked_access.cc share: UCX status mapping, the
// bounded drive of a request, and the state of checked accesses.
#pragma once

#include <ucp/api/ucp.h>

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>

#include "cxlpool/cluster/ucx_transfer.h"

namespace cxlpool::ucx {

using Clock = std::chrono::steady_clock;

Status FromUcs(ucs_status_t st, const std::string& what);

// Progresses `w` until `req` is no longer in progress or `until`.
ucs_status_t Drive(Worker* w, void* req, Clock::time_point until);
// Cancels `req`, progresses until UCX lets it go (1 s at most), frees it.
void CancelAndFree(Worker* w, void* req);

// A checked access this side issued, until the lender's answer completes it.
struct PendingOp {
  uint64_t id = 0;
  std::string peer;
  void* buffer = nullptr;  // a read's destination
  uint64_t length = 0;
  bool done = false;
  Status status;
  void* rndv_desc = nullptr;  // a read's data announced, its receive not yet started
  void* recv_req = nullptr;   // that receive in flight
  void* send_req = nullptr;   // the request's send, while UCX still has it
  // The endpoint's failure: set by UCX's error handler once the peer failed,
  // or by Forget when cancelling this op's send left the connection broken.
  std::shared_ptr<Status> peer_failure;
};

// The checked-access side of a worker: the lender's check, the borrower's
// accesses in flight, and the work UCX callbacks queue for after progress
// (callbacks only record; sends and receives start outside them).
struct CheckedState {
  explicit CheckedState(Worker* w) : worker(w) {}
  ucp_worker_h handle() const { return HandleOf(worker); }
  static ucp_worker_h HandleOf(const Worker* w) { return static_cast<ucp_worker_h>(w->worker_); }
  // Runs what callbacks queued; true when there was any.
  bool RunQueued();
  // Forgets `op` (abandoned or finished): a late answer finds nothing.
  void Forget(PendingOp& op);

  Worker* worker;
  AccessCheck check;
  uint64_t next_id = 1;
  uint64_t served = 0;
  // Sends and lease receives this worker started that UCX still holds, per
  // endpoint: the worker lets them end (or closes their endpoints) before
  // ucp_worker_destroy, which must find no request of ours on an endpoint.
  void Hold(ucp_ep_h ep) {
    ++busy[ep];
    ++in_flight;
  }
  void Let(ucp_ep_h ep) {
    if (auto it = busy.find(ep); it != busy.end() && --it->second == 0) busy.erase(it);
    --in_flight;
  }
  // Progresses until nothing is in flight (`wait` at most), then force-closes
  // the endpoints still holding some, which fails what they hold.
  void Drain(std::chrono::milliseconds wait);
  uint64_t in_flight = 0;
  std::unordered_map<ucp_ep_h, uint64_t> busy;
  std::unordered_map<uint64_t, std::shared_ptr<PendingOp>> pending;
  std::deque<std::function<void()>> queued;
};

// Registers the borrower's reply handlers (done, data) on `s`'s worker.
Status RegisterBorrowerHandlers(CheckedState* s);

}  // namespace cxlpool::ucx
