// Small text helpers shared by the sysfs parsers, the config and the CLI.
// All parsers are strict: trailing garbage is an error, never silently ignored.
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cxlpool/common/status.h"

namespace cxlpool {

std::vector<std::string> Split(std::string_view s, char sep);
// Splits on any run of whitespace; no empty fields.
std::vector<std::string> SplitWhitespace(std::string_view s);
std::string_view Trim(std::string_view s);
// A sysfs or procfs value as a kernel (or a capture of one) wrote it: leading
// whitespace, and any trailing run of whitespace and NUL bytes, removed
// ("0-31\n\0" -> "0-31"). Real machines pad some attributes with a NUL;
// hwloc reads them as C strings, so it never sees the padding. A NUL with
// anything but whitespace or NULs after it stays: that is garbage to report,
// not padding.
std::string_view TrimSysfsValue(std::string_view s);
bool StartsWith(std::string_view s, std::string_view prefix);
bool EndsWith(std::string_view s, std::string_view suffix);

// Decimal (or 0x-prefixed hex when base is 0) integers, whole string only:
// nullopt for a sign on ParseU64 ("-1", "+1"), for anything out of range
// ("18446744073709551616") and for trailing text.
std::optional<uint64_t> ParseU64(std::string_view s, int base = 10);
std::optional<int64_t> ParseI64(std::string_view s, int base = 10);

// Linux cpulist format: "0-3,8,10-11" (node lists too). Empty string is an
// empty list. Ids above `max_id` are refused: no kernel has more than
// kMaxCpuListId + 1 CPUs (NR_CPUS is at most 8192 today) or kMaxNodeListId + 1
// nodes (NODES_SHIFT at most 10), and a garbled file must not make callers
// loop over millions of ids. Overlapping parts cost nothing extra.
inline constexpr int kMaxCpuListId = 16383;
inline constexpr int kMaxNodeListId = 1023;
Result<std::vector<int>> ParseCpuList(std::string_view s, int max_id = kMaxCpuListId);
// Inverse of ParseCpuList: {0,1,2,3,8} -> "0-3,8".
std::string FormatCpuList(const std::vector<int>& cpus);

// "4096", "64K", "2M", "1G", "1GiB", "1.5G", "1T" -> bytes (binary units).
// INVALID_ARGUMENT for a sign ("-1"), no digit, an unknown unit, or a value
// over 2^64-1 ("18446744073709551616", "16385P").
Result<uint64_t> ParseByteSize(std::string_view s);
// 1073741824 -> "1.0 GiB".
std::string HumanBytes(uint64_t bytes);

// Replaces every byte that is not part of valid UTF-8 with '?'. Text from the
// kernel (process names, cgroup paths, sysfs values) may be any bytes, but
// protobuf strings and JSON must be UTF-8.
std::string SanitizeUtf8(std::string_view s);

// "/proc/meminfo"-style text ("Node 0 MemTotal:  123 kB") -> key -> bytes.
// The optional "Node N " prefix is stripped; values without "kB" are counts.
std::map<std::string, uint64_t> ParseMeminfo(std::string_view text);

}  // namespace cxlpool
