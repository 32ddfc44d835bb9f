// Server::Impl: replies and pushes into the send queues, within the queue
// and fd limits, and flushing the queues as clients read.
#include <fcntl.h>

#include <atomic>
#include <boost/asio/post.hpp>
#include <utility>
#include <vector>

#include "cxlpool/common/log.h"
#include "cxlpool/proto/codec.h"
#include "server/server_impl.h"

namespace cxlpool {

namespace asio = boost::asio;
using boost::system::error_code;

namespace {

// Charges the time from its construction to its end to `uid` (nothing when
// `budget` is nullptr).
class BusyCharge {
 public:
  using Clock = std::chrono::steady_clock;
  BusyCharge(BusyBudget* budget, uid_t uid)
      : budget_(budget), uid_(uid), start_(budget ? Clock::now() : Clock::time_point()) {}
  ~BusyCharge() {
    if (budget_ == nullptr) return;
    const auto end = Clock::now();
    budget_->Charge(uid_, end - start_, end);
  }
  BusyCharge(const BusyCharge&) = delete;
  BusyCharge& operator=(const BusyCharge&) = delete;

 private:
  BusyBudget* budget_;
  uid_t uid_;
  Clock::time_point start_;
};

// Shared by every copy of one request's ReplyFn. If the last copy dies
// without a reply, the client still gets one (INTERNAL), so its request and
// the connection's in-flight slot are never lost.
struct ReplyState {
  std::weak_ptr<Server::Impl> impl;
  asio::io_context* io = nullptr;
  ConnectionId conn = 0;
  uid_t uid = 0;
  uint64_t request_id = 0;
  uint16_t request_type = 0;
  std::atomic<bool> replied{false};

  ~ReplyState() {
    if (replied.load()) return;
    asio::post(*io, [impl = impl, conn = conn, uid = uid, rid = request_id, type = request_type] {
      if (auto self = impl.lock()) {
        self->CompleteRequest(
            conn, uid, rid, type,
            MakeErrorReply(Status(Code::kInternal, "the daemon dropped this request unanswered")));
      }
    });
  }

  void Complete(Reply reply) {
    if (auto self = impl.lock()) {
      self->CompleteRequest(conn, uid, request_id, request_type, std::move(reply));
      self->ScheduleDisconnectFlush();
    }
  }
};

// Replaces every fd of `r` by a duplicate kept in `owned`; false (errno
// set) when one cannot be made.
bool DupFds(Reply* r, std::vector<UniqueFd>* owned) {
  for (int& fd : r->fds) {
    int d = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (d < 0) return false;
    owned->emplace_back(d);
    fd = d;  // the copy, valid until the reply is sent
  }
  return true;
}

}  // namespace

ReplyFn Server::Impl::MakeReplyFn(ConnectionId id, uid_t uid, uint64_t request_id,
                                  uint16_t request_type) {
  auto state = std::make_shared<ReplyState>();
  state->impl = weak_from_this();
  state->io = &io_;
  state->conn = id;
  state->uid = uid;
  state->request_id = request_id;
  state->request_type = request_type;
  return [state](Reply reply) {
    if (state->replied.exchange(true)) {
      CXLPOOL_LOG(kError) << "server: request " << state->request_id << " on connection "
                          << state->conn << " answered twice; second reply ignored";
      return;
    }
    if (state->io->get_executor().running_in_this_thread()) {
      state->Complete(std::move(reply));
      return;
    }
    // Off the loop: the fds are only borrowed until we return, so take
    // copies (of every frame's: a lease reply's EXTENT_FDS frames too).
    auto owned = std::make_shared<std::vector<UniqueFd>>();
    bool copied = DupFds(&reply, owned.get());
    for (size_t i = 0; copied && i < reply.more.size(); ++i) {
      copied = DupFds(&reply.more[i], owned.get());
    }
    if (!copied) {
      reply = MakeErrorReply(Status::FromErrno(errno, "dup reply fd"));
      owned->clear();
    }
    asio::post(*state->io, [state, reply = std::move(reply), owned]() mutable {
      state->Complete(std::move(reply));
    });
  };
}

void Server::Impl::CompleteRequest(ConnectionId id, uid_t uid, uint64_t request_id,
                                   uint16_t request_type, Reply reply) {
  // Sending the reply is the uid's daemon time too (unless this runs inside
  // OnRequest, which is charged as a whole).
  BusyCharge charge(callback_depth_ == 0 ? &admission_.busy() : nullptr, uid);
  // The request counted against its uid until now, connection or not.
  admission_.RemoveRequest(uid, Clock::now());
  ConnPtr c = Get(id);
  if (!c || c->closed()) return;  // the client is gone; nothing to answer
  c->RemoveInflight();
  CheckReply(*c, &reply);
  const bool close_after = request_type == proto::MSG_HELLO_REQUEST && OnHelloReply(c, &reply);
  bool substituted = false;
  bool queued = Enqueue(c, reply.type, request_id, reply.payload, reply.fds, &substituted);
  c->UseNegotiatedFrameVersion();
  // The frames that follow it (a lease reply's EXTENT_FDS), at once and in
  // order; none after an error went in place of a frame. One that cannot
  // go leaves the client a reply it cannot finish: it reads the error (or
  // the closed connection) as the reply's failure, and gives the fds that
  // came back by closing the connection.
  for (size_t i = 0; queued && !substituted && i < reply.more.size(); ++i) {
    const Reply& m = reply.more[i];
    queued = Enqueue(c, m.type, request_id, m.payload, m.fds, &substituted);
  }
  if (!queued) return;
  if (close_after) {
    CloseAfterFlush(c, "HELLO failed");
    return;
  }
  StartRead(c);
}

void Server::Impl::CheckReply(const Connection& c, Reply* reply) const {
  // A reply the client could not accept is a daemon bug: say so instead.
  if (reply->payload.size() > options_.max_frame_bytes) {
    CXLPOOL_LOG(kError) << "server: " << wire::MsgTypeName(reply->type) << " reply of "
                        << reply->payload.size() << " bytes exceeds max_frame_bytes";
    *reply = MakeErrorReply(Status(
        Code::kInternal,
        "reply too large for one frame (" + std::to_string(reply->payload.size()) + " bytes)"));
  } else if (reply->fds.size() >
             wire::MaxFdsForType(reply->type, limits().max_fds_per_frame, c.frame_version())) {
    CXLPOOL_LOG(kError) << "server: " << wire::MsgTypeName(reply->type) << " reply with "
                        << reply->fds.size() << " fds refused";
    *reply = MakeErrorReply(
        Status(Code::kInternal, "daemon built a " + wire::MsgTypeName(reply->type) + " with " +
                                    std::to_string(reply->fds.size()) + " fds"));
  }
}

bool Server::Impl::OnHelloReply(const ConnPtr& c, Reply* reply) {
  c->set_hello_pending(false);
  if (reply->type != proto::MSG_HELLO_REPLY) {
    return !c->hello_done();  // a failed hello ends the connection
  }
  proto::HelloReply hr;
  Status st = wire::Decode(reply->payload, &hr);
  if (!st.ok() || hr.version() < wire::kMinWireVersion || hr.version() > wire::kMaxWireVersion) {
    *reply = MakeErrorReply(Status(Code::kInternal, "daemon built an invalid HelloReply"));
    return true;
  }
  if (!c->hello_done()) {
    c->SetHelloDone(hr.version());
    ArmIdleAfterHello(c);
  }
  return false;
}

bool Server::Impl::Enqueue(const ConnPtr& c, proto::MsgType type, uint64_t request_id,
                           const std::string& payload, std::span<const int> fds,
                           bool* substituted) {
  if (c->closed() || c->closing()) return false;
  // Nothing queued ahead: send at once with the caller's fds, which are then
  // never duplicated (a lease grant's common case). Only a frame that has to
  // wait keeps duplicates of them.
  std::span<const int> borrowed;
  if (c->queue().empty() && !fds.empty() && fds.size() <= wire::kHardMaxFdsPerFrame) {
    borrowed = fds;
    fds = {};
  }
  Result<wire::OutFrame> f = wire::MakeOutFrame(type, request_id, payload, fds, c->frame_version());
  if (f.ok() && c->queue().empty()) {
    Result<bool> sent = wire::SendSome(c->fd(), &*f, borrowed);
    if (!sent.ok()) {
      Drop(c, sent.status().ToString());
      return false;
    }
    if (*sent) {
      counters_.FrameOut();
      return true;
    }
    if (f->sent == 0 && !borrowed.empty()) {
      Status kept = wire::KeepFds(&*f, borrowed);
      if (!kept.ok()) f = kept;
    }
  }
  if (!f.ok()) {
    // Typically EMFILE while dup'ing the fds: the client gets the error
    // instead of a reply it cannot use.
    CXLPOOL_LOG(kError) << "server: " << c->Describe() << ": " << f.status().ToString();
    if (substituted != nullptr) *substituted = true;
    f = wire::MakeOutFrame(proto::MSG_ERROR_REPLY, request_id, wire::EncodeErrorPayload(f.status()),
                           {}, c->frame_version());
    if (!f.ok()) {
      Drop(c, f.status().ToString());
      return false;
    }
  }
  return QueueChecked(c, std::move(*f));
}

Server::Impl::ConnPtr Server::Impl::LargestQueue(std::optional<uid_t> uid) {
  ConnPtr best;
  for (auto& [id, c] : conns_) {
    if (c->closing() || c->queue().bytes() == 0 || (uid && c->uid() != *uid)) continue;
    if (!best || c->queue().bytes() > best->queue().bytes()) best = c;
  }
  return best;
}

bool Server::Impl::QueueChecked(const ConnPtr& c, wire::OutFrame f) {
  if (f.sent > 0) {
    // Partly on the wire already (the queue was empty): the rest must
    // follow whatever happens, or the stream loses its framing.
    c->queue().set_last_progress(Clock::now());
    QueueUnchecked(c, std::move(f));
    return !c->closed();
  }
  const uint64_t cost = f.bytes.size() + kFrameOverhead;
  const size_t nfds = f.fds.size();
  if (nfds > 0) {
    if (std::optional<Refusal> no = admission_.CheckFds(c->uid(), nfds)) {
      Abort(c, 0,
            Status(Code::kResourceExhausted,
                   "a reply's fds cannot wait for a client that does not read: " + no->why),
            no->limit);
      return false;
    }
  }
  const uint64_t per_conn = limits().max_queued_bytes_per_connection;
  if (c->queue().bytes() + cost > per_conn) {
    Abort(c, 0,
          Status(Code::kResourceExhausted,
                 std::to_string(c->queue().bytes() + cost) +
                     " reply bytes would be queued for a client that does not read; "
                     "limits.max_queued_bytes_per_connection is " +
                     std::to_string(per_conn)),
          "max_queued_bytes_per_connection");
    return false;
  }
  if (!MakeQueueRoom(c, cost)) return false;
  if (c->queue().empty()) c->queue().set_last_progress(Clock::now());
  QueueUnchecked(c, std::move(f));
  return !c->closed();
}

bool Server::Impl::MakeQueueRoom(const ConnPtr& c, uint64_t cost) {
  while (std::optional<Refusal> no = admission_.CheckQueued(c->uid(), cost)) {
    // Make room by dropping the largest queue: the uid's own (per-uid
    // limit), or the daemon's. A client that reads has none.
    ConnPtr victim = LargestQueue(no->per_uid ? std::optional<uid_t>(c->uid()) : std::nullopt);
    Status st(Code::kResourceExhausted,
              "dropped: this connection held the largest queue of unread replies (" +
                  std::to_string(victim ? victim->queue().bytes() : c->queue().bytes()) +
                  " bytes) when " + no->why);
    if (!victim || victim == c) {
      Abort(c, 0, st, no->limit);
      return false;
    }
    Abort(victim, 0, st, no->limit);
  }
  return true;
}

void Server::Impl::QueueUnchecked(const ConnPtr& c, wire::OutFrame f) {
  c->queue().Push(std::move(f));
  Flush(c);
}

void Server::Impl::QueueError(const ConnPtr& c, uint64_t request_id, const Status& st) {
  CXLPOOL_LOG(kInfo) << "server: " << c->Describe() << ": " << st.ToString();
  Enqueue(c, proto::MSG_ERROR_REPLY, request_id, wire::EncodeErrorPayload(st), {});
}

void Server::Impl::Flush(const ConnPtr& c) {
  while (!c->closed() && !c->queue().empty()) {
    Result<bool> done = c->queue().SendFront(c->fd());
    if (!done.ok()) {
      Drop(c, done.status().ToString());
      return;
    }
    if (!*done) {
      if (limits().send_timeout.count() > 0 && !c->timers().send_armed()) {
        ArmSendTimer(c, limits().send_timeout);
      }
      WaitWritable(c);
      return;
    }
    counters_.FrameOut();
  }
  if (c->closed()) return;
  if (c->closing()) {
    if (c->queue().empty()) Drop(c, c->closing_reason());
    return;
  }
  StartRead(c);  // the queue drained: read requests again
}

void Server::Impl::WaitWritable(const ConnPtr& c) {
  if (c->writing()) return;
  c->set_writing(true);
  c->socket().async_wait(Connection::Socket::wait_write,
                         [weak = weak_from_this(), c](const error_code& ec) {
                           c->set_writing(false);
                           auto self = weak.lock();
                           if (!self || c->closed()) return;
                           if (ec) {
                             self->Drop(c, "wait for output: " + ec.message());
                           } else {
                             self->Flush(c);
                           }
                           self->ScheduleDisconnectFlush();
                         });
}

}  // namespace cxlpool
