// Recovery: the durable side of restart support. JournalStore is the
// LeaseStore the lease manager writes through: the lease journal in the
// state directory (daemon/journal) and, under systemd, the fd store (every
// lease memfd pushed as "lease-<id>", removed when the lease ends). At start
// it locks the state directory (one daemon per directory), replays the
// journal, and sorts the fds systemd handed back.
//
// Thread safety: a JournalStore belongs to the event-loop thread (the
// journal is not thread-safe); the free functions are reentrant.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cxlpool/common/status.h"
#include "cxlpool/common/unique_fd.h"
#include "journal.h"
#include "lease/restart.h"
#include "sd.h"

namespace cxlpool {

// Where the journal lives: --state-dir, else daemon.state_dir, else
// $STATE_DIRECTORY (systemd; the first of a ':'-separated list), else
// `fallback` (DefaultStateDir) — but only for a daemon on its configured
// socket: one started with --socket and no explicit state dir is an ad-hoc
// instance (tests, experiments) and gets "" (no journal: leases do not
// survive its restart), so it can never replay another daemon's leases.
struct StateDirChoice {
  std::string flag;
  std::string config;
  const char* state_directory_env = nullptr;
  std::string fallback;
  bool socket_from_flag = false;
};
std::string ChooseStateDir(const StateDirChoice& c);

journal::LeaseRecord ToRecord(const DurableLease& d);
// What the lease manager needs of the journal's damage report.
JournalHealth HealthOf(const JournalState& state);
DurableLease FromRecord(const journal::LeaseRecord& r);

// The fd store's name of extent `extent` of lease `id` of `extents`:
// "lease-<id>" for a lease of one extent (as every older daemon named it),
// "lease-<id>-extent-<i>" for each extent of a lease of several.
std::string StoredFdName(uint64_t id, size_t extent, size_t extents);

// Splits inherited fds: those named as StoredFdName names them go to the
// result (by id, each at its extent index; an index nobody filled stays an
// invalid fd); the rest stay in `fds`. A second fd for the same name is
// closed.
std::map<uint64_t, std::vector<UniqueFd>> TakeLeaseFds(std::vector<InheritedFd>* fds);

class JournalStore final : public LeaseStore {
 public:
  // Creates `dir` (0700) if needed, takes an exclusive lock on dir/lock
  // (ALREADY_EXISTS names the path when another daemon holds it), opens and
  // replays dir/leases.journal. `notifier` may be null or disabled (no fd
  // store then); it must outlive the store.
  static Result<std::unique_ptr<JournalStore>> Open(const std::string& dir, Notifier* notifier);

  // The leases the journal knew at Open, and the first id never granted.
  std::vector<DurableLease> JournalledLeases() const;
  uint64_t next_id() const { return journal_.state().next_id; }
  const JournalState& state() const { return journal_.state(); }

  Status ReserveIds(uint64_t next_id) override;
  Status Put(const DurableLease& lease, std::span<const int> fds) override;
  Status Delete(uint64_t id) override;

  // Removes the fd-store entries of a lease of `extents` (one no journal
  // record claims, or one that ended).
  void ForgetStoredFd(uint64_t id, size_t extents = 1) override;

 private:
  JournalStore(LeaseJournal journal, UniqueFd lock, Notifier* notifier)
      : journal_(std::move(journal)), lock_(std::move(lock)), notifier_(notifier) {}
  bool fd_store() const { return notifier_ != nullptr && notifier_->enabled(); }

  LeaseJournal journal_;
  UniqueFd lock_;
  Notifier* notifier_;
};

}  // namespace cxlpool
