// The HELLO handshake shared by libcxlpool and BlockingClient: the reply's
// checks, the refusal a daemon writes before it closes, and the limits a
// reply settles.
#include "cxlpool/proto/hello.h"

#include <gtest/gtest.h>
#include <sys/socket.h>

#include <functional>
#include <thread>

#include "cxlpool/common/unique_fd.h"
#include "cxlpool/proto/codec.h"
#include "cxlpool/proto/ipc.h"

namespace cxlpool::wire {
namespace {

// A socket pair: the client's end, and a thread playing the daemon on the
// other that reads the HELLO and answers with `answer`.
class HelloTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int sv[2];
    ASSERT_EQ(0, ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv));
    client_.Reset(sv[0]);
    daemon_.Reset(sv[1]);
  }
  void TearDown() override {
    if (thread_.joinable()) thread_.join();
  }
  void Daemon(std::function<void(int sock)> fn) {
    thread_ = std::thread([this, fn = std::move(fn)] { fn(daemon_.get()); });
  }
  // Reads the HELLO and answers `reply` under `id` (0: the request's id).
  void Answer(proto::HelloReply reply, uint64_t id = 0) {
    Daemon([this, reply, id](int sock) {
      Result<Frame> f = RecvFrame(sock, {}, 5000);
      ASSERT_TRUE(f.ok()) << f.status().ToString();
      EXPECT_EQ(f->type(), proto::MSG_HELLO_REQUEST);
      EXPECT_EQ(f->header.version, kHelloWireVersion);
      proto::HelloRequest req;
      ASSERT_TRUE(Decode(f->payload, &req).ok());
      request_ = req;
      EXPECT_TRUE(SendMessage(sock, reply, id == 0 ? f->request_id() : id).ok());
    });
  }
  static proto::HelloReply Reply(uint32_t version) {
    proto::HelloReply r;
    r.set_version(version);
    r.set_server_version("test-daemon");
    return r;
  }
  UniqueFd client_;
  UniqueFd daemon_;
  std::thread thread_;
  proto::HelloRequest request_;
};

TEST_F(HelloTest, SendsTheOptionsAndReturnsTheReply) {
  Answer(Reply(2));
  HelloOptions o;
  o.name = "hello-test";
  Result<proto::HelloReply> r = SayHello(client_.get(), 7, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->version(), 2u);
  EXPECT_EQ(r->server_version(), "test-daemon");
  thread_.join();
  EXPECT_EQ(request_.client_name(), "hello-test");
  EXPECT_EQ(request_.min_version(), kMinWireVersion);
  EXPECT_EQ(request_.max_version(), kMaxWireVersion);
  EXPECT_EQ(request_.max_fds_per_frame(), kHardMaxFdsPerFrame);
}

TEST_F(HelloTest, AReplyToAnotherRequestIsAProtocolError) {
  Answer(Reply(1), /*id=*/99);
  Result<proto::HelloReply> r = SayHello(client_.get(), 1, HelloOptions{});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kProtocol);
  EXPECT_NE(r.status().message().find("request id 99, expected 1"), std::string::npos)
      << r.status().message();
}

TEST_F(HelloTest, AVersionOutsideTheOfferedRangeIsAProtocolError) {
  Answer(Reply(2));
  HelloOptions o;
  o.max_version = 1;
  Result<proto::HelloReply> r = SayHello(client_.get(), 1, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kProtocol);
  EXPECT_NE(r.status().message().find("chose protocol version 2"), std::string::npos)
      << r.status().message();
}

TEST_F(HelloTest, TheDaemonsRefusalIsTheAnswer) {
  Daemon([](int sock) {
    (void)SendFrame(sock, proto::MSG_ERROR_REPLY, 0,
                    EncodeErrorPayload(Status(Code::kResourceExhausted, "too many connections")));
  });
  thread_.join();
  daemon_.Reset();  // closed after saying why
  Result<proto::HelloReply> r = SayHello(client_.get(), 1, HelloOptions{});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kResourceExhausted);
  EXPECT_EQ(r.status().message(), "too many connections");
}

TEST_F(HelloTest, ReadRefusalIsEmptyWithoutOne) {
  daemon_.Reset();
  EXPECT_FALSE(ReadRefusal(client_.get()).has_value());
}

TEST(HelloLimits, DefaultsWhenTheReplyDoesNotSay) {
  proto::HelloReply r;
  EXPECT_EQ(MaxPayloadBytes(r), kDefaultMaxFrameBytes);
  EXPECT_EQ(RequestFdsPerFrame(r), 0u);
  r.set_max_frame_bytes(uint64_t{1} << 40);
  r.set_max_fds_per_frame(100000);
  EXPECT_EQ(MaxPayloadBytes(r), kHardMaxFrameBytes);
  EXPECT_EQ(RequestFdsPerFrame(r), kMaxExtentFdsPerFrame);
  r.set_max_frame_bytes(4096);
  r.set_max_fds_per_frame(8);
  EXPECT_EQ(MaxPayloadBytes(r), 4096u);
  EXPECT_EQ(RequestFdsPerFrame(r), 8u);
}

}  // namespace
}  // namespace cxlpool::wire
