// The UCX seam: one-sided reads and writes between hosts on UCX's UCP layer
// (Debian's libucx 1.13), for remote leases (issue 40). Only this library
// sees UCX's types.
//
//   Worker     a UCP context and worker: its packed address is what a peer
//              connects to; Progress() drives its transports.
//   Region     a range of this process's memory registered with the worker
//              (ucp_mem_map), and its packed rkey for peers. Destroying it
//              unmaps it (ucp_mem_unmap). Only where the transport's
//              hardware checks rkeys (InfiniBand/RoCE verbs) does that bound
//              a peer to the range and revoke it: over RMA that UCX emulates
//              with active messages (tcp; UCX_LOG_LEVEL=info prints
//              "rma_am"), the target checks no rkey and no address, so a
//              peer with any rkey reaches all of this process's memory
//              (tests/cluster/ucx_transfer_test.cc pins this). A lender must
//              not expose memory that way; docs/cluster.md, Remote leases.
//   Endpoint   a connection to a peer worker, with peer-failure handling:
//              Put/Get of a byte range against a peer's region (RemoteKey)
//              return a Request; Flush completes every operation issued.
//   Request    a non-blocking operation: Test() polls, Wait(timeout) blocks
//              with a bound (no hang: past it the operation is cancelled
//              and UNAVAILABLE names the peer).
//
// Two ways to reach a peer's memory:
//   * raw RMA (Put/Get with a RemoteRegion): one-sided, the target's CPU
//     takes no part where the hardware does RMA; safe only where that
//     hardware checks rkeys (see Region).
//   * checked access (PutChecked/GetChecked with a LeaseRef): each access is
//     a UCP active message that the lender's AccessCheck answers (which
//     lease, which capability, which range) before UCX moves a byte, with
//     rendezvous straight into or out of the lease's memory for large
//     ranges. The lender's worker serves them (Worker::Serve) in Progress.
//     Any transport.
//
// Which transports: UCX's own configuration (UCX_TLS, UCX_NET_DEVICES in the
// environment); tests pin tcp on loopback.
//
// Thread safety: a Worker and everything made from it belong to one thread
// at a time (UCS_THREAD_MODE_SINGLE); a peer's worker must be progressed
// (by its own thread) for operations against it to complete over transports
// without hardware one-sided support, such as tcp.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "cxlpool/common/status.h"

namespace cxlpool::ucx {

class Worker;
class Endpoint;
struct PendingOp;
struct CheckedState;

// A lease of a lending worker as its borrower names it: the lease id, its
// length, and the 128-bit capability the lender issued for it (handed over
// the daemons' authenticated control channel, never guessable).
struct LeaseRef {
  uint64_t lease = 0;
  uint64_t length = 0;
  uint64_t token[2] = {0, 0};
};

// One checked access as the lender receives it (untrusted: any peer may
// send any values).
struct Access {
  uint64_t lease = 0;
  uint64_t token[2] = {0, 0};
  uint64_t offset = 0;
  uint64_t length = 0;
  bool write = false;
};

// The lender's answer: where the bytes are (the lease's mapping + offset,
// `length` bytes) and what to call once the transfer has finished either way
// (the lease's memory must stay mapped until then).
struct Grant {
  void* addr = nullptr;
  std::function<void()> done;
};
// Refusals travel back to the borrower as their Code (PERMISSION_DENIED for
// a wrong capability, NOT_FOUND, INVALID_ARGUMENT for a range outside).
using AccessCheck = std::function<Result<Grant>(const Access&)>;

// Ranges a peer registered, as this side received them: the peer's base
// address, length and packed rkey. Put/Get outside [base, base + length)
// are refused here, before UCX sees them.
struct RemoteRegion {
  uint64_t base = 0;
  uint64_t length = 0;
  std::string rkey;  // packed (Region::rkey())
};

class Region {
 public:
  ~Region();  // revokes: releases the packed rkey and unmaps
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

  uint64_t base() const { return base_; }
  uint64_t length() const { return length_; }
  const std::string& rkey() const { return rkey_; }
  RemoteRegion Describe() const { return RemoteRegion{base_, length_, rkey_}; }

 private:
  friend class Worker;
  Region() = default;
  Worker* worker_ = nullptr;
  void* memh_ = nullptr;  // ucp_mem_h
  uint64_t base_ = 0;
  uint64_t length_ = 0;
  std::string rkey_;
};

class Request {
 public:
  Request() = default;  // complete, OK
  ~Request();           // an unfinished operation is cancelled and waited for
  Request(Request&& o) noexcept;
  Request& operator=(Request&& o) noexcept;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;

  // Progresses the worker once; true when the operation has finished
  // (status() then says how).
  bool Test();
  // Progresses until finished or `timeout` passes: then cancels it and
  // returns UNAVAILABLE naming the peer. A checked write whose bytes were
  // still being sent leaves its endpoint failed (UCX cannot cut a stream
  // short): the next access says so, and a new Connect is needed.
  Status Wait(std::chrono::milliseconds timeout);
  const Status& status() const { return status_; }

 private:
  friend class Endpoint;
  Request(Worker* w, void* req, std::string peer) : worker_(w), req_(req), peer_(std::move(peer)) {}
  Request(Worker* w, std::shared_ptr<PendingOp> op, std::string peer);
  void Reset();
  bool Finish();  // an op_ that is done: its status taken, forgotten
  Worker* worker_ = nullptr;
  void* req_ = nullptr;            // a UCX request in flight; nullptr when finished
  std::shared_ptr<PendingOp> op_;  // a checked access in flight
  std::string peer_;
  Status status_;
};

class Endpoint {
 public:
  ~Endpoint();  // closes (forced when the peer has failed)
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  // Write `len` bytes from `local` to `remote_addr` of `region`; read into
  // `local`. INVALID_ARGUMENT when the range is not inside the region or
  // the rkey cannot be unpacked; UNAVAILABLE once the peer has failed.
  // `local` must stay valid until the Request finishes.
  Result<Request> Put(const void* local, size_t len, const RemoteRegion& region,
                      uint64_t remote_addr);
  Result<Request> Get(void* local, size_t len, const RemoteRegion& region, uint64_t remote_addr);
  // Every Put/Get issued on this endpoint complete at the peer.
  Status Flush(std::chrono::milliseconds timeout);

  // Checked access to `length` bytes at `offset` of the peer's lease `ref`:
  // answered by the peer's AccessCheck. `local` must stay valid until the
  // Request finishes.
  Result<Request> PutChecked(const void* local, size_t len, const LeaseRef& ref, uint64_t offset);
  Result<Request> GetChecked(void* local, size_t len, const LeaseRef& ref, uint64_t offset);
  Status WriteChecked(const void* local, size_t len, const LeaseRef& ref, uint64_t offset,
                      std::chrono::milliseconds timeout);
  Status ReadChecked(void* local, size_t len, const LeaseRef& ref, uint64_t offset,
                     std::chrono::milliseconds timeout);

  // Blocking forms: issue and Wait.
  Status Write(const void* local, size_t len, const RemoteRegion& region, uint64_t remote_addr,
               std::chrono::milliseconds timeout);
  Status Read(void* local, size_t len, const RemoteRegion& region, uint64_t remote_addr,
              std::chrono::milliseconds timeout);

  const std::string& peer() const { return peer_; }
  // The peer's failure as UCX reported it (OK while none).
  const Status& failure() const { return *failure_; }

 private:
  friend class Worker;
  Endpoint() = default;
  Result<void*> Rkey(const std::string& packed);  // ucp_rkey_h, cached per packed rkey
  Status CheckRange(size_t len, const RemoteRegion& region, uint64_t remote_addr) const;
  Status CheckLease(size_t len, const LeaseRef& ref, uint64_t offset) const;
  Result<Request> SendChecked(bool write, void* local, size_t len, const LeaseRef& ref,
                              uint64_t offset);

  Worker* worker_ = nullptr;
  void* ep_ = nullptr;  // ucp_ep_h
  std::string peer_;
  std::shared_ptr<Status> failure_ = std::make_shared<Status>();
  std::string cached_packed_;
  void* cached_rkey_ = nullptr;
};

class Worker {
 public:
  // A context with RMA features and a single-threaded worker.
  static Result<std::unique_ptr<Worker>> Create();
  ~Worker();  // abandons checked accesses still in flight
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // The packed worker address a peer connects to.
  const std::string& address() const { return address_; }
  // Registers [addr, addr + len) for peers' reads and writes.
  Result<std::unique_ptr<Region>> Map(void* addr, size_t len);
  // Connects to the worker whose address() is `peer_address`; `peer` names
  // it in errors ("host-b").
  Result<std::unique_ptr<Endpoint>> Connect(std::string_view peer_address, std::string peer);
  // Serves peers' checked accesses from now on, each answered by `check`
  // (called in Progress, on this worker's thread).
  Status Serve(AccessCheck check);
  // Runs the transports once, then the work their callbacks queued (replies,
  // rendezvous receives); true when something happened.
  bool Progress();
  // Checked accesses answered (granted or refused) since Serve.
  uint64_t served() const;
  // Sends and lease receives of checked access (replies included) that UCX
  // still holds. The destructor waits for them (2 s at most).
  uint64_t in_flight() const;

 private:
  friend class Region;
  friend class Request;
  friend class Endpoint;
  friend struct CheckedState;
  Worker();
  CheckedState& Checked();   // registers the borrower's handlers at first use
  void* context_ = nullptr;  // ucp_context_h
  void* worker_ = nullptr;   // ucp_worker_h
  std::string address_;
  std::unique_ptr<CheckedState> checked_;
};

}  // namespace cxlpool::ucx
