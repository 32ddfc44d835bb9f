#include "journal.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <random>
#include <vector>

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

// ---- damage: every kind is found, reported in state().damage, and never
// makes an id be granted twice ----

// A journal with leases 1..n, ids reserved up to `reserve`.
void Fill(const std::string& dir, uint64_t n, uint64_t reserve) {
  auto j = LeaseJournal::Open(dir, "boot-1");
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  ASSERT_TRUE(j->ReserveIds(reserve).ok());
  for (uint64_t i = 1; i <= n; ++i) {
    journal::LeaseRecord r;
    r.set_id(i);
    r.set_size_bytes(i * 4096);
    r.set_label("lease-" + std::to_string(i));
    ASSERT_TRUE(j->Put(r).ok());
  }
}

// Byte offsets of the records (after the 8-byte header).
std::vector<size_t> RecordOffsets(const std::string& data) {
  std::vector<size_t> out;
  for (size_t off = 8; off + 8 <= data.size();) {
    out.push_back(off);
    uint32_t len = 0;
    for (int i = 0; i < 4; ++i)
      len |= static_cast<uint32_t>(static_cast<uint8_t>(data[off + i])) << (8 * i);
    off += 8 + len;
  }
  return out;
}

std::string Slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void Spit(const std::string& path, const std::string& data) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << data;
}

TEST_F(JournalTest, TruncatedToZeroIsReportedAndIdsContinue) {
  Fill(dir_, 5, 1024);
  ASSERT_EQ(truncate(path().c_str(), 0), 0);
  auto j = LeaseJournal::Open(dir_, "boot-1", true);
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  const auto& s = j->state();
  EXPECT_TRUE(s.damage.journal_empty);
  EXPECT_TRUE(s.damage.journal_damaged());
  EXPECT_TRUE(s.may_have_lost_leases);
  EXPECT_TRUE(s.leases.empty());
  EXPECT_GE(s.next_id, 1024u) << "the id mark keeps the high-water mark";
  EXPECT_NE(s.damage.Describe().find("empty"), std::string::npos) << s.damage.Describe();
  // Rewritten clean: the next open finds nothing wrong and keeps the mark.
  j = LeaseJournal::Open(dir_, "boot-1", true);
  ASSERT_TRUE(j.ok());
  EXPECT_FALSE(j->state().damage.any()) << j->state().damage.Describe();
  EXPECT_GE(j->state().next_id, 1024u);
}

TEST_F(JournalTest, DeletedJournalIsReportedAndIdsContinue) {
  Fill(dir_, 5, 1024);
  ASSERT_EQ(unlink(path().c_str()), 0);
  auto j = LeaseJournal::Open(dir_, "boot-1");  // the id mark shows the directory was used
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  EXPECT_TRUE(j->state().damage.journal_missing);
  EXPECT_TRUE(j->state().may_have_lost_leases);
  EXPECT_GE(j->state().next_id, 1024u);
}

TEST_F(JournalTest, AFirstStartIsNotDamage) {
  auto j = LeaseJournal::Open(dir_, "boot-1", false);
  ASSERT_TRUE(j.ok());
  EXPECT_FALSE(j->state().damage.any()) << j->state().damage.Describe();
  EXPECT_FALSE(j->state().may_have_lost_leases);
  EXPECT_EQ(j->state().next_id, 1u);
}

TEST_F(JournalTest, FlippedByteInTheMiddleSkipsOnlyThatRecord) {
  Fill(dir_, 9, 16);
  std::string data = Slurp(path());
  auto offs = RecordOffsets(data);
  // boot, next-id, then leases 1..9: damage lease 4's payload.
  ASSERT_EQ(offs.size(), 11u);
  data[offs[5] + 12] = static_cast<char>(data[offs[5] + 12] ^ 0x40);
  Spit(path(), data);
  auto j = LeaseJournal::Open(dir_, "boot-1", true);
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  const auto& s = j->state();
  EXPECT_EQ(s.leases.size(), 8u);
  EXPECT_FALSE(s.leases.count(4));
  for (uint64_t i : {1, 2, 3, 5, 6, 7, 8, 9}) EXPECT_TRUE(s.leases.count(i)) << i;
  EXPECT_EQ(s.damage.skipped_regions, 1u);
  EXPECT_EQ(s.damage.skipped_bytes, offs[6] - offs[5]);
  EXPECT_TRUE(s.may_have_lost_leases);
  EXPECT_EQ(s.next_id, 16u);
  EXPECT_EQ(s.damage.saved_copy, path() + ".damaged");
  EXPECT_EQ(Slurp(path() + ".damaged"), data);
}

TEST_F(JournalTest, FlippedLengthFieldIsPassedToo) {
  Fill(dir_, 6, 16);
  std::string data = Slurp(path());
  auto offs = RecordOffsets(data);
  data[offs[3] + 1] = static_cast<char>(0x7f);  // lease 2's length: now far too long
  Spit(path(), data);
  auto j = LeaseJournal::Open(dir_, "boot-1", true);
  ASSERT_TRUE(j.ok());
  EXPECT_EQ(j->state().leases.size(), 5u);
  EXPECT_FALSE(j->state().leases.count(2));
  EXPECT_EQ(j->state().damage.skipped_regions, 1u);
}

TEST_F(JournalTest, TornTailIsReportedApartFromDamage) {
  Fill(dir_, 4, 16);
  off_t full = FileSize();
  ASSERT_EQ(truncate(path().c_str(), full - 5), 0);
  auto j = LeaseJournal::Open(dir_, "boot-1", true);
  ASSERT_TRUE(j.ok());
  EXPECT_GT(j->state().damage.torn_tail_bytes, 0u);
  EXPECT_FALSE(j->state().damage.journal_damaged());
  EXPECT_TRUE(j->state().damage.any());
  EXPECT_EQ(j->state().leases.size(), 3u);
}

TEST_F(JournalTest, AppendedGarbageIsDroppedAndReported) {
  Fill(dir_, 4, 16);
  std::string data = Slurp(path());
  Spit(path(), data + std::string("\xff\xff\xff\x7f garbage appended by someone", 32));
  auto j = LeaseJournal::Open(dir_, "boot-1", true);
  ASSERT_TRUE(j.ok());
  EXPECT_EQ(j->state().leases.size(), 4u);
  EXPECT_EQ(j->state().damage.bad_tail_bytes, 32u);
  EXPECT_TRUE(j->state().damage.journal_damaged());
  // Appends after it are readable again.
  journal::LeaseRecord r;
  r.set_id(20);
  r.set_size_bytes(4096);
  ASSERT_TRUE(j->Put(r).ok());
  j = LeaseJournal::Open(dir_, "boot-1", true);
  ASSERT_TRUE(j.ok());
  EXPECT_EQ(j->state().leases.size(), 5u);
  EXPECT_FALSE(j->state().damage.any()) << j->state().damage.Describe();
}

TEST_F(JournalTest, DamagedMagicWithRecordsAfterItIsRecovered) {
  Fill(dir_, 3, 16);
  std::string data = Slurp(path());
  data[2] = 'X';
  Spit(path(), data);
  auto j = LeaseJournal::Open(dir_, "boot-1", true);
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  EXPECT_TRUE(j->state().damage.bad_header);
  EXPECT_EQ(j->state().leases.size(), 3u);
}

TEST_F(JournalTest, DamageOfAnEarlierBootLosesNothingOfThisOne) {
  Fill(dir_, 3, 16);
  ASSERT_EQ(truncate(path().c_str(), 0), 0);
  auto j = LeaseJournal::Open(dir_, "boot-2", true);  // the mark says boot-1
  ASSERT_TRUE(j.ok());
  EXPECT_TRUE(j->state().damage.journal_empty);
  EXPECT_FALSE(j->state().may_have_lost_leases);
  EXPECT_GE(j->state().next_id, 16u);
}

TEST_F(JournalTest, IdMarkIsWrittenAtEveryReservationAndChecked) {
  {
    auto j = LeaseJournal::Open(dir_, "boot-1");
    ASSERT_TRUE(j.ok());
    ASSERT_TRUE(j->ReserveIds(2048).ok());
  }
  IdMark m = ReadIdMark(dir_);
  ASSERT_EQ(m.state, IdMark::State::kOk);
  EXPECT_EQ(m.next_id, 2048u);
  EXPECT_EQ(m.boot_id, "boot-1");
  // One changed digit fails its CRC.
  std::string text = Slurp(dir_ + "/lease-ids");
  auto at = text.find("2048");
  ASSERT_NE(at, std::string::npos);
  text[at] = '9';
  Spit(dir_ + "/lease-ids", text);
  EXPECT_EQ(ReadIdMark(dir_).state, IdMark::State::kDamaged);
  auto j = LeaseJournal::Open(dir_, "boot-1");
  ASSERT_TRUE(j.ok());
  EXPECT_TRUE(j->state().damage.id_mark_damaged);
  EXPECT_GE(j->state().next_id, 2048u) << "the journal still has it";
  EXPECT_EQ(ReadIdMark(dir_).state, IdMark::State::kOk) << "rewritten at open";
}

// Both the journal and the id mark lost: ids continue above any earlier
// one all the same (from the clock), never back at 1.
TEST_F(JournalTest, JournalAndIdMarkBothLostStillNeverReuseIds) {
  Fill(dir_, 3, 4096);
  ASSERT_EQ(truncate(path().c_str(), 0), 0);
  ASSERT_EQ(unlink((dir_ + "/lease-ids").c_str()), 0);
  auto j = LeaseJournal::Open(dir_, "boot-1", true);
  ASSERT_TRUE(j.ok());
  EXPECT_TRUE(j->state().damage.journal_empty);
  EXPECT_GT(j->state().next_id, 1000000000000000ull);
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
