/* The rounding of a value to the 16-bit type its dense sum runs in
 * (dgc_sum_type, engine.h), written once for the host engine and the CUDA
 * one (which compiles this header with DGC_HOSTDEV = __host__ __device__).
 *
 * Integer arithmetic on the bits, as in compact_rules.h, so that no rounding
 * mode and no device can make the host and the GPU disagree: to nearest,
 * ties to even, and clamped (dgc_sum_limit_bits) so that the sum of the
 * ranks' values cannot overflow where the gradients did not. What rounding
 * and the clamp lose stays in the residual (error feedback), as with the
 * compact payload's 16-bit values, and goes in later steps. */
#ifndef DGCSHIM_SUM_RULES_H
#define DGCSHIM_SUM_RULES_H

#include <stdint.h>

#include "dgcshim/compact_rules.h" /* dgc_cx_top_bit, dgc_cx_round_shift */
#include "dgcshim/hostdev.h"

#define DGC_SUM_F16_MAX_BITS 0x477fe000u  /* 65504, binary16's largest finite, as fp32 bits */
#define DGC_SUM_F16_MIN_NORMAL 0x38800000u /* 2^-14, its smallest normal */
#define DGC_SUM_BF16_MAX_BITS 0x7f7f0000u /* bfloat16's largest finite */

/* The magnitude bits a (no sign) rounded to nearest, ties to even, keeping
 * the top 32 - drop bits of the encoding: exact on fp32's grid, a carry into
 * the exponent included. */
DGC_HOSTDEV uint32_t dgc_sum_round_drop(uint32_t a, unsigned drop) {
    const uint32_t half = (1u << (drop - 1)) - 1u, keep = ~((1u << drop) - 1u);
    return (a + half + ((a >> drop) & 1u)) & keep;
}

/* q 2^-24 as fp32 bits, for a q of at most 24 significant bits (binary16's
 * quantum is 2^-24, so binary16 values are whole numbers of it). */
DGC_HOSTDEV uint32_t dgc_sum_quanta_bits(uint64_t q) {
    if (q == 0) return 0;
    const unsigned top = (unsigned)dgc_cx_top_bit(q);
    const uint64_t m = top > 23 ? q >> (top - 23) : q << (23 - top); /* nothing lost: 24 bits at most */
    return (uint32_t)(top + 103) << 23 | ((uint32_t)m & 0x7fffffu);
}

/* binary16's subnormal range, below 2^-14: multiples of 2^-24. a is the
 * magnitude of an fp32 below 2^-14, so its exponent field is at most 112. */
DGC_HOSTDEV uint32_t dgc_sum_round_f16_tiny(uint32_t a) {
    const uint32_t field = a >> 23;
    if (field < 102) return 0; /* below 2^-25: at most half the quantum (2^-25 itself is a tie, to 0) */
    const uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    /* a = mant 2^(field - 150); in quanta of 2^-24: mant 2^(field - 126),
     * a right shift by 126 - field (14 to 24 bits). */
    return dgc_sum_quanta_bits(dgc_cx_round_shift(mant, (int)(126u - field)));
}

/* The largest magnitude one rank may send into a sum of nranks in type, as
 * fp32 bits. For fp16 the largest binary16 value at most
 * 65504 (2049 - N) / (2048 N): a sum of N values of at most L each, in any
 * order and grouping, rounded at every step (unit roundoff u = 2^-11),
 * stays within N L (1 + u)^(N-1) <= N L / (1 - (N-1) u) <= 65504, so it
 * never overflows where the gradients did not. Past 1024 ranks the bound
 * would soon leave nothing to send, so 65504 / (2N) there (at N = 1024 the
 * two agree within 0.1%), and a sum that still overflows is caught after it
 * (the step is dropped as non-finite). For bf16, its largest finite value:
 * its range is fp32's, and a sum there overflows only from values near
 * 10^38: caught the same way by the dense transport, which sums in bf16;
 * the sparse one sums in fp32, as for fp32 buffers, and its Inf reaches
 * the output as a dense all-reduce's would (the step is kept). */
DGC_HOSTDEV uint32_t dgc_sum_limit_bits(unsigned type, int nranks) {
    if (type == 2u) return DGC_SUM_BF16_MAX_BITS; /* DGC_SUM_BF16 */
    if (type != 1u) return 0x7f7fffffu;           /* fp32: FLT_MAX, no limit */
    const uint64_t N = (uint64_t)(nranks > 1 ? nranks : 1), max = UINT64_C(2047) << 29; /* 65504 in quanta */
    uint64_t q = N <= 1024 ? max * (2049 - N) / (2048 * N) : max / (2 * N);
    const int top = dgc_cx_top_bit(q); /* q >= 2047 2^8: not 0 */
    if (top > 10) q &= ~((UINT64_C(1) << (top - 10)) - 1u); /* down to 11 significant bits */
    return dgc_sum_quanta_bits(q);
}

/* The clamp of one step (dgc_step_params): clamp_bits when set, else the
 * limit of the 16-bit type its dense sum runs in (FLT_MAX's bits for fp32:
 * no clamp). */
DGC_HOSTDEV uint32_t dgc_sum_step_limit_bits(unsigned sum_type, uint32_t clamp_bits, int nranks) {
    return clamp_bits != 0u ? clamp_bits : dgc_sum_limit_bits(sum_type, nranks);
}

/* The fp32 bits u (finite) with the magnitude clamped to limit. */
DGC_HOSTDEV uint32_t dgc_sum_clamp_bits(uint32_t u, uint32_t limit) {
    return (u & 0x7fffffffu) > limit ? (u & 0x80000000u) | limit : u;
}

/* The fp32 bits of x (bits u, finite) rounded to type (DGC_SUM_F16 or
 * DGC_SUM_BF16) and clamped to limit (dgc_sum_limit_bits, a value on the
 * type's grid); u itself for DGC_SUM_F32. */
DGC_HOSTDEV uint32_t dgc_sum_round_bits(uint32_t u, unsigned type, uint32_t limit) {
    const uint32_t sign = u & 0x80000000u, a = u & 0x7fffffffu;
    if (type == 0u) return u;
    if (a >= limit) return sign | limit; /* below it, the nearest grid value is at most limit */
    if (type == 1u) { /* DGC_SUM_F16 */
        if (a >= DGC_SUM_F16_MIN_NORMAL) return sign | dgc_sum_round_drop(a, 13);
        return sign | dgc_sum_round_f16_tiny(a);
    }
    return sign | dgc_sum_round_drop(a, 16); /* DGC_SUM_BF16: fp32's own exponent, so its subnormals too */
}

#endif
