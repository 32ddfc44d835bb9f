// Extents: multi-extent lease replies (wire version 2).
//
// A lease is an ordered list of extents, each a sealed memfd of its own,
// mapped back to back into one range (LeaseInfo.extents; docs/protocol.md,
// "Multi-extent leases"). A reply carries one fd per extent, in order: as
// many as fit on the ALLOC_REPLY / ATTACH_REPLY frame itself (at most the
// client's HelloRequest.max_fds_per_frame, at most kMaxExtentFdsPerFrame),
// the rest on MSG_EXTENT_FDS frames that follow it at once with the same
// request id; the reply's extent_frames says how many follow.
//
//   sending:   auto frames = PlanLeaseReply(proto::MSG_ALLOC_REPLY, lease, n_fds, per_frame);
//              each frame carries fds [first_fd, first_fd + fd_count)
//   receiving: LeaseReplyAssembler a;  a.Start(std::move(reply_frame));
//              while (!a.complete()) a.Add(next frame);  a.TakeExtents();
//
// Validation (every failure is PROTOCOL naming what does not add up): each
// extent has size_bytes > 0 and a page_size that is a power of two >= 4 KiB
// dividing both its size and its offset (the sum of the sizes before it);
// the sizes add up to LeaseInfo.size_bytes; at most kMaxExtentsPerLease
// extents; every frame brings exactly the fds it announces, in order, and
// the frames bring one fd per extent, no more and no fewer.
//
// Thread safety: pure functions and single-owner values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cxlpool.pb.h"
#include "cxlpool/common/status.h"
#include "cxlpool/common/unique_fd.h"
#include "cxlpool/proto/frame.h"

namespace cxlpool::wire {

// The most extents one lease may have.
inline constexpr uint32_t kMaxExtentsPerLease = 16384;

// Where one extent lies in the lease's mapped range.
struct ExtentPlace {
  uint64_t offset = 0;
  uint64_t size = 0;
  uint64_t page_size = 0;
};

// The places of a lease's extents. An empty extent list is one extent of
// size_bytes with the lease's page_size (4 KiB when unset): version 1's form.
// PROTOCOL when the list does not add up (see above).
Result<std::vector<ExtentPlace>> PlaceExtents(const proto::LeaseInfo& lease);

// One frame of a planned lease reply: its type and payload, and the range
// of the lease's fds it carries.
struct PlannedFrame {
  proto::MsgType type = proto::MSG_UNSPECIFIED;
  std::string payload;
  size_t first_fd = 0;
  size_t fd_count = 0;
};

// The frames that carry a lease reply of `reply_type` (MSG_ALLOC_REPLY or
// MSG_ATTACH_REPLY) with `fd_count` fds: one per extent, or exactly one for
// a lease without an extent list. `fds_per_frame` (1..kMaxExtentFdsPerFrame)
// is the most fds one frame may carry. INVALID_ARGUMENT for a bad type, a
// per-frame limit out of range or an fd count that does not match; PROTOCOL
// when the extents do not add up (PlaceExtents) or a payload would exceed
// `max_payload_bytes`.
Result<std::vector<PlannedFrame>> PlanLeaseReply(
    proto::MsgType reply_type, const proto::LeaseInfo& lease, size_t fd_count, size_t fds_per_frame,
    uint32_t max_payload_bytes = kDefaultMaxFrameBytes);

// One received extent: its fd and its place in the mapped range.
struct ReceivedExtent {
  UniqueFd fd;
  ExtentPlace place;
};

// Puts a lease reply and its EXTENT_FDS frames back together.
class LeaseReplyAssembler {
 public:
  // `reply` is an ALLOC_REPLY or ATTACH_REPLY frame (an ERROR_REPLY is
  // answered with the error it carries). PROTOCOL: another type, dropped
  // fds, an undecodable payload, extents that do not add up, no fd, more fds
  // than extents, or a continuation count that cannot bring the rest.
  Status Start(Frame reply);
  // True once every extent has its fd (at once for a one-frame reply).
  bool complete() const { return started_ && received_.size() == places_.size(); }
  // The next frame on the connection, which must be this reply's next
  // EXTENT_FDS frame (same request id and lease id, first_extent = the fds
  // received so far, count = the fds it carries, at least 1). PROTOCOL
  // otherwise, and after that the assembler is unusable.
  Status Add(Frame next);
  const proto::LeaseInfo& lease() const { return lease_; }
  uint64_t request_id() const { return request_id_; }
  // EXTENT_FDS frames still to come.
  uint32_t frames_left() const { return frames_left_; }
  // The extents with their fds, in order; only when complete() (else empty).
  std::vector<ReceivedExtent> TakeExtents();

 private:
  Status Fail(Status why);
  bool started_ = false;
  bool failed_ = false;
  uint64_t request_id_ = 0;
  proto::LeaseInfo lease_;
  std::vector<ExtentPlace> places_;
  std::vector<UniqueFd> received_;
  uint32_t frames_left_ = 0;
};

}  // namespace cxlpool::wire
