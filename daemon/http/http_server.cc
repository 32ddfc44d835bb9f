#include "http/http_server.h"

#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cerrno>
#include <cmath>
#include <exception>
#include <map>
#include <optional>
#include <vector>

#include "config/config.h"
#include "cxlpool/common/log.h"
#include "cxlpool/common/strings.h"
#include "cxlpool/common/thread_annotations.h"
#include "http/peer_uid.h"

namespace cxlpool {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using SteadyClock = std::chrono::steady_clock;

namespace {

constexpr uint32_t kHeaderLimit = 8 * 1024;
constexpr auto kAcceptBackoff = std::chrono::milliseconds(100);
constexpr const char* kPlain = "text/plain; charset=utf-8";
constexpr const char* kExposition = "text/plain; version=0.0.4; charset=utf-8";

// A render's outcome: the text, or why it failed.
struct RenderResult {
  bool ok = false;
  std::string text;
};

// What the loop needs to render and hand the text back to the HTTP thread.
// `closed` is set by Stop before the HTTP io_context goes away: the loop
// neither renders nor posts to it after that.
struct RenderBridge {
  Mutex mu;
  bool closed GUARDED_BY(mu) = false;
  MetricsHttpServer::RenderFn render;
  asio::io_context* http PT_GUARDED_BY(mu) = nullptr;  // posted to only while !closed
};

// A known peer (uid): its open sessions and its request token bucket.
struct Peer {
  int sessions = 0;
  double tokens = 0;
  SteadyClock::time_point refilled;
};

struct AtomicStats {
  std::atomic<uint64_t> sessions{0}, waiting{0}, renders{0}, refused{0}, evicted{0},
      rate_limited{0}, header_timeouts{0}, render_timeouts{0}, unknown_peers{0};
};

class Session;

}  // namespace

struct MetricsHttpServer::Impl : std::enable_shared_from_this<Impl> {
  Impl(asio::io_context& io, asio::io_context& loop_io, RenderFn r, const MetricsHttpOptions& o)
      : http_io(io),
        acceptor(io),
        accept_timer(io),
        render_timer(io),
        loop(loop_io.get_executor()),
        bridge(std::make_shared<RenderBridge>()),
        opt(o) {
    bridge->render = std::move(r);
    bridge->http = &io;
  }

  void Accept();
  void Admit(tcp::socket socket);
  std::optional<uid_t> PeerUid(tcp::socket& socket);
  // Closes the session that has waited longest for its request head (of
  // `uid` only, when given); false when none waits for one.
  bool EvictOne(std::optional<uid_t> uid = std::nullopt);
  // False (and the seconds until the next token) when `uid` is over its rate.
  bool TakeToken(std::optional<uid_t> uid, int* retry_after);
  void Register(Session* s, std::optional<uid_t> uid);
  void Release(Session* s, std::optional<uid_t> uid);
  void WantRender(const std::shared_ptr<Session>& s);
  void ScheduleRender();
  void StartRender();
  void OnRendered(const std::shared_ptr<const RenderResult>& result);
  void CloseAll();

  asio::io_context& http_io;
  tcp::acceptor acceptor;
  asio::steady_timer accept_timer;
  asio::steady_timer render_timer;
  asio::io_context::executor_type loop;
  std::shared_ptr<RenderBridge> bridge;
  MetricsHttpOptions opt;
  std::optional<TcpPeerUids> uids;
  bool warned_unknown = false;
  std::vector<Session*> sessions;
  std::map<uid_t, Peer> peers;
  std::vector<std::weak_ptr<Session>> waiters;    // for the next render
  std::vector<std::weak_ptr<Session>> rendering;  // for the render in flight
  bool render_in_flight = false;
  bool render_timer_armed = false;
  std::optional<SteadyClock::time_point> last_render;
  bool stopped = false;
  AtomicStats stats;
};

namespace {

class Session : public std::enable_shared_from_this<Session> {
 public:
  enum class State { kHead, kWaiting, kWriting, kClosed };

  Session(tcp::socket socket, std::shared_ptr<MetricsHttpServer::Impl> server,
          std::optional<uid_t> uid)
      : stream_(std::move(socket)),
        wait_timer_(server->http_io),
        server_(std::move(server)),
        uid_(uid) {
    server_->Register(this, uid_);
  }
  ~Session() { Finish(); }

  State state() const { return state_; }
  SteadyClock::time_point since() const { return since_; }
  std::optional<uid_t> uid() const { return uid_; }

  // Waits for the next request head (at most opt.header_deadline).
  void Read() {
    state_ = State::kHead;
    since_ = SteadyClock::now();
    parser_.emplace();
    parser_->header_limit(kHeaderLimit);
    parser_->body_limit(0);
    stream_.expires_after(server_->opt.header_deadline);
    http::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->OnRead(ec); });
  }

  // Closes the connection and gives its place back; idempotent.
  void Finish() {
    if (state_ == State::kClosed) return;
    LeaveWaiting();
    state_ = State::kClosed;
    wait_timer_.cancel();
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.socket().close(ec);
    server_->Release(this, uid_);
  }

  void OnRendered(const std::shared_ptr<const RenderResult>& r) {
    if (state_ != State::kWaiting) return;
    if (!r->ok) {
      return Respond(http::status::internal_server_error, r->text + "\n", false, head_, kPlain);
    }
    Respond(http::status::ok, r->text, keep_, head_, kExposition);
  }

 private:
  void OnRead(beast::error_code ec) {
    if (state_ == State::kClosed) return;
    if (ec == http::error::end_of_stream || ec == asio::error::operation_aborted) return Finish();
    if (ec == beast::error::timeout) {
      ++server_->stats.header_timeouts;
      return Finish();
    }
    if (ec)
      return Respond(http::status::bad_request, "bad request: " + ec.message() + "\n", false, false,
                     kPlain);
    const auto& req = parser_->get();
    bool keep = req.keep_alive();
    bool head = req.method() == http::verb::head;
    int retry_after = 0;
    if (!server_->TakeToken(uid_, &retry_after)) {
      ++server_->stats.rate_limited;
      return Respond(http::status::too_many_requests,
                     "too many requests from uid " + std::to_string(*uid_) + " (at most " +
                         FormatRate() + "); retry after " + std::to_string(retry_after) + " s\n",
                     false, head, kPlain, retry_after);
    }
    if (req.method() != http::verb::get && !head) {
      return Respond(http::status::method_not_allowed, "only GET and HEAD\n", keep, false, kPlain);
    }
    std::string_view target(req.target().data(), req.target().size());
    target = target.substr(0, target.find('?'));
    if (target != "/metrics") {
      return Respond(http::status::not_found, "cxlpoold serves metrics at /metrics\n", keep, head,
                     kPlain);
    }
    state_ = State::kWaiting;
    ++server_->stats.waiting;
    keep_ = keep;
    head_ = head;
    wait_timer_.expires_after(server_->opt.render_deadline);
    wait_timer_.async_wait([self = shared_from_this()](beast::error_code wec) {
      if (wec || self->state_ != State::kWaiting) return;
      ++self->server_->stats.render_timeouts;
      self->Respond(http::status::service_unavailable,
                    "the daemon's event loop did not render the metrics in time\n", false,
                    self->head_, kPlain, 1);
    });
    server_->WantRender(shared_from_this());
  }

  std::string FormatRate() const {
    return std::to_string(static_cast<long>(server_->opt.peer_rate_per_sec)) +
           " a second, bursts of " + std::to_string(static_cast<long>(server_->opt.peer_burst));
  }

  void LeaveWaiting() {
    if (state_ == State::kWaiting) --server_->stats.waiting;
  }

  void Respond(http::status status, std::string body, bool keep, bool head,
               const char* content_type, int retry_after = 0) {
    if (state_ == State::kClosed) return;
    LeaveWaiting();
    wait_timer_.cancel();
    state_ = State::kWriting;
    auto res = std::make_shared<http::response<http::string_body>>(status, 11);
    res->set(http::field::server, "cxlpoold");
    res->set(http::field::content_type, content_type);
    if (status == http::status::method_not_allowed) res->set(http::field::allow, "GET, HEAD");
    if (retry_after > 0) res->set(http::field::retry_after, std::to_string(retry_after));
    res->keep_alive(keep);
    size_t length = body.size();
    if (!head) res->body() = std::move(body);
    res->content_length(length);
    stream_.expires_after(server_->opt.write_deadline);
    http::async_write(stream_, *res,
                      [self = shared_from_this(), res, keep](beast::error_code ec, size_t) {
                        if (self->state_ == State::kClosed) return;
                        if (ec || !keep) return self->Finish();
                        self->Read();
                      });
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::empty_body>> parser_;
  asio::steady_timer wait_timer_;
  std::shared_ptr<MetricsHttpServer::Impl> server_;
  std::optional<uid_t> uid_;
  State state_ = State::kHead;
  SteadyClock::time_point since_ = SteadyClock::now();
  bool keep_ = false;
  bool head_ = false;
};

}  // namespace

void MetricsHttpServer::Impl::Accept() {
  acceptor.async_accept([self = shared_from_this()](beast::error_code ec, tcp::socket socket) {
    if (self->stopped || ec == asio::error::operation_aborted) return;
    if (!ec) {
      self->Admit(std::move(socket));
      return self->Accept();
    }
    // EMFILE and the like: retry a little later instead of spinning.
    CXLPOOL_LOG(kWarning) << "metrics http: accept: " << ec.message();
    self->accept_timer.expires_after(kAcceptBackoff);
    self->accept_timer.async_wait([self](beast::error_code tec) {
      if (!tec && !self->stopped) self->Accept();
    });
  });
}

std::optional<uid_t> MetricsHttpServer::Impl::PeerUid(tcp::socket& socket) {
  std::optional<uid_t> uid;
  sockaddr_storage local{}, peer{};
  socklen_t llen = sizeof local, plen = sizeof peer;
  int fd = socket.native_handle();
  if (uids && ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &llen) == 0 &&
      ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &plen) == 0) {
    uid = uids->Lookup(local, peer);
  }
  if (!uid) {
    ++stats.unknown_peers;
    if (!warned_unknown) {
      warned_unknown = true;
      CXLPOOL_LOG(kWarning) << "metrics http: the uid of a client could not be found (the socket "
                               "is in another network namespace?); clients of unknown uid share "
                               "the endpoint without per-peer limits";
    }
  }
  return uid;
}

void MetricsHttpServer::Impl::Admit(tcp::socket socket) {
  std::optional<uid_t> uid = PeerUid(socket);
  auto refuse = [&] {
    ++stats.refused;
    beast::error_code ignored;
    socket.close(ignored);  // the scraper retries
  };
  if (uid) {
    auto now = SteadyClock::now();
    if (peers.size() > 256) {  // forget idle peers whose bucket is full again
      std::erase_if(peers, [&](const auto& kv) {
        const Peer& p = kv.second;
        double refill = std::chrono::duration<double>(now - p.refilled).count();
        return p.sessions == 0 && p.tokens + refill * opt.peer_rate_per_sec >= opt.peer_burst;
      });
    }
    Peer& p = peers.try_emplace(*uid, Peer{0, opt.peer_burst, now}).first->second;
    // At its cap: its own longest-idle connection makes room, else refused.
    if (p.sessions >= opt.max_sessions_per_peer && !EvictOne(uid)) return refuse();
  }
  if (static_cast<int>(sessions.size()) >= opt.max_sessions && !EvictOne()) return refuse();
  std::make_shared<Session>(std::move(socket), shared_from_this(), uid)->Read();
}

bool MetricsHttpServer::Impl::EvictOne(std::optional<uid_t> uid) {
  Session* victim = nullptr;
  for (Session* s : sessions) {
    if (uid && s->uid() != uid) continue;
    if (s->state() == Session::State::kHead && (!victim || s->since() < victim->since())) {
      victim = s;
    }
  }
  if (!victim) return false;
  ++stats.evicted;
  victim->Finish();
  return true;
}

bool MetricsHttpServer::Impl::TakeToken(std::optional<uid_t> uid, int* retry_after) {
  if (!uid) return true;
  auto now = SteadyClock::now();
  Peer& p = peers.try_emplace(*uid, Peer{0, opt.peer_burst, now}).first->second;
  double elapsed = std::chrono::duration<double>(now - p.refilled).count();
  p.tokens = std::min(opt.peer_burst, p.tokens + elapsed * opt.peer_rate_per_sec);
  p.refilled = now;
  if (p.tokens >= 1) {
    p.tokens -= 1;
    return true;
  }
  *retry_after = std::max(1, static_cast<int>(std::ceil((1 - p.tokens) / opt.peer_rate_per_sec)));
  return false;
}

void MetricsHttpServer::Impl::Register(Session* s, std::optional<uid_t> uid) {
  sessions.push_back(s);
  if (uid) ++peers[*uid].sessions;
  stats.sessions = sessions.size();
}

void MetricsHttpServer::Impl::Release(Session* s, std::optional<uid_t> uid) {
  std::erase(sessions, s);
  if (uid) {
    if (auto it = peers.find(*uid); it != peers.end()) --it->second.sessions;
  }
  stats.sessions = sessions.size();
}

void MetricsHttpServer::Impl::WantRender(const std::shared_ptr<Session>& s) {
  waiters.push_back(s);
  ScheduleRender();
}

// At most one render in flight, and render starts at least
// min_render_interval apart; a scrape waits for one that starts after it.
void MetricsHttpServer::Impl::ScheduleRender() {
  if (stopped || render_in_flight || render_timer_armed || waiters.empty()) return;
  if (!last_render) return StartRender();
  auto due = *last_render + opt.min_render_interval;
  if (SteadyClock::now() >= due) return StartRender();
  render_timer_armed = true;
  render_timer.expires_at(due);
  render_timer.async_wait([self = shared_from_this()](beast::error_code ec) {
    self->render_timer_armed = false;
    if (!ec) self->ScheduleRender();
  });
}

void MetricsHttpServer::Impl::StartRender() {
  render_in_flight = true;
  last_render = SteadyClock::now();
  ++stats.renders;
  rendering = std::move(waiters);
  waiters.clear();
  asio::post(loop, [bridge = bridge, weak = weak_from_this()] {
    {
      MutexLock lock(bridge->mu);
      if (bridge->closed) return;
    }
    auto result = std::make_shared<RenderResult>();
    try {
      result->text = bridge->render();
      result->ok = true;
    } catch (const std::exception& e) {
      result->text = std::string("rendering metrics failed: ") + e.what();
    } catch (...) {
      result->text = "rendering metrics failed";
    }
    MutexLock lock(bridge->mu);
    if (bridge->closed) return;
    asio::post(*bridge->http, [weak, result] {
      if (auto self = weak.lock()) self->OnRendered(result);
    });
  });
}

void MetricsHttpServer::Impl::OnRendered(const std::shared_ptr<const RenderResult>& result) {
  render_in_flight = false;
  auto batch = std::move(rendering);
  rendering.clear();
  for (auto& w : batch) {
    if (auto s = w.lock()) s->OnRendered(result);
  }
  ScheduleRender();
}

void MetricsHttpServer::Impl::CloseAll() {
  stopped = true;
  beast::error_code ec;
  acceptor.close(ec);
  accept_timer.cancel();
  render_timer.cancel();
  while (!sessions.empty()) sessions.back()->Finish();
  waiters.clear();
  rendering.clear();
}

namespace {

Status CheckOptions(const MetricsHttpOptions& o) {
  if (o.max_sessions < 1 || o.max_sessions_per_peer < 1 ||
      o.max_sessions_per_peer > o.max_sessions || o.header_deadline.count() <= 0 ||
      o.write_deadline.count() <= 0 || o.render_deadline.count() <= 0 ||
      o.min_render_interval.count() < 0 || !(o.peer_rate_per_sec > 0) || !(o.peer_burst >= 1)) {
    return Status(Code::kInvalidArgument, "metrics http: bad limits");
  }
  return Status();
}

}  // namespace

Result<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Serve(
    std::unique_ptr<asio::io_context> io, std::shared_ptr<Impl> impl) {
  auto uids = TcpPeerUids::Open();
  if (uids.ok()) {
    impl->uids.emplace(std::move(*uids));
  } else {
    CXLPOOL_LOG(kWarning) << "metrics http: " << uids.status().ToString()
                          << "; clients' uids are unknown, no per-peer limits";
  }
  asio::post(*io, [impl] { impl->Accept(); });
  std::unique_ptr<MetricsHttpServer> server(new MetricsHttpServer(std::move(io), std::move(impl)));
  return server;
}

MetricsHttpServer::MetricsHttpServer(std::unique_ptr<asio::io_context> io,
                                     std::shared_ptr<Impl> impl)
    : io_(std::move(io)), impl_(std::move(impl)) {
  beast::error_code ec;
  auto ep = impl_->acceptor.local_endpoint(ec);
  port_ = ec ? 0 : ep.port();
  thread_ = std::thread([io = io_.get()] {
    ::pthread_setname_np(::pthread_self(), "cxlpool-http");
    io->run();
  });
}

Result<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Create(
    asio::io_context& loop, const std::string& listen, RenderFn render,
    const MetricsHttpOptions& options) {
  CXLPOOL_RETURN_IF_ERROR(CheckOptions(options));
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
  auto io = std::make_unique<asio::io_context>(1);
  auto impl = std::make_shared<Impl>(*io, loop, std::move(render), options);
  tcp::endpoint endpoint(addr, any_port ? 0 : ep->port);
  impl->acceptor.open(endpoint.protocol(), ec);
  if (!ec) impl->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) impl->acceptor.bind(endpoint, ec);
  if (!ec) impl->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return Status(Code::kUnavailable, "metrics.http_listen " + listen + ": " + ec.message());
  }
  return Serve(std::move(io), std::move(impl));
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

Result<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::FromListeningFd(
    asio::io_context& loop, int fd, RenderFn render, const MetricsHttpOptions& options) {
  if (Status st = CheckOptions(options); !st.ok()) {
    ::close(fd);
    return st;
  }
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
  auto io = std::make_unique<asio::io_context>(1);
  auto impl = std::make_shared<Impl>(*io, loop, std::move(render), options);
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
  return Serve(std::move(io), std::move(impl));
}

MetricsHttpServer::~MetricsHttpServer() {
  Stop();
  impl_.reset();
  io_.reset();  // drops what the stopped io_context still held (sessions, the acceptor)
}

MetricsHttpStats MetricsHttpServer::stats() const {
  const AtomicStats& a = impl_->stats;
  return MetricsHttpStats{a.sessions,        a.waiting,         a.renders,
                          a.refused,         a.evicted,         a.rate_limited,
                          a.header_timeouts, a.render_timeouts, a.unknown_peers};
}

void MetricsHttpServer::Stop() {
  if (!thread_.joinable()) return;
  {
    MutexLock lock(impl_->bridge->mu);
    impl_->bridge->closed = true;
  }
  asio::post(*io_, [impl = impl_, io = io_.get()] {
    impl->CloseAll();
    io->stop();
  });
  thread_.join();
}

}  // namespace cxlpool
