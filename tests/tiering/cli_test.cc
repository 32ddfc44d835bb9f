// The real cxlpoold (pid tracked, temp socket) with tiering on, a libcxlpool
// client that copies and hints, and `cxlpoolctl tiering` reading it back: the
// lease's temperature and reason, the kernel's access-sampling line, --pin,
// and a hint outside the lease refused on the wire. This machine's pools may
// all be DRAM: then nothing moves, and the reason says so.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cxlpool/client.hpp"
#include "test_support.h"

namespace cxlpool {
namespace {

using testsupport::CtlBinary;
using testsupport::PollUntil;
using testsupport::RunShell;

constexpr uint64_t kMiB = 1ull << 20;

nlohmann::json Tiering(const std::string& socket, const std::string& extra = "") {
  auto [rc, out] = RunShell(CtlBinary() + " tiering --json --all --socket " + socket + " " + extra);
  EXPECT_EQ(rc, 0) << out;
  return nlohmann::json::parse(out, nullptr, false);
}

TEST(TieringCliTest, TheDaemonShowsTemperaturesReasonsAndPins) {
  testsupport::SkipWithoutDaemon();
  testsupport::Daemon d;
  Status st = d.Start(R"(
[daemon]
socket_mode = "0666"
log_level = "info"
[pools]
capacity = "64M"
pin = false
[tiering]
interval = "50ms"
)");
  ASSERT_TRUE(st.ok()) << st.ToString();
  auto client = Client::Connect(d.socket());
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  AllocOptions ao;
  ao.size_bytes = 4 * kMiB;
  ao.label = "kv-blocks";
  auto lease = client->Allocate(ao);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  std::vector<char> buf(4 * kMiB, 'x');
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(lease->CopyIn(0, buf.data(), buf.size()).ok());
  ASSERT_TRUE(lease->CopyOut(0, buf.data(), kMiB).ok());
  ASSERT_TRUE(lease->Hint(0, kMiB, TierHint::kHot).ok());
  ASSERT_TRUE(client->FlushSignals().ok());
  // The temperature is computed when asked, the verdict at the engine's last
  // round: wait for a round that saw the signals (a verdict of "cold (0)"
  // comes from one before them).
  nlohmann::json j;
  ASSERT_TRUE(PollUntil(
      [&] {
        j = Tiering(d.socket());
        return j.is_object() && j["leases"].size() == 1 &&
               j["leases"][0]["units"][0]["verdict"].get<std::string>().rfind("hot", 0) == 0;
      },
      10000, 50))
      << j.dump(2);
  EXPECT_TRUE(j["enabled"].get<bool>());
  EXPECT_NE(j["kernel"].get<std::string>().find("DAMON"), std::string::npos) << j.dump(2);
  const auto& u = j["leases"][0]["units"][0];
  EXPECT_EQ(j["leases"][0]["lease_id"].get<uint64_t>(), lease->id());
  EXPECT_EQ(j["leases"][0]["label"], "kv-blocks");
  EXPECT_EQ(u["bytes_written"].get<uint64_t>(), 12 * kMiB);
  EXPECT_EQ(u["bytes_read"].get<uint64_t>(), kMiB);
  EXPECT_EQ(u["hints"].get<uint64_t>(), 1u);
  EXPECT_GT(u["temperature"].get<double>(), 2.0);
  std::printf("verdict: %s\n", u["verdict"].get<std::string>().c_str());
  // The human view names the lease and says why it stays or moves.
  auto [rc, text] = RunShell(CtlBinary() + " tiering --all --socket " + d.socket());
  EXPECT_EQ(rc, 0);
  EXPECT_NE(text.find("migrations (last 20)"), std::string::npos) << text;
  EXPECT_NE(text.find(u["verdict"].get<std::string>().substr(0, 20)), std::string::npos) << text;
  // An admin pins it to its tier.
  auto [prc, pout] = RunShell(CtlBinary() + " tiering --pin " + std::to_string(lease->id()) +
                              " --socket " + d.socket());
  EXPECT_EQ(prc, 0) << pout;
  j = Tiering(d.socket());
  EXPECT_TRUE(j["leases"][0]["pinned_tier"].get<bool>());
  ASSERT_TRUE(PollUntil(
      [&] {
        j = Tiering(d.socket());
        return j["leases"][0]["units"][0]["verdict"] == "opted out: pinned to its tier";
      },
      5000, 50));
  // No such lease: exit 1 with the daemon's word.
  auto [nrc, nout] =
      RunShell(CtlBinary() + " tiering --pin 999999 --socket " + d.socket() + " 2>&1");
  EXPECT_EQ(nrc, 1) << nout;
  EXPECT_NE(nout.find("lease 999999 is not one this caller may change"), std::string::npos) << nout;
  // A hint outside the lease never leaves the library.
  EXPECT_EQ(lease->Hint(4 * kMiB, 1, TierHint::kCold).code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(lease->Release().ok());
  *client = Client();  // before the daemon goes: no reconnect attempts
  EXPECT_TRUE(d.Stop().ok());
}

}  // namespace
}  // namespace cxlpool
