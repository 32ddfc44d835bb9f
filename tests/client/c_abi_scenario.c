/* The C ABI exercised from C (this file is compiled as C11). Each scenario
 * returns 0, or the line of the first failed check with a note in `why`.
 * c_abi_test.cc runs them against the in-test fake server; the daemon
 * integration test runs the allocation scenario against a real cxlpoold. */
#include "c_abi_scenario.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cxlpool/cxlpool.h"

#define CHECK(cond)                                                                       \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      snprintf(why, why_len, "%s (last error: %s)", #cond, cxlpool_last_error_message()); \
      return __LINE__;                                                                    \
    }                                                                                     \
  } while (0)

int cxlpool_c_offline_scenario(char* why, size_t why_len) {
  static const int codes[] = {CXLPOOL_OK,
                              CXLPOOL_EINVALID_ARGUMENT,
                              CXLPOOL_ENOT_FOUND,
                              CXLPOOL_EPERMISSION_DENIED,
                              CXLPOOL_ERESOURCE_EXHAUSTED,
                              CXLPOOL_EUNAVAILABLE,
                              CXLPOOL_EUNSUPPORTED,
                              CXLPOOL_EPROTOCOL,
                              CXLPOOL_EIO,
                              CXLPOOL_EINTERNAL,
                              CXLPOOL_EALREADY_EXISTS,
                              CXLPOOL_EREVOKED};
  size_t i, j;
  cxlpool_client* c = (cxlpool_client*)1;
  cxlpool_lease* l = (cxlpool_lease*)1;
  cxlpool_alloc_opts o;
  char buf[256];

  /* Every code has its own text; unknown codes have a generic one. */
  for (i = 0; i < sizeof(codes) / sizeof(codes[0]); ++i) {
    CHECK(codes[i] == -(int)i);
    CHECK(cxlpool_strerror(codes[i]) != NULL);
    CHECK(strcmp(cxlpool_strerror(codes[i]), "unknown error") != 0);
    for (j = 0; j < i; ++j)
      CHECK(strcmp(cxlpool_strerror(codes[i]), cxlpool_strerror(codes[j])) != 0);
  }
  CHECK(strcmp(cxlpool_strerror(-12), "unknown error") == 0);
  CHECK(strcmp(cxlpool_strerror(5), "unknown error") == 0);
  CHECK(strcmp(cxlpool_version(), "0.1.0") == 0);

  /* NULL handling: errors, never crashes. */
  CHECK(cxlpool_connect("/nonexistent/dir/cxlpool.sock", NULL) == CXLPOOL_EINVALID_ARGUMENT);
  CHECK(cxlpool_connect("/nonexistent/dir/cxlpool.sock", &c) == CXLPOOL_ENOT_FOUND);
  CHECK(c == NULL);
  CHECK(strstr(cxlpool_last_error_message(), "/nonexistent/dir/cxlpool.sock") != NULL);
  cxlpool_alloc_opts_init(&o);
  o.size_bytes = 4096;
  CHECK(cxlpool_alloc(NULL, &o, &l) == CXLPOOL_EINVALID_ARGUMENT);
  CHECK(l == NULL);
  CHECK(cxlpool_release(NULL) == CXLPOOL_EINVALID_ARGUMENT);
  CHECK(cxlpool_lease_ptr(NULL) == NULL);
  CHECK(cxlpool_lease_size(NULL) == 0);
  CHECK(cxlpool_lease_numa_node(NULL) == -1);
  CHECK(cxlpool_lease_id(NULL) == 0);
  CHECK(cxlpool_lease_revoked(NULL) == -1);
  CHECK(cxlpool_lease_device_ptr(NULL, NULL) == CXLPOOL_EINVALID_ARGUMENT);
  CHECK(cxlpool_lease_device_chunk_count(NULL) == CXLPOOL_EINVALID_ARGUMENT);
  CHECK(cxlpool_process_events(NULL) == CXLPOOL_EINVALID_ARGUMENT);
  cxlpool_disconnect(NULL);

  CHECK(cxlpool_default_socket_path(buf, sizeof(buf)) == CXLPOOL_OK);
  CHECK(buf[0] == '/');
  CHECK(cxlpool_default_socket_path(buf, 4) == CXLPOOL_EINVALID_ARGUMENT);
  CHECK(strlen(buf) == 3);

  /* alloc_opts_init gives defaults. */
  CHECK(o.struct_size == sizeof(cxlpool_alloc_opts));
  CHECK(o.numa_node == -1 && o.near_gpu == -1 && o.flags == 0 && o.label == NULL);
  CHECK(CXLPOOL_ALLOC_OPTS_SIZE_V1 == 40);
  return 0;
}

/* Fills the lease with a pattern and checks it reads back. */
static int pattern_ok(cxlpool_lease* l, unsigned seed) {
  unsigned char* p = (unsigned char*)cxlpool_lease_ptr(l);
  uint64_t n = cxlpool_lease_size(l), i;
  if (p == NULL || n == 0) return 0;
  for (i = 0; i < n; ++i) p[i] = (unsigned char)(seed + i * 13);
  for (i = 0; i < n; ++i)
    if (p[i] != (unsigned char)(seed + i * 13)) return 0;
  return 1;
}

int cxlpool_c_alloc_scenario(const char* socket_path, int expect_fake, char* why, size_t why_len) {
  cxlpool_client* c = NULL;
  cxlpool_lease *l = NULL, *l2 = NULL;
  cxlpool_alloc_opts o;
  cxlpool_lease_info info;
  uint64_t dptr = 0;
  int rc;

  CHECK(cxlpool_connect(socket_path, &c) == CXLPOOL_OK);
  CHECK(c != NULL);

  cxlpool_alloc_opts_init(&o);
  o.size_bytes = 3 * 4096 + 1;
  o.label = "c-abi-test";
  rc = cxlpool_alloc(c, &o, &l);
  CHECK(rc == CXLPOOL_OK);
  CHECK(l != NULL);
  CHECK(cxlpool_lease_size(l) >= o.size_bytes);
  CHECK(cxlpool_lease_id(l) != 0);
  CHECK(cxlpool_lease_numa_node(l) >= 0);
  CHECK(cxlpool_lease_revoked(l) == 0);
  CHECK(pattern_ok(l, 42));

  memset(&info, 0, sizeof(info));
  info.struct_size = sizeof(info);
  CHECK(cxlpool_lease_get_info(l, &info) == CXLPOOL_OK);
  CHECK(info.id == cxlpool_lease_id(l));
  CHECK(info.size_bytes == cxlpool_lease_size(l));
  CHECK(info.requested_bytes == o.size_bytes);
  CHECK(info.kind != NULL && info.backing != NULL && info.placement_reason != NULL);
  CHECK(info.pool != NULL && info.name != NULL && info.label != NULL);
  CHECK(strcmp(info.label, "c-abi-test") == 0);
  CHECK(info.cuda_registered == 0);
  CHECK(info.long_term_pin == 0 && info.placed_numa_node == -1);
  CHECK(info.moved_reason != NULL && info.moved_reason[0] == '\0');
  CHECK(info.device_offset == 0); /* a memfd lease */
  {
    /* Where the kernel says the pages are. */
    cxlpool_lease_placement pl;
    memset(&pl, 0, sizeof(pl));
    pl.struct_size = sizeof(pl);
    rc = cxlpool_lease_verify(l, &pl);
    /* Moved only on a machine with several nodes (then the daemon is told). */
    CHECK(rc == CXLPOOL_OK || pl.moved == 1);
    CHECK(pl.placed_numa_node == cxlpool_lease_numa_node(l) || pl.moved == 1);
    CHECK(pl.pages_sampled == cxlpool_lease_size(l) / 4096);
    CHECK(pl.pages_on_node == pl.pages_sampled && pl.pages_absent == 0);
    CHECK(pl.moved == 1 || pl.numa_node == pl.placed_numa_node);
    CHECK(cxlpool_lease_verify(NULL, &pl) == CXLPOOL_EINVALID_ARGUMENT);
    pl.struct_size = 4; /* below the first version */
    CHECK(cxlpool_lease_verify(l, &pl) == CXLPOOL_EINVALID_ARGUMENT);
    CHECK(strstr(cxlpool_last_error_message(), "struct_size") != NULL);
    CHECK(cxlpool_lease_verify(l, NULL) == CXLPOOL_OK || pl.moved == 1);
  }
  info.struct_size = 8; /* below the first version */
  CHECK(cxlpool_lease_get_info(l, &info) == CXLPOOL_EINVALID_ARGUMENT);

  /* No registration asked for: no device pointer. */
  CHECK(cxlpool_lease_device_ptr(l, &dptr) == CXLPOOL_ENOT_FOUND);
  CHECK(cxlpool_lease_device_chunk_count(l) == 0);
  CHECK(cxlpool_lease_device_chunk(l, 0, NULL, NULL, NULL) == CXLPOOL_ENOT_FOUND);
  if (expect_fake) {
    /* This test runs with CXLPOOL_CUDA_LIBRARY naming no library: the host
     * mapping keeps working and registration says UNSUPPORTED. */
    CHECK(cxlpool_lease_cuda_register(l, 0) == CXLPOOL_EUNSUPPORTED);
    CHECK(strstr(cxlpool_last_error_message(), "CUDA") != NULL);
    CHECK(cxlpool_lease_device_ptr(l, &dptr) == CXLPOOL_EUNSUPPORTED);
    CHECK(pattern_ok(l, 7));
  }
  CHECK(cxlpool_lease_cuda_register(l, -1) == CXLPOOL_EINVALID_ARGUMENT);
  CHECK(cxlpool_lease_cuda_unregister(l) == CXLPOOL_ENOT_FOUND);

  /* A second lease with CUDA_REGISTER: allocation succeeds regardless. */
  o.flags = CXLPOOL_ALLOC_CUDA_REGISTER;
  o.size_bytes = 4096;
  CHECK(cxlpool_alloc(c, &o, &l2) == CXLPOOL_OK);
  CHECK(pattern_ok(l2, 1));
  if (expect_fake) CHECK(cxlpool_lease_device_ptr(l2, &dptr) == CXLPOOL_EUNSUPPORTED);
  CHECK(cxlpool_release(l2) == CXLPOOL_OK);

  CHECK(cxlpool_release(l) == CXLPOOL_OK);
  cxlpool_disconnect(c);
  return 0;
}

int cxlpool_c_struct_size_scenario(const char* socket_path, char* why, size_t why_len) {
  cxlpool_client* c = NULL;
  cxlpool_lease* l = NULL;
  cxlpool_alloc_opts o;
  /* A caller built against a newer header: our struct plus 16 more bytes. */
  struct {
    cxlpool_alloc_opts base;
    uint64_t newer[2];
  } big;

  CHECK(cxlpool_connect(socket_path, &c) == CXLPOOL_OK);
  cxlpool_alloc_opts_init(&o);
  o.size_bytes = 4096;

  o.struct_size = 0;
  CHECK(cxlpool_alloc(c, &o, &l) == CXLPOOL_EINVALID_ARGUMENT);
  o.struct_size = CXLPOOL_ALLOC_OPTS_SIZE_V1 - 1;
  CHECK(cxlpool_alloc(c, &o, &l) == CXLPOOL_EINVALID_ARGUMENT);
  CHECK(strstr(cxlpool_last_error_message(), "struct_size") != NULL);
  CHECK(l == NULL);

  /* A version-1 caller: fields past V1 are not read, even if garbage. */
  o.struct_size = CXLPOOL_ALLOC_OPTS_SIZE_V1;
  o.gpu = (const char*)(uintptr_t)0x1; /* would crash if read */
  o.tier_preference = (const char*)(uintptr_t)0x1;
  CHECK(cxlpool_alloc(c, &o, &l) == CXLPOOL_OK);
  CHECK(cxlpool_release(l) == CXLPOOL_OK);
  l = NULL;

  /* Newer and larger: fine while the unknown tail is zero ... */
  memset(&big, 0, sizeof(big));
  cxlpool_alloc_opts_init(&big.base);
  big.base.struct_size = sizeof(big);
  big.base.size_bytes = 4096;
  CHECK(cxlpool_alloc(c, &big.base, &l) == CXLPOOL_OK);
  CHECK(cxlpool_release(l) == CXLPOOL_OK);
  l = NULL;
  /* ... and refused when it asks for something we do not know. */
  big.newer[1] = 1;
  CHECK(cxlpool_alloc(c, &big.base, &l) == CXLPOOL_EINVALID_ARGUMENT);
  CHECK(strstr(cxlpool_last_error_message(), "does not know") != NULL);

  /* Unknown flags and size 0. */
  cxlpool_alloc_opts_init(&o);
  o.size_bytes = 4096;
  o.flags = 0x80;
  CHECK(cxlpool_alloc(c, &o, &l) == CXLPOOL_EINVALID_ARGUMENT);
  o.flags = 0;
  o.size_bytes = 0;
  CHECK(cxlpool_alloc(c, &o, &l) == CXLPOOL_EINVALID_ARGUMENT);
  CHECK(cxlpool_alloc(c, NULL, &l) == CXLPOOL_EINVALID_ARGUMENT);

  /* Shared leases: argument checks, then a name and an attach. */
  o.size_bytes = 8192;
  CHECK(cxlpool_alloc_shared(c, &o, "", NULL, 0, NULL, 0, &l) == CXLPOOL_EINVALID_ARGUMENT);
  CHECK(cxlpool_alloc_shared(c, &o, "x", NULL, 1, NULL, 0, &l) == CXLPOOL_EINVALID_ARGUMENT);
  {
    const uint32_t uids[1] = {1000};
    cxlpool_lease* a = NULL;
    cxlpool_lease_info info;
    CHECK(cxlpool_alloc_shared(c, &o, "c-shared", uids, 1, NULL, 0, &l) == CXLPOOL_OK);
    CHECK(cxlpool_alloc_shared(c, &o, "c-shared", uids, 1, NULL, 0, &a) == CXLPOOL_EALREADY_EXISTS);
    CHECK(pattern_ok(l, 77));
    CHECK(cxlpool_attach(c, "c-shared", &a) == CXLPOOL_OK);
    CHECK(((unsigned char*)cxlpool_lease_ptr(a))[1] == (unsigned char)(77 + 13));
    memset(&info, 0, sizeof(info));
    info.struct_size = sizeof(info);
    CHECK(cxlpool_lease_get_info(a, &info) == CXLPOOL_OK);
    CHECK(strcmp(info.name, "c-shared") == 0);
    /* The attach says whose lease it is. */
    CHECK(info.owner_uid == (uint32_t)getuid());
    CHECK(info.owner_gid == (uint32_t)getgid());
    CHECK(cxlpool_release(a) == CXLPOOL_OK);
    /* Names live in their owner's namespace: named by owner, or not found. */
    CHECK(cxlpool_attach_from(c, (uint32_t)getuid(), "c-shared", &a) == CXLPOOL_OK);
    memset(&info, 0, sizeof(info));
    info.struct_size = CXLPOOL_LEASE_INFO_SIZE_V1; /* an older caller: no owner fields */
    CHECK(cxlpool_lease_get_info(a, &info) == CXLPOOL_OK);
    CHECK(info.owner_uid == 0);
    CHECK(cxlpool_release(a) == CXLPOOL_OK);
    CHECK(cxlpool_attach_from(c, (uint32_t)getuid() + 1, "c-shared", &a) == CXLPOOL_ENOT_FOUND);
    CHECK(a == NULL);
    CHECK(cxlpool_attach_from(c, (uint32_t)getuid(), "", &a) == CXLPOOL_EINVALID_ARGUMENT);
    CHECK(cxlpool_attach(c, "no-such-name", &a) == CXLPOOL_ENOT_FOUND);
    CHECK(a == NULL);
    CHECK(cxlpool_attach(c, NULL, &a) == CXLPOOL_EINVALID_ARGUMENT);
    CHECK(cxlpool_release(l) == CXLPOOL_OK);
  }
  CHECK(cxlpool_process_events(c) == 0);
  cxlpool_disconnect(c);
  return 0;
}
