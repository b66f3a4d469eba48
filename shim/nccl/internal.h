/* Shared by the NCCL front-end files in shim/nccl/.
 *
 * The front end knows NCCL and nothing of DGC beyond the engine's entry
 * points (engine_cuda.h) and the policy. Its rules, from docs/design.md:
 *   - whether a call is compressed, and everything that sets a message
 *     size, is a function of count, datatype, op, communicator size,
 *     configuration and per-communicator call counters: the same on every
 *     rank (invariant 1);
 *   - everything is enqueued on the caller's stream; the host waits for the
 *     device only at a communicator's configuration check (when it is
 *     made) and at a count's first call (the ranks' votes on holding its
 *     state), by polling (nccl/wait.c), with the results copied into
 *     pinned host memory so that no copy blocks (invariant 5);
 *   - inside ncclGroupStart/End nothing is launched: compressed calls are
 *     recorded and run after the outermost ncclGroupEnd (nccl/group.c). */
#ifndef DGCSHIM_NCCL_INTERNAL_H
#define DGCSHIM_NCCL_INTERNAL_H

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdint.h>

#include "dgcshim/config.h"
#include "dgcshim/engine.h"
#include "dgcshim/engine_cuda.h"
#include "dgcshim/policy.h"
#include "core/registry.h"
#include "rules.h"

/* The interposed functions are the library's interface: nccl.h declares
 * them without a visibility, and the build hides everything by default. */
#define DGC_EXPORT __attribute__((visibility("default")))

/* ---- the real NCCL (nccl/resolve.c) ---- */

/* The real library's entry points, all from one loaded object. The
 * optional ones are NULL where that NCCL lacks them. */
typedef struct {
    ncclResult_t (*all_reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*all_gather)(const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*reduce_scatter)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                   cudaStream_t);
    ncclResult_t (*group_start)(void);
    ncclResult_t (*group_end)(void);
    ncclResult_t (*group_simulate_end)(ncclSimInfo_t *); /* optional (2.22+) */
    ncclResult_t (*comm_count)(const ncclComm_t, int *);
    ncclResult_t (*comm_cu_device)(const ncclComm_t, int *);
    ncclResult_t (*comm_user_rank)(const ncclComm_t, int *);
    ncclResult_t (*comm_get_async_error)(ncclComm_t, ncclResult_t *);
    ncclResult_t (*comm_destroy)(ncclComm_t);
    ncclResult_t (*comm_abort)(ncclComm_t);
    ncclResult_t (*comm_finalize)(ncclComm_t); /* optional (2.18+) */
    ncclResult_t (*get_version)(int *);
    /* the communicator constructors the shim checks its configuration at (optional: where that NCCL has them) */
    ncclResult_t (*comm_init_rank)(ncclComm_t *, int, ncclUniqueId, int);
    ncclResult_t (*comm_init_rank_config)(ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *); /* 2.14+ */
    ncclResult_t (*comm_init_all)(ncclComm_t *, int, const int *);
    ncclResult_t (*comm_split)(ncclComm_t, int, int, ncclComm_t *, ncclConfig_t *); /* 2.18+ */
    /* the node layout's moves inside a node (optional: without them it stays flat) */
    ncclResult_t (*broadcast)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*send)(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t); /* 2.7+ */
    ncclResult_t (*recv)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    int version;          /* from get_version, 0 when it failed */
    char object[512];     /* the file they come from, for log lines */
} dgc_nccl_api;

/* Registry slots of the NCCL front end. */
enum {
    DGC_SLOT_NCCL_API = DGC_SLOT_NCCL_BASE, /* the dgc_nccl_api, once resolved */
    DGC_SLOT_NCCL_FIRST_COMM,                /* a communicator of the first call, for the set-up's log rank */
    DGC_SLOT_NCCL_CTX_GET,                   /* the driver's cuCtxGetCurrent (NULL: not to be had) */
    DGC_SLOT_NCCL_CTX_SET,                   /* the driver's cuCtxSetCurrent */
    DGC_SLOT_NCCL_END
};
_Static_assert(DGC_SLOT_NCCL_END <= DGC_SLOT_COUNT, "registry slots");

/* Finds the real NCCL in the loaded objects (or DGC_NCCL_LIBRARY). Returns
 * a heap copy that lives for the rest of the process, or NULL with a log
 * line saying why. */
dgc_nccl_api *dgc_nccl_resolve(void);

/* ---- process set-up (nccl/setup.c) ---- */

/* The first thing every interposer does: counts the call, sets the front
 * end up on the process's first NCCL call (real NCCL resolved; the DGC_*
 * environment read and installed unless MPI_Init did; comm, the call's
 * communicator or NULL, gives log lines their rank), and returns the real
 * NCCL, or NULL when none can be found (the caller returns
 * ncclSystemError: there is nothing to forward to). */
const dgc_nccl_api *dgc_nccl_enter(ncclComm_t comm);

/* The first-use line, once per process, when the first communicator is
 * seen (its rank now known). */
void dgc_nccl_banner(const dgc_nccl_api *api, int nranks);

/* ---- communicators (nccl/comm.c; their end: nccl/destroy.c) ---- */

/* What the NCCL front end keeps per communicator (the record's ext). */
typedef struct {
    int device;               /* ncclCommCuDevice */
    int rank;                 /* ncclCommUserRank */
    int nranks;               /* ncclCommCount */
    dgc_gpu_report *report;   /* what the device tells the host (mapped pinned memory); NULL: setup failed,
                               * every compressed call takes part flagged */
    cudaStream_t own;         /* the shim's stream for this communicator's frees (nccl/memory.c) */
    cudaEvent_t done;         /* recorded after each call's last work (dgc_nccl_chain_out) */
    cudaStream_t last_stream; /* the stream it was last recorded on */
    int done_recorded;
    void *votes;              /* device memory for a count's first-call agreement: 1 + nranks bytes */
    int votes_pooled;         /* votes came from the memory pool (dgc_nccl_dev_alloc) */
    unsigned char *votes_host; /* nranks bytes: the gathered votes, read by the host (pinned: dgc_nccl_host_get) */
    int votes_host_pinned;    /* votes_host is pinned (else pageable: the vote's wait may block in CUDA) */
    uint64_t failed_seen;     /* report->failed at the last look */
    uint64_t nonfinite_seen;  /* report->nonfinite at the last look */
    uint64_t bad_seen;        /* report->bad_steps at the last look */
    uint64_t own_flagged;     /* calls this rank took part in flagged (counted by their own cause) */
    uint64_t peer_counted;    /* failed steps counted as a peer's (report->failed seen, less own_flagged) */
    uint64_t bad_counted;     /* report->bad_steps counted in the statistics */
    uint64_t bad_undone;      /* report->bad_steps whose step was given back */
    uint64_t saturated_seen;  /* report->saturated counted in the statistics */
    uint64_t node_failed_seen; /* report->node_failed at the last look (counted and said) */
    int node_failed_unsaid;   /* some of them seen since a call last returned the error */
    size_t auto_budget;       /* DGC_MAX_STATE_MB=auto: device memory / DGC_NCCL_AUTO_BUDGET_PART (0: none) */
    uint64_t retired;         /* states retired because a new buffer overlapped them */
    int retire_warned;
    /* The node layout (nccl/children.c), from the configuration check. */
    dgc_layout layout;        /* flat until a check passed on a communicator of 2+ equal nodes of 2+ ranks */
    int node_index;           /* this rank's node in the nodes' order: the cross communicator's key */
    const char *flat_why;     /* why the layout is flat (NULL: node layout) */
    ncclComm_t node_comm;     /* the children, NULL until made (DGC_TOPOLOGY=node): the node's ranks, */
    ncclComm_t cross_comm;    /* and this local rank's across the nodes, its record bound to it (the shards'
                               * states); ended with the parent. Set: the communicator's calls go by the node */
    void *node_scratch;       /* the node sum's flag and pieces (nccl/node.c), device memory kept between calls */
    size_t node_scratch_bytes;
    int node_scratch_pooled;
} dgc_nccl_comm;

/* DGC_MAX_STATE_MB=auto's share of the device's memory: 1 / this. */
#define DGC_NCCL_AUTO_BUDGET_PART 4

static inline dgc_nccl_comm *dgc_nccl_ext(dgc_comm *c) { return (dgc_nccl_comm *)c->ext; }

/* The record bound to comm, held (dgc_registry_comm_drop it), or NULL when
 * it has not been seen yet. */
dgc_comm *dgc_nccl_comm_find(ncclComm_t comm);

/* Opens the record for comm, seen for the first time, on device (the
 * current device already: the report is made there), held. NULL, logged,
 * when host memory is short; a record whose CUDA setup failed opens with
 * report NULL, and the rank takes part in its calls flagged. */
dgc_comm *dgc_nccl_comm_open(const dgc_nccl_api *api, ncclComm_t comm, int device);

/* What the device's report says now about failed steps: counted in the
 * statistics by cause (a peer's failure, a bad payload) as far as they are
 * new. Reads mapped memory only: no wait. */
void dgc_nccl_count_news(dgc_nccl_comm *x);

/* ---- communicators made (checked in nccl/agree.c) ---- */

/* Right after NCCL made n communicators (not inside a group: there, after
 * the outermost ncclGroupEnd): opens their records and runs their
 * configuration checks, in one group, on streams of the shim's own, before
 * any collective of the program's can reach them: so the check's place in
 * each communicator's sequence of collectives is the same on every rank,
 * whatever the program groups later. 0, or the first error (logged; the
 * communicators are then checked at their first candidate call). */
ncclResult_t dgc_nccl_check_new(const dgc_nccl_api *api, const ncclComm_t *comms, int n);

/* ---- the caller's device and stream (nccl/device.c) ---- */

/* The CUDA runtime in the shim is its own (static) instance: it must be
 * pointed at the communicator's device before use, and is pointed back at
 * the caller's after, so that the caller's thread sees no change.
 *
 * The guard also puts the thread's stream capture mode to relaxed for the
 * shim's own CUDA calls (allocations, frees, queries, waits), and back on
 * leaving: a stream being captured elsewhere in global mode, or by this
 * thread on another stream, would otherwise see them fail with a capture
 * error that invalidates the program's graph. The shim's work goes only on
 * streams that are not capturing (dgc_stream_capturing) and streams of its
 * own, so relaxed mode lets nothing into a graph. */
typedef struct {
    int saved; /* the device current on entry, -1 when unknown or when the thread had no context */
    void *ctx; /* the driver's current context on entry (NULL: none) */
    int ctx_saved; /* ctx was read (the driver's entry points were found): leave restores it exactly */
    enum cudaStreamCaptureMode mode; /* the thread's capture mode on entry */
    int mode_saved;
} dgc_device_guard;

/* Finds the driver's cuCtxGetCurrent and cuCtxSetCurrent, once, at the
 * front end's set-up (nccl/setup.c); without them the guard falls back to
 * device numbers. */
void dgc_device_resolve(void);

/* Makes device current (capture mode relaxed), remembering the thread's
 * current context (none included). Returns 0, or -1 (logged, nothing
 * changed) when the runtime fails. */
int dgc_device_enter(dgc_device_guard *g, int device);
/* Makes the context current on entry current again (none, when the thread
 * had none), whichever devices were made current in between
 * (dgc_device_switch). */
void dgc_device_leave(dgc_device_guard *g);

/* Makes device current without saving (inside an open guard, whose leave
 * restores the caller's). 0 or -1. */
int dgc_device_switch(int device);

/* 1 when stream is being captured into a CUDA graph (or the runtime cannot
 * tell: nothing may be launched then either), 0 otherwise. */
int dgc_stream_capturing(cudaStream_t stream);

/* ---- host waits (nccl/wait.c) ---- */

/* For non-blocking communicators: a call that returned ncclInProgress has
 * been enqueued once ncclCommGetAsyncError leaves ncclInProgress; polls for
 * that and returns the communicator's state (ncclSuccess or its error), or
 * ncclInternalError once another thread destroys or aborts the
 * communicator of c (the held record; NULL: none). Returns rc itself unless
 * it is ncclInProgress. */
ncclResult_t dgc_nccl_settle(const dgc_nccl_api *api, dgc_comm *c, ncclComm_t comm, ncclResult_t rc);

/* Waits for stream's work by polling: ncclSuccess when it is done, NCCL's
 * asynchronous error on comm, ncclInternalError once comm is being
 * destroyed or aborted by another thread, ncclUnhandledCudaError when CUDA
 * fails. Never blocks in CUDA or NCCL. */
ncclResult_t dgc_nccl_wait(const dgc_nccl_api *api, dgc_comm *c, ncclComm_t comm, cudaStream_t stream);

/* 1 once the held record's communicator is being destroyed or aborted: a
 * call in flight issues nothing more on it. */
int dgc_nccl_ending(dgc_comm *c);

/* ---- memory given back without a wait (nccl/memory.c) ---- */

/* Mapped pinned host memory of bytes, zeroed: a parked block whose last
 * work is done, else a new one. NULL when short. */
void *dgc_nccl_mapped_get(size_t bytes);

/* Gives mapped memory back for reuse once after (an event, owned from now
 * on; NULL: nothing may still write it) has completed. Never freed. */
void dgc_nccl_mapped_put(void *p, size_t bytes, cudaEvent_t after);

/* Host memory of bytes (zeroed) that the device copies into and the host
 * reads after a polling wait: mapped pinned memory (*pinned 1), so that
 * cudaMemcpyAsync into it returns at once; where none is left, pageable
 * memory (*pinned 0, logged), into which a copy returns only once done:
 * the wait may then block inside CUDA. NULL when host memory is short. */
void *dgc_nccl_host_get(size_t bytes, int *pinned);

/* Gives back what dgc_nccl_host_get gave, once the work enqueued on s so
 * far is done (pinned: parked with an event recorded on s, never freed;
 * left allocated if no event can be recorded; pageable: freed). */
void dgc_nccl_host_put(void *p, size_t bytes, int pinned, cudaStream_t s);

/* A call on stream s first waits (on the device) for the communicator's
 * last call when that ran on another stream; after its last work, it
 * records itself as the last. */
void dgc_nccl_chain_in(dgc_nccl_comm *x, cudaStream_t s);
void dgc_nccl_chain_out(dgc_nccl_comm *x, cudaStream_t s);

/* Makes the communicator's own stream wait for its last call and returns a
 * fresh event recorded there (NULL when no call ran): what frees in stream
 * order on x->own follow, and what parked memory waits for. -1 when CUDA
 * fails. */
int dgc_nccl_comm_after(dgc_nccl_comm *x, cudaEvent_t *after);

/* Device memory from the memory pool in stream order on s (*pooled 1), or,
 * where the device has none, cudaMalloc; freed by dgc_nccl_dev_free in
 * stream order on s, or by cudaFree, which may wait for the device. */
cudaError_t dgc_nccl_dev_alloc(void **p, size_t bytes, cudaStream_t s, int *pooled);
void dgc_nccl_dev_free(void *p, int pooled, cudaStream_t s);

/* ---- the configuration check (nccl/agree.c) ---- */

/* One communicator's check, in three steps so that several can share one
 * NCCL group (single-process multi-device programs drive all their ranks'
 * collectives from one thread: one rank's all-gather would wait for ever
 * for the others' unless they are grouped). */
typedef struct {
    dgc_comm *c;
    ncclComm_t comm;
    cudaStream_t stream;
    void *dev;            /* device buffer: this rank's words, then every rank's */
    int dev_pooled;       /* dev came from the memory pool (dgc_nccl_dev_alloc) */
    void *host;           /* host buffer laid out as dev (dgc_nccl_host_get: pinned, so no copy blocks) */
    int host_pinned;
    uint64_t words[DGC_OPT_COUNT + 2]; /* this rank's words: the collective options' hashes, the parse flag,
                                        * its node (dgc_nccl_node_id) */
    int issued;           /* the all-gather was issued */
    ncclResult_t rc;
} dgc_nccl_check;

/* Prepares (device memory, this rank's words) and issues the all-gather;
 * the device is the communicator's. */
void dgc_nccl_check_issue(const dgc_nccl_api *api, dgc_nccl_check *k, const dgc_config *cfg);

/* Waits for the words, compares them, records the outcome in k->c->check
 * and logs a mismatch. Returns ncclSuccess, ncclInvalidUsage (the ranks
 * disagree: the same on every rank), or the error that stopped the check. */
ncclResult_t dgc_nccl_check_finish(const dgc_nccl_api *api, dgc_nccl_check *k, const dgc_config *cfg);

/* Runs n checks in one group (one without the group). Returns the first
 * non-success result. */
ncclResult_t dgc_nccl_check_run(const dgc_nccl_api *api, dgc_nccl_check *k, int n, const dgc_config *cfg);

/* ---- the node layout (nccl/children.c) ---- */

/* This rank's node, for the check's words: rank / DGC_NODE_SIZE when set,
 * else a hash of NCCL_HOSTID, or of the host name and boot id. */
uint64_t dgc_nccl_node_id(const dgc_config *cfg, int rank);

/* The layout from every rank's node id (ids[r * stride]), after a passing
 * check. */
void dgc_nccl_layout_note(dgc_nccl_comm *x, const uint64_t *ids, int stride);

/* Right after the checks of n communicators (dgc_nccl_check_run): makes
 * the node and cross communicators of those that passed, have node layout
 * and DGC_TOPOLOGY=node, or says why they stay flat. A collective on each
 * (two ncclCommSplit, one all-gather over the parent) with a host wait. */
void dgc_nccl_children_make(const dgc_nccl_api *api, dgc_nccl_check *k, int n, const dgc_config *cfg);

/* Ends a record's children (destroyed, or aborted: abort 1), once. */
void dgc_nccl_children_end(const dgc_nccl_api *api, dgc_nccl_comm *x, int abort);

/* ---- buffer states (nccl/state.c) ---- */

typedef struct dgc_nccl_call dgc_nccl_call;

/* The entry of this call's buffer (found or created, and pinned), or NULL
 * when this rank has no state for it: k->lack then says why (over
 * DGC_MAX_STATE_MB, no device memory, no host memory), logged at debug
 * level: the caller says what follows (a dense sum agreed at the count's
 * first call, or a flagged payload). */
dgc_buffer *dgc_nccl_state_get(dgc_nccl_call *k, const dgc_config *cfg);

/* Unpins and frees the state k->b (the ranks agreed to sum its count
 * densely). */
void dgc_nccl_state_drop(dgc_nccl_call *k);

/* ---- one compressed call (nccl/call.c) ---- */

/* Why a rank has no state for a call (dgc_nccl_state_get). */
enum { DGC_NCCL_LACK_NONE, DGC_NCCL_LACK_BUDGET, DGC_NCCL_LACK_DEVICE, DGC_NCCL_LACK_HOST, DGC_NCCL_LACK_SETUP };

/* A call held in a group only to keep its place: forwarded untouched. */
enum {
    DGC_NCCL_RUN,          /* compressed (as far as the run decides) */
    DGC_NCCL_FORWARD,      /* forwarded: not a compressed call */
    DGC_NCCL_FORWARD_DENSE /* forwarded: its count is summed densely (some rank over budget) */
};

struct dgc_nccl_call {
    /* the call as the caller made it */
    const void *send;
    void *recv;
    size_t count;
    ncclDataType_t dtype;
    ncclRedOp_t op;
    ncclComm_t comm;
    cudaStream_t stream;
    /* what the front end made of it */
    dgc_comm *c;
    dgc_gpu_dtype gpu_dtype;
    int part;             /* DGC_NCCL_* */
    dgc_plan plan;        /* step, k, transport, bytes (dgc_policy_plan): the same on every rank */
    int forward;          /* DGC_NCCL_RUN, or forwarded untouched (DGC_NCCL_FORWARD*) */
    dgc_buffer *b;        /* DGC_NCCL_STATE */
    int lack;             /* DGC_NCCL_LACK_*: why b is NULL */
    size_t footprint;     /* the state's bytes, for the lack's log line */
    void *payload, *gathered; /* this rank's payload and every rank's (dense: their headers) */
    dgc_gpu_dense_vector vec; /* dense: where the dense sum runs */
    void *xbuf;           /* exchange memory of a flagged call, or NULL */
    int xbuf_sync;        /* xbuf came from cudaMalloc (no memory pools here): freed after a stream wait */
    ncclResult_t xrc;     /* what the exchange returned (ncclInProgress until settled) */
    ncclResult_t rc;      /* what the call returns once it is enqueued */
    int64_t order_at;     /* its place in the communicator's step (DGC_BUFFER_KEY=order, or auto once buffers
                           * move), or < 0: keyed by address */
    int learning;         /* passed through while the communicator's step is learnt (DGC_BUFFER_KEY=order) */
    /* A node layout's shard (nccl/node.c): its state is keyed as the
     * in-place buffer at state_at, count elements of state_elem bytes (the
     * shard's place in the caller's buffer), whatever send and recv are (for
     * a 16-bit buffer, an fp32 copy the engine runs on in place). NULL:
     * keyed by send and recv. */
    const void *state_at;
    size_t state_elem;
    int placed;           /* order_at and learning decided already: on its communicator, for a node layout's
                           * call and its shard (nccl/call.c's run_round), as the MPI path keys its shards */
    int step_given;       /* its step is step, taken already (a node layout's shard: core/shards.h) */
    uint64_t step;
};

/* What keys the call's state: its send buffer (NULL: in place), its place,
 * and the bytes of one element there. */
static inline const void *dgc_nccl_key_send(const dgc_nccl_call *k) {
    return k->state_at || k->send == k->recv ? NULL : k->send;
}
static inline const void *dgc_nccl_key_place(const dgc_nccl_call *k) { return k->state_at ? k->state_at : k->recv; }
static inline size_t dgc_nccl_key_elem(const dgc_nccl_call *k) {
    return k->state_at ? k->state_elem : dgc_gpu_dtype_size(k->gpu_dtype);
}

/* dtype as the engine's type; -1 when it is not one it compresses. */
int dgc_nccl_gpu_dtype(ncclDataType_t dtype, dgc_gpu_dtype *out);

/* Why a call that passes through does (call.c), for the statistics. */
dgc_pass_reason dgc_nccl_pass_reason(const dgc_nccl_call *k, const dgc_config *cfg);
/* Bytes per element of any NCCL type (0: unknown), for the statistics. */
size_t dgc_nccl_type_size(ncclDataType_t dtype);

/* Runs n calls (collective-consistent: every rank runs the same list), in
 * rounds: round r holds the r-th call of each communicator (a group may
 * span communicators on several devices, driven by one thread: their
 * collectives must share NCCL groups). In a round each call is prepared
 * (device news read, step, plan, state; at a count's first call, the
 * ranks' votes on whether all hold a state), compressed, exchanged (each
 * phase one group), and decoded. So each communicator sees its calls'
 * collectives in the order the calls were made, whole, exactly as if they
 * had been made one at a time, whatever the program grouped. Calls marked
 * DGC_NCCL_FORWARD* are forwarded in their place. Each call's result lands
 * in its rc; returns the first non-success one. */
ncclResult_t dgc_nccl_run(const dgc_nccl_api *api, dgc_nccl_call *k, int n, const dgc_config *cfg);

/* ---- a one-byte vote over a communicator (nccl/vote.c) ---- */

/* Enqueues this rank's byte and the all-gather of every rank's into the
 * record's votes (inside the caller's NCCL group, if any); returns what
 * NCCL returned. collect settles it (issued: that result, or the group's),
 * copies the votes into the record's votes_host and waits for them:
 * ncclSuccess, and votes_host holds one byte a rank. */
ncclResult_t dgc_nccl_vote_issue(const dgc_nccl_api *api, dgc_comm *c, ncclComm_t comm, cudaStream_t stream,
                                 unsigned char mine);
ncclResult_t dgc_nccl_vote_collect(const dgc_nccl_api *api, dgc_comm *c, ncclComm_t comm, cudaStream_t stream,
                                   ncclResult_t issued);

/* ---- one call in node layout (nccl/node.c) ---- */

/* 1 when a call the front end compresses goes by its communicator's node
 * layout (children made, ncclSum or ncclAvg, a count of 2+ elements a shard):
 * from collective inputs, alike on every rank. */
int dgc_nccl_node_eligible(const dgc_nccl_call *k);

/* Its node parts around its shard's flat call (nccl/call.c runs the
 * three in a round, once the call is placed on its communicator): begin
 * takes the shards' steps, sums the node's pieces of this rank's shard
 * (into the output, or for a 16-bit buffer into the node's scratch) and
 * makes sub, the shard's call on the cross record (held), and returns 0;
 * or -1 with k->rc set when nothing more is issued. end, after sub ran
 * (shard_rc), agrees on the shards' outcome over the node, finishes the
 * shard into the output, spreads the node's shards and sets k->rc. */
int dgc_nccl_node_begin(const dgc_nccl_api *api, dgc_nccl_call *k, dgc_nccl_call *sub);
void dgc_nccl_node_end(const dgc_nccl_api *api, dgc_nccl_call *k, dgc_nccl_call *sub, ncclResult_t shard_rc);

/* ---- groups (nccl/group.c) ---- */

/* 1 while the calling thread is inside ncclGroupStart/End. */
int dgc_nccl_in_group(void);

/* Inside a group: run this communicator's configuration check after the
 * outermost ncclGroupEnd (once per group and communicator). Returns 0, or
 * -1 when memory is short (logged). */
int dgc_nccl_group_defer_check(dgc_comm *c, ncclComm_t comm, cudaStream_t stream);

/* Inside a group: record a call (compressed, or forwarded in its place),
 * run after the outermost ncclGroupEnd. 0, or -1 when memory is short. */
int dgc_nccl_group_defer_call(const dgc_nccl_call *k);

/* Inside a group: 1 when a call on comm is held back already (a later
 * all-reduce on it must be held too, to keep its place). */
int dgc_nccl_group_holds(ncclComm_t comm);

/* Inside a group: a communicator NCCL makes at the outermost ncclGroupEnd;
 * its record and check follow it (dgc_nccl_check_new). 0, or -1. */
int dgc_nccl_group_add_created(ncclComm_t comm);

/* The communicator's record is closing (destroy or abort, maybe inside a
 * group): forgets what this thread's group holds for it. Returns how many
 * held-back calls were dropped. */
int dgc_nccl_group_forget(dgc_comm *c);

#endif
