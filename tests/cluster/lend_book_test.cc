// LendBook (cluster/include/cxlpool/cluster/lend_book.h): capabilities,
// ranges, revocation that waits for accesses in flight, per-borrower counts.
// The last case runs it behind real UCX (tcp on loopback): a revoked
// capability reaches nothing.
#include "cxlpool/cluster/lend_book.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace cxlpool::ucx {
namespace {

Access For(const LeaseRef& r, uint64_t offset, uint64_t length, bool write = false) {
  Access a;
  a.lease = r.lease;
  a.token[0] = r.token[0];
  a.token[1] = r.token[1];
  a.offset = offset;
  a.length = length;
  a.write = write;
  return a;
}

TEST(LendBookTest, GrantsOnlyInsideTheLeaseWithItsCapability) {
  std::vector<uint8_t> mem(1 << 20);
  LendBook book;
  auto ref = book.Lend(mem.data(), mem.size(), "host-b", 1000);
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  EXPECT_EQ(ref->length, mem.size());
  EXPECT_NE(ref->token[0] | ref->token[1], 0u);
  auto other = book.Lend(mem.data(), 4096, "host-b", 1000);
  ASSERT_TRUE(other.ok());
  EXPECT_NE(other->lease, ref->lease);
  EXPECT_FALSE(other->token[0] == ref->token[0] && other->token[1] == ref->token[1]);

  auto g = book.Check(For(*ref, 100, 200, true));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->addr, mem.data() + 100);
  EXPECT_EQ(book.in_flight(), 1u);
  g->done();
  EXPECT_EQ(book.in_flight(), 0u);
  auto last = book.Check(For(*ref, mem.size() - 1, 1));  // the last byte
  ASSERT_TRUE(last.ok());
  last->done();

  Access wrong = For(*ref, 0, 1);
  wrong.token[1] ^= 0x80;
  EXPECT_EQ(book.Check(wrong).status().code(), Code::kPermissionDenied);
  // Another lease's capability does not open this one.
  Access swapped = For(*other, 0, 1);
  swapped.lease = ref->lease;
  EXPECT_EQ(book.Check(swapped).status().code(), Code::kPermissionDenied);
  for (auto [off, len] : {std::pair<uint64_t, uint64_t>{mem.size() - 1, 2},
                          {mem.size(), 1},
                          {0, 0},
                          {8, UINT64_MAX - 4},
                          {UINT64_MAX, 1}}) {
    EXPECT_EQ(book.Check(For(*ref, off, len)).status().code(), Code::kInvalidArgument)
        << off << " +" << len;
  }
  Access unknown = For(*ref, 0, 1);
  unknown.lease = 999;
  EXPECT_EQ(book.Check(unknown).status().code(), Code::kNotFound);
  EXPECT_EQ(book.in_flight(), 0u);
  EXPECT_EQ(book.Lend(nullptr, 10, "h", 1).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(book.Lend(mem.data(), 0, "h", 1).status().code(), Code::kInvalidArgument);
}

TEST(LendBookTest, RevokeStopsNewAccessesAndWaitsForThoseInFlight) {
  std::vector<uint8_t> mem(8192);
  LendBook book;
  auto ref = book.Lend(mem.data(), mem.size(), "host-b", 7);
  ASSERT_TRUE(ref.ok());
  auto g1 = book.Check(For(*ref, 0, 10));
  auto g2 = book.Check(For(*ref, 10, 10));
  ASSERT_TRUE(g1.ok() && g2.ok());
  int drained = 0;
  ASSERT_TRUE(book.Revoke(ref->lease, [&] { ++drained; }).ok());
  EXPECT_EQ(drained, 0) << "two accesses are still moving bytes";
  // A revoked capability answers as a forged one.
  EXPECT_EQ(book.Check(For(*ref, 0, 1)).status().code(), Code::kNotFound);
  EXPECT_EQ(book.Revoke(ref->lease, nullptr).code(), Code::kNotFound);
  EXPECT_TRUE(book.Lent().empty());
  g1->done();
  EXPECT_EQ(drained, 0);
  g2->done();
  EXPECT_EQ(drained, 1);
  EXPECT_EQ(book.in_flight(), 0u);
  // Nothing in flight: drained at once.
  auto ref2 = book.Lend(mem.data(), 100, "host-b", 7);
  ASSERT_TRUE(ref2.ok());
  ASSERT_TRUE(book.Revoke(ref2->lease, [&] { ++drained; }).ok());
  EXPECT_EQ(drained, 2);
}

TEST(LendBookTest, CountsPerBorrowerAndRevokesAHostsLeases) {
  std::vector<uint8_t> mem(1 << 16);
  LendBook book;
  ASSERT_TRUE(book.Lend(mem.data(), 4096, "host-b", 1000).ok());
  ASSERT_TRUE(book.Lend(mem.data() + 4096, 8192, "host-b", 1000).ok());
  ASSERT_TRUE(book.Lend(mem.data() + 12288, 4096, "host-b", 1001).ok());
  auto c = book.Lend(mem.data() + 16384, 4096, "host-c", 1000);
  ASSERT_TRUE(c.ok());
  auto lent = book.Lent();
  ASSERT_EQ(lent.size(), 3u);
  EXPECT_EQ((lent[{"host-b", 1000}].bytes), 12288u);
  EXPECT_EQ((lent[{"host-b", 1000}].leases), 2u);
  EXPECT_EQ((lent[{"host-b", 1001}].bytes), 4096u);
  EXPECT_EQ((lent[{"host-c", 1000}].bytes), 4096u);
  auto busy = book.Check(For(*c, 0, 1));
  ASSERT_TRUE(busy.ok());
  std::vector<uint64_t> drained;
  EXPECT_EQ(book.RevokeHost("host-b", [&](uint64_t id) { drained.push_back(id); }), 3u);
  EXPECT_EQ(drained.size(), 3u);
  lent = book.Lent();
  ASSERT_EQ(lent.size(), 1u);
  EXPECT_EQ(lent.begin()->first.first, "host-c");
  EXPECT_EQ(book.RevokeHost("host-c", [&](uint64_t id) { drained.push_back(id); }), 1u);
  EXPECT_EQ(drained.size(), 3u) << "host-c's access is in flight";
  busy->done();
  ASSERT_EQ(drained.size(), 4u);
  EXPECT_EQ(drained.back(), c->lease);
}

TEST(LendBookTest, ChecksFromManyThreadsWhileRevoking) {
  std::vector<uint8_t> mem(1 << 20);
  LendBook book;
  auto ref = book.Lend(mem.data(), mem.size(), "host-b", 1);
  ASSERT_TRUE(ref.ok());
  std::atomic<int> drained{0};
  std::atomic<uint64_t> granted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20000; ++i) {
        auto g = book.Check(For(*ref, static_cast<uint64_t>(t * 1000 + i % 1000), 8));
        if (!g.ok()) continue;
        ++granted;
        g->done();
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(book.Revoke(ref->lease, [&] { ++drained; }).ok());
  for (auto& th : threads) th.join();
  EXPECT_EQ(drained.load(), 1);
  EXPECT_EQ(book.in_flight(), 0u);
  EXPECT_GT(granted.load(), 0u);
}

// Behind a real UCX worker: a borrower with the capability reads; once the
// lease is revoked the same capability reaches nothing, and the lender's
// bytes are untouched by the refused write.
TEST(LendBookTest, BehindUcxARevokedCapabilityReachesNothing) {
  ::setenv("UCX_TLS", "tcp", 1);
  ::setenv("UCX_NET_DEVICES", "lo", 1);
  std::vector<uint8_t> mem(1 << 20, 0x11);
  LendBook book;
  auto lender = Worker::Create();
  ASSERT_TRUE(lender.ok()) << lender.status().ToString();
  ASSERT_TRUE((*lender)->Serve(book.Checker()).ok());
  auto ref = book.Lend(mem.data(), mem.size(), "borrower", 1000);
  ASSERT_TRUE(ref.ok());
  std::atomic<bool> stop{false};
  std::thread progress([&] {
    while (!stop) (*lender)->Progress();
  });
  {
    auto borrower = Worker::Create();
    ASSERT_TRUE(borrower.ok());
    auto ep = (*borrower)->Connect((*lender)->address(), "lender");
    ASSERT_TRUE(ep.ok());
    const std::chrono::milliseconds t(10000);
    std::vector<uint8_t> buf(65536, 0x22);
    ASSERT_TRUE((*ep)->WriteChecked(buf.data(), buf.size(), *ref, 4096, t).ok());
    EXPECT_EQ(mem[4096], 0x22);
    int drained = 0;
    ASSERT_TRUE(book.Revoke(ref->lease, [&] { ++drained; }).ok());
    EXPECT_EQ(drained, 1);
    std::vector<uint8_t> other(65536, 0x33);
    EXPECT_EQ((*ep)->WriteChecked(other.data(), other.size(), *ref, 4096, t).code(),
              Code::kNotFound);
    EXPECT_EQ(mem[4096], 0x22);
    EXPECT_EQ((*ep)->ReadChecked(other.data(), other.size(), *ref, 0, t).code(), Code::kNotFound);
    EXPECT_EQ(other[0], 0x33);
    ep->reset();
  }
  stop = true;
  progress.join();
}

}  // namespace
}  // namespace cxlpool::ucx
