// LeaseManager's allocator: the path from an ALLOC to a finished grant.
// The request is checked, the pools planned (lease/placement.h) and each
// admitted in turn (size, quota, priority reserve); the lease is then taken
// from the warm reserve, waits for reclaims in flight, or is built on a
// worker (in turns per uid: lease/build_queue.h) and granted, placed
// elsewhere or refused once the build is back on the loop.
#include <algorithm>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>

#include "cxlpool/common/log.h"
#include "cxlpool/common/strings.h"
#include "lease/allocator.h"
#include "lease/longterm_pin.h"

namespace cxlpool {

namespace {
constexpr size_t kMaxNameBytes = 255;
constexpr size_t kMaxLabelBytes = 256;
constexpr size_t kMaxAclEntries = 64;

// The refusal counter's reason for an error code (refusals_<reason>).
const char* RefusalReason(Code code) {
  switch (code) {
    case Code::kInvalidArgument:
      return "invalid";
    case Code::kNotFound:
      return "not_found";
    case Code::kAlreadyExists:
      return "exists";
    case Code::kUnavailable:
      return "unavailable";
    case Code::kResourceExhausted:
      return "capacity";
    case Code::kPermissionDenied:
      return "permission";
    default:
      return "internal";
  }
}

std::string PoolRoom(const Pool* p) {
  return p->name() + ": " + HumanBytes(p->free_bytes()) + " free of " + HumanBytes(p->capacity());
}

// The extents of a lease of `size` built on the request path: one of the
// whole size, or pieces of at most `max_extent` (the last the rest) for a
// memfd pool when `max_extent` is set. Worker threads (or the loop, inline).
Result<std::vector<std::unique_ptr<Backing>>> BuildExtents(const Pool* pool, uint64_t size,
                                                           bool hugetlb, uint64_t max_extent,
                                                           const FillOffer& offer = {}) {
  std::vector<std::unique_ptr<Backing>> out;
  // Every piece a whole number of the lease's pages.
  const uint64_t page =
      hugetlb ? std::max<uint64_t>(pool->page_size(), 2ull << 20) : pool->page_size();
  const uint64_t step = page == 0 ? 0 : max_extent / page * page;
  const bool cut = step > 0 && size > step && std::string(pool->backing()) == "memfd";
  for (uint64_t at = 0; at < size;) {
    const uint64_t piece = cut ? std::min(step, size - at) : size;
    auto b = pool->Build(piece, hugetlb, offer);
    if (!b.ok()) return b.status();  // the pieces built so far reclaim themselves
    out.push_back(std::move(*b));
    at += piece;
  }
  return out;
}

}  // namespace

Allocator::Allocator(LeaseManager& manager) : m_(manager) {}

uint64_t Allocator::Insert(ConnId conn, const AllocParams& p, Pool* pool, uint64_t size,
                           std::vector<std::unique_ptr<Backing>> extents, bool from_warm,
                           std::string reason) {
  CXLPOOL_CHECK(!extents.empty());
  uint64_t id = m_.journal_.NextId();
  Lease l;
  l.id = id;
  l.size = size;
  l.requested = p.size_bytes;
  l.pool = pool;
  l.tier = pool->quota_tier();
  l.label = p.label;
  l.name = p.name;
  l.acl_uids = p.acl_uids;
  l.acl_gids = p.acl_gids;
  l.owner = m_.conns_.at(conn).caller;
  l.created_unix = m_.clock_->WallSeconds();
  m_.extra_extents_ += extents.size() - 1;
  l.extents = std::move(extents);
  l.from_warm = from_warm;
  l.placement_reason = std::move(reason);
  l.gpu = p.gpu;
  l.home_node = p.home_node;
  l.long_term_pin = p.long_term_pin;
  l.holders[conn] = 1;
  l.refs = 1;
  m_.conns_.at(conn).held.insert(id);
  m_.table_.Add(std::move(l));  // indexed by owner and name
  m_.Count("grants");
  return id;
}

void Allocator::Refuse(const AllocDone& done, Status st, const char* reason) {
  m_.Count("refusals");
  m_.Count(std::string("refusals_") + (reason != nullptr ? reason : RefusalReason(st.code())));
  done(std::move(st));
}

void Allocator::Allocate(ConnId conn, AllocParams p, AllocDone done) {
  auto c = m_.conns_.find(conn);
  if (c == m_.conns_.end()) return Refuse(done, Status(Code::kInternal, "unknown connection"));
  const CallerInfo& caller = c->second.caller;
  if (Status st = CheckRequest(caller, p); !st.ok()) return Refuse(done, std::move(st));
  if (Status lim = m_.CheckDaemonLimits(); !lim.ok()) return Refuse(done, lim, "daemon_limit");
  auto plan = PlanPlacement(*m_.topo_, m_.pool_ptrs_, PlacementFor(p));
  if (!plan.ok()) return Refuse(done, plan.status());

  const Tenant tenant = TenantOf(caller);
  PoolRefusals why;  // each candidate that could not take it, in order
  for (Candidate& cand : *plan) {
    Pool* pool = cand.pool;
    std::string reason = cand.reason;
    if (!p.fell_back_from.empty()) reason += "; fell back from " + p.fell_back_from;
    if (!why.text.empty()) reason += "; fell back from " + why.text;
    std::optional<uint64_t> size = Admit(tenant, p, pool, &why);
    if (!size) continue;
    // A long-term pin on a mixed node: built fresh, then moved into the
    // node's kernel zones (reserve extents sit in ZONE_MOVABLE).
    const FileSystem* settle = cand.settle ? m_.settle_fs_ : nullptr;
    std::shared_ptr<ExtentReserve::Taken> taken =
        settle == nullptr && !m_.stopping_ ? LeaseStock::Take(pool, p, *size) : nullptr;
    if (!pool->TryReserve(*size)) {
      LeaseStock::Return(pool, std::move(taken));
      if (pool->FitsAfterReclaims(*size)) {
        // Room is coming back from released leases: wait for it here rather
        // than refuse, or fall back to a pool the caller did not prefer.
        if (!m_.retrying_waiters_) m_.Count("waits_for_reclaim");
        m_.waiting_.Push(WaitingAlloc{conn, std::move(p), std::move(done)});
        return;
      }
      why.Add(PoolRoom(pool), "capacity");
      continue;
    }
    BuildJob job{conn,   std::move(p),      std::move(done),    pool,
                 *size,  std::move(reason), pool->quota_tier(), tenant,
                 settle, std::move(taken)};
    if (job.taken && job.taken->plan.build_bytes == 0) return GrantFromReserve(std::move(job));
    return StartBuild(std::move(job));
  }
  Refuse(done, Status(why.code, "cannot place " + HumanBytes(p.size_bytes) + ": " + why.text),
         why.first_reason);
}

void Allocator::PoolRefusals::Add(const std::string& why, const char* reason, Code c) {
  text += (text.empty() ? "" : "; ") + why;
  if (first_reason == nullptr) first_reason = reason;
  if (c == Code::kInvalidArgument) code = c;
}

Status Allocator::CheckRequest(const CallerInfo& caller, const AllocParams& p) const {
  if (m_.stopping_) return Status(Code::kUnavailable, "daemon is shutting down");
  if (p.size_bytes == 0) return Status(Code::kInvalidArgument, "size_bytes must be greater than 0");
  if (p.label.size() > kMaxLabelBytes) {
    return Status(Code::kInvalidArgument, "label longer than 256 bytes");
  }
  if (p.name.size() > kMaxNameBytes) {
    return Status(Code::kInvalidArgument, "name longer than 255 bytes");
  }
  if (p.acl_uids.size() + p.acl_gids.size() > kMaxAclEntries) {
    return Status(Code::kInvalidArgument, "ACL longer than 64 entries");
  }
  if (p.name.empty() && (!p.acl_uids.empty() || !p.acl_gids.empty())) {
    return Status(Code::kInvalidArgument, "an ACL needs a shared name");
  }
  // Names are per owner uid: only the caller's own namespace can clash.
  if (!p.name.empty() && m_.table_.Named(caller.uid, p.name)) {
    return Status(Code::kAlreadyExists, "you (uid " + std::to_string(caller.uid) +
                                            ") already have a shared lease named '" + p.name + "'");
  }
  return Status::Ok();
}

PlacementRequest Allocator::PlacementFor(const AllocParams& p) {
  PlacementRequest pr;
  pr.numa_node = p.numa_node;
  pr.gpu = p.gpu;
  pr.tiers = p.tiers;
  pr.strict = p.strict;
  pr.home_node = p.home_node;
  pr.long_term_pin = p.long_term_pin;
  pr.exclude = p.exclude_pools;
  return pr;
}

std::optional<uint64_t> Allocator::Admit(const Tenant& tenant, const AllocParams& p, Pool* pool,
                                         PoolRefusals* why) const {
  auto size = pool->RoundSize(p.size_bytes, p.hugetlb);
  if (!size.ok()) {
    const bool invalid = size.status().code() == Code::kInvalidArgument;
    why->Add(size.status().message(), invalid ? "invalid" : "capacity", size.status().code());
    return std::nullopt;
  }
  Status q = m_.quotas_.Check(tenant, pool->quota_tier(), *size);
  if (!q.ok()) {
    why->Add(pool->name() + ": " + q.message(), "quota");
    return std::nullopt;
  }
  Status room = m_.quotas_.CheckReserve(tenant, pool->name(), pool->capacity(),
                                        pool->leased_bytes() + pool->reserved_bytes(), *size);
  if (!room.ok()) {
    why->Add(room.message(), "priority");
    return std::nullopt;
  }
  return *size;
}

void Allocator::GrantFromReserve(BuildJob job) {
  m_.quotas_.Charge(job.owner, job.tier, job.size);
  job.pool->CommitReserve(job.size);
  m_.Count("reserve_hits");
  uint64_t id = Insert(job.conn, job.params, job.pool, job.size,
                       LeaseStock::Assemble(job.taken.get(), {}), true, std::move(job.reason));
  if (!m_.PersistGrant(id, job.done)) return;
  const Lease& l = m_.table_.leases().at(id);
  job.done(Granted{m_.Snapshot(l), l.GrantedExtents()});
  // Only now (the reply is on the socket): refills must not compete with it.
  m_.Refill(job.pool);
}

void Allocator::RetryHeldBuilds() {
  // Builds held for a uid over its daemon-time share: ask again shortly (a
  // refill of its budget has no event of its own).
  if (!build_queue_.held() || busy_retry_armed_ || m_.stopping_) return;
  constexpr std::chrono::milliseconds kBusyRetry{2};
  if (!busy_retry_timer_) busy_retry_timer_ = std::make_unique<boost::asio::steady_timer>(m_.loop_);
  boost::asio::steady_timer* timer = busy_retry_timer_.get();
  busy_retry_armed_ = true;
  timer->expires_after(kBusyRetry);
  std::weak_ptr<bool> alive = m_.alive_;
  timer->async_wait([this, alive](const boost::system::error_code& ec) {
    auto a = alive.lock();
    if (!a || !*a || ec) return;
    busy_retry_armed_ = false;
    build_queue_.Retry();
    RetryHeldBuilds();
  });
}

void Allocator::StartBuild(BuildJob job) {
  // Quota and capacity are held while it builds; so is a shared name.
  m_.quotas_.Charge(job.owner, job.tier, job.size);
  if (!job.params.name.empty()) m_.table_.HoldName(job.owner.uid, job.params.name);
  m_.Count("warm_misses");
  ++m_.pending_builds_;
  const uid_t uid = job.owner.uid;
  const uint32_t owner_builds = ++m_.pending_builds_by_uid_[uid];
  Pool* pool = job.pool;
  const bool hugetlb = job.params.hugetlb;
  const FileSystem* settle = job.settle;
  // With reserve extents taken, only the rest is built now.
  const uint64_t sz = job.taken ? job.taken->plan.build_bytes : job.size;
  if (job.taken) m_.Count("reserve_partial_hits");
  const uint64_t max_extent = job.params.one_extent ? 0 : m_.max_extent_;
  std::weak_ptr<bool> alive = m_.alive_;
  // Runs on the loop once the backing is built.
  auto complete = [this, alive, job = std::move(job)](Result<Extents> built) mutable {
    auto a = alive.lock();
    if (!a || !*a) return;  // manager gone; `built` reclaims itself
    FinishBuild(std::move(job), std::move(built));
  };
  // A shared slice's build may wait for the cluster to claim one: never here.
  const bool device_slice = std::string(pool->backing()) == "shared-slice";
  if (sz <= m_.inline_max_ && owner_builds == 1 && settle == nullptr && !device_slice) {
    // Small, and no other build of this uid in flight: a few syscalls here
    // cost less than a hand-off to a worker and back, and need not wait
    // behind other uids' builds. A uid with builds in flight has the rest
    // built on the workers, so one uid's flood does not take the loop. The
    // completion is posted, as it would be from a worker.
    auto built = std::make_shared<Result<Extents>>(BuildExtents(pool, sz, hugetlb, max_extent));
    boost::asio::post(m_.loop_, [complete = std::move(complete), built]() mutable {
      complete(std::move(*built));
    });
    return;
  }
  // On a worker when the owner's turn comes (BuildQueue); the completion
  // on the loop frees its turn.
  auto on_loop = std::make_shared<decltype(complete)>(std::move(complete));
  auto finish = [this, alive, on_loop, uid](Result<Extents> built, std::chrono::nanoseconds took) {
    const auto start = std::chrono::steady_clock::now();
    auto a = alive.lock();
    if (!a || !*a) return;  // manager gone; `built` reclaims itself
    build_queue_.Done(uid);
    RetryHeldBuilds();
    (*on_loop)(std::move(built));  // the grant: journal, reply
    if (busy_charge_) busy_charge_(uid, took + (std::chrono::steady_clock::now() - start));
  };
  // A large prefault is shared with idle workers (OfferFill): on the
  // worker, handed to the loop.
  FillOffer offer = [this, alive, uid](const std::shared_ptr<SharedFill>& fill) {
    boost::asio::post(m_.loop_, [this, alive, uid, fill]() {
      auto a = alive.lock();
      if (a && *a) OfferFill(uid, fill);
    });
  };
  build_queue_.Submit(uid, [this, pool, sz, hugetlb, settle, max_extent, finish, offer]() {
    boost::asio::post(
        m_.workers_, [this, pool, sz, hugetlb, settle, max_extent, finish, offer]() mutable {
          const auto start = std::chrono::steady_clock::now();
          // A long-term pin on a mixed node: only where its
          // kernel zones have room, then moved there.
          Status zone_room = settle != nullptr ? CheckKernelZoneRoom(sz, pool->numa_node(), *settle)
                                               : Status::Ok();
          auto built = std::make_shared<Result<Extents>>(
              zone_room.ok() ? BuildExtents(pool, sz, hugetlb, max_extent, offer)
                             : Result<Extents>(zone_room));
          for (size_t i = 0; built->ok() && settle != nullptr && i < (*built)->size(); ++i) {
            const Backing& b = *(**built)[i];
            Status st = SettleInKernelZones(b.daemon_addr(), b.size_bytes(), b.page_size(),
                                            pool->numa_node());
            if (!st.ok()) *built = st;  // the extents reclaim themselves
          }
          const std::chrono::nanoseconds took = std::chrono::steady_clock::now() - start;
          boost::asio::post(m_.loop_,
                            [finish, built, took]() mutable { finish(std::move(*built), took); });
        });
  });
  RetryHeldBuilds();
}

void Allocator::OfferFill(uid_t uid, const std::shared_ptr<SharedFill>& fill) {
  // One helper per other worker, each taking one chunk per turn: a helper
  // slot goes back to the BuildQueue after every chunk, so another uid's
  // build waits for one chunk, not for this whole build. Offered even when
  // the owner has taken every chunk by now (a helper then finds none).
  const uint64_t others = build_queue_.max_running() - 1;
  const uint64_t helpers = std::min<uint64_t>(others, fill->chunks() - 1);
  for (uint64_t i = 0; i < helpers; ++i) SubmitFillHelper(uid, fill);
}

void Allocator::SubmitFillHelper(uid_t uid, const std::shared_ptr<SharedFill>& fill) {
  m_.Count("build_helpers");
  std::weak_ptr<bool> alive = m_.alive_;
  build_queue_.Submit(uid, [this, alive, uid, fill]() {
    boost::asio::post(m_.workers_, [this, alive, uid, fill]() {
      const auto start = std::chrono::steady_clock::now();
      const bool took = fill->HelpOne();
      const std::chrono::nanoseconds spent = std::chrono::steady_clock::now() - start;
      boost::asio::post(m_.loop_, [this, alive, uid, fill, took, spent]() {
        auto a = alive.lock();
        if (!a || !*a) return;
        build_queue_.Done(uid);
        if (took) m_.Count("build_helper_chunks");
        if (busy_charge_) busy_charge_(uid, spent);
        // Its turn again, behind whatever waits now.
        if (took && !m_.stopping_ && !fill->exhausted()) SubmitFillHelper(uid, fill);
        RetryHeldBuilds();
      });
    });
  });
}

void Allocator::UndoBuildHold(const BuildJob& job) {
  LeaseStock::Return(job.pool, job.taken);
  job.pool->CancelReserve(job.size);
  // The charge was made against the caller at request time.
  m_.quotas_.Uncharge(job.owner, job.tier, job.size);
  if (!job.params.name.empty()) m_.table_.DropHeldName(job.owner.uid, job.params.name);
}

void Allocator::FinishBuild(BuildJob job, Result<Extents> built) {
  --m_.pending_builds_;
  if (auto b = m_.pending_builds_by_uid_.find(job.owner.uid); --b->second == 0) {
    m_.pending_builds_by_uid_.erase(b);
  }
  const bool connected = m_.conns_.count(job.conn) != 0;
  const bool device_slice = std::string(job.pool->backing()) == "shared-slice";
  if (!built.ok() && (job.settle != nullptr || device_slice) && !job.params.strict && connected &&
      !m_.stopping_) {
    // The mixed node's kernel zones could not keep it, or no slice of the
    // shared device came (fenced, all taken): try the next candidates,
    // never this pool again for this request.
    UndoBuildHold(job);
    m_.Count(device_slice ? "shared_slice_fallbacks" : "pin_settle_fallbacks");
    CXLPOOL_LOG(kInfo) << job.pool->name() << ": " << built.status().message()
                       << "; placing the lease elsewhere";
    AllocParams& p = job.params;
    p.exclude_pools.push_back(job.pool);
    p.fell_back_from +=
        (p.fell_back_from.empty() ? "" : "; ") + job.pool->name() + ": " + built.status().message();
    m_.Refill(job.pool);
    Allocate(job.conn, std::move(p), std::move(job.done));
    return;
  }
  if (!built.ok() || !connected || m_.stopping_) {
    UndoBuildHold(job);
    m_.Count(built.ok() ? "abandoned_builds" : "build_failures");
    m_.Count("refusals");
    m_.Count(built.ok() ? "refusals_unavailable" : "refusals_build_failed");
    if (!built.ok()) {
      job.done(built.status());
    } else {
      job.done(Status(Code::kUnavailable, "connection closed before the lease was ready"));
    }
    m_.Refill(job.pool);
    return;
  }
  job.pool->CommitReserve(job.size);
  Extents extents =
      job.taken ? LeaseStock::Assemble(job.taken.get(), std::move(*built)) : std::move(*built);
  uint64_t id = Insert(job.conn, job.params, job.pool, job.size, std::move(extents), false,
                       std::move(job.reason));
  if (!m_.PersistGrant(id, job.done)) return;
  const Lease& l = m_.table_.leases().at(id);
  job.done(Granted{m_.Snapshot(l), l.GrantedExtents()});
  if (job.taken) m_.Refill(job.pool);  // the reserve gave some of it
}

void LeaseManager::RetryWaiting() {
  // Waiting allocations first (in arrival order), so reserve refills cannot
  // take the room they waited for; one that still only fits after the
  // remaining reclaims waits again.
  if (!waiting_.empty() && !stopping_) {
    std::vector<WaitingAlloc> retry = waiting_.TakeAll();
    retrying_waiters_ = true;
    for (auto& w : retry) Allocate(w.conn, std::move(w.params), std::move(w.done));
    retrying_waiters_ = false;
  }
  if (waiting_.empty()) {
    for (Pool* p : pool_ptrs_) Refill(p);
  }
}

void LeaseManager::RefuseWaiting(const Status& why) {
  for (WaitingAlloc& w : waiting_.TakeAll()) {
    Count("refusals");
    Count(std::string("refusals_") + RefusalReason(why.code()));
    w.done(why);
  }
}

void LeaseManager::StopReserves() { stock_.Stop(pool_ptrs_); }

void LeaseManager::SetBusyHooks(BusyCharge charge, std::function<bool(uid_t)> throttled) {
  reclaims_.set_charge(charge);
  alloc_->SetBusyHooks(std::move(charge), std::move(throttled));
}

void LeaseManager::SetBuildConcurrency(size_t n) { alloc_->SetBuildConcurrency(n); }

void LeaseManager::Allocate(ConnId conn, AllocParams params, AllocDone done) {
  alloc_->Allocate(conn, std::move(params), std::move(done));
}

void Allocator::SetBusyHooks(BusyCharge charge, std::function<bool(uid_t)> throttled) {
  busy_charge_ = std::move(charge);
  if (throttled) {
    build_queue_.set_may_start(
        [throttled = std::move(throttled)](uid_t uid) { return !throttled(uid); });
  } else {
    build_queue_.set_may_start(nullptr);
  }
}

}  // namespace cxlpool
