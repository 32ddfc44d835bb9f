// Tenants and metrics with the real cxlpoold (pid tracked, never killall) on a
// temporary socket and state directory. The test's own gid is the daemon's
// admin group, so it runs without root:
//   - `quota set` is enforced, written to <state_dir>/quotas.toml, and
//     survives a plain stop + start with the same state directory;
//   - SIGHUP applies a changed config file without dropping a lease, and a
//     bad one is logged while the running config stays;
//   - promtool accepts `cxlpoolctl metrics` (its own ctest entry, skipped
//     with 77 without promtool), and the loopback HTTP endpoint serves the
//     same families and series.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include "cxlpool/proto/codec.h"
#include "test_support.h"

namespace cxlpool {
namespace {

using testsupport::kMiB;
using testsupport::ReadFileOrEmpty;

Result<testsupport::RawClient> Connect(const std::string& path) {
  return testsupport::RawClient::Connect(path, "tenants-test");
}

uint16_t FreeLoopbackPort() {
  UniqueFd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (::bind(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(s.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    return 0;
  }
  return ntohs(a.sin_port);
}

// "name{labels} value" lines -> the set of "name{labels}".
std::set<std::string> Series(const std::string& text) {
  std::set<std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    out.insert(line.substr(0, line.rfind(' ')));
  }
  return out;
}

class TenantsDaemonTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (::access(testsupport::CtlBinary().c_str(), X_OK) != 0) {
      testsupport::Skip("no cxlpoolctl at " + testsupport::CtlBinary());
    }
    testsupport::SkipWithoutDaemon();
  }

  void SetUp() override {
    ASSERT_TRUE(daemon_.MakeDir().ok());
    dir_ = daemon_.dir();
    socket_ = daemon_.socket();
    log_ = daemon_.log_path();
    daemon_.set_log_to_file(true);
    port_ = FreeLoopbackPort();
    ASSERT_NE(port_, 0);
    Status st = daemon_.Start(Config(""));
    ASSERT_TRUE(st.ok()) << st.ToString();
  }

  std::string Config(const std::string& extra) {
    std::ostringstream c;
    c << "[daemon]\nsocket_mode = \"0600\"\nlog_level = \"info\"\n"
      << "admin_group = \"" << ::getegid() << "\"\n"
      << "state_dir = \"" << dir_ << "/state\"\n"
      << "[pools]\ncapacity = \"64M\"\npin = false\n"
      << "[metrics]\nhttp_listen = \"127.0.0.1:" << port_ << "\"\n"
      << extra;
    return c.str();
  }

  void WriteConfig(const std::string& extra) {
    ASSERT_TRUE(daemon_.WriteConfig(Config(extra)).ok());
  }

  // Starts the daemon again over the same dir (state dir included).
  void Start() {
    Status st = daemon_.Restart();
    ASSERT_TRUE(st.ok()) << st.ToString();
  }

  void Stop() {
    if (!daemon_.started()) return;
    Status st = daemon_.Stop();
    EXPECT_TRUE(st.ok()) << st.ToString();
  }

  void TearDown() override { Stop(); }

  Status SetQuota(const std::string& scope, const std::string& subject, uint64_t max_bytes,
                  uint64_t max_leases) {
    auto c = Connect(socket_);
    if (!c.ok()) return c.status();
    proto::QuotaSetRequest req;
    req.mutable_quota()->set_scope(scope);
    req.mutable_quota()->set_subject(subject);
    req.mutable_quota()->set_max_bytes(max_bytes);
    req.mutable_quota()->set_max_leases(max_leases);
    proto::QuotaSetReply rep;
    return c->Call(req, &rep);
  }

  uint64_t LeasedBytes() {
    auto c = Connect(socket_);
    if (!c.ok()) return UINT64_MAX;
    proto::StatsReply r;
    if (!c->Call(proto::StatsRequest(), &r).ok()) return UINT64_MAX;
    auto it = r.gauges().find("leased_bytes");
    return it == r.gauges().end() ? UINT64_MAX : it->second;
  }

  std::vector<proto::Quota> Quotas() {
    auto c = Connect(socket_);
    EXPECT_TRUE(c.ok());
    proto::QuotasReply r;
    EXPECT_TRUE(c->Call(proto::QuotasRequest(), &r).ok());
    return {r.quotas().begin(), r.quotas().end()};
  }

  // Polls (no fixed sleep) until `pred`, up to 10 s.
  static bool WaitFor(const std::function<bool()>& pred) {
    return testsupport::PollUntil(pred, 10000, 10);
  }

  // Runs a shell command, returns its exit code and output (stderr too).
  static std::pair<int, std::string> Sh(const std::string& cmd) {
    return testsupport::RunShell(cmd + " 2>&1");
  }

  std::string HttpGet(const std::string& path) {
    UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port_);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return "";
    timeval tv{10, 0};
    ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    std::string req = "GET " + path + " HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";
    (void)!::send(fd.get(), req.data(), req.size(), MSG_NOSIGNAL);
    std::string in;
    char buf[4096];
    ssize_t n;
    while ((n = ::recv(fd.get(), buf, sizeof buf, 0)) > 0) in.append(buf, static_cast<size_t>(n));
    return in;
  }

  testsupport::Daemon daemon_;
  std::string dir_, socket_, log_;
  uint16_t port_ = 0;
};

TEST_F(TenantsDaemonTest, QuotaSetIsEnforcedPersistedAndSurvivesRestart) {
  std::string me = std::to_string(::geteuid());
  ASSERT_TRUE(SetQuota("uid", me, 0, 1).ok());
  auto check = [&] {
    auto c = Connect(socket_);
    ASSERT_TRUE(c.ok());
    UniqueFd a, b;
    ASSERT_TRUE(c->Alloc(kMiB, &a).ok());
    auto second = c->Alloc(kMiB, &b);
    ASSERT_FALSE(second.ok());
    EXPECT_EQ(second.status().code(), Code::kResourceExhausted);
    EXPECT_NE(second.status().message().find("uid " + me + " (all tiers) max_leases 1, used 1"),
              std::string::npos)
        << second.status().message();
  };
  check();
  std::string stored = ReadFileOrEmpty(dir_ + "/state/quotas.toml");
  EXPECT_NE(stored.find("uid = "), std::string::npos) << stored;
  EXPECT_NE(stored.find(me), std::string::npos) << stored;
  // A cgroup rule goes through the same path; a bad one is refused.
  EXPECT_TRUE(SetQuota("cgroup", "/tenants.slice//a/", 8 * kMiB, 0).ok());
  EXPECT_EQ(SetQuota("cgroup", "relative", kMiB, 0).code(), Code::kInvalidArgument);
  EXPECT_EQ(SetQuota("project", "x", kMiB, 0).code(), Code::kInvalidArgument);
  // The client above is gone: once nothing is leased, a plain stop and start.
  ASSERT_TRUE(WaitFor([&] { return LeasedBytes() == 0; }));
  Stop();
  Start();
  auto q = Quotas();
  ASSERT_EQ(q.size(), 2u);
  std::set<std::string> subjects;
  for (const auto& r : q) subjects.insert(r.scope() + " " + r.subject());
  EXPECT_TRUE(subjects.count("uid " + me));
  EXPECT_TRUE(subjects.count("cgroup /tenants.slice/a"));
  check();
}

TEST_F(TenantsDaemonTest, SighupReloadsGoodConfigAndKeepsOldOnBad) {
  auto holder = Connect(socket_);
  ASSERT_TRUE(holder.ok());
  UniqueFd fd;
  auto lease = holder->Alloc(2 * kMiB, &fd);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  std::string me = std::to_string(::geteuid());
  WriteConfig("[[quota]]\nuid = " + me + "\nmax_bytes = \"3M\"\npriority = 4\n");
  ASSERT_EQ(::kill(daemon_.pid(), SIGHUP), 0);
  ASSERT_TRUE(WaitFor([&] { return Quotas().size() == 1; })) << ReadFileOrEmpty(log_);
  auto q = Quotas()[0];
  EXPECT_EQ(q.max_bytes(), 3 * kMiB);
  EXPECT_EQ(q.priority(), 4);
  EXPECT_EQ(q.used_bytes(), 2 * kMiB) << "the held lease is charged to the new rule";
  UniqueFd over;
  auto refused = holder->Alloc(2 * kMiB, &over);
  EXPECT_EQ(refused.status().code(), Code::kResourceExhausted);

  ASSERT_TRUE(daemon_.WriteConfig("[pools]\ncapacity = \"lots\"\n").ok());
  ASSERT_EQ(::kill(daemon_.pid(), SIGHUP), 0);
  ASSERT_TRUE(WaitFor([&] {
    return ReadFileOrEmpty(log_).find("SIGHUP: config not reloaded") != std::string::npos;
  })) << ReadFileOrEmpty(log_);
  EXPECT_NE(ReadFileOrEmpty(log_).find("pools.capacity"), std::string::npos)
      << ReadFileOrEmpty(log_);
  ASSERT_EQ(Quotas().size(), 1u) << "the running config stays";
  proto::StatRequest st;
  st.set_lease_id(lease->id());
  proto::StatReply sr;
  EXPECT_TRUE(holder->Call(st, &sr).ok()) << "the lease survived both reloads";
}

TEST_F(TenantsDaemonTest, PromtoolAcceptsMetricsAndHttpServesTheSame) {
  if (std::system("command -v promtool >/dev/null 2>&1") != 0) {
    std::fprintf(stderr, "promtool missing (Debian package prometheus): skipped\n");
    std::exit(77);
  }
  auto c = Connect(socket_);
  ASSERT_TRUE(c.ok());
  UniqueFd a;
  ASSERT_TRUE(c->Alloc(3 * kMiB, &a).ok());
  auto [rc, text] = Sh("'" + testsupport::CtlBinary() + "' metrics --socket '" + socket_ + "'");
  ASSERT_EQ(rc, 0) << text;
  EXPECT_NE(text.find("cxlpool_grants_total{"), std::string::npos) << text;
  EXPECT_NE(text.find("cxlpool_dumpable 0\n"), std::string::npos) << "PR_SET_DUMPABLE 0";
  std::string path = dir_ + "/metrics.prom";
  std::ofstream(path) << text;
  auto [prc, pout] = Sh("promtool check metrics < '" + path + "'");
  EXPECT_EQ(prc, 0) << pout;

  std::string http = HttpGet("/metrics");
  ASSERT_EQ(http.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << http;
  std::string body = http.substr(http.find("\r\n\r\n") + 4);
  EXPECT_EQ(Series(body), Series(text));
  auto line = [](const std::string& t, const std::string& prefix) {
    auto p = t.find(prefix);
    return p == std::string::npos ? std::string() : t.substr(p, t.find('\n', p) - p);
  };
  std::string leased = "cxlpool_pool_leased_bytes{";
  EXPECT_EQ(line(body, leased), line(text, leased));
  EXPECT_NE(line(body, leased), "");
  EXPECT_EQ(HttpGet("/").rfind("HTTP/1.1 404", 0), 0u);
}

}  // namespace
}  // namespace cxlpool
