// The Asio server against real Unix sockets in a temp dir, with a test
// RequestHandler: hello gating, hostile frames (garbage, bad version,
// oversize, truncated, never finished, unknown type, too many fds) each
// followed by a good client that is still served, a non-reading client
// dropped without stalling others, connection floods, pushes, replies from
// other threads, and OnDisconnect exactly once per connection. Then every
// limit of server/limits.h: what hitting it looks like to the client (an
// error naming the limit), that the rest keep being served, and its count.
#include "server/server.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <set>
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
      case proto::MSG_POOLS_REQUEST: {
        // A lease reply of three extents, one fd per frame: ALLOC_REPLY and
        // two EXTENT_FDS frames, answered from another thread (the server
        // duplicates every frame's fds before this thread closes them).
        std::thread([reply] {
          UniqueFd e0 = MemfdWith("e0"), e1 = MemfdWith("e1"), e2 = MemfdWith("e2");
          Reply r{proto::MSG_ALLOC_REPLY, "", {e0.get()}};
          r.more.push_back(Reply{proto::MSG_EXTENT_FDS, "", {e1.get()}});
          r.more.push_back(Reply{proto::MSG_EXTENT_FDS, "", {e2.get()}});
          reply(std::move(r));
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
      case proto::MSG_QUOTA_SET_REQUEST: {
        // Kept in flight until the test answers (AnswerHeld).
        std::lock_guard<std::mutex> l(mu_);
        held_.push_back(std::move(reply));
        cv_.notify_all();
        return;
      }
      case proto::MSG_LIST_LEASES_REQUEST: {
        // A big reply, held until the test has all it sent in flight
        // (AnswerLists), then produced off the loop.
        std::lock_guard<std::mutex> l(mu_);
        lists_held_.push_back(std::move(reply));
        cv_.notify_all();
        return;
      }
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
  bool HoldsResources(ConnectionId conn) const override {
    std::lock_guard<std::mutex> l(mu_);
    ++holds_asked_[conn];  // the server found it idle, and asks
    cv_.notify_all();
    return holders_.count(conn) > 0;
  }
  // Answers every request held in flight (MSG_QUOTA_SET_REQUEST).
  void AnswerHeld() {
    std::vector<ReplyFn> held;
    {
      std::lock_guard<std::mutex> l(mu_);
      held.swap(held_);
    }
    for (auto& r : held) r(Reply{proto::MSG_QUOTA_SET_REPLY, "", {}});
  }
  // Once `n` MSG_LIST_LEASES_REQUESTs are in flight, answers them from this
  // thread (off the loop) with big replies; false if they never came.
  bool AnswerLists(size_t n) {
    std::vector<ReplyFn> held;
    {
      std::unique_lock<std::mutex> l(mu_);
      if (!cv_.wait_for(l, std::chrono::milliseconds(kWaitMs),
                        [&] { return lists_held_.size() >= n; })) {
        return false;
      }
      held.swap(lists_held_);
    }
    proto::ListLeasesReply out;
    out.add_leases()->set_label(std::string(big_reply_bytes_, 'l'));
    const std::string payload = *wire::Encode(out, 64u << 20);
    for (auto& r : held) r(Reply{proto::MSG_LIST_LEASES_REPLY, payload, {}});
    return true;
  }

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::set<ConnectionId> holders_;
  std::vector<ReplyFn> held_;
  std::vector<ReplyFn> lists_held_;
  mutable std::map<ConnectionId, int> holds_asked_;
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
    options_.limits.frame_timeout = std::chrono::milliseconds(5000);
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

  // Polls `pred` on the loop thread until it holds (bounded).
  bool PollStat(const std::function<bool()>& pred) {
    for (int i = 0; i < kWaitMs / 5; ++i) {
      if (OnLoop([&] { return pred(); })) return true;
      ::usleep(5000);
    }
    return false;
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
    if (!st.ok()) {
      // Refused and closed before the request went out: the reason waits.
      Result<wire::Frame> why = wire::RecvFrame(fd, {}, 100);
      if (why.ok()) return why;
      return st;
    }
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
  options_.limits.max_request_bytes = 4096;
  options_.limits.max_queued_bytes_per_connection = 64 << 10;
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

TEST_F(ServerTest, FrameThatNeverFinishesHitsTheFrameTimeout) {
  options_.limits.frame_timeout = std::chrono::milliseconds(100);
  Start();
  UniqueFd fd = Connect();
  ASSERT_TRUE(Hello(fd.get()).ok());
  std::string f = wire::EncodeFrame(proto::MSG_STAT_REQUEST, 8, "");
  ASSERT_EQ(10, ::write(fd.get(), f.data(), 10));  // never the rest
  ExpectError(wire::RecvFrame(fd.get(), {}, kWaitMs), Code::kUnavailable, 0,
              "limits.frame_timeout");
  ExpectClosed(fd.get());
  ASSERT_TRUE(handler_.WaitDisconnects(1));
  EXPECT_EQ(OnLoop([&] { return server_->stats().hits("frame_timeout"); }), 1u);
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

TEST_F(ServerTest, FdsWhereNoneBelongAreClosedAndTheConnectionToo) {
  Start();
  UniqueFd fd = Connect();
  ASSERT_TRUE(Hello(fd.get()).ok());
  int p[2];
  ASSERT_EQ(0, ::pipe2(p, O_CLOEXEC | O_NONBLOCK));
  UniqueFd r(p[0]), w(p[1]);
  int fds[] = {w.get(), w.get()};
  proto::StatRequest sr;
  ExpectError(Call(fd.get(), proto::MSG_STAT_REQUEST, 40, *wire::Encode(sr), fds), Code::kProtocol,
              40, "may carry no fds");
  w.Reset();
  char c;
  EXPECT_EQ(0, ::read(r.get(), &c, 1));  // the server kept no copy
  ExpectClosed(fd.get());
  ExpectGoodClientServed();
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

TEST_F(ServerTest, AReplysFollowingFramesComeRightBehindItWithTheirFds) {
  Start();
  UniqueFd fd = Connect();
  ASSERT_TRUE(Hello(fd.get()).ok());
  Result<wire::Frame> f = Call(fd.get(), proto::MSG_POOLS_REQUEST, 70, "");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  ASSERT_EQ(f->type(), proto::MSG_ALLOC_REPLY);
  ASSERT_EQ(f->fds.size(), 1u);
  const char* want[] = {"e1", "e2"};
  for (const char* text : want) {
    Result<wire::Frame> next = wire::RecvFrame(fd.get(), {}, kWaitMs);
    ASSERT_TRUE(next.ok()) << next.status().ToString();
    EXPECT_EQ(next->type(), proto::MSG_EXTENT_FDS);
    EXPECT_EQ(next->request_id(), 70u);
    ASSERT_EQ(next->fds.size(), 1u);
    char buf[8] = {};
    EXPECT_EQ(2, ::pread(next->fds[0].get(), buf, sizeof buf, 0));
    EXPECT_STREQ(buf, text);
  }
  // And the connection goes on as before.
  proto::StatRequest sr;
  sr.set_lease_id(5);
  f = Call(fd.get(), proto::MSG_STAT_REQUEST, 71, *wire::Encode(sr));
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->type(), proto::MSG_STAT_REPLY);
  EXPECT_EQ(f->request_id(), 71u);
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
  options_.limits.max_queued_bytes_per_connection = 1u << 20;
  options_.limits.send_timeout = std::chrono::milliseconds(300);
  Start();
  UniqueFd slow = Connect();
  ASSERT_TRUE(Hello(slow.get()).ok());
  UniqueFd good = Connect();
  ASSERT_TRUE(Hello(good.get()).ok());
  // 200 KiB replies the slow client never reads: its socket buffer fills,
  // a reply waits in the server's queue, the server stops reading requests
  // from it, and after send_timeout drops it.
  proto::MetricsRequest mr;
  std::string payload = *wire::Encode(mr);
  for (int i = 0; i < 200; ++i) {
    if (!wire::SendFrame(slow.get(), proto::MSG_METRICS_REQUEST, 100 + i, payload, {}, 1000).ok()) {
      break;  // the server stopped reading (or dropped it already)
    }
  }
  ASSERT_TRUE(PollStat([&] { return server_->stats().hits("send_timeout") == 1; }));
  ExpectStatWorks(good.get(), 70);
  // Reading now (within frame_timeout), the slow client finds its replies
  // up to the one being sent, then the error, then EOF.
  bool named = false;
  for (;;) {
    Result<wire::Frame> f = wire::RecvFrame(slow.get(), {256u << 10, 64}, kWaitMs);
    if (!f.ok()) break;
    if (auto err = wire::ConnectionError(*f)) {
      named = err->message().find("limits.send_timeout") != std::string::npos;
    }
  }
  EXPECT_TRUE(named) << "the dropped client was not told which limit";
  ASSERT_TRUE(handler_.WaitDisconnects(1));
  EXPECT_TRUE(PollStat([&] { return server_->stats().queued_bytes == 0; }));
}

TEST_F(ServerTest, ConnectionFloodIsCappedAndRecovers) {
  options_.limits.max_connections = 3;
  options_.limits.max_connections_per_uid = 3;
  options_.limits.reserved_connections = 0;
  Start();
  std::vector<UniqueFd> held;
  for (int i = 0; i < 3; ++i) {
    held.push_back(Connect());
    ASSERT_TRUE(Hello(held.back().get()).ok());
  }
  UniqueFd extra = Connect();  // the kernel accepts into the backlog...
  // ...and the server says why, then closes it at once.
  ExpectError(wire::RecvFrame(extra.get(), {}, kWaitMs), Code::kResourceExhausted, 0,
              "limits.max_connections");
  ExpectClosed(extra.get());
  EXPECT_EQ(OnLoop([&] { return server_->stats().hits("max_connections"); }), 1u);
  held.pop_back();
  ASSERT_TRUE(handler_.WaitDisconnects(1));
  ExpectGoodClientServed();
}

TEST_F(ServerTest, PerUidLimit) {
  options_.limits.max_connections_per_uid = 2;
  Start();
  UniqueFd a = Connect(), b = Connect();
  ASSERT_TRUE(Hello(a.get()).ok());
  ASSERT_TRUE(Hello(b.get()).ok());
  UniqueFd c = Connect();
  // A client that says HELLO reads the refusal as its answer.
  Status st = Hello(c.get());
  EXPECT_EQ(st.code(), Code::kResourceExhausted) << st.ToString();
  EXPECT_NE(st.message().find("limits.max_connections_per_uid is 2"), std::string::npos)
      << st.message();
  EXPECT_EQ(OnLoop([&] { return server_->stats().hits("max_connections_per_uid"); }), 1u);
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

// ---- limits (server/limits.h) ------------------------------------------------

// A pipe whose read end sees EOF once every copy of the write end is gone:
// the test's own, and any the server took from a frame.
struct FdProbe {
  FdProbe() {
    int p[2];
    EXPECT_EQ(0, ::pipe2(p, O_CLOEXEC | O_NONBLOCK));
    r.Reset(p[0]);
    w.Reset(p[1]);
  }
  // True once no copy of the write end is left (polled, bounded).
  bool WriteEndGone() {
    w.Reset();
    for (int i = 0; i < kWaitMs; ++i) {
      char c;
      if (::read(r.get(), &c, 1) == 0) return true;
      ::usleep(1000);
    }
    return false;
  }
  UniqueFd r, w;
};

// Sends `bytes` of `frame` from `off` in one sendmsg carrying `n` copies of `fd`.
ssize_t SendPiece(int sock, const std::string& frame, size_t off, size_t bytes, int fd, int n) {
  struct iovec iov = {const_cast<char*>(frame.data()) + off, bytes};
  struct msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int) * 253)];
  std::vector<int> fds(static_cast<size_t>(n), fd);
  if (n > 0) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    struct cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  return ::sendmsg(sock, &msg, MSG_NOSIGNAL);
}

TEST_F(ServerTest, FdsOverTheFrameLimitAreClosedWhileTheFrameIsRead) {
  options_.limits.max_fds_per_frame = 16;
  Start();
  UniqueFd fd = Connect();
  ASSERT_TRUE(Hello(fd.get()).ok());
  FdProbe probe;
  // A RECLAIM frame whose bytes come one sendmsg at a time, 10 fds on each:
  // the second piece takes it past 16, while the frame is still unfinished.
  std::string frame = wire::EncodeFrame(proto::MSG_RECLAIM_REQUEST, 77, std::string(40, '\0'));
  ASSERT_EQ(SendPiece(fd.get(), frame, 0, 1, probe.w.get(), 10), 1);
  ASSERT_EQ(SendPiece(fd.get(), frame, 1, 1, probe.w.get(), 10), 1);
  EXPECT_TRUE(probe.WriteEndGone()) << "the server still holds fds of an unfinished frame";
  Result<wire::Frame> f = wire::RecvFrame(fd.get(), {}, kWaitMs);
  // Only one byte of the header had arrived: no request id to echo.
  ExpectError(std::move(f), Code::kProtocol, 0, "limits.max_fds_per_frame is 16");
  ExpectClosed(fd.get());
  EXPECT_EQ(OnLoop([&] { return server_->stats().hits("max_fds_per_frame"); }), 1u);
  EXPECT_EQ(OnLoop([&] { return server_->stats().fds_held; }), 0u);
  ExpectGoodClientServed();
}

TEST_F(ServerTest, FdsOverTheUidBudgetAreClosedAndNamed) {
  options_.limits.max_fds_per_frame = 8;
  options_.limits.max_fds_per_uid = 10;
  options_.limits.max_fds = 64;
  Start();
  UniqueFd a = Connect(), b = Connect();
  ASSERT_TRUE(Hello(a.get()).ok());
  ASSERT_TRUE(Hello(b.get()).ok());
  FdProbe pa, pb;
  // A holds 6 fds in a RECLAIM it has not finished; B's 6 would make 12.
  std::string fa = wire::EncodeFrame(proto::MSG_RECLAIM_REQUEST, 5, std::string(6, '\0'));
  ASSERT_EQ(SendPiece(a.get(), fa, 0, fa.size() - 1, pa.w.get(), 6),
            static_cast<ssize_t>(fa.size() - 1));
  ASSERT_TRUE(PollStat([&] { return server_->stats().fds_held == 6; }));
  std::string fb = wire::EncodeFrame(proto::MSG_RECLAIM_REQUEST, 6, std::string(6, '\0'));
  ASSERT_EQ(SendPiece(b.get(), fb, 0, fb.size(), pb.w.get(), 6), static_cast<ssize_t>(fb.size()));
  ExpectError(wire::RecvFrame(b.get(), {}, kWaitMs), Code::kResourceExhausted, 6,
              "limits.max_fds_per_uid is 10");
  ExpectClosed(b.get());
  EXPECT_TRUE(pb.WriteEndGone());
  EXPECT_EQ(OnLoop([&] { return server_->stats().hits("max_fds_per_uid"); }), 1u);
  // A finishes its frame and is answered (the handler refuses RECLAIM).
  ASSERT_EQ(::write(a.get(), fa.data() + fa.size() - 1, 1), 1);
  ExpectError(wire::RecvFrame(a.get(), {}, kWaitMs), Code::kUnsupported, 5);
  EXPECT_TRUE(pa.WriteEndGone());
  EXPECT_TRUE(PollStat([&] { return server_->stats().fds_held == 0; }));
  ExpectStatWorks(a.get(), 7);
}

TEST_F(ServerTest, RefusedConnectionIsToldWhichLimit) {
  options_.limits.max_connections = 4;
  options_.limits.max_connections_per_uid = 2;
  options_.limits.reserved_connections = 0;
  Start();
  UniqueFd a = Connect(), b = Connect();
  ASSERT_TRUE(Hello(a.get()).ok());
  ASSERT_TRUE(Hello(b.get()).ok());
  for (int i = 0; i < 5; ++i) {
    UniqueFd c = Connect();
    Status st = Hello(c.get());
    EXPECT_EQ(st.code(), Code::kResourceExhausted) << st.ToString();
    EXPECT_NE(st.message().find("limits.max_connections_per_uid is 2"), std::string::npos)
        << st.message();
  }
  EXPECT_EQ(OnLoop([&] { return server_->stats().hits("max_connections_per_uid"); }), 5u);
  a.Reset();
  ASSERT_TRUE(handler_.WaitDisconnects(1));
  ExpectGoodClientServed();
}

TEST_F(ServerTest, HelloTimeoutSaysSo) {
  options_.limits.hello_timeout = std::chrono::milliseconds(100);
  Start();
  UniqueFd fd = Connect();
  ExpectError(wire::RecvFrame(fd.get(), {}, kWaitMs), Code::kUnavailable, 0,
              "limits.hello_timeout");
  ExpectClosed(fd.get());
  EXPECT_EQ(OnLoop([&] { return server_->stats().hits("hello_timeout"); }), 1u);
}

TEST_F(ServerTest, IdleTimeoutSparesConnectionsThatHoldSomething) {
  options_.limits.idle_timeout = std::chrono::milliseconds(150);
  Start();
  UniqueFd idle = Connect();
  ASSERT_TRUE(handler_.WaitFor([&] { return handler_.connects_.size() == 1; }));
  UniqueFd holder = Connect();
  ASSERT_TRUE(handler_.WaitFor([&] { return handler_.connects_.size() == 2; }));
  {
    std::lock_guard<std::mutex> l(handler_.mu_);
    handler_.holders_.insert(std::prev(handler_.connects_.end())->first);  // the holder
  }
  ASSERT_TRUE(Hello(idle.get()).ok());
  ASSERT_TRUE(Hello(holder.get()).ok());
  ExpectError(wire::RecvFrame(idle.get(), {}, kWaitMs), Code::kUnavailable, 0,
              "limits.idle_timeout");
  ExpectClosed(idle.get());
  // The holder sent nothing for many idle periods and is still served.
  const ConnectionId holder_id = std::prev(handler_.connects_.end())->first;
  ASSERT_TRUE(handler_.WaitFor([&] { return handler_.holds_asked_[holder_id] >= 4; }));
  ExpectStatWorks(holder.get(), 12);
  EXPECT_EQ(OnLoop([&] { return server_->stats().hits("idle_timeout"); }), 1u);
  // A request is activity: a connection that keeps asking is not idle. It
  // asks faster than the idle timeout until two quiet probes, connected
  // with it, were closed for being idle.
  UniqueFd busy = Connect();
  ASSERT_TRUE(Hello(busy.get()).ok());
  uint64_t rid = 20;
  for (int round = 0; round < 2; ++round) {
    UniqueFd probe = Connect();
    ASSERT_TRUE(Hello(probe.get()).ok());
    struct pollfd pfd = {probe.get(), POLLIN, 0};
    while (::poll(&pfd, 1, 20) == 0) ExpectStatWorks(busy.get(), rid++);
    ExpectError(wire::RecvFrame(probe.get(), {}, kWaitMs), Code::kUnavailable, 0,
                "limits.idle_timeout");
  }
  EXPECT_GT(rid, 20u);
  ExpectStatWorks(busy.get(), rid);
}

TEST_F(ServerTest, RequestsInFlightPerUidAreRefusedAndCountUntilAnswered) {
  options_.limits.max_requests_per_uid = 3;
  options_.limits.max_requests_per_connection = 2;
  Start();
  UniqueFd a = Connect(), a2 = Connect(), b = Connect();
  ASSERT_TRUE(Hello(a.get()).ok());
  ASSERT_TRUE(Hello(a2.get()).ok());
  ASSERT_TRUE(Hello(b.get()).ok());
  // A and A2 keep 3 requests in flight (the handler holds QUOTA_SET replies).
  for (uint64_t i = 0; i < 2; ++i) {
    ASSERT_TRUE(wire::SendFrame(a.get(), proto::MSG_QUOTA_SET_REQUEST, 100 + i, "").ok());
  }
  ASSERT_TRUE(wire::SendFrame(a2.get(), proto::MSG_QUOTA_SET_REQUEST, 102, "").ok());
  ASSERT_TRUE(handler_.WaitFor([&] { return handler_.held_.size() == 3; }));
  // B, same uid: refused, naming the limit; served again once A's answers go.
  proto::StatRequest sr;
  ExpectError(Call(b.get(), proto::MSG_STAT_REQUEST, 200, *wire::Encode(sr)),
              Code::kResourceExhausted, 200, "limits.max_requests_per_uid is 3");
  // A request keeps counting after its connection closed (its work goes on).
  // (A2 is below its own limit, so the server is reading it and sees EOF.)
  a2.Reset();
  ASSERT_TRUE(handler_.WaitDisconnects(1));
  ExpectError(Call(b.get(), proto::MSG_STAT_REQUEST, 201, *wire::Encode(sr)),
              Code::kResourceExhausted, 201, "max_requests_per_uid");
  EXPECT_EQ(OnLoop([&] { return server_->stats().requests_in_flight; }), 3u);
  handler_.AnswerHeld();
  EXPECT_TRUE(PollStat([&] { return server_->stats().requests_in_flight == 0; }));
  ExpectStatWorks(b.get(), 202);
  EXPECT_EQ(OnLoop([&] { return server_->stats().hits("max_requests_per_uid"); }), 2u);
}

TEST_F(ServerTest, PerConnectionRequestLimitIsBackpressure) {
  options_.limits.max_requests_per_connection = 2;
  Start();
  UniqueFd a = Connect();
  ASSERT_TRUE(Hello(a.get()).ok());
  for (uint64_t i = 0; i < 2; ++i) {
    ASSERT_TRUE(wire::SendFrame(a.get(), proto::MSG_QUOTA_SET_REQUEST, 100 + i, "").ok());
  }
  ASSERT_TRUE(handler_.WaitFor([&] { return handler_.held_.size() == 2; }));
  // The third waits unread: no error, no reply, until one is answered.
  proto::StatRequest sr;
  sr.set_lease_id(5);
  ASSERT_TRUE(wire::SendFrame(a.get(), proto::MSG_STAT_REQUEST, 300, *wire::Encode(sr)).ok());
  EXPECT_FALSE(wire::RecvFrame(a.get(), {}, 200).ok());
  handler_.AnswerHeld();
  for (int i = 0; i < 3; ++i) {
    Result<wire::Frame> f = wire::RecvFrame(a.get(), {}, kWaitMs);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    EXPECT_NE(f->type(), proto::MSG_ERROR_REPLY);
  }
  EXPECT_GE(OnLoop([&] { return server_->stats().hits("max_requests_per_connection"); }), 1u);
}

TEST_F(ServerTest, QueuedBytesPerConnectionAreBounded) {
  options_.max_frame_bytes = 256u << 10;
  options_.limits.max_queued_bytes_per_connection = 1u << 20;
  options_.limits.frame_timeout = std::chrono::milliseconds(300);  // its error, unread
  handler_.big_reply_bytes_ = 100 * 1024;
  Start();
  UniqueFd deaf = Connect();
  ASSERT_TRUE(Hello(deaf.get()).ok());
  // 40 big replies produced off the loop, all in flight at once: far more
  // than the kernel buffer and 1 MiB of queue.
  for (uint64_t i = 0; i < 40; ++i) {
    ASSERT_TRUE(wire::SendFrame(deaf.get(), proto::MSG_LIST_LEASES_REQUEST, 10 + i, "").ok());
  }
  ASSERT_TRUE(handler_.AnswerLists(40));
  ASSERT_TRUE(handler_.WaitDisconnects(1));
  EXPECT_EQ(OnLoop([&] { return server_->stats().hits("max_queued_bytes_per_connection"); }), 1u);
  EXPECT_TRUE(PollStat([&] { return server_->stats().queued_bytes == 0; }));
  ExpectGoodClientServed();
}

TEST_F(ServerTest, QueuedBytesPerUidDropTheLargestQueue) {
  options_.limits.max_queued_bytes_per_connection = 2u << 20;
  options_.limits.max_queued_bytes_per_uid = 5u << 19;
  options_.limits.frame_timeout = std::chrono::milliseconds(300);
  options_.limits.max_requests_per_connection = 16;
  handler_.big_reply_bytes_ = 200 * 1024;
  Start();
  UniqueFd big = Connect(), small = Connect(), good = Connect();
  ASSERT_TRUE(Hello(big.get()).ok());
  ASSERT_TRUE(Hello(small.get()).ok());
  ASSERT_TRUE(Hello(good.get()).ok());
  // `big` gets ~1.6 MiB queued (under its own 2 MiB), then `small` pushes
  // the uid past 2.5 MiB: the largest queue, big's, goes.
  for (uint64_t i = 0; i < 9; ++i) {
    ASSERT_TRUE(wire::SendFrame(big.get(), proto::MSG_LIST_LEASES_REQUEST, 10 + i, "").ok());
  }
  ASSERT_TRUE(handler_.AnswerLists(9));
  ASSERT_TRUE(PollStat([&] { return server_->stats().queued_bytes > (1u << 20); }));
  for (uint64_t i = 0; i < 8; ++i) {
    ASSERT_TRUE(wire::SendFrame(small.get(), proto::MSG_LIST_LEASES_REQUEST, 50 + i, "").ok());
  }
  ASSERT_TRUE(handler_.AnswerLists(8));
  ASSERT_TRUE(handler_.WaitDisconnects(1));
  EXPECT_GE(OnLoop([&] { return server_->stats().hits("max_queued_bytes_per_uid"); }), 1u);
  // The first to go was the largest; the reader that reads is never touched.
  std::lock_guard<std::mutex> l(handler_.mu_);
  EXPECT_EQ(handler_.disconnects_.count(handler_.connects_.begin()->first), 1u);
  EXPECT_EQ(handler_.disconnects_.count(std::prev(handler_.connects_.end())->first), 0u);
}

TEST_F(ServerTest, OversizeRequestNamesMaxRequestBytes) {
  options_.limits.max_request_bytes = 2048;
  Start();
  UniqueFd fd = Connect();
  ASSERT_TRUE(Hello(fd.get()).ok());
  ExpectError(Call(fd.get(), proto::MSG_STAT_REQUEST, 9, std::string(4096, 'x')), Code::kProtocol,
              9, "limits.max_request_bytes");
  ExpectClosed(fd.get());
  EXPECT_EQ(OnLoop([&] { return server_->stats().hits("max_request_bytes"); }), 1u);
  ExpectGoodClientServed();
}

TEST_F(ServerTest, LimitsThatDoNotFitTogetherAreRefused) {
  options_.limits.max_connections_per_uid = options_.limits.max_connections + 1;
  Result<std::unique_ptr<Server>> s = Server::Create(io_, options_, &handler_);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Code::kInvalidArgument);
  EXPECT_NE(s.status().message().find("limits.max_connections_per_uid"), std::string::npos)
      << s.status().message();
}

TEST(FairShare, PerUidTotalAndTheReserveForNewcomers) {
  FairShare share(10, 4, 2);
  EXPECT_EQ(share.Check(1, 4), FairShare::Verdict::kOk);
  EXPECT_EQ(share.Check(1, 5), FairShare::Verdict::kPerUid);
  share.Add(1, 4);
  share.Add(2, 4);
  // 8 of 10 held: the last 2 are for uids that hold none.
  EXPECT_EQ(share.Check(1, 1), FairShare::Verdict::kPerUid);
  EXPECT_EQ(share.Check(2, 1), FairShare::Verdict::kPerUid);
  share.Sub(2, 1);
  EXPECT_EQ(share.Check(2, 1), FairShare::Verdict::kOk);  // 7 held: 3 left, 1 above the reserve
  share.Add(2, 1);
  EXPECT_EQ(share.Available(3), 2u);
  EXPECT_EQ(share.Check(3, 1), FairShare::Verdict::kOk);
  share.Add(3, 1);
  // Uid 3 now holds one: the reserve is not for it any more.
  EXPECT_EQ(share.Check(3, 1), FairShare::Verdict::kReserve);
  EXPECT_EQ(share.Available(3), 0u);
  EXPECT_EQ(share.Check(4, 1), FairShare::Verdict::kOk);
  share.Add(4, 1);
  EXPECT_EQ(share.Check(5, 1), FairShare::Verdict::kTotal);
  EXPECT_EQ(share.used(), 10u);
  std::string why = Explain(share,
                            ShareNames{"max_connections", "max_connections_per_uid",
                                       "reserved_connections", "connections"},
                            FairShare::Verdict::kReserve, 3, 1);
  EXPECT_NE(why.find("limits.reserved_connections"), std::string::npos) << why;
}

TEST(ServerLimits, DerivedFromTheFdLimitAndValidated) {
  ServerLimits small = ServerLimits::ForFdLimit(1024);
  EXPECT_EQ(small.max_connections, 64u);
  EXPECT_EQ(small.max_connections_per_uid, 16u);
  EXPECT_EQ(small.reserved_connections, 4u);
  EXPECT_EQ(small.max_fds, 128u);
  EXPECT_LE(small.FdsReserved(), 1024u / 4);
  EXPECT_TRUE(small.Validate(wire::kDefaultMaxFrameBytes).ok());
  ServerLimits big = ServerLimits::ForFdLimit(1u << 20);
  EXPECT_EQ(big.max_connections, 4096u);
  EXPECT_EQ(big.max_fds, 65536u);
  EXPECT_TRUE(big.Validate(wire::kDefaultMaxFrameBytes).ok());
  ServerLimits bad = big;
  bad.reserved_connections = bad.max_connections;
  EXPECT_NE(bad.Validate(wire::kDefaultMaxFrameBytes).message().find("reserved_connections"),
            std::string::npos);
  bad = big;
  bad.max_queued_bytes_per_connection = 4096;
  EXPECT_NE(bad.Validate(wire::kDefaultMaxFrameBytes).message().find("largest size"),
            std::string::npos);
  bad = big;
  bad.max_fds_per_frame = 254;
  EXPECT_FALSE(bad.Validate(wire::kDefaultMaxFrameBytes).ok());
}

}  // namespace
}  // namespace cxlpool
