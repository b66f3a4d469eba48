/* Policy: what one compressed call does, from collective-consistent inputs
 * only (count, communicator size, configuration, step). Invariant 1 lives here. */
#ifndef DGCSHIM_POLICY_H
#define DGCSHIM_POLICY_H

#include <stdint.h>

#include "dgcshim/config.h"
#include "dgcshim/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Largest buffer the wire format can index (uint32 indices). */
#define DGC_MAX_ELEMENTS 4294967295ull

/* 1 when a float SUM of count elements over nranks ranks is compressed. */
int dgc_policy_compressible(const dgc_config *cfg, uint64_t count, int nranks);

/* The parameters of the call at step on a count-element buffer. Returns 0, or
 * -1 when the call goes by the sparse all-gather and its compact payloads
 * would not fit one (more than INT_MAX 8-byte words in all): the call passes
 * through. The decision depends on count, step and the configuration only,
 * so every rank makes it. */
int dgc_policy_plan(const dgc_config *cfg, uint64_t count, uint64_t step, int nranks,
                    dgc_step_params *out);

/* Bytes one rank sends in one call, for each way its pairs can travel:
 *   sparse: the all-gather of the fixed-size compact payloads (wire_compact.h,
 *           value_bits per value; payload: one of them), (N-1) payloads (ring);
 *   dense:  the pairs scattered into a dense float vector and summed by a
 *           reduce-scatter then an all-gather (a ring all-reduce's
 *           2 (N-1)/N 4n bytes), after an all-gather of the 32-byte headers. */
typedef struct {
    uint64_t sparse, dense, payload;
} dgc_transport_bytes;

void dgc_transport_bytes_for(uint64_t n, uint64_t k, unsigned value_bits, int nranks, dgc_transport_bytes *out);

/* The transport of a call (DGC_TRANSPORT_SPARSE or _DENSE): what
 * cfg->transport forces, else (auto) the sparse all-gather only when it
 * sends fewer bytes than the dense transport (a tie goes dense, which needs
 * no gathered buffer). A function of (n, k, nranks, configuration) alone, so
 * every rank decides alike. bytes, when not NULL, gets both alternatives. */
dgc_transport dgc_policy_transport(const dgc_config *cfg, uint64_t n, uint64_t k, int nranks,
                                   dgc_transport_bytes *bytes);

/* What the calls on a count-element buffer from step on will need, for a
 * state sized once (warm-up densities only fall): *sparse_k, the largest k
 * of those that go by the sparse all-gather (0 when none does), and *dense,
 * whether any goes by the dense transport. */
void dgc_policy_outlook(const dgc_config *cfg, uint64_t count, uint64_t step, int nranks, uint64_t *sparse_k,
                        int *dense);

#ifdef __cplusplus
}
#endif
#endif
