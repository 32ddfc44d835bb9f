#include "cxlpool/cluster/cluster_view.h"

namespace cxlpool::cluster {

const char* SliceStateName(SliceState s) {
  switch (s) {
    case SliceState::kFree:
      return "free";
    case SliceState::kOwned:
      return "owned";
    case SliceState::kQuarantined:
      return "quarantined";
    case SliceState::kFenced:
      return "fenced";
  }
  return "?";
}

namespace {

void Invalid(ClusterView* v, const std::string& key, const std::string& why) {
  v->invalid.push_back(key + ": " + why);
}

void ReadHostsAndFences(const Keys& keys, const std::vector<etcd::KeyValue>& kvs, ClusterView* v) {
  for (const auto& kv : kvs) {
    if (auto host = keys.ParseHost(kv.key)) {
      auto r = ParseHostRecord(kv.value);
      if (!r.ok()) {
        Invalid(v, kv.key, r.status().message());
      } else if (r->host != *host) {
        Invalid(v, kv.key, "host record names '" + r->host + "'");
      } else {
        v->hosts[*host] = HostView{std::move(r.value()), kv.create_revision, kv.lease};
      }
    } else if (auto fence = keys.ParseFence(kv.key)) {
      auto r = ParseFenceRecord(kv.value);
      if (!r.ok()) {
        Invalid(v, kv.key, r.status().message());
      } else if (r->host != fence->first || r->epoch != fence->second) {
        Invalid(v, kv.key, "fence record does not match its key");
      } else {
        v->fences[*fence] = std::move(r.value());
      }
    } else if (kv.key.rfind(keys.Devices(), 0) == 0) {
      const std::string id = kv.key.substr(keys.Devices().size());
      auto r = ParseDeviceRecord(kv.value);
      Status name = CheckName("device", id);
      if (!name.ok()) {
        Invalid(v, kv.key, name.message());
      } else if (!r.ok()) {
        Invalid(v, kv.key, r.status().message());
      } else {
        DeviceView d;
        d.id = id;
        d.record = *r;
        d.slices.resize(r->slices());
        for (uint32_t i = 0; i < d.slices.size(); ++i) {
          d.slices[i].device = id;
          d.slices[i].index = i;
        }
        v->devices[id] = std::move(d);
      }
    }
  }
}

void ReadSlices(const Keys& keys, const std::vector<etcd::KeyValue>& kvs, ClusterView* v) {
  for (const auto& kv : kvs) {
    if (kv.key.rfind(keys.Slices(), 0) != 0) continue;
    auto id = keys.ParseSlice(kv.key);
    if (!id) {
      Invalid(v, kv.key, "not a slice key");
      continue;
    }
    auto dev = v->devices.find(id->device);
    if (dev == v->devices.end() || id->index >= dev->second.slices.size()) {
      Invalid(v, kv.key, "no such slice on a known device");
      continue;
    }
    auto r = ParseSliceRecord(kv.value);
    if (!r.ok()) {
      Invalid(v, kv.key, r.status().message());
      // An unreadable owner may still be writing: never offer it as free.
      dev->second.slices[id->index].state = SliceState::kQuarantined;
      dev->second.slices[id->index].mod_revision = kv.mod_revision;
      continue;
    }
    SliceView& s = dev->second.slices[id->index];
    s.record = std::move(r.value());
    s.mod_revision = kv.mod_revision;
    s.state = v->Classify(s.record);
  }
}

}  // namespace

ClusterView ClusterView::FromKvs(const Keys& keys, const std::vector<etcd::KeyValue>& kvs,
                                 int64_t revision) {
  ClusterView v;
  v.revision = revision;
  ReadHostsAndFences(keys, kvs, &v);
  ReadSlices(keys, kvs, &v);
  return v;
}

int64_t ClusterView::LiveEpoch(const std::string& host) const {
  auto it = hosts.find(host);
  return it == hosts.end() ? 0 : it->second.epoch;
}

SliceState ClusterView::Classify(const SliceRecord& r) const {
  if (LiveEpoch(r.owner) == r.epoch) return SliceState::kOwned;
  if (fences.count({r.owner, r.epoch})) return SliceState::kFenced;
  return SliceState::kQuarantined;
}

size_t ClusterView::CountSlices(SliceState state) const {
  size_t n = 0;
  for (const auto& [id, d] : devices)
    for (const auto& s : d.slices) n += s.state == state;
  return n;
}

}  // namespace cxlpool::cluster
