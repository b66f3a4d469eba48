/* One call in node layout on the NCCL path: the MPI path's node_call
 * (shim/mpi/allreduce.c) in stream order, over the communicator's node and
 * cross children (nccl/children.c).
 *
 *   sum      the pieces of this rank's shard (dgc_policy_shard: uneven
 *            when L does not divide n) from every local rank, in the
 *            buffer's type, by grouped ncclSend/ncclRecv on the node child
 *            (NCCL's reduce-scatter would need equal shards and sums in its
 *            own order), added in local-rank order in fp32 on the device
 *            (dgc_gpu_node_sum): straight into the shard's place in the
 *            output for an fp32 buffer, into the node's scratch for a
 *            16-bit one
 *   nonfinite whether some shard of the node is not finite: its flag
 *            all-reduced (max) over the node, and then every shard of the
 *            node starts with NaN, so that every cross exchange, and every
 *            rank, skips the step whole, as a flat call does
 *   shard    a flat fp32 call on the cross record for the shard, in place
 *            on that sum: its state (keyed by the shard's place in the
 *            caller's buffer), plan, vote, compression, exchange over the
 *            cross child among the M ranks of this local rank, and decode,
 *            exactly as a flat call among M ranks (nccl/call.c)
 *   agree    whether some shard's call failed across nodes (a bad payload,
 *            a rank without state, the exchange itself), all-reduced over
 *            the node: if one did, the whole call fails on every rank, as
 *            on the MPI path (every shard NaN; a rank whose own shard went
 *            through learns of it from its report at its next call)
 *   finish   the shard into the output (dgc_gpu_node_finish): divided by N
 *            for ncclAvg, rounded once for a 16-bit buffer, as the flat
 *            path's decode divides and rounds
 *   spread   each local rank's shard broadcast over the node, in place, in
 *            the buffer's type
 *
 * The steps are the MPI path's (core/shards.h): every shard's count takes a
 * step on the cross record, in shard order, so that the two paths give the
 * same bits (gpu.nccl.ddp_shape_node; a 16-bit buffer's output is the fp32
 * MPI path's rounded once, gpu.nccl.ddp_shape_node_bf16). Every part is
 * issued by every rank of the node whatever the shard's own outcome
 * (passed, compressed, dense, failed), so no node collective is left
 * unmatched. */
#include "core/log.h"
#include "core/shards.h"
#include "internal.h"

/* The node's scratch: the flags (the non-finite one at 0, the outcome's
 * words at WORDS_AT), the L pieces of this rank's shard in the buffer's
 * type, and for a 16-bit buffer the shard's fp32 sum. */
#define FLAG_BYTES 256
#define WORDS_AT 64

static size_t pieces_bytes(uint64_t len, int L, size_t elem) {
    return ((size_t)len * (size_t)L * elem + 255) / 256 * 256; /* the fp32 sum after them stays aligned */
}

/* One call's shard: where its parts go in the scratch and the output. */
typedef struct {
    uint64_t lo, len; /* this rank's shard */
    size_t elem;      /* the buffer's bytes per element */
    int wide;         /* a 16-bit buffer: the shard is summed and compressed in fp32, in the scratch */
    unsigned int *flag;
    uint64_t *words;  /* the shard's outcome (dgc_gpu_node_watch) */
    void *pieces;
    float *sum;       /* the node's sum of the shard, where the shard's call runs in place */
} shard_view;

int dgc_nccl_node_eligible(const dgc_nccl_call *k) {
    if (!k->c) return 0;
    const dgc_nccl_comm *x = dgc_nccl_ext(k->c);
    return x->cross_comm && k->forward == DGC_NCCL_RUN && (k->op == ncclSum || k->op == ncclAvg) &&
           dgc_policy_node_call(&x->layout, k->count);
}

static size_t scratch_need(const dgc_nccl_comm *x, const shard_view *v) {
    return FLAG_BYTES + pieces_bytes(v->len, x->layout.node_size, v->elem) + (v->wide ? v->len * sizeof(float) : 0);
}

/* Room for the flag, the pieces and the wide sum, kept from call to call
 * (grown, in stream order); 0 or -1. */
static int reserve(dgc_nccl_comm *x, const shard_view *v, cudaStream_t st) {
    const size_t need = scratch_need(x, v);
    if (need <= x->node_scratch_bytes) return 0;
    dgc_nccl_dev_free(x->node_scratch, x->node_scratch_pooled, st);
    x->node_scratch = NULL;
    x->node_scratch_bytes = 0;
    if (dgc_nccl_dev_alloc(&x->node_scratch, need, st, &x->node_scratch_pooled) != cudaSuccess) {
        (void)cudaGetLastError();
        x->node_scratch = NULL;
        return -1;
    }
    x->node_scratch_bytes = need;
    return 0;
}

/* The view of k's shard (its pointers into the scratch once reserved). */
static void view_of(const dgc_nccl_call *k, const dgc_nccl_comm *x, shard_view *v) {
    uint64_t hi;
    dgc_policy_shard(k->count, x->layout.node_size, x->layout.local, &v->lo, &hi);
    v->len = hi - v->lo;
    v->elem = dgc_gpu_dtype_size(k->gpu_dtype);
    v->wide = k->gpu_dtype != DGC_GPU_F32;
    char *base = x->node_scratch;
    v->flag = (unsigned int *)base;
    v->words = base ? (uint64_t *)(base + WORDS_AT) : NULL;
    v->pieces = base ? base + FLAG_BYTES : NULL;
    v->sum = !v->wide ? (float *)k->recv + v->lo
             : base  ? (float *)(base + FLAG_BYTES + pieces_bytes(v->len, x->layout.node_size, v->elem))
                     : NULL;
}

static ncclResult_t first_error(ncclResult_t a, ncclResult_t b) { return a != ncclSuccess ? a : b; }

/* sum: the pieces in, the node's sum of this rank's shard into v->sum. */
static ncclResult_t node_sum(const dgc_nccl_api *api, dgc_nccl_call *k, dgc_nccl_comm *x, const shard_view *v) {
    const dgc_layout *lay = &x->layout;
    const char *g = k->send;
    char *pieces = v->pieces;
    cudaError_t e = cudaMemsetAsync(v->flag, 0, sizeof *v->flag, k->stream);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(pieces + (size_t)lay->local * v->len * v->elem, g + v->lo * v->elem, v->len * v->elem,
                            cudaMemcpyDeviceToDevice, k->stream);
    if (e != cudaSuccess) return ncclUnhandledCudaError;
    ncclResult_t rc = api->group_start();
    for (int l = 0; l < lay->node_size && rc == ncclSuccess; l++) {
        if (l == lay->local) continue;
        uint64_t lo_l, hi_l;
        dgc_policy_shard(k->count, lay->node_size, l, &lo_l, &hi_l);
        rc = first_error(api->send(g + lo_l * v->elem, hi_l - lo_l, k->dtype, l, x->node_comm, k->stream),
                         api->recv(pieces + (size_t)l * v->len * v->elem, v->len, k->dtype, l, x->node_comm,
                                   k->stream));
    }
    rc = first_error(rc, api->group_end());
    rc = dgc_nccl_settle(api, k->c, x->node_comm, rc);
    if (rc != ncclSuccess) return rc;
    char err[256] = "";
    if (dgc_gpu_node_sum(pieces, k->gpu_dtype, lay->node_size, v->len, v->sum, v->flag, k->stream, err, sizeof err)) {
        DGC_ERROR("the node's sum could not be enqueued (%s)", err);
        return ncclUnhandledCudaError;
    }
    rc = dgc_nccl_settle(api, k->c, x->node_comm,
                         api->all_reduce(v->flag, v->flag, 1, ncclUint32, ncclMax, x->node_comm, k->stream));
    if (rc == ncclSuccess && dgc_gpu_node_poison(v->sum, v->flag, k->stream, err, sizeof err)) {
        DGC_ERROR("the node's non-finite mark could not be enqueued (%s)", err);
        rc = ncclUnhandledCudaError;
    }
    return rc;
}

/* The shard's decoded fp32 sum into its place in the output: averaged over
 * the whole communicator for ncclAvg (the shard's call summed), in the
 * buffer's type. */
static ncclResult_t finish(dgc_nccl_call *k, const dgc_nccl_comm *x, const shard_view *v) {
    char err[256] = "";
    const int divisor = k->op == ncclAvg ? x->nranks : 1;
    if (dgc_gpu_node_finish(v->sum, (char *)k->recv + v->lo * v->elem, k->gpu_dtype, v->len, divisor, k->stream, err,
                            sizeof err) == 0)
        return ncclSuccess;
    DGC_ERROR("the node's shard could not be finished into the output (%s)", err);
    return ncclUnhandledCudaError;
}

/* spread: every local rank's shard of the output to the node, in place. */
static ncclResult_t spread(const dgc_nccl_api *api, dgc_nccl_call *k, dgc_nccl_comm *x, const shard_view *v) {
    const dgc_layout *lay = &x->layout;
    char *out = k->recv;
    ncclResult_t rc = api->group_start();
    for (int l = 0; l < lay->node_size && rc == ncclSuccess; l++) {
        uint64_t lo, hi;
        dgc_policy_shard(k->count, lay->node_size, l, &lo, &hi);
        rc = api->broadcast(out + lo * v->elem, out + lo * v->elem, hi - lo, k->dtype, l, x->node_comm, k->stream);
    }
    rc = first_error(rc, api->group_end());
    return dgc_nccl_settle(api, k->c, x->node_comm, rc);
}

/* agree: whether some shard of the node failed across nodes (a bad
 * payload, a rank without state, the exchange itself); if one did, the
 * whole call fails on every rank of the node, as on the MPI path: its
 * shards NaN, and a rank whose own shard went through learns of it from
 * its report (news at its next call, nccl/call.c). */
static ncclResult_t agree(const dgc_nccl_api *api, dgc_nccl_call *k, dgc_nccl_comm *x, const dgc_nccl_call *sub,
                          const shard_view *v) {
    dgc_gpu_report *report = dgc_nccl_ext(sub->c)->report;
    const int host_failed = sub->part == DGC_NCCL_FAILED || sub->part == DGC_NCCL_DEAD;
    char err[256] = "";
    if (dgc_gpu_node_judge(report, v->words, host_failed, k->stream, err, sizeof err))
        DGC_ERROR("%s: the node's verdict on this shard is stale", err); /* the all-reduce is issued all the same */
    ncclResult_t rc = dgc_nccl_settle(
        api, k->c, x->node_comm, api->all_reduce(v->words + 2, v->words + 3, 1, ncclUint64, ncclMax, x->node_comm,
                                                 k->stream));
    if (rc == ncclSuccess && dgc_gpu_node_fail(v->sum, v->len, v->words, report, k->stream, err, sizeof err)) {
        DGC_ERROR("the node's failure mark could not be enqueued (%s)", err);
        rc = ncclUnhandledCudaError;
    }
    return rc;
}

int dgc_nccl_node_begin(const dgc_nccl_api *api, dgc_nccl_call *k, dgc_nccl_call *sub) {
    dgc_nccl_comm *x = dgc_nccl_ext(k->c);
    const dgc_layout *lay = &x->layout;
    const ncclComm_t cross = x->cross_comm; /* NULL once another thread ends the children */
    dgc_comm *cc = cross ? dgc_registry_comm_hold(cross) : NULL; /* held until node_end (NULL: unbound, ending) */
    k->rc = ncclSuccess;
    if (!cc || dgc_nccl_ending(k->c)) { /* the parent is ending: nothing more is issued on its children */
        dgc_registry_comm_drop(cc);
        k->rc = ncclInternalError;
        return -1;
    }
    /* Every shard's step now, whatever follows: a failure keeps them taken,
     * as the flat path keeps its step (nccl/call.c's exchange_failed). A
     * full table: the shard's call finds it full too, and passes. */
    uint64_t step = 0;
    const int stepped = dgc_shard_steps_take(cc, k->count, lay, &step) == 0;
    shard_view v;
    view_of(k, x, &v);
    dgc_nccl_chain_in(x, k->stream);
    if (reserve(x, &v, k->stream)) {
        DGC_ERROR("no device memory for the node's %zu bytes of scratch: this call fails with ncclSystemError here, "
                  "and the other ranks of its node may wait for this one",
                  scratch_need(x, &v));
        k->rc = ncclSystemError;
    }
    view_of(k, x, &v); /* in the scratch as reserved */
    if (k->rc == ncclSuccess) k->rc = node_sum(api, k, x, &v);
    if (k->rc == ncclSuccess && dgc_nccl_ending(k->c)) k->rc = ncclInternalError;
    if (k->rc != ncclSuccess) {
        DGC_ERROR("the node's sum of a %llu-element call failed (ncclResult_t %d)", (unsigned long long)k->count,
                  (int)k->rc);
        dgc_nccl_chain_out(x, k->stream);
        dgc_registry_comm_drop(cc);
        return -1;
    }
    char err[256] = "";
    if (dgc_gpu_node_watch(dgc_nccl_ext(cc)->report, v.words, k->stream, err, sizeof err))
        DGC_ERROR("%s: the node may not learn of this shard's failure", err);
    *sub = (dgc_nccl_call){.send = v.sum, .recv = v.sum, .count = v.len, .dtype = ncclFloat32, .op = ncclSum,
                           .comm = cross, .stream = k->stream, .c = cc, .gpu_dtype = DGC_GPU_F32,
                           .forward = dgc_registry_count_dense(cc, v.len) ? DGC_NCCL_FORWARD_DENSE : DGC_NCCL_RUN,
                           .order_at = k->order_at, .placed = 1, .state_at = (char *)k->recv + v.lo * v.elem,
                           .state_elem = v.elem,
                           .step_given = stepped, .step = step};
    return 0;
}

void dgc_nccl_node_end(const dgc_nccl_api *api, dgc_nccl_call *k, dgc_nccl_call *sub, ncclResult_t shard_rc) {
    dgc_nccl_comm *x = dgc_nccl_ext(k->c);
    const dgc_layout *lay = &x->layout;
    shard_view v;
    view_of(k, x, &v);
    if (sub->part == DGC_NCCL_STATE && sub->b) /* the shard's plan is the MPI path's dgc_policy_plan_node's */
        dgc_stats_node_call(&sub->b->stats, (uint64_t)lay->node_size * dgc_policy_cross_bytes(&sub->plan),
                            lay->nodes, lay->node_size);
    /* Whatever the shard's outcome: every rank of the node issues these. */
    ncclResult_t rc = dgc_nccl_ending(k->c) ? ncclInternalError : agree(api, k, x, sub, &v);
    rc = first_error(rc, finish(k, x, &v));
    rc = first_error(dgc_nccl_ending(k->c) ? ncclInternalError : spread(api, k, x, &v), rc);
    k->rc = first_error(shard_rc, rc);
    if (k->rc != ncclSuccess)
        DGC_ERROR("a %llu-element call in node layout failed (ncclResult_t %d)", (unsigned long long)k->count,
                  (int)k->rc);
    dgc_nccl_chain_out(x, k->stream);
    dgc_registry_comm_drop(sub->c);
}
