// SharedFill: one build's prefault cut into chunks that several threads take
// in turn, so a cold build of a large lease is populated by every idle
// worker, not only by the one that created the memfd (4 KiB shmem pages
// fault at some 0.4 ms per MiB here: the prefault is nearly all of a cold
// build; docs/benchmarks.md, P2cold).
//
// The owner (the thread building the memfd) calls Run: it takes chunks until
// none is left, then waits for the chunks other threads took, and returns
// the first error. A helper calls HelpOne: at most one chunk, so a helper's
// worker slot is back in the BuildQueue after one chunk and another uid's
// build waits for at most that (lease/build_queue.h). A helper that comes
// after Run claimed the last chunk does nothing; the range is never touched
// after Run returns.
//
// Thread safety: every member may be called from any thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>

#include "cxlpool/common/status.h"
#include "cxlpool/common/thread_annotations.h"

namespace cxlpool {

class SharedFill {
 public:
  // Fills [addr, addr + size) of the range; called for each chunk once.
  using FillFn = std::function<Status(char* addr, uint64_t size)>;
  // `chunk` > 0; the last chunk is the rest.
  SharedFill(void* addr, uint64_t size, uint64_t chunk, FillFn fill);

  // The number of chunks.
  uint64_t chunks() const { return chunks_; }
  // True once every chunk was taken (or a chunk failed).
  bool exhausted() const EXCLUDES(mu_);
  // Takes one chunk and fills it; false when none was left.
  bool HelpOne() EXCLUDES(mu_);
  // Fills chunks until none is left, then waits for the ones taken by
  // helpers. The first error of any chunk (the rest are not started).
  Status Run() EXCLUDES(mu_);
  // Chunks filled by HelpOne (not by Run).
  uint64_t helped() const EXCLUDES(mu_);

 private:
  // Claims the next chunk under the lock; false when none is left.
  bool Claim(uint64_t* index, bool helper) EXCLUDES(mu_);
  // Fills the chunk without the lock, then records its end under it.
  void Fill(uint64_t index) EXCLUDES(mu_);

  char* const addr_;
  const uint64_t size_;
  const uint64_t chunk_;
  const uint64_t chunks_;
  const FillFn fill_;
  mutable Mutex mu_;
  std::condition_variable idle_;  // in_flight_ went to 0
  uint64_t next_ GUARDED_BY(mu_) = 0;
  uint64_t in_flight_ GUARDED_BY(mu_) = 0;
  uint64_t helped_ GUARDED_BY(mu_) = 0;
  Status first_error_ GUARDED_BY(mu_);
};

// Hands a build's SharedFill to whoever may help (the lease manager's
// BuildQueue); called on the building thread.
using FillOffer = std::function<void(const std::shared_ptr<SharedFill>&)>;

// The chunk a cold build of `size` bytes is cut into for SharedFill: a
// sixteenth, at least 2 MiB (a whole number of any page size) and at most
// 32 MiB (what another uid's build may wait for a helper slot, ~13 ms of
// 4 KiB pages here), rounded down to 2 MiB.
uint64_t SharedFillChunk(uint64_t size);

}  // namespace cxlpool
