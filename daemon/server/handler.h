// RequestHandler: the seam between the IPC server (framing, sockets, fds,
// peer credentials) and the daemon's lease logic.
//
// The server owns sockets and calls the handler on the single event-loop
// thread. The handler answers each request exactly once through the Reply
// callback, either before returning or later from the event-loop thread
// (after posting slow work to a worker pool and the result back).
//
// Thread safety: every method is called on the event-loop thread, and Reply
// must be invoked on it too.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cxlpool.pb.h"
#include "cxlpool/common/status.h"
#include "cxlpool/common/unique_fd.h"

namespace cxlpool {

using ConnectionId = uint64_t;

// Who is on the other end, from SO_PEERCRED / SO_PEERPIDFD at accept time.
struct PeerInfo {
  pid_t pid = -1;
  uid_t uid = static_cast<uid_t>(-1);
  gid_t gid = static_cast<gid_t>(-1);
  int pidfd = -1;      // owned by the server for the connection's life
  std::string comm;    // /proc/<pid>/comm at accept
  std::string cgroup;  // /proc/<pid>/cgroup (unified hierarchy path)
};

// One decoded request: the header's type and request id, the protobuf
// payload still serialized, and any fds that rode along (already CLOEXEC).
struct Request {
  proto::MsgType type = proto::MSG_UNSPECIFIED;
  uint64_t request_id = 0;
  std::string payload;
  std::vector<UniqueFd> fds;
};

// One reply: the header's type, the serialized payload, and fds to pass on
// the same sendmsg. The server closes nothing it is given here: fds are
// borrowed and must stay open until Reply returns. `more`: frames that
// follow it at once with the same request id (a lease reply's
// MSG_EXTENT_FDS frames, proto/extents.h), each with its own fds; none of
// them is sent unless the reply itself is queued.
struct Reply {
  proto::MsgType type = proto::MSG_ERROR_REPLY;
  std::string payload;
  std::vector<int> fds;
  std::vector<Reply> more;
};

using ReplyFn = std::function<void(Reply)>;

class RequestHandler {
 public:
  virtual ~RequestHandler() = default;
  virtual void OnConnect(ConnectionId conn, const PeerInfo& peer) = 0;
  virtual void OnRequest(ConnectionId conn, Request request, ReplyFn reply) = 0;
  // The connection is gone (EOF, error, or dropped for misbehaving). Release
  // everything it held. Called exactly once per OnConnect.
  virtual void OnDisconnect(ConnectionId conn) = 0;
  // True while the connection holds something (a lease, an attachment) that
  // closing it would take away: the server's idle timeout then never closes
  // it, however long it stays silent.
  virtual bool HoldsResources(ConnectionId conn) const {
    (void)conn;
    return false;
  }
};

// Builds an error reply frame payload (MSG_ERROR_REPLY) from a Status.
Reply MakeErrorReply(const Status& status);

}  // namespace cxlpool
