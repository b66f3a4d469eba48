/* NCCL communicators and their records.
 *
 * A communicator is known by its handle (ncclComm_t), bound to a registry
 * record on its first candidate call. NCCL has no attribute to hang the
 * record on, so its life is tied to the functions that end a communicator:
 * ncclCommDestroy and ncclCommAbort unbind the handle (NCCL frees it and may
 * hand the address out again at once) and close the record, which frees
 * every GPU state on it. ncclCommFinalize only flushes: nothing to free.
 *
 * Closing never waits for the device: states, votes and report go back in
 * stream order or are parked (nccl/memory.c), so aborting one communicator
 * does not wait for another one's stuck kernel. A call in flight on another
 * thread (PyTorch's watchdog aborts from its own thread) holds the record:
 * the close then only marks it closing, the call's waits see that and
 * return, and the call's last drop frees the record. Unbinding marks the
 * record closing before the real NCCL is reached, so no call of ours
 * touches the communicator once NCCL has freed it. */
#include <stdio.h>
#include <stdlib.h>

#include "dgcshim/stats.h"
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
    if (ok && ordered) dgc_nccl_dev_free(x->votes, x->votes_pooled, x->own);
    if (ok && x->done) cudaEventDestroy(x->done);
    if (ok && x->own) cudaStreamDestroy(x->own); /* returns at once: the frees queued on it still run */
    if (ok) dgc_device_leave(&g);
    free(x->votes_host);
    free(x);
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
    if (!what) return 0;
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
    dgc_nccl_banner(api);
    dgc_nccl_comm *x = calloc(1, sizeof *x);
    unsigned char *votes_host = malloc((size_t)nranks);
    dgc_comm *c = x && votes_host ? dgc_registry_comm_open_owned(nranks, 0, DGC_OWNER_NCCL) : NULL;
    if (!c) {
        free(x);
        free(votes_host);
        DGC_ERROR("no host memory for a communicator's record");
        return NULL;
    }
    x->device = device;
    x->rank = rank;
    x->votes_host = votes_host; /* the votes' device memory comes at the first vote (nccl/call.c) */
    c->ext = x;
    c->ext_free = free_ext;
    (void)set_up(x);
    dgc_registry_comm_hold_again(c); /* the caller's, before anyone else can find it */
    dgc_registry_comm_bind(comm, c->id);
    DGC_DEBUG("communicator %p: rank %d of %d on device %d, record %llu", (void *)comm, rank, nranks, device,
              (unsigned long long)c->id);
    return c;
}

/* Unbinds comm's record, forgetting what an open group holds for it; its
 * id (0: none) and device. */
static uint64_t detach(ncclComm_t comm, int *device) {
    dgc_comm *c = dgc_registry_comm_by_handle(comm); /* a destroy or abort: the program holds the handle */
    if (!c) return 0;
    *device = dgc_nccl_ext(c)->device;
    int dropped = dgc_nccl_group_forget(c);
    if (dropped)
        DGC_WARN("an NCCL communicator was destroyed or aborted inside the group that held %d of its compressed "
                 "all-reduce(s): they are dropped, their outputs left as they were",
                 dropped);
    return dgc_registry_comm_unbind(comm);
}

/* One STATS row per buffer of the record being closed, labelled as at exit. */
static void print_row(const dgc_buffer *b, void *ctx) {
    if (b->comm != *(const uint64_t *)ctx) return;
    char label[48], row[288];
    dgc_stats_label(b->buf, b->send, "", label, sizeof label);
    dgc_stats_row(label, b->count, &b->stats, row, sizeof row);
    dgc_log_tagged("STATS", "%s", row);
}

/* With DGC_STATS=1, on rank 0: the record's buffers as they stand, before
 * they go (frameworks destroy their communicators before exit: PyTorch's
 * destroy_process_group). The exit report has them too, marked freed, summed
 * with any other communicator's states of the same key. */
static void report_closing(uint64_t id) {
    const dgc_config *cfg = dgc_config_current();
    if (!cfg->stats || dgc_config_rank() != 0) return;
    char row[256];
    dgc_log_tagged("STATS", "buffer states of an NCCL communicator being destroyed:");
    dgc_stats_header(row, sizeof row);
    dgc_log_tagged("STATS", "%s", row);
    dgc_registry_each(print_row, &id);
}

/* Frees the record's states on their own device. */
static void close_record(uint64_t id, int device) {
    if (!id) return;
    report_closing(id);
    dgc_device_guard g;
    int ok = dgc_device_enter(&g, device) == 0;
    dgc_registry_comm_close(id);
    if (ok) dgc_device_leave(&g);
    DGC_DEBUG("record %llu closed with its communicator", (unsigned long long)id);
}

DGC_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    const dgc_nccl_api *api = dgc_nccl_enter(comm);
    if (!api) return ncclSystemError;
    int device = 0;
    uint64_t id = detach(comm, &device);
    close_record(id, device);
    return api->comm_destroy(comm);
}

DGC_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
    const dgc_nccl_api *api = dgc_nccl_enter(comm);
    if (!api) return ncclSystemError;
    int device = 0;
    uint64_t id = detach(comm, &device);
    ncclResult_t rc = api->comm_abort(comm);
    close_record(id, device);
    return rc;
}

DGC_EXPORT ncclResult_t ncclCommFinalize(ncclComm_t comm) {
    const dgc_nccl_api *api = dgc_nccl_enter(comm);
    if (!api) return ncclSystemError;
    if (!api->comm_finalize) return ncclInvalidUsage; /* unreachable: a program calls it only when its NCCL has it */
    return api->comm_finalize(comm);
}
