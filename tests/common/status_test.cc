#include "cxlpool/common/status.h"

#include <gtest/gtest.h>

#include <cerrno>

namespace cxlpool {
namespace {

TEST(StatusTest, OkAndError) {
  EXPECT_TRUE(Status::Ok().ok());
  Status s(Code::kNotFound, "no lease 7");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.ToString(), "NOT_FOUND: no lease 7");
}

TEST(StatusTest, FromErrnoMapsCodes) {
  EXPECT_EQ(Status::FromErrno(ENOENT, "open").code(), Code::kNotFound);
  EXPECT_EQ(Status::FromErrno(EACCES, "open").code(), Code::kPermissionDenied);
  EXPECT_EQ(Status::FromErrno(ENOMEM, "mmap").code(), Code::kResourceExhausted);
  EXPECT_EQ(Status::FromErrno(EIO, "read").code(), Code::kIo);
  EXPECT_NE(Status::FromErrno(EIO, "read").message().find("read: "), std::string::npos);
}

TEST(ResultTest, ValueAndError) {
  Result<int> a = 5;
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, 5);
  Result<int> b = Status(Code::kInvalidArgument, "bad");
  EXPECT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), Code::kInvalidArgument);
  Result<int> c = Status::Ok();  // an OK status is not a value: internal error
  EXPECT_EQ(c.status().code(), Code::kInternal);
}

TEST(ResultDeathTest, ValueOfErrorAborts) {
  Result<int> b = Status(Code::kInvalidArgument, "bad");
  EXPECT_DEATH((void)b.value(), "INVALID_ARGUMENT: bad");
}

}  // namespace
}  // namespace cxlpool
