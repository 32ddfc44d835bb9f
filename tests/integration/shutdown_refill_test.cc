// SIGTERM in the middle of a large reserve refill (issue 37, item 9): a
// real cxlpoold on a sysfs tree of three nodes, each pool with a 2 GiB
// reserve (6 GiB of refills, a 1 GiB extent in each, on the two SCHED_IDLE
// stock threads), holding a client's lease, is sent SIGTERM while the refill
// is under way (POOLS shows extents built and more being built). It must exit within 2 s, not after
// the refill, and hand its lease over: the next daemon lists it from the journal and takes the
// client's fd back (RECLAIM), whose mapping kept its data.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <csignal>
#include <fstream>
#include <string>

#include "kill_loop.h"
#include "test_support.h"

namespace cxlpool {
namespace {

using testsupport::Daemon;
using testsupport::kMiB;
using testsupport::PollUntil;
using testsupport::RawClient;
using testsupport::TempDir;

constexpr int kNodes = 3;

void Write(const std::string& path, const std::string& text) {
  ASSERT_EQ(testsupport::RunShell("mkdir -p \"$(dirname '" + path + "')\"").first, 0);
  std::ofstream(path) << text;
}

// The daemon's config: a reserve of `reserve` per pool ("0": none).
std::string Config(const std::string& reserve) {
  return "[daemon]\nsocket_mode = \"0666\"\nstock_workers = 2\n"
         "[pools]\npin = false\nthp = false\nreserve_low = \"" +
         reserve + "\"\nreserve_high = \"" + reserve + "\"\n";
}

// True when some reserve extents are ready and at least `building` bytes
// are still being built, summed over the pools.
bool RefillUnderWay(const std::string& socket, uint64_t building) {
  auto c = RawClient::Connect(socket, "shutdown-probe");
  if (!c.ok()) return false;
  proto::PoolsReply reply;
  if (!c->Call(proto::PoolsRequest(), &reply).ok()) return false;
  uint64_t ready = 0, being_built = 0;
  for (const auto& p : reply.pools()) {
    ready += p.reserve().ready_bytes();
    being_built += p.reserve().building_bytes();
  }
  return ready > 0 && being_built >= building;
}

class ShutdownRefillTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testsupport::SkipWithoutDaemon();
    ASSERT_FALSE(tree_.path.empty());
    ASSERT_FALSE(state_.path.empty());
    root_ = tree_.path + "/root";
    const std::string n = root_ + "/sys/devices/system/node";
    Write(n + "/online", "0-" + std::to_string(kNodes - 1) + "\n");
    for (int id = 0; id < kNodes; ++id) {
      const std::string d = n + "/node" + std::to_string(id);
      Write(d + "/cpulist", std::to_string(id) + "\n");
      Write(d + "/meminfo", "Node " + std::to_string(id) + " MemTotal:  4194304 kB\nNode " +
                                std::to_string(id) + " MemFree:  4194304 kB\n");
    }
    daemon_.set_log_to_file(true);
  }
  void TearDown() override {
    if (::testing::Test::HasFailure())
      std::fprintf(stderr, "daemon log:\n%s", daemon_.Log().c_str());
  }
  TempDir tree_{"shutdown-tree"};
  TempDir state_{"shutdown-state"};
  std::string root_;
  Daemon daemon_;
};

TEST_F(ShutdownRefillTest, SigtermDuringALargeRefillExitsWithin2sAndHandsLeasesOver) {
  ASSERT_TRUE(daemon_
                  .Start(Config("2G"), {"--sysfs-root", root_, "--state-dir", state_.path,
                                        "--grace-period", "60s"})
                  .ok())
      << daemon_.Log();

  // A client's lease, with data in it.
  auto client = RawClient::Connect(daemon_.socket(), "shutdown-holder");
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  UniqueFd fd;
  auto lease = client->Alloc(kMiB, &fd);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  void* map = ::mmap(nullptr, kMiB, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  ASSERT_NE(map, MAP_FAILED);
  testsupport::Fill(map, kMiB, 0x9A);

  // The refill is under way: the first extents are ready, most of the
  // 6 GiB is still being built.
  ASSERT_TRUE(PollUntil([&] { return RefillUnderWay(daemon_.socket(), 4096 * kMiB); }, 30000))
      << "no large refill to interrupt";
  ASSERT_EQ(::kill(daemon_.pid(), SIGTERM), 0);
  const uint64_t t0 = testsupport::NowMicros();
  const bool exited = PollUntil([&] { return !daemon_.Alive(); }, 2000);
  const uint64_t took_ms = (testsupport::NowMicros() - t0) / 1000;
  EXPECT_TRUE(exited) << "cxlpoold still alive 2 s after SIGTERM (it waited for the refill)";
  if (!exited) {
    ASSERT_TRUE(PollUntil([&] { return !daemon_.Alive(); }, 120000));
  }
  std::fprintf(stderr, "exited %llu ms after SIGTERM\n", static_cast<unsigned long long>(took_ms));
  EXPECT_NE(daemon_.Log().find("handing 1 leases over"), std::string::npos);

  // The next daemon (no reserve this time) has the lease from its journal
  // and takes the client's fd back.
  ASSERT_TRUE(daemon_.WriteConfig(Config("0")).ok());
  ASSERT_TRUE(daemon_.Restart().ok()) << daemon_.Log();
  auto again = RawClient::Connect(daemon_.socket(), "shutdown-holder");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(again->hello().in_grace_period());
  proto::ReclaimRequest rr;
  *rr.add_leases() = *lease;
  proto::ReclaimReply rep;
  ASSERT_TRUE(again->Call(rr, &rep, nullptr, {fd.get()}).ok());
  ASSERT_EQ(rep.accepted_size(), 1)
      << (rep.rejected_reasons_size() > 0 ? rep.rejected_reasons(0) : std::string("?"));
  EXPECT_EQ(rep.accepted(0), lease->id());
  auto admin = RawClient::Connect(daemon_.socket(), "shutdown-checker");
  ASSERT_TRUE(admin.ok());
  auto acct = testsupport::ReadAccounting(*admin);
  ASSERT_TRUE(acct.ok()) << acct.status().ToString();
  ASSERT_EQ(acct->leases.count(lease->id()), 1u);
  EXPECT_EQ(acct->leases.at(lease->id()).size_bytes(), kMiB);
  EXPECT_TRUE(testsupport::Intact(map, kMiB, 0x9A)) << "the lease's memory did not survive";
  ::munmap(map, kMiB);
}

}  // namespace
}  // namespace cxlpool
