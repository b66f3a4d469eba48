/* The compact payload (wire_compact.h): Elias-Fano indices in a fixed
 * budget, and fp32 or scaled binary16 values. Bit I/O is a word at a time: a
 * low slot of up to 32 bits touches at most two little-endian uint64 words,
 * and the upper area is walked a word at a time by its set bits. The float
 * conversions are integer arithmetic, so that no FPU rounding mode (which
 * the user's process may change) can make two ranks disagree. The expander
 * validates everything it reads before it can reach user memory. */
#include "dgcshim/wire_compact.h"

#include <stdio.h>
#include <string.h>

#include "dgcshim/wire.h"

#define HEADER_BYTES sizeof(dgc_wire_header)
#define COUNT_BYTES 8u
#define INDEX_LIMIT ((uint64_t)UINT32_MAX + 1u) /* indices are uint32 on the wire */
#define COUNT_MASK ((UINT64_C(1) << 40) - 1u)
#define RESERVED_MASK (UINT64_C(0xff) << 40)
#define SCALE_SHIFT 48
/* e is the binade of a non-zero fp32 magnitude: 2^-149 up to 2^127. */
#define SCALE_MIN (-149)
#define SCALE_MAX 127
#define HALF_TOP_FIELD 29u /* the largest value's binary16 exponent field: [2^14, 2^15) */

static uint64_t words_for(uint64_t bits) { return bits / 64u + (bits % 64u != 0); }

/* For n = 0 no index fits; the upper area then holds the count's k bits only. */
static uint64_t upper_for(uint64_t n, uint64_t k, unsigned low_bits) { return k + (n ? (n - 1) >> low_bits : 0); }

static size_t bytes_for(uint64_t n, uint64_t k, unsigned low_bits, unsigned vb) {
    return HEADER_BYTES + COUNT_BYTES + (size_t)(8u * words_for(upper_for(n, k, low_bits))) +
           (size_t)(8u * words_for(k * low_bits)) + (size_t)(8u * words_for(k * vb));
}

void dgc_compact_layout_for(uint64_t n, uint64_t k, unsigned value_bits, dgc_compact_layout *out) {
    unsigned best = 0;
    uint64_t best_bits = upper_for(n, k, 0);
    for (unsigned l = 1; l <= 32; l++) {
        uint64_t bits = k * l + upper_for(n, k, l);
        if (bits < best_bits) best_bits = bits, best = l;
    }
    out->n = n;
    out->k = k;
    out->low_bits = best;
    out->value_bits = value_bits == 16 ? 16 : 32;
    out->upper_bits = upper_for(n, k, best);
    out->bytes = bytes_for(n, k, best, out->value_bits);
}

/* ---- values: exact conversions between fp32, binary16 and (mag, exp) ---- */

static uint32_t float_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static float bits_float(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static int float_finite(uint32_t u) { return (u & 0x7f800000u) != 0x7f800000u; }

/* A finite value as sign, integer magnitude and power of two:
 * |x| = mag * 2^exp, mag 0 for a zero. */
typedef struct {
    uint32_t sign; /* the fp32 sign bit, in place */
    uint64_t mag;
    int exp;
} parts;

static parts float_parts(uint32_t u) {
    uint32_t field = (u >> 23) & 0xffu, frac = u & 0x7fffffu;
    parts p = {u & 0x80000000u, frac, -149};
    if (field) p.mag = frac | 0x800000u, p.exp = (int)field - 150;
    return p;
}

static parts half_parts(uint32_t h) {
    uint32_t field = (h >> 10) & 0x1fu, frac = h & 0x3ffu;
    parts p = {(h & 0x8000u) << 16, frac, -24};
    if (field) p.mag = frac | 0x400u, p.exp = (int)field - 25;
    return p;
}

static int top_bit(uint64_t v) { return 63 - __builtin_clzll(v); } /* v != 0 */

/* floor(log2 |value|) of a non-zero p. */
static int binade_of(parts p) { return p.exp + top_bit(p.mag); }

/* Shifts p right until its exponent is at least min_exp and its magnitude
 * has at most sig_bits bits, dropping only zero bits. -1 when a one would be
 * dropped: the value is not on that grid. */
static int normalise(parts *p, int min_exp, int sig_bits) {
    int sh = min_exp - p->exp, over = top_bit(p->mag) + 1 - sig_bits;
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
static int encode_ieee(parts p, int exp_bits, int frac_bits, uint32_t sign, uint32_t *out) {
    const int bias = (1 << (exp_bits - 1)) - 1, min_exp = 1 - bias - frac_bits;
    if (p.mag == 0) {
        *out = sign;
        return 0;
    }
    if (normalise(&p, min_exp, frac_bits + 1)) return -1;
    int top = binade_of(p), t = top_bit(p.mag);
    if (top > bias) return -1;
    if (top < 1 - bias) { /* subnormal: exp is min_exp after normalise */
        *out = sign | (uint32_t)(p.mag << (p.exp - min_exp));
        return 0;
    }
    uint32_t frac = (uint32_t)(p.mag << (frac_bits - t)) & ((UINT32_C(1) << frac_bits) - 1u);
    *out = sign | (uint32_t)(top + bias) << frac_bits | frac;
    return 0;
}

static int float_from_parts(parts p, uint32_t *out) { return encode_ieee(p, 8, 23, p.sign, out); }
static int half_from_parts(parts p, uint32_t *out) { return encode_ieee(p, 5, 10, p.sign >> 16, out); }

/* mag / 2^sh to the nearest integer, ties to the even one. */
static uint64_t round_shift(uint64_t mag, int sh) {
    if (sh <= 0) return mag;
    if (sh > 62) return 0; /* mag < 2^24 is below half a unit */
    uint64_t r = mag >> sh, rem = mag & ((UINT64_C(1) << sh) - 1u), half = UINT64_C(1) << (sh - 1);
    return r + (rem > half || (rem == half && (r & 1u)));
}

static int clamp_scale(int e) { return e < SCALE_MIN ? SCALE_MIN : e > SCALE_MAX ? SCALE_MAX : e; }

/* The fast case of round16 and of the conversions: x an fp32 normal whose
 * binade b lies where binary16 under e is normal too (b >= e - 28) and below
 * 2^127 (no clamp): its grid is then 2^(b - 10), fp32's with 13 fraction
 * bits fewer. Most values of a payload are there; the general code below
 * handles the rest. */
static int fast_case(uint32_t u, int e) {
    const int field = (int)((u >> 23) & 0xffu), b = field - 127;
    return field != 0 && b >= e - 28 && b < 127;
}

/* round16 of wire_compact.h, on the bits of a finite x. */
static uint32_t round16_bits(uint32_t u, int e) {
    if (fast_case(u, e)) { /* ties to even on the 13 bits dropped; a carry into the exponent is exact */
        u += 0xfffu + ((u >> 13) & 1u);
        return u & 0xffffe000u;
    }
    parts p = float_parts(u);
    if (p.mag == 0) return u;
    int q = binade_of(p) - 10;
    if (q < e - 38) q = e - 38; /* binary16's subnormal quantum, scaled */
    if (q < -149) q = -149;     /* fp32's own: nothing finer exists */
    if (q > p.exp) {
        p.mag = round_shift(p.mag, q - p.exp);
        p.exp = q;
    }
    if (p.mag && binade_of(p) > 127) p.mag = 2047, p.exp = 117; /* the largest below 2^128 */
    uint32_t out = p.sign;
    float_from_parts(p, &out); /* exact: at most 11 significant bits, on fp32's grid */
    return out;
}

float dgc_compact_value(float x, unsigned value_bits, int scale_exp) {
    uint32_t u = float_bits(x);
    if (value_bits != 16 || !float_finite(u)) return x;
    return bits_float(round16_bits(u, clamp_scale(scale_exp)));
}

/* The binade of the largest finite magnitude among bits, or SCALE_MIN - 1
 * when all are 0. */
static int max_binade(uint32_t max_abs) {
    return max_abs ? binade_of(float_parts(max_abs)) : SCALE_MIN - 1;
}

int dgc_compact_scale16(const float *x, uint64_t count) {
    uint32_t max = 0; /* finite magnitudes order as their bits do */
    for (uint64_t j = 0; j < count; j++) {
        uint32_t a = float_bits(x[j]) & 0x7fffffffu;
        if (float_finite(a) && a > max) max = a;
    }
    if (!max) return 0;
    int e = max_binade(max);
    /* Rounding may carry the largest into the next binade; at 127 the
     * rounding itself stops below 2^128. */
    if (e < SCALE_MAX && max_binade(round16_bits(max, e) & 0x7fffffffu) > e) e++;
    return e;
}

/* ---- bit I/O ---- */

/* Little-endian words, wherever the host's byte order. */
static uint64_t load64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, sizeof v);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

static void store64(unsigned char *p, uint64_t v) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    memcpy(p, &v, sizeof v);
}

/* LSB-first packing into little-endian words is LSB-first in byte order too:
 * value slot j of 16 or 32 bits is bytes [j*vb/8, (j+1)*vb/8) of the area. */
static uint32_t load_value(const unsigned char *area, uint64_t j, unsigned vb) {
    if (vb == 16) {
        const unsigned char *p = area + 2u * j;
        return (uint32_t)p[0] | (uint32_t)p[1] << 8;
    }
    const unsigned char *p = area + 4u * j;
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void store_value(unsigned char *area, uint64_t j, unsigned vb, uint32_t u) {
    unsigned char *p = area + (vb / 8u) * j;
    for (unsigned b = 0; b < vb / 8u; b++) p[b] = (unsigned char)(u >> (8u * b));
}

/* Sequential writer of b-bit slots (b <= 32) into zeroed words. */
typedef struct {
    unsigned char *base;
    uint64_t word; /* next word to store */
    uint64_t acc;  /* bits not yet stored */
    unsigned fill; /* how many, < 64 */
} bit_writer;

static void put_slot(bit_writer *w, uint64_t v, unsigned b) {
    w->acc |= v << w->fill;
    w->fill += b;
    if (w->fill >= 64) {
        store64(w->base + 8u * w->word++, w->acc);
        w->fill -= 64;
        w->acc = w->fill ? v >> (b - w->fill) : 0;
    }
}

static void flush_slots(bit_writer *w) {
    if (w->fill) store64(w->base + 8u * w->word, w->acc);
}

/* Slot j of b bits (1..32); the caller keeps j below the area's slots, so
 * both words read lie inside the area. */
static uint64_t get_slot(const unsigned char *area, uint64_t j, unsigned b) {
    uint64_t pos = j * b, w = pos >> 6;
    unsigned s = (unsigned)(pos & 63u);
    uint64_t v = load64(area + 8u * w) >> s;
    if (s + b > 64) v |= load64(area + 8u * (w + 1)) << (64 - s);
    return v & ((UINT64_C(1) << b) - 1u);
}

static void set_bit(unsigned char *area, uint64_t bit) {
    unsigned char *p = area + 8u * (bit >> 6);
    store64(p, load64(p) | UINT64_C(1) << (bit & 63u));
}

/* The first non-zero bit at or after bit `from` of an area of `words` words,
 * or UINT64_MAX when all are 0. */
static uint64_t first_set_bit(const unsigned char *area, uint64_t words, uint64_t from) {
    uint64_t w = from >> 6;
    if (w >= words) return UINT64_MAX;
    uint64_t v = load64(area + 8u * w) & (~UINT64_C(0) << (from & 63u));
    for (;;) {
        if (v) return w * 64u + (uint64_t)__builtin_ctzll(v);
        if (++w >= words) return UINT64_MAX;
        v = load64(area + 8u * w);
    }
}

/* ---- the payload ---- */

/* Where the areas of a payload lie. */
typedef struct {
    uint64_t upper_words, low_words, value_words;
    size_t upper, low, values; /* byte offsets */
} areas;

static areas areas_of(const dgc_compact_layout *L) {
    areas a;
    a.upper_words = words_for(L->upper_bits);
    a.low_words = words_for(L->k * L->low_bits);
    a.value_words = words_for(L->k * L->value_bits);
    a.upper = HEADER_BYTES + COUNT_BYTES;
    a.low = a.upper + (size_t)(8u * a.upper_words);
    a.values = a.low + (size_t)(8u * a.low_words);
    return a;
}

/* Exactly dgc_compact_layout_for's: a stale or forged layout could put an
 * area outside the buffer. */
static int layout_sound(const dgc_compact_layout *L) {
    if (L->value_bits != 16 && L->value_bits != 32) return 0;
    dgc_compact_layout want;
    dgc_compact_layout_for(L->n, L->k, L->value_bits, &want);
    return L->low_bits == want.low_bits && L->upper_bits == want.upper_bits && L->bytes == want.bytes;
}

static uint64_t index_limit(uint64_t n) { return n < INDEX_LIMIT ? n : INDEX_LIMIT; }

/* The real pairs: the slots before the trailing run of (0, +0.0f) ones. */
static uint64_t real_pairs(const unsigned char *idx, const unsigned char *val, uint64_t k) {
    uint64_t count = k;
    for (; count > 0; count--) {
        uint32_t i, v;
        memcpy(&i, idx + 4u * (count - 1), 4);
        memcpy(&v, val + 4u * (count - 1), 4);
        if (i != 0 || v != 0) break;
    }
    return count;
}

/* The indices into the upper and low areas (zeroed); -1 unless they are
 * strictly increasing and below the limit. */
static int encode_indices(const unsigned char *idx, uint64_t count, const dgc_compact_layout *L,
                          unsigned char *upper, unsigned char *low) {
    const uint64_t limit = index_limit(L->n), mask = (UINT64_C(1) << L->low_bits) - 1u;
    bit_writer w = {low, 0, 0, 0};
    uint64_t next = 0; /* the least index the next pair may have */
    for (uint64_t j = 0; j < count; j++) {
        uint32_t i;
        memcpy(&i, idx + 4u * j, 4);
        if (i >= limit || i < next) return -1;
        next = (uint64_t)i + 1u;
        set_bit(upper, ((uint64_t)i >> L->low_bits) + j); /* below upper_bits: i <= n-1, j <= k-1 */
        if (L->low_bits) put_slot(&w, i & mask, L->low_bits);
    }
    flush_slots(&w);
    return 0;
}

/* The values and the scale e; -1 for a non-finite value or, with 16 bits,
 * one that is not on the grid its payload's e gives. */
static int encode_values(const unsigned char *val, uint64_t count, unsigned vb, unsigned char *values, int *scale) {
    uint32_t max = 0;
    for (uint64_t j = 0; j < count; j++) {
        uint32_t u;
        memcpy(&u, val + 4u * j, 4);
        if (!float_finite(u)) return -1;
        if ((u & 0x7fffffffu) > max) max = u & 0x7fffffffu;
    }
    /* The values are rounded already: the largest sits in binade e. */
    const int e = vb == 16 && max ? max_binade(max) : 0;
    for (uint64_t j = 0; j < count; j++) {
        uint32_t u, h;
        memcpy(&u, val + 4u * j, 4);
        if (vb == 16) {
            if (round16_bits(u, e) != u) return -1;
            if (fast_case(u, e)) { /* on the grid: the low 13 fraction bits are 0; binade <= e */
                const int hb = (int)((u >> 23) & 0xffu) - 127 + 14 - e; /* in [-14, 14] */
                store_value(values, j, vb, (u >> 16 & 0x8000u) | (uint32_t)(hb + 15) << 10 | (u >> 13 & 0x3ffu));
                continue;
            }
            parts p = float_parts(u);
            p.exp += 14 - e;
            if (half_from_parts(p, &h)) return -1; /* cannot happen on the grid */
            u = h;
        }
        store_value(values, j, vb, u);
    }
    *scale = e;
    return 0;
}

int dgc_compact_encode(const void *plain, const dgc_compact_layout *L, void *compact) {
    if (!layout_sound(L)) return -1;
    const unsigned char *p = plain;
    unsigned char *c = compact;
    const uint64_t k = L->k;
    const unsigned char *idx = p + HEADER_BYTES, *val = p + HEADER_BYTES + 4u * k;
    const areas a = areas_of(L);

    uint64_t count = real_pairs(idx, val, k);
    if (count > COUNT_MASK) return -1;
    memcpy(c, p, HEADER_BYTES);
    memset(c + a.upper, 0, L->bytes - a.upper);
    int e = 0;
    if (encode_indices(idx, count, L, c + a.upper, c + a.low)) return -1;
    if (encode_values(val, count, L->value_bits, c + a.values, &e)) return -1;
    store64(c + HEADER_BYTES, count | (uint64_t)(uint16_t)(int16_t)e << SCALE_SHIFT);
    return 0;
}

/* The count word: the count and, with 16-bit values, the scale in range.
 * Whether the scale is canonical needs the values (expand_values). */
static int expand_count(uint64_t word, const dgc_compact_layout *L, int rank, uint64_t *count, int *scale,
                        char *err, size_t errlen) {
    const uint64_t c = word & COUNT_MASK;
    const int e = (int16_t)(uint16_t)(word >> SCALE_SHIFT);
    if (word & RESERVED_MASK) {
        snprintf(err, errlen, "payload from rank %d: count word 0x%016llx has bits 40..47 set", rank,
                 (unsigned long long)word);
        return -1;
    }
    if (c > L->k) {
        snprintf(err, errlen, "payload from rank %d: %llu pairs, more than its %llu slots", rank,
                 (unsigned long long)c, (unsigned long long)L->k);
        return -1;
    }
    if (L->value_bits == 32 && e != 0) {
        snprintf(err, errlen, "payload from rank %d: scale exponent %d with 32-bit values (must be 0)", rank, e);
        return -1;
    }
    if (e < SCALE_MIN || e > SCALE_MAX) {
        snprintf(err, errlen, "payload from rank %d: scale exponent %d outside [%d, %d]", rank, e, SCALE_MIN,
                 SCALE_MAX);
        return -1;
    }
    *count = c;
    *scale = e;
    return 0;
}

/* Slots at or past count, and bits past the last slot, must be 0. */
static int check_tail(const unsigned char *area, uint64_t words, uint64_t count, uint64_t slots, unsigned slot_bits,
                      const char *what, int rank, char *err, size_t errlen) {
    uint64_t bit = first_set_bit(area, words, count * slot_bits);
    if (bit == UINT64_MAX) return 0;
    if (bit / slot_bits < slots)
        snprintf(err, errlen, "payload from rank %d: %s slot %llu after its %llu pairs is not 0", rank, what,
                 (unsigned long long)(bit / slot_bits), (unsigned long long)count);
    else
        snprintf(err, errlen, "payload from rank %d: %s area bit %llu, past its %llu slots, is not 0", rank, what,
                 (unsigned long long)bit, (unsigned long long)slots);
    return -1;
}

/* Value slot j (16 bits) as fp32 bits: -1 for Inf/NaN or a value fp32
 * cannot hold. */
static int expand_half(uint32_t h, int e, uint64_t j, int rank, uint32_t *out, char *err, size_t errlen) {
    if (((h >> 10) & 0x1fu) == 0x1fu) {
        snprintf(err, errlen, "payload from rank %d: value slot %llu is binary16 Inf or NaN (0x%04x)", rank,
                 (unsigned long long)j, h);
        return -1;
    }
    /* The fast case: a binary16 normal whose value (binade b) is an fp32 normal. */
    const int field = (int)((h >> 10) & 0x1fu), b = field - 15 + e - 14;
    if (field != 0 && b >= -126 && b <= 127) {
        *out = (h & 0x8000u) << 16 | (uint32_t)(b + 127) << 23 | (h & 0x3ffu) << 13;
        return 0;
    }
    parts p = half_parts(h);
    p.exp += e - 14;
    if (float_from_parts(p, out)) {
        snprintf(err, errlen, "payload from rank %d: value slot %llu (binary16 0x%04x times 2^%d) is not exact in fp32",
                 rank, (unsigned long long)j, h, e - 14);
        return -1;
    }
    return 0;
}

/* The count values into val; with 16 bits checks that e is the canonical
 * scale: the largest |value| in [2^e, 2^(e+1)), or e 0 when all are 0. */
static int expand_values(const unsigned char *values, uint64_t count, unsigned vb, int e, int rank,
                         unsigned char *val, char *err, size_t errlen) {
    uint32_t max = 0;
    for (uint64_t j = 0; j < count; j++) {
        uint32_t u = load_value(values, j, vb);
        if (vb == 16) {
            if ((u & 0x7fffu) > max) max = u & 0x7fffu;
            if (expand_half(u, e, j, rank, &u, err, errlen)) return -1;
        } else if (!float_finite(u)) {
            snprintf(err, errlen, "payload from rank %d: value slot %llu is Inf or NaN (0x%08x)", rank,
                     (unsigned long long)j, u);
            return -1;
        }
        memcpy(val + 4u * j, &u, 4);
    }
    if (vb == 16 && max == 0 && e != 0) {
        snprintf(err, errlen, "payload from rank %d: scale exponent %d with every value 0 (canonical: 0)", rank, e);
        return -1;
    }
    if (vb == 16 && max != 0 && (max >> 10) != HALF_TOP_FIELD) {
        snprintf(err, errlen,
                 "payload from rank %d: scale exponent %d is not canonical (largest binary16 magnitude 0x%04x, "
                 "outside [0x7400, 0x7800))",
                 rank, e, max);
        return -1;
    }
    return 0;
}

static int index_out_of_range(uint64_t j, uint64_t high, unsigned low_bits, uint64_t n, int rank, char *err,
                              size_t errlen) {
    snprintf(err, errlen, "payload from rank %d: pair %llu has index at least %llu * 2^%u, out of range for n %llu",
             rank, (unsigned long long)j, (unsigned long long)high, low_bits, (unsigned long long)n);
    return -1;
}

/* The count indices into idx: the j-th set bit of the upper area, at p,
 * gives the high part p - j, the low slot j the rest. Walks the set bits a
 * word at a time and stops at the first one too many: linear in the area. */
static int expand_indices(const unsigned char *upper, const unsigned char *low, const dgc_compact_layout *L,
                          uint64_t count, int rank, unsigned char *idx, char *err, size_t errlen) {
    const uint64_t limit = index_limit(L->n), words = words_for(L->upper_bits);
    const unsigned lb = L->low_bits;
    uint64_t j = 0, prev = 0;
    for (uint64_t w = 0; w < words; w++) {
        for (uint64_t v = load64(upper + 8u * w); v; v &= v - 1u) {
            const uint64_t p = 64u * w + (uint64_t)__builtin_ctzll(v), high = p - j;
            if (p >= L->upper_bits) {
                snprintf(err, errlen, "payload from rank %d: upper area bit %llu, past its %llu bits, is not 0", rank,
                         (unsigned long long)p, (unsigned long long)L->upper_bits);
                return -1;
            }
            if (j == count) {
                snprintf(err, errlen, "payload from rank %d: upper area bit %llu is set after its %llu pairs' bits",
                         rank, (unsigned long long)p, (unsigned long long)count);
                return -1;
            }
            /* Checked before the shift, which could otherwise overflow. */
            if (limit == 0 || high > (limit - 1u) >> lb) return index_out_of_range(j, high, lb, L->n, rank, err, errlen);
            const uint64_t i = high << lb | (lb ? get_slot(low, j, lb) : 0);
            if (i >= limit) {
                snprintf(err, errlen, "payload from rank %d: pair %llu has index %llu, out of range for n %llu", rank,
                         (unsigned long long)j, (unsigned long long)i, (unsigned long long)L->n);
                return -1;
            }
            if (j > 0 && i <= prev) {
                snprintf(err, errlen, "payload from rank %d: pair %llu has index %llu, not above pair %llu's %llu%s",
                         rank, (unsigned long long)j, (unsigned long long)i, (unsigned long long)(j - 1),
                         (unsigned long long)prev, i == prev ? " (a duplicate)" : "");
                return -1;
            }
            const uint32_t i32 = (uint32_t)i;
            memcpy(idx + 4u * j, &i32, 4);
            prev = i;
            j++;
        }
    }
    if (j < count) {
        snprintf(err, errlen, "payload from rank %d: upper area has %llu set bits, fewer than its %llu pairs", rank,
                 (unsigned long long)j, (unsigned long long)count);
        return -1;
    }
    return 0;
}

int dgc_compact_expand(const void *compact, const dgc_compact_layout *L, int rank, void *plain, char *err,
                       size_t errlen) {
    if (!layout_sound(L)) {
        snprintf(err, errlen,
                 "payload from rank %d: compact layout (n %llu k %llu low bits %u upper bits %llu value bits %u, "
                 "%zu bytes) is not sound",
                 rank, (unsigned long long)L->n, (unsigned long long)L->k, L->low_bits,
                 (unsigned long long)L->upper_bits, L->value_bits, L->bytes);
        return -1;
    }
    const unsigned char *c = compact;
    unsigned char *p = plain;
    const uint64_t k = L->k;
    const unsigned vb = L->value_bits;
    const areas a = areas_of(L);
    unsigned char *idx = p + HEADER_BYTES, *val = p + HEADER_BYTES + 4u * k;

    uint64_t count;
    int e;
    if (expand_count(load64(c + HEADER_BYTES), L, rank, &count, &e, err, errlen)) return -1;
    /* The tails first: cheap, and a bad one is rejected before any decoding. */
    if (check_tail(c + a.values, a.value_words, count, k, vb, "value", rank, err, errlen)) return -1;
    if (L->low_bits && check_tail(c + a.low, a.low_words, count, k, L->low_bits, "low", rank, err, errlen))
        return -1;
    memcpy(p, c, HEADER_BYTES);
    if (expand_values(c + a.values, count, vb, e, rank, val, err, errlen)) return -1;
    if (expand_indices(c + a.upper, c + a.low, L, count, rank, idx, err, errlen)) return -1;
    uint32_t i0 = 1, v0 = 1;
    if (count == 1) { /* only a first pair can have index 0 */
        memcpy(&i0, idx, 4);
        memcpy(&v0, val, 4);
    }
    if (i0 == 0 && v0 == 0) {
        snprintf(err, errlen, "payload from rank %d: its one pair (index 0, +0.0) is padding, counted as a pair",
                 rank);
        return -1;
    }
    memset(idx + 4u * count, 0, 4u * (k - count));
    memset(val + 4u * count, 0, 4u * (k - count));
    return 0;
}
