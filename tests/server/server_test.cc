// The Asio server against real Unix sockets in a temp dir, with a test
// RequestHandler: hello gating, hostile frames (garbage, bad version,
// oversize, truncated, never finished, unknown type, too many fds) each
// followed by a good client that is still served, a non-reading client
// dropped without stalling others, connection floods, pushes, replies from
// other threads, and OnDisconnect exactly once per connection.
#include "server/server.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <thread>

#include "cxlpool/proto/codec.h"
#include "cxlpool/proto/ipc.h"
#include "cxlpool/proto/socket.h"

namespace cxlpool {
namespace {

constexpr int kWaitMs = 10000;  // generous: only a hang would reach it

UniqueFd MemfdWith(const std::string& text) {
  UniqueFd fd(::memfd_create("server-test", MFD_CLOEXEC));
  EXPECT_EQ(static_cast<ssize_t>(text.size()), ::write(fd.get(), text.data(), text.size()));
  return fd;
}

// Records every callback; answers requests the way the tests need.
class TestHandler : public RequestHandler {
 public:
  void OnConnect(ConnectionId conn, const PeerInfo& peer) override {
    std::lock_guard<std::mutex> l(mu_);
    connects_[conn]++;
    peers_[conn] = peer;
    pidfd_valid_[conn] = peer.pidfd >= 0 && ::fcntl(peer.pidfd, F_GETFD) >= 0;
    cv_.notify_all();
  }
  void OnDisconnect(ConnectionId conn) override {
    std::lock_guard<std::mutex> l(mu_);
    disconnects_[conn]++;
    cv_.notify_all();
  }
  void OnRequest(ConnectionId conn, Request req, ReplyFn reply) override {
    switch (req.type) {
      case proto::MSG_HELLO_REQUEST: {
        proto::HelloRequest hello;
        Status st = wire::Decode(req.payload, &hello);
        Result<uint32_t> v = st.ok()
                                 ? wire::NegotiateVersion(hello.min_version(), hello.max_version())
                                 : Result<uint32_t>(st);
        if (!v.ok()) return reply(MakeErrorReply(v.status()));
        proto::HelloReply hr;
        hr.set_version(*v);
        hr.set_server_version("test");
        return reply(Reply{proto::MSG_HELLO_REPLY, *wire::Encode(hr), {}});
      }
      case proto::MSG_STAT_REQUEST: {
        proto::StatRequest sr;
        if (!wire::Decode(req.payload, &sr).ok()) {
          return reply(MakeErrorReply(Status(Code::kInvalidArgument, "bad stat")));
        }
        proto::StatReply out;
        out.mutable_lease()->set_id(sr.lease_id());
        out.mutable_lease()->set_owner_pid(static_cast<uint32_t>(conn));
        return reply(Reply{proto::MSG_STAT_REPLY, *wire::Encode(out), {}});
      }
      case proto::MSG_ALLOC_REQUEST: {
        UniqueFd mem = MemfdWith("leased");
        proto::AllocReply out;
        out.mutable_lease()->set_id(1);
        return reply(Reply{proto::MSG_ALLOC_REPLY, *wire::Encode(out), {mem.get()}});
      }
      case proto::MSG_ATTACH_REQUEST: {
        // Answer from another thread, closing the fd right after.
        std::thread([reply] {
          UniqueFd mem = MemfdWith("from a worker");
          reply(Reply{proto::MSG_ATTACH_REPLY, "", {mem.get()}});
        }).detach();
        return;
      }
      case proto::MSG_METRICS_REQUEST: {
        proto::MetricsReply out;
        out.set_text(std::string(big_reply_bytes_, 'm'));
        return reply(Reply{proto::MSG_METRICS_REPLY, *wire::Encode(out, 64u << 20), {}});
      }
      case proto::MSG_RELEASE_REQUEST:
        return;  // drops the ReplyFn unanswered
      default:
        return reply(MakeErrorReply(Status(Code::kUnsupported, "not in this test")));
    }
  }

  // Waits until `pred` holds (under the lock) or the generous timeout.
  bool WaitFor(const std::function<bool()>& pred) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, std::chrono::milliseconds(kWaitMs), pred);
  }
  bool WaitDisconnects(size_t n) {
    return WaitFor([&] { return disconnects_.size() >= n; });
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<ConnectionId, int> connects_, disconnects_;
  std::map<ConnectionId, PeerInfo> peers_;
  std::map<ConnectionId, bool> pidfd_valid_;
  size_t big_reply_bytes_ = 200 * 1024;
};

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/cxlpool-server-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/cxlpool.sock";
    options_.socket_path = path_;
    options_.read_deadline = std::chrono::milliseconds(5000);
  }

  void Start() {
    Result<std::unique_ptr<Server>> s = Server::Create(io_, options_, &handler_);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(*s);
    work_.emplace(io_.get_executor());
    loop_ = std::thread([this] { io_.run(); });
  }

  void TearDown() override {
    if (server_) {
      OnLoop([&] { server_->Stop(); });
      // OnDisconnect exactly once for every OnConnect, whatever happened.
      std::lock_guard<std::mutex> l(handler_.mu_);
      for (auto& [id, n] : handler_.connects_) {
        EXPECT_EQ(n, 1) << "connection " << id;
        EXPECT_EQ(handler_.disconnects_[id], 1) << "connection " << id;
      }
      EXPECT_EQ(handler_.connects_.size(), handler_.disconnects_.size());
    }
    work_.reset();
    if (loop_.joinable()) {
      io_.stop();
      loop_.join();
    }
    server_.reset();
    std::filesystem::remove_all(dir_);
  }

  // Runs fn on the loop thread and waits for it.
  template <typename F>
  auto OnLoop(F fn) -> decltype(fn()) {
    std::packaged_task<decltype(fn())()> task(std::move(fn));
    auto fut = task.get_future();
    boost::asio::post(io_, [&task] { task(); });
    return fut.get();
  }

  UniqueFd Connect() {
    Result<UniqueFd> fd = wire::ConnectUnix(path_);
    EXPECT_TRUE(fd.ok()) << fd.status().ToString();
    return fd.ok() ? std::move(*fd) : UniqueFd();
  }

  static Result<wire::Frame> Call(int fd, proto::MsgType type, uint64_t rid,
                                  const std::string& payload, std::span<const int> fds = {}) {
    Status st = wire::SendFrame(fd, type, rid, payload, fds, kWaitMs);
    if (!st.ok()) return st;
    return wire::RecvFrame(fd, {}, kWaitMs);
  }

  static Status Hello(int fd, uint32_t min = 1, uint32_t max = wire::kMaxWireVersion) {
    proto::HelloRequest h;
    h.set_min_version(min);
    h.set_max_version(max);
    h.set_client_name("server_test");
    Result<wire::Frame> f = Call(fd, proto::MSG_HELLO_REQUEST, 1, *wire::Encode(h));
    if (!f.ok()) return f.status();
    proto::HelloReply hr;
    CXLPOOL_RETURN_IF_ERROR(wire::DecodeReply(*f, &hr));
    if (f->header.version != wire::kHelloWireVersion) {
      return Status(Code::kInternal,
                    "hello reply written in version " + std::to_string(f->header.version));
    }
    return hr.version() == max ? Status::Ok() : Status(Code::kInternal, "bad version");
  }

  // A fresh, good client: hello, then a stat echo.
  void ExpectGoodClientServed() {
    UniqueFd fd = Connect();
    ASSERT_TRUE(Hello(fd.get()).ok());
    ExpectStatWorks(fd.get(), 4242);
  }

  static void ExpectStatWorks(int fd, uint64_t lease_id) {
    proto::StatRequest sr;
    sr.set_lease_id(lease_id);
    Result<wire::Frame> f = Call(fd, proto::MSG_STAT_REQUEST, lease_id + 1, *wire::Encode(sr));
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    EXPECT_EQ(f->request_id(), lease_id + 1);
    proto::StatReply out;
    Status st = wire::DecodeReply(*f, &out);
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(out.lease().id(), lease_id);
  }

  // The next frame is an ERROR_REPLY with `code`, echoing `rid`.
  static void ExpectError(Result<wire::Frame> f, Code code, uint64_t rid,
                          const std::string& needle = "") {
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    EXPECT_EQ(f->type(), proto::MSG_ERROR_REPLY);
    EXPECT_EQ(f->request_id(), rid);
    proto::ErrorReply e;
    ASSERT_TRUE(wire::Decode(f->payload, &e).ok());
    Status st = wire::FromErrorReply(e);
    EXPECT_EQ(st.code(), code) << st.ToString();
    if (!needle.empty()) {
      EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
    }
  }

  // The server closed the connection: the next read sees EOF.
  static void ExpectClosed(int fd) {
    Result<wire::Frame> f = wire::RecvFrame(fd, {}, kWaitMs);
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.status().code(), Code::kUnavailable) << f.status().ToString();
    EXPECT_EQ(f.status().message().find("timed out"), std::string::npos);
  }

  std::string dir_, path_;
  ServerOptions options_;
  TestHandler handler_;
  boost::asio::io_context io_;
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work_;
  std::thread loop_;
  std::unique_ptr<Server> server_;
};

TEST_F(ServerTest, HelloStatAndPeerCredentials) {
  Start();
  struct stat st;
  ASSERT_EQ(0, ::stat(path_.c_str(), &st));
  EXPECT_EQ(st.st_mode & 07777, 0660u);
  UniqueFd fd = Connect();
  ASSERT_TRUE(Hello(fd.get()).ok());
  ExpectStatWorks(fd.get(), 17);
  std::lock_guard<std::mutex> l(handler_.mu_);
  ASSERT_EQ(handler_.peers_.size(), 1u);
  const auto& [id, peer] = *handler_.peers_.begin();
  EXPECT_EQ(peer.pid, ::getpid());
  EXPECT_EQ(peer.uid, ::getuid());
  EXPECT_EQ(peer.gid, ::getgid());
  EXPECT_TRUE(handler_.pidfd_valid_[id]);
  EXPECT_EQ(peer.comm, "server_test");
  EXPECT_FALSE(peer.cgroup.empty());
}

TEST_F(ServerTest, RequestsBeforeHelloAreRefused) {
  Start();
  UniqueFd fd = Connect();
  proto::StatRequest sr;
  ExpectError(Call(fd.get(), proto::MSG_STAT_REQUEST, 9, *wire::Encode(sr)), Code::kProtocol, 9,
              "HELLO");
  ASSERT_TRUE(Hello(fd.get()).ok());  // the connection is still usable
  ExpectStatWorks(fd.get(), 3);
  // A second hello is refused; the connection keeps serving.
  proto::HelloRequest h;
  h.set_min_version(1);
  h.set_max_version(1);
  ExpectError(Call(fd.get(), proto::MSG_HELLO_REQUEST, 10, *wire::Encode(h)), Code::kProtocol, 10);
  ExpectStatWorks(fd.get(), 4);
}

TEST_F(ServerTest, NoCommonVersionEndsTheConnection) {
  Start();
  UniqueFd fd = Connect();
  Status st = Hello(fd.get(), wire::kMaxWireVersion + 1, wire::kMaxWireVersion + 2);
  EXPECT_EQ(st.code(), Code::kProtocol);
  EXPECT_NE(st.message().find("no common protocol version"), std::string::npos);
  ExpectClosed(fd.get());
  ExpectGoodClientServed();
}

TEST_F(ServerTest, GarbageGetsAnErrorAndIsClosed) {
  Start();
  UniqueFd fd = Connect();
  std::string junk = "GET / HTTP/1.1\r\nHost: cxlpool\r\n\r\n";
  ASSERT_EQ(static_cast<ssize_t>(junk.size()), ::write(fd.get(), junk.data(), junk.size()));
  ExpectError(wire::RecvFrame(fd.get(), {}, kWaitMs), Code::kProtocol, 0, "magic");
  ExpectClosed(fd.get());
  ExpectGoodClientServed();
}

// An old client speaks version 1 only: its version-1 frames are served and
// everything the server writes to it is in version 1; a frame in another
// version on that connection is refused.
TEST_F(ServerTest, AVersionOneClientIsServedInVersionOne) {
  Start();
  UniqueFd fd = Connect();
  proto::HelloRequest h;
  h.set_min_version(1);
  h.set_max_version(1);
  ASSERT_TRUE(
      wire::SendFrame(fd.get(), proto::MSG_HELLO_REQUEST, 1, *wire::Encode(h), {}, kWaitMs, 1)
          .ok());
  Result<wire::Frame> f = wire::RecvFrame(fd.get(), {}, kWaitMs);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->header.version, 1u);
  proto::HelloReply hr;
  ASSERT_TRUE(wire::DecodeReply(*f, &hr).ok());
  EXPECT_EQ(hr.version(), 1u);
  proto::StatRequest sr;
  sr.set_lease_id(8);
  ASSERT_TRUE(
      wire::SendFrame(fd.get(), proto::MSG_STAT_REQUEST, 2, *wire::Encode(sr), {}, kWaitMs, 1)
          .ok());
  f = wire::RecvFrame(fd.get(), {}, kWaitMs);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->header.version, 1u);
  proto::StatReply out;
  ASSERT_TRUE(wire::DecodeReply(*f, &out).ok());
  EXPECT_EQ(out.lease().id(), 8u);
  ASSERT_TRUE(wire::SendFrame(fd.get(), proto::MSG_STAT_REQUEST, 3, *wire::Encode(sr), {}, kWaitMs,
                              wire::kMaxWireVersion)
                  .ok());
  f = wire::RecvFrame(fd.get(), {}, kWaitMs);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->header.version, 1u) << "even the refusal is written in version 1";
  ExpectError(std::move(f), Code::kProtocol, 3, "negotiated 1");
}

TEST_F(ServerTest, BadVersionAndOversizeAreClosed) {
  options_.max_frame_bytes = 4096;
  Start();
  {
    UniqueFd fd = Connect();
    std::string f = wire::EncodeFrame(proto::MSG_HELLO_REQUEST, 5, "", /*version=*/9);
    ASSERT_EQ(static_cast<ssize_t>(f.size()), ::write(fd.get(), f.data(), f.size()));
    ExpectError(wire::RecvFrame(fd.get(), {}, kWaitMs), Code::kProtocol, 5, "version");
    ExpectClosed(fd.get());
  }
  {
    UniqueFd fd = Connect();
    ASSERT_TRUE(Hello(fd.get()).ok());
    wire::FrameHeader h;
    h.type = proto::MSG_STAT_REQUEST;
    h.length = 4097;
    h.request_id = 6;
    uint8_t b[wire::kFrameHeaderSize];
    wire::EncodeFrameHeader(h, std::span<uint8_t, wire::kFrameHeaderSize>(b));
    ASSERT_EQ(static_cast<ssize_t>(sizeof b), ::write(fd.get(), b, sizeof b));
    ExpectError(wire::RecvFrame(fd.get(), {}, kWaitMs), Code::kProtocol, 6, "exceeds");
    ExpectClosed(fd.get());
  }
  ExpectGoodClientServed();
}

TEST_F(ServerTest, TruncatedFrameClosesTheConnection) {
  Start();
  UniqueFd fd = Connect();
  ASSERT_TRUE(Hello(fd.get()).ok());
  std::string f = wire::EncodeFrame(proto::MSG_STAT_REQUEST, 8, std::string(100, '\x08'));
  ASSERT_EQ(40, ::write(fd.get(), f.data(), 40));
  ::shutdown(fd.get(), SHUT_WR);
  ASSERT_TRUE(handler_.WaitDisconnects(1));
  ExpectGoodClientServed();
}

TEST_F(ServerTest, FrameThatNeverFinishesHitsTheReadDeadline) {
  options_.read_deadline = std::chrono::milliseconds(100);
  Start();
  UniqueFd fd = Connect();
  ASSERT_TRUE(Hello(fd.get()).ok());
  std::string f = wire::EncodeFrame(proto::MSG_STAT_REQUEST, 8, "");
  ASSERT_EQ(10, ::write(fd.get(), f.data(), 10));  // never the rest
  ExpectClosed(fd.get());
  ASSERT_TRUE(handler_.WaitDisconnects(1));
  EXPECT_EQ(OnLoop([&] { return server_->stats().dropped_deadline; }), 1u);
  ExpectGoodClientServed();
}

TEST_F(ServerTest, UnknownAndNonRequestTypesAreAnsweredAndServingContinues) {
  Start();
  UniqueFd fd = Connect();
  ASSERT_TRUE(Hello(fd.get()).ok());
  ExpectError(Call(fd.get(), static_cast<proto::MsgType>(555), 31, "abc"), Code::kUnsupported, 31,
              "555");
  ExpectError(Call(fd.get(), proto::MSG_ALLOC_REPLY, 32, ""), Code::kProtocol, 32, "not a request");
  ExpectStatWorks(fd.get(), 33);
}

TEST_F(ServerTest, TooManyFdsAreClosedAndAnswered) {
  Start();
  UniqueFd fd = Connect();
  ASSERT_TRUE(Hello(fd.get()).ok());
  int p[2];
  ASSERT_EQ(0, ::pipe2(p, O_CLOEXEC | O_NONBLOCK));
  UniqueFd r(p[0]), w(p[1]);
  int fds[] = {w.get(), w.get()};
  proto::StatRequest sr;
  ExpectError(Call(fd.get(), proto::MSG_STAT_REQUEST, 40, *wire::Encode(sr), fds), Code::kProtocol,
              40, "fd");
  w.Reset();
  char c;
  EXPECT_EQ(0, ::read(r.get(), &c, 1));  // the server kept no copy
  ExpectStatWorks(fd.get(), 41);
}

TEST_F(ServerTest, ReplyFdsArriveFromTheLoopAndFromWorkers) {
  Start();
  UniqueFd fd = Connect();
  ASSERT_TRUE(Hello(fd.get()).ok());
  proto::AllocRequest ar;
  ar.set_size_bytes(4096);
  Result<wire::Frame> f = Call(fd.get(), proto::MSG_ALLOC_REQUEST, 50, *wire::Encode(ar));
  ASSERT_TRUE(f.ok());
  ASSERT_EQ(f->type(), proto::MSG_ALLOC_REPLY);
  ASSERT_EQ(f->fds.size(), 1u);
  char buf[32] = {};
  EXPECT_EQ(6, ::pread(f->fds[0].get(), buf, sizeof buf, 0));
  EXPECT_STREQ(buf, "leased");
  // Replies sent at once (the fd not duplicated) count like queued ones.
  EXPECT_EQ(OnLoop([&] { return server_->stats().frames_out; }), 2u) << "HELLO and ALLOC";

  proto::AttachRequest at;
  f = Call(fd.get(), proto::MSG_ATTACH_REQUEST, 51, *wire::Encode(at));
  ASSERT_TRUE(f.ok());
  ASSERT_EQ(f->type(), proto::MSG_ATTACH_REPLY);
  EXPECT_EQ(f->request_id(), 51u);
  ASSERT_EQ(f->fds.size(), 1u);
  std::memset(buf, 0, sizeof buf);
  EXPECT_EQ(13, ::pread(f->fds[0].get(), buf, sizeof buf, 0));
  EXPECT_STREQ(buf, "from a worker");
}

TEST_F(ServerTest, DroppedReplyFnStillAnswersInternal) {
  Start();
  UniqueFd fd = Connect();
  ASSERT_TRUE(Hello(fd.get()).ok());
  proto::ReleaseRequest rr;
  ExpectError(Call(fd.get(), proto::MSG_RELEASE_REQUEST, 60, *wire::Encode(rr)), Code::kInternal,
              60, "unanswered");
  ExpectStatWorks(fd.get(), 61);
}

TEST_F(ServerTest, NonReadingClientIsDroppedWithoutStallingOthers) {
  options_.max_frame_bytes = 256u << 10;
  options_.max_send_queue_bytes = 1u << 20;
  options_.max_send_queue_frames = 8;
  Start();
  UniqueFd slow = Connect();
  ASSERT_TRUE(Hello(slow.get()).ok());
  UniqueFd good = Connect();
  ASSERT_TRUE(Hello(good.get()).ok());
  // 200 KiB replies the slow client never reads: its socket buffer fills,
  // then the server's queue, then the server drops it.
  proto::MetricsRequest mr;
  std::string payload = *wire::Encode(mr);
  for (int i = 0; i < 200; ++i) {
    if (!wire::SendFrame(slow.get(), proto::MSG_METRICS_REQUEST, 100 + i, payload, {}, kWaitMs)
             .ok()) {
      break;  // dropped already
    }
  }
  ASSERT_TRUE(handler_.WaitDisconnects(1));
  EXPECT_EQ(OnLoop([&] { return server_->stats().dropped_slow_reader; }), 1u);
  ExpectStatWorks(good.get(), 70);
}

TEST_F(ServerTest, ConnectionFloodIsCappedAndRecovers) {
  options_.max_connections = 3;
  Start();
  std::vector<UniqueFd> held;
  for (int i = 0; i < 3; ++i) {
    held.push_back(Connect());
    ASSERT_TRUE(Hello(held.back().get()).ok());
  }
  UniqueFd extra = Connect();  // the kernel accepts into the backlog...
  ExpectClosed(extra.get());   // ...and the server closes it at once
  EXPECT_EQ(OnLoop([&] { return server_->stats().refused_max_connections; }), 1u);
  held.pop_back();
  ASSERT_TRUE(handler_.WaitDisconnects(1));
  ExpectGoodClientServed();
}

TEST_F(ServerTest, PerUidLimit) {
  options_.max_connections_per_uid = 2;
  Start();
  UniqueFd a = Connect(), b = Connect();
  ASSERT_TRUE(Hello(a.get()).ok());
  ASSERT_TRUE(Hello(b.get()).ok());
  UniqueFd c = Connect();
  ExpectClosed(c.get());
  EXPECT_EQ(OnLoop([&] { return server_->stats().refused_per_uid; }), 1u);
}

TEST_F(ServerTest, PushReachesTheClient) {
  Start();
  UniqueFd fd = Connect();
  ASSERT_TRUE(handler_.WaitFor([&] { return handler_.connects_.size() == 1; }));
  ConnectionId id;
  {
    std::lock_guard<std::mutex> l(handler_.mu_);
    id = handler_.connects_.begin()->first;
  }
  proto::LeaseEvent ev;
  ev.set_lease_id(5);
  ev.set_event("revoked");
  Reply push{proto::MSG_LEASE_EVENT, *wire::Encode(ev), {}};
  EXPECT_EQ(OnLoop([&] { return server_->Push(id, push); }).code(), Code::kUnavailable);
  ASSERT_TRUE(Hello(fd.get()).ok());
  EXPECT_EQ(OnLoop([&] { return server_->NegotiatedVersion(id); }),
            std::optional<uint32_t>(wire::kMaxWireVersion));
  ASSERT_TRUE(OnLoop([&] { return server_->Push(id, push); }).ok());
  EXPECT_EQ(OnLoop([&] { return server_->Push(id + 100, push); }).code(), Code::kNotFound);
  Result<wire::Frame> f = wire::RecvFrame(fd.get(), {}, kWaitMs);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->type(), proto::MSG_LEASE_EVENT);
  EXPECT_EQ(f->request_id(), 0u);
  proto::LeaseEvent back;
  ASSERT_TRUE(wire::DecodeReply(*f, &back).ok());
  EXPECT_EQ(back.event(), "revoked");
}

TEST_F(ServerTest, StopDisconnectsEveryoneAndRemovesTheSocket) {
  Start();
  UniqueFd a = Connect(), b = Connect();
  ASSERT_TRUE(Hello(a.get()).ok());
  ASSERT_TRUE(Hello(b.get()).ok());
  OnLoop([&] { server_->Stop(); });
  EXPECT_FALSE(std::filesystem::exists(path_));
  ExpectClosed(a.get());
  ExpectClosed(b.get());
  std::lock_guard<std::mutex> l(handler_.mu_);
  EXPECT_EQ(handler_.disconnects_.size(), 2u);
}

TEST_F(ServerTest, AdoptedListeningFdAndSocketpairConnection) {
  wire::ListenOptions lo;
  lo.path = path_;
  Result<UniqueFd> l = wire::ListenUnix(lo);
  ASSERT_TRUE(l.ok());
  options_.socket_path.clear();
  options_.listen_fd = l->Release();
  Start();
  EXPECT_EQ(server_->socket_path(), "");
  ExpectGoodClientServed();

  int sv[2];
  ASSERT_EQ(0, ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv));
  UniqueFd mine(sv[0]);
  Result<ConnectionId> id = OnLoop([&] { return server_->AddConnection(UniqueFd(sv[1])); });
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  ASSERT_TRUE(Hello(mine.get()).ok());
  ExpectStatWorks(mine.get(), 90);
}

TEST_F(ServerTest, RefusesToStartOverALiveSocketOrABadFd) {
  Start();
  boost::asio::io_context other;
  TestHandler h2;
  Result<std::unique_ptr<Server>> s = Server::Create(other, options_, &h2);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Code::kAlreadyExists);
  ExpectGoodClientServed();  // the first server is untouched

  ServerOptions bad;
  int p[2];
  ASSERT_EQ(0, ::pipe(p));
  ::close(p[1]);
  bad.listen_fd = p[0];  // owned by Create, even when it fails
  s = Server::Create(other, bad, &h2);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(::fcntl(p[0], F_GETFD), -1);
}

}  // namespace
}  // namespace cxlpool
