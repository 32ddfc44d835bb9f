// What etcd_client.cc and watch.cc share: the channels, the failover call
// and the conversions between cxlpool's structs and etcd's messages.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cxlpool/cluster/etcd_client.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"

namespace cxlpool::etcd {

// One endpoint: its channel and the stubs of the services cxlpool uses.
struct Endpoint {
  std::string address;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<etcdserverpb::KV::Stub> kv;
  std::unique_ptr<etcdserverpb::Lease::Stub> lease;
  std::unique_ptr<etcdserverpb::Watch::Stub> watch;
  std::unique_ptr<etcdserverpb::Maintenance::Stub> maintenance;
};

struct Client::Impl {
  ClientOptions options;
  std::vector<Endpoint> endpoints;
  std::atomic<size_t> current{0};  // the endpoint calls go to first

  using Deadline = std::chrono::system_clock::time_point;
  // Runs `attempt(endpoint, context)` on the current endpoint and, while it
  // fails with UNAVAILABLE or DEADLINE_EXCEEDED, on the next ones (each
  // once); the first other answer or the last failure. No attempt runs past
  // `until` (none: only the per-attempt deadline).
  template <typename Attempt>
  Status Call(const char* what, Attempt&& attempt, std::optional<Deadline> until = std::nullopt);
  // A context with the per-attempt deadline (never past `until`) and the
  // leader requirement.
  void Prepare(grpc::ClientContext& context, bool with_deadline,
               std::optional<Deadline> until = std::nullopt) const;
  // Lets the endpoint's channel connect, for at most a second (never past
  // `until`): whether it is connected. Calls are fail-fast, and one on a
  // channel in TRANSIENT_FAILURE returns at once without polling; gRPC's
  // reconnects make progress only while someone polls (else every 5 s, its
  // backup poller), so after a partition heals nothing would reconnect.
  bool WaitConnected(Endpoint& ep, std::optional<Deadline> until = std::nullopt) const;
};

// gRPC status -> cxlpool Status, naming the endpoint and the call.
Status FromGrpc(const grpc::Status& s, const std::string& endpoint, const char* what);
bool Retryable(const grpc::Status& s);

// The first key after every key that starts with `prefix` (etcd's range_end).
std::string PrefixEnd(const std::string& prefix);
KeyValue FromProto(const mvccpb::KeyValue& kv);
void ToProto(const Compare& c, etcdserverpb::Compare* out);
void ToProto(const TxnOp& op, etcdserverpb::RequestOp* out);

template <typename Attempt>
Status Client::Impl::Call(const char* what, Attempt&& attempt, std::optional<Deadline> until) {
  Status last(Code::kUnavailable, std::string("etcd ") + what + ": no endpoint");
  const size_t n = endpoints.size();
  const size_t first = current.load(std::memory_order_relaxed);
  for (size_t i = 0; i < n; ++i) {
    if (until && std::chrono::system_clock::now() >= *until) {
      last = Status(Code::kUnavailable, std::string("etcd ") + what + ": out of time");
      break;
    }
    const size_t at = (first + i) % n;
    Endpoint& ep = endpoints[at];
    WaitConnected(ep, until);
    grpc::ClientContext context;
    Prepare(context, true, until);
    grpc::Status s = attempt(ep, context);
    if (s.ok()) {
      current.store(at, std::memory_order_relaxed);
      return Status::Ok();
    }
    last = FromGrpc(s, ep.address, what);
    if (!Retryable(s)) return last;
  }
  current.store((first + 1) % n, std::memory_order_relaxed);
  return last;
}

}  // namespace cxlpool::etcd
