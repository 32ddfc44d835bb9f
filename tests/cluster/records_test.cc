// Records and the view derived from them: pure, no etcd.
#include <gtest/gtest.h>

#include "cxlpool/cluster/cluster_view.h"

namespace cxlpool::cluster {
namespace {

etcd::KeyValue Kv(std::string key, std::string value, int64_t create, int64_t mod = 0) {
  etcd::KeyValue kv;
  kv.key = std::move(key);
  kv.value = std::move(value);
  kv.create_revision = create;
  kv.mod_revision = mod ? mod : create;
  kv.version = 1;
  return kv;
}

HostRecord Host(const std::string& name) {
  HostRecord r;
  r.host = name;
  r.instance = "inst-" + name;
  r.version = "test";
  r.pools.push_back({0, "memfd", "dram", 8ull << 30, 1ull << 30, 0, 7ull << 30});
  r.gpus.push_back({0, "H100", {0}, false});
  r.shared_devices.push_back({"devA", "/dev/dax0.0", 4ull << 30, 1, 0});
  return r;
}

TEST(ClusterRecords, HostRecordRoundTrips) {
  const HostRecord r = Host("h1");
  auto back = ParseHostRecord(ToJson(r));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(ToJson(*back), ToJson(r));
  EXPECT_EQ(back->pools.at(0).free, 7ull << 30);
  EXPECT_EQ(back->gpus.at(0).nearest_nodes, std::vector<int>{0});
}

TEST(ClusterRecords, BadRecordsNameTheField) {
  struct Case {
    const char* json;
    const char* expect;
  } cases[] = {
      {"not json", "not JSON"},
      {"[1]", "not an object"},
      {R"({"instance":"","version":"","published_at":0})", "host: missing"},
      {R"({"host":"a/b","instance":"","version":"","published_at":0})", "only [A-Za-z0-9._:-]"},
      {R"({"host":"h","instance":"","version":"","published_at":-1})",
       "published_at: out of range"},
      {R"({"host":"h","instance":"","version":"","published_at":0,"pools":[{"node":0,"kind":"m",
          "tier":"d","capacity":1,"leased":2,"reserve":0,"free":0}]})",
       "leased or free above capacity"},
      {R"({"host":"h","instance":"","version":"","published_at":0,"gpus":[{"index":0,"name":"x",
          "nearest_nodes":["a"]}]})",
       "not a node number"},
      {R"({"host":"h","instance":"\u0001","version":"","published_at":0})", "control character"},
  };
  for (const auto& c : cases) {
    auto r = ParseHostRecord(c.json);
    ASSERT_FALSE(r.ok()) << c.json;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
    EXPECT_NE(r.status().message().find(c.expect), std::string::npos)
        << c.json << " -> " << r.status().message();
  }
  EXPECT_FALSE(ParseHostRecord(std::string(kMaxRecordBytes + 1, ' ')).ok());
}

TEST(ClusterRecords, DeviceSlicingIsChecked) {
  EXPECT_TRUE(ParseDeviceRecord(R"({"size":4294967296,"slice_bytes":1073741824})").ok());
  EXPECT_FALSE(ParseDeviceRecord(R"({"size":4294967296,"slice_bytes":1000})").ok());
  EXPECT_FALSE(ParseDeviceRecord(R"({"size":1048576,"slice_bytes":2097152})").ok());
  EXPECT_FALSE(ParseDeviceRecord(R"({"size":4294967296,"slice_bytes":0})").ok());
  EXPECT_FALSE(ParseSliceRecord(R"({"owner":"h","epoch":0,"since":1})").ok());
  EXPECT_FALSE(ParseFenceRecord(R"({"host":"h","epoch":3,"by":"","at":1})").ok());
}

TEST(ClusterKeys, ParseOnlyWhatTheyMake) {
  const Keys keys("/p/");
  EXPECT_EQ(keys.Slice("devA", 3), "/p/slices/devA/00000003");
  auto s = keys.ParseSlice(keys.Slice("devA", 12345678u));
  ASSERT_TRUE(s);
  EXPECT_EQ(s->device, "devA");
  EXPECT_EQ(s->index, 12345678u);
  EXPECT_FALSE(keys.ParseSlice("/p/slices/devA/1"));  // an alias of 00000001
  EXPECT_FALSE(keys.ParseSlice("/p/slices/devA/99999999999"));
  EXPECT_FALSE(keys.ParseSlice("/p/slices/devA/x1"));
  EXPECT_FALSE(keys.ParseSlice("/p/slices/a b/1"));
  auto f = keys.ParseFence(keys.Fence("h1", 42));
  ASSERT_TRUE(f);
  EXPECT_EQ(f->first, "h1");
  EXPECT_EQ(f->second, 42);
  EXPECT_FALSE(keys.ParseFence("/p/fences/h1/0"));
  EXPECT_EQ(keys.ParseHost("/p/hosts/h1").value_or(""), "h1");
  EXPECT_FALSE(keys.ParseHost("/p/hosts/h1/x"));
}

// The states of a slice follow the owner's session and the fences.
TEST(ClusterView, SliceStatesFollowSessionsAndFences) {
  const Keys keys;
  std::vector<etcd::KeyValue> kvs{
      Kv(keys.Host("h1"), ToJson(Host("h1")), 10),
      Kv(keys.Device("devA"), ToJson(DeviceRecord{4ull << 30, 1ull << 30}), 2),
      // h1's live epoch (10): owned.
      Kv(keys.Slice("devA", 0), ToJson(SliceRecord{"h1", 10, 0}), 11),
      // h1's earlier epoch: quarantined until h1 re-adopts it.
      Kv(keys.Slice("devA", 1), ToJson(SliceRecord{"h1", 5, 0}), 6),
      // h2 has no session and no fence: quarantined.
      Kv(keys.Slice("devA", 2), ToJson(SliceRecord{"h2", 7, 0}), 8),
      // h3 has no session, an operator fenced epoch 4: claimable.
      Kv(keys.Slice("devA", 3), ToJson(SliceRecord{"h3", 4, 0}), 9),
      Kv(keys.Fence("h3", 4), ToJson(FenceRecord{"h3", 4, "root@adm", 1, "dead"}), 12),
  };
  const ClusterView v = ClusterView::FromKvs(keys, kvs, 12);
  ASSERT_TRUE(v.invalid.empty()) << v.invalid.at(0);
  const auto& slices = v.devices.at("devA").slices;
  ASSERT_EQ(slices.size(), 4u);
  EXPECT_EQ(slices[0].state, SliceState::kOwned);
  EXPECT_EQ(slices[1].state, SliceState::kQuarantined);
  EXPECT_EQ(slices[2].state, SliceState::kQuarantined);
  EXPECT_EQ(slices[3].state, SliceState::kFenced);
  EXPECT_EQ(v.CountSlices(SliceState::kFree), 0u);
  EXPECT_EQ(v.LiveEpoch("h1"), 10);
  EXPECT_EQ(v.LiveEpoch("h2"), 0);
}

// A record that fails validation is listed, and a slice behind it is never free.
TEST(ClusterView, InvalidRecordsAreListedAndNeverFree) {
  const Keys keys;
  std::vector<etcd::KeyValue> kvs{
      Kv(keys.Host("h1"), R"({"host":"h2","instance":"","version":"","published_at":0})", 3),
      Kv(keys.Device("devA"), ToJson(DeviceRecord{2ull << 30, 1ull << 30}), 2),
      Kv(keys.Slice("devA", 0), "{garbage", 4),
      Kv(keys.Slice("devA", 7), ToJson(SliceRecord{"h1", 3, 0}), 5),
      Kv(keys.Fence("h1", 3), ToJson(FenceRecord{"h9", 3, "x", 1, ""}), 6),
  };
  const ClusterView v = ClusterView::FromKvs(keys, kvs, 6);
  EXPECT_EQ(v.invalid.size(), 4u);
  EXPECT_TRUE(v.hosts.empty());
  EXPECT_TRUE(v.fences.empty());
  EXPECT_EQ(v.devices.at("devA").slices[0].state, SliceState::kQuarantined);
  EXPECT_EQ(v.devices.at("devA").slices[1].state, SliceState::kFree);
}

}  // namespace
}  // namespace cxlpool::cluster
