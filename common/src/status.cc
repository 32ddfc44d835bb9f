#include "cxlpool/common/status.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace cxlpool {

const char* CodeName(Code c) {
  switch (c) {
    case Code::kOk:
      return "OK";
    case Code::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case Code::kNotFound:
      return "NOT_FOUND";
    case Code::kPermissionDenied:
      return "PERMISSION_DENIED";
    case Code::kResourceExhausted:
      return "RESOURCE_EXHAUSTED";
    case Code::kUnavailable:
      return "UNAVAILABLE";
    case Code::kUnsupported:
      return "UNSUPPORTED";
    case Code::kProtocol:
      return "PROTOCOL";
    case Code::kIo:
      return "IO";
    case Code::kInternal:
      return "INTERNAL";
    case Code::kAlreadyExists:
      return "ALREADY_EXISTS";
    case Code::kRevoked:
      return "REVOKED";
  }
  return "UNKNOWN";
}

Status Status::FromErrno(int err, const std::string& what) {
  Code code = Code::kIo;
  switch (err) {
    case ENOENT:
      code = Code::kNotFound;
      break;
    case EACCES:
    case EPERM:
      code = Code::kPermissionDenied;
      break;
    case ENOMEM:
    case ENOSPC:
      code = Code::kResourceExhausted;
      break;
    case EINVAL:
      code = Code::kInvalidArgument;
      break;
    case ENOSYS:
    case EOPNOTSUPP:
      code = Code::kUnsupported;
      break;
    case EEXIST:
      code = Code::kAlreadyExists;
      break;
    default:
      break;
  }
  return Status(code, what + ": " + std::strerror(err));
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(CodeName(code_)) + ": " + message_;
}

void DieWithStatus(const Status& s, const char* where) {
  std::fprintf(stderr, "cxlpool: fatal: %s (%s)\n", s.ToString().c_str(), where);
  std::abort();
}

}  // namespace cxlpool
