// MetricsHttpServer on 127.0.0.1 (port picked by the kernel), serving on its
// own thread, with the "event loop" io_context on a background thread of the
// test and blocking clients:
// - GET /metrics returns the rendered text with the exposition content type,
//   HEAD has no body, keep-alive serves a second request, other paths 404,
//   POST 405, a garbled request 400; the render runs on the loop's thread;
//   non-loopback addresses and bad limits are refused at Create;
// - the limits: a head that does not arrive in time is closed; a peer (uid)
//   over its connections takes the place of its own idle one or is closed;
//   over its rate it gets 429 with Retry-After; scrapes that arrive while a
//   render runs share the next one; no render within the deadline is a 503;
// - as root: a user (nobody) that holds every connection it can, trickling
//   head bytes or idle, leaves room for another user's scrapes; a full
//   endpoint makes room for a new connection by closing an idle one.
#include "http/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "cxlpool/common/unique_fd.h"
#include "test_support.h"

namespace cxlpool {
namespace {

using testsupport::kNobody;
using testsupport::PollUntil;
using namespace std::chrono_literals;

const std::string kScrape = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";

UniqueFd Connect(uint16_t port, int timeout_s = 10) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return UniqueFd();
  timeval tv{timeout_s, 0};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

// Sends `req` and reads one response (headers + Content-Length body); what
// arrived so far when the peer closes or the receive timeout passes.
std::string RoundTrip(int fd, const std::string& req) {
  if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) {
    return "";
  }
  std::string in;
  char buf[4096];
  for (;;) {
    auto end = in.find("\r\n\r\n");
    if (end != std::string::npos) {
      size_t len = 0;
      auto cl = in.find("Content-Length: ");
      if (cl != std::string::npos && cl < end) len = std::stoul(in.substr(cl + 16));
      bool head = req.rfind("HEAD", 0) == 0;
      if (head || in.size() >= end + 4 + len) return in.substr(0, end + 4 + (head ? 0 : len));
    }
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return in;
    in.append(buf, static_cast<size_t>(n));
  }
}

// Whether the server closed `fd` (recv sees EOF or a reset) within its
// receive timeout.
bool ClosedByServer(int fd) {
  char c;
  ssize_t n = ::recv(fd, &c, 1, 0);
  return n == 0 || (n < 0 && errno == ECONNRESET);
}

bool Ok(const std::string& r) { return r.rfind("HTTP/1.1 200 OK\r\n", 0) == 0; }

class HttpTest : public ::testing::Test {
 protected:
  void Start(MetricsHttpOptions options = {}) {
    auto s = MetricsHttpServer::Create(
        io_, "127.0.0.1:0",
        [this] {
          render_thread_ = std::this_thread::get_id();
          ++renders_;
          std::unique_lock lock(mu_);
          cv_.wait(lock, [this] { return !hold_; });
          return std::string("# TYPE x gauge\nx 1\n");
        },
        options);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(*s);
    port_ = server_->port();
    ASSERT_NE(port_, 0);
  }
  void SetUp() override {
    thread_ = std::thread([this] { io_.run(); });
  }
  void TearDown() override {
    Hold(false);
    server_.reset();  // stops and joins the HTTP thread
    work_.reset();
    io_.stop();
    thread_.join();
  }
  // While held, a render blocks the loop (a busy event loop).
  void Hold(bool hold) {
    {
      std::lock_guard lock(mu_);
      hold_ = hold;
    }
    cv_.notify_all();
  }
  // The uid lookup works here (NETLINK_SOCK_DIAG in this namespace).
  // Leaves no connection open.
  bool KnowsPeers() {
    std::string r;
    {
      UniqueFd c = Connect(port_);
      r = RoundTrip(c.get(), "GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n");
    }
    EXPECT_TRUE(PollUntil([&] { return server_->stats().sessions == 0; }));
    return r.rfind("HTTP/1.1 404", 0) == 0 && server_->stats().unknown_peers == 0;
  }

  boost::asio::io_context io_;  // the daemon's event loop
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_{
      io_.get_executor()};
  std::unique_ptr<MetricsHttpServer> server_;
  uint16_t port_ = 0;
  std::atomic<int> renders_{0};
  std::atomic<std::thread::id> render_thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool hold_ = false;
  std::thread thread_;
};

TEST_F(HttpTest, ServesMetricsAndRefusesTheRest) {
  Start();
  UniqueFd c = Connect(port_);
  std::string r = RoundTrip(c.get(), kScrape);
  EXPECT_TRUE(Ok(r)) << r;
  EXPECT_NE(r.find("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"), std::string::npos)
      << r;
  EXPECT_NE(r.find("\r\n\r\n# TYPE x gauge\nx 1\n"), std::string::npos) << r;
  EXPECT_EQ(render_thread_.load(), thread_.get_id());  // rendered on the loop, not the HTTP thread
  // Same connection (keep-alive), with a query string.
  r = RoundTrip(c.get(), "GET /metrics?x=1 HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_TRUE(Ok(r)) << r;
  r = RoundTrip(c.get(), "HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_TRUE(Ok(r)) << r;
  EXPECT_NE(r.find("Content-Length: 19\r\n"), std::string::npos) << r;
  r = RoundTrip(c.get(), "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(r.rfind("HTTP/1.1 404 Not Found\r\n", 0), 0u) << r;
  r = RoundTrip(c.get(), "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
  EXPECT_EQ(r.rfind("HTTP/1.1 405 Method Not Allowed\r\n", 0), 0u) << r;
  EXPECT_NE(r.find("Allow: GET, HEAD\r\n"), std::string::npos) << r;
  // Each scrape waits for a render that starts after it arrived.
  EXPECT_EQ(renders_.load(), 3);  // GET, GET, HEAD

  UniqueFd bad = Connect(port_);
  r = RoundTrip(bad.get(), "\x01\x02 nonsense\r\n\r\n");
  EXPECT_EQ(r.rfind("HTTP/1.1 400 Bad Request\r\n", 0), 0u) << r;
}

TEST_F(HttpTest, ClosesAHeadThatDoesNotArriveInTime) {
  MetricsHttpOptions o;
  o.header_deadline = 300ms;
  Start(o);
  UniqueFd slow = Connect(port_, 5);
  ASSERT_EQ(::send(slow.get(), "GET /met", 8, MSG_NOSIGNAL), 8);
  EXPECT_TRUE(ClosedByServer(slow.get()));  // long before the 5 s receive timeout
  UniqueFd idle = Connect(port_, 5);
  EXPECT_TRUE(ClosedByServer(idle.get()));
  // The stream closes the socket before its handler counts the timeout.
  EXPECT_TRUE(PollUntil([&] { return server_->stats().header_timeouts == 2; }))
      << server_->stats().header_timeouts;
}

TEST_F(HttpTest, APeerOverItsConnectionsTakesThePlaceOfItsOwnIdleOne) {
  MetricsHttpOptions o;
  o.max_sessions_per_peer = 2;
  o.header_deadline = 60s;  // the idle connections stay until evicted
  Start(o);
  if (!KnowsPeers()) GTEST_SKIP() << "no NETLINK_SOCK_DIAG here: peers' uids unknown";
  UniqueFd idle1 = Connect(port_, 5);
  ASSERT_TRUE(PollUntil([&] { return server_->stats().sessions == 1; }));
  UniqueFd idle2 = Connect(port_, 5);
  ASSERT_TRUE(PollUntil([&] { return server_->stats().sessions == 2; }));
  UniqueFd third = Connect(port_);
  std::string r = RoundTrip(third.get(), kScrape);
  EXPECT_TRUE(Ok(r)) << r;
  EXPECT_TRUE(ClosedByServer(idle1.get()));  // the oldest idle one made room
  EXPECT_EQ(server_->stats().evicted, 1u);
  EXPECT_EQ(server_->stats().sessions, 2u);

  // Two connections of this uid both waiting for a render: a third is closed.
  Hold(true);
  ASSERT_EQ(::send(third.get(), kScrape.data(), kScrape.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(kScrape.size()));
  ASSERT_EQ(::send(idle2.get(), kScrape.data(), kScrape.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(kScrape.size()));
  ASSERT_TRUE(PollUntil([&] { return server_->stats().waiting == 2; }));
  UniqueFd fourth = Connect(port_, 5);
  EXPECT_TRUE(ClosedByServer(fourth.get()));
  EXPECT_EQ(server_->stats().refused, 1u);
}

TEST_F(HttpTest, APeerOverItsRateGets429) {
  MetricsHttpOptions o;
  o.peer_rate_per_sec = 0.1;
  o.peer_burst = 3;
  o.min_render_interval = 0ms;
  Start(o);
  if (!KnowsPeers()) GTEST_SKIP() << "no NETLINK_SOCK_DIAG here: peers' uids unknown";
  UniqueFd c = Connect(port_);
  for (int i = 0; i < 2; ++i) {  // the 404 above took the first token
    std::string r = RoundTrip(c.get(), kScrape);
    EXPECT_TRUE(Ok(r)) << i << ": " << r;
  }
  std::string r = RoundTrip(c.get(), kScrape);
  EXPECT_EQ(r.rfind("HTTP/1.1 429 Too Many Requests\r\n", 0), 0u) << r;
  EXPECT_NE(r.find("Retry-After: "), std::string::npos) << r;
  EXPECT_NE(r.find("Connection: close\r\n"), std::string::npos) << r;
  EXPECT_TRUE(ClosedByServer(c.get()));
  EXPECT_EQ(server_->stats().rate_limited, 1u);
  EXPECT_EQ(renders_.load(), 2);
}

TEST_F(HttpTest, ScrapesThatArriveDuringARenderShareTheNextOne) {
  MetricsHttpOptions o;
  o.min_render_interval = 0ms;
  o.max_sessions_per_peer = 16;  // nine scrapes of this test's own uid
  Start(o);
  Hold(true);  // the loop is busy rendering
  std::vector<UniqueFd> conns;
  conns.push_back(Connect(port_));
  ASSERT_EQ(::send(conns[0].get(), kScrape.data(), kScrape.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(kScrape.size()));
  ASSERT_TRUE(PollUntil([&] { return renders_.load() == 1; }));
  for (int i = 1; i < 9; ++i) {
    conns.push_back(Connect(port_));
    ASSERT_EQ(::send(conns[i].get(), kScrape.data(), kScrape.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(kScrape.size()));
  }
  ASSERT_TRUE(PollUntil([&] { return server_->stats().waiting == 9; }));
  Hold(false);
  for (auto& c : conns) {
    std::string r = RoundTrip(c.get(), "");
    EXPECT_TRUE(Ok(r)) << r;
  }
  EXPECT_EQ(renders_.load(), 2);  // the one in flight, then one for the eight
  EXPECT_EQ(server_->stats().renders, 2u);
}

TEST_F(HttpTest, NoRenderWithinTheDeadlineIs503) {
  MetricsHttpOptions o;
  o.min_render_interval = std::chrono::hours(1);
  o.render_deadline = 300ms;
  Start(o);
  UniqueFd c = Connect(port_);
  std::string r = RoundTrip(c.get(), kScrape);
  EXPECT_TRUE(Ok(r)) << r;
  r = RoundTrip(c.get(), kScrape);  // the next render is an hour away
  EXPECT_EQ(r.rfind("HTTP/1.1 503 Service Unavailable\r\n", 0), 0u) << r;
  EXPECT_NE(r.find("Retry-After: 1\r\n"), std::string::npos) << r;
  EXPECT_EQ(renders_.load(), 1);
  EXPECT_EQ(server_->stats().render_timeouts, 1u);
}

// A forked child, as `uid`, that keeps `conns` connections to `port` open:
// odd ones trickle a request head a byte every 50 ms, even ones stay idle;
// one the server closes is opened again on the next tick. It writes a byte
// to `ready` once all are open, and runs until Holder ends it.
pid_t StartHolder(uid_t uid, uint16_t port, int conns, int ready, int stop) {
  pid_t pid = ::fork();
  if (pid != 0) return pid;
  if (!testsupport::BecomeUid(uid)) std::_Exit(90);
  const std::string head = "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ";
  std::vector<UniqueFd> fds(conns);
  std::vector<size_t> sent(conns, 0);
  auto open = [&](int i) {
    fds[i] = Connect(port);
    sent[i] = 0;
    if (fds[i]) ::fcntl(fds[i].get(), F_SETFL, O_NONBLOCK);
  };
  for (int i = 0; i < conns; ++i) open(i);
  if (::write(ready, "r", 1) != 1) std::_Exit(91);
  for (;;) {
    pollfd p{stop, POLLIN, 0};
    if (::poll(&p, 1, 50) != 0) std::_Exit(0);  // the tick's pace, not a synchronisation
    for (int i = 0; i < conns; ++i) {
      char c;
      ssize_t n = fds[i] ? ::recv(fds[i].get(), &c, 1, MSG_DONTWAIT) : 0;
      if (n >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {  // closed or answered
        open(i);
        continue;
      }
      if (i % 2 == 1) {
        char b = sent[i] < head.size() ? head[sent[i]] : 'a';
        if (::send(fds[i].get(), &b, 1, MSG_NOSIGNAL) == 1) ++sent[i];
      }
    }
  }
}

// Runs StartHolder and stops (and reaps) it when it goes out of scope.
class Holder {
 public:
  Holder(uid_t uid, uint16_t port, int conns) {
    int ready[2], stop[2];
    EXPECT_EQ(::pipe2(ready, O_CLOEXEC), 0);
    EXPECT_EQ(::pipe2(stop, O_CLOEXEC), 0);
    ready_.Reset(ready[0]);
    UniqueFd ready_w(ready[1]);
    stop_.Reset(stop[1]);
    UniqueFd stop_r(stop[0]);
    pid_ = StartHolder(uid, port, conns, ready_w.get(), stop_r.get());
  }
  ~Holder() {
    // The child has its own copy of the stop pipe's write end (fork), so
    // closing ours does not wake it: end it.
    stop_.Reset();
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  // Whether the child opened its connections (within 10 s).
  bool Ready() {
    pollfd p{ready_.get(), POLLIN, 0};
    char c;
    return ::poll(&p, 1, 10000) == 1 && ::read(ready_.get(), &c, 1) == 1;
  }

 private:
  UniqueFd ready_, stop_;
  pid_t pid_ = -1;
};

// Issue 37 item 3: nobody held all 16 sessions by trickling header bytes and
// 2 of 47 scrapes were served. Now nobody gets its share (4) and the head
// deadline; the scraper (another uid) is served.
TEST_F(HttpTest, AUserHoldingConnectionsLeavesRoomForOthersScrapes) {
  if (!testsupport::IsRoot()) GTEST_SKIP() << "needs root to connect as nobody";
  Start();
  if (!KnowsPeers()) GTEST_SKIP() << "no NETLINK_SOCK_DIAG here: peers' uids unknown";
  Holder holder(kNobody, port_, 64);
  ASSERT_TRUE(holder.Ready());
  // nobody holds what it may; each connection past its share closes one of
  // its own (or is refused).
  ASSERT_TRUE(PollUntil([&] {
    auto s = server_->stats();
    return s.sessions >= 4 && s.refused + s.evicted > 0;
  })) << "sessions "
      << server_->stats().sessions << ", refused " << server_->stats().refused << ", evicted "
      << server_->stats().evicted;
  int served = 0;
  for (int i = 0; i < 20; ++i) {
    UniqueFd c = Connect(port_, 3);
    if (c && Ok(RoundTrip(c.get(), kScrape))) ++served;
  }
  EXPECT_GE(served, 18) << "of 20 scrapes";
}

// A full endpoint (every place held by nobody's idle connections) closes
// the oldest idle one for a new connection.
TEST_F(HttpTest, AFullEndpointMakesRoomForANewConnection) {
  if (!testsupport::IsRoot()) GTEST_SKIP() << "needs root to connect as nobody";
  MetricsHttpOptions o;
  o.max_sessions = 4;
  o.max_sessions_per_peer = 4;
  o.header_deadline = 60s;  // nobody's connections stay until evicted
  Start(o);
  Holder holder(kNobody, port_, 4);
  ASSERT_TRUE(holder.Ready());
  ASSERT_TRUE(PollUntil([&] { return server_->stats().sessions == 4; }));
  UniqueFd c = Connect(port_);
  std::string r = RoundTrip(c.get(), kScrape);
  EXPECT_TRUE(Ok(r)) << r;
  EXPECT_GE(server_->stats().evicted, 1u);
}

TEST(HttpCreateTest, RefusesNonLoopbackAddressesAndBadLimits) {
  boost::asio::io_context io;
  auto render = [] { return std::string(); };
  for (const char* bad : {"0.0.0.0:9464", "10.0.0.1:9464", "[::]:9464", "example.com:80",
                          "127.0.0.1", "127.0.0.1:70000"}) {
    auto s = MetricsHttpServer::Create(io, bad, render);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_EQ(s.status().code(), Code::kInvalidArgument) << bad;
  }
  MetricsHttpOptions o;
  o.max_sessions_per_peer = 17;  // more than max_sessions
  auto s = MetricsHttpServer::Create(io, "127.0.0.1:0", render, o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Code::kInvalidArgument);
  // A port already taken: UNAVAILABLE, not a crash.
  auto first = MetricsHttpServer::Create(io, "127.0.0.1:0", render);
  ASSERT_TRUE(first.ok());
  std::string taken = "127.0.0.1:" + std::to_string((*first)->port());
  auto second = MetricsHttpServer::Create(io, taken, render);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), Code::kUnavailable) << second.status().ToString();
}

}  // namespace
}  // namespace cxlpool
