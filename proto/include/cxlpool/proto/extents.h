// Extents: multi-extent lease replies (wire version 2).
//
// A lease is an ordered list of extents, each a sealed memfd of its own,
// mapped back to back into one range (LeaseInfo.extents; docs/protocol.md,
// "Multi-extent leases"). A reply carries one fd per extent, in order: as
// many as fit on the ALLOC_REPLY / ATTACH_REPLY frame itself (at most the
// client's HelloRequest.max_fds_per_frame, at most kMaxExtentFdsPerFrame),
// the rest on MSG_EXTENT_FDS frames that follow it at once with the same
// request id; the reply's extent_frames says how many follow. A client's
// RECLAIM_REQUEST of more fds than the daemon takes on one frame is split
// the same way (PlanReclaimRequest, ReclaimRequestAssembler).
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

// The frames that carry a RECLAIM_REQUEST `request` with `fd_count` fds
// (one per extent of each listed lease, in order). Up to `fds_per_frame`
// (1..kMaxExtentFdsPerFrame, the daemon's HelloReply.max_fds_per_frame) is
// one frame with them all; more need MSG_EXTENT_FDS frames, and `request`
// must then list exactly one lease. INVALID_ARGUMENT for a per-frame limit
// out of range, an fd count that does not match, or several leases over
// one frame's fds; PROTOCOL when a payload would exceed `max_payload_bytes`.
Result<std::vector<PlannedFrame>> PlanReclaimRequest(
    const proto::ReclaimRequest& request, size_t fd_count, size_t fds_per_frame,
    uint32_t max_payload_bytes = kDefaultMaxFrameBytes);

// INVALID_ARGUMENT, naming the limit, when the first frame of a planned
// RECLAIM_REQUEST of `fd_count` extents is more than the daemon reads
// (`max_request_bytes`, its HelloReply.max_request_bytes; 0: not said).
Status CheckReclaimRequestBytes(const PlannedFrame& first, size_t fd_count,
                                uint64_t max_request_bytes);

// The part a lease reply and a RECLAIM_REQUEST share: the fds of one lease's
// `extents` extents, some on the first frame, the rest on `frames`
// MSG_EXTENT_FDS frames that follow with the same request id. `who` starts
// every error ("lease 7: "); `first` names the first frame ("the reply").
class ExtentFdsCollector {
 public:
  // PROTOCOL: no fd, more fds than extents, or a frame count that cannot
  // bring the missing fds (each frame brings at least one) or is not 0 when
  // none is missing. On failure every fd is closed.
  Status Start(std::string who, const std::string& first, uint64_t request_id, uint64_t lease_id,
               size_t extents, uint32_t frames, std::vector<UniqueFd> fds);
  // The next EXTENT_FDS frame (see LeaseReplyAssembler::Add). PROTOCOL
  // otherwise; every fd received so far is then closed.
  Status Add(Frame next);
  bool complete() const { return extents_ != 0 && fds_.size() == extents_; }
  uint32_t frames_left() const { return frames_left_; }
  size_t fds_held() const { return fds_.size(); }
  uint64_t request_id() const { return request_id_; }
  // The fds, in order, once complete() (else empty).
  std::vector<UniqueFd> Take();

 private:
  Status Fail(Status why);
  std::string who_;
  uint64_t request_id_ = 0;
  uint64_t lease_id_ = 0;
  size_t extents_ = 0;
  uint32_t frames_left_ = 0;
  std::vector<UniqueFd> fds_;
};

// Puts a RECLAIM_REQUEST and the client's EXTENT_FDS frames back together
// (the daemon's side of PlanReclaimRequest).
class ReclaimRequestAssembler {
 public:
  // How many EXTENT_FDS frames a RECLAIM_REQUEST frame announces (0 for any
  // other frame, and for a payload that does not decode: the handler judges
  // that one alone).
  static uint32_t AnnouncedFrames(const Frame& request);
  // `request` is a RECLAIM_REQUEST that announces EXTENT_FDS frames.
  // PROTOCOL: dropped fds, an undecodable payload, other than one lease,
  // more than kMaxExtentsPerLease extents, or fds and frames that cannot add
  // up (ExtentFdsCollector::Start).
  Status Start(Frame request);
  Status Add(Frame next);  // ExtentFdsCollector::Add
  bool complete() const { return collector_.complete(); }
  uint64_t request_id() const { return collector_.request_id(); }
  uint32_t frames_left() const { return collector_.frames_left(); }
  size_t fds_held() const { return collector_.fds_held(); }
  // The RECLAIM_REQUEST as one frame with every fd, once complete().
  Frame TakeRequest();

 private:
  Frame request_;
  ExtentFdsCollector collector_;
};

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
  bool complete() const { return started_ && !failed_ && fds_.complete(); }
  // The next frame on the connection, which must be this reply's next
  // EXTENT_FDS frame (same request id and lease id, first_extent = the fds
  // received so far, count = the fds it carries, at least 1). PROTOCOL
  // otherwise, and after that the assembler is unusable.
  Status Add(Frame next);
  const proto::LeaseInfo& lease() const { return lease_; }
  uint64_t request_id() const { return request_id_; }
  // EXTENT_FDS frames still to come.
  uint32_t frames_left() const { return fds_.frames_left(); }
  // The extents with their fds, in order; only when complete() (else empty).
  std::vector<ReceivedExtent> TakeExtents();

 private:
  Status Fail(Status why);
  bool started_ = false;
  bool failed_ = false;
  uint64_t request_id_ = 0;
  proto::LeaseInfo lease_;
  std::vector<ExtentPlace> places_;
  ExtentFdsCollector fds_;
};

}  // namespace cxlpool::wire
