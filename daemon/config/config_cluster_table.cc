// [cluster] and [[cluster.shared]].
#include <unistd.h>

#include "config/config_tables.h"
#include "cxlpool/cluster/names.h"
#include "values/value_parser.h"

namespace cxlpool {

namespace {

Status ReadEndpoints(TableReader& r, std::vector<std::string>* out) {
  const toml::node* n = r.Get("endpoints");
  if (n == nullptr) return Status::Ok();
  const toml::array* arr = n->as_array();
  const std::string key = r.Key("endpoints");
  if (arr == nullptr) return BadValue(key, "expected an array of \"host:port\" strings");
  for (const auto& e : *arr) {
    auto s = e.value<std::string>();
    if (!s) return BadValue(key, "expected an array of \"host:port\" strings");
    Status ok = cluster::CheckEndpoint(*s);
    if (!ok.ok()) return BadValue(key, ok.message());
    out->push_back(*s);
  }
  return Status::Ok();
}

Status ReadShared(TableReader& r, const std::string& key, ClusterOptions* c) {
  SharedDeviceOptions d;
  CXLPOOL_RETURN_IF_ERROR(r.ReadPath("path", &d.path));
  if (d.path.empty()) return BadValue(key + ".path", "required");
  CXLPOOL_RETURN_IF_ERROR(r.ReadString("id", &d.id));
  if (!d.id.empty()) CXLPOOL_RETURN_IF_ERROR(cluster::CheckName(key + ".id", d.id));
  std::optional<uint64_t> slice;
  CXLPOOL_RETURN_IF_ERROR(r.ReadByteLimit("slice_size", 2ull << 20, 1ull << 40, &slice));
  if (slice) {
    if (*slice % (2ull << 20) != 0) return BadValue(key + ".slice_size", "must be 2 MiB aligned");
    d.slice_bytes = *slice;
  }
  uint64_t ahead = d.claim_ahead;
  CXLPOOL_RETURN_IF_ERROR(r.ReadUint("claim_ahead", 1024, &ahead));
  d.claim_ahead = static_cast<uint32_t>(ahead);
  CXLPOOL_RETURN_IF_ERROR(r.ReadDuration("idle_release", &d.idle_release));
  CXLPOOL_RETURN_IF_ERROR(r.CheckUnknown());
  for (const auto& other : c->shared)
    if (other.path == d.path) return BadValue(key + ".path", "duplicate '" + d.path + "'");
  c->shared.push_back(std::move(d));
  return Status::Ok();
}

}  // namespace

Status ReadClusterTable(TableReader& top, ClusterOptions* c) {
  return ReadTable(top, "cluster", [&](TableReader& r) -> Status {
    CXLPOOL_RETURN_IF_ERROR(ReadEndpoints(r, &c->endpoints));
    CXLPOOL_RETURN_IF_ERROR(r.ReadString("host", &c->host));
    if (c->host.empty()) {
      char name[256] = {};
      if (::gethostname(name, sizeof name - 1) == 0) c->host = name;
    }
    CXLPOOL_RETURN_IF_ERROR(cluster::CheckName(r.Key("host"), c->host));
    CXLPOOL_RETURN_IF_ERROR(r.ReadString("prefix", &c->prefix));
    if (c->prefix.empty() || c->prefix[0] != '/')
      return BadValue(r.Key("prefix"), "must start with '/'");
    CXLPOOL_RETURN_IF_ERROR(r.ReadDuration("session_ttl", &c->session_ttl));
    if (c->session_ttl < std::chrono::seconds(2) || c->session_ttl > std::chrono::hours(1))
      return BadValue(r.Key("session_ttl"), "must be 2s..1h");
    CXLPOOL_RETURN_IF_ERROR(r.ReadDuration("publish_interval", &c->publish_interval));
    if (c->publish_interval < std::chrono::milliseconds(100))
      return BadValue(r.Key("publish_interval"), "must be at least 100ms");
    CXLPOOL_RETURN_IF_ERROR(r.ReadPath("ca", &c->ca_file));
    CXLPOOL_RETURN_IF_ERROR(r.ReadPath("cert", &c->cert_file));
    CXLPOOL_RETURN_IF_ERROR(r.ReadPath("key", &c->key_file));
    if (c->cert_file.empty() != c->key_file.empty())
      return BadValue(r.Key("cert"), "cert and key go together");
    if (!c->cert_file.empty() && c->ca_file.empty())
      return BadValue(r.Key("ca"), "a client certificate needs the CA that checks etcd");
    auto shared = r.Tables("shared");
    if (!shared.ok()) return shared.status();
    if (*shared != nullptr) {
      CXLPOOL_RETURN_IF_ERROR(ForEachTable(
          **shared, r.Key("shared"),
          [&](TableReader& sr, const std::string& key) { return ReadShared(sr, key, c); }));
    }
    if (c->endpoints.empty() && !c->shared.empty())
      return BadValue(r.Key("endpoints"), "shared devices need the cluster's etcd endpoints");
    return Status::Ok();
  });
}

}  // namespace cxlpool
