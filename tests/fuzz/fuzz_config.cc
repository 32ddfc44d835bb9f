// Fuzz target: the daemon's TOML configuration parser. Any input must give a
// config or an INVALID_ARGUMENT naming a key; never a crash or an exception.
#include <cstdint>
#include <string_view>

#include "config/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto r = cxlpool::ParseConfig(text, "<fuzz>");
  if (r.ok()) {
    for (const auto& [node, pool] : r->node_pools) (void)pool.capacity.Resolve(1ull << 40);
  } else if (r.status().code() != cxlpool::Code::kInvalidArgument) {
    __builtin_trap();  // parse errors are INVALID_ARGUMENT, nothing else
  }
  return 0;
}
