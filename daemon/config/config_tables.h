// The readers of the configuration's tables, one per TOML table; Build
// (config.cc) runs them in order over the root table. Each reads nothing
// when its table is absent, and reports the table's unknown keys.
//
// Thread safety: reentrant functions.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "config/config.h"
#include "values/table_reader.h"

namespace cxlpool {

Status ReadDaemonTable(TableReader& top, DaemonConfig* cfg);    // [daemon]
Status ReadPoolsTables(TableReader& top, PoolsConfig* pools);   // [pools], [pools.node.N]
Status ReadDevdaxTables(TableReader& top, PoolsConfig* pools);  // [[devdax]]
Status ReadPrioritiesTable(TableReader& top,                    // [priorities]
                           std::map<int32_t, CapacitySpec>* reserves);
Status ReadMetricsTable(TableReader& top, std::string* http_listen);  // [metrics]
Status ReadTieringTable(TableReader& top, TieringConfig* tiering);    // [tiering]
Status ReadLimitsTable(TableReader& top, LimitsConfig* limits);       // [limits]
Status ReadClusterTable(TableReader& top, ClusterOptions* cluster);   // [cluster]
// [[quota]]: ReadQuotaTables (lease/quota_rules.h).

}  // namespace cxlpool
