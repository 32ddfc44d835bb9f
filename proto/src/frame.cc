#include "cxlpool/proto/frame.h"

#include <string_view>

namespace cxlpool::wire {
namespace {

void Put16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}
void Put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void Put64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint16_t Get16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t Get32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
uint64_t Get64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

void EncodeFrameHeader(const FrameHeader& h, std::span<uint8_t, kFrameHeaderSize> out) {
  uint8_t* p = out.data();
  Put32(p + 0, h.magic);
  Put16(p + 4, h.version);
  Put16(p + 6, h.type);
  Put32(p + 8, h.flags);
  Put32(p + 12, h.length);
  Put64(p + 16, h.request_id);
}

FrameHeader DecodeFrameHeader(std::span<const uint8_t, kFrameHeaderSize> in) {
  const uint8_t* p = in.data();
  FrameHeader h;
  h.magic = Get32(p + 0);
  h.version = Get16(p + 4);
  h.type = Get16(p + 6);
  h.flags = Get32(p + 8);
  h.length = Get32(p + 12);
  h.request_id = Get64(p + 16);
  return h;
}

std::string EncodeFrame(proto::MsgType type, uint64_t request_id, std::string_view payload,
                        uint16_t version) {
  FrameHeader h;
  h.version = version;
  h.type = static_cast<uint16_t>(type);
  h.length = static_cast<uint32_t>(payload.size());
  h.request_id = request_id;
  std::string out(kFrameHeaderSize + payload.size(), '\0');
  EncodeFrameHeader(h, std::span<uint8_t, kFrameHeaderSize>(reinterpret_cast<uint8_t*>(out.data()),
                                                            kFrameHeaderSize));
  out.replace(kFrameHeaderSize, payload.size(), payload);
  return out;
}

Status ValidateFrameHeader(const FrameHeader& h, uint32_t max_payload_bytes) {
  if (h.magic != kFrameMagic) {
    char buf[96];
    snprintf(buf, sizeof buf, "bad frame magic 0x%08x (want 0x%08x \"CXLP\"): not a cxlpool peer",
             h.magic, kFrameMagic);
    return Status(Code::kProtocol, buf);
  }
  const bool hello_frame = h.type == proto::MSG_HELLO_REQUEST || h.type == proto::MSG_HELLO_REPLY ||
                           h.type == proto::MSG_ERROR_REPLY;
  if ((h.version < kMinWireVersion || h.version > kMaxWireVersion) &&
      !(hello_frame && h.version == kHelloWireVersion)) {
    return Status(Code::kProtocol, "unsupported wire version " + std::to_string(h.version) +
                                       " (this side speaks " + std::to_string(kMinWireVersion) +
                                       ".." + std::to_string(kMaxWireVersion) + ")");
  }
  if (h.flags != 0) {
    return Status(Code::kProtocol, "frame flags " + std::to_string(h.flags) + " set; version " +
                                       std::to_string(h.version) + " requires 0");
  }
  if (h.length > max_payload_bytes) {
    return Status(Code::kProtocol, "frame payload of " + std::to_string(h.length) +
                                       " bytes exceeds the maximum of " +
                                       std::to_string(max_payload_bytes) + " bytes");
  }
  return Status::Ok();
}

bool IsKnownType(uint16_t type) {
  return type != proto::MSG_UNSPECIFIED && proto::MsgType_IsValid(type);
}

bool IsRequestType(uint16_t type) {
  // Requests are the odd values 1..(last request); every request is followed
  // by its reply. ERROR_REPLY and LEASE_EVENT are server-to-client only.
  return IsKnownType(type) && type < proto::MSG_ERROR_REPLY && (type % 2) == 1;
}

std::string MsgTypeName(uint16_t type) {
  if (!IsKnownType(type)) return "MSG_" + std::to_string(type);
  return proto::MsgType_Name(static_cast<proto::MsgType>(type));
}

size_t MaxFdsForType(uint16_t type, size_t max_fds_per_frame, uint16_t version) {
  const bool extents = version >= kExtentWireVersion;
  switch (type) {
    case proto::MSG_ALLOC_REPLY:
    case proto::MSG_ATTACH_REPLY:
      return extents ? kMaxExtentFdsPerFrame : 1;
    case proto::MSG_EXTENT_FDS:
      return extents ? kMaxExtentFdsPerFrame : 0;
    case proto::MSG_RECLAIM_REQUEST:
      return max_fds_per_frame;
    default:
      return 0;
  }
}

}  // namespace cxlpool::wire
