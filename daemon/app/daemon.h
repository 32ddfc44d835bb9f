// Daemon: owns cxlpoold's components. Start builds them in one order (the
// table in Daemon::Start), each step adding itself to a Lifecycle; a stop
// request (SIGINT, SIGTERM or RequestStop) stops them in reverse on the
// loop, and Run then joins their threads in reverse. The members are
// declared in start order, so they are destroyed in reverse too.
//
// To add a component: a member (declared after those it uses), a Start*
// step that builds it and calls lifecycle_.Started(name, {stop, join}), and
// one line in the table in Start. A periodic job is a PeriodicTimer member
// started by its own step.
//
// Thread safety: Start, Run and the destructor one after another (Run's
// loop runs on the thread that calls it); RequestStop from any thread. One
// Daemon at a time per process: it handles SIGINT, SIGTERM and SIGHUP.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/thread_pool.hpp>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cluster/cluster_member.h"
#include "cluster/slice_broker.h"
#include "cxlpool/common/fs.h"
#include "cxlpool/common/unique_fd.h"
#include "cxlpool/topology/topology.h"
#include "handler/daemon_handler.h"
#include "handler/tiering_requests.h"
#include "http/http_server.h"
#include "lease/lease_manager.h"
#include "lease/restart.h"
#include "lifecycle.h"
#include "periodic_timer.h"
#include "pool/devdax.h"
#include "pool/node_memory_watch.h"
#include "pool/pool.h"
#include "recovery.h"
#include "sd.h"
#include "server/busy_budget.h"
#include "server/server.h"
#include "settings.h"
#include "tiering/engine.h"
#include "tiering/lease_adapter.h"
#include "tiering/migrator.h"
#include "tiering/sampler.h"

namespace cxlpool {

class Daemon {
 public:
  explicit Daemon(DaemonSettings settings);
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Builds and starts every component, in order, and tells systemd READY.
  // 0, or the process exit code when one could not start (logged): 1, or 2
  // for a configuration that cannot be applied. Call once.
  int Start();
  // Serves until a stop request, then joins the components' threads; 0.
  int Run();
  // What SIGTERM does, from any thread.
  void RequestStop();

  // Component names in start order, and in the order they were stopped.
  std::vector<std::string> started() const { return lifecycle_.started(); }
  const std::vector<std::string>& stopped() const { return lifecycle_.stopped(); }

 private:
  // Leases survive every exit (an error return as well as a stop): destroyed
  // before the lease manager, this hands them over, never frees.
  struct HandOverAtExit {
    LeaseManager* leases = nullptr;
    ~HandOverAtExit();
  };

  int StartThreads();
  int DiscoverTopology();
  int BuildPools();
  int BuildSharedPools();
  int OpenStateDir();
  int StartLeases();
  int StartServer();
  void StopServer();
  int StartTiering();
  void StartTieringEngine();
  void JoinTiering();
  int StartMetricsHttp();
  int StartMemoryWatch();
  int StartReload();
  int StartWatchdog();
  int StartRefills();
  int StartCluster();
  int StartSignals();
  void Reload();
  std::string SysfsRoot() const;  // --sysfs-root, else $CXLPOOL_FSROOT or /
  void WaitForHup();
  // On the loop: tell systemd STOPPING, stop every component, end the loop.
  void Stop(const std::string& why);

  const DaemonSettings settings_;
  const DaemonConfig& cfg_;  // settings_.config: what the daemon started with
  Lifecycle lifecycle_;
  bool stopping_ = false;

  std::unique_ptr<FileSystem> fs_;    // sysfs: the real one or --sysfs-root
  std::unique_ptr<FileSystem> proc_;  // this machine's /
  std::optional<boost::asio::thread_pool> workers_;
  std::optional<boost::asio::thread_pool> stock_;
  Topology topo_;
  std::unique_ptr<DaxControl> dax_;
  std::vector<std::unique_ptr<Pool>> pools_;  // until the lease manager takes them
  // [[cluster.shared]]: where the shared devices' pools take their slices.
  std::unique_ptr<SliceBroker> slices_;
  Notifier notifier_;
  std::vector<InheritedFd> inherited_;
  std::map<uint64_t, std::vector<UniqueFd>> stored_;
  std::string state_dir_;
  std::chrono::milliseconds grace_{0};
  std::unique_ptr<ProcessProbe> probe_;
  std::unique_ptr<JournalStore> store_;

  boost::asio::io_context io_;
  // Daemon time per uid (limits.max_busy_per_uid): the server charges its
  // loop time, the lease manager its workers'; it outlives both.
  std::optional<BusyBudget> busy_;
  std::optional<LeaseManager> leases_;
  HandOverAtExit hand_over_;
  std::optional<DaemonHandler> handler_;
  int metrics_fd_ = -1;  // cxlpoold-metrics.socket's listening TCP socket
  std::string where_;    // the socket served, for the logs
  std::unique_ptr<Server> server_;
  std::optional<TieringRequests> tiering_requests_;
  std::optional<tiering::LeaseManagerTable> tiering_table_;
  std::unique_ptr<tiering::Migrator> migrator_;
  std::unique_ptr<tiering::KernelFileWriter> kernel_writer_;
  std::optional<boost::asio::thread_pool> tiering_thread_;
  std::unique_ptr<tiering::TieringEngine> tiering_engine_;
  std::unique_ptr<MetricsHttpServer> http_;
  DaemonConfig running_;  // the configuration now, after SIGHUP reloads
  std::optional<NodeMemoryWatch> memory_watch_;
  std::optional<PeriodicTimer> memory_timer_;
  std::optional<boost::asio::signal_set> hup_;
  std::optional<PeriodicTimer> watchdog_;
  std::unique_ptr<ClusterMember> cluster_;  // [cluster]: null without endpoints
  // What the metrics read: set once the cluster has started.
  std::atomic<ClusterMember*> cluster_ptr_{nullptr};
  std::optional<boost::asio::signal_set> signals_;
};

}  // namespace cxlpool
