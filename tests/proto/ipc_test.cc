// Frames and fds over socketpairs: fds ride with their frame, unexpected fds
// are closed (also on MSG_CTRUNC), partial and truncated reads, and the
// non-blocking send path.
#include "cxlpool/proto/ipc.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace cxlpool::wire {
namespace {

struct Pair {
  UniqueFd a, b;
};

Pair MakePair() {
  int sv[2];
  EXPECT_EQ(0, ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv));
  return {UniqueFd(sv[0]), UniqueFd(sv[1])};
}

// A pipe whose write end we hand out; ReadEndSeesEof() is true once every
// copy of the write end (ours, in flight, received) is closed.
struct Probe {
  UniqueFd r, w;
  Probe() {
    int p[2];
    EXPECT_EQ(0, ::pipe2(p, O_CLOEXEC | O_NONBLOCK));
    r.Reset(p[0]);
    w.Reset(p[1]);
  }
  bool ReadEndSeesEof() {
    char c;
    return ::read(r.get(), &c, 1) == 0;
  }
};

UniqueFd MemfdWith(const std::string& text) {
  UniqueFd fd(::memfd_create("ipc-test", MFD_CLOEXEC));
  EXPECT_TRUE(fd.valid());
  EXPECT_EQ(static_cast<ssize_t>(text.size()), ::write(fd.get(), text.data(), text.size()));
  return fd;
}

std::string ReadAll(int fd) {
  char buf[256];
  ssize_t n = ::pread(fd, buf, sizeof buf, 0);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

void WriteRaw(int fd, const std::string& bytes) {
  ASSERT_EQ(static_cast<ssize_t>(bytes.size()), ::write(fd, bytes.data(), bytes.size()));
}

TEST(Ipc, FdRidesWithItsFrameAndIsCloexec) {
  Pair p = MakePair();
  UniqueFd mem = MemfdWith("lease bytes");
  int fds[] = {mem.get()};
  proto::AllocReply reply;
  reply.mutable_lease()->set_id(7);
  ASSERT_TRUE(SendMessage(p.a.get(), reply, 99, fds).ok());
  mem.Reset();  // the in-flight copy keeps the file alive

  Result<Frame> f = RecvFrame(p.b.get(), {}, 5000);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->type(), proto::MSG_ALLOC_REPLY);
  EXPECT_EQ(f->request_id(), 99u);
  ASSERT_EQ(f->fds.size(), 1u);
  EXPECT_EQ(f->fds_dropped, 0u);
  EXPECT_EQ(ReadAll(f->fds[0].get()), "lease bytes");
  EXPECT_TRUE(::fcntl(f->fds[0].get(), F_GETFD) & FD_CLOEXEC);
  proto::AllocReply back;
  ASSERT_TRUE(DecodeReply(*f, &back).ok());
  EXPECT_EQ(back.lease().id(), 7u);
}

TEST(Ipc, FdsNeverCrossIntoTheNextFrame) {
  Pair p = MakePair();
  UniqueFd m1 = MemfdWith("first"), m2 = MemfdWith("second");
  int f1[] = {m1.get()}, f2[] = {m2.get()};
  ASSERT_TRUE(SendFrame(p.a.get(), proto::MSG_ALLOC_REPLY, 1, "", f1).ok());
  ASSERT_TRUE(SendFrame(p.a.get(), proto::MSG_ATTACH_REPLY, 2, "xyz", f2).ok());
  Result<Frame> a = RecvFrame(p.b.get(), {}, 5000);
  Result<Frame> b = RecvFrame(p.b.get(), {}, 5000);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->fds.size(), 1u);
  ASSERT_EQ(b->fds.size(), 1u);
  EXPECT_EQ(ReadAll(a->fds[0].get()), "first");
  EXPECT_EQ(ReadAll(b->fds[0].get()), "second");
  EXPECT_EQ(b->payload, "xyz");
}

TEST(Ipc, UnexpectedFdsAreClosed) {
  Pair p = MakePair();
  Probe probe;
  int fds[] = {probe.w.get(), probe.w.get()};
  // STAT_REPLY may carry no fd at all.
  ASSERT_TRUE(SendFrame(p.a.get(), proto::MSG_STAT_REPLY, 5, "", fds).ok());
  probe.w.Reset();
  Result<Frame> f = RecvFrame(p.b.get(), {}, 5000);
  ASSERT_TRUE(f.ok());
  EXPECT_TRUE(f->fds.empty());
  EXPECT_EQ(f->fds_dropped, 2u);
  EXPECT_TRUE(probe.ReadEndSeesEof());  // no copy of the write end survives
  proto::StatReply out;
  EXPECT_EQ(DecodeReply(*f, &out).code(), Code::kProtocol);
}

bool SendAll(int fd, const std::string& bytes) {
  return ::write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size());
}

// Sends byte `off` of `frame` alone, with `n` copies of `fd`.
void SendByteWithFds(int sock, const std::string& frame, size_t off, int fd, size_t n) {
  struct iovec iov = {const_cast<char*>(frame.data()) + off, 1};
  struct msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int) * 64)];
  std::vector<int> fds(n, fd);
  msg.msg_control = control;
  msg.msg_controllen = CMSG_SPACE(sizeof(int) * n);
  struct cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * n);
  std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * n);
  ASSERT_EQ(::sendmsg(sock, &msg, MSG_NOSIGNAL), 1);
}

TEST(Ipc, FdsOverTheLimitAreClosedAsTheyArriveAcrossPartialReads) {
  Pair p = MakePair();
  Probe probe;
  std::string frame = EncodeFrame(proto::MSG_RECLAIM_REQUEST, 8, std::string(100, '\0'));
  RecvLimits limits;
  limits.max_fds = 8;
  FrameReader reader(limits);
  // 5 fds with each of the first bytes: 5 held, then 10 > 8 -> all closed,
  // and the ones after are closed on arrival, long before the frame ends.
  SendByteWithFds(p.a.get(), frame, 0, probe.w.get(), 5);
  ASSERT_TRUE(reader.Read(p.b.get(), 0).ok());
  EXPECT_EQ(reader.fds_held(), 5u);
  EXPECT_EQ(reader.fds_refused(), 0u);
  for (size_t i = 1; i < 20; ++i) {
    SendByteWithFds(p.a.get(), frame, i, probe.w.get(), 5);
    Result<FrameReader::Progress> r = reader.Read(p.b.get(), 0);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(*r, FrameReader::Progress::kWouldBlock);
    EXPECT_EQ(reader.fds_held(), 0u) << "after byte " << i;
  }
  EXPECT_EQ(reader.fds_refused(), 100u);
  probe.w.Reset();
  EXPECT_TRUE(probe.ReadEndSeesEof()) << "the reader kept an fd of a frame over its limit";
  // The rest of the frame: it comes out failed, with no fd.
  ASSERT_TRUE(SendAll(p.a.get(), frame.substr(20)));
  Result<FrameReader::Progress> r = reader.Read(p.b.get(), 1000);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(*r, FrameReader::Progress::kFrame);
  Frame f = reader.TakeFrame();
  EXPECT_TRUE(f.fds.empty());
  EXPECT_EQ(f.fds_dropped, 100u);
}

TEST(Ipc, FdAllowanceAndTypeLimitApplyMidFrame) {
  Pair p = MakePair();
  Probe probe;
  FrameReader reader;
  reader.set_fd_allowance(3);
  std::string reclaim = EncodeFrame(proto::MSG_RECLAIM_REQUEST, 1, "xy");
  SendByteWithFds(p.a.get(), reclaim, 0, probe.w.get(), 3);
  ASSERT_TRUE(reader.Read(p.b.get(), 0).ok());
  EXPECT_EQ(reader.fds_held(), 3u);  // at the allowance: kept
  SendByteWithFds(p.a.get(), reclaim, 1, probe.w.get(), 1);
  ASSERT_TRUE(reader.Read(p.b.get(), 0).ok());
  EXPECT_EQ(reader.fds_held(), 0u);
  EXPECT_EQ(reader.fds_refused(), 4u);
  ASSERT_TRUE(SendAll(p.a.get(), reclaim.substr(2)));
  ASSERT_TRUE(reader.Read(p.b.get(), 1000).ok());
  EXPECT_EQ(reader.TakeFrame().fds_dropped, 4u);
  // A STAT takes none: its fds go the moment its header is in.
  reader.set_fd_allowance(SIZE_MAX);
  std::string stat = EncodeFrame(proto::MSG_STAT_REQUEST, 2, std::string(10, 'z'));
  SendByteWithFds(p.a.get(), stat, 0, probe.w.get(), 2);
  ASSERT_TRUE(reader.Read(p.b.get(), 0).ok());
  EXPECT_EQ(reader.fds_held(), 2u);  // header not in yet
  ASSERT_TRUE(SendAll(p.a.get(), stat.substr(1, 23)));
  ASSERT_TRUE(reader.Read(p.b.get(), 0).ok());
  EXPECT_TRUE(reader.have_header());
  EXPECT_EQ(reader.fds_held(), 0u);
  EXPECT_EQ(reader.fds_refused(), 2u);
  probe.w.Reset();
  EXPECT_TRUE(probe.ReadEndSeesEof());
}

TEST(Ipc, ControlTruncationClosesEverything) {
  Pair p = MakePair();
  Probe probe;
  std::vector<int> fds(6, probe.w.get());
  ASSERT_TRUE(SendFrame(p.a.get(), proto::MSG_RECLAIM_REQUEST, 3, "", fds).ok());
  probe.w.Reset();
  RecvLimits limits;
  limits.max_fds = 2;  // control buffer for 3: the kernel sets MSG_CTRUNC
  Result<Frame> f = RecvFrame(p.b.get(), limits, 5000);
  ASSERT_TRUE(f.ok());
  EXPECT_TRUE(f->fds.empty());
  EXPECT_GT(f->fds_dropped, 0u);
  EXPECT_TRUE(probe.ReadEndSeesEof());
}

TEST(Ipc, PartialFrameWaitsThenCompletes) {
  Pair p = MakePair();
  std::string frame = EncodeFrame(proto::MSG_STATS_REQUEST, 11, "payload!");
  FrameReader reader;
  WriteRaw(p.a.get(), frame.substr(0, 10));
  Result<FrameReader::Progress> r = reader.Read(p.b.get(), 0);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, FrameReader::Progress::kWouldBlock);
  EXPECT_TRUE(reader.mid_frame());
  EXPECT_FALSE(reader.have_header());
  WriteRaw(p.a.get(), frame.substr(10, 20));
  r = reader.Read(p.b.get(), 0);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, FrameReader::Progress::kWouldBlock);
  EXPECT_TRUE(reader.have_header());
  WriteRaw(p.a.get(), frame.substr(30));
  r = reader.Read(p.b.get(), 0);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(*r, FrameReader::Progress::kFrame);
  Frame f = reader.TakeFrame();
  EXPECT_EQ(f.payload, "payload!");
  EXPECT_EQ(f.request_id(), 11u);
  EXPECT_FALSE(reader.mid_frame());
}

TEST(Ipc, TruncatedFrameIsProtocolErrorAndCleanEofIsNot) {
  Pair p = MakePair();
  std::string frame = EncodeFrame(proto::MSG_STATS_REQUEST, 1, std::string(100, 'x'));
  WriteRaw(p.a.get(), frame.substr(0, 40));
  ::shutdown(p.a.get(), SHUT_WR);
  Result<Frame> f = RecvFrame(p.b.get(), {}, 5000);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), Code::kProtocol);
  EXPECT_NE(f.status().message().find("truncated"), std::string::npos);

  Pair q = MakePair();
  ::shutdown(q.a.get(), SHUT_WR);
  FrameReader reader;
  Result<FrameReader::Progress> r = reader.Read(q.b.get(), -1);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, FrameReader::Progress::kEof);
  Result<Frame> g = RecvFrame(q.b.get(), {}, 5000);
  EXPECT_EQ(g.status().code(), Code::kUnavailable);
}

TEST(Ipc, OversizeAndGarbageHeadersFailBeforeThePayload) {
  Pair p = MakePair();
  RecvLimits limits;
  limits.max_payload_bytes = 1000;
  FrameHeader h;
  h.type = proto::MSG_STATS_REQUEST;
  h.length = 1001;
  h.request_id = 77;
  uint8_t b[kFrameHeaderSize];
  EncodeFrameHeader(h, std::span<uint8_t, kFrameHeaderSize>(b));
  ASSERT_EQ(static_cast<ssize_t>(sizeof b), ::write(p.a.get(), b, sizeof b));
  FrameReader reader(limits);
  Result<FrameReader::Progress> r = reader.Read(p.b.get(), 5000);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kProtocol);
  EXPECT_EQ(reader.header().request_id, 77u);  // for the error reply

  WriteRaw(p.a.get(), "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  Result<Frame> g = RecvFrame(p.b.get(), limits, 5000);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("magic"), std::string::npos);
}

TEST(Ipc, BlockingReceiveTimesOut) {
  Pair p = MakePair();
  Result<Frame> f = RecvFrame(p.b.get(), {}, 20);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), Code::kUnavailable);
}

TEST(Ipc, LargeFrameCrossesManyPartialWritesAndReads) {
  Pair p = MakePair();
  int small = 4096;
  ::setsockopt(p.a.get(), SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
  std::string payload(kDefaultMaxFrameBytes, '\0');
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>(i * 31);
  UniqueFd mem = MemfdWith("big");
  Status send_status;
  std::thread sender([&] {
    int fds[] = {mem.get()};
    send_status = SendFrame(p.a.get(), proto::MSG_ALLOC_REPLY, 3, payload, fds, 10000);
  });
  Result<Frame> f = RecvFrame(p.b.get(), {}, 10000);
  sender.join();
  ASSERT_TRUE(send_status.ok()) << send_status.ToString();
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->payload, payload);
  ASSERT_EQ(f->fds.size(), 1u);
  EXPECT_EQ(ReadAll(f->fds[0].get()), "big");
}

TEST(Ipc, NonBlockingSendQueuesOwnedFdCopies) {
  Pair p = MakePair();
  int small = 4096;
  ::setsockopt(p.a.get(), SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
  // Fill the socket so the next frame cannot go out at once.
  std::string filler(1 << 20, 'f');
  ssize_t n = ::send(p.a.get(), filler.data(), filler.size(), MSG_DONTWAIT);
  ASSERT_GT(n, 0);
  UniqueFd mem = MemfdWith("queued");
  int fds[] = {mem.get()};
  Result<OutFrame> of = MakeOutFrame(proto::MSG_ALLOC_REPLY, 8, std::string(300000, 'p'), fds);
  ASSERT_TRUE(of.ok());
  mem.Reset();  // the caller's fd is gone; the frame owns a dup
  Result<bool> done = SendSome(p.a.get(), &*of);
  ASSERT_TRUE(done.ok());
  EXPECT_FALSE(*done);  // socket full: would block, no spinning

  // Drain the filler, then finish sending while the reader consumes.
  std::string sink(static_cast<size_t>(n), '\0');
  size_t got = 0;
  while (got < sink.size()) {
    ssize_t r = ::read(p.b.get(), sink.data() + got, sink.size() - got);
    ASSERT_GT(r, 0);
    got += static_cast<size_t>(r);
  }
  std::thread reader_thread;
  Result<Frame> f = Status(Code::kInternal, "unset");
  reader_thread = std::thread([&] { f = RecvFrame(p.b.get(), {}, 10000); });
  while (true) {
    done = SendSome(p.a.get(), &*of);
    ASSERT_TRUE(done.ok());
    if (*done) break;
    struct pollfd pfd = {p.a.get(), POLLOUT, 0};
    ::poll(&pfd, 1, 1000);
  }
  reader_thread.join();
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  ASSERT_EQ(f->fds.size(), 1u);
  EXPECT_EQ(ReadAll(f->fds[0].get()), "queued");
  EXPECT_EQ(f->payload.size(), 300000u);
}

TEST(Ipc, BorrowedFdsGoWithoutCopiesAndAreKeptWhenTheFrameMustWait) {
  Pair p = MakePair();
  // Room on the socket: the caller's fd goes as it is, and stays the caller's.
  UniqueFd mem = MemfdWith("borrowed");
  int fds[] = {mem.get()};
  Result<OutFrame> of = MakeOutFrame(proto::MSG_ALLOC_REPLY, 9, "x", {});
  ASSERT_TRUE(of.ok());
  Result<bool> done = SendSome(p.a.get(), &*of, fds);
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(*done);
  EXPECT_GE(::fcntl(mem.get(), F_GETFD), 0) << "a borrowed fd is never closed";
  Result<Frame> f = RecvFrame(p.b.get(), {}, 1000);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  ASSERT_EQ(f->fds.size(), 1u);
  EXPECT_EQ(ReadAll(f->fds[0].get()), "borrowed");

  // A full socket: nothing goes, so the frame keeps copies before it waits,
  // and the caller may close its own fd.
  int small = 4096;
  ::setsockopt(p.a.get(), SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
  std::string filler(1 << 20, 'f');
  ssize_t n = ::send(p.a.get(), filler.data(), filler.size(), MSG_DONTWAIT);
  ASSERT_GT(n, 0);
  Result<OutFrame> wait = MakeOutFrame(proto::MSG_ALLOC_REPLY, 10, "y", {});
  ASSERT_TRUE(wait.ok());
  done = SendSome(p.a.get(), &*wait, fds);
  ASSERT_TRUE(done.ok());
  ASSERT_FALSE(*done);
  ASSERT_EQ(wait->sent, 0u);
  ASSERT_TRUE(KeepFds(&*wait, fds).ok());
  mem.Reset();
  std::string sink(static_cast<size_t>(n), '\0');
  for (size_t got = 0; got < sink.size();) {
    ssize_t r = ::read(p.b.get(), sink.data() + got, sink.size() - got);
    ASSERT_GT(r, 0);
    got += static_cast<size_t>(r);
  }
  done = SendSome(p.a.get(), &*wait);
  ASSERT_TRUE(done.ok());
  ASSERT_TRUE(*done);
  f = RecvFrame(p.b.get(), {}, 1000);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->request_id(), 10u);
  ASSERT_EQ(f->fds.size(), 1u);
  EXPECT_EQ(ReadAll(f->fds[0].get()), "borrowed");
}

TEST(Ipc, SendToClosedPeerIsUnavailableNotSigpipe) {
  Pair p = MakePair();
  p.b.Reset();
  Status st = SendFrame(p.a.get(), proto::MSG_STATS_REQUEST, 1, "x");
  EXPECT_EQ(st.code(), Code::kUnavailable);
}

}  // namespace
}  // namespace cxlpool::wire
