/* The node layout (DGC_TOPOLOGY): find it once per communicator, make its
 * two sub-communicators, and move a call's data inside the node.
 *
 * A communicator of M nodes of L ranks each is split twice: node (the L
 * ranks of one node, by rank) and cross (the M ranks of one local rank, one
 * per node, in the order of the nodes' lowest ranks). A call sums the
 * buffer exactly inside the node, shard by shard, each local rank l getting
 * the node's sum of shard l (dgc_policy_shard) added in local-rank order
 * whatever MPI's own reduction algorithm; l compresses it and exchanges it
 * over cross like a flat call on M ranks; the node then all-gathers the
 * decoded shards. Only the cross exchange leaves the machine.
 *
 * The layout is found collectively, when the communicator's record is
 * attached (right after its configuration check), from what MPI says of the
 * ranks (or DGC_NODE_SIZE) and never from timing, so that every rank holds
 * the same one (rule 1). The sub-communicators and the cross record die
 * with the communicator's record (its ext). */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/pages.h"
#include "internal.h"

struct dgc_mpi_node {
    dgc_layout layout;
    MPI_Comm node, cross;
    uint64_t cross_id;  /* the cross communicator's record (registry) */
    float *scratch;     /* the L pieces of this rank's shard, as received */
    size_t scratch_bytes;
    /* The node's collectives' tables, per local rank: its shard's length and
     * start (what this rank sends it, and the all-gather's layout), and
     * where its piece of this rank's shard lands in scratch. */
    int *counts, *displs, *rcounts, *rdispls;
};

static void node_free(void *p) {
    dgc_mpi_node *x = p;
    if (!x) return;
    if (x->cross_id) dgc_registry_comm_close(x->cross_id); /* already gone after MPI_Finalize's clear: ignored */
    if (x->node != MPI_COMM_NULL) PMPI_Comm_free(&x->node);
    if (x->cross != MPI_COMM_NULL) PMPI_Comm_free(&x->cross);
    dgc_pages_free(x->scratch, x->scratch_bytes);
    free(x->counts); /* one block for the four tables */
    free(x);
}

/* Why a communicator stays flat, said at debug level (and at the default
 * level where DGC_TOPOLOGY=node asked for the node layout). */
static void say_flat(int rank, const dgc_config *cfg, int size, const char *why) {
    if (rank != 0) return;
    if (cfg->topology == DGC_TOPOLOGY_NODE)
        DGC_WARN("DGC_TOPOLOGY=node: a communicator of %d ranks stays flat: %s", size, why);
    else
        DGC_DEBUG("a communicator of %d ranks is flat: %s", size, why);
}

/* The node this rank is in: L consecutive ranks under DGC_NODE_SIZE, else
 * the ranks MPI says share its memory. */
static int split_node(MPI_Comm comm, int rank, const dgc_config *cfg, MPI_Comm *node) {
    if (cfg->node_size) return PMPI_Comm_split(comm, (int)((uint64_t)rank / cfg->node_size), rank, node);
    return PMPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, node);
}

/* Every rank's view, agreed in one all-reduce (MAX) over comm: the largest
 * and smallest node sizes (the smallest as its negation) and whether some
 * rank could not make its part. */
enum { AGREE_L, AGREE_MINUS_L, AGREE_FAILED, AGREE_WORDS };

static int agree(MPI_Comm comm, int mine_l, int failed, int out[AGREE_WORDS]) {
    int in[AGREE_WORDS] = {mine_l, -mine_l, failed};
    return PMPI_Allreduce(in, out, AGREE_WORDS, MPI_INT, MPI_MAX, comm);
}

/* The cross communicator (a collective over comm: every rank makes it, also
 * one short of memory), its record, and the tables of the node's
 * collectives: 0, or -1 when this rank could not make them. */
static int make_cross(MPI_Comm comm, int rank, dgc_mpi_node *x, size_t head) {
    int leader = rank, cross_rank = 0; /* the node's lowest rank orders the nodes in cross */
    if (PMPI_Allreduce(MPI_IN_PLACE, &leader, 1, MPI_INT, MPI_MIN, x->node) != MPI_SUCCESS) return -1;
    if (PMPI_Comm_split(comm, x->layout.local, leader, &x->cross) != MPI_SUCCESS) return -1;
    PMPI_Comm_set_errhandler(x->cross, MPI_ERRORS_RETURN);
    PMPI_Comm_set_errhandler(x->node, MPI_ERRORS_RETURN);
    const size_t L = (size_t)x->layout.node_size;
    x->counts = calloc(4 * L, sizeof *x->counts);
    if (!x->counts) return -1;
    x->displs = x->counts + L;
    x->rcounts = x->displs + L;
    x->rdispls = x->rcounts + L;
    dgc_comm *cc = dgc_registry_comm_open(x->layout.nodes, head);
    if (!cc) return -1;
    PMPI_Comm_rank(x->cross, &cross_rank);
    cc->rank = cross_rank;
    cc->check = DGC_CHECK_PASSED; /* the parent's check covers it */
    x->cross_id = cc->id;
    return 0;
}

/* Why comm stays flat, from every rank's node size (v, agreed), or NULL. */
static const char *flat_reason(const int v[AGREE_WORDS], int nranks) {
    if (v[AGREE_FAILED]) return "a rank could not split it into nodes";
    if (v[AGREE_L] != -v[AGREE_MINUS_L]) return "its nodes have different numbers of ranks";
    if (v[AGREE_L] < 2) return "one rank per node";
    if (v[AGREE_L] == nranks) return "all its ranks are on one node";
    return NULL;
}

dgc_mpi_node *dgc_mpi_node_find(MPI_Comm comm, int nranks, const dgc_config *cfg, size_t (*head)(int)) {
    if (cfg->topology == DGC_TOPOLOGY_FLAT || !cfg->enable) return NULL; /* nothing to ask: alike everywhere */
    int rank = 0, mine = 0, local = 0, v[AGREE_WORDS] = {0};
    PMPI_Comm_rank(comm, &rank);
    MPI_Comm node = MPI_COMM_NULL;
    int failed = split_node(comm, rank, cfg, &node) != MPI_SUCCESS; /* every rank splits, memory or not */
    if (!failed) {
        PMPI_Comm_size(node, &mine);
        PMPI_Comm_rank(node, &local);
    }
    dgc_mpi_node *x = calloc(1, sizeof *x);
    failed |= !x;
    const char *why = agree(comm, mine, failed, v) != MPI_SUCCESS ? "its check failed" : flat_reason(v, nranks);
    if (why) {
        if (node != MPI_COMM_NULL) PMPI_Comm_free(&node);
        free(x);
        say_flat(rank, cfg, nranks, why);
        return NULL;
    }
    x->node = node; /* x owns it from here */
    x->cross = MPI_COMM_NULL;
    x->layout = (dgc_layout){.node = 1, .nodes = nranks / mine, .node_size = mine, .local = local};
    failed = make_cross(comm, rank, x, head(x->layout.nodes)) != 0;
    if (agree(comm, mine, failed, v) != MPI_SUCCESS || v[AGREE_FAILED]) {
        node_free(x);
        say_flat(rank, cfg, nranks, "a rank had no memory for its sub-communicators");
        return NULL;
    }
    if (rank == 0)
        DGC_DEBUG("a communicator of %d ranks is in node layout: %d nodes of %d ranks (%s)", nranks, x->layout.nodes,
                  x->layout.node_size, cfg->node_size ? "DGC_NODE_SIZE" : "MPI_COMM_TYPE_SHARED");
    return x;
}

void dgc_mpi_node_attach(dgc_comm *c, dgc_mpi_node *x) {
    c->ext = x;
    c->ext_free = node_free;
}

dgc_mpi_node *dgc_mpi_node_of(const dgc_comm *c) {
    return c->ext_free == node_free ? c->ext : NULL;
}

const dgc_layout *dgc_mpi_node_layout(const dgc_mpi_node *x) { return &x->layout; }

dgc_comm *dgc_mpi_node_cross(const dgc_mpi_node *x, MPI_Comm *cross) {
    *cross = x->cross;
    return dgc_registry_comm_find(x->cross_id);
}

/* Room for the L pieces of this rank's shard, len elements. */
int dgc_mpi_node_reserve(dgc_mpi_node *x, uint64_t len) {
    size_t need = (size_t)len * (size_t)x->layout.node_size * sizeof(float);
    if (need == 0) need = sizeof(float);
    if (need <= x->scratch_bytes && need * 4 >= x->scratch_bytes) return 0; /* kept unless far too large */
    dgc_pages_free(x->scratch, x->scratch_bytes);
    x->scratch = dgc_pages_alloc(need);
    x->scratch_bytes = x->scratch ? need : 0;
    return x->scratch ? 0 : -1;
}

int dgc_mpi_node_agree(const dgc_mpi_node *x, int64_t *words, int count) {
    return PMPI_Allreduce(MPI_IN_PLACE, words, count, MPI_INT64_T, MPI_MAX, x->node);
}

/* The shards' counts and starts for an n-element call (n <= INT_MAX), and
 * where the pieces of this rank's shard land: back to back. */
static void shard_table(dgc_mpi_node *x, uint64_t n) {
    const int L = x->layout.node_size;
    for (int l = 0; l < L; l++) {
        uint64_t lo, hi;
        dgc_policy_shard(n, L, l, &lo, &hi);
        x->counts[l] = (int)(hi - lo);
        x->displs[l] = (int)lo;
    }
    const int len = x->counts[x->layout.local];
    for (int l = 0; l < L; l++) {
        x->rcounts[l] = len;
        x->rdispls[l] = l * len; /* L len <= n + L - 1: within int, as n <= INT_MAX - L */
    }
}

/* 1 when some float of v[0, len) is Inf or NaN: all exponent bits set. An
 * integer OR over the bits, which the compiler vectorises (a float test with
 * an early exit it would not). */
static int any_nonfinite(const float *v, size_t len) {
    const uint32_t exp = 0x7f800000u;
    uint32_t bad = 0;
    for (size_t i = 0; i < len; i++) {
        uint32_t b;
        memcpy(&b, &v[i], sizeof b); /* a plain load once compiled */
        bad |= (uint32_t)((b & exp) == exp);
    }
    return bad != 0;
}

/* Each local rank gets shard l of every local rank's g (an all-to-all), and
 * adds them in local-rank order into the first piece: ((g_0 + g_1) + g_2)
 * ..., the same bits whatever MPI's reduction would do. */
int dgc_mpi_node_sum(dgc_mpi_node *x, const float *g, uint64_t n, float **sum, int *nonfinite) {
    shard_table(x, n);
    int rc = PMPI_Alltoallv(g, x->counts, x->displs, MPI_FLOAT, x->scratch, x->rcounts, x->rdispls, MPI_FLOAT,
                            x->node);
    if (rc != MPI_SUCCESS) return rc;
    const size_t len = (size_t)x->counts[x->layout.local];
    float *s = x->scratch;
    for (int l = 1; l < x->layout.node_size; l++) {
        const float *piece = x->scratch + (size_t)l * len;
        for (size_t i = 0; i < len; i++) s[i] += piece[i];
    }
    *nonfinite = any_nonfinite(s, len);
    *sum = s;
    return MPI_SUCCESS;
}

int dgc_mpi_node_spread(dgc_mpi_node *x, float *work, uint64_t n) {
    shard_table(x, n);
    return PMPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, work, x->counts, x->displs, MPI_FLOAT, x->node);
}

void dgc_mpi_node_describe(const dgc_mpi_node *x, char *buf, size_t len) {
    if (!x) snprintf(buf, len, "flat");
    else snprintf(buf, len, "node, %d nodes x %d ranks", x->layout.nodes, x->layout.node_size);
}
