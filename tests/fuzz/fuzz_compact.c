/* libFuzzer target for the compact payload's readers (shim/wire/compact.c,
 * shim/wire/sum.c): the expander turns what another rank sent into a plain
 * payload, so whatever arrives it must either reject with a message or give
 * the one plain payload that the bytes stand for; and what it accepts must
 * be canonical: encoding the result gives back the same bytes. The checker
 * and the in-place sum must reach the same verdict with the same message,
 * and the CUDA codec's pieces (tests/common/compact_pieces.h) the same
 * verdict and pairs.
 *
 * Input: 7 choice bytes, then the compact payload, zero-padded or truncated
 * to the layout's bytes:
 *   [0] bit 0: value bits (0: 32, 1: 16); bits 1-2: errlen (2, 7, 64 or 256);
 *       bit 3: take the count (bits 0..39 of the count word) mod k + 2, so
 *       that decoding is reached without the fuzzer solving the count first;
 *       bits 4-5: how many of bytes [1..4] make n - 1 (1 to 4);
 *       bit 6: clear the count word's reserved bits 40..47;
 *       bit 7: k up to 1024 rather than 256, past the expander's chunks of
 *       256 pairs and blocks of 256 values (a payload longer than the input
 *       is zero-padded, as any other)
 *   [1..4] n - 1, little endian (n from 1 to 2^32)
 *   [5..6] k - 1 (little endian, mod min(n, 256), or min(n, 1024) with bit 7)
 * The verdict and the decoded pairs are checked against a bit-at-a-time
 * reference expander written here from the format's description (its values
 * through double arithmetic, not the shim's integer conversions). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dgcshim/wire.h"
#include "dgcshim/wire_compact.h"
#include "../common/compact_pieces.h"
#include "fuzz_check.h"

#define CHOICE_BYTES 7
#define ERRCAP 300
#define ERR_FILL 0xa5
#define SMALL_K 256
#define MAX_K 1024

static const size_t errlens[] = {2, 7, 64, 256};

static unsigned ref_bit(const unsigned char *area, uint64_t i) { return (area[i / 8] >> (i % 8)) & 1u; }

static uint64_t ref_field(const unsigned char *area, uint64_t first_bit, unsigned bits) {
    uint64_t v = 0;
    for (unsigned i = 0; i < bits; i++) v |= (uint64_t)ref_bit(area, first_bit + i) << i;
    return v;
}

static uint64_t words(uint64_t bits) { return (bits + 63) / 64; }

/* Any set bit in [from, to) of an area. */
static int ref_any(const unsigned char *area, uint64_t from, uint64_t to) {
    for (uint64_t i = from; i < to; i++)
        if (ref_bit(area, i)) return 1;
    return 0;
}

static uint32_t float_to_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

/* A value slot as fp32 bits: 0, or -1 when it stands for no finite fp32.
 * *mag gets |value| (for the scale's check). */
static int ref_value(uint32_t slot, unsigned vb, int e, uint32_t *out, double *mag) {
    if (vb == 32) {
        if (((slot >> 23) & 0xffu) == 0xffu) return -1;
        *out = slot;
        *mag = 0;
        return 0;
    }
    unsigned field = (slot >> 10) & 31u, frac = slot & 1023u;
    if (field == 31) return -1;
    double y = field ? ldexp(1024 + frac, (int)field - 25) : ldexp(frac, -24);
    double x = ldexp(y, e - 14);
    float f = (float)x;
    if ((double)f != x) return -1; /* fp32 cannot hold it */
    if (slot & 0x8000u) f = -f;
    *out = float_to_bits(f);
    *mag = x;
    return 0;
}

/* The reference: 0 and the pairs when the payload is sound, else -1. */
static int ref_expand(const unsigned char *c, const dgc_compact_layout *L, uint64_t *count_out, int *scale,
                      uint32_t *idx, uint32_t *val) {
    const uint64_t n = L->n, k = L->k, vb = L->value_bits;
    /* The layout, by brute force. */
    unsigned lb = 0;
    uint64_t best = UINT64_MAX;
    for (unsigned l = 0; l <= 32; l++) {
        uint64_t cost = k * l + k + (n - 1) / ((uint64_t)1 << l);
        if (cost < best) best = cost, lb = l;
    }
    const uint64_t U = k + (n - 1) / ((uint64_t)1 << lb);
    const unsigned char *upper = c + 40, *low = upper + 8 * words(U), *values = low + 8 * words(k * lb);
    if (L->low_bits != lb || L->upper_bits != U || L->bytes != (size_t)(values - c) + 8 * words(k * vb)) return -1;
    const uint64_t limit = n < (UINT64_C(1) << 32) ? n : (UINT64_C(1) << 32);

    const uint64_t word = ref_field(c + 32, 0, 64), count = word & ((UINT64_C(1) << 40) - 1);
    const int e = (int16_t)(uint16_t)(word >> 48);
    if ((word >> 40) & 0xff) return -1;
    if (count > k) return -1;
    if (vb == 32 && e != 0) return -1;
    if (e < -149 || e > 127) return -1;
    if (ref_any(values, count * vb, 64 * words(k * vb))) return -1;
    if (ref_any(low, count * lb, 64 * words(k * lb))) return -1;

    uint64_t j = 0, prev = 0;
    for (uint64_t p = 0; p < 64 * words(U); p++) {
        if (!ref_bit(upper, p)) continue;
        if (p >= U || j >= count) return -1;
        uint64_t high = p - j;
        if (high >= (UINT64_C(1) << 32)) return -1;
        uint64_t i = (high << lb) + ref_field(low, j * lb, lb);
        if (i >= limit || (j > 0 && i <= prev)) return -1;
        idx[j++] = (uint32_t)i;
        prev = i;
    }
    if (j < count) return -1;

    double max = 0;
    for (j = 0; j < count; j++) {
        double mag;
        if (ref_value((uint32_t)ref_field(values, j * vb, (unsigned)vb), (unsigned)vb, e, &val[j], &mag)) return -1;
        if (mag > max) max = mag;
    }
    if (vb == 16 && max == 0 && e != 0) return -1;
    if (vb == 16 && max != 0 && !(max >= ldexp(1, e) && max < ldexp(1, e + 1))) return -1;
    if (count == 1 && idx[0] == 0 && val[0] == 0) return -1;
    *count_out = count;
    *scale = e;
    return 0;
}

/* Accepted 16-bit values are what the engine would have sent: on their
 * scale's grid, and that scale the one dgc_compact_scale16 picks. */
static void check_values_canonical(const float *val, uint64_t count, int e) {
    int any = 0;
    for (uint64_t j = 0; j < count; j++) {
        CHECK(float_to_bits(dgc_compact_value(val[j], 16, e)) == float_to_bits(val[j]));
        any |= val[j] != 0;
    }
    CHECK(dgc_compact_scale16(val, count) == (any ? e : 0));
}

/* dgc_compact_check and dgc_compact_add (the payload as rank 5, after five
 * empty ones) reach the expander's verdict with its message; the sum adds
 * the expanded pairs and writes nothing outside its n floats (up to 2^20 of
 * them: the sum is left out for larger n). */
/* The CUDA codec's pieces, run as its threads run them, reach the same
 * verdict and the same pairs. */
static void pieces_agree(const unsigned char *compact, const dgc_compact_layout *L, int rc, const char *plain) {
    uint64_t *words = malloc(L->bytes);
    uint32_t *idx = malloc(4 * L->k), *val = malloc(4 * L->k);
    CHECK(words && idx && val);
    memcpy(words, compact, L->bytes);
    memset(idx, 0xa5, 4 * L->k);
    const int f = pieces_expand(words, L, idx, val);
    CHECK((f == DGC_CX_OK) == (rc == 0));
    if (rc == 0) {
        CHECK(memcmp(idx, dgc_wire_indices((void *)plain), 4 * L->k) == 0);
        CHECK(memcmp(val, dgc_wire_values((void *)plain, L->k), 4 * L->k) == 0);
    }
    free(words);
    free(idx);
    free(val);
}

static void other_readers_agree(const unsigned char *compact, const dgc_compact_layout *L, int rc, const char *err,
                                size_t errlen, const char *plain) {
    char err2[ERRCAP];
    pieces_agree(compact, L, rc, plain);
    memset(err2, ERR_FILL, sizeof err2);
    CHECK(dgc_compact_check(compact, L, 5, err2, errlen) == rc);
    if (rc) CHECK(strcmp(err2, err) == 0);
    if (L->n > (UINT64_C(1) << 20)) return;
    unsigned char *gathered = calloc(6, L->bytes);
    float *mem = malloc((L->n + 2) * sizeof *mem), *want = calloc(L->n + 1, sizeof *want);
    CHECK(gathered && mem && want);
    memcpy(gathered + 5 * L->bytes, compact, L->bytes);
    for (uint64_t i = 0; i < L->n + 2; i++) mem[i] = i == 0 || i == L->n + 1 ? NAN : 0.0f;
    memset(err2, ERR_FILL, sizeof err2);
    CHECK(dgc_compact_add(gathered, L->bytes, 6, L, 1.0f, mem + 1, err2, errlen) == rc);
    CHECK(isnan(mem[0]) && isnan(mem[L->n + 1]));
    if (rc) {
        CHECK(strcmp(err2, err) == 0);
    } else {
        dgc_wire_add_own(plain, L->k, want);
        CHECK(memcmp(mem + 1, want, L->n * sizeof *want) == 0);
    }
    free(gathered);
    free(mem);
    free(want);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < CHOICE_BYTES) return 0;
    const unsigned vb = data[0] & 1 ? 16 : 32, nbytes = 1 + ((data[0] >> 4) & 3);
    const size_t errlen = errlens[(data[0] >> 1) & 3];
    uint64_t n = 0;
    for (unsigned i = 0; i < nbytes; i++) n |= (uint64_t)data[1 + i] << (8 * i);
    n += 1;
    const uint64_t kmax = data[0] & 128 ? MAX_K : SMALL_K;
    const uint64_t k = 1 + (uint64_t)(data[5] | data[6] << 8) % (n < kmax ? n : kmax);

    dgc_compact_layout L;
    dgc_compact_layout_for(n, k, vb, &L);
    CHECK(L.bytes % 8 == 0 && L.low_bits <= 32 && L.value_bits == vb);
    CHECK(L.upper_bits == k + ((n - 1) >> L.low_bits));

    /* Exactly the layout's size, so ASan sees any read past it. */
    const size_t avail = size - CHOICE_BYTES < L.bytes ? size - CHOICE_BYTES : L.bytes;
    unsigned char *compact = calloc(1, L.bytes), *again = malloc(L.bytes);
    char *plain = malloc(dgc_wire_bytes(k));
    CHECK(compact && again && plain);
    memcpy(compact, data + CHOICE_BYTES, avail);
    uint64_t word;
    memcpy(&word, compact + 32, 8);
    if (data[0] & 8) {
        const uint64_t mask = (UINT64_C(1) << 40) - 1;
        word = (word & ~mask) | (word & mask) % (k + 2);
    }
    if (data[0] & 64) word &= ~(UINT64_C(0xff) << 40);
    memcpy(compact + 32, &word, 8);

    uint32_t ref_idx[MAX_K], ref_val[MAX_K];
    uint64_t ref_count = 0;
    int ref_scale = 0;
    const int want = ref_expand(compact, &L, &ref_count, &ref_scale, ref_idx, ref_val);

    char err[ERRCAP];
    memset(err, ERR_FILL, sizeof err);
    const int rc = dgc_compact_expand(compact, &L, 5, plain, err, errlen);
    CHECK(rc == want);
    other_readers_agree(compact, &L, rc, err, errlen, plain);
    if (rc != 0) {
        CHECK(err[0] != '\0');
        CHECK(memchr(err, '\0', errlen) != NULL);
        for (size_t i = errlen; i < ERRCAP; i++) CHECK((unsigned char)err[i] == ERR_FILL);
    } else {
        CHECK(memcmp(plain, compact, sizeof(dgc_wire_header)) == 0);
        const uint32_t *idx = dgc_wire_indices(plain);
        const float *val = dgc_wire_values(plain, k);
        for (uint64_t j = 0; j < k; j++) {
            uint32_t v;
            memcpy(&v, &val[j], 4);
            if (j < ref_count) {
                CHECK(idx[j] < n);
                CHECK(j == 0 || idx[j] > idx[j - 1]);
                CHECK(idx[j] == ref_idx[j] && v == ref_val[j]);
            } else {
                CHECK(idx[j] == 0 && v == 0); /* padding, +0.0 */
            }
        }
        if (vb == 16) check_values_canonical(val, ref_count, ref_scale);
        /* Canonical: the plain payload encodes back to the same bytes. */
        memset(again, 0x5a, L.bytes);
        CHECK(dgc_compact_encode(plain, &L, again) == 0);
        CHECK(memcmp(again, compact, L.bytes) == 0);
    }
    free(compact);
    free(again);
    free(plain);
    return 0;
}
