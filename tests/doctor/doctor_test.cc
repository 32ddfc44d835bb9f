#include "doctor.h"

#include <gtest/gtest.h>

namespace cxlpool {
namespace {

// By value: callers pass the temporary result of RunDoctor.
Finding Get(const std::vector<Finding>& fs, const std::string& check) {
  for (const auto& f : fs)
    if (f.check == check) return f;
  ADD_FAILURE() << "no finding " << check;
  return Finding{};
}

struct Fixture {
  FakeFileSystem fs;
  Topology topo;
  DoctorInputs in;
  Fixture() {
    fs.AddFile("/sys/kernel/mm/transparent_hugepage/shmem_enabled",
               "always within_size [advise] never deny force\n");
    fs.AddFile("/proc/sys/vm/memfd_noexec", "1\n");
    fs.AddFile("/proc/driver/nvidia/version",
               "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580\n");
    NumaNode n0;
    n0.id = 0;
    n0.kind = NodeKind::kDram;
    n0.memory_bytes = 64ull << 30;
    n0.hugepages_2m_total = 512;
    NumaNode n1 = n0;
    n1.id = 1;
    n1.kind = NodeKind::kCxl;
    n1.zone = "Normal";
    topo.numa_nodes = {n0, n1};
    in.socket_path = "/run/cxlpool/cxlpool.sock";
    in.socket = {true, true, 0660, 0, 990, "cxlpool"};
    in.daemon_reachable = true;
    in.daemon_dumpable = false;
    in.daemon_journal_damaged = false;
    in.client_memlock_bytes = std::nullopt;
  }
};

TEST(DoctorTest, HealthyNodeIsAllOk) {
  Fixture f;
  auto out = RunDoctor(f.fs, f.topo, f.in);
  EXPECT_EQ(out.size(), 13u);
  for (const auto& x : out) EXPECT_EQ(x.severity, Severity::kOk) << x.check << ": " << x.summary;
  EXPECT_EQ(WorstSeverity(out), Severity::kOk);
}

TEST(DoctorTest, FlagsCxlMovableAndStopsAfterNormal) {
  Fixture f;
  f.topo.numa_nodes[1].zone = "Movable";
  auto out = RunDoctor(f.fs, f.topo, f.in);
  Finding m = Get(out, "cxl_movable");
  EXPECT_EQ(m.severity, Severity::kWarning);
  EXPECT_NE(m.summary.find("node(s) 1"), std::string::npos);
  EXPECT_NE(m.remedy.find("--no-movable"), std::string::npos);
  // DRAM in Movable is not a CXL finding.
  f.topo.numa_nodes[1].zone = "Normal";
  f.topo.numa_nodes[0].zone = "Movable";
  EXPECT_EQ(Get(RunDoctor(f.fs, f.topo, f.in), "cxl_movable").severity, Severity::kOk);
}

TEST(DoctorTest, ThpDisabledAndMissing) {
  Fixture f;
  f.fs.AddFile("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "always advise [never]\n");
  EXPECT_EQ(Get(RunDoctor(f.fs, f.topo, f.in), "thp_shmem").severity, Severity::kWarning);
  FakeFileSystem empty;
  auto out = RunDoctor(empty, f.topo, f.in);
  EXPECT_EQ(Get(out, "thp_shmem").severity, Severity::kWarning);
  EXPECT_EQ(Get(out, "memfd_noexec").severity, Severity::kInfo);
  EXPECT_EQ(Get(out, "nvidia_driver").severity, Severity::kWarning);
}

TEST(DoctorTest, HugepagesMissingOnPoolNode) {
  Fixture f;
  f.topo.numa_nodes[1].hugepages_2m_total = 0;
  Finding h = Get(RunDoctor(f.fs, f.topo, f.in), "hugepages");
  EXPECT_EQ(h.severity, Severity::kInfo);
  EXPECT_NE(h.summary.find("node(s) 1"), std::string::npos);
}

TEST(DoctorTest, MemlockTooLow) {
  Fixture f;
  f.in.client_memlock_bytes = 8ull << 20;
  EXPECT_EQ(Get(RunDoctor(f.fs, f.topo, f.in), "memlock").severity, Severity::kWarning);
  f.in.client_memlock_bytes = std::nullopt;
  f.in.daemon_memlock_bytes = 1ull << 30;
  f.in.pool_capacity_bytes = 8ull << 30;
  EXPECT_EQ(Get(RunDoctor(f.fs, f.topo, f.in), "memlock").severity, Severity::kWarning);
}

TEST(DoctorTest, DumpableDaemonIsAnError) {
  Fixture f;
  f.in.daemon_dumpable = true;
  auto out = RunDoctor(f.fs, f.topo, f.in);
  EXPECT_EQ(Get(out, "daemon_dumpable").severity, Severity::kError);
  EXPECT_EQ(WorstSeverity(out), Severity::kError);
  f.in.daemon_reachable = false;
  EXPECT_EQ(Get(RunDoctor(f.fs, f.topo, f.in), "daemon_dumpable").severity, Severity::kWarning);
}

TEST(DoctorTest, DamagedJournalIsAnError) {
  Fixture f;
  f.in.daemon_journal_damaged = true;
  f.in.daemon_journal_skipped_bytes = 310;
  Finding j = Get(RunDoctor(f.fs, f.topo, f.in), "journal");
  EXPECT_EQ(j.severity, Severity::kError);
  EXPECT_NE(j.summary.find("310 bytes skipped"), std::string::npos) << j.summary;
  EXPECT_NE(j.remedy.find("leases.journal.damaged"), std::string::npos);
  f.in.daemon_journal_damaged.reset();  // an older daemon
  EXPECT_EQ(Get(RunDoctor(f.fs, f.topo, f.in), "journal").severity, Severity::kInfo);
}

TEST(DoctorTest, ReserveTooBigOrStarvedIsAWarning) {
  Fixture f;
  EXPECT_EQ(Get(RunDoctor(f.fs, f.topo, f.in), "reserve").severity, Severity::kOk);  // no daemon
  const uint64_t g = 1ull << 30;
  f.in.reserves = std::vector<DoctorInputs::Reserve>{{"node0", 64 * g, g / 2, 0, g / 4, g / 2}};
  Finding ok = Get(RunDoctor(f.fs, f.topo, f.in), "reserve");
  EXPECT_EQ(ok.severity, Severity::kOk) << ok.summary;
  (*f.in.reserves)[0].high_bytes = 20 * g;  // a third of the pool
  Finding big = Get(RunDoctor(f.fs, f.topo, f.in), "reserve");
  EXPECT_EQ(big.severity, Severity::kWarning);
  EXPECT_NE(big.summary.find("node0"), std::string::npos) << big.summary;
  EXPECT_NE(big.remedy.find("reserve_high"), std::string::npos);
  (*f.in.reserves)[0].high_bytes = g / 2;
  (*f.in.reserves)[0].ready_bytes = 0;  // below low, nothing building
  Finding starved = Get(RunDoctor(f.fs, f.topo, f.in), "reserve");
  EXPECT_EQ(starved.severity, Severity::kWarning);
  EXPECT_NE(starved.summary.find("not refilling"), std::string::npos) << starved.summary;
  (*f.in.reserves)[0].building_bytes = g / 2;  // refilling: fine
  EXPECT_EQ(Get(RunDoctor(f.fs, f.topo, f.in), "reserve").severity, Severity::kOk);
}

// A reserve below its low watermark for over 60 s is a warning that says
// why: refills not keeping up (extents being built), the pool full (no room
// to refill), or no refill running (failed builds).
TEST(DoctorTest, ReserveBelowLowForAMinuteIsAWarningWithTheReason) {
  Fixture f;
  EXPECT_EQ(Get(RunDoctor(f.fs, f.topo, f.in), "reserve_below_low").severity, Severity::kOk)
      << "no daemon";
  const uint64_t m = 1ull << 20;
  DoctorInputs::Reserve r{"node0", 64 * m * 1024, 64 * m, 0, 256 * m, 512 * m};
  r.free_bytes = 32 * m * 1024;
  f.in.reserves = std::vector<DoctorInputs::Reserve>{r};
  auto check = [&] { return Get(RunDoctor(f.fs, f.topo, f.in), "reserve_below_low"); };
  EXPECT_EQ(check().severity, Severity::kOk)
      << "below low, but the daemon does not say for how long";
  (*f.in.reserves)[0].below_low_ms = 59'000;
  (*f.in.reserves)[0].building_bytes = 32 * m;
  EXPECT_EQ(check().severity, Severity::kOk) << "a refill under way, for less than a minute";
  (*f.in.reserves)[0].below_low_ms = 61'000;
  Finding slow = check();
  EXPECT_EQ(slow.severity, Severity::kWarning);
  EXPECT_NE(slow.summary.find("node0"), std::string::npos) << slow.summary;
  EXPECT_NE(slow.summary.find("for 61 s"), std::string::npos) << slow.summary;
  EXPECT_NE(slow.summary.find("cannot keep up"), std::string::npos) << slow.summary;
  EXPECT_NE(slow.remedy.find("stock_workers"), std::string::npos) << slow.remedy;
  // Nothing being built and no room: the pool is full.
  (*f.in.reserves)[0].building_bytes = 0;
  (*f.in.reserves)[0].free_bytes = 16 * m;
  Finding full = check();
  EXPECT_EQ(full.severity, Severity::kWarning);
  EXPECT_NE(full.summary.find("pool is full"), std::string::npos) << full.summary;
  EXPECT_NE(full.remedy.find("capacity"), std::string::npos) << full.remedy;
  // Nothing being built though there is room: refills are not running.
  (*f.in.reserves)[0].free_bytes = 32 * m * 1024;
  Finding stuck = check();
  EXPECT_EQ(stuck.severity, Severity::kWarning);
  EXPECT_NE(stuck.summary.find("not running"), std::string::npos) << stuck.summary;
  EXPECT_NE(stuck.remedy.find("log"), std::string::npos) << stuck.remedy;
  // Back above low: the daemon stops reporting the time.
  (*f.in.reserves)[0].below_low_ms.reset();
  (*f.in.reserves)[0].ready_bytes = 512 * m;
  EXPECT_EQ(check().severity, Severity::kOk);
}

TEST(DoctorTest, SocketPermissions) {
  Fixture f;
  f.in.socket.mode = 0666;
  EXPECT_EQ(Get(RunDoctor(f.fs, f.topo, f.in), "socket_permissions").severity, Severity::kError);
  f.in.socket.mode = 0660;
  f.in.socket.group_name = "users";
  EXPECT_EQ(Get(RunDoctor(f.fs, f.topo, f.in), "socket_permissions").severity, Severity::kWarning);
  f.in.socket.exists = false;
  EXPECT_EQ(Get(RunDoctor(f.fs, f.topo, f.in), "socket_permissions").severity, Severity::kWarning);
  f.in.socket = {true, false, 0644, 0, 0, "root"};
  EXPECT_EQ(Get(RunDoctor(f.fs, f.topo, f.in), "socket_permissions").severity, Severity::kError);
}

TEST(DoctorTest, MovableAndMixedCxlByZoneBytes) {
  Fixture f;
  f.topo.numa_nodes[1].zone = "Movable";
  f.topo.numa_nodes[1].kernel_zone_bytes = 0;
  f.topo.numa_nodes[1].movable_bytes = 16ull << 30;
  DaxDevice d;
  d.name = "dax0.0";
  d.mode = "system-ram";
  d.target_node = 1;
  f.topo.dax_devices.push_back(d);
  Finding m = Get(RunDoctor(f.fs, f.topo, f.in), "cxl_movable");
  EXPECT_EQ(m.severity, Severity::kWarning);
  EXPECT_NE(m.summary.find("placed elsewhere"), std::string::npos) << m.summary;
  EXPECT_NE(m.remedy.find("daxctl offline-memory dax0.0 && daxctl online-memory --no-movable"),
            std::string::npos)
      << m.remedy;
  f.topo.numa_nodes[1].kernel_zone_bytes = 4ull << 30;  // mixed
  m = Get(RunDoctor(f.fs, f.topo, f.in), "cxl_movable");
  EXPECT_EQ(m.severity, Severity::kWarning);
  EXPECT_NE(m.summary.find("partly in ZONE_MOVABLE"), std::string::npos) << m.summary;
  f.topo.numa_nodes[1].movable_bytes = 0;  // all in kernel zones now
  EXPECT_EQ(Get(RunDoctor(f.fs, f.topo, f.in), "cxl_movable").severity, Severity::kOk);
}

TEST(DoctorTest, UnpooledNodesSayHowToIncludeThem) {
  Fixture f;
  NumaNode odd;
  odd.id = 3;
  odd.kind = NodeKind::kUnknown;
  odd.backing_unidentified = true;
  odd.memory_bytes = 8ull << 30;
  NumaNode gpu = odd;
  gpu.id = 4;
  gpu.kind = NodeKind::kGpu;
  f.topo.numa_nodes.push_back(odd);
  f.topo.numa_nodes.push_back(gpu);
  Finding u = Get(RunDoctor(f.fs, f.topo, f.in), "unpooled_nodes");
  EXPECT_EQ(u.severity, Severity::kWarning);
  EXPECT_NE(u.summary.find("node(s) 3 (8.0 GiB)"), std::string::npos) << u.summary;
  EXPECT_NE(u.summary.find("node(s) 4 are GPU memory"), std::string::npos) << u.summary;
  EXPECT_NE(u.remedy.find("[pools.node.3] enabled = true"), std::string::npos) << u.remedy;
  // The daemon pools node 3 (its config enabled it): only the GPU note stays.
  f.in.pooled_nodes = std::vector<int>{0, 1, 3};
  u = Get(RunDoctor(f.fs, f.topo, f.in), "unpooled_nodes");
  EXPECT_EQ(u.severity, Severity::kInfo);
  EXPECT_EQ(u.summary.find("node(s) 3"), std::string::npos) << u.summary;
}

TEST(DoctorTest, ClusterFindings) {
  Fixture f;
  auto find = [&](const std::vector<Finding>& out) {
    for (const auto& x : out)
      if (x.check == "cluster") return x;
    return Finding{};
  };
  EXPECT_EQ(find(RunDoctor(f.fs, f.topo, f.in)).severity, Severity::kOk);
  f.in.cluster = DoctorInputs::Cluster{true, false, 0, false};
  EXPECT_EQ(find(RunDoctor(f.fs, f.topo, f.in)).severity, Severity::kOk);
  f.in.cluster->slices_quarantined = 2;
  Finding q = find(RunDoctor(f.fs, f.topo, f.in));
  EXPECT_EQ(q.severity, Severity::kWarning);
  EXPECT_NE(q.remedy.find("--confirm-down"), std::string::npos);
  f.in.cluster->session_live = false;
  f.in.cluster->shared_fenced = true;
  Finding lost = find(RunDoctor(f.fs, f.topo, f.in));
  EXPECT_EQ(lost.severity, Severity::kWarning);
  EXPECT_NE(lost.summary.find("session is lost"), std::string::npos);
  f.in.cluster->insecure_remote = true;
  EXPECT_EQ(find(RunDoctor(f.fs, f.topo, f.in)).severity, Severity::kError);
}

}  // namespace
}  // namespace cxlpool
