#include "lease_state.h"

#include <optional>
#include <utility>

#include "client_core.h"
#include "cxlpool/common/log.h"
#include "cxlpool/common/page_census.h"

namespace cxlpool::detail {

LeaseState::LeaseState(std::shared_ptr<ClientCore> core, ExtentMapping mapping, LeaseInfo info)
    : core_(std::move(core)),
      mapping_(std::move(mapping)),
      info_(std::move(info)),
      signals_(mapping_.size()) {
  node_.store(info_.numa_node, std::memory_order_relaxed);
}

LeaseState::~LeaseState() {
  Status s = Release();
  if (!s.ok()) {
    CXLPOOL_LOG(kDebug) << "release of lease " << info_.id << ": " << s.ToString();
  }
}

Status LeaseState::CudaRegister(int device) {
  if (released_) return Status(Code::kInvalidArgument, "lease already released");
  if (cuda_.registered()) {
    return Status(Code::kAlreadyExists,
                  "lease already registered with CUDA device " + std::to_string(cuda_.device()));
  }
  if (device < 0) return Status(Code::kInvalidArgument, "negative CUDA device index");
  Result<const cuda::CudaDriver*> driver = cuda::CudaDriver::Default();
  if (!driver.ok()) {
    cuda_status_ = driver.status();
    return cuda_status_;
  }
  Result<cuda::CudaRegistration> reg =
      cuda::RegisterHostMemory(**driver, device, mapping_.data(), mapping_.size());
  if (!reg.ok()) {
    cuda_status_ = reg.status();
    return cuda_status_;
  }
  cuda_ = std::move(*reg);
  cuda_status_ = Status::Ok();
  DeclareCooperative();
  // The registration pinned the pages long-term, which may have migrated
  // them (out of ZONE_MOVABLE): ask the kernel where they are now.
  Placement placement;
  if (Status s = VerifyPlacement("cuda_register", &placement); !s.ok()) {
    CXLPOOL_LOG(kWarning) << "lease " << info_.id
                          << ": placement check after CUDA registration: " << s.ToString();
  } else if (placement.moved) {
    CXLPOOL_LOG(kWarning) << "lease " << info_.id
                          << ": after CUDA registration its pages are on node "
                          << placement.numa_node << ", not node " << placement.placed_numa_node
                          << " where it was placed; the daemon was told";
  }
  return Status::Ok();
}

Status LeaseState::VerifyPlacement(const std::string& cause, Placement* out) {
  *out = Placement();
  // Where the daemon last said the pages are (the grant, a tiering move, a
  // confirmed report): numa_node(), which LeaseEvent "moved" keeps current.
  const int accounted = numa_node();
  out->placed_numa_node = accounted;
  if (released_) return Status(Code::kInvalidArgument, "lease already released");
  if (info_.backing == "devdax") {
    return Status(Code::kUnsupported,
                  "a devdax lease is device memory: move_pages cannot place it (its node is the "
                  "DAX device's target node)");
  }
  Result<PageCensus> census = CensusPages(mapping_.data(), mapping_.size(), 4096, 4096);
  if (!census.ok()) return census.status();
  std::optional<int> node = census->MajorityNode();
  out->numa_node = node.value_or(-1);
  out->pages_sampled = census->sampled;
  out->pages_on_node = node ? census->on_node.at(*node) : 0;
  out->pages_absent = census->absent;
  out->moved = node.has_value() && *node != accounted;
  if (!out->moved) return Status::Ok();
  proto::LeaseMovedRequest req;
  req.set_lease_id(info_.id);
  req.set_numa_node(*node);
  req.set_pages_sampled(census->sampled);
  req.set_pages_on_node(out->pages_on_node);
  req.set_cause(cause);
  Result<proto::LeaseMovedReply> reply = core_->ReportMoved(req);
  if (!reply.ok()) return reply.status();
  info_ = FromProto(reply->lease());
  SetNode(info_.numa_node);
  return Status::Ok();
}

Status LeaseState::CudaUnregister() {
  if (!cuda_.registered()) return Status(Code::kNotFound, "the lease is not registered with CUDA");
  Status s = cuda_.Unregister();
  cuda_status_ = Status(Code::kNotFound, "the lease is not registered with CUDA");
  DeclareCooperative();
  return s;
}

Result<uint64_t> LeaseState::DevicePtr() const {
  if (!cuda_.registered()) return cuda_status_;
  if (!cuda_.contiguous()) {
    return Status(Code::kUnsupported, "the lease's " + std::to_string(cuda_.chunks().size()) +
                                          " CUDA chunks have non-contiguous device pointers;"
                                          " use the per-chunk pointers");
  }
  return cuda_.chunks().front().device_ptr;
}

Status LeaseState::Release() {
  if (released_) return Status::Ok();
  released_ = true;
  Status result;
  if (cuda_.registered()) {
    Status s = cuda_.Unregister();
    if (!s.ok()) {
      CXLPOOL_LOG(kWarning) << "lease " << info_.id << ": " << s.ToString();
    }
  }
  // Untracked first: a reconnect on another thread must not hand back an
  // fd that is about to close. The fd stays open until the daemon answered.
  core_->Untrack(this);
  if (revoked()) {
    result = Status(Code::kRevoked, "lease " + std::to_string(info_.id) + " was revoked");
  }
  Status s = core_->Release(info_.id, revoked() ? nullptr : &mapping_);
  mapping_.Unmap();
  if (result.ok() && !s.ok()) result = s;
  core_.reset();
  return result;
}

}  // namespace cxlpool::detail
