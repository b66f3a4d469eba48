/* Memory of the NCCL front end, given back without a host wait.
 *
 * cudaFree of cudaMalloc's memory and cudaFreeHost may wait for the whole
 * device; with a second communicator's kernel stuck on the same GPU (a peer
 * that never calls), that wait never ends, and ncclCommAbort, which frees a
 * communicator's states, would hang with it. So:
 *   - device memory comes from the device's memory pool (cudaMallocAsync)
 *     and goes back in stream order (cudaFreeAsync) on the communicator's
 *     own stream, after the communicator's last work; only a device without
 *     memory pools falls back to cudaMalloc and cudaFree;
 *   - mapped pinned host memory (the device's report, the states' counters,
 *     the votes and the configuration check's words read by the host) is
 *     never freed while the process runs: it is parked in the registry with
 *     an event after the last work that may write it, and reused once that
 *     event has completed. The host reads the votes and the check's words
 *     through pinned memory because a cudaMemcpyAsync into pageable memory
 *     returns, on NVIDIA, only once the copy is done: after the all-gather,
 *     so the polling wait (nccl/wait.c) would never run;
 *   - a communicator's calls are chained: a call on another stream than the
 *     last one's first waits for the last one's work (an event, not the
 *     host), as NCCL orders a communicator's own work. So the communicator's
 *     last recorded work follows all its earlier work, and one event says
 *     when a state, the report or the votes are no longer in use. */
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "internal.h"

static int event_done(void *token) {
    if (!token) return 1; /* no work ever touched it */
    cudaError_t e = cudaEventQuery((cudaEvent_t)token);
    if (e != cudaSuccess && e != cudaErrorNotReady) (void)cudaGetLastError();
    return e == cudaSuccess;
}

static void event_drop(void *token) {
    if (token) cudaEventDestroy((cudaEvent_t)token);
}

void *dgc_nccl_mapped_get(size_t bytes) {
    void *p = dgc_registry_unpark(bytes, event_done, event_drop);
    if (!p && cudaHostAlloc(&p, bytes, cudaHostAllocMapped) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    memset(p, 0, bytes);
    return p;
}

void dgc_nccl_mapped_put(void *p, size_t bytes, cudaEvent_t after) {
    if (!p) return;
    if (dgc_registry_park(p, bytes, (void *)after)) {
        DGC_DEBUG("no host memory to list %zu bytes of mapped memory for reuse: left as they are", bytes);
        event_drop((void *)after);
    }
}

void *dgc_nccl_host_get(size_t bytes, int *pinned) {
    void *p = dgc_nccl_mapped_get(bytes);
    *pinned = p != NULL;
    if (p) return p;
    p = calloc(1, bytes);
    if (p)
        DGC_WARN("no pinned host memory for %zu bytes the device reports to the host: pageable memory instead, so "
                 "this rank's wait for its peers may block inside CUDA (where an abort cannot end it) until they "
                 "call",
                 bytes);
    return p;
}

void dgc_nccl_host_put(void *p, size_t bytes, int pinned, cudaStream_t s) {
    if (!p) return;
    if (!pinned) {
        free(p); /* a copy into pageable memory returned only once done */
        return;
    }
    cudaEvent_t ev = NULL;
    if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess || cudaEventRecord(ev, s) != cudaSuccess) {
        (void)cudaGetLastError();
        if (ev) cudaEventDestroy(ev);
        DGC_DEBUG("%zu bytes of pinned host memory are left allocated: the copy into them cannot be waited for", bytes);
        return;
    }
    dgc_nccl_mapped_put(p, bytes, ev);
}

void dgc_nccl_chain_in(dgc_nccl_comm *x, cudaStream_t s) {
    if (!x->done_recorded || x->last_stream == s) return;
    if (cudaStreamWaitEvent(s, x->done, 0) != cudaSuccess) (void)cudaGetLastError();
}

void dgc_nccl_chain_out(dgc_nccl_comm *x, cudaStream_t s) {
    if (cudaEventRecord(x->done, s) != cudaSuccess) {
        (void)cudaGetLastError();
        return;
    }
    x->last_stream = s;
    x->done_recorded = 1;
}

int dgc_nccl_comm_after(dgc_nccl_comm *x, cudaEvent_t *after) {
    *after = NULL;
    if (!x->done_recorded) return 0;
    cudaEvent_t ev = NULL;
    if (cudaStreamWaitEvent(x->own, x->done, 0) != cudaSuccess ||
        cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventRecord(ev, x->own) != cudaSuccess) {
        (void)cudaGetLastError();
        if (ev) cudaEventDestroy(ev);
        return -1;
    }
    *after = ev;
    return 0;
}

cudaError_t dgc_nccl_dev_alloc(void **p, size_t bytes, cudaStream_t s, int *pooled) {
    *pooled = 0;
    cudaError_t e = cudaMallocAsync(p, bytes, s);
    if (e == cudaSuccess) {
        *pooled = 1;
        return e;
    }
    (void)cudaGetLastError();
    e = cudaMalloc(p, bytes);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        *p = NULL;
    }
    return e;
}

void dgc_nccl_dev_free(void *p, int pooled, cudaStream_t s) {
    if (!p) return;
    cudaError_t e = pooled ? cudaFreeAsync(p, s) : cudaFree(p);
    if (e != cudaSuccess) (void)cudaGetLastError();
}
