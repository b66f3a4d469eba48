/* The compact payload (wire_compact.h): gap codes in a fixed bit width and
 * bf16 or fp32 values. Bit I/O is a word at a time: a code of up to 32 bits
 * touches at most two little-endian uint64 words. The expander validates
 * everything it reads before it can reach user memory. */
#include "dgcshim/wire_compact.h"

#include <stdio.h>
#include <string.h>

#include "dgcshim/wire.h"

#define HEADER_BYTES sizeof(dgc_wire_header)
#define COUNT_BYTES 8u
#define INDEX_LIMIT ((uint64_t)UINT32_MAX + 1u) /* indices are uint32 on the wire */

static uint64_t words_for(uint64_t bits) { return bits / 64u + (bits % 64u != 0); }

static uint64_t codes_for(uint64_t n, uint64_t k, unsigned b) { return k + n / ((UINT64_C(1) << b) - 1u); }

static size_t bytes_for(uint64_t codes, unsigned b, uint64_t k, unsigned vb) {
    return HEADER_BYTES + COUNT_BYTES + (size_t)(8u * words_for(codes * b)) + (size_t)(8u * words_for(k * vb));
}

void dgc_compact_layout_for(uint64_t n, uint64_t k, unsigned value_bits, dgc_compact_layout *out) {
    unsigned best = 1;
    uint64_t best_bits = codes_for(n, k, 1);
    for (unsigned b = 2; b <= 32; b++) {
        uint64_t bits = codes_for(n, k, b) * b;
        if (bits < best_bits) best_bits = bits, best = b;
    }
    out->n = n;
    out->k = k;
    out->code_bits = best;
    out->value_bits = value_bits == 16 ? 16 : 32;
    out->codes = codes_for(n, k, best);
    out->bytes = bytes_for(out->codes, best, k, out->value_bits);
}

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

float dgc_compact_value(float x, unsigned value_bits) {
    if (value_bits != 16) return x;
    uint32_t u = float_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return bits_float((u & 0xffff0000u) | 0x00400000u); /* quiet NaN */
    /* Round to nearest, ties to even; a carry into the exponent is right,
     * including the one past bf16's max, which gives Inf. */
    u += 0x7fffu + ((u >> 16) & 1u);
    return bits_float(u & 0xffff0000u);
}

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
        return (uint32_t)(p[0] | p[1] << 8) << 16;
    }
    const unsigned char *p = area + 4u * j;
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void store_value(unsigned char *area, uint64_t j, unsigned vb, uint32_t u) {
    if (vb == 16) {
        unsigned char *p = area + 2u * j;
        p[0] = (unsigned char)(u >> 16);
        p[1] = (unsigned char)(u >> 24);
        return;
    }
    unsigned char *p = area + 4u * j;
    p[0] = (unsigned char)u;
    p[1] = (unsigned char)(u >> 8);
    p[2] = (unsigned char)(u >> 16);
    p[3] = (unsigned char)(u >> 24);
}

/* Sequential writer of b-bit codes (b <= 32) into zeroed words. */
typedef struct {
    unsigned char *base;
    uint64_t word; /* next word to store */
    uint64_t acc;  /* bits not yet stored */
    unsigned fill; /* how many, < 64 */
} bit_writer;

static void put_code(bit_writer *w, uint64_t v, unsigned b) {
    w->acc |= v << w->fill;
    w->fill += b;
    if (w->fill >= 64) {
        store64(w->base + 8u * w->word++, w->acc);
        w->fill -= 64;
        w->acc = w->fill ? v >> (b - w->fill) : 0;
    }
}

static void flush_codes(bit_writer *w) {
    if (w->fill) store64(w->base + 8u * w->word, w->acc);
}

/* Code slot c of b bits; the caller keeps c below the area's codes, so both
 * words read lie inside the area. */
static uint64_t get_code(const unsigned char *area, uint64_t c, unsigned b, uint64_t mask) {
    uint64_t pos = c * b, w = pos >> 6;
    unsigned s = (unsigned)(pos & 63u);
    uint64_t v = load64(area + 8u * w) >> s;
    if (s + b > 64) v |= load64(area + 8u * (w + 1)) << (64 - s);
    return v & mask;
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

static int layout_sound(const dgc_compact_layout *L) {
    return L->code_bits >= 1 && L->code_bits <= 32 && (L->value_bits == 16 || L->value_bits == 32) &&
           L->codes == codes_for(L->n, L->k, L->code_bits) &&
           L->bytes == bytes_for(L->codes, L->code_bits, L->k, L->value_bits);
}

int dgc_compact_encode(const void *plain, const dgc_compact_layout *L, void *compact) {
    if (!layout_sound(L)) return -1;
    const unsigned char *p = plain;
    unsigned char *c = compact;
    const uint64_t k = L->k, n = L->n, limit = n < INDEX_LIMIT ? n : INDEX_LIMIT;
    const unsigned b = L->code_bits, vb = L->value_bits;
    const uint64_t M = (UINT64_C(1) << b) - 1u;
    const unsigned char *idx = p + HEADER_BYTES, *val = p + HEADER_BYTES + 4u * k;
    unsigned char *codes = c + HEADER_BYTES + COUNT_BYTES;
    unsigned char *values = codes + 8u * words_for(L->codes * b);

    /* The trailing run of (0, +0.0f) slots is padding; the rest are pairs. */
    uint64_t count = k;
    for (; count > 0; count--) {
        uint32_t i, v;
        memcpy(&i, idx + 4u * (count - 1), 4);
        memcpy(&v, val + 4u * (count - 1), 4);
        if (i != 0 || v != 0) break;
    }

    memcpy(c, p, HEADER_BYTES);
    store64(c + HEADER_BYTES, count);
    memset(codes, 0, L->bytes - HEADER_BYTES - COUNT_BYTES);
    bit_writer w = {codes, 0, 0, 0};
    uint64_t next = 0, used = 0; /* next: the least index the next pair may have */
    for (uint64_t j = 0; j < count; j++) {
        uint32_t i, v;
        memcpy(&i, idx + 4u * j, 4);
        memcpy(&v, val + 4u * j, 4);
        if (i >= limit || i < next) return -1;
        if (vb == 16 && (v & 0xffffu) != 0) return -1;
        uint64_t gap = i - next, escapes = gap / M;
        used += escapes + 1;
        if (used > L->codes) return -1; /* cannot happen for indices below n */
        for (uint64_t e = 0; e < escapes; e++) put_code(&w, M, b);
        put_code(&w, gap - escapes * M, b);
        store_value(values, j, vb, v);
        next = (uint64_t)i + 1;
    }
    flush_codes(&w);
    return 0;
}

int dgc_compact_expand(const void *compact, const dgc_compact_layout *L, int rank, void *plain, char *err,
                       size_t errlen) {
    if (!layout_sound(L)) {
        snprintf(err, errlen, "payload from rank %d: compact layout (n %llu k %llu b %u value bits %u) is not sound",
                 rank, (unsigned long long)L->n, (unsigned long long)L->k, L->code_bits, L->value_bits);
        return -1;
    }
    const unsigned char *c = compact;
    unsigned char *p = plain;
    const uint64_t k = L->k, n = L->n, limit = n < INDEX_LIMIT ? n : INDEX_LIMIT;
    const unsigned b = L->code_bits, vb = L->value_bits;
    const uint64_t M = (UINT64_C(1) << b) - 1u;
    const uint64_t code_words = words_for(L->codes * b), value_words = words_for(k * vb);
    const unsigned char *codes = c + HEADER_BYTES + COUNT_BYTES, *values = codes + 8u * code_words;
    unsigned char *idx = p + HEADER_BYTES, *val = p + HEADER_BYTES + 4u * k;

    const uint64_t count = load64(c + HEADER_BYTES);
    if (count > k) {
        snprintf(err, errlen, "payload from rank %d: %llu pairs, more than its %llu slots", rank,
                 (unsigned long long)count, (unsigned long long)k);
        return -1;
    }
    /* The values first: cheap, and a bad tail is rejected before any decoding. */
    uint64_t bit = first_set_bit(values, value_words, count * vb);
    if (bit != UINT64_MAX) {
        if (bit / vb < k)
            snprintf(err, errlen, "payload from rank %d: value slot %llu after its %llu pairs is not 0", rank,
                     (unsigned long long)(bit / vb), (unsigned long long)count);
        else
            snprintf(err, errlen, "payload from rank %d: value area bit %llu, past its %llu slots, is not 0", rank,
                     (unsigned long long)bit, (unsigned long long)k);
        return -1;
    }

    memcpy(p, c, HEADER_BYTES);
    uint64_t next = 0, used = 0;
    for (uint64_t j = 0; j < count; j++) {
        uint64_t i = next, code;
        do {
            if (used >= L->codes) {
                snprintf(err, errlen, "payload from rank %d: pair %llu runs past its %llu code slots", rank,
                         (unsigned long long)j, (unsigned long long)L->codes);
                return -1;
            }
            code = get_code(codes, used++, b, M);
            i += code; /* i < limit <= 2^32 before, code < 2^32: no overflow */
            if (i >= limit) {
                snprintf(err, errlen, "payload from rank %d: pair %llu has index %llu or more, out of range for n %llu",
                         rank, (unsigned long long)j, (unsigned long long)i, (unsigned long long)n);
                return -1;
            }
        } while (code == M);
        uint32_t i32 = (uint32_t)i, v = load_value(values, j, vb);
        memcpy(idx + 4u * j, &i32, 4);
        memcpy(val + 4u * j, &v, 4);
        next = i + 1;
    }
    bit = first_set_bit(codes, code_words, used * b);
    if (bit != UINT64_MAX) {
        if (bit / b < L->codes)
            snprintf(err, errlen, "payload from rank %d: code slot %llu after its last index is not 0", rank,
                     (unsigned long long)(bit / b));
        else
            snprintf(err, errlen, "payload from rank %d: code area bit %llu, past its %llu slots, is not 0", rank,
                     (unsigned long long)bit, (unsigned long long)L->codes);
        return -1;
    }
    if (count == 1 && next == 1 && load_value(values, 0, vb) == 0) {
        snprintf(err, errlen, "payload from rank %d: its one pair (index 0, +0.0) is padding, counted as a pair",
                 rank);
        return -1;
    }
    memset(idx + 4u * count, 0, 4u * (k - count));
    memset(val + 4u * count, 0, 4u * (k - count));
    return 0;
}
