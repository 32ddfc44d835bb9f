// The one parser of the values the daemon's TOML files hold: durations,
// capacities (bytes or percent) and user and group names. Sizes are
// common/strings.h's ParseByteSize. Every message starts with the dotted
// key ("tiering.interval: ...").
//
// Limits: a duration is 0..24h (kMaxDuration); a key that needs a narrower
// range checks it after parsing.
//
// Thread safety: reentrant functions.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "cxlpool/common/status.h"
#include "pool/pool_options.h"

namespace cxlpool {

inline constexpr std::chrono::milliseconds kMaxDuration = std::chrono::hours(24);

// INVALID_ARGUMENT "<key>: <what>".
Status BadValue(const std::string& key, const std::string& what);

// Parses a duration: "10s", "500ms", "2m", "1h", or a bare number of
// seconds ("0", "30"). At most kMaxDuration. INVALID_ARGUMENT names `key`.
Result<std::chrono::milliseconds> ParseDuration(std::string_view text, const std::string& key);

// Parses "90%", "64G", "1073741824". INVALID_ARGUMENT names `key`.
Result<CapacitySpec> ParseCapacity(std::string_view text, const std::string& key);

// The uid of user `name` / gid of group `name`; nullopt if there is none.
std::optional<uint32_t> LookupUser(const std::string& name);
std::optional<uint32_t> LookupGroup(const std::string& name);

}  // namespace cxlpool
