// SendQueue: the frames one connection's client has not taken yet, in order,
// and what they are charged against Admission (their bytes plus
// kFrameOverhead, and their fds until the kernel takes them). A frame partly
// written stays at the front whatever happens, so the stream stays framed.
//
// Thread safety: single-owner (the server's event-loop thread).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <deque>

#include "cxlpool/common/status.h"
#include "cxlpool/proto/ipc.h"
#include "server/admission.h"

namespace cxlpool {

class SendQueue {
 public:
  using Clock = std::chrono::steady_clock;

  // `admission` (borrowed) is charged for `uid`.
  SendQueue(Admission* admission, uid_t uid) : admission_(admission), uid_(uid) {}
  SendQueue(const SendQueue&) = delete;
  SendQueue& operator=(const SendQueue&) = delete;

  bool empty() const { return queue_.empty(); }
  // Bytes charged, kFrameOverhead per frame included.
  uint64_t bytes() const { return bytes_; }
  // When the client last took a queued byte (or the queue last started).
  Clock::time_point last_progress() const { return last_progress_; }
  void set_last_progress(Clock::time_point t) { last_progress_ = t; }

  // Queues `f` and charges it.
  void Push(wire::OutFrame f);
  // Writes the front frame as far as socket `fd` takes it: true when it went
  // out whole (and left the queue), false when the socket is full.
  Result<bool> SendFront(int fd);
  // Frees every frame but one partly sent.
  void DiscardUnsent();
  // Frees every frame (closes their fds).
  void Clear();

 private:
  struct Queued {
    wire::OutFrame frame;
    uint64_t cost = 0;  // bytes + kFrameOverhead
    size_t fds = 0;     // fds charged (0 once the kernel took them)
  };
  void Uncharge(Queued& q);

  Admission* admission_;
  uid_t uid_;
  std::deque<Queued> queue_;
  uint64_t bytes_ = 0;  // sum of queue_[].cost
  Clock::time_point last_progress_;
};

}  // namespace cxlpool
