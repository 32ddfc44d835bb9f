#include "pool/extent_reserve.h"

#include <algorithm>
#include <boost/asio/post.hpp>
#include <optional>

#include "cxlpool/common/log.h"
#include "cxlpool/common/strings.h"
#include "pool/shared_fill.h"

namespace cxlpool {
namespace {
constexpr uint32_t kMaxBuildFailures = 3;
}  // namespace

Result<ReserveSettings> ResolveReserve(const CapacitySpec& low, const CapacitySpec& high,
                                       uint64_t capacity, ExtentLadder ladder) {
  ReserveSettings s;
  s.ladder = std::move(ladder);
  const uint64_t g = s.ladder.smallest();
  s.low_bytes = low.Resolve(capacity) / g * g;
  s.high_bytes = high.Resolve(capacity) / g * g;
  if (s.low_bytes > s.high_bytes) {
    return Status(Code::kInvalidArgument, "reserve low watermark " + HumanBytes(s.low_bytes) +
                                              " is above the high watermark " +
                                              HumanBytes(s.high_bytes));
  }
  return s;
}

// ---- ExtentReserve -------------------------------------------------------------

ExtentReserve::ExtentReserve(std::string pool_name, ReserveSettings settings, MemfdSpec base)
    : name_(std::move(pool_name)),
      configured_(settings),
      settings_(std::move(settings)),
      base_(std::move(base)) {
  base_.stop = stop_;
  for (uint64_t g : settings_.ladder.granules()) levels_.push_back(Level{g, {}, 0, 0});
  MakeSmall({});
  ApplyCapAndTargets();
  NoteLevel();
}

void ExtentReserve::SetCap(uint64_t bytes) {
  cap_bytes_ = bytes;
  Reconfigure(configured_);
}

void ExtentReserve::ApplyCapAndTargets() {
  const uint64_t g = settings_.ladder.smallest();
  // The low watermark keeps its share of the high one.
  auto lower_high_to = [&](uint64_t high) {
    high = high / g * g;
    if (high >= settings_.high_bytes) return;
    const double share = settings_.high_bytes == 0 ? 0.0
                                                   : static_cast<double>(settings_.low_bytes) /
                                                         static_cast<double>(settings_.high_bytes);
    settings_.low_bytes =
        std::min(high, static_cast<uint64_t>(share * static_cast<double>(high)) / g * g);
    settings_.high_bytes = high;
  };
  lower_high_to(cap_bytes_);
  ComputeTargets();
  // The small extents come on top of the high watermark: make room for
  // them under the cap (or, with too little left, go without them).
  if (limit_bytes() > cap_bytes_) {
    lower_high_to(cap_bytes_ > small_target_bytes_ ? cap_bytes_ - small_target_bytes_ : 0);
    ComputeTargets();
  }
  CXLPOOL_CHECK(cap_bytes_ == UINT64_MAX || limit_bytes() <= cap_bytes_);
}

void ExtentReserve::MakeSmall(std::deque<Level> old) {
  small_classes_ = SmallClasses(page_size(), settings_.ladder);
  small_.clear();
  for (uint64_t c : small_classes_) small_.push_back(Level{c, {}, 0, 0});
  for (Level& l : old) {
    Level* now = nullptr;
    for (Level& n : small_) {
      if (n.granule == l.granule) now = &n;
    }
    if (now != nullptr) {
      now->ready = std::move(l.ready);
      now->building = l.building;
      continue;
    }
    for (auto& e : l.ready) {
      ready_bytes_ -= e->size_bytes();
      Retire(std::move(e));
    }
  }
}

ExtentReserve::Level* ExtentReserve::LevelOf(uint64_t bytes) {
  for (Level& l : levels_) {
    if (l.granule == bytes) return &l;
  }
  for (Level& l : small_) {
    if (l.granule == bytes) return &l;
  }
  return nullptr;
}

ExtentReserve::~ExtentReserve() = default;  // extents left retire as they go

void ExtentReserve::set_clock(const Clock* clock) {
  clock_ = clock;
  below_low_since_ns_.reset();  // a time of the old clock means nothing to the new one
  NoteLevel();
}

void ExtentReserve::NoteLevel() {
  const bool below = settings_.low_bytes > 0 && ready_bytes_ < settings_.low_bytes && !stopped_;
  if (!below) {
    below_low_since_ns_.reset();
  } else if (!below_low_since_ns_) {
    below_low_since_ns_ = clock_->MonotonicNs();
  }
}

void ExtentReserve::ComputeTargets() {
  const auto& g = settings_.ladder.granules();
  const size_t top = g.size() - 1;
  targets_.assign(g.size(), 0);
  uint64_t left = settings_.high_bytes;
  // Below the largest granule: up to one level's worth of each (enough to
  // finish any cut at that level), within a share of the reserve.
  for (size_t i = 0; i < top; ++i) {
    uint64_t level_full = (g[i + 1] / g[i] - 1) * g[i];
    uint64_t share = settings_.high_bytes / (i == 0 ? 8 : 4);
    uint64_t n = std::min(level_full, share) / g[i];
    n = std::min<uint64_t>(n, left / g[i]);
    targets_[i] = static_cast<uint32_t>(n);
    left -= n * g[i];
  }
  uint64_t n = left / g[top];
  targets_[top] = static_cast<uint32_t>(n);
  left -= n * g[top];
  // What does not make a whole largest granule goes to the smaller ones.
  for (size_t i = top; i-- > 0;) {
    uint64_t more = left / g[i];
    targets_[i] += static_cast<uint32_t>(more);
    left -= more * g[i];
  }
  // Small extents come on top of the high watermark, so a reserve of N
  // bytes still holds a lease of N bytes in whole granules. Kept where they
  // would be at most a quarter of the smallest granule's bytes (4 per class:
  // under 8 MiB on the default ladder, from a reserve of 32 MiB up).
  uint64_t small_bytes = 0;
  for (uint64_t c : small_classes_) small_bytes += c * settings_.small_per_class;
  const uint64_t need = (small_bytes + g[0] - 1) / g[0];
  const bool keep_small = small_bytes > 0 && 4 * need <= targets_[0];
  small_targets_.assign(small_classes_.size(), keep_small ? settings_.small_per_class : 0);
  small_target_bytes_ = keep_small ? small_bytes : 0;
}

uint32_t ExtentReserve::ready_count(size_t level) const {
  return level < levels_.size() ? static_cast<uint32_t>(levels_[level].ready.size()) : 0;
}

std::vector<uint32_t> ExtentReserve::ready_counts() const {
  std::vector<uint32_t> out;
  for (const Level& l : levels_) out.push_back(static_cast<uint32_t>(l.ready.size()));
  return out;
}

std::vector<uint32_t> ExtentReserve::small_ready_counts() const {
  std::vector<uint32_t> out;
  for (const Level& l : small_) out.push_back(static_cast<uint32_t>(l.ready.size()));
  return out;
}

uint64_t ExtentReserve::ready_extents() const {
  uint64_t n = 0;
  for (const Level& l : levels_) n += l.ready.size();
  for (const Level& l : small_) n += l.ready.size();
  return n;
}

Result<CutPlan> ExtentReserve::Plan(uint64_t requested) const {
  std::vector<uint32_t> ready = ready_counts();
  std::vector<uint32_t> small = small_ready_counts();
  return PlanCut(requested, page_size(), settings_.ladder, ready, settings_.cut, small);
}

MemfdSpec ExtentReserve::BuildSpec(uint64_t bytes, bool background) const {
  MemfdSpec s = base_;
  s.size_bytes = bytes;
  s.yield_between_steps = background;
  return s;
}

Result<ExtentReserve::Taken> ExtentReserve::Take(uint64_t requested) {
  auto plan = Plan(requested);
  if (!plan.ok()) return plan.status();
  Taken t;
  for (const CutPiece& p : plan->pieces) {
    if (p.source != CutPiece::Source::kReserve) continue;
    Level* level = LevelOf(p.granule);
    CXLPOOL_CHECK(level != nullptr);
    Level& l = *level;
    CXLPOOL_CHECK(!l.ready.empty());
    std::unique_ptr<Extent> e = std::move(l.ready.front());
    l.ready.pop_front();
    ready_bytes_ -= e->size_bytes();
    if (p.bytes != e->size_bytes()) {
      Status st = e->ShrinkTo(p.bytes);
      if (!st.ok()) {
        Retire(std::move(e));
        Return(std::move(t.extents));
        return st;
      }
    }
    t.extents.push_back(std::move(e));
  }
  t.plan = std::move(*plan);
  NoteLevel();
  return t;
}

void ExtentReserve::Retire(std::unique_ptr<Extent> e) {
  if (e == nullptr) return;
  retiring_bytes_ += e->size_bytes();
  to_retire_.push_back(std::move(e));
}

void ExtentReserve::Return(std::vector<std::unique_ptr<Extent>> extents) {
  for (auto& e : extents) {
    if (e == nullptr) continue;
    Level* level = LevelOf(e->built_bytes());
    const bool reusable = !e->exposed() && !e->retired() && !stopped_ && level != nullptr &&
                          e->size_bytes() == e->built_bytes() &&
                          ready_bytes_ + building_bytes_ + e->size_bytes() <= limit_bytes();
    if (!reusable) {
      Retire(std::move(e));
      continue;
    }
    ready_bytes_ += e->size_bytes();
    level->ready.push_front(std::move(e));
  }
  NoteLevel();
}

std::vector<uint64_t> ExtentReserve::PlanRefill(uint64_t room) {
  std::vector<uint64_t> out;
  if (stopped_) return out;
  uint64_t have = ready_bytes_ + building_bytes_;
  // The small extents are on top of both watermarks.
  if (!refilling_ && have <= settings_.low_bytes + small_target_bytes_) refilling_ = true;
  // A small class, or a granule below the largest, down to half its target
  // is topped up whatever the watermarks: every cut ends in those, and a
  // reserve holding only larger extents would build each lease's small
  // pieces on the request path until the bytes fall to the low watermark.
  // Waiting for half the target batches these refills (each extent built
  // wakes a stock thread and then the loop).
  auto top_up = [&](Level& l, uint32_t target) {
    if (2 * (l.ready.size() + l.building) > target) return;
    while (l.ready.size() + l.building < target && l.failures < kMaxBuildFailures &&
           l.granule <= room && have + l.granule <= limit_bytes()) {
      ++l.building;
      building_bytes_ += l.granule;
      have += l.granule;
      room -= l.granule;
      out.push_back(l.granule);
    }
  };
  for (size_t i = 0; i < small_.size(); ++i) top_up(small_[i], small_targets_[i]);
  for (size_t i = 0; i + 1 < levels_.size(); ++i) top_up(levels_[i], targets_[i]);
  if (!refilling_) return out;
  for (;;) {
    // The granule furthest below its target, by share; smaller first on ties.
    size_t best = levels_.size();
    double best_gap = 0;
    for (size_t i = 0; i < levels_.size(); ++i) {
      const Level& l = levels_[i];
      uint32_t count = static_cast<uint32_t>(l.ready.size()) + l.building;
      if (targets_[i] == 0 || count >= targets_[i] || l.failures >= kMaxBuildFailures) continue;
      if (l.granule > room || have + l.granule > limit_bytes()) continue;
      double gap = 1.0 - static_cast<double>(count) / targets_[i];
      if (gap > best_gap) {
        best_gap = gap;
        best = i;
      }
    }
    if (best == levels_.size()) break;
    Level& l = levels_[best];
    ++l.building;
    building_bytes_ += l.granule;
    have += l.granule;
    room -= l.granule;
    out.push_back(l.granule);
  }
  // Full (or as full as targets, room and failures allow): wait for the low
  // watermark again.
  if (out.empty() && building_bytes_ == 0) refilling_ = false;
  return out;
}

void ExtentReserve::Built(std::unique_ptr<Extent> extent) {
  uint64_t bytes = extent->built_bytes();
  // A build of a granule the ladder no longer has (Reconfigure meanwhile)
  // is still counted under its size.
  Level* level = LevelOf(bytes);
  if (level != nullptr && level->building > 0) --level->building;
  CXLPOOL_CHECK(building_bytes_ >= bytes);
  building_bytes_ -= bytes;
  if (stopped_ || level == nullptr || ready_bytes_ + bytes > limit_bytes()) {
    Retire(std::move(extent));
    return;
  }
  Level& l = *level;
  l.failures = 0;
  ready_bytes_ += bytes;
  l.ready.push_back(std::move(extent));
  NoteLevel();
}

void ExtentReserve::BuildFailed(uint64_t granule) {
  CXLPOOL_CHECK(building_bytes_ >= granule);
  building_bytes_ -= granule;
  if (Level* l = LevelOf(granule)) {
    if (l->building > 0) --l->building;
    if (!stopped_ && ++l->failures == kMaxBuildFailures) {
      CXLPOOL_LOG(kWarning) << name_ << ": reserve extents of " << HumanBytes(granule)
                            << " disabled after " << kMaxBuildFailures << " failed builds";
    }
  }
}

std::vector<std::unique_ptr<Extent>> ExtentReserve::TakeRetiring() {
  std::vector<std::unique_ptr<Extent>> out;
  out.swap(to_retire_);
  return out;
}

void ExtentReserve::Retired(uint64_t bytes) {
  CXLPOOL_CHECK(retiring_bytes_ >= bytes);
  retiring_bytes_ -= bytes;
}

uint64_t ExtentReserve::Evict(uint64_t bytes) {
  uint64_t queued = 0;
  // Largest first: the ladder from its top, then the small classes.
  std::vector<Level*> order;
  for (size_t i = levels_.size(); i-- > 0;) order.push_back(&levels_[i]);
  for (size_t i = small_.size(); i-- > 0;) order.push_back(&small_[i]);
  for (size_t i = 0; i < order.size() && queued < bytes; ++i) {
    auto& ready = order[i]->ready;
    while (!ready.empty() && queued < bytes) {
      std::unique_ptr<Extent> e = std::move(ready.back());
      ready.pop_back();
      ready_bytes_ -= e->size_bytes();
      queued += e->size_bytes();
      Retire(std::move(e));
    }
  }
  NoteLevel();
  return queued;
}

void ExtentReserve::TrimAboveHigh() {
  while (ready_bytes_ + building_bytes_ > limit_bytes() && ready_bytes_ > 0) {
    // The granule (or small class) most above its target goes first.
    Level* worst = nullptr;
    double worst_excess = -1;
    auto consider = [&](std::deque<Level>& set, const std::vector<uint32_t>& targets) {
      for (size_t i = 0; i < set.size(); ++i) {
        if (set[i].ready.empty()) continue;
        double excess = static_cast<double>(set[i].ready.size() + set[i].building) -
                        static_cast<double>(targets[i]);
        if (excess > worst_excess) {
          worst_excess = excess;
          worst = &set[i];
        }
      }
    };
    consider(levels_, targets_);
    consider(small_, small_targets_);
    if (worst == nullptr) break;
    auto& ready = worst->ready;
    std::unique_ptr<Extent> e = std::move(ready.back());
    ready.pop_back();
    ready_bytes_ -= e->size_bytes();
    Retire(std::move(e));
  }
}

void ExtentReserve::Reconfigure(ReserveSettings settings) {
  std::deque<Level> old;
  old.swap(levels_);
  configured_ = settings;
  settings_ = std::move(settings);
  for (uint64_t g : settings_.ladder.granules()) levels_.push_back(Level{g, {}, 0, 0});
  for (Level& l : old) {
    auto level = settings_.ladder.IndexOf(l.granule);
    if (level) {
      levels_[*level].ready = std::move(l.ready);
      levels_[*level].building = l.building;
    } else {
      for (auto& e : l.ready) {
        ready_bytes_ -= e->size_bytes();
        Retire(std::move(e));
      }
      // Builds of it still land (Built retires them) and keep their bytes
      // in building_bytes_ until then.
    }
  }
  std::deque<Level> old_small;
  old_small.swap(small_);
  MakeSmall(std::move(old_small));
  ApplyCapAndTargets();
  refilling_ = false;
  TrimAboveHigh();
  NoteLevel();
}

void ExtentReserve::DropAll() {
  stopped_ = true;
  stop_->store(true, std::memory_order_release);
  refilling_ = false;
  for (std::deque<Level>* set : {&levels_, &small_}) {
    for (Level& l : *set) {
      for (auto& e : l.ready) {
        ready_bytes_ -= e->size_bytes();
        Retire(std::move(e));
      }
      l.ready.clear();
    }
  }
  NoteLevel();
}

// ---- the kernel's limit -------------------------------------------------------

Result<KernelRoom> ReadKernelRoom(const FileSystem& proc) {
  auto text = proc.ReadFile("/proc/meminfo");
  if (!text.ok()) return text.status();
  const auto m = ParseMeminfo(*text);
  auto field = [&m](const char* key) -> std::optional<uint64_t> {
    auto it = m.find(key);
    if (it == m.end()) return std::nullopt;
    return it->second;
  };
  auto available = field("MemAvailable");
  if (!available) available = field("MemFree");  // kernels before 3.14
  if (!available) {
    return Status(Code::kInvalidArgument, "/proc/meminfo has neither MemAvailable nor MemFree");
  }
  constexpr uint64_t kMinMargin = 256ull << 20;
  KernelRoom r;
  r.available = *available;
  r.margin = std::max(kMinMargin, field("MemTotal").value_or(0) / 16);
  return r;
}

size_t ClampReserves(const std::vector<ExtentReserve*>& reserves, const KernelRoom& room) {
  uint64_t total = 0;
  for (const ExtentReserve* r : reserves) total += r->limit_bytes();
  const uint64_t budget = room.room();
  if (total <= budget) return 0;
  size_t capped = 0;
  const double share = static_cast<double>(budget) / static_cast<double>(total);
  for (ExtentReserve* r : reserves) {
    if (r->limit_bytes() == 0) continue;
    r->SetCap(static_cast<uint64_t>(share * static_cast<double>(r->limit_bytes())));
    ++capped;
  }
  uint64_t now = 0;
  for (const ExtentReserve* r : reserves) now += r->limit_bytes();
  CXLPOOL_LOG(kWarning) << "reserve clamped: the " << reserves.size() << " pools' reserves ("
                        << HumanBytes(total) << ") exceed what the running kernel can give ("
                        << HumanBytes(room.available) << " MemAvailable in /proc/meminfo less a "
                        << HumanBytes(room.margin) << " margin); " << capped
                        << " reserves lowered to " << HumanBytes(now)
                        << " in all (pool capacities follow the MemTotal of each node in the "
                           "sysfs root, not what this kernel has free)";
  return capped;
}

size_t ClampReservesToKernel(const std::vector<ExtentReserve*>& reserves, const FileSystem& proc) {
  auto room = ReadKernelRoom(proc);
  if (!room.ok()) {
    CXLPOOL_LOG(kWarning) << "reserves not checked against the kernel's free memory: "
                          << room.status().ToString();
    return 0;
  }
  return ClampReserves(reserves, *room);
}

// ---- ReserveRefiller -----------------------------------------------------------

ReserveRefiller::ReserveRefiller(ExtentReserve* reserve, Options options)
    : reserve_(reserve), options_(std::move(options)) {
  if (!options_.factory) options_.factory = Extent::Create;
  if (!options_.room) options_.room = [] { return UINT64_MAX; };
}

ReserveRefiller::~ReserveRefiller() { *alive_ = false; }

void ReserveRefiller::Stop() {
  stopped_ = true;
  reserve_->DropAll();
  Kick();  // posts the retirements
}

void ReserveRefiller::Kick() {
  std::weak_ptr<bool> alive = alive_;
  // Retirements first: they give back what refills and grants may need.
  for (auto& e : reserve_->TakeRetiring()) {
    ++pending_retires_;
    const uint64_t bytes = e->size_bytes();
    boost::asio::post(options_.retire,
                      [this, alive, bytes, loop = options_.loop, e = std::move(e)]() mutable {
                        e->Retire();
                        e.reset();
                        boost::asio::post(loop, [this, alive, bytes] {
                          auto a = alive.lock();
                          if (!a || !*a) return;
                          --pending_retires_;
                          reserve_->Retired(bytes);
                          if (options_.on_freed) options_.on_freed();
                          Kick();
                        });
                      });
  }
  if (stopped_) return;
  for (uint64_t granule : reserve_->PlanRefill(options_.room())) {
    ++pending_builds_;
    MemfdSpec spec = reserve_->BuildSpec(granule, true);
    if (options_.stock_threads > 1) {
      // Runs on the building stock thread; a helper queued behind other
      // builds finds the fill done and does nothing.
      spec.offer_fill = [stock = options_.stock, helpers = options_.stock_threads - 1](
                            const std::shared_ptr<SharedFill>& f) {
        for (uint32_t i = 0; i < helpers; ++i) {
          boost::asio::post(stock, [f] {
            while (f->HelpOne()) {
            }
          });
        }
      };
    }
    boost::asio::post(options_.stock, [this, alive, granule, spec, loop = options_.loop,
                                       factory = options_.factory] {
      auto built = factory(spec);
      boost::asio::post(loop, [this, alive, granule, built = std::move(built)]() mutable {
        auto a = alive.lock();
        if (!a || !*a) return;  // the extent, if any, retires with the lambda
        --pending_builds_;
        if (!built.ok()) {
          // A build the stop ended is no failure of the granule.
          if (!reserve_->stop_requested()) {
            CXLPOOL_LOG(kWarning) << reserve_->pool_name() << ": reserve build of "
                                  << HumanBytes(granule)
                                  << " failed: " << built.status().ToString();
          }
          reserve_->BuildFailed(granule);
          if (options_.on_built) options_.on_built(false);
          return;
        }
        reserve_->Built(std::move(*built));
        if (options_.on_built) options_.on_built(true);
        Kick();
      });
    });
  }
}

}  // namespace cxlpool
