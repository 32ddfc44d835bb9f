// Leases of several extents with a real cxlpoold (daemon.max_extent = "2M",
// so a 7 MiB lease is four memfds), its pid tracked:
//   * libcxlpool maps the extents as one contiguous range; data written
//     across the extents' boundaries survives a SIGKILL of the daemon, the
//     client's watcher hands every extent back, and a release brings the
//     accounting back to zero;
//   * revoke truncates every extent: each extent's mapping SIGBUSes;
//   * a client that closes while the extents' fds are still coming on
//     MSG_EXTENT_FDS frames loses nothing and costs nothing; the daemon
//     keeps serving;
//   * a daemon SIGKILLed right after the first frame of a multi-frame grant:
//     the client gets the whole lease or a clear error, and after the
//     restart the accounting is back to zero once that client is gone;
//   * RECLAIM requests whose extents do not add up are refused, naming why.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cstring>

#include "cxlpool/client.hpp"
#include "cxlpool/proto/extents.h"
#include "cxlpool/proto/ipc.h"
#include "cxlpool/proto/socket.h"
#include "restart_util.h"

namespace cxlpool::restart {
namespace {

using testsupport::Daemon;
using testsupport::kMiB;
using testsupport::PollUntil;
using testsupport::RawClient;

constexpr uint64_t kLeaseBytes = 7 * kMiB + 5000;  // 2M + 2M + 2M + (1M + 8K)

// A connection that says it takes one fd per frame, so every extent after
// the first comes on its own MSG_EXTENT_FDS frame.
struct OneFdPerFrame {
  UniqueFd sock;
  uint16_t version = 0;
  static Result<OneFdPerFrame> Connect(const std::string& path) {
    OneFdPerFrame c;
    auto s = wire::ConnectUnix(path);
    if (!s.ok()) return s.status();
    c.sock = std::move(*s);
    proto::HelloRequest h;
    h.set_min_version(wire::kMinWireVersion);
    h.set_max_version(wire::kMaxWireVersion);
    h.set_client_name("one-fd-per-frame");
    h.set_max_fds_per_frame(1);
    CXLPOOL_RETURN_IF_ERROR(
        wire::SendMessage(c.sock.get(), h, 1, {}, 10000, wire::kHelloWireVersion));
    auto f = wire::RecvFrame(c.sock.get(), {}, 10000);
    if (!f.ok()) return f.status();
    proto::HelloReply r;
    CXLPOOL_RETURN_IF_ERROR(wire::DecodeReply(*f, &r));
    c.version = static_cast<uint16_t>(r.version());
    return c;
  }
  Status SendAlloc(uint64_t size) {
    proto::AllocRequest a;
    a.set_size_bytes(size);
    return wire::SendMessage(sock.get(), a, 2, {}, 10000, version);
  }
  Result<wire::Frame> Next() { return wire::RecvFrame(sock.get(), {}, 10000); }
};

class MultiExtentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testsupport::SkipWithoutDaemon();
    ASSERT_FALSE(state_.path.empty());
    ASSERT_TRUE(
        daemon_.Start(kExtentConfig, {"--state-dir", state_.path, "--grace-period", "60s"}).ok());
  }
  // Nothing leased, nothing being reclaimed, and the replies agree.
  void ExpectBaseline(int wait_ms = 20000) {
    std::string last;
    bool clean = PollUntil(
        [&] {
          auto a = Snapshot(daemon_.socket());
          if (!a.ok()) {
            last = a.status().ToString();
            return false;
          }
          uint64_t used = 0;
          for (const auto& p : a->pools) used += p.leased_bytes() + p.reclaiming_bytes();
          last = std::to_string(a->leases.size()) + " leases, " + std::to_string(used) +
                 " bytes used; " + a->Inconsistencies();
          return a->leases.empty() && used == 0 && a->Inconsistencies().empty();
        },
        wait_ms, 10);
    EXPECT_TRUE(clean) << last;
  }
  TempDir state_{"extents"};
  Daemon daemon_;
};

TEST_F(MultiExtentTest, OneRangeAcrossExtentsSurvivesASigkill) {
  const std::string sock = daemon_.socket();
  std::optional<cxlpool::Client> client;
  std::optional<cxlpool::Lease> lease;
  Helper w([&](char cmd) -> uint64_t {
    switch (cmd) {
      case 'a': {
        ::setenv("CXLPOOL_RECONNECT_TIMEOUT_MS", "20000", 1);
        auto c = cxlpool::Client::Connect(sock);
        if (!c.ok()) return 0;
        client.emplace(std::move(*c));
        cxlpool::AllocOptions o;
        o.size_bytes = kLeaseBytes;
        auto l = client->Allocate(o);
        if (!l.ok()) return 0;
        lease.emplace(std::move(*l));
        Fill(lease->data(), lease->size(), 0xE7);
        // A record straddling each boundary between extents.
        auto* p = static_cast<char*>(lease->data());
        for (uint64_t b = 2 * kMiB; b < lease->size(); b += 2 * kMiB) {
          std::memcpy(p + b - 4, "edge", 4);
          std::memcpy(p + b, "EDGE", 4);
        }
        return lease->id();
      }
      case 'v': {
        auto* p = static_cast<const char*>(lease->data());
        for (uint64_t b = 2 * kMiB; b < lease->size(); b += 2 * kMiB) {
          if (std::memcmp(p + b - 4, "edge", 4) != 0 || std::memcmp(p + b, "EDGE", 4) != 0) {
            return 0;
          }
        }
        return !lease->revoked() ? 1 : 0;
      }
      case 'x':
        return lease->Release().ok() ? 1 : 0;
    }
    return 0;
  });
  auto id = w.Ask('a');
  ASSERT_TRUE(id && *id);
  {
    auto a = Snapshot(sock);
    ASSERT_TRUE(a.ok());
    ASSERT_TRUE(a->leases.count(*id));
    EXPECT_EQ(a->leases[*id].size_bytes(), 7 * kMiB + 8192);
  }
  EXPECT_EQ(w.Ask('v'), 1u);
  daemon_.Kill();
  ASSERT_TRUE(daemon_.Restart().ok());
  // The watcher hands all four extents back; the lease is held again.
  std::string last;
  bool back = HeldAgainByOne(sock, *id, w.pid(), &last);
  ASSERT_TRUE(back) << last;
  EXPECT_EQ(w.Ask('v'), 1u);  // same mapping, same data across the boundaries
  EXPECT_EQ(w.Ask('x'), 1u);
  ExpectBaseline();
}

TEST_F(MultiExtentTest, RevokeSigbusesEveryExtent) {
  if (!testsupport::IsRoot()) GTEST_SKIP() << "revoke needs admin (root)";
  auto c = RawClient::Connect(daemon_.socket(), "extent-holder");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  proto::AllocRequest req;
  req.set_size_bytes(kLeaseBytes);
  proto::AllocReply rep;
  std::vector<UniqueFd> fds;
  ASSERT_TRUE(c->Call(req, &rep, &fds).ok());
  ASSERT_EQ(rep.lease().extents_size(), 4);
  ASSERT_EQ(fds.size(), 4u);
  std::vector<void*> maps;
  for (int i = 0; i < 4; ++i) {
    const uint64_t size = rep.lease().extents(i).size_bytes();
    void* m = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[i].get(), 0);
    ASSERT_NE(m, MAP_FAILED);
    static_cast<char*>(m)[0] = 1;
    maps.push_back(m);
  }
  auto admin = RawClient::Connect(daemon_.socket(), "admin");
  ASSERT_TRUE(admin.ok());
  proto::RevokeRequest rv;
  rv.set_lease_id(rep.lease().id());
  proto::RevokeReply rr;
  ASSERT_TRUE(admin->Call(rv, &rr).ok());
  for (int i = 0; i < 4; ++i) {
    struct stat st {};
    ASSERT_EQ(::fstat(fds[i].get(), &st), 0);
    EXPECT_EQ(st.st_size, 0) << "extent " << i << " not truncated";
    std::fflush(nullptr);
    pid_t child = ::fork();
    if (child == 0) {
      static_cast<volatile char*>(maps[i])[0] = 2;
      std::_Exit(4);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status)) << "extent " << i << ": exit " << WEXITSTATUS(status);
    EXPECT_EQ(WTERMSIG(status), SIGBUS) << "extent " << i;
  }
  for (int i = 0; i < 4; ++i) ::munmap(maps[i], rep.lease().extents(i).size_bytes());
  ExpectBaseline();
}

TEST_F(MultiExtentTest, AClientClosingDuringAMultiFrameReplyLosesNothing) {
  auto c = OneFdPerFrame::Connect(daemon_.socket());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(c->SendAlloc(kLeaseBytes).ok());
  auto first = c->Next();
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_EQ(first->type(), proto::MSG_ALLOC_REPLY);
  ASSERT_EQ(first->fds.size(), 1u);
  proto::AllocReply rep;
  ASSERT_TRUE(wire::DecodeReply(*first, &rep).ok());
  EXPECT_EQ(rep.extent_frames(), 3u);  // one frame per remaining extent
  c->sock.Reset();                     // gone before the rest arrived
  first->fds.clear();
  ExpectBaseline();
  // The daemon keeps serving: a whole multi-frame reply to the next client.
  auto d = OneFdPerFrame::Connect(daemon_.socket());
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE(d->SendAlloc(kLeaseBytes).ok());
  auto f = d->Next();
  ASSERT_TRUE(f.ok());
  wire::LeaseReplyAssembler a;
  ASSERT_TRUE(a.Start(std::move(*f)).ok());
  while (!a.complete()) {
    auto next = d->Next();
    ASSERT_TRUE(next.ok()) << next.status().ToString();
    ASSERT_TRUE(a.Add(std::move(*next)).ok());
  }
  EXPECT_EQ(a.TakeExtents().size(), 4u);
  d->sock.Reset();
  ExpectBaseline();
}

TEST_F(MultiExtentTest, ADaemonKilledDuringAMultiFrameGrantComesBackClean) {
  const std::string sock = daemon_.socket();
  std::optional<OneFdPerFrame> c;
  std::optional<wire::LeaseReplyAssembler> reply;
  Helper h([&](char cmd) -> uint64_t {
    switch (cmd) {
      case 'a': {  // ask, and read only the reply's first frame
        auto n = OneFdPerFrame::Connect(sock);
        if (!n.ok() || !n->SendAlloc(kLeaseBytes).ok()) return 0;
        c.emplace(std::move(*n));
        auto f = c->Next();
        if (!f.ok()) return 0;
        reply.emplace();
        return reply->Start(std::move(*f)).ok() ? 1 : 0;
      }
      case 'r': {  // the rest: 1 = the whole lease, 2 = a clear error
        while (!reply->complete()) {
          auto next = c->Next();
          if (!next.ok()) return next.status().code() == Code::kUnavailable ? 2 : 3;
          if (!reply->Add(std::move(*next)).ok()) return 3;
        }
        return reply->TakeExtents().size() == 4 ? 1 : 4;
      }
    }
    return 0;
  });
  ASSERT_EQ(h.Ask('a'), 1u);
  daemon_.Kill();
  auto outcome = h.Ask('r');
  ASSERT_TRUE(outcome.has_value());
  EXPECT_TRUE(*outcome == 1 || *outcome == 2) << "outcome " << *outcome;
  std::printf("multi-frame grant cut by SIGKILL: %s\n",
              *outcome == 1 ? "the client got the whole lease" : "the client got an error");
  h.Kill();  // the holder goes; its lease with it
  ASSERT_TRUE(daemon_.Restart().ok());
  ExpectBaseline();
}

TEST_F(MultiExtentTest, AReclaimWhoseExtentsDoNotAddUpIsRefused) {
  auto c = RawClient::Connect(daemon_.socket(), "extent-holder");
  ASSERT_TRUE(c.ok());
  proto::AllocRequest req;
  req.set_size_bytes(kLeaseBytes);
  proto::AllocReply rep;
  std::vector<UniqueFd> fds;
  ASSERT_TRUE(c->Call(req, &rep, &fds).ok());
  ASSERT_EQ(fds.size(), 4u);
  std::vector<int> raw;
  for (const auto& fd : fds) raw.push_back(fd.get());
  auto other = RawClient::Connect(daemon_.socket(), "reclaimer");
  ASSERT_TRUE(other.ok());
  // Sizes that do not add up to the lease.
  proto::ReclaimRequest bad;
  *bad.add_leases() = rep.lease();
  bad.mutable_leases(0)->mutable_extents(3)->set_size_bytes(4096);
  proto::ReclaimReply out;
  Status st = other->Call(bad, &out, nullptr, raw);
  EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("add up"), std::string::npos) << st.ToString();
  // Four extents listed, three fds sent.
  proto::ReclaimRequest short_fds;
  *short_fds.add_leases() = rep.lease();
  st = other->Call(short_fds, &out, nullptr, {raw[0], raw[1], raw[2]});
  EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("4 extents but carries 3 fds"), std::string::npos) << st.ToString();
  // Right count, wrong order: this lease is judged and refused alone.
  proto::ReclaimRequest swapped;
  *swapped.add_leases() = rep.lease();
  ASSERT_TRUE(other->Call(swapped, &out, nullptr, {raw[1], raw[0], raw[2], raw[3]}).ok());
  ASSERT_EQ(out.rejected_size(), 1);
  EXPECT_NE(out.rejected_reasons(0).find("extent 0"), std::string::npos) << out.rejected_reasons(0);
  // Nothing changed hands; the daemon keeps serving; the holder lets go.
  EXPECT_TRUE(c->Release(rep.lease().id()).ok());
  ExpectBaseline();
}

}  // namespace
}  // namespace cxlpool::restart
