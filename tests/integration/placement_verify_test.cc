// The client's check after a long-term pin, end to end: the real cxlpoold on
// a two-node sysfs tree (--sysfs-root: its pools do not bind, so a lease
// accounted to node 1 really lies on this machine's node), and libcxlpool's
// C++ API. Lease::Verify() and a CUDA registration (the fake libcuda) ask
// move_pages where the pages are, tell the daemon they are not on node 1,
// and the daemon, after its own move_pages, accounts the lease to node 0's
// pool: pools, leases and the leases_moved counter say so.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "cxlpool/client.hpp"
#include "test_support.h"

namespace cxlpool {
namespace {

using testsupport::Daemon;
using testsupport::RawClient;
using testsupport::TempDir;

constexpr uint64_t kMiB = 1ull << 20;

void Write(const std::string& path, const std::string& text) {
  ASSERT_EQ(testsupport::RunShell("mkdir -p \"$(dirname '" + path + "')\"").first, 0);
  std::ofstream(path) << text;
}

class PlacementVerifyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testsupport::SkipWithoutDaemon();
    ASSERT_FALSE(tree_.path.empty());
    root_ = tree_.path + "/root";
    const std::string n = root_ + "/sys/devices/system/node";
    Write(n + "/online", "0-1\n");
    for (int id : {0, 1}) {
      const std::string d = n + "/node" + std::to_string(id);
      Write(d + "/cpulist", std::to_string(id) + "\n");
      Write(d + "/distance", id == 0 ? "10 20\n" : "20 10\n");
      Write(d + "/meminfo", "Node " + std::to_string(id) + " MemTotal:  262144 kB\nNode " +
                                std::to_string(id) + " MemFree:  262144 kB\n");
    }
    daemon_.set_log_to_file(true);
    Status st =
        daemon_.Start("[pools]\npin = false\nthp = false\n" + Extra(), {"--sysfs-root", root_});
    ASSERT_TRUE(st.ok()) << st.ToString() << "\n" << daemon_.Log();
  }
  // More of the daemon's config (after its [pools] table).
  virtual std::string Extra() const { return ""; }
  void TearDown() override {
    if (::testing::Test::HasFailure())
      std::fprintf(stderr, "daemon log:\n%s", daemon_.Log().c_str());
  }
  uint64_t Leased(const std::string& pool) {
    auto c = RawClient::Connect(daemon_.socket(), "verify-check");
    if (!c.ok()) return ~0ull;
    proto::PoolsReply reply;
    if (!c->Call(proto::PoolsRequest(), &reply).ok()) return ~0ull;
    for (const auto& p : reply.pools())
      if (p.name() == pool) return p.leased_bytes();
    return ~0ull;
  }
  uint64_t Counter(const std::string& name) {
    auto c = RawClient::Connect(daemon_.socket(), "verify-check");
    if (!c.ok()) return ~0ull;
    proto::StatsReply reply;
    if (!c->Call(proto::StatsRequest(), &reply).ok()) return ~0ull;
    auto it = reply.counters().find(name);
    return it == reply.counters().end() ? 0 : it->second;
  }
  // A strict, long-term pinned lease of `size` bytes on node 1.
  static ClientResult<Lease> PinnedOnNode1(Client& client, uint64_t size) {
    AllocOptions o;
    o.size_bytes = size;
    o.numa_node = 1;
    o.strict = true;
    o.long_term_pin = true;
    return client.Allocate(o);
  }
  // Why Verify()'s answer `p` cannot show a move on this machine (the test
  // is then skipped): move_pages unsupported, or the pages are on node 1.
  static std::optional<std::string> CannotShowAMove(const ClientResult<Placement>& p) {
    if (!p.ok() && p.status().code() == ErrorCode::kUnsupported) return p.status().ToString();
    if (p.ok() && p->numa_node == 1) return "this machine put the pages on node 1";
    return std::nullopt;
  }
  TempDir tree_{"verify"};
  std::string root_;
  Daemon daemon_;
};

TEST_F(PlacementVerifyTest, VerifyReportsTheTrueNodeAndTheAccountingFollows) {
  auto client = Client::Connect(daemon_.socket());
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  auto lease = PinnedOnNode1(*client, 4 * kMiB);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_EQ(lease->numa_node(), 1);
  EXPECT_TRUE(lease->info().long_term_pin);
  EXPECT_EQ(Leased("node1"), 4 * kMiB);

  auto p = lease->Verify();
  if (auto why = CannotShowAMove(p)) GTEST_SKIP() << *why;
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_TRUE(p->moved);
  EXPECT_EQ(p->placed_numa_node, 1);
  EXPECT_EQ(p->pages_sampled, 1024u);
  EXPECT_EQ(p->pages_on_node, 1024u);
  // The daemon checked and moved the accounting; the lease says so.
  EXPECT_EQ(lease->numa_node(), p->numa_node);
  EXPECT_EQ(lease->info().placed_numa_node, 1);
  EXPECT_EQ(lease->info().pool, "node" + std::to_string(p->numa_node));
  EXPECT_NE(lease->info().moved_reason.find("pages moved from node 1 to node"), std::string::npos)
      << lease->info().moved_reason;
  EXPECT_EQ(Leased("node1"), 0u);
  EXPECT_EQ(Leased("node" + std::to_string(p->numa_node)), 4 * kMiB);
  EXPECT_EQ(Counter("leases_moved"), 1u);
  // The operator's view.
  auto [rc, out] =
      testsupport::RunShell(std::string(std::getenv("CXLPOOL_BINARY_DIR")) +
                            "/tools/cxlpoolctl leases --all --json --socket " + daemon_.socket());
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("\"placed_numa_node\": 1"), std::string::npos) << out;
  // Verified again: where it is accounted now, nothing to report.
  auto again = lease->Verify();
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->moved);
  EXPECT_EQ(Counter("leases_moved"), 1u);
  ASSERT_TRUE(lease->Release().ok());
  EXPECT_TRUE(testsupport::PollUntil(
      [&] { return Leased("node" + std::to_string(p->numa_node)) == 0; }, 5000, 10));
}

TEST_F(PlacementVerifyTest, CudaRegistrationChecksOnItsOwn) {
  const char* cuda = std::getenv("CXLPOOL_CUDA_LIBRARY");
  if (cuda == nullptr || *cuda == '\0') GTEST_SKIP() << "no fake libcuda named";
  auto client = Client::Connect(daemon_.socket());
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  AllocOptions o;
  o.size_bytes = 2 * kMiB;
  o.numa_node = 1;
  o.strict = true;
  o.cuda_register = true;  // implies long_term_pin
  auto lease = client->Allocate(o);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  ASSERT_TRUE(lease->device_ptr().ok()) << lease->device_ptr().status().ToString();
  EXPECT_TRUE(lease->info().long_term_pin);
  if (lease->numa_node() == 1) GTEST_SKIP() << "this machine put the pages on node 1";
  // The registration's own check already told the daemon.
  EXPECT_EQ(lease->info().placed_numa_node, 1);
  EXPECT_EQ(Leased("node1"), 0u);
  EXPECT_EQ(Counter("leases_moved"), 1u);
}

// The operator's test of a node: cxlpoolctl alloc --long-term-pin runs the
// same check and says where the pages are and that the daemon was told.
TEST_F(PlacementVerifyTest, CtlAllocLongTermPinVerifies) {
  auto [rc, out] = testsupport::RunShell(
      std::string(std::getenv("CXLPOOL_BINARY_DIR")) +
      "/tools/cxlpoolctl alloc --size 4M --node 1 --strict --long-term-pin --json --socket " +
      daemon_.socket());
  ASSERT_EQ(rc, 0) << out;
  auto j = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(j.is_object()) << out;
  EXPECT_EQ(j["long_term_pin"], true) << out;
  ASSERT_TRUE(j["verify"].is_object()) << out;
  if (j["verify"].contains("error")) GTEST_SKIP() << j["verify"]["error"];
  if (j["verify"]["numa_node"] == 1) GTEST_SKIP() << "this machine put the pages on node 1";
  EXPECT_EQ(j["verify"]["moved"], true) << out;
  EXPECT_EQ(j["verify"]["placed_numa_node"], 1) << out;
  EXPECT_EQ(j["verify"]["pages_on_node"], j["verify"]["pages_sampled"]) << out;
  EXPECT_EQ(Counter("leases_moved"), 1u);
  EXPECT_TRUE(testsupport::PollUntil([&] { return Leased("node1") == 0; }, 5000, 10));
}

// The same check over a lease of four extents (daemon.max_extent = 2M): the
// client's census covers its one range, the daemon's own census every
// extent's mapping, each page of each.
class PlacementVerifyExtentsTest : public PlacementVerifyTest {
 protected:
  std::string Extra() const override { return "[daemon]\nmax_extent = \"2M\"\n"; }
};

TEST_F(PlacementVerifyExtentsTest, EveryExtentIsAskedAndTheAccountingFollows) {
  auto client = Client::Connect(daemon_.socket());
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  auto lease = PinnedOnNode1(*client, 6 * kMiB + 4096);  // 2M + 2M + 2M + 4K
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_EQ(Leased("node1"), 6 * kMiB + 4096);
  auto p = lease->Verify();
  if (auto why = CannotShowAMove(p)) GTEST_SKIP() << *why;
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_TRUE(p->moved);
  EXPECT_EQ(p->pages_sampled, 1537u);  // every page of the range
  EXPECT_EQ(p->pages_on_node, 1537u);
  // The daemon asked move_pages about every page of every extent.
  const std::string seen = "node " + std::to_string(p->numa_node) + ": 1537 of 1537 pages";
  EXPECT_NE(lease->info().moved_reason.find(seen), std::string::npos) << lease->info().moved_reason;
  EXPECT_EQ(Leased("node1"), 0u);
  EXPECT_EQ(Leased("node" + std::to_string(p->numa_node)), 6 * kMiB + 4096);
  EXPECT_EQ(Counter("leases_moved"), 1u);
  ASSERT_TRUE(lease->Release().ok());
  EXPECT_TRUE(testsupport::PollUntil(
      [&] { return Leased("node" + std::to_string(p->numa_node)) == 0; }, 5000, 10));
}

}  // namespace
}  // namespace cxlpool
