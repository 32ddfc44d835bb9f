#include "lease/lease_manager.h"

#include <algorithm>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <mutex>

#include "cxlpool/common/log.h"
#include "cxlpool/common/page_census.h"
#include "cxlpool/common/strings.h"
#include "lease/longterm_pin.h"

namespace cxlpool {

namespace {
constexpr size_t kMaxNameBytes = 255;
constexpr size_t kMaxLabelBytes = 256;
constexpr size_t kMaxAclEntries = 64;
constexpr size_t kMaxRevokedRemembered = 65536;

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

// Where the kernel says the pages of every extent are (each extent's share
// of `max_samples` by its size, at least one), added up.
Result<PageCensus> CensusExtents(const std::vector<std::unique_ptr<Backing>>& extents,
                                 uint64_t total, uint64_t max_samples) {
  PageCensus all;
  for (const auto& e : extents) {
    const uint64_t share =
        std::max<uint64_t>(1, total == 0 ? max_samples : max_samples * e->size_bytes() / total);
    auto c = CensusPages(e->daemon_addr(), e->size_bytes(), 4096, share);
    if (!c.ok()) return c.status();
    all.sampled += c->sampled;
    all.absent += c->absent;
    all.errors += c->errors;
    for (const auto& [node, n] : c->on_node) all.on_node[node] += n;
  }
  return all;
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

LeaseManager::LeaseManager(const Topology* topo, std::vector<std::unique_ptr<Pool>> pools,
                           QuotaTable quotas, Executor loop, Executor workers, const Clock* clock)
    : topo_(topo),
      pools_(std::move(pools)),
      quotas_(std::move(quotas)),
      loop_(std::move(loop)),
      workers_(std::move(workers)),
      clock_(clock),
      reclaims_(loop_, workers_,
                [this](Pool* pool, uint64_t size) { BackingReclaimed(pool, size); }) {
  for (auto& p : pools_) {
    pool_ptrs_.push_back(p.get());
    if (ExtentReserve* r = p->reserve()) r->set_clock(clock_);
  }
}

LeaseManager::~LeaseManager() {
  Shutdown();
  *alive_ = false;
}

void LeaseManager::Connect(ConnId conn, CallerInfo caller) {
  pid_t pid = caller.pid;
  conns_[conn].caller = std::move(caller);
  CheckHolderOf(pid);  // restart: leases this process no longer holds
}

const CallerInfo* LeaseManager::Caller(ConnId conn) const {
  auto it = conns_.find(conn);
  return it == conns_.end() ? nullptr : &it->second.caller;
}

bool LeaseManager::HoldsLeases(ConnId conn) const {
  auto it = conns_.find(conn);
  return it != conns_.end() && !it->second.held.empty();
}

bool LeaseManager::IsAdmin(ConnId conn) const {
  const CallerInfo* c = Caller(conn);
  return c != nullptr && c->is_admin;
}

void LeaseManager::Disconnect(ConnId conn) {
  auto it = conns_.find(conn);
  if (it == conns_.end()) return;
  std::vector<uint64_t> held(it->second.held.begin(), it->second.held.end());
  for (uint64_t id : held) {
    auto l = table_.leases().find(id);
    if (l == table_.leases().end()) continue;
    auto h = l->second.holders.find(conn);
    if (h == l->second.holders.end()) continue;
    DropRef(l->second, conn, h->second);
    if (Unheld(l->second)) {
      Free(id, "disconnect_reclaims");
    } else {
      (void)Persist(l->second, {});  // a shared lease lost a holder
    }
  }
  conns_.erase(conn);
  // Its allocations still waiting for reclaims: nobody to answer any more.
  for (WaitingAlloc& w : waiting_.TakeConn(conn)) {
    Count("abandoned_waits");
    Count("refusals");
    Count("refusals_unavailable");
    w.done(Status(Code::kUnavailable, "connection closed while the allocation waited"));
  }
}

void LeaseManager::DropRef(Lease& lease, ConnId conn, uint32_t n) {
  auto h = lease.holders.find(conn);
  CXLPOOL_CHECK(h != lease.holders.end() && h->second >= n && lease.refs >= n);
  h->second -= n;
  lease.refs -= n;
  if (h->second == 0) {
    lease.holders.erase(h);
    auto c = conns_.find(conn);
    if (c != conns_.end()) c->second.held.erase(lease.id);
  }
}

void LeaseManager::Free(uint64_t id, const char* counter, std::function<void()> then) {
  Lease l = table_.Remove(id);
  Unpersist(id);
  for (const auto& [conn, n] : l.holders) {
    auto c = conns_.find(conn);
    if (c != conns_.end()) c->second.held.erase(id);
  }
  // Each pool keeps counting its bytes (as reclaiming) until a worker has
  // truncated them; the tenant's quota is free now.
  DropPoolMove(l);
  Count(counter);
  extra_extents_ -=
      std::min<uint64_t>(extra_extents_, l.extents.empty() ? 0 : l.extents.size() - 1);
  const Tenant tenant = TenantOf(l.owner);
  std::vector<LeaseRecord::PoolBytes> by = l.BytesByPool();
  if (by.size() == 1) {
    l.pool->BeginReclaim(l.size);
    quotas_.Uncharge(tenant, l.tier, l.size);
    reclaims_.Submit(l.pool, l.size, std::move(l.extents), std::move(then), l.owner.uid);
    return;
  }
  // Split between pools: one reclaim per pool, `then` after the last.
  ChargeTiers(l, false);
  auto left = std::make_shared<size_t>(by.size());
  auto after = std::make_shared<std::function<void()>>(std::move(then));
  for (auto& b : by) {
    b.pool->BeginReclaim(b.bytes);
    std::vector<std::unique_ptr<Backing>> part;
    for (size_t i : b.extents) {
      if (i < l.extents.size()) part.push_back(std::move(l.extents[i]));
    }
    reclaims_.Submit(
        b.pool, b.bytes, std::move(part),
        [left, after] {
          if (--*left == 0 && *after) (*after)();
        },
        l.owner.uid);
  }
}

void LeaseManager::BackingReclaimed(Pool* pool, uint64_t size) {
  pool->ReleaseLeased(size);
  Count("reclaims_done");
  RetryWaiting();
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

uint64_t LeaseManager::Insert(ConnId conn, const AllocParams& p, Pool* pool, uint64_t size,
                              std::vector<std::unique_ptr<Backing>> extents, bool from_warm,
                              std::string reason) {
  CXLPOOL_CHECK(!extents.empty());
  uint64_t id = NextId();
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
  l.owner = conns_.at(conn).caller;
  l.created_unix = clock_->WallSeconds();
  extra_extents_ += extents.size() - 1;
  l.extents = std::move(extents);
  l.from_warm = from_warm;
  l.placement_reason = std::move(reason);
  l.gpu = p.gpu;
  l.home_node = p.home_node;
  l.long_term_pin = p.long_term_pin;
  l.holders[conn] = 1;
  l.refs = 1;
  conns_.at(conn).held.insert(id);
  table_.Add(std::move(l));  // indexed by owner and name
  Count("grants");
  return id;
}

void LeaseManager::Refuse(const AllocDone& done, Status st, const char* reason) {
  Count("refusals");
  Count(std::string("refusals_") + (reason != nullptr ? reason : RefusalReason(st.code())));
  done(std::move(st));
}

void LeaseManager::Allocate(ConnId conn, AllocParams p, AllocDone done) {
  auto c = conns_.find(conn);
  if (c == conns_.end()) return Refuse(done, Status(Code::kInternal, "unknown connection"));
  const CallerInfo& caller = c->second.caller;
  if (Status st = CheckRequest(caller, p); !st.ok()) return Refuse(done, std::move(st));
  if (Status lim = CheckDaemonLimits(); !lim.ok()) return Refuse(done, lim, "daemon_limit");
  auto plan = PlanPlacement(*topo_, pool_ptrs_, PlacementFor(p));
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
    const FileSystem* settle = cand.settle ? settle_fs_ : nullptr;
    std::shared_ptr<ExtentReserve::Taken> taken =
        settle == nullptr ? TakeFromReserve(pool, p, *size) : nullptr;
    if (!pool->TryReserve(*size)) {
      ReturnToReserve(pool, std::move(taken));
      if (pool->FitsAfterReclaims(*size)) {
        // Room is coming back from released leases: wait for it here rather
        // than refuse, or fall back to a pool the caller did not prefer.
        if (!retrying_waiters_) Count("waits_for_reclaim");
        waiting_.Push(WaitingAlloc{conn, std::move(p), std::move(done)});
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

void LeaseManager::PoolRefusals::Add(const std::string& why, const char* reason, Code c) {
  text += (text.empty() ? "" : "; ") + why;
  if (first_reason == nullptr) first_reason = reason;
  if (c == Code::kInvalidArgument) code = c;
}

Status LeaseManager::CheckRequest(const CallerInfo& caller, const AllocParams& p) const {
  if (stopping_) return Status(Code::kUnavailable, "daemon is shutting down");
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
  if (!p.name.empty() && table_.Named(caller.uid, p.name)) {
    return Status(Code::kAlreadyExists, "you (uid " + std::to_string(caller.uid) +
                                            ") already have a shared lease named '" + p.name + "'");
  }
  return Status::Ok();
}

PlacementRequest LeaseManager::PlacementFor(const AllocParams& p) {
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

std::optional<uint64_t> LeaseManager::Admit(const Tenant& tenant, const AllocParams& p, Pool* pool,
                                            PoolRefusals* why) const {
  auto size = pool->RoundSize(p.size_bytes, p.hugetlb);
  if (!size.ok()) {
    const bool invalid = size.status().code() == Code::kInvalidArgument;
    why->Add(size.status().message(), invalid ? "invalid" : "capacity", size.status().code());
    return std::nullopt;
  }
  Status q = quotas_.Check(tenant, pool->quota_tier(), *size);
  if (!q.ok()) {
    why->Add(pool->name() + ": " + q.message(), "quota");
    return std::nullopt;
  }
  Status room = quotas_.CheckReserve(tenant, pool->name(), pool->capacity(),
                                     pool->leased_bytes() + pool->reserved_bytes(), *size);
  if (!room.ok()) {
    why->Add(room.message(), "priority");
    return std::nullopt;
  }
  return *size;
}

std::shared_ptr<ExtentReserve::Taken> LeaseManager::TakeFromReserve(Pool* pool,
                                                                    const AllocParams& p,
                                                                    uint64_t size) {
  ExtentReserve* r = pool->reserve();
  if (r == nullptr || r->ready_bytes() == 0 || stopping_) return nullptr;
  if (p.hugetlb && !r->hugetlb()) return nullptr;  // the reserve is not hugetlb
  // A dry run first: nothing is taken (or shrunk) that the request cannot use.
  auto plan = r->Plan(p.size_bytes);
  if (!plan.ok() || plan->lease_bytes != size || plan->reserve_pieces() == 0) return nullptr;
  if (p.one_extent && plan->pieces.size() > 1) return nullptr;
  auto t = r->Take(p.size_bytes);
  if (!t.ok()) {
    CXLPOOL_LOG(kWarning) << pool->name() << ": taking reserve extents: " << t.status().ToString();
    pool->RetireReserveNow();  // the extent that failed to shrink
    return nullptr;
  }
  return std::make_shared<ExtentReserve::Taken>(std::move(*t));
}

void LeaseManager::ReturnToReserve(Pool* pool, std::shared_ptr<ExtentReserve::Taken> taken) {
  if (taken == nullptr || pool->reserve() == nullptr) return;
  pool->reserve()->Return(std::move(taken->extents));
  // A shrunk tail cannot go back: retired here (at most one small extent),
  // not through a refill that could take room an allocation waits for.
  pool->RetireReserveNow();
}

LeaseManager::Extents LeaseManager::Assemble(ExtentReserve::Taken* taken, Extents built) {
  Extents out;
  size_t next = 0;
  for (const CutPiece& piece : taken->plan.pieces) {
    if (piece.source == CutPiece::Source::kReserve) {
      CXLPOOL_CHECK(next < taken->extents.size());
      out.push_back(LeaseBacking(std::move(taken->extents[next++])));
    } else {
      for (auto& b : built) out.push_back(std::move(b));
      built.clear();
    }
  }
  taken->extents.clear();
  return out;
}

void LeaseManager::GrantFromReserve(BuildJob job) {
  quotas_.Charge(job.owner, job.tier, job.size);
  job.pool->CommitReserve(job.size);
  Count("reserve_hits");
  uint64_t id = Insert(job.conn, job.params, job.pool, job.size, Assemble(job.taken.get(), {}),
                       true, std::move(job.reason));
  if (!PersistGrant(id, job.done)) return;
  const Lease& l = table_.leases().at(id);
  job.done(Granted{Snapshot(l), l.GrantedExtents()});
  // Only now (the reply is on the socket): refills must not compete with it.
  Refill(job.pool);
}

ReserveRefiller* LeaseManager::RefillerOf(Pool* pool) {
  if (pool->reserve() == nullptr) return nullptr;
  auto it = refillers_.find(pool);
  if (it != refillers_.end()) return it->second.get();
  ReserveRefiller::Options o;
  o.loop = loop_;
  o.stock = stock_ ? *stock_ : workers_;
  o.stock_threads = stock_ ? stock_threads_ : 1;
  o.retire = workers_;
  o.room = [pool] { return pool->free_bytes(); };
  o.on_freed = [this] {
    if (!stopping_) RetryWaiting();
  };
  o.on_built = [this](bool ok) { Count(ok ? "reserve_builds" : "reserve_build_failures"); };
  auto rf = std::make_unique<ReserveRefiller>(pool->reserve(), std::move(o));
  ReserveRefiller* raw = rf.get();
  refillers_.emplace(pool, std::move(rf));
  return raw;
}

void LeaseManager::StopReserves() {
  for (Pool* p : pool_ptrs_) {
    if (ReserveRefiller* rf = RefillerOf(p)) rf->Stop();
  }
}

void LeaseManager::SetBusyHooks(BusyCharge charge, std::function<bool(uid_t)> throttled) {
  busy_charge_ = charge;
  reclaims_.set_charge(std::move(charge));
  if (throttled) {
    build_queue_.set_may_start(
        [throttled = std::move(throttled)](uid_t uid) { return !throttled(uid); });
  } else {
    build_queue_.set_may_start(nullptr);
  }
}

void LeaseManager::RetryHeldBuilds() {
  // Builds held for a uid over its daemon-time share: ask again shortly (a
  // refill of its budget has no event of its own).
  if (!build_queue_.held() || busy_retry_armed_ || stopping_) return;
  constexpr std::chrono::milliseconds kBusyRetry{2};
  if (!busy_retry_timer_) busy_retry_timer_ = std::make_shared<boost::asio::steady_timer>(loop_);
  auto* timer = static_cast<boost::asio::steady_timer*>(busy_retry_timer_.get());
  busy_retry_armed_ = true;
  timer->expires_after(kBusyRetry);
  std::weak_ptr<bool> alive = alive_;
  timer->async_wait([this, alive](const boost::system::error_code& ec) {
    auto a = alive.lock();
    if (!a || !*a || ec) return;
    busy_retry_armed_ = false;
    build_queue_.Retry();
    RetryHeldBuilds();
  });
}

void LeaseManager::StartBuild(BuildJob job) {
  // Quota and capacity are held while it builds; so is a shared name.
  quotas_.Charge(job.owner, job.tier, job.size);
  if (!job.params.name.empty()) table_.HoldName(job.owner.uid, job.params.name);
  Count("warm_misses");
  ++pending_builds_;
  const uid_t uid = job.owner.uid;
  const uint32_t owner_builds = ++pending_builds_by_uid_[uid];
  Pool* pool = job.pool;
  const bool hugetlb = job.params.hugetlb;
  const FileSystem* settle = job.settle;
  // With reserve extents taken, only the rest is built now.
  const uint64_t sz = job.taken ? job.taken->plan.build_bytes : job.size;
  if (job.taken) Count("reserve_partial_hits");
  const uint64_t max_extent = job.params.one_extent ? 0 : max_extent_;
  std::weak_ptr<bool> alive = alive_;
  // Runs on the loop once the backing is built.
  auto complete = [this, alive, job = std::move(job)](Result<Extents> built) mutable {
    auto a = alive.lock();
    if (!a || !*a) return;  // manager gone; `built` reclaims itself
    FinishBuild(std::move(job), std::move(built));
  };
  if (sz <= inline_max_ && owner_builds == 1 && settle == nullptr) {
    // Small, and no other build of this uid in flight: a few syscalls here
    // cost less than a hand-off to a worker and back, and need not wait
    // behind other uids' builds. A uid with builds in flight has the rest
    // built on the workers, so one uid's flood does not take the loop. The
    // completion is posted, as it would be from a worker.
    auto built = std::make_shared<Result<Extents>>(BuildExtents(pool, sz, hugetlb, max_extent));
    boost::asio::post(
        loop_, [complete = std::move(complete), built]() mutable { complete(std::move(*built)); });
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
    boost::asio::post(loop_, [this, alive, uid, fill]() {
      auto a = alive.lock();
      if (a && *a) OfferFill(uid, fill);
    });
  };
  build_queue_.Submit(uid, [this, pool, sz, hugetlb, settle, max_extent, finish, offer]() {
    boost::asio::post(
        workers_, [this, pool, sz, hugetlb, settle, max_extent, finish, offer]() mutable {
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
          boost::asio::post(loop_,
                            [finish, built, took]() mutable { finish(std::move(*built), took); });
        });
  });
  RetryHeldBuilds();
}

void LeaseManager::OfferFill(uid_t uid, const std::shared_ptr<SharedFill>& fill) {
  // One helper per other worker, each taking one chunk per turn: a helper
  // slot goes back to the BuildQueue after every chunk, so another uid's
  // build waits for one chunk, not for this whole build. Offered even when
  // the owner has taken every chunk by now (a helper then finds none).
  const uint64_t others = build_queue_.max_running() - 1;
  const uint64_t helpers = std::min<uint64_t>(others, fill->chunks() - 1);
  for (uint64_t i = 0; i < helpers; ++i) SubmitFillHelper(uid, fill);
}

void LeaseManager::SubmitFillHelper(uid_t uid, const std::shared_ptr<SharedFill>& fill) {
  Count("build_helpers");
  std::weak_ptr<bool> alive = alive_;
  build_queue_.Submit(uid, [this, alive, uid, fill]() {
    boost::asio::post(workers_, [this, alive, uid, fill]() {
      const auto start = std::chrono::steady_clock::now();
      const bool took = fill->HelpOne();
      const std::chrono::nanoseconds spent = std::chrono::steady_clock::now() - start;
      boost::asio::post(loop_, [this, alive, uid, fill, took, spent]() {
        auto a = alive.lock();
        if (!a || !*a) return;
        build_queue_.Done(uid);
        if (took) Count("build_helper_chunks");
        if (busy_charge_) busy_charge_(uid, spent);
        // Its turn again, behind whatever waits now.
        if (took && !stopping_ && !fill->exhausted()) SubmitFillHelper(uid, fill);
        RetryHeldBuilds();
      });
    });
  });
}

void LeaseManager::UndoBuildHold(const BuildJob& job) {
  ReturnToReserve(job.pool, job.taken);
  job.pool->CancelReserve(job.size);
  // The charge was made against the caller at request time.
  quotas_.Uncharge(job.owner, job.tier, job.size);
  if (!job.params.name.empty()) table_.DropHeldName(job.owner.uid, job.params.name);
}

void LeaseManager::FinishBuild(BuildJob job, Result<Extents> built) {
  --pending_builds_;
  if (auto b = pending_builds_by_uid_.find(job.owner.uid); --b->second == 0) {
    pending_builds_by_uid_.erase(b);
  }
  const bool connected = conns_.count(job.conn) != 0;
  if (!built.ok() && job.settle != nullptr && !job.params.strict && connected && !stopping_) {
    // The mixed node's kernel zones could not keep it: try the next
    // candidates, never this pool again for this request.
    UndoBuildHold(job);
    Count("pin_settle_fallbacks");
    CXLPOOL_LOG(kInfo) << job.pool->name() << ": " << built.status().message()
                       << "; placing the lease elsewhere";
    AllocParams& p = job.params;
    p.exclude_pools.push_back(job.pool);
    p.fell_back_from +=
        (p.fell_back_from.empty() ? "" : "; ") + job.pool->name() + ": " + built.status().message();
    Refill(job.pool);
    Allocate(job.conn, std::move(p), std::move(job.done));
    return;
  }
  if (!built.ok() || !connected || stopping_) {
    UndoBuildHold(job);
    Count(built.ok() ? "abandoned_builds" : "build_failures");
    Count("refusals");
    Count(built.ok() ? "refusals_unavailable" : "refusals_build_failed");
    if (!built.ok()) {
      job.done(built.status());
    } else {
      job.done(Status(Code::kUnavailable, "connection closed before the lease was ready"));
    }
    Refill(job.pool);
    return;
  }
  job.pool->CommitReserve(job.size);
  Extents extents = job.taken ? Assemble(job.taken.get(), std::move(*built)) : std::move(*built);
  uint64_t id = Insert(job.conn, job.params, job.pool, job.size, std::move(extents), false,
                       std::move(job.reason));
  if (!PersistGrant(id, job.done)) return;
  const Lease& l = table_.leases().at(id);
  job.done(Granted{Snapshot(l), l.GrantedExtents()});
  if (job.taken) Refill(job.pool);  // the reserve gave some of it
}

namespace {
// One answer for "no such lease" and "not yours to see".
Status NoLease(uint64_t id) { return Status(Code::kNotFound, "no lease " + std::to_string(id)); }
}  // namespace

Status LeaseManager::NotInTable(ConnId conn, uint64_t id) const {
  const std::vector<uid_t>* told = table_.RevokedFor(id);
  const CallerInfo* c = Caller(conn);
  if (told != nullptr && c != nullptr &&
      (c->is_admin || std::find(told->begin(), told->end(), c->uid) != told->end())) {
    return Status(Code::kRevoked, "lease " + std::to_string(id) + " was revoked by an admin");
  }
  return NoLease(id);
}

Status LeaseManager::Release(ConnId conn, uint64_t id) {
  auto it = table_.leases().find(id);
  if (it == table_.leases().end()) {
    return NotInTable(conn, id);
  }
  if (!Visible(it->second, conn)) return NoLease(id);
  auto h = it->second.holders.find(conn);
  if (h == it->second.holders.end()) {
    return Status(Code::kPermissionDenied,
                  "lease " + std::to_string(id) + " is not held by this connection");
  }
  DropRef(it->second, conn, 1);
  Count("releases");
  if (Unheld(it->second)) {
    Free(id, "frees");
  } else if (!it->second.holders.count(conn)) {
    (void)Persist(it->second, {});  // a shared lease lost a holder
  }
  return Status::Ok();
}

bool LeaseManager::InAcl(const Lease& l, const CallerInfo& who) {
  auto has = [](const std::vector<uint32_t>& v, uint32_t x) {
    return std::find(v.begin(), v.end(), x) != v.end();
  };
  if (who.uid == 0 || who.uid == l.owner.uid || has(l.acl_uids, who.uid) ||
      has(l.acl_gids, who.gid)) {
    return true;
  }
  for (gid_t g : who.groups) {
    if (has(l.acl_gids, g)) return true;
  }
  return false;
}

Result<Granted> LeaseManager::Attach(ConnId conn, const std::string& name,
                                     std::optional<uid_t> owner_uid) {
  auto c = conns_.find(conn);
  if (c == conns_.end()) return Status(Code::kInternal, "unknown connection");
  const CallerInfo& who = c->second.caller;
  const uid_t owner = owner_uid.value_or(who.uid);
  // The same answer whether the name does not exist or the caller may not
  // attach to it; the refusal counter counts both alike.
  auto not_found = [&] {
    Count("acl_refusals");
    return Status(Code::kNotFound, "no shared lease '" + name + "' of uid " +
                                       std::to_string(owner) + " that uid " +
                                       std::to_string(who.uid) + " may attach");
  };
  std::optional<uint64_t> named = table_.Named(owner, name);
  if (!named) return not_found();
  if (*named == 0) {
    // Its ACL is not known before the lease exists: only its owner hears.
    if (who.uid != owner) return not_found();
    return Status(Code::kUnavailable, "shared lease '" + name + "' is still being built");
  }
  Lease& l = table_.leases().at(*named);
  if (!InAcl(l, who)) return not_found();
  if (l.awaited_memory) {
    return Status(Code::kUnavailable,
                  "shared lease '" + name + "' awaits its holders' reclaim after a daemon restart");
  }
  bool new_holder = l.holders[conn]++ == 0;
  l.refs += 1;
  c->second.held.insert(l.id);
  Count("attaches");
  if (new_holder) (void)Persist(l, {});
  return Granted{Snapshot(l), l.GrantedExtents()};
}

bool LeaseManager::Visible(const Lease& l, ConnId conn) const {
  const CallerInfo* c = Caller(conn);
  if (c == nullptr) return false;
  return c->is_admin || c->uid == l.owner.uid || l.holders.count(conn) > 0;
}

Result<LeaseSnapshot> LeaseManager::Stat(ConnId conn, uint64_t id) const {
  auto it = table_.leases().find(id);
  if (it == table_.leases().end()) {
    return NotInTable(conn, id);
  }
  if (!Visible(it->second, conn)) return NoLease(id);
  return Snapshot(it->second);
}

std::vector<QuotaUsage> LeaseManager::QuotasVisibleTo(ConnId conn) const {
  const CallerInfo* c = Caller(conn);
  if (c == nullptr) return {};
  std::vector<QuotaUsage> all = quotas_.Rules();
  if (c->is_admin) return all;
  const Tenant t = TenantOf(*c);
  std::vector<QuotaUsage> out;
  for (auto& q : all) {
    bool mine = false;
    switch (q.rule.scope) {
      case QuotaScope::kUid:
        mine = q.rule.id == t.uid;
        break;
      case QuotaScope::kGid:
        mine = q.rule.id == t.gid;
        break;
      case QuotaScope::kCgroup:
        mine = !t.cgroup.empty() && (q.rule.subject == "/" || t.cgroup == q.rule.subject ||
                                     StartsWith(t.cgroup, q.rule.subject + "/"));
        break;
    }
    if (mine) out.push_back(std::move(q));
  }
  return out;
}

Status LeaseManager::CheckDaemonLimits() const {
  // Fds: leases, builds, connections, plus the listening socket, journal,
  // reserve extents and libraries' own. Maps: the same leases, plus the
  // process's ordinary mappings.
  constexpr uint64_t kFdReserve = 128, kMapReserve = 1024;
  uint64_t reserve_extents = 0;  // ready, building and retiring reserve extents
  for (const Pool* p : pool_ptrs_) {
    if (const ExtentReserve* r = p->reserve()) {
      reserve_extents += r->ready_extents();
    }
  }
  for (const auto& [pool, rf] : refillers_) {
    reserve_extents += rf->pending_builds() + rf->pending_retires();
  }
  const uint64_t per_lease = table_.leases().size() + extra_extents_ + pending_builds_ +
                             reclaims_.pending() + reserve_extents;
  if (per_lease + conns_.size() + kFdReserve >= limits_.max_fds) {
    return Status(Code::kResourceExhausted,
                  "daemon fd limit: " + std::to_string(table_.leases().size()) +
                      " leases held and RLIMIT_NOFILE is " + std::to_string(limits_.max_fds) +
                      "; raise LimitNOFILE= for cxlpoold");
  }
  if (per_lease + kMapReserve >= limits_.max_maps) {
    return Status(Code::kResourceExhausted,
                  "daemon mapping limit: " + std::to_string(table_.leases().size()) +
                      " leases held and vm.max_map_count is " + std::to_string(limits_.max_maps) +
                      "; raise it (sysctl vm.max_map_count)");
  }
  return Status::Ok();
}

Result<std::vector<LeaseSnapshot>> LeaseManager::List(ConnId conn, bool all) const {
  const CallerInfo* c = Caller(conn);
  if (c == nullptr) return Status(Code::kInternal, "unknown connection");
  std::vector<LeaseSnapshot> out;
  if (all) {
    if (!c->is_admin) {
      return Status(Code::kPermissionDenied, "listing every tenant's leases needs admin");
    }
    for (const auto& [id, l] : table_.leases()) out.push_back(Snapshot(l));
  } else {
    std::unordered_set<uint64_t> ids = conns_.at(conn).held;
    const std::unordered_set<uint64_t>& owned = table_.OwnedBy(c->uid);
    ids.insert(owned.begin(), owned.end());
    for (uint64_t id : ids) out.push_back(Snapshot(table_.leases().at(id)));
  }
  std::sort(out.begin(), out.end(),
            [](const LeaseSnapshot& a, const LeaseSnapshot& b) { return a.id < b.id; });
  return out;
}

void LeaseManager::Revoke(ConnId conn, uint64_t id, RevokeDone done) {
  if (!IsAdmin(conn)) return done(Status(Code::kPermissionDenied, "revoke needs admin"));
  auto it = table_.leases().find(id);
  if (it == table_.leases().end()) {
    if (table_.RevokedFor(id) != nullptr) {
      return done(Status(Code::kRevoked, "lease " + std::to_string(id) + " was already revoked"));
    }
    return done(NoLease(id));
  }
  std::vector<ConnId> holders;
  std::vector<uid_t> uids{it->second.owner.uid};
  for (const auto& [h, n] : it->second.holders) {
    holders.push_back(h);
    if (const CallerInfo* hc = Caller(h); hc != nullptr) uids.push_back(hc->uid);
  }
  std::sort(holders.begin(), holders.end());
  table_.Revoked(id, std::move(uids), kMaxRevokedRemembered);
  // The holders hear of it only once the memory is truncated, so their next
  // access after the event SIGBUSes.
  Free(id, "revokes", [done = std::move(done), holders = std::move(holders)]() mutable {
    done(std::move(holders));
  });
}

Status LeaseManager::SetQuota(ConnId conn, const QuotaRule& rule) {
  if (!IsAdmin(conn)) return Status(Code::kPermissionDenied, "setting quotas needs admin");
  return quotas_.SetLiveRule(rule);
}

LeaseSnapshot LeaseManager::Snapshot(const Lease& l) const {
  LeaseSnapshot s;
  s.id = l.id;
  s.size_bytes = l.size;
  s.requested_bytes = l.requested;
  s.numa_node = l.pool->numa_node();
  s.kind = l.pool->kind();
  s.memory_tier = l.pool->memory_tier();
  s.label = l.label;
  s.name = l.name;
  s.owner = l.owner;
  s.created_unix = l.created_unix;
  s.holders = l.refs;
  s.backing = l.first().kind();
  s.page_size = l.first().page_size();
  s.extents = static_cast<uint32_t>(l.extents.size());
  if (l.extents.size() > 1) {
    for (const auto& e : l.extents) s.extent_bytes.push_back(e->size_bytes());
  }
  s.from_warm_stock = l.from_warm;
  s.placement_reason = l.placement_reason;
  s.pool = l.pool->name();
  s.long_term_pin = l.long_term_pin;
  s.placed_numa_node = l.placed_node;
  s.moved_reason = l.moved_reason;
  if (!l.extent_pools.empty()) {
    for (const Pool* p : l.extent_pools) {
      s.extent_pools.push_back(p->name());
      s.extent_nodes.push_back(p->numa_node());
    }
    s.spread = Spread(l);
  }
  if (l.moving_to != nullptr) {
    s.migration =
        "to " + l.moving_to->name() + ": " +
        (l.extent_count() > 1 ? "extent " + std::to_string(l.moving_extent) : "the lease") +
        (l.moving_note.empty() ? "" : "; " + l.moving_note);
  }
  if (l.pages_node) s.numa_node = *l.pages_node;
  return s;
}

Result<LeaseManager::MoveCheck> LeaseManager::CheckMoved(ConnId conn, uint64_t id) {
  auto it = table_.leases().find(id);
  if (it == table_.leases().end()) {
    return NotInTable(conn, id);
  }
  Lease& l = it->second;
  if (!Visible(l, conn)) return NoLease(id);  // not yours: as if it did not exist
  if (!l.holders.count(conn)) {
    return Status(Code::kPermissionDenied,
                  "lease " + std::to_string(id) + " is not held by this connection");
  }
  Count("moved_reports");
  const bool mapped = l.has_memory() && std::all_of(l.extents.begin(), l.extents.end(),
                                                    [](const std::unique_ptr<Backing>& e) {
                                                      return e->daemon_addr() != nullptr;
                                                    });
  if (!mapped) {
    return Status(Code::kUnsupported, "lease " + std::to_string(id) + " (" +
                                          (l.has_memory() ? l.first().kind() : std::string("?")) +
                                          ") has no daemon mapping for move_pages to ask about");
  }
  // The daemon's own view of the same pages, over every extent (samples
  // shared out by size): the holder's word moves nothing.
  Result<PageCensus> census = CensusExtents(l.extents, l.size, 4096);
  if (!census.ok()) return census.status();
  MoveCheck out;
  const std::optional<int> now = census->MajorityNode();
  const int accounted = l.pages_node.value_or(l.pool->numa_node());
  bool where_accounted = !now || *now == accounted;
  std::string off_pools;  // a split lease: the groups whose pages are elsewhere
  if (!l.extent_pools.empty() && now) {
    // Split between pools: each pool's extents asked on their own; a pin
    // that moved them all shows as a group off its pool's node.
    where_accounted = true;
    for (const auto& b : l.BytesByPool()) {
      PageCensus part;
      for (size_t i : b.extents) {
        const Backing& e = *l.extents[i];
        auto c = CensusPages(
            e.daemon_addr(), e.size_bytes(), 4096,
            std::max<uint64_t>(1, 4096 * e.size_bytes() / std::max<uint64_t>(1, l.size)));
        if (!c.ok()) return c.status();
        part.sampled += c->sampled;
        for (const auto& [node, n] : c->on_node) part.on_node[node] += n;
      }
      const std::optional<int> there = part.MajorityNode();
      if (there && *there != b.pool->numa_node()) {
        where_accounted = false;
        if (!off_pools.empty()) off_pools += ", ";
        off_pools += std::to_string(b.extents.size()) + " of " + std::to_string(l.extent_count()) +
                     " extents (" + HumanBytes(b.bytes) + ") accounted to " + b.pool->name() +
                     " are on node " + std::to_string(*there);
      }
    }
  }
  if (where_accounted) {
    out.lease = Snapshot(l);
    return out;
  }
  if (l.moving_to != nullptr) {
    // The tiering engine is moving these pages now: its commit (or abort)
    // accounts them, once; a second mover would count the lease twice.
    CXLPOOL_LOG(kInfo) << "lease " << id << ": pages on node " << *now << " while a move to "
                       << l.moving_to->name() << " is under way; that move accounts them";
    out.lease = Snapshot(l);
    return out;
  }
  Pool* to = nullptr;
  for (Pool* p : pool_ptrs_) {
    if (p->numa_node() == *now && std::string(p->backing()) == "memfd") to = p;
  }
  const std::string seen = " (daemon's move_pages: " + census->ToString() + ")";
  std::string why = off_pools.empty()
                        ? "pages moved from node " + std::to_string(accounted) + " to node " +
                              std::to_string(*now) + seen
                        : "pages moved: " + off_pools + "; most of the lease is on node " +
                              std::to_string(*now) + seen;
  if (to == nullptr) {
    // Nowhere to account them: the lease stays on its pool, and says where its pages are.
    if (!l.placed_node) l.placed_node = l.pool->numa_node();
    l.pages_node = *now;
    l.moved_reason = why + "; node " + std::to_string(*now) + " has no pool, so " + l.pool->name() +
                     " still accounts it";
    Count("leases_moved");
    (void)Persist(l, {});
  } else {
    Rehome(l, to, to == l.pool ? why : why + "; accounted to " + to->name() + " now");
  }
  CXLPOOL_LOG(kWarning) << "lease " << id << ": " << l.moved_reason;
  out.moved = true;
  out.lease = Snapshot(l);
  return out;
}

std::vector<PoolSnapshot> LeaseManager::Pools() const {
  std::vector<PoolSnapshot> out;
  for (const Pool* p : pool_ptrs_) {
    PoolSnapshot s;
    s.name = p->name();
    s.numa_node = p->numa_node();
    s.kind = p->kind();
    s.memory_tier = p->memory_tier();
    s.capacity_bytes = p->capacity();
    s.leased_bytes = p->leased_bytes() + p->reserved_bytes();
    s.free_bytes = p->free_bytes();
    s.page_size = p->page_size();
    s.backing = p->backing();
    s.dynamic_region = p->dynamic_region();
    s.lease_count = p->lease_count();
    s.reclaiming_bytes = p->reclaiming_bytes();
    if (const ExtentReserve* r = p->reserve()) {
      s.reserve_ready_bytes = r->ready_bytes();
      s.reserve_building_bytes = r->building_bytes();
      s.reserve_retiring_bytes = r->retiring_bytes();
      s.reserve_low_bytes = r->settings().low_bytes;
      s.reserve_high_bytes = r->settings().high_bytes;
      if (auto since = r->below_low_since_ns()) {
        s.reserve_below_low_ms =
            static_cast<uint64_t>(std::max<int64_t>(0, clock_->MonotonicNs() - *since) / 1000000);
      }
    }
    s.long_term_pin_policy = LongTermPinPolicyName(p->long_term_pin_policy());
    if (const NumaNode* n = topo_->FindNode(p->numa_node());
        n != nullptr && std::string(p->backing()) == "memfd") {
      s.kernel_zone_bytes = n->kernel_zone_bytes;
      s.movable_bytes = n->movable_bytes;
      const char* pins = LongTermPinsName(LongTermPinsOf(*n));
      s.long_term_pins = pins != nullptr ? pins : "";
    }
    out.push_back(std::move(s));
  }
  return out;
}

std::map<std::string, uint64_t> LeaseManager::Gauges() const {
  std::map<std::string, uint64_t> g;
  g["live_leases"] = table_.leases().size();
  g["connections"] = conns_.size();
  // Reserve refills and retirements count as builds and reclaims in flight.
  uint64_t reserve_builds = 0, reserve_retires = 0;
  for (const auto& [pool, rf] : refillers_) {
    reserve_builds += rf->pending_builds();
    reserve_retires += rf->pending_retires();
  }
  g["pending_builds"] = pending_builds_ + reserve_builds;
  g["pending_reclaims"] = reclaims_.pending() + reserve_retires;
  g["waiting_allocs"] = waiting_.size();
  g["shared_leases"] = table_.names();
  uint64_t leased = 0, cap = 0, reclaiming = 0, ready = 0, reserve = 0;
  for (const Pool* p : pool_ptrs_) {
    if (const ExtentReserve* r = p->reserve()) ready += r->ready_bytes();
    reserve += p->reserve_bytes();
    leased += p->leased_bytes() + p->reserved_bytes();
    cap += p->capacity();
    reclaiming += p->reclaiming_bytes();
  }
  g["leased_bytes"] = leased;
  g["reclaiming_bytes"] = reclaiming;
  g["reserve_bytes"] = reserve;  // ready + building + retiring
  g["reserve_ready_bytes"] = ready;
  g["capacity_bytes"] = cap;
  // What the last start found wrong with the journal (docs/daemon.md).
  g["journal_damaged"] = restart_.health.damaged ? 1 : 0;
  g["journal_skipped_regions"] = restart_.health.skipped_regions;
  g["journal_skipped_bytes"] = restart_.health.skipped_bytes;
  g["journal_dropped_tail_bytes"] = restart_.health.dropped_tail_bytes;
  return g;
}

void LeaseManager::StartRefills() {
  for (Pool* p : pool_ptrs_) Refill(p);
}

void LeaseManager::Refill(Pool* pool) {
  // Allocations waiting for reclaims come first: stock is built once they
  // are served (BackingReclaimed).
  if (stopping_ || retrying_waiters_ || !waiting_.empty()) return;
  if (ReserveRefiller* rf = RefillerOf(pool)) rf->Kick();
}

void LeaseManager::Shutdown() {
  // Also after a hand-over: nobody will make room for these any more.
  RefuseWaiting(Status(Code::kUnavailable, "daemon is shutting down"));
  if (stopping_ || restart_.handed_over) return;
  stopping_ = true;
  // Releases of this turn too, and every one from now: the loop may not
  // turn again.
  reclaims_.StartNow();
  std::vector<uint64_t> ids;
  for (const auto& [id, l] : table_.leases()) ids.push_back(id);
  for (uint64_t id : ids) Free(id, "shutdown_frees");
  StopReserves();
}

}  // namespace cxlpool
