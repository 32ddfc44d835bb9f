// Fuzz target: the frame decoder. The input is written in small chunks into
// one end of a socketpair and read back with FrameReader (the same code the
// daemon and the client use), so torn headers, bad magic/version/length and
// truncated payloads all reach it. Each complete frame's payload is then
// decoded as the message its header names. Nothing may crash or leak an fd.
//
// Input: byte 0 picks the chunk size (1 + b % 64). With its high bit set,
// fds ride along too: byte 1 sets the reader's fd allowance (b % 80; 64 and
// up: none below the limits), and each chunk starts with a byte that picks
// how many copies of a pipe's write end go with it on one sendmsg (0, 0, 1,
// 2, 5, 30, 64, 100). The reader must never hold more fds than the frame
// may carry (closing the excess as it arrives, across chunks), a frame must
// come out with no more than its type allows, and once everything is closed
// no copy of the pipe's write end may be left (its read end sees EOF).
#include <fcntl.h>
#include <google/protobuf/stubs/logging.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cxlpool.pb.h"
#include "cxlpool/proto/codec.h"
#include "cxlpool/proto/ipc.h"

namespace {

template <typename M>
void TryDecode(const std::string& payload) {
  M m;
  (void)cxlpool::wire::Decode(payload, &m);
}

void DecodeAs(uint16_t type, const std::string& payload) {
  using namespace cxlpool::proto;
  switch (type) {
    case MSG_HELLO_REQUEST:
      TryDecode<HelloRequest>(payload);
      break;
    case MSG_ALLOC_REQUEST:
      TryDecode<AllocRequest>(payload);
      break;
    case MSG_ALLOC_REPLY:
      TryDecode<AllocReply>(payload);
      break;
    case MSG_EXTENT_FDS:
      TryDecode<ExtentFds>(payload);
      break;
    case MSG_LIST_LEASES_REPLY:
      TryDecode<ListLeasesReply>(payload);
      break;
    case MSG_RECLAIM_REQUEST:
      TryDecode<ReclaimRequest>(payload);
      break;
    case MSG_QUOTA_SET_REQUEST:
      TryDecode<QuotaSetRequest>(payload);
      break;
    case MSG_STATS_REPLY:
      TryDecode<StatsReply>(payload);
      break;
    case MSG_ERROR_REPLY: {
      ErrorReply e;
      if (cxlpool::wire::Decode(payload, &e).ok()) (void)cxlpool::wire::FromErrorReply(e);
      break;
    }
    default:
      TryDecode<PoolsReply>(payload);
      break;
  }
}

// One sendmsg of `len` bytes with `nfds` copies of `fd`; bytes written.
ssize_t WriteWithFds(int sock, const uint8_t* data, size_t len, int fd, size_t nfds) {
  struct iovec iov = {const_cast<uint8_t*>(data), len};
  struct msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int) * 128)];
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
  return sendmsg(sock, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
}

}  // namespace

// Protobuf logs every invalid UTF-8 string it meets; silence it so the
// fuzzer's own output stays readable.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return 0;
  fcntl(sv[0], F_SETFL, O_NONBLOCK);
  fcntl(sv[1], F_SETFL, O_NONBLOCK);
  cxlpool::wire::RecvLimits limits;
  limits.max_payload_bytes = 1u << 16;
  cxlpool::wire::FrameReader reader(limits);
  size_t off = 0;
  bool broken = false;
  // The first byte picks the chunk size, so the fuzzer controls tearing.
  size_t chunk = size > 0 ? 1 + data[0] % 64 : 1;
  const bool with_fds = size > 1 && (data[0] & 0x80) != 0;
  size_t allowance = SIZE_MAX;
  int probe[2] = {-1, -1};
  if (with_fds) {
    if (pipe2(probe, O_CLOEXEC | O_NONBLOCK) != 0) {
      close(sv[0]);
      close(sv[1]);
      return 0;
    }
    allowance = data[1] % 80;
    if (allowance >= limits.max_fds) allowance = SIZE_MAX;
    reader.set_fd_allowance(allowance);
    off = 2;
  }
  static constexpr size_t kFdCounts[] = {0, 0, 1, 2, 5, 30, 64, 100};
  const size_t cap = std::min(limits.max_fds, allowance);
  while (!broken) {
    if (off < size) {
      size_t nfds = 0;
      if (with_fds) nfds = kFdCounts[data[off++] % 8];
      size_t n = std::min(chunk, size - off);
      ssize_t w = n == 0 ? 0 : WriteWithFds(sv[0], data + off, n, probe[1], nfds);
      if (w > 0) off += static_cast<size_t>(w);
    } else if (sv[0] >= 0) {
      close(sv[0]);  // EOF: a frame cut short must be PROTOCOL, not a hang
      sv[0] = -1;
    }
    for (;;) {
      auto r = reader.Read(sv[1], 0);
      // Never more fds held than the frame may carry, whatever came in.
      size_t held_cap = cap;
      if (reader.have_header()) {
        held_cap =
            std::min(held_cap, cxlpool::wire::MaxFdsForType(reader.header().type, limits.max_fds,
                                                            reader.header().version));
      }
      if (reader.fds_held() > held_cap) __builtin_trap();
      if (reader.fds_refused() > 0 && reader.fds_held() != 0) __builtin_trap();
      if (!r.ok()) {
        broken = true;
        break;
      }
      if (*r == cxlpool::wire::FrameReader::Progress::kFrame) {
        cxlpool::wire::Frame f = reader.TakeFrame();
        if (f.payload.size() != f.header.length) __builtin_trap();
        if (f.fds.size() >
            std::min(cap, cxlpool::wire::MaxFdsForType(f.header.type, 64, f.header.version)))
          __builtin_trap();
        if (f.fds_dropped > 0 && !f.fds.empty()) __builtin_trap();
        DecodeAs(f.header.type, f.payload);
        continue;
      }
      if (*r == cxlpool::wire::FrameReader::Progress::kEof) broken = true;
      break;
    }
    if (sv[0] < 0 && !broken) {
      // Writer closed and the reader wants more: it must not block forever.
      // The kernel's EOF can lag the close by a moment when something else
      // briefly holds the socket (seen once in CI, under the sanitizers'
      // own machinery): wait until the socket reports it (POLLIN/POLLHUP, up
      // to 2 s), then the reader must see it too.
      auto r = reader.Read(sv[1], 0);
      if (r.ok() && *r == cxlpool::wire::FrameReader::Progress::kWouldBlock) {
        struct pollfd p = {sv[1], POLLIN, 0};
        if (poll(&p, 1, 2000) == 1) r = reader.Read(sv[1], 0);
        if (r.ok() && *r == cxlpool::wire::FrameReader::Progress::kWouldBlock) __builtin_trap();
      }
      broken = true;
    }
  }
  if (sv[0] >= 0) close(sv[0]);
  close(sv[1]);  // fds still in flight in it are released with it
  reader = cxlpool::wire::FrameReader();
  if (with_fds) {
    // Every copy of the write end is gone: the reader kept none it was sent.
    close(probe[1]);
    char c;
    if (read(probe[0], &c, 1) != 0) __builtin_trap();
    close(probe[0]);
  }
  return 0;
}
