#include "values/table_reader.h"

#include <sstream>

#include "cxlpool/common/strings.h"
#include "values/value_parser.h"

namespace cxlpool {

const toml::node* TableReader::Get(std::string_view key) {
  seen_.insert(std::string(key));
  return t_.get(key);
}

std::string TableReader::Key(std::string_view key) const {
  return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
}

Status TableReader::ReadString(std::string_view key, std::string* out) {
  const toml::node* n = Get(key);
  if (n == nullptr) return Status::Ok();
  auto v = n->value<std::string>();
  if (!n->is_string() || !v) return BadValue(Key(key), "expected a string");
  *out = *v;
  return Status::Ok();
}

Status TableReader::ReadPath(std::string_view key, std::string* out) {
  CXLPOOL_RETURN_IF_ERROR(ReadString(key, out));
  if (!out->empty() && (*out)[0] != '/') return BadValue(Key(key), "must be an absolute path");
  return Status::Ok();
}

Status TableReader::ReadBool(std::string_view key, bool* out) {
  const toml::node* n = Get(key);
  if (n == nullptr) return Status::Ok();
  if (!n->is_boolean()) return BadValue(Key(key), "expected true or false");
  *out = *n->value<bool>();
  return Status::Ok();
}

Status TableReader::ReadUint(std::string_view key, uint64_t max, uint64_t* out) {
  const toml::node* n = Get(key);
  if (n == nullptr) return Status::Ok();
  if (!n->is_integer()) return BadValue(Key(key), "expected an integer");
  int64_t v = *n->value<int64_t>();
  if (v < 0 || static_cast<uint64_t>(v) > max) {
    return BadValue(Key(key),
                    "out of range (0.." + std::to_string(max) + "): " + std::to_string(v));
  }
  *out = static_cast<uint64_t>(v);
  return Status::Ok();
}

Status TableReader::ReadCount(std::string_view key, uint64_t max, std::optional<uint64_t>* out) {
  if (t_.get(key) == nullptr) {
    Get(key);
    return Status::Ok();
  }
  uint64_t v = 0;
  CXLPOOL_RETURN_IF_ERROR(ReadUint(key, max, &v));
  if (v == 0) return BadValue(Key(key), "must be at least 1");
  *out = v;
  return Status::Ok();
}

Status TableReader::ReadNumber(std::string_view key, double lo, double hi, double* out) {
  const toml::node* n = Get(key);
  if (n == nullptr) return Status::Ok();
  if (!n->is_number()) return BadValue(Key(key), "expected a number");
  double x = n->is_integer() ? static_cast<double>(*n->value<int64_t>()) : *n->value<double>();
  if (!(x >= lo && x <= hi)) {
    return BadValue(Key(key), "out of range (" + std::to_string(lo) + ".." + std::to_string(hi) +
                                  "): " + std::to_string(x));
  }
  *out = x;
  return Status::Ok();
}

Status TableReader::ReadBytes(std::string_view key, std::optional<uint64_t>* out) {
  const toml::node* n = Get(key);
  if (n == nullptr) return Status::Ok();
  if (n->is_integer()) {
    int64_t v = *n->value<int64_t>();
    if (v < 0) return BadValue(Key(key), "negative size");
    *out = static_cast<uint64_t>(v);
    return Status::Ok();
  }
  if (n->is_string()) {
    auto b = ParseByteSize(*n->value<std::string>());
    if (!b.ok()) return BadValue(Key(key), b.status().message());
    *out = *b;
    return Status::Ok();
  }
  return BadValue(Key(key), "expected a size (integer bytes or a string like \"2M\")");
}

Status TableReader::ReadByteLimit(std::string_view key, uint64_t min, uint64_t max,
                                  std::optional<uint64_t>* out) {
  std::optional<uint64_t> v;
  CXLPOOL_RETURN_IF_ERROR(ReadBytes(key, &v));
  if (!v) return Status::Ok();
  if (*v < min || *v > max) {
    return BadValue(Key(key), std::to_string(*v) + " bytes is out of range (" + HumanBytes(min) +
                                  ".." + HumanBytes(max) + ")");
  }
  *out = v;
  return Status::Ok();
}

Status TableReader::ReadCapacity(std::string_view key, CapacitySpec* out) {
  const toml::node* n = Get(key);
  if (n == nullptr) return Status::Ok();
  CapacitySpec c;
  if (n->is_integer()) {
    int64_t v = *n->value<int64_t>();
    if (v < 0) return BadValue(Key(key), "negative capacity");
    c.is_percent = false;
    c.bytes = static_cast<uint64_t>(v);
  } else if (n->is_string()) {
    auto parsed = ParseCapacity(*n->value<std::string>(), Key(key));
    if (!parsed.ok()) return parsed.status();
    c = *parsed;
  } else {
    return BadValue(Key(key), "expected bytes (\"64G\") or a percent (\"90%\")");
  }
  if (!c.is_percent && c.bytes < 4096) {
    return BadValue(Key(key), "capacity of " + std::to_string(c.bytes) +
                                  " bytes holds no page (at least 4K; to turn a node's pool off "
                                  "use enabled = false)");
  }
  *out = c;
  return Status::Ok();
}

Status TableReader::ReadDuration(std::string_view key,
                                 std::optional<std::chrono::milliseconds>* out) {
  const toml::node* n = Get(key);
  if (n == nullptr) return Status::Ok();
  std::string text;
  if (n->is_integer()) {
    int64_t v = *n->value<int64_t>();
    if (v < 0) return BadValue(Key(key), "negative duration");
    text = std::to_string(v);
  } else if (n->is_string()) {
    text = *n->value<std::string>();
  } else {
    return BadValue(Key(key), "expected a duration (\"30s\", \"500ms\", \"10m\")");
  }
  auto d = ParseDuration(text, Key(key));
  if (!d.ok()) return d.status();
  *out = *d;
  return Status::Ok();
}

Status TableReader::ReadDuration(std::string_view key, std::chrono::milliseconds* out) {
  std::optional<std::chrono::milliseconds> d;
  CXLPOOL_RETURN_IF_ERROR(ReadDuration(key, &d));
  if (d) *out = *d;
  return Status::Ok();
}

Result<const toml::table*> TableReader::Table(std::string_view key, const std::string& what) {
  const toml::node* n = Get(key);
  if (n == nullptr) return static_cast<const toml::table*>(nullptr);
  const toml::table* t = n->as_table();
  if (t == nullptr) return BadValue(Key(key), "expected " + what);
  return t;
}

Result<const toml::array*> TableReader::Tables(std::string_view key) {
  const toml::node* n = Get(key);
  if (n == nullptr) return static_cast<const toml::array*>(nullptr);
  const toml::array* a = n->as_array();
  if (a == nullptr) {
    return BadValue(Key(key), "expected [[" + std::string(key) + "]] tables");
  }
  return a;
}

Status TableReader::CheckUnknown() const {
  for (const auto& [k, v] : t_) {
    if (!seen_.count(std::string(k.str()))) return BadValue(Key(k.str()), "unknown key");
  }
  return Status::Ok();
}

Status ReadTomlText(std::string_view text, const std::string& origin,
                    const std::function<Status(const toml::table&)>& read) {
  try {
    toml::table root = toml::parse(text, origin);
    Status st = read(root);
    if (!st.ok()) return Status(st.code(), origin + ": " + st.message());
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << origin << ":" << e.source().begin.line << ":" << e.source().begin.column << ": "
       << e.description();
    return Status(Code::kInvalidArgument, os.str());
  } catch (const std::exception& e) {
    return Status(Code::kInvalidArgument, origin + ": " + e.what());
  }
  return Status::Ok();
}

}  // namespace cxlpool
