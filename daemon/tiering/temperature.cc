#include "tiering/temperature.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace cxlpool::tiering {

const char* HintName(Hint h) {
  switch (h) {
    case Hint::kHot:
      return "hot";
    case Hint::kCold:
      return "cold";
    case Hint::kWillNeed:
      return "will_need";
    case Hint::kDontNeed:
      return "dont_need";
  }
  return "?";
}

std::optional<Hint> HintFromInt(int v) {
  if (v >= 1 && v <= 4) return static_cast<Hint>(v);
  return std::nullopt;
}

std::optional<Hint> ParseHint(std::string_view name) {
  for (int v = 1; v <= 4; ++v) {
    if (name == HintName(static_cast<Hint>(v))) return static_cast<Hint>(v);
  }
  if (name == "willneed") return Hint::kWillNeed;
  if (name == "dontneed") return Hint::kDontNeed;
  return std::nullopt;
}

namespace {
double Decay(double value, int64_t elapsed_ns, int64_t half_life_ns) {
  if (elapsed_ns <= 0 || value <= 0) return std::max(value, 0.0);
  if (half_life_ns <= 0) return 0;
  return value * std::exp2(-static_cast<double>(elapsed_ns) / static_cast<double>(half_life_ns));
}
}  // namespace

void Heat::Add(double bytes, int64_t now_ns, int64_t half_life_ns) {
  bytes_ = At(now_ns, half_life_ns) + std::max(bytes, 0.0);
  at_ns_ = std::max(now_ns, at_ns_);
}

void Heat::Set(double bytes, int64_t now_ns) {
  bytes_ = std::max(bytes, 0.0);
  at_ns_ = now_ns;
}

double Heat::At(int64_t now_ns, int64_t half_life_ns) const {
  return Decay(bytes_, now_ns - at_ns_, half_life_ns);
}

RateLimiter::RateLimiter(uint64_t bytes_per_s, uint64_t burst_bytes, int64_t now_ns)
    : rate_(0), burst_(0), tokens_(0), at_ns_(now_ns) {
  SetRate(bytes_per_s, burst_bytes, now_ns);
  tokens_ = burst_;
}

void RateLimiter::SetRate(uint64_t bytes_per_s, uint64_t burst_bytes, int64_t now_ns) {
  Refill(now_ns);
  rate_ = bytes_per_s;
  burst_ = static_cast<double>(burst_bytes != 0 ? burst_bytes : bytes_per_s);
  tokens_ = std::min(tokens_, burst_);
}

void RateLimiter::Refill(int64_t now_ns) {
  if (now_ns > at_ns_ && rate_ != 0) {
    tokens_ = std::min(
        burst_, tokens_ + static_cast<double>(rate_) * static_cast<double>(now_ns - at_ns_) / 1e9);
  }
  at_ns_ = std::max(at_ns_, now_ns);
}

bool RateLimiter::TryTake(uint64_t bytes, int64_t now_ns) {
  if (rate_ == 0) return true;
  Refill(now_ns);
  if (tokens_ < std::min(static_cast<double>(bytes), burst_)) return false;
  tokens_ -= static_cast<double>(bytes);
  return true;
}

bool RateLimiter::Full(int64_t now_ns) {
  if (rate_ == 0) return true;
  Refill(now_ns);
  return tokens_ >= burst_;
}

void RateLimiter::Charge(uint64_t bytes, int64_t now_ns) {
  if (rate_ == 0) return;
  Refill(now_ns);
  tokens_ -= static_cast<double>(bytes);
}

double RateLimiter::Available(int64_t now_ns) {
  if (rate_ == 0) return 1e300;
  Refill(now_ns);
  return tokens_;
}

int64_t RateLimiter::NsUntil(uint64_t bytes, int64_t now_ns) {
  if (rate_ == 0) return 0;
  Refill(now_ns);
  double need = std::min(static_cast<double>(bytes), burst_);
  if (tokens_ >= need) return 0;
  return static_cast<int64_t>(std::ceil((need - tokens_) * 1e9 / static_cast<double>(rate_)));
}

std::string FormatTemperature(double t) {
  char buf[32];
  if (t <= 0) return "0";
  if (t >= 100) {
    std::snprintf(buf, sizeof buf, "%.0f", t);
  } else if (t >= 10) {
    std::snprintf(buf, sizeof buf, "%.1f", t);
  } else if (t >= 0.01) {
    std::snprintf(buf, sizeof buf, "%.2f", t);
  } else {
    std::snprintf(buf, sizeof buf, "%.2g", t);
  }
  return buf;
}

}  // namespace cxlpool::tiering
