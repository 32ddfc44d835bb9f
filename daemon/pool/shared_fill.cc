#include "pool/shared_fill.h"

#include <algorithm>
#include <utility>

namespace cxlpool {

SharedFill::SharedFill(void* addr, uint64_t size, uint64_t chunk, FillFn fill)
    : addr_(static_cast<char*>(addr)),
      size_(size),
      chunk_(chunk),
      chunks_(chunk == 0 ? 0 : (size + chunk - 1) / chunk),
      fill_(std::move(fill)) {
  CXLPOOL_CHECK(chunk > 0);
}

bool SharedFill::exhausted() const {
  MutexLock lock(mu_);
  return next_ >= chunks_;
}

uint64_t SharedFill::helped() const {
  MutexLock lock(mu_);
  return helped_;
}

bool SharedFill::Claim(uint64_t* index, bool helper) {
  MutexLock lock(mu_);
  if (next_ >= chunks_) return false;
  *index = next_++;
  ++in_flight_;
  if (helper) ++helped_;
  return true;
}

void SharedFill::Fill(uint64_t index) {
  const uint64_t at = index * chunk_;
  Status st = fill_(addr_ + at, std::min(chunk_, size_ - at));
  MutexLock lock(mu_);
  if (!st.ok() && first_error_.ok()) {
    first_error_ = std::move(st);
    next_ = chunks_;  // start no more chunks
  }
  if (--in_flight_ == 0) idle_.notify_all();
}

bool SharedFill::HelpOne() {
  uint64_t index = 0;
  if (!Claim(&index, true)) return false;
  Fill(index);
  return true;
}

Status SharedFill::Run() {
  uint64_t index = 0;
  while (Claim(&index, false)) Fill(index);
  MutexLock lock(mu_);
  while (in_flight_ != 0) lock.Wait(idle_);
  return first_error_;
}

uint64_t SharedFillChunk(uint64_t size) {
  constexpr uint64_t kMin = 2ull << 20, kMax = 32ull << 20;
  const uint64_t c = std::clamp<uint64_t>(size / 16, kMin, kMax);
  return c / kMin * kMin;
}

}  // namespace cxlpool
