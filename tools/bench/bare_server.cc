// The baseline: a bare fd-passing AF_UNIX server in its own process
// (BareServer) and its client (BareClient). See bench.h.
#include <sched.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <map>
#include <memory>

#include "bench.h"

namespace cxlpool::bench {

// ---------------------------------------------------------------- bare server

namespace {

struct BareMsg {
  uint32_t op;
  uint32_t pad;
  uint64_t id;
};
static_assert(sizeof(BareMsg) == 16);

// One connection's grants not yet released (memfd mode), oldest first.
using Built = std::deque<std::unique_ptr<Backing>>;

// The fd answering op 1: the shared memfd, or a new one built like the
// daemon's (kept in `built` until its release). -1 when the build failed.
int GrantFd(int shared_memfd, const std::optional<MemfdSpec>& build, Built* built) {
  if (!build) return shared_memfd;
  auto b = CreateMemfdBacking(*build);
  if (!b.ok()) return -1;
  built->push_back(std::move(*b));
  return built->back()->fd();
}

[[noreturn]] void BareServe(int lfd, std::optional<MemfdSpec> build, bool prebuilt) {
  int memfd = -1;
  std::unique_ptr<Backing> ready;  // prebuilt: the one memfd every grant hands over
  if (prebuilt) {
    auto b = CreateMemfdBacking(*build);
    if (!b.ok()) ::_exit(3);
    ready = std::move(*b);
    memfd = ready->fd();
    build.reset();
  } else {
    memfd = ::memfd_create("cxlpool-bench-bare", MFD_CLOEXEC);
    if (memfd < 0 || ::ftruncate(memfd, 4096) != 0) ::_exit(2);
  }
  int ep = ::epoll_create1(EPOLL_CLOEXEC);
  if (ep < 0) ::_exit(2);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = lfd;
  ::epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev);
  std::map<int, std::string> pending;  // partial requests per connection
  std::map<int, Built> built;
  epoll_event evs[64];
  for (;;) {
    int n = ::epoll_wait(ep, evs, 64, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      ::_exit(2);
    }
    for (int i = 0; i < n; ++i) {
      int fd = evs[i].data.fd;
      if (fd == lfd) {
        for (;;) {
          int c = ::accept4(lfd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
          if (c < 0) break;
          epoll_event cev{};
          cev.events = EPOLLIN;
          cev.data.fd = c;
          ::epoll_ctl(ep, EPOLL_CTL_ADD, c, &cev);
        }
        continue;
      }
      char buf[4096];
      ssize_t got = ::recv(fd, buf, sizeof buf, 0);
      if (got <= 0) {
        if (got < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        ::epoll_ctl(ep, EPOLL_CTL_DEL, fd, nullptr);
        ::close(fd);
        pending.erase(fd);
        built.erase(fd);  // reclaims what the client never released
        continue;
      }
      std::string& p = pending[fd];
      p.append(buf, static_cast<size_t>(got));
      while (p.size() >= sizeof(BareMsg)) {
        BareMsg m;
        std::memcpy(&m, p.data(), sizeof m);
        p.erase(0, sizeof m);
        iovec iov{&m, sizeof m};
        msghdr mh{};
        mh.msg_iov = &iov;
        mh.msg_iovlen = 1;
        alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int))];
        if (m.op == 1) {
          int give = GrantFd(memfd, build, &built[fd]);
          if (give < 0) ::_exit(3);  // the client sees EOF: the run fails, not a number
          mh.msg_control = ctl;
          mh.msg_controllen = sizeof ctl;
          cmsghdr* cm = CMSG_FIRSTHDR(&mh);
          cm->cmsg_level = SOL_SOCKET;
          cm->cmsg_type = SCM_RIGHTS;
          cm->cmsg_len = CMSG_LEN(sizeof(int));
          std::memcpy(CMSG_DATA(cm), &give, sizeof(int));
        } else if (build) {
          Built& mine = built[fd];
          if (!mine.empty()) {
            mine.front()->Reclaim();
            mine.pop_front();
          }
        }
        // The CPU the reply leaves from: the client tells same-CPU pairs
        // from cross-CPU ones (BareClient::last_same_cpu).
        m.pad = static_cast<uint32_t>(::sched_getcpu());
        // One request in flight per client: a 16-byte reply always fits.
        ::sendmsg(fd, &mh, MSG_NOSIGNAL);
      }
    }
  }
}

}  // namespace

MemfdSpec FloorSpec(uint64_t size, int node, bool pin, bool thp, const char* name) {
  MemfdSpec spec;
  spec.size_bytes = size;
  spec.numa_node = node;
  spec.pin = pin;
  spec.thp = thp;
  spec.name = name;
  return spec;
}

BareServer::~BareServer() { Stop(); }

Status BareServer::Start(std::optional<MemfdSpec> build) { return Fork(std::move(build), false); }

Status BareServer::StartPrebuilt(const MemfdSpec& spec) { return Fork(spec, true); }

Status BareServer::Fork(std::optional<MemfdSpec> build, bool prebuilt) {
  CXLPOOL_RETURN_IF_ERROR(child_.MakeDir("cxlpool-bench-bare"));
  socket_ = child_.dir() + "/bare.sock";
  int lfd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (lfd < 0) return Status::FromErrno(errno, "socket");
  UniqueFd l(lfd);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  if (socket_.size() >= sizeof sa.sun_path) return Status(Code::kInvalidArgument, "path too long");
  std::memcpy(sa.sun_path, socket_.c_str(), socket_.size() + 1);
  if (::bind(lfd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    return Status::FromErrno(errno, "bind " + socket_);
  }
  if (::listen(lfd, 1024) != 0) return Status::FromErrno(errno, "listen");
  auto in_child = child_.Fork();
  if (!in_child.ok()) return in_child.status();
  if (*in_child) BareServe(lfd, std::move(build), prebuilt);
  return Status();
}

void BareServer::Stop() { child_.Stop(); }

Result<BareClient> BareClient::Connect(const std::string& socket_path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::FromErrno(errno, "socket");
  BareClient c;
  c.sock_.Reset(fd);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::memcpy(sa.sun_path, socket_path.c_str(),
              std::min(socket_path.size() + 1, sizeof sa.sun_path - 1));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    return Status::FromErrno(errno, "connect " + socket_path);
  }
  return c;
}

Status BareClient::GrantRoundTrip() { return RoundTrip(1, true); }

Result<UniqueFd> BareClient::GrantFd() {
  UniqueFd fd;
  CXLPOOL_RETURN_IF_ERROR(RoundTrip(1, true, &fd));
  return fd;
}
Status BareClient::ReleaseRoundTrip() { return RoundTrip(2, false); }

Status BareClient::RoundTrip(uint32_t op, bool expect_fd, UniqueFd* keep) {
  BareMsg m{op, 0, next_id_++};
  if (::send(sock_.get(), &m, sizeof m, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof m)) {
    return Status::FromErrno(errno, "bare send");
  }
  BareMsg r{};
  size_t got = 0;
  int fds_seen = 0;
  while (got < sizeof r) {
    iovec iov{reinterpret_cast<char*>(&r) + got, sizeof r - got};
    alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int) * 2)];
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = ctl;
    mh.msg_controllen = sizeof ctl;
    ssize_t n = ::recvmsg(sock_.get(), &mh, MSG_CMSG_CLOEXEC);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return Status(Code::kUnavailable, "bare server closed the connection");
    }
    for (cmsghdr* cm = CMSG_FIRSTHDR(&mh); cm != nullptr; cm = CMSG_NXTHDR(&mh, cm)) {
      if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
        size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < k; ++i) {
          int fd;
          std::memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof fd);
          if (keep != nullptr && fds_seen == 0) {
            keep->Reset(fd);
          } else {
            ::close(fd);
          }
          ++fds_seen;
        }
      }
    }
    got += static_cast<size_t>(n);
  }
  last_client_cpu_ = ::sched_getcpu();
  last_server_cpu_ = static_cast<int>(r.pad);
  if (r.id != m.id) return Status(Code::kProtocol, "bare reply id mismatch");
  if ((fds_seen == 1) != expect_fd) return Status(Code::kProtocol, "bare reply fd count wrong");
  return Status();
}

std::optional<bool> BareClient::last_same_cpu() const {
  if (last_client_cpu_ < 0 || last_server_cpu_ < 0) return std::nullopt;
  return last_client_cpu_ == last_server_cpu_;
}

}  // namespace cxlpool::bench
