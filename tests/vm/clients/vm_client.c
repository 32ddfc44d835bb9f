/* cxlpool-vm-client: the VM tier's own libcxlpool client, written against the
 * C ABI (<cxlpool/cxlpool.h>). Every claim is checked through the kernel:
 * where the pages are comes from move_pages on our own mapping, never from
 * what the daemon said.
 *
 *   cxlpool-vm-client place  --size B [--node N] [--tier LIST] [--strict]
 *                            [--expect-node N] [--expect-backing B] [--expect-size B]
 *                            [--touch-mib M]
 *       Lease, write a pattern, read it back, check every page is on the
 *       node the daemon reported (and on --expect-node when given). Release.
 *       --touch-mib limits the pattern to the first M MiB (CXL under TCG is
 *       slow). A devdax lease's pages are device memory, which move_pages
 *       cannot place; its node is the DAX device's target_node, which the
 *       guest script checks in sysfs. --expect-extents N: the lease's range
 *       holds exactly N file mappings (/proc/self/maps: one memfd per
 *       extent), and every page of each is on the node (move_pages per
 *       extent), printed as "<tag> EXTENT i ...".
 *   cxlpool-vm-client refuse --size B --node N
 *       A strict lease that must be refused with ERESOURCE_EXHAUSTED.
 *   cxlpool-vm-client share-write NAME --size B [--node N]
 *       Create shared lease NAME, write a pattern, print "READY <node>" and
 *       hold it until stdin reaches EOF (or a line is read), then release.
 *   cxlpool-vm-client share-read NAME [--expect-node N]
 *       Attach to NAME from another process, check the pattern and the node.
 *   cxlpool-vm-client hold --size B [--tier LIST] [--strict] [--expect-backing B]
 *                          [--touch-mib M]
 *       Lease, write a pattern, print "READY <id>" and wait for a line on
 *       stdin (the daemon may be killed and restarted meanwhile: the library
 *       reconnects and hands the lease back). Then check the pattern is
 *       intact, the lease is not revoked and the daemon takes its RELEASE.
 *   cxlpool-vm-client pin --size B [--node N] [--tier LIST] [--strict] [--no-pin-flag]
 *                         [--expect-node N | --expect-moved-to N | --expect-refused]
 *                         [--hold]
 *       A lease asked for with CXLPOOL_ALLOC_LONG_TERM_PIN (unless
 *       --no-pin-flag), written, its pages counted per node (BEFORE), then
 *       pinned long-term with io_uring IORING_REGISTER_BUFFERS (raw
 *       syscalls, as cuMemHostRegister and RDMA pin: FOLL_LONGTERM; one
 *       buffer per extent, as io_uring takes no buffer over two files), counted
 *       again (AFTER), then cxlpool_lease_verify() (VERIFY). --expect-node:
 *       every page on N before and after, nothing moved. --expect-moved-to:
 *       every page on N after the pin, and the library (and so the daemon)
 *       says so. --expect-extents N: as for place, before and after the
 *       pin. --expect-refused: the strict request must be refused with
 *       EUNSUPPORTED naming ZONE_MOVABLE and a daxctl remedy. --hold: print
 *       "READY <id>" and keep the pin until a line on stdin, then release.
 *   cxlpool-vm-client leak --uid-a U --uid-b U [--node N]
 *       No leak between tenants: a child as uid U (A) leases 17 MiB in
 *       granule-sized and odd-sized leases, fills them with a pattern and
 *       releases them; then a child as the other uid (B) leases at least
 *       twice those bytes (releasing its oldest when the pool is full, so
 *       later leases come out of the same memory again) and reads every byte:
 *       all zeros. Prints "LEAK-CHECK <bytes read>". Needs root.
 * Common option: --socket PATH. Exit 0 when the check holds, 1 otherwise
 * (reason on stderr), 2 on bad usage. Single-threaded. */
#define _GNU_SOURCE
#include <cxlpool/cxlpool.h>
#include <errno.h>
#include <grp.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../probe/longterm_pin.h"

typedef struct {
  const char* cmd;
  const char* name;
  const char* socket_path;
  const char* tier;
  uint64_t size;
  int node;
  int expect_node;
  int strict;
  uint64_t touch;             /* bytes to write and verify; 0: all */
  const char* expect_backing; /* e.g. "devdax" */
  uint64_t expect_size;       /* lease size must be this; 0: any */
  int no_pin_flag;            /* pin: do not tell the daemon */
  int expect_moved_to;        /* pin: -1, or the node the pin must move the pages to */
  int expect_refused;         /* pin: the strict request must be refused */
  int hold;                   /* pin: wait for a line on stdin before releasing */
  int expect_extents;         /* place, pin: the lease's file mappings; 0: not checked */
  int uid_a, uid_b;           /* leak: the two tenants */
} Args;

static int Usage(void) {
  fprintf(stderr,
          "usage: cxlpool-vm-client place|refuse|share-write|share-read|hold|pin|leak [NAME]\n"
          "       [--socket P]\n"
          "       [--size B] [--node N] [--tier LIST] [--strict] [--expect-node N]\n"
          "       [--expect-backing B] [--expect-size B] [--touch-mib M] [--expect-extents N]\n"
          "       pin: [--no-pin-flag] [--expect-moved-to N] [--expect-refused] [--hold]\n"
          "       leak: --uid-a U --uid-b U\n");
  return 2;
}

static int Fail(const char* what, int rc) {
  fprintf(stderr, "%s: %s (%s)\n", what, cxlpool_strerror(rc), cxlpool_last_error_message());
  return 1;
}

static unsigned char Pattern(uint64_t i, uint64_t seed) {
  return (unsigned char)(((i * 2654435761u) >> 13) ^ seed);
}

enum { kMaxNodes = 64 };

/* Pages of [p, p+len) per node (move_pages on self); prints "<tag> N0=.. absent=..".
 * Returns the node holding all resident pages, -1 when they are split or
 * none is resident, -2 on error. */
static int CountNodes(const char* tag, void* p, uint64_t len) {
  long page = sysconf(_SC_PAGESIZE);
  uint64_t pages = len / (uint64_t)page, done = 0, absent = 0;
  uint64_t on[kMaxNodes];
  memset(on, 0, sizeof on);
  enum { kChunk = 1024 };
  void* addr[kChunk];
  int status[kChunk];
  while (done < pages) {
    unsigned long n = 0;
    for (; n < kChunk && done + n < pages; ++n) addr[n] = (char*)p + (done + n) * (uint64_t)page;
    if (syscall(SYS_move_pages, 0, n, addr, NULL, status, 0) != 0) {
      fprintf(stderr, "move_pages: %s\n", strerror(errno));
      return -2;
    }
    for (unsigned long i = 0; i < n; ++i) {
      if (status[i] >= 0 && status[i] < kMaxNodes) {
        on[status[i]]++;
      } else {
        absent++;
      }
    }
    done += n;
  }
  int only = -1, nodes = 0;
  printf("%s", tag);
  for (int n = 0; n < kMaxNodes; ++n) {
    if (on[n] == 0) continue;
    printf(" N%d=%" PRIu64, n, on[n]);
    only = n;
    ++nodes;
  }
  printf(" absent=%" PRIu64 "\n", absent);
  return nodes == 1 && absent == 0 ? only : -1;
}

/* Every page of [p, p+len) is resident on `node` (move_pages on self). */
static int PagesOn(void* p, uint64_t len, int node) {
  char tag[32];
  snprintf(tag, sizeof tag, "PAGES want=%d", node);
  return CountNodes(tag, p, len) == node;
}

/* The file mappings (memfds: a lease's extents) in [p, p+len), from
 * /proc/self/maps in address order, clipped to the range; at most `max`.
 * Returns how many, or -1 when /proc/self/maps cannot be read. */
static int FileMappingsIn(void* p, uint64_t len, struct iovec* out, int max) {
  FILE* f = fopen("/proc/self/maps", "r");
  if (f == NULL) return -1;
  const uint64_t lo = (uint64_t)(uintptr_t)p, hi = lo + len;
  int count = 0;
  char line[512];
  while (count < max && fgets(line, sizeof line, f) != NULL) {
    unsigned long start = 0, end = 0, inode = 0;
    if (sscanf(line, "%lx-%lx %*s %*s %*s %lu", &start, &end, &inode) != 3) continue;
    if (end <= lo || start >= hi || inode == 0) continue;
    uint64_t a = start > lo ? start : lo, b = end < hi ? end : hi;
    out[count].iov_base = (void*)(uintptr_t)a;
    out[count].iov_len = (size_t)(b - a);
    ++count;
  }
  fclose(f);
  return count;
}

/* The lease's extents as the kernel maps them (FileMappingsIn): back to
 * back over the whole range, `want` of them, and every page of each on
 * `node` (CountNodes per mapping). */
static int ExtentsOn(const char* tag, void* p, uint64_t len, int node, int want) {
  enum { kMaxExtents = 1024 };
  static struct iovec m[kMaxExtents];
  int count = FileMappingsIn(p, len, m, kMaxExtents);
  if (count < 0) {
    fprintf(stderr, "/proc/self/maps: %s\n", strerror(errno));
    return 0;
  }
  const uint64_t lo = (uint64_t)(uintptr_t)p;
  uint64_t covered = lo;
  int ok = 1;
  for (int i = 0; i < count; ++i) {
    const uint64_t start = (uint64_t)(uintptr_t)m[i].iov_base;
    if (start != covered) {
      fprintf(stderr, "%s: extent %d starts at +%" PRIu64 ", expected +%" PRIu64 "\n", tag, i,
              start - lo, covered - lo);
      ok = 0;
    }
    char t[96];
    snprintf(t, sizeof t, "%s EXTENT %d +%" PRIu64 " size=%zu", tag, i, start - lo, m[i].iov_len);
    if (CountNodes(t, m[i].iov_base, m[i].iov_len) != node) ok = 0;
    covered = start + m[i].iov_len;
  }
  if (covered != lo + len) {
    fprintf(stderr, "%s: the extents end at +%" PRIu64 " of %" PRIu64 "\n", tag, covered - lo, len);
    ok = 0;
  }
  if (count != want) {
    fprintf(stderr, "%s: %d extents mapped, expected %d\n", tag, count, want);
    ok = 0;
  }
  return ok;
}

/* Prints the daemon's view of the lease; copies its backing into `backing`. */
static void Describe(const cxlpool_lease* l, char* backing, size_t len) {
  cxlpool_lease_info info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  if (backing != NULL) backing[0] = '\0';
  if (cxlpool_lease_get_info(l, &info) == CXLPOOL_OK) {
    if (backing != NULL && info.backing != NULL) snprintf(backing, len, "%s", info.backing);
    printf("LEASE id=%" PRIu64 " size=%" PRIu64 " node=%d kind=%s pool=%s backing=%s reason=%s\n",
           info.id, info.size_bytes, info.numa_node, info.kind ? info.kind : "?",
           info.pool ? info.pool : "?", info.backing ? info.backing : "?",
           info.placement_reason ? info.placement_reason : "?");
  }
}

/* Allocation options from the command line: size, node, tier; `flags` and
 * `label` as the command wants them. */
static void OptsFromArgs(const Args* a, uint32_t flags, const char* label, cxlpool_alloc_opts* o) {
  cxlpool_alloc_opts_init(o);
  o->size_bytes = a->size;
  o->numa_node = a->node;
  o->near_gpu = -1;
  o->flags = flags;
  o->label = label;
  o->tier_preference = a->tier;
}

/* 1 (and says so) when --expect-backing was given and the lease has another. */
static int WrongBacking(const Args* a, const char* backing) {
  if (a->expect_backing == NULL || strcmp(backing, a->expect_backing) == 0) return 0;
  fprintf(stderr, "lease backing '%s', expected '%s'\n", backing, a->expect_backing);
  return 1;
}

/* A private lease as the command line asks (--strict honoured), printed;
 * its backing kind goes to `backing`. Returns the cxlpool error code. */
static int AllocDescribed(cxlpool_client* c, const Args* a, const char* label, cxlpool_lease** l,
                          char* backing, size_t len) {
  cxlpool_alloc_opts o;
  OptsFromArgs(a, a->strict ? CXLPOOL_ALLOC_STRICT : 0, label, &o);
  int rc = cxlpool_alloc(c, &o, l);
  if (rc == CXLPOOL_OK) Describe(*l, backing, len);
  return rc;
}

static int Place(cxlpool_client* c, const Args* a) {
  cxlpool_lease* l = NULL;
  char backing[32];
  int rc = AllocDescribed(c, a, "vm-client", &l, backing, sizeof backing);
  if (rc != CXLPOOL_OK) return Fail("alloc", rc);
  unsigned char* p = cxlpool_lease_ptr(l);
  uint64_t n = cxlpool_lease_size(l);
  if (a->touch != 0 && a->touch < n) n = a->touch;
  int node = cxlpool_lease_numa_node(l);
  for (uint64_t i = 0; i < n; ++i) p[i] = Pattern(i, 7);
  uint64_t bad = 0;
  for (uint64_t i = 0; i < n; ++i) bad += p[i] != Pattern(i, 7);
  int ok = bad == 0;
  if (strcmp(backing, "devdax") == 0) {
    printf("PAGES devdax: device memory, node from the DAX device's target_node\n");
  } else {
    ok = ok && PagesOn(p, n, node);
    if (a->expect_extents > 0) {
      ok = ExtentsOn("PLACE", p, cxlpool_lease_size(l), node, a->expect_extents) && ok;
    }
  }
  if (a->expect_size != 0 && cxlpool_lease_size(l) != a->expect_size) {
    fprintf(stderr, "lease size %" PRIu64 ", expected %" PRIu64 "\n", cxlpool_lease_size(l),
            a->expect_size);
    ok = 0;
  }
  if (WrongBacking(a, backing)) ok = 0;
  if (bad != 0) fprintf(stderr, "%" PRIu64 " bytes read back wrong\n", bad);
  if (a->expect_node >= 0 && node != a->expect_node) {
    fprintf(stderr, "daemon placed the lease on node %d, expected %d\n", node, a->expect_node);
    ok = 0;
  }
  rc = cxlpool_release(l);
  if (rc != CXLPOOL_OK) return Fail("release", rc);
  return ok ? 0 : 1;
}

static int Refuse(cxlpool_client* c, const Args* a) {
  cxlpool_alloc_opts o;
  OptsFromArgs(a, CXLPOOL_ALLOC_STRICT, NULL, &o);
  cxlpool_lease* l = NULL;
  int rc = cxlpool_alloc(c, &o, &l);
  if (rc == CXLPOOL_OK) {
    Describe(l, NULL, 0);
    cxlpool_release(l);
    fprintf(stderr, "strict lease of %" PRIu64 " bytes on node %d was granted\n", a->size, a->node);
    return 1;
  }
  printf("REFUSED %s: %s\n", cxlpool_strerror(rc), cxlpool_last_error_message());
  return rc == CXLPOOL_ERESOURCE_EXHAUSTED ? 0 : 1;
}

static int ShareWrite(cxlpool_client* c, const Args* a) {
  cxlpool_alloc_opts o;
  OptsFromArgs(a, a->node >= 0 ? CXLPOOL_ALLOC_STRICT : 0, NULL, &o);
  cxlpool_lease* l = NULL;
  int rc = cxlpool_alloc_shared(c, &o, a->name, NULL, 0, NULL, 0, &l);
  if (rc != CXLPOOL_OK) return Fail("alloc_shared", rc);
  Describe(l, NULL, 0);
  unsigned char* p = cxlpool_lease_ptr(l);
  uint64_t n = cxlpool_lease_size(l);
  for (uint64_t i = 0; i < n; ++i) p[i] = Pattern(i, 0x5a);
  printf("READY %d\n", cxlpool_lease_numa_node(l));
  fflush(stdout);
  char line[16];
  (void)!fgets(line, sizeof line, stdin);
  rc = cxlpool_release(l);
  return rc == CXLPOOL_OK ? 0 : Fail("release", rc);
}

static int ShareRead(cxlpool_client* c, const Args* a) {
  cxlpool_lease* l = NULL;
  int rc = cxlpool_attach(c, a->name, &l);
  if (rc != CXLPOOL_OK) return Fail("attach", rc);
  Describe(l, NULL, 0);
  const unsigned char* p = cxlpool_lease_ptr(l);
  uint64_t n = cxlpool_lease_size(l);
  uint64_t bad = 0;
  for (uint64_t i = 0; i < n; ++i) bad += p[i] != Pattern(i, 0x5a);
  int node = a->expect_node >= 0 ? a->expect_node : cxlpool_lease_numa_node(l);
  int ok = bad == 0 && PagesOn((void*)p, n, node);
  printf("SHARED bytes=%" PRIu64 " corrupt=%" PRIu64 "\n", n, bad);
  rc = cxlpool_release(l);
  if (rc != CXLPOOL_OK) return Fail("release", rc);
  return ok ? 0 : 1;
}

static int Pin(cxlpool_client* c, const Args* a) {
  cxlpool_alloc_opts o;
  uint32_t flags =
      (a->strict ? CXLPOOL_ALLOC_STRICT : 0) | (a->no_pin_flag ? 0 : CXLPOOL_ALLOC_LONG_TERM_PIN);
  OptsFromArgs(a, flags, "vm-pin", &o);
  cxlpool_lease* l = NULL;
  int rc = cxlpool_alloc(c, &o, &l);
  if (a->expect_refused) {
    if (rc == CXLPOOL_OK) {
      Describe(l, NULL, 0);
      cxlpool_release(l);
      fprintf(stderr, "the long-term pinned lease was granted\n");
      return 1;
    }
    const char* m = cxlpool_last_error_message();
    printf("REFUSED %s: %s\n", cxlpool_strerror(rc), m);
    int ok = rc == CXLPOOL_EUNSUPPORTED && strstr(m, "ZONE_MOVABLE") != NULL &&
             strstr(m, "daxctl") != NULL && (a->node < 0 || strstr(m, "node ") != NULL);
    return ok ? 0 : 1;
  }
  if (rc != CXLPOOL_OK) return Fail("alloc", rc);
  Describe(l, NULL, 0);
  int placed = cxlpool_lease_numa_node(l);
  unsigned char* p = cxlpool_lease_ptr(l);
  uint64_t n = cxlpool_lease_size(l);
  for (uint64_t i = 0; i < n; ++i) p[i] = Pattern(i, 0x71);
  int before = CountNodes("BEFORE", p, n);
  int extents_ok = 1;
  if (a->expect_extents > 0) {
    extents_ok =
        ExtentsOn("BEFORE", p, n, a->expect_node >= 0 ? a->expect_node : placed, a->expect_extents);
  }
  /* One io_uring buffer per extent (per file mapping): a buffer over
   * several files is EINVAL. */
  enum { kMaxPinned = 1024 };
  static struct iovec iov[kMaxPinned];
  int nio = FileMappingsIn(p, n, iov, kMaxPinned);
  int ring = nio > 0 ? VmLongTermPinIov(iov, (unsigned)nio) : VmLongTermPin(p, (size_t)n);
  if (ring < 0) {
    cxlpool_release(l);
    return 1;
  }
  int after = CountNodes("AFTER", p, n);
  if (a->expect_extents > 0) {
    int want = a->expect_moved_to >= 0 ? a->expect_moved_to
                                       : (a->expect_node >= 0 ? a->expect_node : placed);
    extents_ok = ExtentsOn("AFTER", p, n, want, a->expect_extents) && extents_ok;
  }
  cxlpool_lease_placement pl;
  memset(&pl, 0, sizeof pl);
  pl.struct_size = sizeof pl;
  rc = cxlpool_lease_verify(l, &pl);
  printf("VERIFY rc=%s node=%d placed=%d moved=%d sampled=%" PRIu64 " on_node=%" PRIu64 "\n",
         cxlpool_strerror(rc), pl.numa_node, pl.placed_numa_node, pl.moved, pl.pages_sampled,
         pl.pages_on_node);
  cxlpool_lease_info info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  cxlpool_lease_get_info(l, &info);
  printf("INFO node=%d placed_node=%d pool=%s moved_reason=%s\n", info.numa_node,
         info.placed_numa_node, info.pool ? info.pool : "?",
         info.moved_reason ? info.moved_reason : "");
  uint64_t bad = 0;
  for (uint64_t i = 0; i < n; ++i) bad += p[i] != Pattern(i, 0x71);
  int ok = rc == CXLPOOL_OK && bad == 0 && extents_ok;
  if (bad != 0) fprintf(stderr, "%" PRIu64 " bytes read back wrong after the pin\n", bad);
  if (a->expect_node >= 0) {
    if (before != a->expect_node || after != a->expect_node || placed != a->expect_node ||
        pl.moved != 0 || pl.numa_node != a->expect_node) {
      fprintf(stderr, "expected every page on node %d before and after the pin\n", a->expect_node);
      ok = 0;
    }
  }
  if (a->expect_moved_to >= 0) {
    if (after != a->expect_moved_to || pl.moved != 1 || pl.numa_node != a->expect_moved_to ||
        info.numa_node != a->expect_moved_to || info.placed_numa_node != placed) {
      fprintf(stderr, "expected the pin to move every page to node %d, and the library to say so\n",
              a->expect_moved_to);
      ok = 0;
    }
  }
  if (a->hold) {
    printf("READY %" PRIu64 "\n", cxlpool_lease_id(l));
    fflush(stdout);
    char line[16];
    (void)!fgets(line, sizeof line, stdin);
  }
  close(ring);
  rc = cxlpool_release(l);
  if (rc != CXLPOOL_OK) return Fail("release", rc);
  fflush(stdout);
  return ok ? 0 : 1;
}

static int Hold(cxlpool_client* c, const Args* a) {
  cxlpool_lease* l = NULL;
  char backing[32];
  int rc = AllocDescribed(c, a, "vm-hold", &l, backing, sizeof backing);
  if (rc != CXLPOOL_OK) return Fail("alloc", rc);
  if (WrongBacking(a, backing)) {
    cxlpool_release(l);
    return 1;
  }
  unsigned char* p = cxlpool_lease_ptr(l);
  uint64_t n = cxlpool_lease_size(l);
  if (a->touch != 0 && a->touch < n) n = a->touch;
  for (uint64_t i = 0; i < n; ++i) p[i] = Pattern(i, 0x3c);
  printf("READY %" PRIu64 "\n", cxlpool_lease_id(l));
  fflush(stdout);
  char line[16];
  (void)!fgets(line, sizeof line, stdin);
  uint64_t bad = 0;
  for (uint64_t i = 0; i < n; ++i) bad += p[i] != Pattern(i, 0x3c);
  int revoked = cxlpool_lease_revoked(l);
  rc = cxlpool_release(l);
  printf("HELD bytes=%" PRIu64 " corrupt=%" PRIu64 " revoked=%d release=%s\n", n, bad, revoked,
         cxlpool_strerror(rc));
  fflush(stdout);
  return bad == 0 && !revoked && rc == CXLPOOL_OK ? 0 : 1;
}

/* ---- leak: one tenant's released bytes never reach another ---- */

static const uint64_t kLeakSizes[] = {2u << 20,         2u << 20,           (8u << 20) + 4097,
                                      (100u << 10) + 1, (5u << 20) + 12345, 64u << 10};
enum { kLeakCount = sizeof kLeakSizes / sizeof kLeakSizes[0], kLeakMax = 64 };

static uint64_t PageUp(uint64_t v) { return (v + 4095) / 4096 * 4096; }

static int BecomeUid(int uid) {
  gid_t g = (gid_t)uid;
  return setgroups(1, &g) == 0 && setresgid(g, g, g) == 0 &&
         setresuid((uid_t)uid, (uid_t)uid, (uid_t)uid) == 0;
}

static int LeakFill(const Args* a) {
  cxlpool_client* c = NULL;
  int rc = cxlpool_connect(a->socket_path, &c);
  if (rc != CXLPOOL_OK) return Fail("tenant A: connect", rc);
  cxlpool_lease* held[kLeakCount];
  for (int k = 0; k < kLeakCount; ++k) {
    cxlpool_alloc_opts o;
    cxlpool_alloc_opts_init(&o);
    o.size_bytes = kLeakSizes[k];
    o.numa_node = a->node;
    o.label = "vm-leak-a";
    rc = cxlpool_alloc(c, &o, &held[k]);
    if (rc != CXLPOOL_OK) return Fail("tenant A: alloc", rc);
    unsigned char* p = cxlpool_lease_ptr(held[k]);
    uint64_t n = cxlpool_lease_size(held[k]);
    for (uint64_t i = 0; i < n; ++i) p[i] = (unsigned char)(Pattern(i, 0x5a) | 1);
    for (uint64_t i = 0; i < n; ++i) {
      if (p[i] != (unsigned char)(Pattern(i, 0x5a) | 1)) {
        fprintf(stderr, "tenant A: pattern did not stick at byte %" PRIu64 "\n", i);
        return 1;
      }
    }
  }
  for (int k = 0; k < kLeakCount; ++k) (void)cxlpool_release(held[k]);
  cxlpool_disconnect(c);
  return 0;
}

static int LeakCheck(const Args* a, uint64_t want) {
  cxlpool_client* c = NULL;
  int rc = cxlpool_connect(a->socket_path, &c);
  if (rc != CXLPOOL_OK) return Fail("tenant B: connect", rc);
  cxlpool_lease* held[kLeakMax];
  int first = 0, last = 0; /* held[first..last) */
  uint64_t got = 0;
  for (int k = 0; got < want;) {
    cxlpool_alloc_opts o;
    cxlpool_alloc_opts_init(&o);
    o.size_bytes = kLeakSizes[(kLeakCount - 1 - k % kLeakCount)];
    o.numa_node = a->node;
    o.label = "vm-leak-b";
    cxlpool_lease* l = NULL;
    rc = cxlpool_alloc(c, &o, &l);
    if (rc != CXLPOOL_OK) {
      if (first == last) return Fail("tenant B: alloc", rc);
      (void)cxlpool_release(held[first % kLeakMax]);
      ++first;
      continue;
    }
    const unsigned char* p = cxlpool_lease_ptr(l);
    uint64_t n = cxlpool_lease_size(l);
    for (uint64_t i = 0; i < n; ++i) {
      if (p[i] != 0) {
        fprintf(stderr,
                "tenant B: lease %" PRIu64 " byte %" PRIu64
                " is 0x%02x%s: another tenant's bytes\n",
                cxlpool_lease_id(l), i, p[i],
                p[i] == (unsigned char)(Pattern(i, 0x5a) | 1) ? " (tenant A's pattern)" : "");
        return 1;
      }
    }
    got += n;
    if (last - first == kLeakMax) {
      (void)cxlpool_release(held[first % kLeakMax]);
      ++first;
    }
    held[last % kLeakMax] = l;
    ++last;
    ++k;
  }
  for (; first < last; ++first) (void)cxlpool_release(held[first % kLeakMax]);
  cxlpool_disconnect(c);
  printf("LEAK-CHECK %" PRIu64 " bytes of zeros read by uid %d after uid %d's pattern\n", got,
         a->uid_b, a->uid_a);
  return 0;
}

static int AsUid(int uid, int (*fn)(const Args*, uint64_t), const Args* a, uint64_t arg) {
  fflush(NULL);
  pid_t p = fork();
  if (p < 0) return 1;
  if (p == 0) {
    if (!BecomeUid(uid)) {
      fprintf(stderr, "cannot become uid %d: %s\n", uid, strerror(errno));
      _exit(1);
    }
    _exit(fn(a, arg));
  }
  int st = 0;
  if (waitpid(p, &st, 0) != p) return 1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}

static int LeakFillArg(const Args* a, uint64_t unused) {
  (void)unused;
  return LeakFill(a);
}

static int Leak(const Args* a) {
  if (a->uid_a < 0 || a->uid_b < 0 || a->uid_a == a->uid_b) return Usage();
  uint64_t total = 0;
  for (int k = 0; k < kLeakCount; ++k) total += PageUp(kLeakSizes[k]);
  int rc = AsUid(a->uid_a, LeakFillArg, a, 0);
  if (rc != 0) return rc;
  return AsUid(a->uid_b, LeakCheck, a, 2 * total);
}

int main(int argc, char** argv) {
  Args a = {.node = -1,
            .expect_node = -1,
            .expect_moved_to = -1,
            .uid_a = -1,
            .uid_b = -1,
            .size = 4u << 20};
  if (argc < 2) return Usage();
  a.cmd = argv[1];
  int i = 2;
  if (strncmp(a.cmd, "share-", 6) == 0) {
    if (argc < 3) return Usage();
    a.name = argv[i++];
  }
  for (; i < argc; ++i) {
    const char* opt = argv[i];
    const char* val = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(opt, "--strict") == 0) {
      a.strict = 1;
      continue;
    }
    if (strcmp(opt, "--no-pin-flag") == 0 || strcmp(opt, "--expect-refused") == 0 ||
        strcmp(opt, "--hold") == 0) {
      if (opt[2] == 'n') a.no_pin_flag = 1;
      if (opt[2] == 'e') a.expect_refused = 1;
      if (opt[2] == 'h') a.hold = 1;
      continue;
    }
    if (val == NULL) return Usage();
    ++i;
    if (strcmp(opt, "--socket") == 0) {
      a.socket_path = val;
    } else if (strcmp(opt, "--tier") == 0) {
      a.tier = val;
    } else if (strcmp(opt, "--size") == 0) {
      a.size = strtoull(val, NULL, 0);
    } else if (strcmp(opt, "--node") == 0) {
      a.node = atoi(val);
    } else if (strcmp(opt, "--touch-mib") == 0) {
      a.touch = strtoull(val, NULL, 0) << 20;
    } else if (strcmp(opt, "--expect-size") == 0) {
      a.expect_size = strtoull(val, NULL, 0);
    } else if (strcmp(opt, "--expect-backing") == 0) {
      a.expect_backing = val;
    } else if (strcmp(opt, "--expect-node") == 0) {
      a.expect_node = atoi(val);
    } else if (strcmp(opt, "--expect-moved-to") == 0) {
      a.expect_moved_to = atoi(val);
    } else if (strcmp(opt, "--expect-extents") == 0) {
      a.expect_extents = atoi(val);
    } else if (strcmp(opt, "--uid-a") == 0) {
      a.uid_a = atoi(val);
    } else if (strcmp(opt, "--uid-b") == 0) {
      a.uid_b = atoi(val);
    } else {
      return Usage();
    }
  }
  if (strcmp(a.cmd, "leak") == 0) return Leak(&a); /* its tenants connect themselves */
  cxlpool_client* c = NULL;
  int rc = cxlpool_connect(a.socket_path, &c);
  if (rc != CXLPOOL_OK) return Fail("connect", rc);
  int out;
  if (strcmp(a.cmd, "place") == 0) {
    out = Place(c, &a);
  } else if (strcmp(a.cmd, "refuse") == 0) {
    out = Refuse(c, &a);
  } else if (strcmp(a.cmd, "share-write") == 0) {
    out = ShareWrite(c, &a);
  } else if (strcmp(a.cmd, "share-read") == 0) {
    out = ShareRead(c, &a);
  } else if (strcmp(a.cmd, "hold") == 0) {
    out = Hold(c, &a);
  } else if (strcmp(a.cmd, "pin") == 0) {
    out = Pin(c, &a);
  } else {
    out = Usage();
  }
  cxlpool_disconnect(c);
  return out;
}
