/* The DGC engine: per-buffer state, compression into a fixed-size payload, and
 * decoding of the gathered payloads. It knows DGC and nothing of MPI or NCCL.
 *
 * The engine executes a plan; it does not decide one. One call of the
 * algorithm on one buffer is:
 *     plan = dgc_policy_plan(...)                    (policy.h: k, transport, clamp;
 *                                                     the same on every rank)
 *     dgc_compress(state, g, &plan.p, payload)       (state untouched, payload filled)
 *     all-gather the payloads                        (the front end's job)
 *     dgc_decode(gathered, ...)                      (writes the dense output)
 *     dgc_commit(state, outcome)                     (residual and momentum advance)
 * Splitting compress and commit is what keeps a non-finite step out of the
 * state on every rank: nobody knows the step was bad until after the gather. */
#ifndef DGCSHIM_ENGINE_H
#define DGCSHIM_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "dgcshim/config.h"
#include "dgcshim/wire.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The type the ranks' values are summed in (dgc_step_params.sum_type): fp32,
 * except on the NCCL path's dense transport of a 16-bit buffer, which sums
 * the scattered pairs in the buffer's own type so that it sends no more than
 * the uncompressed all-reduce (policy.h). */
typedef enum { DGC_SUM_F32 = 0, DGC_SUM_F16 = 1, DGC_SUM_BF16 = 2 } dgc_sum_type;

/* What one compressed call needs beyond the state. */
typedef struct {
    uint64_t n;           /* elements in the buffer */
    uint64_t step;        /* per (communicator, count) call counter */
    uint64_t k;           /* slots in the payload */
    float momentum;       /* DGC_MOMENTUM */
    int nesterov;         /* DGC_NESTEROV */
    int momentum_masking; /* DGC_MOMENTUM_MASKING */
    double clip_norm;     /* DGC_CLIP_NORM (0 = off) */
    int nranks;           /* for the N^-1/2 clipping scale */
    double sample_ratio;  /* DGC_SAMPLE_RATIO */
    unsigned value_bits;  /* DGC_VALUE_BITS: 32, or 16 (binary16 under a per-payload power-of-two scale on the
                           * wire, dgc_compact_value; the rounding kept in the residual) */
    unsigned sum_type;    /* dgc_sum_type: F16 or BF16 rounds every value to that type instead
                           * (dgc_sum_round_bits, sum_rules.h), the rounding kept in the residual */
    uint32_t clamp_bits;  /* the largest magnitude a value is sent with, as fp32 bits, the excess kept in
                           * the residual: the NCCL path's 16-bit buffers on either transport
                           * (dgc_policy_value_limit_bits), so that the output converts back to the
                           * buffer's type without overflowing where the gradients did not. 0: none,
                           * or with a 16-bit sum_type that type's own (dgc_sum_limit_bits). */
} dgc_step_params;

/* The threshold sample of one call, shared by the host and CUDA engines so
 * that both pick the same threshold: runs of DGC_SAMPLE_RUN elements
 * (update_rules.h), count values in all, and the threshold is the want-th
 * largest of them (exact: want <= count). whole: the sample is the buffer. */
typedef struct {
    uint64_t runs, count, want;
    int whole;
} dgc_sample_plan;

void dgc_sample_plan_for(uint64_t n, uint64_t k, double sample_ratio, dgc_sample_plan *out);

/* Candidate room a state keeps for k slots: more candidates than this and
 * the selection falls back to an exact top k over the whole buffer. */
uint64_t dgc_candidate_cap(uint64_t n, uint64_t k);

typedef struct dgc_state dgc_state;

/* State for an n-element buffer; momentum arrays only when with_momentum.
 * Returns NULL when memory is short. */
dgc_state *dgc_state_create(uint64_t n, int with_momentum);
void dgc_state_destroy(dgc_state *s);
uint64_t dgc_state_size(const dgc_state *s);

/* Bytes the state holds now: residual and momentum arrays, their spares,
 * candidate and sample scratch. */
size_t dgc_state_bytes(const dgc_state *s);

/* Bytes a state for n elements will hold once it has compressed with k
 * slots and sample_ratio: the arrays, the candidate room and the sample
 * scratch (the exact fallback keeps none). What a memory budget is checked
 * against. */
size_t dgc_state_footprint(uint64_t n, int with_momentum, uint64_t k, double sample_ratio);

/* The residual v and momentum u as committed (u is NULL without momentum). */
const float *dgc_state_residual(const dgc_state *s);
const float *dgc_state_momentum(const dgc_state *s);

/* g (and out below) must be float-aligned: the front ends make it so.
 *
 * Computes this step's update of u and v into scratch, selects at most p->k of
 * the largest |v|, and writes the payload (header + k slots, unused slots
 * (index 0, value 0)). When g holds Inf or NaN the payload carries the
 * DGC_WIRE_NONFINITE flag. The committed state is not changed.
 * Returns 0, or -1 when memory for scratch could not be had. */
int dgc_compress(dgc_state *s, const float *g, const dgc_step_params *p, void *payload);

/* dgc_compress that also sets the n-element buffer out to zero as the update
 * streams past, so that decoding need not (dgc_wire_decode_zeroed): one pass
 * over memory instead of two. out is the call's output and may be g itself
 * (in place: each element is read before it is zeroed). Returns 1 when out
 * was zeroed, 0 when it was not (out not float-aligned: decode with
 * dgc_wire_decode), -1 as dgc_compress. */
int dgc_compress_zeroing(dgc_state *s, const float *g, const dgc_step_params *p, void *payload, float *out);

/* The number of real (non-padding) pairs the last dgc_compress selected. */
uint64_t dgc_last_selected(const dgc_state *s);

/* 1 when the last dgc_compress held some momentum or residual element at
 * +-FLT_MAX (finite gradients added up past fp32's range there: the excess
 * is lost; update_rules.h). The front end counts and warns. */
int dgc_last_saturated(const dgc_state *s);

/* Makes the last dgc_compress's update the committed state and masks the sent
 * indices (v = 0, and u = 0 when masking). Call only when no rank's payload was
 * non-finite; otherwise call dgc_discard. */
void dgc_commit(dgc_state *s, const dgc_step_params *p);
void dgc_discard(dgc_state *s);

/* dgc_commit for the selected pairs j (in the payload's order, j <
 * dgc_last_selected) whose keep[j] is non-zero; the others stay in the
 * residual as the update left them (the whole accumulated value, momentum
 * unmasked), as if never selected: the reduce transport's pairs that did
 * not fit their region's room or that their owner did not select. */
void dgc_commit_only(dgc_state *s, const dgc_step_params *p, const unsigned char *keep);

#ifdef __cplusplus
}
#endif
#endif
