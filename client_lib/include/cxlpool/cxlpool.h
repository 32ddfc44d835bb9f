/* cxlpool.h: the C ABI of libcxlpool, the client of the cxlpoold daemon.
 *
 * A process connects to the node daemon, asks it for host or CXL memory
 * near a GPU or on a NUMA node, and receives a lease: a sealed memfd that
 * this library maps MAP_SHARED|MAP_POPULATE, read-write, and can register
 * with CUDA (cuMemHostRegister, DEVICEMAP|PORTABLE) on request.
 *
 * Conventions:
 *  - Handles (cxlpool_client, cxlpool_lease) are opaque.
 *  - Every int-returning call returns 0 (CXLPOOL_OK) or a negative
 *    CXLPOOL_E* code; cxlpool_strerror() names it, and
 *    cxlpool_last_error_message() gives the detail of the calling thread's
 *    last failure (e.g. the daemon's quota message).
 *  - Structs passed in carry their own size in `struct_size`. A struct of an
 *    older (smaller) version is accepted and the missing fields take their
 *    defaults; a size below the first version is CXLPOOL_EINVALID_ARGUMENT; a
 *    larger (newer) struct is accepted only when the bytes this library does
 *    not know are zero.
 *  - Exported symbols carry the version node they were added in
 *    (CXLPOOL_0.1, CXLPOOL_0.2) and are never renamed.
 *
 * Thread safety: a cxlpool_client may be used from several threads at once;
 * calls on one client are serialised by a per-client mutex (one request in
 * flight per client). A cxlpool_lease may be read (ptr, size, info, device
 * pointer) from any thread; releasing, (un)registering or verifying it must
 * not race with any other use of the same lease. Leases keep their client's
 * connection alive: the socket closes when the client handle has been
 * disconnected and the last of its leases released.
 */
#ifndef CXLPOOL_CXLPOOL_H_
#define CXLPOOL_CXLPOOL_H_

#include <stddef.h>
#include <stdint.h>

#if defined(CXLPOOL_BUILDING_LIBRARY)
#define CXLPOOL_EXPORT __attribute__((visibility("default")))
#else
#define CXLPOOL_EXPORT
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- error codes: CXLPOOL_E* == -(cxlpool::Code) == -(wire ErrorCode) ---- */
enum {
  CXLPOOL_OK = 0,
  CXLPOOL_EINVALID_ARGUMENT = -1,   /* bad size, NULL, unknown field, garbage */
  CXLPOOL_ENOT_FOUND = -2,          /* no such lease, name, node, GPU, socket */
  CXLPOOL_EPERMISSION_DENIED = -3,  /* ACL refused, not admin, EACCES */
  CXLPOOL_ERESOURCE_EXHAUSTED = -4, /* pool full, quota reached */
  CXLPOOL_EUNAVAILABLE = -5,        /* daemon unreachable or gone, no GPU */
  CXLPOOL_EUNSUPPORTED = -6,        /* no CUDA driver, missing entry point */
  CXLPOOL_EPROTOCOL = -7,           /* bad frame, version mismatch */
  CXLPOOL_EIO = -8,                 /* a syscall failed */
  CXLPOOL_EINTERNAL = -9,           /* broken invariant */
  CXLPOOL_EALREADY_EXISTS = -10,    /* shared name taken */
  CXLPOOL_EREVOKED = -11            /* the lease was revoked (admin, lost shared slice) */
};

/* Static text for an error code ("invalid argument", ...). Never NULL; an
 * unknown code gives "unknown error". */
CXLPOOL_EXPORT const char* cxlpool_strerror(int err);

/* The detail message of the calling thread's last failed cxlpool_* call
 * (e.g. "quota uid 1000 dram: 8 GiB used of 8 GiB"). "" after a success of a
 * call that reports errors. Valid until the thread's next cxlpool_* call. */
CXLPOOL_EXPORT const char* cxlpool_last_error_message(void);

/* The library version, "0.1.0". */
CXLPOOL_EXPORT const char* cxlpool_version(void);

typedef struct cxlpool_client cxlpool_client;
typedef struct cxlpool_lease cxlpool_lease;

/* ---- connection ---- */

/* Writes the default socket path into buf (NUL-terminated):
 * $CXLPOOL_SOCKET if set; else /run/cxlpool/cxlpool.sock for root; else
 * the user's own daemon where a non-root cxlpoold listens by default:
 * $XDG_RUNTIME_DIR/cxlpool.sock, then /tmp/cxlpool-<uid>.sock if this uid
 * owns it, when that socket exists; else the system socket
 * /run/cxlpool/cxlpool.sock.
 * Errors: EINVALID_ARGUMENT (buf NULL or too small; the path is cut). */
CXLPOOL_EXPORT int cxlpool_default_socket_path(char* buf, size_t len);

/* Connects and negotiates the protocol version (hello).
 * socket_path: NULL for the default above.
 * Errors: EINVALID_ARGUMENT (out NULL, path too long), ENOT_FOUND (no socket),
 * EPERMISSION_DENIED, EUNAVAILABLE (refused, daemon gone), EPROTOCOL (no
 * common version, garbled reply), EIO. */
CXLPOOL_EXPORT int cxlpool_connect(const char* socket_path, cxlpool_client** out);

/* Drops the caller's client handle. NULL is a no-op. Leases still held stay
 * mapped and valid; the connection closes when the last of them is released
 * (the daemon releases whatever the connection still held). */
CXLPOOL_EXPORT void cxlpool_disconnect(cxlpool_client* c);

/* Reads, without blocking, any lease events the daemon pushed (revocations)
 * and marks the affected leases. Events are also read during every request.
 * Returns the number of events handled (>= 0) or an error (EUNAVAILABLE when
 * the connection is gone, EPROTOCOL). */
CXLPOOL_EXPORT int cxlpool_process_events(cxlpool_client* c);

/* ---- allocation ---- */

enum {
  CXLPOOL_ALLOC_STRICT = 1u << 0,        /* refuse rather than fall back */
  CXLPOOL_ALLOC_CUDA_REGISTER = 1u << 1, /* cuMemHostRegister after mapping (implies
                                            CXLPOOL_ALLOC_LONG_TERM_PIN) */
  CXLPOOL_ALLOC_HUGETLB = 1u << 2,       /* ask the daemon for hugetlb backing */
  /* The caller will pin the lease long-term itself: RDMA memory registration,
   * io_uring fixed buffers, its own CUDA registration. A long-term pin moves
   * pages out of ZONE_MOVABLE, so the daemon never places such a lease on a
   * node whose memory is all movable (it falls back, or with
   * CXLPOOL_ALLOC_STRICT refuses with EUNSUPPORTED naming the node, its zone
   * and the remedy). After pinning, call cxlpool_lease_verify(). */
  CXLPOOL_ALLOC_LONG_TERM_PIN = 1u << 3
};
#define CXLPOOL_ALLOC_KNOWN_FLAGS 0xFu

typedef struct cxlpool_alloc_opts {
  uint32_t struct_size; /* sizeof(cxlpool_alloc_opts) */
  uint64_t size_bytes;  /* > 0; the daemon rounds up to its page size */
  int32_t numa_node;    /* -1: let the daemon place it */
  int32_t near_gpu;     /* GPU index, -1: none */
  uint32_t flags;       /* CXLPOOL_ALLOC_* */
  const char* label;    /* may be NULL; shown by `cxlpoolctl leases` */
  /* ---- end of version 1 (CXLPOOL_ALLOC_OPTS_SIZE_V1) ---- */
  const char* gpu;             /* GPU uuid or PCI bus id; overrides near_gpu. NULL: none */
  const char* tier_preference; /* node kinds in order, comma separated
                                  ("dram,cxl"). NULL: daemon default */
} cxlpool_alloc_opts;

#define CXLPOOL_ALLOC_OPTS_SIZE_V1 (offsetof(cxlpool_alloc_opts, label) + sizeof(const char*))
#define CXLPOOL_ALLOC_OPTS_SIZE_V2 \
  (offsetof(cxlpool_alloc_opts, tier_preference) + sizeof(const char*))

/* Fills o with defaults: struct_size = sizeof, numa_node = near_gpu = -1. */
CXLPOOL_EXPORT void cxlpool_alloc_opts_init(cxlpool_alloc_opts* o);

/* Asks the daemon for a private lease and maps it.
 * With CXLPOOL_ALLOC_CUDA_REGISTER the mapping is then registered with CUDA
 * on device near_gpu (0 when near_gpu is -1). A failed registration does not
 * fail the allocation: the host mapping works, and
 * cxlpool_lease_device_ptr() reports the registration's error.
 * Errors: EINVALID_ARGUMENT (NULL, struct_size, size 0, unknown flags),
 * ERESOURCE_EXHAUSTED (pool full, quota; see cxlpool_last_error_message),
 * ENOT_FOUND (unknown node or GPU), EUNAVAILABLE, EPROTOCOL (reply or fd
 * does not match), EIO (mmap failed). */
CXLPOOL_EXPORT int cxlpool_alloc(cxlpool_client* c, const cxlpool_alloc_opts* o,
                                 cxlpool_lease** out);

/* Like cxlpool_alloc, and the lease gets a name that processes in the ACL
 * (uids and gids; the owner always) can attach to. Names live in one
 * namespace per owner uid: others find it with cxlpool_attach_from(c,
 * <this process's uid>, name, ...), so no other tenant can take the name.
 * Either ACL array may be NULL when its count is 0.
 * Errors: those of cxlpool_alloc, and EALREADY_EXISTS (this uid already has
 * a shared lease of that name). */
CXLPOOL_EXPORT int cxlpool_alloc_shared(cxlpool_client* c, const cxlpool_alloc_opts* o,
                                        const char* name, const uint32_t* acl_uids, size_t n_uids,
                                        const uint32_t* acl_gids, size_t n_gids,
                                        cxlpool_lease** out);

/* Attaches to the shared lease `name` of the calling process's own uid and
 * maps the same memory. Errors: EINVALID_ARGUMENT, ENOT_FOUND (no such name,
 * or not in its ACL: the daemon does not say which), EUNAVAILABLE,
 * EPROTOCOL, EIO. */
CXLPOOL_EXPORT int cxlpool_attach(cxlpool_client* c, const char* name, cxlpool_lease** out);

/* Attaches to the shared lease `name` that uid `owner_uid` created, and maps
 * it. cxlpool_lease_get_info() then reports owner_uid (and owner_gid): the
 * lease is always the owner's, never another tenant's of the same name.
 * Errors: those of cxlpool_attach. (CXLPOOL_0.2) */
CXLPOOL_EXPORT int cxlpool_attach_from(cxlpool_client* c, uint32_t owner_uid, const char* name,
                                       cxlpool_lease** out);

/* Unregisters from CUDA, unmaps, tells the daemon, closes the fd and frees
 * the handle, always, even when an error is returned. NULL: EINVALID_ARGUMENT.
 * Errors (the handle is freed all the same): EREVOKED (the daemon had
 * revoked it), EUNAVAILABLE (connection gone; the daemon released it when the
 * connection closed), EPROTOCOL. */
CXLPOOL_EXPORT int cxlpool_release(cxlpool_lease* l);

/* ---- lease accessors (NULL lease: NULL / 0 / -1) ---- */
CXLPOOL_EXPORT void* cxlpool_lease_ptr(const cxlpool_lease* l);
CXLPOOL_EXPORT uint64_t cxlpool_lease_size(const cxlpool_lease* l);
CXLPOOL_EXPORT int cxlpool_lease_numa_node(const cxlpool_lease* l);
CXLPOOL_EXPORT uint64_t cxlpool_lease_id(const cxlpool_lease* l);
/* 1 when the daemon has revoked the lease (touching its memory then raises
 * SIGBUS: the daemon truncated the memfd), 0 if not, -1 for NULL. Seen after
 * a request or cxlpool_process_events() on its client. */
CXLPOOL_EXPORT int cxlpool_lease_revoked(const cxlpool_lease* l);

typedef struct cxlpool_lease_info {
  uint32_t struct_size; /* set by the caller: sizeof(cxlpool_lease_info) */
  uint64_t id;
  uint64_t size_bytes; /* mapped size */
  uint64_t requested_bytes;
  uint64_t page_size;
  int32_t numa_node;
  int32_t memory_tier;     /* -1: unknown */
  uint32_t holders;        /* processes holding a shared lease */
  int32_t cuda_registered; /* 1 when registered with CUDA */
  int32_t revoked;         /* 1 when revoked */
  /* Strings below are owned by the lease, valid until it is released;
   * never NULL ("" when unknown). */
  const char* kind;             /* node kind: "dram", "cxl", ... */
  const char* backing;          /* "memfd", "memfd-thp", "hugetlb-2m", "devdax", "shared-slice" */
  const char* placement_reason; /* why the daemon chose this node */
  const char* pool;             /* "node1", "dax0.0" */
  const char* label;
  const char* name; /* shared name, "" if private */
  /* ---- end of version 1 (CXLPOOL_LEASE_INFO_SIZE_V1) ---- */
  uint32_t owner_uid; /* who owns the lease: whose quota, whose name space */
  uint32_t owner_gid;
  /* ---- end of version 2 (CXLPOOL_LEASE_INFO_SIZE_V2) ---- */
  int32_t long_term_pin;    /* 1 when allocated as long-term pinned */
  int32_t placed_numa_node; /* -1, or where the lease was placed once its pages were
                               found on another node (numa_node, kind and pool are
                               then where they are now) */
  const char* moved_reason; /* what the daemon saw when they moved; "" otherwise */
  /* ---- end of version 3 (CXLPOOL_LEASE_INFO_SIZE_V3) ---- */
  uint64_t device_offset; /* backing "shared-slice": where the lease starts on the shared
                             device its fd opens; 0 otherwise */
} cxlpool_lease_info;

#define CXLPOOL_LEASE_INFO_SIZE_V1 (offsetof(cxlpool_lease_info, name) + sizeof(const char*))
#define CXLPOOL_LEASE_INFO_SIZE_V2 (offsetof(cxlpool_lease_info, owner_gid) + sizeof(uint32_t))
#define CXLPOOL_LEASE_INFO_SIZE_V3 \
  (offsetof(cxlpool_lease_info, moved_reason) + sizeof(const char*))
#define CXLPOOL_LEASE_INFO_SIZE_V4 (offsetof(cxlpool_lease_info, device_offset) + sizeof(uint64_t))

/* Copies what the daemon said about the lease into *out, up to
 * out->struct_size bytes. Errors: EINVALID_ARGUMENT (NULL, struct_size). */
CXLPOOL_EXPORT int cxlpool_lease_get_info(const cxlpool_lease* l, cxlpool_lease_info* out);

/* ---- placement check ---- */

/* Where the kernel says a lease's pages are (move_pages over at most 4096
 * pages spread over the lease). */
typedef struct cxlpool_lease_placement {
  uint32_t struct_size;     /* set by the caller: sizeof(cxlpool_lease_placement) */
  int32_t numa_node;        /* the node holding most sampled pages; -1: none resident */
  int32_t placed_numa_node; /* the node the daemon accounted the lease to before the check */
  int32_t moved;            /* 1: the pages are off placed_numa_node (the daemon was told) */
  uint64_t pages_sampled;
  uint64_t pages_on_node; /* of those, on numa_node */
  uint64_t pages_absent;  /* not resident */
} cxlpool_lease_placement;

#define CXLPOOL_LEASE_PLACEMENT_SIZE_V1 \
  (offsetof(cxlpool_lease_placement, pages_absent) + sizeof(uint64_t))

/* Asks the kernel where the lease's pages are, for callers that pinned it by
 * other means than cxlpool_lease_cuda_register() (which checks on its own):
 * a long-term pin may have migrated them off their node. When they left it,
 * the daemon is told (it checks with its own move_pages and moves the
 * lease's accounting to the pool of the node now holding them) and the
 * lease's info (cxlpool_lease_get_info) is updated. `out` may be NULL; it is
 * filled with the census even when telling the daemon fails.
 * Errors: EINVALID_ARGUMENT (NULL lease, out->struct_size), EUNSUPPORTED
 * (devdax: device memory that move_pages cannot place; a kernel without
 * NUMA), EIO (move_pages failed), and the daemon's errors when it is told:
 * EUNAVAILABLE (connection gone), EREVOKED, EPROTOCOL. */
CXLPOOL_EXPORT int cxlpool_lease_verify(cxlpool_lease* l, cxlpool_lease_placement* out);

/* ---- CUDA ----
 * The library loads the CUDA driver API with dlopen("libcuda.so.1"), or the
 * path in $CXLPOOL_CUDA_LIBRARY, the first time it is needed.
 *
 * Registration is done in chunks of at most 64 GiB (single calls of 512 GiB
 * and more fail on recent drivers). Device pointers are contiguous only
 * within one chunk. cxlpool_lease_device_ptr() succeeds when the whole lease
 * is addressable from one pointer: one chunk, or chunks whose device
 * pointers the library verified to be contiguous (the norm with unified
 * addressing). Otherwise use the per-chunk calls. */

/* Registers the lease's mapping with CUDA on `device`, on its primary
 * context, DEVICEMAP|PORTABLE. A registration pins long-term, so the
 * library then checks where the pages are, as cxlpool_lease_verify() does
 * (a failure of that check is logged, not returned). Errors: EINVALID_ARGUMENT (NULL, device < 0),
 * EALREADY_EXISTS (already registered), EUNSUPPORTED (no driver library or
 * entry point), EUNAVAILABLE (no GPU, or the device index does not exist),
 * EIO (the driver refused; see cxlpool_last_error_message). */
CXLPOOL_EXPORT int cxlpool_lease_cuda_register(cxlpool_lease* l, int device);

/* Undoes cxlpool_lease_cuda_register. Releasing a lease does it too.
 * Errors: EINVALID_ARGUMENT, ENOT_FOUND (not registered), EIO. */
CXLPOOL_EXPORT int cxlpool_lease_cuda_unregister(cxlpool_lease* l);

/* The device pointer of the whole lease.
 * Errors: EINVALID_ARGUMENT (NULL), ENOT_FOUND (never registered), the error
 * of a failed registration (EUNSUPPORTED, EUNAVAILABLE, EIO), and
 * EUNSUPPORTED when the chunks' device pointers are not contiguous. */
CXLPOOL_EXPORT int cxlpool_lease_device_ptr(const cxlpool_lease* l, uint64_t* out);

/* Number of registered chunks (0 when not registered), or
 * EINVALID_ARGUMENT. */
CXLPOOL_EXPORT int cxlpool_lease_device_chunk_count(const cxlpool_lease* l);

/* The index-th chunk: its device pointer, and its offset and length in the
 * lease. Any out pointer may be NULL. Errors: EINVALID_ARGUMENT, ENOT_FOUND
 * (index out of range). */
CXLPOOL_EXPORT int cxlpool_lease_device_chunk(const cxlpool_lease* l, uint32_t index,
                                              uint64_t* device_ptr, uint64_t* offset,
                                              uint64_t* length);

/* ---- extents ----
 * A lease is one contiguous range made of one or more extents, each its own
 * file mapped back to back from cxlpool_lease_ptr(). CUDA registration
 * (cxlpool_lease_cuda_register) and the library's own checks cover every
 * extent. Code that pins the lease by other means may need one pin per
 * extent: io_uring, for example, refuses one fixed buffer that spans
 * several files (EINVAL), so register one buffer per extent. */

/* Number of extents (at least 1 for a mapped lease), or EINVALID_ARGUMENT
 * (NULL). */
CXLPOOL_EXPORT int cxlpool_lease_extent_count(const cxlpool_lease* l);

/* The index-th extent: its offset and length in the lease and its page
 * size in bytes. Any out pointer may be NULL. Errors: EINVALID_ARGUMENT
 * (NULL), ENOT_FOUND (index out of range). */
CXLPOOL_EXPORT int cxlpool_lease_extent(const cxlpool_lease* l, uint32_t index, uint64_t* offset,
                                        uint64_t* length, uint64_t* page_size);

/* ---- tiering ----
 * The daemon keeps hot ranges of leases in DRAM near the holder's GPU and
 * cold ones in CXL memory, moving pages in place: the lease's pointer and
 * contents stay the same (docs/daemon.md, "Tiering"; the messages:
 * docs/protocol.md, "Tiering"). It learns what is hot from what holders
 * tell it, since the CPU never sees a GPU's DMA to host memory:
 *  - copies made with cxlpool_lease_copy_in/_out are counted per range;
 *  - cxlpool_lease_note_access reports bytes moved by other means (the
 *    application's own cudaMemcpy, a NIC);
 *  - cxlpool_lease_hint says what a range will be.
 * None of these talks to the daemon: the counts and hints are sent in
 * batches by a thread of the client, every $CXLPOOL_SIGNAL_INTERVAL_MS
 * (default 1000) or once $CXLPOOL_SIGNAL_THRESHOLD bytes (default 256 MiB)
 * are waiting; hints are sent at once. cxlpool_flush_signals sends now.
 *
 * Long-term pinned leases (registered with CUDA by this library, or pinned
 * by the application: io_uring fixed buffers, RDMA) cannot be moved while
 * pinned. The daemon then asks the holder (a push); the application calls
 * cxlpool_safe_point at a moment of its choosing (between batches, no DMA
 * in flight); the library drops the pins (CUDA unregistration, the
 * application's migration callback with CXLPOOL_MIGRATION_PREPARE), tells
 * the daemon, waits while the pages move, and pins again (CUDA registration
 * of the same range: the same device pointer on a system with unified
 * addressing; the callback with CXLPOOL_MIGRATION_RESUME). A holder that
 * does not reach a safe point within the daemon's deadline (2 s by default)
 * is skipped, never forced: its lease stays where it is.
 *
 * Thread safety: copies, cxlpool_lease_note_access and hints may run on any
 * thread at once. cxlpool_safe_point must not race with releasing or
 * (un)registering a lease of the same client. */

enum {
  CXLPOOL_HINT_HOT = 1,       /* keep it in fast memory */
  CXLPOOL_HINT_COLD = 2,      /* may go to slow memory when DRAM is short */
  CXLPOOL_HINT_WILL_NEED = 3, /* needed soon: promote now */
  CXLPOOL_HINT_DONT_NEED = 4  /* not needed for a while: demote now */
};

/* Copies len bytes from src to the lease at offset (copy_in), or from the
 * lease at offset to dst (copy_out), and counts them for the daemon. A
 * revoked lease raises SIGBUS like any access. Errors: EINVALID_ARGUMENT
 * (NULL with len > 0, [offset, offset + len) outside the lease), EREVOKED,
 * EUNAVAILABLE (released). len 0 is a no-op. */
CXLPOOL_EXPORT int cxlpool_lease_copy_in(cxlpool_lease* l, uint64_t offset, const void* src,
                                         size_t len);
CXLPOOL_EXPORT int cxlpool_lease_copy_out(cxlpool_lease* l, uint64_t offset, void* dst, size_t len);

/* Bytes read from and written to [offset, offset + len) by other means.
 * Errors: EINVALID_ARGUMENT (NULL, empty or outside the lease). */
CXLPOOL_EXPORT int cxlpool_lease_note_access(cxlpool_lease* l, uint64_t offset, uint64_t len,
                                             uint64_t bytes_read, uint64_t bytes_written);

/* A CXLPOOL_HINT_* for [offset, offset + len). hot and will_need apply to
 * every extent the range touches; cold and dont_need only to extents it
 * covers whole. Errors: EINVALID_ARGUMENT (NULL, unknown hint, empty range,
 * a range outside the lease; the daemon refuses those too). */
CXLPOOL_EXPORT int cxlpool_lease_hint(cxlpool_lease* l, uint64_t offset, uint64_t len, int hint);

/* 1: the lease stays in its tier (the daemon never moves it); 0: it may
 * move again. Errors: EINVALID_ARGUMENT, ENOT_FOUND, EUNSUPPORTED (the
 * daemon has no tiering), EUNAVAILABLE. */
CXLPOOL_EXPORT int cxlpool_lease_pin_tier(cxlpool_lease* l, int pinned);

enum {
  CXLPOOL_MIGRATION_PREPARE = 1, /* drop your pin of the lease now; return 0 (or
                                    non-zero to decline this migration) */
  CXLPOOL_MIGRATION_RESUME = 2   /* pin it again (same address); the return is ignored */
};
typedef int (*cxlpool_migration_fn)(cxlpool_lease* l, int phase, void* user);

/* Declares a long-term pin the application holds on the lease and how to
 * drop and restore it: fn is called from cxlpool_safe_point, on the
 * caller's thread. NULL fn: no such pin any more. Errors: EINVALID_ARGUMENT,
 * EUNAVAILABLE. */
CXLPOOL_EXPORT int cxlpool_lease_set_migration_callback(cxlpool_lease* l, cxlpool_migration_fn fn,
                                                        void* user);

/* Migrations the daemon asked this client for and that wait for a safe
 * point (reads pending pushes without blocking). >= 0, or EINVALID_ARGUMENT,
 * EUNAVAILABLE. */
CXLPOOL_EXPORT int cxlpool_migrations_pending(cxlpool_client* c);

/* The safe point: answers every pending migration (drop pins, tell the
 * daemon, wait for the move, pin again). Returns how many were answered
 * (0: none pending), or EINVALID_ARGUMENT, EUNAVAILABLE, EPROTOCOL. The
 * pause of each lease is in cxlpool_lease_tiering_stats. */
CXLPOOL_EXPORT int cxlpool_safe_point(cxlpool_client* c);

/* Sends the counted bytes and queued hints now. Errors: EINVALID_ARGUMENT,
 * EUNAVAILABLE (connection gone: counts are best effort). */
CXLPOOL_EXPORT int cxlpool_flush_signals(cxlpool_client* c);

typedef struct cxlpool_tiering_stats {
  uint32_t struct_size;      /* set by the caller: sizeof(cxlpool_tiering_stats) */
  uint64_t bytes_copied_in;  /* through cxlpool_lease_copy_in (and noted writes) */
  uint64_t bytes_copied_out; /* through cxlpool_lease_copy_out (and noted reads) */
  uint64_t migrations;       /* cooperative migrations that moved the lease */
  uint64_t declined;         /* ... that the callback declined */
  int64_t last_pause_ns;     /* pins dropped -> pinned again, last migration */
  int64_t max_pause_ns;
  int32_t numa_node;           /* where its pages are, as last reported */
  uint32_t device_ptr_changed; /* re-registrations that gave another device pointer */
} cxlpool_tiering_stats;

#define CXLPOOL_TIERING_STATS_SIZE_V1 \
  (offsetof(cxlpool_tiering_stats, device_ptr_changed) + sizeof(uint32_t))

/* Errors: EINVALID_ARGUMENT (NULL, struct_size below V1). */
CXLPOOL_EXPORT int cxlpool_lease_tiering_stats(const cxlpool_lease* l, cxlpool_tiering_stats* out);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* CXLPOOL_CXLPOOL_H_ */
