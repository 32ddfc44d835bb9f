#include "lease/lease_stock.h"

#include <utility>

#include "cxlpool/common/log.h"
#include "pool/extent.h"

namespace cxlpool {

LeaseStock::LeaseStock(Executor loop, Executor workers, Hooks hooks)
    : loop_(std::move(loop)), workers_(std::move(workers)), hooks_(std::move(hooks)) {}

void LeaseStock::Kick(Pool* pool) {
  if (ReserveRefiller* rf = RefillerOf(pool)) rf->Kick();
}

void LeaseStock::Stop(const std::vector<Pool*>& pools) {
  for (Pool* p : pools) {
    if (ReserveRefiller* rf = RefillerOf(p)) rf->Stop();
  }
}

std::shared_ptr<ExtentReserve::Taken> LeaseStock::Take(Pool* pool, const AllocParams& p,
                                                       uint64_t size) {
  ExtentReserve* r = pool->reserve();
  if (r == nullptr || r->ready_bytes() == 0) return nullptr;
  if (p.hugetlb && !r->hugetlb()) return nullptr;  // the reserve is not hugetlb
  // A dry run first: nothing is taken (or shrunk) that the request cannot use.
  auto plan = r->Plan(p.size_bytes);
  if (!plan.ok() || plan->lease_bytes != size || plan->reserve_pieces() == 0) return nullptr;
  if (p.one_extent && plan->pieces.size() > 1) return nullptr;
  auto t = r->Take(p.size_bytes);
  if (!t.ok()) {
    CXLPOOL_LOG(kWarning) << pool->name() << ": taking reserve extents: " << t.status().ToString();
    pool->RetireReserveNow();  // the extent that failed to shrink
    return nullptr;
  }
  return std::make_shared<ExtentReserve::Taken>(std::move(*t));
}

void LeaseStock::Return(Pool* pool, std::shared_ptr<ExtentReserve::Taken> taken) {
  if (taken == nullptr || pool->reserve() == nullptr) return;
  pool->reserve()->Return(std::move(taken->extents));
  // A shrunk tail cannot go back: retired here (at most one small extent),
  // not through a refill that could take room an allocation waits for.
  pool->RetireReserveNow();
}

LeaseStock::Extents LeaseStock::Assemble(ExtentReserve::Taken* taken, Extents built) {
  Extents out;
  size_t next = 0;
  for (const CutPiece& piece : taken->plan.pieces) {
    if (piece.source == CutPiece::Source::kReserve) {
      CXLPOOL_CHECK(next < taken->extents.size());
      out.push_back(LeaseBacking(std::move(taken->extents[next++])));
    } else {
      for (auto& b : built) out.push_back(std::move(b));
      built.clear();
    }
  }
  taken->extents.clear();
  return out;
}

uint64_t LeaseStock::pending_builds() const {
  uint64_t n = 0;
  for (const auto& [pool, rf] : refillers_) n += rf->pending_builds();
  return n;
}

uint64_t LeaseStock::pending_retires() const {
  uint64_t n = 0;
  for (const auto& [pool, rf] : refillers_) n += rf->pending_retires();
  return n;
}

ReserveRefiller* LeaseStock::RefillerOf(Pool* pool) {
  if (pool->reserve() == nullptr) return nullptr;
  auto it = refillers_.find(pool);
  if (it != refillers_.end()) return it->second.get();
  ReserveRefiller::Options o;
  o.loop = loop_;
  o.stock = stock_ ? *stock_ : workers_;
  o.stock_threads = stock_ ? stock_threads_ : 1;
  o.retire = workers_;
  o.room = [pool] { return pool->free_bytes(); };
  o.on_freed = hooks_.on_freed;
  o.on_built = hooks_.on_built;
  auto rf = std::make_unique<ReserveRefiller>(pool->reserve(), std::move(o));
  ReserveRefiller* raw = rf.get();
  refillers_.emplace(pool, std::move(rf));
  return raw;
}

}  // namespace cxlpool
