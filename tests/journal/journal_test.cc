#include "journal.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <random>

namespace cxlpool {
namespace {

class JournalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/cxlpool-journal-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { ASSERT_EQ(std::system(("rm -rf " + dir_).c_str()), 0); }

  static journal::LeaseRecord Rec(uint64_t id, uint64_t size) {
    journal::LeaseRecord r;
    r.set_id(id);
    r.set_size_bytes(size);
    r.set_numa_node(static_cast<int32_t>(id % 2));
    r.set_label("lease-" + std::to_string(id));
    return r;
  }
  std::string path() const { return dir_ + "/leases.journal"; }
  off_t FileSize() const {
    struct stat st;
    EXPECT_EQ(stat(path().c_str(), &st), 0);
    return st.st_size;
  }

  std::string dir_;
};

TEST_F(JournalTest, ReplaysPutsAndDeletes) {
  {
    auto j = LeaseJournal::Open(dir_, "boot-1");
    ASSERT_TRUE(j.ok()) << j.status().ToString();
    ASSERT_TRUE(j->Put(Rec(1, 4096)).ok());
    ASSERT_TRUE(j->Put(Rec(2, 8192)).ok());
    ASSERT_TRUE(j->Put(Rec(3, 1 << 20)).ok());
    ASSERT_TRUE(j->Delete(2).ok());
  }
  auto j = LeaseJournal::Open(dir_, "boot-1");
  ASSERT_TRUE(j.ok());
  const auto& s = j->state();
  EXPECT_EQ(s.leases.size(), 2u);
  EXPECT_EQ(s.leases.at(3).size_bytes(), 1u << 20);
  EXPECT_EQ(s.leases.at(1).label(), "lease-1");
  EXPECT_FALSE(s.leases.count(2));
  EXPECT_EQ(s.next_id, 4u);           // id 2 is gone but never handed out again
  EXPECT_EQ(s.records_replayed, 5u);  // the boot record + 4
  EXPECT_EQ(s.torn_bytes_dropped, 0u);
}

TEST_F(JournalTest, TornTailIsDroppedAndPrefixKept) {
  {
    auto j = LeaseJournal::Open(dir_, "boot-1");
    ASSERT_TRUE(j.ok());
    for (uint64_t i = 1; i <= 5; ++i) ASSERT_TRUE(j->Put(Rec(i, i * 4096)).ok());
  }
  off_t full = FileSize();
  ASSERT_EQ(truncate(path().c_str(), full - 3), 0);  // crash in the middle of record 5
  {
    auto j = LeaseJournal::Open(dir_, "boot-1");
    ASSERT_TRUE(j.ok());
    EXPECT_EQ(j->state().leases.size(), 4u);
    EXPECT_GT(j->state().torn_bytes_dropped, 0u);
    // Appending after recovery produces a valid journal.
    ASSERT_TRUE(j->Put(Rec(9, 4096)).ok());
  }
  auto j = LeaseJournal::Open(dir_, "boot-1");
  ASSERT_TRUE(j.ok());
  EXPECT_EQ(j->state().leases.size(), 5u);
  EXPECT_TRUE(j->state().leases.count(9));
  EXPECT_EQ(j->state().torn_bytes_dropped, 0u);
}

TEST_F(JournalTest, CorruptRecordStopsReplay) {
  {
    auto j = LeaseJournal::Open(dir_, "boot-1");
    ASSERT_TRUE(j.ok());
    for (uint64_t i = 1; i <= 3; ++i) ASSERT_TRUE(j->Put(Rec(i, 4096)).ok());
  }
  // Flip one byte in the last record's payload: its CRC no longer matches.
  int fd = open(path().c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  off_t end = lseek(fd, -2, SEEK_END);
  char c;
  ASSERT_EQ(pread(fd, &c, 1, end), 1);
  c = static_cast<char>(c ^ 0x5a);
  ASSERT_EQ(pwrite(fd, &c, 1, end), 1);
  close(fd);
  auto j = LeaseJournal::Open(dir_, "boot-1");
  ASSERT_TRUE(j.ok());
  EXPECT_EQ(j->state().leases.size(), 2u);
  EXPECT_GT(j->state().torn_bytes_dropped, 0u);
}

TEST_F(JournalTest, BadMagicIsAClearError) {
  std::ofstream(path()) << "this is not a journal";
  auto j = LeaseJournal::Open(dir_, "boot-1");
  ASSERT_FALSE(j.ok());
  EXPECT_EQ(j.status().code(), Code::kInvalidArgument);
  EXPECT_NE(j.status().message().find("bad magic"), std::string::npos);
}

TEST_F(JournalTest, CompactionKeepsLiveStateAndIdHighWater) {
  {
    auto j = LeaseJournal::Open(dir_, "boot-1");
    ASSERT_TRUE(j.ok());
    for (uint64_t i = 1; i <= 200; ++i) ASSERT_TRUE(j->Put(Rec(i, 4096)).ok());
    for (uint64_t i = 1; i <= 199; ++i) ASSERT_TRUE(j->Delete(i).ok());
    ASSERT_TRUE(j->ReserveIds(500).ok());
    off_t before = FileSize();
    ASSERT_TRUE(j->MaybeCompact().ok());  // 402 records: under the default minimum
    EXPECT_EQ(FileSize(), before);
    ASSERT_TRUE(j->MaybeCompact(4.0, 64).ok());
    EXPECT_LT(FileSize(), before / 10);
    EXPECT_EQ(j->file_records(), 3u);  // boot + next-id + one lease
    ASSERT_TRUE(j->Put(Rec(500, 1 << 21)).ok());
  }
  auto j = LeaseJournal::Open(dir_, "boot-1");
  ASSERT_TRUE(j.ok());
  EXPECT_EQ(j->state().leases.size(), 2u);
  EXPECT_TRUE(j->state().leases.count(200));
  EXPECT_TRUE(j->state().leases.count(500));
  EXPECT_EQ(j->state().next_id, 501u);
}

TEST_F(JournalTest, SameBootKeepsLeases) {
  {
    auto j = LeaseJournal::Open(dir_, "boot-a");
    ASSERT_TRUE(j.ok()) << j.status().ToString();
    ASSERT_TRUE(j->Put(Rec(1, 4096)).ok());
  }
  auto j = LeaseJournal::Open(dir_, "boot-a");
  ASSERT_TRUE(j.ok());
  EXPECT_EQ(j->state().leases.size(), 1u);
  EXPECT_EQ(j->state().boot_id, "boot-a");
  EXPECT_EQ(j->state().leases_from_earlier_boot, 0u);
}

// After a reboot the leases' memory is gone: the journal drops them, keeps
// the id high-water mark, and starts the new boot's records.
TEST_F(JournalTest, DropsLeasesOfAnEarlierBoot) {
  {
    auto j = LeaseJournal::Open(dir_, "boot-a");
    ASSERT_TRUE(j.ok());
    ASSERT_TRUE(j->Put(Rec(1, 4096)).ok());
    ASSERT_TRUE(j->Put(Rec(7, 8192)).ok());
  }
  {
    auto j = LeaseJournal::Open(dir_, "boot-b");
    ASSERT_TRUE(j.ok()) << j.status().ToString();
    EXPECT_TRUE(j->state().leases.empty());
    EXPECT_EQ(j->state().leases_from_earlier_boot, 2u);
    EXPECT_EQ(j->state().earlier_boot_id, "boot-a");
    EXPECT_EQ(j->state().boot_id, "boot-b");
    EXPECT_EQ(j->state().next_id, 8u);
    ASSERT_TRUE(j->Put(Rec(8, 4096)).ok());
  }
  auto j = LeaseJournal::Open(dir_, "boot-b");
  ASSERT_TRUE(j.ok());
  ASSERT_EQ(j->state().leases.size(), 1u);
  EXPECT_TRUE(j->state().leases.count(8));
  EXPECT_EQ(j->state().leases_from_earlier_boot, 0u);
  EXPECT_EQ(j->state().next_id, 9u);
}

// A journal from before boot ids were recorded keeps its leases.
TEST_F(JournalTest, JournalWithoutBootIdKeepsLeases) {
  {
    auto j = LeaseJournal::Open(dir_, "");
    ASSERT_TRUE(j.ok());
    ASSERT_TRUE(j->Put(Rec(3, 4096)).ok());
  }
  {
    auto j = LeaseJournal::Open(dir_, "boot-b");
    ASSERT_TRUE(j.ok());
    EXPECT_EQ(j->state().leases.size(), 1u);
    EXPECT_EQ(j->state().leases_from_earlier_boot, 0u);
  }
  auto j = LeaseJournal::Open(dir_, "boot-c");  // now it knows it was boot-b
  ASSERT_TRUE(j.ok());
  EXPECT_TRUE(j->state().leases.empty());
  EXPECT_EQ(j->state().leases_from_earlier_boot, 1u);
}

TEST(CurrentBootIdTest, ReadsTheKernelsBootId) {
  std::string id = CurrentBootId();
  if (access("/proc/sys/kernel/random/boot_id", R_OK) != 0) GTEST_SKIP() << "no boot_id";
  EXPECT_EQ(id.size(), 36u) << id;
  EXPECT_EQ(id, CurrentBootId());
}

TEST_F(JournalTest, LeftoverCompactionTempFileIsIgnored) {
  {
    auto j = LeaseJournal::Open(dir_, "boot-1");
    ASSERT_TRUE(j.ok());
    ASSERT_TRUE(j->Put(Rec(1, 4096)).ok());
  }
  std::ofstream(path() + ".tmp") << "half-written compaction";
  auto j = LeaseJournal::Open(dir_, "boot-1");
  ASSERT_TRUE(j.ok());
  EXPECT_EQ(j->state().leases.size(), 1u);
}

// A writer SIGKILLed at random moments: every reopen yields a prefix of what
// was acknowledged, and the journal stays appendable.
TEST_F(JournalTest, SigkillDuringAppendsLeavesAConsistentPrefix) {
  std::mt19937 rng(42);
  uint64_t acked_floor = 0;
  for (int round = 0; round < 20; ++round) {
    int pipefd[2];
    ASSERT_EQ(pipe(pipefd), 0);
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      close(pipefd[0]);
      auto j = LeaseJournal::Open(dir_, "boot-1");
      if (!j.ok()) _exit(3);
      uint64_t next = j->state().next_id;
      for (uint64_t i = next;; ++i) {
        if (!j->Put(Rec(i, 4096)).ok()) _exit(4);
        if (write(pipefd[1], &i, sizeof i) != sizeof i) _exit(5);
      }
    }
    close(pipefd[1]);
    usleep(std::uniform_int_distribution<int>(1000, 20000)(rng));
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    uint64_t last_acked = acked_floor, v;
    while (read(pipefd[0], &v, sizeof v) == sizeof v) last_acked = v;
    close(pipefd[0]);
    auto j = LeaseJournal::Open(dir_, "boot-1");
    ASSERT_TRUE(j.ok()) << j.status().ToString();
    // Everything acknowledged before the kill is there.
    for (uint64_t i = 1; i <= last_acked; ++i) ASSERT_TRUE(j->state().leases.count(i)) << i;
    EXPECT_GE(j->state().next_id, last_acked + 1);
    acked_floor = j->state().next_id - 1;
  }
}

}  // namespace
}  // namespace cxlpool
