/* The rounding of a value to the 16-bit type its dense sum runs in
 * (dgc_sum_type, engine.h), written once for the host engine and the CUDA
 * one (which compiles this header with DGC_HOSTDEV = __host__ __device__).
 *
 * Integer arithmetic on the bits, as in compact_rules.h, so that no rounding
 * mode and no device can make the host and the GPU disagree: to nearest,
 * ties to even, and clamped to the type's largest finite value, so that a
 * rank never sends an infinity its gradient did not hold. What rounding and
 * the clamp lose stays in the residual (error feedback), as with the
 * compact payload's 16-bit values. */
#ifndef DGCSHIM_SUM_RULES_H
#define DGCSHIM_SUM_RULES_H

#include <stdint.h>

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

/* binary16's subnormal range, below 2^-14: multiples of 2^-24. a is the
 * magnitude of an fp32 below 2^-14, so its exponent field is at most 112. */
DGC_HOSTDEV uint32_t dgc_sum_round_f16_tiny(uint32_t a) {
    const uint32_t field = a >> 23;
    if (field < 102) return 0; /* below 2^-25: at most half the quantum (2^-25 itself is a tie, to 0) */
    const uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    /* a = mant 2^(field - 150); in quanta of 2^-24: mant 2^(field - 126),
     * a right shift by 126 - field (14 to 24 bits). */
    const unsigned sh = 126u - field;
    const uint32_t rem = mant & ((1u << sh) - 1u), halfq = 1u << (sh - 1);
    uint32_t q = mant >> sh;
    q += rem > halfq || (rem == halfq && (q & 1u));
    if (q == 0) return 0;
    /* q 2^-24 as fp32 bits: q has at most 11 bits (at most 1024) */
    unsigned top = 31;
    while (!(q >> top)) top--;
    return (uint32_t)(top + 103) << 23 | ((q << (23 - top)) & 0x7fffffu);
}

/* The fp32 bits of x (bits u, finite) rounded to type (DGC_SUM_F16 or
 * DGC_SUM_BF16); u itself for DGC_SUM_F32. */
DGC_HOSTDEV uint32_t dgc_sum_round_bits(uint32_t u, unsigned type) {
    const uint32_t sign = u & 0x80000000u, a = u & 0x7fffffffu;
    if (type == 1u) { /* DGC_SUM_F16 */
        if (a >= DGC_SUM_F16_MAX_BITS) return sign | DGC_SUM_F16_MAX_BITS;
        if (a >= DGC_SUM_F16_MIN_NORMAL) return sign | dgc_sum_round_drop(a, 13);
        return sign | dgc_sum_round_f16_tiny(a);
    }
    if (type == 2u) { /* DGC_SUM_BF16: fp32's own exponent, so its subnormals too */
        if (a >= DGC_SUM_BF16_MAX_BITS) return sign | DGC_SUM_BF16_MAX_BITS;
        return sign | dgc_sum_round_drop(a, 16);
    }
    return u;
}

#endif
