// The real cxlpoold on every fixture tree (--sysfs-root <tree>/root): the
// pools it builds are exactly the nodes expected.json says are pooled by
// default (not_pooled_reason null, memory > 0). GPU memory nodes (found by
// NVML or by the driver's procfs alone) and CPU-less memory of unknown kind
// get no pool, and the daemon's log says which nodes it left out and how to
// include them. A fixture with an nvml-board runs with the fake NVML. A tree
// where no node's memory size is known makes the daemon refuse to start.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "test_support.h"

namespace cxlpool {
namespace {

namespace fs = std::filesystem;
using testsupport::Daemon;
using testsupport::RawClient;

std::string Slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> Fixtures() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(FIXTURES_DIR, ec)) {
    if (fs::is_directory(e.path() / "root") && fs::exists(e.path() / "expected.json")) {
      names.push_back(e.path().filename().string());
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Sets (or clears) one environment variable for a scope; the daemon child
// inherits it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string* value) : name_(name) {
    if (const char* old = ::getenv(name)) old_ = old, had_ = true;
    if (value != nullptr) {
      ::setenv(name, value->c_str(), 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      ::setenv(name_, old_.c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

class DaemonPools : public ::testing::TestWithParam<std::string> {};

TEST_P(DaemonPools, PoolsExactlyTheNodesTheTopologyPoolsByDefault) {
  testsupport::SkipWithoutDaemon();
  const fs::path dir = fs::path(FIXTURES_DIR) / GetParam();
  const auto expected = nlohmann::json::parse(Slurp(dir / "expected.json"));
  std::string lib, board;
  if (fs::exists(dir / "nvml-board")) {
    std::string name = Slurp(dir / "nvml-board");
    while (!name.empty() && std::isspace(static_cast<unsigned char>(name.back()))) name.pop_back();
    lib = FAKE_NVML_LIB;
    board = std::string(FAKE_NVML_BOARDS) + "/" + name + ".json";
  }
  ScopedEnv e1("CXLPOOL_NVML_LIBRARY", lib.empty() ? nullptr : &lib);
  ScopedEnv e2("CXLPOOL_FAKE_NVML_BOARD", board.empty() ? nullptr : &board);
  ScopedEnv e3("CXLPOOL_FSROOT", nullptr);

  Daemon d;
  d.set_log_to_file(true);
  Status st =
      d.Start("[pools]\npin = false\nthp = false\n", {"--sysfs-root", (dir / "root").string()});
  const bool any_size = std::any_of(expected["numa_nodes"].begin(), expected["numa_nodes"].end(),
                                    [](const auto& n) { return n["memory_bytes"].is_number(); });
  if (!any_size) {
    // No memory size anywhere (hwloc's PS3 capture has no meminfo): the
    // daemon refuses to start, and says why, rather than serve nothing.
    EXPECT_FALSE(st.ok()) << GetParam() << ": started with no memory size known\n" << d.Log();
    EXPECT_NE(d.Log().find("no NUMA node has a known memory size"), std::string::npos) << d.Log();
    return;
  }
  ASSERT_TRUE(st.ok()) << st.ToString() << "\n" << d.Log();
  auto c = RawClient::Connect(d.socket(), "golden-pools");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  proto::PoolsReply reply;
  ASSERT_TRUE(c->Call(proto::PoolsRequest(), &reply).ok());
  std::set<int> pooled;
  for (const auto& p : reply.pools()) {
    if (p.backing() == "memfd") pooled.insert(p.numa_node());
  }
  const std::string log = d.Log();
  for (const auto& n : expected["numa_nodes"]) {
    const int id = n["id"].get<int>();
    const bool memory = n["memory_bytes"].is_number() && n["memory_bytes"].get<uint64_t>() > 0;
    const bool by_default = n["not_pooled_reason"].is_null();
    if (memory && by_default) {
      EXPECT_TRUE(pooled.count(id)) << GetParam() << ": node " << id << " has no pool\n" << log;
    } else {
      EXPECT_FALSE(pooled.count(id)) << GetParam() << ": node " << id << " (kind " << n["kind"]
                                     << ", " << n["not_pooled_reason"] << ") was pooled";
    }
    if (memory && !by_default) {
      EXPECT_NE(log.find("node " + std::to_string(id) +
                         " not pooled: " + n["not_pooled_reason"].get<std::string>()),
                std::string::npos)
          << GetParam() << ": the log does not say node " << id << " was left out\n"
          << log;
    }
  }
  EXPECT_TRUE(d.Stop().ok()) << d.Log();
}

// The config can include memory of unknown kind, node by node.
TEST(DaemonPoolsConfig, UnknownNodeIsPooledWhenItsTableEnablesIt) {
  testsupport::SkipWithoutDaemon();
  const fs::path root = fs::path(FIXTURES_DIR) / "unknown-backing" / "root";
  ASSERT_TRUE(fs::exists(root));
  ScopedEnv e1("CXLPOOL_NVML_LIBRARY", nullptr);
  Daemon d;
  d.set_log_to_file(true);
  Status st = d.Start("[pools]\npin = false\nthp = false\n[pools.node.1]\nenabled = true\n",
                      {"--sysfs-root", root.string()});
  ASSERT_TRUE(st.ok()) << st.ToString() << "\n" << d.Log();
  auto c = RawClient::Connect(d.socket(), "golden-pools");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  proto::PoolsReply reply;
  ASSERT_TRUE(c->Call(proto::PoolsRequest(), &reply).ok());
  bool node1 = false;
  for (const auto& p : reply.pools()) {
    node1 = node1 || (p.numa_node() == 1 && p.kind() == "unknown");
    if (p.numa_node() == 2) {
      EXPECT_EQ(p.long_term_pins(), "partly");  // 2 blocks Normal, 6 Movable
      EXPECT_EQ(p.kernel_zone_bytes(), 4ull << 30);
      EXPECT_EQ(p.movable_bytes(), 12ull << 30);
    }
  }
  EXPECT_TRUE(node1) << d.Log();
  EXPECT_NE(d.Log().find("node 1 (kind unknown) pooled: [pools.node.1] enabled = true"),
            std::string::npos)
      << d.Log();
  EXPECT_TRUE(d.Stop().ok());
}

// A kernel without NUMA in sysfs (hwloc's 2i386-2c-nohugepage capture: no
// /sys/devices/system/node, no cpu/online): one DRAM pool on node 0 with all
// of /proc/meminfo, not "no pools".
TEST(DaemonPoolsNoNuma, OneDramPoolOnNodeZero) {
  testsupport::SkipWithoutDaemon();
  const fs::path root = fs::path(FIXTURES_DIR) / "hwloc-2i386-2c-nohugepage" / "root";
  ASSERT_TRUE(fs::exists(root / "proc" / "meminfo"));
  ASSERT_FALSE(fs::exists(root / "sys" / "devices" / "system" / "node"));
  ScopedEnv e1("CXLPOOL_NVML_LIBRARY", nullptr);
  ScopedEnv e2("CXLPOOL_FSROOT", nullptr);
  Daemon d;
  d.set_log_to_file(true);
  Status st = d.Start("[pools]\npin = false\nthp = false\ncapacity = \"100%\"\n",
                      {"--sysfs-root", root.string()});
  ASSERT_TRUE(st.ok()) << st.ToString() << "\n" << d.Log();
  auto c = RawClient::Connect(d.socket(), "golden-pools");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  proto::PoolsReply reply;
  ASSERT_TRUE(c->Call(proto::PoolsRequest(), &reply).ok());
  ASSERT_EQ(reply.pools_size(), 1) << d.Log();
  EXPECT_EQ(reply.pools(0).numa_node(), 0);
  EXPECT_EQ(reply.pools(0).kind(), "dram");
  EXPECT_EQ(reply.pools(0).backing(), "memfd");
  EXPECT_EQ(reply.pools(0).capacity_bytes(), 2075428ull * 1024);  // MemTotal, 100%
  EXPECT_EQ(d.Log().find("no pools"), std::string::npos) << d.Log();
  EXPECT_TRUE(d.Stop().ok()) << d.Log();
}

// An ALLOC naming a node that exists but has no pool says so, why, and the
// key that pools it; a node that does not exist is still NOT_FOUND.
TEST(DaemonPoolsConfig, AllocOnAnUnpooledNodeSaysWhyAndWhichKey) {
  testsupport::SkipWithoutDaemon();
  const fs::path root = fs::path(FIXTURES_DIR) / "unknown-backing" / "root";
  ASSERT_TRUE(fs::exists(root));
  ScopedEnv e1("CXLPOOL_NVML_LIBRARY", nullptr);
  ScopedEnv e2("CXLPOOL_FSROOT", nullptr);
  Daemon d;
  d.set_log_to_file(true);
  Status st = d.Start("[pools]\npin = false\nthp = false\n[pools.node.2]\nenabled = false\n",
                      {"--sysfs-root", root.string()});
  ASSERT_TRUE(st.ok()) << st.ToString() << "\n" << d.Log();
  auto c = RawClient::Connect(d.socket(), "golden-pools");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto alloc_on = [&](int node) {
    proto::AllocRequest req;
    req.set_size_bytes(1 << 20);
    req.set_numa_node(node);
    proto::AllocReply reply;
    std::vector<UniqueFd> fds;
    return c->Call(req, &reply, &fds);
  };
  Status unknown = alloc_on(1);  // CPU-less memory of unknown kind
  EXPECT_EQ(unknown.code(), Code::kUnsupported) << unknown.ToString();
  for (const char* part : {"NUMA node 1 (kind unknown) is not pooled", "of unknown kind",
                           "[pools.node.1] enabled = true"}) {
    EXPECT_NE(unknown.message().find(part), std::string::npos) << part << "\n"
                                                               << unknown.ToString();
  }
  Status off = alloc_on(2);  // CXL, turned off by the config
  EXPECT_EQ(off.code(), Code::kUnsupported) << off.ToString();
  EXPECT_NE(off.message().find("NUMA node 2 (kind cxl) is not pooled: excluded by config "
                               "([pools.node.2] enabled = false); set enabled = true"),
            std::string::npos)
      << off.ToString();
  Status none = alloc_on(7);
  EXPECT_EQ(none.code(), Code::kNotFound) << none.ToString();
  EXPECT_NE(none.message().find("no NUMA node 7 (nodes: 0, 1, 2;"), std::string::npos)
      << none.ToString();
  EXPECT_EQ(none.message().find("not pooled"), std::string::npos) << none.ToString();
  EXPECT_TRUE(d.Stop().ok()) << d.Log();
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DaemonPools, ::testing::ValuesIn(Fixtures()),
                         [](const auto& param_info) {
                           std::string n = param_info.param;
                           for (auto& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(DaemonPools);

}  // namespace
}  // namespace cxlpool
