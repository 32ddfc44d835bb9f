#include "cxlpool/common/strings.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace cxlpool {

std::vector<std::string> Split(std::string_view s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    size_t pos = s.find(sep, start);
    out.emplace_back(s.substr(start, pos == std::string_view::npos ? s.npos : pos - start));
    if (pos == std::string_view::npos) break;
    start = pos + 1;
  }
  return out;
}

std::vector<std::string> SplitWhitespace(std::string_view s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
    size_t j = i;
    while (j < s.size() && !std::isspace(static_cast<unsigned char>(s[j]))) ++j;
    if (j > i) out.emplace_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::string_view TrimSysfsValue(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && (s.back() == '\0' || std::isspace(static_cast<unsigned char>(s.back())))) {
    s.remove_suffix(1);
  }
  return s;
}

bool StartsWith(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool EndsWith(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}

std::optional<uint64_t> ParseU64(std::string_view s, int base) {
  s = Trim(s);
  if (base == 0) {
    if (StartsWith(s, "0x") || StartsWith(s, "0X")) {
      s.remove_prefix(2);
      base = 16;
    } else {
      base = 10;
    }
  }
  if (s.empty()) return std::nullopt;
  uint64_t v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v, base);
  if (ec != std::errc() || ptr != s.data() + s.size()) return std::nullopt;
  return v;
}

std::optional<int64_t> ParseI64(std::string_view s, int base) {
  s = Trim(s);
  if (s.empty()) return std::nullopt;
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v, base);
  if (ec != std::errc() || ptr != s.data() + s.size()) return std::nullopt;
  return v;
}

Result<std::vector<int>> ParseCpuList(std::string_view s, int max_id) {
  std::vector<int> out;
  s = Trim(s);
  if (s.empty()) return out;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& part : Split(s, ',')) {
    auto dash = part.find('-');
    auto lo = ParseU64(part.substr(0, dash));
    auto hi = dash == std::string::npos ? lo : ParseU64(part.substr(dash + 1));
    if (!lo || !hi || *hi < *lo) {
      return Status(Code::kInvalidArgument, "bad cpu list '" + std::string(s) + "'");
    }
    if (max_id < 0 || *hi > static_cast<uint64_t>(max_id)) {
      return Status(Code::kInvalidArgument, "list '" + std::string(s.substr(0, 64)) +
                                                "' names id " + std::to_string(*hi) + ", above " +
                                                std::to_string(max_id));
    }
    ranges.emplace_back(*lo, *hi);
  }
  // Merge first, so each id is produced once however the parts overlap.
  std::sort(ranges.begin(), ranges.end());
  uint64_t next = 0;  // first id not produced yet
  for (const auto& [lo, hi] : ranges) {
    for (uint64_t c = std::max(lo, next); c <= hi; ++c) out.push_back(static_cast<int>(c));
    next = std::max(next, hi + 1);
  }
  return out;
}

std::string FormatCpuList(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(cpus[i]);
    if (j > i) {
      out += '-';
      out += std::to_string(cpus[j]);
    }
    i = j + 1;
  }
  return out;
}

Result<uint64_t> ParseByteSize(std::string_view s) {
  std::string_view t = Trim(s);
  size_t i = 0;
  while (i < t.size() && (std::isdigit(static_cast<unsigned char>(t[i])) || t[i] == '.')) ++i;
  std::string num(t.substr(0, i));
  std::string unit(Trim(t.substr(i)));
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (EndsWith(unit, "IB"))
    unit.resize(unit.size() - 2);
  else if (unit.size() == 2 && unit[1] == 'B')
    unit.resize(1);
  else if (unit == "B")
    unit.clear();
  uint64_t mult = 1;
  if (unit.empty())
    mult = 1;
  else if (unit == "K")
    mult = 1ull << 10;
  else if (unit == "M")
    mult = 1ull << 20;
  else if (unit == "G")
    mult = 1ull << 30;
  else if (unit == "T")
    mult = 1ull << 40;
  else
    return Status(Code::kInvalidArgument, "bad size unit in '" + std::string(s) + "'");
  if (num.find_first_of("0123456789") == std::string::npos ||
      std::count(num.begin(), num.end(), '.') > 1) {
    return Status(Code::kInvalidArgument, "bad size '" + std::string(s) + "'");
  }
  if (num.find('.') == std::string::npos) {
    auto v = ParseU64(num);
    if (!v || (*v != 0 && mult > UINT64_MAX / *v)) {
      return Status(Code::kInvalidArgument, "bad size '" + std::string(s) + "'");
    }
    return *v * mult;
  }
  double d = std::strtod(num.c_str(), nullptr);
  double bytes = std::floor(d * static_cast<double>(mult));
  if (!(bytes >= 0) || bytes > 1.8e19) {
    return Status(Code::kInvalidArgument, "bad size '" + std::string(s) + "'");
  }
  return static_cast<uint64_t>(bytes);
}

std::string HumanBytes(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  else
    std::snprintf(buf, sizeof buf, "%.1f %s", v, kUnits[u]);
  return buf;
}

std::string SanitizeUtf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80           ? 1
                 : (c >> 5) == 0x6  ? 2
                 : (c >> 4) == 0xe  ? 3
                 : (c >> 3) == 0x1e ? 4
                                    : 0;
    bool ok = len > 0 && i + len <= s.size();
    for (size_t k = 1; ok && k < len; ++k) {
      ok = (static_cast<unsigned char>(s[i + k]) & 0xc0) == 0x80;
    }
    if (ok && len > 1) {
      // Reject overlong forms, surrogates and code points past U+10FFFF.
      uint32_t cp = c & (0xff >> (len + 1));
      for (size_t k = 1; k < len; ++k)
        cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
      static const uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
      ok = cp >= kMin[len] && cp <= 0x10ffff && !(cp >= 0xd800 && cp <= 0xdfff);
    }
    if (ok) {
      out.append(s.substr(i, len));
      i += len;
    } else {
      out.push_back('?');
      ++i;
    }
  }
  return out;
}

std::map<std::string, uint64_t> ParseMeminfo(std::string_view text) {
  std::map<std::string, uint64_t> out;
  for (const auto& line : Split(text, '\n')) {
    auto f = SplitWhitespace(line);
    size_t k = 0;
    if (f.size() >= 2 && f[0] == "Node") k = 2;  // "Node 0 MemTotal: ..."
    if (f.size() < k + 2) continue;
    std::string key = f[k];
    if (key.empty() || key.back() != ':') continue;
    key.pop_back();
    auto v = ParseU64(f[k + 1]);
    if (!v) continue;
    bool kb = f.size() > k + 2 && f[k + 2] == "kB";
    out[key] = kb ? *v * 1024 : *v;
  }
  return out;
}

}  // namespace cxlpool
