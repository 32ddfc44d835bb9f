#include "server/limits.h"

#include <algorithm>

#include "cxlpool/common/log.h"
#include "cxlpool/proto/frame.h"

namespace cxlpool {

ServerLimits ServerLimits::ForFdLimit(uint64_t nofile) {
  ServerLimits l;
  l.max_connections = std::clamp<uint64_t>(nofile / 16, 16, 4096);
  l.max_connections_per_uid = std::max<uint64_t>(1, l.max_connections / 4);
  l.reserved_connections = l.max_connections / 16;
  l.max_fds = std::clamp<uint64_t>(nofile / 8, 64, 65536);
  l.max_fds_per_uid = std::max<uint64_t>(l.max_fds_per_frame, l.max_fds / 4);
  return l;
}

uint64_t ServerLimits::FdsReserved() const { return 2 * max_connections + max_fds; }

namespace {

Status Bad(const std::string& key, const std::string& what) {
  return Status(Code::kInvalidArgument, "limits." + key + ": " + what);
}

Status CheckShare(const char* total_key, uint64_t total, const char* per_uid_key, uint64_t per_uid,
                  const char* reserved_key, uint64_t reserved) {
  if (total == 0) return Bad(total_key, "must be at least 1");
  if (per_uid == 0) return Bad(per_uid_key, "must be at least 1");
  if (per_uid > total) {
    return Bad(per_uid_key, std::to_string(per_uid) + " is above limits." + total_key + " (" +
                                std::to_string(total) + ")");
  }
  if (reserved_key != nullptr && reserved >= total) {
    return Bad(reserved_key, std::to_string(reserved) + " leaves nothing of limits." + total_key +
                                 " (" + std::to_string(total) + ")");
  }
  return Status::Ok();
}

}  // namespace

Status ServerLimits::Validate(uint64_t max_frame_bytes) const {
  CXLPOOL_RETURN_IF_ERROR(CheckShare("max_connections", max_connections, "max_connections_per_uid",
                                     max_connections_per_uid, "reserved_connections",
                                     reserved_connections));
  CXLPOOL_RETURN_IF_ERROR(CheckShare("max_requests", max_requests, "max_requests_per_uid",
                                     max_requests_per_uid, nullptr, 0));
  if (max_requests_per_connection == 0) return Bad("max_requests_per_connection", "must be >= 1");
  if (max_requests_per_connection > max_requests_per_uid) {
    return Bad("max_requests_per_connection", "above limits.max_requests_per_uid");
  }
  CXLPOOL_RETURN_IF_ERROR(CheckShare("max_queued_bytes", max_queued_bytes,
                                     "max_queued_bytes_per_uid", max_queued_bytes_per_uid, nullptr,
                                     0));
  const uint64_t one_frame = wire::kFrameHeaderSize + max_frame_bytes + kFrameOverhead;
  if (max_queued_bytes_per_connection < one_frame) {
    return Bad("max_queued_bytes_per_connection",
               "must hold one reply of the largest size (" + std::to_string(one_frame) + " bytes)");
  }
  if (max_queued_bytes_per_connection > max_queued_bytes_per_uid) {
    return Bad("max_queued_bytes_per_connection", "above limits.max_queued_bytes_per_uid");
  }
  CXLPOOL_RETURN_IF_ERROR(
      CheckShare("max_fds", max_fds, "max_fds_per_uid", max_fds_per_uid, nullptr, 0));
  if (max_fds_per_frame > wire::kHardMaxFdsPerFrame) {
    return Bad("max_fds_per_frame",
               "at most " + std::to_string(wire::kHardMaxFdsPerFrame) + " (SCM_MAX_FD)");
  }
  if (max_fds_per_frame > max_fds_per_uid) {
    return Bad("max_fds_per_frame", "above limits.max_fds_per_uid");
  }
  if (max_request_bytes < 1024 || max_request_bytes > max_frame_bytes) {
    return Bad("max_request_bytes",
               "must be 1K.." + std::to_string(max_frame_bytes) + " (the largest frame)");
  }
  if (hello_timeout.count() <= 0) return Bad("hello_timeout", "must be positive");
  if (frame_timeout.count() <= 0) return Bad("frame_timeout", "must be positive");
  if (idle_timeout.count() < 0) return Bad("idle_timeout", "must not be negative");
  if (send_timeout.count() < 0) return Bad("send_timeout", "must not be negative");
  return Status::Ok();
}

FairShare::Verdict FairShare::Check(uid_t uid, uint64_t n) const {
  const uint64_t mine = used(uid);
  if (n > total_ || used_ > total_ - n) return Verdict::kTotal;
  if (n > per_uid_ || mine > per_uid_ - n) return Verdict::kPerUid;
  if (mine > 0 && used_ + n > total_ - std::min(reserved_, total_)) return Verdict::kReserve;
  return Verdict::kOk;
}

uint64_t FairShare::Available(uid_t uid) const {
  const uint64_t mine = used(uid);
  uint64_t room = per_uid_ > mine ? per_uid_ - mine : 0;
  uint64_t limit = total_ - (mine > 0 ? std::min(reserved_, total_) : 0);
  room = std::min(room, limit > used_ ? limit - used_ : 0);
  return room;
}

void FairShare::Add(uid_t uid, uint64_t n) {
  if (n == 0) return;
  by_uid_[uid] += n;
  used_ += n;
}

void FairShare::Sub(uid_t uid, uint64_t n) {
  if (n == 0) return;
  auto it = by_uid_.find(uid);
  CXLPOOL_CHECK(it != by_uid_.end() && it->second >= n && used_ >= n);
  it->second -= n;
  used_ -= n;
  if (it->second == 0) by_uid_.erase(it);
}

uint64_t FairShare::used(uid_t uid) const {
  auto it = by_uid_.find(uid);
  return it == by_uid_.end() ? 0 : it->second;
}

const char* LimitName(const ShareNames& names, FairShare::Verdict v) {
  switch (v) {
    case FairShare::Verdict::kPerUid:
      return names.per_uid;
    case FairShare::Verdict::kTotal:
      return names.total;
    case FairShare::Verdict::kReserve:
      return names.reserved;
    case FairShare::Verdict::kOk:
      break;
  }
  return "";
}

std::string Explain(const FairShare& share, const ShareNames& names, FairShare::Verdict v,
                    uid_t uid, uint64_t n) {
  const std::string u = std::to_string(uid);
  switch (v) {
    case FairShare::Verdict::kPerUid:
      return "uid " + u + " holds " + std::to_string(share.used(uid)) + " " + names.unit +
             " and asks for " + std::to_string(n) + " more; limits." + names.per_uid + " is " +
             std::to_string(share.per_uid());
    case FairShare::Verdict::kTotal:
      return "the daemon holds " + std::to_string(share.used()) + " " + names.unit +
             " for its clients; limits." + names.total + " is " + std::to_string(share.total());
    case FairShare::Verdict::kReserve: {
      const std::string reserve = std::string(names.reserved) == names.total
                                      ? "1/16 of limits." + std::string(names.total)
                                      : "limits." + std::string(names.reserved);
      return "the daemon holds " + std::to_string(share.used()) + " " + names.unit + " of limits." +
             names.total + " = " + std::to_string(share.total()) + "; the last " +
             std::to_string(share.reserved()) + " (" + reserve +
             ") are kept for uids that hold none, and uid " + u + " holds " +
             std::to_string(share.used(uid));
    }
    case FairShare::Verdict::kOk:
      break;
  }
  return "";
}

}  // namespace cxlpool
