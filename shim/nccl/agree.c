/* The configuration check of an NCCL communicator: before anything is
 * compressed on it, its ranks all-gather the hash of every collective DGC_*
 * value (as shim/mpi/check.c does on MPI) and a flag saying whether the rank
 * could parse its environment at all, over the communicator itself, on the
 * caller's stream. The words come back to the host (a polling wait that an
 * abort or NCCL's error ends: nccl/wait.c; the words go through pinned
 * host memory, so that the copies return at once and the wait polls) and
 * every rank compares the same gathered words, so every rank reaches the
 * same verdict: passed, or failed, and then every float sum/average call
 * on the communicator fails with ncclInvalidUsage on every rank without
 * issuing anything.
 *
 * It runs at the communicator's first candidate call (float sum or
 * average: a test that reads no configuration), not at its first
 * compressed one: whether a call is compressed reads DGC_ENABLE,
 * DGC_MIN_ELEMENTS and DGC_MIN_RANKS, which are what may differ. The
 * gather is of bytes (ncclUint8): an all-gather needs no reduction kernel,
 * so any NCCL build has it. */
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "internal.h"

/* The options' words are compared; the parse flag names a rank that could
 * not parse; the node word is the rank's own (the layout, children.c). */
enum { WORD_PARSE = DGC_OPT_COUNT, WORD_NODE, NWORDS };
#define WORDS_BYTES (NWORDS * sizeof(uint64_t))
_Static_assert(sizeof(((dgc_nccl_check *)0)->words) == WORDS_BYTES, "the check's words");

static void own_words(const dgc_config *cfg, dgc_comm *c, uint64_t *w) {
    for (int i = 0; i < DGC_OPT_COUNT; i++)
        w[i] = dgc_option_is_collective((dgc_option)i) ? dgc_option_hash(cfg, (dgc_option)i) : 0;
    w[WORD_PARSE] = dgc_registry_flag(DGC_FLAG_NCCL_PARSE_FAILED) ? 1 : 0;
    /* Only a layout that may be used reads the host's name: enable and
     * topology are compared, so every rank leaves it 0 alike. */
    const int layout_used = cfg->enable && cfg->topology != DGC_TOPOLOGY_FLAT;
    w[WORD_NODE] = layout_used ? dgc_nccl_node_id(cfg, dgc_nccl_ext(c)->rank) : 0;
}

/* The check's buffers go back in stream order: after a wait that ended
 * early (an abort), the all-gather and the copy may still be writing them.
 * Without memory pools, the device's goes by cudaFree. */
static void release(dgc_nccl_check *k) {
    const size_t bytes = WORDS_BYTES * (1 + (size_t)k->c->nranks);
    dgc_nccl_dev_free(k->dev, k->dev_pooled, k->stream);
    dgc_nccl_host_put(k->host, bytes, k->host_pinned, k->stream);
    k->dev = NULL;
    k->host = NULL;
}

void dgc_nccl_check_issue(const dgc_nccl_api *api, dgc_nccl_check *k, const dgc_config *cfg) {
    k->dev = NULL;
    k->host = NULL;
    k->host_pinned = 0;
    k->issued = 0;
    k->rc = ncclSuccess;
    own_words(cfg, k->c, k->words);
    if (k->c->nranks == 1) return; /* nothing to agree with */
    if (dgc_nccl_ending(k->c)) {
        k->rc = ncclInternalError;
        return;
    }
    /* The host side is pinned: a copy to or from pageable memory may block
     * until the stream reaches it (on NVIDIA, the copy back returns only
     * after the all-gather), and the wait that an abort ends would never
     * run. */
    const size_t bytes = WORDS_BYTES * (1 + (size_t)k->c->nranks);
    cudaError_t e = (k->host = dgc_nccl_host_get(bytes, &k->host_pinned)) ? cudaSuccess : cudaErrorMemoryAllocation;
    if (e == cudaSuccess) e = dgc_nccl_dev_alloc(&k->dev, bytes, k->stream, &k->dev_pooled);
    if (e == cudaSuccess) {
        memcpy(k->host, k->words, WORDS_BYTES);
        e = cudaMemcpyAsync(k->dev, k->host, WORDS_BYTES, cudaMemcpyHostToDevice, k->stream);
    }
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        DGC_ERROR("the DGC_* consistency check of a communicator cannot run on this rank (%s): its call fails "
                  "with ncclSystemError here, and the other ranks may wait for this one",
                  cudaGetErrorString(e));
        release(k);
        k->rc = ncclSystemError;
        return;
    }
    k->rc = api->all_gather(k->dev, (char *)k->dev + WORDS_BYTES, WORDS_BYTES, ncclUint8, k->comm, k->stream);
    k->issued = k->rc == ncclSuccess || k->rc == ncclInProgress;
}

static void report_mismatch(const dgc_config *cfg, int i) {
    char mine[128];
    dgc_option_describe(cfg, (dgc_option)i, mine, sizeof mine);
    DGC_ERROR("%s differs between the ranks of an NCCL communicator (this rank has %s); every rank must run with "
              "the same value (accepted %s, default %s): float sum/average all-reduces on it fail with "
              "ncclInvalidUsage",
              dgc_option_name((dgc_option)i), mine, dgc_option_range((dgc_option)i),
              dgc_option_default((dgc_option)i));
}

/* The verdict from every rank's words (nranks rows of NWORDS), logged. */
static int verdict(const dgc_config *cfg, const uint64_t *all, int nranks) {
    int bad_rank, bad_word;
    int v = dgc_nccl_verdict(all, nranks, NWORDS, WORD_PARSE, &bad_rank, &bad_word);
    if (bad_rank >= 0 && !dgc_registry_flag(DGC_FLAG_NCCL_PARSE_FAILED))
        DGC_ERROR("rank %d of an NCCL communicator rejected its DGC_* environment (its own message says "
                  "which variable): float sum/average all-reduces on it fail with ncclInvalidUsage",
                  bad_rank);
    if (bad_word >= 0) report_mismatch(cfg, bad_word);
    return v;
}

ncclResult_t dgc_nccl_check_finish(const dgc_nccl_api *api, dgc_nccl_check *k, const dgc_config *cfg) {
    int nranks = k->c->nranks;
    if (nranks == 1) {
        k->c->check = verdict(cfg, k->words, 1);
        dgc_nccl_layout_note(dgc_nccl_ext(k->c), k->words + WORD_NODE, NWORDS);
        return k->c->check == DGC_CHECK_PASSED ? ncclSuccess : ncclInvalidUsage;
    }
    if (!k->issued) { /* the check stays pending: tried again at the next call */
        release(k);
        return k->rc;
    }
    uint64_t *all = (uint64_t *)((char *)k->host + WORDS_BYTES);
    ncclResult_t rc = dgc_nccl_settle(api, k->c, k->comm, k->rc);
    cudaError_t e = cudaSuccess;
    if (rc == ncclSuccess) {
        /* into pinned memory: returns at once, and the wait polls */
        e = cudaMemcpyAsync(all, (char *)k->dev + WORDS_BYTES, WORDS_BYTES * (size_t)nranks, cudaMemcpyDeviceToHost,
                            k->stream);
        if (e == cudaSuccess) rc = dgc_nccl_wait(api, k->c, k->comm, k->stream);
    }
    if (rc == ncclSuccess && e != cudaSuccess) {
        (void)cudaGetLastError();
        DGC_ERROR("the DGC_* consistency check of a communicator could not read its result (%s): the call fails "
                  "with ncclSystemError here, and the other ranks may fail later",
                  cudaGetErrorString(e));
        rc = ncclSystemError;
    }
    if (rc == ncclSuccess) {
        k->c->check = verdict(cfg, all, nranks);
        if (k->c->check == DGC_CHECK_FAILED) rc = ncclInvalidUsage;
        else dgc_nccl_layout_note(dgc_nccl_ext(k->c), all + WORD_NODE, NWORDS);
    }
    release(k);
    return rc;
}

ncclResult_t dgc_nccl_check_run(const dgc_nccl_api *api, dgc_nccl_check *k, int n, const dgc_config *cfg) {
    ncclResult_t first = ncclSuccess;
    int grouped = n > 1 && api->group_start() == ncclSuccess;
    for (int i = 0; i < n; i++) {
        if (dgc_device_switch(dgc_nccl_ext(k[i].c)->device) == 0) {
            dgc_nccl_check_issue(api, &k[i], cfg);
        } else {
            own_words(cfg, k[i].c, k[i].words);
            k[i].dev = NULL;
            k[i].host = NULL;
            k[i].issued = 0;
            k[i].rc = ncclUnhandledCudaError;
        }
    }
    if (grouped) {
        /* Members of a group return ncclSuccess; the group's end says how it went. */
        ncclResult_t rc = api->group_end();
        for (int i = 0; i < n; i++) {
            if (!k[i].issued) continue;
            k[i].rc = rc;
            if (rc != ncclSuccess && rc != ncclInProgress) k[i].issued = 0;
        }
    }
    for (int i = 0; i < n; i++) {
        ncclResult_t rc = k[i].rc;
        if (dgc_device_switch(dgc_nccl_ext(k[i].c)->device) == 0) rc = dgc_nccl_check_finish(api, &k[i], cfg);
        if (first == ncclSuccess) first = rc;
    }
    dgc_nccl_children_make(api, k, n, cfg);
    return first;
}

/* The checks of communicators just made (init.c, or group.c after the
 * outermost ncclGroupEnd), on streams of the shim's own. */
ncclResult_t dgc_nccl_check_new(const dgc_nccl_api *api, const ncclComm_t *comms, int n) {
    const dgc_config *cfg = dgc_config_current();
    dgc_nccl_check *chk = calloc((size_t)n, sizeof *chk);
    if (!chk) {
        DGC_ERROR("no host memory to check %d new communicator(s): they are checked at their first candidate call", n);
        return ncclSystemError;
    }
    int m = 0;
    ncclResult_t rc = ncclSuccess;
    dgc_device_guard g;
    int guarded = 0;
    for (int i = 0; i < n; i++) {
        int device = -1;
        if (!comms[i]) continue; /* ncclCommSplit's NCCL_SPLIT_NOCOLOR */
        dgc_comm *seen = dgc_nccl_comm_find(comms[i]);
        dgc_registry_comm_drop(seen);
        if (seen || api->comm_cu_device(comms[i], &device) != ncclSuccess)
            continue; /* known already, or NCCL will say what is wrong with it */
        if (!guarded) {
            if (dgc_device_enter(&g, device)) break;
            guarded = 1;
        } else if (dgc_device_switch(device)) {
            continue;
        }
        dgc_comm *c = dgc_nccl_comm_open(api, comms[i], device);
        cudaStream_t s = NULL;
        if (!c) continue;
        if (c->nranks > 1 && cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
            (void)cudaGetLastError(); /* the check must run here, as on the other ranks: on the legacy stream */
            DGC_DEBUG("no stream of its own for a new communicator's configuration check: the legacy stream");
            s = NULL;
        }
        chk[m++] = (dgc_nccl_check){.c = c, .comm = comms[i], .stream = s};
    }
    if (m) rc = dgc_nccl_check_run(api, chk, m, cfg);
    for (int i = 0; i < m; i++) {
        if (chk[i].stream && dgc_device_switch(dgc_nccl_ext(chk[i].c)->device) == 0)
            cudaStreamDestroy(chk[i].stream); /* returns at once: the check's free still runs on it */
        dgc_registry_comm_drop(chk[i].c);
    }
    if (guarded) dgc_device_leave(&g);
    free(chk);
    return rc;
}
