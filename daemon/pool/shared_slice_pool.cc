#include "pool/shared_slice_pool.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cxlpool/common/log.h"

namespace cxlpool {

namespace {

// One slice of a shared device, held by one lease. Reclaim closes the
// daemon's fd and gives the slice back to the source, which zeroes it
// before any other lease sees it.
class SharedSliceBacking final : public Backing {
 public:
  SharedSliceBacking(UniqueFd fd, std::string path, SliceSource::Slice slice, uint64_t size,
                     SliceSource* source)
      : fd_(std::move(fd)), path_(std::move(path)), slice_(slice), size_(size), source_(source) {
    struct stat st {};
    if (fd_.valid() && ::fstat(fd_.get(), &st) == 0) {
      inode_ = st.st_ino;
      dev_ = st.st_dev;
      rdev_ = S_ISCHR(st.st_mode) ? st.st_rdev : 0;
    }
  }
  ~SharedSliceBacking() override { Reclaim(); }

  int fd() const override { return fd_.get(); }
  uint64_t size_bytes() const override { return size_; }
  uint64_t page_size() const override { return SharedSlicePool::kAlign; }
  const std::string& kind() const override {
    static const std::string k = "shared-slice";
    return k;
  }
  uint64_t device_number() const override { return rdev_; }
  uint64_t device_offset() const override { return slice_.device_offset; }
  std::optional<uint32_t> shared_slice() const override { return slice_.index; }
  bool Identity(uint64_t* inode, uint64_t* dev) const override {
    if (inode_ == 0) return false;
    *inode = inode_;
    *dev = dev_;
    return true;
  }
  void Reclaim() override {
    if (reclaimed_) return;
    reclaimed_ = true;
    fd_.Reset();
    source_->Return(path_, slice_.index);
  }

 private:
  UniqueFd fd_;
  const std::string path_;
  const SliceSource::Slice slice_;
  const uint64_t size_;
  SliceSource* source_;
  uint64_t inode_ = 0, dev_ = 0, rdev_ = 0;
  bool reclaimed_ = false;
};

}  // namespace

std::string SharedSlicePool::PoolName(const std::string& path) {
  const size_t slash = path.rfind('/');
  return "shared:" + (slash == std::string::npos ? path : path.substr(slash + 1));
}

SharedSlicePool::SharedSlicePool(std::string path, uint64_t slice_bytes, uint64_t capacity,
                                 SliceSource* source)
    : Pool(PoolName(path), -1, "cxl", std::nullopt, capacity, "shared"),
      path_(std::move(path)),
      slice_bytes_(slice_bytes),
      source_(source) {}

Result<uint64_t> SharedSlicePool::RoundSize(uint64_t requested, bool hugetlb) const {
  if (requested == 0) return Status(Code::kInvalidArgument, "size_bytes must be > 0");
  if (hugetlb) {
    return Status(Code::kUnsupported,
                  "hugetlb leases come from memfd pools, not shared device " + name());
  }
  if (requested > slice_bytes_) {
    return Status(Code::kResourceExhausted,
                  "a lease on shared device " + name() + " is at most one slice (" +
                      std::to_string(slice_bytes_) + " bytes), not " + std::to_string(requested));
  }
  return slice_bytes_;
}

Result<std::unique_ptr<Backing>> SharedSlicePool::Wrap(SliceSource::Slice s, uint64_t size) const {
  UniqueFd fd(::open(path_.c_str(), O_RDWR | O_CLOEXEC));
  if (!fd.valid()) {
    Status st = Status::FromErrno(errno, "open " + path_);
    source_->Return(path_, s.index);
    return st;
  }
  return std::unique_ptr<Backing>(
      std::make_unique<SharedSliceBacking>(std::move(fd), path_, s, size, source_));
}

Result<std::unique_ptr<Backing>> SharedSlicePool::Build(uint64_t size, bool hugetlb,
                                                        const FillOffer&) const {
  if (hugetlb || size != slice_bytes_) {
    return Status(Code::kInvalidArgument, "a build on " + name() + " is one slice of " +
                                              std::to_string(slice_bytes_) + " bytes");
  }
  auto s = source_->Take(path_);
  if (!s.ok()) return s.status();
  if (s->length < size) {
    // The device's record in etcd says another slice size than our config.
    source_->Return(path_, s->index);
    return Status(Code::kInvalidArgument,
                  name() + ": the cluster cuts this device into slices of " +
                      std::to_string(s->length) + " bytes, the config says " +
                      std::to_string(slice_bytes_) + "; make [[cluster.shared]] slice_size agree");
  }
  return Wrap(*s, size);
}

Result<std::unique_ptr<Backing>> SharedSlicePool::Recovered(uint32_t index, uint64_t device_offset,
                                                            uint64_t size) const {
  source_->Hold(path_, index);
  return Wrap(SliceSource::Slice{index, device_offset, size}, size);
}

Status SharedSlicePool::CheckFd(int fd) const {
  struct stat got {
  }, want{};
  if (::fstat(fd, &got) != 0) return Status::FromErrno(errno, "fstat of the handed-back fd");
  if (::stat(path_.c_str(), &want) != 0) return Status::FromErrno(errno, "stat " + path_);
  const bool same = S_ISCHR(want.st_mode)
                        ? (S_ISCHR(got.st_mode) && got.st_rdev == want.st_rdev)
                        : (got.st_ino == want.st_ino && got.st_dev == want.st_dev);
  if (!same) return Status(Code::kInvalidArgument, "the fd handed back is not " + path_);
  return Status::Ok();
}

}  // namespace cxlpool
