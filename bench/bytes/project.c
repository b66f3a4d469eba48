/* A projection of one compressed call's time to many ranks on 1 Gbit/s
 * Ethernet, from an alpha-beta model fed with the policy's bytes (the same
 * formulas the shim sends by, which bench/bytes/run.sh checks against the
 * PMPI counter up to 64 ranks) and each algorithm's message count:
 *   time = messages * alpha + bytes * beta + engine
 * dense ring: 2 (N-1) messages; sparse all-gather (ring): N-1; reduce: the
 * headers' round (32 bytes a rank: recursive doubling, ceil(log2 N)), the
 * all-to-all and the all-gather (N-1 each).
 *
 * Node mode (--nodes M --node-size L): M machines of L ranks, N = M L, each
 * machine's ranks behind one network card, and bytes counted through that
 * card, the slow link. The hierarchical scheme: an exact sum inside the
 * machine (a reduce-scatter: rank l holds the sum of shard l, elements
 * [floor(l n/L), floor((l+1) n/L))), DGC on each shard (k_shard =
 * dgc_k_for(n_shard, 1 - s)), a ring all-gather of each shard's payloads
 * among the M ranks with the same local rank (M-1 messages, (M-1) payloads
 * a rank, L ranks a card) and an all-gather of the decoded shards inside the
 * machine. Beside it, a card's bytes for the flat algorithms, ranks placed
 * machine by machine:
 *   flat recursive doubling / Bruck all-gather (Open MPI below 32 ranks):
 *     each of the L ranks receives the N-L payloads of the other machines'
 *     ranks: L (N-L) P; ceil(log2 N) messages (Bruck's rounds all cross a
 *     machine boundary for some rank, so none is free);
 *   flat ring all-gather: one ring edge leaves each machine, and an edge
 *     carries what one rank sends: (N-1) P, N-1 messages;
 *   reduce transport: L b.reduce (what the L ranks send, their on-machine
 *     peers' share included: a slight overcount);
 *   dense ring all-reduce: one edge per ring direction crosses each card:
 *     2 (N-1)/N 4n bytes, 2 (N-1) messages.
 * The intra-machine phases cost nothing on the slow link; --intra GBIT
 * charges their bytes (2 (L-1)/L 4n a rank: the reduce-scatter and the
 * all-gather of dense shards) at GBIT a rank, without alpha (a machine's
 * fabric's latency is not TCP's); 0, the default, leaves them out.
 *
 *   project N_FLOATS SPARSITY ENGINE_MS [ALPHA_US [GBIT]]
 *   project --nodes M --node-size L [--intra GBIT] N_FLOATS SPARSITY ENGINE_MS [ALPHA_US [GBIT]] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dgcshim/policy.h"

#define VALUE_BITS 16 /* the shim's default DGC_VALUE_BITS */

typedef struct {
    uint64_t n, k;
    double sparsity, engine, alpha, beta; /* engine: seconds a call; alpha: a message; beta: a byte */
} model;

static void project_ranks(const model *m) {
    printf("# %llu floats, k %llu, alpha %.0f us, %.1f Gbit/s, engine %.2f ms a call\n", (unsigned long long)m->n,
           (unsigned long long)m->k, m->alpha * 1e6, 8.0 / m->beta / 1e9, m->engine * 1e3);
    printf("%6s %14s %12s %12s %10s %10s %10s %9s %9s\n", "ranks", "dense_bytes", "sparse", "reduce", "dense_ms",
           "sparse_ms", "reduce_ms", "x_sparse", "x_reduce");
    const int ranks[] = {2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};
    for (size_t i = 0; i < sizeof ranks / sizeof *ranks; i++) {
        const int N = ranks[i];
        dgc_transport_bytes b;
        dgc_transport_bytes_for(m->n, 4, m->k, VALUE_BITS, N, &b);
        const double dense = 2.0 * (N - 1) / N * 4.0 * (double)m->n;
        const double td = 2.0 * (N - 1) * m->alpha + dense * m->beta;
        const double ts = (N - 1) * m->alpha + (double)b.sparse * m->beta + m->engine;
        const double tr =
            (ceil(log2((double)N)) + 2.0 * (N - 1)) * m->alpha + (double)b.reduce * m->beta + m->engine;
        printf("%6d %14.0f %12llu %12llu %10.2f %10.2f %10.2f %8.1fx %8.1fx\n", N, dense, (unsigned long long)b.sparse,
               (unsigned long long)b.reduce, td * 1e3, ts * 1e3, tr * 1e3, td / ts, td / tr);
    }
}

/* One payload of each of the L shards, summed: the shards' sizes differ by
 * one element at most, but their payloads are counted as the shim would
 * size each. The largest shard's k is reported beside. */
static uint64_t shard_payloads(const model *m, int L, int M, uint64_t *k_shard) {
    uint64_t sum = 0;
    *k_shard = 0;
    for (int l = 0; l < L; l++) {
        const uint64_t lo = (uint64_t)l * m->n / (uint64_t)L, hi = (uint64_t)(l + 1) * m->n / (uint64_t)L;
        const uint64_t k = dgc_k_for(hi - lo, 1.0 - m->sparsity);
        dgc_transport_bytes b;
        dgc_transport_bytes_for(hi - lo, 4, k, VALUE_BITS, M, &b);
        sum += b.payload;
        if (k > *k_shard) *k_shard = k;
    }
    return sum;
}

static void row(const char *name, double card_bytes, double messages, double extra, const model *m, double dense_s) {
    const double t = messages * m->alpha + card_bytes * m->beta + extra;
    printf("%-10s %14.0f %9.0f %10.2f %9.1fx\n", name, card_bytes, messages, t * 1e3, dense_s / t);
}

static void project_nodes(const model *m, int M, int L, double intra_gbit) {
    const int N = M * L;
    uint64_t k_shard;
    const double shards = (double)shard_payloads(m, L, M, &k_shard);
    dgc_transport_bytes b;
    dgc_transport_bytes_for(m->n, 4, m->k, VALUE_BITS, N, &b);
    const double P = (double)b.payload, n4 = 4.0 * (double)m->n;
    /* Node mode's intra-machine phases, per rank, on the machine's fabric. */
    const double intra = intra_gbit > 0 ? 2.0 * (L - 1) / L * n4 * 8.0 / (intra_gbit * 1e9) : 0.0;
    printf("# node mode: %d machines x %d ranks (N %d), %llu floats, k %llu (payload %.0f bytes), shard %llu floats, "
           "k_shard %llu; alpha %.0f us, %.1f Gbit/s a machine's card, engine %.2f ms a call (node: the same, not "
           "scaled by 1/L); intra-machine phases ",
           M, L, N, (unsigned long long)m->n, (unsigned long long)m->k, P, (unsigned long long)(m->n / (uint64_t)L),
           (unsigned long long)k_shard, m->alpha * 1e6, 8.0 / m->beta / 1e9, m->engine * 1e3);
    if (intra_gbit > 0)
        printf("charged at %.0f Gbit/s a rank (%.2f ms, no alpha)\n", intra_gbit, intra * 1e3);
    else
        printf("ignored (cost nothing on the slow link)\n");
    printf("%-10s %14s %9s %10s %10s\n", "scheme", "card_bytes", "messages", "ms", "vs_dense");
    const double dense_s = 2.0 * (N - 1) * m->alpha + 2.0 * (N - 1) / N * n4 * m->beta;
    row("flat_rd", (double)L * (N - L) * P, ceil(log2((double)N)), m->engine, m, dense_s);
    row("flat_ring", (double)(N - 1) * P, N - 1, m->engine, m, dense_s);
    row("node", (double)(M - 1) * shards, M - 1, m->engine + intra, m, dense_s);
    row("reduce", (double)L * (double)b.reduce, ceil(log2((double)N)) + 2.0 * (N - 1), m->engine, m, dense_s);
    row("dense", 2.0 * (N - 1) / N * n4, 2.0 * (N - 1), 0.0, m, dense_s);
}

static int usage(void) {
    fprintf(stderr, "usage: project N_FLOATS SPARSITY ENGINE_MS [ALPHA_US [GBIT]]\n"
                    "       project --nodes M --node-size L [--intra GBIT] N_FLOATS SPARSITY ENGINE_MS "
                    "[ALPHA_US [GBIT]]\n");
    return 2;
}

int main(int argc, char **argv) {
    int M = 0, L = 0, a = 1;
    double intra_gbit = 0.0;
    for (; a + 1 < argc && strncmp(argv[a], "--", 2) == 0; a += 2) {
        if (strcmp(argv[a], "--nodes") == 0)
            M = atoi(argv[a + 1]);
        else if (strcmp(argv[a], "--node-size") == 0)
            L = atoi(argv[a + 1]);
        else if (strcmp(argv[a], "--intra") == 0)
            intra_gbit = atof(argv[a + 1]);
        else
            return usage();
    }
    /* Node mode needs both, and two machines at least: with one, nothing
     * crosses a card and the flat formulas above do not hold. --intra has
     * no meaning without it. */
    if (argc - a < 3 || ((M || L || intra_gbit > 0) && (M < 2 || L < 1))) return usage();
    model m = {.n = strtoull(argv[a], NULL, 10), .sparsity = atof(argv[a + 1]), .engine = atof(argv[a + 2]) * 1e-3};
    m.alpha = (argc - a > 3 ? atof(argv[a + 3]) : 50.0) * 1e-6;
    m.beta = 8.0 / ((argc - a > 4 ? atof(argv[a + 4]) : 1.0) * 1e9);
    m.k = dgc_k_for(m.n, 1.0 - m.sparsity);
    if (M)
        project_nodes(&m, M, L, intra_gbit);
    else
        project_ranks(&m);
    return 0;
}
