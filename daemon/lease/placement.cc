#include "lease/placement.h"

#include <algorithm>
#include <climits>
#include <set>

#include "cxlpool/common/proc.h"
#include "cxlpool/common/strings.h"
#include "lease/tier_names.h"

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

bool IsShared(const Pool* p) { return std::string(p->backing()) == "shared-slice"; }
// Device memory (never migrated): devdax pools and shared devices' slices.
bool IsDevdax(const Pool* p) { return std::string(p->backing()) == "devdax" || IsShared(p); }
std::string TierOf(const Pool* p) {
  if (IsShared(p)) return "shared";
  return IsDevdax(p) ? "devdax" : p->kind();
}

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

enum class PinFit { kStays, kSettle, kMoves, kRefused };

PinFit FitForPin(const Topology& topo, const Pool* p) {
  if (IsDevdax(p)) return PinFit::kStays;  // device memory is never migrated
  switch (p->long_term_pin_policy()) {
    case LongTermPinPolicy::kRefuse:
      return PinFit::kRefused;
    case LongTermPinPolicy::kAllow:
      return PinFit::kStays;
    case LongTermPinPolicy::kAuto:
      break;
  }
  const NumaNode* n = topo.FindNode(p->numa_node());
  switch (n != nullptr ? LongTermPinsOf(*n) : LongTermPins::kUnknown) {
    case LongTermPins::kNo:
      return PinFit::kMoves;
    case LongTermPins::kPartly:
      return PinFit::kSettle;
    case LongTermPins::kYes:
    case LongTermPins::kUnknown:  // no zone facts: the kernel's default (kernel zones)
      return PinFit::kStays;
  }
  return PinFit::kStays;
}

std::string PoolNames(const std::vector<Pool*>& pools) {
  std::string s;
  for (Pool* p : pools) s += (s.empty() ? "" : ", ") + p->name();
  return s.empty() ? "none" : s;
}

std::string NodeIds(const Topology& topo) {
  std::string s;
  for (const auto& n : topo.numa_nodes) s += (s.empty() ? "" : ", ") + std::to_string(n.id);
  return s.empty() ? "none" : s;
}

// A request named `node` and no pool is there: NOT_FOUND when the node does
// not exist; else UNSUPPORTED saying why it is not pooled and what pools it.
Status NoPoolOnNode(const Topology& topo, int node, const std::vector<Pool*>& pools) {
  const std::string id = std::to_string(node);
  const NumaNode* n = topo.FindNode(node);
  if (n == nullptr) {
    return Status(Code::kNotFound, "no NUMA node " + id + " (nodes: " + NodeIds(topo) +
                                       "; pools: " + PoolNames(pools) + ")");
  }
  std::string why;
  if (auto reason = NotPooledReason(*n)) {
    why = *reason;
    if (n->kind == NodeKind::kGpu) {
      why += "; no config key pools it";
    } else if (!n->memory_bytes || *n->memory_bytes == 0) {
      why += "; nothing to pool";
    }
  } else {
    // Pooled by default, so the config turned it off.
    why = "excluded by config ([pools.node." + id +
          "] enabled = false); set enabled = true there and restart cxlpoold to pool it";
  }
  return Status(Code::kUnsupported, "NUMA node " + id + " (kind " + NodeKindName(n->kind) +
                                        ") is not pooled: " + why + " (pools: " + PoolNames(pools) +
                                        ")");
}

}  // namespace

std::optional<std::string> LongTermPinRefusal(const Topology& topo, const Pool* pool) {
  const std::string node = "node " + std::to_string(pool->numa_node());
  switch (FitForPin(topo, pool)) {
    case PinFit::kStays:
    case PinFit::kSettle:
      return std::nullopt;
    case PinFit::kRefused:
      return node + " takes no long-term pinned leases ([pools.node." +
             std::to_string(pool->numa_node()) + "] long_term_pins = \"refuse\")";
    case PinFit::kMoves:
      break;
  }
  const NumaNode* n = topo.FindNode(pool->numa_node());
  std::string size = n != nullptr && n->movable_bytes ? HumanBytes(*n->movable_bytes) + " " : "";
  return node + " cannot hold a long-term pin: its " + size +
         "memory is all in ZONE_MOVABLE, so pinning the lease (CUDA registration, RDMA, io_uring "
         "fixed buffers) would migrate every page to another node; to fix, " +
         topo.KernelZoneRemedy(pool->numa_node());
}

namespace {

// Unknown tier names, and a GPU and a node both named.
Status CheckPlacementRequest(const PlacementRequest& req) {
  for (const auto& t : req.tiers) {
    if (!IsTierName(t)) {
      return Status(Code::kInvalidArgument,
                    "unknown tier '" + t + "' (known: " + TierNamesHint() + ")");
    }
  }
  if (req.numa_node && !req.gpu.empty()) {
    return Status(Code::kInvalidArgument, "name a GPU or a NUMA node, not both");
  }
  return Status::Ok();
}

// A named node's pools first (memfd, then devdax), then the rest by distance.
Status OrderForNode(const Topology& topo, const std::vector<Pool*>& pools,
                    const PlacementRequest& req, std::vector<Candidate>* out) {
  int node = *req.numa_node;
  for (Pool* p : pools) {
    if (p->numa_node() == node && !IsDevdax(p)) {
      out->push_back({p, "requested NUMA node " + std::to_string(node)});
    }
  }
  for (Pool* p : pools) {
    if (p->numa_node() == node && IsDevdax(p)) {
      out->push_back({p, "requested NUMA node " + std::to_string(node) + " (devdax)"});
    }
  }
  const bool excluded_here = std::any_of(req.exclude.begin(), req.exclude.end(),
                                         [&](const Pool* p) { return p->numa_node() == node; });
  if (out->empty() && !excluded_here) return NoPoolOnNode(topo, node, pools);
  AppendByDistance(topo, pools, node, "fallback by distance from NUMA node " + std::to_string(node),
                   out);
  return Status::Ok();
}

// A named GPU's preferred nodes first, then by distance from its CPU node.
Status OrderForGpu(const Topology& topo, const std::vector<Pool*>& pools,
                   const PlacementRequest& req, std::vector<Candidate>* out) {
  const Gpu* gpu = topo.FindGpuByName(req.gpu);
  if (gpu == nullptr) {
    std::string known;
    for (const auto& g : topo.gpus) known += (known.empty() ? "" : ", ") + std::to_string(g.index);
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
          out->push_back({p, "nearest to " + gname + " (preference #" + std::to_string(i + 1) +
                                 " of " + std::to_string(nodes.size()) + ")"});
        }
      }
    }
  }
  AppendByDistance(topo, pools, gpu->numa_node,
                   "by distance from " + gname + "'s CPU node" +
                       (gpu->numa_node ? " " + std::to_string(*gpu->numa_node) : " (unknown)"),
                   out);
  return Status::Ok();
}

// The candidates by locality: to the named node, the named GPU, or the caller.
Status OrderByLocality(const Topology& topo, const std::vector<Pool*>& pools,
                       const PlacementRequest& req, std::vector<Candidate>* out) {
  if (req.numa_node) return OrderForNode(topo, pools, req, out);
  if (!req.gpu.empty()) return OrderForGpu(topo, pools, req, out);
  AppendByDistance(topo, pools, req.home_node,
                   req.home_node
                       ? "closest to the caller's NUMA node " + std::to_string(*req.home_node)
                       : "caller's node unknown; by node id",
                   out);
  return Status::Ok();
}

// Tier preferences: devdax pools and shared devices join when their tier is
// asked for (never otherwise); the order becomes the tiers' (stable within
// one); strict drops unlisted tiers.
void ApplyTiers(const std::vector<Pool*>& pools, const PlacementRequest& req,
                std::vector<Candidate>* out) {
  if (req.tiers.empty()) return;
  for (const char* tier : {"devdax", "shared"}) {
    if (std::find(req.tiers.begin(), req.tiers.end(), tier) == req.tiers.end()) continue;
    for (Pool* p : pools) {
      bool have =
          std::any_of(out->begin(), out->end(), [&](const Candidate& c) { return c.pool == p; });
      if (IsDevdax(p) && TierOf(p) == tier && !have) {
        out->push_back({p, IsShared(p) ? "shared device's slices" : "devdax pool"});
      }
    }
  }
  auto rank = [&](const Candidate& c) {
    auto it = std::find(req.tiers.begin(), req.tiers.end(), TierOf(c.pool));
    return static_cast<size_t>(it - req.tiers.begin());  // unlisted: tiers.size()
  };
  std::stable_sort(out->begin(), out->end(),
                   [&](const Candidate& a, const Candidate& b) { return rank(a) < rank(b); });
  for (auto& c : *out) {
    size_t r = rank(c);
    c.reason += r < req.tiers.size()
                    ? "; tier " + TierOf(c.pool) + " is preference #" + std::to_string(r + 1)
                    : "; tier " + TierOf(c.pool) + " not in the preference list";
  }
  if (req.strict) {
    out->erase(std::remove_if(out->begin(), out->end(),
                              [&](const Candidate& c) { return rank(c) >= req.tiers.size(); }),
               out->end());
  }
}

// Rule 4: never where a long-term pin would move the pages off the node.
Status ApplyLongTermPin(const Topology& topo, const PlacementRequest& req,
                        std::vector<Candidate>* out) {
  if (req.strict) {
    if (auto why = LongTermPinRefusal(topo, (*out)[0].pool)) {
      return Status(Code::kUnsupported, "strict long-term pinned lease refused: " + *why);
    }
  }
  std::vector<Candidate> kept;
  std::string skipped;
  std::optional<std::string> first_refusal;
  for (auto& c : *out) {
    if (auto why = LongTermPinRefusal(topo, c.pool)) {
      if (!first_refusal) first_refusal = *why;
      skipped += (skipped.empty() ? "" : ", ") + c.pool->name();
      continue;
    }
    if (FitForPin(topo, c.pool) == PinFit::kSettle) {
      c.settle = true;
      c.reason += "; long-term pin: pages moved into node " + std::to_string(c.pool->numa_node()) +
                  "'s kernel zones before the grant";
    } else if (c.pool->long_term_pin_policy() == LongTermPinPolicy::kAllow) {
      c.reason += "; long-term pin allowed by long_term_pins = \"allow\"";
    }
    if (!skipped.empty()) {
      c.reason += "; skipped " + skipped + " (a long-term pin would move the pages off)";
    }
    kept.push_back(std::move(c));
  }
  if (kept.empty()) {
    return Status(Code::kUnsupported, "long-term pinned lease refused: " + *first_refusal);
  }
  *out = std::move(kept);
  return Status::Ok();
}

}  // namespace

Result<std::vector<Candidate>> PlanPlacement(const Topology& topo,
                                             const std::vector<Pool*>& all_pools,
                                             const PlacementRequest& req) {
  std::vector<Pool*> pools;
  for (Pool* p : all_pools) {
    if (std::find(req.exclude.begin(), req.exclude.end(), p) == req.exclude.end()) {
      pools.push_back(p);
    }
  }
  if (Status st = CheckPlacementRequest(req); !st.ok()) return st;
  std::vector<Candidate> out;
  if (Status st = OrderByLocality(topo, pools, req, &out); !st.ok()) return st;
  ApplyTiers(pools, req, &out);
  if (out.empty()) {
    return Status(Code::kNotFound, "no pool matches the request (pools: " + PoolNames(pools) + ")");
  }
  if (req.long_term_pin) {
    if (Status st = ApplyLongTermPin(topo, req, &out); !st.ok()) return st;
  }
  if (req.strict) {
    out.resize(1);
    out[0].reason += "; strict";
  }
  return out;
}

}  // namespace cxlpool
