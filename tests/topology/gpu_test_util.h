// Helpers shared by the GPU tests in tests/topology: hand-built topologies, fake PCI
// devices in a FakeFileSystem, fake NVML boards and scoped environment.
// Thread safety: test-only; setenv is not thread-safe, tests run serially.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "cxlpool/common/fs.h"
#include "cxlpool/topology/topology.h"

namespace cxlpool::testing_gpu {

inline std::string Board(const std::string& name) {
  return std::string(FAKE_NVML_BOARDS) + "/" + name + ".json";
}

// Sets (or unsets, with nullopt) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      ::setenv(name, value->c_str(), 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

inline NumaNode MakeNode(int id, std::vector<int> cpus, std::optional<uint64_t> bytes,
                         std::map<int, int> distances, NodeKind kind) {
  NumaNode n;
  n.id = id;
  n.cpus = std::move(cpus);
  n.memory_bytes = bytes;
  n.distances = std::move(distances);
  n.kind = kind;
  return n;
}

// Two sockets: node 0 cpus 0-7, node 1 cpus 8-15; 64 GiB each.
inline Topology TwoSockets() {
  Topology t;
  t.numa_nodes.push_back(
      MakeNode(0, {0, 1, 2, 3, 4, 5, 6, 7}, 64ull << 30, {{0, 10}, {1, 21}}, NodeKind::kDram));
  t.numa_nodes.push_back(MakeNode(1, {8, 9, 10, 11, 12, 13, 14, 15}, 64ull << 30,
                                  {{0, 21}, {1, 10}}, NodeKind::kDram));
  return t;
}

// A PCI function under /sys/devices, linked from /sys/bus/pci/devices.
inline void AddPci(FakeFileSystem* fs, const std::string& bus_id, const std::string& vendor,
                   const std::string& pci_class, const std::string& numa_node) {
  std::string dir = "/sys/devices/pci0000:00/" + bus_id;
  fs->AddFile(dir + "/vendor", vendor + "\n");
  fs->AddFile(dir + "/class", pci_class + "\n");
  if (!numa_node.empty()) fs->AddFile(dir + "/numa_node", numa_node + "\n");
  fs->AddSymlink("/sys/bus/pci/devices/" + bus_id, "../../../devices/pci0000:00/" + bus_id);
}

inline std::string WriteTemp(const std::string& name, const std::string& text) {
  std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

}  // namespace cxlpool::testing_gpu
