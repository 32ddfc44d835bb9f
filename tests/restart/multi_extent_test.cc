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
//   * RECLAIM requests whose extents do not add up are refused, naming why;
//   * both APIs list a lease's extents (Lease::extents, cxlpool_lease_extent),
//     each exactly one mapping of its own file in /proc/self/maps;
//   * a lease of more extents than one frame carries (131, against 64 fds a
//     frame) survives a SIGKILL and is handed back whole, its RECLAIM split
//     over EXTENT_FDS frames; a split RECLAIM whose frames do not add up, or
//     whose client closes half way, is refused (PROTOCOL, the connection
//     closed), costs nothing, and the daemon keeps serving.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>

#include "cxlpool/client.hpp"
#include "cxlpool/cxlpool.h"
#include "cxlpool/proto/extents.h"
#include "cxlpool/proto/ipc.h"
#include "cxlpool/proto/socket.h"
#include "library_holder.h"
#include "restart_util.h"

namespace cxlpool::restart {
namespace {

using testsupport::Daemon;
using testsupport::kMiB;
using testsupport::PollUntil;
using testsupport::RawClient;

constexpr uint64_t kLeaseBytes = 7 * kMiB + 5000;  // 2M + 2M + 2M + (1M + 8K)

// Lease `id` as the daemon on `socket` lists it; NOT_FOUND when it does not.
Result<proto::LeaseInfo> Listed(const std::string& socket, uint64_t id) {
  auto a = Snapshot(socket);
  if (!a.ok()) return a.status();
  auto it = a->leases.find(id);
  if (it == a->leases.end()) return Status(Code::kNotFound, "lease not listed");
  return it->second;
}

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
  Status Send(proto::MsgType type, uint64_t id, const google::protobuf::MessageLite& m,
              std::span<const int> fds = {}) {
    return wire::SendFrame(sock.get(), type, id, m.SerializeAsString(), fds, 10000, version);
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
  virtual const char* Config() const { return kExtentConfig; }
  void SetUp() override {
    testsupport::SkipWithoutDaemon();
    ASSERT_FALSE(state_.path.empty());
    ASSERT_TRUE(
        daemon_.Start(Config(), {"--state-dir", state_.path, "--grace-period", "60s"}).ok());
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

// A lease of four extents with records across their boundaries, the daemon
// SIGKILLed (`while_down` runs before the restart), the extents handed back
// by the client's watcher: the same data in the same mapping, the lease
// listed whole, and a release brings the accounting back to zero.
// `damaged`: while_down damages the journal, so the grace period runs its
// full length after the reclaim.
void KillRestartAndReclaim(Daemon& daemon, const std::function<void()>& while_down,
                           bool damaged = false) {
  const std::string sock = daemon.socket();
  LibraryHolder h;
  std::optional<cxlpool::Lease>& lease = h.lease;
  Helper w([&](char cmd) -> uint64_t {
    switch (cmd) {
      case 'a': {
        if (h.Allocate(sock, kLeaseBytes, 0xE7) == 0) return 0;
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
  auto listed = Listed(sock, *id);
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  EXPECT_EQ(listed->size_bytes(), 7 * kMiB + 8192);
  EXPECT_EQ(w.Ask('v'), 1u);
  daemon.Kill();
  while_down();
  ASSERT_TRUE(daemon.Restart().ok());
  // The watcher hands all four extents back; the lease is held again.
  std::string last;
  bool back = HeldAgainByOne(sock, *id, w.pid(), &last, 20000, damaged);
  ASSERT_TRUE(back) << last;
  listed = Listed(sock, *id);
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  EXPECT_EQ(listed->size_bytes(), 7 * kMiB + 8192) << "accounted whole";
  EXPECT_EQ(listed->extents_size(), 4);
  auto a = Snapshot(sock);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->Inconsistencies(), "");
  EXPECT_EQ(a->Counter("unjournalled_revokes"), 0u);
  EXPECT_EQ(w.Ask('v'), 1u);  // same mapping, same data across the boundaries
  EXPECT_EQ(w.Ask('x'), 1u);
}

TEST_F(MultiExtentTest, OneRangeAcrossExtentsSurvivesASigkill) {
  KillRestartAndReclaim(daemon_, [] {});
  ExpectBaseline();
}

// The journal is lost while the daemon is down: the holder's RECLAIM of its
// four extents accounts the lease again whole, none of them revoked.
TEST_F(MultiExtentTest, ALeaseOfSeveralExtentsTheJournalLostComesBackWhole) {
  // After damage the grace period runs its full length, and a lease the
  // journal lost is freed only at its end: a short one.
  daemon_.Kill();
  ASSERT_TRUE(daemon_.Start(Config(), {"--state-dir", state_.path, "--grace-period", "6s"}).ok());
  KillRestartAndReclaim(
      daemon_,
      [&] {
        ASSERT_EQ(::unlink((state_.path + "/leases.journal").c_str()), 0) << std::strerror(errno);
      },
      /*damaged=*/true);
  auto a = Snapshot(daemon_.socket());
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->Counter("unjournalled_adopted"), 1u);
  ExpectBaseline();
}

// The file (device:inode) mapped at exactly [start, end) in this process;
// "" when no mapping has those bounds.
std::string FileMappedAt(uintptr_t start, uintptr_t end) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    std::istringstream in(line);
    std::string range, perms, offset, dev, inode;
    in >> range >> perms >> offset >> dev >> inode;
    const size_t dash = range.find('-');
    if (std::stoull(range.substr(0, dash), nullptr, 16) == start &&
        std::stoull(range.substr(dash + 1), nullptr, 16) == end) {
      return dev + ":" + inode;
    }
  }
  return "";
}

TEST_F(MultiExtentTest, BothApisListTheExtentsAsTheyAreMapped) {
  cxlpool_client* c = nullptr;
  ASSERT_EQ(cxlpool_connect(daemon_.socket().c_str(), &c), CXLPOOL_OK)
      << cxlpool_last_error_message();
  cxlpool_alloc_opts o;
  cxlpool_alloc_opts_init(&o);
  o.size_bytes = kLeaseBytes;
  cxlpool_lease* l = nullptr;
  ASSERT_EQ(cxlpool_alloc(c, &o, &l), CXLPOOL_OK) << cxlpool_last_error_message();
  const auto base = reinterpret_cast<uintptr_t>(cxlpool_lease_ptr(l));
  ASSERT_EQ(cxlpool_lease_extent_count(l), 4);  // 2M + 2M + 2M + (1M + 8K)
  const uint64_t lengths[] = {2 * kMiB, 2 * kMiB, 2 * kMiB, kMiB + 8192};
  std::set<std::string> files;
  uint64_t next = 0;
  for (uint32_t i = 0; i < 4; ++i) {
    uint64_t off = 1, len = 0, page = 0;
    ASSERT_EQ(cxlpool_lease_extent(l, i, &off, &len, &page), CXLPOOL_OK)
        << cxlpool_last_error_message();
    EXPECT_EQ(off, next) << "extent " << i << " is right behind the one before";
    EXPECT_EQ(len, lengths[i]) << "extent " << i;
    EXPECT_EQ(page, 4096u);
    const std::string file = FileMappedAt(base + off, base + off + len);
    EXPECT_FALSE(file.empty()) << "extent " << i << " is one mapping of exactly its bounds";
    files.insert(file);
    next = off + len;
  }
  EXPECT_EQ(files.size(), 4u) << "each extent is its own file";
  EXPECT_EQ(next, (kLeaseBytes + 4095) / 4096 * 4096);
  EXPECT_EQ(cxlpool_lease_extent(l, 4, nullptr, nullptr, nullptr), CXLPOOL_ENOT_FOUND);
  EXPECT_NE(std::string(cxlpool_last_error_message()).find("extent 4 of 4"), std::string::npos);
  EXPECT_EQ(cxlpool_lease_extent(nullptr, 0, nullptr, nullptr, nullptr), CXLPOOL_EINVALID_ARGUMENT);
  EXPECT_EQ(cxlpool_lease_extent_count(nullptr), CXLPOOL_EINVALID_ARGUMENT);
  ASSERT_EQ(cxlpool_release(l), CXLPOOL_OK);

  // The C++ API says the same of a lease of one file.
  auto client = cxlpool::Client::Connect(daemon_.socket());
  ASSERT_TRUE(client.ok());
  cxlpool::AllocOptions ao;
  ao.size_bytes = kMiB;
  auto one = client->Allocate(ao);
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  std::vector<cxlpool::LeaseExtent> extents = one->extents();
  ASSERT_EQ(extents.size(), 1u);
  EXPECT_EQ(extents[0].offset, 0u);
  EXPECT_EQ(extents[0].length, kMiB);
  EXPECT_TRUE(cxlpool::Lease().extents().empty());
  ASSERT_TRUE(one->Release().ok());
  cxlpool_disconnect(c);
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

// 2 MiB extents in a pool with room for two leases of 131 of them.
constexpr const char* kManyExtentConfig = R"(
[daemon]
socket_mode = "0666"
log_level = "warning"
max_extent = "2M"
[pools]
capacity = "640M"
)";
constexpr uint64_t kManyBytes = 130 * 2 * kMiB + 5000;  // 130 x 2M + 8K
constexpr int kManyExtents = 131;                       // 64 + 64 + 3 fds per RECLAIM

class ManyExtentsTest : public MultiExtentTest {
 protected:
  const char* Config() const override { return kManyExtentConfig; }
};

TEST_F(ManyExtentsTest, ALeaseOfMoreExtentsThanOneFrameCarriesSurvivesASigkill) {
  const std::string sock = daemon_.socket();
  LibraryHolder h;
  Helper w([&](char cmd) -> uint64_t {
    switch (cmd) {
      case 'a':
        return h.Allocate(sock, kManyBytes, 0x6B);
      case 'v':
        return h.Intact(0x6B) ? 1 : 0;
      case 'x':
        return h.lease->Release().ok() ? 1 : 0;
    }
    return 0;
  });
  auto id = w.Ask('a');
  ASSERT_TRUE(id && *id);
  auto listed = Listed(sock, *id);
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  ASSERT_EQ(listed->extents_size(), kManyExtents);
  daemon_.Kill();
  ASSERT_TRUE(daemon_.Restart().ok());
  // The watcher hands all 131 extents back on a RECLAIM and two EXTENT_FDS
  // frames; before, the library marked such a lease revoked.
  std::string last;
  bool back = HeldAgainByOne(sock, *id, w.pid(), &last);
  ASSERT_TRUE(back) << last;
  listed = Listed(sock, *id);
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  EXPECT_EQ(listed->extents_size(), kManyExtents);
  EXPECT_EQ(listed->size_bytes(), 130 * 2 * kMiB + 8192);
  EXPECT_EQ(w.Ask('v'), 1u);  // same mapping, same data, not revoked
  EXPECT_EQ(w.Ask('x'), 1u);
  ExpectBaseline();
}

TEST_F(ManyExtentsTest, ASplitReclaimThatDoesNotAddUpIsRefusedAndCostsNothing) {
  const std::string sock = daemon_.socket();
  auto holder = RawClient::Connect(sock, "extent-holder");
  ASSERT_TRUE(holder.ok()) << holder.status().ToString();
  proto::AllocRequest req;
  req.set_size_bytes(kManyBytes);
  proto::AllocReply rep;
  std::vector<UniqueFd> fds;
  ASSERT_TRUE(holder->Call(req, &rep, &fds).ok());
  ASSERT_EQ(fds.size(), static_cast<size_t>(kManyExtents));
  const uint64_t id = rep.lease().id();
  std::vector<int> raw;
  for (const auto& fd : fds) raw.push_back(fd.get());
  const std::span<const int> all(raw);
  auto fds_held = [&] {
    auto a = Snapshot(sock);
    return a.ok() ? a->Gauge("client_fds") : ~0ull;
  };
  const uint64_t fds_before = fds_held();
  auto head = [&](uint32_t frames) {
    proto::ReclaimRequest r;
    *r.add_leases() = rep.lease();
    r.set_extent_frames(frames);
    return r;
  };
  auto more = [&](uint32_t first, uint32_t count) {
    proto::ExtentFds m;
    m.set_lease_id(id);
    m.set_first_extent(first);
    m.set_count(count);
    return m;
  };
  // The daemon's answer to a split RECLAIM that does not add up: PROTOCOL
  // naming why, for the RECLAIM's request id, then the connection closes.
  auto refused = [&](OneFdPerFrame& c, const std::string& needle) {
    auto f = c.Next();
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    EXPECT_EQ(f->request_id(), 7u);
    proto::ReclaimReply out;
    Status st = wire::DecodeReply(*f, &out);
    EXPECT_EQ(st.code(), Code::kProtocol) << st.ToString();
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.ToString();
    auto eof = c.Next();
    EXPECT_FALSE(eof.ok()) << "the connection stays open after a broken RECLAIM";
  };
  {  // The last follow-up frame says 3 fds and carries 2.
    auto c = OneFdPerFrame::Connect(sock);
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE(c->Send(proto::MSG_RECLAIM_REQUEST, 7, head(2), all.subspan(0, 64)).ok());
    ASSERT_TRUE(c->Send(proto::MSG_EXTENT_FDS, 7, more(64, 64), all.subspan(64, 64)).ok());
    ASSERT_TRUE(c->Send(proto::MSG_EXTENT_FDS, 7, more(128, 3), all.subspan(128, 2)).ok());
    refused(*c, "announces 3 fd(s) and carries 2");
  }
  {  // One follow-up frame announced, and it brings too few.
    auto c = OneFdPerFrame::Connect(sock);
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE(c->Send(proto::MSG_RECLAIM_REQUEST, 7, head(1), all.subspan(0, 64)).ok());
    ASSERT_TRUE(c->Send(proto::MSG_EXTENT_FDS, 7, more(64, 3), all.subspan(64, 3)).ok());
    refused(*c, "brought 67 of 131");
  }
  {  // Another request where the fds should be.
    auto c = OneFdPerFrame::Connect(sock);
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE(c->Send(proto::MSG_RECLAIM_REQUEST, 7, head(2), all.subspan(0, 64)).ok());
    ASSERT_TRUE(c->Send(proto::MSG_STAT_REQUEST, 8, proto::StatRequest()).ok());
    refused(*c, "expected MSG_EXTENT_FDS");
  }
  {  // The client closes half way.
    auto c = OneFdPerFrame::Connect(sock);
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE(c->Send(proto::MSG_RECLAIM_REQUEST, 7, head(2), all.subspan(0, 64)).ok());
    ASSERT_TRUE(c->Send(proto::MSG_EXTENT_FDS, 7, more(64, 64), all.subspan(64, 64)).ok());
    c->sock.Reset();
  }
  // None of it reached the lease: one holder, the fds the daemon held for
  // those requests closed, the accounting consistent.
  std::string last;
  EXPECT_TRUE(PollUntil(
      [&] {
        auto a = Snapshot(sock);
        if (!a.ok()) return false;
        last = "holders " + std::to_string(a->leases[id].holders()) + ", client fds " +
               std::to_string(a->Gauge("client_fds")) + " (before " + std::to_string(fds_before) +
               "); " + a->Inconsistencies();
        return a->leases.size() == 1 && a->leases[id].holders() == 1 &&
               a->Gauge("client_fds") == fds_before && a->Inconsistencies().empty();
      },
      10000, 10))
      << last;
  {  // The daemon keeps serving: the same RECLAIM, split right, is taken.
    auto c = OneFdPerFrame::Connect(sock);
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE(c->Send(proto::MSG_RECLAIM_REQUEST, 7, head(2), all.subspan(0, 64)).ok());
    ASSERT_TRUE(c->Send(proto::MSG_EXTENT_FDS, 7, more(64, 64), all.subspan(64, 64)).ok());
    ASSERT_TRUE(c->Send(proto::MSG_EXTENT_FDS, 7, more(128, 3), all.subspan(128, 3)).ok());
    auto f = c->Next();
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    proto::ReclaimReply out;
    ASSERT_TRUE(wire::DecodeReply(*f, &out).ok());
    ASSERT_EQ(out.accepted_size(), 1)
        << (out.rejected_reasons_size() ? out.rejected_reasons(0) : "");
    EXPECT_EQ(out.accepted(0), id);
    auto a = Snapshot(sock);
    ASSERT_TRUE(a.ok());
    EXPECT_EQ(a->leases[id].holders(), 2u);
  }  // that connection closes: its hold goes with it
  EXPECT_TRUE(PollUntil(
      [&] {
        auto a = Snapshot(sock);
        return a.ok() && a->leases[id].holders() == 1;
      },
      10000, 10));
  EXPECT_TRUE(holder->Release(id).ok());
  fds.clear();
  ExpectBaseline();
}

}  // namespace
}  // namespace cxlpool::restart
