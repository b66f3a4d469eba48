/* The compact payload (wire_compact.h): Elias-Fano indices in a fixed
 * budget, and fp32 or scaled binary16 values. Bit I/O is a word at a time: a
 * low slot of up to 32 bits touches at most two little-endian uint64 words,
 * and the upper area is walked a word at a time by its set bits. The float
 * conversions are integer arithmetic, so that no FPU rounding mode (which
 * the user's process may change) can make two ranks disagree. The expander
 * validates everything it reads before it can reach user memory.
 *
 * Speed: every payload each rank sends is expanded by every other rank at
 * every step, so the hot loops do not branch on the data. Each handles the
 * common case of a sound payload and or-s up a flag for anything else (a
 * value that needs the general conversion, an index out of order); only
 * when a flag is set does the per-slot code, which checks as it goes and
 * names the first fault, redo that part. The fast loops thus decide how
 * quickly a payload is handled, never what comes out of it or which error
 * is reported. */
#include "dgcshim/wire_compact.h"

#include <stdio.h>
#include <string.h>

#include "dgcshim/compact_rules.h"
#include "dgcshim/wire.h"
#include "compact_walk.h"

#define HEADER_BYTES sizeof(dgc_wire_header)
#define COUNT_BYTES 8u
#define INDEX_LIMIT DGC_CX_INDEX_LIMIT
#define COUNT_MASK DGC_CX_COUNT_MASK
#define RESERVED_MASK DGC_CX_RESERVED_MASK
#define SCALE_SHIFT DGC_CX_SCALE_SHIFT
#define SCALE_MIN DGC_CX_SCALE_MIN
#define SCALE_MAX DGC_CX_SCALE_MAX
#define HALF_TOP_FIELD DGC_CX_HALF_TOP_FIELD


/* For n = 0 no index fits; the upper area then holds the count's k bits only. */
static uint64_t upper_for(uint64_t n, uint64_t k, unsigned low_bits) { return k + (n ? (n - 1) >> low_bits : 0); }

static size_t bytes_for(uint64_t n, uint64_t k, unsigned low_bits, unsigned vb) {
    return HEADER_BYTES + COUNT_BYTES + (size_t)(8u * dgc_cx_words(upper_for(n, k, low_bits))) +
           (size_t)(8u * dgc_cx_words(k * low_bits)) + (size_t)(8u * dgc_cx_words(k * vb));
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

/* The conversions are compact_rules.h's (dgc_cx_*), shared with the CUDA codec. */

float dgc_compact_value(float x, unsigned value_bits, int scale_exp) {
    uint32_t u = float_bits(x);
    if (value_bits != 16 || !dgc_cx_finite(u)) return x;
    return bits_float(dgc_cx_round16_bits(u, dgc_cx_clamp_scale(scale_exp)));
}

/* The value loops take VALUE_BLOCK slots at a time: a branch-free pass that
 * the compiler can vectorise does the common values and says whether the
 * block holds any other; only then does the per-slot code below redo the
 * block, so a rare odd value costs one block, and the result (and, in the
 * expander, which slot an error names) is the per-slot code's. */
#define VALUE_BLOCK 256u

static uint64_t block_end(uint64_t from, uint64_t count) {
    return count - from < VALUE_BLOCK ? count : from + VALUE_BLOCK;
}

void dgc_compact_values(const float *x, uint64_t count, unsigned value_bits, int scale_exp, float *out) {
    if (value_bits != 16) {
        memmove(out, x, (size_t)count * sizeof *x);
        return;
    }
    const int e = dgc_cx_clamp_scale(scale_exp);
    /* dgc_cx_fast_case as a range of the exponent field: [lo, 253]. */
    const uint32_t lo = dgc_cx_fast_field_min(e), span = 253u - lo;
    uint32_t r[VALUE_BLOCK];
    for (uint64_t j0 = 0, end; j0 < count; j0 = end) {
        end = block_end(j0, count);
        const uint64_t len = end - j0;
        uint32_t off = 0;
        for (uint64_t j = 0; j < len; j++) { /* dgc_cx_round16_bits' fast case, without a branch */
            const uint32_t u = float_bits(x[j0 + j]);
            off |= (((u >> 23) & 0xffu) - lo) > span;
            r[j] = (u + 0xfffu + ((u >> 13) & 1u)) & 0xffffe000u;
        }
        if (off)
            for (uint64_t j = 0; j < len; j++) r[j] = float_bits(dgc_compact_value(x[j0 + j], 16, e));
        memcpy(out + j0, r, (size_t)len * sizeof *r);
    }
}

int dgc_compact_scale16(const float *x, uint64_t count) {
    uint32_t max = 0; /* finite magnitudes order as their bits do */
    for (uint64_t j = 0; j < count; j++) {
        uint32_t a = float_bits(x[j]) & 0x7fffffffu;
        if (dgc_cx_finite(a) && a > max) max = a;
    }
    return dgc_cx_scale16_of_max(max);
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

/* The same for 16 and 32 bits: a memcpy the compiler turns into one load
 * or store, which keeps the value loops below vectorisable. */
static uint32_t load16(const unsigned char *p) {
    uint16_t v;
    memcpy(&v, p, sizeof v);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap16(v);
#endif
    return v;
}

static void store16(unsigned char *p, uint32_t u) {
    uint16_t v = (uint16_t)u;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap16(v);
#endif
    memcpy(p, &v, sizeof v);
}

static uint32_t load32(const unsigned char *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    return v;
}

static void store32(unsigned char *p, uint32_t v) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    memcpy(p, &v, sizeof v);
}

/* A plain payload's index or value: host order, as wire.h has it. */
static uint32_t load_host32(const unsigned char *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static void store_host32(unsigned char *p, uint32_t v) { memcpy(p, &v, sizeof v); }

/* LSB-first packing into little-endian words is LSB-first in byte order too:
 * value slot j of 16 or 32 bits is bytes [j*vb/8, (j+1)*vb/8) of the area. */
static uint32_t load_value(const unsigned char *area, uint64_t j, unsigned vb) {
    return vb == 16 ? load16(area + 2u * j) : load32(area + 4u * j);
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
    a.upper_words = dgc_cx_words(L->upper_bits);
    a.low_words = dgc_cx_words(L->k * L->low_bits);
    a.value_words = dgc_cx_words(L->k * L->value_bits);
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
 * strictly increasing and below the limit. The upper word being filled stays
 * in a register and is stored after every pair, to the same address until
 * the word changes: no load, and no branch on where a word ends. */
static int encode_indices(const unsigned char *idx, uint64_t count, const dgc_compact_layout *L,
                          unsigned char *upper, unsigned char *low) {
    const uint64_t limit = index_limit(L->n), mask = (UINT64_C(1) << L->low_bits) - 1u;
    const unsigned lb = L->low_bits;
    bit_writer w = {low, 0, 0, 0};
    uint64_t next = 0; /* the least index the next pair may have */
    uint64_t word = 0, bits = 0; /* the upper word being filled, and its bits so far */
    for (uint64_t j = 0; j < count; j++) {
        const uint64_t i = load_host32(idx + 4u * j);
        if (i >= limit || i < next) return -1;
        next = i + 1u;
        /* Below upper_bits (i <= n-1, j <= k-1), and above the last pair's. */
        const uint64_t bit = (i >> lb) + j, at = bit >> 6;
        bits = (at == word ? bits : 0) | UINT64_C(1) << (bit & 63u);
        word = at;
        store64(upper + 8u * at, bits);
        if (lb) put_slot(&w, i & mask, lb);
    }
    flush_slots(&w);
    return 0;
}

/* 16-bit slots [from, to) of the encoder, one at a time: -1 for a value off
 * its payload's grid. */
static int encode_halves_exact(const unsigned char *val, uint64_t from, uint64_t to, int e, unsigned char *values) {
    for (uint64_t j = from; j < to; j++) {
        uint32_t h;
        if (dgc_cx_half_of(load_host32(val + 4u * j), e, &h)) return -1;
        store16(values + 2u * j, h);
    }
    return 0;
}

/* The same slots in the common case: u is +-0, or an fp32 normal of binade
 * b in [e - 28, e] (binary16 normal under e; b <= e holds for every value,
 * e being the binade of the payload's largest) whose low 13 fraction bits
 * are 0. Such a u is on the grid, dgc_cx_round16_bits(u, e) == u: below binade 127
 * that is dgc_cx_fast_case's rounding, and at 127 the general code drops the same
 * 13 bits with no clamp to meet. Its binary16 field is b + 29 - e (in
 * [1, 29]), so the half is fp32's field and fraction shifted down 13 with
 * the bias moved, in wrapping arithmetic. Nonzero when some slot is
 * neither: the exact code must redo the block.
 *
 * Rather than test each value against both ends of the range, the loop
 * or-s up two flags that vectorise well: a non-zero |u| below the range's
 * lowest normal (|u| - 1 wraps a zero past it), and every |u|'s low 13
 * bits. The top end needs no test: no |u| passes the largest. */
static uint32_t encode_halves_fast(const unsigned char *val, uint64_t from, uint64_t to, int e,
                                   unsigned char *values) {
    const uint32_t lowest = dgc_cx_fast_field_min(e) << 23; /* binade e - 28, and a normal */
    const uint32_t rebias = (uint32_t)(-98 - e) << 10;
    uint32_t small = 0, bits = 0;
    for (uint64_t j = from; j < to; j++) {
        const uint32_t u = load_host32(val + 4u * j), a = u & 0x7fffffffu;
        small |= (uint32_t)(a - 1u < lowest - 1u);
        bits |= a;
        store16(values + 2u * j, (u >> 16 & 0x8000u) | (((a >> 13) + rebias) & (0u - (uint32_t)(a != 0))));
    }
    return small | (bits & 0x1fffu);
}

/* The values and the scale e; -1 for a non-finite value or, with 16 bits,
 * one that is not on the grid its payload's e gives. */
static int encode_values(const unsigned char *val, uint64_t count, unsigned vb, unsigned char *values, int *scale) {
    uint32_t max = 0, nonfinite = 0; /* finite magnitudes order as their bits do */
    for (uint64_t j = 0; j < count; j++) {
        const uint32_t a = load_host32(val + 4u * j) & 0x7fffffffu;
        nonfinite |= a >= 0x7f800000u;
        max = a > max ? a : max;
    }
    if (nonfinite) return -1;
    /* The values are rounded already: the largest sits in binade e. */
    const int e = vb == 16 && max ? dgc_cx_max_binade(max) : 0;
    if (vb == 32) {
        for (uint64_t j = 0; j < count; j++) store32(values + 4u * j, load_host32(val + 4u * j));
    } else {
        for (uint64_t from = 0, to; from < count; from = to) {
            to = block_end(from, count);
            if (encode_halves_fast(val, from, to, e, values) && encode_halves_exact(val, from, to, e, values))
                return -1;
        }
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
    const int rc = dgc_cx_float_of_half(h, e, out);
    if (rc == -1)
        snprintf(err, errlen, "payload from rank %d: value slot %llu is binary16 Inf or NaN (0x%04x)", rank,
                 (unsigned long long)j, h);
    else if (rc)
        snprintf(err, errlen, "payload from rank %d: value slot %llu (binary16 0x%04x times 2^%d) is not exact in fp32",
                 rank, (unsigned long long)j, h, e - 14);
    return rc ? -1 : 0;
}

/* Value slots [from, to) one at a time into val (which holds slot from
 * first): -1, naming the first bad slot, for Inf/NaN or (16 bits) a value
 * fp32 cannot hold. */
static int expand_values_exact(const unsigned char *values, uint64_t from, uint64_t to, unsigned vb, int e, int rank,
                               unsigned char *val, char *err, size_t errlen) {
    for (uint64_t j = from; j < to; j++) {
        uint32_t u = load_value(values, j, vb);
        if (vb == 16) {
            if (expand_half(u, e, j, rank, &u, err, errlen)) return -1;
        } else if (!dgc_cx_finite(u)) {
            snprintf(err, errlen, "payload from rank %d: value slot %llu is Inf or NaN (0x%08x)", rank,
                     (unsigned long long)j, u);
            return -1;
        }
        store_host32(val + 4u * (j - from), u);
    }
    return 0;
}

/* The same 16-bit slots in the common case: a zero (the sign alone), or
 * expand_half's fast case, a binary16 normal whose value is an fp32 normal:
 * field in [lo, hi] with 1 <= lo and hi <= 30. The fp32 bits are then the
 * half's field and fraction shifted up 13 with the bias moved by e, in
 * wrapping arithmetic; as two 16-bit halves, the high one the half's bits
 * shifted down 3 (bias added, sign kept) and the low one its 3 last bits at
 * the top. Raises *max to the largest magnitude's bits (of every slot).
 * Nonzero when some slot is neither (Inf/NaN, a subnormal, or out of fp32's
 * normal range): the exact code must redo the block.
 *
 * Everything is 16 bits wide, so that it vectorises well, and the fields are
 * not tested one by one: the largest magnitude gives the top field, the
 * least non-zero one the bottom field. That least is kept as mag + 0x7fff in
 * int16 (wrapping: -0x8000 + mag - 1 for mag >= 1, 0x7fff for a zero), so
 * that a plain signed minimum passes the zeros over. */
static uint32_t expand_halves_fast(const unsigned char *values, uint64_t from, uint64_t to, int e,
                                   unsigned char *val, uint32_t *max) {
    const int lo = -97 - e > 1 ? -97 - e : 1, hi = 156 - e < 30 ? 156 - e : 30; /* b in [-126, 127] */
    const uint16_t rebias = (uint16_t)((uint32_t)(e + 98) << 7);
    int16_t top = 0, least = INT16_MAX;
    for (uint64_t j = from; j < to; j++) {
        const uint16_t h = (uint16_t)load16(values + 2u * j), mag = h & 0x7fffu;
        const int16_t biased = (int16_t)(uint16_t)(mag + 0x7fffu);
        top = (int16_t)mag > top ? (int16_t)mag : top;
        least = biased < least ? biased : least;
        const uint16_t keep = mag != 0 ? 0xffffu : 0u,
                       high = (uint16_t)((uint16_t)((mag >> 3) + rebias) & keep) | (h & 0x8000u),
                       low = (uint16_t)(h << 13);
        store_host32(val + 4u * (j - from), (uint32_t)high << 16 | low);
    }
    if ((uint32_t)top > *max) *max = (uint32_t)top;
    if (least == INT16_MAX) return 0; /* all zero */
    const int bottom = (least + 0x8001) >> 10;
    return bottom < lo || top >> 10 > hi;
}

/* 32-bit slots: copied (val holds slot from first), nonzero when one is Inf
 * or NaN. */
static uint32_t expand_floats_fast(const unsigned char *values, uint64_t from, uint64_t to, unsigned char *val) {
    uint32_t odd = 0;
    for (uint64_t j = from; j < to; j++) {
        const uint32_t u = load32(values + 4u * j);
        odd |= (u & 0x7f800000u) == 0x7f800000u;
        store_host32(val + 4u * (j - from), u);
    }
    return odd;
}

/* With 16 bits, e must be the canonical scale: the largest binary16
 * magnitude max in [2^e, 2^(e+1)) (top field HALF_TOP_FIELD), or e 0 when
 * every value is 0. */
static int canonical_scale(uint32_t max, unsigned vb, int e, int rank, char *err, size_t errlen) {
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

/* Value slots [from, to) into val (which holds slot from first): the fast
 * loop, and the exact one for a range it flags; raises *max (16 bits). -1
 * for a bad value, named in err. */
static int expand_value_range(const unsigned char *values, uint64_t from, uint64_t to, unsigned vb, int e, int rank,
                              unsigned char *val, uint32_t *max, char *err, size_t errlen) {
    const uint32_t odd = vb == 16 ? expand_halves_fast(values, from, to, e, val, max)
                                  : expand_floats_fast(values, from, to, val);
    return odd ? expand_values_exact(values, from, to, vb, e, rank, val, err, errlen) : 0;
}

/* The count values into val (NULL: only checked, a block at a time through
 * scratch); with 16 bits checks that e is the canonical scale: the largest
 * |value| in [2^e, 2^(e+1)), or e 0 when all are 0. */
static int expand_values(const unsigned char *values, uint64_t count, unsigned vb, int e, int rank,
                         unsigned char *val, char *err, size_t errlen) {
    unsigned char block[4u * VALUE_BLOCK];
    uint32_t max = 0;
    for (uint64_t from = 0, to; from < count; from = to) {
        to = block_end(from, count);
        if (expand_value_range(values, from, to, vb, e, rank, val ? val + 4u * from : block, &max, err, errlen))
            return -1;
    }
    return canonical_scale(max, vb, e, rank, err, errlen);
}

static int index_out_of_range(uint64_t j, uint64_t high, unsigned low_bits, uint64_t n, int rank, char *err,
                              size_t errlen) {
    snprintf(err, errlen, "payload from rank %d: pair %llu has index at least %llu * 2^%u, out of range for n %llu",
             rank, (unsigned long long)j, (unsigned long long)high, low_bits, (unsigned long long)n);
    return -1;
}

/* The count indices into idx (NULL: only checked): the j-th set bit of the
 * upper area, at p, gives the high part p - j, the low slot j the rest.
 * Walks the set bits a word at a time, checking each pair, and stops at the
 * first bad one (its message): linear in the area. */
static int expand_indices_exact(const unsigned char *upper, const unsigned char *low, const dgc_compact_layout *L,
                                uint64_t count, int rank, unsigned char *idx, char *err, size_t errlen) {
    const uint64_t limit = index_limit(L->n), words = dgc_cx_words(L->upper_bits);
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
            if (idx) memcpy(idx + 4u * j, &i32, 4);
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

/* ---- the fast index walk ---- */

/* For each byte value b of the upper area, its r-th set bit's position minus
 * r, for r below its number of set bits; 0 after. The r-th set bit of byte
 * t, at position q, is pair j + r (j the set bits before the byte), whose
 * high part is 8t + q - (j + r) = (8t - j) + byte_gaps[b][r]: a byte's pairs
 * are one addition over eight lanes. Written out by the preprocessor from
 * those definitions: no code fills the table. BIT_POS(b, r) counts the
 * positions q whose prefix b & (2^(q+1) - 1) holds at most r set bits:
 * those before the r-th set bit. */
#define BYTE_BIT(b, q) (((b) >> (q)) & 1)
#define BYTE_ONES(b)                                                                                                   \
    (BYTE_BIT(b, 0) + BYTE_BIT(b, 1) + BYTE_BIT(b, 2) + BYTE_BIT(b, 3) + BYTE_BIT(b, 4) + BYTE_BIT(b, 5) +            \
     BYTE_BIT(b, 6) + BYTE_BIT(b, 7))
#define BIT_POS(b, r)                                                                                                  \
    ((BYTE_ONES((b) & 1) <= (r)) + (BYTE_ONES((b) & 3) <= (r)) + (BYTE_ONES((b) & 7) <= (r)) +                        \
     (BYTE_ONES((b) & 15) <= (r)) + (BYTE_ONES((b) & 31) <= (r)) + (BYTE_ONES((b) & 63) <= (r)) +                     \
     (BYTE_ONES((b) & 127) <= (r)) + (BYTE_ONES((b) & 255) <= (r)))
#define GAP(b, r) ((r) < BYTE_ONES(b) ? BIT_POS(b, r) - (r) : 0)
#define GAPS(b) {GAP(b, 0), GAP(b, 1), GAP(b, 2), GAP(b, 3), GAP(b, 4), GAP(b, 5), GAP(b, 6), GAP(b, 7)}
#define GAPS4(b) GAPS(b), GAPS((b) + 1), GAPS((b) + 2), GAPS((b) + 3)
#define GAPS16(b) GAPS4(b), GAPS4((b) + 4), GAPS4((b) + 8), GAPS4((b) + 12)
#define GAPS64(b) GAPS16(b), GAPS16((b) + 16), GAPS16((b) + 32), GAPS16((b) + 48)
#define ONES4(b) BYTE_ONES(b), BYTE_ONES((b) + 1), BYTE_ONES((b) + 2), BYTE_ONES((b) + 3)
#define ONES16(b) ONES4(b), ONES4((b) + 4), ONES4((b) + 8), ONES4((b) + 12)
#define ONES64(b) ONES16(b), ONES16((b) + 16), ONES16((b) + 32), ONES16((b) + 48)
/* 32-bit lanes (8 KiB), so that adding and storing them is plain vector
 * code; narrower ones cost a widening per byte that takes longer. */
static const uint32_t byte_gaps[256][8] = {GAPS64(0), GAPS64(64), GAPS64(128), GAPS64(192)};
static const unsigned char byte_ones[256] = {ONES64(0), ONES64(64), ONES64(128), ONES64(192)};

/* Pairs pass from the upper area to the indices this many at a time (and
 * up to 7 more: a byte's worth). */
#define INDEX_CHUNK 256u
_Static_assert(INDEX_CHUNK + 8u <= DGC_COMPACT_WALK_CHUNK, "a walk's chunk holds a whole chunk of pairs");

/* The last set bit of an area of `words` words, UINT64_MAX when all are 0. */
static uint64_t last_set_bit(const unsigned char *area, uint64_t words) {
    for (uint64_t w = words; w-- > 0;) {
        const uint64_t v = load64(area + 8u * w);
        if (v) return 64u * w + (uint64_t)dgc_cx_top_bit(v);
    }
    return UINT64_MAX;
}

static uint32_t low_slot(const unsigned char *low, uint64_t j, unsigned lb, uint64_t mask) {
    const uint64_t bit = j * lb;
    return (uint32_t)((load64(low + (bit >> 3)) >> (bit & 7u)) & mask);
}

/* Low slots [j, j + m) of lb bits (1..32) into out. Slot j is bits
 * [j*lb, j*lb + lb) of the area: a 64-bit load from its first byte holds it
 * (it starts at most 7 bits in). Each slot is its own load, shift and mask,
 * with nothing carried from one slot to the next: shifting one loaded word
 * down slot by slot chained every slot on the one before, and at 1 to 3
 * bits a slot that chain was most of an expansion's time. A load may run
 * past the low area's end into the value area's first word (which exists:
 * k >= 1): inside the payload, and shifted or masked off. With up to 8
 * bits a slot (the warm-up densities, 1/256 and up), eight slots from a
 * multiple of 8 on fill exactly lb bytes: one load serves all eight, each
 * then a shift by a multiple of lb, independent of the others; that load
 * starts no later than the eighth slot's own would, so it reads no further. */
static void unpack_lows(const unsigned char *low, uint64_t j, uint64_t m, unsigned lb, uint32_t *out) {
    const uint64_t mask = (UINT64_C(1) << lb) - 1u;
    uint64_t t = 0;
    if (lb <= 8) {
        for (; t < m && ((j + t) & 7u); t++) out[t] = low_slot(low, j + t, lb, mask);
        for (; t + 8 <= m; t += 8) {
            const uint64_t w = load64(low + (((j + t) * lb) >> 3));
            for (unsigned q = 0; q < 8; q++) out[t + q] = (uint32_t)((w >> (q * lb)) & mask);
        }
    }
    for (; t < m; t++) out[t] = low_slot(low, j + t, lb, mask);
}

/* Pairs [j, j + m) from their high parts: index high << lb | low slot into
 * lows. The high parts are at most (limit - 1) >> lb (expand_indices_fast
 * checked), so every index is below 2^32 and the shift cannot overflow; with
 * lb 32 they are 0, and the shift by lb & 31 gives that 0 too without
 * shifting a 32-bit value by 32. Returns nonzero when an index is not above
 * the one before (*least, 0 at the start, is the least the first may be);
 * sets *least for the next chunk. */
static uint32_t index_chunk(const uint32_t *high, uint32_t *lows, uint64_t m, uint64_t j, const unsigned char *low,
                            unsigned lb, uint64_t *least) {
    if (lb) unpack_lows(low, j, m, lb, lows);
    else memset(lows, 0, m * sizeof *lows);
    for (uint64_t t = 0; t < m; t++) lows[t] = high[t] << (lb & 31u) | lows[t];
    uint32_t bad = lows[0] < *least;
    for (uint64_t t = 1; t < m; t++) bad |= (uint32_t)(lows[t] <= lows[t - 1]);
    *least = (uint64_t)lows[m - 1] + 1u;
    return bad;
}

/* For count >= 1 pairs, whether the upper area passes the fast walk's
 * checks made before any pair: its last set bit lies before upper_bits, and
 * the high part it gives the last pair is within the limit's (high parts
 * never fall from one pair to the next, so that bounds them all). */
static int highs_bounded(const unsigned char *upper, const dgc_compact_layout *L, uint64_t count) {
    const uint64_t limit = index_limit(L->n);
    if (count == 0 || limit == 0) return 0;
    const uint64_t last = last_set_bit(upper, dgc_cx_words(L->upper_bits));
    return last != UINT64_MAX && last < L->upper_bits && last - (count - 1u) <= (limit - 1u) >> L->low_bits;
}

/* The high parts of the next chunk of pairs into high: the upper area's
 * bytes from *at on (j pairs before them) through byte_gaps, until a chunk
 * (INDEX_CHUNK or up to 7 more) is in or the area ends; *at moves past the
 * bytes read. Returns the chunk's pairs, 0 at the end. */
static uint64_t next_highs(const unsigned char *upper, uint64_t bytes, uint64_t *at, uint64_t j, uint32_t *high) {
    uint64_t m = 0, t = *at;
    for (; t < bytes && m < INDEX_CHUNK; t++) {
        const unsigned b = upper[t]; /* bits 8t..8t+7: the words are little-endian */
        const uint32_t base = (uint32_t)(8u * t - j - m);
        for (unsigned r = 0; r < 8; r++) high[m + r] = base + byte_gaps[b][r]; /* past m + ones: overwritten */
        m += byte_ones[b];
    }
    *at = t;
    return m;
}

/* expand_indices_exact's result for a sound payload, in loops without
 * branches on the data. The upper area is taken a byte at a time through
 * byte_gaps into the high parts of a chunk of pairs, which index_chunk then
 * turns into indices. Its per-bit checks are hoisted:
 *  - no set bit past upper_bits: the last set bit is before it;
 *  - no high part past the limit's: high parts never fall from one pair to
 *    the next (p - j grows by at least 0), so the last pair's is the largest;
 *  - count set bits, no more, no fewer: counted as the chunks go (none is
 *    written past count), and in all;
 *  - every index below the limit: with each above the one before (checked
 *    by index_chunk), the last is the largest.
 * Returns 0, or -1 when the payload fails one of those (or has no pairs):
 * the exact walk must then say where. Writes only idx slots below count.
 * Aligned to a cache line so that where its byte loop falls against 64-byte
 * boundaries does not change with the link: on the machine this was tuned
 * on (AMD EPYC), one and the same object code expanded about 20% slower in
 * some links than in others. */
static __attribute__((aligned(64))) int expand_indices_fast(const unsigned char *upper, const unsigned char *low, const dgc_compact_layout *L,
                               uint64_t count, unsigned char *idx) {
    if (!highs_bounded(upper, L, count)) return -1;
    /* The high parts, below 2^32 when sound, are kept mod 2^32 until then. */
    uint32_t high[INDEX_CHUNK + 8], lows[INDEX_CHUNK + 8];
    const uint64_t bytes = 8u * dgc_cx_words(L->upper_bits);
    uint64_t t = 0, j = 0, m, least = 0; /* upper bytes read, pairs done, pairs in the chunk */
    uint32_t bad = 0;
    while ((m = next_highs(upper, bytes, &t, j, high)) != 0) {
        if (m > count - j) return -1; /* more set bits than pairs */
        bad |= index_chunk(high, lows, m, j, low, L->low_bits, &least);
        memcpy(idx + 4u * j, lows, m * sizeof *lows); /* idx is host order */
        j += m;
    }
    return bad || j != count || least > index_limit(L->n) ? -1 : 0;
}

/* The fast walk for a sound payload; the exact one, to find and name the
 * fault, for any other. */
static int expand_indices(const unsigned char *upper, const unsigned char *low, const dgc_compact_layout *L,
                          uint64_t count, int rank, unsigned char *idx, char *err, size_t errlen) {
    if (expand_indices_fast(upper, low, L, count, idx) == 0) return 0;
    return expand_indices_exact(upper, low, L, count, rank, idx, err, errlen);
}

/* With count 1, whether that pair is (index 0, +0.0): padding, which the
 * canonical form counts out. Only asked of a payload found sound so far: the
 * index is then 0 exactly when the first upper bit and low slot are, and
 * the value +0.0 exactly when its slot's bits are 0 (either width). */
static int lone_padding(const unsigned char *c, const areas *a, const dgc_compact_layout *L) {
    return first_set_bit(c + a->upper, a->upper_words, 0) == 0 &&
           (L->low_bits == 0 || get_slot(c + a->low, 0, L->low_bits) == 0) &&
           load_value(c + a->values, 0, L->value_bits) == 0;
}

static int layout_unsound(const dgc_compact_layout *L, int rank, char *err, size_t errlen) {
    snprintf(err, errlen,
             "payload from rank %d: compact layout (n %llu k %llu low bits %u upper bits %llu value bits %u, "
             "%zu bytes) is not sound",
             rank, (unsigned long long)L->n, (unsigned long long)L->k, L->low_bits, (unsigned long long)L->upper_bits,
             L->value_bits, L->bytes);
    return -1;
}

/* The checks every reader makes before decoding anything: the layout, the
 * count word, and the value and low areas' tails. */
static int check_frame(const unsigned char *c, const dgc_compact_layout *L, const areas *a, int rank, uint64_t *count,
                       int *e, char *err, size_t errlen) {
    if (!layout_sound(L)) return layout_unsound(L, rank, err, errlen);
    if (expand_count(load64(c + HEADER_BYTES), L, rank, count, e, err, errlen)) return -1;
    /* The tails first: cheap, and a bad one is rejected before any decoding. */
    if (check_tail(c + a->values, a->value_words, *count, L->k, L->value_bits, "value", rank, err, errlen)) return -1;
    if (L->low_bits && check_tail(c + a->low, a->low_words, *count, L->k, L->low_bits, "low", rank, err, errlen))
        return -1;
    return 0;
}

static int padding_counted(int rank, char *err, size_t errlen) {
    snprintf(err, errlen, "payload from rank %d: its one pair (index 0, +0.0) is padding, counted as a pair", rank);
    return -1;
}

int dgc_compact_expand(const void *compact, const dgc_compact_layout *L, int rank, void *plain, char *err,
                       size_t errlen) {
    const unsigned char *c = compact;
    unsigned char *p = plain;
    const areas a = areas_of(L);
    uint64_t count;
    int e;
    if (check_frame(c, L, &a, rank, &count, &e, err, errlen)) return -1;
    const uint64_t k = L->k;
    unsigned char *idx = p + HEADER_BYTES, *val = p + HEADER_BYTES + 4u * k;
    memcpy(p, c, HEADER_BYTES);
    if (expand_values(c + a.values, count, L->value_bits, e, rank, val, err, errlen)) return -1;
    if (expand_indices(c + a.upper, c + a.low, L, count, rank, idx, err, errlen)) return -1;
    if (count == 1 && lone_padding(c, &a, L)) return padding_counted(rank, err, errlen);
    memset(idx + 4u * count, 0, 4u * (k - count));
    memset(val + 4u * count, 0, 4u * (k - count));
    return 0;
}

int dgc_compact_check(const void *compact, const dgc_compact_layout *L, int rank, char *err, size_t errlen) {
    const unsigned char *c = compact;
    const areas a = areas_of(L);
    uint64_t count;
    int e;
    if (check_frame(c, L, &a, rank, &count, &e, err, errlen)) return -1;
    if (expand_values(c + a.values, count, L->value_bits, e, rank, NULL, err, errlen)) return -1;
    if (expand_indices_exact(c + a.upper, c + a.low, L, count, rank, NULL, err, errlen)) return -1;
    if (count == 1 && lone_padding(c, &a, L)) return padding_counted(rank, err, errlen);
    return 0;
}

/* ---- the walk: a payload's pairs a chunk at a time ---- */

int dgc_compact_walk_start(dgc_compact_walk *w, const void *compact, const dgc_compact_layout *L) {
    const unsigned char *c = compact;
    const areas a = areas_of(L);
    char err[256]; /* unread: the walk only says whether, dgc_compact_check says what */
    uint64_t count = 0;
    int e = 0;
    *w = (dgc_compact_walk){.upper = c + a.upper,
                            .low = c + a.low,
                            .values = c + a.values,
                            .bytes = 8u * a.upper_words,
                            .limit = index_limit(L->n),
                            .lb = L->low_bits,
                            .vb = L->value_bits};
    w->bad = check_frame(c, L, &a, 0, &count, &e, err, sizeof err) != 0;
    if (w->bad) return -1;
    w->count = count;
    w->e = e;
    if (count == 0) w->bad = last_set_bit(w->upper, a.upper_words) != UINT64_MAX; /* no pairs, no bits */
    else w->bad = !highs_bounded(w->upper, L, count);
    if (!w->bad && count == 1 && lone_padding(c, &a, L)) w->bad = 1;
    return w->bad ? -1 : 0;
}

/* The chunk's values, pairs [j, j + m). Nonzero for a bad value. */
static uint32_t walk_values(dgc_compact_walk *w, uint64_t m) {
    char err[256]; /* unread, as in dgc_compact_walk_start */
    return expand_value_range(w->values, w->j, w->j + m, w->vb, w->e, 0, (unsigned char *)w->value, &w->max, err,
                              sizeof err) != 0;
}

/* expand_indices_fast's byte loop, resumed where the last chunk ended: the
 * high parts of the next chunk of pairs into w->index. Its checks are the
 * same, spread over the chunks: each chunk is checked whole (in order, its
 * largest index below the limit) before it is handed out, so a caller never
 * sees an index at or past n, whatever the payload holds. */
uint64_t dgc_compact_walk_next(dgc_compact_walk *w) {
    w->got = w->next = 0;
    if (w->bad || w->j == w->count) return 0;
    const uint64_t m = next_highs(w->upper, w->bytes, &w->t, w->j, w->high);
    if (m == 0 || m > w->count - w->j) { /* fewer set bits than pairs, or more */
        w->bad = 1;
        return 0;
    }
    uint32_t bad = index_chunk(w->high, w->index, m, w->j, w->low, w->lb, &w->least);
    bad |= w->least > w->limit; /* the chunk's last index is its largest when it is in order */
    bad |= walk_values(w, m);
    if (bad) {
        w->bad = 1;
        return 0;
    }
    w->j += m;
    w->got = m;
    return m;
}

int dgc_compact_walk_end(const dgc_compact_walk *w) {
    char err[256]; /* unread, as in dgc_compact_walk_start */
    if (w->bad || w->j != w->count) return -1;
    for (uint64_t t = w->t; t < w->bytes; t++) /* no set bit after the last pair's */
        if (w->upper[t]) return -1;
    return canonical_scale(w->max, w->vb, w->e, 0, err, sizeof err) ? -1 : 0;
}
