#include "server/admission.h"

namespace cxlpool {

namespace {

// Names of the four shared resources' limits (server/limits.h).
constexpr ShareNames kConnNames{"max_connections", "max_connections_per_uid",
                                "reserved_connections", "connections"};
constexpr ShareNames kRequestNames{"max_requests", "max_requests_per_uid", "max_requests",
                                   "requests in flight"};
constexpr ShareNames kQueueNames{"max_queued_bytes", "max_queued_bytes_per_uid", "max_queued_bytes",
                                 "queued reply bytes"};
constexpr ShareNames kFdNames{"max_fds", "max_fds_per_uid", "max_fds", "fds"};

std::optional<Refusal> Check(const FairShare& share, const ShareNames& names, uid_t uid,
                             uint64_t n) {
  const FairShare::Verdict v = share.Check(uid, n);
  if (v == FairShare::Verdict::kOk) return std::nullopt;
  return Refusal{LimitName(names, v), Explain(share, names, v, uid, n),
                 v == FairShare::Verdict::kPerUid};
}

}  // namespace

Admission::Admission(const ServerLimits& l, BusyBudget* shared_busy)
    : max_fds_per_frame_(l.max_fds_per_frame),
      own_busy_(l.max_busy_per_uid),
      busy_(shared_busy != nullptr ? shared_busy : &own_busy_),
      conns_(l.max_connections, l.max_connections_per_uid, l.reserved_connections),
      requests_(l.max_requests, l.max_requests_per_uid, l.max_requests / 16),
      queued_(l.max_queued_bytes, l.max_queued_bytes_per_uid, l.max_queued_bytes / 16),
      fds_(l.max_fds, l.max_fds_per_uid, l.max_fds / 16) {}

std::optional<Refusal> Admission::CheckConnection(uid_t uid) const {
  return Check(conns_, kConnNames, uid, 1);
}

std::optional<Refusal> Admission::CheckRequest(uid_t uid) const {
  return Check(requests_, kRequestNames, uid, 1);
}

void Admission::AddRequest(uid_t uid, Clock::time_point now) {
  requests_.Add(uid, 1);
  busy_->SetInFlight(uid, requests_.used(uid), now);
}

void Admission::RemoveRequest(uid_t uid, Clock::time_point now) {
  requests_.Sub(uid, 1);
  busy_->SetInFlight(uid, requests_.used(uid), now);
}

std::optional<Refusal> Admission::CheckQueued(uid_t uid, uint64_t cost) const {
  return Check(queued_, kQueueNames, uid, cost);
}

std::optional<Refusal> Admission::CheckFds(uid_t uid, uint64_t n) const {
  return Check(fds_, kFdNames, uid, n);
}

void Admission::SyncFds(uid_t uid, uint64_t held, uint64_t* charged) {
  if (held > *charged) fds_.Add(uid, held - *charged);
  if (held < *charged) fds_.Sub(uid, *charged - held);
  *charged = held;
}

Admission::FdAllowance Admission::FdAllowanceFor(uid_t uid, uint64_t charged) const {
  const uint64_t avail = fds_.Available(uid);
  FdAllowance a;
  a.fds = charged + avail;
  if (a.fds < max_fds_per_frame_) a.limit = LimitName(kFdNames, fds_.Check(uid, avail + 1));
  return a;
}

}  // namespace cxlpool
