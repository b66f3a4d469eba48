/* The transport policy (DGC_TRANSPORT) against the byte formulas, written
 * out here from DESIGN.md's "Bytes: never worse than dense": an all-gather
 * of the payloads sends (N-1) payloads of 32 + 8k bytes per rank; the dense
 * transport sends a ring all-reduce's 2 (N-1)/N 4n bytes plus the 32-byte
 * headers to the N-1 others. */
#include <criterion/criterion.h>
#include <math.h>

#include "dgcshim/config.h"
#include "dgcshim/engine.h"
#include "dgcshim/policy.h"

/* The compact payload (wire_compact.h): header, count, gap codes of the
 * width that makes the fewest bits, values; each area in 8-byte words. */
static double compact_bytes(double n, double k, double vb) {
    double best = INFINITY, bits = 0;
    for (int b = 1; b <= 32; b++) {
        double codes = k + floor(n / (ldexp(1, b) - 1));
        if (codes * b < best) best = codes * b, bits = b;
    }
    double codes = k + floor(n / (ldexp(1, (int)bits) - 1));
    return 40 + 8 * ceil(codes * bits / 64) + 8 * ceil(k * vb / 64);
}
static double sparse_bytes(double n, double k, double N, double vb) { return (N - 1) * compact_bytes(n, k, vb); }
static double dense_bytes(double n, double N) { return ceil(2 * (N - 1) * 4 * n / N) + 32 * (N - 1); }

static dgc_config with_transport(int t) {
    dgc_config c;
    dgc_config_defaults(&c);
    c.transport = t;
    return c;
}

/* Every N from 2 to 4096, each warm-up stage and the target: auto sends the
 * fewer bytes, and never more than dense. */
Test(policy_transport, auto_picks_the_fewer_bytes_for_2_to_4096_ranks) {
    static const double densities[] = {0.25, 0.0625, 0.015625, 0.00390625, 0.001};
    static const uint64_t sizes[] = {16384, 1000000, 25000000, 4294967295ull};
    dgc_config cfg = with_transport(DGC_TRANSPORT_AUTO);
    for (cfg.value_bits = 16; cfg.value_bits <= 32; cfg.value_bits += 16)
    for (size_t a = 0; a < sizeof sizes / sizeof *sizes; a++) {
        for (size_t d = 0; d < sizeof densities / sizeof *densities; d++) {
            uint64_t n = sizes[a], k = dgc_k_for(n, densities[d]);
            for (int N = 2; N <= 4096; N++) {
                dgc_transport_bytes b;
                dgc_transport t = dgc_policy_transport(&cfg, n, k, N, &b);
                double s = sparse_bytes((double)n, (double)k, N, (double)cfg.value_bits), e = dense_bytes((double)n, N);
                cr_assert(fabs((double)b.sparse - s) < 0.5 && fabs((double)b.dense - e) < 0.5,
                          "n %llu k %llu N %d: bytes %llu/%llu, formulas %.0f/%.0f", (unsigned long long)n,
                          (unsigned long long)k, N, (unsigned long long)b.sparse, (unsigned long long)b.dense, s, e);
                dgc_transport want = s < e ? DGC_TRANSPORT_SPARSE : DGC_TRANSPORT_DENSE;
                cr_assert_eq(t, want, "n %llu density %g N %d: transport %d, want %d", (unsigned long long)n,
                             densities[d], N, t, want);
                double sent = t == DGC_TRANSPORT_SPARSE ? s : e;
                cr_assert(sent <= e, "more than dense");
            }
        }
    }
}

/* One crossover per density: sparse below some N, dense from it on. With
 * 16-bit compact payloads the 25% warm-up stage stays sparse up to 12 ranks
 * (a payload is about 0.65n bytes against dense's 8n/N), with 32-bit ones up
 * to 6 (about 1.15n), and 99.9% past 2000 and 1000 ranks (plain 8-byte pairs
 * tied at 4 and at about 1000). */
static int first_dense(uint64_t n, double density, unsigned value_bits) {
    dgc_config cfg = with_transport(DGC_TRANSPORT_AUTO);
    cfg.value_bits = value_bits;
    uint64_t k = dgc_k_for(n, density);
    int first = 0;
    for (int N = 2; N <= 4096; N++) {
        int dense = dgc_policy_transport(&cfg, n, k, N, NULL) == DGC_TRANSPORT_DENSE;
        if (dense && !first) first = N;
        cr_assert(!first || dense, "density %g: sparse again at N %d after dense from %d", density, N, first);
    }
    return first;
}

Test(policy_transport, the_crossovers) {
    cr_assert_eq(first_dense(1000000, 0.25, 16), 13);
    cr_assert_eq(first_dense(1000000, 0.25, 32), 7);
    int f = first_dense(1000000, 0.001, 16);
    cr_assert(f == 0 || f > 2000, "99.9%% bf16: dense from %d ranks", f);
    f = first_dense(1000000, 0.001, 32);
    cr_assert(f > 1000, "99.9%% fp32: dense from %d ranks", f);
    dgc_config cfg = with_transport(DGC_TRANSPORT_AUTO);
    cr_assert_eq(dgc_policy_transport(&cfg, 1000000, 1000, 1, NULL), DGC_TRANSPORT_SPARSE, "one rank sends nothing");
}

Test(policy_transport, forced_either_way) {
    dgc_config s = with_transport(DGC_TRANSPORT_SPARSE), d = with_transport(DGC_TRANSPORT_DENSE);
    for (int N = 1; N <= 64; N++) {
        cr_assert_eq(dgc_policy_transport(&s, 1000000, 250000, N, NULL), DGC_TRANSPORT_SPARSE);
        cr_assert_eq(dgc_policy_transport(&d, 1000000, 1000, N, NULL), DGC_TRANSPORT_DENSE);
    }
}
