// client.hpp: the C++ API of libcxlpool.
//
//   auto client = cxlpool::Client::Connect();           // default socket
//   if (!client.ok()) { std::cerr << client.status().ToString(); return 1; }
//   cxlpool::AllocOptions opts;
//   opts.size_bytes = 1ull << 30;
//   opts.near_gpu = 0;
//   auto lease = client->Allocate(opts);               // ClientResult<Lease>
//   if (lease.ok()) std::memset(lease->data(), 0, lease->size());
//   // ~Lease releases the memory.
//
// Errors are values: every call that can fail returns a ClientStatus or a
// ClientResult<T>; no exception leaves the library. Codes (ErrorCode) are the
// C ABI's, negated: ClientStatus::c_error() == CXLPOOL_E*.
//
// This header depends only on the standard library and <cxlpool/cxlpool.h>.
//
// Thread safety: a Client may be used from several threads at once (one
// request in flight at a time per client; others wait). A Lease is a
// single-owner value: its const accessors may be called from any thread,
// Release/CudaRegister/CudaUnregister/Verify must not race with other uses
// of it.
// A Lease keeps its client's connection open, so it may outlive the Client
// object it came from; its mapping stays valid until it is released.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "cxlpool/cxlpool.h"

namespace cxlpool {

// The same values as the C ABI's codes, positive.
enum class ErrorCode : int {
  kOk = 0,
  kInvalidArgument = 1,
  kNotFound = 2,
  kPermissionDenied = 3,
  kResourceExhausted = 4,
  kUnavailable = 5,
  kUnsupported = 6,
  kProtocol = 7,
  kIo = 8,
  kInternal = 9,
  kAlreadyExists = 10,
  kRevoked = 11,
};

class [[nodiscard]] ClientStatus {
 public:
  ClientStatus() = default;  // OK
  ClientStatus(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}

  bool ok() const { return code_ == ErrorCode::kOk; }
  ErrorCode code() const { return code_; }
  // CXLPOOL_OK or a negative CXLPOOL_E* code.
  int c_error() const { return -static_cast<int>(code_); }
  const std::string& message() const { return message_; }
  // "cxlpool_strerror text: message"
  std::string ToString() const {
    if (ok()) return "ok";
    return std::string(cxlpool_strerror(c_error())) + ": " + message_;
  }

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

// A value or a non-OK ClientStatus. value() of an error aborts the process
// with the status printed: check ok() first.
template <typename T>
class [[nodiscard]] ClientResult {
 public:
  ClientResult(T value) : v_(std::move(value)) {}              // NOLINT: implicit by design
  ClientResult(ClientStatus status) : v_(std::move(status)) {  // NOLINT
    if (std::get<ClientStatus>(v_).ok()) {
      v_ = ClientStatus(ErrorCode::kInternal, "ClientResult built from an OK status");
    }
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  ClientStatus status() const { return ok() ? ClientStatus() : std::get<ClientStatus>(v_); }
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
  void CheckOk() const {
    if (!ok()) {
      std::fprintf(stderr, "cxlpool: value() of a failed result: %s\n",
                   std::get<ClientStatus>(v_).ToString().c_str());
      std::abort();
    }
  }
  std::variant<T, ClientStatus> v_;
};

struct AllocOptions {
  uint64_t size_bytes = 0;                   // > 0; rounded up by the daemon to its page size
  int numa_node = -1;                        // -1: let the daemon place it
  int near_gpu = -1;                         // GPU index, -1: none
  std::string gpu;                           // GPU uuid or PCI bus id; overrides near_gpu
  std::vector<std::string> tier_preference;  // node kinds in order: "dram", "cxl"
  bool strict = false;                       // refuse rather than fall back
  bool hugetlb = false;                      // ask for hugetlb backing
  // Register with CUDA after mapping, on near_gpu (0 if none). A failed
  // registration does not fail the allocation; device_ptr() reports it.
  // Implies long_term_pin.
  bool cuda_register = false;
  // The caller will pin it long-term itself (RDMA registration, io_uring
  // fixed buffers, its own CUDA registration): never placed where a pin
  // moves the pages to another node (see CXLPOOL_ALLOC_LONG_TERM_PIN).
  // Call Lease::Verify() after pinning.
  bool long_term_pin = false;
  std::string label;
  // Shared named lease: non-empty makes it attachable by processes whose
  // uid or gid is listed (the owner always may). Names live in one
  // namespace per owner uid: others attach with AttachFrom(your uid, name).
  std::string name;
  std::vector<uint32_t> acl_uids;
  std::vector<uint32_t> acl_gids;
};

// What the daemon said about a lease.
struct LeaseInfo {
  uint64_t id = 0;
  uint64_t size_bytes = 0;
  uint64_t requested_bytes = 0;
  uint64_t page_size = 0;
  int numa_node = -1;
  int memory_tier = -1;  // -1: unknown
  uint32_t holders = 0;
  std::string kind;              // "dram", "cxl", ...
  std::string backing;           // "memfd", "memfd-thp", "hugetlb-2m", "devdax", ...
  std::string placement_reason;  // why this node
  std::string pool;              // "node1", "dax0.0", "shared:dax1.0"
  // backing "shared-slice": where the lease starts on the shared device.
  uint64_t device_offset = 0;
  std::string label;
  std::string name;  // shared name, "" if private (in its owner's namespace)
  // Who owns the lease (whose quota it is charged to, whose namespace its
  // name is in). After Attach/AttachFrom: check it is who you meant.
  uint32_t owner_uid = 0;
  uint32_t owner_gid = 0;
  bool long_term_pin = false;
  // -1, or where the lease was placed once its pages were found on another
  // node; numa_node, kind and pool are then where they are now.
  int placed_numa_node = -1;
  std::string moved_reason;
};

// Where the kernel says a lease's pages are (Lease::Verify).
struct Placement {
  int numa_node = -1;         // the node holding most sampled pages; -1: none resident
  int placed_numa_node = -1;  // where the daemon accounted the lease before the check
  bool moved = false;         // the pages are off placed_numa_node (the daemon was told)
  uint64_t pages_sampled = 0;
  uint64_t pages_on_node = 0;  // of those, on numa_node
  uint64_t pages_absent = 0;   // not resident
};

// One CUDA-registered chunk of a lease (registration goes in chunks of at
// most 64 GiB; device pointers are contiguous within a chunk).
struct DeviceChunk {
  uint64_t device_ptr = 0;
  uint64_t offset = 0;  // in the lease
  uint64_t length = 0;
};

// One extent of a lease (cxlpool.h, cxlpool_lease_extent): a separate file,
// mapped at data() + offset.
struct LeaseExtent {
  uint64_t offset = 0;  // in the lease
  uint64_t length = 0;
  uint64_t page_size = 4096;
};

// Tiering (cxlpool.h, "tiering"): hints and a lease's migration record.
enum class TierHint : int { kHot = 1, kCold = 2, kWillNeed = 3, kDontNeed = 4 };
enum class MigrationPhase : int { kPrepare = 1, kResume = 2 };
struct TieringStats {
  uint64_t bytes_copied_in = 0;
  uint64_t bytes_copied_out = 0;
  uint64_t migrations = 0;
  uint64_t declined = 0;
  int64_t last_pause_ns = 0;
  int64_t max_pause_ns = 0;
  int numa_node = -1;
  uint32_t device_ptr_changed = 0;
  std::string last_detail;  // the daemon's word on the last migration
};

namespace detail {
class ClientCore;
class LeaseState;
}  // namespace detail

class CXLPOOL_EXPORT Lease {
 public:
  Lease();   // empty: valid() is false
  ~Lease();  // releases (errors are ignored; call Release() to see them)
  Lease(Lease&& other) noexcept;
  Lease& operator=(Lease&& other) noexcept;  // releases what *this held
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;

  bool valid() const { return state_ != nullptr; }
  explicit operator bool() const { return valid(); }

  // Empty lease: nullptr / 0 / -1.
  void* data() const;
  uint64_t size() const;
  int numa_node() const;
  uint64_t id() const;
  // True once the daemon revoked the lease (seen after any request on its
  // client, or Client::ProcessEvents). Its memory then raises SIGBUS.
  bool revoked() const;
  // Empty lease: a default LeaseInfo.
  const LeaseInfo& info() const;

  // The device pointer of the whole lease. NOT_FOUND if never registered,
  // the registration's error if it failed (UNSUPPORTED: no driver;
  // UNAVAILABLE: no such GPU; IO), UNSUPPORTED if the chunks' device pointers
  // are not contiguous (use device_chunks()), INVALID_ARGUMENT when empty.
  ClientResult<uint64_t> device_ptr() const;
  // Empty when not registered.
  std::vector<DeviceChunk> device_chunks() const;
  // The lease's extents in order, back to back from data(); one for a lease
  // of one file. Empty for an empty lease.
  std::vector<LeaseExtent> extents() const;
  // Registers the mapping with CUDA on `device` (see cxlpool.h); then
  // checks where the pages are, as Verify() does.
  ClientStatus CudaRegister(int device);
  ClientStatus CudaUnregister();
  // After pinning the lease by other means: asks the kernel where its pages
  // are and, when they left their node, tells the daemon and updates info().
  // Errors: see cxlpool_lease_verify in cxlpool.h.
  ClientResult<Placement> Verify();

  // Unregisters, unmaps, tells the daemon. The lease is empty afterwards
  // even if an error is returned (REVOKED, UNAVAILABLE, PROTOCOL).
  // INVALID_ARGUMENT when already empty.
  ClientStatus Release();

  // ---- tiering (see cxlpool.h: the same calls and errors) ----
  ClientStatus CopyIn(uint64_t offset, const void* src, size_t len);
  ClientStatus CopyOut(uint64_t offset, void* dst, size_t len);
  ClientStatus NoteAccess(uint64_t offset, uint64_t len, uint64_t bytes_read,
                          uint64_t bytes_written);
  ClientStatus Hint(uint64_t offset, uint64_t len, TierHint hint);
  ClientStatus PinTier(bool pinned);
  // The application's own long-term pin: called at a safe point with
  // kPrepare (drop it; non-zero declines) and kResume (pin again). Empty
  // function: no such pin.
  ClientStatus SetMigrationCallback(std::function<int(MigrationPhase)> callback);
  TieringStats tiering_stats() const;

 private:
  friend class Client;
  friend struct ClientAccess;
  explicit Lease(std::unique_ptr<detail::LeaseState> state);
  std::unique_ptr<detail::LeaseState> state_;
};

class CXLPOOL_EXPORT Client {
 public:
  // Connects and negotiates the protocol version. Empty path: the default
  // (DefaultSocketPath). Errors: see cxlpool_connect in cxlpool.h.
  static ClientResult<Client> Connect(const std::string& socket_path = "");
  // $CXLPOOL_SOCKET, else /run/cxlpool/cxlpool.sock for root, else the
  // user's own daemon where a non-root cxlpoold listens by default
  // ($XDG_RUNTIME_DIR/cxlpool.sock, then /tmp/cxlpool-<uid>.sock if this uid
  // owns it) when that socket exists, else /run/cxlpool/cxlpool.sock.
  static std::string DefaultSocketPath();

  Client();  // not connected: every call returns UNAVAILABLE
  ~Client();
  Client(Client&& other) noexcept;
  Client& operator=(Client&& other) noexcept;
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  bool connected() const { return core_ != nullptr; }

  // A private lease, or a shared named one when options.name is set.
  // Errors: see cxlpool_alloc / cxlpool_alloc_shared in cxlpool.h.
  ClientResult<Lease> Allocate(const AllocOptions& options);
  // Maps the shared lease `name` of this process's own uid. Errors: see
  // cxlpool_attach.
  ClientResult<Lease> Attach(const std::string& name);
  // Maps the shared lease `name` that uid `owner_uid` created (names live in
  // one namespace per owner). info().owner_uid of the result is owner_uid.
  // Errors: see cxlpool_attach_from.
  ClientResult<Lease> AttachFrom(uint32_t owner_uid, const std::string& name);
  // Handles pushed lease events without blocking; the number handled.
  ClientResult<int> ProcessEvents();

  // ---- tiering (see cxlpool.h) ----
  // Migrations waiting for a safe point; answers them (the number answered);
  // sends counted bytes and hints now.
  ClientResult<int> MigrationsPending();
  ClientResult<int> SafePoint();
  ClientStatus FlushSignals();

  // The wire version agreed at hello, and the daemon's version text.
  uint32_t protocol_version() const;
  std::string server_version() const;

 private:
  friend struct ClientAccess;
  explicit Client(std::shared_ptr<detail::ClientCore> core);
  std::shared_ptr<detail::ClientCore> core_;
};

}  // namespace cxlpool
