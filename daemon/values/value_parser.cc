#include "values/value_parser.h"

#include <grp.h>
#include <pwd.h>

#include <cstdlib>

#include "cxlpool/common/strings.h"

namespace cxlpool {

Status BadValue(const std::string& key, const std::string& what) {
  return Status(Code::kInvalidArgument, key + ": " + what);
}

Result<std::chrono::milliseconds> ParseDuration(std::string_view text, const std::string& key) {
  std::string_view t = Trim(text);
  uint64_t scale = 1000;  // a bare number is seconds
  if (EndsWith(t, "ms")) {
    scale = 1;
    t.remove_suffix(2);
  } else if (EndsWith(t, "s")) {
    t.remove_suffix(1);
  } else if (EndsWith(t, "m")) {
    scale = 60 * 1000;
    t.remove_suffix(1);
  } else if (EndsWith(t, "h")) {
    scale = 3600 * 1000;
    t.remove_suffix(1);
  }
  constexpr uint64_t kMaxMs = static_cast<uint64_t>(kMaxDuration.count());
  auto v = ParseU64(Trim(t));
  if (!v || *v > kMaxMs / scale) {
    return BadValue(key, "bad duration '" + std::string(text) +
                             "' (want e.g. \"10s\", \"500ms\", \"2m\" or \"0\"; at most 24h)");
  }
  return std::chrono::milliseconds(*v * scale);
}

Result<CapacitySpec> ParseCapacity(std::string_view text, const std::string& key) {
  std::string_view t = Trim(text);
  CapacitySpec spec;
  if (EndsWith(t, "%")) {
    std::string num(Trim(t.substr(0, t.size() - 1)));
    char* end = nullptr;
    double p = num.empty() ? -1 : std::strtod(num.c_str(), &end);
    if (num.empty() || end == nullptr || *end != '\0' || !(p > 0) || p > 100) {
      return BadValue(key, "bad percent '" + std::string(text) + "' (want 0 < N <= 100)");
    }
    spec.is_percent = true;
    spec.percent = p;
    return spec;
  }
  auto b = ParseByteSize(t);
  if (!b.ok()) {
    return BadValue(key, "bad capacity '" + std::string(text) +
                             "' (want bytes like \"64G\" or a percent like \"90%\")");
  }
  spec.is_percent = false;
  spec.bytes = *b;
  return spec;
}

std::optional<uint32_t> LookupUser(const std::string& name) {
  struct passwd pw, *res = nullptr;
  char buf[4096];
  if (getpwnam_r(name.c_str(), &pw, buf, sizeof buf, &res) != 0 || res == nullptr) {
    return std::nullopt;
  }
  return res->pw_uid;
}

std::optional<uint32_t> LookupGroup(const std::string& name) {
  struct group gr, *res = nullptr;
  char buf[4096];
  if (getgrnam_r(name.c_str(), &gr, buf, sizeof buf, &res) != 0 || res == nullptr) {
    return std::nullopt;
  }
  return res->gr_gid;
}

}  // namespace cxlpool
