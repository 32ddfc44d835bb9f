// Strict sysfs/procfs parsers behind DiscoverMemory (memory_internal.h).
#include <gtest/gtest.h>

#include <algorithm>

#include "memory_internal.h"

namespace cxlpool::memory_internal {
namespace {

TEST(ParseSysfsU64, DecimalAndHex) {
  EXPECT_EQ(ParseSysfsU64("42\n").value(), 42u);
  EXPECT_EQ(ParseSysfsU64("0x400000000").value(), 16ull << 30);
  for (const char* bad : {"", "  ", "abc", "-1", "12abc", "0x", "0xZZZ", "1 2"}) {
    auto r = ParseSysfsU64(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
    }
  }
}

TEST(ParseNodeId, NoNodeIsNullopt) {
  EXPECT_EQ(ParseNodeId("3\n").value(), std::optional<int>(3));
  EXPECT_EQ(ParseNodeId("-1").value(), std::nullopt);
  EXPECT_FALSE(ParseNodeId("-7").ok());
  EXPECT_FALSE(ParseNodeId("x").ok());
  EXPECT_FALSE(ParseNodeId("").ok());
  EXPECT_FALSE(ParseNodeId("99999999999").ok());
}

TEST(NumberedName, ExactPrefixAndDigits) {
  EXPECT_EQ(NumberedName("node12", "node"), 12);
  EXPECT_EQ(NumberedName("node", "node"), std::nullopt);
  EXPECT_EQ(NumberedName("node1a", "node"), std::nullopt);
  EXPECT_EQ(NumberedName("nodes", "node"), std::nullopt);
  EXPECT_EQ(NumberedName("memory_tier4", "memory_tier"), 4);
  EXPECT_EQ(NumberedName("memory4", "memory_tier"), std::nullopt);
}

TEST(ParseDistanceRow, MapsValuesToOnlineNodeIds) {
  auto row = ParseDistanceRow("10 17\n", {0, 2});
  ASSERT_TRUE(row.ok());
  EXPECT_EQ(row.value(), (std::map<int, int>{{0, 10}, {2, 17}}));
  EXPECT_FALSE(ParseDistanceRow("10 21 30", {0, 1}).ok());  // count mismatch
  EXPECT_FALSE(ParseDistanceRow("10 abc", {0, 1}).ok());
  EXPECT_FALSE(ParseDistanceRow("10 256", {0, 1}).ok());
  EXPECT_FALSE(ParseDistanceRow("", {0}).ok());
}

TEST(ParseCpuMask, WordsMostSignificantFirst) {
  EXPECT_EQ(ParseCpuMask("0000ff0f\n").value(),
            (std::vector<int>{0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15}));
  EXPECT_EQ(ParseCpuMask("00000003,00000001").value(), (std::vector<int>{0, 32, 33}));
  EXPECT_TRUE(ParseCpuMask("00000000").value().empty());
  EXPECT_FALSE(ParseCpuMask("zz").ok());
  EXPECT_FALSE(ParseCpuMask("").ok());
  EXPECT_FALSE(ParseCpuMask("1,,2").ok());
  EXPECT_FALSE(ParseCpuMask("123456789").ok());  // a word is 32 bits
}

TEST(ParseCpuinfoProcessors, ProcessorLinesAscending) {
  // x86 and ppc (the PS3 capture) spell it the same way; other keys are skipped.
  EXPECT_EQ(ParseCpuinfoProcessors("processor\t: 1\nmodel name\t: x\n\nprocessor\t: 0\n"
                                   "cpu\t\t: Cell Broadband Engine\n")
                .value(),
            (std::vector<int>{0, 1}));
  EXPECT_EQ(ParseCpuinfoProcessors("processor : 3\nprocessor : 3\n").value(),
            (std::vector<int>{3}));
  EXPECT_FALSE(ParseCpuinfoProcessors("").ok());
  EXPECT_FALSE(ParseCpuinfoProcessors("model name : x\n").ok());
  EXPECT_FALSE(ParseCpuinfoProcessors("processor\t: zz\n").ok());
  EXPECT_FALSE(ParseCpuinfoProcessors("processor\t: 99999999\n").ok());
}

TEST(ParseZoneinfo, ManagedPagesPerNodeAndZone) {
  const char* text =
      "Node 0, zone    DMA32\n  pages free     100\n        present  800\n"
      "        managed  700\n  pagesets\n    cpu: 0\n              count: 5\n"
      "Node 0, zone   Normal\n        present  9000\n        managed  8000\n"
      "Node 0, zone  Movable\n        present  0\n        managed  0\n"
      "Node 2, zone  Movable\n        spanned  4096\n        present  4096\n";
  auto z = ParseZoneinfo(text);
  ASSERT_TRUE(z.ok());
  EXPECT_EQ(z.value().at(0).at("DMA32"), 700u);
  EXPECT_EQ(z.value().at(0).at("Normal"), 8000u);
  EXPECT_EQ(z.value().at(0).at("Movable"), 0u);
  EXPECT_EQ(z.value().at(2).at("Movable"), 4096u);  // no managed line: present
  EXPECT_FALSE(ParseZoneinfo("\x89PNG junk").ok());
  EXPECT_FALSE(ParseZoneinfo("").ok());
}

TEST(DominantZone, MostWinsZeroIgnoredTiesByName) {
  EXPECT_EQ(DominantZone({{"DMA32", 23}, {"Normal", 168}}), "Normal");
  EXPECT_EQ(DominantZone({{"Movable", 5}, {"Normal", 5}}), "Movable");
  EXPECT_EQ(DominantZone({{"Movable", 0}}), std::nullopt);
  EXPECT_EQ(DominantZone({}), std::nullopt);
}

TEST(NaturalLess, NumbersCompareAsNumbers) {
  std::vector<std::string> v{"mem10", "mem2", "dax0.10", "dax0.1", "dax10.0", "dax2.0"};
  std::sort(v.begin(), v.end(), NaturalLess);
  EXPECT_EQ(v,
            (std::vector<std::string>{"dax0.1", "dax0.10", "dax2.0", "dax10.0", "mem2", "mem10"}));
  EXPECT_FALSE(NaturalLess("mem2", "mem2"));
}

TEST(Printable, EscapesBinaryAndCuts) {
  EXPECT_EQ(Printable(std::string("a\0b\xff\n", 5)), "a\\x00b\\xff\\n");
  EXPECT_EQ(Printable(std::string(100, 'x'), 4), "xxxx...");
}

TEST(DirName, Parents) {
  EXPECT_EQ(DirName("/a/b/c"), "/a/b");
  EXPECT_EQ(DirName("/a"), "/");
  EXPECT_EQ(DirName("/a/b/"), "/a");
}

}  // namespace
}  // namespace cxlpool::memory_internal
