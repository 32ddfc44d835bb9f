#include "cxlpool/proto/ipc.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <chrono>
#include <cstring>

namespace cxlpool::wire {
namespace {

constexpr size_t kPayloadChunk = 64 * 1024;  // grow the payload buffer as bytes arrive

using SteadyClock = std::chrono::steady_clock;

// Milliseconds left until `deadline` (>= 0), or -1 for "forever".
int RemainingMs(bool has_deadline, SteadyClock::time_point deadline) {
  if (!has_deadline) return -1;
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now());
  return static_cast<int>(std::max<int64_t>(0, left.count()));
}

// Waits for `events` on `sock`. OK when ready (or hung up: the next syscall
// reports it), UNAVAILABLE on timeout, IO on poll failure.
Status WaitFor(int sock, short events, bool has_deadline, SteadyClock::time_point deadline,
               const char* what) {
  for (;;) {
    int ms = RemainingMs(has_deadline, deadline);
    struct pollfd p = {sock, events, 0};
    int r = ::poll(&p, 1, ms);
    if (r > 0) return Status::Ok();
    if (r == 0) return Status(Code::kUnavailable, std::string("timed out waiting to ") + what);
    if (errno != EINTR) return Status::FromErrno(errno, std::string("poll to ") + what);
  }
}

Status SendErrno(int err) {
  if (err == EPIPE || err == ECONNRESET || err == ENOTCONN) {
    return Status(Code::kUnavailable,
                  std::string("peer closed the connection (sendmsg: ") + std::strerror(err) + ")");
  }
  return Status::FromErrno(err, "sendmsg");
}

// One sendmsg; fds (if any) go in an SCM_RIGHTS control message.
ssize_t SendChunk(int sock, struct iovec* iov, int iovcnt, std::span<const int> fds) {
  struct msghdr msg = {};
  msg.msg_iov = iov;
  msg.msg_iovlen = static_cast<size_t>(iovcnt);
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int) * kHardMaxFdsPerFrame)];
  if (!fds.empty()) {
    size_t len = sizeof(int) * fds.size();
    std::memset(control, 0, CMSG_SPACE(len));
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(len);
    struct cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(len);
    std::memcpy(CMSG_DATA(c), fds.data(), len);
  }
  ssize_t n;
  do {
    n = ::sendmsg(sock, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  return n;
}

}  // namespace

FrameReader::FrameReader(RecvLimits limits) : limits_(limits) {
  limits_.max_fds = std::min(limits_.max_fds, kHardMaxFdsPerFrame);
}

void FrameReader::TakeFds(std::vector<int>& fds) {
  for (int fd : fds) frame_.fds.emplace_back(fd);
  fds.clear();
}

void FrameReader::EnforceFdLimit() {
  size_t limit = std::min(limits_.max_fds, fd_allowance_);
  if (have_header_) {
    limit =
        std::min(limit, MaxFdsForType(frame_.header.type, limits_.max_fds, frame_.header.version));
  }
  if (fds_refused_ == 0 && !ctrunc_ && frame_.fds.size() <= limit) return;
  // Over: nothing of this frame is kept, now or when more fds arrive.
  fds_refused_ += frame_.fds.size();
  frame_.fds.clear();
}

ssize_t FrameReader::RecvOnce(int sock, void* buf, size_t len) {
  struct iovec iov = {buf, len};
  struct msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  // Room for the allowed fds plus one, so an excess is seen as fds (closed
  // below) rather than only as MSG_CTRUNC.
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int) * (kHardMaxFdsPerFrame + 1))];
  msg.msg_control = control;
  msg.msg_controllen = CMSG_SPACE(sizeof(int) * (limits_.max_fds + 1));
  ssize_t n;
  do {
    n = ::recvmsg(sock, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return n;
  std::vector<int> fds;
  for (struct cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      const unsigned char* data = CMSG_DATA(c);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, data + i * sizeof(int), sizeof(int));
        fds.push_back(fd);
      }
    }
  }
  // Ownership first: every fd received is now closed exactly once, by the
  // frame or here, at once, when it is one too many.
  TakeFds(fds);
  if ((msg.msg_flags & MSG_CTRUNC) && !ctrunc_) {
    ctrunc_ = true;
    ++fds_refused_;  // at least one fd the kernel could not hand over
  }
  EnforceFdLimit();
  return n;
}

Result<FrameReader::Progress> FrameReader::Read(int sock, int timeout_ms) {
  const bool has_deadline = timeout_ms > 0;
  const SteadyClock::time_point deadline =
      SteadyClock::now() + std::chrono::milliseconds(std::max(timeout_ms, 0));
  for (;;) {
    if (have_header_ && got_ == kFrameHeaderSize + frame_.header.length) {
      // Frame complete; its fds were judged as they arrived.
      frame_.fds_dropped = fds_refused_;
      return Progress::kFrame;
    }
    void* buf;
    size_t need;
    if (!have_header_) {
      buf = header_buf_ + got_;
      need = kFrameHeaderSize - got_;
    } else {
      size_t off = got_ - kFrameHeaderSize;
      size_t want = std::min<size_t>(frame_.header.length, off + kPayloadChunk);
      if (frame_.payload.size() < want) frame_.payload.resize(want);
      buf = frame_.payload.data() + off;
      need = want - off;
    }
    ssize_t n = RecvOnce(sock, buf, need);
    if (n < 0) {
      int err = errno;
      if (err == EAGAIN || err == EWOULDBLOCK) {
        if (timeout_ms == 0) return Progress::kWouldBlock;
        CXLPOOL_RETURN_IF_ERROR(WaitFor(sock, POLLIN, has_deadline, deadline, "receive a frame"));
        continue;
      }
      if (err == ECONNRESET) {
        return Status(Code::kUnavailable, "peer reset the connection");
      }
      return Status::FromErrno(err, "recvmsg");
    }
    if (n == 0) {
      if (got_ == 0) return Progress::kEof;
      size_t total = kFrameHeaderSize + (have_header_ ? frame_.header.length : 0);
      return Status(Code::kProtocol, "truncated frame: peer closed after " + std::to_string(got_) +
                                         " of " + std::to_string(total) + " bytes" +
                                         (have_header_ ? "" : " (header incomplete)"));
    }
    got_ += static_cast<size_t>(n);
    if (!have_header_ && got_ == kFrameHeaderSize) {
      frame_.header = DecodeFrameHeader(std::span<const uint8_t, kFrameHeaderSize>(header_buf_));
      have_header_ = true;
      if (Status st = ValidateFrameHeader(frame_.header, limits_.max_payload_bytes); !st.ok()) {
        frame_.fds.clear();  // the frame is dead: nothing of it is kept
        return st;
      }
      EnforceFdLimit();  // the type's own limit applies from here
    }
  }
}

Frame FrameReader::TakeFrame() {
  Frame out = std::move(frame_);
  frame_ = Frame();
  got_ = 0;
  have_header_ = false;
  ctrunc_ = false;
  fds_refused_ = 0;
  return out;
}

Result<OutFrame> MakeOutFrame(proto::MsgType type, uint64_t request_id, std::string_view payload,
                              std::span<const int> fds, uint16_t version) {
  if (fds.size() > kHardMaxFdsPerFrame) {
    return Status(Code::kInvalidArgument, std::to_string(fds.size()) +
                                              " fds on one frame; the maximum is " +
                                              std::to_string(kHardMaxFdsPerFrame));
  }
  if (payload.size() > kHardMaxFrameBytes) {
    return Status(Code::kInvalidArgument,
                  "payload of " + std::to_string(payload.size()) + " bytes is over the hard limit");
  }
  OutFrame f;
  CXLPOOL_RETURN_IF_ERROR(KeepFds(&f, fds));
  f.bytes = EncodeFrame(type, request_id, payload, version);
  return f;
}

Status KeepFds(OutFrame* f, std::span<const int> fds) {
  std::vector<UniqueFd> kept;
  kept.reserve(fds.size());
  for (int fd : fds) {
    int d = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (d < 0) return Status::FromErrno(errno, "dup fd " + std::to_string(fd) + " for sending");
    kept.emplace_back(d);
  }
  for (UniqueFd& fd : kept) f->fds.push_back(std::move(fd));
  return Status::Ok();
}

Result<bool> SendSome(int sock, OutFrame* f, std::span<const int> borrowed_fds) {
  while (!f->done()) {
    struct iovec iov = {f->bytes.data() + f->sent, f->bytes.size() - f->sent};
    std::vector<int> raw;
    if (f->sent == 0) {
      raw.reserve(f->fds.size() + borrowed_fds.size());
      for (const UniqueFd& fd : f->fds) raw.push_back(fd.get());
      raw.insert(raw.end(), borrowed_fds.begin(), borrowed_fds.end());
    }
    ssize_t n = SendChunk(sock, &iov, 1, raw);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
      return SendErrno(errno);
    }
    // The kernel took the fds with the first byte; our copies can go.
    if (f->sent == 0) f->fds.clear();
    f->sent += static_cast<size_t>(n);
  }
  return true;
}

Status SendFrame(int sock, proto::MsgType type, uint64_t request_id, std::string_view payload,
                 std::span<const int> fds, int timeout_ms, uint16_t version) {
  if (fds.size() > kHardMaxFdsPerFrame) {
    return Status(Code::kInvalidArgument, std::to_string(fds.size()) +
                                              " fds on one frame; the maximum is " +
                                              std::to_string(kHardMaxFdsPerFrame));
  }
  if (payload.size() > kHardMaxFrameBytes) {
    return Status(Code::kInvalidArgument,
                  "payload of " + std::to_string(payload.size()) + " bytes is over the hard limit");
  }
  FrameHeader h;
  h.version = version;
  h.type = static_cast<uint16_t>(type);
  h.length = static_cast<uint32_t>(payload.size());
  h.request_id = request_id;
  uint8_t header[kFrameHeaderSize];
  EncodeFrameHeader(h, std::span<uint8_t, kFrameHeaderSize>(header));

  const bool has_deadline = timeout_ms >= 0;
  const SteadyClock::time_point deadline =
      SteadyClock::now() + std::chrono::milliseconds(std::max(timeout_ms, 0));
  const size_t total = kFrameHeaderSize + payload.size();
  size_t sent = 0;
  while (sent < total) {
    struct iovec iov[2];
    int iovcnt = 0;
    if (sent < kFrameHeaderSize) {
      iov[iovcnt++] = {header + sent, kFrameHeaderSize - sent};
      if (!payload.empty()) iov[iovcnt++] = {const_cast<char*>(payload.data()), payload.size()};
    } else {
      size_t off = sent - kFrameHeaderSize;
      iov[iovcnt++] = {const_cast<char*>(payload.data()) + off, payload.size() - off};
    }
    ssize_t n = SendChunk(sock, iov, iovcnt, sent == 0 ? fds : std::span<const int>());
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        CXLPOOL_RETURN_IF_ERROR(WaitFor(sock, POLLOUT, has_deadline, deadline, "send a frame"));
        continue;
      }
      return SendErrno(errno);
    }
    sent += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Result<Frame> RecvFrame(int sock, const RecvLimits& limits, int timeout_ms) {
  FrameReader reader(limits);
  // Read() treats 0 as "do not wait"; a blocking caller asking for 0 gets 1 ms.
  Result<FrameReader::Progress> p = reader.Read(sock, timeout_ms == 0 ? 1 : timeout_ms);
  if (!p.ok()) return p.status();
  switch (*p) {
    case FrameReader::Progress::kFrame:
      return reader.TakeFrame();
    case FrameReader::Progress::kEof:
      return Status(Code::kUnavailable, "peer closed the connection");
    case FrameReader::Progress::kWouldBlock:
      break;
  }
  return Status(Code::kUnavailable, "timed out waiting for a frame");
}

}  // namespace cxlpool::wire
