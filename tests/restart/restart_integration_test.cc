// Restart without losing a lease, with real cxlpoold processes (temp socket,
// temp state dir, pids tracked) SIGKILLed and started again:
//   * a private lease and a shared one held by two processes survive: the
//     new daemon refuses grants (UNAVAILABLE "daemon restarting") until the
//     holders hand their fds back, then lists the same ids, owners and
//     holders, accounts exactly what is held, never reuses an id and never
//     grants beyond capacity; the holders' mappings kept their data;
//   * a lease whose owner died while the daemon was down is dropped;
//   * an idle libcxlpool client (no calls at all) is reclaimed by its
//     background watcher, and its application sees no interruption.
#include <gtest/gtest.h>

#include <algorithm>

#include "cxlpool/client.hpp"
#include "library_holder.h"
#include "restart_util.h"

namespace cxlpool::restart {
namespace {

using testsupport::Accounting;
using testsupport::Daemon;
using testsupport::kMiB;
using testsupport::PollUntil;
using testsupport::RawClient;

// A process holding leases over the raw protocol; it reclaims only when told.
struct RawHolder {
  std::string socket;
  std::optional<RawClient> c;
  struct Held {
    proto::LeaseInfo info;
    UniqueFd fd;
    void* map = nullptr;
    uint64_t tag = 0;
  };
  std::vector<Held> held;

  uint64_t Keep(Result<proto::LeaseInfo> l, UniqueFd fd, uint64_t tag, bool fill) {
    if (!l.ok()) return 0;
    Held h;
    h.info = *l;
    h.fd = std::move(fd);
    h.tag = tag;
    h.map = ::mmap(nullptr, l->size_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, h.fd.get(), 0);
    if (h.map == MAP_FAILED) return 0;
    if (fill) Fill(h.map, l->size_bytes(), tag);
    held.push_back(std::move(h));
    return l->id();
  }
  bool Connect() {
    c.reset();
    auto n = RawClient::Connect(socket, "restart-holder");
    if (!n.ok()) return false;
    c.emplace(std::move(*n));
    return true;
  }
  // Accepted * 1000 + rejected.
  uint64_t Reclaim() {
    if (!Connect()) return 999999;
    proto::ReclaimRequest rr;
    std::vector<int> fds;
    for (auto& h : held) {
      *rr.add_leases() = h.info;
      fds.push_back(h.fd.get());
    }
    proto::ReclaimReply rep;
    if (!c->Call(rr, &rep, nullptr, fds).ok()) return 999998;
    return static_cast<uint64_t>(rep.accepted_size()) * 1000 + rep.rejected_size();
  }
  uint64_t Verify() {
    for (auto& h : held) {
      if (!Intact(h.map, h.info.size_bytes(), h.tag)) return 0;
    }
    return 1;
  }
  uint64_t ReleaseAll() {
    for (auto& h : held) {
      if (!c->Release(h.info.id()).ok()) return 0;
    }
    return 1;
  }
};

class RestartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testsupport::SkipWithoutDaemon();
    ASSERT_FALSE(state_.path.empty());
    ASSERT_TRUE(
        daemon_.Start(kRestartConfig, {"--state-dir", state_.path, "--grace-period", "60s"}).ok());
  }
  TempDir state_{"restart"};
  Daemon daemon_;
};

TEST_F(RestartTest, PrivateAndSharedLeasesSurviveSigkillAndGrantsWaitForReclaim) {
  const std::string sock = daemon_.socket();
  RawHolder a_state{sock, {}, {}};
  Helper a([&](char cmd) -> uint64_t {
    switch (cmd) {
      case 'p': {
        if (!a_state.Connect()) return 0;
        UniqueFd fd;
        auto l = a_state.c->Alloc(kMiB, &fd);
        return a_state.Keep(std::move(l), std::move(fd), 0xA1, true);
      }
      case 's': {
        UniqueFd fd;
        auto l = a_state.c->Alloc(2 * kMiB, &fd, "model", {::getuid()});
        return a_state.Keep(std::move(l), std::move(fd), 0x5A, true);
      }
      case 'r':
        return a_state.Reclaim();
      case 'v':
        return a_state.Verify();
      case 'x':
        return a_state.ReleaseAll();
    }
    return 0;
  });
  RawHolder b_state{sock, {}, {}};
  Helper b([&](char cmd) -> uint64_t {
    switch (cmd) {
      case 'a': {
        if (!b_state.Connect()) return 0;
        UniqueFd fd;
        auto l = b_state.c->Attach("model", &fd);
        uint64_t id = b_state.Keep(std::move(l), std::move(fd), 0x5A, false);
        return id != 0 && b_state.Verify() ? id : 0;
      }
      case 'r':
        return b_state.Reclaim();
      case 'v':
        return b_state.Verify();
      case 'x':
        return b_state.ReleaseAll();
    }
    return 0;
  });
  auto priv = a.Ask('p');
  auto shared = a.Ask('s');
  auto attached = b.Ask('a');
  ASSERT_TRUE(priv && *priv && shared && *shared && attached);
  ASSERT_EQ(*attached, *shared);
  auto before = Snapshot(sock);
  ASSERT_TRUE(before.ok());
  uint64_t max_id = std::max(*priv, *shared);

  daemon_.Kill();
  ASSERT_TRUE(daemon_.Restart().ok());

  // Grace: nothing new is granted (nor attached) until the leases are back.
  {
    auto c = RawClient::Connect(sock, "restart-test");
    ASSERT_TRUE(c.ok());
    EXPECT_TRUE(c->hello().in_grace_period());
    UniqueFd fd;
    auto l = c->Alloc(4096, &fd);
    ASSERT_FALSE(l.ok());
    EXPECT_EQ(l.status().code(), Code::kUnavailable);
    EXPECT_NE(l.status().message().find("daemon restarting"), std::string::npos)
        << l.status().ToString();
    auto at = c->Attach("model", &fd);
    ASSERT_FALSE(at.ok());
    EXPECT_EQ(at.status().code(), Code::kUnavailable);
  }
  // Owner first (both its leases), then the second holder of the shared one.
  EXPECT_EQ(a.Ask('r'), 2000u);
  EXPECT_FALSE(InGrace(sock));  // every journalled lease has its memory back
  EXPECT_EQ(b.Ask('r'), 1000u);

  auto after = Snapshot(sock);
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  EXPECT_EQ(after->Inconsistencies(), "");
  ASSERT_EQ(after->leases.size(), 2u);
  for (uint64_t id : {*priv, *shared}) {
    ASSERT_TRUE(after->leases.count(id)) << "lease " << id << " lost";
    const auto& was = before->leases.at(id);
    const auto& now = after->leases.at(id);
    EXPECT_EQ(now.owner_pid(), was.owner_pid());
    EXPECT_EQ(now.owner_uid(), was.owner_uid());
    EXPECT_EQ(now.size_bytes(), was.size_bytes());
    EXPECT_EQ(now.name(), was.name());
    EXPECT_EQ(now.holders(), was.holders());
  }
  EXPECT_EQ(after->leases.at(*shared).holders(), 2u);
  EXPECT_EQ(after->LeaseBytes(), 3 * kMiB);
  EXPECT_EQ(after->Gauge("leased_bytes"), 3 * kMiB);
  // The mappings kept their data through the restart.
  EXPECT_EQ(a.Ask('v'), 1u);
  EXPECT_EQ(b.Ask('v'), 1u);

  // New grants: a fresh id, and never beyond a pool's free room.
  auto c = RawClient::Connect(sock, "restart-test");
  ASSERT_TRUE(c.ok());
  UniqueFd fd;
  auto fresh = c->Alloc(4096, &fd);
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  EXPECT_GT(fresh->id(), max_id);
  uint64_t most_free = 0;
  for (const auto& p : after->pools) {
    most_free = std::max(most_free, p.capacity_bytes() - p.leased_bytes());
  }
  UniqueFd big_fd;
  auto big = c->Alloc(most_free + 4096, &big_fd);
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), Code::kResourceExhausted);

  // Holders release: nothing is left.
  EXPECT_EQ(b.Ask('x'), 1u);
  EXPECT_EQ(a.Ask('x'), 1u);
  ASSERT_TRUE(c->Release(fresh->id()).ok());
  auto end = Snapshot(sock);
  ASSERT_TRUE(end.ok());
  EXPECT_TRUE(end->leases.empty());
  EXPECT_EQ(end->Inconsistencies(), "");
}

TEST_F(RestartTest, ALeaseWhoseOwnerDiedWhileTheDaemonWasDownIsDropped) {
  const std::string sock = daemon_.socket();
  RawHolder st{sock, {}, {}};
  Helper h([&](char cmd) -> uint64_t {
    if (cmd != 'p' || !st.Connect()) return 0;
    UniqueFd fd;
    auto l = st.c->Alloc(kMiB, &fd);
    return st.Keep(std::move(l), std::move(fd), 1, true);
  });
  auto id = h.Ask('p');
  ASSERT_TRUE(id && *id);
  daemon_.Kill();
  h.Kill();  // dies while no daemon runs
  ASSERT_TRUE(daemon_.Restart().ok());
  EXPECT_FALSE(InGrace(sock));  // nothing to wait for
  auto a = Snapshot(sock);
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a->leases.empty());
  EXPECT_EQ(a->Gauge("leased_bytes"), 0u);
  EXPECT_EQ(a->Counter("restart_drops"), 1u);
  EXPECT_EQ(a->Inconsistencies(), "");
}

// A shared lease keeps its ACL across a SIGKILL of the daemon: after the
// restart (and its owner's reclaim) a uid outside the ACL still gets
// NOT_FOUND for the name, one inside attaches the same lease.
TEST_F(RestartTest, ASharedLeaseKeepsItsAclAcrossARestart) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root: the owner and the attachers are other uids";
  constexpr uid_t kOwnerUid = 4201, kOutside = 4202, kInside = 4203;
  const std::string sock = daemon_.socket();
  RawHolder st{sock, {}, {}};
  Helper owner([&](char cmd) -> uint64_t {
    if (cmd == 'u') return testsupport::BecomeUid(kOwnerUid) ? 1 : 0;
    if (cmd == 'r') return st.Reclaim();
    if (cmd != 'p' || !st.Connect()) return 0;
    UniqueFd fd;
    auto l = st.c->Alloc(kMiB, &fd, "acl-weights", {kInside});
    return st.Keep(std::move(l), std::move(fd), 7, true);
  });
  ASSERT_EQ(owner.Ask('u'), std::optional<uint64_t>(1));
  auto id = owner.Ask('p');
  ASSERT_TRUE(id && *id);
  // 0: NOT_FOUND, 1: attached lease *id, 2: anything else.
  auto attach_as = [&](uid_t uid) {
    return testsupport::RunInChild(
        [&] {
          auto c = RawClient::Connect(sock, "restart-attacher");
          if (!c.ok()) return 2;
          UniqueFd fd;
          auto l = c->Attach("acl-weights", &fd, kOwnerUid);
          if (!l.ok()) return l.status().code() == Code::kNotFound ? 0 : 2;
          return l->id() == *id ? 1 : 2;
        },
        uid);
  };
  ASSERT_EQ(attach_as(kOutside), 0);
  ASSERT_EQ(attach_as(kInside), 1);

  daemon_.Kill();
  ASSERT_TRUE(daemon_.Restart().ok());
  EXPECT_EQ(owner.Ask('r'), std::optional<uint64_t>(1000));  // accepted, none rejected
  EXPECT_TRUE(PollUntil([&] { return !InGrace(sock); }, 10000));
  EXPECT_EQ(attach_as(kOutside), 0) << "a uid outside the ACL attached after the restart";
  EXPECT_EQ(attach_as(kInside), 1) << "a uid in the ACL could not attach after the restart";
}

TEST_F(RestartTest, AnIdleLibraryClientIsReclaimedByItsWatcher) {
  const std::string sock = daemon_.socket();
  LibraryHolder h;
  Helper w([&](char cmd) -> uint64_t {
    switch (cmd) {
      case 'a':
        return h.Allocate(sock, 3 * kMiB, 0xC1);
      case 'v':
        return h.Intact(0xC1) ? 1 : 0;
      case 'x':
        return h.lease->Release().ok() ? 1 : 0;
    }
    return 0;
  });
  auto id = w.Ask('a');
  ASSERT_TRUE(id && *id);
  daemon_.Kill();
  uint64_t t0 = testsupport::NowMicros();
  ASSERT_TRUE(daemon_.Restart().ok());
  // The client makes no call: its watcher notices, reconnects and reclaims.
  std::string last;
  bool back = HeldAgainByOne(sock, *id, w.pid(), &last);
  ASSERT_TRUE(back) << last;
  std::printf("restart: idle client reclaimed %llu ms after the SIGKILL\n",
              static_cast<unsigned long long>((testsupport::NowMicros() - t0) / 1000));
  EXPECT_EQ(w.Ask('v'), 1u);  // same mapping, same data, not revoked
  EXPECT_EQ(w.Ask('x'), 1u);
  auto a = Snapshot(sock);
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a->leases.empty());
}

}  // namespace
}  // namespace cxlpool::restart
