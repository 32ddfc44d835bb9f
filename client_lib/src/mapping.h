// Mapping: the client's view of a lease fd, mmap(MAP_SHARED|MAP_POPULATE,
// PROT_READ|PROT_WRITE) at the size the daemon announced, after checking
// with fstat that the fd really is that size.
//
// A Mapping owns the fd as well as the address range: the fd stays open for
// the life of the lease so that it can be handed back to a restarted daemon
// (reclaim). Nothing here refers to the connection the fd came from.
//
// Thread safety: like a unique_ptr; one owner at a time.
#pragma once

#include <cstdint>
#include <string>

#include "cxlpool/common/status.h"
#include "cxlpool/common/unique_fd.h"

namespace cxlpool {

class Mapping {
 public:
  Mapping() = default;
  ~Mapping() { Unmap(); }
  Mapping(Mapping&& o) noexcept;
  Mapping& operator=(Mapping&& o) noexcept;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;

  // Maps `fd`, which must be `size` bytes: a regular file (memfd, hugetlbfs)
  // of exactly that size, or a character device when `backing` is "devdax"
  // (whose size fstat cannot tell).
  // Errors: INVALID_ARGUMENT (size 0, bad fd), PROTOCOL (the fd's size or
  // type does not match the daemon's reply), RESOURCE_EXHAUSTED / IO (mmap).
  static Result<Mapping> Map(UniqueFd fd, uint64_t size, const std::string& backing);

  void* data() const { return addr_; }
  uint64_t size() const { return size_; }
  int fd() const { return fd_.get(); }
  bool mapped() const { return addr_ != nullptr; }

  // munmap and close; idempotent.
  void Unmap();

 private:
  UniqueFd fd_;
  void* addr_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace cxlpool
