// What the tests with cxlpoold hosts in a cluster share: cxlpoolctl against
// the test's etcd, and reading its `cluster --json` view.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "etcd_cluster.h"
#include "netns.h"
#include "test_support.h"

namespace cxlpool::clustertest {

// `cxlpoolctl <args>` on the cluster's 127.0.0.1 endpoints with its TLS
// files; stdout and stderr.
inline std::string Ctl(const testsupport::EtcdCluster& etcd, const std::string& args) {
  const std::string cmd = testsupport::CtlBinary() + " " + args + " --etcd " +
                          etcd.endpoints_csv() + " --etcd-ca " + etcd.ca_file() + " --etcd-cert " +
                          etcd.client_cert_file() + " --etcd-key " + etcd.client_key_file() +
                          " 2>&1";
  return testsupport::RunShell(cmd).second;
}

// `cluster --json`, or {} when it did not print JSON.
inline nlohmann::json View(const testsupport::EtcdCluster& etcd) {
  nlohmann::json j = nlohmann::json::parse(Ctl(etcd, "cluster --json"), nullptr, false);
  return j.is_discarded() ? nlohmann::json::object() : j;
}

// A daemon config for host `host` of the cluster on `endpoints`: state in
// `state_dir`, session TTL 2 s, one shared device (`shared`, id "shared-0",
// 4 MiB slices, 2 claimed ahead).
inline std::string HostConfig(const testsupport::EtcdCluster& etcd,
                              const std::vector<std::string>& endpoints, const std::string& host,
                              const std::string& state_dir, const std::string& shared) {
  std::string eps;
  for (const auto& e : endpoints) eps.append(eps.empty() ? "\"" : ", \"").append(e) += "\"";
  std::string t = "[daemon]\nstate_dir = \"";
  t.append(state_dir).append("\"\n[cluster]\nendpoints = [").append(eps);
  t.append("]\nhost = \"").append(host);
  t.append("\"\nsession_ttl = \"2s\"\npublish_interval = \"200ms\"\nca = \"");
  t.append(etcd.ca_file()).append("\"\ncert = \"").append(etcd.client_cert_file());
  t.append("\"\nkey = \"").append(etcd.client_key_file());
  t.append("\"\n[[cluster.shared]]\npath = \"").append(shared);
  t.append("\"\nid = \"shared-0\"\nslice_size = \"4M\"\nclaim_ahead = 2\n");
  return t;
}

// host -> the slices it owns (live epoch).
inline std::map<std::string, std::set<uint32_t>> Owners(const nlohmann::json& v) {
  std::map<std::string, std::set<uint32_t>> out;
  for (const auto& d : v.value("shared_devices", nlohmann::json::array()))
    for (const auto& s : d.value("owned_slices", nlohmann::json::array()))
      if (s.value("state", "") == "owned") out[s.value("owner", "")].insert(s.value("index", 0u));
  return out;
}

inline size_t Quarantined(const nlohmann::json& v) {
  return v.value("quarantined", nlohmann::json::array()).size();
}

// A daemon's STATS gauge through its socket (cxlpoolctl --json stats); -1
// when it did not answer.
inline int64_t Gauge(const testsupport::Daemon& d, const std::string& name) {
  auto [rc, out] =
      testsupport::RunShell(testsupport::CtlBinary() + " --socket " + d.socket() + " --json stats");
  nlohmann::json j = nlohmann::json::parse(out, nullptr, false);
  if (rc != 0 || j.is_discarded() || !j.contains("gauges")) return -1;
  return j["gauges"].value(name, int64_t{-1});
}

// A file of `bytes` standing in for a shared device.
inline Status MakeSharedFile(const std::string& path, uint64_t bytes) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return Status::FromErrno(errno, "open " + path);
  const int rc = ::ftruncate(fd, static_cast<off_t>(bytes));
  ::close(fd);
  return rc == 0 ? Status::Ok() : Status(Code::kIo, "ftruncate " + path);
}

inline std::string HostName(int i) { return std::string("h").append(std::to_string(i)); }

// `n` cxlpoold hosts "h0".."h<n-1>", each in its own network namespace
// (NetnsHost i), on a 3-member etcd with TLS that they reach only over their
// links, sharing a file of `device_bytes` in `dir`.
struct NamespacedHosts {
  std::vector<std::unique_ptr<testsupport::NetnsHost>> ns;
  std::unique_ptr<testsupport::EtcdCluster> etcd;
  std::vector<std::unique_ptr<testsupport::Daemon>> hosts;
  std::string shared;

  // Exits 77, saying why, where namespaces cannot be made (the test's ctest
  // property SKIP_RETURN_CODE 77 shows it skipped). UNSUPPORTED when etcd is
  // not installed (skip), another error when something else failed.
  Status Start(const std::string& test, int n, const std::string& dir, uint64_t device_bytes) {
    std::vector<std::string> outer;
    for (int i = 0; i < n; ++i) {
      auto h = testsupport::NetnsHost::Create(i);
      if (!h.ok() && h.status().code() == Code::kUnsupported) {
        std::fprintf(stderr, "%s: cannot make network namespaces here: %s\n", test.c_str(),
                     h.status().ToString().c_str());
        std::exit(77);
      }
      if (!h.ok()) return h.status();
      outer.push_back((*h)->outer_ip());
      ns.push_back(std::move(h.value()));
    }
    testsupport::EtcdClusterOptions eo;
    eo.extra_client_ips = outer;
    auto c = testsupport::EtcdCluster::Start(eo);
    if (!c.ok()) return c.status();
    etcd = std::move(c.value());
    shared = dir + "/shared.img";
    CXLPOOL_RETURN_IF_ERROR(MakeSharedFile(shared, device_bytes));
    for (int i = 0; i < n; ++i) {
      hosts.push_back(std::make_unique<testsupport::Daemon>());
      testsupport::Daemon& d = *hosts.back();
      d.set_log_to_file(true);
      d.set_exec_prefix(ns[i]->Prefix());
      CXLPOOL_RETURN_IF_ERROR(d.MakeDir());
      // Each host knows etcd only by the far end of its own link.
      const std::string config = HostConfig(*etcd, etcd->endpoints_on(ns[i]->outer_ip()),
                                            HostName(i), d.dir() + "/state", shared);
      if (Status s = d.Start(config); !s.ok())
        return Status(s.code(), HostName(i) + ": " + s.message() + "\n" + d.Log());
    }
    return Status::Ok();
  }
};

}  // namespace cxlpool::clustertest
