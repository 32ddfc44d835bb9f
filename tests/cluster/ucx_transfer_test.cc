// The UCX seam (cluster/include/cxlpool/cluster/ucx_transfer.h) on real UCX
// over tcp on loopback (UCX_TLS=tcp, UCX_NET_DEVICES=lo): a lender worker,
// progressed by its own thread, registers memory; a borrower worker on the
// test's thread writes and reads it one-sided. Checked against the lender's
// bytes directly (same process), so nothing is taken on the seam's word.
#include "cxlpool/cluster/ucx_transfer.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

namespace cxlpool::ucx {
namespace {

using std::chrono::milliseconds;
constexpr milliseconds kTimeout{10000};
constexpr size_t kLendBytes = (64u << 20) + 4096;
// The lease the lender's check knows: lender memory [kLeaseAt, kLeaseAt +
// kLeaseBytes), id kLease, capability kToken.
constexpr uint64_t kLease = 7;
constexpr uint64_t kLeaseAt = 4096;
constexpr uint64_t kLeaseBytes = 32u << 20;
constexpr uint64_t kToken[2] = {0x9e3779b97f4a7c15ull, 0xc2b2ae3d27d4eb4full};

// A lender: its worker, its memory, and a thread that progresses it (the
// tcp transport completes one-sided operations in the target's progress).
class Lender {
 public:
  Lender() {
    auto w = Worker::Create();
    if (!w.ok()) {
      error = w.status().ToString();
      return;
    }
    worker = std::move(w.value());
    void* p =
        ::mmap(nullptr, kLendBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      error = "mmap";
      return;
    }
    mem = static_cast<uint8_t*>(p);
  }
  ~Lender() {
    Pause();
    region.reset();
    worker.reset();
    if (mem != nullptr) ::munmap(mem, kLendBytes);
  }
  // The worker is single-threaded: map and unmap only while paused.
  void Resume() {
    stop = false;
    thread = std::thread([this] {
      while (!stop.load(std::memory_order_relaxed)) worker->Progress();
    });
  }
  void Pause() {
    stop = true;
    if (thread.joinable()) thread.join();
  }

  std::string error;
  std::unique_ptr<Worker> worker;
  std::unique_ptr<Region> region;
  uint8_t* mem = nullptr;
  std::atomic<bool> stop{false};
  std::thread thread;
  std::atomic<uint64_t> checks{0}, grants{0}, dones{0};
};

class UcxTransferTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ::setenv("UCX_TLS", "tcp", 1);
    ::setenv("UCX_NET_DEVICES", "lo", 1);
  }
  void SetUp() override {
    lender_ = std::make_unique<Lender>();
    ASSERT_TRUE(lender_->error.empty()) << lender_->error;
    auto r = lender_->worker->Map(lender_->mem, kLendBytes);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    lender_->region = std::move(r.value());
    remote_ = lender_->region->Describe();
    Lender* l = lender_.get();
    ASSERT_TRUE(lender_->worker
                    ->Serve([l](const Access& a) -> Result<Grant> {
                      l->checks++;
                      if (a.lease != kLease) return Status(Code::kNotFound, "no such lease");
                      if (a.token[0] != kToken[0] || a.token[1] != kToken[1])
                        return Status(Code::kPermissionDenied, "wrong capability");
                      if (a.offset > kLeaseBytes || a.length > kLeaseBytes - a.offset)
                        return Status(Code::kInvalidArgument, "outside the lease");
                      l->grants++;
                      return Grant{l->mem + kLeaseAt + a.offset, [l] { l->dones++; }};
                    })
                    .ok());
    lender_->Resume();
    auto w = Worker::Create();
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    borrower_ = std::move(w.value());
    auto e = borrower_->Connect(lender_->worker->address(), "lender-host");
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    ep_ = std::move(e.value());
  }
  void TearDown() override {
    ep_.reset();
    borrower_.reset();
    lender_.reset();
  }

  std::unique_ptr<Lender> lender_;
  RemoteRegion remote_;
  std::unique_ptr<Worker> borrower_;
  std::unique_ptr<Endpoint> ep_;
};

std::vector<uint8_t> Pattern(size_t n, uint64_t seed) {
  std::vector<uint8_t> v(n);
  std::mt19937_64 rng(seed);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

TEST_F(UcxTransferTest, BytesArriveIntactAtUnalignedOffsets) {
  const size_t sizes[] = {1, 7, 4093, (64u << 10) + 3, (1u << 20) + 17, (16u << 20) + 1, 64u << 20};
  const uint64_t offsets[] = {0, 1, 4097, 13};
  uint64_t seed = 1;
  for (size_t n : sizes) {
    for (uint64_t off : offsets) {
      if (off + n > kLendBytes) continue;
      SCOPED_TRACE(std::to_string(n) + " bytes at offset " + std::to_string(off));
      // Local buffers start at an odd address too.
      std::vector<uint8_t> src = Pattern(n + 3, seed++);
      ASSERT_TRUE(ep_->Write(src.data() + 3, n, remote_, remote_.base + off, kTimeout).ok());
      ASSERT_EQ(std::memcmp(lender_->mem + off, src.data() + 3, n), 0) << "lender's bytes";
      std::vector<uint8_t> back(n + 5, 0);
      Status st = ep_->Read(back.data() + 5, n, remote_, remote_.base + off, kTimeout);
      ASSERT_TRUE(st.ok()) << st.ToString();
      ASSERT_EQ(std::memcmp(back.data() + 5, src.data() + 3, n), 0) << "read back";
      if (n >= (16u << 20)) break;  // the big ones once
    }
  }
}

TEST_F(UcxTransferTest, NonBlockingRequestsCompleteAndFlush) {
  constexpr size_t kChunk = 64u << 10;
  constexpr int kRequests = 16;
  std::vector<uint8_t> src = Pattern(kChunk * kRequests, 42);
  std::vector<Request> reqs;
  for (int i = 0; i < kRequests; ++i) {
    auto r = ep_->Put(src.data() + i * kChunk, kChunk, remote_, remote_.base + 1 + i * kChunk);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    reqs.push_back(std::move(r.value()));
  }
  const auto until = std::chrono::steady_clock::now() + kTimeout;
  for (auto& r : reqs) {
    while (!r.Test()) ASSERT_LT(std::chrono::steady_clock::now(), until) << "a put never finished";
    EXPECT_TRUE(r.status().ok()) << r.status().ToString();
  }
  ASSERT_TRUE(ep_->Flush(kTimeout).ok());
  EXPECT_EQ(std::memcmp(lender_->mem + 1, src.data(), src.size()), 0);
  // Reads the same way, into one buffer.
  std::vector<uint8_t> back(src.size(), 0);
  reqs.clear();
  for (int i = 0; i < kRequests; ++i) {
    auto r = ep_->Get(back.data() + i * kChunk, kChunk, remote_, remote_.base + 1 + i * kChunk);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    reqs.push_back(std::move(r.value()));
  }
  for (auto& r : reqs) EXPECT_TRUE(r.Wait(kTimeout).ok());
  EXPECT_EQ(back, src);
}

TEST_F(UcxTransferTest, RangesOutsideTheRegionAreRefusedBeforeUcx) {
  uint8_t b[2] = {1, 2};
  const uint64_t end = remote_.base + remote_.length;
  for (auto [addr, len] : {std::pair<uint64_t, size_t>{end - 1, 2},
                           {end, 1},
                           {remote_.base - 1, 1},
                           {remote_.base, 0},
                           {remote_.base + 8, SIZE_MAX - 4}}) {
    auto r = ep_->Put(b, len, remote_, addr);
    ASSERT_FALSE(r.ok()) << addr - remote_.base << " +" << len;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << r.status().ToString();
    auto g = ep_->Get(b, len, remote_, addr);
    ASSERT_FALSE(g.ok());
    EXPECT_EQ(g.status().code(), Code::kInvalidArgument);
  }
  RemoteRegion no_key = remote_;
  no_key.rkey.clear();
  EXPECT_EQ(ep_->Write(b, 1, no_key, remote_.base, kTimeout).code(), Code::kInvalidArgument);
}

TEST_F(UcxTransferTest, ALenderThatGoesAwayFailsTheNextOperationInBoundedTime) {
  uint8_t b[64] = {};
  ASSERT_TRUE(ep_->Write(b, sizeof b, remote_, remote_.base, kTimeout).ok());
  lender_.reset();  // its worker and sockets are gone
  const auto start = std::chrono::steady_clock::now();
  Status st;
  // The first operations may be accepted locally before the loss is seen;
  // within the bound one must fail, and none may hang.
  for (int i = 0; i < 50 && st.ok(); ++i) {
    st = ep_->Read(b, sizeof b, remote_, remote_.base, milliseconds(2000));
  }
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), Code::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("lender-host"), std::string::npos) << st.ToString();
  EXPECT_LT(took, std::chrono::seconds(15));
}

// What UCX 1.13 does NOT do over tcp, where RMA is emulated with active
// messages (UCX_LOG_LEVEL=info shows "rma_am(tcp/lo)"): the target checks
// neither that an rkey is still mapped nor that an address lies in a
// registered region. A peer holding any rkey of a worker reads and writes
// that process's memory at any address, and ucp_mem_unmap revokes nothing.
// This pins the property the remote-lease design rests on (docs/cluster.md,
// "Remote leases"): raw one-sided access is only for transports whose
// hardware checks rkeys; over emulated RMA the lender must check each
// access itself. If UCX starts refusing these, the test fails and says so.
TEST_F(UcxTransferTest, OverEmulatedRmaTheTargetChecksNoRkey) {
  uint8_t b[64] = {};
  std::memset(lender_->mem, 0x5a, sizeof b);
  lender_->Pause();
  lender_->region.reset();  // ucp_mem_unmap: the rkey is "revoked"
  lender_->Resume();
  Status st = ep_->Read(b, sizeof b, remote_, remote_.base, kTimeout);
  ASSERT_TRUE(st.ok()) << "UCX now refuses a revoked rkey over tcp (" << st.ToString()
                       << "): revisit docs/cluster.md, Remote leases";
  EXPECT_EQ(b[0], 0x5a);
  // An address in no registered region, in the lender's process.
  static char elsewhere[32] = "not registered anywhere";
  RemoteRegion forged = remote_;
  forged.base = reinterpret_cast<uint64_t>(elsewhere);
  forged.length = sizeof elsewhere;
  std::memset(b, 0, sizeof b);
  st = ep_->Read(b, sizeof elsewhere, forged, forged.base, kTimeout);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_STREQ(reinterpret_cast<char*>(b), elsewhere);
}

LeaseRef Ref() {
  LeaseRef r;
  r.lease = kLease;
  r.length = kLeaseBytes;
  r.token[0] = kToken[0];
  r.token[1] = kToken[1];
  return r;
}

// Checked access: eager and rendezvous sizes, unaligned on both sides, the
// bytes checked in the lease itself; every grant's done runs once.
TEST_F(UcxTransferTest, CheckedAccessMovesBytesIntact) {
  const size_t sizes[] = {1, 4093, (64u << 10) + 3, (1u << 20) + 17, (16u << 20) + 1};
  const uint64_t offsets[] = {0, 5, 4097};
  uint64_t seed = 100, ops = 0;
  for (size_t n : sizes) {
    for (uint64_t off : offsets) {
      SCOPED_TRACE(std::to_string(n) + " bytes at lease offset " + std::to_string(off));
      std::vector<uint8_t> src = Pattern(n + 1, seed++);
      Status st = ep_->WriteChecked(src.data() + 1, n, Ref(), off, kTimeout);
      ASSERT_TRUE(st.ok()) << st.ToString();
      ASSERT_EQ(std::memcmp(lender_->mem + kLeaseAt + off, src.data() + 1, n), 0);
      std::vector<uint8_t> back(n + 3, 0);
      st = ep_->ReadChecked(back.data() + 3, n, Ref(), off, kTimeout);
      ASSERT_TRUE(st.ok()) << st.ToString();
      ASSERT_EQ(std::memcmp(back.data() + 3, src.data() + 1, n), 0);
      ops += 2;
    }
  }
  EXPECT_EQ(lender_->grants.load(), ops);
  // A read's done runs when its reply is sent; give the lender a moment.
  for (int i = 0; i < 1000 && lender_->dones.load() != ops; ++i) {
    std::this_thread::sleep_for(milliseconds(1));
  }
  EXPECT_EQ(lender_->dones.load(), ops);
}

TEST_F(UcxTransferTest, CheckedAccessInFlightTogether) {
  constexpr size_t kChunk = 256u << 10;
  constexpr int kRequests = 12;
  std::vector<uint8_t> src = Pattern(kChunk * kRequests, 9);
  std::vector<Request> reqs;
  for (int i = 0; i < kRequests; ++i) {
    auto r = ep_->PutChecked(src.data() + i * kChunk, kChunk, Ref(), 3 + i * kChunk);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    reqs.push_back(std::move(r.value()));
  }
  for (auto& r : reqs) ASSERT_TRUE(r.Wait(kTimeout).ok()) << r.status().ToString();
  EXPECT_EQ(std::memcmp(lender_->mem + kLeaseAt + 3, src.data(), src.size()), 0);
}

// The lender's check decides, whatever the borrower claims: a wrong
// capability, another lease, a range past the lease (the borrower's own
// LeaseRef forged longer) are refused with their codes, and no byte moves
// either way.
TEST_F(UcxTransferTest, CheckedAccessRefusalsMoveNothing) {
  std::vector<uint8_t> before(lender_->mem, lender_->mem + kLendBytes);
  std::vector<uint8_t> buf = Pattern(8192, 5);
  std::vector<uint8_t> untouched = buf;
  LeaseRef wrong_token = Ref();
  wrong_token.token[1] ^= 1;
  LeaseRef other_lease = Ref();
  other_lease.lease = kLease + 1;
  LeaseRef longer = Ref();
  longer.length = kLendBytes;  // claims more than the lender lent
  struct Case {
    LeaseRef ref;
    uint64_t offset;
    Code code;
  };
  for (const Case& c :
       {Case{wrong_token, 0, Code::kPermissionDenied}, Case{other_lease, 0, Code::kNotFound},
        Case{longer, kLeaseBytes - 10, Code::kInvalidArgument}}) {
    Status w = ep_->WriteChecked(buf.data(), buf.size(), c.ref, c.offset, kTimeout);
    EXPECT_EQ(w.code(), c.code) << w.ToString();
    EXPECT_NE(w.message().find("lender-host"), std::string::npos) << w.ToString();
    Status r = ep_->ReadChecked(buf.data(), buf.size(), c.ref, c.offset, kTimeout);
    EXPECT_EQ(r.code(), c.code) << r.ToString();
  }
  EXPECT_EQ(buf, untouched) << "a refused read wrote into the borrower's buffer";
  EXPECT_TRUE(std::equal(before.begin(), before.end(), lender_->mem))
      << "a refused write reached the lender's memory";
  EXPECT_EQ(lender_->grants.load(), 0u);
  EXPECT_EQ(lender_->checks.load(), 6u);
  // Refused on this side before anything is sent.
  EXPECT_EQ(ep_->WriteChecked(buf.data(), 16, Ref(), kLeaseBytes - 8, kTimeout).code(),
            Code::kInvalidArgument);
  EXPECT_EQ(lender_->checks.load(), 6u);
}

TEST_F(UcxTransferTest, CheckedAccessToALenderThatIsGoneFailsInBoundedTime) {
  uint8_t b[64] = {};
  ASSERT_TRUE(ep_->WriteChecked(b, sizeof b, Ref(), 0, kTimeout).ok());
  lender_.reset();
  const auto start = std::chrono::steady_clock::now();
  Status st;
  for (int i = 0; i < 50 && st.ok(); ++i) {
    st = ep_->ReadChecked(b, sizeof b, Ref(), 0, milliseconds(2000));
  }
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(st.code(), Code::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("lender-host"), std::string::npos) << st.ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(15));
}

// A lender that does not progress: each access fails at its bound and gives
// the borrower's buffer back (a send still reading it is cancelled). A read
// abandoned that way leaves the endpoint usable (a late answer finds
// nothing); a write cut off mid-send leaves it failed, and says so. After
// the lender wakes up, a new connection works.
TEST_F(UcxTransferTest, CheckedAccessPastItsBoundIsAbandonedCleanly) {
  ASSERT_TRUE(ep_->WriteChecked("x", 1, Ref(), 0, kTimeout).ok());  // connected
  lender_->Pause();
  std::vector<uint8_t> back(4u << 20);
  auto start = std::chrono::steady_clock::now();
  Status st = ep_->ReadChecked(back.data(), back.size(), Ref(), 0, milliseconds(300));
  EXPECT_EQ(st.code(), Code::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("lender-host"), std::string::npos);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
  EXPECT_TRUE(ep_->failure().ok()) << "an abandoned read needs no new connection";

  auto buf = std::make_unique<std::vector<uint8_t>>(Pattern(4u << 20, 3));
  start = std::chrono::steady_clock::now();
  st = ep_->WriteChecked(buf->data(), buf->size(), Ref(), 0, milliseconds(300));
  EXPECT_EQ(st.code(), Code::kUnavailable) << st.ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
  buf.reset();  // the caller's buffer is gone; UCX must not read it later
  lender_->Resume();
  std::vector<uint8_t> src = Pattern(8192, 77);
  if (!ep_->failure().ok()) {
    st = ep_->WriteChecked(src.data(), src.size(), Ref(), 100, kTimeout);
    EXPECT_EQ(st.code(), Code::kUnavailable);
    EXPECT_NE(st.message().find("connect again"), std::string::npos) << st.ToString();
    ep_.reset();
    auto e = borrower_->Connect(lender_->worker->address(), "lender-host");
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    ep_ = std::move(e.value());
  }
  std::fill(back.begin(), back.end(), 0);
  ASSERT_TRUE(ep_->WriteChecked(src.data(), src.size(), Ref(), 100, kTimeout).ok());
  ASSERT_TRUE(ep_->ReadChecked(back.data(), src.size(), Ref(), 100, kTimeout).ok());
  EXPECT_TRUE(std::equal(src.begin(), src.end(), back.begin()));
}

// A lender answering a borrower that has stopped listening: its 4 MiB
// reply (rendezvous) waits in UCX for the borrower when the lender goes
// away. The worker fails it first by closing that endpoint; a request of
// ours left on an endpoint that ucp_worker_destroy tears down is a fatal
// assertion in UCX.
TEST_F(UcxTransferTest, AWorkerGoingAwayEndsTheRepliesItHasInFlight) {
  ASSERT_TRUE(ep_->WriteChecked("x", 1, Ref(), 0, kTimeout).ok());  // connected
  lender_->Pause();
  std::vector<uint8_t> back(4u << 20);
  EXPECT_EQ(ep_->ReadChecked(back.data(), back.size(), Ref(), 0, milliseconds(100)).code(),
            Code::kUnavailable);
  // The lender takes the read (the borrower progresses no more) and sends.
  const uint64_t served = lender_->worker->served();
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while ((lender_->worker->served() == served || lender_->worker->in_flight() == 0) &&
         std::chrono::steady_clock::now() < until) {
    lender_->worker->Progress();
  }
  ASSERT_EQ(lender_->worker->in_flight(), 1u) << "the lender's reply is not waiting in UCX";
  const auto start = std::chrono::steady_clock::now();
  lender_.reset();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
}

}  // namespace
}  // namespace cxlpool::ucx
