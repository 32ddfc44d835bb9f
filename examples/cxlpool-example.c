/* cxlpool-example: the smallest useful libcxlpool client, in C.
 *
 *   cxlpool-example [--socket PATH] [--size SIZE] [--node N | --gpu G] [--cuda]
 *   cxlpool-example --help | --version
 *
 * Connects to cxlpoold, leases memory near GPU 0 (or on node N, or near GPU
 * G; without GPUs the daemon places it), writes a pattern over all of it and
 * reads it back, prints the lease's id, node, size and placement, and
 * releases it. SIZE is bytes with an optional binary suffix: 4096, 64K, 64M,
 * 1G (KiB, MiB, GiB too); anything else is refused.
 * Exit status: 0 success, 1 the daemon refused or could not be reached,
 * 2 bad command line.
 */
#include <cxlpool/cxlpool.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE* out) {
  fprintf(out,
          "usage: cxlpool-example [--socket PATH] [--size SIZE] [--node N | --gpu G] [--cuda]\n"
          "  SIZE: bytes, or with a suffix K, M, G, T (KiB, MiB, GiB, TiB); default 64M\n"
          "  exit status: 0 ok, 1 refused or no daemon, 2 bad command line\n");
}

/* "64M" -> 67108864; 0 when the text is not a size. */
static uint64_t parse_size(const char* text) {
  char* end = NULL;
  uint64_t v, mult = 1;
  if (text[0] < '0' || text[0] > '9') return 0;
  errno = 0;
  v = strtoull(text, &end, 10);
  if (errno != 0) return 0;
  if (*end != '\0') {
    switch (*end) {
      case 'K':
      case 'k':
        mult = 1ull << 10;
        break;
      case 'M':
      case 'm':
        mult = 1ull << 20;
        break;
      case 'G':
      case 'g':
        mult = 1ull << 30;
        break;
      case 'T':
      case 't':
        mult = 1ull << 40;
        break;
      default:
        return 0;
    }
    ++end;
    if (strcmp(end, "") != 0 && strcmp(end, "iB") != 0 && strcmp(end, "B") != 0) return 0;
  }
  if (v > UINT64_MAX / mult) return 0;
  return v * mult;
}

/* A non-negative decimal integer; -1 when the text is not one. */
static int parse_index(const char* text) {
  char* end = NULL;
  long v;
  errno = 0;
  v = strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || v < 0 || v > 1000000) return -1;
  return (int)v;
}

int main(int argc, char** argv) {
  const char* socket_path = NULL;
  uint64_t size = 64ull << 20;
  int node = -1, gpu = 0, gpu_given = 0, cuda = 0, i, rc;
  cxlpool_client* client = NULL;
  cxlpool_lease* lease = NULL;
  cxlpool_alloc_opts opts;
  cxlpool_lease_info info;
  unsigned char* p;
  uint64_t n, k, dptr;

  for (i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      usage(stdout);
      return 0;
    } else if (strcmp(argv[i], "--version") == 0) {
      printf("cxlpool-example %s\n", cxlpool_version());
      return 0;
    } else if (strcmp(argv[i], "--socket") == 0 && i + 1 < argc) {
      socket_path = argv[++i];
    } else if (strcmp(argv[i], "--size") == 0 && i + 1 < argc) {
      size = parse_size(argv[++i]);
      if (size == 0) {
        fprintf(stderr, "cxlpool-example: --size: '%s' is not a size (e.g. 4096, 64M, 1G)\n",
                argv[i]);
        return 2;
      }
    } else if ((strcmp(argv[i], "--node") == 0 || strcmp(argv[i], "--gpu") == 0) && i + 1 < argc) {
      int v = parse_index(argv[i + 1]);
      if (v < 0) {
        fprintf(stderr, "cxlpool-example: %s: '%s' is not a number\n", argv[i], argv[i + 1]);
        return 2;
      }
      if (argv[i][2] == 'n') {
        node = v;
        gpu = -1;
      } else {
        gpu = v;
        gpu_given = 1;
      }
      ++i;
    } else if (strcmp(argv[i], "--cuda") == 0) {
      cuda = 1;
    } else {
      fprintf(stderr, "cxlpool-example: unknown argument '%s'\n", argv[i]);
      usage(stderr);
      return 2;
    }
  }
  if (node >= 0 && gpu_given) {
    fprintf(stderr, "cxlpool-example: --node and --gpu exclude each other\n");
    return 2;
  }

  rc = cxlpool_connect(socket_path, &client);
  if (rc != CXLPOOL_OK) {
    fprintf(stderr,
            "connect: %s: %s\n"
            "  is cxlpoold running? Pass its socket with --socket PATH or $CXLPOOL_SOCKET.\n",
            cxlpool_strerror(rc), cxlpool_last_error_message());
    return 1;
  }

  cxlpool_alloc_opts_init(&opts);
  opts.size_bytes = size;
  opts.numa_node = node;
  opts.near_gpu = gpu;
  opts.flags = cuda ? CXLPOOL_ALLOC_CUDA_REGISTER : 0;
  opts.label = "cxlpool-example";
  rc = cxlpool_alloc(client, &opts, &lease);
  if (rc == CXLPOOL_ENOT_FOUND && node < 0 && !gpu_given) {
    /* The default "near GPU 0" on a machine without GPUs: let the daemon place it. */
    printf("note: %s; letting the daemon choose the node\n", cxlpool_last_error_message());
    opts.near_gpu = -1;
    rc = cxlpool_alloc(client, &opts, &lease);
  }
  if (rc != CXLPOOL_OK) {
    fprintf(stderr, "alloc: %s: %s\n", cxlpool_strerror(rc), cxlpool_last_error_message());
    cxlpool_disconnect(client);
    return 1;
  }

  p = (unsigned char*)cxlpool_lease_ptr(lease);
  n = cxlpool_lease_size(lease);
  for (k = 0; k < n; ++k) p[k] = (unsigned char)(k * 31 + 7);
  for (k = 0; k < n; ++k) {
    if (p[k] != (unsigned char)(k * 31 + 7)) {
      fprintf(stderr, "pattern mismatch at byte %" PRIu64 "\n", k);
      cxlpool_release(lease);
      cxlpool_disconnect(client);
      return 1;
    }
  }

  memset(&info, 0, sizeof(info));
  info.struct_size = sizeof(info);
  cxlpool_lease_get_info(lease, &info);
  printf("lease id=%" PRIu64 " node=%d size=%" PRIu64 " kind=%s backing=%s pool=%s\n",
         cxlpool_lease_id(lease), cxlpool_lease_numa_node(lease), n, info.kind, info.backing,
         info.pool);
  printf("placement: %s\n", info.placement_reason);
  printf("pattern: %" PRIu64 " bytes written and verified\n", n);
  if (cuda) {
    rc = cxlpool_lease_device_ptr(lease, &dptr);
    if (rc == CXLPOOL_OK) {
      printf("cuda: device pointer 0x%" PRIx64 " (%d chunk(s))\n", dptr,
             cxlpool_lease_device_chunk_count(lease));
    } else {
      printf("cuda: not registered: %s: %s\n", cxlpool_strerror(rc), cxlpool_last_error_message());
    }
  }

  rc = cxlpool_release(lease);
  if (rc != CXLPOOL_OK) {
    fprintf(stderr, "release: %s: %s\n", cxlpool_strerror(rc), cxlpool_last_error_message());
  }
  cxlpool_disconnect(client);
  return rc == CXLPOOL_OK ? 0 : 1;
}
