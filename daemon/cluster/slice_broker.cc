#include "cluster/slice_broker.h"

#include "cxlpool/common/log.h"

namespace cxlpool {

Result<SliceSource::Slice> SliceBroker::Take(const std::string& path) {
  ClusterMember* m = member_.load();
  if (m == nullptr) {
    return Status(Code::kUnavailable, "shared device " + path + ": the cluster has not started");
  }
  auto g = m->TakeSlice(path, wait_);
  if (!g.ok()) return g.status();
  return Slice{g->index, g->offset, g->length};
}

void SliceBroker::Return(const std::string& path, uint32_t index) {
  if (ClusterMember* m = member_.load()) return m->ReturnSlice(path, index);
  MutexLock lock(mu_);
  if (ClusterMember* m = member_.load()) return m->ReturnSlice(path, index);
  held_[path].erase(index);
}

void SliceBroker::Hold(const std::string& path, uint32_t index) {
  MutexLock lock(mu_);
  if (member_.load() != nullptr) {
    // Recovery runs before the cluster starts; a hold after it is a bug.
    CXLPOOL_LOG(kError) << "cluster: slice " << index << " of " << path
                        << " held after the cluster started; not re-adopted";
    return;
  }
  held_[path].insert(index);
}

Status SliceBroker::Attach(
    const std::function<Result<ClusterMember*>(std::map<std::string, std::set<uint32_t>> held)>&
        start) {
  MutexLock lock(mu_);
  auto m = start(held_);
  if (!m.ok()) return m.status();
  held_.clear();
  member_.store(*m);
  return Status::Ok();
}

void SliceBroker::Detach() {
  MutexLock lock(mu_);
  member_.store(nullptr);
}

}  // namespace cxlpool
