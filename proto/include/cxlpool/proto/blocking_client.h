// BlockingClient: one request at a time to cxlpoold over its Unix socket,
// for tools and tests (cxlpoolctl, the bench, the test support library).
// The client library (libcxlpool) says the same HELLO (hello.h) but keeps
// its own connection, with reconnects and mappings.
//
//   auto c = wire::BlockingClient::Connect(path, {.name = "cxlpool-bench"});
//   proto::AllocReply r;  std::vector<UniqueFd> fds;
//   Status st = c->Call(alloc_request, &r, &fds);   // one fd per extent
//
// HELLO is sent at connect (wire::SayHello, hello.h); every later frame
// is written in the negotiated version. A lease reply (ALLOC_REPLY,
// ATTACH_REPLY) is put together with its EXTENT_FDS frames
// (LeaseReplyAssembler), so `fds` holds every extent's fd, in order. Server
// pushes (LeaseEvent) that arrive while a call waits are counted and kept
// for NextEvent(). Every wait is bounded by the timeout.
//
// Errors: Connect as ConnectUnix (NOT_FOUND, UNAVAILABLE, PERMISSION_DENIED,
// ...) and the daemon's HELLO refusal (PROTOCOL, naming both versions);
// Call: the daemon's error reply as its Status, PROTOCOL (a reply of another
// type or request id, fds that do not add up), UNAVAILABLE (closed, timed
// out). After a reply that does not match its request (request id, extent
// fds) the connection is unusable: later calls fail at once.
//
// Thread safety: a single-owner value; not for concurrent use.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "cxlpool.pb.h"
#include "cxlpool/common/status.h"
#include "cxlpool/common/unique_fd.h"
#include "cxlpool/proto/codec.h"
#include "cxlpool/proto/frame.h"

namespace cxlpool::wire {

struct BlockingClientOptions {
  std::string name = "cxlpool";  // HelloRequest.client_name
  int timeout_ms = 30000;        // each send and each wait for a frame
  uint32_t min_version = kMinWireVersion;
  uint32_t max_version = kMaxWireVersion;
};

class BlockingClient {
 public:
  static Result<BlockingClient> Connect(const std::string& socket_path,
                                        BlockingClientOptions options = {});
  // HELLO over a socket that is already connected (e.g. to a listener that
  // hands the connection on, as systemd-socket-activate does).
  static Result<BlockingClient> Handshake(UniqueFd sock, BlockingClientOptions options = {});

  BlockingClient(BlockingClient&&) = default;
  BlockingClient& operator=(BlockingClient&&) = default;

  // Sends `req` (with `send_fds`, borrowed) and waits for its reply, decoded
  // into `out`. For lease replies `fds_out` gets one fd per extent, in order;
  // for others the fds the reply carried. A reply's fds are closed when
  // `fds_out` is null.
  // A RECLAIM_REQUEST with more fds than the daemon reads in one frame
  // (HelloReply.max_fds_per_frame) goes out split over EXTENT_FDS frames
  // (PlanReclaimRequest), as libcxlpool sends it.
  template <typename Req, typename Rep>
  Status Call(const Req& req, Rep* out, std::vector<UniqueFd>* fds_out = nullptr,
              std::span<const int> send_fds = {}) {
    Result<Frame> f = [&] {
      if constexpr (std::is_same_v<Req, proto::ReclaimRequest>) {
        return ExchangeReclaim(req, send_fds);
      } else {
        return Exchange(TypeOf<Req>(), Encode(req), TypeOf<Rep>(), send_fds);
      }
    }();
    if (!f.ok()) return f.status();
    CXLPOOL_RETURN_IF_ERROR(DecodeReply(*f, out));
    if (fds_out != nullptr) *fds_out = std::move(f->fds);
    return Status::Ok();
  }

  // The next server push: one kept aside by an earlier call, else the next
  // frame read from the socket (bounded by the timeout).
  Result<proto::LeaseEvent> NextEvent();

  int fd() const { return sock_.get(); }
  const proto::HelloReply& hello() const { return hello_; }
  uint16_t version() const { return version_; }
  bool is_admin() const { return hello_.is_admin(); }
  // Pushes received so far (kept or not).
  uint64_t pushes() const { return pushes_; }
  // SO_PEERCRED's pid at connect (0 when unknown).
  pid_t peer_pid() const { return peer_pid_; }
  int timeout_ms() const { return options_.timeout_ms; }
  void set_timeout_ms(int ms) { options_.timeout_ms = ms; }

 private:
  BlockingClient() = default;
  // One request and its whole reply: the reply frame, with every extent's
  // fd for a lease reply (`reply_type` ALLOC_REPLY / ATTACH_REPLY).
  Result<Frame> Exchange(proto::MsgType type, const Result<std::string>& payload,
                         proto::MsgType reply_type, std::span<const int> send_fds);
  Result<Frame> ExchangeReclaim(const proto::ReclaimRequest& req, std::span<const int> send_fds);
  // After request `id` went out: its reply (see Exchange).
  Result<Frame> AwaitReply(uint64_t id, proto::MsgType reply_type);
  // A send failed: the daemon's own reason when it wrote one before closing.
  Status SendFailed(Status sent);
  // The next frame that is not a push (pushes are kept).
  Result<Frame> NextReplyFrame();
  Status Broken(Status why);

  UniqueFd sock_;
  BlockingClientOptions options_;
  uint16_t version_ = kHelloWireVersion;
  uint64_t next_id_ = 1;
  uint64_t pushes_ = 0;
  pid_t peer_pid_ = 0;
  std::deque<proto::LeaseEvent> events_;
  proto::HelloReply hello_;
  Status broken_;
};

}  // namespace cxlpool::wire
