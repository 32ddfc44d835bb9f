#include "daemon.h"

#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <csignal>
#include <cstdlib>
#include <future>
#include <random>
#include <utility>

#include "cluster/cluster_metrics.h"
#include "cluster/host_summary.h"
#include "cxlpool/cluster/shared_device.h"
#include "cxlpool/common/clock.h"
#include "cxlpool/common/log.h"
#include "cxlpool/common/proc.h"
#include "cxlpool/common/strings.h"
#include "cxlpool/common/version.h"
#include "cxlpool/proto/frame.h"
#include "cxlpool/topology/discover.h"
#include "handler/limit_metrics.h"
#include "lease/thread_priority.h"
#include "reload/reload.h"
#include "tiering/damon_sampler.h"

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

Daemon::HandOverAtExit::~HandOverAtExit() {
  if (leases != nullptr) leases->HandOver();
}

Daemon::Daemon(DaemonSettings settings)
    : settings_(std::move(settings)), cfg_(settings_.config), running_(settings_.config) {}

Daemon::~Daemon() = default;

int Daemon::Start() {
  // The start order. Each step builds one component and adds it to
  // lifecycle_; a stop request stops them in reverse.
  // clang-format off
  static constexpr int (Daemon::*kSteps[])() = {
      &Daemon::StartThreads,      // fs views, lease builders, refill threads
      &Daemon::DiscoverTopology,
      &Daemon::BuildPools,
      &Daemon::OpenStateDir,      // journal, fd store, grace period
      &Daemon::StartLeases,
      &Daemon::StartServer,       // the handler and the listening socket
      &Daemon::StartTiering,
      &Daemon::StartMetricsHttp,
      &Daemon::StartMemoryWatch,  // periodic
      &Daemon::StartReload,       // SIGHUP
      &Daemon::StartWatchdog,     // periodic
      &Daemon::StartRefills,
      &Daemon::StartCluster,      // [cluster]: etcd session, shared slices
      &Daemon::StartSignals,      // SIGINT, SIGTERM
  };
  // clang-format on
  for (auto step : kSteps) {
    if (int code = (this->*step)(); code != 0) return code;
  }
  CXLPOOL_LOG(kInfo) << "cxlpoold listening on " << where_;
  (void)notifier_.Ready("serving on " + where_);
  return 0;
}

int Daemon::Run() {
  io_.run();
  lifecycle_.JoinAll();
  return 0;
}

void Daemon::RequestStop() {
  boost::asio::post(io_, [this] { Stop("stop requested"); });
}

void Daemon::Stop(const std::string& why) {
  if (stopping_) return;
  stopping_ = true;
  CXLPOOL_LOG(kInfo) << why << ": shutting down";
  (void)notifier_.Stopping("shutting down");
  lifecycle_.StopAll();
  io_.stop();
}

std::string Daemon::SysfsRoot() const {
  const std::string& root = settings_.flags.sysfs_root;
  return root.empty() ? FsRootFromEnv("/") : root;
}

// The sysfs view, the lease builders and the reserve's refill threads.
int Daemon::StartThreads() {
  fs_ = MakeRootedFileSystem(SysfsRoot());
  proc_ = MakeRootedFileSystem("/");
  workers_.emplace(cfg_.workers);
  stock_.emplace(cfg_.stock_workers);
  if (Status st = SetPoolPriority(*stock_, cfg_.stock_workers, cfg_.stock_nice, cfg_.stock_idle);
      !st.ok()) {
    CXLPOOL_LOG(kWarning) << "reserve refill threads keep the daemon's priority: " << st.ToString();
  }
  // Builds in flight finish; their results are dropped.
  lifecycle_.Started("threads", {.join = [this] {
                       workers_->join();
                       stock_->join();
                     }});
  return 0;
}

// Topology discovery scans sysfs (and may load NVML): a worker does it.
int Daemon::DiscoverTopology() {
  std::promise<Topology> topo_promise;
  auto topo_future = topo_promise.get_future();
  boost::asio::post(*workers_, [&] { topo_promise.set_value(cxlpool::DiscoverTopology(*fs_)); });
  topo_ = topo_future.get();
  for (const auto& w : topo_.warnings) CXLPOOL_LOG(kWarning) << "topology: " << w;
  lifecycle_.Started("topology");
  return 0;
}

int Daemon::BuildPools() {
  if (!cfg_.devdax.empty()) {
    auto d = MakeLibDaxctlControl();
    if (!d.ok()) {
      CXLPOOL_LOG(kError) << "devdax pools configured but " << d.status().ToString();
      return 1;
    }
    dax_ = std::move(*d);
  }
  std::vector<std::string> warnings;
  PoolBuildOptions popts;
  popts.bind = fs_->IsThisSystem();
  popts.fs = fs_.get();
  popts.dax = dax_.get();
  auto pools = cxlpool::BuildPools(topo_, cfg_, popts, &warnings);
  for (const auto& w : warnings) CXLPOOL_LOG(kWarning) << w;
  if (!pools.ok()) {
    CXLPOOL_LOG(kError) << "pools: " << pools.status().ToString();
    return 1;
  }
  pools_ = std::move(*pools);
  uint64_t pinned = 0;
  for (const auto& p : pools_) pinned += p->capacity();
  if (int code = BuildSharedPools(); code != 0) return code;
  for (const auto& p : pools_) {
    CXLPOOL_LOG(kInfo) << "pool " << p->name() << ": " << p->kind() << ", "
                       << HumanBytes(p->capacity()) << ", " << p->backing();
  }
  if (pools_.empty()) {
    if (auto why = NoMemorySizeKnown(topo_)) {
      CXLPOOL_LOG(kError) << "topology of " << SysfsRoot() << ": " << *why;
      return 1;
    }
    CXLPOOL_LOG(kWarning) << "no pools: every allocation will be refused";
  }
  RaiseMemlock(pinned);
  // The reserves together never ask for more than this kernel can give,
  // whatever the sysfs root says (docs/daemon.md, "The warm reserve").
  std::vector<ExtentReserve*> reserves;
  for (const auto& p : pools_) {
    if (ExtentReserve* r = p->reserve()) reserves.push_back(r);
  }
  ClampReservesToKernel(reserves, *proc_);
  lifecycle_.Started("pools");
  return 0;
}

// One pool per [[cluster.shared]] device, serving its slices (tier
// "shared"). Its capacity is the device's slices; which of them this host
// owns is the cluster's (StartCluster attaches it to slices_).
int Daemon::BuildSharedPools() {
  if (!cfg_.cluster.enabled() || cfg_.cluster.shared.empty()) return 0;
  slices_ = std::make_unique<SliceBroker>(std::chrono::milliseconds(1000));
  for (const SharedDeviceOptions& o : cfg_.cluster.shared) {
    auto dev = cluster::SharedDevice::Open(o.path, o.id, SysfsRoot());
    if (!dev.ok()) {
      CXLPOOL_LOG(kError) << "cluster: shared device " << o.path << ": " << dev.status().ToString();
      return 1;
    }
    const std::string name = SharedSlicePool::PoolName(o.path);
    for (const auto& p : pools_) {
      if (p->name() == name) {
        CXLPOOL_LOG(kError) << "cluster: shared device " << o.path << " would be pool " << name
                            << ", which exists already; give the devices different file names";
        return 1;
      }
    }
    const uint64_t capacity = (*dev)->data_bytes() / o.slice_bytes * o.slice_bytes;
    pools_.push_back(
        std::make_unique<SharedSlicePool>(o.path, o.slice_bytes, capacity, slices_.get()));
  }
  return 0;
}

// Restart support: the journal in the state directory, the fd store.
int Daemon::OpenStateDir() {
  const DaemonFlags& flags = settings_.flags;
  inherited_ = TakeListenFds();
  stored_ = TakeLeaseFds(&inherited_);
  StateDirChoice sdc;
  sdc.flag = flags.state_dir;
  sdc.config = cfg_.state_dir;
  sdc.state_directory_env = ::getenv("STATE_DIRECTORY");
  sdc.fallback = DefaultStateDir(::geteuid(), ::getenv("XDG_STATE_HOME"), ::getenv("HOME"));
  sdc.socket_from_flag = !flags.socket.empty();
  state_dir_ = ChooseStateDir(sdc);
  grace_ = std::chrono::milliseconds(uint64_t{cfg_.grace_period_s} * 1000);
  if (!flags.grace_period.empty()) {
    auto g = ParseGracePeriod(flags.grace_period);
    if (!g) {
      CXLPOOL_LOG(kError) << "--grace-period: '" << flags.grace_period
                          << "' is not a duration of at most 1h (30, 30s, 500ms, 2m)";
      return 2;
    }
    grace_ = *g;
  }
  probe_ = MakeProcProbe();
  if (!state_dir_.empty()) {
    auto s = JournalStore::Open(state_dir_, &notifier_);
    if (!s.ok()) {
      CXLPOOL_LOG(kError) << "state directory: " << s.status().ToString();
      return 1;
    }
    store_ = std::move(*s);
  } else {
    CXLPOOL_LOG(kWarning) << "no state directory (--socket without --state-dir): leases will "
                             "not survive a restart of this daemon";
  }
  lifecycle_.Started("state directory");
  return 0;
}

int Daemon::StartLeases() {
  busy_.emplace(settings_.limits.max_busy_per_uid);
  leases_.emplace(&topo_, std::move(pools_), QuotaTable(cfg_.quotas), io_.get_executor(),
                  workers_->get_executor(), &SystemClock::Get());
  LeaseManager& leases = *leases_;
  leases.SetDaemonLimits(DaemonLimitsNow(*proc_, settings_.nofile, settings_.limits));
  leases.SetStockExecutor(stock_->get_executor(), cfg_.stock_workers);
  leases.SetInlineMax(cfg_.inline_max_bytes);
  leases.SetMaxExtentBytes(cfg_.max_extent_bytes);
  leases.SetBuildConcurrency(cfg_.workers);
  BusyBudget* busy = &*busy_;
  leases.SetBusyHooks(
      [busy](uid_t uid, std::chrono::nanoseconds d) {
        busy->Charge(uid, d, std::chrono::steady_clock::now());
      },
      [busy](uid_t uid) { return busy->Throttled(uid, std::chrono::steady_clock::now()); });
  // Long-term pinned leases on a mixed node are moved into its kernel zones
  // before the grant; only where the topology is this machine's.
  if (fs_->IsThisSystem()) leases.SetPinSettle(proc_.get());
  if (store_) {
    hand_over_.leases = &leases;
    leases.EnableRestart(store_.get(), probe_.get(), store_->next_id());
    // Stored fds the journal has no record of are accounted again there
    // (journal damage); those that cannot be are dropped from the store.
    leases.Recover(store_->JournalledLeases(), std::move(stored_), grace_,
                   HealthOf(store_->state()));
    CXLPOOL_LOG(kInfo) << "lease journal: " << store_->state().records_replayed
                       << " records replayed from " << state_dir_ << "/leases.journal";
  }
  // Tenants: priority reserves, and the live quota changes (cxlpoolctl quota
  // set) kept in the state directory over the config file's rules.
  leases.mutable_quotas()->SetReserves(cfg_.priority_reserves);
  if (!state_dir_.empty()) {
    if (Status st = leases.mutable_quotas()->OpenStore(state_dir_ + "/quotas.toml"); !st.ok()) {
      CXLPOOL_LOG(kError) << "quota store: " << st.ToString() << " (fix or remove the file)";
      return 1;
    }
  } else {
    CXLPOOL_LOG(kWarning) << "no state directory: quota changes will not survive a restart";
  }
  lifecycle_.Started("leases", {.stop = [this] { leases_->Shutdown(); }});
  return 0;
}

int Daemon::StartServer() {
  HandlerOptions hopts;
  hopts.admin_gid = cfg_.admin_gid;
  hopts.instance_id = RandomHex(16);
  hopts.max_frame_bytes = wire::kDefaultMaxFrameBytes;
  hopts.max_fds_per_frame = static_cast<uint32_t>(settings_.limits.max_fds_per_frame);
  hopts.max_request_bytes = settings_.limits.max_request_bytes;
  hopts.topology_is_local = fs_->IsThisSystem();
  handler_.emplace(&*leases_, proc_.get(), hopts);

  ServerOptions sopts;
  sopts.socket_mode = cfg_.socket_mode;
  sopts.socket_group = settings_.socket_group;
  sopts.fs = proc_.get();
  sopts.limits = settings_.limits;
  sopts.busy = &*busy_;
  for (auto& inh : inherited_) {
    if (sopts.listen_fd < 0 && IsListeningUnixSocket(inh.fd.get())) {
      sopts.listen_fd = inh.fd.Release();
    } else if (metrics_fd_ < 0 && inh.fd && MetricsHttpServer::IsListeningTcpSocket(inh.fd.get())) {
      metrics_fd_ = inh.fd.Release();
    }
  }
  const std::string& socket_path = settings_.socket_path;
  if (sopts.listen_fd < 0) {
    sopts.socket_path = socket_path;
    if (Status st = EnsureParentDir(socket_path); !st.ok()) {
      CXLPOOL_LOG(kError) << st.ToString();
      return 1;
    }
  }
  where_ = sopts.socket_path.empty() ? "inherited socket" : sopts.socket_path;
  auto server = Server::Create(io_, sopts, &*handler_);
  if (!server.ok()) {
    CXLPOOL_LOG(kError) << "socket " << socket_path << ": " << server.status().ToString();
    return 1;
  }
  server_ = std::move(*server);
  Server* srv = server_.get();
  handler_->SetPush([srv](ConnectionId c, Reply r) { return srv->Push(c, std::move(r)); });
  handler_->SetExtraStats(
      [this, srv](std::map<std::string, uint64_t>* counters,
                  std::map<std::string, uint64_t>* gauges) {
        ExportLimitStats(srv->stats(), counters, gauges);
        if (ClusterMember* c = cluster_ptr_.load())
          ExportClusterStats(c->stats(), counters, gauges);
      },
      [this, srv](MetricsRegistry* reg) {
        ExportLimitMetrics(srv->stats(), srv->options().limits, reg);
        if (ClusterMember* c = cluster_ptr_.load()) ExportClusterMetrics(c->stats(), reg);
      });
  lifecycle_.Started("server",
                     {.stop = [this] { StopServer(); }, .join = [this] { server_.reset(); }});
  return 0;
}

// Tiering (docs/daemon.md, "Tiering"): moves run on their own thread, the
// engine's state on the loop.
int Daemon::StartTiering() {
  Server* srv = server_.get();
  tiering_requests_.emplace(&*leases_);
  tiering_requests_->SetPush([srv](ConnectionId c, Reply r) { return srv->Push(c, std::move(r)); });
  tiering_requests_->SetLoop(io_.get_executor());
  tiering_table_.emplace(&*leases_, fs_->IsThisSystem());
  migrator_ = tiering::MakeKernelMigrator();
  kernel_writer_ = tiering::MakeKernelFileWriter();
  tiering_thread_.emplace(1);
  if (Status st = SetPoolPriority(*tiering_thread_, 1, cfg_.stock_nice, false, "cxlpool-tier");
      !st.ok()) {
    CXLPOOL_LOG(kInfo) << "tiering thread keeps the daemon's priority: " << st.ToString();
  }
  // Also without the engine: it pushes LeaseEvent "moved" when a long-term
  // pin moved a lease, and answers the tiering messages with UNSUPPORTED.
  handler_->SetTiering(&*tiering_requests_);
  if (cfg_.tiering.enabled) StartTieringEngine();
  auto stop = [this] {
    if (tiering_engine_) tiering_engine_->Stop();
  };
  lifecycle_.Started("tiering", {.stop = stop, .join = [this] { JoinTiering(); }});
  return 0;
}

void Daemon::StopServer() {
  // Restart support: the clients keep their leases (memory, mappings) and
  // reclaim them from the next daemon; the journal keeps them.
  if (store_) leases_->HandOver();
  server_->Stop();  // without restart support every connection's leases are released
}

void Daemon::JoinTiering() {
  if (tiering_engine_) tiering_engine_->Stop();
  tiering_thread_->join();  // a move stops after its current step
  tiering_requests_->SetEngine(nullptr);
  tiering_engine_.reset();
}

void Daemon::StartTieringEngine() {
  tiering_engine_ = std::make_unique<tiering::TieringEngine>(
      &*tiering_table_, migrator_.get(), &*tiering_requests_, &SystemClock::Get(),
      io_.get_executor(), tiering_thread_->get_executor(),
      tiering::TieringOptionsFrom(cfg_.tiering));
  // On-demand rounds for urgent hints are charged to the hints' senders.
  BusyBudget* busy = &*busy_;
  tiering_engine_->SetBusyCharge([busy](uid_t uid, std::chrono::nanoseconds d) {
    busy->Charge(uid, d, std::chrono::steady_clock::now());
  });
  tiering::KernelAccess access = tiering::DetectKernelAccess(*proc_, *proc_);
  if (fs_->IsThisSystem()) {
    // Names the kdamond this daemon makes, so that one a killed daemon left
    // is taken back after the restart (docs/daemon.md, "Access sampling").
    tiering::DamonOptions damon;
    if (!state_dir_.empty()) damon.owner_file = state_dir_ + "/damon.owner";
    if (auto sampler = tiering::ChooseSampler(cfg_.tiering.sampling, &access, proc_.get(),
                                              proc_.get(), kernel_writer_.get(), damon)) {
      tiering_engine_->SetSampler(std::move(sampler));
    }
  }
  CXLPOOL_LOG(kInfo) << "tiering: " << access.ToString();
  tiering_engine_->SetKernelAccess(access.ToString());
  if (!tiering::HaveCapSysNice()) {
    tiering_engine_->DisableMoves(
        "no CAP_SYS_NICE: pages that other processes map cannot be moved (give cxlpoold "
        "CAP_SYS_NICE; the systemd unit does)");
    CXLPOOL_LOG(kWarning) << "tiering: no CAP_SYS_NICE; temperatures are tracked, nothing moves";
  }
  tiering_requests_->SetEngine(tiering_engine_.get());
  tiering_engine_->Start();
}

// Optional loopback HTTP endpoint for Prometheus: the socket systemd passed
// (cxlpoold-metrics.socket), else metrics.http_listen.
int Daemon::StartMetricsHttp() {
  auto render = [this] { return handler_->MetricsText(); };
  if (metrics_fd_ >= 0) {
    auto h = MetricsHttpServer::FromListeningFd(io_, metrics_fd_, render);
    if (!h.ok()) {
      CXLPOOL_LOG(kError) << h.status().ToString()
                          << " (fix ListenStream= in cxlpoold-metrics.socket)";
      return 2;
    }
    http_ = std::move(*h);
    CXLPOOL_LOG(kInfo) << "metrics on http://127.0.0.1:" << http_->port()
                       << "/metrics (socket from systemd)";
    if (!cfg_.metrics_http_listen.empty()) {
      CXLPOOL_LOG(kWarning) << "metrics.http_listen " << cfg_.metrics_http_listen
                            << " is not used: systemd passed the metrics socket";
    }
  } else if (!cfg_.metrics_http_listen.empty()) {
    auto h = MetricsHttpServer::Create(io_, cfg_.metrics_http_listen, render);
    if (!h.ok()) {
      // A configuration that cannot be applied: exit 2, which the unit's
      // RestartPreventExitStatus= does not restart (no restart loop).
      CXLPOOL_LOG(kError) << h.status().ToString()
                          << (settings_.under_systemd
                                  ? " (cxlpoold.service has no network of its own: remove "
                                    "metrics.http_listen, run `systemctl enable --now "
                                    "cxlpoold-metrics.socket` while cxlpoold is stopped, then "
                                    "start cxlpoold)"
                                  : " (choose a free loopback port in metrics.http_listen, or "
                                    "set it to \"\" to turn the endpoint off)");
      return 2;
    }
    http_ = std::move(*h);
    CXLPOOL_LOG(kInfo) << "metrics on http://" << cfg_.metrics_http_listen << "/metrics";
  }
  if (http_) lifecycle_.Started("metrics http", {.stop = [this] { http_->Stop(); }});
  return 0;
}

// SIGHUP: re-read the config file; a bad one is logged and the old kept.
int Daemon::StartReload() {
  hup_.emplace(io_, SIGHUP);
  WaitForHup();
  lifecycle_.Started("reload", {.stop = [this] { hup_->cancel(); }});
  return 0;
}

void Daemon::WaitForHup() {
  hup_->async_wait([this](const boost::system::error_code& ec, int) {
    if (ec) return;
    Reload();
    WaitForHup();
  });
}

void Daemon::Reload() {
  ReloadOptions ro;
  ro.log_level_from_flag = !settings_.flags.log_level.empty();
  ro.memory = &*memory_watch_;
  auto interval = running_.memory_watch_interval;
  auto r = ReloadConfigFile(settings_.flags.config, topo_, &*leases_, &running_, ro);
  if (running_.memory_watch_interval != interval) {
    memory_timer_->Start(running_.memory_watch_interval);
  }
  if (!r.ok()) {
    CXLPOOL_LOG(kError) << "SIGHUP: config not reloaded, the running one is kept: "
                        << r.status().ToString();
    return;
  }
  for (const auto& a : r->applied) CXLPOOL_LOG(kInfo) << "SIGHUP: " << a;
  for (const auto& k : r->kept) CXLPOOL_LOG(kWarning) << "SIGHUP: " << k;
}

// Node pools follow memory onlined or offlined after start: MemTotal is
// re-read every daemon.memory_watch_interval (and on SIGHUP).
int Daemon::StartMemoryWatch() {
  memory_watch_.emplace(fs_.get(), topo_);
  memory_timer_.emplace(io_, "memory watch", [this] {
    // Growth leaves room to stock; a shrink may have dropped ready stock.
    if (memory_watch_->Check(running_, leases_->pools()).resized) leases_->StartRefills();
  });
  memory_timer_->Start(running_.memory_watch_interval);
  lifecycle_.Started("memory watch", {.stop = [this] { memory_timer_->Stop(); }});
  return 0;
}

// systemd's watchdog (WatchdogSec=): pinged at half its interval.
int Daemon::StartWatchdog() {
  watchdog_.emplace(io_, "watchdog", [this] { (void)notifier_.Watchdog(); });
  watchdog_->Start(std::chrono::microseconds(notifier_.watchdog_interval_usec()));
  lifecycle_.Started("watchdog", {.stop = [this] { watchdog_->Stop(); }});
  return 0;
}

// The warm reserves fill up on the stock threads (stopped with the leases).
int Daemon::StartRefills() {
  leases_->StartRefills();
  lifecycle_.Started("reserve refills");
  return 0;
}

// The rack's cluster ([cluster] endpoints): joins in the background, so an
// unreachable etcd never delays serving; leaves after the loop has stopped.
int Daemon::StartCluster() {
  if (!cfg_.cluster.enabled()) return 0;
  ClusterMember::Deps deps;
  deps.options = cfg_.cluster;
  deps.state_dir = state_dir_;
  deps.sysfs_root = SysfsRoot();
  deps.version = ProjectVersion();
  deps.clock = &SystemClock::Get();
  deps.describe = [this] { return SummarizeHost(leases_->Pools(), topo_); };
  // A lost slice: its leases are revoked on the loop; once their memory is
  // back the slice may be claimed again.
  deps.lost = [this](const std::string& path, uint32_t index) {
    boost::asio::post(io_, [this, path, index] {
      leases_->RevokeOnSlice(
          SharedSlicePool::PoolName(path), index,
          [this](uint64_t id, std::vector<ConnId> holders) {
            if (handler_) handler_->TellRevoked(id, holders);
          },
          [this, path, index] {
            if (ClusterMember* c = cluster_ptr_.load()) c->ForgetLost(path, index);
          });
    });
  };
  auto start = [&](std::map<std::string, std::set<uint32_t>> held) -> Result<ClusterMember*> {
    deps.held = std::move(held);
    auto member = ClusterMember::Start(std::move(deps));
    if (!member.ok()) return member.status();
    cluster_ = std::move(member.value());
    return cluster_.get();
  };
  Status st = slices_ ? slices_->Attach(start) : start({}).status();
  if (!st.ok()) {
    CXLPOOL_LOG(kError) << "cluster: " << st.ToString();
    return 2;
  }
  cluster_ptr_.store(cluster_.get());
  CXLPOOL_LOG(kInfo) << "cluster: host " << cfg_.cluster.host << " on etcd "
                     << cfg_.cluster.endpoints.size() << " endpoint(s), "
                     << cfg_.cluster.shared.size() << " shared device(s)";
  lifecycle_.Started("cluster", {.join = [this] {
                       cluster_ptr_.store(nullptr);
                       cluster_->Stop();
                       if (slices_) slices_->Detach();
                     }});
  return 0;
}

int Daemon::StartSignals() {
  signals_.emplace(io_, SIGINT, SIGTERM);
  signals_->async_wait([this](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    Stop("signal " + std::to_string(sig));
  });
  lifecycle_.Started("signals");
  return 0;
}

}  // namespace cxlpool
