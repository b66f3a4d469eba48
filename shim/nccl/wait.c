/* Host waits inside a call, and what ends them.
 *
 * A compressed call waits for the device at few places (a communicator's
 * configuration check, a count's first-call vote) and for a non-blocking
 * communicator to settle. PyTorch registers a collective's work, and starts
 * its timeout, only once ncclAllReduce has returned: a wait in here that a
 * missing peer makes endless would hang the job where PyTorch cannot see it,
 * and the watchdog's ncclCommAbort, from its own thread, would never reach
 * the waiting thread. So no wait here blocks in CUDA or NCCL: each polls
 * (cudaStreamQuery, ncclCommGetAsyncError) and ends when the work is done,
 * when NCCL reports an error on the communicator (a peer that died, a
 * network failure), or when another thread has begun to destroy or abort it
 * (the registry marks the record closing before the real NCCL is reached,
 * and holds that back while a query of ours is under way, so no query
 * touches a freed communicator). The call then returns ncclInternalError,
 * as NCCL's own calls do on an aborted communicator. */
#include <sched.h>
#include <time.h>

#include "core/log.h"
#include "internal.h"

/* Spins first (a check or vote usually completes in microseconds), then
 * sleeps, doubling up to a millisecond: a long wait costs no core. */
typedef struct {
    int spins;
    long sleep_ns;
} backoff;

static void pause_next(backoff *b) {
    if (b->spins < 200) {
        b->spins++;
        sched_yield();
        return;
    }
    struct timespec ts = {0, b->sleep_ns};
    nanosleep(&ts, NULL);
    if (b->sleep_ns < 1000000) b->sleep_ns *= 2;
}

static ncclResult_t said_closing(void) {
    DGC_WARN("an NCCL communicator was destroyed or aborted by another thread while a compressed call waited on it: "
             "the call returns ncclInternalError");
    return ncclInternalError;
}

/* The communicator's asynchronous state (ncclSuccess, ncclInProgress or its
 * error); ncclInternalError once it is ending. */
static ncclResult_t comm_state(const dgc_nccl_api *api, dgc_comm *c, ncclComm_t comm) {
    if (c && !dgc_registry_comm_enter(c)) return said_closing();
    ncclResult_t st = ncclSuccess;
    ncclResult_t q = api->comm_get_async_error(comm, &st);
    if (c) dgc_registry_comm_leave(c);
    return q != ncclSuccess ? q : st; /* NCCL's own answer: a destroyed or invalid communicator */
}

ncclResult_t dgc_nccl_settle(const dgc_nccl_api *api, dgc_comm *c, ncclComm_t comm, ncclResult_t rc) {
    if (rc != ncclInProgress) return rc;
    backoff b = {0, 1000};
    for (;;) {
        ncclResult_t st = comm_state(api, c, comm);
        if (st != ncclInProgress) return st;
        pause_next(&b);
    }
}

ncclResult_t dgc_nccl_wait(const dgc_nccl_api *api, dgc_comm *c, ncclComm_t comm, cudaStream_t stream) {
    backoff b = {0, 1000};
    for (;;) {
        cudaError_t e = cudaStreamQuery(stream);
        if (e == cudaSuccess) return ncclSuccess;
        if (e != cudaErrorNotReady) {
            (void)cudaGetLastError();
            DGC_ERROR("waiting for a stream failed (%s): the call fails with ncclUnhandledCudaError",
                      cudaGetErrorString(e));
            return ncclUnhandledCudaError;
        }
        ncclResult_t st = comm_state(api, c, comm);
        if (st != ncclSuccess && st != ncclInProgress) return st;
        pause_next(&b);
    }
}

int dgc_nccl_ending(dgc_comm *c) { return c && dgc_registry_comm_closing(c); }
