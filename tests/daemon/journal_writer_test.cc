// JournalWriter (ids reserved in batches, writes stop at the hand-over) and
// RestartTracker (the grace period's timer, holder watches).
#include "lease/journal_writer.h"

#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <cstdint>
#include <optional>
#include <vector>

#include "lease/restart_tracker.h"

namespace cxlpool {
namespace {

class CountingStore final : public LeaseStore {
 public:
  Status ReserveIds(uint64_t next_id) override {
    reserved.push_back(next_id);
    return Status::Ok();
  }
  Status Put(const DurableLease& lease, std::span<const int>) override {
    puts.push_back(lease.id);
    return Status::Ok();
  }
  Status Delete(uint64_t id) override {
    deletes.push_back(id);
    return Status::Ok();
  }
  std::vector<uint64_t> reserved, puts, deletes;
};

TEST(JournalWriterTest, ReservesIdsInBatches) {
  CountingStore store;
  JournalWriter j;
  j.Enable(&store, 5);
  EXPECT_EQ(j.NextId(), 5u);
  EXPECT_EQ(store.reserved, (std::vector<uint64_t>{5 + JournalWriter::kIdBatch}));
  for (uint64_t i = 6; i < 5 + JournalWriter::kIdBatch; ++i) EXPECT_EQ(j.NextId(), i);
  EXPECT_EQ(store.reserved.size(), 1u);
  EXPECT_EQ(j.NextId(), 5 + JournalWriter::kIdBatch);
  EXPECT_EQ(store.reserved.size(), 2u);
  EXPECT_TRUE(j.MayHaveGranted(5));
  EXPECT_FALSE(j.MayHaveGranted(0));
  EXPECT_FALSE(j.MayHaveGranted(6 + JournalWriter::kIdBatch));
}

TEST(JournalWriterTest, RecoveredIdsAreTakenAndReservedPastThem) {
  CountingStore store;
  JournalWriter j;
  j.Enable(&store, 1);
  j.TakeJournalledId(40);  // reserved by the daemon that granted it
  j.ReserveTaken();
  EXPECT_TRUE(store.reserved.empty());
  j.TakeStoredId(100);  // only the fd store knew it
  j.ReserveTaken();
  EXPECT_EQ(store.reserved, (std::vector<uint64_t>{101 + JournalWriter::kIdBatch}));
  EXPECT_EQ(j.NextId(), 101u);
}

TEST(JournalWriterTest, NothingIsWrittenAfterTheHandOverOrWithoutAStore) {
  JournalWriter off;
  EXPECT_TRUE(off.Put(DurableLease{}, {}).ok());
  EXPECT_EQ(off.NextId(), 1u);
  EXPECT_EQ(off.NextId(), 2u);
  CountingStore store;
  JournalWriter j;
  j.Enable(&store, 1);
  DurableLease d;
  d.id = 7;
  EXPECT_TRUE(j.Put(d, {}).ok());
  j.Delete(7);
  j.HandOver();
  EXPECT_FALSE(j.writing());
  EXPECT_TRUE(j.Put(d, {}).ok());
  j.Delete(7);
  EXPECT_EQ(store.puts, (std::vector<uint64_t>{7}));
  EXPECT_EQ(store.deletes, (std::vector<uint64_t>{7}));
}

TEST(RestartTrackerTest, GraceEndsWhenItsTimeIsOver) {
  boost::asio::io_context io;
  RestartTracker t(io.get_executor());
  bool over = false;
  t.StartGrace(std::chrono::milliseconds(1), [&] { over = true; });
  EXPECT_TRUE(t.in_grace());
  EXPECT_EQ(t.Refusal().code(), Code::kUnavailable);
  io.run();  // returns once the timer fired
  EXPECT_TRUE(over);
  EXPECT_TRUE(t.EndGrace());
  EXPECT_FALSE(t.EndGrace());
  EXPECT_TRUE(t.Refusal().ok());
}

TEST(RestartTrackerTest, AnEndedGraceNeverCallsBack) {
  boost::asio::io_context io;
  RestartTracker t(io.get_executor());
  bool over = false;
  t.StartGrace(std::chrono::hours(1), [&] { over = true; });
  EXPECT_TRUE(t.EndGrace());
  io.run();  // the cancelled wait completes at once
  EXPECT_FALSE(over);
  EXPECT_FALSE(t.in_grace());
}

TEST(RestartTrackerTest, WatchCallsBackOnceThePidfdIsReadable) {
  boost::asio::io_context io;
  RestartTracker t(io.get_executor());
  int efd = ::eventfd(0, EFD_CLOEXEC);
  ASSERT_GE(efd, 0);
  UniqueFd pidfd(::dup(efd));
  const HolderId h{42, 7};
  std::optional<HolderId> exited;
  t.Watch(h, std::move(pidfd), [&](const HolderId& who) {
    exited = who;
    auto keep = t.Unwatch(who);
    EXPECT_NE(keep, nullptr);
  });
  EXPECT_TRUE(t.Watching(h));
  uint64_t one = 1;
  ASSERT_EQ(::write(efd, &one, sizeof(one)), static_cast<ssize_t>(sizeof(one)));
  io.run();
  ASSERT_TRUE(exited.has_value());
  EXPECT_EQ(*exited, h);
  EXPECT_FALSE(t.Watching(h));
  ::close(efd);
}

TEST(RestartTrackerTest, StopCancelsTheWatches) {
  boost::asio::io_context io;
  RestartTracker t(io.get_executor());
  int efd = ::eventfd(0, EFD_CLOEXEC);
  ASSERT_GE(efd, 0);
  bool called = false;
  t.Watch(HolderId{42, 7}, UniqueFd(::dup(efd)), [&](const HolderId&) { called = true; });
  t.Stop();
  EXPECT_FALSE(t.Watching(HolderId{42, 7}));
  io.run();
  EXPECT_FALSE(called);
  ::close(efd);
}

}  // namespace
}  // namespace cxlpool
