#include "signals.h"

#include <algorithm>

namespace cxlpool::detail {

SignalRecorder::SignalRecorder(uint64_t lease_bytes) : size_(lease_bytes) {
  uint64_t b = kMinBucketBytes;
  while (b < UINT64_MAX / 2 && (lease_bytes + b - 1) / b > kMaxBuckets) b *= 2;
  bucket_ = b;
  n_ = static_cast<uint32_t>(std::max<uint64_t>(1, (lease_bytes + b - 1) / b));
  for (uint32_t i = 0; i < kMaxBuckets; ++i) {
    read_[i].store(0, std::memory_order_relaxed);
    written_[i].store(0, std::memory_order_relaxed);
  }
}

uint64_t SignalRecorder::Spread(uint64_t offset, uint64_t len, uint64_t written, uint64_t read) {
  if (len == 0 || offset >= size_) return 0;
  len = std::min(len, size_ - offset);
  const uint64_t end = offset + len;
  const uint32_t first = static_cast<uint32_t>(offset / bucket_);
  const uint32_t last = static_cast<uint32_t>((end - 1) / bucket_);
  uint64_t given_r = 0, given_w = 0;
  for (uint32_t i = first; i <= last && i < n_; ++i) {
    uint64_t lo = std::max<uint64_t>(offset, uint64_t{i} * bucket_);
    uint64_t hi = std::min<uint64_t>(end, uint64_t{i + 1} * bucket_);
    // The last bucket takes the rounding remainder, so the totals are exact.
    uint64_t w =
        i == last
            ? written - given_w
            : static_cast<uint64_t>(static_cast<unsigned __int128>(written) * (hi - lo) / len);
    uint64_t r =
        i == last ? read - given_r
                  : static_cast<uint64_t>(static_cast<unsigned __int128>(read) * (hi - lo) / len);
    given_w += w;
    given_r += r;
    if (w != 0) written_[i].fetch_add(w, std::memory_order_relaxed);
    if (r != 0) read_[i].fetch_add(r, std::memory_order_relaxed);
  }
  total_written_.fetch_add(written, std::memory_order_relaxed);
  total_read_.fetch_add(read, std::memory_order_relaxed);
  return written + read;
}

void SignalRecorder::Drain(std::vector<Range>* out) {
  for (uint32_t i = 0; i < n_; ++i) {
    uint64_t r = read_[i].exchange(0, std::memory_order_relaxed);
    uint64_t w = written_[i].exchange(0, std::memory_order_relaxed);
    if (r == 0 && w == 0) continue;
    Range g;
    g.offset = uint64_t{i} * bucket_;
    g.length = std::min(bucket_, size_ - g.offset);
    g.bytes_read = r;
    g.bytes_written = w;
    out->push_back(g);
  }
}

void SignalRecorder::Restore(const std::vector<Range>& ranges) {
  for (const Range& g : ranges) {
    uint32_t i = static_cast<uint32_t>(g.offset / bucket_);
    if (i >= n_) continue;
    read_[i].fetch_add(g.bytes_read, std::memory_order_relaxed);
    written_[i].fetch_add(g.bytes_written, std::memory_order_relaxed);
  }
}

}  // namespace cxlpool::detail
