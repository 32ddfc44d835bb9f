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
#pragma once

#include <atomic>
#include <boost/asio/any_io_executor.hpp>
#include <chrono>
#include <climits>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "cxlpool/common/clock.h"
#include "cxlpool/common/status.h"
#include "tiering/lease_table.h"
#include "tiering/migrator.h"
#include "tiering/policy.h"
#include "tiering/sampler.h"
#include "tiering/temperature.h"

namespace cxlpool::tiering {

struct TieringOptions {
  bool enabled = true;
  PolicyConfig policy;
  int64_t half_life_ns = 60'000'000'000;
  int64_t interval_ns = 1'000'000'000;           // one policy round
  uint64_t rate_limit_bytes_per_s = 1ull << 30;  // 0: unlimited
  uint32_t cooperative_deadline_ms = 2000;
  int64_t cooperative_retry_ns = 300'000'000'000;
  // A cooperative move of a range expected to pause its holders longer than
  // this (its size at the throughput measured so far) is not attempted.
  int64_t max_pause_ns = 2'000'000'000;
  // A hot / will_need hint sets the temperature to at least this many times
  // the hot threshold.
  double hint_boost = 2.0;
  // A will_need / dont_need hint that could not be acted on lapses after this.
  int64_t urgent_ttl_ns = 60'000'000'000;
  // On-demand rounds for urgent hints: at most one pending, at least this
  // far apart.
  int64_t urgent_interval_ns = 100'000'000;
  // Urgent hints (will_need, dont_need) a uid may send per second (0: no limit).
  uint32_t max_urgent_hints_per_uid = 1000;
  // Samples: one round at most this often; each adds share x length bytes.
  int64_t sample_interval_ns = 5'000'000'000;
  uint64_t step_bytes = 64ull << 20;
  size_t history = 256;
};

// The answer to a holder's OnMigrationReady.
struct MigrationOutcome {
  bool moved = false;
  int numa_node = -1;  // where the range is now (-1 unknown)
  uint64_t bytes = 0;
  int64_t move_ns = 0;
  std::string detail;
};

struct MigrationRecord {
  uint64_t migration_id = 0;
  int64_t unix_time = 0;
  uint64_t lease_id = 0;
  uint32_t unit = 0;
  uint64_t bytes = 0;
  std::string from_pool;
  std::string to_pool;
  std::string direction;  // "promote", "demote", "resume", "rollback"
  std::string mode;       // "in-place", "cooperative"
  std::string outcome;    // "moved", "rolled back", "split", "refused", "skipped", "failed", "gone"
  std::string why;        // the policy's reason
  std::string detail;     // what happened (the migrator's report, the error)
  int64_t move_ns = 0;
  int64_t pause_ns = 0;  // cooperative: first holder ready -> answers sent
};

struct UnitReport {
  uint32_t unit = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  std::string pool;
  int numa_node = -1;
  double temperature = 0;
  std::string verdict;
  uint64_t bytes_read = 0;  // signalled by holders, since start
  uint64_t bytes_written = 0;
  uint64_t hints = 0;
  uint64_t sampled_pages = 0;  // sampler
  uint64_t accessed_pages = 0;
  int64_t last_moved_unix = 0;
};

struct LeaseReport {
  uint64_t id = 0;
  std::string label;
  uint32_t owner_uid = 0;
  int32_t priority = 0;
  bool opted_out = false;
  bool cooperative = false;
  std::string cooperative_state;
  std::string moving;  // a move under way or left split
  std::vector<UnitReport> units;
};

struct TieringReport {
  bool enabled = false;
  std::string disabled_why;
  std::string sampler;
  std::string kernel;
  uint64_t rate_limit_bytes_per_s = 0;
  double hot_threshold = 0;
  double cold_threshold = 0;
  int64_t half_life_ns = 0;
  std::vector<std::string> pressure;
  std::string in_flight;
  std::vector<LeaseReport> leases;
  std::vector<MigrationRecord> history;  // oldest first
  std::map<std::string, uint64_t> counters;
};

// Who sent a request: its connection, its uid, whether it is an admin.
struct Caller {
  ConnId conn = 0;
  uid_t uid = static_cast<uid_t>(-1);
  bool admin = false;
};

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
  void DisableMoves(std::string why) { moves_off_ = std::move(why); }
  // Where the loop time of on-demand rounds is charged, per uid.
  void SetBusyCharge(BusyCharge charge) { busy_charge_ = std::move(charge); }

  // Starts the periodic rounds. Stop cancels them, cancels a cooperative
  // move that waits for holders (they are answered UNAVAILABLE), and asks a
  // running move to stop after its current step.
  void Start();
  void Stop();

  struct Signal {
    uint64_t lease_id = 0;
    uint64_t offset = 0;
    uint64_t length = 0;
    uint64_t bytes_read = 0;
    uint64_t bytes_written = 0;
    std::optional<Hint> hint;
  };
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
  bool busy() const { return move_.has_value(); }
  const std::map<std::string, uint64_t>& counters() const { return counters_; }

 private:
  struct UnitTrack {
    uint64_t offset = 0;
    uint64_t length = 0;
    Heat heat;
    std::optional<Hint> urgent;
    int64_t urgent_ns = 0;
    int64_t last_moved_ns = 0;
    int64_t last_moved_unix = 0;
    int64_t refused_until_ns = 0;
    std::string refused_why;
    uint64_t bytes_read = 0;
    uint64_t bytes_written = 0;
    uint64_t hints = 0;
    uint64_t sampled = 0;
    uint64_t accessed = 0;
    std::string verdict;
  };
  struct LeaseTrack {
    std::vector<UnitTrack> units;
    bool opted_out = false;
    std::set<ConnId> pinned_by;
    int64_t coop_retry_ns = 0;
    std::string coop_why;
  };
  struct Move {
    uint64_t id = 0;
    Decision d;
    std::string kind;  // "promote", "demote", "resume", "rollback" (a move back)
    int from_node = -1;
    int to_node = -1;
    uint64_t page_size = 4096;
    bool cooperative = false;
    bool running = false;
    bool rolling_back = false;
    int64_t begun_ns = 0;
    int64_t deadline_ns = 0;
    int64_t first_ready_ns = 0;
    std::set<ConnId> waiting;
    std::map<ConnId, ReadyDone> ready;
    std::map<ConnId, pid_t> pids;
    // Where the lease was accounted mostly (its holders are told when that changes).
    std::string lease_pool;
    // Cooperative, several units: the units to move after `d.unit` within
    // the same pause (every unit not on the target), and what moved so far.
    std::deque<uint32_t> next_units;
    uint32_t units = 1;  // of the lease
    std::string first_why;
    uint32_t units_moved = 0;
    uint64_t bytes_moved = 0;
    // NextUnit could not begin the move of this unit (no room, quota): the
    // pause ends with the lease split; recorded as refused after the others.
    std::optional<uint32_t> refused_unit;
    std::string refused_detail;
  };

  LeaseTrack& Track(const LeaseFacts& f);
  void SyncUnits(LeaseTrack& t, const LeaseFacts& f);
  double Temperature(const UnitTrack& u) const;
  std::string Evidence(const UnitTrack& u) const;
  void ApplyHint(UnitTrack& u, Hint h, bool whole, int64_t now);
  void MaybeSample(const std::vector<LeaseFacts>& leases);
  // Whether `from` may take an urgent hint now (its uid's bucket).
  Status TakeUrgent(const Caller& from, int64_t now);
  // Queues lease `id` for the on-demand round (its hint came from `uid`).
  void QueueUrgent(uint64_t id, uid_t uid);
  void ScheduleUrgent();
  // A round: refresh, decide, start a move when none runs.
  void Round();
  // What Round decides over `leases` (all of them, or only those urgent
  // hints queued: `urgent_only`, which keeps only the urgent rules'
  // decisions); starts a move when none runs.
  void Plan(const std::vector<LeaseFacts>& leases, bool urgent_only);
  std::vector<UnitState> UnitStates(const std::vector<LeaseFacts>& leases, int64_t now);
  // An unfinished move (a daemon killed mid-migration) among `leases`, begun again.
  bool ResumeUnfinished(const std::vector<LeaseFacts>& leases, int64_t now);
  std::vector<PoolState> RefreshPools();
  // `also`: more units of the same lease the policy sends to the same pool
  // this round, moved in the same pause when its holders pin it.
  void Begin(const Decision& d, const LeaseFacts& f, bool resume,
             const std::vector<uint32_t>& also = {});
  void Run();
  void Moved(uint64_t id, Result<MoveReport> r);
  // Cooperative, several units: the next unit of the same pause, if any.
  bool NextUnit();
  void RolledBack(uint64_t id, std::string first, Result<MoveReport> r);
  // `recorded`: the last unit's record is written already (a pause of several units).
  void Finish(const std::string& outcome, const std::string& detail, int64_t move_ns, bool moved,
              bool recorded = false);
  void CancelCooperative(const std::string& why);
  void Record(const Move& m, const std::string& outcome, const std::string& detail,
              int64_t move_ns);
  void ScheduleRound(int64_t delay_ns);
  int NodeOfPool(const std::string& pool) const;
  void Count(const std::string& k, uint64_t by = 1) { counters_[k] += by; }

  LeaseTable* table_;
  Migrator* migrator_;
  HolderChannel* holders_;
  const Clock* clock_;
  Executor loop_;
  Executor mover_;
  TieringOptions options_;
  RateLimiter limiter_;
  std::string kernel_;
  std::string moves_off_;
  std::shared_ptr<AccessSampler> sampler_;
  bool sampling_ = false;
  int64_t last_sample_ns_ = 0;

  std::map<uint64_t, LeaseTrack> tracks_;
  std::optional<Move> move_;
  uint64_t next_migration_id_ = 1;
  std::deque<MigrationRecord> history_;
  std::map<std::string, uint64_t> counters_;
  std::vector<std::string> pressure_;
  std::map<std::string, int> pool_nodes_;
  double measured_bps_ = 2e9;  // in-place throughput seen so far (EWMA)
  bool started_ = false;
  bool stopped_ = false;
  std::shared_ptr<std::atomic<bool>> cancel_ = std::make_shared<std::atomic<bool>>(false);
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  std::shared_ptr<void> timer_;  // boost::asio::steady_timer
  bool round_scheduled_ = false;
  // On-demand rounds: the queued leases (-> the uid whose hint queued it),
  // their timer, and each uid's bucket of urgent hints.
  std::map<uint64_t, uid_t> urgent_;
  std::shared_ptr<void> urgent_timer_;
  bool urgent_scheduled_ = false;
  int64_t last_urgent_round_ns_ = INT64_MIN / 2;
  std::map<uid_t, RateLimiter> urgent_buckets_;
  BusyCharge busy_charge_;
};

}  // namespace cxlpool::tiering
