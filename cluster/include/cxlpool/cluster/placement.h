// Where in the rack N bytes fit: every host ranked for a request, with the
// reasons, from a ClusterView. Hosts whose session is gone are not in the
// view; a host fenced from its shared slices offers only local pools.
//
// A host fits when the free bytes of its pools of the tier (all tiers when
// none is asked) plus, for "cxl" or no tier, the free slices of the shared
// devices it can claim (never quarantined ones) cover the size. With
// near_free_gpu it must also have a GPU no lease is placed for, and the
// bytes must be free on that GPU's nearest nodes. Fitting hosts rank first,
// by most free bytes where asked; the rest follow with why they do not fit.
//
// Thread safety: a pure function.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cxlpool/cluster/cluster_view.h"

namespace cxlpool::cluster {

struct PlaceRequest {
  uint64_t size = 0;
  std::string tier;  // "" : any
  bool near_free_gpu = false;
};

struct HostRank {
  std::string host;
  bool fits = false;
  uint64_t free_bytes = 0;         // in the asked tier, local pools
  uint64_t shared_free_bytes = 0;  // claimable shared slices
  int gpu = -1;                    // the free GPU chosen (near_free_gpu)
  std::vector<std::string> reasons;
};

std::vector<HostRank> RankHosts(const ClusterView& view, const PlaceRequest& req);

}  // namespace cxlpool::cluster
