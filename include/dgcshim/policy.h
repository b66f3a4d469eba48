/* Policy: what one compressed call does, from collective-consistent inputs
 * only (count, communicator size, configuration, step). Invariant 1 lives here. */
#ifndef DGCSHIM_POLICY_H
#define DGCSHIM_POLICY_H

#include <stdint.h>

#include "dgcshim/config.h"
#include "dgcshim/engine.h"
#include "dgcshim/wire_compact.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Density (1 - sparsity) for a step under warm-up: 25%, 6.25%, ... a quarter
 * each stage, the stages spread evenly over warmup_steps, never below the
 * target density; the target from warmup_steps on. */
double dgc_density_at(double sparsity, uint64_t warmup_steps, uint64_t step);

/* k = ceil(density * n), at least 1, at most n. */
uint64_t dgc_k_for(uint64_t n, double density);

/* Largest buffer the wire format can index (uint32 indices). */
#define DGC_MAX_ELEMENTS 4294967295ull

/* 1 when a float SUM of count elements over nranks ranks is compressed. */
int dgc_policy_compressible(const dgc_config *cfg, uint64_t count, int nranks);

/* The largest magnitude, as fp32 bits, a rank may send of a buffer whose
 * output goes back into type (dgc_sum_type; dgc_step_params.clamp_bits):
 * 0 for fp32 (no clamp); for fp16 and bf16 their sum limit
 * (dgc_sum_limit_bits, sum_rules.h), and with momentum compensation
 * (compensated_m = m > 0; else 0), whose output is S_t - m S_{t-1}, that
 * limit divided by 1 + m, down to the type's grid: both sums are then
 * within max / (1 + m), so the output is within the type's max. */
uint32_t dgc_policy_value_limit_bits(unsigned type, int nranks, double compensated_m);

/* elem_bytes, below: the size of one element of the buffer, 4 (fp32) or 2
 * (the NCCL path's fp16 and bf16), in which the dense transport sums, as the
 * uncompressed call would. Like the count, it is the same on every rank. */

/* Bytes one rank sends in one call, for each way its pairs can travel:
 *   sparse: the all-gather of the fixed-size compact payloads (wire_compact.h,
 *           value_bits per value; payload: one of them), (N-1) payloads (ring);
 *   dense:  the pairs scattered into a dense vector of the buffer's type and
 *           summed by a reduce-scatter then an all-gather (a ring
 *           all-reduce's 2 (N-1)/N elem_bytes n bytes: what the uncompressed
 *           call sends), after an all-gather of the 32-byte headers. */
typedef struct {
    uint64_t sparse, dense, payload;
    uint64_t reduce; /* DGC_TRANSPORT_REDUCE's (dgc_region_plan.bytes) */
} dgc_transport_bytes;

void dgc_transport_bytes_for(uint64_t n, unsigned elem_bytes, uint64_t k, unsigned value_bits, int nranks,
                             dgc_transport_bytes *out);

/* The transport of a call (DGC_TRANSPORT_SPARSE, _DENSE or _REDUCE): what
 * cfg->transport forces (_REDUCE only with 2 ranks or more, and only where
 * it sends fewer bytes than _DENSE, which takes its place otherwise: small
 * buffers on many ranks, whose headers outweigh them; auto never chooses it), else (auto) the sparse
 * all-gather only when it
 * sends fewer bytes than the dense transport (a tie goes dense, which needs
 * no gathered buffer). A function of (n, elem_bytes, k, nranks,
 * configuration) alone, so every rank decides alike. bytes, when not NULL,
 * gets both alternatives. */
dgc_transport dgc_policy_transport(const dgc_config *cfg, uint64_t n, unsigned elem_bytes, uint64_t k, int nranks,
                                   dgc_transport_bytes *bytes);

/* DGC_TRANSPORT=reduce (the MPI path's shim/mpi/reduce.c): the index range
 * is split into nranks regions, one owned by each rank; each rank sends each
 * owner at most cap of its selected pairs in the owner's region (one
 * all-to-all of compact payloads laid out as send: value_bits values), each
 * owner sums what it received in rank order and selects keep of the sums
 * (laid out as pick: 32-bit values, so the sums travel exactly), and one
 * all-gather of the owners' selections gives every rank the output. Sizes
 * from (n, k, nranks, value_bits) alone (invariant 1). An all-to-all
 * message is a send payload without its 32-byte header (body bytes): the
 * headers' round has already agreed on the step and the count, so the owner
 * rebuilds it. bytes: what a rank sends in all, headers' round included. */
typedef struct {
    uint64_t cap, keep;
    dgc_compact_layout send, pick;
    uint64_t body;
    uint64_t bytes;
} dgc_region_plan;

void dgc_policy_regions(uint64_t n, uint64_t k, unsigned value_bits, int nranks, dgc_region_plan *out);

/* The regions' boundaries: bounds[0] = 0 <= bounds[1] <= ... <= bounds[nranks]
 * = n, region r being [bounds[r], bounds[r+1]). Equal: bounds[r] = r n /
 * nranks. Balanced: the m indices sel (sorted, the previous step's global
 * selection, which every rank holds alike) cut into nranks equal shares, so
 * that regions where the selection clusters are narrow; equal when m is 0. */
void dgc_policy_bounds_equal(uint64_t n, int nranks, uint32_t *bounds);
void dgc_policy_bounds_balanced(uint64_t n, int nranks, const uint32_t *sel, uint64_t m, uint32_t *bounds);

/* A communicator's layout (DGC_TOPOLOGY), found once per communicator and
 * the same on every rank: flat (node 0), or nodes nodes of node_size ranks
 * each, this rank being local within its node. */
typedef struct {
    int node;
    int nodes, node_size, local;
} dgc_layout;

/* Shard l of n elements among node_size: [floor(l n / L), floor((l+1) n / L)). */
void dgc_policy_shard(uint64_t n, int node_size, int l, uint64_t *lo, uint64_t *hi);

/* 1 when a count-element call on a communicator of this layout goes by the
 * node layout: a node layout, and a count the node's collectives can carry
 * (int counts and displacements: at most INT_MAX - node_size elements) with every
 * shard non-empty. Else the call is flat, on every rank alike. */
int dgc_policy_node_call(const dgc_layout *layout, uint64_t count);

/* One compressed call, as every rank does it: the step's parameters (k,
 * the rules' options, the clamp), the transport, the bytes a rank sends
 * either way and the compact payload's layout. In node layout all of these
 * are the shard's, exchanged among the nodes ranks of this local rank. */
typedef struct {
    dgc_step_params p;
    dgc_transport transport;   /* DGC_TRANSPORT_SPARSE, _DENSE or _REDUCE (the NCCL path takes _REDUCE as
                                * _SPARSE: every other field is then what _SPARSE's would be) */
    dgc_transport_bytes bytes; /* bytes.payload: one compact payload */
    dgc_compact_layout code;
    dgc_region_plan regions;   /* _REDUCE's (dgc_policy_regions); zero for the other transports */
    dgc_layout layout;         /* flat (layout.node 0), or the node layout this call goes by */
    uint64_t shard_lo, shard_hi; /* the elements of the buffer this rank compresses: all of them when flat */
    /* Node layout: the bytes one node's card carries in this call, estimated
     * as node_size times what this rank sends across nodes (every local rank's
     * shard is as large, to within one element); 0 when flat. */
    uint64_t card_bytes;
} dgc_plan;

/* The plan of the call at step on a count-element buffer whose values are
 * summed in sum_type (dgc_sum_type: DGC_SUM_F32 for fp32 buffers, the MPI
 * path's; the NCCL path's fp16 and bf16 buffers name theirs, in which the
 * dense transport sums and to which the values sent are clamped, as the
 * uncompressed call would sum them). Everything in it follows from count,
 * sum_type, step, nranks and the configuration, which are the same on every
 * rank (invariant 1): it is the one place a call's shape is decided.
 * Returns 0, or -1 when the call goes by the sparse all-gather and its
 * compact payloads would not fit one (more than INT_MAX 8-byte words in
 * all): the call passes through. */
int dgc_policy_plan(const dgc_config *cfg, uint64_t count, unsigned sum_type, uint64_t step, int nranks,
                    dgc_plan *out);

/* The plan of a node-layout call (dgc_policy_node_call) on a count-element
 * buffer: this rank's shard (layout->local's) at shard_step, the step of
 * that shard's own count, exchanged among layout->nodes ranks: the shard's
 * dgc_policy_plan, with the layout, the shard's bounds and card_bytes.
 * Returns what dgc_policy_plan returns. */
int dgc_policy_plan_node(const dgc_config *cfg, uint64_t count, unsigned sum_type, uint64_t shard_step,
                         const dgc_layout *layout, dgc_plan *out);

/* What a rank sends to its peers in the plan's transport, all of them
 * together (dgc_transport_bytes_for: a ring's N-1 payloads or shares); in
 * node layout, what it sends across nodes. */
uint64_t dgc_policy_cross_bytes(const dgc_plan *plan);

/* What the calls on a count-element buffer from step on will need, for a
 * state sized once (warm-up densities only fall): *sparse_k, the largest k
 * of those that go by the sparse all-gather (0 when none does), and *dense,
 * whether any goes by the dense transport. */
void dgc_policy_outlook(const dgc_config *cfg, uint64_t count, unsigned sum_type, uint64_t step, int nranks,
                        uint64_t *sparse_k, int *dense);

#ifdef __cplusplus
}
#endif
#endif
