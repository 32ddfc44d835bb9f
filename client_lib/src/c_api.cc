// The C ABI (cxlpool.h) over the C++ API. Every entry point catches
// everything: no exception crosses into C.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <new>
#include <string>
#include <utility>

#include "client_core.h"
#include "cxlpool/client.hpp"
#include "cxlpool/common/strings.h"
#include "cxlpool/cxlpool.h"

struct cxlpool_client {
  cxlpool::Client client;
};

struct cxlpool_lease {
  cxlpool::Lease lease;
};

namespace {

using cxlpool::ClientStatus;
using cxlpool::ErrorCode;

// The C codes are the internal codes negated, one for one.
#define CXLPOOL_SAME_CODE(c_name, code)                             \
  static_assert(c_name == -static_cast<int>(cxlpool::Code::code) && \
                c_name == -static_cast<int>(ErrorCode::code))
CXLPOOL_SAME_CODE(CXLPOOL_OK, kOk);
CXLPOOL_SAME_CODE(CXLPOOL_EINVALID_ARGUMENT, kInvalidArgument);
CXLPOOL_SAME_CODE(CXLPOOL_ENOT_FOUND, kNotFound);
CXLPOOL_SAME_CODE(CXLPOOL_EPERMISSION_DENIED, kPermissionDenied);
CXLPOOL_SAME_CODE(CXLPOOL_ERESOURCE_EXHAUSTED, kResourceExhausted);
CXLPOOL_SAME_CODE(CXLPOOL_EUNAVAILABLE, kUnavailable);
CXLPOOL_SAME_CODE(CXLPOOL_EUNSUPPORTED, kUnsupported);
CXLPOOL_SAME_CODE(CXLPOOL_EPROTOCOL, kProtocol);
CXLPOOL_SAME_CODE(CXLPOOL_EIO, kIo);
CXLPOOL_SAME_CODE(CXLPOOL_EINTERNAL, kInternal);
CXLPOOL_SAME_CODE(CXLPOOL_EALREADY_EXISTS, kAlreadyExists);
CXLPOOL_SAME_CODE(CXLPOOL_EREVOKED, kRevoked);
#undef CXLPOOL_SAME_CODE

thread_local std::string t_last_error;

int Report(const ClientStatus& s) {
  t_last_error = s.message();
  return s.c_error();
}

int Invalid(const char* what) {
  t_last_error = what;
  return CXLPOOL_EINVALID_ARGUMENT;
}

// Runs `body` (returning an int code) with every exception turned into a code.
template <typename F>
int Guard(F&& body) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    t_last_error = "out of memory";
    return CXLPOOL_ERESOURCE_EXHAUSTED;
  } catch (...) {
    t_last_error = "unexpected exception inside libcxlpool";
    return CXLPOOL_EINTERNAL;
  }
}

// Reads a caller's struct that starts with `uint32_t struct_size` into a
// zeroed T: older (smaller, >= min_size) versions leave later fields zero; a
// newer (larger) one is accepted only if the bytes we do not know are zero.
template <typename T>
int ReadSizedStruct(const T* in, size_t min_size, const char* what, T* out) {
  std::memset(static_cast<void*>(out), 0, sizeof(T));
  uint32_t given = 0;
  std::memcpy(&given, in, sizeof(given));
  if (given < min_size) {
    t_last_error = std::string(what) + ".struct_size is " + std::to_string(given) +
                   ", the smallest known version is " + std::to_string(min_size) + " bytes";
    return CXLPOOL_EINVALID_ARGUMENT;
  }
  const auto* bytes = reinterpret_cast<const unsigned char*>(in);
  for (size_t i = sizeof(T); i < given; ++i) {
    if (bytes[i] != 0) {
      t_last_error = std::string(what) + " has non-zero fields past byte " +
                     std::to_string(sizeof(T)) + " that this libcxlpool does not know";
      return CXLPOOL_EINVALID_ARGUMENT;
    }
  }
  std::memcpy(static_cast<void*>(out), in, std::min<size_t>(given, sizeof(T)));
  return CXLPOOL_OK;
}

int ToOptions(const cxlpool_alloc_opts* o, cxlpool::AllocOptions* out) {
  if (o == nullptr) return Invalid("alloc options are NULL");
  cxlpool_alloc_opts opts;
  int rc = ReadSizedStruct(o, CXLPOOL_ALLOC_OPTS_SIZE_V1, "cxlpool_alloc_opts", &opts);
  if (rc != CXLPOOL_OK) return rc;
  if (opts.size_bytes == 0) return Invalid("size_bytes is 0");
  if ((opts.flags & ~CXLPOOL_ALLOC_KNOWN_FLAGS) != 0) {
    t_last_error = "unknown allocation flags 0x" + [&] {
      char buf[16];
      std::snprintf(buf, sizeof(buf), "%x", opts.flags & ~CXLPOOL_ALLOC_KNOWN_FLAGS);
      return std::string(buf);
    }();
    return CXLPOOL_EINVALID_ARGUMENT;
  }
  if (opts.numa_node < -1) return Invalid("numa_node must be >= 0, or -1");
  if (opts.near_gpu < -1) return Invalid("near_gpu must be >= 0, or -1");
  out->size_bytes = opts.size_bytes;
  out->numa_node = opts.numa_node;
  out->near_gpu = opts.near_gpu;
  out->strict = (opts.flags & CXLPOOL_ALLOC_STRICT) != 0;
  out->cuda_register = (opts.flags & CXLPOOL_ALLOC_CUDA_REGISTER) != 0;
  out->hugetlb = (opts.flags & CXLPOOL_ALLOC_HUGETLB) != 0;
  out->long_term_pin = (opts.flags & CXLPOOL_ALLOC_LONG_TERM_PIN) != 0;
  if (opts.label != nullptr) out->label = opts.label;
  if (opts.gpu != nullptr) out->gpu = opts.gpu;
  if (opts.tier_preference != nullptr) {
    for (const std::string& t : cxlpool::Split(opts.tier_preference, ',')) {
      std::string trimmed(cxlpool::Trim(t));
      if (trimmed.empty()) return Invalid("empty entry in tier_preference");
      out->tier_preference.push_back(trimmed);
    }
  }
  return CXLPOOL_OK;
}

int FinishAlloc(cxlpool_client* c, const cxlpool::AllocOptions& opts, cxlpool_lease** out) {
  cxlpool::ClientResult<cxlpool::Lease> lease = c->client.Allocate(opts);
  if (!lease.ok()) return Report(lease.status());
  *out = new cxlpool_lease{std::move(*lease)};
  // A failed CUDA registration does not fail the allocation, but the caller
  // can read why from cxlpool_last_error_message().
  cxlpool::ClientResult<uint64_t> dptr = (*out)->lease.device_ptr();
  t_last_error = (opts.cuda_register && !dptr.ok()) ? dptr.status().message() : "";
  return CXLPOOL_OK;
}

}  // namespace

extern "C" {

CXLPOOL_EXPORT const char* cxlpool_strerror(int err) {
  switch (err) {
    case CXLPOOL_OK:
      return "success";
    case CXLPOOL_EINVALID_ARGUMENT:
      return "invalid argument";
    case CXLPOOL_ENOT_FOUND:
      return "not found";
    case CXLPOOL_EPERMISSION_DENIED:
      return "permission denied";
    case CXLPOOL_ERESOURCE_EXHAUSTED:
      return "resource exhausted (pool full or quota reached)";
    case CXLPOOL_EUNAVAILABLE:
      return "unavailable";
    case CXLPOOL_EUNSUPPORTED:
      return "unsupported";
    case CXLPOOL_EPROTOCOL:
      return "protocol error";
    case CXLPOOL_EIO:
      return "I/O error";
    case CXLPOOL_EINTERNAL:
      return "internal error";
    case CXLPOOL_EALREADY_EXISTS:
      return "already exists";
    case CXLPOOL_EREVOKED:
      return "lease revoked";
    default:
      return "unknown error";
  }
}

CXLPOOL_EXPORT const char* cxlpool_last_error_message(void) { return t_last_error.c_str(); }

CXLPOOL_EXPORT const char* cxlpool_version(void) { return CXLPOOL_VERSION_STRING; }

CXLPOOL_EXPORT int cxlpool_default_socket_path(char* buf, size_t len) {
  return Guard([&]() -> int {
    if (buf == nullptr || len == 0) return Invalid("no buffer");
    std::string path = cxlpool::detail::DefaultSocketPath();
    std::snprintf(buf, len, "%s", path.c_str());
    if (path.size() >= len) return Invalid("buffer too small for the socket path");
    t_last_error.clear();
    return CXLPOOL_OK;
  });
}

CXLPOOL_EXPORT int cxlpool_connect(const char* socket_path, cxlpool_client** out) {
  return Guard([&]() -> int {
    if (out == nullptr) return Invalid("out is NULL");
    *out = nullptr;
    cxlpool::ClientResult<cxlpool::Client> c =
        cxlpool::Client::Connect(socket_path != nullptr ? socket_path : "");
    if (!c.ok()) return Report(c.status());
    *out = new cxlpool_client{std::move(*c)};
    t_last_error.clear();
    return CXLPOOL_OK;
  });
}

CXLPOOL_EXPORT void cxlpool_disconnect(cxlpool_client* c) { delete c; }

CXLPOOL_EXPORT int cxlpool_process_events(cxlpool_client* c) {
  return Guard([&]() -> int {
    if (c == nullptr) return Invalid("client is NULL");
    cxlpool::ClientResult<int> n = c->client.ProcessEvents();
    if (!n.ok()) return Report(n.status());
    t_last_error.clear();
    return *n;
  });
}

CXLPOOL_EXPORT void cxlpool_alloc_opts_init(cxlpool_alloc_opts* o) {
  if (o == nullptr) return;
  std::memset(static_cast<void*>(o), 0, sizeof(*o));
  o->struct_size = sizeof(*o);
  o->numa_node = -1;
  o->near_gpu = -1;
}

CXLPOOL_EXPORT int cxlpool_alloc(cxlpool_client* c, const cxlpool_alloc_opts* o,
                                 cxlpool_lease** out) {
  return Guard([&]() -> int {
    if (out == nullptr) return Invalid("out is NULL");
    *out = nullptr;
    if (c == nullptr) return Invalid("client is NULL");
    cxlpool::AllocOptions opts;
    int rc = ToOptions(o, &opts);
    if (rc != CXLPOOL_OK) return rc;
    return FinishAlloc(c, opts, out);
  });
}

CXLPOOL_EXPORT int cxlpool_alloc_shared(cxlpool_client* c, const cxlpool_alloc_opts* o,
                                        const char* name, const uint32_t* acl_uids, size_t n_uids,
                                        const uint32_t* acl_gids, size_t n_gids,
                                        cxlpool_lease** out) {
  return Guard([&]() -> int {
    if (out == nullptr) return Invalid("out is NULL");
    *out = nullptr;
    if (c == nullptr) return Invalid("client is NULL");
    if (name == nullptr || *name == '\0') return Invalid("a shared lease needs a name");
    if ((acl_uids == nullptr && n_uids > 0) || (acl_gids == nullptr && n_gids > 0)) {
      return Invalid("ACL array is NULL but its count is not 0");
    }
    cxlpool::AllocOptions opts;
    int rc = ToOptions(o, &opts);
    if (rc != CXLPOOL_OK) return rc;
    opts.name = name;
    opts.acl_uids.assign(acl_uids, acl_uids + n_uids);
    opts.acl_gids.assign(acl_gids, acl_gids + n_gids);
    return FinishAlloc(c, opts, out);
  });
}

CXLPOOL_EXPORT int cxlpool_attach(cxlpool_client* c, const char* name, cxlpool_lease** out) {
  return Guard([&]() -> int {
    if (out == nullptr) return Invalid("out is NULL");
    *out = nullptr;
    if (c == nullptr) return Invalid("client is NULL");
    if (name == nullptr || *name == '\0') return Invalid("name is empty");
    cxlpool::ClientResult<cxlpool::Lease> lease = c->client.Attach(name);
    if (!lease.ok()) return Report(lease.status());
    *out = new cxlpool_lease{std::move(*lease)};
    t_last_error.clear();
    return CXLPOOL_OK;
  });
}

CXLPOOL_EXPORT int cxlpool_attach_from(cxlpool_client* c, uint32_t owner_uid, const char* name,
                                       cxlpool_lease** out) {
  return Guard([&]() -> int {
    if (out == nullptr) return Invalid("out is NULL");
    *out = nullptr;
    if (c == nullptr) return Invalid("client is NULL");
    if (name == nullptr || *name == '\0') return Invalid("name is empty");
    cxlpool::ClientResult<cxlpool::Lease> lease = c->client.AttachFrom(owner_uid, name);
    if (!lease.ok()) return Report(lease.status());
    *out = new cxlpool_lease{std::move(*lease)};
    t_last_error.clear();
    return CXLPOOL_OK;
  });
}

CXLPOOL_EXPORT int cxlpool_release(cxlpool_lease* l) {
  return Guard([&]() -> int {
    if (l == nullptr) return Invalid("lease is NULL");
    ClientStatus s = l->lease.Release();
    delete l;
    if (!s.ok()) return Report(s);
    t_last_error.clear();
    return CXLPOOL_OK;
  });
}

CXLPOOL_EXPORT void* cxlpool_lease_ptr(const cxlpool_lease* l) {
  return l != nullptr ? l->lease.data() : nullptr;
}
CXLPOOL_EXPORT uint64_t cxlpool_lease_size(const cxlpool_lease* l) {
  return l != nullptr ? l->lease.size() : 0;
}
CXLPOOL_EXPORT int cxlpool_lease_numa_node(const cxlpool_lease* l) {
  return l != nullptr ? l->lease.numa_node() : -1;
}
CXLPOOL_EXPORT uint64_t cxlpool_lease_id(const cxlpool_lease* l) {
  return l != nullptr ? l->lease.id() : 0;
}
CXLPOOL_EXPORT int cxlpool_lease_revoked(const cxlpool_lease* l) {
  if (l == nullptr) return -1;
  return l->lease.revoked() ? 1 : 0;
}

CXLPOOL_EXPORT int cxlpool_lease_get_info(const cxlpool_lease* l, cxlpool_lease_info* out) {
  return Guard([&]() -> int {
    if (l == nullptr || out == nullptr) return Invalid("lease or out is NULL");
    const uint32_t given = out->struct_size;
    if (given < CXLPOOL_LEASE_INFO_SIZE_V1) {
      t_last_error = "cxlpool_lease_info.struct_size is " + std::to_string(given) +
                     ", the smallest known version is " +
                     std::to_string(CXLPOOL_LEASE_INFO_SIZE_V1) + " bytes";
      return CXLPOOL_EINVALID_ARGUMENT;
    }
    const cxlpool::LeaseInfo& i = l->lease.info();
    cxlpool_lease_info info;
    std::memset(static_cast<void*>(&info), 0, sizeof(info));
    info.struct_size = given;
    info.id = i.id;
    info.size_bytes = i.size_bytes;
    info.requested_bytes = i.requested_bytes;
    info.page_size = i.page_size;
    info.numa_node = l->lease.numa_node();
    info.memory_tier = i.memory_tier;
    info.holders = i.holders;
    info.cuda_registered = l->lease.device_chunks().empty() ? 0 : 1;
    info.revoked = l->lease.revoked() ? 1 : 0;
    info.kind = i.kind.c_str();
    info.backing = i.backing.c_str();
    info.placement_reason = i.placement_reason.c_str();
    info.pool = i.pool.c_str();
    info.label = i.label.c_str();
    info.name = i.name.c_str();
    info.owner_uid = i.owner_uid;
    info.owner_gid = i.owner_gid;
    info.long_term_pin = i.long_term_pin ? 1 : 0;
    info.placed_numa_node = i.placed_numa_node;
    info.moved_reason = i.moved_reason.c_str();
    info.device_offset = i.device_offset;
    const size_t n = std::min<size_t>(given, sizeof(info));
    std::memcpy(static_cast<void*>(out), &info, n);
    if (given > sizeof(info)) {
      std::memset(reinterpret_cast<unsigned char*>(out) + sizeof(info), 0, given - sizeof(info));
    }
    t_last_error.clear();
    return CXLPOOL_OK;
  });
}

CXLPOOL_EXPORT int cxlpool_lease_verify(cxlpool_lease* l, cxlpool_lease_placement* out) {
  return Guard([&]() -> int {
    if (l == nullptr) return Invalid("lease is NULL");
    if (out != nullptr && out->struct_size < CXLPOOL_LEASE_PLACEMENT_SIZE_V1) {
      t_last_error = "cxlpool_lease_placement.struct_size is " + std::to_string(out->struct_size) +
                     ", the smallest known version is " +
                     std::to_string(CXLPOOL_LEASE_PLACEMENT_SIZE_V1) + " bytes";
      return CXLPOOL_EINVALID_ARGUMENT;
    }
    if (!l->lease.valid()) return Invalid("empty lease");
    cxlpool::Placement p;
    cxlpool::Status s = cxlpool::ClientAccess::State(l->lease)->VerifyPlacement("verify", &p);
    if (out != nullptr) {
      const uint32_t given = out->struct_size;
      cxlpool_lease_placement c;
      std::memset(static_cast<void*>(&c), 0, sizeof(c));
      c.struct_size = given;
      c.numa_node = p.numa_node;
      c.placed_numa_node = p.placed_numa_node;
      c.moved = p.moved ? 1 : 0;
      c.pages_sampled = p.pages_sampled;
      c.pages_on_node = p.pages_on_node;
      c.pages_absent = p.pages_absent;
      std::memcpy(static_cast<void*>(out), &c, std::min<size_t>(given, sizeof(c)));
      if (given > sizeof(c)) {
        std::memset(reinterpret_cast<unsigned char*>(out) + sizeof(c), 0, given - sizeof(c));
      }
    }
    if (!s.ok()) return Report(cxlpool::detail::ToClientStatus(s));
    t_last_error.clear();
    return CXLPOOL_OK;
  });
}

CXLPOOL_EXPORT int cxlpool_lease_cuda_register(cxlpool_lease* l, int device) {
  return Guard([&]() -> int {
    if (l == nullptr) return Invalid("lease is NULL");
    ClientStatus s = l->lease.CudaRegister(device);
    if (!s.ok()) return Report(s);
    t_last_error.clear();
    return CXLPOOL_OK;
  });
}

CXLPOOL_EXPORT int cxlpool_lease_cuda_unregister(cxlpool_lease* l) {
  return Guard([&]() -> int {
    if (l == nullptr) return Invalid("lease is NULL");
    ClientStatus s = l->lease.CudaUnregister();
    if (!s.ok()) return Report(s);
    t_last_error.clear();
    return CXLPOOL_OK;
  });
}

CXLPOOL_EXPORT int cxlpool_lease_device_ptr(const cxlpool_lease* l, uint64_t* out) {
  return Guard([&]() -> int {
    if (l == nullptr || out == nullptr) return Invalid("lease or out is NULL");
    cxlpool::ClientResult<uint64_t> p = l->lease.device_ptr();
    if (!p.ok()) return Report(p.status());
    *out = *p;
    t_last_error.clear();
    return CXLPOOL_OK;
  });
}

CXLPOOL_EXPORT int cxlpool_lease_device_chunk_count(const cxlpool_lease* l) {
  return Guard([&]() -> int {
    if (l == nullptr) return Invalid("lease is NULL");
    return static_cast<int>(l->lease.device_chunks().size());
  });
}

CXLPOOL_EXPORT int cxlpool_lease_device_chunk(const cxlpool_lease* l, uint32_t index,
                                              uint64_t* device_ptr, uint64_t* offset,
                                              uint64_t* length) {
  return Guard([&]() -> int {
    if (l == nullptr) return Invalid("lease is NULL");
    std::vector<cxlpool::DeviceChunk> chunks = l->lease.device_chunks();
    if (index >= chunks.size()) {
      t_last_error = "chunk " + std::to_string(index) + " of " + std::to_string(chunks.size());
      return CXLPOOL_ENOT_FOUND;
    }
    if (device_ptr != nullptr) *device_ptr = chunks[index].device_ptr;
    if (offset != nullptr) *offset = chunks[index].offset;
    if (length != nullptr) *length = chunks[index].length;
    t_last_error.clear();
    return CXLPOOL_OK;
  });
}

// ---- extents ----

CXLPOOL_EXPORT int cxlpool_lease_extent_count(const cxlpool_lease* l) {
  return Guard([&]() -> int {
    if (l == nullptr) return Invalid("lease is NULL");
    t_last_error.clear();
    return static_cast<int>(l->lease.extents().size());
  });
}

CXLPOOL_EXPORT int cxlpool_lease_extent(const cxlpool_lease* l, uint32_t index, uint64_t* offset,
                                        uint64_t* length, uint64_t* page_size) {
  return Guard([&]() -> int {
    if (l == nullptr) return Invalid("lease is NULL");
    std::vector<cxlpool::LeaseExtent> extents = l->lease.extents();
    if (index >= extents.size()) {
      t_last_error = "extent " + std::to_string(index) + " of " + std::to_string(extents.size());
      return CXLPOOL_ENOT_FOUND;
    }
    if (offset != nullptr) *offset = extents[index].offset;
    if (length != nullptr) *length = extents[index].length;
    if (page_size != nullptr) *page_size = extents[index].page_size;
    t_last_error.clear();
    return CXLPOOL_OK;
  });
}

// ---- tiering ----

CXLPOOL_EXPORT int cxlpool_lease_copy_in(cxlpool_lease* l, uint64_t offset, const void* src,
                                         size_t len) {
  return Guard([&]() -> int {
    if (l == nullptr) return Invalid("lease is NULL");
    ClientStatus s = l->lease.CopyIn(offset, src, len);
    if (!s.ok()) return Report(s);
    return CXLPOOL_OK;
  });
}

CXLPOOL_EXPORT int cxlpool_lease_copy_out(cxlpool_lease* l, uint64_t offset, void* dst,
                                          size_t len) {
  return Guard([&]() -> int {
    if (l == nullptr) return Invalid("lease is NULL");
    ClientStatus s = l->lease.CopyOut(offset, dst, len);
    if (!s.ok()) return Report(s);
    return CXLPOOL_OK;
  });
}

CXLPOOL_EXPORT int cxlpool_lease_note_access(cxlpool_lease* l, uint64_t offset, uint64_t len,
                                             uint64_t bytes_read, uint64_t bytes_written) {
  return Guard([&]() -> int {
    if (l == nullptr) return Invalid("lease is NULL");
    ClientStatus s = l->lease.NoteAccess(offset, len, bytes_read, bytes_written);
    if (!s.ok()) return Report(s);
    return CXLPOOL_OK;
  });
}

CXLPOOL_EXPORT int cxlpool_lease_hint(cxlpool_lease* l, uint64_t offset, uint64_t len, int hint) {
  return Guard([&]() -> int {
    if (l == nullptr) return Invalid("lease is NULL");
    ClientStatus s = l->lease.Hint(offset, len, static_cast<cxlpool::TierHint>(hint));
    if (!s.ok()) return Report(s);
    t_last_error.clear();
    return CXLPOOL_OK;
  });
}

CXLPOOL_EXPORT int cxlpool_lease_pin_tier(cxlpool_lease* l, int pinned) {
  return Guard([&]() -> int {
    if (l == nullptr) return Invalid("lease is NULL");
    ClientStatus s = l->lease.PinTier(pinned != 0);
    if (!s.ok()) return Report(s);
    t_last_error.clear();
    return CXLPOOL_OK;
  });
}

CXLPOOL_EXPORT int cxlpool_lease_set_migration_callback(cxlpool_lease* l, cxlpool_migration_fn fn,
                                                        void* user) {
  return Guard([&]() -> int {
    if (l == nullptr) return Invalid("lease is NULL");
    std::function<int(cxlpool::MigrationPhase)> cb;
    if (fn != nullptr) {
      cb = [fn, user, l](cxlpool::MigrationPhase phase) {
        // No exception may cross the callback either way.
        return fn(l, static_cast<int>(phase), user);
      };
    }
    ClientStatus s = l->lease.SetMigrationCallback(std::move(cb));
    if (!s.ok()) return Report(s);
    t_last_error.clear();
    return CXLPOOL_OK;
  });
}

CXLPOOL_EXPORT int cxlpool_migrations_pending(cxlpool_client* c) {
  return Guard([&]() -> int {
    if (c == nullptr) return Invalid("client is NULL");
    cxlpool::ClientResult<int> n = c->client.MigrationsPending();
    if (!n.ok()) return Report(n.status());
    return *n;
  });
}

CXLPOOL_EXPORT int cxlpool_safe_point(cxlpool_client* c) {
  return Guard([&]() -> int {
    if (c == nullptr) return Invalid("client is NULL");
    cxlpool::ClientResult<int> n = c->client.SafePoint();
    if (!n.ok()) return Report(n.status());
    t_last_error.clear();
    return *n;
  });
}

CXLPOOL_EXPORT int cxlpool_flush_signals(cxlpool_client* c) {
  return Guard([&]() -> int {
    if (c == nullptr) return Invalid("client is NULL");
    ClientStatus s = c->client.FlushSignals();
    if (!s.ok()) return Report(s);
    t_last_error.clear();
    return CXLPOOL_OK;
  });
}

CXLPOOL_EXPORT int cxlpool_lease_tiering_stats(const cxlpool_lease* l, cxlpool_tiering_stats* out) {
  return Guard([&]() -> int {
    if (l == nullptr || out == nullptr) return Invalid("lease or out is NULL");
    const uint32_t given = out->struct_size;
    if (given < CXLPOOL_TIERING_STATS_SIZE_V1) {
      t_last_error = "cxlpool_tiering_stats.struct_size is " + std::to_string(given) +
                     ", the smallest known version is " +
                     std::to_string(CXLPOOL_TIERING_STATS_SIZE_V1) + " bytes";
      return CXLPOOL_EINVALID_ARGUMENT;
    }
    cxlpool::TieringStats t = l->lease.tiering_stats();
    cxlpool_tiering_stats st;
    std::memset(static_cast<void*>(&st), 0, sizeof(st));
    st.struct_size = given;
    st.bytes_copied_in = t.bytes_copied_in;
    st.bytes_copied_out = t.bytes_copied_out;
    st.migrations = t.migrations;
    st.declined = t.declined;
    st.last_pause_ns = t.last_pause_ns;
    st.max_pause_ns = t.max_pause_ns;
    st.numa_node = t.numa_node;
    st.device_ptr_changed = t.device_ptr_changed;
    const size_t n = std::min<size_t>(given, sizeof(st));
    std::memcpy(static_cast<void*>(out), &st, n);
    if (given > sizeof(st)) {
      std::memset(reinterpret_cast<unsigned char*>(out) + sizeof(st), 0, given - sizeof(st));
    }
    t_last_error.clear();
    return CXLPOOL_OK;
  });
}

}  // extern "C"
