// The stable `cxlpoolctl topology --json` form of a Topology (schema in
// docs/topology-json.md, schema_version 1). Every documented field is always
// present; an absent fact is null, never omitted. Keys keep schema order.
//
// Thread safety: pure functions of their argument.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "cxlpool/topology/topology.h"

namespace cxlpool {

nlohmann::ordered_json TopologyToJson(const Topology& topo);

// TopologyToJson(topo).dump(indent) plus a trailing newline. Never throws:
// invalid UTF-8 in a sysfs string is replaced, not an exception.
std::string TopologyToJsonString(const Topology& topo, int indent = 2);

}  // namespace cxlpool
