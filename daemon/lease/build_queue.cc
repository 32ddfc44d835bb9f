#include "lease/build_queue.h"

#include <utility>

#include "cxlpool/common/status.h"

namespace cxlpool {

void BuildQueue::set_max_running(size_t n) {
  max_running_ = n == 0 ? 1 : n;
  StartWaiting();
}

void BuildQueue::Submit(uid_t uid, std::function<void()> start) {
  if (running_ < max_running_ && waiting_count_ == 0 && (!may_start_ || may_start_(uid))) {
    ++running_;
    ++running_by_uid_[uid];
    start();
    return;
  }
  auto& q = waiting_[uid];
  if (q.empty()) turns_.push_back(uid);
  q.push_back(std::move(start));
  ++waiting_count_;
  StartWaiting();
}

void BuildQueue::Done(uid_t uid) {
  auto it = running_by_uid_.find(uid);
  CXLPOOL_CHECK(running_ > 0 && it != running_by_uid_.end());
  --running_;
  if (--it->second == 0) running_by_uid_.erase(it);
  StartWaiting();
}

void BuildQueue::StartWaiting() {
  held_ = false;
  while (running_ < max_running_ && !turns_.empty()) {
    auto running_of = [this](uid_t u) {
      auto r = running_by_uid_.find(u);
      return r == running_by_uid_.end() ? size_t{0} : r->second;
    };
    auto next = turns_.end();
    for (auto t = turns_.begin(); t != turns_.end(); ++t) {
      if (may_start_ && !may_start_(*t)) continue;
      if (next == turns_.end() || running_of(*t) < running_of(*next)) next = t;
    }
    if (next == turns_.end()) {
      held_ = true;  // every waiting uid is over its share now
      return;
    }
    uid_t uid = *next;
    turns_.erase(next);
    auto it = waiting_.find(uid);
    std::function<void()> start = std::move(it->second.front());
    it->second.pop_front();
    if (it->second.empty()) {
      waiting_.erase(it);
    } else {
      turns_.push_back(uid);
    }
    --waiting_count_;
    ++running_;
    ++running_by_uid_[uid];
    start();
  }
}

}  // namespace cxlpool
