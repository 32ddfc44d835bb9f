// Connection: one connection of libcxlpool to cxlpoold, the session every
// request of a core goes over. It owns the socket, the frame reader,
// request ids, what HELLO settled (version, limits) and whether the
// connection broke; a reconnect puts a fresh socket in (Adopt) and bumps
// the generation.
//
// A call sends one request and reads frames until its reply; server pushes
// read on the way go to the push hook. The call hook hears when the first
// call starts and the last one ends (CallScope): the event watcher then
// leaves replies to the caller.
//
// Thread safety: none of its own; its owner (ClientCore) guards it with the
// connection lock and holds it for each call and its whole reply.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "cxlpool.pb.h"
#include "cxlpool/common/status.h"
#include "cxlpool/common/unique_fd.h"
#include "cxlpool/proto/codec.h"
#include "cxlpool/proto/hello.h"
#include "cxlpool/proto/ipc.h"

namespace cxlpool::detail {

// The largest request an older daemon reads (its limits.max_request_bytes),
// when its HELLO reply does not say.
inline constexpr uint64_t kDaemonRequestBytes = 64u << 10;

// The connection is gone (the daemon died or restarted), as opposed to a
// request the daemon refused or a protocol violation.
bool ConnectionLost(const Status& s);

// The HELLO libcxlpool says: its version and the process name.
wire::HelloOptions LibraryHello();

class Connection {
 public:
  struct Hooks {
    std::function<bool(const wire::Frame&)> push;   // a server push; false: not one
    std::function<void(bool active)> calls_active;  // the first call began, the last ended
  };
  Connection(UniqueFd sock, std::string peer, Hooks hooks);
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // HELLO on the socket given at construction.
  Status Hello();
  // A fresh socket that said hello (`reply`) replaces the old one.
  void Adopt(UniqueFd sock, const proto::HelloReply& reply);
  // The connection is given up: `why` is what later calls return.
  void Fail(Status why);
  // Marks the connection unusable (the first failure is kept) and passes
  // `s` through.
  Status Broken(Status s);

  // Sends one request and waits for the reply with the same request id,
  // handling pushes on the way. Any failure leaves the connection broken.
  Result<wire::Frame> Call(proto::MsgType type, const std::string& payload,
                           std::span<const int> fds = {});
  template <typename Req>
  Result<wire::Frame> CallMessage(const Req& req) {
    Result<std::string> payload = wire::Encode(req, max_payload_bytes_);
    if (!payload.ok()) return payload.status();
    return Call(wire::TypeOf<Req>(), *payload);
  }
  // The same for a RECLAIM_REQUEST with one fd per extent of each lease it
  // lists, on as many frames as the daemon's per-frame fd limit needs
  // (wire::PlanReclaimRequest). INVALID_ARGUMENT (nothing sent) when it
  // cannot be sent: several leases over one frame's fds, or a payload over
  // the daemon's max_request_bytes.
  Result<wire::Frame> CallReclaim(const proto::ReclaimRequest& req, std::span<const int> fds);
  // The next frame, whatever it is (a reply's EXTENT_FDS frames); inside a
  // CallScope.
  Result<wire::Frame> ReadFrame();
  // Non-blocking: handles the pushes waiting on the socket; their number.
  Result<int> DrainPushes();

  // A request and its reply, read by the caller (see the call hook).
  class CallScope {
   public:
    explicit CallScope(Connection* c);
    ~CallScope();
    CallScope(const CallScope&) = delete;
    CallScope& operator=(const CallScope&) = delete;

   private:
    Connection* c_;
  };

  uint64_t NextRequestId() { return next_request_id_++; }
  bool ok() const { return broken_.ok(); }
  const Status& broken() const { return broken_; }
  int fd() const { return sock_.get(); }
  uint64_t generation() const { return generation_; }
  uint32_t version() const { return version_; }
  const std::string& server_version() const { return server_version_; }
  const std::string& instance_id() const { return instance_id_; }
  uint32_t max_payload_bytes() const { return max_payload_bytes_; }
  // What the daemon takes on one request (HelloReply.max_fds_per_frame and
  // max_request_bytes).
  size_t request_fds_per_frame() const { return request_fds_per_frame_; }
  uint64_t max_request_bytes() const { return max_request_bytes_; }

 private:
  void Apply(const proto::HelloReply& reply);
  Result<wire::Frame> AwaitReply(uint64_t id);

  UniqueFd sock_;
  std::string peer_;
  Hooks hooks_;
  wire::FrameReader reader_;
  uint64_t next_request_id_ = 1;
  Status broken_;            // non-OK once the connection is unusable
  uint64_t generation_ = 0;  // bumped by every Adopt
  int calls_active_ = 0;
  uint32_t version_ = 0;
  std::string server_version_;
  std::string instance_id_;
  uint32_t max_payload_bytes_ = wire::kDefaultMaxFrameBytes;
  size_t request_fds_per_frame_ = wire::kDefaultMaxFdsPerFrame;
  uint64_t max_request_bytes_ = kDaemonRequestBytes;
};

}  // namespace cxlpool::detail
