// Admission: what the server lets each uid make the daemon hold, and when it
// reads a uid's sockets. It owns the four fair shares of server/limits.h
// (connections, requests in flight, queued reply bytes, fds; each a whole-
// daemon limit, a per-uid limit and a reserve for uids that hold none) and
// the busy budget (server/busy_budget.h) that holds a heavy uid to
// limits.max_busy_per_uid next to a lighter one.
//
// Check* answers whether `uid` may take more, and when not, a Refusal that
// names the `limits.` key and says why in a sentence for the client; Add*
// and Remove* keep the counts (a broken count is a crash). Requests in
// flight are also the uid's demand the busy budget weighs.
//
// Thread safety: single-owner (the server's event-loop thread).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "server/busy_budget.h"
#include "server/limits.h"

namespace cxlpool {

// Why a uid may not take more: the limit's key without "limits."
// ("max_connections_per_uid") and the sentence a refused client reads.
struct Refusal {
  const char* limit = "";
  std::string why;
  bool per_uid = false;  // the uid's own limit (not the daemon's) was reached
};

class Admission {
 public:
  using Clock = BusyBudget::Clock;

  // `shared_busy` (borrowed; may be nullptr): where daemon time is charged
  // when others (the lease manager's workers) charge it too; nullptr: an
  // own budget from limits.max_busy_per_uid.
  Admission(const ServerLimits& limits, BusyBudget* shared_busy);
  Admission(const Admission&) = delete;
  Admission& operator=(const Admission&) = delete;

  // Connections.
  std::optional<Refusal> CheckConnection(uid_t uid) const;
  void AddConnection(uid_t uid) { conns_.Add(uid, 1); }
  void RemoveConnection(uid_t uid) { conns_.Sub(uid, 1); }

  // Requests handed to the handler and not answered yet.
  std::optional<Refusal> CheckRequest(uid_t uid) const;
  void AddRequest(uid_t uid, Clock::time_point now);
  void RemoveRequest(uid_t uid, Clock::time_point now);

  // Reply bytes queued for clients that do not read (kFrameOverhead each).
  std::optional<Refusal> CheckQueued(uid_t uid, uint64_t cost) const;
  void AddQueued(uid_t uid, uint64_t cost) { queued_.Add(uid, cost); }
  void RemoveQueued(uid_t uid, uint64_t cost) { queued_.Sub(uid, cost); }

  // Fds held for clients.
  std::optional<Refusal> CheckFds(uid_t uid, uint64_t n) const;
  void AddFds(uid_t uid, uint64_t n) { fds_.Add(uid, n); }
  void RemoveFds(uid_t uid, uint64_t n) { fds_.Sub(uid, n); }
  // Moves what a holder of fds has charged (`*charged`) to what it holds now.
  void SyncFds(uid_t uid, uint64_t held, uint64_t* charged);

  // The fds a reader that has `charged` of them may hold for one frame, and
  // the limit (a fd key) that cut it below max_fds_per_frame (nullptr: none).
  struct FdAllowance {
    uint64_t fds = 0;
    const char* limit = nullptr;
  };
  FdAllowance FdAllowanceFor(uid_t uid, uint64_t charged) const;

  // Daemon time.
  BusyBudget& busy() { return *busy_; }
  bool Throttled(uid_t uid, Clock::time_point now) { return busy_->Throttled(uid, now); }
  Clock::time_point RefilledAt(uid_t uid, Clock::time_point now) {
    return busy_->RefilledAt(uid, now);
  }

  // In use now, by all uids.
  uint64_t connections() const { return conns_.used(); }
  uint64_t requests() const { return requests_.used(); }
  uint64_t queued_bytes() const { return queued_.used(); }
  uint64_t fds() const { return fds_.used(); }
  uint64_t fds(uid_t uid) const { return fds_.used(uid); }

 private:
  const uint64_t max_fds_per_frame_;
  BusyBudget own_busy_;
  BusyBudget* busy_;
  FairShare conns_, requests_, queued_, fds_;
};

}  // namespace cxlpool
