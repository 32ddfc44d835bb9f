// The Reconnector (dial with backoff until the daemon answers HELLO, give
// up after $CXLPOOL_RECONNECT_TIMEOUT_MS or when the core closes) and the
// StopSignal its naps wait on.
#include "reconnector.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <string>

#include "fake_server.h"
#include "stop_signal.h"

namespace cxlpool::detail {
namespace {

class ReconnectorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/cxlpool-reconnect-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/s.sock";
  }
  void TearDown() override {
    ::unsetenv("CXLPOOL_RECONNECT_TIMEOUT_MS");
    ::unlink(path_.c_str());
    ::rmdir(dir_.c_str());
  }
  std::string dir_;
  std::string path_;
};

TEST_F(ReconnectorTest, ACoreWithoutAPathCannotReconnect) {
  StopSignal stop;
  EXPECT_FALSE(Reconnector("", stop).enabled());
  EXPECT_TRUE(Reconnector(path_, stop).enabled());
}

TEST_F(ReconnectorTest, DialsAndSaysHello) {
  testing::FakeServer server;
  ASSERT_TRUE(server.StartListening(path_).ok());
  StopSignal stop;
  Result<Reconnector::Dialed> d = Reconnector(path_, stop).Dial(42);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_TRUE(d->sock.valid());
  EXPECT_EQ(d->hello.server_version(), "fake-cxlpoold 0");
  EXPECT_EQ(server.hello_client_name().rfind("libcxlpool/", 0), 0u);
}

TEST_F(ReconnectorTest, GivesUpAfterTheTimeout) {
  ::setenv("CXLPOOL_RECONNECT_TIMEOUT_MS", "50", 1);
  StopSignal stop;
  Result<Reconnector::Dialed> d = Reconnector(path_, stop).Dial(1);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), Code::kUnavailable);
  EXPECT_EQ(d.status().message().rfind(
                "cxlpoold at " + path_ +
                    " did not come back within 50 ms: " + "no cxlpoold socket at " + path_,
                0),
            0u)
      << d.status().message();
}

TEST_F(ReconnectorTest, StopsWhenTheCoreCloses) {
  ::setenv("CXLPOOL_RECONNECT_TIMEOUT_MS", "600000", 1);
  StopSignal stop;
  ASSERT_TRUE(stop.Arm());
  Reconnector r(path_, stop);
  auto dial = std::async(std::launch::async, [&] { return r.Dial(1); });
  stop.Stop();
  // Not a timing goal: without the stop it dials for ten minutes.
  ASSERT_EQ(dial.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  Result<Reconnector::Dialed> d = dial.get();
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().message(), "the client is closing");
}

TEST(StopSignalTest, NapEndsWhenStopped) {
  StopSignal stop;
  EXPECT_TRUE(stop.Nap(1));  // unarmed: a plain sleep
  ASSERT_TRUE(stop.Arm());
  EXPECT_GE(stop.fd(), 0);
  auto nap = std::async(std::launch::async, [&] { return stop.Nap(600000); });
  stop.Stop();
  ASSERT_EQ(nap.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_FALSE(nap.get());
  EXPECT_TRUE(stop.stopping());
  EXPECT_FALSE(stop.Nap(1));
}

}  // namespace
}  // namespace cxlpool::detail
