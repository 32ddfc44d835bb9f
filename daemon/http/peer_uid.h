// TcpPeerUids: which uid owns the other end of a loopback TCP connection the
// metrics endpoint accepted, so its limits can be kept per user. One exact
// NETLINK_SOCK_DIAG query (inet_diag, no dump) per connection: the kernel
// looks up the peer's socket by its 4-tuple and reports the uid that created
// it (`idiag_uid`), in O(1) whatever the number of sockets on the host.
//
// The query only sees the network namespace the netlink socket was made in:
// a connection to a socket another namespace owns (the one systemd passes
// from cxlpoold-metrics.socket into a service with PrivateNetwork=yes) is
// not found, and Lookup answers nullopt (the peer is unknown).
//
// Thread safety: one thread at a time (the HTTP thread).
#pragma once

#include <sys/socket.h>
#include <sys/types.h>

#include <cstdint>
#include <optional>

#include "cxlpool/common/status.h"
#include "cxlpool/common/unique_fd.h"

namespace cxlpool {

class TcpPeerUids {
 public:
  // UNAVAILABLE (with the errno text) when no NETLINK_SOCK_DIAG socket can
  // be made (a seccomp or RestrictAddressFamilies= without AF_NETLINK).
  static Result<TcpPeerUids> Open();

  // The uid of the socket at `peer` connected to `local` (both as the
  // accepting side sees them: IPv4, IPv6 or v4-mapped IPv6); nullopt when
  // the kernel does not find it (gone, another namespace) or does not answer.
  std::optional<uid_t> Lookup(const sockaddr_storage& local, const sockaddr_storage& peer);

 private:
  explicit TcpPeerUids(UniqueFd fd) : fd_(std::move(fd)) {}
  UniqueFd fd_;
  uint32_t seq_ = 0;
};

}  // namespace cxlpool
