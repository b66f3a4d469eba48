/* The CUDA DGC engine: the host engine's algorithm (engine.h), its state in
 * GPU memory, every step enqueued on the caller's stream. It knows DGC and
 * CUDA, nothing of NCCL.
 *
 * One compressed call on one buffer:
 *     dgc_gpu_compress(s, g, out, dtype, p, stream)    update, select, pack the payload
 *     all-gather dgc_gpu_payload(s) into dgc_gpu_gathered(s)   (the front end's job)
 *     dgc_gpu_decode(s, out, dtype, p, compensate, report, stream)
 *                                                      check, sum, commit or discard
 * Nothing here reads device memory from the host or synchronises the host
 * with the stream, except dgc_gpu_state_create/destroy (first sight of a
 * buffer, and its end). Decisions that depend on data (was some rank's
 * gradient non-finite? did a payload fail its check? did the candidates
 * overflow?) are taken on the device, by kernels that read flags other
 * kernels wrote; the host learns of them later through a dgc_gpu_report in
 * mapped host memory.
 *
 * Payloads use the host engine's wire format (wire.h) with one rule more,
 * which the decoder enforces: the real pairs come first, with strictly
 * increasing indices, and padding slots are (0, +0.0f) after them. That is
 * what lets the decoder add each rank's pairs in parallel without atomics
 * (no index twice in one launch) and in rank order (one launch per rank),
 * so every rank's output is bitwise identical (invariant 3). */
#ifndef DGCSHIM_ENGINE_CUDA_H
#define DGCSHIM_ENGINE_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "dgcshim/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/* cudaStream_t without the CUDA headers. */
struct CUstream_st;
typedef struct CUstream_st *dgc_cuda_stream;

/* Element types of the caller's buffers; state and payload values are fp32. */
typedef enum { DGC_GPU_F32 = 0, DGC_GPU_F16 = 1, DGC_GPU_BF16 = 2 } dgc_gpu_dtype;

size_t dgc_gpu_dtype_size(dgc_gpu_dtype t);

/* The type the dense transport sums a buffer of type t in: its own (the
 * pairs are rounded to it, dgc_step_params.sum_type). */
static inline unsigned dgc_gpu_sum_type_of(dgc_gpu_dtype t) {
    return t == DGC_GPU_F16 ? DGC_SUM_F16 : t == DGC_GPU_BF16 ? DGC_SUM_BF16 : DGC_SUM_F32;
}

/* Why a payload failed its check on the device. */
enum {
    DGC_GPU_BAD_NONE = 0,
    DGC_GPU_BAD_MAGIC = 1, /* not a dgcshim payload, or flags other than NONFINITE/FAILED (DENSE too) */
    DGC_GPU_BAD_HEADER = 2, /* step, n or k differ from this rank's */
    DGC_GPU_BAD_INDEX = 3, /* an index >= n */
    DGC_GPU_BAD_ORDER = 4, /* indices not strictly increasing, or padding before a real pair */
    DGC_GPU_BAD_CODE = 5,  /* a compact payload breaks its format: bad_value is compact_rules.h's DGC_CX_* fault */
};

#define DGC_GPU_BAD_RING 64

/* What the device tells the host, in mapped pinned host memory: kernels
 * write it, the front end reads it on its next call without synchronising
 * (so it may lag by the calls still in flight). One per communicator. The
 * first bad payload is kept (bad_* are written once, bad last); within one
 * call "first" is the lowest (rank, slot), a header counting as slot 0 of
 * its rank. The counters add up: every step with a bad payload in
 * bad_steps (after bad is set), a dropped step in failed (with failed_rank)
 * when some rank flagged DGC_WIRE_FAILED, else in nonfinite. */
typedef struct {
    uint32_t bad;         /* DGC_GPU_BAD_* of the first bad payload seen, 0 when none */
    int32_t bad_rank;     /* the rank that sent it */
    uint64_t bad_slot;    /* the slot, for DGC_GPU_BAD_INDEX / _ORDER */
    uint64_t bad_value;   /* the index, magic or flags that was wrong */
    uint64_t bad_step;    /* the step it came in */
    uint64_t nonfinite;   /* steps dropped because some rank's gradient held Inf/NaN */
    uint64_t failed;      /* steps dropped because some rank flagged DGC_WIRE_FAILED */
    int32_t failed_rank;  /* the lowest such rank of the latest */
    uint32_t pad;
    uint64_t bad_steps;   /* steps with a bad payload (output zero, no state changed), the first one's in bad_* */
    /* This rank's own call at each bad step, (n, step) at bad_calls[i %
     * DGC_GPU_BAD_RING] for the i-th: written before bad_steps counts it.
     * A rejected call changed no state anywhere, so the front end gives its
     * step back, on every rank alike, even where ranks called with different
     * counts (each gives back its own). */
    uint64_t bad_calls[DGC_GPU_BAD_RING][2];
    uint64_t saturated;   /* decoded steps whose update held some u or v at +-FLT_MAX (update_rules.h) */
    /* Node layout: calls whose own shard went through but another shard of
     * the node failed (dgc_gpu_node_fail), so the whole call failed. */
    uint64_t node_failed;
} dgc_gpu_report;

/* A zeroed report in mapped pinned memory, or NULL (no device, no memory). */
dgc_gpu_report *dgc_gpu_report_create(void);
void dgc_gpu_report_destroy(dgc_gpu_report *r);

typedef struct dgc_gpu_state dgc_gpu_state;

/* What a state is made for: n elements, payloads of up to k slots (the
 * warm-up's first k is the largest a buffer ever needs), nranks payloads
 * of up to sparse_k slots gathered (the largest k that goes by the sparse
 * all-gather; 0 when none does), the dense transport's room when dense
 * (some step goes by it), the previous step's sum kept when keep_prev
 * (momentum compensation: as gathered payloads after a sparse step, as a
 * dense vector after a dense one), momentum arrays when with_momentum, an
 * fp32 accumulator when dtype is not DGC_GPU_F32. dgc_policy_outlook gives
 * sparse_k and dense. */
typedef struct {
    uint64_t n, k;
    uint64_t sparse_k;
    int dense;
    int nranks;
    int with_momentum;
    int keep_prev;
    dgc_gpu_dtype dtype;
    unsigned value_bits; /* the sparse payload on the wire: 16 or 32, compact (wire_compact.h) with values of
                          * that width; 0, the plain pairs (wire.h) */
} dgc_gpu_shape;

/* Device bytes a state of this shape holds (the one cudaMalloc of
 * dgc_gpu_state_create; its mapped host counter aside). What
 * DGC_MAX_STATE_MB checks. 0 for a shape create would refuse, or when the
 * device cannot be asked (cub sizes its sort scratch per device). */
size_t dgc_gpu_state_footprint(const dgc_gpu_shape *shape);

/* Allocates every array the state will ever need in one block (first sight
 * is the one place the GPU path allocates: cudaMallocAsync on stream where
 * the device has memory pools, else cudaMalloc) and zeroes it on stream, so
 * it is ready in stream order. NULL when device memory is short, with
 * nothing left allocated; err then says what failed. */
dgc_gpu_state *dgc_gpu_state_create(const dgc_gpu_shape *shape, dgc_cuda_stream stream, char *err, size_t errlen);

/* What a state's kernels tell the host, in mapped pinned memory: the steps
 * dropped (dgc_gpu_state_nonfinite), and how the last committed step's sum
 * is kept for the compensation (dgc_gpu_state_kept_fits). done_step is
 * written last, after every decode, committed or not: 1 + its step. */
typedef struct {
    unsigned long long nonfinite;
    unsigned long long kept_step, kept_k;
    int kept_kind; /* 0 nothing kept, 1 gathered payloads of kept_k slots, 2 a dense vector */
    int kept_nranks;
    unsigned long long done_step;
} dgc_gpu_state_mapped;

/* The same, its dgc_gpu_state_mapped in counter: mapped pinned host memory
 * of that size, zeroed here, that stays the caller's (NULL: the state
 * allocates its own). */
dgc_gpu_state *dgc_gpu_state_create_with(const dgc_gpu_shape *shape, dgc_cuda_stream stream, void *counter,
                                         char *err, size_t errlen);

/* Waits for the device to finish with the state, then frees it (tests,
 * benchmarks). */
void dgc_gpu_state_destroy(dgc_gpu_state *s);

/* 1 when every step enqueued on s has finished its decode (as far as the
 * mapped memory shows: no wait) and what s keeps for the compensation fits
 * a state of shape: nothing, payloads of at most shape->sparse_k slots from
 * as many ranks, or a dense vector where shape keeps one. Then
 * dgc_gpu_state_resize(s, shape) loses nothing. */
int dgc_gpu_state_kept_fits(const dgc_gpu_state *s, const dgc_gpu_shape *shape);

/* The warm-up's end: a state of shape (s's but for a smaller k, sparse_k or
 * no dense room), holding s's committed residual and momentum, its kept sum
 * and its mapped memory, made on stream after whatever stream already
 * holds (the caller orders s's last work before it); s's block is freed in
 * stream order (without memory pools, as on the emulated device: by
 * cudaFree after a wait for stream) and s is gone. NULL, s untouched, when
 * device memory is short or the shapes differ otherwise. The caller has
 * checked dgc_gpu_state_kept_fits. */
dgc_gpu_state *dgc_gpu_state_resize(dgc_gpu_state *s, const dgc_gpu_shape *shape, dgc_cuda_stream stream,
                                    char *err, size_t errlen);

/* Frees the state without a host wait: its block in stream order on stream
 * (which the caller has made wait for the state's last work), or, without
 * memory pools (the block came from cudaMalloc), by cudaFree, which may
 * wait for the device. Its mapped counter is not freed (cudaFreeHost may
 * wait for the whole device): it is returned, for the caller to reuse once
 * that work is done. */
void *dgc_gpu_state_release(dgc_gpu_state *s, dgc_cuda_stream stream);

const dgc_gpu_shape *dgc_gpu_state_shape(const dgc_gpu_state *s);
size_t dgc_gpu_state_bytes(const dgc_gpu_state *s);

/* Device pointers: this rank's payload (dgc_wire_bytes(shape k) bytes),
 * and room for nranks payloads of a sparse call's k (dgc_wire_bytes(p->k)
 * apart), or, on a dense-transport call, for nranks 32-byte headers. */
void *dgc_gpu_payload(dgc_gpu_state *s);
void *dgc_gpu_gathered(dgc_gpu_state *s);

/* What the sparse all-gather carries: this rank's payload as it travels
 * (dgc_gpu_wire_bytes(s, p->k) bytes: the compact one that dgc_gpu_encode
 * writes when the shape's value_bits is 16 or 32, else the plain
 * dgc_gpu_payload), and room for nranks of them, that far apart, which
 * dgc_gpu_decode reads (and, compact, expands into dgc_gpu_gathered first). */
void *dgc_gpu_wire(dgc_gpu_state *s);
void *dgc_gpu_wire_gathered(dgc_gpu_state *s);
size_t dgc_gpu_wire_bytes(const dgc_gpu_state *s, uint64_t k);

/* Enqueues, after dgc_gpu_compress on a compact shape, the compact form of
 * the payload into dgc_gpu_wire(s): the bytes dgc_compact_encode gives for
 * it (the selected pairs, values on the grid of the payload's scale; none on
 * a non-finite step). p->value_bits must be the shape's. A no-op for a
 * plain shape. Returns 0, or -1 when a launch failed. */
int dgc_gpu_encode(dgc_gpu_state *s, const dgc_step_params *p, dgc_cuda_stream stream, char *err, size_t errlen);

/* Enqueues this step's update and selection: reads g (n elements of dtype,
 * device memory), computes the clipping scale (p->clip_norm > 0), the
 * momentum and residual updates into spare arrays (the committed state is
 * untouched), the threshold from the shared sample (dgc_sample_plan_for),
 * the candidates, the exact top p->k of them, and writes the payload, its
 * pairs sorted by index, with DGC_WIRE_NONFINITE when some updated value is
 * Inf or NaN. With p->value_bits 16 the values are rounded to the binary16
 * grid of one scale per payload (dgc_compact_value, dgc_compact_scale16, as
 * the host engine rounds them), and the commit leaves what rounding lost in
 * the residual (error feedback); with p->sum_type (the dense transport of a
 * 16-bit buffer: it must be dgc_gpu_sum_type_of(dtype), else the call is
 * refused) they are rounded and clamped for that type's sum instead
 * (sum_rules.h); with p->clamp_bits (a 16-bit buffer on either transport:
 * dgc_policy_value_limit_bits) they are clamped to it first, so that the
 * output converts back to dtype without overflowing (the excess, too, stays
 * in the residual). Sets out (n elements of dtype; may be g) to zero, or the fp32
 * accumulator when dtype is not fp32, as the update streams past.
 * p->k must not exceed the shape's k. dgc_gpu_decode must get the same out
 * (fp32: it adds into what this call zeroed). Returns 0, or -1 when a launch
 * failed or the call does not fit the state (err says which). */
int dgc_gpu_compress(dgc_gpu_state *s, const void *g, void *out, dgc_gpu_dtype dtype, const dgc_step_params *p,
                     dgc_cuda_stream stream, char *err, size_t errlen);

/* Enqueues the decode of dgc_gpu_wire_gathered(s) (p->nranks payloads of
 * p->k slots, p->k at most the shape's sparse_k; compact ones expanded into
 * dgc_gpu_gathered(s) and checked as dgc_compact_check checks them) into
 * out, and the commit, all decided on the device:
 *   - some header, index or compact code fails its check: report->bad (first time), out
 *     left as compress left it (zero), the state not changed;
 *   - some rank flagged DGC_WIRE_FAILED or DGC_WIRE_NONFINITE: out all NaN
 *     (in dtype), the state not changed, the report's counter and this
 *     state's dgc_gpu_state_nonfinite advance;
 *   - otherwise out = the sum of every rank's pairs, rank by rank in rank
 *     order; then, when compensate and p->momentum > 0, minus p->momentum
 *     times the previous finite step's sum (momentum compensation, as the
 *     MPI path does; kept as payloads or, after a dense-transport step, as
 *     a dense vector); divided by p->nranks when average (ncclAvg);
 *     converted to dtype; the update becomes the committed
 *     state, the sent indices masked (v = 0; u = 0 with
 *     p->momentum_masking), and the gathered payloads kept as the previous
 *     step's.
 * Returns 0, or -1 when a launch failed. */
int dgc_gpu_decode(dgc_gpu_state *s, void *out, dgc_gpu_dtype dtype, const dgc_step_params *p, int compensate,
                   int average, dgc_gpu_report *report, dgc_cuda_stream stream, char *err, size_t errlen);

/* The dense transport (DESIGN.md, "Bytes: never worse than dense"), for a
 * state made with shape dense, in place of the all-gather and decode above:
 *     dgc_gpu_compress(s, g, out, dtype, p, stream)         as for the all-gather
 *     dgc_gpu_dense_scatter(s, out, dtype, p, stream)       this rank's pairs into the dense vector
 *     the front end: all-gather of the 32-byte header of dgc_gpu_payload(s)
 *         into dgc_gpu_gathered(s), and the dense sum of the vector
 *         (dgc_gpu_dense_vector): reduce-scatter then all-gather, in place,
 *         over its blocks, and the same over the spare for the rest
 *     dgc_gpu_decode_dense(s, out, dtype, p, compensate, average, report, stream)
 * Each element is reduced once, on the rank that owns its block, and copied
 * to all: every rank gets the same bytes (invariant 3). */

/* Where the dense sum runs, in the buffer's own type (so that it sends what
 * the uncompressed all-reduce sends): body, nranks blocks of block elements
 * (out itself, its first block * nranks elements), and spare, nranks
 * elements holding the rem = n - block * nranks elements after them (zeros
 * after those), one a rank. A 16-bit sum is widened into the state's fp32
 * accumulator for the rest of the decode. */
typedef struct {
    void *body;
    uint64_t block;
    void *spare;
    uint64_t rem;
    dgc_gpu_dtype type; /* of body and spare: the buffer's */
} dgc_gpu_dense_vector;

/* The vector of a state made with shape dense for the output out; -1 (and
 * nothing set) when the state has no dense room or dtype does not fit. */
int dgc_gpu_dense_view(dgc_gpu_state *s, void *out, dgc_gpu_dtype dtype, dgc_gpu_dense_vector *v);

/* Enqueues, after dgc_gpu_compress: this rank's selected pairs written
 * into the zeroed vector (for fp32 the compression zeroed it; a 16-bit one
 * is zeroed here, after the compression has read g), and the rest moved to
 * the spare. A 16-bit buffer's pairs must have been rounded to its type
 * (p->sum_type = dgc_gpu_sum_type_of(dtype) for the compression too).
 * Returns 0, or -1 when a launch failed, the state has no dense room or
 * p->sum_type does not fit dtype. */
int dgc_gpu_dense_scatter(dgc_gpu_state *s, void *out, dgc_gpu_dtype dtype, const dgc_step_params *p,
                          dgc_cuda_stream stream, char *err, size_t errlen);

/* Enqueues, after the headers' all-gather and the dense sum: the rest back
 * from the spare, and the outcome decided on the device from the nranks
 * headers in dgc_gpu_gathered(s) (32 bytes apart), as dgc_gpu_decode
 * decides it: a bad header: report->bad, out zero, no state change; a
 * failed or non-finite rank: out NaN, no state change, the counters; else
 * out = the sum (a 16-bit one widened to fp32 first), compensated (the previous finite step's sum, kept either
 * way, times -m; this step's sum kept as a dense vector), averaged,
 * converted, and the state committed and masked. Returns 0, or -1 when a
 * launch failed. */
int dgc_gpu_decode_dense(dgc_gpu_state *s, void *out, dgc_gpu_dtype dtype, const dgc_step_params *p, int compensate,
                         int average, dgc_gpu_report *report, dgc_cuda_stream stream, char *err, size_t errlen);

/* For a rank that cannot take part with state (no memory): writes a header
 * carrying only flags (DGC_WIRE_FAILED) into payload (device memory, room
 * for dgc_wire_bytes(p->k)), and, after the all-gather, checks the nranks
 * headers in gathered (stride bytes apart: dgc_wire_bytes(p->k) after the
 * payloads' all-gather, 32 after the dense transport's headers) and sets
 * out as the ranks with state set theirs: NaN, the step failed on every
 * rank (the report's failed counter advances), or zero when some header is
 * bad (report->bad is set). Payload and gathered here are the front end's
 * own exchange buffers. */
int dgc_gpu_flag_only(void *payload, uint32_t flags, const dgc_step_params *p, dgc_cuda_stream stream);
int dgc_gpu_decode_stateless(const void *gathered, size_t stride, void *out, dgc_gpu_dtype dtype,
                             const dgc_step_params *p, dgc_gpu_report *report, dgc_cuda_stream stream);

/* The node layout's exact sum (the NCCL path's node transport): pieces
 * holds L pieces of len elements of dtype back to back (device memory),
 * piece l being local rank l's part of this rank's shard; writes sum[i] =
 * ((p_0[i] + p_1[i]) + p_2[i]) + ... in fp32, 16-bit pieces widened first:
 * the MPI path's node sum, bit for bit. sum may be the pieces themselves
 * (fp32). Sets *nonfinite (device memory) to 1 when some sum is Inf or NaN,
 * and leaves it alone otherwise. Enqueued on stream: 0, or -1 (err). */
int dgc_gpu_node_sum(const void *pieces, dgc_gpu_dtype dtype, int L, uint64_t len, float *sum,
                     unsigned int *nonfinite, dgc_cuda_stream stream, char *err, size_t errlen);

/* After the node's ranks agreed on *flag (device memory: the largest of
 * their dgc_gpu_node_sum flags): sets sum[0] to NaN when it is set, so
 * that the shard's step is skipped everywhere, as a flat call with Inf or
 * NaN is. Enqueued on stream: 0, or -1 (err). */
int dgc_gpu_node_poison(float *sum, const unsigned int *flag, dgc_cuda_stream stream, char *err, size_t errlen);

/* Node layout: whether a shard's call failed, agreed over the node so
 * that the whole call fails on every rank, as on the MPI path. words is
 * device memory of 4 uint64_t: watch, before the shard's call, keeps the
 * report's failed and bad-step counts (report: the cross record's; NULL
 * counts nothing); judge, after it, sets word 2 (own verdict) to 1 when
 * they moved or when host_failed (the host knows already: a flagged
 * payload), else 0; the node then all-reduces word 2 (max) into word 3;
 * fail, when word 3 is set, makes the shard's len sums NaN and, when this
 * rank's own verdict was 0, counts the call in report->node_failed for
 * the host. Enqueued on stream: 0, or -1 (err). */
int dgc_gpu_node_watch(const dgc_gpu_report *report, uint64_t *words, dgc_cuda_stream stream, char *err,
                       size_t errlen);
int dgc_gpu_node_judge(const dgc_gpu_report *report, uint64_t *words, int host_failed, dgc_cuda_stream stream,
                       char *err, size_t errlen);
int dgc_gpu_node_fail(float *sum, uint64_t len, const uint64_t *words, dgc_gpu_report *report,
                      dgc_cuda_stream stream, char *err, size_t errlen);

/* A node-layout shard, decoded in fp32 (sum: len floats, device memory),
 * into out in dtype: each value divided by divisor first when it is above
 * 1 (ncclAvg: the communicator's ranks, as the flat path's decode divides),
 * then rounded once to nearest even for a 16-bit type. out may be sum for
 * fp32 (nothing is launched when there is nothing to do). Enqueued on
 * stream: 0, or -1 (err). */
int dgc_gpu_node_finish(const float *sum, void *out, dgc_gpu_dtype dtype, uint64_t len, int divisor,
                        dgc_cuda_stream stream, char *err, size_t errlen);

/* Steps of this state dropped for Inf/NaN (or a failed rank), as far as the
 * device has got (mapped memory: no synchronisation). */
uint64_t dgc_gpu_state_nonfinite(const dgc_gpu_state *s);

/* For tests and benchmarks: waits for the stream, then copies the
 * committed residual v and momentum u (NULL: skipped; u only with momentum)
 * to host memory. Returns 0 or -1. */
int dgc_gpu_state_read(dgc_gpu_state *s, float *v, float *u);

/* 1 when the process can use a CUDA device (a driver and at least one
 * device); asks the runtime once, lazily, never at load time. */
int dgc_gpu_available(void);

/* The CUDA runtime's message for the last error, for log lines. */
const char *dgc_gpu_last_error(void);

#ifdef __cplusplus
}
#endif
#endif
