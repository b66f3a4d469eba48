/* The rounding to a 16-bit sum's type (sum_rules.h), against references
 * written here another way: the value scaled by its quantum in double and
 * rounded there (nearbyint: to nearest, ties to even), and, where the
 * compiler has it, the conversion to _Float16. Both clamp as the rule does:
 * to the type's largest finite value. */
#include <criterion/criterion.h>

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "dgcshim/engine.h"
#include "dgcshim/policy.h"
#include "dgcshim/sum_rules.h"

static float from_bits(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static uint32_t to_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

/* x on the grid of a type with `digits` significant bits whose smallest
 * normal is 2^min_exp, clamped to max. */
static float reference(float x, int digits, int min_exp, double max) {
    double a = fabs((double)x);
    if (a >= max) return (float)copysign(max, (double)x);
    if (a == 0) return x;
    int e;
    frexp(a, &e); /* a = f 2^e, f in [0.5, 1): binade e - 1 */
    int binade = e - 1 < min_exp ? min_exp : e - 1;
    double q = ldexp(1.0, binade - (digits - 1));
    return (float)copysign(nearbyint(a / q) * q, (double)x);
}

static float ref_f16(float x) { return reference(x, 11, -14, 65504.0); }
/* As a 16-bit addition's result: rounded, and Inf from 65520 on (the
 * midpoint to 2^16, which ties to even, upwards). */
static float ref_f16_inf(float x) { return fabsf(x) >= 65520.0f ? copysignf(INFINITY, x) : ref_f16(x); }
static float ref_bf16(float x) { return reference(x, 8, -126, (double)from_bits(DGC_SUM_BF16_MAX_BITS)); }

static void check(uint32_t u) {
    const float x = from_bits(u);
    if (!isfinite(x)) return;
    const uint32_t lh = dgc_sum_limit_bits(DGC_SUM_F16, 1), lb = dgc_sum_limit_bits(DGC_SUM_BF16, 1);
    const float h = from_bits(dgc_sum_round_bits(u, DGC_SUM_F16, lh)), want_h = ref_f16(x);
    cr_assert(to_bits(h) == to_bits(want_h), "fp16 of %a (0x%08x): %a, reference %a", (double)x, u, (double)h,
              (double)want_h);
#ifdef __FLT16_MAX__
    _Float16 c = (_Float16)x; /* the compiler's own conversion: ties to even, overflow to Inf */
    float fc = isinf((float)c) ? copysignf(65504.0f, x) : (float)c;
    cr_assert(to_bits(h) == to_bits(fc), "fp16 of %a: %a, _Float16 %a", (double)x, (double)h, (double)fc);
#endif
    const float b = from_bits(dgc_sum_round_bits(u, DGC_SUM_BF16, lb)), want_b = ref_bf16(x);
    cr_assert(to_bits(b) == to_bits(want_b), "bf16 of %a (0x%08x): %a, reference %a", (double)x, u, (double)b,
              (double)want_b);
    cr_assert_eq(dgc_sum_round_bits(u, DGC_SUM_F32, dgc_sum_limit_bits(DGC_SUM_F32, 8)), u,
                 "fp32 leaves the value alone");
}

/* A million values spread over every fp32 encoding, both signs. */
Test(sum_rules, spread_over_all_finite_floats) {
    for (uint64_t u = 0; u < (1ull << 32); u += 4093) check((uint32_t)u);
}

/* Every encoding near each edge: binary16's largest finite and its
 * midpoint to 2^16, its smallest normal, its subnormal quanta down to 0,
 * bfloat16's largest, fp32's subnormals and 1.0 (ties at both widths). */
Test(sum_rules, every_encoding_near_the_edges) {
    const float edges[] = {65504.0f, 65520.0f, 0x1p-14f, 0x1p-24f, 0x1p-25f, 0x3p-26f, 0x1p-126f, 1.0f,
                           from_bits(DGC_SUM_BF16_MAX_BITS), FLT_MAX, 0x1p-149f};
    for (size_t i = 0; i < sizeof edges / sizeof *edges; i++)
        for (int64_t d = -70000; d <= 70000; d++) {
            int64_t u = (int64_t)to_bits(edges[i]) + d;
            if (u < 0 || u > 0x7f7fffff) continue;
            check((uint32_t)u);
            check((uint32_t)u | 0x80000000u);
        }
}

#define F16_ONE DGC_SUM_F16_MAX_BITS /* the limit of one rank: 65504 */
#define BF16_MAX DGC_SUM_BF16_MAX_BITS

/* A few by hand, so that a reference wrong the same way would show. */
Test(sum_rules, by_hand) {
    const struct {
        float x, want;
        unsigned type;
        const char *why;
    } cases[] = {
        {1.0f + 0x1p-11f, 1.0f, DGC_SUM_F16, "tie to even, down"},
        {1.0f + 0x3p-11f, 1.0f + 0x1p-9f, DGC_SUM_F16, "tie to even, up"},
        {1e6f, 65504.0f, DGC_SUM_F16, "clamped, not Inf"},
        {-1e6f, -65504.0f, DGC_SUM_F16, "clamped, negative"},
        {0x1p-25f, 0.0f, DGC_SUM_F16, "half a quantum: to 0"},
        {0x3p-26f, 0x1p-24f, DGC_SUM_F16, "0.75 quantum: one"},
        {0x3p-25f, 0x1p-23f, DGC_SUM_F16, "1.5 quanta: tie to 2"},
        {1.0f + 0x1p-8f, 1.0f, DGC_SUM_BF16, "bf16 tie, down"},
        {FLT_MAX, 0x1.fep127f, DGC_SUM_BF16, "bf16 clamped"},
        {-0.0f, -0.0f, DGC_SUM_F16, "-0 stays -0"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const uint32_t got = dgc_sum_round_bits(to_bits(cases[i].x), cases[i].type,
                                                cases[i].type == DGC_SUM_F16 ? F16_ONE : BF16_MAX);
        cr_assert_eq(got, to_bits(cases[i].want), "%s: %a gives %a", cases[i].why, (double)cases[i].x,
                     (double)from_bits(got));
    }
}

/* The fp16 limit of N ranks: on binary16's grid, the largest there within
 * 65504 (2049 - N) / (2048 N) (65504 / (2N) past 1024 ranks), and sums of
 * N values within it, in 16-bit arithmetic rounded at every step, never
 * overflow up to 1024 ranks: all equal to the limit (the worst case, since
 * rounding is monotonic) and at random. */
Test(sum_rules, fp16_limit_keeps_every_sum_finite) {
    cr_assert_eq(dgc_sum_limit_bits(DGC_SUM_F16, 1), DGC_SUM_F16_MAX_BITS);
    cr_assert_eq(dgc_sum_limit_bits(DGC_SUM_BF16, 64), DGC_SUM_BF16_MAX_BITS);
    uint64_t seed = 7;
    for (int N = 1; N <= 4096; N++) {
        const float L = from_bits(dgc_sum_limit_bits(DGC_SUM_F16, N));
        const double bound = N <= 1024 ? 65504.0 * (2049 - N) / (2048.0 * N) : 65504.0 / (2.0 * N);
        cr_assert(ref_f16(L) == L && L <= bound, "N %d: limit %a off the grid or above %a", N, (double)L, bound);
        int e;
        frexpf(L, &e);
        const float up = L + ldexpf(1.0f, e - 11); /* the next binary16 value: L is the largest */
        cr_assert(up > bound, "N %d: the next binary16 value, %a, is within %a too", N, (double)up, bound);
        if (N > 1024) continue;
        for (int trial = 0; trial < 3; trial++) {
            float sum = 0;
            for (int r = 0; r < N; r++) {
                float x = L;
                if (trial) { /* random values within the limit, on the grid */
                    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                    x = ref_f16((float)((double)(seed >> 11) / 9007199254740992.0) * 2 * L - L);
                    if (trial == 2) x = fabsf(x);
                }
                sum = ref_f16_inf(sum + x); /* what a 16-bit reduction leaves: rounded, Inf past the range */
                cr_assert(isfinite(sum), "N %d trial %d: the sum overflowed at rank %d", N, trial, r);
            }
        }
    }
}

/* The fp32 clamp (dgc_policy_value_limit_bits): an L whose sum over N
 * ranks, rounded at every step, stays within FLT_MAX (with compensation,
 * within FLT_MAX / (1 + m)): N L (1 + u)^(N-1) bounds it, u = 2^-24. It has
 * 11 significant bits (the 16-bit wire values' grid) and is within 2^-9 of
 * the bound; the sum of N copies of it, rounded as fp32 adds it, is finite. */
Test(sum_rules, fp32_limit_keeps_every_sum_finite) {
    const double ms[] = {0.0, 0.9};
    for (int N = 1; N <= 4096; N += N < 64 ? 1 : 61) {
        for (size_t mi = 0; mi < sizeof ms / sizeof *ms; mi++) {
            const double m = ms[mi];
            const float L = from_bits(dgc_policy_value_limit_bits(DGC_SUM_F32, N, m));
            const double grow = (double)N / (1.0 - (N - 1) * 0x1p-24) * (1.0 + m); /* bound / L */
            cr_assert(isfinite(L) && L > 0 && (double)L * grow <= (double)FLT_MAX, "N %d m %g: limit %a breaks the bound",
                      N, m, (double)L);
            /* On the 11-bit grid of the 16-bit wire values, the largest
             * there but for the rounding down of the division by 1 + m. */
            const uint32_t b = dgc_policy_value_limit_bits(DGC_SUM_F32, N, m);
            cr_assert((b & 0x1fffu) == 0, "N %d m %g: limit %a has more than 11 significant bits", N, m, (double)L);
            cr_assert((double)L * grow > (double)FLT_MAX * (1.0 - 0x1p-9), "N %d m %g: limit %a is far below the bound", N,
                      m, (double)L);
            float sum = 0.0f;
            for (int r = 0; r < N; r++) sum += L;
            cr_assert(isfinite(sum) && (double)sum * (1.0 + m) <= (double)FLT_MAX,
                      "N %d m %g: %d copies of the limit sum to %a", N, m, N, (double)sum);
        }
    }
}

/* A 16-bit buffer's clamp (dgc_policy_value_limit_bits): the sum limit
 * without compensation; with it (the output is S_t - m
 * S_{t-1}), the largest value on the type's grid within the sum limit
 * divided by 1 + m, and then the worst output, two sums of N such values of
 * opposite signs (each rounded at every step in fp16), one of them times
 * -m, in fp32 as the decode computes it, converts to fp16 finite. */
Test(sum_rules, compensated_limit_keeps_the_output_finite) {
    cr_assert_eq(dgc_policy_value_limit_bits(DGC_SUM_BF16, 8, 0.0), DGC_SUM_BF16_MAX_BITS);
    const float bl = from_bits(dgc_policy_value_limit_bits(DGC_SUM_BF16, 8, 0.9));
    const double bb = (double)from_bits(DGC_SUM_BF16_MAX_BITS) / 1.9;
    int be;
    frexpf(bl, &be);
    cr_assert(ref_bf16(bl) == bl && bl <= bb && (double)bl + ldexp(1.0, be - 8) > bb,
              "bf16 at m 0.9: %a is not the largest bfloat16 within %a", (double)bl, bb);
    const double ms[] = {0.0, 0.5, 0.9, 0.99, 0.999};
    for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++)
        for (int N = 1; N <= 4096; N++) {
            const double m = ms[mi];
            const uint32_t plain = dgc_sum_limit_bits(DGC_SUM_F16, N), got = dgc_policy_value_limit_bits(DGC_SUM_F16, N, m);
            if (m == 0.0) {
                cr_assert_eq(got, plain, "N %d: %a without compensation", N, (double)from_bits(got));
                continue;
            }
            const float L = from_bits(got);
            const double bound = (double)from_bits(plain) / (1.0 + m);
            int e;
            frexpf(L, &e);
            cr_assert(ref_f16(L) == L && L <= bound && L + ldexpf(1.0f, e - 11) > bound,
                      "N %d m %g: limit %a is not the largest binary16 within %a", N, m, (double)L, bound);
            if (N > 1024) continue;
            float s = 0;
            for (int r = 0; r < N; r++) s = ref_f16_inf(s + L);
            const float neg_m = (float)-m, out = s + neg_m * -s; /* S_t - m S_{t-1}, S_{t-1} = -S_t */
            cr_assert(isfinite(ref_f16_inf(out)), "N %d m %g: output %a overflows fp16", N, m, (double)out);
        }
}
