// The --json form: every documented field present, absent facts null (never
// omitted), schema order, and no exception on hostile strings.
#include "cxlpool/topology/json.h"

#include <gtest/gtest.h>

#include "gpu_test_util.h"

namespace cxlpool {
namespace {

using Json = nlohmann::ordered_json;  // what TopologyToJson returns

std::vector<std::string> Keys(const nlohmann::ordered_json& j) {
  std::vector<std::string> out;
  for (auto it = j.begin(); it != j.end(); ++it) out.push_back(it.key());
  return out;
}

TEST(TopologyJson, EmptyTopologyHasEveryTopLevelField) {
  auto j = TopologyToJson(Topology{});
  EXPECT_EQ(Keys(j),
            (std::vector<std::string>{"schema_version", "numa_nodes", "dax_devices", "cxl", "gpus",
                                      "memory_tiers", "gpu_memory_preference", "warnings"}));
  EXPECT_EQ(j["schema_version"], 1);
  EXPECT_TRUE(j["numa_nodes"].is_array());
  EXPECT_TRUE(j["cxl"]["memdevs"].is_array());
  EXPECT_TRUE(j["cxl"]["regions"].is_array());
  EXPECT_TRUE(j["gpu_memory_preference"].is_object());
}

TEST(TopologyJson, AbsentFactsAreNullNotOmitted) {
  Topology t;
  NumaNode n;
  n.id = 3;
  n.access.push_back(AccessClass{});  // every figure absent
  t.numa_nodes.push_back(n);
  t.dax_devices.push_back(DaxDevice{"dax0.0"});
  t.cxl_memdevs.push_back(CxlMemdev{"mem0"});
  t.cxl_regions.push_back(CxlRegion{"region0"});
  Gpu g;  // PCI-scan GPU with nothing known but the bus id
  g.pci_bus_id = "0000:17:00.0";
  g.source = "pci";
  t.gpus.push_back(g);
  auto j = TopologyToJson(t);

  const auto& node = j["numa_nodes"][0];
  EXPECT_EQ(Keys(node),
            (std::vector<std::string>{"id", "cpus", "memory_bytes", "free_bytes", "kind",
                                      "kind_reason", "distances", "memory_tier", "zone",
                                      "kernel_zone_bytes", "movable_bytes", "long_term_pins",
                                      "not_pooled_reason", "access", "hugepages", "local_gpus"}));
  for (const char* k : {"memory_bytes", "free_bytes", "kind_reason", "memory_tier", "zone",
                        "kernel_zone_bytes", "movable_bytes", "long_term_pins"})
    EXPECT_TRUE(node[k].is_null()) << k;
  EXPECT_EQ(node["not_pooled_reason"], "memory size unknown");
  EXPECT_EQ(node["kind"], "unknown");
  EXPECT_EQ(node["cpus"], Json::array());
  EXPECT_EQ(node["distances"], Json::object());
  EXPECT_EQ(
      Keys(node["access"][0]),
      (std::vector<std::string>{"class", "initiators", "read_bandwidth_mbps",
                                "write_bandwidth_mbps", "read_latency_ns", "write_latency_ns"}));
  for (const char* k :
       {"read_bandwidth_mbps", "write_bandwidth_mbps", "read_latency_ns", "write_latency_ns"})
    EXPECT_TRUE(node["access"][0][k].is_null()) << k;
  EXPECT_TRUE(node["hugepages"]["2m"]["total"].is_null());
  EXPECT_TRUE(node["hugepages"]["1g"]["free"].is_null());

  EXPECT_EQ(Keys(j["dax_devices"][0]),
            (std::vector<std::string>{"name", "size_bytes", "target_node", "mode", "source",
                                      "region", "dynamic", "align_bytes"}));
  for (const char* k : {"size_bytes", "target_node", "mode", "source", "region", "dynamic"})
    EXPECT_TRUE(j["dax_devices"][0][k].is_null()) << k;
  EXPECT_EQ(Keys(j["cxl"]["memdevs"][0]),
            (std::vector<std::string>{"name", "serial", "ram_bytes", "pmem_bytes", "numa_node"}));
  EXPECT_TRUE(j["cxl"]["memdevs"][0]["serial"].is_null());
  EXPECT_EQ(Keys(j["cxl"]["regions"][0]),
            (std::vector<std::string>{"name", "size_bytes", "type", "memdevs", "dax_devices",
                                      "numa_nodes"}));
  EXPECT_TRUE(j["cxl"]["regions"][0]["type"].is_null());

  const auto& gpu = j["gpus"][0];
  EXPECT_EQ(Keys(gpu), (std::vector<std::string>{"index", "uuid", "name", "pci_bus_id",
                                                 "memory_bytes", "numa_node", "memory_node",
                                                 "memory_node_source", "source", "nvlinks"}));
  for (const char* k : {"uuid", "name", "memory_bytes", "numa_node", "memory_node",
                        "memory_node_source", "nvlinks"})
    EXPECT_TRUE(gpu[k].is_null()) << k;
  EXPECT_EQ(gpu["pci_bus_id"], "0000:17:00.0");
}

TEST(TopologyJson, KnownValuesAndNvlinks) {
  Topology t = testing_gpu::TwoSockets();
  t.numa_nodes[0].memory_tier = 4;
  t.numa_nodes[0].zone = "Normal";
  t.numa_nodes[0].hugepages_2m_total = 16;
  t.numa_nodes[0].hugepages_2m_free = 8;
  Gpu g;
  g.index = 0;
  g.pci_bus_id = "0000:17:00.0";
  g.numa_node = 0;
  g.nvlinks_known = true;  // NVML answered: no links is [] not null
  t.gpus.push_back(g);
  g.index = 1;
  g.nvlinks.push_back(NvLink{3, true, "0000:05:00.0", "switch"});
  g.nvlinks.push_back(NvLink{4, false, std::nullopt, std::nullopt});
  t.gpus.push_back(g);
  t.gpu_memory_preference[0] = {0, 1};
  t.memory_tiers.push_back(MemoryTier{4, {0, 1}});
  t.warnings.push_back("something odd");
  auto j = TopologyToJson(t);
  EXPECT_EQ(j["numa_nodes"][0]["distances"], (Json{{"0", 10}, {"1", 21}}));
  EXPECT_EQ(j["numa_nodes"][0]["cpus"], (Json{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(j["numa_nodes"][0]["memory_bytes"], 64ull << 30);
  EXPECT_EQ(j["numa_nodes"][0]["memory_tier"], 4);
  EXPECT_EQ(j["numa_nodes"][0]["zone"], "Normal");
  EXPECT_EQ(j["numa_nodes"][0]["hugepages"]["2m"]["free"], 8);
  EXPECT_EQ(j["numa_nodes"][0]["local_gpus"], (Json{0, 1}));
  EXPECT_EQ(j["gpus"][0]["nvlinks"], Json::array());
  EXPECT_EQ(j["gpus"][1]["nvlinks"][0]["remote_type"], "switch");
  EXPECT_TRUE(j["gpus"][1]["nvlinks"][1]["remote_pci_bus_id"].is_null());
  EXPECT_EQ(j["gpu_memory_preference"]["0"], (Json{0, 1}));
  EXPECT_EQ(j["memory_tiers"][0]["nodes"], (Json{0, 1}));
  EXPECT_EQ(j["warnings"][0], "something odd");
}

TEST(TopologyJson, StringFormParsesBackAndSurvivesBadUtf8) {
  Topology t = testing_gpu::TwoSockets();
  t.warnings.push_back("garbled \xff\xfe bytes");
  std::string s = TopologyToJsonString(t);
  ASSERT_FALSE(s.empty());
  EXPECT_EQ(s.back(), '\n');
  Json parsed = Json::parse(s);
  EXPECT_EQ(parsed["numa_nodes"].size(), 2u);
  EXPECT_EQ(parsed["warnings"].size(), 1u);
}

}  // namespace
}  // namespace cxlpool
