#include "event_watcher.h"

#include <pthread.h>
#include <sys/epoll.h>

#include <cerrno>
#include <cstring>

#include "cxlpool/common/log.h"
#include "reconnector.h"

namespace cxlpool::detail {

EventWatcher::~EventWatcher() {
  if (thread_.joinable()) thread_.join();
}

void EventWatcher::Start() {
  MutexLock lock(mu_);
  if (started_ || stop_.stopping()) return;
  started_ = true;
  if (!stop_.Arm()) {
    CXLPOOL_LOG(kWarning) << "no restart watcher (eventfd: " << std::strerror(errno)
                          << "); a restart is noticed at the next call";
    return;
  }
  epoll_.Reset(::epoll_create1(EPOLL_CLOEXEC));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = stop_.fd();
  if (!epoll_.valid() || ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, stop_.fd(), &ev) != 0) {
    CXLPOOL_LOG(kWarning) << "no restart watcher (epoll: " << std::strerror(errno)
                          << "); a restart is noticed at the next call";
    epoll_.Reset();
    return;
  }
  thread_ = std::thread([this] { Loop(); });
}

void EventWatcher::SetCallActive(bool active) {
  MutexLock lock(mu_);
  call_active_ = active;
  Arm();
}

void EventWatcher::Watch(int fd) {
  MutexLock lock(mu_);
  if (watch_fd_ >= 0) (void)::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, watch_fd_, nullptr);
  watch_fd_ = -1;
  if (fd < 0) return;
  epoll_event ev{};
  ev.events = call_active_ ? EPOLLRDHUP : EPOLLIN | EPOLLRDHUP;
  ev.data.fd = fd;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) == 0) watch_fd_ = fd;
}

void EventWatcher::Arm() {
  if (watch_fd_ < 0) return;
  epoll_event ev{};
  // Hang-ups (EPOLLHUP, EPOLLERR) are reported whatever is asked: a daemon
  // that dies mid-call is seen by the caller and the watcher alike.
  ev.events = call_active_ ? EPOLLRDHUP : EPOLLIN | EPOLLRDHUP;
  ev.data.fd = watch_fd_;
  (void)::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, watch_fd_, &ev);
}

void EventWatcher::Loop() {
  // Named for top -H and the tests (at most 15 characters).
  (void)::pthread_setname_np(::pthread_self(), "cxlpool-watch");
  uint64_t gen = ~0ull;
  UniqueFd watched;
  while (!stop_.stopping()) {
    uint64_t now_gen = 0;
    bool lost = false;
    hooks_.look(&now_gen, &lost);
    if (now_gen != gen || !watched.valid()) {
      Watch(-1);
      watched = hooks_.dup_socket(&gen);
      Watch(watched.get());
    }
    if (lost || !watched.valid()) {
      if (stop_.stopping()) return;
      Status s = hooks_.reconnect();
      if (!s.ok()) {
        if (stop_.stopping()) return;
        CXLPOOL_LOG(kWarning) << "restart watcher: " << s.ToString();
        if (!stop_.Nap(kMaxBackoffMs)) return;
      }
      Watch(-1);
      watched.Reset();
      continue;
    }
    epoll_event evs[2];
    int r = ::epoll_wait(epoll_.get(), evs, 2, -1);
    if (r < 0 && errno != EINTR) return;
    if (stop_.stopping()) return;
    bool on_socket = false;
    for (int i = 0; i < r; ++i) {
      if (evs[i].data.fd == stop_.fd()) return;
      on_socket = on_socket || evs[i].data.fd == watched.get();
    }
    if (on_socket) hooks_.drain(gen);
  }
}

}  // namespace cxlpool::detail
