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

/* A call forwarded untouched but held back in this thread's group, behind
 * the held call on its communicator (which holds a record: found here). */
static decision hold(dgc_nccl_call *k, int how) {
    if (!k->c) k->c = dgc_nccl_comm_find(k->comm);
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

/* What the record says about the call (nothing when there is none yet). */
static void learn(dgc_nccl_facts *f, dgc_comm *c, const dgc_config *cfg, size_t count) {
    f->known = c != NULL;
    if (!c) return;
    f->check = c->check;
    f->compressible = dgc_policy_compressible(cfg, count, c->nranks);
    f->count_dense = f->compressible && dgc_registry_count_dense(c, count);
}

/* Enters the communicator's device (*device, *guarded) and asks whether
 * the call's stream is being captured: 0 or 1, or -1 and the decision when
 * that fails. */
static int ask_capture(const dgc_nccl_api *api, dgc_nccl_call *k, dgc_device_guard *g, int *guarded, int *device,
                       decision *d) {
    if (k->c) *device = dgc_nccl_ext(k->c)->device;
    else if (api->comm_cu_device(k->comm, device) != ncclSuccess) {
        *d = DECIDED_PASS; /* NCCL will say what is wrong with it */
        return -1;
    }
    if (dgc_device_enter(g, *device)) {
        *d = last_resort(k, ncclUnhandledCudaError, "the CUDA runtime failed");
        return -1;
    }
    *guarded = 1;
    return dgc_stream_capturing(k->stream) != 0;
}

static decision captured(void) {
    dgc_registry_tally_add(DGC_TALLY_NCCL_CAPTURED);
    if (dgc_registry_claim(DGC_FLAG_NCCL_CAPTURE_SAID))
        DGC_INFO("ncclAllReduce calls captured into a CUDA graph pass through uncompressed (the shim enqueues "
                 "host-side decisions that a graph replay would not repeat); counted, said once");
    return DECIDED_PASS;
}

/* The communicator's configuration check, now (a host wait): 0 when it
 * ran, else the decision (the call fails). */
static int check_now(const dgc_nccl_api *api, dgc_nccl_call *k, const dgc_config *cfg, decision *d) {
    dgc_comm *c = k->c;
    dgc_nccl_check chk = {.c = c, .comm = k->comm, .stream = k->stream};
    ncclResult_t rc = dgc_nccl_check_run(api, &chk, 1, cfg);
    if (c->check == DGC_CHECK_FAILED) {
        c->check_reported = 1; /* the check itself just said why */
        k->rc = ncclInvalidUsage;
    } else if (rc == ncclSuccess && c->check == DGC_CHECK_PENDING) {
        k->rc = ncclInternalError; /* not reached: a check that ran has a verdict */
    } else if (rc != ncclSuccess) {
        k->rc = rc;
    } else {
        return 0;
    }
    *d = DECIDED_FAIL;
    return -1;
}

/* The route (nccl/rules.c) from what is known, learning one fact more
 * whenever it asks (capture: a CUDA call; a record; the check), in the
 * order the rules ask for them; the record's facts are read again only
 * when the record or its check changed. g is entered (the communicator's device
 * made current) when *guarded. k->c, once set, is held
 * (dgc_registry_comm_hold): the caller drops it. */
static decision decide(const dgc_nccl_api *api, dgc_nccl_call *k, const dgc_config *cfg, dgc_device_guard *g,
                       int *guarded) {
    dgc_nccl_facts f = {.in_group = dgc_nccl_in_group(), .capturing = -1};
    f.candidate = k->comm && (k->op == ncclSum || k->op == ncclAvg) && !dgc_nccl_gpu_dtype(k->dtype, &k->gpu_dtype);
    f.group_holds = f.in_group && k->comm && dgc_nccl_group_holds(k->comm);
    if (f.candidate) k->c = dgc_nccl_comm_find(k->comm);
    decision d = DECIDED_PASS;
    int device = -1;
    learn(&f, k->c, cfg, k->count);
    for (;;) {
        switch (dgc_nccl_route_of(&f)) {
        case DGC_ROUTE_PASS: return DECIDED_PASS;
        case DGC_ROUTE_PASS_DENSE: return DECIDED_DENSE;
        case DGC_ROUTE_HOLD: return hold(k, DGC_NCCL_FORWARD);
        case DGC_ROUTE_HOLD_DENSE: return hold(k, DGC_NCCL_FORWARD_DENSE);
        case DGC_ROUTE_FAIL: return check_failed(k->c, k);
        case DGC_ROUTE_PASS_CAPTURED: return captured();
        case DGC_ROUTE_RUN: return DECIDED_RUN;
        case DGC_ROUTE_ASK_CAPTURE:
            if ((f.capturing = ask_capture(api, k, g, guarded, &device, &d)) < 0) return d;
            break;
        case DGC_ROUTE_OPEN:
            if (!(k->c = dgc_nccl_comm_open(api, k->comm, device)))
                return last_resort(k, ncclSystemError, "no record for a new NCCL communicator");
            learn(&f, k->c, cfg, k->count);
            break;
        case DGC_ROUTE_CHECK_NOW:
            if (check_now(api, k, cfg, &d)) return d;
            learn(&f, k->c, cfg, k->count); /* its verdict */
            break;
        case DGC_ROUTE_CHECK_LATER: /* passed through in the group, checked after it: alike everywhere */
            if (dgc_nccl_group_defer_check(k->c, k->comm, k->stream))
                return last_resort(k, ncclSystemError, "no memory to hold a configuration check back");
            return DECIDED_PASS;
        case DGC_ROUTE_DEFER:
            if (dgc_nccl_group_defer_call(k)) return last_resort(k, ncclSystemError, "no memory to hold a call back");
            return DECIDED_DEFERRED;
        }
    }
}

DGC_EXPORT ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                                      ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    const dgc_nccl_api *api = dgc_nccl_enter(comm);
    if (!api) return ncclSystemError;
    const dgc_config *cfg = dgc_config_current();
    dgc_nccl_call k = {.send = sendbuff, .recv = recvbuff, .count = count, .dtype = datatype, .op = op,
                       .forward = DGC_NCCL_RUN, .order_at = -1};
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
    else if (dgc_config_counts(cfg))
        dgc_registry_count_passthrough((uint64_t)count * dgc_nccl_type_size(datatype), dgc_nccl_pass_reason(&k, cfg));
    return api->all_reduce(sendbuff, recvbuff, count, datatype, op, comm, stream);
}
