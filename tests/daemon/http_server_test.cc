// MetricsHttpServer on 127.0.0.1 (port picked by the kernel) with the
// io_context on a background thread and a blocking client: GET /metrics
// returns the rendered text with the exposition content type, HEAD has no
// body, keep-alive serves a second request, other paths 404, POST 405, a
// garbled request 400; non-loopback addresses are refused at Create.
#include "http/http_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <thread>

#include "cxlpool/common/unique_fd.h"

namespace cxlpool {
namespace {

class HttpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = MetricsHttpServer::Create(io_, "127.0.0.1:0", [this] {
      ++renders_;
      return std::string("# TYPE x gauge\nx 1\n");
    });
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(*s);
    port_ = server_->port();
    ASSERT_NE(port_, 0);
    thread_ = std::thread([this] { io_.run(); });
  }
  void TearDown() override {
    boost::asio::post(io_, [this] { server_->Stop(); });
    work_.reset();
    io_.stop();
    thread_.join();
  }
  UniqueFd Connect() {
    UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port_);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    timeval tv{10, 0};
    ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
  }
  // Sends `req` and reads one response (headers + Content-Length body).
  static std::string RoundTrip(int fd, const std::string& req) {
    EXPECT_EQ(::send(fd, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
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

  boost::asio::io_context io_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_{
      io_.get_executor()};
  std::unique_ptr<MetricsHttpServer> server_;
  uint16_t port_ = 0;
  std::atomic<int> renders_{0};
  std::thread thread_;
};

TEST_F(HttpTest, ServesMetricsAndRefusesTheRest) {
  UniqueFd c = Connect();
  std::string r = RoundTrip(c.get(), "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(r.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << r;
  EXPECT_NE(r.find("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"), std::string::npos)
      << r;
  EXPECT_NE(r.find("\r\n\r\n# TYPE x gauge\nx 1\n"), std::string::npos) << r;
  // Same connection (keep-alive), with a query string.
  r = RoundTrip(c.get(), "GET /metrics?x=1 HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(r.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << r;
  r = RoundTrip(c.get(), "HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(r.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << r;
  EXPECT_NE(r.find("Content-Length: 19\r\n"), std::string::npos) << r;
  r = RoundTrip(c.get(), "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(r.rfind("HTTP/1.1 404 Not Found\r\n", 0), 0u) << r;
  r = RoundTrip(c.get(), "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
  EXPECT_EQ(r.rfind("HTTP/1.1 405 Method Not Allowed\r\n", 0), 0u) << r;
  EXPECT_NE(r.find("Allow: GET, HEAD\r\n"), std::string::npos) << r;
  EXPECT_EQ(renders_.load(), 3);  // GET, GET, HEAD

  UniqueFd bad = Connect();
  r = RoundTrip(bad.get(), "\x01\x02 nonsense\r\n\r\n");
  EXPECT_EQ(r.rfind("HTTP/1.1 400 Bad Request\r\n", 0), 0u) << r;
}

TEST(HttpCreateTest, RefusesNonLoopbackAndBadAddresses) {
  boost::asio::io_context io;
  auto render = [] { return std::string(); };
  for (const char* bad : {"0.0.0.0:9464", "10.0.0.1:9464", "[::]:9464", "example.com:80",
                          "127.0.0.1", "127.0.0.1:70000"}) {
    auto s = MetricsHttpServer::Create(io, bad, render);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_EQ(s.status().code(), Code::kInvalidArgument) << bad;
  }
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
