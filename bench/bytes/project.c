/* A projection of one compressed call's time to many ranks on 1 Gbit/s
 * Ethernet, from an alpha-beta model fed with the policy's bytes (the same
 * formulas the shim sends by, which bench/bytes/run.sh checks against the
 * PMPI counter up to 64 ranks) and each algorithm's message count:
 *   time = messages * alpha + bytes * beta + engine
 * dense ring: 2 (N-1) messages; sparse all-gather (ring): N-1; reduce: the
 * headers' round (32 bytes a rank: recursive doubling, ceil(log2 N)), the
 * all-to-all and the all-gather (N-1 each).
 *
 *   project N_FLOATS SPARSITY ENGINE_MS [ALPHA_US [GBIT]] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "dgcshim/policy.h"

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: project N_FLOATS SPARSITY ENGINE_MS [ALPHA_US [GBIT]]\n");
        return 2;
    }
    const uint64_t n = strtoull(argv[1], NULL, 10);
    const double sparsity = atof(argv[2]), engine = atof(argv[3]) * 1e-3;
    const double alpha = (argc > 4 ? atof(argv[4]) : 50.0) * 1e-6, beta = 8.0 / ((argc > 5 ? atof(argv[5]) : 1.0) * 1e9);
    const uint64_t k = dgc_k_for(n, 1.0 - sparsity);
    printf("# %llu floats, k %llu, alpha %.0f us, %.1f Gbit/s, engine %.2f ms a call\n", (unsigned long long)n,
           (unsigned long long)k, alpha * 1e6, 8.0 / beta / 1e9, engine * 1e3);
    printf("%6s %14s %12s %12s %10s %10s %10s %9s %9s\n", "ranks", "dense_bytes", "sparse", "reduce", "dense_ms",
           "sparse_ms", "reduce_ms", "x_sparse", "x_reduce");
    const int ranks[] = {2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};
    for (size_t i = 0; i < sizeof ranks / sizeof *ranks; i++) {
        const int N = ranks[i];
        dgc_transport_bytes b;
        dgc_transport_bytes_for(n, 4, k, 16, N, &b);
        const double dense = 2.0 * (N - 1) / N * 4.0 * (double)n;
        const double td = 2.0 * (N - 1) * alpha + dense * beta;
        const double ts = (N - 1) * alpha + (double)b.sparse * beta + engine;
        const double tr = (ceil(log2((double)N)) + 2.0 * (N - 1)) * alpha + (double)b.reduce * beta + engine;
        printf("%6d %14.0f %12llu %12llu %10.2f %10.2f %10.2f %8.1fx %8.1fx\n", N, dense, (unsigned long long)b.sparse,
               (unsigned long long)b.reduce, td * 1e3, ts * 1e3, tr * 1e3, td / ts, td / tr);
    }
    return 0;
}
