/* Compressed ncclAllReduce calls, from the decision to compress on:
 *
 *   plan      read the device's news, take the step, plan k, find or make
 *             the state
 *   vote      at a count's first call only: every rank says whether it holds
 *             a state (an all-gather of one byte a rank, then a host wait);
 *             when some rank does not (over DGC_MAX_STATE_MB, no device
 *             memory), every rank sums this count densely from now on, by
 *             the real ncclAllReduce: exact, and counted as summed densely
 *             over budget
 *   compress enqueue the compression (or a flagged payload)
 *   exchange  the real ncclAllGather of the fixed-size compact payloads
 *             (wire_compact.h, encoded and expanded on the device), as bytes;
 *             or, by the dense transport (dgc_policy_transport: when the
 *             payloads would outweigh a dense all-reduce), the all-gather of
 *             the 32-byte headers and the dense sum of the scattered pairs:
 *             ncclReduceScatter, then ncclAllGather, in place
 *   finish    enqueue the decode (or the stateless one), count
 *
 * Several calls (those a user's group held back) run as one batch, in
 * rounds: the r-th call of each communicator in round r, each round's
 * collectives of one kind in one NCCL group of our own (one thread may drive
 * several devices' communicators), every call whole before the next call on
 * its communicator begins. So each communicator sees the collectives of its
 * calls in the order the calls were made, exactly as if they had been made
 * one at a time, whether or not the program grouped them (ranks may group
 * differently: NCCL matches a communicator's operations by their order).
 *
 * Failures keep every rank issuing the same collectives (invariant 1):
 *   - a rank without state after its count's first call (a buffer that
 *     moved, no device memory then) sends a header flagged DGC_WIRE_FAILED
 *     from exchange memory of the call's own (stream-ordered where the
 *     device has memory pools); the device then makes the step a no-op with
 *     NaN output on every rank (zero when some header is bad too) and counts
 *     it in the communicator's report;
 *   - errors the device finds (a failed rank, a bad payload) reach the host
 *     through that report, read without waiting at the start of every
 *     compressed call: the call is enqueued as usual, then returns
 *     ncclSystemError / ncclInvalidUsage. Ranks may learn of it at different
 *     calls; they all issue the same collectives meanwhile;
 *   - only when not even the flagged payload's few bytes can be had does a
 *     rank stop issuing (ncclSystemError at once, logged: the others may
 *     wait for it). */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "dgcshim/compact_rules.h"
#include "dgcshim/policy.h"
#include "dgcshim/wire.h"
#include "core/log.h"
#include "core/order.h"
#include "core/stats_file.h"
#include "internal.h"

int dgc_nccl_gpu_dtype(ncclDataType_t dtype, dgc_gpu_dtype *out) {
    switch (dtype) {
    case ncclFloat32: *out = DGC_GPU_F32; return 0;
    case ncclFloat16: *out = DGC_GPU_F16; return 0;
    case ncclBfloat16: *out = DGC_GPU_BF16; return 0;
    default: return -1;
    }
}

/* Bytes per element; 0 for a type this NCCL header does not know (counted
 * as a call with no bytes rather than guessed). */
size_t dgc_nccl_type_size(ncclDataType_t dtype) {
    switch ((int)dtype) {
    case 0: case 1: case 10: case 11: return 1; /* int8, uint8, float8 e4m3 and e5m2 */
    case 6: case 9: return 2;                   /* float16, bfloat16 */
    case 2: case 3: case 7: return 4;           /* int32, uint32, float32 */
    case 4: case 5: case 8: return 8;           /* int64, uint64, float64 */
    default: return 0;
    }
}

/* A compact payload's fault (compact_rules.h's DGC_CX_*, the report's value). */
static const char *code_fault(uint64_t f) {
    switch (f) {
    case DGC_CX_COUNT: return "a compact payload's count word is bad (reserved bits, count above k, or scale)";
    case DGC_CX_TAIL: return "a compact payload has a non-zero slot or bit past its pairs";
    case DGC_CX_UPPER: return "a compact payload's upper area has a bit past it, or more or fewer set bits than pairs";
    case DGC_CX_INDEX: return "a compact payload has an index out of range";
    case DGC_CX_ORDER: return "a compact payload's indices are not strictly increasing";
    case DGC_CX_VALUE: return "a compact payload has an Inf, NaN or inexact value";
    case DGC_CX_SCALE: return "a compact payload's scale is not canonical";
    case DGC_CX_PADDING: return "a compact payload counts its padding (0, +0.0) as a pair";
    default: return "a compact payload breaks its format";
    }
}

static const char *bad_reason(uint32_t bad, uint64_t value) {
    switch (bad) {
    case DGC_GPU_BAD_MAGIC: return "not a dgcshim payload, or unknown flags";
    case DGC_GPU_BAD_HEADER: return "its step, n or k differ from this rank's";
    case DGC_GPU_BAD_INDEX: return "an index out of range";
    case DGC_GPU_BAD_ORDER: return "indices not strictly increasing, or padding before a pair";
    case DGC_GPU_BAD_CODE: return code_fault(value);
    default: return "unknown reason";
    }
}

void dgc_nccl_count_news(dgc_nccl_comm *x) {
    const volatile dgc_gpu_report *r = x->report;
    if (!r) return;
    uint64_t bad_steps = r->bad_steps, failed = r->failed, saturated = r->saturated, node_failed = r->node_failed;
    if (saturated > x->saturated_seen) {
        dgc_registry_count_saturated(saturated - x->saturated_seen, 0);
        x->saturated_seen = saturated;
    }
    atomic_thread_fence(memory_order_acquire);
    if (node_failed > x->node_failed_seen) { /* another local rank's shard: a peer's failure here */
        dgc_registry_count_failed(DGC_FAIL_PEER, node_failed - x->node_failed_seen);
        DGC_ERROR("%llu call(s) in node layout failed on every rank: another local rank's shard failed across nodes "
                  "(that rank's log says why); output NaN, this rank's shard kept its state; a call returns "
                  "ncclSystemError",
                  (unsigned long long)(node_failed - x->node_failed_seen));
        x->node_failed_seen = node_failed;
        x->node_failed_unsaid = 1;
    }
    if (bad_steps > x->bad_counted) {
        dgc_registry_count_failed(DGC_FAIL_BAD_PAYLOAD, bad_steps - x->bad_counted);
        x->bad_counted = bad_steps;
    }
    /* Failed steps are this rank's own (counted by cause when it flagged)
     * or a peer's: what the device has counted beyond this rank's own flags,
     * never more (the device may not have reached them all yet). */
    const uint64_t peer = failed > x->own_flagged ? failed - x->own_flagged : 0;
    if (peer > x->peer_counted) {
        dgc_registry_count_failed(DGC_FAIL_PEER, peer - x->peer_counted);
        x->peer_counted = peer;
    }
}

/* Each call the device rejected gives its step back (the MPI path does the
 * same): it changed no state on any rank, and ranks whose calls disagreed
 * (different counts) must not keep counters apart for ever. Every rank
 * rejects the same calls and gives back its own, so the counters meet again
 * once each has read its report (gpu.nccl.count_mismatch). */
static void give_back_rejected(dgc_comm *c, dgc_nccl_comm *x) {
    const volatile dgc_gpu_report *r = x->report;
    const uint64_t bad_steps = r->bad_steps;
    atomic_thread_fence(memory_order_acquire);
    if (bad_steps - x->bad_undone > DGC_GPU_BAD_RING) {
        DGC_ERROR("%llu rejected calls since the last look, more than the device's record of %d: the steps of the "
                  "older ones stay taken, and later calls on their counts may keep failing",
                  (unsigned long long)(bad_steps - x->bad_undone), DGC_GPU_BAD_RING);
        x->bad_undone = bad_steps - DGC_GPU_BAD_RING;
    }
    for (; x->bad_undone < bad_steps; x->bad_undone++) {
        const uint64_t n = r->bad_calls[x->bad_undone % DGC_GPU_BAD_RING][0];
        DGC_DEBUG("the %llu-element call rejected at step %llu gives its step back", (unsigned long long)n,
                  (unsigned long long)r->bad_calls[x->bad_undone % DGC_GPU_BAD_RING][1]);
        dgc_registry_undo_step(c, n);
    }
}

/* What the device reported since the last look, logged once; the error the
 * current call returns after it is enqueued (ncclSuccess: none). */
static ncclResult_t news(dgc_comm *c) {
    dgc_nccl_comm *x = dgc_nccl_ext(c);
    const volatile dgc_gpu_report *r = x->report;
    ncclResult_t rc = ncclSuccess;
    if (!r) return rc; /* the setup failed: this rank's calls are flagged, and say so */
    dgc_nccl_count_news(x);
    give_back_rejected(c, x);
    uint64_t bad_steps = r->bad_steps;
    atomic_thread_fence(memory_order_acquire); /* bad and its details were written before the count */
    if (bad_steps != x->bad_seen) {
        /* Every step with a bad payload fails a call: its output was left
         * zero, not a sum (invariant 4); the first one is named. */
        if (x->bad_seen == 0)
            DGC_ERROR("a payload from rank %d failed its check on the device (%s; slot %llu, value %llu, step %llu): "
                      "that step changed no state on any rank, its output is zero (%llu such step(s) so far); this "
                      "call returns ncclInvalidUsage",
                      (int)r->bad_rank, bad_reason(r->bad, r->bad_value), (unsigned long long)r->bad_slot,
                      (unsigned long long)r->bad_value, (unsigned long long)r->bad_step,
                      (unsigned long long)bad_steps);
        else
            DGC_ERROR("%llu more step(s) had a bad payload (output zero, no state changed); this call returns "
                      "ncclInvalidUsage",
                      (unsigned long long)(bad_steps - x->bad_seen));
        x->bad_seen = bad_steps;
        rc = ncclInvalidUsage;
    }
    uint64_t failed = r->failed;
    if (failed != x->failed_seen) {
        DGC_ERROR("%llu step(s) failed on every rank because rank %d could not take part (no device memory for "
                  "its state, over its DGC_MAX_STATE_MB, or a buffer it could not compress: its own log says): output "
                  "NaN, no state changed; this call returns ncclSystemError",
                  (unsigned long long)(failed - x->failed_seen), (int)r->failed_rank);
        x->failed_seen = failed;
        if (rc == ncclSuccess) rc = ncclSystemError;
    }
    if (x->node_failed_unsaid) {
        x->node_failed_unsaid = 0;
        if (rc == ncclSuccess) rc = ncclSystemError;
    }
    uint64_t nonfinite = r->nonfinite;
    if (nonfinite != x->nonfinite_seen) {
        DGC_INFO("%llu step(s) held Inf/NaN on some rank (or overflowed in a 16-bit sum): output set to NaN, residual "
                 "and momentum kept as they were",
                 (unsigned long long)(nonfinite - x->nonfinite_seen));
        x->nonfinite_seen = nonfinite;
    }
    return rc;
}

/* The call's own resources: its state unpinned, its exchange memory freed
 * after the kernels that use it: in stream order, or, when it came from
 * cudaMalloc, once the host has waited for the stream (cudaFree is not
 * stream-ordered). */
static void release(dgc_nccl_call *k) {
    if (k->b) k->b->pinned = 0;
    if (k->xbuf && !k->xbuf_sync) cudaFreeAsync(k->xbuf, k->stream);
    if (k->xbuf && k->xbuf_sync) {
        (void)cudaStreamSynchronize(k->stream);
        cudaFree(k->xbuf);
    }
    k->xbuf = NULL;
    k->xbuf_sync = 0;
}

/* Exchange memory for a call without state: stream-ordered when the device
 * has memory pools; else (cudaMallocAsync answers cudaErrorNotSupported on
 * some virtualised or older setups) plain cudaMalloc, since a rank that does
 * not take part hangs every other one. This path is for failures only: its
 * host waits do not touch steady state. */
static cudaError_t exchange_alloc(dgc_nccl_call *k, size_t bytes) {
    k->xbuf_sync = 0;
    cudaError_t e = cudaMallocAsync(&k->xbuf, bytes, k->stream);
    if (e == cudaSuccess) return e;
    (void)cudaGetLastError();
    k->xbuf = NULL;
    e = cudaMalloc(&k->xbuf, bytes);
    if (e == cudaSuccess) {
        k->xbuf_sync = 1;
        return e;
    }
    (void)cudaGetLastError();
    k->xbuf = NULL;
    return e;
}

/* The pairs go by the dense transport (the plan's). */
static int dense(const dgc_nccl_call *k) { return k->plan.transport == DGC_TRANSPORT_DENSE; }

/* One payload as the call's exchange sends it: the compact one by the
 * all-gather, the 32-byte header alone by the dense transport. */
static size_t sent_bytes(const dgc_nccl_call *k) {
    return dense(k) ? sizeof(dgc_wire_header) : (size_t)k->plan.bytes.payload;
}

/* Exchange memory of a flagged call: its header and every rank's, then,
 * by the dense transport, the spare (nranks elements: nranks floats hold
 * them in any type). The dense sum runs on the output itself: the step
 * fails everywhere, so what it holds does not matter, and its NaN comes
 * after. */
static size_t flagged_bytes(const dgc_nccl_call *k) {
    const size_t r = (size_t)k->c->nranks;
    return sent_bytes(k) * (1 + r) + (dense(k) ? sizeof(float) * r : 0);
}

static cudaError_t flagged_buffers(dgc_nccl_call *k) {
    cudaError_t e = exchange_alloc(k, flagged_bytes(k));
    if (e != cudaSuccess) return e;
    const size_t r = (size_t)k->c->nranks;
    const size_t one = sent_bytes(k);
    k->payload = k->xbuf;
    k->gathered = (char *)k->xbuf + one;
    /* Only the header is written, and only it is read, but the payload
     * travels whole: fresh pool memory may hold the application's data. */
    e = cudaMemsetAsync(k->payload, 0, one, k->stream);
    if (e != cudaSuccess || !dense(k)) return e;
    void *spare = (char *)k->gathered + one * r;
    k->vec = (dgc_gpu_dense_vector){
        .body = k->recv, .block = k->count / r, .spare = spare, .type = k->gpu_dtype};
    k->vec.rem = k->count - k->vec.block * r;
    return cudaMemsetAsync(spare, 0, sizeof(float) * r, k->stream);
}

/* No state: a flagged header from the call's own exchange memory; cause:
 * this rank's reason, for the statistics. */
static void take_part_flagged(dgc_nccl_call *k, dgc_fail_cause cause) {
    if (!k->payload || (dense(k) && !k->vec.body)) {
        cudaError_t e = flagged_buffers(k);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            DGC_ERROR("no device memory even for the %zu bytes of a flagged payload (%s): this call fails with "
                      "ncclSystemError without its exchange, and the other ranks may wait for this one",
                      flagged_bytes(k), cudaGetErrorString(e));
            k->part = DGC_NCCL_DEAD;
            k->rc = ncclSystemError;
            return;
        }
    }
    k->part = DGC_NCCL_FAILED;
    dgc_registry_count_failed(cause, 1);
    dgc_nccl_ext(k->c)->own_flagged++;
    if (dgc_gpu_flag_only(k->payload, DGC_WIRE_FAILED, &k->plan.p, k->stream)) {
        DGC_ERROR("a flagged payload could not be enqueued (%s): this call fails with ncclUnhandledCudaError "
                  "without its all-gather, and the other ranks may wait for this one",
                  dgc_gpu_last_error());
        k->part = DGC_NCCL_DEAD;
        k->rc = ncclUnhandledCudaError;
    }
}

static const char *lack_text(int lack) {
    switch (lack) {
    case DGC_NCCL_LACK_BUDGET: return "it would pass DGC_MAX_STATE_MB";
    case DGC_NCCL_LACK_DEVICE: return "no device memory";
    case DGC_NCCL_LACK_SETUP: return "the communicator's setup failed";
    default: return "no host memory";
    }
}

/* DGC_BUFFER_KEY=order: k's place in its communicator's step (core/order.h);
 * -1 while the step is learnt, when the call passes through (the real
 * ncclAllReduce, in its place): decided from the counts alone, alike on
 * every rank. */
static int order_place(dgc_nccl_call *k) {
    dgc_comm *c = k->c;
    k->order_at = dgc_registry_order_next(c, k->count);
    if (k->order_at >= 0) return 0;
    k->learning = 1;
    dgc_registry_order_say(c, k->order_at, k->count, "an NCCL communicator");
    return -1;
}

/* DGC_BUFFER_KEY=auto: by address until the communicator's buffers show
 * that they are made afresh (core/places.h: a comm hook's new tensor per
 * call, landing where another bucket's was), then by place in the step, as
 * under order. A rank's own choice among its states: the call is
 * compressed either way. */
static void auto_place(dgc_nccl_call *k) {
    int now = 0;
    k->order_at = dgc_registry_auto_place(k->c, k->count, dgc_nccl_key_send(k), dgc_nccl_key_place(k),
                                          dgc_nccl_key_elem(k), &now);
    if (now)
        DGC_INFO("an NCCL communicator's buffers are made afresh from step to step (one came where another of the "
                 "step had been: a comm hook that makes a new tensor per call, such as fp16_compress_hook): its "
                 "buffer states follow each call's place in the step from now on, as under DGC_BUFFER_KEY=order "
                 "(said once per communicator)");
}

/* The call's step, plan and state; k->part DGC_NCCL_STATE when this rank
 * holds one (compressed later), else DGC_NCCL_FAILED for now (the vote or
 * take_part_flagged settles it), or DGC_NCCL_PASS. */
static void plan(dgc_nccl_call *k, const dgc_config *cfg) {
    dgc_comm *c = k->c;
    /* The engine checks its launches with cudaGetLastError: a failure of an
     * earlier call of ours (already handled: an allocation refused) must not
     * read as this call's. Sticky errors stay whatever is done here. */
    (void)cudaGetLastError();
    k->b = NULL;
    k->lack = DGC_NCCL_LACK_NONE;
    k->payload = k->gathered = k->xbuf = NULL;
    k->vec = (dgc_gpu_dense_vector){0};
    k->plan.transport = DGC_TRANSPORT_SPARSE; /* until planned: flagged payloads are plain */
    k->xbuf_sync = 0;
    k->xrc = ncclSuccess;
    k->rc = ncclSuccess;
    if (dgc_nccl_ending(c)) { /* destroyed or aborted by another thread since the call was made */
        k->part = DGC_NCCL_DEAD;
        k->rc = ncclInternalError;
        return;
    }
    if (k->forward != DGC_NCCL_RUN) {
        k->part = DGC_NCCL_PASS;
        return;
    }
    dgc_nccl_chain_in(dgc_nccl_ext(c), k->stream);
    k->rc = news(c);
    if (k->placed ? k->learning : cfg->buffer_key == DGC_KEY_ORDER && order_place(k)) {
        k->part = DGC_NCCL_PASS;
        return;
    }
    if (!k->placed && cfg->buffer_key == DGC_KEY_AUTO) auto_place(k);
    uint64_t step = k->step;
    if (!k->step_given && dgc_registry_next_step(c, k->count, &step)) {
        if (!c->table_full_warned++)
            DGC_WARN("an NCCL communicator has all-reduced %d distinct counts: new counts pass through",
                     DGC_COUNTS_PER_COMM);
        k->part = DGC_NCCL_PASS;
        return;
    }
    dgc_config spare;
    const dgc_config *planning = dgc_nccl_planning_config(cfg, &spare);
    if (dgc_policy_plan(planning, k->count, dgc_gpu_sum_type_of(k->gpu_dtype), step, c->nranks, &k->plan)) {
        k->part = DGC_NCCL_PASS; /* too big for one payload */
        return;
    }
    DGC_DEBUG("step %llu, %llu elements, k %llu: %s transport (bytes a rank sends: sparse all-gather %llu, dense %llu)",
              (unsigned long long)step, (unsigned long long)k->count, (unsigned long long)k->plan.p.k,
              dense(k) ? "dense" : "sparse", (unsigned long long)k->plan.bytes.sparse, (unsigned long long)k->plan.bytes.dense);
    if (dgc_nccl_ext(c)->report) {
        k->b = dgc_nccl_state_get(k, cfg);
    } else {
        k->lack = DGC_NCCL_LACK_SETUP;
        k->footprint = 0;
    }
    k->part = k->b ? DGC_NCCL_STATE : DGC_NCCL_FAILED;
}

/* A count's first call: the ranks vote (a communicator of one rank
 * decides alone). */
static int first_call(const dgc_nccl_call *k) {
    return (k->part == DGC_NCCL_STATE || k->part == DGC_NCCL_FAILED) && k->plan.p.step == 0;
}
static int votes(const dgc_nccl_call *k) { return dgc_nccl_votes(k->part, k->plan.p.step, k->c->nranks); }

/* The ranks agreed to sum k's count densely: this rank's state goes, the
 * call is forwarded (in its place in the exchange), and every later call
 * of the count too (nccl/allreduce.c). */
static void go_dense(dgc_nccl_call *k, const unsigned char *v) {
    dgc_comm *c = k->c;
    dgc_registry_set_count_dense(c, k->count);
    dgc_nccl_state_drop(k);
    k->part = DGC_NCCL_PASS;
    k->forward = DGC_NCCL_FORWARD_DENSE;
    if (!c->budget_warned++) {
        char ranks[96] = "";
        size_t at = 0;
        for (int r = 0; r < c->nranks && at + 12 < sizeof ranks; r++)
            if (v[r]) at += (size_t)snprintf(ranks + at, sizeof ranks - at, "%s%d", at ? ", " : "", r);
        DGC_WARN("a %llu-element buffer is summed densely on every rank from its first call on (the real "
                 "ncclAllReduce: exact, counted in STATS as summed densely over budget): rank(s) %s%s could not hold "
                 "its state (over DGC_MAX_STATE_MB, or no device memory: their log says which)%s; said once per "
                 "communicator",
                 (unsigned long long)k->count, ranks, at + 12 >= sizeof ranks ? "..." : "",
                 k->lack ? ", this one among them" : "");
    }
    if (k->lack)
        DGC_INFO("this rank's state of the %llu-element buffer (%zu bytes): %s", (unsigned long long)k->count,
                 k->footprint, lack_text(k->lack));
}

/* The votes of the round's first calls (nccl/vote.c: one byte a rank, 1
 * for no state; one group when several). A vote that cannot be taken
 * fails the call here: the other ranks may wait for this one. */
static void vote(const dgc_nccl_api *api, dgc_nccl_call **v, int m) {
    static const unsigned char alone = 1;
    for (int i = 0; i < m; i++)
        if (first_call(v[i]) && v[i]->c->nranks == 1 && v[i]->part == DGC_NCCL_FAILED) go_dense(v[i], &alone);
    int n = 0;
    for (int i = 0; i < m; i++) n += votes(v[i]);
    if (!n) return;
    const int grouped = n > 1;
    ncclResult_t gs = grouped ? api->group_start() : ncclSuccess;
    for (int i = 0; i < m; i++) {
        dgc_nccl_call *k = v[i];
        if (!votes(k)) continue;
        dgc_device_switch(dgc_nccl_ext(k->c)->device);
        k->xrc = gs != ncclSuccess ? gs : dgc_nccl_vote_issue(api, k->c, k->comm, k->stream, k->b ? 0 : 1);
    }
    if (grouped && gs == ncclSuccess) {
        ncclResult_t ge = api->group_end();
        for (int i = 0; i < m; i++)
            if (votes(v[i]) && v[i]->xrc == ncclSuccess) v[i]->xrc = ge;
    }
    for (int i = 0; i < m; i++) {
        dgc_nccl_call *k = v[i];
        if (!votes(k)) continue;
        dgc_nccl_comm *x = dgc_nccl_ext(k->c);
        dgc_device_switch(x->device);
        const ncclResult_t rc = dgc_nccl_vote_collect(api, k->c, k->comm, k->stream, k->xrc);
        k->xrc = ncclSuccess;
        if (rc != ncclSuccess) {
            DGC_ERROR("the ranks' vote on holding a %llu-element buffer's state failed (%s): this call fails here, "
                      "and the other ranks may wait for this one",
                      (unsigned long long)k->count, rc == ncclUnhandledCudaError ? "a CUDA copy" : "NCCL's all-gather");
            dgc_nccl_state_drop(k);
            k->part = DGC_NCCL_DEAD;
            k->rc = rc;
            continue;
        }
        if (dgc_nccl_vote_dense(x->votes_host, k->c->nranks)) go_dense(k, x->votes_host);
    }
}

/* The buffer is not aligned to its elements (the compression refuses it). */
static int misaligned(const dgc_nccl_call *k) {
    const uintptr_t e = (uintptr_t)dgc_gpu_dtype_size(k->gpu_dtype);
    return (uintptr_t)k->send % e != 0 || (uintptr_t)k->recv % e != 0;
}

/* Enqueues the compression of a call with state; without one (after its
 * count's first call), a flagged payload. */
static void compress(dgc_nccl_call *k, const dgc_config *cfg) {
    (void)cfg;
    if (k->part == DGC_NCCL_FAILED) {
        DGC_ERROR("no state for a %llu-element buffer (%zu bytes: %s) after its count's first call (it moved, or "
                  "memory ran short since): this call fails on every rank (output NaN, ncclSystemError later)",
                  (unsigned long long)k->count, k->footprint, lack_text(k->lack));
        take_part_flagged(k, DGC_FAIL_MEMORY);
        return;
    }
    if (k->part != DGC_NCCL_STATE) return;
    char err[256] = "";
    dgc_gpu_state *s = k->b->gpu;
    /* The all-gather's payloads travel compact; the dense transport's
     * headers are the plain payload's. */
    k->payload = dense(k) ? dgc_gpu_payload(s) : dgc_gpu_wire(s);
    k->gathered = dense(k) ? dgc_gpu_gathered(s) : dgc_gpu_wire_gathered(s);
    if (dense(k) && dgc_gpu_dense_view(s, k->recv, k->gpu_dtype, &k->vec))
        snprintf(err, sizeof err, "the state has no room for the dense transport (a bug)");
    else if (dgc_gpu_compress(s, k->send, k->recv, k->gpu_dtype, &k->plan.p, k->stream, err, sizeof err) == 0 &&
             (dense(k) ? dgc_gpu_dense_scatter(s, k->recv, k->gpu_dtype, &k->plan.p, k->stream, err, sizeof err)
                       : dgc_gpu_encode(s, &k->plan.p, k->stream, err, sizeof err)) == 0)
        return;
    DGC_ERROR("the compression of a %llu-element buffer could not be enqueued (%s): the call takes part "
              "flagged as failed",
              (unsigned long long)k->count, err);
    take_part_flagged(k, misaligned(k) ? DGC_FAIL_MISALIGNED : DGC_FAIL_ENGINE); /* into the state's own buffers */
}

/* The collectives a call issues in an exchange phase: 0, the payloads'
 * all-gather (or the pass-through all-reduce), or the headers' all-gather
 * and the dense sum's reduce-scatters (blocks, spare); 1, the dense sum's
 * all-gathers. All from collective inputs: the same on every rank. */
static int collectives(const dgc_nccl_call *k, int phase) {
    return dgc_nccl_collectives(k->part, dense(k), k->vec.block, k->vec.rem, phase);
}

static void note(dgc_nccl_call *k, ncclResult_t rc) {
    if (k->xrc == ncclSuccess) k->xrc = rc;
}

static ncclDataType_t nccl_type_of(dgc_gpu_dtype t) {
    return t == DGC_GPU_F16 ? ncclFloat16 : t == DGC_GPU_BF16 ? ncclBfloat16 : ncclFloat32;
}

/* The dense sum in place (DESIGN.md "Bytes"), in the buffer's type: each
 * rank's block reduced on that rank (ncclReduceScatter's in-place form: its
 * output at rank * block of the input), then copied to all
 * (ncclAllGather's: its input there). */
static void dense_sum(const dgc_nccl_api *api, dgc_nccl_call *k, int phase) {
    const size_t rank = (size_t)dgc_nccl_ext(k->c)->rank;
    const dgc_gpu_dense_vector *v = &k->vec;
    const size_t e = dgc_gpu_dtype_size(v->type);
    const ncclDataType_t t = nccl_type_of(v->type);
    char *mine = (char *)v->body + rank * v->block * e, *spare = (char *)v->spare + rank * e;
    if (phase == 0) {
        if (v->block) note(k, api->reduce_scatter(v->body, mine, v->block, t, ncclSum, k->comm, k->stream));
        if (v->rem) note(k, api->reduce_scatter(v->spare, spare, 1, t, ncclSum, k->comm, k->stream));
    } else {
        if (v->block) note(k, api->all_gather(mine, v->body, v->block, t, k->comm, k->stream));
        if (v->rem) note(k, api->all_gather(spare, v->spare, 1, t, k->comm, k->stream));
    }
}

static void exchange(const dgc_nccl_api *api, dgc_nccl_call *k, int phase) {
    if (!collectives(k, phase)) return;
    if (k->part == DGC_NCCL_PASS) {
        note(k, api->all_reduce(k->send, k->recv, k->count, k->dtype, k->op, k->comm, k->stream));
        return;
    }
    /* The payloads, or by the dense transport their headers, then its sum. */
    if (phase == 0) note(k, api->all_gather(k->payload, k->gathered, sent_bytes(k), ncclUint8, k->comm, k->stream));
    if (dense(k)) dense_sum(api, k, phase);
}

/* The exchange did not go through: nothing is decoded, nothing committed.
 * The step stays taken: this rank cannot know whether the others failed
 * too, and a step given back on some ranks only would make their later k,
 * payload sizes and headers differ (invariant 1). NCCL's own log says why.
 * A dense-transport call that fails in its first phase issues nothing of
 * its second: ranks whose first phase went through may wait in its
 * all-gathers (an NCCL failure is the communicator's, as a rule). */
static void exchange_failed(dgc_nccl_call *k, ncclResult_t rc) {
    if (k->part != DGC_NCCL_PASS)
        DGC_ERROR("the real NCCL exchange of a compressed call failed (ncclResult_t %d): nothing was decoded or "
                  "committed%s",
                  (int)rc, dense(k) ? " (the other ranks may wait in its dense sum)" : "");
    k->part = DGC_NCCL_DEAD;
    k->rc = rc;
}

/* engine_seconds stays 0 on the GPU path: timing the kernels would take a
 * host wait (or events read later), which steady state does not have. */
static void count_call(dgc_nccl_call *k) {
    dgc_buffer_stats *s = &k->b->stats;
    /* What this rank sent to each other rank: its payload, or by the dense
     * transport its total over N-1 (as the MPI path counts it). */
    const uint64_t others = (uint64_t)k->c->nranks - 1;
    size_t wire = !dense(k) ? sent_bytes(k) : others ? (size_t)((k->plan.bytes.dense + others - 1) / others) : 0;
    s->calls++;
    s->dense_transport += dense(k);
    s->dense_bytes += (uint64_t)k->count * dgc_nccl_key_elem(k); /* the caller's (a 16-bit shard runs in fp32) */
    s->wire_bytes += wire;
    s->last_wire_bytes = wire;
    s->nonfinite = dgc_gpu_state_nonfinite(k->b->gpu); /* as far as the device has got: no wait */
    s->last_k = k->plan.p.k;
    s->last_transport = dense(k) ? DGC_TRANSPORT_DENSE : DGC_TRANSPORT_SPARSE;
    dgc_stats_file_tick();
}

dgc_pass_reason dgc_nccl_pass_reason(const dgc_nccl_call *k, const dgc_config *cfg) {
    dgc_gpu_dtype t;
    if (k->learning) return DGC_PASS_ORDER;
    if (!cfg->enable) return DGC_PASS_DISABLED;
    if (k->op != ncclSum && k->op != ncclAvg) return DGC_PASS_OP;
    if (dgc_nccl_gpu_dtype(k->dtype, &t)) return DGC_PASS_TYPE;
    if (k->count < cfg->min_elements) return DGC_PASS_SMALL;
    if (k->c && (uint64_t)k->c->nranks < cfg->min_ranks) return DGC_PASS_RANKS;
    if (k->count > DGC_MAX_ELEMENTS) return DGC_PASS_LARGE;
    return DGC_PASS_OTHER;
}

static void finish(dgc_nccl_call *k, const dgc_config *cfg) {
    dgc_gpu_report *report = dgc_nccl_ext(k->c)->report;
    char err[256] = "";
    int failed = 0;
    switch (k->part) {
    case DGC_NCCL_PASS:
        dgc_registry_tally_add(DGC_TALLY_NCCL_PASSED);
        if (k->forward == DGC_NCCL_FORWARD_DENSE) dgc_registry_count_over_budget();
        else if (dgc_config_counts(cfg))
            dgc_registry_count_passthrough((uint64_t)k->count * dgc_nccl_type_size(k->dtype),
                                           dgc_nccl_pass_reason(k, cfg));
        break;
    case DGC_NCCL_STATE:
        failed = (dense(k) ? dgc_gpu_decode_dense : dgc_gpu_decode)(k->b->gpu, k->recv, k->gpu_dtype, &k->plan.p,
                                                                    cfg->compensate, k->op == ncclAvg, report,
                                                                    k->stream, err, sizeof err) != 0;
        count_call(k);
        dgc_registry_tally_add(DGC_TALLY_NCCL_COMPRESSED);
        break;
    case DGC_NCCL_FAILED:
        failed = dgc_gpu_decode_stateless(k->gathered, sent_bytes(k), k->recv, k->gpu_dtype, &k->plan.p, report,
                                          k->stream) != 0;
        if (failed) snprintf(err, sizeof err, "%s", dgc_gpu_last_error());
        dgc_registry_tally_add(DGC_TALLY_NCCL_COMPRESSED);
        break;
    default: break;
    }
    if (failed) {
        DGC_ERROR("the decode of a %llu-element buffer could not be enqueued (%s): ncclUnhandledCudaError",
                  (unsigned long long)k->count, err);
        if (k->rc == ncclSuccess) k->rc = ncclUnhandledCudaError;
    }
    if (k->forward == DGC_NCCL_RUN) dgc_nccl_chain_out(dgc_nccl_ext(k->c), k->stream); /* its last work */
    release(k);
}

/* One phase of the round's exchanges: one collective alone needs no group;
 * several share one, which is also what lets one thread drive several
 * devices' ranks. Each call's outcome is settled (non-blocking
 * communicators) before the next phase issues anything on it. */
static void exchange_phase(const dgc_nccl_api *api, dgc_nccl_call **v, int m, int phase) {
    int issued = 0;
    for (int i = 0; i < m; i++) issued += collectives(v[i], phase);
    if (!issued) return;
    const int grouped = issued > 1;
    ncclResult_t gs = grouped ? api->group_start() : ncclSuccess;
    for (int i = 0; i < m; i++) {
        if (!collectives(v[i], phase)) continue;
        if (gs != ncclSuccess || dgc_nccl_ending(v[i]->c)) {
            exchange_failed(v[i], gs != ncclSuccess ? gs : ncclInternalError);
            continue;
        }
        dgc_device_switch(dgc_nccl_ext(v[i]->c)->device);
        exchange(api, v[i], phase);
    }
    if (grouped && gs == ncclSuccess) {
        ncclResult_t ge = api->group_end(); /* group members return ncclSuccess; this says how they went */
        for (int i = 0; i < m; i++)
            if (collectives(v[i], phase) && v[i]->xrc == ncclSuccess) v[i]->xrc = ge;
    }
    for (int i = 0; i < m; i++) {
        if (!collectives(v[i], phase)) continue;
        ncclResult_t rc = dgc_nccl_settle(api, v[i]->c, v[i]->comm, v[i]->xrc);
        v[i]->xrc = ncclSuccess;
        if (rc != ncclSuccess) exchange_failed(v[i], rc);
    }
}

/* A device the runtime cannot switch to: the call fails here alone. */
static void unreachable(dgc_nccl_call *k) {
    k->b = NULL;
    k->xbuf = NULL;
    k->xbuf_sync = 0;
    k->part = DGC_NCCL_DEAD;
    k->rc = ncclUnhandledCudaError;
}

/* A call in node layout (nccl/node.c): the node's sum, its shard as a
 * flat call among the cross child's ranks, the node's spread. */
static void run_node(const dgc_nccl_api *api, dgc_nccl_call *k, const dgc_config *cfg) {
    dgc_nccl_call sub;
    if (dgc_nccl_node_begin(api, k, &sub)) return;
    const ncclResult_t rc = dgc_nccl_run(api, &sub, 1, cfg);
    dgc_nccl_node_end(api, k, &sub, rc);
}

/* A node layout's call is keyed on its own communicator, by the whole
 * call, as the MPI path keys it (DGC_BUFFER_KEY=order and auto); its shard
 * then takes that place on the cross record. 0 when it passes whole while
 * the step is learnt (run with the flat calls, as the MPI path passes it). */
static int node_placed(dgc_nccl_call *k, const dgc_config *cfg) {
    k->placed = 1;
    if (cfg->buffer_key == DGC_KEY_ORDER && order_place(k)) return 0;
    if (cfg->buffer_key == DGC_KEY_AUTO) auto_place(k);
    return 1;
}

/* One round: at most one call per communicator. Calls in node layout run
 * whole first (nccl/node.c: their collectives go on their communicator's
 * children); the flat ones after them, phase by phase. */
static void run_round(const dgc_nccl_api *api, dgc_nccl_call **v, int m, const dgc_config *cfg) {
    int flat = 0;
    for (int i = 0; i < m; i++) {
        if (!dgc_nccl_node_eligible(v[i]) || !node_placed(v[i], cfg)) v[flat++] = v[i];
        else if (dgc_device_switch(dgc_nccl_ext(v[i]->c)->device) == 0) run_node(api, v[i], cfg);
        else unreachable(v[i]);
    }
    m = flat;
    for (int i = 0; i < m; i++) {
        if (dgc_device_switch(dgc_nccl_ext(v[i]->c)->device) == 0) plan(v[i], cfg);
        else unreachable(v[i]);
    }
    vote(api, v, m);
    for (int i = 0; i < m; i++)
        if (v[i]->part != DGC_NCCL_DEAD && dgc_device_switch(dgc_nccl_ext(v[i]->c)->device) == 0) compress(v[i], cfg);
    for (int phase = 0; phase < 2; phase++) exchange_phase(api, v, m, phase);
    for (int i = 0; i < m; i++) {
        if (dgc_device_switch(dgc_nccl_ext(v[i]->c)->device) == 0) finish(v[i], cfg);
        else release(v[i]);
    }
}

ncclResult_t dgc_nccl_run(const dgc_nccl_api *api, dgc_nccl_call *k, int n, const dgc_config *cfg) {
    /* Round r: the r-th call of each communicator, in the order made. */
    dgc_nccl_call **v = malloc((size_t)n * sizeof *v);
    const void **comms = calloc((size_t)n, sizeof *comms);
    int *round = malloc((size_t)n * sizeof *round);
    if (!v || !comms || !round) {
        free(v);
        free(comms);
        free(round);
        DGC_ERROR("no host memory to run %d held-back call(s): they fail here, and the other ranks may wait", n);
        for (int i = 0; i < n; i++) k[i].rc = ncclSystemError;
        return ncclSystemError;
    }
    for (int i = 0; i < n; i++) comms[i] = k[i].comm;
    const int rounds = dgc_nccl_rounds(comms, n, round);
    for (int r = 0; r < rounds; r++) {
        int m = 0;
        for (int i = 0; i < n; i++)
            if (round[i] == r) v[m++] = &k[i];
        run_round(api, v, m, cfg);
    }
    ncclResult_t first = ncclSuccess;
    for (int i = 0; i < n && first == ncclSuccess; i++) first = k[i].rc;
    free(v);
    free(comms);
    free(round);
    return first;
}
