#include "doctor.h"

#include <grp.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>

#include "cxlpool/common/strings.h"

namespace cxlpool {
namespace {

constexpr uint64_t kMinClientMemlock = 64ull << 20;

std::string Octal(mode_t m) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(m & 07777));
  return buf;
}

// "always [advise] never" -> "advise"
std::string BracketedChoice(const std::string& s) {
  auto open = s.find('[');
  auto close = s.find(']', open);
  if (open == std::string::npos || close == std::string::npos) return std::string(Trim(s));
  return s.substr(open + 1, close - open - 1);
}

Finding CheckThp(const FileSystem& fs) {
  Finding f{"thp_shmem", Severity::kOk, "", ""};
  auto r = fs.ReadTrimmed("/sys/kernel/mm/transparent_hugepage/shmem_enabled");
  if (!r.ok()) {
    f.severity = Severity::kWarning;
    f.summary = "shmem transparent huge pages unavailable (" + r.status().message() + ")";
    f.remedy = "use a kernel with CONFIG_TRANSPARENT_HUGEPAGE, or configure hugetlb pools";
    return f;
  }
  std::string mode = BracketedChoice(*r);
  if (mode == "never" || mode == "deny") {
    f.severity = Severity::kWarning;
    f.summary = "shmem THP is '" + mode + "': leases are backed by 4 KiB pages";
    f.remedy = "echo advise > /sys/kernel/mm/transparent_hugepage/shmem_enabled";
  } else {
    f.summary = "shmem THP is '" + mode + "'";
  }
  return f;
}

bool IsPoolNode(const NumaNode& n) { return !NotPooledReason(n).has_value(); }

Finding CheckHugepages(const Topology& topo) {
  Finding f{"hugepages", Severity::kOk, "", ""};
  std::vector<int> without;
  int pool_nodes = 0;
  for (const auto& n : topo.numa_nodes) {
    if (!IsPoolNode(n)) continue;
    ++pool_nodes;
    if (n.hugepages_2m_total.value_or(0) == 0 && n.hugepages_1g_total.value_or(0) == 0) {
      without.push_back(n.id);
    }
  }
  if (pool_nodes == 0) {
    f.severity = Severity::kWarning;
    f.summary = "no NUMA node with memory found";
    f.remedy = "check that /sys/devices/system/node is readable";
  } else if (!without.empty()) {
    f.severity = Severity::kInfo;
    f.summary = "no hugepages reserved on pool node(s) " + FormatCpuList(without) +
                ": hugetlb-backed leases are unavailable there";
    f.remedy = "echo N > /sys/devices/system/node/node<ID>/hugepages/hugepages-2048kB/nr_hugepages";
  } else {
    f.summary = "hugepages reserved on every pool node";
  }
  return f;
}

Finding CheckCxlMovable(const Topology& topo) {
  Finding f{"cxl_movable", Severity::kOk, "", ""};
  std::vector<int> movable, partly;
  for (const auto& n : topo.numa_nodes) {
    if (n.kind != NodeKind::kCxl) continue;
    switch (LongTermPinsOf(n)) {
      case LongTermPins::kNo:
        movable.push_back(n.id);
        break;
      case LongTermPins::kPartly:
        partly.push_back(n.id);
        break;
      case LongTermPins::kUnknown:
        // No byte counts: go by the dominant zone.
        if (n.zone && *n.zone == "Movable") movable.push_back(n.id);
        break;
      case LongTermPins::kYes:
        break;
    }
  }
  if (movable.empty() && partly.empty()) {
    f.summary = "no CXL memory onlined as ZONE_MOVABLE";
    return f;
  }
  f.severity = Severity::kWarning;
  std::vector<int> all = movable;
  all.insert(all.end(), partly.begin(), partly.end());
  std::sort(all.begin(), all.end());
  if (!movable.empty()) {
    f.summary = "CXL node(s) " + FormatCpuList(movable) +
                " onlined as ZONE_MOVABLE: a long-term pin (CUDA registration, RDMA) migrates "
                "those pages off CXL, so leases that will be pinned are placed elsewhere";
  }
  if (!partly.empty()) {
    f.summary += std::string(f.summary.empty() ? "" : "; ") + "CXL node(s) " +
                 FormatCpuList(partly) +
                 " partly in ZONE_MOVABLE: pinned leases there fit only in the kernel zones";
  }
  for (int id : all) f.remedy += (f.remedy.empty() ? "" : "; ") + topo.KernelZoneRemedy(id);
  return f;
}

Finding CheckUnpooledNodes(const Topology& topo, const DoctorInputs& in) {
  Finding f{"unpooled_nodes", Severity::kOk, "", ""};
  std::vector<std::string> unknown, gpu;
  for (const auto& n : topo.numa_nodes) {
    auto why = NotPooledReason(n);
    if (!why || !n.memory_bytes || *n.memory_bytes == 0) continue;
    if (n.kind == NodeKind::kGpu) {
      gpu.push_back(std::to_string(n.id));
      continue;
    }
    if (in.pooled_nodes && std::find(in.pooled_nodes->begin(), in.pooled_nodes->end(), n.id) !=
                               in.pooled_nodes->end()) {
      continue;  // the config enabled it
    }
    unknown.push_back(std::to_string(n.id) + " (" + HumanBytes(*n.memory_bytes) + ")");
    f.remedy += std::string(f.remedy.empty() ? "" : "; ") + "[pools.node." + std::to_string(n.id) +
                "] enabled = true";
  }
  auto join = [](const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
    return s;
  };
  if (!unknown.empty()) {
    f.severity = Severity::kWarning;
    f.summary = "CPU-less node(s) " + join(unknown) +
                " of unknown kind (no CXL, hmem, nvdimm or GPU backing found) are not pooled";
    f.remedy = "if that memory is host memory to lend out, add to cxlpoold.toml: " + f.remedy +
               "; then restart cxlpoold";
  }
  if (!gpu.empty()) {
    if (f.severity == Severity::kOk) f.severity = Severity::kInfo;
    f.summary += std::string(f.summary.empty() ? "" : "; ") + "node(s) " + join(gpu) +
                 " are GPU memory, never pooled";
    if (f.remedy.empty()) f.remedy = "none needed";
  }
  if (f.summary.empty()) f.summary = "every node with memory is pooled";
  return f;
}

Finding CheckMemlock(const DoctorInputs& in) {
  Finding f{"memlock", Severity::kOk, "", ""};
  std::vector<std::string> problems;
  if (in.client_memlock_bytes && *in.client_memlock_bytes < kMinClientMemlock) {
    problems.push_back("this process's RLIMIT_MEMLOCK is " + HumanBytes(*in.client_memlock_bytes) +
                       " (clients that pin or lock lease memory need more)");
  }
  if (in.daemon_memlock_bytes && *in.daemon_memlock_bytes < in.pool_capacity_bytes) {
    problems.push_back("the daemon's RLIMIT_MEMLOCK " + HumanBytes(*in.daemon_memlock_bytes) +
                       " is below pool capacity " + HumanBytes(in.pool_capacity_bytes));
  }
  if (problems.empty()) {
    f.summary = "RLIMIT_MEMLOCK is sufficient";
    return f;
  }
  f.severity = Severity::kWarning;
  for (size_t i = 0; i < problems.size(); ++i) f.summary += (i ? "; " : "") + problems[i];
  f.remedy = "LimitMEMLOCK=infinity in the unit, or 'memlock unlimited' in limits.conf";
  return f;
}

Finding CheckMemfdNoexec(const FileSystem& fs) {
  Finding f{"memfd_noexec", Severity::kOk, "", ""};
  auto r = fs.ReadTrimmed("/proc/sys/vm/memfd_noexec");
  if (!r.ok()) {
    f.severity = Severity::kInfo;
    f.summary =
        "vm.memfd_noexec absent: kernel predates MFD_NOEXEC_SEAL (Linux 6.3); leases "
        "are created executable-sealable";
    f.remedy = "none needed; a kernel >= 6.3 seals lease memfds non-executable";
    return f;
  }
  auto v = ParseU64(*r);
  if (!v || *v > 2) {
    f.severity = Severity::kWarning;
    f.summary = "vm.memfd_noexec has an unexpected value '" + *r + "'";
    f.remedy = "sysctl vm.memfd_noexec=1";
  } else if (*v == 0) {
    f.severity = Severity::kInfo;
    f.summary =
        "vm.memfd_noexec=0: memfds default to executable (cxlpool seals its own "
        "non-executable)";
    f.remedy = "sysctl vm.memfd_noexec=1 to make non-executable the default for all memfds";
  } else {
    f.summary = "vm.memfd_noexec=" + *r;
  }
  return f;
}

Finding CheckDumpable(const DoctorInputs& in) {
  Finding f{"daemon_dumpable", Severity::kOk, "", ""};
  if (!in.daemon_reachable) {
    f.severity = Severity::kWarning;
    f.summary = "daemon not reachable on " + in.socket_path;
    f.remedy = "systemctl start cxlpoold.socket cxlpoold.service";
  } else if (!in.daemon_dumpable) {
    f.severity = Severity::kInfo;
    f.summary = "daemon did not report its dumpable flag";
    f.remedy = "upgrade cxlpoold";
  } else if (*in.daemon_dumpable) {
    f.severity = Severity::kError;
    f.summary =
        "daemon is dumpable: other processes of its user can open lease fds through "
        "/proc/<pid>/fd";
    f.remedy =
        "restart cxlpoold (it sets PR_SET_DUMPABLE=0 at start); check for ptrace tools "
        "resetting it";
  } else {
    f.summary = "daemon is not dumpable";
  }
  return f;
}

Finding CheckJournal(const DoctorInputs& in) {
  Finding f{"journal", Severity::kOk, "", ""};
  if (!in.daemon_reachable) {
    f.severity = Severity::kInfo;
    f.summary = "daemon not reachable: its lease journal was not checked";
    f.remedy = "start cxlpoold";
  } else if (!in.daemon_journal_damaged) {
    f.severity = Severity::kInfo;
    f.summary = "daemon did not report the state of its lease journal";
    f.remedy = "upgrade cxlpoold";
  } else if (*in.daemon_journal_damaged) {
    f.severity = Severity::kError;
    f.summary = "the daemon found its lease journal damaged or lost at start (" +
                std::to_string(in.daemon_journal_skipped_bytes) + " bytes skipped, " +
                std::to_string(in.daemon_journal_dropped_tail_bytes) +
                " bytes of tail dropped); leases it lost are accounted again as their holders "
                "reclaim them";
    f.remedy =
        "read the daemon's log (journalctl -u cxlpoold) for what was lost and re-adopted; "
        "the damaged copy is leases.journal.damaged in the state directory; check the disk";
  } else {
    f.summary = "lease journal intact at the daemon's last start";
  }
  return f;
}

Finding CheckSocket(const DoctorInputs& in) {
  Finding f{"socket_permissions", Severity::kOk, "", ""};
  const SocketFacts& s = in.socket;
  if (!s.exists) {
    f.severity = Severity::kWarning;
    f.summary = "socket " + in.socket_path + " does not exist";
    f.remedy = "start cxlpoold.socket, or pass --socket";
  } else if (!s.is_socket) {
    f.severity = Severity::kError;
    f.summary = in.socket_path + " is not a socket";
    f.remedy = "remove it and restart cxlpoold";
  } else if (s.mode & 0007) {
    f.severity = Severity::kError;
    f.summary = "socket mode " + Octal(s.mode) + " lets any user on the node lease memory";
    f.remedy = "SocketMode=0660 in cxlpoold.socket (or socket_mode in cxlpoold.toml)";
  } else if (!in.expected_socket_group.empty() && s.group_name != in.expected_socket_group) {
    f.severity = Severity::kWarning;
    f.summary =
        "socket group is '" + s.group_name + "', expected '" + in.expected_socket_group + "'";
    f.remedy = "SocketGroup=" + in.expected_socket_group + " in cxlpoold.socket";
  } else {
    f.summary = "socket mode " + Octal(s.mode) + " group '" + s.group_name + "'";
  }
  return f;
}

Finding CheckNvidiaDriver(const FileSystem& fs) {
  Finding f{"nvidia_driver", Severity::kOk, "", ""};
  if (fs.Exists("/proc/driver/nvidia/version") || fs.Exists("/sys/module/nvidia")) {
    auto v = fs.ReadTrimmed("/proc/driver/nvidia/version");
    std::string first = v.ok() ? Split(*v, '\n')[0] : "loaded";
    f.summary = "NVIDIA driver: " + first;
    return f;
  }
  f.severity = Severity::kWarning;
  f.summary =
      "NVIDIA driver not loaded: no GPU placement hints from NVML, and CUDA "
      "registration of leases is unavailable";
  f.remedy = "install and load the NVIDIA driver (modprobe nvidia), or ignore on CPU-only nodes";
  return f;
}

std::string Join(const std::vector<std::string>& parts, const char* sep) {
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : sep) + p;
  return out;
}

// The warm reserve is pinned memory no lease outside it can use: warn when
// it is a large share of a pool, and when one sits below its low watermark
// with nothing being built (its builds fail, or the pool has no room).
Finding CheckReserve(const DoctorInputs& in) {
  Finding f{"reserve", Severity::kOk, "", ""};
  if (!in.reserves) {
    f.summary = "daemon not reachable: warm reserve not checked";
    return f;
  }
  std::vector<std::string> big, starved, fine;
  for (const auto& r : *in.reserves) {
    if (r.capacity_bytes > 0 && r.high_bytes > r.capacity_bytes / 4) {
      big.push_back(r.pool + " (high " + HumanBytes(r.high_bytes) + " of " +
                    HumanBytes(r.capacity_bytes) + ")");
    } else if (r.low_bytes > 0 && r.ready_bytes < r.low_bytes && r.building_bytes == 0) {
      starved.push_back(r.pool + " (" + HumanBytes(r.ready_bytes) + " ready, low " +
                        HumanBytes(r.low_bytes) + ")");
    } else {
      fine.push_back(r.pool + " " + HumanBytes(r.ready_bytes) + "/" + HumanBytes(r.high_bytes));
    }
  }
  if (!big.empty()) {
    f.severity = Severity::kWarning;
    f.summary = "warm reserve above a quarter of the pool: " + Join(big, ", ") +
                "; that memory is pinned and no lease beyond the reserve can use it";
    f.remedy = "lower reserve_high (and reserve_low) in [pools] or [pools.node.N] of cxlpoold.toml";
  } else if (!starved.empty()) {
    f.severity = Severity::kWarning;
    f.summary = "warm reserve below its low watermark and not refilling: " + Join(starved, ", ") +
                "; grants build on the request path";
    f.remedy =
        "check the daemon log for failed reserve builds, and `cxlpoolctl pools` for room in "
        "the pool (a full pool cannot refill)";
  } else {
    f.summary = fine.empty() ? "no memfd pools" : "warm reserve: " + Join(fine, ", ");
  }
  return f;
}

// A reserve that stays below its low watermark serves grants from the
// request path: say which pools, for how long, and the likely reason.
Finding CheckReserveBelowLow(const DoctorInputs& in) {
  Finding f{"reserve_below_low", Severity::kOk, "", ""};
  if (!in.reserves) {
    f.summary = "daemon not reachable: warm reserve levels not checked";
    return f;
  }
  const uint64_t limit = DoctorInputs::kReserveBelowLowWarnMs;
  std::vector<std::string> slow, full, failing;
  for (const auto& r : *in.reserves) {
    if (!r.below_low_ms || *r.below_low_ms < limit) continue;
    std::string what = r.pool + " (" + HumanBytes(r.ready_bytes) + " ready, low " +
                       HumanBytes(r.low_bytes) + ", for " + std::to_string(*r.below_low_ms / 1000) +
                       " s";
    if (r.building_bytes > 0) {
      slow.push_back(what + ", " + HumanBytes(r.building_bytes) + " being built)");
    } else if (r.free_bytes < r.low_bytes - std::min(r.low_bytes, r.ready_bytes)) {
      full.push_back(what + ", " + HumanBytes(r.free_bytes) + " free in the pool)");
    } else {
      failing.push_back(what + ", nothing being built)");
    }
  }
  std::vector<std::string> parts, remedies;
  if (!slow.empty()) {
    parts.push_back("refills cannot keep up with grants: " + Join(slow, ", "));
    remedies.push_back(
        "give refills more CPU (daemon.stock_workers, stock_idle = false) or raise reserve_low");
  }
  if (!full.empty()) {
    parts.push_back("the pool is full, so the reserve cannot refill: " + Join(full, ", "));
    remedies.push_back("raise the pool's capacity, or lower reserve_low and reserve_high");
  }
  if (!failing.empty()) {
    parts.push_back("refills are not running (failed builds?): " + Join(failing, ", "));
    remedies.push_back("check the daemon log for failed reserve builds");
  }
  if (!parts.empty()) {
    f.severity = Severity::kWarning;
    f.summary = "warm reserve below its low watermark for over " + std::to_string(limit / 1000) +
                " s; grants build on the request path. " + Join(parts, "; ");
    f.remedy = Join(remedies, "; ");
  } else {
    f.summary =
        "no warm reserve below its low watermark for over " + std::to_string(limit / 1000) + " s";
  }
  return f;
}

}  // namespace

const char* SeverityName(Severity s) {
  switch (s) {
    case Severity::kOk:
      return "ok";
    case Severity::kInfo:
      return "info";
    case Severity::kWarning:
      return "warning";
    case Severity::kError:
      return "error";
  }
  return "unknown";
}

Finding CheckCluster(const DoctorInputs& in) {
  Finding f{"cluster", Severity::kOk, "", ""};
  if (!in.cluster) {
    f.summary = "not a cluster member (no [cluster] endpoints, or the daemon did not say)";
    return f;
  }
  const DoctorInputs::Cluster& c = *in.cluster;
  if (c.insecure_remote) {
    f.severity = Severity::kError;
    f.summary =
        "etcd is reached off loopback without TLS: anyone on the path can read and forge "
        "slice ownership";
    f.remedy = "set [cluster] ca, cert and key (etcd with --client-cert-auth)";
  } else if (!c.session_live) {
    f.severity = Severity::kWarning;
    f.summary = std::string("the cluster session is lost") +
                (c.shared_fenced ? ": no grants from shared slices until it rejoins" : "") +
                "; local pools still serve";
    f.remedy =
        "check that etcd is reachable from this host (cxlpoolctl cluster); the daemon "
        "rejoins by itself";
  } else if (c.slices_quarantined > 0) {
    f.severity = Severity::kWarning;
    f.summary = std::to_string(c.slices_quarantined) +
                " shared slice(s) quarantined: a host's session ended while it owned them";
    f.remedy =
        "cxlpoolctl cluster shows whose; once that host is known to be down, "
        "cxlpoolctl cluster fence HOST --confirm-down (docs/cluster.md)";
  } else {
    f.summary = "cluster session live, no quarantined slice";
  }
  return f;
}

std::vector<Finding> RunDoctor(const FileSystem& fs, const Topology& topo, const DoctorInputs& in) {
  return {CheckThp(fs),
          CheckHugepages(topo),
          CheckCxlMovable(topo),
          CheckMemlock(in),
          CheckUnpooledNodes(topo, in),
          CheckMemfdNoexec(fs),
          CheckDumpable(in),
          CheckJournal(in),
          CheckSocket(in),
          CheckNvidiaDriver(fs),
          CheckReserve(in),
          CheckReserveBelowLow(in),
          CheckCluster(in)};
}

Severity WorstSeverity(const std::vector<Finding>& findings) {
  Severity worst = Severity::kOk;
  for (const auto& f : findings) worst = std::max(worst, f.severity);
  return worst;
}

SocketFacts StatSocket(const std::string& path) {
  SocketFacts s;
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return s;
  s.exists = true;
  s.is_socket = S_ISSOCK(st.st_mode);
  s.mode = st.st_mode & 07777;
  s.uid = st.st_uid;
  s.gid = st.st_gid;
  if (group* g = ::getgrgid(st.st_gid))
    s.group_name = g->gr_name;
  else
    s.group_name = std::to_string(st.st_gid);
  return s;
}

}  // namespace cxlpool
