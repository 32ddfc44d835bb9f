// JournalWriter: the lease manager's writer to the durable side (LeaseStore,
// lease/restart.h) and its lease ids. Every grant is Put before its reply
// leaves, holder changes are Put, every end is a Delete; ids are taken one
// by one and reserved in the store in batches, so a restarted daemon never
// grants an id again. After a hand-over nothing is written any more (the
// next daemon owns the journal).
//
// Without a store (restart support off) every write is OK and ids are just
// counted. Thread safety: the event-loop thread only, like the manager.
#pragma once

#include <cstdint>
#include <span>

#include "cxlpool/common/status.h"
#include "lease/restart.h"

namespace cxlpool {

class JournalWriter {
 public:
  // Ids are reserved this many at a time.
  static constexpr uint64_t kIdBatch = 1024;

  // Writes through `store` from now on; ids from `next_id` on (those below
  // it are taken). Call once, before any grant.
  void Enable(LeaseStore* store, uint64_t next_id);
  // Restart support is on (a store is set), handed over or not.
  bool enabled() const { return store_ != nullptr; }
  // Writes reach the store: enabled and not handed over.
  bool writing() const { return store_ != nullptr && !handed_over_; }
  bool handed_over() const { return handed_over_; }
  // From now on nothing is written (SIGTERM hand-over).
  void HandOver() { handed_over_ = true; }

  // The next lease id, reserving a batch in the store when needed (a failed
  // reservation is logged; the grant's own Put then decides).
  uint64_t NextId();
  // Whether this daemon may have granted `id` (below the next id, not 0).
  bool MayHaveGranted(uint64_t id) const { return id != 0 && id < next_id_; }
  // Recovery: a journalled lease's id is taken and was reserved by the
  // daemon that granted it.
  void TakeJournalledId(uint64_t id);
  // Recovery: an id only the fd store named is taken.
  void TakeStoredId(uint64_t id);
  // Recovery done: reserves a batch past the ids taken when they went past
  // the reservation (errors logged).
  void ReserveTaken();

  // Records a new lease (with its extents' fds) or a holder change (no
  // fds). OK when not writing; errors are logged and returned.
  Status Put(const DurableLease& lease, std::span<const int> fds);
  // The end of a lease (errors logged); nothing when not writing.
  void Delete(uint64_t id);
  // Drops the store's fds of a lease the journal has no record of.
  void ForgetStoredFd(uint64_t id, size_t extents);

 private:
  // Reserves ids below `id + kIdBatch`.
  void ReserveFrom(uint64_t id);

  LeaseStore* store_ = nullptr;
  uint64_t next_id_ = 1;
  uint64_t ids_reserved_ = 0;  // ids below this are reserved in the store
  bool handed_over_ = false;
};

}  // namespace cxlpool
