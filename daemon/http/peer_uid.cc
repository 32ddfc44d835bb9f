#include "http/peer_uid.h"

#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <sys/time.h>

#include <cerrno>
#include <cstring>

namespace cxlpool {

namespace {

// One endpoint as inet_diag wants it: family, port (network order) and the
// address in 4 words (IPv4 in the first). A v4-mapped IPv6 address is IPv4.
struct DiagEndpoint {
  int family = 0;
  uint16_t port = 0;
  uint32_t addr[4] = {};
};

std::optional<DiagEndpoint> ToDiag(const sockaddr_storage& ss) {
  DiagEndpoint e;
  if (ss.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(ss);
    e.family = AF_INET;
    e.port = in.sin_port;
    std::memcpy(e.addr, &in.sin_addr, sizeof in.sin_addr);
    return e;
  }
  if (ss.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(ss);
    e.port = in6.sin6_port;
    if (IN6_IS_ADDR_V4MAPPED(&in6.sin6_addr)) {
      e.family = AF_INET;
      std::memcpy(e.addr, in6.sin6_addr.s6_addr + 12, 4);
    } else {
      e.family = AF_INET6;
      std::memcpy(e.addr, &in6.sin6_addr, sizeof in6.sin6_addr);
    }
    return e;
  }
  return std::nullopt;
}

}  // namespace

Result<TcpPeerUids> TcpPeerUids::Open() {
  UniqueFd fd(::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG));
  if (!fd) return Status::FromErrno(errno, "socket(AF_NETLINK, NETLINK_SOCK_DIAG)");
  // The kernel answers an exact query at once; never wait long for it.
  timeval tv{0, 200 * 1000};
  (void)::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return TcpPeerUids(std::move(fd));
}

std::optional<uid_t> TcpPeerUids::Lookup(const sockaddr_storage& local,
                                         const sockaddr_storage& peer) {
  auto l = ToDiag(local);
  auto p = ToDiag(peer);
  if (!l || !p || l->family != p->family) return std::nullopt;
  struct {
    nlmsghdr nlh;
    inet_diag_req_v2 req;
  } msg{};
  msg.nlh.nlmsg_len = sizeof msg;
  msg.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  msg.nlh.nlmsg_flags = NLM_F_REQUEST;
  msg.nlh.nlmsg_seq = ++seq_;
  msg.req.sdiag_family = static_cast<uint8_t>(p->family);
  msg.req.sdiag_protocol = IPPROTO_TCP;
  msg.req.idiag_states = ~0u;
  // The peer's socket: its source is our remote end, its destination us.
  msg.req.id.idiag_sport = p->port;
  msg.req.id.idiag_dport = l->port;
  std::memcpy(msg.req.id.idiag_src, p->addr, sizeof p->addr);
  std::memcpy(msg.req.id.idiag_dst, l->addr, sizeof l->addr);
  msg.req.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
  msg.req.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  if (::sendto(fd_.get(), &msg, sizeof msg, 0, reinterpret_cast<sockaddr*>(&kernel),
               sizeof kernel) != static_cast<ssize_t>(sizeof msg)) {
    return std::nullopt;
  }
  alignas(nlmsghdr) char buf[8192];
  for (int tries = 0; tries < 4; ++tries) {  // skip answers to earlier, timed-out queries
    ssize_t n = ::recv(fd_.get(), buf, sizeof buf, 0);
    if (n <= 0) return std::nullopt;
    ssize_t len = n;  // wider than nlmsg_len, so NLMSG_OK compares signed values
    for (auto* h = reinterpret_cast<nlmsghdr*>(buf); NLMSG_OK(h, len); h = NLMSG_NEXT(h, len)) {
      if (h->nlmsg_seq != seq_) continue;
      if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY ||
          h->nlmsg_len < NLMSG_LENGTH(sizeof(inet_diag_msg))) {
        return std::nullopt;  // NLMSG_ERROR (ENOENT: not in this namespace) or garbled
      }
      return static_cast<uid_t>(static_cast<const inet_diag_msg*>(NLMSG_DATA(h))->idiag_uid);
    }
  }
  return std::nullopt;
}

}  // namespace cxlpool
