#include "stop_signal.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdint>

namespace cxlpool::detail {

bool StopSignal::Arm() {
  if (owned_.valid()) return true;
  owned_.Reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!owned_.valid()) return false;
  fd_.store(owned_.get());
  return true;
}

void StopSignal::Stop() {
  stopping_.store(true);
  if (int fd = fd_.load(); fd >= 0) {
    uint64_t one = 1;
    (void)!::write(fd, &one, sizeof one);
  }
}

bool StopSignal::Nap(int ms) const {
  if (stopping()) return false;
  const int fd = fd_.load();
  if (fd < 0) {
    ::usleep(static_cast<useconds_t>(ms) * 1000);
    return !stopping();
  }
  pollfd p{fd, POLLIN, 0};
  int r = ::poll(&p, 1, ms);
  return r == 0 && !stopping();
}

}  // namespace cxlpool::detail
