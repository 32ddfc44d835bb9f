// SignalRecorder: what one lease's holder moved through the library's copy
// helpers, per range, until the next batch leaves (docs/protocol.md,
// "Tiering").
//
// The lease is cut into at most kMaxBuckets ranges of a power-of-two size of
// at least 2 MiB (the smallest extent), so a batch stays small whatever the
// lease's size. A copy adds its bytes to the ranges it touched; nothing is
// sent from the copy itself: the client's flusher thread drains every
// recorder periodically or when enough bytes piled up (ClientCore).
//
// Thread safety: Record and Drain may run concurrently on any threads (relaxed
// atomics; a drain takes what was there and leaves zeros).
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

namespace cxlpool::detail {

class SignalRecorder {
 public:
  static constexpr uint32_t kMaxBuckets = 64;
  static constexpr uint64_t kMinBucketBytes = 2ull << 20;

  explicit SignalRecorder(uint64_t lease_bytes);

  // A copy of `len` bytes at `offset` (already checked to be inside).
  // Returns the bytes recorded.
  uint64_t Record(uint64_t offset, uint64_t len, bool write) {
    return Spread(offset, len, write ? len : 0, write ? 0 : len);
  }
  // Bytes the holder moved by other means over [offset, offset + len)
  // (cudaMemcpy of its own, a NIC), spread over the range.
  uint64_t Note(uint64_t offset, uint64_t len, uint64_t read, uint64_t written) {
    return Spread(offset, len, written, read);
  }

  struct Range {
    uint64_t offset = 0;
    uint64_t length = 0;
    uint64_t bytes_read = 0;
    uint64_t bytes_written = 0;
  };
  // Takes every non-zero range (and zeroes it).
  void Drain(std::vector<Range>* out);
  // Puts ranges back (a batch that could not be sent).
  void Restore(const std::vector<Range>& ranges);

  uint64_t bucket_bytes() const { return bucket_; }
  uint32_t buckets() const { return n_; }
  uint64_t total_read() const { return total_read_.load(std::memory_order_relaxed); }
  uint64_t total_written() const { return total_written_.load(std::memory_order_relaxed); }

 private:
  uint64_t Spread(uint64_t offset, uint64_t len, uint64_t written, uint64_t read);

  uint64_t size_;
  uint64_t bucket_;
  uint32_t n_;
  std::atomic<uint64_t> read_[kMaxBuckets];
  std::atomic<uint64_t> written_[kMaxBuckets];
  std::atomic<uint64_t> total_read_{0};
  std::atomic<uint64_t> total_written_{0};
};

}  // namespace cxlpool::detail
