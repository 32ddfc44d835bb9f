// Helpers for the daemon's unit tests: hand-built topologies (two sockets
// with CXL, a GPU box), a fake DaxControl (also used by tests/restart), and a
// LeaseManager harness that runs its loop and workers on one io_context
// (deterministic).
// Thread safety: single-threaded test code.
#pragma once

#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "config/config.h"
#include "cxlpool/common/clock.h"
#include "lease/lease_manager.h"
#include "pool/devdax.h"
#include "pool/pool.h"

namespace cxlpool::testing {

inline NumaNode MakeNode(int id, NodeKind kind, uint64_t mem, std::vector<int> cpus,
                         std::map<int, int> dist) {
  NumaNode n;
  n.id = id;
  n.kind = kind;
  n.memory_bytes = mem;
  n.cpus = std::move(cpus);
  n.distances = std::move(dist);
  return n;
}

// node0 dram (cpus 0-1), node1 dram (cpus 2-3), node2 cxl (near node0),
// node3 cxl (near node1), node4 gpu memory; GPU 0 near node0, GPU 1 near
// node1. Each memory node has `mem` bytes.
inline Topology TwoSocketCxl(uint64_t mem = 64ull << 20) {
  Topology t;
  t.numa_nodes.push_back(
      MakeNode(0, NodeKind::kDram, mem, {0, 1}, {{0, 10}, {1, 21}, {2, 14}, {3, 24}, {4, 30}}));
  t.numa_nodes.push_back(
      MakeNode(1, NodeKind::kDram, mem, {2, 3}, {{0, 21}, {1, 10}, {2, 24}, {3, 14}, {4, 30}}));
  t.numa_nodes.push_back(
      MakeNode(2, NodeKind::kCxl, mem, {}, {{0, 14}, {1, 24}, {2, 10}, {3, 26}, {4, 30}}));
  t.numa_nodes.push_back(
      MakeNode(3, NodeKind::kCxl, mem, {}, {{0, 24}, {1, 14}, {2, 26}, {3, 10}, {4, 30}}));
  t.numa_nodes.push_back(MakeNode(4, NodeKind::kGpu, mem, {}, {{4, 10}}));
  for (int i = 0; i < 2; ++i) {
    Gpu g;
    g.index = i;
    g.uuid = "GPU-000" + std::to_string(i);
    g.pci_bus_id = i == 0 ? "0000:17:00.0" : "0000:b3:00.0";
    g.numa_node = i;
    t.gpus.push_back(g);
  }
  t.gpu_memory_preference[0] = {0, 2, 1, 3};
  t.gpu_memory_preference[1] = {1, 3, 0, 2};
  return t;
}

// A per-uid quota rule: `max_bytes` on `tier` ("" = all tiers).
inline QuotaRule UidQuota(uint32_t uid, uint64_t max_bytes, std::string tier = "") {
  QuotaRule q;
  q.scope = QuotaScope::kUid;
  q.id = uid;
  q.subject = std::to_string(uid);
  q.tier = std::move(tier);
  q.max_bytes = max_bytes;
  return q;
}

// Pools of the whole node, unpinned, 4 KiB pages; a warm reserve refilled
// from `reserve_low` up to `reserve_high` bytes (default: `reserve_low`; 0:
// no reserve).
inline DaemonConfig TestConfig(uint64_t reserve_low = 0, uint64_t reserve_high = 0) {
  DaemonConfig c;
  c.pool_defaults.capacity.is_percent = true;
  c.pool_defaults.capacity.percent = 100;
  c.pool_defaults.pin = false;
  c.pool_defaults.thp = false;
  c.pool_defaults.reserve_low = CapacitySpec{false, 0, reserve_low};
  c.pool_defaults.reserve_high = CapacitySpec{false, 0, std::max(reserve_low, reserve_high)};
  return c;
}

// DAX regions for the devdax pools, with no /dev/dax: devices are memfds of
// the device's size, each with a made-up device number (major 251) while it
// exists. FdDeviceNumber knows the memfds Open handed out, so "is this fd
// dax0.1?" is answered, and answered wrongly for any other fd. The object may
// outlive the lease managers built on it (tests/restart: devices survive a
// "daemon restart"). `fail_create` makes CreateDevice fail (EIO).
class FakeDaxControl final : public DaxControl {
 public:
  struct RegionData {
    DaxRegionState state;
    int id = 0;
    int next_dev = 1;
  };

  void AddRegion(const std::string& name, int id, uint64_t size, uint64_t align, bool dynamic,
                 int node) {
    RegionData r;
    r.id = id;
    r.state.name = name;
    r.state.size_bytes = size;
    r.state.available_bytes = dynamic ? size : 0;
    r.state.align_bytes = align;
    r.state.dynamic = dynamic;
    r.state.target_node = node;
    if (!dynamic) {
      std::string dev = "dax" + std::to_string(id) + ".0";
      r.state.devices.push_back(dev);
      sizes[dev] = size;
      rdev[dev] = makedev(251, next_minor_++);
    }
    regions[name] = r;
  }
  Result<DaxRegionState> Region(const std::string& name) override {
    auto it = regions.find(name);
    if (it == regions.end()) return Status(Code::kNotFound, "no DAX region '" + name + "'");
    return it->second.state;
  }
  Result<std::string> CreateDevice(const std::string& name, uint64_t size,
                                   uint64_t align) override {
    auto& r = regions.at(name);
    if (fail_create) return Status(Code::kIo, "injected create failure");
    if (size % align != 0) return Status(Code::kInvalidArgument, "unaligned");
    if (r.state.available_bytes < size) return Status(Code::kResourceExhausted, "region full");
    r.state.available_bytes -= size;
    std::string dev = "dax" + std::to_string(r.id) + "." + std::to_string(r.next_dev++);
    r.state.devices.push_back(dev);
    sizes[dev] = size;
    rdev[dev] = makedev(251, next_minor_++);
    return dev;
  }
  Status DestroyDevice(const std::string& name, const std::string& dev) override {
    auto& r = regions.at(name);
    auto it = std::find(r.state.devices.begin(), r.state.devices.end(), dev);
    if (it == r.state.devices.end()) return Status(Code::kNotFound, dev);
    if (busy.count(dev) != 0) return Status(Code::kUnavailable, dev + ": device busy");
    r.state.devices.erase(it);
    r.state.available_bytes += sizes[dev];
    rdev.erase(dev);
    destroyed.push_back(dev);
    return Status::Ok();
  }
  Result<UniqueFd> Open(const std::string& dev) override {
    if (!rdev.count(dev)) return Status(Code::kNotFound, "no /dev/" + dev);
    UniqueFd fd(::memfd_create(dev.c_str(), MFD_CLOEXEC));
    if (!fd.valid()) return Status::FromErrno(errno, "memfd");
    if (::ftruncate(fd.get(), static_cast<off_t>(sizes[dev])) != 0) {
      return Status::FromErrno(errno, "ftruncate");
    }
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) return Status::FromErrno(errno, "fstat");
    opened_[st.st_ino] = dev;
    return fd;
  }
  Result<uint64_t> FdDeviceNumber(int fd) override {
    struct stat st {};
    if (fd < 0 || ::fstat(fd, &st) != 0) return Status(Code::kInvalidArgument, "no usable fd");
    auto it = opened_.find(st.st_ino);
    if (it == opened_.end()) {
      return Status(Code::kInvalidArgument, "the fd is not a DAX character device");
    }
    auto r = rdev.find(it->second);
    // A destroyed device's fd still names its old number.
    return r != rdev.end() ? r->second : makedev(251, 0);
  }
  Result<uint64_t> DeviceNumber(const std::string& dev) override {
    auto it = rdev.find(dev);
    if (it == rdev.end()) return Status(Code::kNotFound, "DAX device " + dev + " does not exist");
    return it->second;
  }
  Result<uint64_t> DeviceSize(const std::string& dev) override {
    if (!rdev.count(dev)) return Status(Code::kNotFound, "DAX device " + dev + " does not exist");
    return sizes.at(dev);
  }

  std::map<std::string, RegionData> regions;
  std::map<std::string, uint64_t> sizes;  // device -> size
  std::map<std::string, uint64_t> rdev;   // device -> number, while it exists
  std::vector<std::string> destroyed;
  std::set<std::string> busy;  // held open by a process: DestroyDevice fails
  bool fail_create = false;

 private:
  std::map<ino_t, std::string> opened_;  // memfd inode -> device
  unsigned next_minor_ = 1;
};

// A LeaseManager on a single io_context (loop == workers).
struct Harness {
  // `prefault` false: grants are not populated (for harnesses that never
  // touch them, such as fuzz_handler).
  // `bind` true: memfd pools claim to bind their node (nothing is built:
  // for tests of where existing memory is found).
  explicit Harness(Topology t, DaemonConfig cfg = TestConfig(), DaxControl* dax = nullptr,
                   bool prefault = true, bool bind = false)
      : topo(std::move(t)) {
    PoolBuildOptions o;
    o.bind = bind;
    o.prefault = prefault;
    o.dax = dax;
    auto pools = BuildPools(topo, cfg, o, nullptr);
    CXLPOOL_CHECK(pools.ok());
    mgr = std::make_unique<LeaseManager>(&topo, std::move(*pools), QuotaTable(cfg.quotas),
                                         io.get_executor(), io.get_executor(), &clock);
  }
  void Connect(ConnId c, uid_t uid = 1000, gid_t gid = 1000, bool admin = false) {
    CallerInfo ci;
    ci.pid = 100 + static_cast<pid_t>(c);
    ci.uid = uid;
    ci.gid = gid;
    ci.is_admin = admin;
    ci.comm = "test";
    mgr->Connect(c, ci);
  }
  Result<Granted> Alloc(ConnId c, AllocParams p) {
    std::optional<Result<Granted>> out;
    mgr->Allocate(c, std::move(p), [&](Result<Granted> g) { out.emplace(std::move(g)); });
    io.restart();
    io.run();
    CXLPOOL_CHECK(out.has_value());
    return std::move(*out);
  }
  Result<Granted> Alloc(ConnId c, uint64_t size, std::optional<int> node = std::nullopt) {
    AllocParams p;
    p.size_bytes = size;
    p.numa_node = node;
    return Alloc(c, std::move(p));
  }
  // Allocate without running the io_context: the answer when it came on the
  // request path (a grant wholly from the reserve), nullopt when it waits for a build (that
  // later answer is dropped).
  std::optional<Result<Granted>> AllocOnRequestPath(ConnId c, uint64_t size,
                                                    std::optional<int> node = std::nullopt) {
    auto out = std::make_shared<std::optional<Result<Granted>>>();
    AllocParams p;
    p.size_bytes = size;
    p.numa_node = node;
    mgr->Allocate(c, std::move(p), [out](Result<Granted> g) { out->emplace(std::move(g)); });
    return std::move(*out);
  }
  void Drain() {
    io.restart();
    io.run();
  }
  const PoolSnapshot Pool(const std::string& name) {
    for (auto& p : mgr->Pools())
      if (p.name == name) return p;
    CXLPOOL_CHECK(false);
    return {};
  }

  Topology topo;
  boost::asio::io_context io;
  FakeClock clock;
  std::unique_ptr<LeaseManager> mgr;
};

}  // namespace cxlpool::testing
