#include "lease/placement.h"

#include <algorithm>
#include <climits>
#include <set>

#include "cxlpool/common/proc.h"
#include "cxlpool/common/strings.h"

namespace cxlpool {

std::optional<int> NodeOfCpu(const Topology& topo, int cpu) {
  for (const auto& n : topo.numa_nodes) {
    if (std::find(n.cpus.begin(), n.cpus.end(), cpu) != n.cpus.end()) return n.id;
  }
  return std::nullopt;
}

std::optional<int> OnlyCpuNode(const Topology& topo) {
  std::optional<int> only;
  for (const auto& n : topo.numa_nodes) {
    if (n.cpus.empty()) continue;
    if (only) return std::nullopt;
    only = n.id;
  }
  return only;
}

std::optional<int> LastCpuOf(const FileSystem& proc, pid_t pid) {
  auto st = ReadProcStat(proc, pid);
  if (!st.ok() || st->processor < 0) return std::nullopt;
  return st->processor;
}

namespace {

bool IsDevdax(const Pool* p) { return std::string(p->backing()) == "devdax"; }
std::string TierOf(const Pool* p) { return IsDevdax(p) ? "devdax" : p->kind(); }

int Distance(const Topology& topo, int from, int to) {
  if (from == to) return 10;
  const NumaNode* n = topo.FindNode(from);
  if (n == nullptr) return INT_MAX / 2;
  auto it = n->distances.find(to);
  return it == n->distances.end() ? INT_MAX / 2 : it->second;
}

// memfd pools not yet in `out`, by distance from `from`, ties by node id.
void AppendByDistance(const Topology& topo, const std::vector<Pool*>& pools,
                      std::optional<int> from, const std::string& why,
                      std::vector<Candidate>* out) {
  std::set<Pool*> have;
  for (const auto& c : *out) have.insert(c.pool);
  std::vector<Pool*> rest;
  for (Pool* p : pools) {
    if (!IsDevdax(p) && !have.count(p)) rest.push_back(p);
  }
  std::stable_sort(rest.begin(), rest.end(), [&](Pool* a, Pool* b) {
    int da = from ? Distance(topo, *from, a->numa_node()) : 0;
    int db = from ? Distance(topo, *from, b->numa_node()) : 0;
    if (da != db) return da < db;
    return a->numa_node() < b->numa_node();
  });
  for (Pool* p : rest) {
    std::string r = why;
    if (from) r += " (distance " + std::to_string(Distance(topo, *from, p->numa_node())) + ")";
    out->push_back({p, r});
  }
}

std::string PoolNames(const std::vector<Pool*>& pools) {
  std::string s;
  for (Pool* p : pools) s += (s.empty() ? "" : ", ") + p->name();
  return s.empty() ? "none" : s;
}

}  // namespace

Result<std::vector<Candidate>> PlanPlacement(const Topology& topo, const std::vector<Pool*>& pools,
                                             const PlacementRequest& req) {
  static const std::set<std::string> kTiers = {"dram", "cxl", "hbm", "nvm", "unknown", "devdax"};
  for (const auto& t : req.tiers) {
    if (!kTiers.count(t)) {
      return Status(Code::kInvalidArgument,
                    "unknown tier '" + t + "' (known: dram, cxl, hbm, nvm, devdax)");
    }
  }
  if (req.numa_node && !req.gpu.empty()) {
    return Status(Code::kInvalidArgument, "name a GPU or a NUMA node, not both");
  }
  std::vector<Candidate> out;
  if (req.numa_node) {
    int node = *req.numa_node;
    for (Pool* p : pools) {
      if (p->numa_node() == node && !IsDevdax(p)) {
        out.push_back({p, "requested NUMA node " + std::to_string(node)});
      }
    }
    for (Pool* p : pools) {
      if (p->numa_node() == node && IsDevdax(p)) {
        out.push_back({p, "requested NUMA node " + std::to_string(node) + " (devdax)"});
      }
    }
    if (out.empty()) {
      return Status(Code::kNotFound, "no pool on NUMA node " + std::to_string(node) +
                                         " (pools: " + PoolNames(pools) + ")");
    }
    AppendByDistance(topo, pools, node,
                     "fallback by distance from NUMA node " + std::to_string(node), &out);
  } else if (!req.gpu.empty()) {
    const Gpu* gpu = topo.FindGpuByName(req.gpu);
    if (gpu == nullptr) {
      std::string known;
      for (const auto& g : topo.gpus)
        known += (known.empty() ? "" : ", ") + std::to_string(g.index);
      return Status(Code::kNotFound,
                    "no GPU '" + req.gpu + "' (known: " + (known.empty() ? "none" : known) + ")");
    }
    std::string gname = "GPU " + std::to_string(gpu->index);
    auto pref = topo.gpu_memory_preference.find(gpu->index);
    if (pref != topo.gpu_memory_preference.end()) {
      const auto& nodes = pref->second;
      for (size_t i = 0; i < nodes.size(); ++i) {
        for (Pool* p : pools) {
          if (p->numa_node() == nodes[i] && !IsDevdax(p)) {
            out.push_back({p, "nearest to " + gname + " (preference #" + std::to_string(i + 1) +
                                  " of " + std::to_string(nodes.size()) + ")"});
          }
        }
      }
    }
    AppendByDistance(topo, pools, gpu->numa_node,
                     "by distance from " + gname + "'s CPU node" +
                         (gpu->numa_node ? " " + std::to_string(*gpu->numa_node) : " (unknown)"),
                     &out);
  } else {
    AppendByDistance(topo, pools, req.home_node,
                     req.home_node
                         ? "closest to the caller's NUMA node " + std::to_string(*req.home_node)
                         : "caller's node unknown; by node id",
                     &out);
  }
  if (!req.tiers.empty()) {
    // devdax pools join only when asked for by tier.
    if (std::find(req.tiers.begin(), req.tiers.end(), "devdax") != req.tiers.end()) {
      for (Pool* p : pools) {
        bool have =
            std::any_of(out.begin(), out.end(), [&](const Candidate& c) { return c.pool == p; });
        if (IsDevdax(p) && !have) out.push_back({p, "devdax pool"});
      }
    }
    auto rank = [&](const Candidate& c) {
      auto it = std::find(req.tiers.begin(), req.tiers.end(), TierOf(c.pool));
      return static_cast<size_t>(it - req.tiers.begin());  // unlisted: tiers.size()
    };
    std::stable_sort(out.begin(), out.end(),
                     [&](const Candidate& a, const Candidate& b) { return rank(a) < rank(b); });
    for (auto& c : out) {
      size_t r = rank(c);
      c.reason += r < req.tiers.size()
                      ? "; tier " + TierOf(c.pool) + " is preference #" + std::to_string(r + 1)
                      : "; tier " + TierOf(c.pool) + " not in the preference list";
    }
    if (req.strict) {
      out.erase(std::remove_if(out.begin(), out.end(),
                               [&](const Candidate& c) { return rank(c) >= req.tiers.size(); }),
                out.end());
    }
  }
  if (out.empty()) {
    return Status(Code::kNotFound, "no pool matches the request (pools: " + PoolNames(pools) + ")");
  }
  if (req.strict) {
    out.resize(1);
    out[0].reason += "; strict";
  }
  return out;
}

}  // namespace cxlpool
