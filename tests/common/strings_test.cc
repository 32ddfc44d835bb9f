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
  EXPECT_EQ(HumanBytes(1ull << 30), "1.0 GiB");
}

TEST(StringsTest, Integers) {
  EXPECT_EQ(*ParseU64(" 12 "), 12u);
  EXPECT_EQ(*ParseU64("0x1f", 0), 31u);
  EXPECT_FALSE(ParseU64("12abc").has_value());
  EXPECT_FALSE(ParseU64("-1").has_value());
  EXPECT_EQ(*ParseI64("-1"), -1);
}

TEST(StringsTest, Meminfo) {
  auto m = ParseMeminfo("Node 1 MemTotal:       1024 kB\nNode 1 HugePages_Total:     4\ngarbage\n");
  EXPECT_EQ(m["MemTotal"], 1024u * 1024);
  EXPECT_EQ(m["HugePages_Total"], 4u);
  EXPECT_EQ(m.size(), 2u);
}

}  // namespace
}  // namespace cxlpool
