#include "cxlpool/proto/codec.h"

#include <algorithm>
#include <exception>

namespace cxlpool::wire {
namespace {

Result<std::string> SerializeBounded(const google::protobuf::MessageLite& msg,
                                     uint32_t max_payload_bytes) {
  try {
    size_t size = msg.ByteSizeLong();
    if (size > max_payload_bytes) {
      return Status(Code::kProtocol, msg.GetTypeName() + " is " + std::to_string(size) +
                                         " bytes, over the frame maximum of " +
                                         std::to_string(max_payload_bytes));
    }
    std::string out;
    if (!msg.SerializeToString(&out)) {
      return Status(Code::kInternal, "could not serialize " + msg.GetTypeName());
    }
    return out;
  } catch (const std::exception& e) {
    return Status(Code::kInternal, "serializing " + msg.GetTypeName() + ": " + e.what());
  }
}

Status ParseChecked(std::string_view payload, google::protobuf::MessageLite* out) {
  try {
    if (payload.size() > static_cast<size_t>(INT32_MAX) ||
        !out->ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
      return Status(Code::kProtocol, "malformed " + out->GetTypeName() + " payload (" +
                                         std::to_string(payload.size()) + " bytes)");
    }
    return Status::Ok();
  } catch (const std::exception& e) {
    return Status(Code::kProtocol, "parsing " + out->GetTypeName() + ": " + e.what());
  }
}

}  // namespace

#define CXLPOOL_WIRE_DEFINE(Msg, Type)                                            \
  Result<std::string> Encode(const proto::Msg& msg, uint32_t max_payload_bytes) { \
    return SerializeBounded(msg, max_payload_bytes);                              \
  }                                                                               \
  Status Decode(std::string_view payload, proto::Msg* out) { return ParseChecked(payload, out); }
CXLPOOL_WIRE_MESSAGES(CXLPOOL_WIRE_DEFINE)
#undef CXLPOOL_WIRE_DEFINE

proto::ErrorReply ToErrorReply(const Status& status) {
  proto::ErrorReply r;
  int code = static_cast<int>(status.code());
  r.set_code(proto::ErrorCode_IsValid(code) ? static_cast<proto::ErrorCode>(code)
                                            : proto::INTERNAL);
  r.set_message(status.message());
  return r;
}

Status FromErrorReply(const proto::ErrorReply& reply) {
  int code = static_cast<int>(reply.code());
  if (code == proto::OK) {
    return Status(Code::kProtocol, "error reply without an error code: " + reply.message());
  }
  if (!proto::ErrorCode_IsValid(code) || code > static_cast<int>(Code::kRevoked)) {
    return Status(Code::kInternal,
                  "unknown error code " + std::to_string(code) + ": " + reply.message());
  }
  return Status(static_cast<Code>(code), reply.message());
}

std::string EncodeErrorPayload(const Status& status) {
  proto::ErrorReply r = ToErrorReply(status);
  // Keep error replies far below any sane frame limit.
  constexpr size_t kMaxMessage = 4096;
  if (r.message().size() > kMaxMessage) r.mutable_message()->resize(kMaxMessage);
  std::string out;
  r.SerializeToString(&out);
  return out;
}

Result<uint32_t> NegotiateVersion(uint32_t client_min, uint32_t client_max, uint32_t server_min,
                                  uint32_t server_max) {
  auto range = [](uint32_t lo, uint32_t hi) {
    return std::to_string(lo) + ".." + std::to_string(hi);
  };
  if (client_min > client_max) {
    return Status(Code::kProtocol, "hello: min_version " + std::to_string(client_min) +
                                       " > max_version " + std::to_string(client_max));
  }
  uint32_t hi = std::min(client_max, server_max);
  uint32_t lo = std::max(client_min, server_min);
  if (hi < lo) {
    return Status(Code::kProtocol, "no common protocol version: client speaks " +
                                       range(client_min, client_max) + ", server speaks " +
                                       range(server_min, server_max));
  }
  return hi;
}

}  // namespace cxlpool::wire
