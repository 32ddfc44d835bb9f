#include "tiering/lease_adapter.h"

#include <fcntl.h>

#include <algorithm>
#include <cerrno>

#include "lease/placement.h"

namespace cxlpool::tiering {

LeaseManagerTable::LeaseManagerTable(LeaseManager* leases, bool local)
    : leases_(leases), local_(local) {}

std::string LeaseManagerTable::Nearest(const std::string& gpu, std::optional<int> node,
                                       const std::vector<std::string>& kinds,
                                       bool long_term_pin) const {
  PlacementRequest req;
  // A long-term pinned lease goes only where its pin keeps the pages
  // (placement rule 4): the pin of a re-registration would move them off
  // a ZONE_MOVABLE node. A mixed node is skipped too: mbind cannot choose
  // its kernel zones.
  req.long_term_pin = long_term_pin;
  if (!gpu.empty()) {
    req.gpu = gpu;
  } else {
    req.numa_node = node;
  }
  req.tiers = kinds;
  auto plan = PlanPlacement(leases_->topology(), leases_->pools(), req);
  if (!plan.ok()) {
    if (gpu.empty()) return "";
    return Nearest("", node, kinds, long_term_pin);  // the GPU is gone: from the node instead
  }
  for (const Candidate& c : *plan) {
    if (std::string(c.pool->backing()) != "memfd" || c.settle) continue;
    for (const auto& k : kinds) {
      if (c.pool->kind() == k) return c.pool->name();
    }
  }
  return "";
}

Pool* LeaseManagerTable::PoolNamed(const std::string& name) const {
  for (Pool* p : leases_->pools()) {
    if (p->name() == name) return p;
  }
  return nullptr;
}

LeaseFacts LeaseManagerTable::Convert(const LeaseManager::MigrationFacts& m) const {
  LeaseFacts f;
  const LeaseSnapshot& s = m.lease;
  f.id = s.id;
  f.size_bytes = s.size_bytes;
  f.backing = s.backing;
  f.label = s.label;
  f.owner_uid = s.owner.uid;
  f.owner_pid = s.owner.pid;
  f.owner_comm = s.owner.comm;
  f.priority = m.priority;
  f.holders = m.holders;
  f.holder_pids = m.holder_pids;
  // One unit per extent, at its place in the mapping, on the pool that
  // accounts it.
  const uint64_t page = s.page_size != 0 ? s.page_size : 4096;
  auto unit_at = [&](uint64_t offset, uint64_t length) {
    UnitFacts u;
    u.offset = offset;
    u.length = length;
    u.page_size = page;
    const size_t i = f.units.size();
    const Pool* p = i < m.extent_pools.size() ? m.extent_pools[i] : nullptr;
    u.pool = p != nullptr ? p->name() : s.pool;
    u.numa_node = p != nullptr ? p->numa_node() : s.numa_node;
    f.units.push_back(u);
  };
  if (m.extents.size() > 1) {
    uint64_t offset = 0;
    for (const GrantedExtent& e : m.extents) {
      unit_at(offset, e.size_bytes);
      offset += e.size_bytes;
    }
  } else if (!s.extent_bytes.empty()) {
    // Several extents whose memory is not back yet after a restart.
    uint64_t offset = 0;
    for (uint64_t b : s.extent_bytes) {
      unit_at(offset, b);
      offset += b;
    }
  } else {
    unit_at(0, s.size_bytes);
  }
  const bool memfd = m.pool != nullptr && std::string(m.pool->backing()) == "memfd";
  if (!local_) {
    f.not_movable = "the topology is not this machine's (--sysfs-root): nothing is moved";
  } else if (!memfd) {
    f.not_movable = "devdax memory cannot move (the device is the memory)";
  } else if (m.extents.empty() || m.extents.front().fd < 0) {
    f.not_movable = "its memory is not back since the daemon restarted (awaiting RECLAIM)";
  }
  if (memfd) {
    const int node = s.numa_node;
    f.promote_pool = Nearest(m.gpu, m.home_node.has_value() && m.gpu.empty() ? m.home_node : node,
                             {"dram"}, s.long_term_pin);
    f.demote_pool = Nearest("", node, {"cxl", "nvm"}, s.long_term_pin);
  }
  if (m.moving_to != nullptr) {
    f.moving_to = m.moving_to->name();
    f.moving_note = m.moving_note;
    f.moving_unit = m.moving_extent;
    f.moving_back = f.moving_unit < f.units.size() && f.units[f.moving_unit].pool == f.moving_to;
  }
  return f;
}

std::vector<LeaseFacts> LeaseManagerTable::Leases() const {
  std::vector<LeaseFacts> out;
  for (const auto& m : leases_->LeasesForMigration()) out.push_back(Convert(m));
  return out;
}

std::optional<LeaseFacts> LeaseManagerTable::Find(uint64_t id) const {
  auto m = leases_->LeaseForMigration(id);
  if (!m) return std::nullopt;
  return Convert(*m);
}

std::vector<PoolFacts> LeaseManagerTable::Pools() const {
  std::vector<PoolFacts> out;
  for (const auto& p : leases_->Pools()) {
    PoolFacts f;
    f.name = p.name;
    f.numa_node = p.numa_node;
    f.kind = p.kind;
    f.movable = p.backing == "memfd";
    f.capacity_bytes = p.capacity_bytes;
    f.free_bytes = p.free_bytes;
    out.push_back(std::move(f));
  }
  return out;
}

Result<UnitMemory> LeaseManagerTable::OpenUnit(uint64_t id, uint32_t unit) {
  auto m = leases_->LeaseForMigration(id);
  if (!m) return Status(Code::kNotFound, "no lease " + std::to_string(id));
  if (m->pool == nullptr || std::string(m->pool->backing()) != "memfd") {
    return Status(Code::kUnsupported, "devdax memory cannot move");
  }
  const size_t units =
      std::max<size_t>(m->extents.size(), std::max<size_t>(m->lease.extent_bytes.size(), 1));
  if (unit >= units) {
    return Status(Code::kNotFound,
                  "lease " + std::to_string(id) + " has no unit " + std::to_string(unit));
  }
  if (m->extents.empty() || m->extents[unit].fd < 0) {
    return Status(Code::kUnavailable, "lease " + std::to_string(id) +
                                          "'s memory is not back since the daemon restarted");
  }
  // Each extent is its own memfd: the unit is all of it.
  UnitMemory mem;
  mem.fd.Reset(::fcntl(m->extents[unit].fd, F_DUPFD_CLOEXEC, 0));
  if (!mem.fd.valid()) return Status::FromErrno(errno, "dup of lease " + std::to_string(id));
  mem.file_offset = 0;
  return mem;
}

Status LeaseManagerTable::BeginMove(uint64_t id, uint32_t unit, const std::string& to_pool) {
  auto f = Find(id);
  if (!f) return Status(Code::kNotFound, "no lease " + std::to_string(id));
  if (unit >= f->units.size()) return Status(Code::kNotFound, "no unit " + std::to_string(unit));
  // Each extent is accounted to its own pool: room for this one only.
  Pool* to = PoolNamed(to_pool);
  if (to == nullptr) return Status(Code::kNotFound, "no pool " + to_pool);
  return leases_->BeginExtentMove(id, unit, to);
}

Status LeaseManagerTable::CommitMove(uint64_t id, uint32_t unit) {
  return leases_->CommitExtentMove(id, unit);
}

Status LeaseManagerTable::AbortMove(uint64_t id, uint32_t unit, const std::string& split_note) {
  return leases_->AbortExtentMove(id, unit, split_note);
}

TieringOptions TieringOptionsFrom(const TieringConfig& c) {
  auto ns = [](std::chrono::milliseconds ms) {
    return static_cast<int64_t>(ms.count()) * 1'000'000;
  };
  TieringOptions o;
  o.enabled = c.enabled;
  o.interval_ns = ns(c.interval);
  o.half_life_ns = ns(c.half_life);
  o.policy.hot_threshold = c.hot_threshold;
  o.policy.cold_threshold = c.cold_threshold;
  o.policy.min_residency_ns = ns(c.min_residency);
  o.policy.fast_low_watermark = c.dram_low_watermark / 100;
  o.policy.fast_high_watermark = c.dram_high_watermark / 100;
  o.policy.slow_reserve = c.cxl_reserve / 100;
  o.rate_limit_bytes_per_s = c.rate_limit_mbps << 20;
  o.cooperative_deadline_ms = static_cast<uint32_t>(c.cooperative_deadline.count());
  o.cooperative_retry_ns = ns(c.cooperative_retry);
  o.max_pause_ns = ns(c.max_pause);
  o.urgent_interval_ns = ns(c.hint_interval);
  o.max_urgent_hints_per_uid = static_cast<uint32_t>(c.max_urgent_hints_per_uid);
  return o;
}

}  // namespace cxlpool::tiering
