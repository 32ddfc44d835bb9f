// Checked access (see cxlpool/cluster/ucx_transfer.h): every read or write
// of a lent lease is a UCP active message the lender answers.
//
//   borrower                                 lender
//   kWrite {id, lease, token, off, len} + bytes  ──►  check; bytes into the lease
//                                           ◄──  kDone {id, code}
//   kRead  {id, lease, token, off, len}      ──►  check
//                                           ◄──  kData {id, code, len} + bytes
//                                                (or kDone {id, code}: refused)
//
// Large payloads go by UCX's rendezvous, received straight into the lease
// (writes) or into the borrower's buffer (reads). Headers are checked for
// size and magic; everything else in them is the lender's check's to judge.
#include <cstring>
#include <vector>

#include "ucx_internal.h"

namespace cxlpool::ucx {

namespace {

constexpr unsigned kAmWrite = 0xC501;
constexpr unsigned kAmRead = 0xC502;
constexpr unsigned kAmDone = 0xC503;
constexpr unsigned kAmData = 0xC504;
constexpr uint32_t kMagic = 0x4358414d;  // "CXAM"

struct AccessHeader {
  uint32_t magic;
  uint32_t reserved;
  uint64_t id;
  uint64_t lease;
  uint64_t token[2];
  uint64_t offset;
  uint64_t length;
};

struct ReplyHeader {
  uint32_t magic;
  int32_t code;
  uint64_t id;
  uint64_t length;
};

// What a send owns until UCX is done with it: its header, and what to do
// on completion.
struct SendCtx {
  std::vector<uint8_t> header;
  std::function<void(ucs_status_t)> then;
  CheckedState* owner = nullptr;  // set once UCX holds the send
  ucp_ep_h ep = nullptr;
};

void SendDone(void* request, ucs_status_t status, void* user_data) {
  std::unique_ptr<SendCtx> ctx(static_cast<SendCtx*>(user_data));
  ctx->owner->Let(ctx->ep);
  if (ctx->then) ctx->then(status);
  ucp_request_free(request);
}

// Sends AM `id` with `header` (copied) and `len` bytes of `data` on `ep`;
// `then` runs once it completes, whichever way.
// Returns the UCX request while the send is in flight (nullptr once done);
// it stays valid until `then` has run, and `s` holds it on `ep` till then.
void* Send(CheckedState* s, ucp_ep_h ep, unsigned id, const void* header, size_t header_len,
           const void* data, size_t len, bool reply, std::function<void(ucs_status_t)> then) {
  auto ctx = std::make_unique<SendCtx>();
  ctx->header.assign(static_cast<const uint8_t*>(header),
                     static_cast<const uint8_t*>(header) + header_len);
  ctx->then = std::move(then);
  ucp_request_param_t rp{};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  rp.cb.send = SendDone;
  rp.user_data = ctx.get();
  if (reply) {
    rp.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
    rp.flags = UCP_AM_SEND_FLAG_REPLY;
  }
  ucs_status_ptr_t r =
      ucp_am_send_nbx(ep, id, ctx->header.data(), ctx->header.size(), data, len, &rp);
  if (r != nullptr && !UCS_PTR_IS_ERR(r)) {
    ctx->owner = s;
    ctx->ep = ep;
    s->Hold(ep);
    ctx.release();  // SendDone owns it now
    return r;
  }
  if (ctx->then) ctx->then(r == nullptr ? UCS_OK : UCS_PTR_STATUS(r));
  return nullptr;
}

void SendDoneReply(CheckedState* s, ucp_ep_h ep, uint64_t id, Code code) {
  ReplyHeader h{kMagic, static_cast<int32_t>(code), id, 0};
  Send(s, ep, kAmDone, &h, sizeof h, nullptr, 0, false, nullptr);
}

Code CodeOf(ucs_status_t st) { return st == UCS_OK ? Code::kOk : FromUcs(st, "").code(); }

// ---- lender side ----

Access ToAccess(const AccessHeader& h, bool write) {
  Access a;
  a.lease = h.lease;
  a.token[0] = h.token[0];
  a.token[1] = h.token[1];
  a.offset = h.offset;
  a.length = h.length;
  a.write = write;
  return a;
}

// Asks the lender's check; a grant must also come with an address.
Result<Grant> Ask(CheckedState* s, const Access& a) {
  ++s->served;
  if (!s->check) return Status(Code::kUnsupported, "this worker lends nothing");
  auto g = s->check(a);
  if (g.ok() && g->addr == nullptr) return Status(Code::kInternal, "a grant without an address");
  return g;
}

ucs_status_t OnWrite(void* arg, const void* header, size_t header_len, void* data, size_t length,
                     const ucp_am_recv_param_t* param) {
  auto* s = static_cast<CheckedState*>(arg);
  if (header_len != sizeof(AccessHeader) || !(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) {
    return UCS_OK;  // not ours: dropped
  }
  AccessHeader h;
  std::memcpy(&h, header, sizeof h);
  if (h.magic != kMagic) return UCS_OK;
  ucp_ep_h ep = param->reply_ep;
  Result<Grant> g = length == h.length
                        ? Ask(s, ToAccess(h, true))
                        : Result<Grant>(Status(Code::kProtocol, "payload length mismatch"));
  if (!g.ok()) {
    const Code code = g.status().code();
    s->queued.push_back([s, ep, id = h.id, code] { SendDoneReply(s, ep, id, code); });
    return UCS_OK;
  }
  Grant grant = std::move(g.value());
  if (!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
    std::memcpy(grant.addr, data, length);
    if (grant.done) grant.done();
    s->queued.push_back([s, ep, id = h.id] { SendDoneReply(s, ep, id, Code::kOk); });
    return UCS_OK;
  }
  // Rendezvous: the receive starts after progress, straight into the lease.
  s->queued.push_back([s, ep, id = h.id, data, length, grant = std::move(grant)]() mutable {
    struct RecvCtx {
      CheckedState* s;
      ucp_ep_h ep;
      uint64_t id;
      std::function<void()> done;
    };
    auto finish = [](RecvCtx* c, ucs_status_t st) {
      if (c->done) c->done();
      SendDoneReply(c->s, c->ep, c->id, CodeOf(st));
      delete c;
    };
    auto* ctx = new RecvCtx{s, ep, id, std::move(grant.done)};
    ucp_request_param_t rp{};
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    rp.cb.recv_am = [](void* req, ucs_status_t st, size_t, void* user) {
      auto* c = static_cast<RecvCtx*>(user);
      c->s->Let(c->ep);
      if (c->done) c->done();
      SendDoneReply(c->s, c->ep, c->id, CodeOf(st));
      delete c;
      ucp_request_free(req);
    };
    rp.user_data = ctx;
    ucs_status_ptr_t r = ucp_am_recv_data_nbx(s->handle(), data, grant.addr, length, &rp);
    if (r == nullptr) {
      finish(ctx, UCS_OK);
    } else if (UCS_PTR_IS_ERR(r)) {
      finish(ctx, UCS_PTR_STATUS(r));
    } else {
      s->Hold(ep);
    }
  });
  return UCS_INPROGRESS;  // the descriptor waits for that receive
}

ucs_status_t OnRead(void* arg, const void* header, size_t header_len, void*, size_t length,
                    const ucp_am_recv_param_t* param) {
  auto* s = static_cast<CheckedState*>(arg);
  if (header_len != sizeof(AccessHeader) || !(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) {
    return UCS_OK;
  }
  AccessHeader h;
  std::memcpy(&h, header, sizeof h);
  if (h.magic != kMagic) return UCS_OK;
  ucp_ep_h ep = param->reply_ep;
  Result<Grant> g = length == 0 ? Ask(s, ToAccess(h, false))
                                : Result<Grant>(Status(Code::kProtocol, "a read with a payload"));
  if (!g.ok()) {
    const Code code = g.status().code();
    s->queued.push_back([s, ep, id = h.id, code] { SendDoneReply(s, ep, id, code); });
    return UCS_OK;
  }
  s->queued.push_back([s, ep, id = h.id, len = h.length, grant = std::move(g.value())]() mutable {
    ReplyHeader r{kMagic, 0, id, len};
    Send(s, ep, kAmData, &r, sizeof r, grant.addr, len, false,
         [done = std::move(grant.done)](ucs_status_t) {
           if (done) done();
         });
  });
  return UCS_OK;
}

// ---- borrower side ----

std::shared_ptr<PendingOp> Find(CheckedState* s, const void* header, size_t header_len,
                                ReplyHeader* h) {
  if (header_len != sizeof(ReplyHeader)) return nullptr;
  std::memcpy(h, header, sizeof *h);
  if (h->magic != kMagic) return nullptr;
  auto it = s->pending.find(h->id);
  return it == s->pending.end() ? nullptr : it->second;
}

void Complete(PendingOp& op, Code code) {
  op.done = true;
  if (code != Code::kOk) {
    op.status = Status(code, std::string(op.buffer != nullptr ? "read from " : "write to ") +
                                 op.peer + ": the lender answered " + CodeName(code));
  }
}

ucs_status_t OnDone(void* arg, const void* header, size_t header_len, void*, size_t,
                    const ucp_am_recv_param_t*) {
  auto* s = static_cast<CheckedState*>(arg);
  ReplyHeader h;
  std::shared_ptr<PendingOp> op = Find(s, header, header_len, &h);
  if (op && !op->done && op->rndv_desc == nullptr && op->recv_req == nullptr) {
    Complete(*op, static_cast<Code>(h.code));
  }
  return UCS_OK;
}

ucs_status_t OnData(void* arg, const void* header, size_t header_len, void* data, size_t length,
                    const ucp_am_recv_param_t* param) {
  auto* s = static_cast<CheckedState*>(arg);
  ReplyHeader h;
  std::shared_ptr<PendingOp> op = Find(s, header, header_len, &h);
  if (!op || op->done || op->buffer == nullptr || op->rndv_desc != nullptr) return UCS_OK;
  if (length != op->length || h.length != op->length) {
    Complete(*op, Code::kProtocol);
    return UCS_OK;
  }
  if (!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
    std::memcpy(op->buffer, data, length);
    Complete(*op, Code::kOk);
    return UCS_OK;
  }
  op->rndv_desc = data;
  s->queued.push_back([s, op] {
    if (op->done || op->rndv_desc == nullptr) return;
    void* desc = std::exchange(op->rndv_desc, nullptr);
    ucp_request_param_t rp{};
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    rp.cb.recv_am = [](void* req, ucs_status_t st, size_t, void* user) {
      auto* o = static_cast<PendingOp*>(user);
      // Forget takes recv_req before it cancels, and frees the request then.
      if (o->recv_req == nullptr) return;
      o->recv_req = nullptr;
      ucp_request_free(req);
      Complete(*o, CodeOf(st));
    };
    rp.user_data = op.get();
    ucs_status_ptr_t r = ucp_am_recv_data_nbx(s->handle(), desc, op->buffer, op->length, &rp);
    if (r == nullptr) {
      Complete(*op, Code::kOk);
    } else if (UCS_PTR_IS_ERR(r)) {
      Complete(*op, CodeOf(UCS_PTR_STATUS(r)));
    } else if (op->done) {
      ucp_request_free(r);  // completed inside the call
    } else {
      op->recv_req = r;
    }
  });
  return UCS_INPROGRESS;
}

Status SetHandler(ucp_worker_h w, unsigned id, ucp_am_recv_callback_t cb, void* arg) {
  ucp_am_handler_param_t p{};
  p.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                 UCP_AM_HANDLER_PARAM_FIELD_ARG;
  p.id = id;
  p.cb = cb;
  p.arg = arg;
  ucs_status_t st = ucp_worker_set_am_recv_handler(w, &p);
  return st == UCS_OK ? Status::Ok() : FromUcs(st, "ucp_worker_set_am_recv_handler");
}

}  // namespace

bool CheckedState::RunQueued() {
  bool any = false;
  while (!queued.empty()) {
    auto f = std::move(queued.front());
    queued.pop_front();
    f();
    any = true;
  }
  return any;
}

void CheckedState::Forget(PendingOp& op) {
  if (op.send_req != nullptr) {
    // The send may still read the caller's buffer: cancel it and wait (1 s
    // at most) until UCX has let go of it.
    ucp_request_cancel(handle(), op.send_req);
    const Clock::time_point until = Clock::now() + std::chrono::seconds(1);
    while (op.send_req != nullptr && Clock::now() < until) worker->Progress();
    // A send cut off mid-stream leaves the connection unusable (tcp): say
    // so on the endpoint rather than let the next access fail obscurely.
    if (op.peer_failure != nullptr && op.peer_failure->ok()) {
      *op.peer_failure = Status(Code::kUnavailable,
                                "a transfer abandoned past its bound left the connection "
                                "unusable; connect again");
    }
  }
  if (op.recv_req != nullptr) {
    void* r = std::exchange(op.recv_req, nullptr);
    op.done = true;  // the cancelled receive's callback finds it done
    CancelAndFree(worker, r);
  }
  if (op.rndv_desc != nullptr) ucp_am_data_release(handle(), std::exchange(op.rndv_desc, nullptr));
  op.done = true;
  pending.erase(op.id);
}

void CheckedState::Drain(std::chrono::milliseconds wait) {
  const Clock::time_point until = Clock::now() + wait;
  queued.clear();
  while (in_flight > 0 && Clock::now() < until) {
    ucp_worker_progress(handle());
    queued.clear();
  }
  // A peer that is alive but silent never lets them end: closing the
  // endpoint by force fails them (their callbacks run, and Let them go).
  std::vector<ucp_ep_h> eps;
  for (const auto& [ep, n] : busy) eps.push_back(ep);
  for (ucp_ep_h ep : eps) {
    ucp_request_param_t rp{};
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    rp.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &rp);
    if (r != nullptr && !UCS_PTR_IS_ERR(r)) {
      Drive(worker, r, Clock::now() + std::chrono::seconds(1));
      ucp_request_free(r);
    }
  }
  // The close fails their requests from a later progress, not at once.
  const Clock::time_point purged = Clock::now() + std::chrono::seconds(1);
  while (in_flight > 0 && Clock::now() < purged) {
    ucp_worker_progress(handle());
    queued.clear();
  }
}

Status RegisterBorrowerHandlers(CheckedState* s) {
  CXLPOOL_RETURN_IF_ERROR(SetHandler(s->handle(), kAmDone, OnDone, s));
  return SetHandler(s->handle(), kAmData, OnData, s);
}

Status Worker::Serve(AccessCheck check) {
  CheckedState& s = Checked();
  const bool first = !s.check;
  s.check = std::move(check);
  if (!first) return Status::Ok();
  CXLPOOL_RETURN_IF_ERROR(SetHandler(s.handle(), kAmWrite, OnWrite, &s));
  return SetHandler(s.handle(), kAmRead, OnRead, &s);
}

uint64_t Worker::served() const { return checked_ ? checked_->served : 0; }

uint64_t Worker::in_flight() const { return checked_ ? checked_->in_flight : 0; }

// ---- Endpoint ----

Status Endpoint::CheckLease(size_t len, const LeaseRef& ref, uint64_t offset) const {
  if (!failure_->ok()) return Status(failure_->code(), peer_ + ": " + failure_->message());
  if (len == 0) return Status(Code::kInvalidArgument, "empty transfer");
  if (offset > ref.length || len > ref.length - offset) {
    return Status(Code::kInvalidArgument, "range of " + std::to_string(len) + " bytes at offset " +
                                              std::to_string(offset) + " is outside lease " +
                                              std::to_string(ref.lease) + " (" +
                                              std::to_string(ref.length) + " bytes) on " + peer_);
  }
  return Status::Ok();
}

Result<Request> Endpoint::SendChecked(bool write, void* local, size_t len, const LeaseRef& ref,
                                      uint64_t offset) {
  CXLPOOL_RETURN_IF_ERROR(CheckLease(len, ref, offset));
  CheckedState& s = worker_->Checked();
  auto op = std::make_shared<PendingOp>();
  op->id = s.next_id++;
  op->peer = peer_;
  op->length = len;
  op->peer_failure = failure_;
  if (!write) op->buffer = local;
  AccessHeader h{kMagic, 0, op->id, ref.lease, {ref.token[0], ref.token[1]}, offset, len};
  s.pending.emplace(op->id, op);
  std::weak_ptr<PendingOp> weak = op;
  op->send_req = Send(&s, static_cast<ucp_ep_h>(ep_), write ? kAmWrite : kAmRead, &h, sizeof h,
                      write ? local : nullptr, write ? len : 0, true, [weak](ucs_status_t st) {
                        auto o = weak.lock();
                        if (!o) return;
                        o->send_req = nullptr;
                        if (st != UCS_OK && !o->done) Complete(*o, CodeOf(st));
                      });
  return Request(worker_, op, peer_);
}

Result<Request> Endpoint::PutChecked(const void* local, size_t len, const LeaseRef& ref,
                                     uint64_t offset) {
  return SendChecked(true, const_cast<void*>(local), len, ref, offset);
}

Result<Request> Endpoint::GetChecked(void* local, size_t len, const LeaseRef& ref,
                                     uint64_t offset) {
  return SendChecked(false, local, len, ref, offset);
}

Status Endpoint::WriteChecked(const void* local, size_t len, const LeaseRef& ref, uint64_t offset,
                              std::chrono::milliseconds timeout) {
  auto r = PutChecked(local, len, ref, offset);
  if (!r.ok()) return r.status();
  return r->Wait(timeout);
}

Status Endpoint::ReadChecked(void* local, size_t len, const LeaseRef& ref, uint64_t offset,
                             std::chrono::milliseconds timeout) {
  auto r = GetChecked(local, len, ref, offset);
  if (!r.ok()) return r.status();
  return r->Wait(timeout);
}

}  // namespace cxlpool::ucx
