// LeaseTable keeps its indexes (owner uid, shared name, revocations) in step
// with the leases: adding, removing, re-owning and naming a lease, holding a
// name for a build, and the bounded memory of revocations.
#include "lease/lease_table.h"

#include <gtest/gtest.h>

#include <unordered_set>

namespace cxlpool {
namespace {

LeaseRecord Record(uint64_t id, uid_t owner, const std::string& name = "") {
  LeaseRecord l;
  l.id = id;
  l.owner.uid = owner;
  l.name = name;
  return l;
}

TEST(LeaseTableTest, AddAndRemoveKeepOwnerAndNameIndexes) {
  LeaseTable t;
  t.Add(Record(1, 1000, "kv"));
  t.Add(Record(2, 1000));
  t.Add(Record(3, 2000, "kv"));  // names are per owner: no clash
  EXPECT_EQ(t.leases().size(), 3u);
  EXPECT_EQ(t.OwnedBy(1000), (std::unordered_set<uint64_t>{1, 2}));
  EXPECT_EQ(t.Named(1000, "kv"), 1u);
  EXPECT_EQ(t.Named(2000, "kv"), 3u);
  EXPECT_EQ(t.names(), 2u);
  LeaseRecord gone = t.Remove(1);
  EXPECT_EQ(gone.id, 1u);
  EXPECT_EQ(gone.name, "kv");
  EXPECT_FALSE(t.Named(1000, "kv").has_value());
  EXPECT_EQ(t.OwnedBy(1000), (std::unordered_set<uint64_t>{2}));
  t.Remove(2);
  EXPECT_TRUE(t.OwnedBy(1000).empty());
  EXPECT_EQ(t.leases().count(2), 0u);
}

TEST(LeaseTableTest, ANewOwnerTakesTheLeaseWithoutItsOldName) {
  LeaseTable t;
  LeaseRecord& l = t.Add(Record(7, 1000, "weights"));
  CallerInfo who;
  who.uid = 3000;
  t.SetOwner(l, who);
  EXPECT_TRUE(l.name.empty());
  EXPECT_FALSE(t.Named(1000, "weights").has_value());
  EXPECT_TRUE(t.OwnedBy(1000).empty());
  EXPECT_EQ(t.OwnedBy(3000), (std::unordered_set<uint64_t>{7}));
  EXPECT_TRUE(t.SetName(l, "weights"));
  EXPECT_EQ(t.Named(3000, "weights"), 7u);
  // A name the owner already uses is refused and nothing changes.
  LeaseRecord& other = t.Add(Record(8, 3000));
  EXPECT_FALSE(t.SetName(other, "weights"));
  EXPECT_TRUE(other.name.empty());
  EXPECT_EQ(t.Named(3000, "weights"), 7u);
}

TEST(LeaseTableTest, AHeldNameIsTakenUntilDroppedOrFilled) {
  LeaseTable t;
  t.HoldName(1000, "kv");
  EXPECT_EQ(t.Named(1000, "kv"), 0u) << "0: being built";
  t.DropHeldName(1000, "kv");
  EXPECT_FALSE(t.Named(1000, "kv").has_value());
  t.HoldName(1000, "kv");
  t.Add(Record(5, 1000, "kv"));  // the build finished
  EXPECT_EQ(t.Named(1000, "kv"), 5u);
  t.DropHeldName(1000, "kv");  // only a held (0) name goes
  EXPECT_EQ(t.Named(1000, "kv"), 5u);
}

TEST(LeaseTableTest, RevocationsAreRememberedWithinABound) {
  LeaseTable t;
  EXPECT_EQ(t.RevokedFor(1), nullptr);
  t.Revoked(1, {1000, 2000}, 2);
  ASSERT_NE(t.RevokedFor(1), nullptr);
  EXPECT_EQ(*t.RevokedFor(1), (std::vector<uid_t>{1000, 2000}));
  t.Revoked(2, {1000}, 2);
  t.Revoked(3, {1000}, 2);  // the bound reached: the older are forgotten
  EXPECT_EQ(t.RevokedFor(1), nullptr);
  EXPECT_NE(t.RevokedFor(3), nullptr);
}

TEST(LeaseTableTest, ClearForgetsLeasesAndNamesButNotRevocations) {
  LeaseTable t;
  t.Add(Record(1, 1000, "kv"));
  t.Revoked(9, {1000}, 10);
  t.Clear();
  EXPECT_TRUE(t.leases().empty());
  EXPECT_EQ(t.names(), 0u);
  EXPECT_TRUE(t.OwnedBy(1000).empty());
  EXPECT_NE(t.RevokedFor(9), nullptr);
}

}  // namespace
}  // namespace cxlpool
