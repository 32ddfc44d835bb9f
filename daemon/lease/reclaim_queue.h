// ReclaimQueue: gives the memory of ended leases back (Backing::Reclaim:
// truncate, unmap, close) off the request path, and tells the loop when each
// is done. Until then the pool counts the bytes as reclaiming.
//
// A reclaim starts on the loop's next turn after Submit, so the reply to the
// request that ended the lease leaves first (neither a truncation nor a
// worker woken for it delays it). It runs on a worker, or on the loop itself
// when it is small (<= inline_max) and nothing else is in flight. Its
// completion is always posted to the loop: `on_done(pool, size)`, then the
// reclaim's own `then`.
//
// Thread safety: every method on the loop. A worker touches only the extents
// and the channel; once the queue is gone (its destructor closes the
// channel) finished reclaims post nothing, and handlers already posted do
// nothing. A reclaim whose worker task is dropped unrun (a stopped pool)
// still reclaims when its backing is destroyed.
#pragma once

#include <sys/types.h>

#include <boost/asio/any_io_executor.hpp>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "pool/backing.h"

namespace cxlpool {

class Pool;

class ReclaimQueue {
 public:
  using Executor = boost::asio::any_io_executor;
  using Done = std::function<void(Pool* pool, uint64_t size)>;

  ReclaimQueue(Executor loop, Executor workers, Done on_done);
  ~ReclaimQueue();
  ReclaimQueue(const ReclaimQueue&) = delete;
  ReclaimQueue& operator=(const ReclaimQueue&) = delete;

  // `size` bytes of `pool` held by `extents` (every extent of one lease);
  // `then` runs on the loop once all of them are truncated (or never, when
  // the queue is gone by then). `owner` is charged the reclaim's duration
  // (set_charge).
  void Submit(Pool* pool, uint64_t size, std::vector<std::unique_ptr<Backing>> extents,
              std::function<void()> then = nullptr, uid_t owner = static_cast<uid_t>(-1));
  // Told, on the loop, how long each reclaim took and whose lease it was.
  void set_charge(std::function<void(uid_t, std::chrono::nanoseconds)> charge) {
    charge_ = std::move(charge);
  }
  // Starts every submitted reclaim now, and each later one at once (daemon
  // exit: the loop may never turn again).
  void StartNow();
  // Reclaims up to `bytes` run on the loop when nothing else is in flight.
  void set_inline_max(uint64_t bytes) { inline_max_ = bytes; }
  // Submitted and not yet done.
  uint32_t pending() const { return pending_; }

 private:
  struct Item {
    Pool* pool;
    uint64_t size;
    std::vector<std::unique_ptr<Backing>> extents;
    std::function<void()> then;
    uid_t owner = static_cast<uid_t>(-1);
  };
  struct Channel;
  void StartDeferred();
  void Start(Item item);
  void Finished(Pool* pool, uint64_t size, const std::function<void()>& then);

  Executor loop_;
  Executor workers_;
  Done on_done_;
  std::function<void(uid_t, std::chrono::nanoseconds)> charge_;
  uint64_t inline_max_ = 0;
  bool immediate_ = false;
  uint32_t pending_ = 0;
  // Submitted, to start on the loop's next turn (counted in pending_).
  std::deque<Item> deferred_;
  std::shared_ptr<Channel> channel_;
  // Flipped when the queue dies so handlers already posted do nothing.
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace cxlpool
