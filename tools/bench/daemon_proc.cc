// The daemon under test (DaemonProc, PhaseSocket) and the blocking protocol
// client the figures drive it with (WireClient). See bench.h.
#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>

#include "bench.h"
#include "cxlpool/common/fs.h"
#include "lease/placement.h"

namespace cxlpool::bench {

namespace {

// The daemon's warm reserve of `bytes`, as [pools] keys: the one place that
// knows how the daemon is told. Refilled after every grant (low = high), so
// each sample finds it full once the daemon is idle.
std::string ReserveToml(const DaemonConfig& c) {
  std::ostringstream t;
  t << "reserve_low = " << c.reserve_bytes << "\nreserve_high = " << c.reserve_bytes << "\n";
  return t.str();
}

std::string ConfigText(const DaemonConfig& c) {
  std::ostringstream t;
  t << "[daemon]\nsocket_mode = \"0600\"\nlog_level = \"warning\"\nworkers = " << c.workers
    << "\n\n[pools]\ncapacity = \"" << c.capacity << "\"\npin = " << (c.pin ? "true" : "false")
    << "\nthp = " << (c.thp ? "true" : "false") << "\nhugetlb = " << (c.hugetlb ? "true" : "false")
    << "\n"
    << ReserveToml(c);
  if (!c.extra_toml.empty()) t << "\n" << c.extra_toml << "\n";
  return t.str();
}

}  // namespace

// ---------------------------------------------------------------- daemon

DaemonProc::~DaemonProc() { Stop(); }

Status DaemonProc::Start(const std::string& binary, const DaemonConfig& cfg) {
  if (::access(binary.c_str(), X_OK) != 0) {
    return Status(Code::kNotFound, "no cxlpoold at " + binary + " (build it, or pass --daemon)");
  }
  CXLPOOL_RETURN_IF_ERROR(child_.MakeDir("cxlpool-bench"));
  return Launch(binary, cfg);
}

void DaemonProc::Kill() { child_.Kill(); }

Status DaemonProc::Restart(const std::string& binary, const DaemonConfig& cfg) {
  if (child_.dir().empty()) return Status(Code::kInternal, "Restart before Start");
  child_.Kill();
  return Launch(binary, cfg);
}

Status DaemonProc::Launch(const std::string& binary, const DaemonConfig& cfg) {
  const std::string& dir = child_.dir();
  socket_ = dir + "/cxlpool.sock";
  std::string config = dir + "/cxlpoold.toml";
  {
    std::ofstream out(config);
    out << ConfigText(cfg);
    if (!out) return Status(Code::kIo, "cannot write " + config);
  }
  std::string log = dir + "/cxlpoold.log";
  // A state directory, so the daemon journals every grant and release as it
  // does in production (an ad-hoc --socket instance would run without one).
  std::string state = dir + "/state";
  auto in_child = child_.Fork();
  if (!in_child.ok()) return in_child.status();
  if (*in_child) {
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    ::execl(binary.c_str(), binary.c_str(), "--config", config.c_str(), "--socket", socket_.c_str(),
            "--state-dir", state.c_str(), "--foreground", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  for (int i = 0; i < 600; ++i) {  // 30 s
    if (child_.Exited()) {
      return Status(Code::kUnavailable, "cxlpoold exited during start: " + LogTail());
    }
    if (::access(socket_.c_str(), F_OK) == 0) {
      auto c = WireClient::Connect(socket_);
      if (c.ok()) return c->WaitIdle();
    }
    ::usleep(50000);
  }
  return Status(Code::kUnavailable, "cxlpoold did not accept within 30 s: " + LogTail());
}

std::string DaemonProc::LogTail() const {
  std::ifstream in(child_.dir() + "/cxlpoold.log");
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (all.size() > 600) all = all.substr(all.size() - 600);
  while (!all.empty() && all.back() == '\n') all.pop_back();
  return all.empty() ? "(empty log)" : all;
}

void DaemonProc::Stop() { child_.Stop(); }

Result<std::string> PhaseSocket(const Options& o, const DaemonConfig& cfg, DaemonProc* owned) {
  if (!o.spawn()) return o.socket;
  DaemonConfig c = cfg;
  c.pin = c.pin && o.pin;
  Status st = owned->Start(o.daemon_path, c);
  if (!st.ok()) return st;
  return owned->socket();
}

// ---------------------------------------------------------------- wire client

Result<WireClient> WireClient::Connect(const std::string& socket_path) {
  wire::BlockingClientOptions opts;
  opts.name = "cxlpool-bench";
  opts.timeout_ms = 300000;
  auto c = wire::BlockingClient::Connect(socket_path, opts);
  if (!c.ok()) return c.status();
  return WireClient(std::move(*c));
}

Result<proto::LeaseInfo> WireClient::Alloc(uint64_t size, int node, bool hugetlb, UniqueFd* fd) {
  proto::AllocRequest a;
  a.set_size_bytes(size);
  if (node >= 0) a.set_numa_node(node);
  a.set_hugetlb(hugetlb);
  a.set_strict(true);
  a.set_label("cxlpool-bench");
  proto::AllocReply r;
  std::vector<UniqueFd> fds;
  Status st = client_.Call(a, &r, &fds);
  if (!st.ok()) return st;
  if (fd != nullptr) {
    if (fds.size() != 1) {
      return Status(Code::kProtocol,
                    "alloc reply with " + std::to_string(fds.size()) + " extent fds, expected 1");
    }
    *fd = std::move(fds[0]);
  }
  return r.lease();
}

std::optional<bool> WireClient::LoopOnMyCpu() const {
  if (client_.peer_pid() <= 0) return std::nullopt;
  static const std::unique_ptr<FileSystem> proc = MakeRootedFileSystem("/");
  std::optional<int> loop = LastCpuOf(*proc, client_.peer_pid());
  int mine = ::sched_getcpu();
  if (!loop || mine < 0) return std::nullopt;
  return *loop == mine;
}

Status WireClient::Release(uint64_t id) {
  proto::ReleaseRequest q;
  q.set_lease_id(id);
  proto::ReleaseReply r;
  return client_.Call(q, &r);
}

Result<proto::StatsReply> WireClient::GetStats() {
  proto::StatsRequest q;
  proto::StatsReply r;
  Status st = client_.Call(q, &r);
  if (!st.ok()) return st;
  return r;
}

Result<proto::PoolsReply> WireClient::GetPools() {
  proto::PoolsRequest q;
  proto::PoolsReply r;
  Status st = client_.Call(q, &r);
  if (!st.ok()) return st;
  return r;
}

Status WireClient::WaitIdle(int timeout_ms) {
  uint64_t deadline = NowNs() + static_cast<uint64_t>(timeout_ms) * 1000000ull;
  for (;;) {
    auto s = GetStats();
    if (!s.ok()) return s.status();
    auto it = s->gauges().find("pending_builds");
    if (it == s->gauges().end()) {
      return Status(Code::kUnsupported, "daemon STATS has no pending_builds gauge");
    }
    // Released leases still being reclaimed hold memory a baseline may need.
    auto rec = s->gauges().find("pending_reclaims");
    bool reclaiming = rec != s->gauges().end() && rec->second != 0;
    if (it->second == 0 && !reclaiming) return Status();
    if (NowNs() > deadline) {
      return Status(Code::kUnavailable,
                    "warm reserve still building or leases still reclaiming after " +
                        std::to_string(timeout_ms / 1000) + " s");
    }
    ::usleep(2000);
  }
}

}  // namespace cxlpool::bench
