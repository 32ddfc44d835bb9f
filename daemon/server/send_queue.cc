#include "server/send_queue.h"

#include <utility>

#include "server/limits.h"

namespace cxlpool {

void SendQueue::Push(wire::OutFrame f) {
  Queued q;
  q.cost = f.bytes.size() + kFrameOverhead;
  q.fds = f.fds.size();
  q.frame = std::move(f);
  bytes_ += q.cost;
  admission_->AddQueued(uid_, q.cost);
  admission_->AddFds(uid_, q.fds);
  queue_.push_back(std::move(q));
}

Result<bool> SendQueue::SendFront(int fd) {
  Queued& q = queue_.front();
  const size_t before = q.frame.sent;
  Result<bool> done = wire::SendSome(fd, &q.frame);
  if (!done.ok()) return done;
  if (q.frame.sent != before) last_progress_ = Clock::now();
  if (q.fds > 0 && q.frame.fds.empty()) {  // the kernel took them
    admission_->RemoveFds(uid_, q.fds);
    q.fds = 0;
  }
  if (!*done) return false;
  Uncharge(q);
  queue_.pop_front();
  return true;
}

void SendQueue::DiscardUnsent() {
  size_t keep = !queue_.empty() && queue_.front().frame.sent > 0 ? 1 : 0;
  while (queue_.size() > keep) {
    Uncharge(queue_.back());
    queue_.pop_back();  // closes its fds
  }
}

void SendQueue::Clear() {
  for (Queued& q : queue_) Uncharge(q);
  queue_.clear();  // closes queued fds
}

void SendQueue::Uncharge(Queued& q) {
  bytes_ -= q.cost;
  admission_->RemoveQueued(uid_, q.cost);
  admission_->RemoveFds(uid_, q.fds);
  q.cost = 0;
  q.fds = 0;
}

}  // namespace cxlpool
