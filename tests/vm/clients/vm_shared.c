/* cxlpool-vm-shared: leases on a shared CXL device's slices, for the
 * two-guest check (tests/vm/run-pair-vm.sh). Written against the C ABI.
 *
 *   cxlpool-vm-shared hold --socket S --tag T --count N
 *       Takes N strict leases of tier "shared". Each must read zero over its
 *       whole size before anything is written; then it is filled with a
 *       pattern of 64-bit words made of the tag and the word's place on the
 *       device (device_offset + 8 i). Prints "SLICE <device_offset> <size>"
 *       per lease and "READY", then reads lines on stdin:
 *         check    every lease still holds its pattern: "CHECK ok" or
 *                  "CHECK corrupt=<words>"
 *         release  (or EOF) checks, releases them all and exits
 *   cxlpool-vm-shared fill --socket S --tag T [--wait-s W]
 *       Takes leases of tier "shared" until the daemon has refused for W
 *       seconds in a row (default 10: a host claims its next slice within a
 *       round of its cluster thread). Each must read zero; each is written,
 *       printed as above, checked and, at the end, released.
 *
 * A lease that is revoked, not of backing "shared-slice", not zero when
 * granted or not intact when checked fails the command (exit 1, reason on
 * stderr). Exit 2 on bad usage. Single-threaded. */
#define _GNU_SOURCE
#include <cxlpool/cxlpool.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { kMaxLeases = 256 };

typedef struct {
  cxlpool_lease* lease;
  uint64_t offset; /* on the device */
  uint64_t words;
} Held;

static uint64_t g_tag;

static uint64_t TagOf(const char* s) { /* FNV-1a */
  uint64_t h = 1469598103934665603ull;
  for (; *s != '\0'; ++s) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

static uint64_t Word(uint64_t device_byte) { return g_tag ^ (device_byte * 0x9e3779b97f4a7c15ull); }

static double Now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Takes one strict lease of tier "shared"; 0 ok, else the cxlpool error. On
 * success checks it is a zeroed shared slice, fills it and prints it; a
 * lease failing a check is released and -1 returned. */
static int Take(cxlpool_client* c, Held* h) {
  cxlpool_alloc_opts o;
  cxlpool_alloc_opts_init(&o);
  o.size_bytes = 2u << 20; /* a slice is leased whole, whatever is asked */
  o.numa_node = -1;
  o.near_gpu = -1;
  o.flags = CXLPOOL_ALLOC_STRICT;
  o.label = "vm-shared";
  o.tier_preference = "shared";
  int rc = cxlpool_alloc(c, &o, &h->lease);
  if (rc != CXLPOOL_OK) return rc;
  cxlpool_lease_info info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  rc = cxlpool_lease_get_info(h->lease, &info);
  const char* why = NULL;
  if (rc != CXLPOOL_OK)
    why = "no lease info";
  else if (strcmp(info.backing, "shared-slice") != 0)
    why = "backing is not shared-slice";
  h->offset = info.device_offset;
  h->words = cxlpool_lease_size(h->lease) / 8;
  uint64_t* p = (uint64_t*)cxlpool_lease_ptr(h->lease);
  uint64_t dirty = 0;
  for (uint64_t i = 0; why == NULL && i < h->words; ++i) dirty += p[i] != 0;
  if (why == NULL && dirty != 0) {
    fprintf(stderr, "slice at %" PRIu64 ": %" PRIu64 " of %" PRIu64 " words not zero\n", h->offset,
            dirty, h->words);
    why = "granted not zeroed";
  }
  if (why != NULL) {
    fprintf(stderr, "lease %" PRIu64 " (backing %s): %s\n", cxlpool_lease_id(h->lease),
            rc == CXLPOOL_OK ? info.backing : "?", why);
    cxlpool_release(h->lease);
    return -1;
  }
  for (uint64_t i = 0; i < h->words; ++i) p[i] = Word(h->offset + 8 * i);
  printf("SLICE %" PRIu64 " %" PRIu64 "\n", h->offset, h->words * 8);
  fflush(stdout);
  return 0;
}

/* Words of the held leases that lost their pattern; revoked leases count
 * as one each. */
static uint64_t Corrupt(const Held* held, int n) {
  uint64_t bad = 0;
  for (int k = 0; k < n; ++k) {
    const uint64_t* p = (const uint64_t*)cxlpool_lease_ptr(held[k].lease);
    uint64_t here = 0;
    for (uint64_t i = 0; i < held[k].words; ++i) here += p[i] != Word(held[k].offset + 8 * i);
    if (cxlpool_lease_revoked(held[k].lease)) {
      fprintf(stderr, "slice at %" PRIu64 ": lease revoked\n", held[k].offset);
      ++here;
    }
    if (here != 0)
      fprintf(stderr, "slice at %" PRIu64 ": %" PRIu64 " words changed\n", held[k].offset, here);
    bad += here;
  }
  return bad;
}

static int ReleaseAll(Held* held, int n) {
  int failed = 0;
  for (int k = 0; k < n; ++k) {
    int rc = cxlpool_release(held[k].lease);
    if (rc != CXLPOOL_OK) {
      fprintf(stderr, "release: %s (%s)\n", cxlpool_strerror(rc), cxlpool_last_error_message());
      failed = 1;
    }
  }
  return failed;
}

static int Usage(void) {
  fprintf(stderr,
          "usage: cxlpool-vm-shared hold --socket S --tag T --count N\n"
          "       cxlpool-vm-shared fill --socket S --tag T [--wait-s W]\n");
  return 2;
}

int main(int argc, char** argv) {
  if (argc < 2) return Usage();
  const char* cmd = argv[1];
  const char* socket_path = NULL;
  const char* tag = NULL;
  int count = 0;
  double wait_s = 10;
  for (int i = 2; i < argc; ++i) {
    if (i + 1 >= argc) return Usage();
    if (strcmp(argv[i], "--socket") == 0)
      socket_path = argv[++i];
    else if (strcmp(argv[i], "--tag") == 0)
      tag = argv[++i];
    else if (strcmp(argv[i], "--count") == 0)
      count = atoi(argv[++i]);
    else if (strcmp(argv[i], "--wait-s") == 0)
      wait_s = atof(argv[++i]);
    else
      return Usage();
  }
  const int hold = strcmp(cmd, "hold") == 0;
  if ((!hold && strcmp(cmd, "fill") != 0) || tag == NULL || (hold && count <= 0) ||
      count > kMaxLeases || wait_s < 0)
    return Usage();
  g_tag = TagOf(tag);

  cxlpool_client* c = NULL;
  int rc = cxlpool_connect(socket_path, &c);
  if (rc != CXLPOOL_OK) {
    fprintf(stderr, "connect: %s (%s)\n", cxlpool_strerror(rc), cxlpool_last_error_message());
    return 1;
  }
  static Held held[kMaxLeases];
  int n = 0, failed = 0;
  double refused_since = 0;
  while (n < (hold ? count : kMaxLeases)) {
    rc = Take(c, &held[n]);
    if (rc == 0) {
      ++n;
      refused_since = 0;
      continue;
    }
    if (rc == -1) {
      failed = 1;
      break;
    }
    /* Refused: a hold waits for its slices as a fill does for the last. */
    const double now = Now();
    if (refused_since == 0) refused_since = now;
    if (now - refused_since >= wait_s) {
      if (hold) {
        fprintf(stderr, "alloc: %s (%s)\n", cxlpool_strerror(rc), cxlpool_last_error_message());
        failed = 1;
      } else {
        printf("REFUSED %s\n", cxlpool_strerror(rc));
      }
      break;
    }
    usleep(200 * 1000);
  }
  if (!failed && hold) {
    printf("READY\n");
    fflush(stdout);
    char line[32];
    while (fgets(line, sizeof line, stdin) != NULL && strncmp(line, "check", 5) == 0) {
      const uint64_t bad = Corrupt(held, n);
      if (bad == 0)
        printf("CHECK ok\n");
      else
        printf("CHECK corrupt=%" PRIu64 "\n", bad);
      fflush(stdout);
    }
  }
  const uint64_t bad = Corrupt(held, n);
  failed |= bad != 0;
  failed |= ReleaseAll(held, n);
  printf("DONE leases=%d corrupt=%" PRIu64 " %s\n", n, bad, failed ? "FAIL" : "ok");
  cxlpool_disconnect(c);
  return failed ? 1 : 0;
}
