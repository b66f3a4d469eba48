/* ncclGroupStart / ncclGroupEnd / ncclGroupSimulateEnd.
 *
 * NCCL defers every collective issued inside a group until the outermost
 * ncclGroupEnd. A compressed call is several steps in stream order
 * (compress, all-gather, decode), so inside a group the shim launches
 * nothing (invariant 5): it records the call and returns ncclSuccess, and
 * once the real outermost ncclGroupEnd has returned (and, for non-blocking
 * communicators, ncclCommGetAsyncError has left ncclInProgress), it runs the
 * recorded calls as one batch whose all-gathers share one NCCL group of its
 * own (nccl/call.c). So:
 *   - no kernel of ours reads a buffer before the group's collectives that
 *     precede it in stream order have been enqueued;
 *   - a group that fails, or that ncclGroupSimulateEnd ends without running
 *     it, has had nothing done for its recorded calls: they are dropped,
 *     and no step counter moved (steps are taken when a call runs);
 *   - every rank records the same calls in the same order (the group's
 *     members are the same everywhere), so every rank runs the same batch.
 * All-reduces that pass through untouched are forwarded at once, into
 * NCCL's group, unless a call on their communicator is held already: then
 * they are held too, and forwarded in their place, so that the communicator
 * sees its all-reduces in the order they were made, as a rank that does not
 * group sees them (ranks may group differently).
 * Communicators NCCL makes inside a group are checked right after the
 * outermost ncclGroupEnd (nccl/init.c). A communicator seen for the first
 * time inside a group, whose making the shim did not see, cannot be checked
 * there (the check waits for its result): its candidate calls pass through
 * in the group, as on every rank, and its check runs right after the
 * outermost ncclGroupEnd, before the recorded calls.
 *
 * The recorded calls and checks are the calling thread's: NCCL's group
 * depth is per thread, and so is this file's state. That is why it is
 * _Thread_local rather than in the registry, which holds process-wide
 * state; it is emptied (and its memory freed) at every outermost end, so a
 * thread leaves nothing behind unless it exits inside a group. */
#include <stdlib.h>

#include "core/log.h"
#include "internal.h"

typedef struct {
    int depth;
    dgc_nccl_call *calls;
    int ncalls, calls_cap;
    dgc_nccl_check *checks;
    int nchecks, checks_cap;
    ncclComm_t *created; /* communicators NCCL makes at the outermost end */
    int ncreated, created_cap;
} group_state;

static _Thread_local group_state group;

int dgc_nccl_in_group(void) { return group.depth > 0; }

static int grow(void **arr, int *cap, int want, size_t elem) {
    if (want <= *cap) return 0;
    int ncap = *cap ? 2 * *cap : 8;
    while (ncap < want) ncap *= 2;
    void *p = realloc(*arr, (size_t)ncap * elem);
    if (!p) return -1;
    *arr = p;
    *cap = ncap;
    return 0;
}

/* Each held-back call and check holds its record (dgc_registry_comm_hold),
 * dropped when it has run or is dropped. */
int dgc_nccl_group_defer_check(dgc_comm *c, ncclComm_t comm, cudaStream_t stream) {
    for (int i = 0; i < group.nchecks; i++)
        if (group.checks[i].c == c) return 0; /* once per communicator and group */
    if (grow((void **)&group.checks, &group.checks_cap, group.nchecks + 1, sizeof *group.checks)) return -1;
    group.checks[group.nchecks++] = (dgc_nccl_check){.c = c, .comm = comm, .stream = stream};
    dgc_registry_comm_hold_again(c);
    return 0;
}

int dgc_nccl_group_defer_call(const dgc_nccl_call *k) {
    if (grow((void **)&group.calls, &group.calls_cap, group.ncalls + 1, sizeof *group.calls)) return -1;
    group.calls[group.ncalls++] = *k;
    if (k->c) dgc_registry_comm_hold_again(k->c);
    return 0;
}

int dgc_nccl_group_holds(ncclComm_t comm) {
    for (int i = 0; i < group.ncalls; i++)
        if (group.calls[i].comm == comm) return 1;
    return 0;
}

int dgc_nccl_group_add_created(ncclComm_t comm) {
    if (grow((void **)&group.created, &group.created_cap, group.ncreated + 1, sizeof *group.created)) return -1;
    group.created[group.ncreated++] = comm;
    return 0;
}

/* NCCL accepts ncclCommDestroy and ncclCommAbort inside a group (it runs
 * them at the outermost end), but the shim closes the communicator's record
 * at once: held-back work on it would run on a freed record and a reclaimed
 * communicator. Only this thread's group can hold it: NCCL forbids using a
 * communicator from another thread while it is being destroyed (an abort
 * from another thread finds this thread's group in its thread-local state
 * untouched: the held-back calls hold the record, and run against a closing
 * one as calls in flight do, issuing nothing). */
int dgc_nccl_group_forget(dgc_comm *c) {
    int kept = 0, gone = 0;
    for (int i = 0; i < group.ncalls; i++) {
        if (group.calls[i].c == c) gone++;
        else group.calls[kept++] = group.calls[i];
    }
    group.ncalls = kept;
    kept = 0;
    int checks_gone = 0;
    for (int i = 0; i < group.nchecks; i++) {
        if (group.checks[i].c != c) group.checks[kept++] = group.checks[i];
        else checks_gone++;
    }
    group.nchecks = kept;
    for (int i = 0; i < gone + checks_gone; i++) dgc_registry_comm_drop(c); /* not closing yet: none frees it */
    return gone;
}

/* Forgets the recorded calls and checks (the checks' communicators stay
 * unchecked: their next candidate call checks them), dropping their holds. */
static void drop(void) {
    for (int i = 0; i < group.ncalls; i++) dgc_registry_comm_drop(group.calls[i].c);
    for (int i = 0; i < group.nchecks; i++) dgc_registry_comm_drop(group.checks[i].c);
    free(group.calls);
    free(group.checks);
    free(group.created);
    group.calls = NULL;
    group.checks = NULL;
    group.created = NULL;
    group.ncalls = group.calls_cap = group.nchecks = group.checks_cap = group.ncreated = group.created_cap = 0;
}

/* The real group has ended with rc: the held-back work, if any. */
static ncclResult_t after_outermost(const dgc_nccl_api *api, ncclResult_t rc) {
    if (group.ncreated && rc == ncclSuccess) /* made now: checked before any call can reach them */
        dgc_nccl_check_new(api, group.created, group.ncreated);
    if (!group.ncalls && !group.nchecks) {
        drop();
        return rc;
    }
    const ncclResult_t real = rc;
    if (rc == ncclInProgress) { /* non-blocking communicators: ours may be used once they have settled */
        rc = ncclSuccess;
        for (int i = 0; i < group.nchecks; i++) {
            ncclResult_t r = dgc_nccl_settle(api, group.checks[i].c, group.checks[i].comm, ncclInProgress);
            if (rc == ncclSuccess) rc = r;
        }
        for (int i = 0; i < group.ncalls; i++) {
            ncclResult_t r = dgc_nccl_settle(api, group.calls[i].c, group.calls[i].comm, ncclInProgress);
            if (rc == ncclSuccess) rc = r;
        }
    }
    if (rc != ncclSuccess) {
        DGC_DEBUG("an NCCL group failed (ncclResult_t %d): its %d held-back compressed call(s) dropped, nothing "
                  "done for them",
                  (int)rc, group.ncalls);
        drop();
        return rc;
    }
    const dgc_config *cfg = dgc_config_current();
    dgc_comm *first_comm = group.nchecks ? group.checks[0].c : group.calls[0].c;
    dgc_device_guard g;
    if (dgc_device_enter(&g, dgc_nccl_ext(first_comm)->device)) {
        DGC_ERROR("the CUDA runtime failed after an NCCL group: its held-back calls fail here, and the other ranks "
                  "may wait for this one");
        drop();
        return ncclUnhandledCudaError;
    }
    ncclResult_t first = ncclSuccess;
    if (group.nchecks) first = dgc_nccl_check_run(api, group.checks, group.nchecks, cfg);
    if (group.ncalls) {
        ncclResult_t r = dgc_nccl_run(api, group.calls, group.ncalls, cfg);
        if (first == ncclSuccess) first = r;
    }
    dgc_device_leave(&g);
    drop();
    /* The group's other members may be on non-blocking communicators still
     * in progress: the caller polls them when told ncclInProgress, as NCCL
     * told the shim (ours have settled, and poll as done). */
    return first == ncclSuccess && real == ncclInProgress ? ncclInProgress : first;
}

DGC_EXPORT ncclResult_t ncclGroupStart(void) {
    const dgc_nccl_api *api = dgc_nccl_enter(NULL);
    if (!api) return ncclSystemError;
    ncclResult_t rc = api->group_start();
    if (rc == ncclSuccess) group.depth++;
    return rc;
}

DGC_EXPORT ncclResult_t ncclGroupEnd(void) {
    const dgc_nccl_api *api = dgc_nccl_enter(NULL);
    if (!api) return ncclSystemError;
    if (group.depth == 0) return api->group_end(); /* not in a group: NCCL says so */
    group.depth--;                                   /* NCCL leaves the level whatever the outcome */
    ncclResult_t rc = api->group_end();
    if (group.depth > 0) return rc;
    return after_outermost(api, rc);
}

/* Ends the group as ncclGroupEnd does, without running it: nothing was done
 * for the recorded calls, so they are simply forgotten. */
DGC_EXPORT ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t *simInfo) {
    const dgc_nccl_api *api = dgc_nccl_enter(NULL);
    if (!api) return ncclSystemError;
    if (!api->group_simulate_end) return ncclInvalidUsage; /* unreachable: only a newer NCCL's programs call it */
    if (group.depth == 0) return api->group_simulate_end(simInfo);
    group.depth--;
    ncclResult_t rc = api->group_simulate_end(simInfo);
    if (group.depth == 0) drop();
    return rc;
}
