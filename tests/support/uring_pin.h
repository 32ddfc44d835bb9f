// A long-term pin for tests, standing in for a GPU's: io_uring fixed
// buffers (IORING_REGISTER_BUFFERS pins the pages with FOLL_LONGTERM, as
// cuMemHostRegister does), with raw syscalls (no liburing). Also one
// IORING_OP_WRITE_FIXED, to show a buffer registered again still works.
//
// Thread safety: one UringPin per thread.
#pragma once

#include <linux/io_uring.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace cxlpool::testing {

class UringPin {
 public:
  UringPin() = default;
  ~UringPin() { Close(); }
  UringPin(const UringPin&) = delete;
  UringPin& operator=(const UringPin&) = delete;

  // 0 or -errno (ENOSYS/EPERM: no io_uring here).
  int Open() {
    io_uring_params p;
    std::memset(&p, 0, sizeof p);
    int fd = static_cast<int>(::syscall(__NR_io_uring_setup, 4, &p));
    if (fd < 0) return -errno;
    fd_ = fd;
    params_ = p;
    sq_len_ = p.sq_off.array + p.sq_entries * sizeof(uint32_t);
    cq_len_ = p.cq_off.cqes + p.cq_entries * sizeof(io_uring_cqe);
    sq_ = ::mmap(nullptr, sq_len_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd_,
                 IORING_OFF_SQ_RING);
    cq_ = ::mmap(nullptr, cq_len_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd_,
                 IORING_OFF_CQ_RING);
    sqes_ = ::mmap(nullptr, p.sq_entries * sizeof(io_uring_sqe), PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_POPULATE, fd_, IORING_OFF_SQES);
    if (sq_ == MAP_FAILED || cq_ == MAP_FAILED || sqes_ == MAP_FAILED) return -ENOMEM;
    return 0;
  }
  void Close() {
    if (fd_ < 0) return;
    if (sqes_ != MAP_FAILED && sqes_ != nullptr)
      ::munmap(sqes_, params_.sq_entries * sizeof(io_uring_sqe));
    if (cq_ != MAP_FAILED && cq_ != nullptr) ::munmap(cq_, cq_len_);
    if (sq_ != MAP_FAILED && sq_ != nullptr) ::munmap(sq_, sq_len_);
    ::close(fd_);
    fd_ = -1;
  }
  // Pins [addr, addr + len) as fixed buffer 0; `piece` set: as fixed
  // buffers 0, 1, ... of `piece` bytes each (the last the rest). A kernel
  // before 6.4 wants a fixed buffer's pages in one file, so a lease of
  // several extents (memfds) is pinned one extent per buffer there.
  // 0 or -errno.
  int Register(void* addr, size_t len, size_t piece = 0) {
    std::vector<iovec> v;
    for (size_t off = 0; off < len; off += piece == 0 ? len : piece) {
      v.push_back(
          iovec{static_cast<char*>(addr) + off, std::min(len - off, piece == 0 ? len : piece)});
    }
    if (::syscall(__NR_io_uring_register, fd_, IORING_REGISTER_BUFFERS, v.data(),
                  static_cast<unsigned>(v.size())) != 0) {
      return -errno;
    }
    registered_ = true;
    ++registrations;
    return 0;
  }
  int Unregister() {
    if (!registered_) return 0;
    if (::syscall(__NR_io_uring_register, fd_, IORING_UNREGISTER_BUFFERS, nullptr, 0) != 0) {
      return -errno;
    }
    registered_ = false;
    ++unregistrations;
    return 0;
  }
  bool registered() const { return registered_; }
  // Writes `len` bytes of fixed buffer 0 (at `addr`) to `file_fd` at 0 and
  // waits for it. Bytes written or -errno.
  int WriteFixed(int file_fd, void* addr, uint32_t len) {
    auto* tail =
        reinterpret_cast<std::atomic<uint32_t>*>(static_cast<char*>(sq_) + params_.sq_off.tail);
    auto* mask = reinterpret_cast<uint32_t*>(static_cast<char*>(sq_) + params_.sq_off.ring_mask);
    auto* array = reinterpret_cast<uint32_t*>(static_cast<char*>(sq_) + params_.sq_off.array);
    uint32_t t = tail->load(std::memory_order_acquire);
    uint32_t idx = t & *mask;
    auto* sqe = static_cast<io_uring_sqe*>(sqes_) + idx;
    std::memset(sqe, 0, sizeof *sqe);
    sqe->opcode = IORING_OP_WRITE_FIXED;
    sqe->fd = file_fd;
    sqe->addr = reinterpret_cast<uint64_t>(addr);
    sqe->len = len;
    sqe->off = 0;
    sqe->buf_index = 0;
    array[idx] = idx;
    tail->store(t + 1, std::memory_order_release);
    long rc = ::syscall(__NR_io_uring_enter, fd_, 1, 1, IORING_ENTER_GETEVENTS, nullptr, 0);
    if (rc < 0) return -errno;
    auto* chead =
        reinterpret_cast<std::atomic<uint32_t>*>(static_cast<char*>(cq_) + params_.cq_off.head);
    auto* cmask = reinterpret_cast<uint32_t*>(static_cast<char*>(cq_) + params_.cq_off.ring_mask);
    auto* cqes = reinterpret_cast<io_uring_cqe*>(static_cast<char*>(cq_) + params_.cq_off.cqes);
    uint32_t h = chead->load(std::memory_order_acquire);
    int res = cqes[h & *cmask].res;
    chead->store(h + 1, std::memory_order_release);
    return res;
  }

  int registrations = 0;
  int unregistrations = 0;

 private:
  int fd_ = -1;
  io_uring_params params_{};
  void* sq_ = nullptr;
  void* cq_ = nullptr;
  void* sqes_ = nullptr;
  size_t sq_len_ = 0;
  size_t cq_len_ = 0;
  bool registered_ = false;
};

}  // namespace cxlpool::testing
