// SharedFill (pool/shared_fill.h): every chunk is filled exactly once, by
// the owner or a helper; a helper really runs alongside the owner; an error
// stops the rest; nothing touches the range after Run returns.
#include "pool/shared_fill.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace cxlpool {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

TEST(SharedFillTest, EveryChunkOnceTheLastOneTheRest) {
  std::vector<char> buf(10);
  std::mutex mu;
  std::vector<std::pair<uint64_t, uint64_t>> seen;
  SharedFill fill(buf.data(), 10, 4, [&](char* at, uint64_t len) {
    std::lock_guard<std::mutex> lock(mu);
    seen.emplace_back(static_cast<uint64_t>(at - buf.data()), len);
    return Status::Ok();
  });
  EXPECT_EQ(fill.chunks(), 3u);
  EXPECT_TRUE(fill.HelpOne());  // a helper first: chunk 0
  EXPECT_TRUE(fill.Run().ok());
  EXPECT_TRUE(fill.exhausted());
  EXPECT_FALSE(fill.HelpOne()) << "nothing left after Run";
  EXPECT_EQ(fill.helped(), 1u);
  const std::set<std::pair<uint64_t, uint64_t>> want{{0, 4}, {4, 4}, {8, 2}};
  using Ranges = std::set<std::pair<uint64_t, uint64_t>>;
  EXPECT_EQ(Ranges(seen.begin(), seen.end()), want);
  EXPECT_EQ(seen.size(), 3u);
}

// The owner's first chunk does not finish until another thread has started
// a chunk: with no helper the owner would fill everything alone and the
// wait below would time out (an error, not a hang).
TEST(SharedFillTest, AHelperFillsAlongsideTheOwner) {
  std::vector<char> buf(4 * kMiB);
  std::mutex mu;
  std::condition_variable cv;
  std::thread::id owner_id = std::this_thread::get_id();
  bool other_started = false;
  SharedFill fill(buf.data(), buf.size(), kMiB, [&](char* at, uint64_t len) {
    std::unique_lock<std::mutex> lock(mu);
    if (std::this_thread::get_id() != owner_id) {
      other_started = true;
      cv.notify_all();
    } else if (at == buf.data()) {
      if (!cv.wait_for(lock, std::chrono::seconds(20), [&] { return other_started; })) {
        return Status(Code::kInternal, "no helper ran alongside the owner");
      }
    }
    for (uint64_t i = 0; i < len; ++i) at[i] = 1;
    return Status::Ok();
  });
  std::atomic<bool> stop{false};
  std::thread helper([&] {
    while (!stop.load() && !fill.exhausted()) {
      if (!fill.HelpOne()) std::this_thread::yield();
    }
  });
  Status st = fill.Run();
  stop.store(true);
  helper.join();
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_GE(fill.helped(), 1u);
  for (char c : buf) ASSERT_EQ(c, 1);
}

TEST(SharedFillTest, AnErrorStopsTheRestAndIsReturned) {
  std::vector<char> buf(8);
  int calls = 0;
  SharedFill fill(buf.data(), 8, 2, [&](char*, uint64_t) {
    ++calls;
    return calls == 2 ? Status(Code::kResourceExhausted, "node full") : Status::Ok();
  });
  Status st = fill.Run();
  EXPECT_EQ(st.code(), Code::kResourceExhausted);
  EXPECT_EQ(calls, 2) << "no chunk starts after a failed one";
  EXPECT_TRUE(fill.exhausted());
  EXPECT_FALSE(fill.HelpOne());
}

TEST(SharedFillTest, ChunkIsASixteenthBetween2And32MiB) {
  EXPECT_EQ(SharedFillChunk(4 * kMiB), 2 * kMiB);
  EXPECT_EQ(SharedFillChunk(64 * kMiB), 4 * kMiB);
  EXPECT_EQ(SharedFillChunk(100 * kMiB), 6 * kMiB);  // 6.25 MiB, down to 2 MiB
  EXPECT_EQ(SharedFillChunk(2048 * kMiB), 32 * kMiB);
}

}  // namespace
}  // namespace cxlpool
