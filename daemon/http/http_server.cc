#include "http/http_server.h"

#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cerrno>
#include <chrono>
#include <exception>

#include "config/config.h"
#include "cxlpool/common/log.h"
#include "cxlpool/common/strings.h"

namespace cxlpool {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

namespace {
constexpr auto kRequestDeadline = std::chrono::seconds(10);
constexpr uint32_t kHeaderLimit = 8 * 1024;
constexpr int kMaxSessions = 16;
}  // namespace

struct MetricsHttpServer::Impl : std::enable_shared_from_this<Impl> {
  Impl(asio::io_context& io, RenderFn r) : acceptor(io), render(std::move(r)) {}

  void Accept();

  tcp::acceptor acceptor;
  RenderFn render;
  int sessions = 0;
  bool stopped = false;
};

namespace {

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, std::shared_ptr<MetricsHttpServer::Impl> server)
      : stream_(std::move(socket)), server_(std::move(server)) {
    ++server_->sessions;
  }
  ~Session() {
    --server_->sessions;
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
  }

  void Read() {
    parser_.emplace();
    parser_->header_limit(kHeaderLimit);
    parser_->body_limit(0);
    stream_.expires_after(kRequestDeadline);
    http::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->OnRead(ec); });
  }

 private:
  void OnRead(beast::error_code ec) {
    if (ec == http::error::end_of_stream) return;  // client closed: done
    if (ec) {
      if (ec != beast::error::timeout && ec != asio::error::operation_aborted) {
        Respond(http::status::bad_request, "bad request: " + ec.message() + "\n", false, false);
      }
      return;
    }
    const auto& req = parser_->get();
    bool keep = req.keep_alive();
    bool head = req.method() == http::verb::head;
    if (req.method() != http::verb::get && !head) {
      return Respond(http::status::method_not_allowed, "only GET and HEAD\n", keep, false);
    }
    std::string_view target(req.target().data(), req.target().size());
    auto q = target.find('?');
    if (q != std::string_view::npos) target = target.substr(0, q);
    if (target != "/metrics") {
      return Respond(http::status::not_found, "cxlpoold serves metrics at /metrics\n", keep, head);
    }
    std::string text;
    try {
      text = server_->render();
    } catch (const std::exception& e) {
      return Respond(http::status::internal_server_error,
                     std::string("rendering metrics failed: ") + e.what() + "\n", false, head);
    }
    Respond(http::status::ok, std::move(text), keep, head, true);
  }

  void Respond(http::status status, std::string body, bool keep, bool head, bool metrics = false) {
    auto res = std::make_shared<http::response<http::string_body>>(status, 11);
    res->set(http::field::server, "cxlpoold");
    res->set(http::field::content_type,
             metrics ? "text/plain; version=0.0.4; charset=utf-8" : "text/plain; charset=utf-8");
    if (status == http::status::method_not_allowed) res->set(http::field::allow, "GET, HEAD");
    res->keep_alive(keep);
    size_t length = body.size();
    if (!head) res->body() = std::move(body);
    res->content_length(length);
    stream_.expires_after(kRequestDeadline);
    http::async_write(stream_, *res,
                      [self = shared_from_this(), res, keep](beast::error_code ec, size_t) {
                        if (!ec && keep) self->Read();
                      });
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::empty_body>> parser_;
  std::shared_ptr<MetricsHttpServer::Impl> server_;
};

}  // namespace

void MetricsHttpServer::Impl::Accept() {
  acceptor.async_accept([self = shared_from_this()](beast::error_code ec, tcp::socket socket) {
    if (self->stopped || ec == asio::error::operation_aborted) return;
    if (!ec) {
      if (self->sessions >= kMaxSessions) {
        beast::error_code ignored;
        socket.close(ignored);  // over the limit: the scraper retries
      } else {
        std::make_shared<Session>(std::move(socket), self)->Read();
      }
    } else {
      CXLPOOL_LOG(kWarning) << "metrics http: accept: " << ec.message();
    }
    self->Accept();
  });
}

Result<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Create(asio::io_context& io,
                                                                     const std::string& listen,
                                                                     RenderFn render) {
  // Port 0 (tests) is not a valid config value: parse with a stand-in.
  bool any_port = EndsWith(listen, ":0");
  auto ep = ParseLoopbackEndpoint(any_port ? listen.substr(0, listen.size() - 1) + "1" : listen);
  if (!ep.ok())
    return Status(Code::kInvalidArgument, "metrics.http_listen " + ep.status().message());
  beast::error_code ec;
  auto addr = asio::ip::make_address(ep->address, ec);
  if (ec || !addr.is_loopback()) {
    return Status(Code::kInvalidArgument, "metrics.http_listen '" + listen + "' is not loopback");
  }
  auto impl = std::make_shared<Impl>(io, std::move(render));
  tcp::endpoint endpoint(addr, any_port ? 0 : ep->port);
  impl->acceptor.open(endpoint.protocol(), ec);
  if (!ec) impl->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) impl->acceptor.bind(endpoint, ec);
  if (!ec) impl->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return Status(Code::kUnavailable, "metrics.http_listen " + listen + ": " + ec.message());
  }
  impl->Accept();
  return std::unique_ptr<MetricsHttpServer>(new MetricsHttpServer(std::move(impl)));
}

bool MetricsHttpServer::IsListeningTcpSocket(int fd) {
  int domain = 0, type = 0, listening = 0;
  socklen_t len = sizeof domain;
  if (::getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) != 0) return false;
  len = sizeof type;
  if (::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0) return false;
  len = sizeof listening;
  if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0) return false;
  return (domain == AF_INET || domain == AF_INET6) && type == SOCK_STREAM && listening != 0;
}

Result<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::FromListeningFd(asio::io_context& io,
                                                                              int fd,
                                                                              RenderFn render) {
  if (!IsListeningTcpSocket(fd)) {
    ::close(fd);
    return Status(Code::kInvalidArgument, "the metrics socket is not a listening TCP socket");
  }
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    Status st = Status::FromErrno(errno, "metrics socket: getsockname");
    ::close(fd);
    return st;
  }
  auto impl = std::make_shared<Impl>(io, std::move(render));
  const tcp protocol = ss.ss_family == AF_INET6 ? tcp::v6() : tcp::v4();
  beast::error_code ec;
  impl->acceptor.assign(protocol, fd, ec);
  if (ec) {
    ::close(fd);
    return Status(Code::kInvalidArgument, "metrics socket: " + ec.message());
  }
  auto local = impl->acceptor.local_endpoint(ec);
  if (ec || !local.address().is_loopback()) {
    return Status(Code::kInvalidArgument,
                  "the metrics socket listens on " +
                      (ec ? std::string("?") : local.address().to_string()) +
                      ", not a loopback address (cxlpoold serves metrics on loopback only)");
  }
  impl->Accept();
  return std::unique_ptr<MetricsHttpServer>(new MetricsHttpServer(std::move(impl)));
}

MetricsHttpServer::MetricsHttpServer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

uint16_t MetricsHttpServer::port() const {
  beast::error_code ec;
  auto ep = impl_->acceptor.local_endpoint(ec);
  return ec ? 0 : ep.port();
}

void MetricsHttpServer::Stop() {
  if (impl_->stopped) return;
  impl_->stopped = true;
  beast::error_code ec;
  impl_->acceptor.close(ec);
}

}  // namespace cxlpool
