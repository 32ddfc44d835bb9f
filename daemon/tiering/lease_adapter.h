// LeaseManagerTable: the tiering engine's LeaseTable (tiering/lease_table.h)
// over the daemon's LeaseManager. It is the only piece of the tiering code
// that knows how the daemon keeps its leases; when the lease code is cut
// differently (extents, a separate lease table), only this file changes.
//
// What it answers:
//  - each extent of a lease is a unit (its own memfd, at its offset in the
//    mapping) on the pool that accounts it: each extent is accounted on
//    its own, so a move reserves room for that extent only and its commit
//    moves that extent's bytes (LeaseManager::BeginExtentMove,
//    CommitExtentMove), and a lease may stay split between pools. A move
//    back (moving_to is the unit's own pool, after a restart found no room
//    on a move's target) is moving_back;
//  - promote_pool: the first DRAM memfd pool in the placement order for the
//    GPU the lease was asked near (lease/placement.h), else for the node the
//    holder ran on, else for the lease's own node;
//  - demote_pool: the first CXL (or NVM) memfd pool by distance from the
//    lease's node;
//  - not_movable: devdax leases ("devdax memory cannot move"), leases whose
//    memory is not back after a restart, and every lease when the topology is
//    not this machine's (a --sysfs-root tree: nothing may act on the real
//    machine from it).
//
// Thread safety: the event-loop thread only, like LeaseManager.
#pragma once

#include <string>

#include "lease/lease_manager.h"
#include "tiering/engine.h"
#include "tiering/lease_table.h"
#include "tiering/tiering_options.h"

namespace cxlpool::tiering {

class LeaseManagerTable final : public LeaseTable {
 public:
  // `local`: the topology is this machine's (moves allowed).
  LeaseManagerTable(LeaseManager* leases, bool local);

  std::vector<LeaseFacts> Leases() const override;
  std::optional<LeaseFacts> Find(uint64_t id) const override;
  std::vector<PoolFacts> Pools() const override;
  Result<UnitMemory> OpenUnit(uint64_t id, uint32_t unit) override;
  Status BeginMove(uint64_t id, uint32_t unit, const std::string& to_pool) override;
  Status CommitMove(uint64_t id, uint32_t unit) override;
  Status AbortMove(uint64_t id, uint32_t unit, const std::string& split_note) override;

 private:
  LeaseFacts Convert(const LeaseManager::MigrationFacts& m) const;
  // The first pool of `kinds` in the placement order from a GPU or a node;
  // for a long-term pinned lease only where the pin keeps its pages.
  std::string Nearest(const std::string& gpu, std::optional<int> node,
                      const std::vector<std::string>& kinds, bool long_term_pin) const;
  Pool* PoolNamed(const std::string& name) const;

  LeaseManager* leases_;
  bool local_;
};

// The engine's options from the daemon's [tiering] table.
TieringOptions TieringOptionsFrom(const TieringConfig& c);

}  // namespace cxlpool::tiering
