// Fakes for the lease manager's restart unit tests (tests/restart/): a
// LeaseStore that keeps what would be journalled, and a ProcessProbe whose
// processes, held files and pidfds the test decides. The fake DaxControl
// (devices that outlive a daemon) is tests/daemon/test_util.h's
// FakeDaxControl.
//
// Thread safety: single-threaded test code.
#pragma once

#include <fcntl.h>

#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "lease/restart.h"

namespace cxlpool::testing {

// The fds of a one-extent lease handed back (LeaseManager::ReclaimItem).
inline std::vector<UniqueFd> Fds(UniqueFd fd) {
  std::vector<UniqueFd> v;
  v.push_back(std::move(fd));
  return v;
}

class FakeStore final : public LeaseStore {
 public:
  Status ReserveIds(uint64_t next_id) override {
    reserved.push_back(next_id);
    return Status::Ok();
  }
  Status Put(const DurableLease& lease, std::span<const int> fds) override {
    if (fail_puts) return Status(Code::kIo, "disk full");
    leases[lease.id] = lease;
    if (!fds.empty()) {
      stored_fds.insert(lease.id);
      stored_extents[lease.id] = fds.size();
    }
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
  std::map<uint64_t, size_t> stored_extents;  // fds stored with each grant
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

}  // namespace cxlpool::testing
