// /proc parsing in one place (common/proc.h): stat lines with hostile comms,
// short and garbled lines, zombies, the processor field; status groups;
// the unified cgroup line; and reads through a fail-closed fake tree.
#include "cxlpool/common/proc.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

namespace cxlpool {
namespace {

// A stat line of `pid` with `comm`, state `state`, start time 4242 and
// processor 7, like the kernel's (52 fields).
std::string StatLine(int pid, const std::string& comm, char state = 'S') {
  // append, not "lit" + std::string: GCC 12 -O3 -Wrestrict (PR 105651).
  std::string s = std::to_string(pid);
  s.append(" (").append(comm).append(") ").push_back(state);
  for (int i = 4; i <= 52; ++i)
    s.append(" ").append(std::to_string(i == 22 ? 4242 : i == 39 ? 7 : i));
  s.append("\n");
  return s;
}

TEST(ProcStat, ParsesTheFieldsAfterTheLastParenthesis) {
  auto st = ParseProcStat(StatLine(42, "a) b (c"));
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->pid, 42);
  EXPECT_EQ(st->comm, "a) b (c");
  EXPECT_EQ(st->state, 'S');
  EXPECT_EQ(st->start_time, 4242u);
  EXPECT_EQ(st->processor, 7);
  EXPECT_FALSE(st->gone());
  EXPECT_TRUE(ParseProcStat(StatLine(1, "x", 'Z'))->gone());
  EXPECT_TRUE(ParseProcStat(StatLine(1, "x", 'X'))->gone());
  // Up to field 22 only: no processor, still a stat line.
  auto short_line = ParseProcStat("42 (x) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 99");
  ASSERT_TRUE(short_line.ok()) << short_line.status().ToString();
  EXPECT_EQ(short_line->start_time, 99u);
  EXPECT_EQ(short_line->processor, -1);
}

TEST(ProcStat, RefusesWhatIsNotAStatLine) {
  for (const char* bad :
       {"", "garbage", "42 (x) S 1", "(x) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20",
        "42 (x) SS 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20"}) {
    auto st = ParseProcStat(bad);
    EXPECT_EQ(st.status().code(), Code::kInvalidArgument) << bad;
  }
}

TEST(ProcStat, ReadsThroughTheFileSystemSeam) {
  FakeFileSystem fs;
  fs.AddFile("/proc/42/stat", StatLine(42, "python3"));
  auto st = ReadProcStat(fs, 42);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->comm, "python3");
  EXPECT_FALSE(ReadProcStat(fs, 43).ok()) << "the fake fails closed";
  // And the real one, for this process.
  auto real = MakeRootedFileSystem("/");
  auto me = ReadProcStat(*real, ::getpid());
  ASSERT_TRUE(me.ok()) << me.status().ToString();
  EXPECT_EQ(me->pid, ::getpid());
  EXPECT_GE(me->processor, 0);
  EXPECT_GT(me->start_time, 0u);
}

TEST(ProcStatus, GroupsAndCgroup) {
  EXPECT_EQ(ParseStatusGroups("Uid:\t1\nGroups:\t4 24 27 \nX: 1\n"),
            (std::vector<gid_t>{4, 24, 27}));
  EXPECT_TRUE(ParseStatusGroups("Groups:\n").empty());
  EXPECT_TRUE(ParseStatusGroups("").empty());
  EXPECT_EQ(ParseUnifiedCgroup("12:cpu:/a\n0::/system.slice/foo.service\n"),
            "/system.slice/foo.service");
  EXPECT_EQ(ParseUnifiedCgroup("0::/\n"), "/");
  EXPECT_EQ(ParseUnifiedCgroup("12:cpu:/a\n"), "");
}

TEST(ProcStatus, EffectiveCapabilities) {
  EXPECT_EQ(ParseStatusCapEff("CapInh:\t0000000000000000\nCapEff:\t0000000000804000\n"), 0x804000u);
  EXPECT_EQ(ParseStatusCapEff("CapEff:\t000001ffffffffff\n"), 0x1ffffffffffu);
  EXPECT_EQ(ParseStatusCapEff("CapEff:\tzz\n"), 0u);
  EXPECT_EQ(ParseStatusCapEff("Uid:\t0\n"), 0u);
  EXPECT_FALSE(HaveEffectiveCapability(-1));
  EXPECT_FALSE(HaveEffectiveCapability(64));
  // This process, against the kernel's own line read here another way.
  std::ifstream in("/proc/self/status");
  std::string line;
  unsigned long long caps = ~0ull;
  while (std::getline(in, line)) {
    if (std::sscanf(line.c_str(), "CapEff: %llx", &caps) == 1) break;
  }
  ASSERT_NE(caps, ~0ull);
  for (int cap : {12, 14, 21, 23})
    EXPECT_EQ(HaveEffectiveCapability(cap), ((caps >> cap) & 1) != 0);
}

}  // namespace
}  // namespace cxlpool
