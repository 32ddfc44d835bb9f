// What the cluster component is built from: the [cluster] table and its
// [[cluster.shared]] devices (config/ reads them into these structs). No
// endpoints: no cluster, and the daemon is a single host as before.
//
// Thread safety: values.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace cxlpool {

struct SharedDeviceOptions {
  std::string path;  // /dev/daxX.Y (a regular file in tests)
  std::string id;    // the stable id; may be left out once the device has a header
  uint64_t slice_bytes = 1ull << 30;
  uint32_t claim_ahead = 1;
  std::chrono::milliseconds idle_release{60000};
  bool operator==(const SharedDeviceOptions&) const = default;
};

struct ClusterOptions {
  std::vector<std::string> endpoints;  // etcd, "host:port"
  std::string host;                    // this host's name in the cluster (default: hostname)
  std::string prefix = "/cxlpool/v1";
  std::chrono::milliseconds session_ttl{10000};
  std::chrono::milliseconds publish_interval{2000};
  std::string ca_file, cert_file, key_file;  // TLS to etcd
  std::vector<SharedDeviceOptions> shared;

  bool enabled() const { return !endpoints.empty(); }
  bool operator==(const ClusterOptions&) const = default;
};

}  // namespace cxlpool
