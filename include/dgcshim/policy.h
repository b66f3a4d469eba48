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
 * -1 when the payload would not fit one all-gather (the call passes through;
 * the decision depends on count and step only, so every rank makes it). */
int dgc_policy_plan(const dgc_config *cfg, uint64_t count, uint64_t step, int nranks,
                    dgc_step_params *out);

#ifdef __cplusplus
}
#endif
#endif
