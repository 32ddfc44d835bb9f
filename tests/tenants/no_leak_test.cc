// No leak between tenants (issue 18), with the real cxlpoold on a temporary
// socket: one uid fills leases with a pattern and releases them; then another
// uid takes leases covering at least the released bytes, from a pool too
// small to serve them from anything but that memory (its capacity is a little
// over what the first uid held, and the daemon keeps a warm reserve, which
// recycles released memory where the daemon does so), and reads every byte:
// all zeros, and never the pattern. The sizes are the ladder's granules,
// sizes that cut into several extents, and odd ones.
//
// Each tenant is a forked process switched to its uid (test_support.h
// RunInChild) that uses the client library as an application would. Needs
// root for the uids; exits 77 otherwise.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <vector>

#include "cxlpool/client.hpp"
#include "test_support.h"

namespace cxlpool {
namespace {

using testsupport::kKiB;
using testsupport::kMiB;

constexpr uid_t kFirst = 4201;
constexpr uid_t kSecond = 4202;
constexpr uint64_t kPattern = 0xA5C3A5C3DEADBEEFull;

// The first tenant's leases: 2 MiB and 32 MiB granules, a size of several
// granules, and sizes that are not page multiples. 124 MiB in all.
const std::vector<uint64_t>& FirstSizes() {
  static const std::vector<uint64_t> s = {
      2 * kMiB,       2 * kMiB,         2 * kMiB,      32 * kMiB, 36 * kMiB + 4097,
      100 * kKiB + 1, 5 * kMiB + 12345, 40 * kMiB + 7, 64 * kKiB, 3 * kMiB + 4096 * 3};
  return s;
}

uint64_t Total(const std::vector<uint64_t>& v) {
  uint64_t t = 0;
  for (uint64_t s : v) t += (s + 4095) / 4096 * 4096;
  return t;
}

// The daemon's warm reserve (40 MiB of extents), in the one place that knows
// the config keys.
std::string ReserveToml() { return "reserve_low = \"40M\"\nreserve_high = \"40M\"\n"; }

std::string Config(uint64_t capacity) {
  std::ostringstream c;
  c << "[daemon]\nsocket_mode = \"0666\"\nlog_level = \"warning\"\n"
    << "[pools]\ncapacity = \"" << capacity / kMiB << "M\"\n"
    << ReserveToml();
  return c.str();
}

cxlpool::AllocOptions Opts(uint64_t size) {
  cxlpool::AllocOptions o;
  o.size_bytes = size;
  o.numa_node = 0;
  o.label = "no-leak";
  return o;
}

// Child: fills each lease with the pattern, reads it back, releases all.
int Fill(const std::string& socket) {
  auto client = cxlpool::Client::Connect(socket);
  if (!client.ok()) {
    std::fprintf(stderr, "first: connect: %s\n", client.status().ToString().c_str());
    return 2;
  }
  std::vector<cxlpool::Lease> held;
  for (uint64_t size : FirstSizes()) {
    auto l = client->Allocate(Opts(size));
    if (!l.ok()) {
      std::fprintf(stderr, "first: allocate %llu: %s\n", static_cast<unsigned long long>(size),
                   l.status().ToString().c_str());
      return 2;
    }
    // The whole mapping, past the requested size up to its page end too.
    auto* w = static_cast<uint64_t*>(l->data());
    const uint64_t n = l->size() / sizeof(uint64_t);
    for (uint64_t i = 0; i < n; ++i) w[i] = kPattern ^ i;
    for (uint64_t i = 0; i < n; ++i) {
      if (w[i] != (kPattern ^ i)) {
        std::fprintf(stderr, "first: pattern did not stick at word %llu\n",
                     static_cast<unsigned long long>(i));
        return 3;
      }
    }
    held.push_back(std::move(*l));
  }
  for (auto& l : held) {
    if (auto st = l.Release(); !st.ok()) {
      std::fprintf(stderr, "first: release: %s\n", st.ToString().c_str());
      return 2;
    }
  }
  return 0;
}

// Child: takes leases of at least `want` bytes in all (the first tenant's
// sizes, in a different order, then again) and reads every byte of each.
int Check(const std::string& socket, uint64_t want) {
  auto client = cxlpool::Client::Connect(socket);
  if (!client.ok()) {
    std::fprintf(stderr, "second: connect: %s\n", client.status().ToString().c_str());
    return 2;
  }
  std::vector<uint64_t> sizes(FirstSizes().rbegin(), FirstSizes().rend());
  std::vector<cxlpool::Lease> held;
  uint64_t got = 0, bytes_read = 0;
  size_t k = 0;
  while (got < want) {
    uint64_t size = sizes[k % sizes.size()];
    auto l = client->Allocate(Opts(size));
    if (!l.ok()) {
      // The pool is full: release the oldest and go on, so that later
      // leases come out of the same memory again.
      if (held.empty()) {
        std::fprintf(stderr, "second: allocate %llu: %s\n", static_cast<unsigned long long>(size),
                     l.status().ToString().c_str());
        return 2;
      }
      (void)held.front().Release();
      held.erase(held.begin());
      continue;
    }
    const auto* w = static_cast<const uint64_t*>(l->data());
    const uint64_t n = l->size() / sizeof(uint64_t);
    for (uint64_t i = 0; i < n; ++i) {
      if (w[i] != 0) {
        std::fprintf(stderr,
                     "second: lease %llu (%llu bytes) word %llu is %016llx%s: another tenant's "
                     "bytes\n",
                     static_cast<unsigned long long>(l->id()),
                     static_cast<unsigned long long>(size), static_cast<unsigned long long>(i),
                     static_cast<unsigned long long>(w[i]),
                     (w[i] ^ i) == kPattern ? " (the first tenant's pattern)" : "");
        return 1;
      }
    }
    bytes_read += l->size();
    got += l->size();
    held.push_back(std::move(*l));
    ++k;
  }
  std::fprintf(stderr, "second: read %llu bytes of zeros\n",
               static_cast<unsigned long long>(bytes_read));
  return 0;
}

class NoLeakTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    testsupport::SkipWithoutDaemon();
    if (!testsupport::IsRoot()) testsupport::Skip("needs root: the tenants run as other uids");
  }
};

TEST_F(NoLeakTest, ASecondUidNeverReadsWhatTheFirstReleased) {
  const uint64_t first = Total(FirstSizes());
  // Room for the first tenant's leases and the reserve, little more: the
  // second tenant's leases must reuse what the first released.
  const uint64_t capacity = first + 40 * kMiB + 8 * kMiB;
  testsupport::Daemon d;
  d.set_log_to_file(true);
  ASSERT_TRUE(d.Start(Config(capacity)).ok()) << d.Log();
  const std::string socket = d.socket();
  ASSERT_EQ(testsupport::RunInChild([&] { return Fill(socket); }, kFirst), 0) << d.Log();
  // Twice the released bytes, so the check covers them even where the
  // daemon hands out the reserve before recycled memory.
  ASSERT_EQ(testsupport::RunInChild([&] { return Check(socket, 2 * first); }, kSecond), 0)
      << d.Log();
  EXPECT_TRUE(d.Alive());
  // The accounting is back to nothing leased.
  auto admin = testsupport::RawClient::Connect(socket, "no-leak-admin");
  ASSERT_TRUE(admin.ok());
  ASSERT_TRUE(testsupport::PollUntil([&] {
    auto a = testsupport::ReadAccounting(*admin);
    return a.ok() && a->leases.empty();
  }));
}

}  // namespace
}  // namespace cxlpool
