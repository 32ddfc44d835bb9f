// The project's version and source revision, for --version and the
// cxlpool_build_info metric. The revision is `git describe --always --dirty`
// of the source tree at build time, or $CXLPOOL_GIT_REVISION /
// -DCXLPOOL_GIT_REVISION (package builds from a tarball), else "unknown".
//
// Thread safety: pure functions.
#pragma once

#include <string>

namespace cxlpool {

const char* ProjectVersion();  // "0.1.0"
const char* GitRevision();     // "4d4703a0c1e2", "v0.1.0-3-g4d4703a0c1e2-dirty", "unknown"

// "<program> <version> (git <revision>)", the first line of every binary's
// --version.
inline std::string VersionLine(const std::string& program) {
  return program + " " + ProjectVersion() + " (git " + GitRevision() + ")";
}

}  // namespace cxlpool
