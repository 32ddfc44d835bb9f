#include "cxlpool/proto/extents.h"

#include <algorithm>

#include "cxlpool/proto/codec.h"

namespace cxlpool::wire {
namespace {

constexpr uint64_t kMinPage = 4096;

bool PowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

std::string Extent(size_t i) { return "extent " + std::to_string(i) + ": "; }

Status Protocol(const std::string& what) { return Status(Code::kProtocol, what); }

template <typename Reply>
Result<std::string> EncodeLeaseReply(const proto::LeaseInfo& lease, uint32_t frames,
                                     uint32_t max_payload_bytes) {
  Reply r;
  *r.mutable_lease() = lease;
  r.set_extent_frames(frames);
  return Encode(r, max_payload_bytes);
}

}  // namespace

Result<std::vector<ExtentPlace>> PlaceExtents(const proto::LeaseInfo& lease) {
  std::vector<ExtentPlace> out;
  const std::string who = "lease " + std::to_string(lease.id()) + ": ";
  if (lease.extents_size() == 0) {
    uint64_t page = lease.page_size() == 0 ? kMinPage : lease.page_size();
    if (lease.size_bytes() == 0) return Protocol(who + "size_bytes is 0");
    out.push_back({0, lease.size_bytes(), page});
    return out;
  }
  if (static_cast<uint64_t>(lease.extents_size()) > kMaxExtentsPerLease) {
    return Protocol(who + std::to_string(lease.extents_size()) + " extents; at most " +
                    std::to_string(kMaxExtentsPerLease) + " are allowed");
  }
  out.reserve(static_cast<size_t>(lease.extents_size()));
  uint64_t offset = 0;
  for (int i = 0; i < lease.extents_size(); ++i) {
    const proto::ExtentInfo& e = lease.extents(i);
    const size_t n = static_cast<size_t>(i);
    if (e.size_bytes() == 0) return Protocol(who + Extent(n) + "size_bytes is 0");
    if (e.page_size() < kMinPage || !PowerOfTwo(e.page_size())) {
      return Protocol(who + Extent(n) + "page_size " + std::to_string(e.page_size()) +
                      " is not a power of two of at least 4096");
    }
    if (e.size_bytes() % e.page_size() != 0) {
      return Protocol(who + Extent(n) + std::to_string(e.size_bytes()) +
                      " bytes is not a multiple of its page size " + std::to_string(e.page_size()));
    }
    if (offset % e.page_size() != 0) {
      return Protocol(who + Extent(n) + "starts at offset " + std::to_string(offset) +
                      ", not a multiple of its page size " + std::to_string(e.page_size()));
    }
    if (e.size_bytes() > lease.size_bytes() - offset || offset > lease.size_bytes()) {
      return Protocol(who + "extent sizes add up to more than the lease's " +
                      std::to_string(lease.size_bytes()) + " bytes (at extent " +
                      std::to_string(n) + ")");
    }
    out.push_back({offset, e.size_bytes(), e.page_size()});
    offset += e.size_bytes();
  }
  if (offset != lease.size_bytes()) {
    return Protocol(who + "extent sizes add up to " + std::to_string(offset) +
                    " bytes, the lease is " + std::to_string(lease.size_bytes()));
  }
  return out;
}

Result<std::vector<PlannedFrame>> PlanLeaseReply(proto::MsgType reply_type,
                                                 const proto::LeaseInfo& lease, size_t fd_count,
                                                 size_t fds_per_frame, uint32_t max_payload_bytes) {
  if (reply_type != proto::MSG_ALLOC_REPLY && reply_type != proto::MSG_ATTACH_REPLY) {
    return Status(Code::kInvalidArgument,
                  MsgTypeName(reply_type) + " is not a lease reply (ALLOC_REPLY, ATTACH_REPLY)");
  }
  if (fds_per_frame == 0 || fds_per_frame > kMaxExtentFdsPerFrame) {
    return Status(Code::kInvalidArgument, "fds per frame " + std::to_string(fds_per_frame) +
                                              " is not in 1.." +
                                              std::to_string(kMaxExtentFdsPerFrame));
  }
  auto places = PlaceExtents(lease);
  if (!places.ok()) return places.status();
  if (fd_count != places->size()) {
    return Status(Code::kInvalidArgument, "lease " + std::to_string(lease.id()) + " has " +
                                              std::to_string(places->size()) + " extent(s) but " +
                                              std::to_string(fd_count) + " fd(s) to send");
  }
  const size_t first = std::min(fd_count, fds_per_frame);
  const size_t rest = fd_count - first;
  const uint32_t frames = static_cast<uint32_t>((rest + fds_per_frame - 1) / fds_per_frame);
  std::vector<PlannedFrame> out;
  out.reserve(1 + frames);
  Result<std::string> head =
      reply_type == proto::MSG_ALLOC_REPLY
          ? EncodeLeaseReply<proto::AllocReply>(lease, frames, max_payload_bytes)
          : EncodeLeaseReply<proto::AttachReply>(lease, frames, max_payload_bytes);
  if (!head.ok()) return head.status();
  out.push_back({reply_type, std::move(*head), 0, first});
  for (size_t at = first; at < fd_count; at += fds_per_frame) {
    proto::ExtentFds m;
    m.set_lease_id(lease.id());
    m.set_first_extent(static_cast<uint32_t>(at));
    size_t n = std::min(fds_per_frame, fd_count - at);
    m.set_count(static_cast<uint32_t>(n));
    Result<std::string> p = Encode(m, max_payload_bytes);
    if (!p.ok()) return p.status();
    out.push_back({proto::MSG_EXTENT_FDS, std::move(*p), at, n});
  }
  return out;
}

Status CheckReclaimRequestBytes(const PlannedFrame& first, size_t fd_count,
                                uint64_t max_request_bytes) {
  if (max_request_bytes == 0 || first.payload.size() <= max_request_bytes) return Status::Ok();
  return Status(Code::kInvalidArgument,
                "RECLAIM_REQUEST of " + std::to_string(fd_count) + " extent(s) is " +
                    std::to_string(first.payload.size()) + " bytes, more than the daemon reads (" +
                    std::to_string(max_request_bytes) + ", limits.max_request_bytes)");
}

Result<std::vector<PlannedFrame>> PlanReclaimRequest(const proto::ReclaimRequest& request,
                                                     size_t fd_count, size_t fds_per_frame,
                                                     uint32_t max_payload_bytes) {
  if (fds_per_frame == 0 || fds_per_frame > kMaxExtentFdsPerFrame) {
    return Status(Code::kInvalidArgument, "fds per frame " + std::to_string(fds_per_frame) +
                                              " is not in 1.." +
                                              std::to_string(kMaxExtentFdsPerFrame));
  }
  size_t wanted = 0;
  for (const proto::LeaseInfo& l : request.leases()) {
    wanted += static_cast<size_t>(std::max(1, l.extents_size()));
  }
  if (fd_count != wanted) {
    return Status(Code::kInvalidArgument,
                  "RECLAIM_REQUEST lists " + std::to_string(request.leases_size()) +
                      " lease(s) of " + std::to_string(wanted) + " extent(s) but " +
                      std::to_string(fd_count) + " fd(s) to send");
  }
  if (fd_count > fds_per_frame && request.leases_size() != 1) {
    return Status(Code::kInvalidArgument,
                  "RECLAIM_REQUEST of " + std::to_string(request.leases_size()) + " leases and " +
                      std::to_string(fd_count) + " fds: more than one frame carries (" +
                      std::to_string(fds_per_frame) + ") is sent one lease at a time");
  }
  const size_t first = std::min(fd_count, fds_per_frame);
  const size_t rest = fd_count - first;
  proto::ReclaimRequest head = request;
  head.set_extent_frames(static_cast<uint32_t>((rest + fds_per_frame - 1) / fds_per_frame));
  Result<std::string> p = Encode(head, max_payload_bytes);
  if (!p.ok()) return p.status();
  std::vector<PlannedFrame> out;
  out.push_back({proto::MSG_RECLAIM_REQUEST, std::move(*p), 0, first});
  const uint64_t lease_id = request.leases_size() == 1 ? request.leases(0).id() : 0;
  for (size_t at = first; at < fd_count; at += fds_per_frame) {
    proto::ExtentFds m;
    m.set_lease_id(lease_id);
    m.set_first_extent(static_cast<uint32_t>(at));
    const size_t n = std::min(fds_per_frame, fd_count - at);
    m.set_count(static_cast<uint32_t>(n));
    Result<std::string> e = Encode(m, max_payload_bytes);
    if (!e.ok()) return e.status();
    out.push_back({proto::MSG_EXTENT_FDS, std::move(*e), at, n});
  }
  return out;
}

// ---- ExtentFdsCollector

Status ExtentFdsCollector::Fail(Status why) {
  fds_.clear();  // closes every fd received so far
  extents_ = 0;
  frames_left_ = 0;
  return why;
}

Status ExtentFdsCollector::Start(std::string who, const std::string& first, uint64_t request_id,
                                 uint64_t lease_id, size_t extents, uint32_t frames,
                                 std::vector<UniqueFd> fds) {
  who_ = std::move(who);
  request_id_ = request_id;
  lease_id_ = lease_id;
  extents_ = extents;
  fds_ = std::move(fds);
  const size_t got = fds_.size();
  if (got == 0) return Fail(Protocol(who_ + first + " carried no fd"));
  if (got > extents) {
    return Fail(Protocol(who_ + first + " carried " + std::to_string(got) + " fds for " +
                         std::to_string(extents) + " extent(s)"));
  }
  if (got == extents && frames != 0) {
    return Fail(Protocol(who_ + "every fd is on " + first + ", yet it announces " +
                         std::to_string(frames) + " EXTENT_FDS frame(s)"));
  }
  if (got < extents && (frames == 0 || frames > extents - got)) {
    return Fail(Protocol(who_ + std::to_string(extents - got) + " extent fd(s) are missing and " +
                         std::to_string(frames) + " EXTENT_FDS frame(s) are announced"));
  }
  frames_left_ = frames;
  return Status::Ok();
}

Status ExtentFdsCollector::Add(Frame next) {
  if (extents_ == 0 || complete()) {
    // Whatever it brought is closed with it.
    return Status(Code::kInternal, "no frame is waiting for extent fds");
  }
  if (next.type() != proto::MSG_EXTENT_FDS) {
    return Fail(Protocol(who_ + "expected MSG_EXTENT_FDS with the rest of its extent fds, got " +
                         MsgTypeName(next.header.type)));
  }
  if (next.request_id() != request_id_) {
    return Fail(Protocol(who_ + "MSG_EXTENT_FDS for request " + std::to_string(next.request_id()) +
                         ", expected " + std::to_string(request_id_)));
  }
  if (next.fds_dropped > 0) {
    return Fail(Protocol(who_ + "MSG_EXTENT_FDS carried " + std::to_string(next.fds_dropped) +
                         " fd(s) more than it may; they were closed"));
  }
  proto::ExtentFds m;
  if (Status st = Decode(next.payload, &m); !st.ok()) return Fail(st);
  if (m.lease_id() != lease_id_) {
    return Fail(Protocol(who_ + "MSG_EXTENT_FDS names lease " + std::to_string(m.lease_id())));
  }
  if (m.first_extent() != fds_.size()) {
    return Fail(Protocol(who_ + "MSG_EXTENT_FDS starts at extent " +
                         std::to_string(m.first_extent()) + ", expected " +
                         std::to_string(fds_.size())));
  }
  if (m.count() == 0 || m.count() != next.fds.size()) {
    return Fail(Protocol(who_ + "MSG_EXTENT_FDS announces " + std::to_string(m.count()) +
                         " fd(s) and carries " + std::to_string(next.fds.size())));
  }
  if (next.fds.size() > extents_ - fds_.size()) {
    return Fail(Protocol(who_ + "MSG_EXTENT_FDS brings " + std::to_string(next.fds.size()) +
                         " fd(s) for the " + std::to_string(extents_ - fds_.size()) +
                         " extent(s) left"));
  }
  if (frames_left_ == 0) {
    return Fail(Protocol(who_ + "more MSG_EXTENT_FDS frames than were announced"));
  }
  --frames_left_;
  for (UniqueFd& fd : next.fds) fds_.push_back(std::move(fd));
  if (frames_left_ == 0 && !complete()) {
    return Fail(Protocol(who_ + "the announced MSG_EXTENT_FDS frames brought " +
                         std::to_string(fds_.size()) + " of " + std::to_string(extents_) +
                         " extent fds"));
  }
  if (complete() && frames_left_ != 0) {
    return Fail(Protocol(who_ + "every extent has its fd, yet " + std::to_string(frames_left_) +
                         " more MSG_EXTENT_FDS frame(s) are announced"));
  }
  return Status::Ok();
}

std::vector<UniqueFd> ExtentFdsCollector::Take() {
  if (!complete()) return {};
  std::vector<UniqueFd> out = std::move(fds_);
  fds_.clear();
  extents_ = 0;
  return out;
}

// ---- ReclaimRequestAssembler

uint32_t ReclaimRequestAssembler::AnnouncedFrames(const Frame& request) {
  if (request.type() != proto::MSG_RECLAIM_REQUEST) return 0;
  proto::ReclaimRequest r;
  if (!Decode(request.payload, &r).ok()) return 0;
  return r.extent_frames();
}

Status ReclaimRequestAssembler::Start(Frame request) {
  const uint64_t rid = request.request_id();
  proto::ReclaimRequest r;
  if (request.type() != proto::MSG_RECLAIM_REQUEST) {
    return Protocol("expected a RECLAIM_REQUEST, got " + MsgTypeName(request.header.type));
  }
  if (request.fds_dropped > 0) {
    return Protocol("RECLAIM_REQUEST carried " + std::to_string(request.fds_dropped) +
                    " fd(s) more than it may; they were closed");
  }
  if (Status st = Decode(request.payload, &r); !st.ok()) return st;
  if (r.leases_size() != 1) {
    return Protocol("RECLAIM_REQUEST announces " + std::to_string(r.extent_frames()) +
                    " EXTENT_FDS frame(s) for " + std::to_string(r.leases_size()) +
                    " leases; a RECLAIM split over frames hands back one lease");
  }
  const proto::LeaseInfo& l = r.leases(0);
  if (static_cast<uint64_t>(l.extents_size()) > kMaxExtentsPerLease) {
    return Protocol("lease " + std::to_string(l.id()) + ": " + std::to_string(l.extents_size()) +
                    " extents; at most " + std::to_string(kMaxExtentsPerLease) + " are allowed");
  }
  const size_t extents = static_cast<size_t>(std::max(1, l.extents_size()));
  std::vector<UniqueFd> fds = std::move(request.fds);
  request_ = std::move(request);
  request_.fds.clear();
  return collector_.Start("RECLAIM_REQUEST of lease " + std::to_string(l.id()) + ": ",
                          "the request", rid, l.id(), extents, r.extent_frames(), std::move(fds));
}

Status ReclaimRequestAssembler::Add(Frame next) { return collector_.Add(std::move(next)); }

Frame ReclaimRequestAssembler::TakeRequest() {
  Frame out = std::move(request_);
  out.fds = collector_.Take();
  return out;
}

// ---- LeaseReplyAssembler

Status LeaseReplyAssembler::Fail(Status why) {
  failed_ = true;
  return why;
}

Status LeaseReplyAssembler::Start(Frame reply) {
  if (started_ || failed_) return Status(Code::kInternal, "lease reply assembler reused");
  started_ = true;
  request_id_ = reply.request_id();
  const proto::MsgType type = reply.type();
  if (type == proto::MSG_ERROR_REPLY) {
    proto::ErrorReply err;
    Status st = Decode(reply.payload, &err);
    return Fail(st.ok() ? FromErrorReply(err) : st);
  }
  if (reply.fds_dropped > 0) {
    return Fail(Protocol(MsgTypeName(reply.header.type) + " carried " +
                         std::to_string(reply.fds_dropped) +
                         " fd(s) more than it may; they were closed"));
  }
  uint32_t frames = 0;
  if (type == proto::MSG_ALLOC_REPLY) {
    proto::AllocReply r;
    if (Status st = Decode(reply.payload, &r); !st.ok()) return Fail(st);
    lease_ = std::move(*r.mutable_lease());
    frames = r.extent_frames();
  } else if (type == proto::MSG_ATTACH_REPLY) {
    proto::AttachReply r;
    if (Status st = Decode(reply.payload, &r); !st.ok()) return Fail(st);
    lease_ = std::move(*r.mutable_lease());
    frames = r.extent_frames();
  } else {
    return Fail(Protocol("expected a lease reply (ALLOC_REPLY or ATTACH_REPLY), got " +
                         MsgTypeName(reply.header.type)));
  }
  auto places = PlaceExtents(lease_);
  if (!places.ok()) return Fail(places.status());
  places_ = std::move(*places);
  Status st = fds_.Start("lease " + std::to_string(lease_.id()) + ": ", "the reply", request_id_,
                         lease_.id(), places_.size(), frames, std::move(reply.fds));
  return st.ok() ? st : Fail(st);
}

Status LeaseReplyAssembler::Add(Frame next) {
  if (!started_ || failed_ || complete()) {
    // Whatever it brought is closed with it.
    return Status(Code::kInternal, "lease reply assembler: no reply is waiting for fds");
  }
  Status st = fds_.Add(std::move(next));
  return st.ok() ? st : Fail(st);
}

std::vector<ReceivedExtent> LeaseReplyAssembler::TakeExtents() {
  std::vector<ReceivedExtent> out;
  if (!complete()) return out;
  std::vector<UniqueFd> fds = fds_.Take();
  out.reserve(places_.size());
  for (size_t i = 0; i < places_.size(); ++i) out.push_back({std::move(fds[i]), places_[i]});
  places_.clear();
  started_ = false;
  failed_ = true;  // taken: the assembler is done
  return out;
}

}  // namespace cxlpool::wire
