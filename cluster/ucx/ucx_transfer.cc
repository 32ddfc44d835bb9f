// The UCX seam (see cxlpool/cluster/ucx_transfer.h).
#include "cxlpool/cluster/ucx_transfer.h"

#include <utility>

#include "ucx_internal.h"

namespace cxlpool::ucx {

Status FromUcs(ucs_status_t st, const std::string& what) {
  Code code = Code::kIo;
  switch (st) {
    case UCS_ERR_NO_MEMORY:
    case UCS_ERR_EXCEEDS_LIMIT:
      code = Code::kResourceExhausted;
      break;
    case UCS_ERR_INVALID_PARAM:
    case UCS_ERR_INVALID_ADDR:
      code = Code::kInvalidArgument;
      break;
    case UCS_ERR_UNSUPPORTED:
      code = Code::kUnsupported;
      break;
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_TIMED_OUT:
    case UCS_ERR_CANCELED:
    case UCS_ERR_REJECTED:
    case UCS_ERR_NOT_CONNECTED:
      code = Code::kUnavailable;
      break;
    default:
      break;
  }
  return Status(code, what + ": " + ucs_status_string(st));
}

ucs_status_t Drive(Worker* w, void* req, Clock::time_point until) {
  ucs_status_t st = ucp_request_check_status(req);
  while (st == UCS_INPROGRESS && Clock::now() < until) {
    w->Progress();
    st = ucp_request_check_status(req);
  }
  return st;
}

void CancelAndFree(Worker* w, void* req) {
  if (ucp_request_check_status(req) == UCS_INPROGRESS) {
    ucp_request_cancel(CheckedState::HandleOf(w), req);
    Drive(w, req, Clock::now() + std::chrono::seconds(1));
  }
  ucp_request_free(req);
}

// ---------------------------------------------------------------- Worker

Result<std::unique_ptr<Worker>> Worker::Create() {
  std::unique_ptr<Worker> w(new Worker());
  ucp_config_t* config = nullptr;
  if (ucs_status_t st = ucp_config_read(nullptr, nullptr, &config); st != UCS_OK) {
    return FromUcs(st, "ucp_config_read");
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM;
  ucp_context_h ctx = nullptr;
  ucs_status_t st = ucp_init(&params, config, &ctx);
  ucp_config_release(config);
  if (st != UCS_OK) return FromUcs(st, "ucp_init");
  w->context_ = ctx;
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  ucp_worker_h worker = nullptr;
  if (st = ucp_worker_create(ctx, &wp, &worker); st != UCS_OK) {
    return FromUcs(st, "ucp_worker_create");
  }
  w->worker_ = worker;
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  if (st = ucp_worker_get_address(worker, &addr, &len); st != UCS_OK) {
    return FromUcs(st, "ucp_worker_get_address");
  }
  w->address_.assign(reinterpret_cast<const char*>(addr), len);
  ucp_worker_release_address(worker, addr);
  w->checked_ = std::make_unique<CheckedState>(w.get());
  CXLPOOL_RETURN_IF_ERROR(RegisterBorrowerHandlers(w->checked_.get()));
  return w;
}

Worker::Worker() = default;

Worker::~Worker() {
  if (checked_ != nullptr) {
    while (!checked_->pending.empty()) checked_->Forget(*checked_->pending.begin()->second);
    // UCX must not hold a request of ours when the worker goes: a gone peer
    // fails them on progress; a silent one is cut off after 1 s.
    checked_->Drain(std::chrono::seconds(1));
  }
  if (worker_ != nullptr) ucp_worker_destroy(static_cast<ucp_worker_h>(worker_));
  if (context_ != nullptr) ucp_cleanup(static_cast<ucp_context_h>(context_));
}

CheckedState& Worker::Checked() { return *checked_; }

bool Worker::Progress() {
  bool any = ucp_worker_progress(static_cast<ucp_worker_h>(worker_)) != 0;
  if (checked_ != nullptr && checked_->RunQueued()) any = true;
  return any;
}

Result<std::unique_ptr<Region>> Worker::Map(void* addr, size_t len) {
  if (addr == nullptr || len == 0) {
    return Status(Code::kInvalidArgument, "cannot register an empty range");
  }
  auto ctx = static_cast<ucp_context_h>(context_);
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = addr;
  mp.length = len;
  ucp_mem_h memh = nullptr;
  if (ucs_status_t st = ucp_mem_map(ctx, &mp, &memh); st != UCS_OK) {
    return FromUcs(st, "ucp_mem_map of " + std::to_string(len) + " bytes");
  }
  std::unique_ptr<Region> r(new Region());
  r->worker_ = this;
  r->memh_ = memh;
  r->base_ = reinterpret_cast<uint64_t>(addr);
  r->length_ = len;
  void* packed = nullptr;
  size_t packed_len = 0;
  if (ucs_status_t st = ucp_rkey_pack(ctx, memh, &packed, &packed_len); st != UCS_OK) {
    return FromUcs(st, "ucp_rkey_pack");  // ~Region unmaps
  }
  r->rkey_.assign(static_cast<const char*>(packed), packed_len);
  ucp_rkey_buffer_release(packed);
  return r;
}

Result<std::unique_ptr<Endpoint>> Worker::Connect(std::string_view peer_address, std::string peer) {
  if (peer_address.empty()) {
    return Status(Code::kInvalidArgument, "no worker address for " + peer);
  }
  std::unique_ptr<Endpoint> e(new Endpoint());
  e->worker_ = this;
  e->peer_ = std::move(peer);
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.address = reinterpret_cast<const ucp_address_t*>(peer_address.data());
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = [](void* arg, ucp_ep_h, ucs_status_t st) {
    auto* failure = static_cast<Status*>(arg);
    if (failure->ok()) *failure = FromUcs(st, "peer failed");
  };
  ep.err_handler.arg = e->failure_.get();
  ucp_ep_h h = nullptr;
  if (ucs_status_t st = ucp_ep_create(static_cast<ucp_worker_h>(worker_), &ep, &h); st != UCS_OK) {
    return FromUcs(st, "connect to " + e->peer_);
  }
  e->ep_ = h;
  return e;
}

// ---------------------------------------------------------------- Region

Region::~Region() {
  if (memh_ != nullptr) {
    ucp_mem_unmap(static_cast<ucp_context_h>(worker_->context_), static_cast<ucp_mem_h>(memh_));
  }
}

// ---------------------------------------------------------------- Request

Request::Request(Worker* w, std::shared_ptr<PendingOp> op, std::string peer)
    : worker_(w), op_(std::move(op)), peer_(std::move(peer)) {}

Request::~Request() { Reset(); }

Request::Request(Request&& o) noexcept
    : worker_(o.worker_),
      req_(std::exchange(o.req_, nullptr)),
      op_(std::move(o.op_)),
      peer_(std::move(o.peer_)),
      status_(std::move(o.status_)) {}

Request& Request::operator=(Request&& o) noexcept {
  if (this != &o) {
    Reset();
    worker_ = o.worker_;
    req_ = std::exchange(o.req_, nullptr);
    op_ = std::move(o.op_);
    peer_ = std::move(o.peer_);
    status_ = std::move(o.status_);
  }
  return *this;
}

void Request::Reset() {
  if (req_ != nullptr) CancelAndFree(worker_, req_);
  req_ = nullptr;
  if (op_ != nullptr) worker_->Checked().Forget(*op_);
  op_.reset();
}

bool Request::Finish() {
  if (!op_->done && op_->peer_failure != nullptr && !op_->peer_failure->ok()) {
    // The lender will not answer: fail now rather than at the bound.
    op_->done = true;
    op_->status = Status(op_->peer_failure->code(), peer_ + ": " + op_->peer_failure->message());
  }
  if (!op_->done) return false;
  status_ = op_->status;
  worker_->Checked().Forget(*op_);
  op_.reset();
  return true;
}

bool Request::Test() {
  if (op_ != nullptr) {
    worker_->Progress();
    return Finish();
  }
  if (req_ == nullptr) return true;
  worker_->Progress();
  ucs_status_t st = ucp_request_check_status(req_);
  if (st == UCS_INPROGRESS) return false;
  ucp_request_free(req_);
  req_ = nullptr;
  if (st != UCS_OK) status_ = FromUcs(st, "transfer with " + peer_);
  return true;
}

Status Request::Wait(std::chrono::milliseconds timeout) {
  const Clock::time_point until = Clock::now() + timeout;
  auto timed_out = [&] {
    status_ = Status(Code::kUnavailable, "transfer with " + peer_ + " did not finish within " +
                                             std::to_string(timeout.count()) + " ms");
    return status_;
  };
  if (op_ != nullptr) {
    while (!Finish()) {
      if (Clock::now() >= until) {
        Reset();  // abandoned: a late answer finds nothing
        return timed_out();
      }
      worker_->Progress();
    }
    return status_;
  }
  if (req_ == nullptr) return status_;
  ucs_status_t st = Drive(worker_, req_, until);
  if (st == UCS_INPROGRESS) {
    CancelAndFree(worker_, req_);
    req_ = nullptr;
    return timed_out();
  }
  ucp_request_free(req_);
  req_ = nullptr;
  if (st != UCS_OK) status_ = FromUcs(st, "transfer with " + peer_);
  return status_;
}

// ---------------------------------------------------------------- Endpoint

Endpoint::~Endpoint() {
  Worker* w = worker_;
  if (cached_rkey_ != nullptr) ucp_rkey_destroy(static_cast<ucp_rkey_h>(cached_rkey_));
  if (ep_ == nullptr) return;
  ucp_request_param_t rp{};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  rp.flags = failure_->ok() ? 0 : UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t s = ucp_ep_close_nbx(static_cast<ucp_ep_h>(ep_), &rp);
  if (s != nullptr && !UCS_PTR_IS_ERR(s)) {
    if (Drive(w, s, Clock::now() + std::chrono::seconds(1)) == UCS_INPROGRESS) {
      // The peer does not answer: force it, bounded as well.
      ucp_request_free(s);
      rp.flags = UCP_EP_CLOSE_FLAG_FORCE;
      s = ucp_ep_close_nbx(static_cast<ucp_ep_h>(ep_), &rp);
      if (s != nullptr && !UCS_PTR_IS_ERR(s)) Drive(w, s, Clock::now() + std::chrono::seconds(1));
    }
    if (s != nullptr && !UCS_PTR_IS_ERR(s)) ucp_request_free(s);
  }
}

Status Endpoint::CheckRange(size_t len, const RemoteRegion& region, uint64_t remote_addr) const {
  if (!failure_->ok()) return Status(failure_->code(), peer_ + ": " + failure_->message());
  if (len == 0) return Status(Code::kInvalidArgument, "empty transfer");
  if (remote_addr < region.base || remote_addr - region.base > region.length ||
      len > region.length - (remote_addr - region.base)) {
    return Status(Code::kInvalidArgument,
                  "range of " + std::to_string(len) + " bytes at offset " +
                      std::to_string(static_cast<int64_t>(remote_addr - region.base)) +
                      " is outside the remote region of " + std::to_string(region.length) +
                      " bytes on " + peer_);
  }
  return Status::Ok();
}

Result<void*> Endpoint::Rkey(const std::string& packed) {
  if (cached_rkey_ != nullptr && packed == cached_packed_) return cached_rkey_;
  if (packed.empty()) return Status(Code::kInvalidArgument, "no rkey for " + peer_);
  ucp_rkey_h rkey = nullptr;
  if (ucs_status_t st = ucp_ep_rkey_unpack(static_cast<ucp_ep_h>(ep_), packed.data(), &rkey);
      st != UCS_OK) {
    Status s = FromUcs(st, "unpack an rkey of " + peer_);
    return Status(Code::kInvalidArgument, s.message());
  }
  if (cached_rkey_ != nullptr) ucp_rkey_destroy(static_cast<ucp_rkey_h>(cached_rkey_));
  cached_rkey_ = rkey;
  cached_packed_ = packed;
  return cached_rkey_;
}

Result<Request> Endpoint::Put(const void* local, size_t len, const RemoteRegion& region,
                              uint64_t remote_addr) {
  CXLPOOL_RETURN_IF_ERROR(CheckRange(len, region, remote_addr));
  auto rkey = Rkey(region.rkey);
  if (!rkey.ok()) return rkey.status();
  ucp_request_param_t rp{};
  ucs_status_ptr_t s = ucp_put_nbx(static_cast<ucp_ep_h>(ep_), local, len, remote_addr,
                                   static_cast<ucp_rkey_h>(*rkey), &rp);
  if (UCS_PTR_IS_ERR(s)) return FromUcs(UCS_PTR_STATUS(s), "write to " + peer_);
  if (s == nullptr) return Request();
  return Request(worker_, s, peer_);
}

Result<Request> Endpoint::Get(void* local, size_t len, const RemoteRegion& region,
                              uint64_t remote_addr) {
  CXLPOOL_RETURN_IF_ERROR(CheckRange(len, region, remote_addr));
  auto rkey = Rkey(region.rkey);
  if (!rkey.ok()) return rkey.status();
  ucp_request_param_t rp{};
  ucs_status_ptr_t s = ucp_get_nbx(static_cast<ucp_ep_h>(ep_), local, len, remote_addr,
                                   static_cast<ucp_rkey_h>(*rkey), &rp);
  if (UCS_PTR_IS_ERR(s)) return FromUcs(UCS_PTR_STATUS(s), "read from " + peer_);
  if (s == nullptr) return Request();
  return Request(worker_, s, peer_);
}

Status Endpoint::Flush(std::chrono::milliseconds timeout) {
  if (!failure_->ok()) return Status(failure_->code(), peer_ + ": " + failure_->message());
  ucp_request_param_t rp{};
  ucs_status_ptr_t s = ucp_ep_flush_nbx(static_cast<ucp_ep_h>(ep_), &rp);
  if (UCS_PTR_IS_ERR(s)) return FromUcs(UCS_PTR_STATUS(s), "flush to " + peer_);
  if (s == nullptr) return Status::Ok();
  Request r(worker_, s, peer_);
  return r.Wait(timeout);
}

Status Endpoint::Write(const void* local, size_t len, const RemoteRegion& region,
                       uint64_t remote_addr, std::chrono::milliseconds timeout) {
  auto r = Put(local, len, region, remote_addr);
  if (!r.ok()) return r.status();
  CXLPOOL_RETURN_IF_ERROR(r->Wait(timeout));
  // A put is complete locally when its buffer may be reused; the flush
  // makes it visible at the peer.
  return Flush(timeout);
}

Status Endpoint::Read(void* local, size_t len, const RemoteRegion& region, uint64_t remote_addr,
                      std::chrono::milliseconds timeout) {
  auto r = Get(local, len, region, remote_addr);
  if (!r.ok()) return r.status();
  return r->Wait(timeout);
}

}  // namespace cxlpool::ucx
