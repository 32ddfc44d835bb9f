/* cxlpool-vm-probe: asks the kernel where memory really is, for the VM tier.
 *
 * Runs inside the QEMU guests (tests/vm/), as root, with no dependency on the
 * project's libraries, so the VM checks do not trust the code they check.
 *
 *   cxlpool-vm-probe bind NODE MIB
 *       mmap MIB MiB of anonymous memory, mbind(MPOL_BIND) it to NODE, write a
 *       pattern, ask move_pages where every page is, read the pattern back.
 *       Exit 0 only when every page is on NODE and the data is intact
 *       (proves the node is usable memory, e.g. that CXL reads are not zeros).
 *   cxlpool-vm-probe nodes PID [SUBSTR]
 *       For every mapping of PID whose path contains SUBSTR (default
 *       "memfd:"), print how many resident pages are on each node
 *       ("N0=.. N1=.. absent=.."), then a SUMMARY line over all of them.
 *       Exit 0 if at least one mapping matched, 2 if none did.
 *   cxlpool-vm-probe expect PID NODE [SUBSTR]
 *       As "nodes", but exit 0 only when at least one page is resident and
 *       every resident page is on NODE.
 *   cxlpool-vm-probe zones PID [SUBSTR]
 *       As "nodes", but counts resident pages per node AND zone: each page's
 *       frame number (/proc/PID/pagemap) names its memory block, whose
 *       valid_zones says the zone it is onlined to ("N1:Movable=512").
 *   cxlpool-vm-probe pin NODE MIB
 *       The kernel's own answer to "what does a long-term pin do here": a
 *       memfd of MIB MiB, mbind(MPOL_BIND) to NODE and written (as cxlpoold
 *       builds a lease), its pages counted per node and zone, then pinned
 *       long-term with io_uring IORING_REGISTER_BUFFERS (FOLL_LONGTERM, as
 *       cuMemHostRegister and RDMA registration pin) and counted again, then
 *       the data checked. Prints "PIN before ..." and "PIN after ..." lines;
 *       exit 0 when every step worked (wherever the pages went).
 *
 * Exit 1 means a system call failed or the answer was wrong; the reason is on
 * stderr. Single-threaded; no state shared between calls. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "longterm_pin.h"

enum { kMaxNodes = 64, kMpolBind = 2, kChunk = 4096 };

typedef struct {
  long on_node[kMaxNodes];
  long absent;
  long other_error;
} Census;

static int ParseInt(const char* s, long* out) {
  char* end = NULL;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0' || v < 0) return -1;
  *out = v;
  return 0;
}

/* move_pages(pid, pages) with nodes == NULL: status[i] = node or -errno. */
static int CountPages(long pid, uintptr_t start, uintptr_t end, Census* c) {
  long page = sysconf(_SC_PAGESIZE);
  void* pages[kChunk];
  int status[kChunk];
  for (uintptr_t a = start; a < end;) {
    unsigned long n = 0;
    for (; n < kChunk && a < end; ++n, a += (uintptr_t)page) pages[n] = (void*)a;
    long rc = syscall(SYS_move_pages, (int)pid, n, pages, NULL, status, 0);
    if (rc < 0) {
      fprintf(stderr, "move_pages(pid %ld): %s\n", pid, strerror(errno));
      return -1;
    }
    for (unsigned long i = 0; i < n; ++i) {
      if (status[i] >= 0 && status[i] < kMaxNodes) {
        c->on_node[status[i]]++;
      } else if (status[i] == -ENOENT || status[i] == -EFAULT) {
        c->absent++;
      } else {
        c->other_error++;
      }
    }
  }
  return 0;
}

static void PrintCensus(const char* prefix, const Census* c) {
  printf("%s", prefix);
  for (int n = 0; n < kMaxNodes; ++n) {
    if (c->on_node[n] != 0) printf(" N%d=%ld", n, c->on_node[n]);
  }
  printf(" absent=%ld", c->absent);
  if (c->other_error != 0) printf(" error=%ld", c->other_error);
  printf("\n");
}

/* ---- zones: page frame -> memory block -> valid_zones ---- */

enum { kMaxZoneKeys = 32 };
typedef struct {
  int node;
  char zone[16];
  long pages;
} ZoneCount;
typedef struct {
  ZoneCount c[kMaxZoneKeys];
  int n;
  long unknown; /* frame unreadable (not root), or its block unreadable */
} ZoneCensus;

static unsigned long long BlockSize(void) {
  static unsigned long long size = 0;
  if (size != 0) return size;
  FILE* f = fopen("/sys/devices/system/memory/block_size_bytes", "re");
  if (f == NULL) return 0;
  if (fscanf(f, "%llx", &size) != 1) size = 0;
  fclose(f);
  return size;
}

/* The zone memory block `block` is onlined to (first word of valid_zones). */
static int BlockZone(unsigned long long block, char* out, size_t len) {
  char path[96];
  snprintf(path, sizeof path, "/sys/devices/system/memory/memory%llu/valid_zones", block);
  FILE* f = fopen(path, "re");
  if (f == NULL) return -1;
  char word[32] = "";
  int ok = fscanf(f, "%31s", word) == 1;
  fclose(f);
  if (!ok) return -1;
  snprintf(out, len, "%s", word);
  return 0;
}

static void ZoneAdd(ZoneCensus* z, int node, const char* zone) {
  for (int i = 0; i < z->n; ++i) {
    if (z->c[i].node == node && strcmp(z->c[i].zone, zone) == 0) {
      z->c[i].pages++;
      return;
    }
  }
  if (z->n == kMaxZoneKeys) {
    z->unknown++;
    return;
  }
  z->c[z->n].node = node;
  snprintf(z->c[z->n].zone, sizeof z->c[z->n].zone, "%s", zone);
  z->c[z->n].pages = 1;
  z->n++;
}

/* Counts the pages of [start, end) in `pid` per (node, zone). */
static int CountZones(long pid, uintptr_t start, uintptr_t end, ZoneCensus* z) {
  long page = sysconf(_SC_PAGESIZE);
  unsigned long long bs = BlockSize();
  char path[64];
  snprintf(path, sizeof path, "/proc/%ld/pagemap", pid);
  FILE* pm = fopen(path, "re");
  if (pm == NULL || bs == 0) {
    fprintf(stderr, "zones: %s or block_size_bytes unreadable\n", path);
    if (pm != NULL) fclose(pm);
    return -1;
  }
  /* A small cache: the blocks a lease touches are few. */
  unsigned long long cached_block = ~0ull;
  char cached_zone[32] = "?";
  for (uintptr_t a = start; a < end;) {
    void* pages[kChunk];
    int status[kChunk];
    unsigned long n = 0;
    for (; n < kChunk && a < end; ++n, a += (uintptr_t)page) pages[n] = (void*)a;
    if (syscall(SYS_move_pages, (int)pid, n, pages, NULL, status, 0) < 0) {
      fprintf(stderr, "move_pages(pid %ld): %s\n", pid, strerror(errno));
      fclose(pm);
      return -1;
    }
    for (unsigned long i = 0; i < n; ++i) {
      if (status[i] < 0) continue; /* not resident */
      uint64_t entry = 0;
      uintptr_t va = (uintptr_t)pages[i];
      if (fseeko(pm, (off_t)(va / (uintptr_t)page) * 8, SEEK_SET) != 0 ||
          fread(&entry, sizeof entry, 1, pm) != 1) {
        z->unknown++;
        continue;
      }
      uint64_t pfn = entry & ((1ull << 55) - 1);
      if (!(entry >> 63) || pfn == 0) { /* not present, or PFN hidden (not root) */
        z->unknown++;
        continue;
      }
      unsigned long long block = pfn * (unsigned long long)page / bs;
      if (block != cached_block) {
        cached_block = block;
        if (BlockZone(block, cached_zone, sizeof cached_zone) != 0) {
          snprintf(cached_zone, sizeof cached_zone, "?");
        }
      }
      ZoneAdd(z, status[i], cached_zone);
    }
  }
  fclose(pm);
  return 0;
}

static void PrintZones(const char* prefix, const ZoneCensus* z) {
  printf("%s", prefix);
  for (int i = 0; i < z->n; ++i) printf(" N%d:%s=%ld", z->c[i].node, z->c[i].zone, z->c[i].pages);
  printf(" unknown=%ld\n", z->unknown);
}

/* Calls visit(pid, start, end, line, ctx) for every mapping of PID whose
 * /proc/PID/maps line contains `substr`; returns how many matched, or -1 when
 * the maps are unreadable or a visit failed. */
typedef int (*MapVisitor)(long pid, uintptr_t start, uintptr_t end, const char* line, void* ctx);
static int ScanMaps(long pid, const char* substr, MapVisitor visit, void* ctx) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%ld/maps", pid);
  FILE* f = fopen(path, "re");
  if (f == NULL) {
    fprintf(stderr, "open %s: %s\n", path, strerror(errno));
    return -1;
  }
  int matched = 0;
  char line[4096];
  while (fgets(line, sizeof line, f) != NULL) {
    if (strstr(line, substr) == NULL) continue;
    unsigned long long start = 0, end = 0;
    if (sscanf(line, "%llx-%llx", &start, &end) != 2 || end <= start) continue;
    line[strcspn(line, "\n")] = '\0';
    if (visit(pid, (uintptr_t)start, (uintptr_t)end, line, ctx) != 0) {
      fclose(f);
      return -1;
    }
    ++matched;
  }
  fclose(f);
  return matched;
}

static int VisitNodes(long pid, uintptr_t start, uintptr_t end, const char* line, void* ctx) {
  Census* total = ctx;
  Census c;
  memset(&c, 0, sizeof c);
  if (CountPages(pid, start, end, &c) != 0) return -1;
  char prefix[4200];
  snprintf(prefix, sizeof prefix, "MAP %s :", line);
  PrintCensus(prefix, &c);
  for (int n = 0; n < kMaxNodes; ++n) total->on_node[n] += c.on_node[n];
  total->absent += c.absent;
  total->other_error += c.other_error;
  return 0;
}

/* Fills *total over the matching maps; returns the number of them. */
static int ScanProcess(long pid, const char* substr, Census* total) {
  return ScanMaps(pid, substr, VisitNodes, total);
}

static int VisitZones(long pid, uintptr_t start, uintptr_t end, const char* line, void* ctx) {
  ZoneCensus* total = ctx;
  ZoneCensus z;
  memset(&z, 0, sizeof z);
  if (CountZones(pid, start, end, &z) != 0) return -1;
  char prefix[4200];
  snprintf(prefix, sizeof prefix, "MAP %s :", line);
  PrintZones(prefix, &z);
  for (int i = 0; i < z.n; ++i) {
    for (long k = 0; k < z.c[i].pages; ++k) ZoneAdd(total, z.c[i].node, z.c[i].zone);
  }
  total->unknown += z.unknown;
  return 0;
}

/* As ScanProcess, counting per (node, zone), then a SUMMARY line. */
static int ScanZones(long pid, const char* substr) {
  ZoneCensus total;
  memset(&total, 0, sizeof total);
  int m = ScanMaps(pid, substr, VisitZones, &total);
  if (m >= 0) PrintZones("SUMMARY", &total);
  return m;
}

static int BindMask(void* p, size_t len, long node) {
  unsigned long mask[kMaxNodes / (8 * sizeof(unsigned long)) + 1];
  memset(mask, 0, sizeof mask);
  mask[node / (8 * sizeof(unsigned long))] |= 1UL << (node % (8 * sizeof(unsigned long)));
  if (syscall(SYS_mbind, p, len, kMpolBind, mask, (unsigned long)kMaxNodes + 1, 0) != 0) {
    fprintf(stderr, "mbind(node %ld): %s\n", node, strerror(errno));
    return -1;
  }
  return 0;
}

static int Pin(long node, long mib) {
  if (node >= kMaxNodes || mib <= 0 || mib > 1024) {
    fprintf(stderr, "pin: node or size out of range\n");
    return 1;
  }
  size_t len = (size_t)mib << 20;
  int fd = (int)syscall(SYS_memfd_create, "cxlpool-vm-probe", 1u /* MFD_CLOEXEC */);
  if (fd < 0 || ftruncate(fd, (off_t)len) != 0) {
    fprintf(stderr, "memfd: %s\n", strerror(errno));
    return 1;
  }
  unsigned char* p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    fprintf(stderr, "mmap: %s\n", strerror(errno));
    return 1;
  }
  if (BindMask(p, len, node) != 0) return 1;
  for (size_t i = 0; i < len; ++i) p[i] = (unsigned char)((i * 131u) ^ (i >> 12));
  ZoneCensus before, after;
  memset(&before, 0, sizeof before);
  memset(&after, 0, sizeof after);
  if (CountZones(getpid(), (uintptr_t)p, (uintptr_t)(p + len), &before) != 0) return 1;
  PrintZones("PIN before", &before);
  int ring = VmLongTermPin(p, len);
  if (ring < 0) return 1;
  if (CountZones(getpid(), (uintptr_t)p, (uintptr_t)(p + len), &after) != 0) return 1;
  PrintZones("PIN after", &after);
  size_t bad = 0;
  for (size_t i = 0; i < len; ++i) {
    if (p[i] != (unsigned char)((i * 131u) ^ (i >> 12))) ++bad;
  }
  printf("PIN corrupt_bytes=%zu\n", bad);
  close(ring);
  munmap(p, len);
  close(fd);
  return bad == 0 ? 0 : 1;
}

static int Bind(long node, long mib) {
  if (node >= kMaxNodes || mib <= 0 || mib > 4096) {
    fprintf(stderr, "bind: node or size out of range\n");
    return 1;
  }
  size_t len = (size_t)mib << 20;
  unsigned char* p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    fprintf(stderr, "mmap: %s\n", strerror(errno));
    return 1;
  }
  unsigned long mask[kMaxNodes / (8 * sizeof(unsigned long)) + 1];
  memset(mask, 0, sizeof mask);
  mask[node / (8 * sizeof(unsigned long))] |= 1UL << (node % (8 * sizeof(unsigned long)));
  if (syscall(SYS_mbind, p, len, kMpolBind, mask, (unsigned long)kMaxNodes + 1, 0) != 0) {
    fprintf(stderr, "mbind(node %ld): %s\n", node, strerror(errno));
    return 1;
  }
  for (size_t i = 0; i < len; ++i) p[i] = (unsigned char)((i * 131u) ^ (i >> 12));
  Census c;
  memset(&c, 0, sizeof c);
  if (CountPages(getpid(), (uintptr_t)p, (uintptr_t)(p + len), &c) != 0) return 1;
  PrintCensus("BIND", &c);
  size_t bad = 0;
  for (size_t i = 0; i < len; ++i) {
    if (p[i] != (unsigned char)((i * 131u) ^ (i >> 12))) ++bad;
  }
  long pages = (long)(len / (size_t)sysconf(_SC_PAGESIZE));
  int ok = c.on_node[node] == pages && bad == 0;
  printf("BIND node=%ld pages=%ld on_node=%ld corrupt_bytes=%zu -> %s\n", node, pages,
         c.on_node[node], bad, ok ? "ok" : "WRONG");
  munmap(p, len);
  return ok ? 0 : 1;
}

static int Usage(void) {
  fprintf(stderr,
          "usage: cxlpool-vm-probe bind NODE MIB\n"
          "       cxlpool-vm-probe nodes PID [SUBSTR]\n"
          "       cxlpool-vm-probe expect PID NODE [SUBSTR]\n"
          "       cxlpool-vm-probe zones PID [SUBSTR]\n"
          "       cxlpool-vm-probe pin NODE MIB\n");
  return 1;
}

int main(int argc, char** argv) {
  if (argc < 2) return Usage();
  const char* cmd = argv[1];
  long a = 0, b = 0;
  if (strcmp(cmd, "bind") == 0 && argc == 4) {
    if (ParseInt(argv[2], &a) != 0 || ParseInt(argv[3], &b) != 0) return Usage();
    return Bind(a, b);
  }
  if (strcmp(cmd, "pin") == 0 && argc == 4) {
    if (ParseInt(argv[2], &a) != 0 || ParseInt(argv[3], &b) != 0) return Usage();
    return Pin(a, b);
  }
  if (strcmp(cmd, "zones") == 0 && (argc == 3 || argc == 4)) {
    if (ParseInt(argv[2], &a) != 0) return Usage();
    int m = ScanZones(a, argc == 4 ? argv[3] : "memfd:");
    if (m < 0) return 1;
    return m > 0 ? 0 : 2;
  }
  if (strcmp(cmd, "nodes") == 0 && (argc == 3 || argc == 4)) {
    if (ParseInt(argv[2], &a) != 0) return Usage();
    Census total;
    memset(&total, 0, sizeof total);
    int m = ScanProcess(a, argc == 4 ? argv[3] : "memfd:", &total);
    if (m < 0) return 1;
    PrintCensus("SUMMARY", &total);
    return m > 0 ? 0 : 2;
  }
  if (strcmp(cmd, "expect") == 0 && (argc == 4 || argc == 5)) {
    if (ParseInt(argv[2], &a) != 0 || ParseInt(argv[3], &b) != 0 || b >= kMaxNodes) {
      return Usage();
    }
    Census total;
    memset(&total, 0, sizeof total);
    int m = ScanProcess(a, argc == 5 ? argv[4] : "memfd:", &total);
    if (m < 0) return 1;
    PrintCensus("SUMMARY", &total);
    long resident = 0;
    for (int n = 0; n < kMaxNodes; ++n) resident += total.on_node[n];
    if (m == 0 || resident == 0) {
      fprintf(stderr, "expect: no resident pages in matching mappings of pid %ld\n", a);
      return 1;
    }
    if (total.on_node[b] != resident || total.other_error != 0) {
      fprintf(stderr, "expect: %ld of %ld resident pages on node %ld\n", total.on_node[b], resident,
              b);
      return 1;
    }
    return 0;
  }
  return Usage();
}
