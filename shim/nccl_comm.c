/* NCCL communicators and their records.
 *
 * A communicator is known by its handle (ncclComm_t), bound to a registry
 * record on its first candidate call. NCCL has no attribute to hang the
 * record on, so its life is tied to the functions that end a communicator:
 * ncclCommDestroy and ncclCommAbort unbind the handle (NCCL frees it and may
 * hand the address out again at once) and close the record, which frees
 * every GPU state on it. ncclCommFinalize only flushes: nothing to free.
 *
 * Destroy closes the record before forwarding (the communicator is still
 * whole, and freeing a state waits for its last kernels, which NCCL's own
 * destroy would wait for too); Abort forwards first, because aborting is
 * what gets stuck NCCL kernels, which our kernels queue behind, out of the
 * way of that wait. */
#include <stdio.h>
#include <stdlib.h>

#include "dgcshim/stats.h"
#include "log.h"
#include "nccl_internal.h"

dgc_comm *dgc_nccl_comm_find(ncclComm_t comm) { return dgc_registry_comm_by_handle(comm); }

/* Runs when the record closes, after its buffer states were freed. Kernels
 * of flagged calls (stateless decodes) may still be writing the report:
 * the device finishes them first. */
static void free_ext(void *ext) {
    dgc_nccl_comm *x = ext;
    if (!x) return;
    if (x->report) {
        cudaDeviceSynchronize();
        dgc_nccl_count_news(x); /* the device's last word on failed steps, for the statistics */
        dgc_gpu_report_destroy(x->report);
    }
    if (x->votes) cudaFree(x->votes);
    free(x->votes_host);
    free(x);
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
    dgc_comm *c = x ? dgc_registry_comm_open_owned(nranks, 0, DGC_OWNER_NCCL) : NULL;
    if (!c) {
        free(x);
        DGC_ERROR("no host memory for a communicator's record");
        return NULL;
    }
    x->device = device;
    x->rank = rank;
    x->report = dgc_gpu_report_create();
    c->ext = x;
    c->ext_free = free_ext;
    if (!x->report) {
        DGC_ERROR("no pinned host memory for a communicator's device report (%s)", dgc_gpu_last_error());
        dgc_registry_comm_close(c->id);
        return NULL;
    }
    /* The votes at a count's first call (nccl_call.c): this rank's byte,
     * then every rank's. */
    x->votes_host = malloc((size_t)nranks);
    cudaError_t e = x->votes_host ? cudaMalloc(&x->votes, 1 + (size_t)nranks) : cudaErrorMemoryAllocation;
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        x->votes = NULL;
        DGC_ERROR("no memory for a communicator's %d-byte vote buffer (%s)", 1 + nranks, cudaGetErrorString(e));
        dgc_registry_comm_close(c->id);
        return NULL;
    }
    dgc_registry_comm_bind(comm, c->id);
    DGC_DEBUG("communicator %p: rank %d of %d on device %d, record %llu", (void *)comm, rank, nranks, device,
              (unsigned long long)c->id);
    return c;
}

/* Unbinds comm's record, forgetting what an open group holds for it; its
 * id (0: none) and device. */
static uint64_t detach(ncclComm_t comm, int *device) {
    dgc_comm *c = dgc_registry_comm_by_handle(comm);
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
