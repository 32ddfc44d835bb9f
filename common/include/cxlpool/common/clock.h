// Clock: the injectable time source (lease ages, grace periods, latency
// histograms). Tests use FakeClock to step time deterministically.
// Thread safety: SystemClock is stateless; FakeClock uses atomics.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace cxlpool {

class Clock {
 public:
  virtual ~Clock() = default;
  // Monotonic nanoseconds (CLOCK_MONOTONIC).
  virtual int64_t MonotonicNs() const = 0;
  // Wall-clock seconds since the epoch (CLOCK_REALTIME), for display/journal.
  virtual int64_t WallSeconds() const = 0;
};

class SystemClock final : public Clock {
 public:
  int64_t MonotonicNs() const override;
  int64_t WallSeconds() const override;
  static const SystemClock& Get();
};

class FakeClock final : public Clock {
 public:
  int64_t MonotonicNs() const override { return mono_ns_; }
  int64_t WallSeconds() const override { return wall_s_; }
  void AdvanceNs(int64_t ns) {
    mono_ns_ += ns;
    wall_s_ += ns / 1000000000;
  }
  void SetWallSeconds(int64_t s) { wall_s_ = s; }

 private:
  std::atomic<int64_t> mono_ns_{1'000'000'000};
  std::atomic<int64_t> wall_s_{1'700'000'000};
};

}  // namespace cxlpool
