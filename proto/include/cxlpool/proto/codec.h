// Codec: one encode/decode pair per protocol message, the MsgType each
// message travels under, Status <-> ErrorReply mapping, and hello version
// negotiation.
//
//   auto payload = wire::Encode(alloc_request);            // Result<std::string>
//   Status st = wire::DecodeReply(frame, &alloc_reply);     // checks the type;
//                                                           // ERROR_REPLY -> its Status
//
// Protobuf exceptions never escape: every failure is a Status.
// Thread safety: pure functions; safe from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "cxlpool.pb.h"
#include "cxlpool/common/status.h"
#include "cxlpool/proto/frame.h"

namespace cxlpool::wire {

// Every message that travels as a frame of its own, with its MsgType.
#define CXLPOOL_WIRE_MESSAGES(X)                \
  X(HelloRequest, MSG_HELLO_REQUEST)            \
  X(HelloReply, MSG_HELLO_REPLY)                \
  X(AllocRequest, MSG_ALLOC_REQUEST)            \
  X(AllocReply, MSG_ALLOC_REPLY)                \
  X(ReleaseRequest, MSG_RELEASE_REQUEST)        \
  X(ReleaseReply, MSG_RELEASE_REPLY)            \
  X(ListLeasesRequest, MSG_LIST_LEASES_REQUEST) \
  X(ListLeasesReply, MSG_LIST_LEASES_REPLY)     \
  X(StatRequest, MSG_STAT_REQUEST)              \
  X(StatReply, MSG_STAT_REPLY)                  \
  X(AttachRequest, MSG_ATTACH_REQUEST)          \
  X(AttachReply, MSG_ATTACH_REPLY)              \
  X(PoolsRequest, MSG_POOLS_REQUEST)            \
  X(PoolsReply, MSG_POOLS_REPLY)                \
  X(TopologyRequest, MSG_TOPOLOGY_REQUEST)      \
  X(TopologyReply, MSG_TOPOLOGY_REPLY)          \
  X(StatsRequest, MSG_STATS_REQUEST)            \
  X(StatsReply, MSG_STATS_REPLY)                \
  X(RevokeRequest, MSG_REVOKE_REQUEST)          \
  X(RevokeReply, MSG_REVOKE_REPLY)              \
  X(ReclaimRequest, MSG_RECLAIM_REQUEST)        \
  X(ReclaimReply, MSG_RECLAIM_REPLY)            \
  X(QuotasRequest, MSG_QUOTAS_REQUEST)          \
  X(QuotasReply, MSG_QUOTAS_REPLY)              \
  X(QuotaSetRequest, MSG_QUOTA_SET_REQUEST)     \
  X(QuotaSetReply, MSG_QUOTA_SET_REPLY)         \
  X(MetricsRequest, MSG_METRICS_REQUEST)        \
  X(MetricsReply, MSG_METRICS_REPLY)            \
  X(ExtentFds, MSG_EXTENT_FDS)                  \
  X(LeaseMovedRequest, MSG_LEASE_MOVED_REQUEST) \
  X(LeaseMovedReply, MSG_LEASE_MOVED_REPLY)     \
  X(ErrorReply, MSG_ERROR_REPLY)                \
  X(LeaseEvent, MSG_LEASE_EVENT)

// TypeOf(&msg) / TypeOf<M>(): the MsgType a message travels under.
// Encode(msg): the serialized payload; PROTOCOL if it exceeds
//   max_payload_bytes, INTERNAL if protobuf cannot serialize it.
// Decode(payload, &msg): PROTOCOL if the bytes are not a valid message.
#define CXLPOOL_WIRE_DECLARE(Msg, Type)                                           \
  constexpr proto::MsgType TypeOf(const proto::Msg*) { return proto::Type; }      \
  Result<std::string> Encode(const proto::Msg& msg,                               \
                             uint32_t max_payload_bytes = kDefaultMaxFrameBytes); \
  Status Decode(std::string_view payload, proto::Msg* out);
CXLPOOL_WIRE_MESSAGES(CXLPOOL_WIRE_DECLARE)
#undef CXLPOOL_WIRE_DECLARE

template <typename M>
constexpr proto::MsgType TypeOf() {
  return TypeOf(static_cast<const M*>(nullptr));
}

// A whole frame (header + payload) for `msg`, typed by TypeOf(msg).
template <typename M>
Result<std::string> EncodeMessageFrame(const M& msg, uint64_t request_id,
                                       uint32_t max_payload_bytes = kDefaultMaxFrameBytes) {
  Result<std::string> payload = Encode(msg, max_payload_bytes);
  if (!payload.ok()) return payload.status();
  return EncodeFrame(TypeOf<M>(), request_id, *payload);
}

// Status <-> ErrorReply. Codes map one-to-one (cxlpool::Code == ErrorCode).
proto::ErrorReply ToErrorReply(const Status& status);
// An unknown wire code becomes INTERNAL; an OK code in an ErrorReply becomes
// PROTOCOL (an error reply must carry an error).
Status FromErrorReply(const proto::ErrorReply& reply);
// The serialized ErrorReply payload for `status` (never fails: an over-long
// message is cut to fit).
std::string EncodeErrorPayload(const Status& status);

// Decodes a reply frame into `out`. If the frame is an ERROR_REPLY, returns
// the error it carries. PROTOCOL if the frame has another type than M's, an
// undecodable payload, or dropped fds.
template <typename M>
Status DecodeReply(const Frame& frame, M* out) {
  if (frame.fds_dropped > 0) {
    return Status(Code::kProtocol, "frame " + MsgTypeName(frame.header.type) + " carried " +
                                       std::to_string(frame.fds_dropped) +
                                       " unexpected fd(s); they were closed");
  }
  if (frame.type() == proto::MSG_ERROR_REPLY && TypeOf<M>() != proto::MSG_ERROR_REPLY) {
    proto::ErrorReply err;
    CXLPOOL_RETURN_IF_ERROR(Decode(frame.payload, &err));
    return FromErrorReply(err);
  }
  if (frame.type() != TypeOf<M>()) {
    return Status(Code::kProtocol, "expected " + MsgTypeName(TypeOf<M>()) + ", got " +
                                       MsgTypeName(frame.header.type));
  }
  return Decode(frame.payload, out);
}

// A connection's own error: an ERROR_REPLY with request id 0, which the
// server sends just before it closes a connection (a limit refused it, a
// timeout). Returns the status it carries (never OK), or nullopt for any
// other frame. docs/protocol.md, "Connection errors".
inline std::optional<Status> ConnectionError(const Frame& frame) {
  if (frame.type() != proto::MSG_ERROR_REPLY || frame.request_id() != 0) return std::nullopt;
  proto::ErrorReply err;
  Status st = Decode(frame.payload, &err);
  if (st.ok()) st = FromErrorReply(err);
  if (st.ok()) st = Status(Code::kProtocol, "connection error frame without a code");
  return st;
}

// Picks the highest version in both [client_min, client_max] and
// [server_min, server_max]. PROTOCOL (naming both ranges) if there is none,
// or if client_min > client_max.
Result<uint32_t> NegotiateVersion(uint32_t client_min, uint32_t client_max,
                                  uint32_t server_min = kMinWireVersion,
                                  uint32_t server_max = kMaxWireVersion);

}  // namespace cxlpool::wire
