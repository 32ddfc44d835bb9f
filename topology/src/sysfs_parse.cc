// Strict parsers for the sysfs/procfs values the memory discovery reads.
// Declared in memory_internal.h.
#include <algorithm>
#include <cctype>
#include <cstdio>

#include "cxlpool/common/strings.h"
#include "memory_internal.h"

namespace cxlpool::memory_internal {

namespace {
constexpr uint64_t kMaxNodeId = 1u << 20;
}  // namespace

std::string Printable(std::string_view text, size_t max_len) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (out.size() >= max_len) {
      out += "...";
      break;
    }
    unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20 || c >= 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

bool NaturalLess(const std::string& a, const std::string& b) {
  auto digit = [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; };
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (digit(a[i]) && digit(b[j])) {
      size_t ie = i, je = j;
      while (ie < a.size() && digit(a[ie])) ++ie;
      while (je < b.size() && digit(b[je])) ++je;
      // Compare numerically without overflow: strip leading zeros, then
      // longer is bigger, then lexicographic.
      std::string_view x(a.data() + i, ie - i), y(b.data() + j, je - j);
      while (x.size() > 1 && x.front() == '0') x.remove_prefix(1);
      while (y.size() > 1 && y.front() == '0') y.remove_prefix(1);
      if (x.size() != y.size()) return x.size() < y.size();
      if (x != y) return x < y;
      i = ie;
      j = je;
      continue;
    }
    if (a[i] != b[j]) return a[i] < b[j];
    ++i;
    ++j;
  }
  return a.size() - i < b.size() - j;
}

Result<uint64_t> ParseSysfsU64(std::string_view text) {
  auto v = ParseU64(Trim(text), 0);
  if (!v) return Status(Code::kInvalidArgument, "not an integer: '" + Printable(text) + "'");
  return *v;
}

Result<std::optional<int>> ParseNodeId(std::string_view text) {
  auto v = ParseI64(Trim(text));
  if (!v || *v < -1 || *v > static_cast<int64_t>(kMaxNodeId)) {
    return Status(Code::kInvalidArgument, "not a node id: '" + Printable(text) + "'");
  }
  if (*v == -1) return std::optional<int>();
  return std::optional<int>(static_cast<int>(*v));
}

std::optional<int> NumberedName(std::string_view name, std::string_view prefix) {
  if (!StartsWith(name, prefix) || name.size() == prefix.size()) return std::nullopt;
  std::string_view digits = name.substr(prefix.size());
  if (!std::all_of(digits.begin(), digits.end(),
                   [](char c) { return std::isdigit(static_cast<unsigned char>(c)); })) {
    return std::nullopt;
  }
  auto v = ParseU64(digits);
  if (!v || *v > kMaxNodeId) return std::nullopt;
  return static_cast<int>(*v);
}

Result<std::map<int, int>> ParseDistanceRow(std::string_view text, const std::vector<int>& online) {
  auto fields = SplitWhitespace(text);
  if (fields.size() != online.size()) {
    return Status(Code::kInvalidArgument, "distance row has " + std::to_string(fields.size()) +
                                              " values for " + std::to_string(online.size()) +
                                              " online nodes: '" + Printable(text) + "'");
  }
  std::map<int, int> row;
  for (size_t i = 0; i < fields.size(); ++i) {
    auto v = ParseU64(fields[i]);
    if (!v || *v > 255) {
      return Status(Code::kInvalidArgument, "bad distance '" + Printable(fields[i]) + "'");
    }
    row[online[i]] = static_cast<int>(*v);
  }
  return row;
}

Result<std::vector<int>> ParseCpuMask(std::string_view text) {
  std::string_view t = Trim(text);
  if (t.empty()) return Status(Code::kInvalidArgument, "empty cpumask");
  auto words = Split(t, ',');
  std::vector<int> cpus;
  int base = 0;
  for (auto it = words.rbegin(); it != words.rend(); ++it, base += 32) {
    if (it->empty() || it->size() > 8) {
      return Status(Code::kInvalidArgument, "bad cpumask '" + Printable(text) + "'");
    }
    auto w = ParseU64(*it, 16);
    if (!w) return Status(Code::kInvalidArgument, "bad cpumask '" + Printable(text) + "'");
    for (int bit = 0; bit < 32; ++bit) {
      if (*w & (1ull << bit)) cpus.push_back(base + bit);
    }
  }
  std::sort(cpus.begin(), cpus.end());
  return cpus;
}

Result<std::map<int, std::map<std::string, uint64_t>>> ParseZoneinfo(std::string_view text) {
  std::map<int, std::map<std::string, uint64_t>> out;
  // managed wins over present for the same zone; remember which we used.
  std::map<std::pair<int, std::string>, bool> have_managed;
  std::optional<int> node;
  std::string zone;
  bool any_header = false;
  for (const auto& line : Split(text, '\n')) {
    auto f = SplitWhitespace(line);
    if (f.size() == 4 && f[0] == "Node" && f[2] == "zone" && EndsWith(f[1], ",")) {
      auto id = ParseU64(std::string_view(f[1]).substr(0, f[1].size() - 1));
      if (!id || *id > kMaxNodeId) {
        node.reset();
        continue;
      }
      node = static_cast<int>(*id);
      zone = f[3];
      out[*node][zone];  // a zone with no counts is still a zone
      any_header = true;
      continue;
    }
    if (!node || f.size() != 2) continue;
    if (f[0] != "managed" && f[0] != "present") continue;
    auto v = ParseU64(f[1]);
    if (!v) continue;
    auto key = std::make_pair(*node, zone);
    if (f[0] == "managed") {
      out[*node][zone] = *v;
      have_managed[key] = true;
    } else if (!have_managed[key]) {
      out[*node][zone] = *v;
    }
  }
  if (!any_header) return Status(Code::kInvalidArgument, "no 'Node N, zone NAME' lines");
  return out;
}

Result<std::vector<int>> ParseCpuinfoProcessors(std::string_view text) {
  std::vector<int> cpus;
  for (const auto& line : Split(text, '\n')) {
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    auto key = SplitWhitespace(line.substr(0, colon));
    if (key.size() != 1 || key[0] != "processor") continue;
    auto value = SplitWhitespace(line.substr(colon + 1));
    auto id = value.size() == 1 ? ParseU64(value[0]) : std::nullopt;
    if (!id || *id > static_cast<uint64_t>(kMaxCpuListId)) {
      return Status(Code::kInvalidArgument,
                    "processor line '" + Printable(line) + "' does not end in a CPU number");
    }
    cpus.push_back(static_cast<int>(*id));
  }
  if (cpus.empty()) return Status(Code::kInvalidArgument, "no 'processor : N' lines");
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

std::optional<std::string> DominantZone(const std::map<std::string, uint64_t>& counts) {
  std::optional<std::string> best;
  uint64_t best_count = 0;
  for (const auto& [name, count] : counts) {
    if (count > best_count) {
      best = name;
      best_count = count;
    }
  }
  return best;
}

}  // namespace cxlpool::memory_internal

namespace cxlpool::memory_internal {

void SysfsReader::Warn(std::string line) { topo_->warnings.push_back(std::move(line)); }

std::optional<std::string> SysfsReader::Read(const std::string& path, bool required) {
  auto r = fs_.ReadFile(path);
  if (!r.ok()) {
    if (r.status().code() != Code::kNotFound || required) {
      Warn(path + ": " +
           (r.status().code() == Code::kNotFound ? std::string("missing") : r.status().ToString()));
    }
    return std::nullopt;
  }
  return std::string(TrimSysfsValue(r.value()));
}

std::optional<uint64_t> SysfsReader::ReadU64(const std::string& path, bool required) {
  auto text = Read(path, required);
  if (!text) return std::nullopt;
  auto v = ParseSysfsU64(*text);
  if (!v.ok()) {
    Warn(path + ": " + v.status().message());
    return std::nullopt;
  }
  return v.value();
}

std::optional<int> SysfsReader::ReadNodeId(const std::string& path, bool required) {
  auto text = Read(path, required);
  if (!text) return std::nullopt;
  auto v = ParseNodeId(*text);
  if (!v.ok()) {
    Warn(path + ": " + v.status().message());
    return std::nullopt;
  }
  return v.value();
}

std::optional<std::vector<int>> SysfsReader::ReadList(const std::string& path, bool required,
                                                      int max_id) {
  auto text = Read(path, required);
  if (!text) return std::nullopt;
  auto v = ParseCpuList(*text, max_id);
  if (!v.ok()) {
    Warn(path + ": bad list '" + Printable(*text) + "'");
    return std::nullopt;
  }
  return v.value();
}

std::string DirName(std::string_view path) {
  while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  auto pos = path.rfind('/');
  if (pos == std::string_view::npos) return ".";
  if (pos == 0) return "/";
  return std::string(path.substr(0, pos));
}

}  // namespace cxlpool::memory_internal
