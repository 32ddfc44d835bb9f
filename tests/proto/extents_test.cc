// Multi-extent lease replies (proto/extents.h) and the blocking client
// (proto/blocking_client.h): extent lists that add up and those that do
// not; a reply planned into frames of at most N fds, sent over a socketpair
// with real memfds and put back together in order; every way the frames can
// disagree with the reply (missing, extra, misordered fds, wrong request or
// lease, an early end) is a PROTOCOL error that closes what arrived; and the
// blocking client's version handling (HELLO in version 1, then the
// negotiated one) against a scripted server; a RECLAIM_REQUEST's fds split
// over frames and put back together, and each way those frames can
// disagree.
#include "cxlpool/proto/extents.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <functional>
#include <thread>
#include <vector>

#include "cxlpool/proto/blocking_client.h"
#include "cxlpool/proto/codec.h"
#include "cxlpool/proto/ipc.h"

namespace cxlpool::wire {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

proto::LeaseInfo Lease(uint64_t id, const std::vector<uint64_t>& sizes, uint64_t page = 4096) {
  proto::LeaseInfo l;
  l.set_id(id);
  uint64_t total = 0;
  for (uint64_t s : sizes) {
    proto::ExtentInfo* e = l.add_extents();
    e->set_size_bytes(s);
    e->set_page_size(page);
    total += s;
  }
  l.set_size_bytes(total);
  return l;
}

int OpenFds() {
  int n = 0;
  for (int fd = 0; fd < 4096; ++fd) n += ::fcntl(fd, F_GETFD) >= 0;
  return n;
}

UniqueFd Memfd(uint64_t size) {
  UniqueFd fd(::memfd_create("extents-test", MFD_CLOEXEC));
  EXPECT_TRUE(fd.valid());
  EXPECT_EQ(::ftruncate(fd.get(), static_cast<off_t>(size)), 0);
  return fd;
}

uint64_t Inode(int fd) {
  struct stat st {};
  return ::fstat(fd, &st) == 0 ? st.st_ino : 0;
}

// `n` memfds of `size` bytes each: the fds, their numbers and inodes.
struct Memfds {
  Memfds(size_t n, uint64_t size) {
    for (size_t i = 0; i < n; ++i) {
      fds.push_back(Memfd(size));
      raw.push_back(fds.back().get());
      inodes.push_back(Inode(raw.back()));
    }
  }
  std::vector<UniqueFd> fds;
  std::vector<int> raw;
  std::vector<uint64_t> inodes;
};

// Sends every planned frame over `sock` as request `rid`, each with its
// share of `raw`, on a thread of its own.
std::thread SendPlanned(int sock, uint64_t rid, const std::vector<PlannedFrame>& frames,
                        const std::vector<int>& raw) {
  return std::thread([sock, rid, &frames, &raw] {
    for (const PlannedFrame& f : frames) {
      std::span<const int> part(raw.data() + f.first_fd, f.fd_count);
      ASSERT_TRUE(SendFrame(sock, f.type, rid, f.payload, part, 5000).ok());
    }
  });
}

// An EXTENT_FDS frame (or one of `type`) with `fds` fresh memfds.
Frame ExtentFdsFrame(uint64_t lease, uint32_t first, uint32_t count, size_t fds, uint64_t rid,
                     proto::MsgType type = proto::MSG_EXTENT_FDS) {
  proto::ExtentFds m;
  m.set_lease_id(lease);
  m.set_first_extent(first);
  m.set_count(count);
  Frame f;
  f.header.type = type;
  f.header.request_id = rid;
  f.payload = *Encode(m);
  for (size_t i = 0; i < fds; ++i) f.fds.push_back(Memfd(4096));
  return f;
}

TEST(PlaceExtents, AddsUpOrSaysWhy) {
  auto p = PlaceExtents(Lease(1, {32 * kMiB, 2 * kMiB, 2 * kMiB, 8192}));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_EQ(p->size(), 4u);
  EXPECT_EQ((*p)[1].offset, 32 * kMiB);
  EXPECT_EQ((*p)[3].offset, 36 * kMiB);
  EXPECT_EQ((*p)[3].size, 8192u);

  proto::LeaseInfo v1;  // no extent list: one extent, version 1's form
  v1.set_id(2);
  v1.set_size_bytes(3 * kMiB);
  v1.set_page_size(2 * kMiB);
  p = PlaceExtents(v1);
  ASSERT_TRUE(p.ok());
  ASSERT_EQ(p->size(), 1u);
  EXPECT_EQ((*p)[0].page_size, 2 * kMiB);

  auto why = [](const proto::LeaseInfo& l) {
    auto r = PlaceExtents(l);
    EXPECT_EQ(r.status().code(), Code::kProtocol);
    return r.status().message();
  };
  proto::LeaseInfo more = Lease(3, {2 * kMiB, 2 * kMiB});
  more.set_size_bytes(3 * kMiB);
  EXPECT_NE(why(more).find("more than the lease"), std::string::npos);
  proto::LeaseInfo less = Lease(4, {2 * kMiB, 2 * kMiB});
  less.set_size_bytes(5 * kMiB);
  EXPECT_NE(why(less).find("add up to 4194304"), std::string::npos);
  EXPECT_NE(why(Lease(5, {2 * kMiB, 0})).find("size_bytes is 0"), std::string::npos);
  EXPECT_NE(why(Lease(6, {2 * kMiB}, 3000)).find("power of two"), std::string::npos);
  proto::LeaseInfo misaligned = Lease(8, {4096});
  proto::ExtentInfo* huge = misaligned.add_extents();
  huge->set_size_bytes(2 * kMiB);
  huge->set_page_size(2 * kMiB);
  misaligned.set_size_bytes(4096 + 2 * kMiB);
  EXPECT_NE(why(misaligned).find("offset 4096"), std::string::npos);
  proto::LeaseInfo many;
  many.set_id(9);
  for (uint32_t i = 0; i <= kMaxExtentsPerLease; ++i) {
    auto* e = many.add_extents();
    e->set_size_bytes(4096);
    e->set_page_size(4096);
  }
  many.set_size_bytes(4096ull * (kMaxExtentsPerLease + 1));
  EXPECT_NE(why(many).find("at most"), std::string::npos);
  proto::LeaseInfo empty;
  EXPECT_NE(why(empty).find("size_bytes is 0"), std::string::npos);
}

TEST(PlanLeaseReply, SplitsFdsOverFrames) {
  std::vector<uint64_t> sizes(600, 4096);
  proto::LeaseInfo l = Lease(42, sizes);
  auto frames = PlanLeaseReply(proto::MSG_ALLOC_REPLY, l, 600, 253);
  ASSERT_TRUE(frames.ok()) << frames.status().ToString();
  ASSERT_EQ(frames->size(), 3u);
  EXPECT_EQ((*frames)[0].type, proto::MSG_ALLOC_REPLY);
  EXPECT_EQ((*frames)[0].fd_count, 253u);
  EXPECT_EQ((*frames)[1].type, proto::MSG_EXTENT_FDS);
  EXPECT_EQ((*frames)[1].first_fd, 253u);
  EXPECT_EQ((*frames)[2].fd_count, 94u);
  proto::AllocReply head;
  ASSERT_TRUE(Decode((*frames)[0].payload, &head).ok());
  EXPECT_EQ(head.extent_frames(), 2u);
  proto::ExtentFds last;
  ASSERT_TRUE(Decode((*frames)[2].payload, &last).ok());
  EXPECT_EQ(last.lease_id(), 42u);
  EXPECT_EQ(last.first_extent(), 506u);
  EXPECT_EQ(last.count(), 94u);

  // One extent, or the version-1 form: one frame, one fd.
  proto::LeaseInfo v1;
  v1.set_id(1);
  v1.set_size_bytes(4096);
  frames = PlanLeaseReply(proto::MSG_ATTACH_REPLY, v1, 1, 64);
  ASSERT_TRUE(frames.ok());
  ASSERT_EQ(frames->size(), 1u);
  EXPECT_EQ((*frames)[0].fd_count, 1u);

  EXPECT_EQ(PlanLeaseReply(proto::MSG_STAT_REPLY, v1, 1, 64).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(PlanLeaseReply(proto::MSG_ALLOC_REPLY, v1, 2, 64).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(PlanLeaseReply(proto::MSG_ALLOC_REPLY, v1, 1, 0).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(PlanLeaseReply(proto::MSG_ALLOC_REPLY, v1, 1, 254).status().code(),
            Code::kInvalidArgument);
}

// A RECLAIM_REQUEST of more fds than the daemon takes on one frame: one
// lease, its fds on the request and on EXTENT_FDS frames that follow, sent
// over a socketpair and put back together into one request in order.
TEST(ReclaimRequest, SplitsOneLeaseOverFramesAndComesBackWhole) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  UniqueFd a(sv[0]), b(sv[1]);
  const size_t n = 150;
  proto::ReclaimRequest req;
  *req.add_leases() = Lease(11, std::vector<uint64_t>(n, 8192));
  Memfds m(n, 8192);
  auto frames = PlanReclaimRequest(req, n, 64);
  ASSERT_TRUE(frames.ok()) << frames.status().ToString();
  ASSERT_EQ(frames->size(), 3u);  // 64 + 64 + 22
  EXPECT_EQ((*frames)[0].type, proto::MSG_RECLAIM_REQUEST);
  EXPECT_EQ((*frames)[0].fd_count, 64u);
  EXPECT_EQ((*frames)[2].type, proto::MSG_EXTENT_FDS);
  EXPECT_EQ((*frames)[2].first_fd, 128u);
  EXPECT_EQ((*frames)[2].fd_count, 22u);
  const int before = OpenFds();
  std::thread sender = SendPlanned(a.get(), 3, *frames, m.raw);
  RecvLimits limits;
  limits.max_fds = 64;
  auto first = RecvFrame(b.get(), limits, 5000);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(ReclaimRequestAssembler::AnnouncedFrames(*first), 2u);
  ReclaimRequestAssembler asm_;
  ASSERT_TRUE(asm_.Start(std::move(*first)).ok());
  EXPECT_EQ(asm_.fds_held(), 64u);
  while (!asm_.complete()) {
    auto next = RecvFrame(b.get(), limits, 5000);
    ASSERT_TRUE(next.ok()) << next.status().ToString();
    ASSERT_TRUE(asm_.Add(std::move(*next)).ok());
  }
  sender.join();
  Frame whole = asm_.TakeRequest();
  EXPECT_EQ(whole.type(), proto::MSG_RECLAIM_REQUEST);
  EXPECT_EQ(whole.request_id(), 3u);
  ASSERT_EQ(whole.fds.size(), n);
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(Inode(whole.fds[i].get()), m.inodes[i]) << i;
  proto::ReclaimRequest back;
  ASSERT_TRUE(Decode(whole.payload, &back).ok());
  EXPECT_EQ(back.leases(0).extents_size(), static_cast<int>(n));
  whole.fds.clear();
  EXPECT_EQ(OpenFds(), before);

  // What fits one frame is one frame, any number of leases.
  proto::ReclaimRequest two;
  *two.add_leases() = Lease(1, {4096, 4096});
  *two.add_leases() = Lease(2, {4096});
  frames = PlanReclaimRequest(two, 3, 64);
  ASSERT_TRUE(frames.ok());
  ASSERT_EQ(frames->size(), 1u);
  proto::ReclaimRequest head;
  ASSERT_TRUE(Decode((*frames)[0].payload, &head).ok());
  EXPECT_EQ(head.extent_frames(), 0u);
  // Several leases over one frame's fds, a wrong count, a bad limit.
  EXPECT_EQ(PlanReclaimRequest(two, 3, 2).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(PlanReclaimRequest(two, 2, 64).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(PlanReclaimRequest(two, 3, 0).status().code(), Code::kInvalidArgument);
}

TEST(ReclaimRequest, FramesThatDoNotAddUpArePROTOCOLAndCloseEveryFd) {
  auto request = [](size_t leases, size_t extents, uint32_t frames, size_t fds) {
    proto::ReclaimRequest r;
    for (size_t i = 0; i < leases; ++i) {
      *r.add_leases() = Lease(20 + i, std::vector<uint64_t>(extents, 4096));
    }
    r.set_extent_frames(frames);
    Frame f;
    f.header.type = proto::MSG_RECLAIM_REQUEST;
    f.header.request_id = 9;
    f.payload = *Encode(r);
    for (size_t i = 0; i < fds; ++i) f.fds.push_back(Memfd(4096));
    return f;
  };
  auto more = [](uint64_t lease, uint32_t first, uint32_t count, size_t fds) {
    return ExtentFdsFrame(lease, first, count, fds, 9);
  };
  const int before = OpenFds();
  auto start_fails = [&](Frame f, const std::string& needle) {
    ReclaimRequestAssembler a;
    Status st = a.Start(std::move(f));
    EXPECT_EQ(st.code(), Code::kProtocol) << st.ToString();
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
    EXPECT_EQ(OpenFds(), before) << needle;
  };
  start_fails(request(2, 3, 1, 4), "hands back one lease");
  start_fails(request(1, 4, 1, 0), "carried no fd");
  start_fails(request(1, 4, 1, 5), "5 fds for 4");
  start_fails(request(1, 4, 3, 2), "missing");
  start_fails(request(1, 4, 1, 4), "every fd is on the request");
  auto add_fails = [&](Frame next, const std::string& needle) {
    ReclaimRequestAssembler a;
    ASSERT_TRUE(a.Start(request(1, 4, 1, 2)).ok());
    EXPECT_EQ(a.fds_held(), 2u);
    Status st = a.Add(std::move(next));
    EXPECT_EQ(st.code(), Code::kProtocol) << st.ToString();
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
    EXPECT_EQ(a.fds_held(), 0u);
    EXPECT_EQ(OpenFds(), before) << "what had arrived is closed at once: " << needle;
  };
  add_fails(more(20, 2, 1, 1), "brought 3 of 4");            // too few follow-up fds
  add_fails(more(20, 2, 3, 3), "for the 2 extent(s) left");  // too many
  add_fails(more(20, 2, 2, 1), "announces 2 fd(s) and carries 1");
  add_fails(more(21, 2, 2, 2), "names lease 21");
  add_fails(more(20, 1, 2, 2), "starts at extent 1");
  Frame stat;
  stat.header.type = proto::MSG_STAT_REQUEST;
  stat.header.request_id = 9;
  add_fails(std::move(stat), "expected MSG_EXTENT_FDS");
  // Not announced: the handler judges the request alone.
  EXPECT_EQ(ReclaimRequestAssembler::AnnouncedFrames(request(1, 4, 0, 4)), 0u);
  EXPECT_EQ(OpenFds(), before);
}

// Sends the planned frames of `lease` over a socketpair with one memfd per
// extent, reads them back with FrameReader and the assembler.
TEST(LeaseReplyAssembler, PutsFdsBackInOrderOverASocket) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  UniqueFd a(sv[0]), b(sv[1]);
  const size_t n = 300;
  std::vector<uint64_t> sizes(n, 8192);
  proto::LeaseInfo l = Lease(7, sizes);
  Memfds m(n, 8192);
  const std::vector<uint64_t>& inodes = m.inodes;
  auto frames = PlanLeaseReply(proto::MSG_ALLOC_REPLY, l, n, 128);
  ASSERT_TRUE(frames.ok());
  ASSERT_EQ(frames->size(), 3u);
  const int before = OpenFds();
  std::thread sender = SendPlanned(a.get(), 9, *frames, m.raw);
  RecvLimits limits;
  limits.max_fds = kHardMaxFdsPerFrame;
  auto first = RecvFrame(b.get(), limits, 5000);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  LeaseReplyAssembler asm_;
  ASSERT_TRUE(asm_.Start(std::move(*first)).ok());
  EXPECT_FALSE(asm_.complete());
  EXPECT_EQ(asm_.frames_left(), 2u);
  while (!asm_.complete()) {
    auto next = RecvFrame(b.get(), limits, 5000);
    ASSERT_TRUE(next.ok()) << next.status().ToString();
    ASSERT_TRUE(asm_.Add(std::move(*next)).ok());
  }
  sender.join();
  auto got = asm_.TakeExtents();
  ASSERT_EQ(got.size(), n);
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(Inode(got[i].fd.get()), inodes[i]) << "extent " << i << " out of order";
    EXPECT_EQ(got[i].place.offset, i * 8192);
  }
  EXPECT_EQ(OpenFds(), before + static_cast<int>(n));
  got.clear();
  EXPECT_EQ(OpenFds(), before);
}

// Frames built by hand (no socket): each disagreement is PROTOCOL and every
// fd that arrived is closed.
class AssemblerErrors : public ::testing::Test {
 protected:
  static Frame Reply(const proto::LeaseInfo& l, uint32_t frames, size_t fds, uint64_t rid = 5) {
    proto::AllocReply r;
    *r.mutable_lease() = l;
    r.set_extent_frames(frames);
    Frame f;
    f.header.type = proto::MSG_ALLOC_REPLY;
    f.header.request_id = rid;
    f.payload = *Encode(r);
    for (size_t i = 0; i < fds; ++i) f.fds.push_back(Memfd(4096));
    return f;
  }
  static Frame More(uint64_t lease, uint32_t first, uint32_t count, size_t fds, uint64_t rid = 5,
                    proto::MsgType type = proto::MSG_EXTENT_FDS) {
    return ExtentFdsFrame(lease, first, count, fds, rid, type);
  }
  // Every fd made for the frames is closed once the assembler fails and is gone.
  void ExpectStartFails(const std::function<Frame()>& make, const std::string& needle) {
    const int before = OpenFds();
    {
      LeaseReplyAssembler a;
      Status st = a.Start(make());
      EXPECT_EQ(st.code(), Code::kProtocol) << st.ToString();
      EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
      EXPECT_TRUE(a.TakeExtents().empty());
    }
    EXPECT_EQ(OpenFds(), before) << needle;
  }
  void ExpectAddFails(const std::function<Frame()>& start, const std::function<Frame()>& next,
                      const std::string& needle) {
    const int before = OpenFds();
    {
      LeaseReplyAssembler a;
      ASSERT_TRUE(a.Start(start()).ok());
      Status st = a.Add(next());
      EXPECT_EQ(st.code(), Code::kProtocol) << st.ToString();
      EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
      EXPECT_EQ(OpenFds(), before) << "what had arrived is closed at once: " << needle;
      EXPECT_TRUE(a.TakeExtents().empty());
      EXPECT_FALSE(a.Add(More(1, 0, 1, 1)).ok()) << "unusable after an error";
    }
    EXPECT_EQ(OpenFds(), before) << needle;
  }
  const proto::LeaseInfo four_ = Lease(1, {4096, 4096, 4096, 4096});
};

TEST_F(AssemblerErrors, TheReplyItself) {
  const proto::LeaseInfo l = four_;
  ExpectStartFails([&] { return Reply(l, 0, 0); }, "no fd");
  ExpectStartFails([&] { return Reply(l, 0, 5); }, "5 fds for 4");
  ExpectStartFails([&] { return Reply(l, 0, 2); }, "missing");
  ExpectStartFails([&] { return Reply(l, 3, 2); }, "missing");  // 3 frames cannot each bring one
  ExpectStartFails([&] { return Reply(l, 1, 4); }, "announces 1");
  proto::LeaseInfo bad = l;
  bad.set_size_bytes(4096);
  ExpectStartFails([&] { return Reply(bad, 0, 4); }, "more than the lease");
  ExpectStartFails(
      [] {
        Frame stat;
        stat.header.type = proto::MSG_STAT_REPLY;
        return stat;
      },
      "expected a lease reply");
  ExpectStartFails(
      [&] {
        Frame dropped = Reply(l, 0, 4);
        dropped.fds_dropped = 1;
        return dropped;
      },
      "more than it may");
  // An error reply is the error it carries.
  Frame err;
  err.header.type = proto::MSG_ERROR_REPLY;
  err.payload = EncodeErrorPayload(Status(Code::kResourceExhausted, "pool full"));
  LeaseReplyAssembler a;
  Status st = a.Start(std::move(err));
  EXPECT_EQ(st.code(), Code::kResourceExhausted);
}

TEST_F(AssemblerErrors, TheFramesThatFollow) {
  const proto::LeaseInfo l = four_;
  auto head = [&](uint32_t frames, size_t fds) {
    return [&l, frames, fds] { return Reply(l, frames, fds); };
  };
  auto more = [](uint64_t lease, uint32_t first, uint32_t count, size_t fds, uint64_t rid = 5,
                 proto::MsgType type = proto::MSG_EXTENT_FDS) {
    return [=] { return More(lease, first, count, fds, rid, type); };
  };
  ExpectAddFails(head(1, 2), more(1, 2, 2, 2, 6), "for request 6");
  ExpectAddFails(head(1, 2), more(2, 2, 2, 2), "names lease 2");
  ExpectAddFails(head(1, 2), more(1, 1, 2, 2), "starts at extent 1");
  ExpectAddFails(head(1, 2), more(1, 2, 2, 1), "announces 2 fd(s) and carries 1");
  ExpectAddFails(head(1, 2), more(1, 2, 0, 0), "announces 0");
  ExpectAddFails(head(1, 2), more(1, 2, 3, 3), "for the 2 extent(s) left");
  ExpectAddFails(head(1, 2), more(1, 2, 1, 1), "brought 3 of 4");
  ExpectAddFails(head(2, 2), more(1, 2, 2, 2), "more MSG_EXTENT_FDS frame(s)");
  ExpectAddFails(head(1, 2), more(1, 2, 2, 2, 5, proto::MSG_ALLOC_REPLY),
                 "expected MSG_EXTENT_FDS");
  // And the good case, for contrast.
  LeaseReplyAssembler a;
  ASSERT_TRUE(a.Start(Reply(l, 2, 1)).ok());
  ASSERT_TRUE(a.Add(More(1, 1, 2, 2)).ok());
  ASSERT_TRUE(a.Add(More(1, 3, 1, 1)).ok());
  EXPECT_TRUE(a.complete());
  EXPECT_EQ(a.TakeExtents().size(), 4u);
}

// ---- the blocking client against a scripted server ----------------------------

// Serves one connection: answers HELLO (negotiating like the daemon), then
// runs `script` for each later request.
class ScriptedServer {
 public:
  using Script = std::function<void(int sock, const Frame& req, uint16_t version)>;
  // `max_fds_per_frame`: what the HELLO reply says the server reads per
  // frame (0: nothing, as a daemon that predates split requests).
  explicit ScriptedServer(Script script, uint32_t max_fds_per_frame = 0)
      : script_(std::move(script)), max_fds_per_frame_(max_fds_per_frame) {
    int sv[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    client_.Reset(sv[0]);
    server_.Reset(sv[1]);
    thread_ = std::thread([this] { Serve(); });
  }
  ~ScriptedServer() {
    client_.Reset();
    if (thread_.joinable()) thread_.join();
  }
  UniqueFd TakeClient() { return std::move(client_); }
  uint16_t hello_header_version() const { return hello_header_version_; }
  uint16_t request_header_version() const { return request_header_version_; }
  uint32_t hello_max_fds() const { return hello_max_fds_; }

 private:
  void Serve() {
    uint16_t version = kHelloWireVersion;
    for (;;) {
      auto f = RecvFrame(server_.get(), {}, 5000);
      if (!f.ok()) return;
      if (f->type() == proto::MSG_HELLO_REQUEST) {
        hello_header_version_ = f->header.version;
        proto::HelloRequest h;
        ASSERT_TRUE(Decode(f->payload, &h).ok());
        hello_max_fds_ = h.max_fds_per_frame();
        auto v = NegotiateVersion(h.min_version(), h.max_version());
        if (!v.ok()) {
          (void)SendFrame(server_.get(), proto::MSG_ERROR_REPLY, f->request_id(),
                          EncodeErrorPayload(v.status()), {}, 5000, kHelloWireVersion);
          return;
        }
        proto::HelloReply r;
        r.set_version(*v);
        r.set_max_fds_per_frame(max_fds_per_frame_);
        (void)SendMessage(server_.get(), r, f->request_id(), {}, 5000, kHelloWireVersion);
        version = static_cast<uint16_t>(*v);
        continue;
      }
      request_header_version_ = f->header.version;
      script_(server_.get(), *f, version);
    }
  }
  Script script_;
  uint32_t max_fds_per_frame_ = 0;
  UniqueFd client_, server_;
  std::thread thread_;
  uint16_t hello_header_version_ = 0;
  uint16_t request_header_version_ = 0;
  uint32_t hello_max_fds_ = 0;
};

// Answers an ALLOC with `n` extents of 4 KiB in frames of `per` fds; `cut`
// frames are sent before the server hangs up (all when -1).
ScriptedServer::Script AllocReplies(size_t n, size_t per, int cut = -1) {
  return [n, per, cut](int sock, const Frame& req, uint16_t version) {
    std::vector<uint64_t> sizes(n, 4096);
    proto::LeaseInfo l = Lease(77, sizes);
    std::vector<UniqueFd> fds;
    std::vector<int> raw;
    for (size_t i = 0; i < n; ++i) {
      fds.push_back(Memfd(4096));
      raw.push_back(fds.back().get());
    }
    auto frames = PlanLeaseReply(proto::MSG_ALLOC_REPLY, l, n, per);
    ASSERT_TRUE(frames.ok());
    int sent = 0;
    for (const PlannedFrame& f : *frames) {
      if (cut >= 0 && sent == cut) {
        ::shutdown(sock, SHUT_RDWR);
        return;
      }
      std::span<const int> part(raw.data() + f.first_fd, f.fd_count);
      ASSERT_TRUE(SendFrame(sock, f.type, req.request_id(), f.payload, part, 5000, version).ok());
      ++sent;
    }
  };
}

TEST(BlockingClient, HelloInVersionOneThenTheNegotiatedVersion) {
  ScriptedServer s(AllocReplies(600, 253));
  auto c = BlockingClient::Handshake(s.TakeClient(), {.name = "extents-test"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->version(), kMaxWireVersion);
  EXPECT_EQ(s.hello_header_version(), kHelloWireVersion);
  EXPECT_EQ(s.hello_max_fds(), kHardMaxFdsPerFrame);
  proto::AllocRequest a;
  a.set_size_bytes(600 * 4096);
  proto::AllocReply r;
  std::vector<UniqueFd> fds;
  Status st = c->Call(a, &r, &fds);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(s.request_header_version(), kMaxWireVersion);
  EXPECT_EQ(fds.size(), 600u);
  EXPECT_EQ(r.lease().extents_size(), 600);
}

TEST(BlockingClient, AVersionOneClientStaysInVersionOne) {
  ScriptedServer s([](int sock, const Frame& req, uint16_t version) {
    proto::StatReply r;
    ASSERT_TRUE(SendMessage(sock, r, req.request_id(), {}, 5000, version).ok());
  });
  auto c = BlockingClient::Handshake(s.TakeClient(), {.name = "old", .max_version = 1});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->version(), 1u);
  proto::StatRequest q;
  proto::StatReply r;
  ASSERT_TRUE(c->Call(q, &r).ok());
  EXPECT_EQ(s.request_header_version(), 1u);
}

TEST(BlockingClient, NoCommonVersionNamesBoth) {
  ScriptedServer s([](int, const Frame&, uint16_t) {});
  auto c = BlockingClient::Handshake(
      s.TakeClient(),
      {.name = "future", .min_version = kMaxWireVersion + 1, .max_version = kMaxWireVersion + 3});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kProtocol);
  EXPECT_NE(c.status().message().find("client speaks 3..5, server speaks 1..2"), std::string::npos)
      << c.status().message();
}

// A RECLAIM of more extents than the server reads per frame goes out split,
// as libcxlpool sends it; one the server has no per-frame limit for goes as
// one frame.
TEST(BlockingClient, SplitsAReclaimOverTheFramesTheServerReads) {
  const size_t n = 131;
  std::vector<size_t> frame_fds;  // fds per frame the server read
  size_t whole_fds = 0;
  int announced = -1;
  ScriptedServer s(
      [&](int sock, const Frame& req, uint16_t version) {
        RecvLimits limits;
        limits.max_fds = 64;
        Frame first;
        first.header = req.header;
        first.payload = req.payload;
        for (const UniqueFd& fd : req.fds) first.fds.emplace_back(::dup(fd.get()));
        frame_fds.push_back(req.fds.size());
        announced = static_cast<int>(ReclaimRequestAssembler::AnnouncedFrames(first));
        Frame whole;
        if (announced > 0) {
          ReclaimRequestAssembler a;
          ASSERT_TRUE(a.Start(std::move(first)).ok());
          while (!a.complete()) {
            auto next = RecvFrame(sock, limits, 5000);
            ASSERT_TRUE(next.ok()) << next.status().ToString();
            frame_fds.push_back(next->fds.size());
            ASSERT_TRUE(a.Add(std::move(*next)).ok());
          }
          whole = a.TakeRequest();
        } else {
          whole = std::move(first);
        }
        whole_fds = whole.fds.size();
        proto::ReclaimReply r;
        r.add_accepted(11);
        ASSERT_TRUE(SendMessage(sock, r, req.request_id(), {}, 5000, version).ok());
      },
      64);
  auto c = BlockingClient::Handshake(s.TakeClient());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  proto::ReclaimRequest req;
  *req.add_leases() = Lease(11, std::vector<uint64_t>(n, 4096));
  Memfds m(n, 4096);
  proto::ReclaimReply r;
  Status st = c->Call(req, &r, nullptr, m.raw);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(announced, 2);
  EXPECT_EQ(frame_fds, (std::vector<size_t>{64, 64, 3}));
  EXPECT_EQ(whole_fds, n);
  EXPECT_EQ(r.accepted_size(), 1);
}

TEST(BlockingClient, AServerThatHangsUpMidReplyIsAnError) {
  const int before = OpenFds();
  {
    ScriptedServer s(AllocReplies(600, 253, 2));
    auto c = BlockingClient::Handshake(s.TakeClient());
    ASSERT_TRUE(c.ok());
    proto::AllocRequest a;
    proto::AllocReply r;
    std::vector<UniqueFd> fds;
    Status st = c->Call(a, &r, &fds);
    EXPECT_EQ(st.code(), Code::kUnavailable) << st.ToString();
    EXPECT_TRUE(fds.empty());
  }
  EXPECT_EQ(OpenFds(), before) << "every fd that arrived was closed";
}

}  // namespace
}  // namespace cxlpool::wire
