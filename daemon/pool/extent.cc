#include "pool/extent.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "cxlpool/common/log.h"

namespace cxlpool {

Result<std::unique_ptr<Extent>> Extent::Create(const MemfdSpec& spec) {
  auto built = BuildMemfd(spec);
  if (!built.ok()) return built.status();
  std::unique_ptr<Extent> e(new Extent());
  e->fd_ = std::move(built->fd);
  e->addr_ = built->addr;
  e->map_bytes_ = built->size_bytes;
  e->size_ = built->size_bytes;
  e->built_ = built->size_bytes;
  e->page_ = built->page_size;
  e->kind_ = std::move(built->kind);
  e->node_ = spec.numa_node;
  struct stat st {};
  if (::fstat(e->fd_.get(), &st) == 0) {
    e->inode_ = st.st_ino;
    e->dev_ = st.st_dev;
  }
  return e;
}

Status Extent::ShrinkTo(uint64_t size) {
  if (exposed_) return Status(Code::kInvalidArgument, "an exposed extent cannot be reshaped");
  if (retired()) return Status(Code::kInvalidArgument, "the extent is retired");
  if (size == 0 || size > size_ || size % page_ != 0) {
    return Status(Code::kInvalidArgument, "cannot shrink a " + std::to_string(size_) +
                                              "-byte extent to " + std::to_string(size) +
                                              " bytes (page size " + std::to_string(page_) + ")");
  }
  if (size == size_) return Status::Ok();
  if (::ftruncate(fd_.get(), static_cast<off_t>(size)) != 0) {
    return Status::FromErrno(errno, "shrink extent to " + std::to_string(size) + " bytes");
  }
  size_ = size;
  return Status::Ok();
}

void Extent::Retire() {
  if (fd_.valid()) {
    // Truncate first: the pages go back even while a holder still has the
    // fd or a mapping (its next access faults with SIGBUS). Should not fail
    // for a memfd we made (F_SEAL_SHRINK is never set); if it does, say so:
    // a holder could then still read the memory.
    if (::ftruncate(fd_.get(), 0) != 0) {
      CXLPOOL_LOG(kError) << "extent: truncating a retired memfd failed: " << std::strerror(errno);
    }
  }
  if (addr_ != nullptr) {
    ::munmap(addr_, map_bytes_);
    addr_ = nullptr;
  }
  fd_.Reset();
  size_ = 0;
}

namespace {
class ExtentBacking final : public Backing {
 public:
  explicit ExtentBacking(std::unique_ptr<Extent> e) : e_(std::move(e)) { e_->MarkExposed(); }
  int fd() const override { return e_->fd(); }
  uint64_t size_bytes() const override { return e_->size_bytes(); }
  uint64_t page_size() const override { return e_->page_size(); }
  const std::string& kind() const override { return e_->kind(); }
  void* daemon_addr() const override { return e_->daemon_addr(); }
  bool Identity(uint64_t* inode, uint64_t* dev) const override {
    if (e_->inode() == 0) return false;
    *inode = e_->inode();
    *dev = e_->device();
    return true;
  }
  void Reclaim() override { e_->Retire(); }

 private:
  std::unique_ptr<Extent> e_;
};
}  // namespace

std::unique_ptr<Backing> LeaseBacking(std::unique_ptr<Extent> extent) {
  return std::make_unique<ExtentBacking>(std::move(extent));
}

}  // namespace cxlpool
