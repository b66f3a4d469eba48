/* One call in node layout on the NCCL path: the MPI path's node_call
 * (shim/mpi/allreduce.c) in stream order, over the communicator's node and
 * cross children (nccl/children.c).
 *
 *   sum      the pieces of this rank's shard (dgc_policy_shard: uneven
 *            when L does not divide n) from every local rank, by grouped
 *            ncclSend/ncclRecv on the node child (NCCL's reduce-scatter
 *            would need equal shards and sums in its own order), added in
 *            local-rank order on the device (dgc_gpu_node_sum) straight
 *            into the shard's place in the output
 *   agree    whether some shard of the node is not finite: its flag
 *            all-reduced (max) over the node, and then every shard of the
 *            node starts with NaN, so that every cross exchange, and every
 *            rank, skips the step whole, as a flat call does
 *   shard    a flat call on the cross record for the shard, in place: its
 *            state, plan, vote, compression, exchange over the cross child
 *            among the M ranks of this local rank, and decode, exactly as
 *            a flat call among M ranks (nccl/call.c)
 *   spread   each local rank's decoded shard broadcast over the node, in
 *            place
 *
 * The steps are the MPI path's: every shard's count takes a step on the
 * cross record, in shard order, so that the two paths give the same bits
 * (gpu.nccl.ddp_shape_node). Every part is issued by every rank of the
 * node whatever the shard's own outcome (passed, compressed, dense, failed),
 * so no node collective is left unmatched.
 *
 * Not yet: 16-bit buffers and ncclAvg stay flat (the node sum is fp32, and
 * an average needs the whole communicator's size); a shard whose exchange
 * failed fails that shard's part of the output only (the MPI path fails the
 * whole call on every rank). */
#include "core/log.h"
#include "internal.h"

/* The node's scratch: the flag, then the L pieces of this rank's shard. */
#define FLAG_BYTES 256

int dgc_nccl_node_eligible(const dgc_nccl_call *k) {
    if (!k->c) return 0;
    const dgc_nccl_comm *x = dgc_nccl_ext(k->c);
    return x->cross_id && k->forward == DGC_NCCL_RUN && k->gpu_dtype == DGC_GPU_F32 && k->op == ncclSum &&
           dgc_policy_node_call(&x->layout, k->count);
}

/* Room for the flag and L pieces of len floats, kept from call to call
 * (grown, in stream order); 0 or -1. */
static int reserve(dgc_nccl_comm *x, uint64_t len, cudaStream_t st) {
    const size_t need = FLAG_BYTES + (size_t)len * (size_t)x->layout.node_size * sizeof(float);
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

/* Steps of the shards before (from 0 to upto - 1) or after this rank's,
 * on the cross record, as the MPI path takes them (shard_steps). */
static void shard_steps(dgc_comm *cc, uint64_t n, const dgc_layout *lay, int from, int upto) {
    for (int l = from; l < upto; l++) {
        uint64_t lo, hi, step;
        dgc_policy_shard(n, lay->node_size, l, &lo, &hi);
        (void)dgc_registry_next_step(cc, hi - lo, &step); /* a full table: alike on every rank of cc */
    }
}

static ncclResult_t first_error(ncclResult_t a, ncclResult_t b) { return a != ncclSuccess ? a : b; }

/* sum: the pieces in, the node's sum of this rank's shard into out. */
static ncclResult_t node_sum(const dgc_nccl_api *api, dgc_nccl_call *k, dgc_nccl_comm *x, uint64_t lo, uint64_t len) {
    const dgc_layout *lay = &x->layout;
    const float *g = k->send;
    float *out = (float *)k->recv + lo;
    float *pieces = (float *)((char *)x->node_scratch + FLAG_BYTES);
    unsigned int *flag = x->node_scratch;
    cudaError_t e = cudaMemsetAsync(flag, 0, sizeof *flag, k->stream);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(pieces + (size_t)lay->local * len, g + lo, len * sizeof(float),
                            cudaMemcpyDeviceToDevice, k->stream);
    if (e != cudaSuccess) return ncclUnhandledCudaError;
    ncclResult_t rc = api->group_start();
    for (int l = 0; l < lay->node_size && rc == ncclSuccess; l++) {
        if (l == lay->local) continue;
        uint64_t lo_l, hi_l;
        dgc_policy_shard(k->count, lay->node_size, l, &lo_l, &hi_l);
        rc = first_error(api->send(g + lo_l, hi_l - lo_l, ncclFloat32, l, x->node_comm, k->stream),
                         api->recv(pieces + (size_t)l * len, len, ncclFloat32, l, x->node_comm, k->stream));
    }
    rc = first_error(rc, api->group_end());
    rc = dgc_nccl_settle(api, k->c, x->node_comm, rc);
    if (rc != ncclSuccess) return rc;
    char err[256] = "";
    if (dgc_gpu_node_sum(pieces, DGC_GPU_F32, lay->node_size, len, out, flag, k->stream, err, sizeof err)) {
        DGC_ERROR("the node's sum could not be enqueued (%s)", err);
        return ncclUnhandledCudaError;
    }
    rc = dgc_nccl_settle(api, k->c, x->node_comm,
                         api->all_reduce(flag, flag, 1, ncclUint32, ncclMax, x->node_comm, k->stream));
    if (rc == ncclSuccess && dgc_gpu_node_poison(out, flag, k->stream, err, sizeof err)) {
        DGC_ERROR("the node's non-finite mark could not be enqueued (%s)", err);
        rc = ncclUnhandledCudaError;
    }
    return rc;
}

/* spread: every local rank's shard of the output to the node, in place. */
static ncclResult_t spread(const dgc_nccl_api *api, dgc_nccl_call *k, dgc_nccl_comm *x) {
    const dgc_layout *lay = &x->layout;
    float *out = k->recv;
    ncclResult_t rc = api->group_start();
    for (int l = 0; l < lay->node_size && rc == ncclSuccess; l++) {
        uint64_t lo, hi;
        dgc_policy_shard(k->count, lay->node_size, l, &lo, &hi);
        rc = api->broadcast(out + lo, out + lo, hi - lo, ncclFloat32, l, x->node_comm, k->stream);
    }
    rc = first_error(rc, api->group_end());
    return dgc_nccl_settle(api, k->c, x->node_comm, rc);
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
    uint64_t lo, hi;
    dgc_policy_shard(k->count, lay->node_size, lay->local, &lo, &hi);
    const uint64_t len = hi - lo;
    dgc_nccl_chain_in(x, k->stream);
    if (reserve(x, len, k->stream)) {
        DGC_ERROR("no device memory for the node's %llu-element pieces: this call fails with ncclSystemError here, "
                  "and the other ranks of its node may wait for this one",
                  (unsigned long long)(len * (uint64_t)lay->node_size));
        k->rc = ncclSystemError;
    }
    if (k->rc == ncclSuccess) k->rc = node_sum(api, k, x, lo, len);
    if (k->rc == ncclSuccess && dgc_nccl_ending(k->c)) k->rc = ncclInternalError;
    if (k->rc != ncclSuccess) {
        DGC_ERROR("the node's sum of a %llu-element call failed (ncclResult_t %d)", (unsigned long long)k->count,
                  (int)k->rc);
        dgc_nccl_chain_out(x, k->stream);
        dgc_registry_comm_drop(cc);
        return -1;
    }
    shard_steps(cc, k->count, lay, 0, lay->local);
    float *out = (float *)k->recv + lo;
    *sub = (dgc_nccl_call){.send = out, .recv = out, .count = len, .dtype = ncclFloat32, .op = ncclSum,
                           .comm = x->cross_comm, .stream = k->stream, .c = cc, .gpu_dtype = DGC_GPU_F32,
                           .forward = dgc_registry_count_dense(cc, len) ? DGC_NCCL_FORWARD_DENSE : DGC_NCCL_RUN,
                           .order_at = -1};
    return 0;
}

void dgc_nccl_node_end(const dgc_nccl_api *api, dgc_nccl_call *k, dgc_nccl_call *sub, ncclResult_t shard_rc,
                       const dgc_config *cfg) {
    dgc_nccl_comm *x = dgc_nccl_ext(k->c);
    const dgc_layout *lay = &x->layout;
    shard_steps(sub->c, k->count, lay, lay->local + 1, lay->node_size);
    if (sub->part == DGC_NCCL_STATE && sub->b) {
        dgc_config spare;
        dgc_plan plan;
        if (dgc_policy_plan_node(dgc_nccl_planning_config(cfg, &spare), k->count, DGC_SUM_F32, sub->plan.p.step,
                                 lay, &plan) == 0)
            dgc_stats_node_call(&sub->b->stats, plan.card_bytes, lay->nodes, lay->node_size);
    }
    /* Whatever the shard's outcome: every rank of the node issues it. */
    const ncclResult_t rc = dgc_nccl_ending(k->c) ? ncclInternalError : spread(api, k, x);
    k->rc = first_error(shard_rc, rc);
    if (k->rc != ncclSuccess)
        DGC_ERROR("a %llu-element call in node layout failed (ncclResult_t %d)", (unsigned long long)k->count,
                  (int)k->rc);
    dgc_nccl_chain_out(x, k->stream);
    dgc_registry_comm_drop(sub->c);
}
