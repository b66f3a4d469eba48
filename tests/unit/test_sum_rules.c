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
static float ref_bf16(float x) { return reference(x, 8, -126, (double)from_bits(DGC_SUM_BF16_MAX_BITS)); }

static void check(uint32_t u) {
    const float x = from_bits(u);
    if (!isfinite(x)) return;
    const float h = from_bits(dgc_sum_round_bits(u, DGC_SUM_F16)), want_h = ref_f16(x);
    cr_assert(to_bits(h) == to_bits(want_h), "fp16 of %a (0x%08x): %a, reference %a", (double)x, u, (double)h,
              (double)want_h);
#ifdef __FLT16_MAX__
    _Float16 c = (_Float16)x; /* the compiler's own conversion: ties to even, overflow to Inf */
    float fc = isinf((float)c) ? copysignf(65504.0f, x) : (float)c;
    cr_assert(to_bits(h) == to_bits(fc), "fp16 of %a: %a, _Float16 %a", (double)x, (double)h, (double)fc);
#endif
    const float b = from_bits(dgc_sum_round_bits(u, DGC_SUM_BF16)), want_b = ref_bf16(x);
    cr_assert(to_bits(b) == to_bits(want_b), "bf16 of %a (0x%08x): %a, reference %a", (double)x, u, (double)b,
              (double)want_b);
    cr_assert_eq(dgc_sum_round_bits(u, DGC_SUM_F32), u, "fp32 leaves the value alone");
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

/* A few by hand, so that a reference wrong the same way would show. */
Test(sum_rules, by_hand) {
    cr_assert_eq(from_bits(dgc_sum_round_bits(to_bits(1.0f + 0x1p-11f), DGC_SUM_F16)), 1.0f, "tie to even, down");
    cr_assert_eq(from_bits(dgc_sum_round_bits(to_bits(1.0f + 0x3p-11f), DGC_SUM_F16)), 1.0f + 0x1p-9f, "tie, up");
    cr_assert_eq(from_bits(dgc_sum_round_bits(to_bits(1e6f), DGC_SUM_F16)), 65504.0f, "clamped, not Inf");
    cr_assert_eq(from_bits(dgc_sum_round_bits(to_bits(-1e6f), DGC_SUM_F16)), -65504.0f);
    cr_assert_eq(from_bits(dgc_sum_round_bits(to_bits(0x1p-25f), DGC_SUM_F16)), 0.0f, "half a quantum: to 0");
    cr_assert_eq(from_bits(dgc_sum_round_bits(to_bits(0x3p-26f), DGC_SUM_F16)), 0x1p-24f, "0.75 quantum: one");
    cr_assert_eq(from_bits(dgc_sum_round_bits(to_bits(0x3p-25f), DGC_SUM_F16)), 0x1p-23f, "1.5 quanta: tie to 2");
    cr_assert_eq(from_bits(dgc_sum_round_bits(to_bits(1.0f + 0x1p-8f), DGC_SUM_BF16)), 1.0f, "bf16 tie, down");
    cr_assert_eq(from_bits(dgc_sum_round_bits(to_bits(FLT_MAX), DGC_SUM_BF16)), from_bits(DGC_SUM_BF16_MAX_BITS));
    cr_assert_eq(dgc_sum_round_bits(0x80000000u, DGC_SUM_F16), 0x80000000u, "-0 stays -0");
}
