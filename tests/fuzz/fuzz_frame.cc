// Fuzz target: the frame decoder. The input is written in small chunks into
// one end of a socketpair and read back with FrameReader (the same code the
// daemon and the client use), so torn headers, bad magic/version/length and
// truncated payloads all reach it. Each complete frame's payload is then
// decoded as the message its header names. Nothing may crash or leak an fd.
#include <fcntl.h>
#include <google/protobuf/stubs/logging.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

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
  while (!broken) {
    if (off < size) {
      size_t n = std::min(chunk, size - off);
      ssize_t w = write(sv[0], data + off, n);
      if (w > 0) off += static_cast<size_t>(w);
    } else if (sv[0] >= 0) {
      close(sv[0]);  // EOF: a frame cut short must be PROTOCOL, not a hang
      sv[0] = -1;
    }
    for (;;) {
      auto r = reader.Read(sv[1], 0);
      if (!r.ok()) {
        broken = true;
        break;
      }
      if (*r == cxlpool::wire::FrameReader::Progress::kFrame) {
        cxlpool::wire::Frame f = reader.TakeFrame();
        if (f.payload.size() != f.header.length) __builtin_trap();
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
  close(sv[1]);
  return 0;
}
