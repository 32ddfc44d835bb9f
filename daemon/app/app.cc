#include "app.h"

#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <future>
#include <map>
#include <optional>
#include <random>
#include <set>

#include "config/config.h"
#include "cxlpool/common/clock.h"
#include "cxlpool/common/fs.h"
#include "cxlpool/common/log.h"
#include "cxlpool/common/proc.h"
#include "cxlpool/common/strings.h"
#include "cxlpool/proto/frame.h"
#include "cxlpool/topology/discover.h"
#include "handler/daemon_handler.h"
#include "handler/limit_metrics.h"
#include "http/http_server.h"
#include "lease/lease_manager.h"
#include "lease/restart.h"
#include "lease/thread_priority.h"
#include "pool/node_memory_watch.h"
#include "pool/pool.h"
#include "recovery.h"
#include "reload/reload.h"
#include "sd.h"
#include "server/server.h"
#include "tiering/damon_sampler.h"
#include "tiering/engine.h"
#include "tiering/lease_adapter.h"
#include "tiering/migrator.h"
#include "tiering/sampler.h"

namespace cxlpool {
namespace {

std::string RandomHex(int bytes) {
  std::random_device rd;
  std::string s;
  static const char* kHex = "0123456789abcdef";
  for (int i = 0; i < bytes; ++i) {
    unsigned v = rd() & 0xff;
    s += kHex[v >> 4];
    s += kHex[v & 15];
  }
  return s;
}

// Raises RLIMIT_MEMLOCK as far as allowed: pinned leases count against it.
void RaiseMemlock(uint64_t want) {
  // CAP_IPC_LOCK in the effective set: mlock ignores RLIMIT_MEMLOCK.
  if (HaveEffectiveCapability(CAP_IPC_LOCK)) return;
  struct rlimit rl;
  if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0) return;
  struct rlimit inf = {RLIM_INFINITY, RLIM_INFINITY};
  if (setrlimit(RLIMIT_MEMLOCK, &inf) == 0) return;  // privileged
  if (rl.rlim_cur != rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_MEMLOCK, &rl) != 0) return;
  }
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want) {
    CXLPOOL_LOG(kWarning)
        << "RLIMIT_MEMLOCK is " << HumanBytes(rl.rlim_cur) << " but pinned pools may hold "
        << HumanBytes(want)
        << "; leases beyond it are refused (raise LimitMEMLOCK or set pin = false)";
  }
}

Status EnsureParentDir(const std::string& path) {
  auto slash = path.rfind('/');
  if (slash == std::string::npos || slash == 0) return Status::Ok();
  std::string dir = path.substr(0, slash);
  struct stat st;
  if (::stat(dir.c_str(), &st) == 0) return Status::Ok();
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return Status::FromErrno(errno, "create socket directory " + dir);
  }
  return Status::Ok();
}

std::optional<gid_t> ResolveGroup(const std::string& name) {
  if (name.empty()) return std::nullopt;
  if (auto n = ParseU64(name)) return static_cast<gid_t>(*n);
  struct group gr, *res = nullptr;
  char buf[4096];
  if (getgrnam_r(name.c_str(), &gr, buf, sizeof buf, &res) != 0 || res == nullptr) {
    return std::nullopt;
  }
  return res->gr_gid;
}

// Background mode (no --foreground, not under systemd): fork; the child
// carries on in a new session with its working directory at / and stdin and
// stdout on /dev/null; the parent exits 0 once the child is serving, 1 if it
// failed to start. The child keeps the launcher's stderr until it is ready, so
// a start-up error still reaches the terminal; FinishDaemonize then moves
// logging to syslog and stderr to /dev/null.
int Daemonize(int* ready_fd) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return -1;
  pid_t pid = ::fork();
  if (pid < 0) return -1;
  if (pid > 0) {
    ::close(p[1]);
    char c = 0;
    ssize_t n = ::read(p[0], &c, 1);
    std::_Exit(n == 1 && c == 'R' ? 0 : 1);
  }
  ::close(p[0]);
  ::setsid();
  if (::chdir("/") != 0) return -1;
  int devnull = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  if (devnull >= 0) {
    ::dup2(devnull, 0);
    ::dup2(devnull, 1);
    ::close(devnull);
  }
  *ready_fd = p[1];
  return 0;
}

void FinishDaemonize(int ready_fd) {
  LogToSyslog("cxlpoold");
  int devnull = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  if (devnull >= 0) {
    ::dup2(devnull, 2);
    ::close(devnull);
  }
  (void)!::write(ready_fd, "R", 1);
  ::close(ready_fd);
}

// Paths from the command line, made absolute before the background mode's
// chdir("/") (the config path is read again on SIGHUP).
void MakeAbsolute(std::string* path) {
  if (path->empty() || (*path)[0] == '/') return;
  char cwd[4096];
  if (::getcwd(cwd, sizeof cwd) != nullptr) *path = std::string(cwd) + "/" + *path;
}

// Raises RLIMIT_NOFILE's soft limit to the hard one (each lease holds an fd)
// and returns it (1M for "unlimited").
uint64_t RaiseFdLimit() {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 1024;
  if (rl.rlim_cur < rl.rlim_max) {
    struct rlimit up = {rl.rlim_max, rl.rlim_max};
    if (setrlimit(RLIMIT_NOFILE, &up) == 0) rl = up;
  }
  return rl.rlim_cur == RLIM_INFINITY ? (1u << 20) : static_cast<uint64_t>(rl.rlim_cur);
}

// The fd table is split: connections and fds in transit take what the
// server limits allow them (ServerLimits::FdsReserved), leases the rest.
// Also reads vm.max_map_count (each lease holds a mapping).
LeaseManager::DaemonLimits DaemonLimitsNow(const FileSystem& proc, uint64_t nofile,
                                           const ServerLimits& server) {
  LeaseManager::DaemonLimits l;
  l.max_fds = nofile - server.FdsReserved();
  if (auto m = proc.ReadTrimmed("/proc/sys/vm/max_map_count"); m.ok()) {
    if (auto v = ParseU64(*m)) l.max_maps = *v;
  }
  CXLPOOL_LOG(kInfo) << "fds: RLIMIT_NOFILE " << nofile << ", " << server.FdsReserved()
                     << " kept for " << server.max_connections << " connections and "
                     << server.max_fds << " fds in transit, " << l.max_fds
                     << " for leases; vm.max_map_count " << l.max_maps;
  return l;
}

}  // namespace

Result<ServerLimits> ResolveLimits(const LimitsConfig& c, uint64_t nofile) {
  ServerLimits l = ServerLimits::ForFdLimit(nofile);
  // A whole-daemon limit set alone brings its per-uid share and reserve along.
  if (c.max_connections) {
    l.max_connections = *c.max_connections;
    l.max_connections_per_uid = std::max<uint64_t>(1, l.max_connections / 4);
    l.reserved_connections = l.max_connections / 16;
  }
  if (c.max_requests) {
    l.max_requests = *c.max_requests;
    l.max_requests_per_uid = std::max<uint64_t>(1, l.max_requests / 4);
  }
  if (c.max_queued_bytes) {
    l.max_queued_bytes = *c.max_queued_bytes;
    l.max_queued_bytes_per_uid = l.max_queued_bytes / 4;
  }
  if (c.max_fds) {
    l.max_fds = *c.max_fds;
    l.max_fds_per_uid = l.max_fds / 4;
  }
  auto set = [](const std::optional<uint64_t>& v, uint64_t* out) {
    if (v) *out = *v;
  };
  set(c.max_connections_per_uid, &l.max_connections_per_uid);
  set(c.reserved_connections, &l.reserved_connections);
  set(c.max_requests_per_uid, &l.max_requests_per_uid);
  set(c.max_requests_per_connection, &l.max_requests_per_connection);
  set(c.max_queued_bytes_per_uid, &l.max_queued_bytes_per_uid);
  set(c.max_queued_bytes_per_connection, &l.max_queued_bytes_per_connection);
  set(c.max_fds_per_frame, &l.max_fds_per_frame);
  if (!c.max_fds_per_uid && c.max_fds) {
    l.max_fds_per_uid = std::max(l.max_fds_per_uid, l.max_fds_per_frame);
  }
  set(c.max_fds_per_uid, &l.max_fds_per_uid);
  set(c.max_request_bytes, &l.max_request_bytes);
  if (c.hello_timeout) l.hello_timeout = *c.hello_timeout;
  if (c.idle_timeout) l.idle_timeout = *c.idle_timeout;
  if (c.frame_timeout) l.frame_timeout = *c.frame_timeout;
  if (c.send_timeout) l.send_timeout = *c.send_timeout;
  if (c.max_busy_per_uid) l.max_busy_per_uid = *c.max_busy_per_uid;
  CXLPOOL_RETURN_IF_ERROR(l.Validate(wire::kDefaultMaxFrameBytes));
  // What is left of the fd table must hold some leases.
  if (l.FdsReserved() + 256 > nofile) {
    return Status(Code::kInvalidArgument,
                  "limits: " + std::to_string(l.max_connections) +
                      " connections (2 fds each) and max_fds = " + std::to_string(l.max_fds) +
                      " take " + std::to_string(l.FdsReserved()) + " of RLIMIT_NOFILE " +
                      std::to_string(nofile) +
                      ", leaving under 256 for leases; lower them or raise LimitNOFILE=");
  }
  return l;
}

std::optional<std::chrono::milliseconds> ParseGracePeriod(const std::string& text) {
  std::string_view t = text;
  uint64_t scale = 1000;
  if (EndsWith(t, "ms")) {
    scale = 1;
    t.remove_suffix(2);
  } else if (EndsWith(t, "s")) {
    t.remove_suffix(1);
  }
  auto v = ParseU64(t);
  if (!v || *v > 3600ull * 1000) return std::nullopt;
  return std::chrono::milliseconds(*v * scale);
}

int RunDaemon(const DaemonFlags& command_line) {
  DaemonFlags flags = command_line;
  for (std::string* p : {&flags.config, &flags.socket, &flags.sysfs_root, &flags.state_dir}) {
    MakeAbsolute(p);
  }
  ::prctl(PR_SET_DUMPABLE, 0);  // no /proc/<pid>/fd access to lease memfds
  std::signal(SIGPIPE, SIG_IGN);

  auto cfg = flags.config.empty() ? ParseConfig(DefaultConfigText(), "<default>")
                                  : LoadConfigFile(flags.config);
  if (!cfg.ok()) {
    CXLPOOL_LOG(kError) << cfg.status().ToString();
    return 2;
  }
  LogLevel level = cfg->log_level;
  if (!flags.log_level.empty() && !ParseLogLevel(flags.log_level, &level)) {
    CXLPOOL_LOG(kError) << "--log-level: unknown level '" << flags.log_level
                        << "' (debug, info, warning, error)";
    return 2;
  }
  SetLogLevel(level);
  const uint64_t nofile = RaiseFdLimit();
  Result<ServerLimits> limits = ResolveLimits(cfg->limits, nofile);
  if (!limits.ok()) {
    std::fprintf(stderr, "cxlpoold: %s: %s\n",
                 flags.config.empty() ? "<default>" : flags.config.c_str(),
                 limits.status().message().c_str());
    return 2;
  }
  if (flags.check_config) {
    for (const auto& w : cfg->warnings) std::fprintf(stderr, "cxlpoold: warning: %s\n", w.c_str());
    std::printf("config OK\n");
    return 0;
  }
  for (const auto& w : cfg->warnings) CXLPOOL_LOG(kWarning) << "config: " << w;
  std::optional<gid_t> socket_group = ResolveGroup(cfg->socket_group);
  if (!cfg->socket_group.empty() && !socket_group) {
    CXLPOOL_LOG(kError) << "daemon.socket_group: no such group '" << cfg->socket_group
                        << "' (create it, or set socket_group = \"\")";
    return 2;
  }
  std::string socket_path = !flags.socket.empty() ? flags.socket
                            : !cfg->socket_path.empty()
                                ? cfg->socket_path
                                : DefaultSocketPath(::geteuid(), ::getenv("XDG_RUNTIME_DIR"));
  int ready_fd = -1;
  // Under systemd (Type=notify) the main pid must stay: never fork there.
  bool under_systemd = ::getenv("NOTIFY_SOCKET") != nullptr || ::getenv("INVOCATION_ID") != nullptr;
  if (!flags.foreground && !under_systemd && Daemonize(&ready_fd) != 0) {
    CXLPOOL_LOG(kError) << "background mode: " << std::strerror(errno)
                        << " (--foreground runs without forking)";
    return 1;
  }

  std::string root = flags.sysfs_root.empty() ? FsRootFromEnv("/") : flags.sysfs_root;
  std::unique_ptr<FileSystem> fs = MakeRootedFileSystem(root);
  std::unique_ptr<FileSystem> proc = MakeRootedFileSystem("/");
  boost::asio::thread_pool workers(cfg->workers);
  boost::asio::thread_pool stock(cfg->stock_workers);
  if (Status st = SetPoolPriority(stock, cfg->stock_workers, cfg->stock_nice, cfg->stock_idle);
      !st.ok()) {
    CXLPOOL_LOG(kWarning) << "reserve refill threads keep the daemon's priority: " << st.ToString();
  }

  // Topology discovery scans sysfs (and may load NVML): a worker does it.
  std::promise<Topology> topo_promise;
  auto topo_future = topo_promise.get_future();
  boost::asio::post(workers, [&] { topo_promise.set_value(DiscoverTopology(*fs)); });
  Topology topo = topo_future.get();
  for (const auto& w : topo.warnings) CXLPOOL_LOG(kWarning) << "topology: " << w;

  std::unique_ptr<DaxControl> dax;
  if (!cfg->devdax.empty()) {
    auto d = MakeLibDaxctlControl();
    if (!d.ok()) {
      CXLPOOL_LOG(kError) << "devdax pools configured but " << d.status().ToString();
      return 1;
    }
    dax = std::move(*d);
  }
  std::vector<std::string> warnings;
  PoolBuildOptions popts;
  popts.bind = fs->IsThisSystem();
  popts.fs = fs.get();
  popts.dax = dax.get();
  auto pools = BuildPools(topo, *cfg, popts, &warnings);
  for (const auto& w : warnings) CXLPOOL_LOG(kWarning) << w;
  if (!pools.ok()) {
    CXLPOOL_LOG(kError) << "pools: " << pools.status().ToString();
    return 1;
  }
  uint64_t pinned = 0;
  for (const auto& p : *pools) {
    CXLPOOL_LOG(kInfo) << "pool " << p->name() << ": " << p->kind() << ", "
                       << HumanBytes(p->capacity()) << ", " << p->backing();
    pinned += p->capacity();
  }
  if (pools->empty()) {
    if (auto why = NoMemorySizeKnown(topo)) {
      CXLPOOL_LOG(kError) << "topology of " << root << ": " << *why;
      return 1;
    }
    CXLPOOL_LOG(kWarning) << "no pools: every allocation will be refused";
  }
  RaiseMemlock(pinned);
  // The reserves together never ask for more than this kernel can give,
  // whatever the sysfs root says (docs/daemon.md, "The warm reserve").
  std::vector<ExtentReserve*> reserves;
  for (const auto& p : *pools) {
    if (ExtentReserve* r = p->reserve()) reserves.push_back(r);
  }
  ClampReservesToKernel(reserves, *proc);

  // Restart support: the journal in the state directory, the fd store.
  Notifier notifier;
  std::vector<InheritedFd> inherited = TakeListenFds();
  std::map<uint64_t, std::vector<UniqueFd>> stored = TakeLeaseFds(&inherited);
  StateDirChoice sdc;
  sdc.flag = flags.state_dir;
  sdc.config = cfg->state_dir;
  sdc.state_directory_env = ::getenv("STATE_DIRECTORY");
  sdc.fallback = DefaultStateDir(::geteuid(), ::getenv("XDG_STATE_HOME"), ::getenv("HOME"));
  sdc.socket_from_flag = !flags.socket.empty();
  std::string state_dir = ChooseStateDir(sdc);
  std::chrono::milliseconds grace(uint64_t{cfg->grace_period_s} * 1000);
  if (!flags.grace_period.empty()) {
    auto g = ParseGracePeriod(flags.grace_period);
    if (!g) {
      CXLPOOL_LOG(kError) << "--grace-period: '" << flags.grace_period
                          << "' is not a duration (30, 30s, 500ms)";
      return 2;
    }
    grace = *g;
  }
  std::unique_ptr<ProcessProbe> probe = MakeProcProbe();
  std::unique_ptr<JournalStore> store;
  if (!state_dir.empty()) {
    auto s = JournalStore::Open(state_dir, &notifier);
    if (!s.ok()) {
      CXLPOOL_LOG(kError) << "state directory: " << s.status().ToString();
      return 1;
    }
    store = std::move(*s);
  } else {
    CXLPOOL_LOG(kWarning) << "no state directory (--socket without --state-dir): leases will "
                             "not survive a restart of this daemon";
  }

  boost::asio::io_context io;
  // Daemon time per uid (limits.max_busy_per_uid): the server charges its
  // loop time, the lease manager its workers'; declared first, it outlives
  // both.
  BusyBudget busy(limits->max_busy_per_uid);
  LeaseManager leases(&topo, std::move(*pools), QuotaTable(cfg->quotas), io.get_executor(),
                      workers.get_executor(), &SystemClock::Get());
  leases.SetDaemonLimits(DaemonLimitsNow(*proc, nofile, *limits));
  leases.SetStockExecutor(stock.get_executor(), cfg->stock_workers);
  leases.SetInlineMax(cfg->inline_max_bytes);
  leases.SetMaxExtentBytes(cfg->max_extent_bytes);
  leases.SetBuildConcurrency(cfg->workers);
  leases.SetBusyHooks(
      [&busy](uid_t uid, std::chrono::nanoseconds d) {
        busy.Charge(uid, d, std::chrono::steady_clock::now());
      },
      [&busy](uid_t uid) { return busy.Throttled(uid, std::chrono::steady_clock::now()); });
  // Long-term pinned leases on a mixed node are moved into its kernel zones
  // before the grant; only where the topology is this machine's.
  if (fs->IsThisSystem()) leases.SetPinSettle(proc.get());
  // Leases survive every exit of this function (an error return as well as
  // SIGTERM): destroyed before `leases`, this hands them over, never frees.
  struct HandOverAtExit {
    LeaseManager* leases;
    ~HandOverAtExit() {
      if (leases != nullptr) leases->HandOver();
    }
  } hand_over{store ? &leases : nullptr};
  if (store) {
    leases.EnableRestart(store.get(), probe.get(), store->next_id());
    // Stored fds the journal has no record of are accounted again there
    // (journal damage); those that cannot be are dropped from the store.
    leases.Recover(store->JournalledLeases(), std::move(stored), grace, HealthOf(store->state()));
    CXLPOOL_LOG(kInfo) << "lease journal: " << store->state().records_replayed
                       << " records replayed from " << state_dir << "/leases.journal";
  }

  // Tenants: priority reserves, and the live quota changes (cxlpoolctl quota
  // set) kept in the state directory over the config file's rules.
  leases.mutable_quotas()->SetReserves(cfg->priority_reserves);
  if (!state_dir.empty()) {
    if (Status st = leases.mutable_quotas()->OpenStore(state_dir + "/quotas.toml"); !st.ok()) {
      CXLPOOL_LOG(kError) << "quota store: " << st.ToString() << " (fix or remove the file)";
      return 1;
    }
  } else {
    CXLPOOL_LOG(kWarning) << "no state directory: quota changes will not survive a restart";
  }

  HandlerOptions hopts;
  hopts.admin_gid = cfg->admin_gid;
  hopts.instance_id = RandomHex(16);
  hopts.max_frame_bytes = wire::kDefaultMaxFrameBytes;
  hopts.max_fds_per_frame = static_cast<uint32_t>(limits->max_fds_per_frame);
  hopts.max_request_bytes = limits->max_request_bytes;
  hopts.topology_is_local = fs->IsThisSystem();
  DaemonHandler handler(&leases, proc.get(), hopts);

  ServerOptions sopts;
  sopts.socket_mode = cfg->socket_mode;
  sopts.socket_group = socket_group;
  sopts.fs = proc.get();
  int metrics_fd = -1;  // cxlpoold-metrics.socket's listening TCP socket
  sopts.limits = *limits;
  sopts.busy = &busy;
  for (auto& inh : inherited) {
    if (sopts.listen_fd < 0 && IsListeningUnixSocket(inh.fd.get())) {
      sopts.listen_fd = inh.fd.Release();
    } else if (metrics_fd < 0 && inh.fd && MetricsHttpServer::IsListeningTcpSocket(inh.fd.get())) {
      metrics_fd = inh.fd.Release();
    }
  }
  if (sopts.listen_fd < 0) {
    sopts.socket_path = socket_path;
    if (Status st = EnsureParentDir(socket_path); !st.ok()) {
      CXLPOOL_LOG(kError) << st.ToString();
      return 1;
    }
  }
  auto server = Server::Create(io, sopts, &handler);
  if (!server.ok()) {
    CXLPOOL_LOG(kError) << "socket " << socket_path << ": " << server.status().ToString();
    return 1;
  }
  Server* srv = server->get();
  handler.SetPush([srv](ConnectionId c, Reply r) { return srv->Push(c, std::move(r)); });
  handler.SetExtraStats(
      [srv](std::map<std::string, uint64_t>* counters, std::map<std::string, uint64_t>* gauges) {
        ExportLimitStats(srv->stats(), counters, gauges);
      },
      [srv](MetricsRegistry* reg) {
        ExportLimitMetrics(srv->stats(), srv->options().limits, reg);
      });

  // Tiering (docs/daemon.md, "Tiering"): moves run on their own thread, the
  // engine's state on the loop.
  TieringRequests tiering_requests(&leases);
  tiering_requests.SetPush([srv](ConnectionId c, Reply r) { return srv->Push(c, std::move(r)); });
  tiering_requests.SetLoop(io.get_executor());
  tiering::LeaseManagerTable tiering_table(&leases, fs->IsThisSystem());
  std::unique_ptr<tiering::Migrator> migrator = tiering::MakeKernelMigrator();
  std::unique_ptr<tiering::KernelFileWriter> kernel_writer = tiering::MakeKernelFileWriter();
  boost::asio::thread_pool tiering_thread(1);
  if (Status st = SetPoolPriority(tiering_thread, 1, cfg->stock_nice, false, "cxlpool-tier");
      !st.ok()) {
    CXLPOOL_LOG(kInfo) << "tiering thread keeps the daemon's priority: " << st.ToString();
  }
  // Also without the engine: it pushes LeaseEvent "moved" when a long-term
  // pin moved a lease, and answers the tiering messages with UNSUPPORTED.
  handler.SetTiering(&tiering_requests);
  std::unique_ptr<tiering::TieringEngine> tiering_engine;
  if (cfg->tiering.enabled) {
    tiering_engine = std::make_unique<tiering::TieringEngine>(
        &tiering_table, migrator.get(), &tiering_requests, &SystemClock::Get(), io.get_executor(),
        tiering_thread.get_executor(), tiering::TieringOptionsFrom(cfg->tiering));
    // On-demand rounds for urgent hints are charged to the hints' senders.
    tiering_engine->SetBusyCharge([&busy](uid_t uid, std::chrono::nanoseconds d) {
      busy.Charge(uid, d, std::chrono::steady_clock::now());
    });
    tiering::KernelAccess access = tiering::DetectKernelAccess(*proc, *proc);
    if (fs->IsThisSystem()) {
      // Names the kdamond this daemon makes, so that one a killed daemon left
      // is taken back after the restart (docs/daemon.md, "Access sampling").
      tiering::DamonOptions damon;
      if (!state_dir.empty()) damon.owner_file = state_dir + "/damon.owner";
      if (auto sampler = tiering::ChooseSampler(cfg->tiering.sampling, &access, proc.get(),
                                                proc.get(), kernel_writer.get(), damon)) {
        tiering_engine->SetSampler(std::move(sampler));
      }
    }
    CXLPOOL_LOG(kInfo) << "tiering: " << access.ToString();
    tiering_engine->SetKernelAccess(access.ToString());
    if (!tiering::HaveCapSysNice()) {
      tiering_engine->DisableMoves(
          "no CAP_SYS_NICE: pages that other processes map cannot be moved (give cxlpoold "
          "CAP_SYS_NICE; the systemd unit does)");
      CXLPOOL_LOG(kWarning) << "tiering: no CAP_SYS_NICE; temperatures are tracked, nothing moves";
    }
    tiering_requests.SetEngine(tiering_engine.get());
    tiering_engine->Start();
  }

  // Optional loopback HTTP endpoint for Prometheus: the socket systemd passed
  // (cxlpoold-metrics.socket), else metrics.http_listen.
  std::unique_ptr<MetricsHttpServer> http;
  auto render = [&handler] { return handler.MetricsText(); };
  if (metrics_fd >= 0) {
    auto h = MetricsHttpServer::FromListeningFd(io, metrics_fd, render);
    if (!h.ok()) {
      CXLPOOL_LOG(kError) << h.status().ToString()
                          << " (fix ListenStream= in cxlpoold-metrics.socket)";
      return 2;
    }
    http = std::move(*h);
    CXLPOOL_LOG(kInfo) << "metrics on http://127.0.0.1:" << http->port()
                       << "/metrics (socket from systemd)";
    if (!cfg->metrics_http_listen.empty()) {
      CXLPOOL_LOG(kWarning) << "metrics.http_listen " << cfg->metrics_http_listen
                            << " is not used: systemd passed the metrics socket";
    }
  } else if (!cfg->metrics_http_listen.empty()) {
    auto h = MetricsHttpServer::Create(io, cfg->metrics_http_listen, render);
    if (!h.ok()) {
      // A configuration that cannot be applied: exit 2, which the unit's
      // RestartPreventExitStatus= does not restart (no restart loop).
      CXLPOOL_LOG(kError) << h.status().ToString()
                          << (under_systemd
                                  ? " (cxlpoold.service has no network of its own: remove "
                                    "metrics.http_listen, run `systemctl enable --now "
                                    "cxlpoold-metrics.socket` while cxlpoold is stopped, then "
                                    "start cxlpoold)"
                                  : " (choose a free loopback port in metrics.http_listen, or "
                                    "set it to \"\" to turn the endpoint off)");
      return 2;
    }
    http = std::move(*h);
    CXLPOOL_LOG(kInfo) << "metrics on http://" << cfg->metrics_http_listen << "/metrics";
  }

  // SIGHUP: re-read the config file; a bad one is logged and the old kept.
  DaemonConfig running = *cfg;
  // Node pools follow memory onlined or offlined after start: MemTotal is
  // re-read every daemon.memory_watch_interval (and on SIGHUP).
  NodeMemoryWatch memory_watch(fs.get(), topo);
  boost::asio::steady_timer memory_timer(io);
  std::function<void()> arm_memory_watch = [&] {
    memory_timer.cancel();
    if (running.memory_watch_interval.count() == 0) return;
    memory_timer.expires_after(running.memory_watch_interval);
    memory_timer.async_wait([&](const boost::system::error_code& ec) {
      if (ec) return;
      // Growth leaves room to stock; a shrink may have dropped ready stock.
      if (memory_watch.Check(running, leases.pools()).resized) leases.StartRefills();
      arm_memory_watch();
    });
  };
  boost::asio::signal_set hup(io, SIGHUP);
  std::function<void()> arm_hup = [&] {
    hup.async_wait([&](const boost::system::error_code& ec, int) {
      if (ec) return;
      ReloadOptions ro;
      ro.log_level_from_flag = !flags.log_level.empty();
      ro.memory = &memory_watch;
      auto interval = running.memory_watch_interval;
      auto r = ReloadConfigFile(flags.config, topo, &leases, &running, ro);
      if (running.memory_watch_interval != interval) arm_memory_watch();
      if (!r.ok()) {
        CXLPOOL_LOG(kError) << "SIGHUP: config not reloaded, the running one is kept: "
                            << r.status().ToString();
      } else {
        for (const auto& a : r->applied) CXLPOOL_LOG(kInfo) << "SIGHUP: " << a;
        for (const auto& k : r->kept) CXLPOOL_LOG(kWarning) << "SIGHUP: " << k;
      }
      arm_hup();
    });
  };
  arm_hup();

  boost::asio::steady_timer watchdog(io);
  std::function<void()> arm_watchdog = [&] {
    if (notifier.watchdog_interval_usec() == 0) return;
    watchdog.expires_after(std::chrono::microseconds(notifier.watchdog_interval_usec()));
    watchdog.async_wait([&](const boost::system::error_code& ec) {
      if (ec) return;
      (void)notifier.Watchdog();
      arm_watchdog();
    });
  };
  boost::asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    CXLPOOL_LOG(kInfo) << "signal " << sig << ": shutting down";
    (void)notifier.Stopping("shutting down");
    if (tiering_engine) tiering_engine->Stop();
    if (store) {
      // Restart support: the clients keep their leases (memory, mappings)
      // and reclaim them from the next daemon; the journal keeps them.
      leases.HandOver();
    }
    srv->Stop();  // without restart support every connection's leases are released
    leases.Shutdown();
    watchdog.cancel();
    memory_timer.cancel();
    hup.cancel();
    if (http) http->Stop();
    io.stop();
  });

  leases.StartRefills();
  arm_watchdog();
  arm_memory_watch();
  std::string where = sopts.socket_path.empty() ? "inherited socket" : sopts.socket_path;
  CXLPOOL_LOG(kInfo) << "cxlpoold listening on " << where;
  (void)notifier.Ready("serving on " + where);
  if (ready_fd >= 0) FinishDaemonize(ready_fd);
  io.run();
  if (tiering_engine) tiering_engine->Stop();
  tiering_thread.join();  // a move stops after its current step
  tiering_requests.SetEngine(nullptr);
  tiering_engine.reset();
  server->reset();
  workers.join();  // builds in flight finish; their results are dropped
  stock.join();
  return 0;
}

}  // namespace cxlpool
