// etcd::Client: the part of etcd's v3 API cxlpool uses (KV, transactions,
// leases, watches), over gRPC with the protos etcd publishes.
//
// One gRPC channel per endpoint. A call goes to the current endpoint and,
// when that one is unreachable or times out, to the next, each attempt with
// its own deadline (ClientOptions::deadline): a call never blocks longer than
// deadline x endpoints. Calls carry etcd's "hasleader" requirement, so a
// member cut off from its quorum refuses instead of answering stale data.
//
// A call that timed out may still have been applied (a put, a transaction):
// callers that change state compare revisions and reread on a failed
// comparison, which makes a retried write safe.
//
// Errors: UNAVAILABLE (no endpoint answered in time, no leader),
// PERMISSION_DENIED (TLS or auth refused), NOT_FOUND (a lease that is gone),
// INVALID_ARGUMENT (bad options), IO for anything else; the message names the
// endpoint and etcd's own text.
//
// Thread safety: every method may be called from any thread at once.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cxlpool/common/status.h"

namespace cxlpool::etcd {

struct TlsFiles {
  std::string ca_file;    // PEM; empty: plaintext (loopback tests and labs only)
  std::string cert_file;  // the client certificate (etcd's --client-cert-auth)
  std::string key_file;
  bool enabled() const { return !ca_file.empty(); }
};

struct ClientOptions {
  std::vector<std::string> endpoints;  // "host:port", no scheme
  TlsFiles tls;
  std::chrono::milliseconds deadline{2000};  // per attempt of a unary call
};

struct KeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t version = 0;
  int64_t lease = 0;
};

struct RangeResult {
  std::vector<KeyValue> kvs;
  int64_t revision = 0;  // the store's revision when it was read
};

// One comparison of a transaction's guard.
struct Compare {
  enum class Target { kVersion, kCreateRevision, kModRevision, kValue };
  enum class Result { kEqual, kGreater, kLess, kNotEqual };
  std::string key;
  Target target = Target::kVersion;
  Result result = Result::kEqual;
  int64_t number = 0;  // for the revision/version targets
  std::string value;   // for kValue

  static Compare Absent(std::string key);                    // version == 0
  static Compare Present(std::string key);                   // version > 0
  static Compare ModRevision(std::string key, int64_t rev);  // mod_revision == rev
  static Compare CreateRevision(std::string key, int64_t rev);
};

struct TxnOp {
  enum class Kind { kPut, kDelete, kGet };
  Kind kind = Kind::kGet;
  std::string key;
  std::string value;
  int64_t lease = 0;    // kPut: attach to this lease (0: none)
  bool prefix = false;  // kGet/kDelete: every key under `key`

  static TxnOp Put(std::string key, std::string value, int64_t lease = 0);
  static TxnOp Delete(std::string key);
  static TxnOp Get(std::string key, bool prefix = false);
};

struct TxnResult {
  bool succeeded = false;         // the guard held: `then` ran, else `otherwise`
  int64_t revision = 0;           // the store's revision after it
  std::vector<RangeResult> gets;  // one per kGet op of the branch that ran
};

struct Lease {
  int64_t id = 0;
  int64_t ttl_s = 0;
};

struct MemberStatus {
  uint64_t member_id = 0;
  uint64_t leader_id = 0;
  int64_t raft_term = 0;
  std::string version;
};

struct WatchEvent {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  KeyValue kv;  // kDelete: key and mod_revision only
};

class Watch;

class Client {
 public:
  static Result<std::unique_ptr<Client>> Connect(const ClientOptions& options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  Result<RangeResult> Get(const std::string& key);
  Result<RangeResult> GetPrefix(const std::string& prefix);
  // The store's revision after the write.
  Result<int64_t> Put(const std::string& key, const std::string& value, int64_t lease = 0);
  Result<int64_t> Delete(const std::string& key);
  // No attempt runs past `until` (then UNAVAILABLE; it may have applied).
  Result<TxnResult> Txn(
      const std::vector<Compare>& guard, const std::vector<TxnOp>& then,
      const std::vector<TxnOp>& otherwise = {},
      std::chrono::steady_clock::time_point until = std::chrono::steady_clock::time_point::max());

  Result<Lease> GrantLease(int64_t ttl_s);
  Status RevokeLease(int64_t id);
  // Renews `id` once; its TTL in seconds. NOT_FOUND once it has expired.
  // Gives up (UNAVAILABLE) at `until`, whatever the endpoints do.
  Result<int64_t> KeepAliveOnce(int64_t id, std::chrono::steady_clock::time_point until =
                                                std::chrono::steady_clock::time_point::max());
  // The status of the member at endpoints()[i] (no failover).
  Result<MemberStatus> EndpointStatus(size_t i);

  // Watches every key under `prefix` from `start_revision` (0: now). See
  // Watch. The Watch must not outlive this Client.
  using EventHandler = std::function<void(const std::vector<WatchEvent>& events, int64_t revision)>;
  // Rereads whatever the caller keeps and returns the revision it read at.
  using ResyncHandler = std::function<int64_t()>;
  std::unique_ptr<Watch> WatchPrefix(const std::string& prefix, int64_t start_revision,
                                     EventHandler on_events, ResyncHandler on_resync);

  const ClientOptions& options() const;

  struct Impl;

 private:
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// A watch on a key prefix, served by its own thread. Events arrive in
// revision order, each batch once. When the stream breaks it reconnects
// (next endpoint) from the revision after the last one delivered, so nothing
// is lost or repeated; when etcd has compacted past that revision it calls
// on_resync (the caller rereads) and carries on after the revision it read. Handlers run on the
// watch thread and must not destroy the Watch.
class Watch {
 public:
  virtual ~Watch() = default;
  // Stops the stream and joins the thread; idempotent. Called by the
  // destructor.
  virtual void Stop() = 0;
  // The last revision delivered (0 before the first).
  virtual int64_t revision() const = 0;
};

}  // namespace cxlpool::etcd
