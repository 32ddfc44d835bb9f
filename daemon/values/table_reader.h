// TableReader: typed reads of the keys of one TOML table, with the limits of
// values/value_parser.h. It remembers which keys were read, so that the rest
// can be reported as unknown. Every message starts with the dotted key
// ("pools.node.1.capacity: ...").
//
// Thread safety: one reader per thread; it borrows the table.
#pragma once

#include <toml++/toml.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "cxlpool/common/status.h"
#include "pool/pool_options.h"

namespace cxlpool {

class TableReader {
 public:
  // `path`: the table's dotted name ("" for the root).
  TableReader(const toml::table& t, std::string path) : t_(t), path_(std::move(path)) {}

  // The node of `key` (nullptr when absent), marked as read.
  const toml::node* Get(std::string_view key);
  // The dotted name of `key` in this table.
  std::string Key(std::string_view key) const;

  // Each leaves *out as it is when the key is absent.
  Status ReadString(std::string_view key, std::string* out);
  // A string that must be an absolute path when not empty.
  Status ReadPath(std::string_view key, std::string* out);
  Status ReadBool(std::string_view key, bool* out);
  Status ReadUint(std::string_view key, uint64_t max, uint64_t* out);
  // A count 1..max (0 is refused: a limit of nothing).
  Status ReadCount(std::string_view key, uint64_t max, std::optional<uint64_t>* out);
  // An integer or a float lo..hi.
  Status ReadNumber(std::string_view key, double lo, double hi, double* out);
  // An integer (bytes) or a string with a unit ("2M").
  Status ReadBytes(std::string_view key, std::optional<uint64_t>* out);
  // Bytes min..max.
  Status ReadByteLimit(std::string_view key, uint64_t min, uint64_t max,
                       std::optional<uint64_t>* out);
  // Bytes ("64G", at least 4K) or a percent ("90%").
  Status ReadCapacity(std::string_view key, CapacitySpec* out);
  // An integer (seconds) or a string ("30s", "500ms", "10m"); 0..24h.
  Status ReadDuration(std::string_view key, std::optional<std::chrono::milliseconds>* out);
  Status ReadDuration(std::string_view key, std::chrono::milliseconds* out);

  // The sub-table `key` (nullptr when absent); "<key>: expected <what>" when
  // it is something else.
  Result<const toml::table*> Table(std::string_view key, const std::string& what = "a table");
  // The array of tables `key` ([[key]]; nullptr when absent).
  Result<const toml::array*> Tables(std::string_view key);

  // Everything not read is an unknown key.
  Status CheckUnknown() const;

 private:
  const toml::table& t_;
  std::string path_;
  std::set<std::string> seen_;
};

// Parses `text` and runs `read` on its root table. INVALID_ARGUMENT
// "<origin>:<line>:<column>: <what>" for a TOML syntax error; an error of
// `read` gets "<origin>: " in front. toml++ exceptions never leave it.
Status ReadTomlText(std::string_view text, const std::string& origin,
                    const std::function<Status(const toml::table&)>& read);

// Runs `read(reader)` on the sub-table `key` of `top` when there is one,
// then reports its unread keys as unknown.
template <typename Read>
Status ReadTable(TableReader& top, std::string_view key, Read read) {
  auto t = top.Table(key);
  if (!t.ok()) return t.status();
  if (*t == nullptr) return Status::Ok();
  TableReader r(**t, top.Key(key));
  CXLPOOL_RETURN_IF_ERROR(read(r));
  return r.CheckUnknown();
}

// Runs `read(reader, key)` on each table of the array `arr` (named
// "<name>[i]"), stopping at the first error.
template <typename Read>
Status ForEachTable(const toml::array& arr, const std::string& name, Read read) {
  for (size_t i = 0; i < arr.size(); ++i) {
    std::string key = name + "[" + std::to_string(i) + "]";
    const toml::table* t = arr.get(i)->as_table();
    if (t == nullptr) return Status(Code::kInvalidArgument, key + ": expected a table");
    TableReader r(*t, key);
    CXLPOOL_RETURN_IF_ERROR(read(r, key));
  }
  return Status::Ok();
}

}  // namespace cxlpool
