// Frame: the fixed 24-byte header that precedes every cxlpool message on the
// Unix socket, its validation, and which message types may carry fds.
//
// Layout (little-endian, no padding; docs/protocol.md has the full story):
//   off  size  field
//     0     4  magic       0x504C5843 ("CXLP" on the wire)
//     4     2  version     wire version this frame is written in: the
//                          negotiated one; 1 for HELLO and its reply
//     6     2  type        proto::MsgType
//     8     4  flags       0 (versions 1 and 2); anything else is refused
//    12     4  length      payload bytes that follow (<= max frame bytes)
//    16     8  request_id  chosen by the requester, echoed by the reply;
//                          0 for server pushes
//
// Thread safety: pure functions and values; safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cxlpool.pb.h"
#include "cxlpool/common/status.h"
#include "cxlpool/common/unique_fd.h"

namespace cxlpool::wire {

inline constexpr uint32_t kFrameMagic = 0x504C5843;  // bytes 43 58 4C 50: "CXLP"
inline constexpr size_t kFrameHeaderSize = 24;
// Wire versions this build speaks. Hello negotiates one inside this range.
// Version 2 adds multi-extent lease replies (LeaseInfo.extents,
// MSG_EXTENT_FDS, HelloRequest.max_fds_per_frame; proto/extents.h).
inline constexpr uint16_t kMinWireVersion = 1;
inline constexpr uint16_t kMaxWireVersion = 2;
inline constexpr uint16_t kExtentWireVersion = 2;
// HELLO_REQUEST and its answer (HELLO_REPLY or ERROR_REPLY) are always
// written in version 1, whatever either side speaks, so that any two builds
// can negotiate or say why they cannot.
inline constexpr uint16_t kHelloWireVersion = 1;
// Default maximum payload of one frame (the header is not counted).
inline constexpr uint32_t kDefaultMaxFrameBytes = 1u << 20;
// No configuration may raise the maximum payload beyond this.
inline constexpr uint32_t kHardMaxFrameBytes = 64u << 20;
// Default and hard cap on fds one frame may carry (the kernel's SCM_MAX_FD is 253).
inline constexpr size_t kDefaultMaxFdsPerFrame = 64;
inline constexpr size_t kHardMaxFdsPerFrame = 253;
// Version 2: the most extent fds one lease reply frame may carry.
inline constexpr size_t kMaxExtentFdsPerFrame = kHardMaxFdsPerFrame;

struct FrameHeader {
  uint32_t magic = kFrameMagic;
  uint16_t version = kMaxWireVersion;
  uint16_t type = 0;  // a proto::MsgType value, possibly unknown to us
  uint32_t flags = 0;
  uint32_t length = 0;
  uint64_t request_id = 0;
};

// One received frame: the header, its payload, and the fds that rode along
// (already O_CLOEXEC). `fds_dropped` counts fds that arrived but were closed
// because the frame carried more than its type allows (or the control buffer
// was truncated); the receiver must treat such a frame as an error.
struct Frame {
  FrameHeader header;
  std::string payload;
  std::vector<UniqueFd> fds;
  size_t fds_dropped = 0;

  proto::MsgType type() const { return static_cast<proto::MsgType>(header.type); }
  uint64_t request_id() const { return header.request_id; }
};

void EncodeFrameHeader(const FrameHeader& h, std::span<uint8_t, kFrameHeaderSize> out);
FrameHeader DecodeFrameHeader(std::span<const uint8_t, kFrameHeaderSize> in);

// Header followed by payload, ready to write.
std::string EncodeFrame(proto::MsgType type, uint64_t request_id, std::string_view payload,
                        uint16_t version = kMaxWireVersion);

// Checks magic, version (kMinWireVersion..kMaxWireVersion, or
// kHelloWireVersion for HELLO_REQUEST, HELLO_REPLY and ERROR_REPLY), flags ==
// 0 and length <= max_payload_bytes. The type is not checked otherwise (an
// unknown type is answered, not fatal). Errors: PROTOCOL, with a message
// naming the field.
Status ValidateFrameHeader(const FrameHeader& h, uint32_t max_payload_bytes);

// True for a MsgType value this build knows.
bool IsKnownType(uint16_t type);
// True for types a client sends to the server (the *_REQUEST types).
bool IsRequestType(uint16_t type);
// "MSG_ALLOC_REPLY", or "MSG_<n>" for an unknown value.
std::string MsgTypeName(uint16_t type);

// How many fds a frame of `type`, written in `version`, may carry: for
// ALLOC_REPLY and ATTACH_REPLY 1 in version 1 and up to
// kMaxExtentFdsPerFrame from version 2 (EXTENT_FDS too); up to
// `max_fds_per_frame` for RECLAIM_REQUEST; 0 otherwise.
size_t MaxFdsForType(uint16_t type, size_t max_fds_per_frame = kDefaultMaxFdsPerFrame,
                     uint16_t version = kMaxWireVersion);

}  // namespace cxlpool::wire
