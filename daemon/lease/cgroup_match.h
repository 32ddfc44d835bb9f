// Cgroup paths as quotas name them: normalized unified-hierarchy paths, and
// whether a rule's cgroup covers a tenant's (a rule on "/a" covers "/a" and
// everything below it).
//
// Thread safety: pure functions.
#pragma once

#include <string>
#include <string_view>

#include "cxlpool/common/status.h"

namespace cxlpool {

// "/system.slice//x.service/" -> "/system.slice/x.service". INVALID_ARGUMENT
// for a relative path, "." or ".." components, or control characters.
Result<std::string> NormalizeCgroupPath(std::string_view path);

// True when the cgroup `path` is `rule_path` or below it (both normalized).
bool CgroupCovers(std::string_view rule_path, std::string_view path);

}  // namespace cxlpool
