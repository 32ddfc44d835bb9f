// The narrow interfaces the tiering engine consumes, so that it knows
// nothing of how the daemon keeps its leases:
//
//  - LeaseTable: the leases (each an ordered list of units: byte ranges that
//    move as one: an extent, each its own memfd, each accounted to its own
//    pool), the pools, a way to open a unit's memory for a move, and the
//    accounting of a move (begin: room for the unit reserved on the target
//    and the intent journalled; commit: the unit's bytes and its tenant's
//    quota charge move to the target; abort: the reservation goes, and a
//    note says when the pages are left split). The daemon implements it over LeaseManager
//    (lease_adapter.h); tests implement it with a map.
//  - HolderChannel: server pushes to the holders of a lease (the
//    cooperative migration of long-term pinned memory).
//
// Thread safety: both are called on the event-loop thread only.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cxlpool/common/status.h"
#include "cxlpool/common/unique_fd.h"

namespace cxlpool::tiering {

using ConnId = uint64_t;

struct PoolFacts {
  std::string name;
  int numa_node = -1;
  std::string kind;      // node kind: dram, cxl, ... ("devdax" pools: their node's kind)
  bool movable = false;  // memfd-backed: pages can move in and out
  uint64_t capacity_bytes = 0;
  uint64_t free_bytes = 0;
};

struct UnitFacts {
  uint64_t offset = 0;  // in the lease
  uint64_t length = 0;
  uint64_t page_size = 4096;
  std::string pool;  // where this unit is accounted (units of one lease may differ)
  int numa_node = -1;
};

struct LeaseFacts {
  uint64_t id = 0;
  uint64_t size_bytes = 0;
  std::vector<UnitFacts> units;  // in lease order, adding up to size_bytes
  std::string backing;           // "memfd", "memfd-thp", "hugetlb-2m", "devdax"
  std::string label;
  uid_t owner_uid = static_cast<uid_t>(-1);
  pid_t owner_pid = -1;
  std::string owner_comm;
  int32_t priority = 0;            // the owner's priority class (quota.h)
  std::vector<ConnId> holders;     // connections holding it
  std::vector<pid_t> holder_pids;  // their processes
  std::string not_movable;         // "" when its memory can move now; else why not
  bool long_term_pin = false;      // asked for as long-term pinned when allocated
  std::string promote_pool;        // fast pool nearest its holder's GPU ("" none)
  std::string demote_pool;         // slow pool nearest it ("" none)
  // A move of one unit begun and not finished (reservation held on this
  // pool), e.g. journalled by a daemon that was killed mid-migration; ""
  // none.
  std::string moving_to;
  uint32_t moving_unit = 0;  // the unit it is of
  std::string moving_note;   // what the accounting says about it
  // moving_to is the pool that accounts that unit: a move back of pages an
  // interrupted move left elsewhere.
  bool moving_back = false;
};

// A unit's memory, opened for a move or for sampling: a dup of the fd
// holding it and where the unit starts in that file.
struct UnitMemory {
  UniqueFd fd;
  uint64_t file_offset = 0;
};

class LeaseTable {
 public:
  virtual ~LeaseTable() = default;
  virtual std::vector<LeaseFacts> Leases() const = 0;
  virtual std::optional<LeaseFacts> Find(uint64_t id) const = 0;
  virtual std::vector<PoolFacts> Pools() const = 0;
  // NOT_FOUND (no such lease or unit), UNSUPPORTED (devdax), UNAVAILABLE
  // (its memory is not back after a restart), IO (dup).
  virtual Result<UnitMemory> OpenUnit(uint64_t id, uint32_t unit) = 0;
  // Reserves room for the unit on `to_pool` and journals the intent.
  // RESOURCE_EXHAUSTED (no room, the tenant's quota on that tier, or its
  // priority class's reserve, naming which), NOT_FOUND, INVALID_ARGUMENT
  // (same pool, not movable), ALREADY_EXISTS (another move of the lease is
  // under way), IO (journal).
  virtual Status BeginMove(uint64_t id, uint32_t unit, const std::string& to_pool) = 0;
  // The unit's pages are all on the target (verified): its accounting and
  // its tenant's quota move there; journalled. NOT_FOUND (the lease ended
  // meanwhile: nothing to do), INTERNAL (no move of that unit begun).
  virtual Status CommitMove(uint64_t id, uint32_t unit) = 0;
  // The move did not finish. `split_note` empty: the pages are whole where
  // they were, the reservation is released. Non-empty: some pages are
  // still on the target; the reservation stays and the note is what the
  // lease's accounting says until a later move makes it whole.
  virtual Status AbortMove(uint64_t id, uint32_t unit, const std::string& split_note) = 0;
};

// What the daemon tells a holder of a long-term pinned lease (docs/protocol.md,
// "Cooperative migration").
struct MigrationAsk {
  uint64_t migration_id = 0;
  uint64_t lease_id = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  int target_node = -1;
  uint32_t deadline_ms = 0;  // reach a safe point and answer within this
  std::string why;
};

struct MigrationNotice {
  uint64_t migration_id = 0;
  uint64_t lease_id = 0;
  std::string phase;  // "cancelled"
  std::string why;
};

class HolderChannel {
 public:
  virtual ~HolderChannel() = default;
  // Pushes a PREPARE to `conn`. UNAVAILABLE / NOT_FOUND when it cannot be told.
  virtual Status Ask(ConnId conn, const MigrationAsk& ask) = 0;
  // Pushes a CANCELLED (errors logged by the implementation).
  virtual void Tell(ConnId conn, const MigrationNotice& notice) = 0;
  // Tells a holder its lease's pages moved (in place: its mapping is the
  // same) and where they are now. Every holder, pinning or not.
  virtual void Moved(ConnId conn, uint64_t lease_id, int numa_node, const std::string& pool) = 0;
};

}  // namespace cxlpool::tiering
