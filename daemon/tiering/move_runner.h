// MoveRunner: the one move at a time. Begin reserves room on the target
// (LeaseTable::BeginMove) and, when the lease's holders pin it long-term, asks
// them to drop their pins (cooperative); the range then moves on the `mover`
// executor, in place paced to the rate limit or, paused, as fast as it goes;
// every page verified on the target: CommitMove; else the range is moved back
// and AbortMove (or AbortMove with a note: the lease is left split). A
// cooperative move of several units moves them all in the one pause.
//
// It records each outcome in the MigrationLog, notes refusals, moves and
// cooperative back-offs in the LeaseBook, and when a move ends asks for a
// round (`round_after`). On the loop's thread; a late completion after it is
// destroyed does nothing.
#pragma once

#include <atomic>
#include <boost/asio/any_io_executor.hpp>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cxlpool/common/clock.h"
#include "cxlpool/common/status.h"
#include "tiering/engine_types.h"
#include "tiering/lease_book.h"
#include "tiering/lease_table.h"
#include "tiering/migration_log.h"
#include "tiering/migrator.h"
#include "tiering/policy.h"
#include "tiering/temperature.h"

namespace cxlpool::tiering {

class MoveRunner {
 public:
  using Executor = boost::asio::any_io_executor;
  using ReadyDone = std::function<void(Result<MigrationOutcome>)>;

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

  struct Parts {
    LeaseTable* table = nullptr;
    Migrator* migrator = nullptr;
    HolderChannel* holders = nullptr;
    const Clock* clock = nullptr;
    Executor loop;
    Executor mover;
    const TieringOptions* options = nullptr;
    LeaseBook* book = nullptr;
    MigrationLog* log = nullptr;
    RateLimiter* limiter = nullptr;
    // The periodic round in this many ns (a cooperative deadline to check).
    std::function<void(int64_t)> schedule_round;
    // A round now, after a move ended.
    std::function<void()> round_after;
  };

  explicit MoveRunner(Parts parts);
  ~MoveRunner();
  MoveRunner(const MoveRunner&) = delete;
  MoveRunner& operator=(const MoveRunner&) = delete;

  // The move under way, if any.
  const Move* current() const { return move_ ? &*move_ : nullptr; }
  // Why moves are off ("" on).
  const std::string& off() const { return moves_off_; }
  void Disable(std::string why) { moves_off_ = std::move(why); }
  // In-place throughput seen so far (EWMA), bytes per second.
  double measured_bps() const { return measured_bps_; }
  // Where each pool's memory is (from the last round's pools).
  void SetPoolNodes(std::map<std::string, int> nodes) { pool_nodes_ = std::move(nodes); }

  // Starts the move `d` of lease `f`. `resume`: the table has it begun
  // already. `also`: more units of the lease the policy sends to the same
  // pool, moved in the same pause when its holders pin it.
  void Begin(const Decision& d, const LeaseFacts& f, bool resume,
             const std::vector<uint32_t>& also = {});
  // A cooperative move past its deadline with holders not ready is cancelled.
  void CheckDeadline(int64_t now);
  void OnMigrationReady(ConnId conn, uint64_t migration_id, bool ready, const std::string& reason,
                        ReadyDone done);
  void OnDisconnect(ConnId conn);
  // Asks a running move to stop after its step; cancels one that waits for
  // holders (they are answered); no round follows a move's end.
  void Stop();

 private:
  void Run();
  // Runs `req` on the mover, then `then` with its report on the loop.
  void Post(MoveRequest req, UniqueFd fd, std::function<void(Result<MoveReport>)> then);
  void Moved(uint64_t id, Result<MoveReport> r);
  // Every page is on the target: commit and tell the holders.
  void Committed(const MoveReport& r);
  // Not every page moved (or the state is unknown): move the range back.
  void MoveBack(uint64_t id, const Result<MoveReport>& r);
  // Cooperative, several units: the next unit of the same pause, if any.
  bool NextUnit();
  void RolledBack(uint64_t id, const std::string& first, Result<MoveReport> r);
  // `recorded`: the last unit's record is written already (a pause of several units).
  void Finish(const std::string& outcome, const std::string& detail, int64_t move_ns, bool moved,
              bool recorded = false);
  // Answers the holders of a cooperative move that ended (`now`).
  void Answer(const Move& m, const std::string& outcome, const std::string& detail, int64_t move_ns,
              bool moved, int64_t now);
  void CancelCooperative(const std::string& why);
  void Ask(const LeaseFacts& f, int64_t now);
  void Record(const Move& m, const std::string& outcome, const std::string& detail,
              int64_t move_ns);
  int NodeOfPool(const std::string& pool) const;

  Parts p_;
  const TieringOptions& options_;
  std::optional<Move> move_;
  uint64_t next_migration_id_ = 1;
  std::string moves_off_;
  std::map<std::string, int> pool_nodes_;
  double measured_bps_ = 2e9;
  bool stopped_ = false;
  std::shared_ptr<std::atomic<bool>> cancel_ = std::make_shared<std::atomic<bool>>(false);
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

// The pool holding most of a lease's bytes (the first of its units' on a tie).
std::string MostOn(const LeaseFacts& f);

}  // namespace cxlpool::tiering
