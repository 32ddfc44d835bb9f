// Fakes for the lease manager's restart unit tests (tests/restart/): a
// LeaseStore that keeps what would be journalled, a ProcessProbe whose
// processes, held files and pidfds the test decides, and a DaxControl whose
// devices are memfds with made-up device numbers (there is no /dev/dax on
// the build machines): FdDeviceNumber knows the memfds its Open handed out,
// so "is this fd dax0.1?" can be answered, and answered wrongly for any
// other fd.
//
// Thread safety: single-threaded test code.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "lease/restart.h"
#include "pool/devdax.h"

namespace cxlpool::testing {

class FakeStore final : public LeaseStore {
 public:
  Status ReserveIds(uint64_t next_id) override {
    reserved.push_back(next_id);
    return Status::Ok();
  }
  Status Put(const DurableLease& lease, int fd) override {
    if (fail_puts) return Status(Code::kIo, "disk full");
    leases[lease.id] = lease;
    if (fd >= 0) stored_fds.insert(lease.id);
    ++puts;
    return Status::Ok();
  }
  Status Delete(uint64_t id) override {
    leases.erase(id);
    deleted.insert(id);
    return Status::Ok();
  }
  std::vector<DurableLease> Journalled() const {
    std::vector<DurableLease> out;
    for (const auto& [id, l] : leases) out.push_back(l);
    return out;
  }
  std::map<uint64_t, DurableLease> leases;
  std::set<uint64_t> stored_fds, deleted;
  std::vector<uint64_t> reserved;
  int puts = 0;
  bool fail_puts = false;
};

class FakeProbe final : public ProcessProbe {
 public:
  std::optional<uint64_t> StartTime(pid_t pid) const override {
    auto it = start.find(pid);
    if (it == start.end()) return std::nullopt;
    return it->second;
  }
  Holding HoldsFile(pid_t pid, uint64_t, uint64_t ino) const override {
    auto it = holds.find({pid, ino});
    return it == holds.end() ? Holding::kUnknown : it->second;
  }
  // An eventfd stands in for the pidfd: the test makes it readable ("exited").
  UniqueFd OpenPidfd(pid_t pid) const override {
    auto it = pidfds.find(pid);
    if (it == pidfds.end()) return UniqueFd();
    return UniqueFd(::fcntl(it->second, F_DUPFD_CLOEXEC, 0));
  }
  std::map<pid_t, int> pidfds;
  std::map<pid_t, uint64_t> start;
  std::map<std::pair<pid_t, uint64_t>, Holding> holds;
};

// DAX regions whose devices survive a "daemon restart" (the object outlives
// the lease managers built on it). Devices are memfds of the device's size;
// each device has a made-up device number (major 251).
class FakeDax final : public DaxControl {
 public:
  void AddRegion(const std::string& name, int id, uint64_t size, uint64_t align, bool dynamic,
                 int node) {
    Data r;
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

  struct Data {
    DaxRegionState state;
    int id = 0;
    int next_dev = 1;
  };
  std::map<std::string, Data> regions;
  std::map<std::string, uint64_t> sizes;  // device -> size
  std::map<std::string, uint64_t> rdev;   // device -> number, while it exists
  std::vector<std::string> destroyed;

 private:
  std::map<ino_t, std::string> opened_;  // memfd inode -> device
  unsigned next_minor_ = 1;
};

}  // namespace cxlpool::testing
