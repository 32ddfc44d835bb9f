#include "cxlpool/proto/hello.h"

#include <algorithm>

#include "cxlpool/proto/codec.h"
#include "cxlpool/proto/extents.h"
#include "cxlpool/proto/ipc.h"

namespace cxlpool::wire {

std::optional<Status> ReadRefusal(int sock) {
  Result<Frame> why = RecvFrame(sock, {}, 100);
  if (!why.ok()) return std::nullopt;
  return ConnectionError(*why);
}

Result<proto::HelloReply> SayHello(int sock, uint64_t id, const HelloOptions& options) {
  proto::HelloRequest req;
  req.set_min_version(options.min_version);
  req.set_max_version(options.max_version);
  req.set_client_name(options.name);
  req.set_max_fds_per_frame(static_cast<uint32_t>(kHardMaxFdsPerFrame));
  Result<std::string> payload = Encode(req);
  if (!payload.ok()) return payload.status();
  Status sent = SendFrame(sock, proto::MSG_HELLO_REQUEST, id, *payload, {}, options.timeout_ms,
                          kHelloWireVersion);
  if (!sent.ok()) {
    // A daemon that refused the connection (a limit) wrote why and closed
    // before the HELLO went out: that is the answer, not EPIPE.
    if (std::optional<Status> err = ReadRefusal(sock)) return *err;
    return sent;
  }
  RecvLimits limits;
  limits.max_fds = kHardMaxFdsPerFrame;
  Result<Frame> frame = RecvFrame(sock, limits, options.timeout_ms);
  if (!frame.ok()) return frame.status();
  if (std::optional<Status> err = ConnectionError(*frame)) return *err;
  if (frame->request_id() != id) {
    return Status(Code::kProtocol, "hello reply carries request id " +
                                       std::to_string(frame->request_id()) + ", expected " +
                                       std::to_string(id));
  }
  proto::HelloReply reply;
  CXLPOOL_RETURN_IF_ERROR(DecodeReply(*frame, &reply));
  const uint32_t lo = std::max<uint32_t>(options.min_version, kMinWireVersion);
  const uint32_t hi = std::min<uint32_t>(options.max_version, kMaxWireVersion);
  if (reply.version() < lo || reply.version() > hi) {
    return Status(Code::kProtocol, "cxlpoold chose protocol version " +
                                       std::to_string(reply.version()) + ", this library speaks " +
                                       std::to_string(options.min_version) + ".." +
                                       std::to_string(options.max_version));
  }
  return reply;
}

uint32_t MaxPayloadBytes(const proto::HelloReply& reply) {
  if (reply.max_frame_bytes() == 0) return kDefaultMaxFrameBytes;
  return static_cast<uint32_t>(std::min<uint64_t>(reply.max_frame_bytes(), kHardMaxFrameBytes));
}

size_t RequestFdsPerFrame(const proto::HelloReply& reply) {
  return std::min<size_t>(reply.max_fds_per_frame(), kMaxExtentFdsPerFrame);
}

}  // namespace cxlpool::wire
