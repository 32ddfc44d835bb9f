// cxlpoolctl cluster: the rack's cluster as etcd holds it, from any host.
//   cluster                     hosts, capacity per tier, shared devices,
//                               slice ownership, quarantined slices
//   cluster place --size 64G    hosts ranked for a request, with reasons
//   cluster fence HOST --confirm-down
//                               an operator confirms HOST down: its
//                               quarantined slices become claimable
// etcd is found from --etcd (or $CXLPOOL_ETCD) with --etcd-ca/-cert/-key, or
// from the daemon's config file's [cluster] table (--config, default
// /etc/cxlpool/cxlpoold.toml).
#include <pwd.h>
#include <unistd.h>

#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include "commands.h"
#include "config/config.h"
#include "cxlpool/cluster/placement.h"
#include "cxlpool/cluster/slice_registry.h"
#include "cxlpool/common/strings.h"
#include "daemon_client.h"
#include "table.h"

namespace cxlpool::ctl {

namespace {

using nlohmann::ordered_json;
using namespace cxlpool::cluster;

struct ClusterCliOptions {
  ConnOptions conn;
  std::string config = "/etc/cxlpool/cxlpoold.toml";
  std::string etcd, ca, cert, key, prefix;
};

void AddEtcdOptions(CLI::App* app, ClusterCliOptions* o) {
  AddConnOptions(app, &o->conn);
  app->add_option("--config", o->config, "The daemon's config file, for its [cluster] table");
  app->add_option("--etcd", o->etcd, "etcd endpoints, host:port[,host:port...]")
      ->envname("CXLPOOL_ETCD");
  app->add_option("--etcd-ca", o->ca, "CA certificate of etcd (PEM)");
  app->add_option("--etcd-cert", o->cert, "Client certificate for etcd (PEM)");
  app->add_option("--etcd-key", o->key, "Its key (PEM)");
  app->add_option("--prefix", o->prefix, "Key prefix of the cluster (default /cxlpool/v1)");
}

// The registry to read, or an exit code.
struct Connected {
  std::unique_ptr<etcd::Client> client;
  std::unique_ptr<SliceRegistry> registry;
};

int Connect(const ClusterCliOptions& o, Connected* out) {
  ClusterOptions c;
  if (o.etcd.empty()) {
    if (::access(o.config.c_str(), R_OK) == 0) {
      auto cfg = LoadConfigFile(o.config);
      if (!cfg.ok()) {
        std::cerr << "cxlpoolctl cluster: " << cfg.status().message() << "\n";
        return kExitFailure;
      }
      c = cfg->cluster;
    }
    if (!c.enabled()) {
      std::cerr << "cxlpoolctl cluster: no etcd endpoints: give --etcd (or $CXLPOOL_ETCD), or a "
                   "config file with [cluster] endpoints (--config)\n";
      return kExitUsage;
    }
  } else {
    std::stringstream ss(o.etcd);
    for (std::string ep; std::getline(ss, ep, ',');)
      if (!ep.empty()) c.endpoints.push_back(ep);
  }
  if (!o.ca.empty()) c.ca_file = o.ca;
  if (!o.cert.empty()) c.cert_file = o.cert;
  if (!o.key.empty()) c.key_file = o.key;
  if (!o.prefix.empty()) c.prefix = o.prefix;
  etcd::ClientOptions eo;
  eo.endpoints = c.endpoints;
  eo.tls = {c.ca_file, c.cert_file, c.key_file};
  auto client = etcd::Client::Connect(eo);
  if (!client.ok()) {
    std::cerr << "cxlpoolctl cluster: " << client.status().message() << "\n";
    return kExitUsage;
  }
  out->client = std::move(client.value());
  out->registry = std::make_unique<SliceRegistry>(out->client.get(), Keys(c.prefix));
  return kExitOk;
}

int Read(const ClusterCliOptions& o, Connected* c, ClusterView* view) {
  if (int rc = Connect(o, c); rc != kExitOk) return rc;
  auto v = c->registry->Read();
  if (!v.ok()) {
    std::cerr << "cxlpoolctl cluster: " << v.status().message() << "\n";
    return kExitUnavailable;
  }
  *view = std::move(v.value());
  return kExitOk;
}

// The record as published, with its epoch.
ordered_json HostJson(const HostView& h) {
  ordered_json j{{"host", h.record.host}, {"epoch", h.epoch}};
  j.update(ordered_json::parse(ToJson(h.record)));
  return j;
}

// Capacity and free bytes per tier, over every live host.
std::map<std::string, std::pair<uint64_t, uint64_t>> PerTier(const ClusterView& v) {
  std::map<std::string, std::pair<uint64_t, uint64_t>> out;
  for (const auto& [name, h] : v.hosts)
    for (const auto& p : h.record.pools) {
      out[p.tier].first += p.capacity;
      out[p.tier].second += p.free;
    }
  return out;
}

ordered_json ViewJson(const ClusterView& v) {
  ordered_json hosts = ordered_json::array();
  for (const auto& [name, h] : v.hosts) hosts.push_back(HostJson(h));
  ordered_json tiers = ordered_json::object();
  for (const auto& [tier, cf] : PerTier(v))
    tiers[tier] = {{"capacity", cf.first}, {"free", cf.second}};
  ordered_json devices = ordered_json::array();
  ordered_json quarantined = ordered_json::array();
  for (const auto& [id, d] : v.devices) {
    ordered_json slices = ordered_json::array();
    std::map<std::string, uint32_t> count;
    for (const auto& s : d.slices) {
      count[SliceStateName(s.state)]++;
      if (s.state == SliceState::kFree) continue;
      ordered_json js{{"index", s.index},
                      {"state", SliceStateName(s.state)},
                      {"owner", s.record.owner},
                      {"epoch", s.record.epoch}};
      slices.push_back(js);
      if (s.state == SliceState::kQuarantined) {
        ordered_json q = js;
        q["device"] = id;
        quarantined.push_back(std::move(q));
      }
    }
    devices.push_back({{"id", id},
                       {"size", d.record.size},
                       {"slice_bytes", d.record.slice_bytes},
                       {"slices", d.slices.size()},
                       {"free", count["free"]},
                       {"owned", count["owned"]},
                       {"quarantined", count["quarantined"]},
                       {"fenced", count["fenced"]},
                       {"owned_slices", slices}});
  }
  ordered_json fences = ordered_json::array();
  for (const auto& [key, f] : v.fences)
    fences.push_back(
        {{"host", f.host}, {"epoch", f.epoch}, {"by", f.by}, {"at", f.at}, {"reason", f.reason}});
  return {{"revision", v.revision},
          {"hosts", hosts},
          {"tiers", tiers},
          {"shared_devices", devices},
          {"quarantined", quarantined},
          {"fences", fences},
          {"invalid_records", v.invalid}};
}

void PrintView(const ClusterView& v) {
  Table hosts(
      {"HOST", "EPOCH", "VERSION", "POOLS FREE/CAPACITY", "GPUS", "SHARED OWNED/USED", "SHARED"});
  for (const auto& [name, h] : v.hosts) {
    std::string pools;
    for (const auto& p : h.record.pools)
      pools += (pools.empty() ? "" : ", ") + p.tier + std::to_string(p.node) + " " +
               HumanBytes(p.free) + "/" + HumanBytes(p.capacity);
    uint32_t owned = 0, used = 0;
    for (const auto& d : h.record.shared_devices) owned += d.slices_owned, used += d.slices_used;
    hosts.Add({name, std::to_string(h.epoch), OrDash(h.record.version), OrDash(pools),
               std::to_string(h.record.gpus.size()),
               std::to_string(owned) + "/" + std::to_string(used),
               h.record.shared_fenced ? "FENCED" : "ok"});
  }
  std::cout << "hosts: " << v.hosts.size() << " live (etcd revision " << v.revision << ")\n"
            << hosts.Render();
  Table tiers({"TIER", "CAPACITY", "FREE"});
  for (const auto& [tier, cf] : PerTier(v))
    tiers.Add({tier, HumanBytes(cf.first), HumanBytes(cf.second)});
  std::cout << "\ncapacity per tier\n" << tiers.Render();
  Table devs({"DEVICE", "SIZE", "SLICE", "SLICES", "FREE", "OWNED", "QUARANTINED", "FENCED"});
  Table owners({"DEVICE", "SLICE", "STATE", "OWNER", "EPOCH"});
  for (const auto& [id, d] : v.devices) {
    std::map<SliceState, uint32_t> n;
    for (const auto& s : d.slices) {
      n[s.state]++;
      if (s.state != SliceState::kFree)
        owners.Add({id, std::to_string(s.index), SliceStateName(s.state), s.record.owner,
                    std::to_string(s.record.epoch)});
    }
    devs.Add({id, HumanBytes(d.record.size), HumanBytes(d.record.slice_bytes),
              std::to_string(d.slices.size()), std::to_string(n[SliceState::kFree]),
              std::to_string(n[SliceState::kOwned]), std::to_string(n[SliceState::kQuarantined]),
              std::to_string(n[SliceState::kFenced])});
  }
  std::cout << "\nshared devices\n" << devs.Render() << "\nslices\n" << owners.Render();
  std::map<std::pair<std::string, int64_t>, uint32_t> q;
  for (const auto& [id, d] : v.devices)
    for (const auto& s : d.slices)
      if (s.state == SliceState::kQuarantined) q[{s.record.owner, s.record.epoch}]++;
  for (const auto& [he, n] : q)
    std::cout << "quarantined: " << n << " slice(s) of " << he.first << " epoch " << he.second
              << ": they return when " << he.first << " rejoins, or after `cxlpoolctl cluster "
              << "fence " << he.first << " --confirm-down` once it is known to be down\n";
  for (const auto& bad : v.invalid) std::cout << "invalid record: " << bad << "\n";
}

int RunShow(const ClusterCliOptions& o) {
  Connected c;
  ClusterView v;
  if (int rc = Read(o, &c, &v); rc != kExitOk) return rc;
  if (o.conn.json) {
    std::cout << JsonText(ViewJson(v)) << "\n";
  } else {
    PrintView(v);
  }
  return kExitOk;
}

struct PlaceOptions {
  ClusterCliOptions cluster;
  std::string size;
  std::string tier;
  bool near_free_gpu = false;
};

int RunPlace(const PlaceOptions& o) {
  auto size = ParseByteSize(o.size);
  if (!size.ok() || *size == 0) {
    std::cerr << "cxlpoolctl cluster place: --size: "
              << (size.ok() ? "must be positive" : size.status().message()) << "\n";
    return kExitUsage;
  }
  Connected c;
  ClusterView v;
  if (int rc = Read(o.cluster, &c, &v); rc != kExitOk) return rc;
  const auto ranks = RankHosts(v, {*size, o.tier, o.near_free_gpu});
  if (o.cluster.conn.json) {
    ordered_json out = ordered_json::array();
    for (const auto& r : ranks)
      out.push_back({{"host", r.host},
                     {"fits", r.fits},
                     {"free_bytes", r.free_bytes},
                     {"shared_free_bytes", r.shared_free_bytes},
                     {"gpu", r.gpu},
                     {"reasons", r.reasons}});
    std::cout << JsonText(out) << "\n";
  } else {
    Table t({"RANK", "HOST", "FITS", "WHY"});
    int rank = 0;
    for (const auto& r : ranks) {
      std::string why;
      for (const auto& s : r.reasons) why += (why.empty() ? "" : "; ") + s;
      t.Add({std::to_string(++rank), r.host, r.fits ? "yes" : "no", why});
    }
    std::cout << t.Render();
  }
  const bool any = !ranks.empty() && ranks.front().fits;
  if (!any) std::cerr << "cxlpoolctl cluster place: no live host fits " << o.size << "\n";
  return any ? kExitOk : kExitFailure;
}

struct FenceOptions {
  ClusterCliOptions cluster;
  std::string host;
  bool confirm_down = false;
  std::string reason;
};

std::string Operator() {
  const passwd* pw = ::getpwuid(::getuid());
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  return std::string(pw != nullptr ? pw->pw_name : std::to_string(::getuid())) + "@" + host;
}

int RunFence(const FenceOptions& o) {
  if (!o.confirm_down) {
    std::cerr << "cxlpoolctl cluster fence: a fence says " << o.host
              << " is down and will never write again; confirm with --confirm-down\n";
    return kExitUsage;
  }
  Connected c;
  ClusterView v;
  if (int rc = Read(o.cluster, &c, &v); rc != kExitOk) return rc;
  if (auto live = v.hosts.find(o.host); live != v.hosts.end()) {
    std::cerr << "cxlpoolctl cluster fence: " << o.host << " has a live session (epoch "
              << live->second.epoch << "): it is not down; the slices of its earlier epochs "
              << "return when it re-adopts or frees them\n";
    return kExitFailure;
  }
  std::set<int64_t> epochs;
  for (const auto& [id, d] : v.devices)
    for (const auto& s : d.slices)
      if (s.state == SliceState::kQuarantined && s.record.owner == o.host)
        epochs.insert(s.record.epoch);
  if (epochs.empty()) {
    std::cout << o.host << " holds no quarantined slice; nothing to fence\n";
    return kExitOk;
  }
  int rc = kExitOk;
  for (int64_t epoch : epochs) {
    FenceRecord f{o.host, epoch, Operator(), 0, o.reason};
    f.at = static_cast<int64_t>(::time(nullptr));
    auto r = c.registry->Fence(f);
    if (!r.ok()) {
      std::cerr << "cxlpoolctl cluster fence: " << r.status().message() << "\n";
      return kExitUnavailable;
    }
    if (*r) {
      std::cout << "fenced " << o.host << " epoch " << epoch << " (by " << f.by << ")\n";
    } else {
      std::cerr << "cxlpoolctl cluster fence: " << o.host << " epoch " << epoch
                << " is live again: not fenced\n";
      rc = kExitFailure;
    }
  }
  return rc;
}

}  // namespace

Command MakeClusterCommand() {
  return {"cluster",
          "The rack's cluster from etcd: hosts, tiers, shared devices, slices; place, fence",
          [](CLI::App* app) -> std::function<int()> {
            auto show = std::make_shared<ClusterCliOptions>();
            AddEtcdOptions(app, show.get());
            CLI::App* place = app->add_subcommand("place", "Rank hosts for a request, with why");
            auto po = std::make_shared<PlaceOptions>();
            AddEtcdOptions(place, &po->cluster);
            place->add_option("--size", po->size, "Bytes, e.g. 64G")->required();
            place->add_option("--tier", po->tier, "dram, cxl, ... (default: any)");
            place->add_flag("--near-free-gpu", po->near_free_gpu,
                            "Only near a GPU no lease is placed for");
            CLI::App* fence = app->add_subcommand(
                "fence", "Confirm a host down: its quarantined slices become claimable");
            auto fo = std::make_shared<FenceOptions>();
            AddEtcdOptions(fence, &fo->cluster);
            fence->add_option("host", fo->host, "The host that is down")->required();
            fence->add_flag("--confirm-down", fo->confirm_down,
                            "It is powered off or cut off for good (required)");
            fence->add_option("--reason", fo->reason, "Why, for the record");
            return [show, po, fo, place, fence]() -> int {
              if (place->parsed()) return RunPlace(*po);
              if (fence->parsed()) return RunFence(*fo);
              return RunShow(*show);
            };
          }};
}

}  // namespace cxlpool::ctl
