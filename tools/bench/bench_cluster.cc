// See bench_cluster.h.
#include "bench_cluster.h"

#include <chrono>
#include <thread>

namespace cxlpool::bench {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

etcd::ClientOptions EtcdOptions(const testsupport::EtcdCluster& e) {
  etcd::ClientOptions o;
  o.endpoints = e.endpoints();
  o.tls = {e.ca_file(), e.client_cert_file(), e.client_key_file()};
  return o;
}

std::string HostName(int i) { return std::string("bench-h").append(std::to_string(i)); }

Status JoinBenchHost(const testsupport::EtcdCluster& e, const cluster::Keys& keys, int i,
                     BenchHost* h) {
  auto client = etcd::Client::Connect(EtcdOptions(e));
  if (!client.ok()) return client.status();
  h->etcd = std::move(client.value());
  h->name = HostName(i);
  cluster::SessionOptions so;
  so.host = h->name;
  so.ttl_s = 10;
  h->session =
      std::make_unique<cluster::Session>(h->etcd.get(), keys, so, cluster::Session::Callbacks{});
  cluster::HostRecord rec;
  rec.host = h->name;
  rec.instance = "bench";
  rec.boot_id = "bench";
  rec.version = "bench";
  CXLPOOL_RETURN_IF_ERROR(h->session->Start(rec));
  const auto end = steady_clock::now() + milliseconds(10000);
  while (!h->session->live() && steady_clock::now() < end)
    std::this_thread::sleep_for(milliseconds(10));
  if (!h->session->live()) return Status(Code::kUnavailable, h->name + ": did not join");
  h->epoch = h->session->epoch();
  h->registry = std::make_unique<cluster::SliceRegistry>(h->etcd.get(), keys);
  return Status::Ok();
}

}  // namespace cxlpool::bench
