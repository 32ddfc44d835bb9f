// The shared pieces of cxlpool-bench: report, stats, daemon process, wire
// client, bare baseline server, node facts. See bench.h.
#include <fcntl.h>
#include <numaif.h>
#include <sched.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <deque>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bench.h"
#include "cxlpool/common/fs.h"
#include "cxlpool/proto/codec.h"
#include "cxlpool/proto/ipc.h"
#include "cxlpool/proto/socket.h"
#include "lease/placement.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace cxlpool::bench {

// ---------------------------------------------------------------- report

bool Options::Wants(const std::string& p) const {
  return only.empty() || std::find(only.begin(), only.end(), p) != only.end();
}

std::string Row::Verdict() const {
  if (skipped) return "skipped";
  if (goal_op.empty() || baseline <= 0) return "info";
  double r = Ratio();
  bool met = goal_op == "le" ? r <= goal : r >= goal;
  return met ? "met" : "NOT met";
}

void Report::Skip(const std::string& figure, const std::string& metric, const std::string& why) {
  Row r;
  r.figure = figure;
  r.metric = metric;
  r.skipped = true;
  r.note = why;
  Add(std::move(r));
}

namespace {

std::string Num(double v) {
  char buf[64];
  if (v == 0) return "0";
  double a = std::fabs(v);
  if (a >= 1e6) {
    std::snprintf(buf, sizeof buf, "%.3g", v);
  } else if (a >= 100) {
    std::snprintf(buf, sizeof buf, "%.0f", v);
  } else if (a >= 1) {
    std::snprintf(buf, sizeof buf, "%.2f", v);
  } else {
    std::snprintf(buf, sizeof buf, "%.3g", v);
  }
  return buf;
}

std::string GoalText(const Row& r) {
  if (r.goal_op.empty()) return "-";
  return std::string(r.goal_op == "le" ? "<= " : ">= ") + Num(r.goal) + "x";
}

}  // namespace

std::string Report::Table() const {
  std::vector<std::vector<std::string>> cells;
  cells.push_back({"fig", "metric", "cxlpool", "baseline", "unit", "ratio", "goal", "verdict"});
  for (const Row& r : rows) {
    if (r.skipped) {
      cells.push_back({r.figure, r.metric, "-", "-", "-", "-", "-", "skipped"});
    } else {
      cells.push_back({r.figure, r.metric, Num(r.value), r.baseline > 0 ? Num(r.baseline) : "-",
                       r.unit, r.baseline > 0 ? Num(r.Ratio()) + "x" : "-", GoalText(r),
                       r.Verdict()});
    }
  }
  std::vector<size_t> w(cells[0].size(), 0);
  for (const auto& row : cells)
    for (size_t i = 0; i < row.size(); ++i) w[i] = std::max(w[i], row[i].size());
  std::ostringstream out;
  for (size_t k = 0; k < cells.size(); ++k) {
    const auto& row = cells[k];
    out << "|";
    for (size_t i = 0; i < row.size(); ++i) {
      out << " " << row[i] << std::string(w[i] - row[i].size(), ' ') << " |";
    }
    out << "\n";
    if (k == 0) {
      out << "|";
      for (size_t i = 0; i < row.size(); ++i) out << std::string(w[i] + 2, '-') << "|";
      out << "\n";
    }
  }
  bool any_note = false;
  for (const Row& r : rows) {
    if (r.note.empty()) continue;
    if (!any_note) out << "\nNotes:\n";
    any_note = true;
    out << "- " << r.figure << " " << r.metric << ": " << r.note << "\n";
  }
  for (const std::string& n : notes) out << "- " << n << "\n";
  return out.str();
}

std::string Report::Json(const Options& o) const {
  nlohmann::json j;
  j["command"] = o.command_line;
  j["quick"] = o.quick;
  j["node"] = o.node;
  j["mode"] = o.spawn() ? "spawned daemon" : "running daemon at " + o.socket;
  auto& arr = j["results"] = nlohmann::json::array();
  for (const Row& r : rows) {
    nlohmann::json e;
    e["figure"] = r.figure;
    e["metric"] = r.metric;
    e["verdict"] = r.Verdict();
    e["note"] = r.note;
    if (!r.skipped) {
      e["value"] = r.value;
      e["unit"] = r.unit;
      if (r.baseline > 0) {
        e["baseline"] = r.baseline;
        e["ratio"] = r.Ratio();
      } else {
        e["baseline"] = nullptr;
        e["ratio"] = nullptr;
      }
      if (!r.goal_op.empty()) {
        e["goal"] = {{"op", r.goal_op}, {"ratio", r.goal}};
      } else {
        e["goal"] = nullptr;
      }
    }
    arr.push_back(std::move(e));
  }
  j["notes"] = notes;
  return j.dump(2);
}

double Stats::PercentileUs(double q) const {
  if (v_.empty()) return 0;
  if (!sorted_) {
    std::sort(v_.begin(), v_.end());
    sorted_ = true;
  }
  size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(v_.size())));
  if (rank == 0) rank = 1;
  if (rank > v_.size()) rank = v_.size();
  return static_cast<double>(v_[rank - 1]) / 1000.0;
}

uint64_t NowNs() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

std::string HumanSize(uint64_t b) {
  if (b >= kGiB && b % kGiB == 0) return std::to_string(b / kGiB) + " GiB";
  if (b >= kMiB && b % kMiB == 0) return std::to_string(b / kMiB) + " MiB";
  if (b >= kKiB && b % kKiB == 0) return std::to_string(b / kKiB) + " KiB";
  return std::to_string(b) + " B";
}

void SettleVmstat() {
  std::string v = ReadFirstLine("/proc/sys/vm/stat_interval");
  int s = v.empty() ? 1 : std::max(1, std::atoi(v.c_str()));
  ::usleep(static_cast<useconds_t>(2 * s) * 1000000u + 200000u);
}

std::string ReadFirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return "";
  return line;
}

// ---------------------------------------------------------------- children

namespace {

constexpr int kMaxChildren = 64;
std::atomic<pid_t> g_children[kMaxChildren];

void Track(pid_t pid) {
  for (auto& c : g_children) {
    pid_t expected = 0;
    if (c.compare_exchange_strong(expected, pid)) return;
  }
}

void Untrack(pid_t pid) {
  for (auto& c : g_children) {
    pid_t expected = pid;
    if (c.compare_exchange_strong(expected, 0)) return;
  }
}

// SIGTERM, then SIGKILL after `grace_ms`; reaps.
void TermAndReap(pid_t pid, int grace_ms) {
  if (pid <= 0) return;
  ::kill(pid, SIGTERM);
  for (int waited = 0; waited < grace_ms; waited += 10) {
    pid_t r = ::waitpid(pid, nullptr, WNOHANG);
    if (r == pid || (r < 0 && errno == ECHILD)) {
      Untrack(pid);
      return;
    }
    ::usleep(10000);
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  Untrack(pid);
}

std::string MakeTempDir(const char* prefix) {
  std::string tmpl = std::string("/tmp/") + prefix + "-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) return "";
  return buf.data();
}

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

void KillAllChildren() {
  for (auto& c : g_children) {
    pid_t p = c.exchange(0);
    if (p > 0) {
      ::kill(p, SIGKILL);
      ::waitpid(p, nullptr, 0);
    }
  }
}

// ---------------------------------------------------------------- daemon

DaemonProc::~DaemonProc() { Stop(); }

Status DaemonProc::Start(const std::string& binary, const DaemonConfig& cfg) {
  if (::access(binary.c_str(), X_OK) != 0) {
    return Status(Code::kNotFound, "no cxlpoold at " + binary + " (build it, or pass --daemon)");
  }
  dir_ = MakeTempDir("cxlpool-bench");
  if (dir_.empty()) return Status::FromErrno(errno, "mkdtemp");
  socket_ = dir_ + "/cxlpool.sock";
  std::string config = dir_ + "/cxlpoold.toml";
  {
    std::ofstream out(config);
    out << ConfigText(cfg);
    if (!out) return Status(Code::kIo, "cannot write " + config);
  }
  std::string log = dir_ + "/cxlpoold.log";
  // A state directory, so the daemon journals every grant and release as it
  // does in production (an ad-hoc --socket instance would run without one).
  std::string state = dir_ + "/state";
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) return Status::FromErrno(errno, "fork");
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    ::execl(binary.c_str(), binary.c_str(), "--config", config.c_str(), "--socket", socket_.c_str(),
            "--state-dir", state.c_str(), "--foreground", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  pid_ = pid;
  Track(pid);
  for (int i = 0; i < 600; ++i) {  // 30 s
    int st = 0;
    if (::waitpid(pid_, &st, WNOHANG) == pid_) {
      Untrack(pid_);
      pid_ = -1;
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
  std::ifstream in(dir_ + "/cxlpoold.log");
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (all.size() > 600) all = all.substr(all.size() - 600);
  while (!all.empty() && all.back() == '\n') all.pop_back();
  return all.empty() ? "(empty log)" : all;
}

void DaemonProc::Stop() {
  if (pid_ > 0) TermAndReap(pid_, 10000);
  pid_ = -1;
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
    dir_.clear();
  }
}

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
    // Released leases still being reclaimed (daemons since the reclaim moved
    // off the event loop) hold memory a baseline may need.
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

// ---------------------------------------------------------------- bare server

namespace {

struct BareMsg {
  uint32_t op;
  uint32_t pad;
  uint64_t id;
};
static_assert(sizeof(BareMsg) == 16);

// One connection's grants not yet released (memfd mode), oldest first.
using Built = std::deque<std::unique_ptr<Backing>>;

// The fd answering op 1: the shared memfd, or a new one built like the
// daemon's (kept in `built` until its release). -1 when the build failed.
int GrantFd(int shared_memfd, const std::optional<MemfdSpec>& build, Built* built) {
  if (!build) return shared_memfd;
  auto b = CreateMemfdBacking(*build);
  if (!b.ok()) return -1;
  built->push_back(std::move(*b));
  return built->back()->fd();
}

[[noreturn]] void BareServe(int lfd, std::optional<MemfdSpec> build, bool prebuilt) {
  int memfd = -1;
  std::unique_ptr<Backing> ready;  // prebuilt: the one memfd every grant hands over
  if (prebuilt) {
    auto b = CreateMemfdBacking(*build);
    if (!b.ok()) ::_exit(3);
    ready = std::move(*b);
    memfd = ready->fd();
    build.reset();
  } else {
    memfd = ::memfd_create("cxlpool-bench-bare", MFD_CLOEXEC);
    if (memfd < 0 || ::ftruncate(memfd, 4096) != 0) ::_exit(2);
  }
  int ep = ::epoll_create1(EPOLL_CLOEXEC);
  if (ep < 0) ::_exit(2);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = lfd;
  ::epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev);
  std::map<int, std::string> pending;  // partial requests per connection
  std::map<int, Built> built;
  epoll_event evs[64];
  for (;;) {
    int n = ::epoll_wait(ep, evs, 64, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      ::_exit(2);
    }
    for (int i = 0; i < n; ++i) {
      int fd = evs[i].data.fd;
      if (fd == lfd) {
        for (;;) {
          int c = ::accept4(lfd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
          if (c < 0) break;
          epoll_event cev{};
          cev.events = EPOLLIN;
          cev.data.fd = c;
          ::epoll_ctl(ep, EPOLL_CTL_ADD, c, &cev);
        }
        continue;
      }
      char buf[4096];
      ssize_t got = ::recv(fd, buf, sizeof buf, 0);
      if (got <= 0) {
        if (got < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        ::epoll_ctl(ep, EPOLL_CTL_DEL, fd, nullptr);
        ::close(fd);
        pending.erase(fd);
        built.erase(fd);  // reclaims what the client never released
        continue;
      }
      std::string& p = pending[fd];
      p.append(buf, static_cast<size_t>(got));
      while (p.size() >= sizeof(BareMsg)) {
        BareMsg m;
        std::memcpy(&m, p.data(), sizeof m);
        p.erase(0, sizeof m);
        iovec iov{&m, sizeof m};
        msghdr mh{};
        mh.msg_iov = &iov;
        mh.msg_iovlen = 1;
        alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int))];
        if (m.op == 1) {
          int give = GrantFd(memfd, build, &built[fd]);
          if (give < 0) ::_exit(3);  // the client sees EOF: the run fails, not a number
          mh.msg_control = ctl;
          mh.msg_controllen = sizeof ctl;
          cmsghdr* cm = CMSG_FIRSTHDR(&mh);
          cm->cmsg_level = SOL_SOCKET;
          cm->cmsg_type = SCM_RIGHTS;
          cm->cmsg_len = CMSG_LEN(sizeof(int));
          std::memcpy(CMSG_DATA(cm), &give, sizeof(int));
        } else if (build) {
          Built& mine = built[fd];
          if (!mine.empty()) {
            mine.front()->Reclaim();
            mine.pop_front();
          }
        }
        // The CPU the reply leaves from: the client tells same-CPU pairs
        // from cross-CPU ones (BareClient::last_same_cpu).
        m.pad = static_cast<uint32_t>(::sched_getcpu());
        // One request in flight per client: a 16-byte reply always fits.
        ::sendmsg(fd, &mh, MSG_NOSIGNAL);
      }
    }
  }
}

}  // namespace

MemfdSpec FloorSpec(uint64_t size, int node, bool pin, bool thp, const char* name) {
  MemfdSpec spec;
  spec.size_bytes = size;
  spec.numa_node = node;
  spec.pin = pin;
  spec.thp = thp;
  spec.name = name;
  return spec;
}

BareServer::~BareServer() { Stop(); }

Status BareServer::Start(std::optional<MemfdSpec> build) { return Fork(std::move(build), false); }

Status BareServer::StartPrebuilt(const MemfdSpec& spec) { return Fork(spec, true); }

Status BareServer::Fork(std::optional<MemfdSpec> build, bool prebuilt) {
  dir_ = MakeTempDir("cxlpool-bench-bare");
  if (dir_.empty()) return Status::FromErrno(errno, "mkdtemp");
  socket_ = dir_ + "/bare.sock";
  int lfd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (lfd < 0) return Status::FromErrno(errno, "socket");
  UniqueFd l(lfd);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  if (socket_.size() >= sizeof sa.sun_path) return Status(Code::kInvalidArgument, "path too long");
  std::memcpy(sa.sun_path, socket_.c_str(), socket_.size() + 1);
  if (::bind(lfd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    return Status::FromErrno(errno, "bind " + socket_);
  }
  if (::listen(lfd, 1024) != 0) return Status::FromErrno(errno, "listen");
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) return Status::FromErrno(errno, "fork");
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    BareServe(lfd, std::move(build), prebuilt);
  }
  pid_ = pid;
  Track(pid);
  return Status();
}

void BareServer::Stop() {
  if (pid_ > 0) TermAndReap(pid_, 2000);
  pid_ = -1;
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
    dir_.clear();
  }
}

Result<BareClient> BareClient::Connect(const std::string& socket_path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::FromErrno(errno, "socket");
  BareClient c;
  c.sock_.Reset(fd);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::memcpy(sa.sun_path, socket_path.c_str(),
              std::min(socket_path.size() + 1, sizeof sa.sun_path - 1));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    return Status::FromErrno(errno, "connect " + socket_path);
  }
  return c;
}

Status BareClient::GrantRoundTrip() { return RoundTrip(1, true); }

Result<UniqueFd> BareClient::GrantFd() {
  UniqueFd fd;
  CXLPOOL_RETURN_IF_ERROR(RoundTrip(1, true, &fd));
  return fd;
}
Status BareClient::ReleaseRoundTrip() { return RoundTrip(2, false); }

Status BareClient::RoundTrip(uint32_t op, bool expect_fd, UniqueFd* keep) {
  BareMsg m{op, 0, next_id_++};
  if (::send(sock_.get(), &m, sizeof m, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof m)) {
    return Status::FromErrno(errno, "bare send");
  }
  BareMsg r{};
  size_t got = 0;
  int fds_seen = 0;
  while (got < sizeof r) {
    iovec iov{reinterpret_cast<char*>(&r) + got, sizeof r - got};
    alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int) * 2)];
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = ctl;
    mh.msg_controllen = sizeof ctl;
    ssize_t n = ::recvmsg(sock_.get(), &mh, MSG_CMSG_CLOEXEC);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return Status(Code::kUnavailable, "bare server closed the connection");
    }
    for (cmsghdr* cm = CMSG_FIRSTHDR(&mh); cm != nullptr; cm = CMSG_NXTHDR(&mh, cm)) {
      if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
        size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < k; ++i) {
          int fd;
          std::memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof fd);
          if (keep != nullptr && fds_seen == 0) {
            keep->Reset(fd);
          } else {
            ::close(fd);
          }
          ++fds_seen;
        }
      }
    }
    got += static_cast<size_t>(n);
  }
  last_client_cpu_ = ::sched_getcpu();
  last_server_cpu_ = static_cast<int>(r.pad);
  if (r.id != m.id) return Status(Code::kProtocol, "bare reply id mismatch");
  if ((fds_seen == 1) != expect_fd) return Status(Code::kProtocol, "bare reply fd count wrong");
  return Status();
}

std::optional<bool> BareClient::last_same_cpu() const {
  if (last_client_cpu_ < 0 || last_server_cpu_ < 0) return std::nullopt;
  return last_client_cpu_ == last_server_cpu_;
}

// ---------------------------------------------------------------- node facts

Status BindToNode(void* p, uint64_t len, int node) {
  unsigned long mask[16] = {};
  if (node < 0 || node >= static_cast<int>(sizeof(mask) * 8)) {
    return Status(Code::kInvalidArgument, "node out of range");
  }
  mask[node / (8 * sizeof(unsigned long))] |= 1ul << (node % (8 * sizeof(unsigned long)));
  if (::mbind(p, len, MPOL_BIND, mask, sizeof(mask) * 8, 0) != 0) {
    return Status::FromErrno(errno, "mbind");
  }
  return Status();
}

void PopulateWrite(void* p, uint64_t len, uint64_t page) {
  if (::madvise(p, len, MADV_POPULATE_WRITE) == 0) return;
  auto* c = static_cast<volatile char*>(p);
  for (uint64_t off = 0; off < len; off += page) c[off] = 0;
}

const char* PagesName(Pages p) {
  switch (p) {
    case Pages::k4K:
      return "4k";
    case Pages::kThp:
      return "thp";
    case Pages::kHugetlb:
      return "hugetlb";
  }
  return "?";
}

uint64_t CounterOf(const proto::StatsReply& s, const std::string& k) {
  auto it = s.counters().find(k);
  return it == s.counters().end() ? 0 : it->second;
}

Result<uint64_t> PopulateYourselfNs(uint64_t size, int node, Pages pages) {
  // A hugetlb mapping is whole 2 MiB pages (and munmap of a part fails).
  if (pages == Pages::kHugetlb) size = (size + 2 * kMiB - 1) / (2 * kMiB) * (2 * kMiB);
  uint64_t t0 = NowNs();
  int flags = MAP_PRIVATE | MAP_ANONYMOUS | (pages == Pages::kHugetlb ? MAP_HUGETLB : 0);
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, flags, -1, 0);
  if (p == MAP_FAILED) return Status::FromErrno(errno, "mmap baseline");
  Status st = BindToNode(p, size, node);
  if (st.ok() && pages != Pages::kHugetlb) {
    ::madvise(p, size, pages == Pages::kThp ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  }
  if (st.ok()) PopulateWrite(p, size, pages == Pages::kHugetlb ? 2 * kMiB : 4 * kKiB);
  uint64_t t1 = NowNs();
  ::munmap(p, size);
  if (!st.ok()) return st;
  return t1 - t0;
}

bool ShmemThpAllowed() {
  std::string mode = ReadFirstLine("/sys/kernel/mm/transparent_hugepage/shmem_enabled");
  auto open = mode.find('['), close = mode.find(']');
  std::string cur =
      open != std::string::npos && close > open ? mode.substr(open + 1, close - open - 1) : "";
  return cur == "advise" || cur == "always" || cur == "within_size" || cur == "force";
}

uint64_t FreeHugepages(int node) {
  std::string v = ReadFirstLine("/sys/devices/system/node/node" + std::to_string(node) +
                                "/hugepages/hugepages-2048kB/free_hugepages");
  return v.empty() ? 0 : std::strtoull(v.c_str(), nullptr, 10);
}

namespace {

// "Key:   123 kB" lines -> bytes; `prefix` is stripped first ("Node 0 ").
std::map<std::string, uint64_t> ParseKb(std::istream& in, const std::string& prefix) {
  std::map<std::string, uint64_t> out;
  std::string line;
  while (std::getline(in, line)) {
    if (!prefix.empty() && line.rfind(prefix, 0) == 0) line = line.substr(prefix.size());
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    std::istringstream rest(line.substr(colon + 1));
    uint64_t v = 0;
    std::string unit;
    if (!(rest >> v)) continue;
    rest >> unit;
    out[key] = unit == "kB" ? v * 1024 : v;
  }
  return out;
}

}  // namespace

Result<std::map<std::string, uint64_t>> NodeMeminfo(int node) {
  std::string path = "/sys/devices/system/node/node" + std::to_string(node) + "/meminfo";
  std::ifstream in(path);
  if (!in) return Status(Code::kNotFound, "cannot read " + path);
  return ParseKb(in, "Node " + std::to_string(node) + " ");
}

Result<std::map<std::string, uint64_t>> ProcStatus(pid_t pid) {
  std::string path = "/proc/" + std::to_string(pid) + "/status";
  std::ifstream in(path);
  if (!in) return Status(Code::kNotFound, "cannot read " + path);
  return ParseKb(in, "");
}

Result<uint64_t> SmapsField(const void* addr, uint64_t len, const std::string& field) {
  std::ifstream in("/proc/self/smaps");
  if (!in) return Status(Code::kNotFound, "cannot read /proc/self/smaps");
  uintptr_t lo = reinterpret_cast<uintptr_t>(addr), hi = lo + len;
  uint64_t total = 0;
  bool inside = false, found = false;
  std::string line;
  while (std::getline(in, line)) {
    uintptr_t a = 0, b = 0;
    if (std::sscanf(line.c_str(), "%" SCNxPTR "-%" SCNxPTR, &a, &b) == 2 &&
        line.find(':') > line.find(' ')) {
      inside = a < hi && b > lo;
      continue;
    }
    if (inside && line.rfind(field + ":", 0) == 0) {
      uint64_t kb = 0;
      std::sscanf(line.c_str() + field.size() + 1, "%" SCNu64, &kb);
      total += kb * 1024;
      found = true;
    }
  }
  if (!found) return Status(Code::kNotFound, "no " + field + " for that mapping in smaps");
  return total;
}

}  // namespace cxlpool::bench
