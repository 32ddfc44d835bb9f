// ComputeGpuMemoryPreference: SLIT distance first, then HMAT bandwidth
// (higher first) and latency (lower first) from the GPU's node, then node id;
// GPU memory nodes and memory-less nodes are never candidates.
#include <gtest/gtest.h>

#include "cxlpool/topology/discover.h"
#include "gpu_test_util.h"

namespace cxlpool {
namespace {

using testing_gpu::MakeNode;

AccessClass Access(int cls, std::vector<int> initiators, std::optional<uint64_t> bw,
                   std::optional<uint64_t> lat) {
  AccessClass a;
  a.access_class = cls;
  a.initiators = std::move(initiators);
  a.read_bandwidth_mbps = bw;
  a.read_latency_ns = lat;
  return a;
}

Gpu GpuOn(int index, std::optional<int> node) {
  Gpu g;
  g.index = index;
  g.numa_node = node;
  return g;
}

// Node 0 (CPUs) plus CPU-less nodes 1..4 all at the same SLIT distance 20.
Topology EqualDistances() {
  Topology t;
  std::map<int, int> row = {{0, 10}, {1, 20}, {2, 20}, {3, 20}, {4, 20}};
  t.numa_nodes.push_back(MakeNode(0, {0, 1}, 1ull << 30, row, NodeKind::kDram));
  for (int id = 1; id <= 4; ++id)
    t.numa_nodes.push_back(MakeNode(id, {}, 1ull << 30, {{0, 20}, {id, 10}}, NodeKind::kCxl));
  t.gpus.push_back(GpuOn(0, 0));
  return t;
}

TEST(Preference, SlitDistanceComesFirst) {
  Topology t = testing_gpu::TwoSockets();
  t.numa_nodes.push_back(
      MakeNode(2, {}, 256ull << 30, {{0, 14}, {1, 26}, {2, 10}}, NodeKind::kCxl));
  t.numa_nodes[0].distances[2] = 14;
  t.numa_nodes[1].distances[2] = 26;
  t.gpus = {GpuOn(0, 0), GpuOn(1, 1)};
  ComputeGpuMemoryPreference(&t);
  EXPECT_EQ(t.gpu_memory_preference.at(0), (std::vector<int>{0, 2, 1}));
  EXPECT_EQ(t.gpu_memory_preference.at(1), (std::vector<int>{1, 0, 2}));
}

TEST(Preference, HmatBandwidthThenLatencyBreakTies) {
  Topology t = EqualDistances();
  t.numa_nodes[1].access = {Access(0, {0}, 20000, 300)};
  t.numa_nodes[2].access = {Access(0, {0}, 40000, 400)};  // fastest
  t.numa_nodes[3].access = {Access(0, {0}, 20000, 250)};  // same bw as 1, lower latency
  // Node 4: no HMAT figures at all: unknown sorts after known.
  ComputeGpuMemoryPreference(&t);
  EXPECT_EQ(t.gpu_memory_preference.at(0), (std::vector<int>{0, 2, 3, 1, 4}));
}

TEST(Preference, HmatFromOtherInitiatorsIsIgnored) {
  Topology t = EqualDistances();
  // Figures for initiator 5 say nothing about a GPU on node 0.
  t.numa_nodes[1].access = {Access(0, {5}, 90000, 100)};
  t.numa_nodes[2].access = {Access(1, {0}, 1000, 900)};  // access1 lists node 0
  ComputeGpuMemoryPreference(&t);
  EXPECT_EQ(t.gpu_memory_preference.at(0), (std::vector<int>{0, 2, 1, 3, 4}));
}

TEST(Preference, Access0BeatsAccess1ForTheSameInitiator) {
  Topology t = EqualDistances();
  t.numa_nodes[1].access = {Access(1, {0}, 90000, 100), Access(0, {0}, 1000, 900)};
  t.numa_nodes[2].access = {Access(0, {0}, 2000, 900)};
  ComputeGpuMemoryPreference(&t);
  EXPECT_EQ(t.gpu_memory_preference.at(0), (std::vector<int>{0, 2, 1, 3, 4}));
}

TEST(Preference, WriteFiguresStandInForMissingReadFigures) {
  Topology t = EqualDistances();
  AccessClass a = Access(0, {0}, std::nullopt, std::nullopt);
  a.write_bandwidth_mbps = 50000;
  t.numa_nodes[3].access = {a};
  t.numa_nodes[1].access = {Access(0, {0}, 10000, std::nullopt)};
  ComputeGpuMemoryPreference(&t);
  EXPECT_EQ(t.gpu_memory_preference.at(0), (std::vector<int>{0, 3, 1, 2, 4}));
}

TEST(Preference, ExcludesGpuMemoryAndEmptyNodes) {
  Topology t = EqualDistances();
  t.numa_nodes[1].kind = NodeKind::kGpu;        // some GPU's HBM (marked by kind)
  t.numa_nodes[2].memory_bytes = 0;             // memory-less
  t.numa_nodes[3].memory_bytes = std::nullopt;  // unknown size: not offered
  Gpu other = GpuOn(1, 0);
  other.memory_node = 4;  // another GPU's memory node (by memory_node)
  t.gpus.push_back(other);
  ComputeGpuMemoryPreference(&t);
  EXPECT_EQ(t.gpu_memory_preference.at(0), (std::vector<int>{0}));
  EXPECT_EQ(t.gpu_memory_preference.at(1), (std::vector<int>{0}));
}

TEST(Preference, UnknownGpuNodeFallsBackToNodeIdOrder) {
  Topology t = testing_gpu::TwoSockets();
  t.gpus = {GpuOn(0, std::nullopt), GpuOn(1, 7)};  // 7 is not in the topology
  ComputeGpuMemoryPreference(&t);
  EXPECT_EQ(t.gpu_memory_preference.at(0), (std::vector<int>{0, 1}));
  EXPECT_EQ(t.gpu_memory_preference.at(1), (std::vector<int>{0, 1}));
}

TEST(Preference, MissingDistanceSortsLast) {
  Topology t = testing_gpu::TwoSockets();
  t.numa_nodes.push_back(MakeNode(2, {}, 1ull << 30, {}, NodeKind::kCxl));
  t.numa_nodes.push_back(MakeNode(3, {}, 1ull << 30, {}, NodeKind::kCxl));
  t.numa_nodes[1].distances[3] = 30;  // node 2 has no distance from node 1
  t.gpus = {GpuOn(0, 1)};
  ComputeGpuMemoryPreference(&t);
  EXPECT_EQ(t.gpu_memory_preference.at(0), (std::vector<int>{1, 0, 3, 2}));
}

TEST(Preference, NoGpusNoEntries) {
  Topology t = testing_gpu::TwoSockets();
  t.gpu_memory_preference[3] = {1};  // stale entries are cleared
  ComputeGpuMemoryPreference(&t);
  EXPECT_TRUE(t.gpu_memory_preference.empty());
}

}  // namespace
}  // namespace cxlpool
