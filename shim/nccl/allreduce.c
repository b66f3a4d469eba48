/* ncclAllReduce interposition: which calls are compressed.
 *
 * A call is a candidate when its op is ncclSum or ncclAvg and its type
 * float32, float16 or bfloat16: a test that reads nothing but the call.
 * Whether a candidate is then compressed depends on DGC_ENABLE,
 * DGC_MIN_ELEMENTS and DGC_MIN_RANKS (dgc_policy_compressible), which ranks
 * must agree on first: a communicator's configuration check runs when NCCL
 * makes it (nccl/init.c), or, for one the shim did not see made (or a
 * non-blocking one), at its first candidate call. A count whose first call
 * found some rank without a state is summed densely from then on
 * (nccl/call.c). Everything else passes through to the real ncclAllReduce
 * untouched; inside a group, after a held-back call on the same
 * communicator, it is held back too, to keep its place.
 *
 * Every input to the decision is the same on every rank (invariant 1):
 * count, type, op, the communicator's size, the agreed configuration, the
 * check's verdict (computed from the same gathered words everywhere), and
 * whether the call is inside a group (NCCL needs the same group structure
 * on every rank) or its stream is being captured into a CUDA graph (the
 * same captured program on every rank). Pointers, data and memory only
 * decide what a rank sends inside the fixed-size payload.
 *
 * The pass-through test for the calls frameworks make most (tiny, or of
 * other types) is a few comparisons and one registry lookup: no CUDA call. */
#include "dgcshim/policy.h"
#include "core/log.h"
#include "internal.h"

typedef enum {
    DECIDED_PASS,     /* to the real ncclAllReduce, untouched */
    DECIDED_DENSE,    /* the same, its count summed densely (some rank over budget at its first call) */
    DECIDED_FAIL,     /* k->rc at once, nothing issued */
    DECIDED_RUN,      /* compressed now */
    DECIDED_DEFERRED, /* held back until the outermost ncclGroupEnd */
} decision;

/* A call forwarded untouched: at once, unless a call on its communicator
 * is held back in this thread's group already, which it must follow (each
 * communicator's collectives in the order the calls were made, grouped or
 * not: nccl/call.c). */
static decision forward(const dgc_nccl_api *api, dgc_nccl_call *k, int how) {
    (void)api;
    if (!dgc_nccl_in_group() || !k->comm || !dgc_nccl_group_holds(k->comm))
        return how == DGC_NCCL_FORWARD_DENSE ? DECIDED_DENSE : DECIDED_PASS;
    if (!k->c) k->c = dgc_nccl_comm_find(k->comm); /* it has one: calls on it are held (held here till return) */
    k->forward = how;
    if (!k->c || dgc_nccl_group_defer_call(k)) {
        DGC_ERROR("no memory to hold an all-reduce back in its place in a group: it is forwarded at once, and its "
                  "communicator's collectives may then differ in order between ranks");
        return how == DGC_NCCL_FORWARD_DENSE ? DECIDED_DENSE : DECIDED_PASS;
    }
    return DECIDED_DEFERRED;
}

/* A failed check is known to every rank: each returns the error without
 * issuing anything, from the same calls. */
static decision check_failed(dgc_comm *c, dgc_nccl_call *k) {
    if (!c->check_reported++)
        DGC_ERROR("float sum/average all-reduces on an NCCL communicator fail with ncclInvalidUsage: its ranks "
                  "disagree on the DGC_* configuration (the first error on it said which variable)");
    k->rc = ncclInvalidUsage;
    return DECIDED_FAIL;
}

static decision last_resort(dgc_nccl_call *k, ncclResult_t rc, const char *what) {
    DGC_ERROR("%s: this call fails with ncclResult_t %d on this rank alone, and the other ranks may wait for it", what,
              (int)rc);
    k->rc = rc;
    return DECIDED_FAIL;
}

/* g is entered (the communicator's device made current) when *guarded.
 * k->c, once set, is held (dgc_registry_comm_hold): the caller drops it. */
static decision decide(const dgc_nccl_api *api, dgc_nccl_call *k, const dgc_config *cfg, dgc_device_guard *g,
                       int *guarded) {
    if (!k->comm || (k->op != ncclSum && k->op != ncclAvg) || dgc_nccl_gpu_dtype(k->dtype, &k->gpu_dtype))
        return forward(api, k, DGC_NCCL_FORWARD);
    dgc_comm *c = dgc_nccl_comm_find(k->comm);
    k->c = c;
    if (c && c->check == DGC_CHECK_FAILED) return check_failed(c, k);
    if (c && c->check == DGC_CHECK_PASSED && !dgc_policy_compressible(cfg, k->count, c->nranks))
        return forward(api, k, DGC_NCCL_FORWARD);
    if (c && c->check == DGC_CHECK_PASSED && dgc_registry_count_dense(c, k->count))
        return forward(api, k, DGC_NCCL_FORWARD_DENSE);
    int device = -1;
    if (c) device = dgc_nccl_ext(c)->device;
    else if (api->comm_cu_device(k->comm, &device) != ncclSuccess)
        return DECIDED_PASS; /* NCCL will say what is wrong with it */
    if (dgc_device_enter(g, device)) return last_resort(k, ncclUnhandledCudaError, "the CUDA runtime failed");
    *guarded = 1;
    if (dgc_stream_capturing(k->stream)) {
        dgc_registry_tally_add(DGC_TALLY_NCCL_CAPTURED);
        if (dgc_registry_claim(DGC_FLAG_NCCL_CAPTURE_SAID))
            DGC_INFO("ncclAllReduce calls captured into a CUDA graph pass through uncompressed (the shim enqueues "
                     "host-side decisions that a graph replay would not repeat); counted, said once");
        return DECIDED_PASS;
    }
    if (!c) c = dgc_nccl_comm_open(api, k->comm, device);
    if (!c) return last_resort(k, ncclSystemError, "no record for a new NCCL communicator");
    k->c = c;
    if (c->check == DGC_CHECK_PENDING) {
        if (dgc_nccl_in_group()) { /* passed through in the group, checked after it: alike everywhere */
            if (dgc_nccl_group_defer_check(c, k->comm, k->stream))
                return last_resort(k, ncclSystemError, "no memory to hold a configuration check back");
            return DECIDED_PASS;
        }
        dgc_nccl_check chk = {.c = c, .comm = k->comm, .stream = k->stream};
        ncclResult_t rc = dgc_nccl_check_run(api, &chk, 1, cfg);
        if (c->check == DGC_CHECK_FAILED) {
            c->check_reported = 1; /* the check itself just said why */
            k->rc = ncclInvalidUsage;
            return DECIDED_FAIL;
        }
        if (rc != ncclSuccess) {
            k->rc = rc;
            return DECIDED_FAIL;
        }
    }
    if (!dgc_policy_compressible(cfg, k->count, c->nranks)) return forward(api, k, DGC_NCCL_FORWARD);
    if (dgc_registry_count_dense(c, k->count)) return forward(api, k, DGC_NCCL_FORWARD_DENSE);
    if (dgc_nccl_in_group()) {
        if (dgc_nccl_group_defer_call(k)) return last_resort(k, ncclSystemError, "no memory to hold a call back");
        return DECIDED_DEFERRED;
    }
    return DECIDED_RUN;
}

DGC_EXPORT ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                                      ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    const dgc_nccl_api *api = dgc_nccl_enter(comm);
    if (!api) return ncclSystemError;
    const dgc_config *cfg = dgc_config_current();
    dgc_nccl_call k = {.send = sendbuff, .recv = recvbuff, .count = count, .dtype = datatype, .op = op,
                       .forward = DGC_NCCL_RUN};
    k.comm = comm;
    k.stream = stream;
    dgc_device_guard g;
    int guarded = 0;
    decision d = decide(api, &k, cfg, &g, &guarded);
    ncclResult_t rc = ncclSuccess;
    switch (d) {
    case DECIDED_PASS:
    case DECIDED_DENSE: break;
    case DECIDED_FAIL: rc = k.rc; break;
    case DECIDED_DEFERRED: rc = ncclSuccess; break;
    case DECIDED_RUN: rc = dgc_nccl_run(api, &k, 1, cfg); break;
    }
    if (guarded) dgc_device_leave(&g); /* before forwarding: NCCL sees the caller's device, as without the shim */
    dgc_registry_comm_drop(k.c); /* a held-back copy keeps its own hold; a close meanwhile frees the record now */
    if (d != DECIDED_PASS && d != DECIDED_DENSE) return rc;
    dgc_registry_tally_add(DGC_TALLY_NCCL_PASSED);
    if (d == DECIDED_DENSE) dgc_registry_count_over_budget();
    else if (cfg->stats) dgc_registry_count_passthrough();
    return api->all_reduce(sendbuff, recvbuff, count, datatype, op, comm, stream);
}
