// Frame header layout and validation; per-message codec; error mapping;
// version negotiation.
#include <gtest/gtest.h>

#include <cstring>

#include "cxlpool/proto/codec.h"
#include "cxlpool/proto/frame.h"

namespace cxlpool::wire {
namespace {

TEST(FrameHeader, LayoutIsLittleEndianAndFixed) {
  FrameHeader h;
  h.version = 1;
  h.type = proto::MSG_ALLOC_REPLY;
  h.flags = 0;
  h.length = 0x01020304;
  h.request_id = 0x1122334455667788ull;
  uint8_t b[kFrameHeaderSize];
  EncodeFrameHeader(h, std::span<uint8_t, kFrameHeaderSize>(b));
  EXPECT_EQ(0, std::memcmp(b, "CXLP", 4));  // magic 0x504C5843, little-endian
  EXPECT_EQ(b[4], 1);
  EXPECT_EQ(b[5], 0);
  EXPECT_EQ(b[6], proto::MSG_ALLOC_REPLY);
  EXPECT_EQ(b[7], 0);
  EXPECT_EQ(b[12], 0x04);
  EXPECT_EQ(b[15], 0x01);
  EXPECT_EQ(b[16], 0x88);
  EXPECT_EQ(b[23], 0x11);
  FrameHeader d = DecodeFrameHeader(std::span<const uint8_t, kFrameHeaderSize>(b));
  EXPECT_EQ(d.magic, kFrameMagic);
  EXPECT_EQ(d.type, h.type);
  EXPECT_EQ(d.length, h.length);
  EXPECT_EQ(d.request_id, h.request_id);
}

TEST(FrameHeader, ValidationNamesTheProblem) {
  FrameHeader ok;
  ok.length = 10;
  EXPECT_TRUE(ValidateFrameHeader(ok, 100).ok());

  FrameHeader bad = ok;
  bad.magic = 0x47455420;  // "GET "
  Status st = ValidateFrameHeader(bad, 100);
  EXPECT_EQ(st.code(), Code::kProtocol);
  EXPECT_NE(st.message().find("magic"), std::string::npos);

  bad = ok;
  bad.version = 0;
  EXPECT_NE(ValidateFrameHeader(bad, 100).message().find("version"), std::string::npos);
  bad.version = kMaxWireVersion + 1;
  EXPECT_EQ(ValidateFrameHeader(bad, 100).code(), Code::kProtocol);
  for (uint16_t v = kMinWireVersion; v <= kMaxWireVersion; ++v) {
    bad.version = v;
    EXPECT_TRUE(ValidateFrameHeader(bad, 100).ok()) << v;
  }
  // HELLO and its answers are always readable in version 1.
  for (auto t : {proto::MSG_HELLO_REQUEST, proto::MSG_HELLO_REPLY, proto::MSG_ERROR_REPLY}) {
    bad.type = t;
    bad.version = kHelloWireVersion;
    EXPECT_TRUE(ValidateFrameHeader(bad, 100).ok()) << t;
  }

  bad = ok;
  bad.flags = 4;
  EXPECT_NE(ValidateFrameHeader(bad, 100).message().find("flags"), std::string::npos);

  bad = ok;
  bad.length = 101;
  st = ValidateFrameHeader(bad, 100);
  EXPECT_EQ(st.code(), Code::kProtocol);
  EXPECT_NE(st.message().find("exceeds"), std::string::npos);
}

TEST(FrameHeader, TypesAndFdRules) {
  EXPECT_TRUE(IsKnownType(proto::MSG_LEASE_EVENT));
  EXPECT_FALSE(IsKnownType(0));
  EXPECT_FALSE(IsKnownType(555));
  EXPECT_TRUE(IsRequestType(proto::MSG_HELLO_REQUEST));
  EXPECT_TRUE(IsRequestType(proto::MSG_METRICS_REQUEST));
  EXPECT_FALSE(IsRequestType(proto::MSG_HELLO_REPLY));
  EXPECT_FALSE(IsRequestType(proto::MSG_ERROR_REPLY));
  EXPECT_FALSE(IsRequestType(proto::MSG_LEASE_EVENT));
  EXPECT_EQ(MaxFdsForType(proto::MSG_ALLOC_REPLY, kDefaultMaxFdsPerFrame, 1), 1u);
  EXPECT_EQ(MaxFdsForType(proto::MSG_ATTACH_REPLY, kDefaultMaxFdsPerFrame, 1), 1u);
  EXPECT_EQ(MaxFdsForType(proto::MSG_EXTENT_FDS, kDefaultMaxFdsPerFrame, 1), 0u);
  // Version 2: lease replies carry one fd per extent, up to SCM_MAX_FD.
  EXPECT_EQ(MaxFdsForType(proto::MSG_ALLOC_REPLY), kMaxExtentFdsPerFrame);
  EXPECT_EQ(MaxFdsForType(proto::MSG_ATTACH_REPLY, 7, 2), 253u);
  EXPECT_EQ(MaxFdsForType(proto::MSG_EXTENT_FDS, 7, 2), 253u);
  EXPECT_FALSE(IsRequestType(proto::MSG_EXTENT_FDS));
  EXPECT_EQ(MaxFdsForType(proto::MSG_RECLAIM_REQUEST, 7), 7u);
  EXPECT_EQ(MaxFdsForType(proto::MSG_STAT_REPLY), 0u);
  EXPECT_EQ(MaxFdsForType(555), 0u);
  EXPECT_EQ(MsgTypeName(proto::MSG_ALLOC_REPLY), "MSG_ALLOC_REPLY");
  EXPECT_EQ(MsgTypeName(555), "MSG_555");
}

TEST(Codec, RoundTripAndTypes) {
  proto::AllocRequest req;
  req.set_size_bytes(1ull << 30);
  req.set_numa_node(1);
  req.set_label("kv-cache");
  static_assert(TypeOf<proto::AllocRequest>() == proto::MSG_ALLOC_REQUEST);
  static_assert(TypeOf<proto::LeaseEvent>() == proto::MSG_LEASE_EVENT);
  Result<std::string> bytes = Encode(req);
  ASSERT_TRUE(bytes.ok());
  proto::AllocRequest back;
  ASSERT_TRUE(Decode(*bytes, &back).ok());
  EXPECT_EQ(back.size_bytes(), 1ull << 30);
  EXPECT_EQ(back.numa_node(), 1);
  EXPECT_EQ(back.label(), "kv-cache");

  Result<std::string> frame = EncodeMessageFrame(req, 42);
  ASSERT_TRUE(frame.ok());
  ASSERT_EQ(frame->size(), kFrameHeaderSize + bytes->size());
  FrameHeader h = DecodeFrameHeader(std::span<const uint8_t, kFrameHeaderSize>(
      reinterpret_cast<const uint8_t*>(frame->data()), kFrameHeaderSize));
  EXPECT_EQ(h.type, proto::MSG_ALLOC_REQUEST);
  EXPECT_EQ(h.request_id, 42u);
  EXPECT_EQ(h.length, bytes->size());
}

TEST(Codec, GarbageAndOversizeAreErrors) {
  proto::HelloRequest hello;
  Status st = Decode(std::string("\xff\xff\xff\xff\xff", 5), &hello);
  EXPECT_EQ(st.code(), Code::kProtocol);
  EXPECT_NE(st.message().find("HelloRequest"), std::string::npos);

  proto::TopologyReply big;
  big.set_json(std::string(2000, 'x'));
  Result<std::string> r = Encode(big, 1000);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kProtocol);
}

TEST(Codec, DecodeReplyChecksTypeAndSurfacesErrors) {
  Frame f;
  f.header.type = proto::MSG_ERROR_REPLY;
  f.payload = EncodeErrorPayload(Status(Code::kResourceExhausted, "pool node1 full"));
  proto::AllocReply out;
  Status st = DecodeReply(f, &out);
  EXPECT_EQ(st.code(), Code::kResourceExhausted);
  EXPECT_EQ(st.message(), "pool node1 full");

  f.header.type = proto::MSG_STAT_REPLY;
  f.payload.clear();
  st = DecodeReply(f, &out);
  EXPECT_EQ(st.code(), Code::kProtocol);
  EXPECT_NE(st.message().find("expected MSG_ALLOC_REPLY"), std::string::npos);

  f.header.type = proto::MSG_ALLOC_REPLY;
  f.fds_dropped = 2;
  EXPECT_EQ(DecodeReply(f, &out).code(), Code::kProtocol);
  f.fds_dropped = 0;
  EXPECT_TRUE(DecodeReply(f, &out).ok());
}

TEST(Codec, ErrorCodesMapOneToOne) {
  for (int c = 1; c <= static_cast<int>(Code::kRevoked); ++c) {
    Status in(static_cast<Code>(c), std::string("m").append(std::to_string(c)));
    proto::ErrorReply e = ToErrorReply(in);
    EXPECT_EQ(static_cast<int>(e.code()), c);
    Status out = FromErrorReply(e);
    EXPECT_EQ(out.code(), in.code());
    EXPECT_EQ(out.message(), in.message());
  }
  proto::ErrorReply ok;
  EXPECT_EQ(FromErrorReply(ok).code(), Code::kProtocol);
}

TEST(Codec, VersionNegotiation) {
  EXPECT_EQ(*NegotiateVersion(1, 1), 1u);
  EXPECT_EQ(*NegotiateVersion(1, 5), kMaxWireVersion);
  EXPECT_EQ(*NegotiateVersion(1, 5, 1, 3), 3u);
  EXPECT_EQ(*NegotiateVersion(2, 2, 1, 3), 2u);
  // An old client (1..1) against a server that needs 2..2: both ranges named.
  Result<uint32_t> none = NegotiateVersion(1, 1, 2, 2);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), Code::kProtocol);
  EXPECT_NE(none.status().message().find("client speaks 1..1, server speaks 2..2"),
            std::string::npos)
      << none.status().message();
  EXPECT_FALSE(NegotiateVersion(3, 1).ok());
}

}  // namespace
}  // namespace cxlpool::wire
