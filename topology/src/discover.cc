// DiscoverTopology: the memory side, then GPUs, then the preference.
#include "cxlpool/topology/discover.h"

#include <exception>
#include <string>

namespace cxlpool {

Topology DiscoverTopology(const FileSystem& fs, const DiscoverOptions& options) {
  Topology topo;
  // Discovery reports problems as warnings; this catch only keeps a bug
  // (e.g. an unchecked std::stoi on garbage) from escaping as an exception.
  try {
    DiscoverMemory(fs, &topo);
  } catch (const std::exception& e) {
    topo.warnings.push_back(std::string("memory discovery stopped early: ") + e.what());
  }
  try {
    DiscoverGpus(fs, options, &topo);
  } catch (const std::exception& e) {
    topo.warnings.push_back(std::string("GPU discovery stopped early: ") + e.what());
  }
  ComputeGpuMemoryPreference(&topo);
  return topo;
}

}  // namespace cxlpool
