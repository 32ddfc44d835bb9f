// What the cluster figures (cluster.cc, elasticity.cc) share: etcd client
// options for the test cluster, and a bench "host": its own etcd client,
// joined session and slice registry.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "cxlpool/cluster/etcd_client.h"
#include "cxlpool/cluster/session.h"
#include "cxlpool/cluster/slice_registry.h"
#include "etcd_cluster.h"

namespace cxlpool::bench {

etcd::ClientOptions EtcdOptions(const testsupport::EtcdCluster& e);

// "bench-h<i>".
std::string HostName(int i);

struct BenchHost {
  std::unique_ptr<etcd::Client> etcd;
  std::unique_ptr<cluster::Session> session;
  std::unique_ptr<cluster::SliceRegistry> registry;
  std::string name;
  int64_t epoch = 0;
};

// Connects host `i` (HostName(i)) under `keys`, joins its session (10 s at
// most) and makes its registry.
Status JoinBenchHost(const testsupport::EtcdCluster& e, const cluster::Keys& keys, int i,
                     BenchHost* h);

}  // namespace cxlpool::bench
