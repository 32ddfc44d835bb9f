#include "lease/lease_table.h"

#include <algorithm>
#include <utility>

#include "cxlpool/common/status.h"
#include "pool/pool.h"

namespace cxlpool {

std::vector<GrantedExtent> LeaseRecord::GrantedExtents() const {
  std::vector<GrantedExtent> out;
  out.reserve(extents.size());
  for (const auto& e : extents) out.push_back({e->fd(), e->size_bytes(), e->page_size()});
  return out;
}

size_t LeaseRecord::extent_count() const {
  return std::max<size_t>({extents.size(), identity.size(), size_t{1}});
}

uint64_t LeaseRecord::ExtentBytes(size_t i) const {
  if (extent_count() == 1) return size;
  if (i < identity.size()) return identity[i].size_bytes;
  if (i < extents.size() && extents[i] != nullptr) return extents[i]->size_bytes();
  return 0;
}

std::vector<LeaseRecord::PoolBytes> LeaseRecord::BytesByPool() const {
  std::vector<PoolBytes> out;
  const size_t n = extent_count();
  out.push_back(PoolBytes{pool, 0, {}});
  for (size_t i = 0; i < n; ++i) {
    Pool* p = PoolOf(i);
    auto it = std::find_if(out.begin(), out.end(), [p](const PoolBytes& b) { return b.pool == p; });
    if (it == out.end()) it = out.insert(out.end(), PoolBytes{p, 0, {}});
    it->bytes += ExtentBytes(i);
    it->extents.push_back(i);
  }
  if (n == 1) out.front().bytes = size;
  if (out.size() > 1 && out.front().extents.empty()) out.erase(out.begin());
  return out;
}

void LeaseRecord::SetExtentPool(size_t i, Pool* to) {
  const size_t n = extent_count();
  if (i >= n) return;
  if (extent_pools.empty()) extent_pools.assign(n, pool);
  extent_pools[i] = to;
  std::vector<PoolBytes> by = BytesByPool();
  if (by.size() == 1) {
    pool = by.front().pool;
    extent_pools.clear();
  } else {
    auto most = std::max_element(by.begin(), by.end(), [](const PoolBytes& a, const PoolBytes& b) {
      return a.bytes < b.bytes;
    });
    // Stays where it is on a tie, so the lease's pool does not flap.
    if (most->bytes > by.front().bytes || by.front().pool != pool) pool = most->pool;
  }
  tier = pool->quota_tier();
}

std::vector<int> LeaseRecord::Fds() const {
  std::vector<int> out;
  out.reserve(extents.size());
  for (const auto& e : extents) out.push_back(e ? e->fd() : -1);
  return out;
}

LeaseRecord& LeaseTable::Add(LeaseRecord l) {
  const uint64_t id = l.id;
  auto [it, inserted] = leases_.emplace(id, std::move(l));
  CXLPOOL_CHECK(inserted);
  LeaseRecord& added = it->second;
  by_uid_[added.owner.uid].insert(id);
  if (!added.name.empty()) names_[NameKey(added.owner.uid, added.name)] = id;
  return added;
}

void LeaseTable::Unindex(const LeaseRecord& l) {
  if (!l.name.empty()) names_.erase(NameKey(l.owner.uid, l.name));
  auto u = by_uid_.find(l.owner.uid);
  if (u != by_uid_.end()) {
    u->second.erase(l.id);
    if (u->second.empty()) by_uid_.erase(u);
  }
}

LeaseRecord LeaseTable::Remove(uint64_t id) {
  auto it = leases_.find(id);
  CXLPOOL_CHECK(it != leases_.end());
  LeaseRecord l = std::move(it->second);
  leases_.erase(it);
  Unindex(l);
  return l;
}

void LeaseTable::SetOwner(LeaseRecord& l, const CallerInfo& owner) {
  Unindex(l);
  l.name.clear();
  l.owner = owner;
  by_uid_[l.owner.uid].insert(l.id);
}

bool LeaseTable::SetName(LeaseRecord& l, const std::string& name) {
  const std::string key = NameKey(l.owner.uid, name);
  if (names_.count(key) != 0) return false;
  if (!l.name.empty()) names_.erase(NameKey(l.owner.uid, l.name));
  l.name = name;
  names_[key] = l.id;
  return true;
}

void LeaseTable::Clear() {
  leases_.clear();
  names_.clear();
  by_uid_.clear();
}

std::optional<uint64_t> LeaseTable::Named(uid_t owner, const std::string& name) const {
  auto it = names_.find(NameKey(owner, name));
  if (it == names_.end()) return std::nullopt;
  return it->second;
}

void LeaseTable::HoldName(uid_t owner, const std::string& name) {
  names_[NameKey(owner, name)] = 0;
}

void LeaseTable::DropHeldName(uid_t owner, const std::string& name) {
  auto it = names_.find(NameKey(owner, name));
  if (it != names_.end() && it->second == 0) names_.erase(it);
}

const std::unordered_set<uint64_t>& LeaseTable::OwnedBy(uid_t owner) const {
  static const std::unordered_set<uint64_t> kNone;
  auto it = by_uid_.find(owner);
  return it == by_uid_.end() ? kNone : it->second;
}

void LeaseTable::Revoked(uint64_t id, std::vector<uid_t> uids, size_t max_remembered) {
  if (revoked_.size() >= max_remembered) revoked_.clear();
  revoked_[id] = std::move(uids);
}

const std::vector<uid_t>* LeaseTable::RevokedFor(uint64_t id) const {
  auto it = revoked_.find(id);
  return it == revoked_.end() ? nullptr : &it->second;
}

}  // namespace cxlpool
