// The EtcdCluster fixture (tests/support/etcd_cluster.h) against a real
// etcd-server 3.4: three members on loopback with TLS certificates made by
// the test, a put and get over TLS, a client without a certificate refused,
// the leader SIGKILLed (writes go on, a new leader is elected) and restarted
// (healthy again, it holds the key), a member SIGSTOPped and continued.
// Then one plain-http member, the errors (a missing binary, a member that
// exits) and a start again on other ports when one was taken under etcd.
// Skipped when etcd, etcdctl or openssl is not installed.
#include "etcd_cluster.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "test_support.h"

namespace cxlpool::testsupport {
namespace {

using Clock = std::chrono::steady_clock;

int64_t MsSince(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
}

std::string Trimmed(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  return s;
}

// Start, or skip the test when a binary is missing.
#define START_OR_SKIP(var, options)                                                       \
  auto var##_r = EtcdCluster::Start(options);                                             \
  if (!var##_r.ok() && var##_r.status().code() == Code::kUnsupported) {                   \
    GTEST_SKIP() << var##_r.status().message();                                           \
  }                                                                                       \
  ASSERT_TRUE(var##_r.ok()) << var##_r.status().ToString();                               \
  std::unique_ptr<EtcdCluster> var = std::move(*var##_r);                                 \
  std::fprintf(stderr, "etcd cluster of %d in %s: %s\n", var->size(), var->dir().c_str(), \
               var->endpoints_csv().c_str())

// A process state letter from /proc/<pid>/stat ('T' when stopped).
char ProcState(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(f, line);
  auto p = line.rfind(')');
  return p == std::string::npos || p + 2 >= line.size() ? '?' : line[p + 2];
}

TEST(EtcdClusterTest, TlsClusterSurvivesLeaderKillAndRestart) {
  auto t0 = Clock::now();
  START_OR_SKIP(c, EtcdClusterOptions{});
  std::fprintf(stderr, "healthy after %lld ms\n", static_cast<long long>(MsSince(t0)));
  ASSERT_EQ(c->size(), 3);
  ASSERT_EQ(c->endpoints().size(), 3u);
  for (const auto& e : c->endpoints()) EXPECT_EQ(e.rfind("127.0.0.1:", 0), 0u) << e;
  const std::string csv = c->endpoints_csv();
  EXPECT_EQ(std::count(csv.begin(), csv.end(), ','), 2) << csv;
  for (int i = 0; i < 3; ++i) {
    EXPECT_GT(c->member_pid(i), 0);
    EXPECT_NE(c->member_id(i), 0u);
  }
  for (const auto& f : {c->ca_file(), c->client_cert_file(), c->client_key_file()}) {
    EXPECT_TRUE(std::ifstream(f).good()) << f;
  }

  // Put and get over TLS with the client certificate.
  auto put = c->Ctl({"put", "/cxlpool/test/key", "v1"});
  ASSERT_TRUE(put.ok()) << put.status().ToString();
  EXPECT_EQ(Trimmed(*put), "OK");
  auto got = c->Ctl({"get", "--print-value-only", "/cxlpool/test/key"});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(Trimmed(*got), "v1");

  // Without a client certificate the TLS handshake is refused.
  EtcdCtlOptions nocert;
  nocert.client_cert = false;
  nocert.command_timeout_ms = 1500;
  auto refused = c->CtlRun({"get", "/cxlpool/test/key"}, nocert);
  ASSERT_TRUE(refused.ok()) << refused.status().ToString();
  EXPECT_NE(refused->exit_code, 0) << "a client without a certificate was served: " << refused->out;
  EXPECT_EQ(refused->out.find("v1"), std::string::npos) << refused->out;
  // Plain http on a TLS port: refused too.
  auto plain = c->CtlRun({"get", "/cxlpool/test/key"},
                         EtcdCtlOptions{.endpoints = {"http://" + c->endpoint(0)},
                                        .ca = false,
                                        .client_cert = false,
                                        .dial_timeout_ms = 1000,
                                        .command_timeout_ms = 1500});
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_NE(plain->exit_code, 0) << plain->out;

  // Kill the leader: a put through the two others succeeds within a few
  // seconds, and they elect a new leader.
  int leader = c->leader_index();
  ASSERT_GE(leader, 0) << c->LogTails();
  std::fprintf(stderr, "leader is member%d (pid %d)\n", leader, c->member_pid(leader));
  auto t_kill = Clock::now();
  ASSERT_TRUE(c->KillMember(leader).ok());
  EXPECT_EQ(c->member_pid(leader), -1);
  EXPECT_FALSE(c->member_running(leader));
  bool written = false;
  std::string last_err;
  int attempts = 0;
  while (!written && MsSince(t_kill) < 8000) {
    ++attempts;
    auto p = c->Ctl({"put", "/cxlpool/test/key", "v2"},
                    EtcdCtlOptions{.command_timeout_ms = 1000});  // the live members
    written = p.ok();
    if (!written) last_err = p.status().ToString();
  }
  ASSERT_TRUE(written) << "no put within 8 s after killing the leader: " << last_err << "\n"
                       << c->LogTails();
  std::fprintf(stderr, "put after leader kill took %lld ms, %d tries (last error: %s)\n",
               static_cast<long long>(MsSince(t_kill)), attempts, last_err.c_str());
  int new_leader = -1;
  while (MsSince(t_kill) < 8000) {
    new_leader = c->leader_index();
    if (new_leader >= 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_GE(new_leader, 0) << c->LogTails();
  EXPECT_NE(new_leader, leader);
  EXPECT_TRUE(c->member_running(new_leader));
  std::fprintf(stderr, "new leader member%d after %lld ms\n", new_leader,
               static_cast<long long>(MsSince(t_kill)));

  // Restart the killed member on its data dir: healthy, and its own store
  // (a serializable read from it alone) holds the value written while it
  // was down.
  auto t_restart = Clock::now();
  Status st = c->RestartMember(leader);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_GT(c->member_pid(leader), 0);
  std::fprintf(stderr, "member%d healthy again after %lld ms\n", leader,
               static_cast<long long>(MsSince(t_restart)));
  std::string seen;
  while (MsSince(t_restart) < 10000) {
    auto g = c->Ctl({"get", "--consistency=s", "--print-value-only", "/cxlpool/test/key"},
                    EtcdCtlOptions{.endpoints = {c->endpoint(leader)}});
    if (g.ok()) seen = Trimmed(*g);
    if (seen == "v2") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(seen, "v2") << c->MemberLogTail(leader);
  auto all = c->Ctl({"endpoint", "health"});
  EXPECT_TRUE(all.ok()) << all.status().ToString();

  // SIGSTOP and SIGCONT a member: the process is stopped, then healthy again.
  int other = (leader + 1) % 3;
  ASSERT_TRUE(c->StopMember(other).ok());
  EXPECT_TRUE(c->member_stopped(other));
  EXPECT_EQ(ProcState(c->member_pid(other)), 'T');
  ASSERT_TRUE(c->ContMember(other).ok());
  EXPECT_FALSE(c->member_stopped(other));
  st = c->WaitHealthy(10000);
  EXPECT_TRUE(st.ok()) << st.ToString();
  std::fprintf(stderr, "whole test %lld ms\n", static_cast<long long>(MsSince(t0)));
}

TEST(EtcdClusterTest, PlainSingleMember) {
  START_OR_SKIP(c, (EtcdClusterOptions{.members = 1, .tls = false}));
  EXPECT_TRUE(c->ca_file().empty());
  EXPECT_EQ(c->client_url(0).rfind("http://", 0), 0u);
  EXPECT_EQ(c->leader_index(), 0);
  auto put = c->Ctl({"put", "k", "plain"});
  ASSERT_TRUE(put.ok()) << put.status().ToString();
  auto got = c->Ctl({"get", "--print-value-only", "k"});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(Trimmed(*got), "plain");
  // The data dir goes with the cluster.
  std::string dir = c->dir();
  c.reset();
  EXPECT_FALSE(std::ifstream(dir + "/member0/etcd.log").good()) << dir;
}

TEST(EtcdClusterTest, MissingBinaryIsUnsupported) {
  EtcdClusterOptions o;
  o.etcd_binary = "/nonexistent/etcd";
  auto r = EtcdCluster::Start(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kUnsupported);
  EXPECT_NE(r.status().message().find("etcd"), std::string::npos) << r.status().message();
}

// A member that exits at once fails Start quickly, with its log.
TEST(EtcdClusterTest, MemberThatExitsIsReported) {
  EtcdClusterOptions o;
  o.members = 1;
  o.tls = false;
  o.etcd_binary = "/bin/false";
  auto t0 = Clock::now();
  auto r = EtcdCluster::Start(o);
  if (!r.ok() && r.status().code() == Code::kUnsupported) GTEST_SKIP() << r.status().message();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kUnavailable) << r.status().ToString();
  EXPECT_NE(r.status().message().find("member0 exited with code 1"), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("--- member0"), std::string::npos) << r.status().message();
  EXPECT_LT(MsSince(t0), 5000);
}

// A port taken between its pick and etcd's bind: Start goes again on
// other ports. The first etcd run here says so and exits, as etcd does.
TEST(EtcdClusterTest, PortTakenUnderEtcdStartsAgain) {
  TempDir tmp("etcd-wrap");
  ASSERT_FALSE(tmp.path.empty());
  const std::string wrapper = tmp.path + "/etcd";
  {
    std::ofstream w(wrapper);
    w << "#!/bin/sh\n"
      << "if [ ! -e " << tmp.path << "/once ]; then\n"
      << "  : > " << tmp.path << "/once\n"
      << "  echo 'listen tcp 127.0.0.1:1: bind: address already in use' >&2\n"
      << "  exit 1\n"
      << "fi\n"
      << "exec etcd \"$@\"\n";
  }
  ASSERT_EQ(::chmod(wrapper.c_str(), 0755), 0);
  EtcdClusterOptions o;
  o.members = 1;
  o.tls = false;
  o.etcd_binary = wrapper;
  START_OR_SKIP(c, o);
  EXPECT_TRUE(std::ifstream(tmp.path + "/once").good());
  auto put = c->Ctl({"put", "k", "again"});
  EXPECT_TRUE(put.ok()) << put.status().ToString();
}

}  // namespace
}  // namespace cxlpool::testsupport
