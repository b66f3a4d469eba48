/* The NCCL front end's decisions, as plain functions of what every rank
 * knows alike (invariant 1), apart from the code that calls CUDA and NCCL:
 * which ncclAllReduce calls are compressed, forwarded or held back in a
 * group; the rounds a batch of held-back calls runs in; which collectives a
 * call issues; the ranks' votes and the configuration check's verdict.
 * Nothing here includes CUDA or NCCL, so tests/unit/test_nccl_rules.c runs
 * them on any machine. */
#ifndef DGCSHIM_NCCL_RULES_H
#define DGCSHIM_NCCL_RULES_H

#include <stddef.h>
#include <stdint.h>

#include "core/registry.h"
#include "dgcshim/policy.h"

/* What routes one ncclAllReduce call. Every field but capturing is known
 * without a CUDA call; all are the same on every rank for the same call. */
typedef struct {
    int candidate;    /* a communicator, op ncclSum or ncclAvg, type float32, float16 or bfloat16 */
    int known;        /* the shim has a record for the communicator */
    int check;        /* the record's configuration check (DGC_CHECK_*), when known */
    int compressible; /* dgc_policy_compressible(count, the communicator's size), when known */
    int count_dense;  /* the ranks agreed to sum this count densely, when known and compressible */
    int in_group;     /* inside ncclGroupStart/End on this thread */
    int group_holds;  /* this thread's group holds a call on the communicator back already */
    int capturing;    /* the stream is being captured into a CUDA graph: 1, 0, or -1 not asked yet */
} dgc_nccl_facts;

typedef enum {
    DGC_ROUTE_PASS,          /* to the real ncclAllReduce now, untouched */
    DGC_ROUTE_PASS_DENSE,    /* the same, counted as summed densely over budget */
    DGC_ROUTE_HOLD,          /* untouched, but held back in the group behind its communicator's held call */
    DGC_ROUTE_HOLD_DENSE,    /* the same, counted as summed densely */
    DGC_ROUTE_FAIL,          /* ncclInvalidUsage, nothing issued: the ranks disagree on the configuration */
    DGC_ROUTE_ASK_CAPTURE,   /* ask whether the stream is being captured (on the device), then route again */
    DGC_ROUTE_PASS_CAPTURED, /* untouched: a graph replay would not repeat the shim's host-side decisions */
    DGC_ROUTE_OPEN,          /* open a record for the communicator, then route again */
    DGC_ROUTE_CHECK_NOW,     /* run the configuration check (a host wait), then route again */
    DGC_ROUTE_CHECK_LATER,   /* in a group: untouched now, checked after the outermost ncclGroupEnd */
    DGC_ROUTE_RUN,           /* compressed now */
    DGC_ROUTE_DEFER,         /* in a group: recorded, compressed after the outermost ncclGroupEnd */
} dgc_nccl_route;

/* The next step for a call. ASK_CAPTURE, OPEN and CHECK_NOW ask the caller
 * to learn one more fact and route again; every other answer is final.
 * Inside a group nothing is launched (invariant 5): never RUN or CHECK_NOW. */
dgc_nccl_route dgc_nccl_route_of(const dgc_nccl_facts *f);

/* How a rank takes part in a compressed call. */
enum {
    DGC_NCCL_PASS,   /* forwarded to the real ncclAllReduce (decided from collective inputs) */
    DGC_NCCL_STATE,  /* with its state */
    DGC_NCCL_FAILED, /* without state: a flag-only payload, output NaN on every rank */
    DGC_NCCL_DEAD    /* not even that: nothing issued (last resort), or the exchange failed */
};

/* The rounds n held-back calls run in: round[i] is the number of calls
 * before i on the same communicator (comms[i]), so each communicator's
 * calls run whole, in the order made. Returns the number of rounds. */
int dgc_nccl_rounds(const void *const *comms, int n, int *round);

/* The collectives a call issues in exchange phase 0 (the payloads'
 * all-gather, the pass-through all-reduce, or the dense transport's header
 * all-gather and reduce-scatters) or 1 (the dense transport's all-gathers);
 * block and rem are the dense sum's block and remainder. */
int dgc_nccl_collectives(int part, int dense, size_t block, size_t rem, int phase);

/* A count's first call (step 0) with or without a state: its ranks vote
 * on whether every one holds a state (a communicator of one decides alone). */
int dgc_nccl_votes(int part, uint64_t step, int nranks);

/* The vote's outcome: 1 when some rank said it has no state (votes[r]
 * non-zero), and the count is summed densely from then on. */
int dgc_nccl_vote_dense(const unsigned char *votes, int nranks);

/* The configuration check's verdict from every rank's words (nranks rows
 * of nwords: the words before parse must be equal on every rank; the word
 * at parse says the rank could not parse its environment; the words after
 * it are facts of the rank's own, such as its node, never compared):
 * DGC_CHECK_PASSED, or DGC_CHECK_FAILED with *bad_rank the first rank that
 * could not parse (else -1) and *bad_word the first word that differs from
 * rank 0's (else -1). */
int dgc_nccl_verdict(const uint64_t *all, int nranks, int nwords, int parse, int *bad_rank, int *bad_word);

/* The node layout of a communicator from every rank's node identity
 * (ids[r * stride], the same on every rank), by the MPI path's rule: 2 or
 * more nodes of an equal L >= 2 ranks. Nodes are ordered by their lowest
 * rank; local ranks by rank within the node. Fills *out for this rank
 * (rank) and *node_index (its node's place in that order: the cross
 * communicator's key), and returns NULL; or returns why the communicator
 * stays flat (*out flat: node 0, nodes nranks, node_size 1). */
const char *dgc_nccl_layout_of(const uint64_t *ids, int nranks, int stride, int rank, dgc_layout *out,
                               int *node_index);

/* Calls of a communicator after a refused move of a GPU state into a
 * smaller block before the next try (dgc_nccl_move_due). */
#define DGC_NCCL_MOVE_RETRY_CALLS 1000

/* Whether a state whose move device memory refused (for k refused_k at the
 * communicator's call refused_call; refused_k 0: none refused) tries again
 * now, for want_k at call calls: for a smaller k (a later warm-up stage),
 * or DGC_NCCL_MOVE_RETRY_CALLS calls on. Under memory pressure each try is
 * an allocation that fails. */
int dgc_nccl_move_due(uint64_t refused_k, uint64_t refused_call, uint64_t want_k, uint64_t calls);

/* The configuration the NCCL path plans with: cfg itself, or with
 * DGC_TRANSPORT=reduce (the MPI path's alone) a copy in spare that says
 * auto, so that its calls go by whichever of the all-gather and the dense
 * transport sends fewer bytes. */
const dgc_config *dgc_nccl_planning_config(const dgc_config *cfg, dgc_config *spare);

#endif
