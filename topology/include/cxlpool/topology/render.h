// Human view of a Topology for `cxlpoolctl topology`: a tree of NUMA nodes
// (kind, tier, size, cpus, DAX/CXL backing, HMAT figures, local GPUs), the
// DAX and CXL devices, then a GPU x node matrix in the style of
// `nvidia-smi topo -m` (SLIT distance / preference rank per cell), then the
// warnings. The text is for people; scripts use --json (json.h).
//
// Thread safety: pure function of its argument.
#pragma once

#include <string>

#include "cxlpool/topology/topology.h"

namespace cxlpool {

std::string RenderTopologyText(const Topology& topo);

}  // namespace cxlpool
