// TieringEngine: tracks how hot each range of each lease is, asks the
// policy (policy.h) what should move, and moves it through the Migrator
// seam, in place or, for long-term pinned leases, cooperatively.
//
// Signals (docs/daemon.md, "Tiering"):
//  - bytes the holders copied through the client library's copy helpers,
//    per range, sent in batches (OnSignals);
//  - hints for a range: hot, cold, will_need, dont_need. hot and will_need
//    apply to every unit the range touches, cold and dont_need only to units
//    the range covers whole (a part of a unit still in use keeps it warm).
//    Only the owner's (a connection of the lease's owner uid) and an admin's
//    hints act as hints; another holder's (one that attached) are signals
//    of its own use: hot / will_need keep the units warm (halfway between
//    the cold and the hot threshold: never demoted as cold, never promoted
//    by this alone), cold / dont_need change nothing, none is urgent;
//  - CPU-side samples from an AccessSampler, when the kernel offers one;
//  - pool pressure (free bytes against the watermarks), read from the
//    LeaseTable each round.
// Heat decays with `half_life`; temperature is heat per byte (temperature.h).
//
// Moves: one at a time, and no faster on average than `rate_limit` (a token
// bucket; resumed and rolled-back moves count too). A move is:
//   BeginMove (room reserved on the target, intent journalled) ->
//   Migrator::Move on the `mover` executor (never the loop) ->
//   every page verified on the target: CommitMove; else the pages that did
//   move are moved back and AbortMove (or, if even that leaves some behind,
//   AbortMove with a note, so the accounting says the lease is split).
// A move the table reports as begun but that is not this engine's (the
// journal of a daemon killed mid-migration) is resumed first thing; so is a
// move back (LeaseFacts::moving_back: the restart found no room on the
// target), recorded as "rollback". A cooperative one, of several units,
// moves them all in one pause, like a forward move.
//
// Cooperative migration of long-term pinned leases (a holder registered the
// lease with CUDA, or declared another pin such as io_uring fixed buffers):
// after BeginMove, every such holder gets a MigrationAsk push; each answers
// at a safe point of its own with OnMigrationReady once it has dropped its
// pins; when all have, the range moves, and each holder's pending answer is
// replied to with the outcome, after which it pins again. A holder that does
// not answer within `cooperative_deadline`, or declines, cancels the move
// (nothing moved, the reservation released, the others told); the lease is
// then left alone for `cooperative_retry`. A holder is never forced. A
// holder that disconnects no longer pins anything and is not waited for.
//
// Urgent hints (an owner's will_need / dont_need) do not start a full
// round: the lease is queued and an on-demand round is asked for. Requests
// coalesce into at most one pending on-demand round, which starts no sooner
// than `urgent_interval` after the last one and looks only at the queued
// leases (their facts, the pools, the urgent rules of the policy), never at
// every tenant's; what needs room made for it waits for the next periodic
// round. Its loop time is charged to the uids whose hints it served
// (SetBusyCharge: limits.max_busy_per_uid), and each uid may send at most
// `max_urgent_hints_per_uid` urgent hints a second (a bucket of one
// second's worth); beyond that an urgent hint is refused RESOURCE_EXHAUSTED,
// naming the limit.
//
// Every decision and its outcome goes into a bounded history with its reason
// (Report, `cxlpoolctl tiering`).
//
// Thread safety: every public method on the `loop` executor's thread. Moves
// and samples run on `mover` (one thread: the sampler's state lives there)
// and post back; a late completion after the engine is destroyed does nothing.
// Destroy the engine before the LeaseTable, the Migrator and the channel.
//
// The engine is a facade over its units, each with its own state:
//   LeaseBook     (lease_book.h)     per-lease heat, hints, verdicts, pins
//   RoundPlanner  (round_planner.h)  a round: the policy's inputs, verdicts, the move to begin
//   MoveRunner    (move_runner.h)    the one move at a time, cooperative or in place
//   UrgentHints   (urgent_hints.h)   the on-demand queue and each uid's urgent-hint budget
//   RoundTimers   (round_timers.h)   when the periodic and on-demand rounds run
//   SampleRounds  (sample_rounds.h)  the access sampler's rounds on `mover`
//   MigrationLog  (migration_log.h)  the history and the counters
// The rules that decide what moves are in policy.cc.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cxlpool/common/clock.h"
#include "cxlpool/common/status.h"
#include "tiering/engine_types.h"
#include "tiering/lease_book.h"
#include "tiering/lease_table.h"
#include "tiering/migration_log.h"
#include "tiering/migrator.h"
#include "tiering/move_runner.h"
#include "tiering/policy.h"
#include "tiering/round_planner.h"
#include "tiering/round_timers.h"
#include "tiering/sample_rounds.h"
#include "tiering/sampler.h"
#include "tiering/temperature.h"
#include "tiering/urgent_hints.h"

namespace cxlpool::tiering {

class TieringEngine {
 public:
  using Executor = boost::asio::any_io_executor;
  using ReadyDone = std::function<void(Result<MigrationOutcome>)>;
  // Charges daemon time spent for a uid (BusyBudget::Charge).
  using BusyCharge = std::function<void(uid_t uid, std::chrono::nanoseconds busy)>;

  TieringEngine(LeaseTable* table, Migrator* migrator, HolderChannel* holders, const Clock* clock,
                Executor loop, Executor mover, TieringOptions options);
  ~TieringEngine();
  TieringEngine(const TieringEngine&) = delete;
  TieringEngine& operator=(const TieringEngine&) = delete;

  // The sampler (runs on `mover`) and the line that says what the kernel offers.
  void SetSampler(std::unique_ptr<AccessSampler> sampler);
  void SetKernelAccess(std::string description) { kernel_ = std::move(description); }
  // Moves stay off with this reason (a foreign topology, no CAP_SYS_NICE);
  // signals are still taken and temperatures still shown.
  void DisableMoves(std::string why) { runner_.Disable(std::move(why)); }
  // Where the loop time of on-demand rounds is charged, per uid.
  void SetBusyCharge(BusyCharge charge) { busy_charge_ = std::move(charge); }

  // Starts the periodic rounds. Stop cancels them, cancels a cooperative
  // move that waits for holders (they are answered UNAVAILABLE), and asks a
  // running move to stop after its current step.
  void Start();
  void Stop();

  using Signal = RangeSignal;
  // Takes a batch from `from`. Each entry is judged alone; the rejected ones
  // come back with their index: NOT_FOUND (no such lease, or not held by
  // this connection: one answer), INVALID_ARGUMENT (empty range, a range
  // outside the lease, naming both), RESOURCE_EXHAUSTED (an urgent hint
  // over max_urgent_hints_per_uid). A holder that is neither the owner nor
  // an admin has its hints taken as signals (see above).
  std::vector<std::pair<size_t, Status>> OnSignals(const Caller& from,
                                                   const std::vector<Signal>& batch);
  // How long `uid` waits until its bucket holds `n` urgent hints again
  // (0: now; at most a second): the reply to a frame whose urgent hints were
  // refused for rate is held that long, so a flood paces itself.
  int64_t UrgentWaitNs(uid_t uid, uint64_t n);

  // Per-lease settings. `opt_out`: pinned to its tier (the owner uid, or an
  // admin). `cooperative_pin`: this connection holds a long-term pin it can
  // drop at a safe point (any holder). NOT_FOUND (no such lease, or one the
  // caller neither owns nor holds and is not admin of: one answer),
  // PERMISSION_DENIED (a holder that is not the owner asks for opt_out; a
  // non-holder declares a pin).
  Status SetLeaseOptions(const Caller& from, uint64_t lease_id, std::optional<bool> opt_out,
                         std::optional<bool> cooperative_pin);

  // A holder reached its safe point for `migration_id` (ready: its pins are
  // dropped) or declines. `done` is called exactly once: after the move (or
  // at once when declined or when the migration is over: NOT_FOUND).
  void OnMigrationReady(ConnId conn, uint64_t migration_id, bool ready, const std::string& reason,
                        ReadyDone done);

  void OnDisconnect(ConnId conn);

  // What `cxlpoolctl tiering` shows; `owner` set: that uid's leases only.
  TieringReport Report(std::optional<uint32_t> owner) const;

  // One round now (the timer calls it; tests call it with a FakeClock).
  void Tick();
  // The on-demand round over the leases urgent hints queued (its timer
  // calls it; tests may call it).
  void UrgentRound();
  size_t urgent_queued() const { return urgent_.size(); }
  bool busy() const { return runner_.current() != nullptr; }
  const std::map<std::string, uint64_t>& counters() const { return log_.counters(); }

 private:
  // A round: drop the leases that are gone, sample, plan.
  void Round();
  // One lease's part of Report.
  LeaseReport ReportLease(const LeaseFacts& f) const;

  LeaseTable* table_;
  const Clock* clock_;
  TieringOptions options_;
  std::string kernel_;
  BusyCharge busy_charge_;
  RateLimiter limiter_;
  MigrationLog log_;
  LeaseBook book_;
  UrgentHints urgent_;
  SampleRounds samples_;
  RoundTimers timers_;
  MoveRunner runner_;
  RoundPlanner planner_;
};

}  // namespace cxlpool::tiering
