/* NCCL communicators' records: found by handle, opened at a
 * communicator's first candidate call (or when the shim sees NCCL make it),
 * with what every call on it needs besides its states (the shim's own
 * stream, the chain's event, the mapped report), and freed when the record
 * closes (nccl/destroy.c ends them).
 *
 * A communicator is known by its handle (ncclComm_t), bound to a registry
 * record. NCCL has no attribute to hang the record on, so its life is tied
 * to the functions that end a communicator (nccl/destroy.c). Freeing never
 * waits for the device: the report and the votes go back in stream order or
 * are parked (nccl/memory.c). */
#include <stdlib.h>

#include "core/log.h"
#include "internal.h"

dgc_comm *dgc_nccl_comm_find(ncclComm_t comm) { return dgc_registry_comm_hold(comm); }

/* Runs when the record closes, after its buffer states were released, on
 * whichever thread drops it last. Nothing here waits for the device: the
 * report's last word is read as far as the device has written it, the
 * report is parked until the communicator's last work is done, and the
 * votes go back in stream order (nccl/memory.c). */
static void free_ext(void *ext) {
    dgc_nccl_comm *x = ext;
    if (!x) return;
    dgc_device_guard g;
    int ok = dgc_device_enter(&g, x->device) == 0;
    cudaEvent_t after = NULL;
    int ordered = ok && x->own && dgc_nccl_comm_after(x, &after) == 0;
    if (x->report) {
        dgc_nccl_count_news(x); /* the device's last word on failed steps, for the statistics */
        if (ordered) dgc_nccl_mapped_put(x->report, sizeof *x->report, after);
        else DGC_DEBUG("a communicator's report is left allocated: its last work cannot be waited for");
        after = NULL; /* the parked report owns it */
    }
    if (after) cudaEventDestroy(after);
    if (x->votes_host && !x->votes_host_pinned) {
        free(x->votes_host); /* pageable: the copy into it returned only once done */
    } else if (x->votes_host) {
        /* pinned: after a wait that an abort ended, the copy may still write it */
        if (ordered && dgc_nccl_comm_after(x, &after) == 0)
            dgc_nccl_mapped_put(x->votes_host, (size_t)x->nranks, after);
        else
            DGC_DEBUG("a communicator's vote memory is left allocated: its last work cannot be waited for");
    }
    if (ok && ordered) dgc_nccl_dev_free(x->votes, x->votes_pooled, x->own);
    if (ok && ordered) dgc_nccl_dev_free(x->node_scratch, x->node_scratch_pooled, x->own); /* NULL: nothing */
    if (ok && x->done) cudaEventDestroy(x->done);
    if (ok && x->own) cudaStreamDestroy(x->own); /* returns at once: the frees queued on it still run */
    if (ok) dgc_device_leave(&g);
    free(x);
}

/* DGC_MAX_STATE_MB=auto on the NCCL path: a quarter of the device's memory.
 * The states are made in the first backward pass, before PyTorch makes its
 * optimizer's state: without a ceiling they could take what the framework
 * needs next, and it would run out of memory where the shim cannot help. A
 * buffer over the budget is summed densely instead (nccl/call.c's vote). */
static void set_auto_budget(dgc_nccl_comm *x) {
    size_t free_bytes = 0, total = 0;
    if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) {
        (void)cudaGetLastError();
        DGC_DEBUG("cudaMemGetInfo failed: DGC_MAX_STATE_MB=auto sets no budget on this communicator");
        total = 0;
    }
    x->auto_budget = total / DGC_NCCL_AUTO_BUDGET_PART;
}

/* What every call on the communicator needs besides its state, made once:
 * the shim's own stream, the chain's event, the mapped report. 0, or -1
 * (logged): the record stays open and the rank takes part in every
 * compressed call flagged (invariant 1: it must not stop issuing what the
 * other ranks issue). */
static int set_up(dgc_nccl_comm *x) {
    const char *what = NULL;
    cudaError_t e = cudaStreamCreateWithFlags(&x->own, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        x->own = NULL;
        what = "a stream";
    } else if ((e = cudaEventCreateWithFlags(&x->done, cudaEventDisableTiming)) != cudaSuccess) {
        x->done = NULL;
        what = "an event";
    } else if (!(x->report = dgc_nccl_mapped_get(sizeof *x->report))) {
        e = cudaErrorMemoryAllocation;
        what = "mapped pinned host memory for the device's report";
    }
    if (!what) {
        set_auto_budget(x);
        return 0;
    }
    (void)cudaGetLastError();
    DGC_ERROR("an NCCL communicator's setup failed: no %s (%s); this rank takes part in its compressed calls "
              "flagged, so they fail on every rank (output NaN, ncclSystemError)",
              what, cudaGetErrorString(e));
    return -1;
}

dgc_comm *dgc_nccl_comm_open(const dgc_nccl_api *api, ncclComm_t comm, int device) {
    int nranks = 0, rank = -1;
    if (api->comm_count(comm, &nranks) != ncclSuccess || nranks < 1 ||
        api->comm_user_rank(comm, &rank) != ncclSuccess) {
        DGC_ERROR("ncclCommCount or ncclCommUserRank failed on a communicator: its calls fail");
        return NULL;
    }
    if (dgc_config_rank() == -1) dgc_config_set_rank(rank); /* no launcher rank: the first communicator's */
    dgc_nccl_banner(api, nranks);
    dgc_nccl_comm *x = calloc(1, sizeof *x);
    dgc_comm *c = x ? dgc_registry_comm_open_owned(nranks, 0, DGC_OWNER_NCCL) : NULL;
    if (!c) {
        free(x);
        DGC_ERROR("no host memory for a communicator's record");
        return NULL;
    }
    x->device = device;
    x->rank = rank;
    x->nranks = nranks;
    c->ext = x;
    c->ext_free = free_ext;
    (void)set_up(x);
    /* Pinned, so that the vote's copy back returns at once and its wait
     * polls (pageable only where no pinned memory is left); the votes'
     * device memory comes at the first vote (nccl/call.c). */
    x->votes_host = dgc_nccl_host_get((size_t)nranks, &x->votes_host_pinned);
    if (!x->votes_host) {
        dgc_registry_comm_close(c->id); /* frees x (free_ext) */
        DGC_ERROR("no host memory for a communicator's record");
        return NULL;
    }
    dgc_registry_comm_hold_again(c); /* the caller's, before anyone else can find it */
    dgc_registry_comm_bind(comm, c->id);
    DGC_DEBUG("communicator %p: rank %d of %d on device %d, record %llu", (void *)comm, rank, nranks, device,
              (unsigned long long)c->id);
    return c;
}
