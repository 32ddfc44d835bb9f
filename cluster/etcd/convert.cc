// Conversions between cxlpool's etcd structs and etcd's protobuf messages.
#include <string>

#include "impl.h"

namespace cxlpool::etcd {

Status FromGrpc(const grpc::Status& s, const std::string& endpoint, const char* what) {
  if (s.ok()) return Status::Ok();
  std::string msg = "etcd " + endpoint + " " + what + ": " + s.error_message();
  switch (s.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::CANCELLED:
      return Status(Code::kUnavailable, msg);
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::PERMISSION_DENIED:
      return Status(Code::kPermissionDenied, msg);
    case grpc::StatusCode::NOT_FOUND:
      return Status(Code::kNotFound, msg);
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::OUT_OF_RANGE:
      return Status(Code::kInvalidArgument, msg);
    default:
      return Status(Code::kIo, msg);
  }
}

bool Retryable(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAVAILABLE ||
         s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
}

std::string PrefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    auto& last = reinterpret_cast<unsigned char&>(end.back());
    if (last < 0xff) {
      ++last;
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

KeyValue FromProto(const mvccpb::KeyValue& kv) {
  KeyValue out;
  out.key = kv.key();
  out.value = kv.value();
  out.create_revision = kv.create_revision();
  out.mod_revision = kv.mod_revision();
  out.version = kv.version();
  out.lease = kv.lease();
  return out;
}

void ToProto(const Compare& c, etcdserverpb::Compare* out) {
  out->set_key(c.key);
  switch (c.result) {
    case Compare::Result::kEqual:
      out->set_result(etcdserverpb::Compare::EQUAL);
      break;
    case Compare::Result::kGreater:
      out->set_result(etcdserverpb::Compare::GREATER);
      break;
    case Compare::Result::kLess:
      out->set_result(etcdserverpb::Compare::LESS);
      break;
    case Compare::Result::kNotEqual:
      out->set_result(etcdserverpb::Compare::NOT_EQUAL);
      break;
  }
  switch (c.target) {
    case Compare::Target::kVersion:
      out->set_target(etcdserverpb::Compare::VERSION);
      out->set_version(c.number);
      break;
    case Compare::Target::kCreateRevision:
      out->set_target(etcdserverpb::Compare::CREATE);
      out->set_create_revision(c.number);
      break;
    case Compare::Target::kModRevision:
      out->set_target(etcdserverpb::Compare::MOD);
      out->set_mod_revision(c.number);
      break;
    case Compare::Target::kValue:
      out->set_target(etcdserverpb::Compare::VALUE);
      out->set_value(c.value);
      break;
  }
}

void ToProto(const TxnOp& op, etcdserverpb::RequestOp* out) {
  switch (op.kind) {
    case TxnOp::Kind::kPut: {
      auto* put = out->mutable_request_put();
      put->set_key(op.key);
      put->set_value(op.value);
      put->set_lease(op.lease);
      break;
    }
    case TxnOp::Kind::kDelete: {
      auto* del = out->mutable_request_delete_range();
      del->set_key(op.key);
      if (op.prefix) del->set_range_end(PrefixEnd(op.key));
      break;
    }
    case TxnOp::Kind::kGet: {
      auto* get = out->mutable_request_range();
      get->set_key(op.key);
      if (op.prefix) get->set_range_end(PrefixEnd(op.key));
      break;
    }
  }
}

Compare Compare::Absent(std::string key) {
  return {std::move(key), Target::kVersion, Result::kEqual, 0, {}};
}
Compare Compare::Present(std::string key) {
  return {std::move(key), Target::kVersion, Result::kGreater, 0, {}};
}
Compare Compare::ModRevision(std::string key, int64_t rev) {
  return {std::move(key), Target::kModRevision, Result::kEqual, rev, {}};
}
Compare Compare::CreateRevision(std::string key, int64_t rev) {
  return {std::move(key), Target::kCreateRevision, Result::kEqual, rev, {}};
}

TxnOp TxnOp::Put(std::string key, std::string value, int64_t lease) {
  return {Kind::kPut, std::move(key), std::move(value), lease, false};
}
TxnOp TxnOp::Delete(std::string key) { return {Kind::kDelete, std::move(key), {}, 0, false}; }
TxnOp TxnOp::Get(std::string key, bool prefix) {
  return {Kind::kGet, std::move(key), {}, 0, prefix};
}

}  // namespace cxlpool::etcd
