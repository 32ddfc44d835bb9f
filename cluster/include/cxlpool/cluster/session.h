// Session: this host's membership. It holds an etcd lease kept alive and the
// host record attached to it; the record's create_revision is the host's
// epoch, the fencing token every slice write checks.
//
// Everything that talks to etcd runs on the session's own thread: Publish
// only hands the newest record over, so the daemon's request path never
// waits on the network. The thread joins (and rejoins after a loss, with a
// new epoch), renews the lease every TTL/3 and publishes at most once per
// publish_interval.
//
// A loss is declared once the lease can no longer be known alive: etcd says
// it expired, the host key is gone or replaced, or no renewal has been
// confirmed for a whole TTL (measured from when the last confirmed renewal
// was sent, so never later than etcd's own expiry). `lost` runs first, then
// the thread tries to rejoin every rejoin_interval.
//
// A host name is held by one daemon at a time. A record left by this same
// daemon (its `instance`, from the state directory, on the same boot) that
// has not expired yet (a SIGKILL and restart: the state directory's lock
// says the old process is gone) is revoked at once; any other makes Join
// wait until it expires.
//
// Thread safety: Start, Leave and Abandon from one thread; Publish, live,
// epoch and the counters from any. Callbacks run on the session thread and
// must not call Leave or Abandon.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "cxlpool/cluster/etcd_client.h"
#include "cxlpool/cluster/records.h"
#include "cxlpool/common/thread_annotations.h"

namespace cxlpool::cluster {

struct SessionOptions {
  std::string host;
  int64_t ttl_s = 10;
  std::chrono::milliseconds publish_interval{1000};
  std::chrono::milliseconds rejoin_interval{1000};
};

class Session {
 public:
  struct Callbacks {
    std::function<void(int64_t epoch)> joined;
    std::function<void(int64_t epoch, const std::string& why)> lost;
  };

  Session(etcd::Client* etcd, Keys keys, SessionOptions options, Callbacks callbacks);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Starts the thread with the first record to publish; it joins at once.
  // INVALID_ARGUMENT for a bad host name or TTL.
  Status Start(HostRecord first);
  // The newest record; published within publish_interval when live.
  void Publish(HostRecord record);
  // Clean exit: revokes the lease (the record goes at once), stops the thread.
  void Leave();
  // As a crash would: stops renewing and leaves etcd alone (the record
  // expires after the TTL). For tests and the daemon's abort path.
  void Abandon();

  bool live() const { return epoch_.load() != 0; }
  // Live, and renewed recently enough that etcd cannot have expired the
  // lease yet: what a grant from a shared slice checks, even before a loss
  // is declared.
  bool certainly_live() const;
  int64_t epoch() const { return epoch_.load(); }  // 0 while not joined
  uint64_t joins() const { return joins_.load(); }
  uint64_t losses() const { return losses_.load(); }
  uint64_t publishes() const { return publishes_.load(); }
  std::string last_loss() const;

 private:
  using SteadyTime = std::chrono::steady_clock::time_point;
  void Loop();
  // One try; the epoch, or 0.
  int64_t TryJoin(const HostRecord& record);
  void Renew(SteadyTime now);
  void PublishPending(SteadyTime now);
  void Lose(const std::string& why);
  void StopThread();

  etcd::Client* etcd_;
  const Keys keys_;
  const SessionOptions options_;
  const Callbacks callbacks_;

  std::atomic<int64_t> epoch_{0};
  std::atomic<uint64_t> joins_{0}, losses_{0}, publishes_{0};

  // Session thread only.
  int64_t lease_ = 0;
  SteadyTime confirmed_until_{};
  std::atomic<int64_t> confirmed_until_ns_{0};  // the same, for certainly_live
  SteadyTime next_renew_{};
  SteadyTime next_publish_{};

  mutable Mutex mu_;
  std::condition_variable wake_;
  bool stopping_ GUARDED_BY(mu_) = false;
  std::optional<HostRecord> pending_ GUARDED_BY(mu_);  // newer than the one published
  HostRecord current_ GUARDED_BY(mu_);                 // the newest, for rejoins
  std::string last_loss_ GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace cxlpool::cluster
