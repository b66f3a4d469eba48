/* The NCCL front end's decisions (rules.h). Every input is the same on
 * every rank for the same call, so every rank decides the same
 * (invariant 1); what only one rank knows (pointers, data, memory) never
 * enters here. */
#include "rules.h"

/* Untouched, and in a group behind its communicator's held call when there
 * is one: each communicator sees its all-reduces in the order they were
 * made, as a rank that does not group sees them. */
static dgc_nccl_route forward(const dgc_nccl_facts *f, int dense) {
    if (f->in_group && f->group_holds) return dense ? DGC_ROUTE_HOLD_DENSE : DGC_ROUTE_HOLD;
    return dense ? DGC_ROUTE_PASS_DENSE : DGC_ROUTE_PASS;
}

/* The cheap tests come first: the calls frameworks make most (tiny, or of
 * other types) pass with no CUDA call. */
dgc_nccl_route dgc_nccl_route_of(const dgc_nccl_facts *f) {
    if (!f->candidate) return forward(f, 0);
    const int passed = f->known && f->check == DGC_CHECK_PASSED;
    if (f->known && f->check == DGC_CHECK_FAILED) return DGC_ROUTE_FAIL;
    if (passed && !f->compressible) return forward(f, 0);
    if (passed && f->count_dense) return forward(f, 1);
    if (f->capturing < 0) return DGC_ROUTE_ASK_CAPTURE;
    if (f->capturing) return DGC_ROUTE_PASS_CAPTURED;
    if (!f->known) return DGC_ROUTE_OPEN;
    if (!passed) return f->in_group ? DGC_ROUTE_CHECK_LATER : DGC_ROUTE_CHECK_NOW;
    return f->in_group ? DGC_ROUTE_DEFER : DGC_ROUTE_RUN;
}

int dgc_nccl_rounds(const void *const *comms, int n, int *round) {
    int rounds = 0;
    for (int i = 0; i < n; i++) {
        round[i] = 0;
        for (int j = 0; j < i; j++) round[i] += comms[j] == comms[i];
        if (round[i] + 1 > rounds) rounds = round[i] + 1;
    }
    return rounds;
}

int dgc_nccl_collectives(int part, int dense, size_t block, size_t rem, int phase) {
    if (part == DGC_NCCL_DEAD) return 0;
    if (part == DGC_NCCL_PASS || !dense) return phase == 0;
    const int sum = (block > 0) + (rem > 0);
    return phase == 0 ? 1 + sum : sum;
}

int dgc_nccl_votes(int part, uint64_t step, int nranks) {
    return (part == DGC_NCCL_STATE || part == DGC_NCCL_FAILED) && step == 0 && nranks > 1;
}

int dgc_nccl_vote_dense(const unsigned char *votes, int nranks) {
    for (int r = 0; r < nranks; r++)
        if (votes[r]) return 1;
    return 0;
}

int dgc_nccl_verdict(const uint64_t *all, int nranks, int nwords, int parse, int *bad_rank, int *bad_word) {
    *bad_rank = *bad_word = -1;
    for (int r = 0; r < nranks; r++) {
        if (!all[(size_t)r * (size_t)nwords + (size_t)parse]) continue;
        *bad_rank = r;
        return DGC_CHECK_FAILED;
    }
    (void)nwords; /* the row's stride: the words after parse are the rank's own */
    for (int i = 0; i < parse; i++)
        for (int r = 1; r < nranks; r++)
            if (all[(size_t)r * (size_t)nwords + (size_t)i] != all[i]) {
                *bad_word = i;
                return DGC_CHECK_FAILED;
            }
    return DGC_CHECK_PASSED;
}

/* The rank's place in its node (ranks before it with its id) and the node's
 * first rank. */
static int local_of(const uint64_t *ids, int stride, int rank, int *first) {
    int local = 0;
    *first = rank;
    for (int r = rank - 1; r >= 0; r--)
        if (ids[(size_t)r * (size_t)stride] == ids[(size_t)rank * (size_t)stride]) {
            local++;
            *first = r;
        }
    return local;
}

const char *dgc_nccl_layout_of(const uint64_t *ids, int nranks, int stride, int rank, dgc_layout *out,
                               int *node_index) {
    *out = (dgc_layout){.node = 0, .nodes = nranks, .node_size = 1, .local = 0};
    *node_index = rank;
    int nodes = 0, size = -1, first;
    for (int r = 0; r < nranks; r++) { /* each node counted at its first rank, sized there */
        if (local_of(ids, stride, r, &first) != 0) continue;
        int members = 0;
        for (int q = r; q < nranks; q++) members += ids[(size_t)q * (size_t)stride] == ids[(size_t)r * (size_t)stride];
        if (size >= 0 && members != size) return "its nodes have different numbers of ranks";
        size = members;
        nodes++;
    }
    if (size < 2) return "one rank per node";
    if (nodes < 2) return "all its ranks are on one node";
    const int local = local_of(ids, stride, rank, &first);
    int index = 0;
    for (int r = 0; r < first; r++) index += local_of(ids, stride, r, &(int){0}) == 0;
    *out = (dgc_layout){.node = 1, .nodes = nodes, .node_size = size, .local = local};
    *node_index = index;
    return NULL;
}

int dgc_nccl_move_due(uint64_t refused_k, uint64_t refused_call, uint64_t want_k, uint64_t calls) {
    return refused_k == 0 || want_k < refused_k || calls - refused_call >= DGC_NCCL_MOVE_RETRY_CALLS;
}

const dgc_config *dgc_nccl_planning_config(const dgc_config *cfg, dgc_config *spare) {
    if (cfg->transport != DGC_TRANSPORT_REDUCE) return cfg;
    *spare = *cfg;
    spare->transport = DGC_TRANSPORT_AUTO;
    return spare;
}
