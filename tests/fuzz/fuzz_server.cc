// Fuzz target: the server's frame paths and limits (daemon/server), on real
// sockets: two client connections (socketpairs handed to AddConnection)
// whose bytes and fds the input writes, torn anywhere, with small limits so
// that fds over the frame and uid limits, queued-bytes limits (replies of
// up to 60 KiB that the client reads only when told), requests held in
// flight and connections closed under them are all reached. After every
// step the server's own accounting must be sane, and at the end (server
// stopped, held requests answered) nothing may be left: no fd held, no byte
// queued, no request counted, and no copy of the fds the clients sent.
//
// Input: byte 0 picks the limits; then steps, each `op` byte (op % 6,
// connection (op >> 3) % 2) and its arguments:
//   0 raw:    n = 1 + b1 % 64 bytes of input, with kFdCounts[b2 % 8] fds
//   1 frame:  a whole frame, type from kTypes[b1 % 6], payload of b2 input
//             bytes (HELLO gets a valid HelloRequest), kFdCounts[b3 % 8] fds;
//             with b1 & 0x80 a HELLO asks for version 2, a RECLAIM_REQUEST
//             is one lease of 1 + b2 % 200 extents announcing
//             1 + (b2 / 200) EXTENT_FDS frames, and ALLOC_REPLY's slot is
//             an EXTENT_FDS frame {lease 1, first_extent b2, count = fds}
//   2 run the event loop      3 the client reads what is there
//   4 answer held requests    5 the client closes its end
#include <fcntl.h>
#include <google/protobuf/stubs/logging.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cxlpool/common/log.h"
#include "cxlpool/proto/codec.h"
#include "cxlpool/proto/ipc.h"
#include "server/server.h"

namespace {

using cxlpool::ConnectionId;
using cxlpool::Reply;
using cxlpool::ReplyFn;
using cxlpool::Request;
namespace proto = cxlpool::proto;
namespace wire = cxlpool::wire;

constexpr size_t kFdCounts[] = {0, 0, 1, 2, 5, 17, 30, 64};
constexpr proto::MsgType kTypes[] = {proto::MSG_HELLO_REQUEST,   proto::MSG_STAT_REQUEST,
                                     proto::MSG_METRICS_REQUEST, proto::MSG_QUOTA_SET_REQUEST,
                                     proto::MSG_RECLAIM_REQUEST, proto::MSG_ALLOC_REPLY};

class Handler : public cxlpool::RequestHandler {
 public:
  void OnConnect(ConnectionId, const cxlpool::PeerInfo&) override { ++connects; }
  void OnDisconnect(ConnectionId) override { ++disconnects; }
  void OnRequest(ConnectionId, Request req, ReplyFn reply) override {
    switch (req.type) {
      case proto::MSG_HELLO_REQUEST: {
        proto::HelloRequest in;
        proto::HelloReply hr;
        hr.set_version(wire::Decode(req.payload, &in).ok() && in.max_version() >= 2 ? 2 : 1);
        return reply(Reply{proto::MSG_HELLO_REPLY, *wire::Encode(hr), {}});
      }
      case proto::MSG_METRICS_REQUEST: {
        // Reply size from the payload's length: up to 60 KiB.
        proto::MetricsReply out;
        out.set_text(std::string(std::min<size_t>(req.payload.size() * 1024, 60 << 10), 'm'));
        return reply(Reply{proto::MSG_METRICS_REPLY, *wire::Encode(out), {}});
      }
      case proto::MSG_QUOTA_SET_REQUEST:
        held.push_back(std::move(reply));
        return;
      default:
        return reply(cxlpool::MakeErrorReply(cxlpool::Status(cxlpool::Code::kUnsupported, "no")));
    }
  }
  void AnswerHeld() {
    std::vector<ReplyFn> h;
    h.swap(held);
    for (auto& r : h) r(Reply{proto::MSG_QUOTA_SET_REPLY, "", {}});
  }
  int connects = 0, disconnects = 0;
  std::vector<ReplyFn> held;
};

// A listening socket in the abstract namespace, for Server::Create (the
// connections themselves come through AddConnection).
int Listener() {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un a = {};
  a.sun_family = AF_UNIX;
  std::string name = "cxlpool-fuzz-server-" + std::to_string(getpid());
  std::memcpy(a.sun_path + 1, name.data(), name.size());
  socklen_t len = static_cast<socklen_t>(offsetof(struct sockaddr_un, sun_path) + 1 + name.size());
  if (bind(fd, reinterpret_cast<struct sockaddr*>(&a), len) != 0 || listen(fd, 4) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

void SendWithFds(int sock, const char* data, size_t len, int fd, size_t nfds) {
  struct iovec iov = {const_cast<char*>(data), len};
  struct msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int) * 64)];
  std::vector<int> fds(nfds, fd);
  if (nfds > 0) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
    struct cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * nfds);
  }
  (void)sendmsg(sock, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
}

void Drain(int sock) {
  char buf[65536];
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int) * 8)];
  for (;;) {
    struct iovec iov = {buf, sizeof buf};
    struct msghdr msg = {};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    if (recvmsg(sock, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC) <= 0) return;
    for (struct cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < n; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
        close(fd);
      }
    }
  }
}

// Runs what is ready. restart() first: an io_context that ran out of work
// (after Stop) is stopped, and would run nothing posted later.
void Poll(boost::asio::io_context& io) {
  io.restart();
  io.poll();
}

void CheckSane(const cxlpool::Server& s) {
  cxlpool::ServerStats st = s.stats();
  const cxlpool::ServerLimits& l = s.options().limits;
  if (st.connections > 2 || st.fds_held > l.max_fds) __builtin_trap();
  // Queues never grow past the limits by more than the error frames of
  // connections being closed.
  if (st.queued_bytes > l.max_queued_bytes + 2 * 1024) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  cxlpool::SetLogLevel(cxlpool::LogLevel::kError);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  cxlpool::SetLogLevel(cxlpool::LogLevel::kError);  // one line per close otherwise
  int probe[2];
  if (pipe2(probe, O_CLOEXEC | O_NONBLOCK) != 0) return 0;
  {
    boost::asio::io_context io;
    Handler handler;
    cxlpool::ServerOptions o;
    o.listen_fd = Listener();
    o.max_frame_bytes = 64 << 10;
    cxlpool::ServerLimits& l = o.limits;
    l.max_request_bytes = 4 << 10;
    l.max_fds_per_uid = (data[0] & 2) ? 24 : 64;
    l.max_fds_per_frame = std::min<uint64_t>((data[0] & 1) ? 16 : 64, l.max_fds_per_uid);
    l.max_fds = 64;
    l.max_queued_bytes_per_connection = (64 << 10) + 256;
    l.max_queued_bytes_per_uid = (data[0] & 4) ? (100 << 10) : (200 << 10);
    l.max_queued_bytes = 200 << 10;
    l.max_requests_per_uid = (data[0] & 16) ? 3 : 16;
    l.max_requests_per_connection =
        std::min<uint64_t>((data[0] & 8) ? 2 : 8, l.max_requests_per_uid);
    l.max_requests = 16;
    auto server = cxlpool::Server::Create(io, o, &handler);
    if (!server.ok()) {
      std::fprintf(stderr, "%s\n", server.status().ToString().c_str());
      __builtin_trap();
    }
    int client[2] = {-1, -1};
    for (int i = 0; i < 2; ++i) {
      int sv[2];
      if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) __builtin_trap();
      int small = 8192;  // so that unread replies queue in the server soon
      setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
      fcntl(sv[0], F_SETFL, O_NONBLOCK);
      client[i] = sv[0];
      auto added = (*server)->AddConnection(cxlpool::UniqueFd(sv[1]));
      if (!added.ok()) {
        std::fprintf(stderr, "%s\n", added.status().ToString().c_str());
        __builtin_trap();
      }
    }
    size_t off = 1;
    auto arg = [&](size_t i) -> uint8_t { return off + i < size ? data[off + i] : 0; };
    while (off < size) {
      const uint8_t op = data[off];
      const int c = (op >> 3) % 2;
      switch (op % 6) {
        case 0: {
          size_t n = std::min<size_t>(1 + arg(1) % 64, size - std::min(size, off + 3));
          if (client[c] >= 0 && n > 0) {
            SendWithFds(client[c], reinterpret_cast<const char*>(data + off + 3), n, probe[1],
                        kFdCounts[arg(2) % 8]);
          }
          off += 3 + n;
          break;
        }
        case 1: {
          size_t n = std::min<size_t>(arg(2), size - std::min(size, off + 4));
          std::string payload(reinterpret_cast<const char*>(data + std::min(size, off + 4)), n);
          proto::MsgType type = kTypes[arg(1) % 6];
          const bool shaped = (arg(1) & 0x80) != 0;
          uint64_t rid = 1 + off;
          if (type == proto::MSG_HELLO_REQUEST) {
            proto::HelloRequest h;
            h.set_min_version(1);
            h.set_max_version(shaped ? 2 : 1);
            payload = *wire::Encode(h);
          } else if (shaped && type == proto::MSG_RECLAIM_REQUEST) {
            proto::ReclaimRequest r;
            proto::LeaseInfo* lease = r.add_leases();
            lease->set_id(1);
            const size_t extents = 1 + arg(2) % 200;
            lease->set_size_bytes(4096 * extents);
            for (size_t i = 0; i < extents; ++i) lease->add_extents()->set_size_bytes(4096);
            r.set_extent_frames(1 + arg(2) / 200);
            payload = *wire::Encode(r);
            rid = 7;
          } else if (shaped && type == proto::MSG_ALLOC_REPLY) {
            type = proto::MSG_EXTENT_FDS;
            proto::ExtentFds m;
            m.set_lease_id(1);
            m.set_first_extent(arg(2));
            m.set_count(static_cast<uint32_t>(kFdCounts[arg(3) % 8]));
            payload = *wire::Encode(m);
            rid = 7;
          }
          std::string frame = wire::EncodeFrame(type, rid, payload);
          if (client[c] >= 0) {
            SendWithFds(client[c], frame.data(), frame.size(), probe[1], kFdCounts[arg(3) % 8]);
          }
          off += 4 + n;
          break;
        }
        case 2:
          Poll(io);
          ++off;
          break;
        case 3:
          if (client[c] >= 0) Drain(client[c]);
          ++off;
          break;
        case 4:
          handler.AnswerHeld();
          ++off;
          break;
        case 5:
          if (client[c] >= 0) close(client[c]);
          client[c] = -1;
          ++off;
          break;
      }
      Poll(io);
      CheckSane(**server);
    }
    (*server)->Stop();
    Poll(io);
    handler.AnswerHeld();
    Poll(io);
    cxlpool::ServerStats st = (*server)->stats();
    if (st.connections != 0 || st.fds_held != 0 || st.queued_bytes != 0 ||
        st.requests_in_flight != 0) {
      __builtin_trap();
    }
    if (handler.connects != handler.disconnects) __builtin_trap();
    server->reset();
    Poll(io);
    for (int fd : client) {
      if (fd >= 0) close(fd);
    }
  }
  // No copy of what the clients sent survives anywhere in the process.
  close(probe[1]);
  char ch;
  if (read(probe[0], &ch, 1) != 0) __builtin_trap();
  close(probe[0]);
  return 0;
}
