#include "fake_server.h"

#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "cxlpool/proto/codec.h"
#include "cxlpool/proto/extents.h"
#include "cxlpool/proto/ipc.h"

namespace cxlpool::testing {

FakeServer::~FakeServer() {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (listen_.valid()) ::shutdown(listen_.get(), SHUT_RDWR);
    if (sock_.valid()) ::shutdown(sock_.get(), SHUT_RDWR);
  }
  Join();
}

void FakeServer::Join() {
  if (thread_.joinable()) thread_.join();
}

void FakeServer::HangUp() {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (sock_.valid()) ::shutdown(sock_.get(), SHUT_RDWR);
  }
  Join();
  std::lock_guard<std::mutex> l(mu_);
  listen_.Reset();
  sock_.Reset();
}

UniqueFd FakeServer::StartPair() {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return UniqueFd();
  sock_.Reset(sv[0]);
  thread_ = std::thread([this] { Serve(); });
  return UniqueFd(sv[1]);
}

Status FakeServer::StartListening(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) return Status(Code::kInvalidArgument, "long path");
  std::memcpy(addr.sun_path, path.data(), path.size());
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return Status::FromErrno(errno, "socket");
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return Status::FromErrno(errno, "bind " + path);
  }
  if (::listen(fd.get(), 4) != 0) return Status::FromErrno(errno, "listen");
  listen_ = std::move(fd);
  thread_ = std::thread([this] {
    int c = ::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) return;
    {
      std::lock_guard<std::mutex> l(mu_);
      sock_.Reset(c);
    }
    Serve();
  });
  return Status::Ok();
}

void FakeServer::SetHelloVersion(uint32_t v) {
  std::lock_guard<std::mutex> l(mu_);
  hello_version_ = v;
}
void FakeServer::SetMisbehave(Misbehave m) {
  std::lock_guard<std::mutex> l(mu_);
  misbehave_ = m;
}
void FakeServer::FailNextAlloc(Code code, const std::string& message) {
  std::lock_guard<std::mutex> l(mu_);
  fail_code_ = code;
  fail_message_ = message;
}
void FakeServer::PushBeforeNextReply(uint64_t lease_id, const std::string& event) {
  std::lock_guard<std::mutex> l(mu_);
  pending_events_.emplace_back(lease_id, event);
}
void FakeServer::PushNow(uint64_t lease_id, const std::string& event) {
  std::lock_guard<std::mutex> l(mu_);
  proto::LeaseEvent ev;
  ev.set_lease_id(lease_id);
  ev.set_event(event);
  Status s = wire::SendMessage(sock_.get(), ev, 0);
  (void)s;
}
std::vector<proto::AllocRequest> FakeServer::allocs() {
  std::lock_guard<std::mutex> l(mu_);
  return allocs_;
}
std::vector<uint64_t> FakeServer::releases() {
  std::lock_guard<std::mutex> l(mu_);
  return releases_;
}
bool FakeServer::WaitForRelease(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> l(mu_);
  return handled_.wait_for(l, timeout, [&] { return !releases_.empty(); });
}
std::vector<uint64_t> FakeServer::reclaims() {
  std::lock_guard<std::mutex> l(mu_);
  return reclaims_;
}
int FakeServer::live_leases() {
  std::lock_guard<std::mutex> l(mu_);
  return static_cast<int>(leases_.size());
}
std::string FakeServer::hello_client_name() {
  std::lock_guard<std::mutex> l(mu_);
  return hello_client_name_;
}

void FakeServer::Serve() {
  for (;;) {
    Result<wire::Frame> f = wire::RecvFrame(sock_.get());
    if (!f.ok()) break;
    std::lock_guard<std::mutex> l(mu_);
    incoming_fds_ = std::move(f->fds);
    Handle(f->type(), f->request_id(), f->payload);
    handled_.notify_all();
    if (!sock_.valid()) break;
  }
  std::lock_guard<std::mutex> l(mu_);
  // Like the daemon: a closed connection releases what it held.
  leases_.clear();
  holders_.clear();
  names_.clear();
}

void FakeServer::Send(proto::MsgType type, uint64_t request_id, const std::string& payload,
                      std::vector<int> fds) {
  for (const auto& [id, event] : pending_events_) {
    proto::LeaseEvent ev;
    ev.set_lease_id(id);
    ev.set_event(event);
    Status s = wire::SendMessage(sock_.get(), ev, 0);
    (void)s;
  }
  pending_events_.clear();
  if (misbehave_ == Misbehave::kWrongRequestId) request_id += 1000;
  Status s = wire::SendFrame(sock_.get(), type, request_id, payload, fds);
  (void)s;
}

void FakeServer::SendError(uint64_t request_id, Code code, const std::string& message) {
  Send(proto::MSG_ERROR_REPLY, request_id, wire::EncodeErrorPayload(Status(code, message)));
}

void FakeServer::SetExtents(uint64_t granule, size_t fds_per_frame) {
  std::lock_guard<std::mutex> l(mu_);
  extent_granule_ = granule;
  extent_fds_per_frame_ = fds_per_frame;
}

std::vector<int> FakeServer::extent_fds(uint64_t lease_id) {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<int> out;
  for (const UniqueFd& fd : extents_[lease_id]) out.push_back(fd.get());
  return out;
}

proto::LeaseInfo FakeServer::NewLease(uint64_t size, const std::string& name, int* fd_out) {
  const uint64_t rounded = (size + 4095) / 4096 * 4096;
  UniqueFd fd(::memfd_create("fake-lease", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  uint64_t fd_size = rounded;
  if (misbehave_ == Misbehave::kWrongFdSize) fd_size -= 4096;
  if (fd.valid() && ::ftruncate(fd.get(), static_cast<off_t>(fd_size)) != 0) fd.Reset();
  proto::LeaseInfo info;
  info.set_id(next_id_++);
  info.set_size_bytes(rounded);
  info.set_requested_bytes(size);
  info.set_page_size(4096);
  info.set_kind("dram");
  info.set_backing("memfd");
  info.set_pool("node0");
  info.set_name(name);
  info.set_holders(1);
  *fd_out = fd.get();
  holders_[info.id()] = 1;
  leases_[info.id()] = std::move(fd);
  return info;
}

void FakeServer::SendExtentLease(uint64_t request_id, proto::LeaseInfo info) {
  // The single memfd NewLease made is replaced by one per extent.
  info.clear_extents();
  std::vector<UniqueFd> fds;
  std::vector<int> raw;
  for (uint64_t off = 0; off < info.size_bytes(); off += extent_granule_) {
    uint64_t n = std::min(extent_granule_, info.size_bytes() - off);
    UniqueFd fd(::memfd_create("fake-extent", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (!fd.valid() || ::ftruncate(fd.get(), static_cast<off_t>(n)) != 0) {
      return SendError(request_id, Code::kIo, "fake server: memfd");
    }
    proto::ExtentInfo* e = info.add_extents();
    e->set_size_bytes(n);
    e->set_page_size(4096);
    raw.push_back(fd.get());
    fds.push_back(std::move(fd));
  }
  auto frames =
      wire::PlanLeaseReply(proto::MSG_ALLOC_REPLY, info, raw.size(), extent_fds_per_frame_);
  if (!frames.ok()) return SendError(request_id, Code::kInternal, frames.status().message());
  for (size_t i = 0; i < frames->size(); ++i) {
    const wire::PlannedFrame& f = (*frames)[i];
    size_t count = f.fd_count;
    if (misbehave_ == Misbehave::kExtentFdShort && i + 1 == frames->size()) --count;
    std::span<const int> part(raw.data() + f.first_fd, count);
    Status s = wire::SendFrame(sock_.get(), f.type, request_id, f.payload, part, 5000,
                               static_cast<uint16_t>(hello_version_));
    (void)s;
  }
  extents_[info.id()] = std::move(fds);
}

void FakeServer::Handle(proto::MsgType type, uint64_t request_id, const std::string& payload) {
  switch (type) {
    case proto::MSG_HELLO_REQUEST: {
      proto::HelloRequest req;
      if (!wire::Decode(payload, &req).ok()) return SendError(request_id, Code::kProtocol, "hello");
      hello_client_name_ = req.client_name();
      proto::HelloReply reply;
      reply.set_version(hello_version_);
      reply.set_server_version("fake-cxlpoold 0");
      reply.set_instance_id("fake");
      reply.set_max_frame_bytes(1 << 20);
      Send(proto::MSG_HELLO_REPLY, request_id, *wire::Encode(reply));
      return;
    }
    case proto::MSG_ALLOC_REQUEST: {
      proto::AllocRequest req;
      if (!wire::Decode(payload, &req).ok()) return SendError(request_id, Code::kProtocol, "alloc");
      allocs_.push_back(req);
      if (misbehave_ == Misbehave::kCloseOnAlloc) {
        sock_.Reset();
        return;
      }
      if (fail_code_ != Code::kOk) {
        Code c = fail_code_;
        fail_code_ = Code::kOk;
        return SendError(request_id, c, fail_message_);
      }
      if (!req.name().empty() && names_.count(req.name()) != 0) {
        return SendError(request_id, Code::kAlreadyExists, "name " + req.name() + " is taken");
      }
      int fd = -1;
      proto::LeaseInfo info = NewLease(req.size_bytes(), req.name(), &fd);
      info.set_numa_node(req.has_numa_node() ? req.numa_node() : 0);
      info.set_memory_tier(req.has_numa_node() ? 2 : 1);
      info.set_label(req.label());
      info.set_owner_uid(::getuid());  // the fake's one tenant: whoever runs the test
      info.set_owner_gid(::getgid());
      info.set_placement_reason(req.gpu().empty() ? "fake: default node"
                                                  : "fake: nearest to GPU " + req.gpu());
      if (!req.name().empty()) names_[req.name()] = info.id();
      if (extent_granule_ != 0) return SendExtentLease(request_id, std::move(info));
      proto::AllocReply reply;
      *reply.mutable_lease() = info;
      std::vector<int> fds;
      if (misbehave_ != Misbehave::kNoFd) fds.push_back(fd);
      Send(proto::MSG_ALLOC_REPLY, request_id, *wire::Encode(reply), fds);
      return;
    }
    case proto::MSG_ATTACH_REQUEST: {
      proto::AttachRequest req;
      if (!wire::Decode(payload, &req).ok())
        return SendError(request_id, Code::kProtocol, "attach");
      auto it = names_.find(req.name());
      if (it == names_.end() || (req.has_owner_uid() && req.owner_uid() != ::getuid()))
        return SendError(request_id, Code::kNotFound, "no lease " + req.name());
      proto::AttachReply reply;
      proto::LeaseInfo* info = reply.mutable_lease();
      info->set_id(it->second);
      struct stat st {};
      ::fstat(leases_[it->second].get(), &st);
      info->set_size_bytes(st.st_size);
      info->set_name(req.name());
      info->set_holders(++holders_[it->second]);
      info->set_backing("memfd");
      info->set_owner_uid(::getuid());
      info->set_owner_gid(::getgid());
      Send(proto::MSG_ATTACH_REPLY, request_id, *wire::Encode(reply), {leases_[it->second].get()});
      return;
    }
    case proto::MSG_RELEASE_REQUEST: {
      proto::ReleaseRequest req;
      if (!wire::Decode(payload, &req).ok()) return SendError(request_id, Code::kProtocol, "rel");
      releases_.push_back(req.lease_id());
      if (leases_.count(req.lease_id()) == 0) {
        return SendError(request_id, Code::kNotFound, "no lease " + std::to_string(req.lease_id()));
      }
      if (--holders_[req.lease_id()] > 0) {
        Send(proto::MSG_RELEASE_REPLY, request_id, *wire::Encode(proto::ReleaseReply()));
        return;
      }
      leases_.erase(req.lease_id());
      extents_.erase(req.lease_id());
      holders_.erase(req.lease_id());
      for (auto it = names_.begin(); it != names_.end(); ++it) {
        if (it->second == req.lease_id()) {
          names_.erase(it);
          break;
        }
      }
      Send(proto::MSG_RELEASE_REPLY, request_id, *wire::Encode(proto::ReleaseReply()));
      return;
    }
    case proto::MSG_RECLAIM_REQUEST: {
      proto::ReclaimRequest req;
      if (!wire::Decode(payload, &req).ok() ||
          static_cast<size_t>(req.leases_size()) != incoming_fds_.size()) {
        return SendError(request_id, Code::kProtocol, "reclaim: one fd per lease");
      }
      proto::ReclaimReply reply;
      for (int i = 0; i < req.leases_size(); ++i) {
        const uint64_t id = req.leases(i).id();
        reclaims_.push_back(id);
        leases_[id] = std::move(incoming_fds_[static_cast<size_t>(i)]);
        holders_[id] = 1;
        reply.add_accepted(id);
      }
      Send(proto::MSG_RECLAIM_REPLY, request_id, *wire::Encode(reply));
      return;
    }
    default:
      return SendError(request_id, Code::kUnsupported, "fake server: " + wire::MsgTypeName(type));
  }
}

}  // namespace cxlpool::testing
