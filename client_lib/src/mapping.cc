#include "mapping.h"

#include <sys/mman.h>
#include <sys/stat.h>

#include <cerrno>
#include <utility>

namespace cxlpool {

Mapping::Mapping(Mapping&& o) noexcept
    : fd_(std::move(o.fd_)),
      addr_(std::exchange(o.addr_, nullptr)),
      size_(std::exchange(o.size_, 0)) {}

Mapping& Mapping::operator=(Mapping&& o) noexcept {
  if (this != &o) {
    Unmap();
    fd_ = std::move(o.fd_);
    addr_ = std::exchange(o.addr_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

void Mapping::Unmap() {
  if (addr_ != nullptr) ::munmap(addr_, size_);
  addr_ = nullptr;
  size_ = 0;
  fd_.Reset();
}

Result<Mapping> Mapping::Map(UniqueFd fd, uint64_t size, const std::string& backing) {
  if (!fd.valid()) return Status(Code::kInvalidArgument, "no lease fd");
  if (size == 0) return Status(Code::kInvalidArgument, "lease size is 0");
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return Status::FromErrno(errno, "fstat(lease fd)");
  if (S_ISREG(st.st_mode)) {
    if (static_cast<uint64_t>(st.st_size) != size) {
      return Status(Code::kProtocol, "lease fd is " + std::to_string(st.st_size) +
                                         " bytes but the daemon announced " + std::to_string(size));
    }
  } else if (!(S_ISCHR(st.st_mode) && backing == "devdax")) {
    return Status(Code::kProtocol, "lease fd is neither a regular file nor a devdax device");
  }
  void* addr =
      ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd.get(), 0);
  if (addr == MAP_FAILED) {
    return Status::FromErrno(errno, "mmap(lease, " + std::to_string(size) + " bytes)");
  }
  Mapping m;
  m.fd_ = std::move(fd);
  m.addr_ = addr;
  m.size_ = size;
  return m;
}

}  // namespace cxlpool
