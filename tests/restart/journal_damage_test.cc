// Journal damage with real cxlpoold processes (temp socket, temp state dir,
// pids tracked): leases are held by two forked processes (three private
// leases and a shared one they both map), the daemon is SIGKILLed, its
// journal is damaged in one of five ways, and the daemon is started again:
//   * truncated to 0 bytes, deleted, one byte flipped in the middle, a torn
//     last record, garbage appended.
// Each run checks that:
//   * nothing is silently forgotten: the daemon's log has an error (a
//     warning for a torn tail) naming the damage, STATS shows it
//     (journal_damaged, journal_dropped_tail_bytes), and the grace period
//     holds new grants back while the holders reclaim;
//   * the accounting matches the live mappings: after the holders' RECLAIM
//     every held lease is listed with its size, the pools count exactly the
//     bytes mapped, and the holders' data is intact;
//   * no id is granted twice: grants after the grace period get ids no
//     holder has, above every id granted before.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <set>

#include "restart_util.h"

namespace cxlpool::restart {
namespace {

using testsupport::Accounting;
using testsupport::Daemon;
using testsupport::kMiB;
using testsupport::PollUntil;
using testsupport::RawClient;

// A process holding leases over the raw protocol; it reclaims when told,
// handing back everything the daemon told it of each lease.
struct Holder {
  std::string socket;
  std::optional<RawClient> c;
  struct Held {
    proto::LeaseInfo info;
    UniqueFd fd;
    void* map = nullptr;
    uint64_t tag = 0;
  };
  std::vector<Held> held;

  bool Connect() {
    c.reset();
    auto n = RawClient::Connect(socket, "damage-holder");
    if (!n.ok()) return false;
    c.emplace(std::move(*n));
    return true;
  }
  uint64_t Keep(Result<proto::LeaseInfo> l, UniqueFd fd, uint64_t tag, bool fill) {
    if (!l.ok()) return 0;
    Held h;
    h.info = *l;
    h.fd = std::move(fd);
    h.tag = tag;
    h.map = ::mmap(nullptr, l->size_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, h.fd.get(), 0);
    if (h.map == MAP_FAILED) return 0;
    if (fill) Fill(h.map, l->size_bytes(), tag);
    held.push_back(std::move(h));
    return l->id();
  }
  // Accepted * 1000 + rejected.
  uint64_t Reclaim() {
    if (!Connect()) return 999999;
    proto::ReclaimRequest rr;
    std::vector<int> fds;
    for (auto& h : held) {
      *rr.add_leases() = h.info;
      fds.push_back(h.fd.get());
    }
    proto::ReclaimReply rep;
    if (!c->Call(rr, &rep, nullptr, fds).ok()) return 999998;
    return static_cast<uint64_t>(rep.accepted_size()) * 1000 + rep.rejected_size();
  }
  uint64_t Verify() {
    for (auto& h : held) {
      if (!Intact(h.map, h.info.size_bytes(), h.tag)) return 0;
    }
    return 1;
  }
};

enum class Damage { kTruncateToZero, kDelete, kFlipMiddleByte, kTornTail, kAppendGarbage };

std::string Name(Damage d) {
  switch (d) {
    case Damage::kTruncateToZero:
      return "TruncatedToZero";
    case Damage::kDelete:
      return "Deleted";
    case Damage::kFlipMiddleByte:
      return "FlippedMiddleByte";
    case Damage::kTornTail:
      return "TornTail";
    case Damage::kAppendGarbage:
      return "AppendedGarbage";
  }
  return "?";
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

bool WriteAll(const std::string& path, const std::string& data) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << data;
  return static_cast<bool>(f);
}

// Damages `path` as asked; "" or what went wrong.
std::string Apply(Damage d, const std::string& path) {
  std::string data = ReadAll(path);
  if (data.size() < 64) return "journal too short to damage: " + std::to_string(data.size());
  switch (d) {
    case Damage::kTruncateToZero:
      return ::truncate(path.c_str(), 0) == 0 ? "" : "truncate failed";
    case Damage::kDelete:
      return ::unlink(path.c_str()) == 0 ? "" : "unlink failed";
    case Damage::kFlipMiddleByte:
      data[data.size() / 2] = static_cast<char>(data[data.size() / 2] ^ 0x10);
      return WriteAll(path, data) ? "" : "write failed";
    case Damage::kTornTail:
      return ::truncate(path.c_str(), static_cast<off_t>(data.size() - 7)) == 0 ? ""
                                                                                : "truncate failed";
    case Damage::kAppendGarbage: {
      std::string junk;
      for (int i = 0; i < 97; ++i) junk.push_back(static_cast<char>((i * 73 + 41) & 0xff));
      return WriteAll(path, data + junk) ? "" : "write failed";
    }
  }
  return "unknown damage";
}

class JournalDamageTest : public ::testing::TestWithParam<Damage> {
 protected:
  void SetUp() override {
    testsupport::SkipWithoutDaemon();
    ASSERT_FALSE(state_.path.empty());
    daemon_.set_log_to_file(true);
    ASSERT_TRUE(
        daemon_.Start(kRestartConfig, {"--state-dir", state_.path, "--grace-period", "4s"}).ok());
  }
  std::string JournalPath() const { return state_.path + "/leases.journal"; }

  TempDir state_{"damage"};
  Daemon daemon_;
};

TEST_P(JournalDamageTest, NothingIsForgottenNoIdIsGrantedTwiceAndAccountingHolds) {
  const std::string sock = daemon_.socket();
  Holder a_state{sock, {}, {}};
  Helper a([&](char cmd) -> uint64_t {
    switch (cmd) {
      case 'p': {  // a private lease of a size of its own
        if (!a_state.c && !a_state.Connect()) return 0;
        UniqueFd fd;
        uint64_t n = a_state.held.size() + 1;
        auto l = a_state.c->Alloc(n * kMiB, &fd);
        return a_state.Keep(std::move(l), std::move(fd), 0xA0 + n, true);
      }
      case 's': {
        UniqueFd fd;
        auto l = a_state.c->Alloc(2 * kMiB, &fd, "damage-model", {::getuid()});
        return a_state.Keep(std::move(l), std::move(fd), 0x5A, true);
      }
      case 'r':
        return a_state.Reclaim();
      case 'v':
        return a_state.Verify();
    }
    return 0;
  });
  Holder b_state{sock, {}, {}};
  Helper b([&](char cmd) -> uint64_t {
    switch (cmd) {
      case 'a': {
        if (!b_state.Connect()) return 0;
        UniqueFd fd;
        auto l = b_state.c->Attach("damage-model", &fd);
        return b_state.Keep(std::move(l), std::move(fd), 0x5A, false);
      }
      case 'r':
        return b_state.Reclaim();
      case 'v':
        return b_state.Verify();
    }
    return 0;
  });
  std::set<uint64_t> held_ids;
  std::map<uint64_t, uint64_t> sizes;
  for (int i = 0; i < 3; ++i) {
    auto id = a.Ask('p');
    ASSERT_TRUE(id && *id);
    held_ids.insert(*id);
  }
  auto shared = a.Ask('s');
  ASSERT_TRUE(shared && *shared);
  held_ids.insert(*shared);
  auto attached = b.Ask('a');
  ASSERT_TRUE(attached && *attached == *shared);
  auto before = Snapshot(sock);
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  ASSERT_EQ(before->leases.size(), held_ids.size());
  uint64_t held_bytes = 0;
  for (const auto& [id, l] : before->leases) {
    sizes[id] = l.size_bytes();
    held_bytes += l.size_bytes();
  }
  const uint64_t max_id = *held_ids.rbegin();

  daemon_.Kill();
  const std::string why = Apply(GetParam(), JournalPath());
  ASSERT_EQ(why, "");
  ASSERT_TRUE(daemon_.Restart().ok());

  // Nothing silent: the damage is in the log and in STATS, and grants wait.
  EXPECT_TRUE(InGrace(sock)) << "leases may be missing: their holders must get to reclaim first";
  {
    auto c = RawClient::Connect(sock, "damage-early");
    ASSERT_TRUE(c.ok());
    UniqueFd fd;
    auto l = c->Alloc(4096, &fd);
    ASSERT_FALSE(l.ok()) << "granted lease " << l->id() << " during the grace period";
    EXPECT_EQ(l.status().code(), Code::kUnavailable);
  }
  auto found = Snapshot(sock);
  ASSERT_TRUE(found.ok());
  const std::string log = daemon_.Log();
  if (GetParam() == Damage::kTornTail) {
    EXPECT_GT(found->Gauge("journal_dropped_tail_bytes"), 0u);
    EXPECT_NE(log.find("torn last record"), std::string::npos) << log;
  } else {
    EXPECT_EQ(found->Gauge("journal_damaged"), 1u);
    EXPECT_NE(log.find("the lease journal was damaged"), std::string::npos) << log;
  }
  EXPECT_EQ(found->Overcommit(), "");

  // The holders come back: every lease is taken back, known to the
  // journal or not.
  EXPECT_EQ(a.Ask('r'), 4000u);
  EXPECT_EQ(b.Ask('r'), 1000u);
  auto after = Snapshot(sock);
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  EXPECT_EQ(after->Inconsistencies(), "");
  std::set<uint64_t> listed;
  for (const auto& [id, l] : after->leases) listed.insert(id);
  EXPECT_EQ(listed, held_ids) << "the daemon's leases are not the ones mapped";
  for (const auto& [id, size] : sizes) {
    if (after->leases.count(id)) {
      EXPECT_EQ(after->leases.at(id).size_bytes(), size) << id;
    }
  }
  if (after->leases.count(*shared)) {
    EXPECT_EQ(after->leases.at(*shared).holders(), 2u);
  }
  EXPECT_EQ(after->LeaseBytes(), held_bytes);
  EXPECT_EQ(after->Gauge("leased_bytes"), held_bytes);
  // Every lease the journal lost was accounted again by a reclaim, loudly.
  const uint64_t readopted = after->Counter("unjournalled_adopted");
  if (GetParam() == Damage::kTruncateToZero || GetParam() == Damage::kDelete) {
    EXPECT_EQ(readopted, held_ids.size());
  }
  if (readopted > 0) {
    EXPECT_NE(daemon_.Log().find("was not in the journal: accounted again"), std::string::npos);
  }
  EXPECT_EQ(a.Ask('v'), 1u);
  EXPECT_EQ(b.Ask('v'), 1u);
  std::printf("journal damage %s: %llu of %zu leases accounted again from their holders\n",
              Name(GetParam()).c_str(), static_cast<unsigned long long>(readopted),
              held_ids.size());

  // After the grace period: new ids are new.
  ASSERT_TRUE(PollUntil([&] { return !InGrace(sock); }, 15000, 20));
  {
    auto c = RawClient::Connect(sock, "damage-after");
    ASSERT_TRUE(c.ok());
    std::vector<UniqueFd> fds(5);
    std::vector<uint64_t> fresh;
    for (auto& fd : fds) {
      auto l = c->Alloc(4096, &fd);
      ASSERT_TRUE(l.ok()) << l.status().ToString();
      EXPECT_FALSE(held_ids.count(l->id())) << "id " << l->id() << " granted twice";
      EXPECT_GT(l->id(), max_id);
      fresh.push_back(l->id());
    }
    auto end = Snapshot(sock);
    ASSERT_TRUE(end.ok());
    EXPECT_EQ(end->leases.size(), held_ids.size() + fds.size());
    EXPECT_EQ(end->Inconsistencies(), "");
    for (uint64_t id : fresh) ASSERT_TRUE(c->Release(id).ok());
  }
  // The journal was rewritten clean: a second restart finds nothing wrong
  // and every lease journalled.
  daemon_.Kill();
  ASSERT_TRUE(daemon_.Restart().ok());
  EXPECT_EQ(a.Ask('r'), 4000u);
  EXPECT_EQ(b.Ask('r'), 1000u);
  auto again = Snapshot(sock);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->Gauge("journal_damaged"), 0u);
  EXPECT_EQ(again->Counter("unjournalled_adopted"), 0u);
  EXPECT_EQ(again->leases.size(), held_ids.size());
  EXPECT_EQ(again->Inconsistencies(), "");
}

INSTANTIATE_TEST_SUITE_P(AllKinds, JournalDamageTest,
                         ::testing::Values(Damage::kTruncateToZero, Damage::kDelete,
                                           Damage::kFlipMiddleByte, Damage::kTornTail,
                                           Damage::kAppendGarbage),
                         [](const ::testing::TestParamInfo<Damage>& i) { return Name(i.param); });

}  // namespace
}  // namespace cxlpool::restart
