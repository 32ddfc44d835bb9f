#include "lease/reclaim_queue.h"

#include <boost/asio/post.hpp>
#include <utility>

#include "cxlpool/common/log.h"
#include "cxlpool/common/thread_annotations.h"

namespace cxlpool {

namespace {
// Every extent truncated (each holder's next access SIGBUSes), unmapped and
// closed.
void ReclaimAll(std::vector<std::unique_ptr<Backing>>* extents) {
  for (auto& e : *extents) {
    if (e) e->Reclaim();
  }
  extents->clear();
}
}  // namespace

// How a reclaim on a worker reaches the loop without touching the queue:
// closed (under its mutex) when the queue dies.
struct ReclaimQueue::Channel {
  Mutex mu;
  bool open GUARDED_BY(mu) = true;
  Executor loop;
};

ReclaimQueue::ReclaimQueue(Executor loop, Executor workers, Done on_done)
    : loop_(std::move(loop)),
      workers_(std::move(workers)),
      on_done_(std::move(on_done)),
      channel_(std::make_shared<Channel>()) {
  channel_->loop = loop_;
}

ReclaimQueue::~ReclaimQueue() {
  *alive_ = false;
  MutexLock lock(channel_->mu);
  channel_->open = false;
}

void ReclaimQueue::Submit(Pool* pool, uint64_t size, std::vector<std::unique_ptr<Backing>> extents,
                          std::function<void()> then, uid_t owner) {
  ++pending_;
  deferred_.push_back(Item{pool, size, std::move(extents), std::move(then), owner});
  if (immediate_) {
    StartDeferred();
    return;
  }
  if (deferred_.size() > 1) return;  // a start is already posted
  // A released 8 MiB lease's reply took 1.6 ms when its worker started
  // first (docs/benchmarks.md): start on the next turn instead.
  std::weak_ptr<bool> alive = alive_;
  boost::asio::post(loop_, [this, alive] {
    auto a = alive.lock();
    if (!a || !*a) return;
    StartDeferred();
  });
}

void ReclaimQueue::StartNow() {
  immediate_ = true;
  StartDeferred();
}

void ReclaimQueue::StartDeferred() {
  std::deque<Item> now;
  now.swap(deferred_);
  for (Item& item : now) Start(std::move(item));
}

void ReclaimQueue::Finished(Pool* pool, uint64_t size, const std::function<void()>& then) {
  CXLPOOL_CHECK(pending_ > 0);
  --pending_;
  on_done_(pool, size);
  if (then) then();
}

void ReclaimQueue::Start(Item item) {
  std::weak_ptr<bool> alive = alive_;
  if (item.size <= inline_max_ && pending_ == 1) {
    // Small, and the loop is not busy with others' (nothing else in flight):
    // truncating here costs less than a hand-off. Under load the workers
    // take it, so the loop keeps serving. The bookkeeping is still posted,
    // so every path sees the same order as from a worker.
    const auto start = std::chrono::steady_clock::now();
    ReclaimAll(&item.extents);
    if (charge_) charge_(item.owner, std::chrono::steady_clock::now() - start);
    boost::asio::post(
        loop_, [this, alive, pool = item.pool, size = item.size, then = std::move(item.then)] {
          auto a = alive.lock();
          if (!a || !*a) return;
          Finished(pool, size, then);
        });
    return;
  }
  boost::asio::post(workers_, [this, alive, channel = channel_, item = std::move(item)]() mutable {
    const auto start = std::chrono::steady_clock::now();
    ReclaimAll(&item.extents);
    const auto took = std::chrono::steady_clock::now() - start;
    MutexLock lock(channel->mu);
    if (!channel->open) return;  // the queue is gone
    boost::asio::post(channel->loop, [this, alive, pool = item.pool, size = item.size,
                                      then = std::move(item.then), owner = item.owner, took] {
      auto a = alive.lock();
      if (!a || !*a) return;
      if (charge_) charge_(owner, took);
      Finished(pool, size, then);
    });
  });
}

}  // namespace cxlpool
