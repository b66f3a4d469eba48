/* ncclCommDestroy, ncclCommAbort, ncclCommFinalize: the end of a
 * communicator's record.
 *
 * ncclCommDestroy and ncclCommAbort unbind the handle (NCCL frees it and may
 * hand the address out again at once) and close the record, which frees
 * every GPU state on it; what an open group of this thread held back on it
 * is dropped (nccl/group.c). ncclCommFinalize only flushes: nothing to free.
 *
 * Closing never waits for the device: states, votes and report go back in
 * stream order or are parked (nccl/memory.c), so aborting one communicator
 * does not wait for another one's stuck kernel. A call in flight on another
 * thread (PyTorch's watchdog aborts from its own thread) holds the record:
 * the close then only marks it closing, the call's waits see that and
 * return, and the call's last drop frees the record. Unbinding marks the
 * record closing before the real NCCL is reached, so no call of ours
 * touches the communicator once NCCL has freed it. */
#include "dgcshim/stats.h"
#include "core/log.h"
#include "internal.h"

/* Unbinds comm's record, forgetting what an open group holds for it, and
 * then, the record marked closing (so that a call in flight on another
 * thread issues nothing more on them), ends its node layout's children
 * (nccl/children.c: aborted when the parent is, so that a call waiting on
 * one returns; else destroyed before it); its id (0: none) and device. The
 * record itself lives until its close. */
static uint64_t detach(const dgc_nccl_api *api, ncclComm_t comm, int abort, int *device) {
    dgc_comm *c = dgc_registry_comm_by_handle(comm); /* a destroy or abort: the program holds the handle */
    if (!c) return 0;
    *device = dgc_nccl_ext(c)->device;
    int dropped = dgc_nccl_group_forget(c);
    if (dropped)
        DGC_WARN("an NCCL communicator was destroyed or aborted inside the group that held %d of its compressed "
                 "all-reduce(s): they are dropped, their outputs left as they were",
                 dropped);
    const uint64_t id = dgc_registry_comm_unbind(comm);
    dgc_nccl_children_end(api, dgc_nccl_ext(c), abort);
    return id;
}

/* One STATS row per buffer of the record being closed, labelled as at exit. */
static void print_row(const dgc_buffer *b, void *ctx) {
    if (b->comm != *(const uint64_t *)ctx) return;
    char label[48], row[288];
    dgc_stats_label(b->buf, b->send, "", label, sizeof label);
    dgc_stats_row(label, b->count, &b->stats, b->bytes, row, sizeof row);
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
    uint64_t id = detach(api, comm, 0, &device);
    close_record(id, device);
    return api->comm_destroy(comm);
}

DGC_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
    const dgc_nccl_api *api = dgc_nccl_enter(comm);
    if (!api) return ncclSystemError;
    int device = 0;
    uint64_t id = detach(api, comm, 1, &device);
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
