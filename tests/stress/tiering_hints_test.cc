// Tiering hints from one tenant must not slow the others (issue 37, item 2).
// A real cxlpoold; three tenants, each its own uid:
//   * a holder with 3,000 leases of 64 KiB (what a full scan of every
//     tenant's leases would walk);
//   * a hinter that owns one lease and sends will_need / dont_need hints on
//     it as fast as the daemon answers, 64 to a frame;
//   * a victim that allocates and releases 64 KiB on one connection and
//     reports the median time of an alloc+release pair.
// The victim's median during the flood stays within 2x of its median
// without it (measured before and after, with the 3,000 leases held: the
// quiet baseline of the same run). A noisy machine can spoil one
// measurement: up to 3 tries, a real regression (a full round per hint on
// the event loop: 20-40x) misses every time. The hinter is told, past
// tiering.max_urgent_hints_per_uid a second, that its hints were not taken,
// and waits for those answers.
// Needs root (other uids); exits 77 otherwise.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <sstream>
#include <thread>
#include <vector>

#include "cxlpool/proto/ipc.h"
#include "tenant_process.h"
#include "test_support.h"

namespace cxlpool::testsupport {
namespace {

constexpr uid_t kHolder = 4301, kHinter = 4302, kVictim = 4303;
constexpr int kHeldLeases = 3000;

std::string Config() {
  return "[daemon]\nsocket_mode = \"0666\"\nlog_level = \"error\"\n"
         "[pools]\ncapacity = \"512M\"\n"
         "[tiering]\nenabled = true\n";
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// On "m <ms>": alloc+release pairs on one connection for <ms>; answers
// "<pairs> <failed> <median microseconds> <first error>".
int VictimBody(const std::string& socket, Channel& ch) {
  auto c = RawClient::Connect(socket, "victim", 5000);
  if (!c.ok()) return 2;
  for (;;) {
    std::string cmd = ch.Hear();
    if (cmd.rfind("m ", 0) != 0) return 0;
    const uint64_t end = NowMicros() + std::stoull(cmd.substr(2)) * 1000;
    std::vector<double> took;
    uint64_t failed = 0;
    std::string error;
    while (NowMicros() < end) {
      const uint64_t t0 = NowMicros();
      UniqueFd fd;
      auto l = c->Alloc(64 * kKiB, &fd);
      Status st = l.ok() ? c->Release(l->id()) : l.status();
      if (st.ok()) {
        took.push_back(static_cast<double>(NowMicros() - t0));
      } else {
        ++failed;
        if (error.empty()) error = st.ToString();
      }
    }
    for (char& x : error) x = x == '\n' ? ' ' : x;
    ch.Tell(std::to_string(took.size()) + " " + std::to_string(failed) + " " +
            std::to_string(Median(took)) + " " + error);
  }
}

// Holds kHeldLeases leases until told to finish.
int HolderBody(const std::string& socket, Channel& ch) {
  auto c = RawClient::Connect(socket, "holder", 10000);
  if (!c.ok()) return 2;
  int held = 0;
  std::string error;
  for (; held < kHeldLeases; ++held) {
    UniqueFd fd;  // closed at once: the connection holds the lease
    auto l = c->Alloc(64 * kKiB, &fd);
    if (!l.ok()) {
      error = l.status().ToString();
      break;
    }
  }
  ch.Tell("ready " + std::to_string(held) + " " + error);
  ch.Hear();
  return 0;
}

// Owns one lease and sends urgent hints on it, 64 to a frame, as fast as
// the daemon answers, until told to finish; answers
// "<frames> <taken> <refused> <first refusal>".
int HinterBody(const std::string& socket, Channel& ch) {
  auto c = RawClient::Connect(socket, "hinter", 10000);
  if (!c.ok()) return 2;
  UniqueFd fd;
  auto l = c->Alloc(2 * kMiB, &fd);
  if (!l.ok()) return 3;
  std::atomic<bool> stop{false};
  uint64_t frames = 0, taken = 0, refused = 0;
  std::string first;
  std::thread flood([&] {
    proto::TieringSignalsRequest req;
    for (int i = 0; i < 64; ++i) {
      proto::RangeSignal* s = req.add_signals();
      s->set_lease_id(l->id());
      s->set_offset(0);
      s->set_length(2 * kMiB);
      s->set_hint(i % 2 ? proto::HINT_DONT_NEED : proto::HINT_WILL_NEED);
    }
    while (!stop.load()) {
      proto::TieringSignalsReply rep;
      Status st = c->Call(req, &rep);
      if (!st.ok()) {
        if (first.empty()) first = st.ToString();
        break;
      }
      ++frames;
      taken += rep.accepted();
      refused += static_cast<uint64_t>(rep.rejected_size());
      if (first.empty() && rep.rejected_size() > 0) first = rep.rejected(0).message();
    }
  });
  ch.Tell("ready");
  ch.Hear();
  stop.store(true);
  flood.join();
  for (char& x : first) x = x == '\n' ? ' ' : x;
  ch.Tell(std::to_string(frames) + " " + std::to_string(taken) + " " + std::to_string(refused) +
          " " + first);
  return 0;
}

struct Window {
  uint64_t pairs = 0, failed = 0;
  double median_us = 0;
  std::string error;
};

// `n` windows of `ms`; the median of their medians.
double MeasureMedian(Tenant& victim, int n, int ms, uint64_t* failed, std::string* error) {
  std::vector<double> medians;
  for (int i = 0; i < n; ++i) {
    victim.channel().Say("m " + std::to_string(ms));
    std::istringstream in(victim.channel().Listen());
    Window w;
    in >> w.pairs >> w.failed >> w.median_us;
    std::getline(in, w.error);
    if (w.pairs > 0) medians.push_back(w.median_us);
    *failed += w.failed;
    if (error->empty() && w.failed > 0) *error = w.error;
  }
  return Median(medians);
}

TEST(TieringHintsStress, AHintFloodBesideThousandsOfLeasesKeepsAnotherTenantsMedian) {
  SkipWithoutDaemon();
  if (!IsRoot()) Skip("needs root: the tenants run as other uids");
  Daemon daemon;
  ASSERT_TRUE(daemon.Start(Config()).ok());
  const std::string socket = daemon.socket();
  Tenant victim(kVictim, [socket](Channel& ch) { return VictimBody(socket, ch); });
  Tenant holder(kHolder, [socket](Channel& ch) { return HolderBody(socket, ch); });
  const std::string held = holder.channel().Listen();
  ASSERT_EQ(held.rfind("ready " + std::to_string(kHeldLeases), 0), 0u) << held;
  uint64_t failed = 0;
  std::string error;
  MeasureMedian(victim, 1, 300, &failed, &error);  // warm up

  double ratio = 0;
  std::string hinted;
  for (int round = 0; round < 3; ++round) {
    const double before = MeasureMedian(victim, 5, 300, &failed, &error);
    Tenant hinter(kHinter, [socket](Channel& ch) { return HinterBody(socket, ch); });
    ASSERT_EQ(hinter.channel().Listen(), "ready");
    const double during = MeasureMedian(victim, 5, 300, &failed, &error);
    hinter.channel().Say("finish");
    hinted = hinter.channel().Listen();
    EXPECT_EQ(hinter.Wait(), 0);
    const double after = MeasureMedian(victim, 5, 300, &failed, &error);
    const double quiet = (before + after) / 2;
    ratio = quiet > 0 ? during / quiet : 1e9;
    std::printf(
        "tiering hints: round %d: victim alloc+release median %.0f us quiet (%.0f before, %.0f "
        "after), %.0f us during a hint flood beside %d leases (%.2fx)\n  hinter: %s\n",
        round, quiet, before, after, during, kHeldLeases, ratio, hinted.c_str());
    if (ratio <= 2.0) break;
  }
  EXPECT_EQ(failed, 0u) << "the victim's requests failed: " << error;
  EXPECT_LE(ratio, 2.0) << "a hint flood slowed another tenant's alloc+release median more than 2x";
  // frames taken refused first-refusal: the flood went past its rate and
  // was told which limit it hit.
  std::istringstream in(hinted);
  uint64_t frames = 0, taken = 0, refused = 0;
  in >> frames >> taken >> refused;
  EXPECT_GT(frames, 0u) << hinted;
  EXPECT_GT(taken, 0u) << hinted;
  if (refused > 0) {
    EXPECT_NE(hinted.find("tiering.max_urgent_hints_per_uid"), std::string::npos) << hinted;
  }
  // Replies to frames over the rate are held until the bucket refills: the
  // flood gets about rate / 64 frames a second (plus its burst), not one
  // per round trip (thousands).
  EXPECT_LT(frames, 500u) << hinted;
  EXPECT_TRUE(daemon.Alive());
  holder.channel().Say("finish");
  EXPECT_EQ(holder.Wait(), 0);
}

}  // namespace
}  // namespace cxlpool::testsupport
