#include "lease_registry.h"

#include "client_core.h"

namespace cxlpool::detail {

void LeaseRegistry::Add(LeaseState* lease) {
  MutexLock lock(mu_);
  leases_.emplace(lease->info().id, lease);
}

void LeaseRegistry::Remove(LeaseState* lease) {
  MutexLock lock(mu_);
  auto [begin, end] = leases_.equal_range(lease->info().id);
  for (auto it = begin; it != end; ++it) {
    if (it->second == lease) {
      leases_.erase(it);
      return;
    }
  }
}

void LeaseRegistry::ForId(uint64_t id, const std::function<void(LeaseState*)>& fn) const {
  MutexLock lock(mu_);
  auto [begin, end] = leases_.equal_range(id);
  for (auto it = begin; it != end; ++it) fn(it->second);
}

void LeaseRegistry::ForAll(const std::function<bool(uint64_t id, LeaseState*)>& fn) const {
  MutexLock lock(mu_);
  for (const auto& [id, lease] : leases_) {
    if (!fn(id, lease)) return;
  }
}

}  // namespace cxlpool::detail
