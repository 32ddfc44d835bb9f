#include "cxlpool/common/strings.h"

#include <gtest/gtest.h>

namespace cxlpool {
namespace {

TEST(StringsTest, CpuList) {
  auto r = ParseCpuList("0-3,8,10-11\n");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(FormatCpuList(*r), "0-3,8,10-11");
  EXPECT_TRUE(ParseCpuList("")->empty());
  EXPECT_FALSE(ParseCpuList("3-1").ok());
  EXPECT_FALSE(ParseCpuList("0-x").ok());
  EXPECT_FALSE(ParseCpuList("0,,1").ok());
  // Ids beyond any kernel's CPU count are refused, not expanded.
  EXPECT_EQ(ParseCpuList("0-16383")->size(), 16384u);
  auto huge = ParseCpuList("0 0-406107");
  EXPECT_FALSE(huge.ok());
  EXPECT_FALSE(ParseCpuList("16384").ok());
  EXPECT_NE(ParseCpuList("0-1048576").status().message().find("above 16383"), std::string::npos);
  EXPECT_TRUE(ParseCpuList("0-1023", kMaxNodeListId).ok());
  EXPECT_FALSE(ParseCpuList("0-1024", kMaxNodeListId).ok()) << "node lists stop at 1023";
  // Overlapping parts: each id once, in order.
  std::string many;
  for (int i = 0; i < 500; ++i) many.append(i ? "," : "").append("0-16383");
  auto merged = ParseCpuList(many + ",5,20000-20000");
  EXPECT_FALSE(merged.ok()) << "one bad part refuses the list";
  merged = ParseCpuList(many + ",5,3-9");
  ASSERT_TRUE(merged.ok());
  EXPECT_EQ(merged->size(), 16384u);
  EXPECT_EQ(merged->front(), 0);
  EXPECT_EQ(merged->back(), 16383);
  EXPECT_EQ(*ParseCpuList("8,0-3,2-5"), (std::vector<int>{0, 1, 2, 3, 4, 5, 8}));
}

TEST(StringsTest, ByteSizes) {
  EXPECT_EQ(*ParseByteSize("4096"), 4096u);
  EXPECT_EQ(*ParseByteSize("64K"), 65536u);
  EXPECT_EQ(*ParseByteSize("2MiB"), 2u << 20);
  EXPECT_EQ(*ParseByteSize("1G"), 1ull << 30);
  EXPECT_EQ(*ParseByteSize("1.5G"), 3ull << 29);
  EXPECT_FALSE(ParseByteSize("1X").ok());
  EXPECT_FALSE(ParseByteSize("").ok());
  EXPECT_FALSE(ParseByteSize("99999999999999999999").ok());
  // Signs, no digit, and anything over 2^64-1 are refused, never wrapped.
  for (const char* bad : {"-1", "-1K", "+1", ".", ".K", "18446744073709551616", "16385P",
                          "16777216T", "1e3", "0x10", "1..5G"}) {
    EXPECT_FALSE(ParseByteSize(bad).ok()) << bad;
  }
  EXPECT_EQ(*ParseByteSize("18446744073709551615"), UINT64_MAX);
  EXPECT_EQ(*ParseByteSize("0"), 0u);
  EXPECT_EQ(HumanBytes(1ull << 30), "1.0 GiB");
}

TEST(StringsTest, Integers) {
  EXPECT_EQ(*ParseU64(" 12 "), 12u);
  EXPECT_EQ(*ParseU64("0x1f", 0), 31u);
  EXPECT_FALSE(ParseU64("12abc").has_value());
  EXPECT_FALSE(ParseU64("-1").has_value());
  EXPECT_FALSE(ParseU64("+1").has_value());
  EXPECT_FALSE(ParseU64("18446744073709551616").has_value());
  EXPECT_EQ(*ParseU64("18446744073709551615"), UINT64_MAX);
  EXPECT_EQ(*ParseI64("-1"), -1);
}

TEST(StringsTest, SanitizeUtf8) {
  EXPECT_EQ(SanitizeUtf8("python3"), "python3");
  EXPECT_EQ(SanitizeUtf8("caf\xc3\xa9"), "caf\xc3\xa9");  // valid 2-byte
  EXPECT_EQ(SanitizeUtf8("a\xa3"
                         "b"),
            "a?b");                                                 // stray continuation
  EXPECT_EQ(SanitizeUtf8("\xe2\x82"), "??");                        // truncated 3-byte
  EXPECT_EQ(SanitizeUtf8("\xc0\xaf"), "??");                        // overlong '/'
  EXPECT_EQ(SanitizeUtf8("\xed\xa0\x80"), "???");                   // surrogate
  EXPECT_EQ(SanitizeUtf8("\xf0\x9f\x98\x80"), "\xf0\x9f\x98\x80");  // emoji
}

TEST(StringsTest, Meminfo) {
  auto m = ParseMeminfo("Node 1 MemTotal:       1024 kB\nNode 1 HugePages_Total:     4\ngarbage\n");
  EXPECT_EQ(m["MemTotal"], 1024u * 1024);
  EXPECT_EQ(m["HugePages_Total"], 4u);
  EXPECT_EQ(m.size(), 2u);
}

TEST(StringsTest, TrimSysfsValueDropsTrailingNulPadding) {
  using namespace std::string_literals;
  EXPECT_EQ(TrimSysfsValue("0-31\n\0"s), "0-31");
  EXPECT_EQ(TrimSysfsValue("  0-31\0\n\0\0 "s), "0-31");
  EXPECT_EQ(TrimSysfsValue("\0"s), "");
  EXPECT_EQ(TrimSysfsValue(""), "");
  // A NUL with something after it is not padding: it stays, for the parser
  // to report.
  EXPECT_EQ(TrimSysfsValue("0-3\0junk\n"s), "0-3\0junk"s);
  // Leading NULs are not trimmed either.
  EXPECT_EQ(TrimSysfsValue("\0"
                           "5\n"s),
            "\0"
            "5"s);
}

}  // namespace
}  // namespace cxlpool
