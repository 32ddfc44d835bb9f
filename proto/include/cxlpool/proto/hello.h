// The HELLO handshake every client of cxlpoold says (libcxlpool's
// connection and its reconnects, BlockingClient), the limits a HELLO reply
// settles, and the reader of the reason a daemon gives when it refuses a
// connection.
//
//   wire::HelloOptions o{.name = "cxlpoolctl"};
//   Result<proto::HelloReply> r = wire::SayHello(sock, /*id=*/1, o);
//
// Thread safety: free functions; safe from any thread on distinct sockets.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "cxlpool.pb.h"
#include "cxlpool/common/status.h"
#include "cxlpool/proto/frame.h"

namespace cxlpool::wire {

struct HelloOptions {
  std::string name;  // HelloRequest.client_name
  uint32_t min_version = kMinWireVersion;
  uint32_t max_version = kMaxWireVersion;
  int timeout_ms = 30000;  // the send, and the wait for the reply
};

// Sends HELLO_REQUEST `id` on `sock` (written in kHelloWireVersion; it
// offers kHardMaxFdsPerFrame fds per frame) and reads its reply.
// Errors: the daemon's refusal as its Status (a connection limit, no common
// version), also when it wrote it before the request went out; PROTOCOL for
// a reply to another request or a version outside the options' range (and
// this library's); UNAVAILABLE or IO when the socket fails or times out.
Result<proto::HelloReply> SayHello(int sock, uint64_t id, const HelloOptions& options);

// After a send on `sock` failed: the reason the daemon wrote before it
// closed the connection (an ERROR_REPLY with request id 0), if one arrives
// within 100 ms; nullopt otherwise.
std::optional<Status> ReadRefusal(int sock);

// The largest frame payload the daemon takes and sends: its
// max_frame_bytes, at most kHardMaxFrameBytes; kDefaultMaxFrameBytes when
// the reply does not say.
uint32_t MaxPayloadBytes(const proto::HelloReply& reply);

// The most fds the daemon reads on one request frame (max_fds_per_frame,
// at most kMaxExtentFdsPerFrame); 0 when the reply does not say (a daemon
// older than split requests).
size_t RequestFdsPerFrame(const proto::HelloReply& reply);

}  // namespace cxlpool::wire
