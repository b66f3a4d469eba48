/* The buffer-state registry: per-communicator records (step counters, the
 * configuration check's outcome, memory reserved for a rank that cannot take
 * part otherwise) and per-buffer DGC state and statistics. With config, the
 * only module that holds process-wide mutable state.
 *
 * A communicator is known by an id the registry hands out, unique for the
 * life of the process: the front end ties the id to the communicator's own
 * life (an MPI attribute whose delete callback closes it; for NCCL, the
 * interposed ncclCommDestroy/ncclCommAbort unbind its handle and close it),
 * so a handle reused for a new communicator can never find the old one's
 * state.
 *
 * Lookups take a mutex; MPI's pass-through calls never come here (NCCL's
 * float sum/average calls look their communicator up by handle). A record or
 * entry handed out stays valid until its communicator is closed, the entry
 * is freed as idle by a call on the same communicator, or the registry is
 * cleared. MPI and NCCL forbid concurrent collectives on one communicator,
 * but not an abort from another thread (PyTorch's watchdog): a call that
 * holds its record (dgc_registry_comm_hold) keeps it and its entries alive
 * through a close, which then only marks it closing, and the call's last
 * drop frees it.
 *
 * No device memory is freed with the mutex held: the GPU path's release
 * waits for the GPU, and a kernel may wait for a peer thread that waits for
 * the mutex. Entries leave the tables under the lock and are freed after. */
#ifndef DGCSHIM_REGISTRY_H
#define DGCSHIM_REGISTRY_H

#include <stddef.h>
#include <stdint.h>

#include "dgcshim/engine.h"
#include "dgcshim/stats.h"
#include "dgcshim/wire_compact.h"

/* The configuration check of a communicator. */
enum { DGC_CHECK_PENDING = 0, DGC_CHECK_PASSED = 1, DGC_CHECK_FAILED = -1 };

typedef struct dgc_comm_counters dgc_comm_counters;

/* Which front end opened a record: MPI_Finalize frees only its own, since
 * NCCL communicators outlive MPI in a job that uses both. */
enum { DGC_OWNER_MPI = 0, DGC_OWNER_NCCL = 1 };

typedef struct {
    uint64_t id;
    int owner;           /* DGC_OWNER_* */
    const void *handle;  /* the NCCL communicator it is bound to (dgc_registry_comm_bind), or NULL */
    void *ext;           /* the front end's own per-communicator data, or NULL */
    void (*ext_free)(void *ext); /* frees ext when the record closes, after its buffers */
    int nranks;
    int rank;            /* this process's rank in it (set by the MPI front end; 0 on NCCL's) */
    int check;           /* DGC_CHECK_*; FAILED stays failed */
    int check_reported;  /* the failed check was logged on a later call */
    uint64_t calls;      /* compressed calls so far: the same count on every rank */
    size_t head;         /* the largest payload exchanged in one all-gather (a multiple of 8) */
    void *reserve;       /* head bytes to send + nranks * head to receive, reserved ahead */
    uint64_t live, created; /* buffer states on it now, and ever */
    /* Its steps as its calls show them: advanced when an entry is found
     * again within the current epoch (a buffer reduced twice means a new
     * step began). Buffers reduced once a step see it advance once a step
     * (twice for one reduced twice), whatever the buffers without state. */
    uint64_t epoch;
    uint64_t reuse_call, reuse_created; /* calls and created at the first call that found its state (0: none yet) */
    int growth_warned, budget_warned, fusion_warned;
    int table_full_warned;
    dgc_comm_counters *counters;
    int holds;           /* calls in flight that hold it (under the registry's lock) */
    int closing;         /* its communicator is ending (unbound): freed by the last drop when held */
    int inside;          /* short queries of the communicator under way (dgc_registry_comm_enter) */
    struct dgc_order *order; /* DGC_BUFFER_KEY=order or auto: its step, learnt from its calls (core/order.h) */
    struct dgc_places *places; /* DGC_BUFFER_KEY=auto: are its buffers made afresh (core/places.h)? */
    int by_place;        /* DGC_BUFFER_KEY=auto: they are: its states follow places, as under order */
    int order_warned;    /* the order of its calls changed, or its step is too long: said once */
    int moving_warned;   /* its one count's calls come at moving addresses: said once */
    const void *last_send, *last_buf; /* its latest call's addresses, while it has one count */
    uint64_t moves;      /* of those calls, the ones at other addresses than the call before */
} dgc_comm;

typedef struct dgc_buffer {
    uint64_t comm;    /* the id of its communicator */
    const void *send; /* the call's send buffer; NULL for in place */
    const void *buf;  /* the output buffer: where the gradient comes back */
    uint64_t count;
    uint64_t last_call; /* the communicator's call count at its latest use */
    uint64_t epoch;     /* the communicator's epoch at its latest use */
    dgc_state *state;
    void *payload;    /* this rank's payload */
    void *gathered;   /* the dense sum, kept for compensation after a dense-transport step */
    size_t payload_cap, gathered_cap;
    /* Momentum compensation's S_{t-1}: the last decoded step's wire buffer
     * (its compact payloads as received: prev_nranks of them, laid out as
     * prev_code, the first at prev + prev_code.bytes; prev_code.k 0 when
     * there is none), or with prev_dense the last step's dense sum S (count
     * floats): it went by the dense transport. prev_step: the step it was
     * summed at (what the headers' age is reckoned from). */
    void *prev;
    size_t prev_cap;
    uint64_t prev_step;
    int prev_nranks;
    int prev_dense;
    dgc_compact_layout prev_code;
    void *wire;       /* the compact payloads on the wire: this rank's, then every rank's */
    size_t wire_cap;
    /* DGC_TRANSPORT=reduce (mpi/reduce.c): its working memory, and the
     * region boundaries (bounds_ranks + 1 of them) balanced for the call at
     * bounds_step. */
    void *scratch;
    size_t scratch_cap;
    uint32_t *bounds;
    int bounds_ranks;
    uint64_t bounds_step;
    size_t bytes;     /* memory held, as last accounted */
    dgc_buffer_stats stats;
    /* The GPU path's state (dgc_registry_adopt) in place of state and the
     * host buffers: the CUDA engine's, opaque here, freed through
     * gpu_release, which also brings stats up to date first. */
    void *gpu;
    size_t gpu_bytes;
    void (*gpu_release)(struct dgc_buffer *b);
    void *gpu_owner;  /* the front end's per-communicator data, for gpu_release (set after adopt) */
    size_t gpu_elem;  /* bytes per element of the memory at buf (and send) that keys it (set after adopt) */
    /* A move of the GPU state into a smaller block that device memory
     * refused: the k it was for, and the communicator's call count then
     * (nccl/state.c's shrink tries again for a smaller k, or later). */
    uint64_t gpu_move_refused_k, gpu_move_refused_call;
    int pinned;       /* a call in flight uses it: never freed as idle or retired (dgc_registry_release_where) */
} dgc_buffer;

/* Step counters per communicator: distinct element counts it can track. A
 * count beyond them passes through (the same on every rank: the counts
 * arrive in the same order everywhere). */
#define DGC_COUNTS_PER_COMM 4096

/* Opens a record for a communicator of nranks ranks whose payloads up to
 * head bytes go in one all-gather; reserves the memory a rank without state
 * needs to take part. NULL when memory is short. */
dgc_comm *dgc_registry_comm_open(int nranks, size_t head);

/* dgc_registry_comm_open for a given front end (DGC_OWNER_*); the plain
 * one opens MPI's. */
dgc_comm *dgc_registry_comm_open_owned(int nranks, size_t head, int owner);

/* The open record with this id, or NULL. */
dgc_comm *dgc_registry_comm_find(uint64_t id);

/* NCCL communicators are known by their handle: binds the record id to
 * handle (0, or -1 when there is no such record), finds the record bound to
 * handle (NULL when none), and unbinds it, returning its id (0 when none),
 * so that the handle, freed by NCCL right after, can be reused at once.
 * Unbinding marks the record closing and returns once no query entered
 * with dgc_registry_comm_enter is under way. */
int dgc_registry_comm_bind(const void *handle, uint64_t id);
dgc_comm *dgc_registry_comm_by_handle(const void *handle);
uint64_t dgc_registry_comm_unbind(const void *handle);

/* Frees the record and every buffer state on it; their statistics are kept
 * for the report. Unknown ids are ignored. A held record is unbound from its
 * handle and marked closing instead; the last drop frees it. */
void dgc_registry_comm_close(uint64_t id);

/* The record bound to handle, held (NULL when none): it stays valid, closed
 * or not, until dgc_registry_comm_drop. hold_again adds a hold on a record
 * the caller holds already (a call held back in a group keeps its own). */
dgc_comm *dgc_registry_comm_hold(const void *handle);
void dgc_registry_comm_hold_again(dgc_comm *c);
void dgc_registry_comm_drop(dgc_comm *c);

/* 1 once the held record's communicator was closed (destroyed or aborted):
 * a call in flight must not touch the communicator again. */
int dgc_registry_comm_closing(dgc_comm *c);

/* Around a short, non-blocking query of the held record's communicator
 * (ncclCommGetAsyncError) from a call in flight: enter says 0 once the
 * communicator is ending (do not touch it), else 1, and the ending waits
 * for the matching leave. */
int dgc_registry_comm_enter(dgc_comm *c);
void dgc_registry_comm_leave(dgc_comm *c);

/* The step of this call: how many calls on (comm, count) came before it; a
 * function of the call sequence alone, hence identical on every rank.
 * Returns -1 when the communicator already tracks DGC_COUNTS_PER_COMM other
 * counts (the call must pass through). Counts the call in c->calls. */
int dgc_registry_next_step(dgc_comm *c, uint64_t count, uint64_t *step);

/* Takes back the step next_step gave, for a call that failed on every rank. */
void dgc_registry_undo_step(dgc_comm *c, uint64_t count);

/* Notes the addresses of a call of count (after next_step). Returns 1, once
 * per communicator, when c's compressed calls all have this one count and
 * at least half of its DGC_MOVES_CALLS or more calls came at other
 * addresses than the call before: one buffer at moving addresses (a fresh
 * array every step), or several persistent buffers of one size, which the
 * addresses alone cannot tell apart. */
#define DGC_MOVES_CALLS 8
int dgc_registry_note_moves(dgc_comm *c, uint64_t count, const void *send, const void *buf);

/* DGC_BUFFER_KEY=order: the call's position in c's step (dgc_order_next),
 * or DGC_ORDER_* (< 0) while the step is not known; and its undo. */
int64_t dgc_registry_order_next(dgc_comm *c, uint64_t count);
void dgc_registry_order_undo(dgc_comm *c);

/* What at (dgc_registry_order_next's answer to a count-element call) means
 * for the user, said once per communicator where it is a change of order or
 * a step too long: what names the communicator ("an NCCL communicator"). */
void dgc_registry_order_say(dgc_comm *c, int64_t at, uint64_t count, const char *what);

/* DGC_BUFFER_KEY=auto: learns c's step from every call, as order does,
 * and watches whether its buffers are made afresh (core/places.h): the
 * gradient's memory, send (NULL in place) or else buf, count elements of
 * elem bytes. Returns the call's position, to key its state as order
 * does, once they have shown it (*now 1 at the call that showed it), else
 * -1 (DGC_ORDER_TOO_LONG when no step will be learnt): key it by address.
 * A rank's own decision: never a call passed through or summed densely
 * for it. */
int64_t dgc_registry_auto_place(dgc_comm *c, uint64_t count, const void *send, const void *buf, size_t elem,
                                int *now);

/* Under DGC_BUFFER_KEY=order a state's key is (DGC_ORDER_SEND, its position
 * + 1 as the output "address", count): never a real buffer's. */
extern const int dgc_order_key_tag;
#define DGC_ORDER_SEND ((const void *)&dgc_order_key_tag)
#define DGC_ORDER_BUF(position) ((const void *)(uintptr_t)((position) + 1))

/* Counts the ranks agreed to sum densely from now on (their first call
 * found some rank without a state for it: NCCL path). A count next_step
 * has not seen reads 0. */
int dgc_registry_count_dense(dgc_comm *c, uint64_t count);
void dgc_registry_set_count_dense(dgc_comm *c, uint64_t count);

/* 1 the first time c shows the sign of fresh buffers every call, 0 before
 * and after: live states that keep growing, each starting from an empty
 * residual and stranding what it kept. Persistent buffers stop creating
 * states after the first iteration, so two signs count: creations still
 * outnumbering reuses once there are DGC_GROWTH_STATES states and
 * DGC_GROWTH_CALLS calls; or, sooner, DGC_GROWTH_AFTER_REUSE creations
 * after the first call that found its state (the second iteration had
 * begun), more than half of the calls since. Each front end words its own
 * warning. */
#define DGC_GROWTH_STATES 256
#define DGC_GROWTH_CALLS 512
#define DGC_GROWTH_AFTER_REUSE 32
int dgc_registry_growth_first(dgc_comm *c);

/* Frees the states on c unused for more than idle_calls of its calls (0:
 * never), or, sooner, for more than DGC_IDLE_EPOCHS of its epochs (whole
 * steps), pinned ones aside. Returns how many were freed. The second limit
 * frees what a program stopped reducing (DDP's step-0 bucket, the buckets a
 * rebuild left behind) after a few steps rather than idle_calls calls. */
#define DGC_IDLE_EPOCHS 4
uint64_t dgc_registry_free_idle(dgc_comm *c, uint64_t idle_calls);

/* Under memory pressure, before a new state is refused (idle_calls not 0):
 * frees the states on c that missed a whole epoch, pinned ones aside.
 * Returns how many were freed. */
uint64_t dgc_registry_free_stale(dgc_comm *c, uint64_t idle_calls);

/* Frees the entries on c, pinned ones aside, for which drop says so (called
 * under the registry's lock: drop must not call into the registry). Returns
 * how many were freed. */
uint64_t dgc_registry_release_where(dgc_comm *c, int (*drop)(const dgc_buffer *b, const void *ctx), const void *ctx);

/* How many live entries on c have this send and output buffer, whatever
 * their count: more than one or two is the sign of a fusion buffer that
 * packs different tensors from call to call. */
uint64_t dgc_registry_counts_at(dgc_comm *c, const void *send, const void *buf);

/* The entry for (send, buf, count) on c, or NULL. */
dgc_buffer *dgc_registry_find(dgc_comm *c, const void *send, const void *buf, uint64_t count);

typedef enum { DGC_CREATED = 0, DGC_OVER_BUDGET = 1, DGC_NO_MEMORY = -1 } dgc_create_result;

/* Creates the entry with fresh state, unless the process's state memory plus
 * estimate bytes would pass budget bytes (0: no budget). */
dgc_create_result dgc_registry_create(dgc_comm *c, const void *send, const void *buf, uint64_t count,
                                      int with_momentum, size_t estimate, size_t budget, dgc_buffer **out);

/* 1 when the process's state memory plus estimate bytes stays within budget
 * bytes (0: no budget). */
int dgc_registry_within_budget(size_t estimate, size_t budget);

/* Creates the entry for a state the front end made itself (the GPU path's:
 * gpu, holding gpu_bytes, freed by release, which the registry calls outside
 * its lock, after the entry left its tables: it must not call into the
 * registry).
 * DGC_NO_MEMORY when the entry could not be made; gpu is then not taken. */
dgc_create_result dgc_registry_adopt(dgc_comm *c, const void *send, const void *buf, uint64_t count, void *gpu,
                                     size_t gpu_bytes, void (*release)(dgc_buffer *b), dgc_buffer **out);

/* Makes the entry's payload buffers hold bytes and nranks * bytes, and gives
 * back room far beyond that (after warm-up). */
int dgc_registry_reserve(dgc_buffer *b, size_t bytes, int nranks);

/* Makes the entry's wire buffer hold bytes (its payload and nranks others'
 * in the compact encoding), giving back room far beyond that. */
int dgc_registry_reserve_wire(dgc_buffer *b, size_t bytes);

/* Makes the entry's scratch hold bytes (reduce transport), giving back room
 * far beyond that, and its bounds hold nranks + 1 boundaries (kept as they
 * are when they already do). */
int dgc_registry_reserve_scratch(dgc_buffer *b, size_t bytes, int nranks);

/* Keeps the dense sum of step (in gathered) as the previous step's: swaps
 * gathered and prev, so no copy. */
void dgc_registry_keep_dense(dgc_buffer *b, uint64_t step, int nranks);

/* Keeps the received compact payloads of step (in wire, after this rank's
 * own, laid out as code) as the previous step's: swaps wire and prev. */
void dgc_registry_keep_wire(dgc_buffer *b, const dgc_compact_layout *code, uint64_t step, int nranks);

/* Re-reads the memory an entry holds into the totals. */
void dgc_registry_account(dgc_buffer *b);

/* The entry's GPU state is now gpu, holding gpu_bytes (moved into a block
 * of another size by the front end, which freed the old one). */
void dgc_registry_gpu_moved(dgc_buffer *b, void *gpu, size_t gpu_bytes);

/* Calls fn for every live buffer entry, in creation order. */
void dgc_registry_each(void (*fn)(const dgc_buffer *b, void *ctx), void *ctx);

/* Freed states keep their statistics under their (send, buf, count), one row
 * per key, up to this many keys (the rest only in the totals): frameworks
 * such as Horovod free their communicators before MPI_Finalize, and a report
 * without the buffers they compressed would say nothing. */
#define DGC_RELEASED_ROWS 4096

/* One row of the statistics report. */
typedef struct {
    const void *send, *buf;
    uint64_t count;
    uint64_t states;  /* states that held this key: freed ones, plus 1 if live */
    int live;         /* a live entry has this key */
    size_t bytes;     /* the live entry's memory now (device memory included), 0 when none is live */
    size_t device_bytes; /* of those, its GPU state's device memory */
    dgc_buffer_stats stats; /* the live entry's and the freed states' together */
} dgc_report_row;

/* Calls fn (under the registry's lock: fn must not call into it) for each
 * live entry, in creation order, with the freed states of the same key folded
 * in, then for each key seen only in freed states, in order of first release. */
void dgc_registry_each_row(void (*fn)(const dgc_report_row *r, void *ctx), void *ctx);

/* Memory that cannot be freed safely while the process runs: mapped pinned
 * host memory (cudaFreeHost may wait for the whole device, which another
 * communicator's stuck kernel can make endless) that kernels may still
 * write. park keeps p (bytes long) with a token that says when the last
 * work that may touch it has finished (0, or -1 when memory for the list is
 * short: p is then left as it is); unpark hands back a parked block of
 * exactly bytes whose ready(token) says so (then drop_token(token)), or
 * NULL. ready is called under the registry's lock: it must not wait or call
 * into the registry. Parked memory is never freed: the process's end
 * returns it. */
int dgc_registry_park(void *p, size_t bytes, void *token);
void *dgc_registry_unpark(size_t bytes, int (*ready)(void *token), void (*drop_token)(void *token));

/* Why a compressed call failed on every rank, as this rank knows it: its own
 * reason when it took part flagged, else what the exchange told it. */
typedef enum {
    DGC_FAIL_MEMORY,      /* this rank had no memory (or budget) for the call's state or buffers */
    DGC_FAIL_MISALIGNED,  /* this rank's buffer is not aligned to its elements (NCCL path) */
    DGC_FAIL_ENGINE,      /* this rank's compression could not be enqueued (NCCL path) */
    DGC_FAIL_PEER,        /* another rank took part flagged */
    DGC_FAIL_BAD_PAYLOAD, /* a received payload failed its check */
    DGC_FAIL_CAUSES
} dgc_fail_cause;

/* Why a call went to the real all-reduce untouched. */
typedef enum {
    DGC_PASS_DISABLED, /* DGC_ENABLE=0 */
    DGC_PASS_OP,       /* not a sum (or, on NCCL, an average) */
    DGC_PASS_TYPE,     /* not a float type the shim compresses (MPI: 4-byte floats; NCCL: also fp16, bf16) */
    DGC_PASS_SMALL,    /* fewer elements than DGC_MIN_ELEMENTS */
    DGC_PASS_RANKS,    /* fewer ranks than DGC_MIN_RANKS, an inter-communicator or MPI_COMM_NULL */
    DGC_PASS_TABLE,    /* the communicator's table of counts is full */
    DGC_PASS_LARGE,    /* a payload too large for one all-gather */
    DGC_PASS_ORDER,    /* DGC_BUFFER_KEY=order while the communicator's step is learnt */
    DGC_PASS_OTHER,    /* the front end's own routing (NCCL: a capture, a communicator that failed its check) */
    DGC_PASS_REASONS
} dgc_pass_reason;

/* The reason's name in the report and the statistics file. */
const char *dgc_pass_reason_name(dgc_pass_reason why);

/* Process-wide figures for the statistics report. */
typedef struct {
    uint64_t released_states;  /* states freed before now (idle or communicator freed); their
                                * statistics are in dgc_registry_each_row's rows */
    dgc_buffer_stats released_unkeyed; /* of those, the ones past DGC_RELEASED_ROWS keys */
    uint64_t released_unkeyed_states;
    uint64_t live_states;
    size_t bytes, peak_bytes;  /* memory held by states and exchange buffers (reserves included) */
    size_t device_bytes, device_peak_bytes; /* of those, the GPU states' device memory */
    uint64_t passthrough;      /* pass-through calls, counted only when statistics are on */
    uint64_t passthrough_bytes; /* their bytes (count times the type's size) */
    uint64_t passthrough_by[DGC_PASS_REASONS]; /* of the pass-through calls, those for each reason */
    uint64_t compressed;       /* compressed calls (dgc_registry_count_compressed) */
    uint64_t over_budget;      /* calls summed densely because some rank was over its budget */
    uint64_t failed[DGC_FAIL_CAUSES]; /* calls that failed on every rank, by the cause this rank saw */
    uint64_t saturated;        /* steps whose update held some residual or momentum at +-FLT_MAX */
} dgc_registry_totals;

void dgc_registry_totals_get(dgc_registry_totals *t);
/* A pass-through call of this many bytes, for this reason (counted when
 * statistics are kept). */
void dgc_registry_count_passthrough(uint64_t bytes, dgc_pass_reason why);
/* The reason of a pass-through call alone, for a process without
 * statistics (the exit line when nothing was compressed). */
void dgc_registry_note_pass_reason(dgc_pass_reason why);
/* One more compressed call in this process; returns the count so far. */
uint64_t dgc_registry_count_compressed(void);
void dgc_registry_count_over_budget(void);
void dgc_registry_count_failed(dgc_fail_cause cause, uint64_t calls);
/* Steps whose update saturated (update_rules.h); the first ones logged once
 * per process (both front ends: a WARN naming the buffer's size). */
void dgc_registry_count_saturated(uint64_t steps, uint64_t count);
/* The cause's words in the report ("for memory", ...). */
const char *dgc_fail_cause_name(dgc_fail_cause cause);

/* Two ints the front end keeps for the life of the process (its MPI
 * attribute keyvals); -1 until set. */
enum { DGC_HOOK_COMM_KEY, DGC_HOOK_SELF_KEY, DGC_HOOK_COUNT };
int dgc_registry_hook(int which);
void dgc_registry_set_hook(int which, int value);

/* Addresses a front end looks up once and keeps (the real functions it
 * forwards to, a language's sentinels): NULL until set. Reads take no lock,
 * since pass-through calls read them; a slot is written with the same value
 * by whoever resolves it first. The Fortran front end uses the slots below
 * DGC_SLOT_NCCL_BASE, the NCCL one those from it on. */
#define DGC_SLOT_COUNT 64
#define DGC_SLOT_NCCL_BASE 32
void *dgc_registry_slot(int which);
void dgc_registry_set_slot(int which, void *value);

/* Process-wide one-time work: runs fn once, the first caller running it
 * while later ones wait until it has returned (pthread_once). */
enum { DGC_ONCE_NCCL_SETUP, DGC_ONCE_COUNT };
void dgc_registry_once(int which, void (*fn)(void));

/* Process-wide flags, clear until claimed: dgc_registry_claim sets one and
 * returns 1 for the one caller that found it clear (so a message is said
 * once, a report printed once), 0 for every other. */
enum {
    DGC_FLAG_REPORTED,           /* the DGC_STATS report was printed */
    DGC_FLAG_NCCL_PARSE_FAILED,  /* the NCCL front end found the DGC_* environment invalid */
    DGC_FLAG_NCCL_BANNER,        /* the NCCL path's first-use line was logged */
    DGC_FLAG_NCCL_CAPTURE_SAID,  /* pass-through under CUDA graph capture was logged */
    DGC_FLAG_NCCL_CAPTURE_QUERY_SAID, /* a failed cudaStreamIsCapturing was logged */
    DGC_FLAG_NCCL_MISSING_SAID,  /* no real NCCL could be found: logged */
    DGC_FLAG_SATURATED_SAID,     /* a saturated residual was logged */
    DGC_FLAG_STATS_FILE_OPENED,  /* DGC_STATS_FILE's file was started afresh (truncated) */
    DGC_FLAG_STATS_FILE_FAILED,  /* writing DGC_STATS_FILE failed: logged */
    DGC_FLAG_STATS_FILE_FINAL,   /* the exit line of DGC_STATS_FILE was written */
    DGC_FLAG_TYPE_PASSTHROUGH_SAID, /* a gradient-sized sum of a type not compressed (float64) was logged */
    DGC_FLAG_COUNT
};
int dgc_registry_claim(int which);
int dgc_registry_flag(int which);

/* Process-wide event counters of the NCCL front end, counted whatever
 * DGC_STATS says (the exit line and the exit warning read them). */
enum {
    DGC_TALLY_MPI_COMPRESSED,  /* MPI_Allreduce calls compressed (whatever the statistics) */
    DGC_TALLY_NCCL_CALLS,      /* interposed NCCL calls of any kind */
    DGC_TALLY_NCCL_COMPRESSED, /* ncclAllReduce calls compressed */
    DGC_TALLY_NCCL_PASSED,     /* ncclAllReduce calls passed through */
    DGC_TALLY_NCCL_CAPTURED,   /* of those, under CUDA graph capture */
    DGC_TALLY_COUNT
};
void dgc_registry_tally_add(int which);
uint64_t dgc_registry_tally(int which);

/* Frees every record of one front end (DGC_OWNER_*) and its entries
 * (their statistics are kept for the report). */
void dgc_registry_clear_owner(int owner);

/* Frees every record and entry (their statistics are kept for the report). */
void dgc_registry_clear(void);

#endif
