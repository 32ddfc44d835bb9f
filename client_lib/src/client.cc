// The C++ API (cxlpool::Client, cxlpool::Lease) over ClientCore/LeaseState.
#include "cxlpool/client.hpp"

#include <utility>

#include "client_core.h"

namespace cxlpool {
namespace {

const LeaseInfo& EmptyInfo() {
  static const LeaseInfo kEmpty;
  return kEmpty;
}

ClientStatus NotConnected() {
  return ClientStatus(ErrorCode::kUnavailable, "the client is not connected");
}

}  // namespace

// ---------------------------------------------------------------- Lease

Lease::Lease() = default;
Lease::Lease(std::unique_ptr<detail::LeaseState> state) : state_(std::move(state)) {}
Lease::~Lease() = default;  // ~LeaseState releases
Lease::Lease(Lease&& other) noexcept = default;
Lease& Lease::operator=(Lease&& other) noexcept {
  if (this != &other) state_ = std::move(other.state_);
  return *this;
}

void* Lease::data() const { return state_ ? state_->data() : nullptr; }
uint64_t Lease::size() const { return state_ ? state_->size() : 0; }
int Lease::numa_node() const { return state_ ? state_->numa_node() : -1; }
uint64_t Lease::id() const { return state_ ? state_->info().id : 0; }
bool Lease::revoked() const { return state_ && state_->revoked(); }
const LeaseInfo& Lease::info() const { return state_ ? state_->info() : EmptyInfo(); }

ClientResult<uint64_t> Lease::device_ptr() const {
  if (!state_) return ClientStatus(ErrorCode::kInvalidArgument, "empty lease");
  Result<uint64_t> p = state_->DevicePtr();
  if (!p.ok()) return detail::ToClientStatus(p.status());
  return *p;
}

std::vector<DeviceChunk> Lease::device_chunks() const {
  std::vector<DeviceChunk> out;
  if (!state_) return out;
  for (const cuda::RegisteredChunk& c : state_->cuda().chunks()) {
    out.push_back(DeviceChunk{c.device_ptr, c.offset, c.length});
  }
  return out;
}

std::vector<LeaseExtent> Lease::extents() const {
  std::vector<LeaseExtent> out;
  if (!state_) return out;
  for (const ExtentMapping::Extent& e : state_->mapping().extents()) {
    out.push_back(LeaseExtent{e.offset, e.size, e.page_size != 0 ? e.page_size : 4096});
  }
  return out;
}

ClientStatus Lease::CudaRegister(int device) {
  if (!state_) return ClientStatus(ErrorCode::kInvalidArgument, "empty lease");
  return detail::ToClientStatus(state_->CudaRegister(device));
}

ClientResult<Placement> Lease::Verify() {
  if (!state_) return ClientStatus(ErrorCode::kInvalidArgument, "empty lease");
  Placement p;
  Status s = state_->VerifyPlacement("verify", &p);
  if (!s.ok()) return detail::ToClientStatus(s);
  return p;
}

ClientStatus Lease::CudaUnregister() {
  if (!state_) return ClientStatus(ErrorCode::kInvalidArgument, "empty lease");
  return detail::ToClientStatus(state_->CudaUnregister());
}

ClientStatus Lease::Release() {
  if (!state_) return ClientStatus(ErrorCode::kInvalidArgument, "empty lease");
  Status s = state_->Release();
  state_.reset();
  return detail::ToClientStatus(s);
}

ClientStatus Lease::CopyIn(uint64_t offset, const void* src, size_t len) {
  if (!state_) return ClientStatus(ErrorCode::kInvalidArgument, "empty lease");
  return detail::ToClientStatus(state_->CopyIn(offset, src, len));
}

ClientStatus Lease::CopyOut(uint64_t offset, void* dst, size_t len) {
  if (!state_) return ClientStatus(ErrorCode::kInvalidArgument, "empty lease");
  return detail::ToClientStatus(state_->CopyOut(offset, dst, len));
}

ClientStatus Lease::NoteAccess(uint64_t offset, uint64_t len, uint64_t bytes_read,
                               uint64_t bytes_written) {
  if (!state_) return ClientStatus(ErrorCode::kInvalidArgument, "empty lease");
  return detail::ToClientStatus(state_->NoteAccess(offset, len, bytes_read, bytes_written));
}

ClientStatus Lease::Hint(uint64_t offset, uint64_t len, TierHint hint) {
  if (!state_) return ClientStatus(ErrorCode::kInvalidArgument, "empty lease");
  return detail::ToClientStatus(state_->Hint(offset, len, static_cast<int>(hint)));
}

ClientStatus Lease::PinTier(bool pinned) {
  if (!state_) return ClientStatus(ErrorCode::kInvalidArgument, "empty lease");
  return detail::ToClientStatus(state_->PinTier(pinned));
}

ClientStatus Lease::SetMigrationCallback(std::function<int(MigrationPhase)> callback) {
  if (!state_) return ClientStatus(ErrorCode::kInvalidArgument, "empty lease");
  std::function<int(int)> cb;
  if (callback) {
    cb = [callback = std::move(callback)](int phase) {
      return callback(static_cast<MigrationPhase>(phase));
    };
  }
  return detail::ToClientStatus(state_->SetMigrationCallback(std::move(cb)));
}

TieringStats Lease::tiering_stats() const {
  TieringStats t;
  if (!state_) return t;
  t.bytes_copied_in = state_->signals().total_written();
  t.bytes_copied_out = state_->signals().total_read();
  const auto& c = state_->tiering();
  t.migrations = c.migrations;
  t.declined = c.declined;
  t.last_pause_ns = c.last_pause_ns;
  t.max_pause_ns = c.max_pause_ns;
  t.numa_node = state_->numa_node();
  t.device_ptr_changed = c.device_ptr_changed;
  t.last_detail = c.last_detail;
  return t;
}

// ---------------------------------------------------------------- Client

Client::Client() = default;
Client::Client(std::shared_ptr<detail::ClientCore> core) : core_(std::move(core)) {}
Client::~Client() = default;
Client::Client(Client&& other) noexcept = default;
Client& Client::operator=(Client&& other) noexcept = default;

std::string Client::DefaultSocketPath() { return detail::DefaultSocketPath(); }

ClientResult<Client> Client::Connect(const std::string& socket_path) {
  const std::string path = socket_path.empty() ? detail::DefaultSocketPath() : socket_path;
  Result<std::shared_ptr<detail::ClientCore>> core = detail::ClientCore::Connect(path);
  if (!core.ok()) return detail::ToClientStatus(core.status());
  return Client(std::move(*core));
}

ClientResult<Lease> Client::Allocate(const AllocOptions& o) {
  if (!core_) return NotConnected();
  if (o.size_bytes == 0) return ClientStatus(ErrorCode::kInvalidArgument, "size_bytes is 0");
  if (o.numa_node < -1) {
    return ClientStatus(ErrorCode::kInvalidArgument, "numa_node must be >= 0, or -1");
  }
  if (o.near_gpu < -1) {
    return ClientStatus(ErrorCode::kInvalidArgument, "near_gpu must be >= 0, or -1");
  }
  if (o.name.empty() && (!o.acl_uids.empty() || !o.acl_gids.empty())) {
    return ClientStatus(ErrorCode::kInvalidArgument, "an ACL needs a shared lease name");
  }
  proto::AllocRequest req;
  req.set_size_bytes(o.size_bytes);
  if (o.numa_node >= 0) req.set_numa_node(o.numa_node);
  if (!o.gpu.empty()) {
    req.set_gpu(o.gpu);
  } else if (o.near_gpu >= 0) {
    req.set_gpu(std::to_string(o.near_gpu));
  }
  for (const std::string& t : o.tier_preference) req.add_tier_preference(t);
  req.set_strict(o.strict);
  req.set_hugetlb(o.hugetlb);
  req.set_long_term_pin(o.long_term_pin || o.cuda_register);
  req.set_label(o.label);
  req.set_name(o.name);
  for (uint32_t u : o.acl_uids) req.add_acl_uids(u);
  for (uint32_t g : o.acl_gids) req.add_acl_gids(g);

  Result<std::unique_ptr<detail::LeaseState>> state = core_->Allocate(req);
  if (!state.ok()) return detail::ToClientStatus(state.status());
  Lease lease(std::move(*state));
  if (o.cuda_register) {
    // A failed registration is kept in the lease (device_ptr() reports it);
    // the host mapping is usable either way.
    Status s = lease.state_->CudaRegister(o.near_gpu >= 0 ? o.near_gpu : 0);
    (void)s;
  }
  return lease;
}

ClientResult<Lease> Client::Attach(const std::string& name) {
  if (!core_) return NotConnected();
  if (name.empty()) return ClientStatus(ErrorCode::kInvalidArgument, "empty lease name");
  Result<std::unique_ptr<detail::LeaseState>> state = core_->Attach(name, std::nullopt);
  if (!state.ok()) return detail::ToClientStatus(state.status());
  return Lease(std::move(*state));
}

ClientResult<Lease> Client::AttachFrom(uint32_t owner_uid, const std::string& name) {
  if (!core_) return NotConnected();
  if (name.empty()) return ClientStatus(ErrorCode::kInvalidArgument, "empty lease name");
  Result<std::unique_ptr<detail::LeaseState>> state = core_->Attach(name, owner_uid);
  if (!state.ok()) return detail::ToClientStatus(state.status());
  return Lease(std::move(*state));
}

ClientResult<int> Client::ProcessEvents() {
  if (!core_) return NotConnected();
  Result<int> n = core_->ProcessEvents();
  if (!n.ok()) return detail::ToClientStatus(n.status());
  return *n;
}

ClientResult<int> Client::MigrationsPending() {
  if (!core_) return NotConnected();
  return core_->MigrationsPending();
}

ClientResult<int> Client::SafePoint() {
  if (!core_) return NotConnected();
  Result<int> n = core_->SafePoint();
  if (!n.ok()) return detail::ToClientStatus(n.status());
  return *n;
}

ClientStatus Client::FlushSignals() {
  if (!core_) return NotConnected();
  return detail::ToClientStatus(core_->FlushSignals());
}

uint32_t Client::protocol_version() const { return core_ ? core_->protocol_version() : 0; }
std::string Client::server_version() const { return core_ ? core_->server_version() : ""; }

}  // namespace cxlpool
