// Status and Result<T>: how every cxlpool module reports failure.
//
// No exception crosses a module boundary. A function that can fail returns a
// Status (no value) or a Result<T> (a value or a Status). Codes are stable and
// map one-to-one to the wire protocol's error codes and the C ABI's negative
// integers, so an error keeps its meaning from the kernel to the user.
//
// Thread safety: values; copy freely between threads.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace cxlpool {

enum class Code : int32_t {
  kOk = 0,
  kInvalidArgument = 1,    // malformed input: bad size, unknown field, garbage
  kNotFound = 2,           // no such lease, node, GPU, file
  kPermissionDenied = 3,   // not admin, ACL refused, EACCES
  kResourceExhausted = 4,  // pool full, quota reached
  kUnavailable = 5,        // daemon not reachable, grace period, try again
  kUnsupported = 6,        // feature/entry point missing (no NVML, no CUDA)
  kProtocol = 7,           // bad magic/version/frame
  kIo = 8,                 // syscall failure not covered above
  kInternal = 9,           // broken invariant surfaced as a value
  kAlreadyExists = 10,     // named lease exists, etc.
  kRevoked = 11,           // lease revoked by an admin
};

const char* CodeName(Code c);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return {}; }
  // Builds a kIo (or errno-mapped) status: "<what>: <strerror(err)>".
  static Status FromErrno(int err, const std::string& what);

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  // "CODE_NAME: message"
  std::string ToString() const;

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

// A value or a non-OK Status. Accessing value() of an error aborts with a
// message: that is a programming error, not a runtime condition.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT
    if (std::get<Status>(v_).ok()) v_ = Status(Code::kInternal, "Result built from OK status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOkStatus;
    return ok() ? kOkStatus : std::get<Status>(v_);
  }
  T& value() & {
    CheckOk();
    return std::get<T>(v_);
  }
  const T& value() const& {
    CheckOk();
    return std::get<T>(v_);
  }
  T&& value() && {
    CheckOk();
    return std::get<T>(std::move(v_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  void CheckOk() const;
  std::variant<T, Status> v_;
};

[[noreturn]] void DieWithStatus(const Status& s, const char* where);

template <typename T>
void Result<T>::CheckOk() const {
  if (!ok()) DieWithStatus(std::get<Status>(v_), "Result::value() on error");
}

// Crash with a message when an invariant is broken. Never a silent recovery.
#define CXLPOOL_CHECK(cond)                                                                 \
  do {                                                                                      \
    if (!(cond))                                                                            \
      ::cxlpool::DieWithStatus(                                                             \
          ::cxlpool::Status(::cxlpool::Code::kInternal, "check failed: " #cond), __FILE__); \
  } while (0)

#define CXLPOOL_RETURN_IF_ERROR(expr) \
  do {                                \
    ::cxlpool::Status _st = (expr);   \
    if (!_st.ok()) return _st;        \
  } while (0)

}  // namespace cxlpool
