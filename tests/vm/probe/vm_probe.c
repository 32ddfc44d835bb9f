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

/* Walks /proc/PID/maps; fills *total; returns the number of matching maps. */
static int ScanProcess(long pid, const char* substr, Census* total) {
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
    Census c;
    memset(&c, 0, sizeof c);
    if (CountPages(pid, (uintptr_t)start, (uintptr_t)end, &c) != 0) {
      fclose(f);
      return -1;
    }
    line[strcspn(line, "\n")] = '\0';
    char prefix[4200];
    snprintf(prefix, sizeof prefix, "MAP %s :", line);
    PrintCensus(prefix, &c);
    for (int n = 0; n < kMaxNodes; ++n) total->on_node[n] += c.on_node[n];
    total->absent += c.absent;
    total->other_error += c.other_error;
    ++matched;
  }
  fclose(f);
  return matched;
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
          "       cxlpool-vm-probe expect PID NODE [SUBSTR]\n");
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
