// IPC: frames and fds over a connected Unix stream socket.
//
// Rules this layer enforces (docs/protocol.md):
//   * A frame's fds go out with its bytes on ONE sendmsg (SCM_RIGHTS); the
//     kernel attaches them to the frame's first byte.
//   * Receive uses MSG_CMSG_CLOEXEC, checks MSG_CTRUNC, and never reads past
//     the end of the current frame, so fds can only belong to that frame.
//     Fds beyond what the frame may carry (RecvLimits::max_fds, the type's
//     MaxFdsForType once the header is in, the reader's fd allowance) are
//     closed as they arrive, while the frame is still being read: once one
//     is over, every fd of the frame is closed and counted in
//     Frame::fds_dropped, however many sendmsg calls carried them.
//   * Nothing spins on EAGAIN: the non-blocking calls return kWouldBlock and
//     the caller waits for readiness (poll or an event loop); the blocking
//     calls poll(2) with the caller's timeout.
//
// Error codes: PROTOCOL (bad header, oversize, truncated frame, control
// data truncated), UNAVAILABLE (peer closed, timed out), IO (other syscall
// failures).
//
// Thread safety: FrameReader and OutFrame are single-owner values. The free
// functions are safe from any thread, but two threads must not read (or
// write) the same socket at once.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cxlpool/common/status.h"
#include "cxlpool/common/unique_fd.h"
#include "cxlpool/proto/codec.h"
#include "cxlpool/proto/frame.h"

namespace cxlpool::wire {

struct RecvLimits {
  uint32_t max_payload_bytes = kDefaultMaxFrameBytes;
  // Upper bound on fds in one frame (control buffer size); per-type limits
  // (MaxFdsForType) apply below this.
  size_t max_fds = kDefaultMaxFdsPerFrame;
};

// Incremental frame reader over a stream socket. Keeps partial state between
// calls, so it serves both an event loop (timeout 0) and a blocking client.
class FrameReader {
 public:
  enum class Progress {
    kFrame,       // a whole frame is ready: TakeFrame()
    kWouldBlock,  // timeout 0 and no more bytes now: wait for readability
    kEof,         // the peer closed between frames (clean)
  };

  explicit FrameReader(RecvLimits limits = {});

  // Reads until a frame is complete, the socket would block (timeout_ms ==
  // 0), the timeout passes (UNAVAILABLE), or an error. timeout_ms < 0 waits
  // forever. After a non-OK result the stream is unusable, except that
  // header() still shows what was decoded (for an error reply's request id);
  // after a bad header the reader holds no fd of the frame.
  // PROTOCOL: header invalid (see ValidateFrameHeader), EOF mid-frame.
  Result<Progress> Read(int sock, int timeout_ms);

  // The frame completed by the last kFrame result; resets for the next one.
  Frame TakeFrame();

  // True if some, but not all, bytes of a frame have arrived.
  bool mid_frame() const { return got_ > 0; }
  // At most `n` fds for the current frame and the next ones (below
  // RecvLimits::max_fds and the type's limit); one more and the frame's fds
  // are all closed at once. A server sets it from its fd budget before each
  // Read. Default: no allowance beyond the limits.
  void set_fd_allowance(size_t n) { fd_allowance_ = n; }
  // Fds of the current frame held now, and fds of it closed on arrival
  // (non-zero: the frame will come out with fds_dropped, and no fd).
  size_t fds_held() const { return frame_.fds.size(); }
  size_t fds_refused() const { return fds_refused_; }
  // MSG_CTRUNC was seen for the current frame (the kernel had more fds than
  // the control buffer holds).
  bool control_truncated() const { return ctrunc_; }
  // True once the current frame's header is complete.
  bool have_header() const { return have_header_; }
  const FrameHeader& header() const { return frame_.header; }
  const RecvLimits& limits() const { return limits_; }

 private:
  // One recvmsg of at most what the current section still needs.
  // Returns bytes read, 0 on EOF, -1 with errno on failure.
  ssize_t RecvOnce(int sock, void* buf, size_t len);
  void TakeFds(std::vector<int>& fds);
  // Closes every fd of the frame once one is over the limit in force.
  void EnforceFdLimit();

  RecvLimits limits_;
  Frame frame_;
  uint8_t header_buf_[kFrameHeaderSize] = {};
  size_t got_ = 0;  // bytes of the current frame (header + payload) read so far
  bool have_header_ = false;
  bool ctrunc_ = false;
  size_t fd_allowance_ = SIZE_MAX;
  size_t fds_refused_ = 0;
};

// One outgoing frame that owns its bytes and its fds (dup'ed), so it can sit
// in a send queue after the caller's fds are gone.
struct OutFrame {
  std::string bytes;          // header + payload
  std::vector<UniqueFd> fds;  // sent with the first byte
  size_t sent = 0;            // bytes already written

  bool done() const { return sent == bytes.size(); }
};

// Builds an OutFrame written in `version`, duplicating `fds`
// (F_DUPFD_CLOEXEC). IO if a dup fails (EMFILE); INVALID_ARGUMENT if there
// are more than kHardMaxFdsPerFrame.
Result<OutFrame> MakeOutFrame(proto::MsgType type, uint64_t request_id, std::string_view payload,
                              std::span<const int> fds, uint16_t version = kMaxWireVersion);

// Adds duplicates (F_DUPFD_CLOEXEC) of `fds` to f->fds, all or none. IO if
// a dup fails (EMFILE).
Status KeepFds(OutFrame* f, std::span<const int> fds);

// Non-blocking: writes as much of `f` as the socket takes now (MSG_DONTWAIT,
// MSG_NOSIGNAL). Returns true when the frame is fully sent, false if the
// socket is full (wait for writability and call again). UNAVAILABLE if the
// peer is gone (EPIPE/ECONNRESET), IO otherwise. `borrowed_fds` (still the
// caller's, never closed here) ride with the first byte after f->fds, so a
// frame sent at once needs no duplicates; if nothing was sent (f->sent is
// still 0) and the frame must wait, KeepFds them first.
Result<bool> SendSome(int sock, OutFrame* f, std::span<const int> borrowed_fds = {});

// Blocking: sends one frame written in `version` and its fds (borrowed; not
// closed), waiting up to timeout_ms (< 0: forever) for buffer space. The fds
// ride on the first sendmsg. INVALID_ARGUMENT if the payload exceeds
// kHardMaxFrameBytes or there are too many fds; UNAVAILABLE (peer gone or
// timeout); IO.
Status SendFrame(int sock, proto::MsgType type, uint64_t request_id, std::string_view payload,
                 std::span<const int> fds = {}, int timeout_ms = -1,
                 uint16_t version = kMaxWireVersion);

// Blocking: sends `msg` typed by TypeOf(msg).
template <typename M>
Status SendMessage(int sock, const M& msg, uint64_t request_id, std::span<const int> fds = {},
                   int timeout_ms = -1, uint16_t version = kMaxWireVersion) {
  Result<std::string> payload = Encode(msg);
  if (!payload.ok()) return payload.status();
  return SendFrame(sock, TypeOf<M>(), request_id, *payload, fds, timeout_ms, version);
}

// Blocking: receives one whole frame, waiting up to timeout_ms (< 0: forever)
// for all of it. UNAVAILABLE if the peer closed before the frame began or the
// timeout passed; PROTOCOL for a bad header or a frame cut short. A frame
// whose extra fds were closed is returned with fds_dropped > 0 (DecodeReply
// turns that into PROTOCOL).
Result<Frame> RecvFrame(int sock, const RecvLimits& limits = {}, int timeout_ms = -1);

}  // namespace cxlpool::wire
