#include "lease/cgroup_match.h"

#include "cxlpool/common/strings.h"

namespace cxlpool {

Result<std::string> NormalizeCgroupPath(std::string_view path) {
  if (path.empty() || path[0] != '/') {
    return Status(Code::kInvalidArgument,
                  "cgroup path '" + std::string(path) + "' must be absolute (\"/system.slice/x\")");
  }
  if (path.size() > 4096) return Status(Code::kInvalidArgument, "cgroup path longer than 4096");
  std::string out;
  for (const auto& part : Split(path, '/')) {
    if (part.empty()) continue;
    if (part == "." || part == "..") {
      return Status(Code::kInvalidArgument,
                    "cgroup path '" + std::string(path) + "' has a '.' or '..' component");
    }
    for (char c : part) {
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
        return Status(Code::kInvalidArgument, "cgroup path has a control character");
      }
    }
    out += "/" + part;
  }
  return out.empty() ? std::string("/") : out;
}

bool CgroupCovers(std::string_view rule_path, std::string_view path) {
  if (path.empty() || rule_path.empty()) return false;
  if (rule_path == "/") return path[0] == '/';
  if (!StartsWith(path, rule_path)) return false;
  return path.size() == rule_path.size() || path[rule_path.size()] == '/';
}

}  // namespace cxlpool
