/* cxlpool-example: the smallest useful libcxlpool client, in C.
 *
 *   cxlpool-example [--socket PATH] [--size BYTES] [--node N | --gpu G] [--cuda]
 *
 * Connects to cxlpoold, leases memory near GPU 0 (or on node N, or near GPU
 * G; without GPUs the daemon places it), writes a pattern over all of it and reads it back, prints
 * the lease's id, node, size and placement, and releases it. Exit status 0 on success.
 */
#include <cxlpool/cxlpool.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(void) {
  fprintf(stderr,
          "usage: cxlpool-example [--socket PATH] [--size BYTES] [--node N | --gpu G] [--cuda]\n");
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
    if (strcmp(argv[i], "--socket") == 0 && i + 1 < argc) {
      socket_path = argv[++i];
    } else if (strcmp(argv[i], "--size") == 0 && i + 1 < argc) {
      size = strtoull(argv[++i], NULL, 0);
    } else if (strcmp(argv[i], "--node") == 0 && i + 1 < argc) {
      node = atoi(argv[++i]);
      gpu = -1;
    } else if (strcmp(argv[i], "--gpu") == 0 && i + 1 < argc) {
      gpu = atoi(argv[++i]);
      gpu_given = 1;
    } else if (strcmp(argv[i], "--cuda") == 0) {
      cuda = 1;
    } else {
      usage();
      return 2;
    }
  }

  rc = cxlpool_connect(socket_path, &client);
  if (rc != CXLPOOL_OK) {
    fprintf(stderr, "connect: %s: %s\n", cxlpool_strerror(rc), cxlpool_last_error_message());
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
