// LeaseStock: the lease manager's side of every pool's warm reserve
// (pool/extent_reserve.h): one ReserveRefiller per pool with a reserve, made
// on first use, that refills it on the stock threads (low priority:
// SCHED_IDLE, lease/thread_priority.h) or the workers; taking reserve
// extents for a lease and giving back those of a grant that did not happen;
// and the stop at shutdown or hand-over (no more refills, ready stock
// retired).
//
// Thread safety: the event-loop thread only, like the manager. Destroy it
// before the pools (its refillers point into their reserves).
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "lease/lease_types.h"
#include "pool/extent_reserve.h"
#include "pool/pool.h"

namespace cxlpool {

class LeaseStock {
 public:
  using Executor = boost::asio::any_io_executor;
  using Extents = std::vector<std::unique_ptr<Backing>>;
  struct Hooks {
    std::function<void()> on_freed;         // retired stock gave bytes back
    std::function<void(bool ok)> on_built;  // a refill build finished
  };
  LeaseStock(Executor loop, Executor workers, Hooks hooks);
  LeaseStock(const LeaseStock&) = delete;
  LeaseStock& operator=(const LeaseStock&) = delete;

  // Where refills of reserves first used from now on run, and on how many
  // threads (default: the workers, one).
  void SetExecutor(Executor stock, uint32_t threads) {
    stock_ = std::move(stock);
    stock_threads_ = threads;
  }
  // Starts what `pool`'s reserve wants now (refills, retirements).
  void Kick(Pool* pool);
  // No more refills in any of `pools`; ready stock is retired.
  void Stop(const std::vector<Pool*>& pools);

  // The pool's reserve extents for a lease of `size`, when the reserve
  // covers some of it and the request may take them (null otherwise).
  static std::shared_ptr<ExtentReserve::Taken> Take(Pool* pool, const AllocParams& p,
                                                    uint64_t size);
  // Extents of a grant that did not happen go back (never exposed).
  static void Return(Pool* pool, std::shared_ptr<ExtentReserve::Taken> taken);
  // The lease's extents in plan order: the taken ones and the `built` piece.
  static Extents Assemble(ExtentReserve::Taken* taken, Extents built);

  // Refill builds and retirements in flight, over every pool.
  uint64_t pending_builds() const;
  uint64_t pending_retires() const;

 private:
  // The refiller of `pool`'s reserve (made on first use), or null.
  ReserveRefiller* RefillerOf(Pool* pool);

  Executor loop_;
  Executor workers_;
  Hooks hooks_;
  std::optional<Executor> stock_;
  uint32_t stock_threads_ = 1;
  std::map<Pool*, std::unique_ptr<ReserveRefiller>> refillers_;
};

}  // namespace cxlpool
