/* A vote over a communicator: one byte a rank, gathered by the real
 * ncclAllGather into the record's device votes, copied into its pinned
 * votes_host (so cudaMemcpyAsync returns at once: into pageable memory it
 * would return, on NVIDIA, only after the all-gather, where no abort can
 * end it) and read after a polling wait for the stream (nccl/wait.c).
 *
 * Used at a count's first call (whether every rank holds its state,
 * nccl/call.c) and once the node layout's children are made (whether every
 * rank made both, nccl/children.c). Issue and collect are apart so that
 * several communicators' votes can share one NCCL group. */
#include "internal.h"

ncclResult_t dgc_nccl_vote_issue(const dgc_nccl_api *api, dgc_comm *c, ncclComm_t comm, cudaStream_t stream,
                                 unsigned char mine) {
    dgc_nccl_comm *x = dgc_nccl_ext(c);
    if (dgc_nccl_ending(c)) return ncclInternalError;
    cudaError_t e = x->votes ? cudaSuccess : dgc_nccl_dev_alloc(&x->votes, 1 + (size_t)c->nranks, stream, &x->votes_pooled);
    if (e == cudaSuccess) e = cudaMemsetAsync(x->votes, mine, 1, stream);
    if (e != cudaSuccess) return ncclUnhandledCudaError;
    return api->all_gather(x->votes, (char *)x->votes + 1, 1, ncclUint8, comm, stream);
}

ncclResult_t dgc_nccl_vote_collect(const dgc_nccl_api *api, dgc_comm *c, ncclComm_t comm, cudaStream_t stream,
                                   ncclResult_t issued) {
    dgc_nccl_comm *x = dgc_nccl_ext(c);
    ncclResult_t rc = dgc_nccl_settle(api, c, comm, issued);
    if (rc != ncclSuccess) return rc;
    if (cudaMemcpyAsync(x->votes_host, (char *)x->votes + 1, (size_t)c->nranks, cudaMemcpyDeviceToHost, stream) !=
        cudaSuccess) {
        (void)cudaGetLastError();
        return ncclUnhandledCudaError;
    }
    return dgc_nccl_wait(api, c, comm, stream);
}
