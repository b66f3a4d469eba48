/* The transport policy (DGC_TRANSPORT) against the byte formulas, written
 * out here from DESIGN.md's "Bytes: never worse than dense": an all-gather
 * of the payloads sends (N-1) compact payloads (below) per rank; the dense
 * transport sends a ring all-reduce's 2 (N-1)/N e n bytes (e: the
 * element's bytes, 4 for fp32, 2 for the NCCL path's fp16 and bf16, which
 * it sums in their own type) plus the 32-byte headers to the N-1 others. */
#include <criterion/criterion.h>
#include <math.h>

#include "dgcshim/config.h"
#include "dgcshim/engine.h"
#include "dgcshim/policy.h"

/* The compact payload (wire_compact.h): header, count word, the Elias-Fano
 * upper area (k + (n-1)/2^L bits) and low area (k L bits) for the L that
 * makes the fewest bits, the values; each area in 8-byte words. */
static double compact_bytes(double n, double k, double vb) {
    double best = INFINITY, low = 0;
    for (int L = 0; L <= 32; L++) {
        double bits = k * L + k + floor((n - 1) / ldexp(1, L));
        if (bits < best) best = bits, low = L;
    }
    double upper = k + floor((n - 1) / ldexp(1, (int)low));
    return 40 + 8 * ceil(upper / 64) + 8 * ceil(k * low / 64) + 8 * ceil(k * vb / 64);
}
static double sparse_bytes(double n, double k, double N, double vb) { return (N - 1) * compact_bytes(n, k, vb); }
static double dense_bytes(double n, double N, double e) { return ceil(2 * (N - 1) * e * n / N) + 32 * (N - 1); }

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
    for (unsigned elem = 2; elem <= 4; elem += 2)
    for (cfg.value_bits = 16; cfg.value_bits <= 32; cfg.value_bits += 16)
    for (size_t a = 0; a < sizeof sizes / sizeof *sizes; a++) {
        for (size_t d = 0; d < sizeof densities / sizeof *densities; d++) {
            uint64_t n = sizes[a], k = dgc_k_for(n, densities[d]);
            for (int N = 2; N <= 4096; N++) {
                dgc_transport_bytes b;
                dgc_transport t = dgc_policy_transport(&cfg, n, elem, k, N, &b);
                double s = sparse_bytes((double)n, (double)k, N, (double)cfg.value_bits),
                       e = dense_bytes((double)n, N, elem);
                cr_assert(fabs((double)b.sparse - s) < 0.5 && fabs((double)b.dense - e) < 0.5,
                          "n %llu k %llu N %d elem %u: bytes %llu/%llu, formulas %.0f/%.0f", (unsigned long long)n,
                          (unsigned long long)k, N, elem, (unsigned long long)b.sparse, (unsigned long long)b.dense,
                          s, e);
                dgc_transport want = s < e ? DGC_TRANSPORT_SPARSE : DGC_TRANSPORT_DENSE;
                cr_assert_eq(t, want, "n %llu density %g N %d: transport %d, want %d", (unsigned long long)n,
                             densities[d], N, t, want);
                double sent = t == DGC_TRANSPORT_SPARSE ? s : e;
                cr_assert(sent <= e, "more than dense");
            }
        }
    }
}

/* One crossover per density: sparse below some N, dense from it on. At
 * n = 10^6 the 25% warm-up stage's payload is 625048 bytes with 16-bit
 * values (L = 1: 749999 + 250000 index bits, 4 Mbit of values) and 1125048
 * with 32-bit ones, against dense's 8n (N-1)/N + 32 (N-1): sparse up to 12
 * and 7 ranks. At 99.9% (k = 1000, L = 9) the payloads are 3544 and 5544
 * bytes: sparse up to 2277 and 1451 ranks. */
static int first_dense(uint64_t n, double density, unsigned value_bits, unsigned elem) {
    dgc_config cfg = with_transport(DGC_TRANSPORT_AUTO);
    cfg.value_bits = value_bits;
    uint64_t k = dgc_k_for(n, density);
    int first = 0;
    for (int N = 2; N <= 4096; N++) {
        int dense = dgc_policy_transport(&cfg, n, elem, k, N, NULL) == DGC_TRANSPORT_DENSE;
        if (dense && !first) first = N;
        cr_assert(!first || dense, "density %g: sparse again at N %d after dense from %d", density, N, first);
    }
    return first;
}

Test(policy_transport, the_crossovers) {
    cr_assert_eq(first_dense(1000000, 0.25, 16, 4), 13);
    cr_assert_eq(first_dense(1000000, 0.25, 32, 4), 8);
    cr_assert_eq(first_dense(1000000, 0.001, 16, 4), 2278);
    cr_assert_eq(first_dense(1000000, 0.001, 32, 4), 1452);
    /* A 16-bit buffer's dense transport sends half: 4n (N-1)/N + 32 (N-1)
     * against the same payloads, sparse up to 6 ranks at 25% (625048
     * bytes a payload) and 1138 at 99.9% (3544). */
    cr_assert_eq(first_dense(1000000, 0.25, 16, 2), 7);
    cr_assert_eq(first_dense(1000000, 0.001, 16, 2), 1139);
    dgc_config cfg = with_transport(DGC_TRANSPORT_AUTO);
    cr_assert_eq(dgc_policy_transport(&cfg, 1000000, 4, 1000, 1, NULL), DGC_TRANSPORT_SPARSE, "one rank sends nothing");
}

Test(policy_transport, forced_either_way) {
    dgc_config s = with_transport(DGC_TRANSPORT_SPARSE), d = with_transport(DGC_TRANSPORT_DENSE);
    for (int N = 1; N <= 64; N++) {
        cr_assert_eq(dgc_policy_transport(&s, 1000000, 2, 250000, N, NULL), DGC_TRANSPORT_SPARSE);
        cr_assert_eq(dgc_policy_transport(&d, 1000000, 4, 1000, N, NULL), DGC_TRANSPORT_DENSE);
    }
}

/* reduce: opt-in, one rank sends nothing, the dense transport where it is
 * fewer bytes (k = n at 2 ranks), never chosen by auto. */
Test(policy_transport, reduce_forced_where_fewer_bytes) {
    dgc_config r = with_transport(DGC_TRANSPORT_REDUCE), a = with_transport(DGC_TRANSPORT_AUTO);
    cr_assert_eq(dgc_policy_transport(&r, 1000000, 4, 1000, 1, NULL), DGC_TRANSPORT_SPARSE);
    cr_assert_eq(dgc_policy_transport(&r, 1000000, 4, 1000000, 2, NULL), DGC_TRANSPORT_DENSE);
    for (int N = 2; N <= 4096; N *= 2) {
        dgc_transport_bytes b;
        cr_assert_eq(dgc_policy_transport(&r, 2000000, 4, 2000, N, &b), DGC_TRANSPORT_REDUCE, "N %d", N);
        cr_assert_neq(dgc_policy_transport(&a, 2000000, 4, 2000, N, NULL), DGC_TRANSPORT_REDUCE);
        /* Under Ok-Topk's 3k(N-1)/N pairs of 8 bytes up to 64 ranks (the
         * issue's range; past it each peer's two payloads' headers, about
         * 112 bytes, outweigh its share of k = 2000). */
        if (N <= 64) cr_assert_lt(b.reduce, 3ull * 2000 * (uint64_t)(N - 1) / (uint64_t)N * 8, "N %d: %llu", N,
                     (unsigned long long)b.reduce);
    }
}

/* Regions: cap and keep from (n, k, N); equal bounds, and balanced ones cut
 * at the selection's quantiles (monotone, first 0, last n). */
Test(policy_regions, sizes_and_bounds) {
    dgc_region_plan rp;
    dgc_policy_regions(20011, 201, 32, 8, &rp);
    cr_assert_eq(rp.cap, 51);
    cr_assert_eq(rp.keep, 26);
    cr_assert_eq(rp.pick.value_bits, 32);
    dgc_policy_regions(20011, 201, 16, 2, &rp);
    cr_assert_eq(rp.cap, 201, "two ranks: a rank's k pairs always fit");
    uint32_t b[6];
    dgc_policy_bounds_equal(20011, 5, b);
    cr_assert(b[0] == 0 && b[1] == 4002 && b[4] == 16008 && b[5] == 20011);
    const uint32_t sel[] = {3, 5, 7, 9, 11, 13, 100, 19000, 19001, 19002};
    dgc_policy_bounds_balanced(20011, 5, sel, 10, b);
    cr_assert(b[0] == 0 && b[1] == 7 && b[2] == 11 && b[3] == 100 && b[4] == 19001 && b[5] == 20011);
    dgc_policy_bounds_balanced(20011, 5, sel, 0, b);
    cr_assert_eq(b[1], 4002, "no selection: equal");
}

/* The outlook against every later step, one by one: the largest k that goes
 * sparse and whether any goes dense, from each step of a warm-up on (and
 * past it), for rank counts on both sides of each stage's crossover. */
Test(policy_transport, outlook_covers_every_later_step) {
    static const int ranks[] = {2, 3, 4, 6, 7, 8, 12, 13, 64, 1000, 1139, 1452, 2300};
    for (unsigned elem = 2; elem <= 4; elem += 2)
    for (unsigned vb = 16; vb <= 32; vb += 16)
        for (int t = DGC_TRANSPORT_AUTO; t <= DGC_TRANSPORT_DENSE; t++)
            for (size_t r = 0; r < sizeof ranks / sizeof *ranks; r++) {
                dgc_config cfg = with_transport(t);
                cfg.warmup_steps = 50;
                cfg.value_bits = (int)vb;
                const uint64_t n = 1000000;
                for (uint64_t step = 0; step <= 52; step++) {
                    uint64_t want_k = 0, got_k;
                    int want_dense = 0, got_dense;
                    for (uint64_t s = step; s <= 60; s++) {
                        uint64_t k = dgc_k_for(n, dgc_density_at(cfg.sparsity, cfg.warmup_steps, s));
                        if (dgc_policy_transport(&cfg, n, elem, k, ranks[r], NULL) == DGC_TRANSPORT_DENSE)
                            want_dense = 1;
                        else if (k > want_k)
                            want_k = k;
                    }
                    dgc_policy_outlook(&cfg, n, elem == 4 ? DGC_SUM_F32 : DGC_SUM_F16, step, ranks[r], &got_k, &got_dense);
                    cr_assert(got_k == want_k && got_dense == want_dense,
                              "elem %u value bits %u transport %d N %d step %llu: outlook (%llu, %d), steps say "
                              "(%llu, %d)",
                              elem, vb, t, ranks[r], (unsigned long long)step, (unsigned long long)got_k, got_dense,
                              (unsigned long long)want_k, want_dense);
                }
            }
}

/* The plan's pass-through limit is the sparse all-gather's: its compact
 * payloads, N of them, in at most INT_MAX 8-byte words. A call that goes by
 * the dense transport gathers only headers and never passes through. */
Test(policy_plan, limit_is_the_compact_all_gather) {
    const uint64_t n = 4294967295ull;
    static const int ranks[] = {2, 3, 4, 8, 16, 64, 512};
    for (unsigned vb = 16; vb <= 32; vb += 16)
        for (int t = DGC_TRANSPORT_AUTO; t <= DGC_TRANSPORT_DENSE; t++)
            for (size_t r = 0; r < sizeof ranks / sizeof *ranks; r++)
                for (uint64_t step = 0; step <= 5; step++) {
                    dgc_config cfg = with_transport(t);
                    cfg.warmup_steps = 5;
                    cfg.value_bits = (int)vb;
                    const int N = ranks[r];
                    uint64_t k = dgc_k_for(n, dgc_density_at(cfg.sparsity, cfg.warmup_steps, step));
                    int sparse = dgc_policy_transport(&cfg, n, 4, k, N, NULL) == DGC_TRANSPORT_SPARSE;
                    double words = compact_bytes((double)n, (double)k, vb) / 8;
                    int fits = !sparse || words * N <= 2147483647.0;
                    dgc_plan plan;
                    int rc = dgc_policy_plan(&cfg, n, DGC_SUM_F32, step, N, &plan);
                    const dgc_step_params p = plan.p;
                    cr_assert_eq(rc, fits ? 0 : -1, "value bits %u transport %d N %d step %llu (k %llu, %s): plan %d",
                                 vb, t, N, (unsigned long long)step, (unsigned long long)k,
                                 sparse ? "sparse" : "dense", rc);
                    if (rc == 0)
                        cr_assert(p.k == k && p.n == n && p.nranks == N && p.value_bits == vb &&
                                  p.sum_type == DGC_SUM_F32);
                }
}

/* The case the old limit (N plain 8-byte-a-pair payloads) passed through:
 * 2^32-1 elements at 25% on 2 ranks fit as compact payloads. */
Test(policy_plan, compact_payloads_fit_where_plain_ones_did_not) {
    dgc_config cfg = with_transport(DGC_TRANSPORT_AUTO);
    cfg.sparsity = 0.75;
    cfg.warmup_steps = 0;
    dgc_plan plan;
    cr_assert_eq(dgc_policy_plan(&cfg, 4294967295ull, DGC_SUM_F32, 0, 2, &plan), 0);
    cr_assert_gt((double)plan.p.k * 8 * 2 / 8, 2147483647.0); /* the plain payloads would not */
    cfg.transport = DGC_TRANSPORT_DENSE;
    cr_assert_eq(dgc_policy_plan(&cfg, 4294967295ull, DGC_SUM_F32, 0, 4096, &plan), 0);
}

/* One plan per call: its transport, bytes and layout are what the pieces
 * give, its sum type is the buffer's on the dense transport only, and its
 * clamp is the buffer type's limit (with compensation, divided by 1 + m). */
Test(policy_plan, one_plan_holds_the_whole_call) {
    static const unsigned types[] = {DGC_SUM_F32, DGC_SUM_F16, DGC_SUM_BF16};
    static const int ranks[] = {1, 2, 8, 300};
    for (size_t t = 0; t < 3; t++)
        for (int tr = DGC_TRANSPORT_AUTO; tr <= DGC_TRANSPORT_DENSE; tr++)
            for (size_t r = 0; r < sizeof ranks / sizeof *ranks; r++)
                for (int comp = 0; comp < 2; comp++) {
                    dgc_config cfg = with_transport(tr);
                    cfg.warmup_steps = 4;
                    cfg.momentum = comp ? 0.9 : 0.0;
                    cfg.compensate = comp;
                    const uint64_t n = 100003;
                    const unsigned elem = types[t] == DGC_SUM_F32 ? 4 : 2;
                    for (uint64_t step = 0; step < 6; step++) {
                        dgc_plan plan;
                        cr_assert_eq(dgc_policy_plan(&cfg, n, types[t], step, ranks[r], &plan), 0);
                        const uint64_t k = dgc_k_for(n, dgc_density_at(cfg.sparsity, cfg.warmup_steps, step));
                        dgc_transport_bytes tb;
                        const dgc_transport want = dgc_policy_transport(&cfg, n, elem, k, ranks[r], &tb);
                        dgc_compact_layout code;
                        dgc_compact_layout_for(n, k, (unsigned)cfg.value_bits, &code);
                        cr_assert(plan.p.k == k && plan.p.n == n && plan.p.step == step && plan.transport == want &&
                                      plan.bytes.sparse == tb.sparse && plan.bytes.dense == tb.dense &&
                                      plan.code.bytes == code.bytes,
                                  "type %u transport %d N %d step %llu", types[t], tr, ranks[r],
                                  (unsigned long long)step);
                        cr_assert_eq(plan.p.sum_type, want == DGC_TRANSPORT_DENSE ? types[t] : DGC_SUM_F32);
                        cr_assert_eq(plan.p.clamp_bits,
                                     dgc_policy_value_limit_bits(types[t], ranks[r], comp ? 0.9 : 0.0));
                    }
                }
}
