/* The compact payload's rules (wire_compact.h), written once for the host
 * codec (shim/wire/compact.c) and the CUDA one (kernels/compact.cu), which
 * compiles this header with DGC_HOSTDEV = __host__ __device__.
 *
 * Two kinds of rules live here:
 *   - the value conversions, integer arithmetic on the bits (fp32 <->
 *     binary16 under a power-of-two scale, the rounding to the wire grid),
 *     so that no rounding mode and no device can make two ranks disagree;
 *   - the codec cut into the pieces a GPU runs in parallel: the frame of one
 *     payload (count word, area tails), one upper-area word, one slot, the
 *     end of one payload. Run over every word and slot, they accept exactly
 *     the payloads dgc_compact_check accepts and give the pairs
 *     dgc_compact_expand gives (unit.test_compact_rules holds them to it);
 *     each fault they name is one the host would reject, though not always
 *     the one it names first.
 *
 * Payloads are read as little-endian uint64 words (the host and the GPU are
 * both little-endian). */
#ifndef DGCSHIM_COMPACT_RULES_H
#define DGCSHIM_COMPACT_RULES_H

#include <stdint.h>

#include "dgcshim/hostdev.h"

#define DGC_CX_HEADER_WORDS 4u /* the 32-byte dgc_wire_header */
#define DGC_CX_COUNT_MASK ((UINT64_C(1) << 40) - 1u)
#define DGC_CX_RESERVED_MASK (UINT64_C(0xff) << 40)
#define DGC_CX_SCALE_SHIFT 48
/* e is the binade of a non-zero fp32 magnitude: 2^-149 up to 2^127. */
#define DGC_CX_SCALE_MIN (-149)
#define DGC_CX_SCALE_MAX 127
#define DGC_CX_HALF_TOP_FIELD 29u /* the largest value's binary16 exponent field: [2^14, 2^15) */
#define DGC_CX_INDEX_LIMIT ((uint64_t)UINT32_MAX + 1u) /* indices are uint32 on the wire */

DGC_HOSTDEV int dgc_cx_top_bit(uint64_t v) { /* v != 0 */
#ifdef __CUDA_ARCH__
    return 63 - __clzll((long long)v);
#else
    return 63 - __builtin_clzll(v);
#endif
}

DGC_HOSTDEV int dgc_cx_popcount(uint64_t v) {
#ifdef __CUDA_ARCH__
    return __popcll(v);
#else
    return __builtin_popcountll(v);
#endif
}

DGC_HOSTDEV int dgc_cx_low_bit(uint64_t v) { /* v != 0 */
#ifdef __CUDA_ARCH__
    return __ffsll((long long)v) - 1;
#else
    return __builtin_ctzll(v);
#endif
}

DGC_HOSTDEV uint64_t dgc_cx_words(uint64_t bits) { return bits / 64u + (bits % 64u != 0); }

/* ---- values ---- */

DGC_HOSTDEV int dgc_cx_finite(uint32_t u) { return (u & 0x7f800000u) != 0x7f800000u; }

/* A finite value as sign, integer magnitude and power of two:
 * |x| = mag * 2^exp, mag 0 for a zero. */
typedef struct {
    uint32_t sign; /* the fp32 sign bit, in place */
    uint64_t mag;
    int exp;
} dgc_cx_parts;

DGC_HOSTDEV dgc_cx_parts dgc_cx_float_parts(uint32_t u) {
    uint32_t field = (u >> 23) & 0xffu, frac = u & 0x7fffffu;
    dgc_cx_parts p = {u & 0x80000000u, frac, -149};
    if (field) p.mag = frac | 0x800000u, p.exp = (int)field - 150;
    return p;
}

DGC_HOSTDEV dgc_cx_parts dgc_cx_half_parts(uint32_t h) {
    uint32_t field = (h >> 10) & 0x1fu, frac = h & 0x3ffu;
    dgc_cx_parts p = {(h & 0x8000u) << 16, frac, -24};
    if (field) p.mag = frac | 0x400u, p.exp = (int)field - 25;
    return p;
}

/* floor(log2 |value|) of a non-zero p. */
DGC_HOSTDEV int dgc_cx_binade(dgc_cx_parts p) { return p.exp + dgc_cx_top_bit(p.mag); }

/* Shifts p right until its exponent is at least min_exp and its magnitude
 * has at most sig_bits bits, dropping only zero bits. -1 when a one would be
 * dropped: the value is not on that grid. */
DGC_HOSTDEV int dgc_cx_normalise(dgc_cx_parts *p, int min_exp, int sig_bits) {
    int sh = min_exp - p->exp, over = dgc_cx_top_bit(p->mag) + 1 - sig_bits;
    if (over > sh) sh = over;
    if (sh <= 0) return 0;
    if (sh >= 64 || (p->mag & ((UINT64_C(1) << sh) - 1u))) return -1;
    p->mag >>= sh;
    p->exp += sh;
    return 0;
}

/* The IEEE bits of p in a format with exp_bits exponent bits and frac_bits
 * fraction bits (fp32: 8, 23; binary16: 5, 10). -1 when p is not exactly
 * representable there, or too large for its finite values. */
DGC_HOSTDEV int dgc_cx_encode_ieee(dgc_cx_parts p, int exp_bits, int frac_bits, uint32_t sign, uint32_t *out) {
    const int bias = (1 << (exp_bits - 1)) - 1, min_exp = 1 - bias - frac_bits;
    if (p.mag == 0) {
        *out = sign;
        return 0;
    }
    if (dgc_cx_normalise(&p, min_exp, frac_bits + 1)) return -1;
    int top = dgc_cx_binade(p), t = dgc_cx_top_bit(p.mag);
    if (top > bias) return -1;
    if (top < 1 - bias) { /* subnormal: exp is min_exp after normalise */
        *out = sign | (uint32_t)(p.mag << (p.exp - min_exp));
        return 0;
    }
    uint32_t frac = (uint32_t)(p.mag << (frac_bits - t)) & ((UINT32_C(1) << frac_bits) - 1u);
    *out = sign | (uint32_t)(top + bias) << frac_bits | frac;
    return 0;
}

DGC_HOSTDEV int dgc_cx_float_from_parts(dgc_cx_parts p, uint32_t *out) { return dgc_cx_encode_ieee(p, 8, 23, p.sign, out); }
DGC_HOSTDEV int dgc_cx_half_from_parts(dgc_cx_parts p, uint32_t *out) {
    return dgc_cx_encode_ieee(p, 5, 10, p.sign >> 16, out);
}

/* mag / 2^sh to the nearest integer, ties to the even one. */
DGC_HOSTDEV uint64_t dgc_cx_round_shift(uint64_t mag, int sh) {
    if (sh <= 0) return mag;
    if (sh > 62) return 0; /* mag < 2^24 is below half a unit */
    uint64_t r = mag >> sh, rem = mag & ((UINT64_C(1) << sh) - 1u), half = UINT64_C(1) << (sh - 1);
    return r + (rem > half || (rem == half && (r & 1u)));
}

DGC_HOSTDEV int dgc_cx_clamp_scale(int e) {
    return e < DGC_CX_SCALE_MIN ? DGC_CX_SCALE_MIN : e > DGC_CX_SCALE_MAX ? DGC_CX_SCALE_MAX : e;
}

/* The fast case of the rounding and of the conversions: x an fp32 normal
 * whose binade b lies where binary16 under e is normal too (b >= e - 28) and
 * below 2^127 (no clamp): its grid is then 2^(b - 10), fp32's with 13
 * fraction bits fewer. Most values of a payload are there; the general code
 * handles the rest. */
DGC_HOSTDEV uint32_t dgc_cx_fast_field_min(int e) { return e + 99 > 1 ? (uint32_t)(e + 99) : 1u; } /* b >= e - 28 */

DGC_HOSTDEV int dgc_cx_fast_case(uint32_t u, int e) {
    const uint32_t field = (u >> 23) & 0xffu;
    return field >= dgc_cx_fast_field_min(e) && field < 254u; /* b < 127 */
}

/* dgc_compact_value(x, 16, e) on the bits of a finite x (e in range). */
DGC_HOSTDEV uint32_t dgc_cx_round16_bits(uint32_t u, int e) {
    if (dgc_cx_fast_case(u, e)) { /* ties to even on the 13 bits dropped; a carry into the exponent is exact */
        u += 0xfffu + ((u >> 13) & 1u);
        return u & 0xffffe000u;
    }
    dgc_cx_parts p = dgc_cx_float_parts(u);
    if (p.mag == 0) return u;
    int q = dgc_cx_binade(p) - 10;
    if (q < e - 38) q = e - 38; /* binary16's subnormal quantum, scaled */
    if (q < -149) q = -149;     /* fp32's own: nothing finer exists */
    if (q > p.exp) {
        p.mag = dgc_cx_round_shift(p.mag, q - p.exp);
        p.exp = q;
    }
    if (p.mag && dgc_cx_binade(p) > 127) p.mag = 2047, p.exp = 117; /* the largest below 2^128 */
    uint32_t out = p.sign;
    dgc_cx_float_from_parts(p, &out); /* exact: at most 11 significant bits, on fp32's grid */
    return out;
}

/* The binade of the largest finite magnitude among bits, or SCALE_MIN - 1
 * when all are 0. */
DGC_HOSTDEV int dgc_cx_max_binade(uint32_t max_abs) {
    return max_abs ? dgc_cx_binade(dgc_cx_float_parts(max_abs)) : DGC_CX_SCALE_MIN - 1;
}

/* dgc_compact_scale16 from the largest finite |x|'s bits (0: every x is 0):
 * its binade, one more when rounding carries it into the next (below
 * 2^128: at 127 the rounding itself stops short of it). */
DGC_HOSTDEV int dgc_cx_scale16_of_max(uint32_t max_abs) {
    if (!max_abs) return 0;
    int e = dgc_cx_max_binade(max_abs);
    if (e < DGC_CX_SCALE_MAX && dgc_cx_max_binade(dgc_cx_round16_bits(max_abs, e) & 0x7fffffffu) > e) e++;
    return e;
}

/* The binary16 slot of u, the bits of a value on its payload's grid (u ==
 * dgc_cx_round16_bits(u, e)) with e the payload's scale: the half of
 * u * 2^(14 - e). -1 when u is off the grid. */
DGC_HOSTDEV int dgc_cx_half_of(uint32_t u, int e, uint32_t *h) {
    if (dgc_cx_round16_bits(u, e) != u) return -1;
    if (dgc_cx_fast_case(u, e)) { /* on the grid: the low 13 fraction bits are 0; binade <= e */
        const int hb = (int)((u >> 23) & 0xffu) - 127 + 14 - e; /* in [-14, 14] */
        *h = (u >> 16 & 0x8000u) | (uint32_t)(hb + 15) << 10 | (u >> 13 & 0x3ffu);
        return 0;
    }
    dgc_cx_parts p = dgc_cx_float_parts(u);
    p.exp += 14 - e;
    return dgc_cx_half_from_parts(p, h); /* cannot fail on the grid */
}

/* The fp32 bits value slot h stands for under scale e: 0, or -1 for a
 * binary16 Inf or NaN and -2 for a value fp32 cannot hold exactly. */
DGC_HOSTDEV int dgc_cx_float_of_half(uint32_t h, int e, uint32_t *out) {
    if (((h >> 10) & 0x1fu) == 0x1fu) return -1;
    /* The fast case: a binary16 normal whose value (binade b) is an fp32 normal. */
    const int field = (int)((h >> 10) & 0x1fu), b = field - 15 + e - 14;
    if (field != 0 && b >= -126 && b <= 127) {
        *out = (h & 0x8000u) << 16 | (uint32_t)(b + 127) << 23 | (h & 0x3ffu) << 13;
        return 0;
    }
    dgc_cx_parts p = dgc_cx_half_parts(h);
    p.exp += e - 14;
    return dgc_cx_float_from_parts(p, out) ? -2 : 0;
}

/* ---- the codec in pieces ---- */

/* The real pairs of an engine's payload of nsel selected pairs, the first
 * (index0, value0): nsel, except that a lone (0, +0.0) is padding. */
DGC_HOSTDEV uint64_t dgc_cx_real_pairs(uint64_t nsel, uint32_t index0, uint32_t value0) {
    return nsel == 1 && index0 == 0 && value0 == 0 ? 0 : nsel;
}

/* The count word of count pairs under scale e (0 with fp32 values, or when
 * there is no pair). */
DGC_HOSTDEV uint64_t dgc_cx_count_word(uint64_t count, int e) {
    return count | (uint64_t)(uint16_t)(int16_t)e << DGC_CX_SCALE_SHIFT;
}

/* Where a payload's areas lie, in 64-bit words from its start, for one
 * layout (dgc_compact_layout's fields). */
typedef struct {
    uint64_t n, k, upper_bits;
    unsigned low_bits, value_bits;
    uint64_t upper, low, values;       /* first word of each area */
    uint64_t upper_words, low_words, value_words, words;
} dgc_cx_view;

DGC_HOSTDEV dgc_cx_view dgc_cx_view_of(uint64_t n, uint64_t k, unsigned low_bits, unsigned value_bits,
                                       uint64_t upper_bits) {
    dgc_cx_view v;
    v.n = n;
    v.k = k;
    v.upper_bits = upper_bits;
    v.low_bits = low_bits;
    v.value_bits = value_bits;
    v.upper_words = dgc_cx_words(upper_bits);
    v.low_words = dgc_cx_words(k * low_bits);
    v.value_words = dgc_cx_words(k * value_bits);
    v.upper = DGC_CX_HEADER_WORDS + 1u;
    v.low = v.upper + v.upper_words;
    v.values = v.low + v.low_words;
    v.words = v.values + v.value_words;
    return v;
}

DGC_HOSTDEV uint64_t dgc_cx_index_limit(uint64_t n) { return n < DGC_CX_INDEX_LIMIT ? n : DGC_CX_INDEX_LIMIT; }

/* What is wrong with a payload, as the pieces find it. */
enum {
    DGC_CX_OK = 0,
    DGC_CX_COUNT = 1,        /* count word: reserved bits, a count above k, a scale out of range or with fp32 */
    DGC_CX_TAIL = 2,         /* a low or value slot at or past the count, or a bit past an area's slots, is not 0 */
    DGC_CX_UPPER = 3,        /* an upper bit past the area, or set after the count-th, or fewer than the count */
    DGC_CX_INDEX = 4,        /* an index at or past n (or 2^32) */
    DGC_CX_ORDER = 5,        /* an index not above the one before */
    DGC_CX_VALUE = 6,        /* a value Inf or NaN, or (16 bits) not exact in fp32 */
    DGC_CX_SCALE = 7,        /* the scale is not the canonical one */
    DGC_CX_PADDING = 8,      /* its one pair is (0, +0.0): padding counted as a pair */
};

/* Slot j of b bits (1..32) of an area, both words read inside the area
 * (the caller keeps j below its slots). */
DGC_HOSTDEV uint64_t dgc_cx_get_slot(const uint64_t *area, uint64_t j, unsigned b) {
    uint64_t pos = j * b, w = pos >> 6;
    unsigned s = (unsigned)(pos & 63u);
    uint64_t v = area[w] >> s;
    if (s + b > 64) v |= area[w + 1] << (64 - s);
    return v & ((UINT64_C(1) << b) - 1u);
}

/* Slot j of b bits as masks to or into word w and the one after (hi 0 when
 * it fits one word): what an encoder writes, by atomics or plainly. */
typedef struct {
    uint64_t w, lo, hi;
} dgc_cx_bits;

DGC_HOSTDEV dgc_cx_bits dgc_cx_slot_bits(uint64_t j, unsigned b, uint64_t value) {
    const uint64_t pos = j * b;
    const unsigned s = (unsigned)(pos & 63u);
    dgc_cx_bits r = {pos >> 6, value << s, s + b > 64 ? value >> (64 - s) : 0};
    return r;
}

/* Whether the bits of an area of `words` words from bit `from` on are 0,
 * for `from` the end of its last slot (so they lie in its last word). */
DGC_HOSTDEV int dgc_cx_clear_after(const uint64_t *area, uint64_t words, uint64_t from) {
    if (from >= 64u * words) return 1;
    return (area[from >> 6] >> (from & 63u)) == 0;
}

/* The frame: the count word (count <= k, reserved bits 0, the scale in
 * range, 0 with fp32 values) and the bits past each area's last slot. */
DGC_HOSTDEV int dgc_cx_frame(const uint64_t *pl, const dgc_cx_view *v, uint64_t *count, int *e) {
    const uint64_t word = pl[DGC_CX_HEADER_WORDS];
    const uint64_t c = word & DGC_CX_COUNT_MASK;
    const int s = (int)(int16_t)(uint16_t)(word >> DGC_CX_SCALE_SHIFT);
    if ((word & DGC_CX_RESERVED_MASK) || c > v->k || (v->value_bits == 32 && s != 0) || s < DGC_CX_SCALE_MIN ||
        s > DGC_CX_SCALE_MAX)
        return DGC_CX_COUNT;
    if (!dgc_cx_clear_after(pl + v->values, v->value_words, v->k * v->value_bits) ||
        (v->low_bits && !dgc_cx_clear_after(pl + v->low, v->low_words, v->k * v->low_bits)))
        return DGC_CX_TAIL;
    *count = c;
    *e = s;
    return DGC_CX_OK;
}

/* Upper word w (its bits x) with `before` set bits in the words before it:
 * for each set bit, the pair it starts (j = before + its rank in the word),
 * its index (high part p - j above the low slot j) into idx[j]. Returns the
 * first fault, *slot its pair (or the bit's position past the area). */
DGC_HOSTDEV int dgc_cx_upper_word(const uint64_t *pl, const dgc_cx_view *v, uint64_t count, uint64_t w, uint64_t x,
                                  uint64_t before, uint32_t *idx, uint64_t *slot) {
    const uint64_t limit = dgc_cx_index_limit(v->n);
    const unsigned lb = v->low_bits;
    uint64_t j = before;
    for (; x; x &= x - 1u, j++) {
        const uint64_t p = 64u * w + (uint64_t)dgc_cx_low_bit(x), high = p - j;
        *slot = j;
        if (p >= v->upper_bits || j >= count) return DGC_CX_UPPER;
        /* Checked before the shift, which could otherwise overflow. */
        if (limit == 0 || high > (limit - 1u) >> lb) return DGC_CX_INDEX;
        const uint64_t i = high << lb | (lb ? dgc_cx_get_slot(pl + v->low, j, lb) : 0);
        if (i >= limit) return DGC_CX_INDEX;
        idx[j] = (uint32_t)i;
    }
    return DGC_CX_OK;
}

/* Slot j, after every upper word has given its index: below the count, the
 * index above the one before and the value sound (its fp32 bits into
 * *value, and for 16 bits its magnitude into *mag, for the scale's check);
 * at or past it, the low and value slots 0 (*value 0, the padding). */
DGC_HOSTDEV int dgc_cx_slot(const uint64_t *pl, const dgc_cx_view *v, uint64_t count, int e, uint64_t j,
                            const uint32_t *idx, uint32_t *value, uint32_t *mag) {
    const uint32_t raw = (uint32_t)dgc_cx_get_slot(pl + v->values, j, v->value_bits);
    *mag = 0;
    *value = 0;
    if (j >= count)
        return raw != 0 || (v->low_bits && dgc_cx_get_slot(pl + v->low, j, v->low_bits) != 0) ? DGC_CX_TAIL
                                                                                            : DGC_CX_OK;
    if (j > 0 && idx[j] <= idx[j - 1]) return DGC_CX_ORDER;
    if (v->value_bits == 32) {
        *value = raw;
        return dgc_cx_finite(raw) ? DGC_CX_OK : DGC_CX_VALUE;
    }
    *mag = raw & 0x7fffu;
    return dgc_cx_float_of_half(raw, e, value) ? DGC_CX_VALUE : DGC_CX_OK;
}

/* The payload's end: as many set upper bits as the count (set_bits, all of
 * them), the canonical scale (16 bits: the largest magnitude max in
 * binary16's top binade, or e 0 when every value is 0), and a lone pair
 * that is not the padding (0, +0.0). */
DGC_HOSTDEV int dgc_cx_end(const dgc_cx_view *v, uint64_t count, int e, uint64_t set_bits, uint32_t max,
                           uint32_t first_index, uint32_t first_value) {
    if (set_bits < count) return DGC_CX_UPPER;
    if (v->value_bits == 16 && (max == 0 ? e != 0 : (max >> 10) != DGC_CX_HALF_TOP_FIELD)) return DGC_CX_SCALE;
    if (count == 1 && first_index == 0 && first_value == 0) return DGC_CX_PADDING;
    return DGC_CX_OK;
}

#endif
