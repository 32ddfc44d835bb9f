/* Scenarios that exercise the C ABI from C (c_abi_scenario.c). Each returns
 * 0 or the source line of the first failed check, with a note in `why`.
 * Thread safety: run one at a time per client. */
#ifndef CXLPOOL_TESTS_CLIENT_C_ABI_SCENARIO_H_
#define CXLPOOL_TESTS_CLIENT_C_ABI_SCENARIO_H_

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Error strings, NULL handling, defaults: needs no server. */
int cxlpool_c_offline_scenario(char* why, size_t why_len);
/* Connect, allocate, write a pattern, info, device pointer, release.
 * expect_fake: the server is the fake and CUDA is absent. */
int cxlpool_c_alloc_scenario(const char* socket_path, int expect_fake, char* why, size_t why_len);
/* struct_size rules, flag and argument checks, shared leases. */
int cxlpool_c_struct_size_scenario(const char* socket_path, char* why, size_t why_len);

#ifdef __cplusplus
}
#endif

#endif
