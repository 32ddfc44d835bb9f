/* A long-term pin for the VM tier's own tools (cxlpool-vm-probe and
 * cxlpool-vm-client): io_uring fixed-buffer registration by raw syscalls
 * (liburing is not in the guest). It pins with FOLL_LONGTERM, as the GPU
 * driver does for cuMemHostRegister and RDMA does for memory registration,
 * so the kernel first migrates the pages out of ZONE_MOVABLE. Plain C, no
 * project libraries. */
#ifndef CXLPOOL_VM_LONGTERM_PIN_H_
#define CXLPOOL_VM_LONGTERM_PIN_H_

#include <errno.h>
#include <linux/io_uring.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

/* Pins the `n` ranges of `iov` (each at most 1 GiB, each inside one
 * mapping of one file: io_uring refuses a buffer over several files with
 * EINVAL, so a lease of several extents is one buffer per extent); returns
 * the ring fd, whose close unpins, or -1 with the reason on stderr. */
static inline int VmLongTermPinIov(const struct iovec* iov, unsigned n) {
  struct io_uring_params params;
  memset(&params, 0, sizeof params);
  int ring = (int)syscall(__NR_io_uring_setup, 1, &params);
  if (ring < 0) {
    fprintf(stderr, "io_uring_setup: %s\n", strerror(errno));
    return -1;
  }
  if (syscall(__NR_io_uring_register, ring, IORING_REGISTER_BUFFERS, iov, n) != 0) {
    size_t len = 0;
    for (unsigned i = 0; i < n; ++i) len += iov[i].iov_len;
    fprintf(stderr, "io_uring_register(IORING_REGISTER_BUFFERS, %u buffers, %zu bytes): %s\n", n,
            len, strerror(errno));
    close(ring);
    return -1;
  }
  return ring;
}

/* Pins [p, p + len), one mapping (at most 1 GiB). */
static inline int VmLongTermPin(void* p, size_t len) {
  struct iovec iov = {p, len};
  return VmLongTermPinIov(&iov, 1);
}

#endif /* CXLPOOL_VM_LONGTERM_PIN_H_ */
