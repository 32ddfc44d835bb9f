// The names the cluster layer accepts, shared by the config reader, the
// records' validation and the etcd client (header-only: the config library
// uses it without linking the cluster's).
//
// Thread safety: pure functions.
#pragma once

#include <string>
#include <string_view>

#include "cxlpool/common/status.h"

namespace cxlpool::cluster {

// Host names and device ids: 1..128 of [A-Za-z0-9._:-] (a key segment in
// etcd, printable everywhere). INVALID_ARGUMENT "<what> '<name>': ...".
inline Status CheckName(std::string_view what, std::string_view name) {
  if (name.empty() || name.size() > 128)
    return Status(Code::kInvalidArgument, std::string(what) + ": must be 1..128 characters");
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-' || c == ':';
    if (!ok)
      return Status(Code::kInvalidArgument,
                    std::string(what) + " '" + std::string(name) + "': only [A-Za-z0-9._:-]");
  }
  return Status::Ok();
}

// An etcd endpoint: "host:port", no scheme.
inline Status CheckEndpoint(std::string_view ep) {
  const auto colon = ep.rfind(':');
  if (ep.find("://") != std::string_view::npos || colon == std::string_view::npos || colon == 0 ||
      colon + 1 == ep.size() ||
      ep.find_first_not_of("0123456789", colon + 1) != std::string_view::npos)
    return Status(Code::kInvalidArgument,
                  "etcd endpoint '" + std::string(ep) + "': expected host:port without a scheme");
  return Status::Ok();
}

}  // namespace cxlpool::cluster
