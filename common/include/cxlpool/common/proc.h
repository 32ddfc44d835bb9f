// Proc: what cxlpool reads about a process from /proc/<pid>/, parsed in one
// place and read through the FileSystem seam (a fake or a rooted tree in
// tests): the stat line (state, start time, last CPU), the supplementary
// groups and effective capabilities of status, and the unified-hierarchy
// line of cgroup.
//
// The stat line is "pid (comm) state ppid ...": comm may hold spaces and
// parentheses, so fields are counted after the last ')'.
//
// Thread safety: pure functions; reentrant.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "cxlpool/common/fs.h"
#include "cxlpool/common/status.h"

namespace cxlpool {

// The fields of /proc/<pid>/stat that cxlpool uses.
struct ProcStat {
  pid_t pid = 0;
  std::string comm;         // field 2, without its parentheses
  char state = '?';         // field 3: R, S, D, Z (zombie), X (dead), ...
  uint64_t start_time = 0;  // field 22: clock ticks after boot (tells a reused pid apart)
  int processor = -1;       // field 39: the CPU it last ran on; -1 when the line is shorter
  // A zombie or dying task: it holds no fd and no mapping any more.
  bool gone() const { return state == 'Z' || state == 'X'; }
};

// INVALID_ARGUMENT when `text` is not a stat line (no "(comm)", fewer than
// 22 fields, a field that is not a number).
Result<ProcStat> ParseProcStat(std::string_view text);
// /proc/<pid>/stat through `fs`: the read's error (NOT_FOUND once the
// process is gone) or ParseProcStat's.
Result<ProcStat> ReadProcStat(const FileSystem& fs, pid_t pid);

// "Groups:\t10 27 1000" of /proc/<pid>/status -> {10, 27, 1000}; empty when
// the line is missing.
std::vector<gid_t> ParseStatusGroups(std::string_view status_text);
// "CapEff:\t0000000000800000" of /proc/<pid>/status -> its bit mask; 0 when
// the line is missing or not hex.
uint64_t ParseStatusCapEff(std::string_view status_text);
// Whether capability number `cap` (<linux/capability.h>: CAP_IPC_LOCK 14,
// CAP_SYS_NICE 23, ...) is in this process's effective set, from
// /proc/self/status; false when that cannot be read.
bool HaveEffectiveCapability(int cap);

// The "0::/system.slice/foo.service" line of /proc/<pid>/cgroup -> its path;
// "" when there is none (no unified hierarchy).
std::string ParseUnifiedCgroup(std::string_view cgroup_text);

}  // namespace cxlpool
