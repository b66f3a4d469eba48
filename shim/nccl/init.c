/* Communicators as NCCL makes them: the configuration check at their making.
 *
 * Ranks must agree on the DGC_* configuration before any call is decided by
 * it (nccl/agree.c), and the check's all-gather must take the same place
 * in every rank's sequence of collectives on the communicator. Its first
 * candidate call is no such place: a rank that groups that call holds it,
 * and one that does not runs it at once. The making of the communicator is:
 * no collective of the program's can reach it before, on any rank. So the
 * constructors are interposed, and once NCCL has made a communicator (right
 * away, or, inside a group, at the outermost ncclGroupEnd) its record is
 * opened and its check runs, on a stream of the shim's own, with a host
 * wait. The check runs whatever DGC_ENABLE says, so that ranks that disagree
 * on it fail their float sums alike (ncclInvalidUsage) instead of hanging.
 *
 * A non-blocking communicator (config.blocking = 0) is not usable until the
 * program has seen it settle: it is checked at its first candidate call
 * instead, as are communicators made by constructors the shim does not
 * interpose (ncclCommInitRankScalable, ncclCommShrink). */
#include <stdlib.h>

#include "core/log.h"
#include "internal.h"

/* After a constructor: rc is NCCL's answer for the n communicators. */
static ncclResult_t made(const dgc_nccl_api *api, ncclResult_t rc, const ncclComm_t *comms, int n) {
    if (rc != ncclSuccess) return rc; /* failed, or non-blocking and in progress: checked at first use */
    if (dgc_nccl_in_group()) {
        for (int i = 0; i < n; i++)
            if (comms[i] && dgc_nccl_group_add_created(comms[i]))
                DGC_WARN("no memory to note a communicator made in a group: it is checked at its first candidate call");
        return rc;
    }
    (void)dgc_nccl_check_new(api, comms, n); /* a failed check is the calls' business, not the making's */
    return rc;
}

static ncclResult_t missing(const char *name) {
    DGC_ERROR("the real NCCL has no %s: the call fails with ncclInvalidUsage", name);
    return ncclInvalidUsage;
}

DGC_EXPORT ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    const dgc_nccl_api *api = dgc_nccl_enter(NULL);
    if (!api) return ncclSystemError;
    if (!api->comm_init_rank) return missing("ncclCommInitRank");
    ncclResult_t rc = api->comm_init_rank(comm, nranks, id, rank);
    return made(api, rc, comm, 1);
}

DGC_EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                               ncclConfig_t *config) {
    const dgc_nccl_api *api = dgc_nccl_enter(NULL);
    if (!api) return ncclSystemError;
    if (!api->comm_init_rank_config) return missing("ncclCommInitRankConfig");
    ncclResult_t rc = api->comm_init_rank_config(comm, nranks, id, rank, config);
    return made(api, rc, comm, 1);
}

DGC_EXPORT ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist) {
    const dgc_nccl_api *api = dgc_nccl_enter(NULL);
    if (!api) return ncclSystemError;
    if (!api->comm_init_all) return missing("ncclCommInitAll");
    ncclResult_t rc = api->comm_init_all(comms, ndev, devlist);
    return made(api, rc, comms, ndev);
}

DGC_EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                                      ncclConfig_t *config) {
    const dgc_nccl_api *api = dgc_nccl_enter(comm);
    if (!api) return ncclSystemError;
    if (!api->comm_split) return missing("ncclCommSplit");
    ncclResult_t rc = api->comm_split(comm, color, key, newcomm, config);
    return made(api, rc, newcomm, 1);
}
