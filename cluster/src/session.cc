#include "cxlpool/cluster/session.h"

#include <algorithm>

#include "cxlpool/common/log.h"

namespace cxlpool::cluster {

using etcd::Compare;
using etcd::TxnOp;
using std::chrono::milliseconds;
using std::chrono::seconds;
using std::chrono::steady_clock;

Session::Session(etcd::Client* etcd, Keys keys, SessionOptions options, Callbacks callbacks)
    : etcd_(etcd),
      keys_(std::move(keys)),
      options_(std::move(options)),
      callbacks_(std::move(callbacks)) {}

Session::~Session() { StopThread(); }

Status Session::Start(HostRecord first) {
  CXLPOOL_RETURN_IF_ERROR(CheckName("cluster host", options_.host));
  if (options_.ttl_s < 2 || options_.ttl_s > 3600)
    return Status(Code::kInvalidArgument, "cluster session TTL must be 2..3600 s");
  first.host = options_.host;
  {
    MutexLock lock(mu_);
    current_ = std::move(first);
  }
  thread_ = std::thread([this] { Loop(); });
  return Status::Ok();
}

void Session::Publish(HostRecord record) {
  record.host = options_.host;
  MutexLock lock(mu_);
  current_ = record;
  pending_ = std::move(record);
  wake_.notify_all();
}

bool Session::certainly_live() const {
  return epoch_.load() != 0 &&
         steady_clock::now().time_since_epoch().count() < confirmed_until_ns_.load();
}

std::string Session::last_loss() const {
  MutexLock lock(mu_);
  return last_loss_;
}

void Session::StopThread() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
    wake_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

void Session::Leave() {
  StopThread();
  if (lease_ == 0) return;
  Status s = etcd_->RevokeLease(lease_);
  if (!s.ok()) {
    CXLPOOL_LOG(kWarning) << "cluster: could not revoke the session of " << options_.host
                          << " (its record expires in " << options_.ttl_s
                          << " s): " << s.ToString();
  } else {
    CXLPOOL_LOG(kInfo) << "cluster: " << options_.host << " left (epoch " << epoch_.load() << ")";
  }
  lease_ = 0;
  epoch_.store(0);
}

void Session::Abandon() {
  StopThread();
  lease_ = 0;
  epoch_.store(0);
}

void Session::Loop() {
  while (true) {
    HostRecord record;
    {
      MutexLock lock(mu_);
      if (stopping_) return;
      record = current_;
    }
    const auto now = steady_clock::now();
    if (epoch_.load() == 0) {
      const int64_t epoch = TryJoin(record);
      if (epoch != 0 && callbacks_.joined) callbacks_.joined(epoch);
    } else {
      if (now >= next_renew_) Renew(now);
      if (epoch_.load() != 0) PublishPending(now);
    }
    MutexLock lock(mu_);
    if (stopping_) return;
    SteadyTime until = epoch_.load() == 0 ? now + options_.rejoin_interval : next_renew_;
    if (epoch_.load() != 0 && pending_) until = std::min(until, next_publish_);
    if (until > steady_clock::now()) lock.WaitUntil(wake_, until);
  }
}

int64_t Session::TryJoin(const HostRecord& record) {
  const std::string key = keys_.Host(options_.host);
  const auto sent = steady_clock::now();
  auto lease = etcd_->GrantLease(options_.ttl_s);
  if (!lease.ok()) {
    CXLPOOL_LOG(kDebug) << "cluster: join: " << lease.status().ToString();
    return 0;
  }
  auto txn = etcd_->Txn({Compare::Absent(key)}, {TxnOp::Put(key, ToJson(record), lease->id)},
                        {TxnOp::Get(key)});
  if (!txn.ok() || !txn->succeeded) {
    etcd_->RevokeLease(lease->id).ok();  // best effort: it expires anyway
    if (!txn.ok()) return 0;
    const auto& held = txn->gets.empty() ? std::vector<etcd::KeyValue>{} : txn->gets[0].kvs;
    if (held.empty()) return 0;  // gone since: the next try joins
    auto other = ParseHostRecord(held[0].value);
    if (other.ok() && !record.instance.empty() && other->instance == record.instance &&
        !record.boot_id.empty() && other->boot_id == record.boot_id) {
      // This daemon's own record from before a crash: that process is gone.
      CXLPOOL_LOG(kInfo) << "cluster: " << options_.host << ": revoking the session left by "
                         << "this daemon before it restarted (epoch " << held[0].create_revision
                         << ")";
      etcd_->RevokeLease(held[0].lease).ok();
    } else {
      CXLPOOL_LOG(kWarning) << "cluster: host name " << options_.host
                            << " is held by another live daemon (epoch " << held[0].create_revision
                            << "); waiting for it to expire";
    }
    return 0;
  }
  lease_ = lease->id;
  confirmed_until_ = sent + seconds(lease->ttl_s);
  confirmed_until_ns_.store(confirmed_until_.time_since_epoch().count());
  next_renew_ = sent + milliseconds(lease->ttl_s * 1000 / 3);
  next_publish_ = steady_clock::now() + options_.publish_interval;
  {
    MutexLock lock(mu_);  // published with the join, unless a newer one came since
    if (pending_ && ToJson(*pending_) == ToJson(record)) pending_.reset();
  }
  const int64_t epoch = txn->revision;  // the put's revision is the key's create_revision
  epoch_.store(epoch);
  joins_.fetch_add(1);
  publishes_.fetch_add(1);
  CXLPOOL_LOG(kInfo) << "cluster: " << options_.host << " joined, epoch " << epoch << ", TTL "
                     << lease->ttl_s << " s";
  return epoch;
}

void Session::Renew(SteadyTime now) {
  // No attempt outlives what etcd has confirmed: the loss is declared on time.
  auto ttl = etcd_->KeepAliveOnce(lease_, confirmed_until_);
  if (ttl.ok()) {
    confirmed_until_ = now + seconds(*ttl);
    confirmed_until_ns_.store(confirmed_until_.time_since_epoch().count());
    next_renew_ = now + milliseconds(*ttl * 1000 / 3);
    return;
  }
  if (ttl.status().code() == Code::kNotFound) return Lose("the session's lease expired");
  if (steady_clock::now() >= confirmed_until_)
    return Lose("no renewal confirmed for a whole TTL (" + ttl.status().message() + ")");
  next_renew_ = steady_clock::now() + milliseconds(200);
}

void Session::PublishPending(SteadyTime now) {
  std::optional<HostRecord> record;
  {
    MutexLock lock(mu_);
    if (!pending_ || now < next_publish_) return;
    record = pending_;
  }
  const std::string key = keys_.Host(options_.host);
  // Never past what etcd has confirmed: a blocked publish must not delay
  // declaring the loss.
  auto txn = etcd_->Txn({Compare::CreateRevision(key, epoch_.load())},
                        {TxnOp::Put(key, ToJson(*record), lease_)}, {}, confirmed_until_);
  next_publish_ = now + options_.publish_interval;
  if (!txn.ok()) return;  // kept pending; renewal decides about the session
  if (!txn->succeeded) return Lose("the host record was removed or replaced");
  publishes_.fetch_add(1);
  MutexLock lock(mu_);
  if (pending_ && ToJson(*pending_) == ToJson(*record)) pending_.reset();
}

void Session::Lose(const std::string& why) {
  confirmed_until_ns_.store(0);
  const int64_t epoch = epoch_.exchange(0);
  lease_ = 0;
  losses_.fetch_add(1);
  {
    MutexLock lock(mu_);
    last_loss_ = why;
  }
  CXLPOOL_LOG(kError) << "cluster: " << options_.host << " lost its session (epoch " << epoch
                      << "): " << why << "; granting from shared slices stops";
  if (callbacks_.lost) callbacks_.lost(epoch, why);
}

}  // namespace cxlpool::cluster
