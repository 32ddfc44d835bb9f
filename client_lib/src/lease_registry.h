// LeaseRegistry: the live leases of one core, by id, for what reaches them
// from outside their owner: server pushes (revoked, moved), the RECLAIM
// after a reconnect, tiering signals and migrations.
//
// A lease is added once granted and removed when released (before its fd
// closes, so a reconnect never hands back an fd about to close). Several
// leases may share an id (the same shared lease attached twice).
//
// Thread safety: safe from any thread. The visitors run with the registry
// locked: they must not add or remove leases, nor take the core's
// connection lock (the order is connection lock, then registry).
#pragma once

#include <cstdint>
#include <functional>
#include <map>

#include "cxlpool/common/thread_annotations.h"

namespace cxlpool::detail {

class LeaseState;

class LeaseRegistry {
 public:
  void Add(LeaseState* lease) EXCLUDES(mu_);
  void Remove(LeaseState* lease) EXCLUDES(mu_);
  // `fn` for every live lease of id `id`.
  void ForId(uint64_t id, const std::function<void(LeaseState*)>& fn) const EXCLUDES(mu_);
  // `fn` for every live lease, in id order; it returns false to stop.
  void ForAll(const std::function<bool(uint64_t id, LeaseState*)>& fn) const EXCLUDES(mu_);

 private:
  mutable Mutex mu_;
  std::multimap<uint64_t, LeaseState*> leases_ GUARDED_BY(mu_);
};

}  // namespace cxlpool::detail
