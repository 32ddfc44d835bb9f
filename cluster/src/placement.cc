#include "cxlpool/cluster/placement.h"

#include <algorithm>
#include <set>

namespace cxlpool::cluster {

namespace {

std::string GiB(uint64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", static_cast<double>(b) / (1ull << 30));
  return buf;
}

// Free bytes of claimable slices on the devices `host` sees.
uint64_t SharedFree(const ClusterView& view, const HostView& h) {
  if (h.record.shared_fenced) return 0;
  uint64_t free = 0;
  for (const auto& d : h.record.shared_devices) {
    auto it = view.devices.find(d.id);
    if (it == view.devices.end()) continue;
    for (const auto& s : it->second.slices)
      if (s.state == SliceState::kFree || s.state == SliceState::kFenced)
        free += it->second.record.slice_bytes;
  }
  return free;
}

uint64_t FreeOn(const HostRecord& r, const std::string& tier, const std::set<int>* nodes) {
  uint64_t free = 0;
  for (const auto& p : r.pools) {
    if (!tier.empty() && p.tier != tier) continue;
    if (nodes != nullptr && nodes->count(p.node) == 0) continue;
    free += p.free;
  }
  return free;
}

HostRank Rank(const ClusterView& view, const HostView& h, const PlaceRequest& req) {
  HostRank r;
  r.host = h.record.host;
  const bool shared_counts = req.tier.empty() || req.tier == "cxl";
  r.shared_free_bytes = shared_counts ? SharedFree(view, h) : 0;
  if (req.near_free_gpu) {
    const GpuSummary* best = nullptr;
    uint64_t best_free = 0;
    for (const auto& g : h.record.gpus) {
      if (g.busy) continue;
      std::set<int> near(g.nearest_nodes.begin(), g.nearest_nodes.end());
      const uint64_t f = FreeOn(h.record, req.tier, &near);
      if (best == nullptr || f > best_free) best = &g, best_free = f;
    }
    if (best == nullptr) {
      r.reasons.push_back(h.record.gpus.empty() ? "no GPU" : "every GPU is busy");
      return r;
    }
    r.gpu = best->index;
    r.free_bytes = best_free;
    r.reasons.push_back("GPU " + std::to_string(best->index) + " is free, " + GiB(best_free) +
                        " free near it");
  } else {
    r.free_bytes = FreeOn(h.record, req.tier, nullptr);
    r.reasons.push_back(GiB(r.free_bytes) + " free" +
                        (req.tier.empty() ? std::string() : " in " + req.tier));
  }
  if (r.shared_free_bytes > 0) r.reasons.push_back(GiB(r.shared_free_bytes) + " of shared slices");
  if (h.record.shared_fenced) r.reasons.push_back("fenced from shared slices (session was lost)");
  r.fits = r.free_bytes + r.shared_free_bytes >= req.size;
  if (!r.fits) r.reasons.push_back("short of " + GiB(req.size));
  return r;
}

}  // namespace

std::vector<HostRank> RankHosts(const ClusterView& view, const PlaceRequest& req) {
  std::vector<HostRank> out;
  for (const auto& [name, h] : view.hosts) out.push_back(Rank(view, h, req));
  std::stable_sort(out.begin(), out.end(), [](const HostRank& a, const HostRank& b) {
    if (a.fits != b.fits) return a.fits;
    // Local bytes first: a lease from a local pool costs no claim.
    if (a.free_bytes != b.free_bytes) return a.free_bytes > b.free_bytes;
    return a.shared_free_bytes > b.shared_free_bytes;
  });
  return out;
}

}  // namespace cxlpool::cluster
