// etcd::Client: unary calls with failover across endpoints.
#include <grpcpp/security/credentials.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <utility>

#include "cxlpool/cluster/names.h"
#include "impl.h"

namespace cxlpool::etcd {

namespace {

Result<std::string> ReadPem(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return Status(Code::kInvalidArgument,
                  std::string("etcd TLS ") + what + " " + path + ": cannot be read");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (ss.str().empty())
    return Status(Code::kInvalidArgument, std::string("etcd TLS ") + what + " " + path + ": empty");
  return ss.str();
}

Result<std::shared_ptr<grpc::ChannelCredentials>> Credentials(const TlsFiles& tls) {
  if (!tls.enabled()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  auto ca = ReadPem(tls.ca_file, "CA");
  if (!ca.ok()) return ca.status();
  ssl.pem_root_certs = *ca;
  if (tls.cert_file.empty() != tls.key_file.empty())
    return Status(Code::kInvalidArgument, "etcd TLS: a client certificate needs its key");
  if (!tls.cert_file.empty()) {
    auto cert = ReadPem(tls.cert_file, "certificate");
    if (!cert.ok()) return cert.status();
    auto key = ReadPem(tls.key_file, "key");
    if (!key.ok()) return key.status();
    ssl.pem_cert_chain = *cert;
    ssl.pem_private_key = *key;
  }
  return grpc::SslCredentials(ssl);
}

// A steady deadline as the system clock gRPC takes; none for max().
std::optional<Client::Impl::Deadline> SystemDeadline(std::chrono::steady_clock::time_point until) {
  if (until == std::chrono::steady_clock::time_point::max()) return std::nullopt;
  const auto left = until - std::chrono::steady_clock::now();
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(left);
}

grpc::ChannelArguments ChannelArgs() {
  grpc::ChannelArguments args;
  // A member that stops answering (SIGSTOP, a cut link) is noticed by pings;
  // etcd refuses pings more often than every 5 s (--grpc-keepalive-min-time).
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 3000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // A restarted member is reachable again within a second. The minimum is
  // also each connection attempt's timeout (TCP and the TLS handshake).
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  return args;
}

}  // namespace

void Client::Impl::Prepare(grpc::ClientContext& context, bool with_deadline,
                           std::optional<Deadline> until) const {
  if (with_deadline) {
    Deadline d = std::chrono::system_clock::now() + options.deadline;
    if (until && *until < d) d = *until;
    context.set_deadline(d);
  }
  // etcd's WithRequireLeader: a member without a leader answers UNAVAILABLE.
  context.AddMetadata("hasleader", "true");
}

bool Client::Impl::WaitConnected(Endpoint& ep, std::optional<Deadline> until) const {
  if (ep.channel->GetState(/*try_to_connect=*/true) == GRPC_CHANNEL_READY) return true;
  Deadline by = std::chrono::system_clock::now() +
                std::min<std::chrono::milliseconds>(options.deadline, std::chrono::seconds(1));
  if (until && *until < by) by = *until;
  return ep.channel->WaitForConnected(by);
}

Result<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  if (options.endpoints.empty()) return Status(Code::kInvalidArgument, "etcd: no endpoints");
  if (options.deadline.count() <= 0)
    return Status(Code::kInvalidArgument, "etcd: the call deadline must be positive");
  for (const auto& ep : options.endpoints) CXLPOOL_RETURN_IF_ERROR(cluster::CheckEndpoint(ep));
  auto creds = Credentials(options.tls);
  if (!creds.ok()) return creds.status();
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  for (const auto& address : options.endpoints) {
    Endpoint ep;
    ep.address = address;
    ep.channel = grpc::CreateCustomChannel(address, *creds, ChannelArgs());
    ep.kv = etcdserverpb::KV::NewStub(ep.channel);
    ep.lease = etcdserverpb::Lease::NewStub(ep.channel);
    ep.watch = etcdserverpb::Watch::NewStub(ep.channel);
    ep.maintenance = etcdserverpb::Maintenance::NewStub(ep.channel);
    impl->endpoints.push_back(std::move(ep));
  }
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

const ClientOptions& Client::options() const { return impl_->options; }

namespace {

RangeResult FromRange(const etcdserverpb::RangeResponse& resp) {
  RangeResult out;
  out.revision = resp.header().revision();
  out.kvs.reserve(resp.kvs_size());
  for (const auto& kv : resp.kvs()) out.kvs.push_back(FromProto(kv));
  return out;
}

}  // namespace

Result<RangeResult> Client::Get(const std::string& key) {
  etcdserverpb::RangeRequest req;
  req.set_key(key);
  etcdserverpb::RangeResponse resp;
  CXLPOOL_RETURN_IF_ERROR(impl_->Call("get", [&](Endpoint& ep, grpc::ClientContext& ctx) {
    return ep.kv->Range(&ctx, req, &resp);
  }));
  return FromRange(resp);
}

Result<RangeResult> Client::GetPrefix(const std::string& prefix) {
  etcdserverpb::RangeRequest req;
  req.set_key(prefix);
  req.set_range_end(PrefixEnd(prefix));
  etcdserverpb::RangeResponse resp;
  CXLPOOL_RETURN_IF_ERROR(impl_->Call("get prefix", [&](Endpoint& ep, grpc::ClientContext& ctx) {
    return ep.kv->Range(&ctx, req, &resp);
  }));
  return FromRange(resp);
}

Result<int64_t> Client::Put(const std::string& key, const std::string& value, int64_t lease) {
  etcdserverpb::PutRequest req;
  req.set_key(key);
  req.set_value(value);
  req.set_lease(lease);
  etcdserverpb::PutResponse resp;
  CXLPOOL_RETURN_IF_ERROR(impl_->Call(
      "put", [&](Endpoint& ep, grpc::ClientContext& ctx) { return ep.kv->Put(&ctx, req, &resp); }));
  return resp.header().revision();
}

Result<int64_t> Client::Delete(const std::string& key) {
  etcdserverpb::DeleteRangeRequest req;
  req.set_key(key);
  etcdserverpb::DeleteRangeResponse resp;
  CXLPOOL_RETURN_IF_ERROR(impl_->Call("delete", [&](Endpoint& ep, grpc::ClientContext& ctx) {
    return ep.kv->DeleteRange(&ctx, req, &resp);
  }));
  return resp.header().revision();
}

Result<TxnResult> Client::Txn(const std::vector<Compare>& guard, const std::vector<TxnOp>& then,
                              const std::vector<TxnOp>& otherwise,
                              std::chrono::steady_clock::time_point until) {
  etcdserverpb::TxnRequest req;
  for (const auto& c : guard) ToProto(c, req.add_compare());
  for (const auto& op : then) ToProto(op, req.add_success());
  for (const auto& op : otherwise) ToProto(op, req.add_failure());
  etcdserverpb::TxnResponse resp;
  CXLPOOL_RETURN_IF_ERROR(impl_->Call(
      "txn", [&](Endpoint& ep, grpc::ClientContext& ctx) { return ep.kv->Txn(&ctx, req, &resp); },
      SystemDeadline(until)));
  TxnResult out;
  out.succeeded = resp.succeeded();
  out.revision = resp.header().revision();
  for (const auto& r : resp.responses())
    if (r.has_response_range()) out.gets.push_back(FromRange(r.response_range()));
  return out;
}

Result<Lease> Client::GrantLease(int64_t ttl_s) {
  if (ttl_s <= 0) return Status(Code::kInvalidArgument, "etcd lease: TTL must be positive");
  etcdserverpb::LeaseGrantRequest req;
  req.set_ttl(ttl_s);
  etcdserverpb::LeaseGrantResponse resp;
  CXLPOOL_RETURN_IF_ERROR(impl_->Call("lease grant", [&](Endpoint& ep, grpc::ClientContext& ctx) {
    return ep.lease->LeaseGrant(&ctx, req, &resp);
  }));
  if (!resp.error().empty()) return Status(Code::kIo, "etcd lease grant: " + resp.error());
  return Lease{resp.id(), resp.ttl()};
}

Status Client::RevokeLease(int64_t id) {
  etcdserverpb::LeaseRevokeRequest req;
  req.set_id(id);
  etcdserverpb::LeaseRevokeResponse resp;
  return impl_->Call("lease revoke", [&](Endpoint& ep, grpc::ClientContext& ctx) {
    return ep.lease->LeaseRevoke(&ctx, req, &resp);
  });
}

Result<int64_t> Client::KeepAliveOnce(int64_t id, std::chrono::steady_clock::time_point until) {
  etcdserverpb::LeaseKeepAliveRequest req;
  req.set_id(id);
  etcdserverpb::LeaseKeepAliveResponse resp;
  CXLPOOL_RETURN_IF_ERROR(impl_->Call(
      "keepalive",
      [&](Endpoint& ep, grpc::ClientContext& ctx) {
        auto stream = ep.lease->LeaseKeepAlive(&ctx);
        if (!stream->Write(req)) return stream->Finish();
        stream->WritesDone();
        if (!stream->Read(&resp)) return stream->Finish();
        // The answer is in; end the stream without waiting on the server.
        ctx.TryCancel();
        stream->Finish().ok();
        return grpc::Status::OK;
      },
      SystemDeadline(until)));
  if (resp.ttl() <= 0)
    return Status(Code::kNotFound, "etcd lease " + std::to_string(id) + " has expired");
  return resp.ttl();
}

Result<MemberStatus> Client::EndpointStatus(size_t i) {
  if (i >= impl_->endpoints.size())
    return Status(Code::kInvalidArgument, "etcd: no endpoint " + std::to_string(i));
  Endpoint& ep = impl_->endpoints[i];
  impl_->WaitConnected(ep);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + impl_->options.deadline);
  etcdserverpb::StatusResponse resp;
  grpc::Status s = ep.maintenance->Status(&ctx, etcdserverpb::StatusRequest(), &resp);
  if (!s.ok()) return FromGrpc(s, ep.address, "status");
  MemberStatus out;
  out.member_id = resp.header().member_id();
  out.leader_id = resp.leader();
  out.raft_term = static_cast<int64_t>(resp.raftterm());
  out.version = resp.version();
  return out;
}

}  // namespace cxlpool::etcd
