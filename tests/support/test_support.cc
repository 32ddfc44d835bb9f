#include "test_support.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "cxlpool/proto/socket.h"

namespace cxlpool::testsupport {

namespace {
std::string BinaryDir() {
  const char* bin = std::getenv("CXLPOOL_BINARY_DIR");
  return bin != nullptr ? bin : ".";
}
}  // namespace

std::string DaemonBinary() { return BinaryDir() + "/daemon/cxlpoold"; }

std::string CtlBinary() { return BinaryDir() + "/tools/cxlpoolctl"; }

void Skip(const std::string& why) {
  std::fprintf(stderr, "SKIPPED: %s\n", why.c_str());
  std::fflush(stderr);
  std::exit(77);
}

void SkipWithoutDaemon() {
  if (::access(DaemonBinary().c_str(), X_OK) != 0) Skip("no cxlpoold at " + DaemonBinary());
  if (::access("/sys/devices/system/node/node0/meminfo", R_OK) != 0) {
    Skip("no /sys/devices/system/node/node0/meminfo");
  }
}

bool IsRoot() { return ::geteuid() == 0; }

// ---- RawClient ----

const proto::HelloReply RawClient::kNoHello;

Result<RawClient> RawClient::Connect(const std::string& socket, const std::string& name,
                                     int timeout_ms) {
  auto fd = wire::ConnectUnix(socket);
  if (!fd.ok()) return fd.status();
  return Handshake(std::move(*fd), name, timeout_ms);
}

Result<RawClient> RawClient::Handshake(UniqueFd sock, const std::string& name, int timeout_ms) {
  wire::BlockingClientOptions o;
  o.name = name;
  o.timeout_ms = timeout_ms;
  auto c = wire::BlockingClient::Handshake(std::move(sock), o);
  if (!c.ok()) return c.status();
  RawClient r;
  r.c_.emplace(std::move(*c));
  return r;
}

namespace {
Status OneFd(const char* what, std::vector<UniqueFd>& fds, UniqueFd* fd) {
  if (fds.size() != 1) {
    return Status(Code::kProtocol, std::string(what) + " reply with " + std::to_string(fds.size()) +
                                       " fds, expected 1");
  }
  if (fd != nullptr) *fd = std::move(fds[0]);
  return Status::Ok();
}
}  // namespace

Result<proto::LeaseInfo> RawClient::Alloc(uint64_t size, UniqueFd* fd, const std::string& name,
                                          const std::vector<uint32_t>& acl_uids) {
  proto::AllocRequest a;
  a.set_size_bytes(size);
  a.set_name(name);
  for (auto u : acl_uids) a.add_acl_uids(u);
  proto::AllocReply r;
  std::vector<UniqueFd> fds;
  CXLPOOL_RETURN_IF_ERROR(Call(a, &r, &fds));
  CXLPOOL_RETURN_IF_ERROR(OneFd("alloc", fds, fd));
  return r.lease();
}

Result<proto::LeaseInfo> RawClient::Attach(const std::string& name, UniqueFd* fd,
                                           std::optional<uint32_t> owner_uid) {
  proto::AttachRequest a;
  a.set_name(name);
  if (owner_uid) a.set_owner_uid(*owner_uid);
  proto::AttachReply r;
  std::vector<UniqueFd> fds;
  CXLPOOL_RETURN_IF_ERROR(Call(a, &r, &fds));
  CXLPOOL_RETURN_IF_ERROR(OneFd("attach", fds, fd));
  return r.lease();
}

Result<proto::LeaseEvent> RawClient::NextEvent() {
  if (!c_) return NotConnected();
  return c_->NextEvent();
}

Status RawClient::Release(uint64_t id) {
  proto::ReleaseRequest r;
  r.set_lease_id(id);
  proto::ReleaseReply out;
  return Call(r, &out);
}

// ---- Accounting ----

uint64_t Accounting::Gauge(const std::string& k) const {
  auto it = gauges.find(k);
  return it == gauges.end() ? 0 : it->second;
}

uint64_t Accounting::Counter(const std::string& k) const {
  auto it = counters.find(k);
  return it == counters.end() ? 0 : it->second;
}

uint64_t Accounting::LeaseBytes() const {
  uint64_t sum = 0;
  for (const auto& [id, l] : leases) sum += l.size_bytes();
  return sum;
}

std::string Accounting::Overcommit() const {
  std::ostringstream why;
  for (const auto& p : pools) {
    // Released leases still being reclaimed are used too, and so is the
    // warm reserve (ready, building, retiring).
    const proto::PoolReserve& r = p.reserve();
    const uint64_t reserve = r.ready_bytes() + r.building_bytes() + r.retiring_bytes();
    if (p.leased_bytes() + reserve + p.reclaiming_bytes() > p.capacity_bytes()) {
      why << "pool " << p.name() << " overcommitted: leased " << p.leased_bytes() << " + reserve "
          << reserve << " + reclaiming " << p.reclaiming_bytes() << " > capacity "
          << p.capacity_bytes() << "; ";
    }
  }
  if (Gauge("leased_bytes") + Gauge("reserve_bytes") + Gauge("reclaiming_bytes") >
      Gauge("capacity_bytes")) {
    why << "gauges overcommitted: leased " << Gauge("leased_bytes") << " + reserve "
        << Gauge("reserve_bytes") << " + reclaiming " << Gauge("reclaiming_bytes") << " > capacity "
        << Gauge("capacity_bytes") << "; ";
  }
  for (const auto& q : quotas) {
    if ((q.max_bytes() != 0 && q.used_bytes() > q.max_bytes()) ||
        (q.max_leases() != 0 && q.used_leases() > q.max_leases())) {
      why << "quota " << q.scope() << " " << q.subject() << " tier '" << q.tier()
          << "' exceeded: bytes " << q.used_bytes() << "/" << q.max_bytes() << ", leases "
          << q.used_leases() << "/" << q.max_leases() << "; ";
    }
  }
  return why.str();
}

std::string Accounting::Inconsistencies() const {
  std::ostringstream why;
  why << Overcommit();
  if (Gauge("live_leases") != leases.size()) {
    why << "gauge live_leases " << Gauge("live_leases") << " but " << leases.size()
        << " leases listed; ";
  }
  uint64_t pool_leased = 0, pool_count = 0;
  for (const auto& p : pools) {
    pool_leased += p.leased_bytes();
    pool_count += p.lease_count();
  }
  // Bytes being built for a request count as leased in the pools view, so
  // the list can only be at most what the pools say.
  if (LeaseBytes() > pool_leased) {
    why << "leases listed hold " << LeaseBytes() << " B but pools report " << pool_leased
        << " B leased; ";
  }
  if (Gauge("pending_builds") == 0) {
    if (LeaseBytes() != pool_leased) {
      why << "no build pending, yet leases hold " << LeaseBytes() << " B and pools " << pool_leased
          << " B; ";
    }
    if (Gauge("leased_bytes") != LeaseBytes()) {
      why << "gauge leased_bytes " << Gauge("leased_bytes") << " but leases hold " << LeaseBytes()
          << " B; ";
    }
  }
  if (pool_count != leases.size()) {
    why << "pools count " << pool_count << " leases, list has " << leases.size() << "; ";
  }
  return why.str();
}

Result<Accounting> ReadAccounting(RawClient& admin) {
  Accounting a;
  proto::ListLeasesRequest lr;
  lr.set_all(true);
  proto::ListLeasesReply ll;
  CXLPOOL_RETURN_IF_ERROR(admin.Call(lr, &ll));
  for (const auto& l : ll.leases()) {
    if (!a.leases.emplace(l.id(), l).second) {
      return Status(Code::kInternal, "lease id " + std::to_string(l.id()) + " listed twice");
    }
  }
  proto::StatsReply st;
  CXLPOOL_RETURN_IF_ERROR(admin.Call(proto::StatsRequest(), &st));
  a.counters = {st.counters().begin(), st.counters().end()};
  a.gauges = {st.gauges().begin(), st.gauges().end()};
  proto::PoolsReply pr;
  CXLPOOL_RETURN_IF_ERROR(admin.Call(proto::PoolsRequest(), &pr));
  a.pools = {pr.pools().begin(), pr.pools().end()};
  proto::QuotasReply qr;
  CXLPOOL_RETURN_IF_ERROR(admin.Call(proto::QuotasRequest(), &qr));
  a.quotas = {qr.quotas().begin(), qr.quotas().end()};
  return a;
}

// ---- Daemon ----

Daemon::~Daemon() {
  Kill();
  if (!dir_.empty()) {
    // Everything in it: config, socket, log, and any state dir put there.
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

Status Daemon::MakeDir() {
  if (!dir_.empty()) return Status::Ok();
  char tmpl[] = "/tmp/cxlpool-test-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return Status::FromErrno(errno, "mkdtemp");
  dir_ = tmpl;
  ::chmod(dir_.c_str(), 0755);
  socket_ = dir_ + "/cxlpool.sock";
  return Status::Ok();
}

Status Daemon::WriteConfig(const std::string& config) {
  CXLPOOL_RETURN_IF_ERROR(MakeDir());
  std::ofstream f(config_path(), std::ios::trunc);
  f << config;
  f.close();
  if (!f) return Status(Code::kIo, "cannot write " + config_path());
  return Status::Ok();
}

Status Daemon::Start(const std::string& config, const std::vector<std::string>& extra_args) {
  CXLPOOL_RETURN_IF_ERROR(WriteConfig(config));
  args_ = extra_args;
  return Spawn();
}

Status Daemon::Restart() {
  Kill();
  return Spawn();
}

std::string Daemon::Log() const { return ReadFileOrEmpty(log_path()); }

Status Daemon::Spawn() {
  std::vector<std::string> argv = {"cxlpoold", "--foreground", "--socket",
                                   socket_,    "--config",     config_path()};
  argv.insert(argv.end(), args_.begin(), args_.end());
  std::string bin = DaemonBinary();
  if (!prefix_.empty()) {
    argv[0] = bin;
    argv.insert(argv.begin(), prefix_.begin(), prefix_.end());
  }
  std::string log = log_to_file_ ? log_path() : "";
  std::fflush(nullptr);
  pid_ = ::fork();
  if (pid_ < 0) return Status::FromErrno(errno, "fork");
  if (pid_ == 0) {
    if (!log.empty()) {
      int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
      if (fd >= 0) ::dup2(fd, 2);
    }
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    if (prefix_.empty()) {
      ::execv(bin.c_str(), cargv.data());
    } else {
      ::execvp(cargv[0], cargv.data());
    }
    std::_Exit(127);
  }
  bool up = PollUntil(
      [&] {
        if (!Alive()) return true;
        return RawClient::Connect(socket_, "stress-probe", 2000).ok();
      },
      10000, 5);
  std::string log_note = log_to_file_ ? ": " + Log() : "";
  if (!Alive()) return Status(Code::kUnavailable, "cxlpoold exited during start" + log_note);
  if (!up) return Status(Code::kUnavailable, "cxlpoold did not answer on " + socket_ + log_note);
  return Status::Ok();
}

bool Daemon::Alive() {
  if (pid_ <= 0) return false;
  int status = 0;
  pid_t r = ::waitpid(pid_, &status, WNOHANG);
  // ECHILD: someone else's waitpid(-1) reaped it.
  if (r == pid_ || (r < 0 && errno == ECHILD)) {
    pid_ = -1;
    return false;
  }
  return true;
}

Status Daemon::Stop() {
  if (pid_ <= 0) return Status(Code::kUnavailable, "cxlpoold is not running");
  ::kill(pid_, SIGTERM);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return Status::Ok();
  return Status(Code::kInternal, "cxlpoold ended with status " + std::to_string(status));
}

void Daemon::Kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

// ---- files and commands ----

TempDir::TempDir(const std::string& tag) {
  std::string tmpl = "/tmp/cxlpool-" + tag + "-XXXXXX";
  if (::mkdtemp(tmpl.data()) != nullptr) path = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  if (!path.empty()) std::filesystem::remove_all(path, ec);
}

std::string ReadFileOrEmpty(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

std::pair<int, std::string> RunShell(const std::string& cmd) {
  std::string out;
  std::fflush(nullptr);
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return {-1, ""};
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int rc = ::pclose(p);
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, out};
}

// ---- memory and process counters ----

namespace {
std::optional<uint64_t> FieldKb(const std::string& path, const std::string& field) {
  std::ifstream f(path);
  if (!f) return std::nullopt;
  std::string line;
  while (std::getline(f, line)) {
    // node meminfo: "Node 0 Shmem:   123 kB"; status: "VmLck:   0 kB"
    auto pos = line.find(field + ":");
    if (pos == std::string::npos) continue;
    if (pos > 0 && line[pos - 1] != ' ') continue;
    unsigned long long kb = 0;
    if (std::sscanf(line.c_str() + pos + field.size() + 1, "%llu", &kb) != 1) return std::nullopt;
    return kb * 1024;
  }
  return std::nullopt;
}
}  // namespace

std::optional<uint64_t> NodeMeminfoBytes(const std::string& field) {
  DIR* d = ::opendir("/sys/devices/system/node");
  if (d == nullptr) return std::nullopt;
  uint64_t sum = 0;
  bool any = false;
  while (dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n.rfind("node", 0) != 0 || n.size() < 5 || n.find_first_not_of("0123456789", 4) != n.npos)
      continue;
    auto v = FieldKb("/sys/devices/system/node/" + n + "/meminfo", field);
    if (v) {
      sum += *v;
      any = true;
    }
  }
  ::closedir(d);
  if (!any) return std::nullopt;
  return sum;
}

std::optional<uint64_t> ProcStatusBytes(pid_t pid, const std::string& field) {
  return FieldKb("/proc/" + std::to_string(pid) + "/status", field);
}

std::optional<size_t> CountFds(pid_t pid) {
  DIR* d = ::opendir(("/proc/" + std::to_string(pid) + "/fd").c_str());
  if (d == nullptr) return std::nullopt;
  size_t n = 0;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  ::closedir(d);
  return n;
}

std::string ThreadStates(pid_t pid) {
  const std::string task = "/proc/" + std::to_string(pid) + "/task";
  DIR* d = ::opendir(task.c_str());
  if (d == nullptr) return task + ": " + std::strerror(errno) + "\n";
  std::string out;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    const std::string dir = task + "/" + e->d_name;
    std::string stat = ReadFileOrEmpty(dir + "/stat");
    std::string wchan = ReadFileOrEmpty(dir + "/wchan");
    // stat: "tid (comm) S ...": comm may hold spaces, so cut at the last ')'.
    size_t open = stat.find('('), close = stat.rfind(')');
    std::string comm = open != std::string::npos && close != std::string::npos && close > open
                           ? stat.substr(open + 1, close - open - 1)
                           : "?";
    char state = close != std::string::npos && close + 2 < stat.size() ? stat[close + 2] : '?';
    out.append(e->d_name).append(" ").append(comm).append(" ");
    out.push_back(state);
    out.append(" ").append(wchan.empty() ? "-" : wchan).append("\n");
  }
  ::closedir(d);
  return out;
}

// ---- processes ----

bool BecomeUid(uid_t uid) {
  return ::setgroups(0, nullptr) == 0 && ::setgid(uid) == 0 && ::setuid(uid) == 0;
}

int RunInChild(const std::function<int()>& fn, std::optional<uid_t> uid) {
  std::fflush(nullptr);
  pid_t p = ::fork();
  if (p < 0) return -1;
  if (p == 0) {
    if (uid && !BecomeUid(*uid)) std::_Exit(90);
    std::_Exit(fn());
  }
  int status = 0;
  ::waitpid(p, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

bool PollUntil(const std::function<bool()>& done, int limit_ms, int step_ms) {
  auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(limit_ms);
  for (;;) {
    if (done()) return true;
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(step_ms));
  }
}

uint64_t NowMicros() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

}  // namespace cxlpool::testsupport
