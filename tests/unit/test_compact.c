/* Unit tests for shim/wire_compact.c: the layout choice, bf16 rounding, the
 * encode -> expand round trip and the expander's rejections. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dgcshim/engine.h"
#include "dgcshim/wire.h"
#include "dgcshim/wire_compact.h"

#define GUARD 64
#define GUARD_BYTE 0xa5

static uint64_t rng_state = 88172645463325252ull;

static uint64_t rng_next(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static float rng_float(void) { return (float)((double)(rng_next() >> 11) / 4503599627370496.0 * 8.0 - 4.0); }

static uint32_t fbits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static float bitsf(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static uint64_t words(uint64_t bits) { return (bits + 63) / 64; }

/* A plain payload of k slots: count pairs, then padding. */
static char *plain_new(uint64_t n, uint64_t k, uint64_t count, const uint32_t *idx, const float *val) {
    char *p = calloc(1, dgc_wire_bytes(k));
    cr_assert_not_null(p);
    dgc_wire_header h = {DGC_WIRE_MAGIC, 0, 42, n, k};
    memcpy(p, &h, sizeof h);
    if (count) {
        memcpy(dgc_wire_indices(p), idx, count * 4);
        memcpy(dgc_wire_values(p, k), val, count * 4);
    }
    return p;
}

/* Encodes, expands into a guarded buffer and checks the bytes come back. */
static void round_trip(uint64_t n, uint64_t k, unsigned vb, uint64_t count, const uint32_t *idx,
                       const float *val) {
    dgc_compact_layout L;
    dgc_compact_layout_for(n, k, vb, &L);
    char *plain = plain_new(n, k, count, idx, val);
    unsigned char *compact = malloc(L.bytes), *mem = malloc(dgc_wire_bytes(k) + 2 * GUARD);
    cr_assert(compact && mem);
    cr_assert_eq(dgc_compact_encode(plain, &L, compact), 0, "n %llu k %llu count %llu vb %u: encode failed",
                 (unsigned long long)n, (unsigned long long)k, (unsigned long long)count, vb);
    uint64_t stored;
    memcpy(&stored, compact + 32, 8);
    uint64_t want_count = count == 1 && idx[0] == 0 && fbits(val[0]) == 0 ? 0 : count;
    cr_assert_eq(stored, want_count, "count field %llu, want %llu", (unsigned long long)stored,
                 (unsigned long long)want_count);
    memset(mem, GUARD_BYTE, dgc_wire_bytes(k) + 2 * GUARD);
    char err[256] = "";
    cr_assert_eq(dgc_compact_expand(compact, &L, 3, mem + GUARD, err, sizeof err), 0,
                 "n %llu k %llu count %llu vb %u b %u: %s", (unsigned long long)n, (unsigned long long)k,
                 (unsigned long long)count, vb, L.code_bits, err);
    cr_assert(memcmp(mem + GUARD, plain, dgc_wire_bytes(k)) == 0,
              "n %llu k %llu count %llu vb %u b %u: expanded plain payload differs", (unsigned long long)n,
              (unsigned long long)k, (unsigned long long)count, vb, L.code_bits);
    for (size_t i = 0; i < GUARD; i++) {
        cr_assert_eq(mem[i], GUARD_BYTE, "wrote before the plain payload");
        cr_assert_eq(mem[GUARD + dgc_wire_bytes(k) + i], GUARD_BYTE, "wrote past the plain payload");
    }
    free(plain);
    free(compact);
    free(mem);
}

/* count distinct sorted indices below n (selection sampling), values rounded. */
static void random_set(uint64_t n, uint64_t count, unsigned vb, uint32_t *idx, float *val) {
    uint64_t chosen = 0;
    for (uint64_t i = 0; i < n && chosen < count; i++)
        if (rng_next() % (n - i) < count - chosen) idx[chosen++] = (uint32_t)i;
    cr_assert_eq(chosen, count);
    for (uint64_t j = 0; j < count; j++) {
        uint64_t r = rng_next() % 16;
        float v = r == 0 ? 0.0f : r == 1 ? -0.0f : r == 2 ? 1e30f * (float)(rng_next() % 3) : rng_float();
        val[j] = dgc_compact_value(v, vb);
    }
}

Test(compact_layout, b_minimises_code_bits_and_bytes_follow_the_formula) {
    static const uint64_t ns[] = {0, 1, 2, 3, 7, 100, 1000, 65535, 669706, 1000000, 5000000, 123456789,
                                  UINT32_MAX, (uint64_t)UINT32_MAX + 1};
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++) {
        uint64_t n = ns[a];
        uint64_t ks[] = {0, 1, 2, n / 1000, n / 100, n / 3, n / 2, n};
        for (size_t c = 0; c < sizeof ks / sizeof ks[0]; c++) {
            uint64_t k = ks[c];
            unsigned best = 0;
            uint64_t best_bits = 0;
            for (unsigned b = 1; b <= 32; b++) {
                uint64_t bits = (k + n / ((UINT64_C(1) << b) - 1)) * b;
                if (best == 0 || bits < best_bits) best = b, best_bits = bits;
            }
            for (unsigned vb = 16; vb <= 32; vb += 16) {
                dgc_compact_layout L;
                dgc_compact_layout_for(n, k, vb, &L);
                cr_assert_eq(L.code_bits, best, "n %llu k %llu: b %u, want %u", (unsigned long long)n,
                             (unsigned long long)k, L.code_bits, best);
                cr_assert_eq(L.n, n);
                cr_assert_eq(L.k, k);
                cr_assert_eq(L.value_bits, vb);
                cr_assert_eq(L.codes, k + n / ((UINT64_C(1) << best) - 1));
                size_t want = 32 + 8 + 8 * words(L.codes * best) + 8 * words(k * vb);
                cr_assert_eq(L.bytes, want, "n %llu k %llu vb %u: %zu bytes, want %zu", (unsigned long long)n,
                             (unsigned long long)k, vb, L.bytes, want);
                cr_assert_eq(L.bytes % 8, 0);
            }
        }
    }
    dgc_compact_layout L;
    dgc_compact_layout_for(1000000, 1000, 16, &L);
    /* b = 13: (1000 + 122) * 13 = 14586 bits, less than b = 12 (1244 * 12)
     * and b = 14 (1061 * 14). */
    cr_assert_eq(L.code_bits, 13, "n 10^6 k 1000: b %u", L.code_bits);
    cr_assert_eq(L.codes, 1122);
    cr_assert_eq(L.bytes, 40 + 8 * 228 + 8 * 250);
}

Test(compact_value, bf16_rounds_to_nearest_even_and_keeps_specials) {
    static const struct {
        uint32_t in, out;
    } cases[] = {
        {0x3f800000u, 0x3f800000u}, /* 1.0 */
        {0x3f808000u, 0x3f800000u}, /* tie, to the even 0x3f80 */
        {0x3f818000u, 0x3f820000u}, /* tie, to the even 0x3f82 */
        {0x3f808001u, 0x3f810000u}, /* just past the tie */
        {0x3f807fffu, 0x3f800000u}, /* just short of it */
        {0xbf818000u, 0xbf820000u}, /* negative tie */
        {0x7f7f0000u, 0x7f7f0000u}, /* bf16 max finite */
        {0x7f7f7fffu, 0x7f7f0000u}, /* below the midpoint to Inf */
        {0x7f7f8000u, 0x7f800000u}, /* the midpoint: ties to even is Inf */
        {0x7f7fffffu, 0x7f800000u}, /* FLT_MAX overflows */
        {0xff7fffffu, 0xff800000u}, /* -FLT_MAX to -Inf */
        {0x7f800000u, 0x7f800000u}, /* Inf */
        {0xff800000u, 0xff800000u}, /* -Inf */
        {0x80000000u, 0x80000000u}, /* -0.0 */
        {0x00000000u, 0x00000000u}, /* +0.0 */
        {0x00000001u, 0x00000000u}, /* least subnormal to 0 */
        {0x80000001u, 0x80000000u}, /* to -0 */
        {0x00008000u, 0x00000000u}, /* subnormal tie to even 0 */
        {0x00018000u, 0x00020000u}, /* subnormal tie to even 2 */
        {0x00008001u, 0x00010000u}, /* past the tie */
        {0x007fffffu, 0x00800000u}, /* largest subnormal up to the least normal */
        {0x7fc00000u, 0x7fc00000u}, /* quiet NaN */
        {0x7f800001u, 0x7fc00000u}, /* signalling NaN, low payload: quiet, not Inf */
        {0xff800001u, 0xffc00000u}, /* negative one keeps its sign */
        {0x7fa5a5a5u, 0x7fe50000u}, /* payload's top bits kept, made quiet */
        {0x7fffffffu, 0x7fff0000u},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint32_t got = fbits(dgc_compact_value(bitsf(cases[i].in), 16));
        cr_assert_eq(got, cases[i].out, "bf16(0x%08x) = 0x%08x, want 0x%08x", cases[i].in, got, cases[i].out);
        cr_assert_eq(fbits(dgc_compact_value(bitsf(cases[i].in), 32)), cases[i].in, "fp32 must be the identity");
    }
    /* Against nearest-even done in double arithmetic, for random finite floats. */
    for (int t = 0; t < 100000; t++) {
        uint32_t u = (uint32_t)rng_next();
        if ((u & 0x7f800000u) == 0x7f800000u) continue;
        float x = bitsf(u), got = dgc_compact_value(x, 16);
        uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;
        double dl = fabs((double)x - (double)bitsf(lo)), dh = fabs((double)bitsf(hi) - (double)x);
        /* hi may be Inf: past the max, the midpoint rule still picks it. */
        if ((hi & 0x7f800000u) == 0x7f800000u) dh = fabs(ldexp(1.0, 128) * (u >> 31 ? -1 : 1) - (double)x);
        uint32_t want = dl < dh ? lo : dh < dl ? hi : ((lo >> 16) & 1) ? hi : lo;
        cr_assert_eq(fbits(got), want, "bf16(0x%08x) = 0x%08x, want 0x%08x", u, fbits(got), want);
    }
}

Test(compact_round_trip, random_sorted_sets) {
    for (int t = 0; t < 400; t++) {
        uint64_t scale = 1;
        for (uint64_t d = rng_next() % 7; d > 0; d--) scale *= 10;
        uint64_t n = 1 + rng_next() % (scale * 5);
        uint64_t kscale = 1;
        for (uint64_t d = rng_next() % 7; d > 0; d--) kscale *= 10;
        uint64_t k = 1 + rng_next() % (n < kscale * 5 ? n : kscale * 5);
        uint64_t count = rng_next() % (k + 1);
        if (t % 5 == 0) count = k;
        unsigned vb = t % 2 ? 16 : 32;
        uint32_t *idx = malloc((count + 1) * 4);
        float *val = malloc((count + 1) * 4);
        cr_assert(idx && val);
        random_set(n, count, vb, idx, val);
        round_trip(n, k, vb, count, idx, val);
        free(idx);
        free(val);
    }
}

/* count indices by a rule, values 1..count. */
static void shaped(uint64_t n, uint64_t k, uint64_t count, int shape, unsigned vb) {
    uint32_t *idx = malloc((count + 1) * 4);
    float *val = malloc((count + 1) * 4);
    cr_assert(idx && val);
    uint64_t step = count ? n / count : 1;
    for (uint64_t j = 0; j < count; j++) {
        switch (shape) {
        case 0: idx[j] = (uint32_t)(n - count + j); break;             /* all at the end: one huge gap */
        case 1: idx[j] = (uint32_t)j; break;                           /* 0..count-1 */
        default: idx[j] = (uint32_t)(n - 1 - (count - 1 - j) * step); /* evenly, the widest gaps */
        }
        val[j] = dgc_compact_value((float)(j + 1) * 0.37f, vb);
    }
    round_trip(n, k, vb, count, idx, val);
    free(idx);
    free(val);
}

Test(compact_round_trip, worst_cases) {
    static const uint64_t nk[][2] = {
        {1, 1},          {2, 1},          {2, 2},        {3, 1},       {1000, 1},     {1000, 1000},
        {1000000, 1000}, {669706, 670},   {5000000, 1},  {5000000, 5000}, {5000000, 5000000},
        {4096, 64},      {UINT32_MAX, 1}, {(uint64_t)UINT32_MAX + 1, 1}, {(uint64_t)UINT32_MAX + 1, 3},
        {(uint64_t)UINT32_MAX + 1, 1000}};
    for (size_t a = 0; a < sizeof nk / sizeof nk[0]; a++) {
        uint64_t n = nk[a][0], k = nk[a][1];
        for (unsigned vb = 16; vb <= 32; vb += 16) {
            uint32_t last = (uint32_t)(n - 1);
            float one = 1.5f;
            round_trip(n, k, vb, 1, &last, &one);   /* index n-1 alone */
            round_trip(n, k, vb, 0, NULL, NULL);    /* nothing */
            for (int shape = 0; shape < 3; shape++) {
                shaped(n, k, k, shape, vb);
                if (k > 2) shaped(n, k, k / 2, shape, vb);
            }
        }
    }
}

Test(compact_round_trip, gaps_at_the_escape_boundaries) {
    static const uint64_t nk[][2] = {{100, 100},   {100, 50},     {1000, 10},     {1000000, 1000},
                                     {1000000, 3}, {50000000, 4}, {(uint64_t)UINT32_MAX + 1, 6}};
    for (size_t a = 0; a < sizeof nk / sizeof nk[0]; a++) {
        uint64_t n = nk[a][0], k = nk[a][1];
        dgc_compact_layout L;
        dgc_compact_layout_for(n, k, 32, &L);
        uint64_t M = (UINT64_C(1) << L.code_bits) - 1;
        uint64_t gaps[] = {0, M - 1, M, M + 1, 2 * M - 1, 2 * M, 2 * M + 1, 3 * M};
        for (size_t g = 0; g < sizeof gaps / sizeof gaps[0]; g++) {
            uint32_t idx[64];
            float val[64];
            uint64_t count = 0, next = 0;
            while (count < k && count < 64 && next + gaps[(g + count) % 8] < n) {
                idx[count] = (uint32_t)(next + gaps[(g + count) % 8]);
                val[count] = -2.0f - (float)count;
                next = (uint64_t)idx[count++] + 1;
            }
            round_trip(n, k, 16, count, idx, val);
            round_trip(n, k, 32, count, idx, val);
        }
    }
}

Test(compact_round_trip, a_lone_zero_pair_is_padding) {
    uint32_t i = 0;
    float v = 0.0f;
    round_trip(10, 4, 16, 1, &i, &v); /* checks the count field is 0 */
    v = -0.0f;
    round_trip(10, 4, 16, 1, &i, &v); /* -0.0 is a real value */
}

/* A test-side writer of code slot c. */
static void set_code(unsigned char *compact, uint64_t c, unsigned b, uint64_t v) {
    for (unsigned i = 0; i < b; i++) {
        uint64_t bit = 40 * 8 + c * b + i;
        if ((v >> i) & 1)
            compact[bit / 8] |= (unsigned char)(1u << (bit % 8));
        else
            compact[bit / 8] &= (unsigned char)~(1u << (bit % 8));
    }
}

static void set_count(unsigned char *compact, uint64_t count) { memcpy(compact + 32, &count, 8); }

static void expect_reject(const unsigned char *compact, const dgc_compact_layout *L, const char *what) {
    char *plain = malloc(dgc_wire_bytes(L->k));
    char err[256] = "";
    cr_assert_not_null(plain);
    cr_assert_eq(dgc_compact_expand(compact, L, 7, plain, err, sizeof err), -1, "%s: accepted", what);
    cr_assert(strstr(err, "rank 7") != NULL, "%s: message does not name the rank: %s", what, err);
    cr_log_info("%s: %s", what, err);
    free(plain);
}

/* A sound compact payload for n 1000, k 10 with 5 pairs. */
static unsigned char *valid_compact(dgc_compact_layout *L, unsigned vb) {
    static const uint32_t idx[] = {3, 17, 600, 601, 999};
    static const float val[] = {1.0f, -2.0f, 0.5f, 3.0f, -0.25f};
    dgc_compact_layout_for(1000, 10, vb, L);
    char *plain = plain_new(1000, 10, 5, idx, val);
    unsigned char *c = malloc(L->bytes);
    cr_assert_not_null(c);
    cr_assert_eq(dgc_compact_encode(plain, L, c), 0);
    free(plain);
    char err[256] = "";
    char *out = malloc(dgc_wire_bytes(10));
    cr_assert_eq(dgc_compact_expand(c, L, 7, out, err, sizeof err), 0, "%s", err);
    free(out);
    return c;
}

Test(compact_expand, rejects_what_is_unsound_naming_the_rank) {
    for (unsigned vb = 16; vb <= 32; vb += 16) {
        dgc_compact_layout L;
        unsigned char *c = valid_compact(&L, vb);
        const unsigned b = L.code_bits;
        const uint64_t M = (UINT64_C(1) << b) - 1;
        cr_assert_eq(b, 9, "premise: n 1000 k 10 codes in 9 bits");

        set_count(c, 11);
        expect_reject(c, &L, "count > k");
        set_count(c, UINT64_MAX);
        expect_reject(c, &L, "count 2^64-1");
        free(c);

        c = valid_compact(&L, vb);
        set_count(c, 2);
        memset(c + 40, 0, 8 * words(L.codes * b)); /* the values of pairs 2..4 stay: bad tail */
        expect_reject(c, &L, "value slot after the count");
        memset(c + 40 + 8 * words(L.codes * b), 0, 8 * words(10 * vb));
        set_code(c, 0, b, 510);
        set_code(c, 1, b, 489); /* 510, then 510 + 1 + 489 = 1000 = n */
        expect_reject(c, &L, "index n (gap sum reaches n)");
        set_code(c, 1, b, 488); /* 999: sound */
        char err[256] = "";
        char *plain = malloc(dgc_wire_bytes(10));
        cr_assert_eq(dgc_compact_expand(c, &L, 7, plain, err, sizeof err), 0, "%s", err);
        set_count(c, 1);
        set_code(c, 0, b, M);
        set_code(c, 1, b, M); /* two escapes: 1022 */
        expect_reject(c, &L, "escapes past n");
        free(c);

        c = valid_compact(&L, vb);
        set_code(c, L.codes - 1, b, 1);
        expect_reject(c, &L, "non-zero last code slot");
        set_code(c, L.codes - 1, b, 0);
        cr_assert_eq(dgc_compact_expand(c, &L, 7, plain, err, sizeof err), 0, "%s", err);
        c[40 + 8 * words(L.codes * b) - 1] |= 0x80; /* a bit past the last code slot */
        expect_reject(c, &L, "non-zero bit after the code slots");
        free(c);

        c = valid_compact(&L, vb);
        unsigned char *values = c + 40 + 8 * words(L.codes * b);
        values[5 * vb / 8 + vb / 8 - 1] = 0x80; /* slot 5 = -0.0 */
        expect_reject(c, &L, "value slot 5 after 5 pairs is -0.0");
        values[5 * vb / 8 + vb / 8 - 1] = 0;
        c[L.bytes - 1] = 1; /* the last value slot, or a bit past it */
        expect_reject(c, &L, "non-zero last value word");
        free(c);

        /* One pair (0, +0.0): padding, which the canonical form counts out. */
        c = valid_compact(&L, vb);
        memset(c + 40, 0, L.bytes - 40);
        set_count(c, 1);
        expect_reject(c, &L, "a counted (0, +0.0) pair");
        set_count(c, 0);
        cr_assert_eq(dgc_compact_expand(c, &L, 7, plain, err, sizeof err), 0, "%s", err);

        /* A layout that is not dgc_compact_layout_for's. */
        dgc_compact_layout bad = L;
        bad.code_bits = 33;
        expect_reject(c, &bad, "b 33");
        bad = L;
        bad.codes = L.codes - 1;
        expect_reject(c, &bad, "codes short of k + n / M");
        bad = L;
        bad.bytes = L.bytes + 8;
        expect_reject(c, &bad, "bytes not the layout's");
        bad = L;
        bad.value_bits = 8;
        expect_reject(c, &bad, "value bits 8");
        free(c);
        free(plain);
    }
}

/* Running past L->codes needs more than floor(n / M) escapes, which carry the
 * index to n or past first: with a sound layout that check fires, and the
 * code-count one is a guard. Every code an escape, every slot counted. */
Test(compact_expand, codes_running_past_the_slots_are_rejected) {
    static const uint64_t nk[][2] = {{1, 1}, {7, 7}, {100, 3}, {1000, 10}, {1000000, 1000}, {4096, 64}};
    for (size_t a = 0; a < sizeof nk / sizeof nk[0]; a++) {
        dgc_compact_layout L;
        dgc_compact_layout_for(nk[a][0], nk[a][1], 32, &L);
        unsigned char *c = calloc(1, L.bytes);
        cr_assert_not_null(c);
        const uint64_t M = (UINT64_C(1) << L.code_bits) - 1;
        for (uint64_t s = 0; s < L.codes; s++) set_code(c, s, L.code_bits, M);
        set_count(c, L.k);
        expect_reject(c, &L, "all escapes");
        /* All codes 0 but one more pair than indices fit: k + 1 > k first. */
        memset(c + 40, 0, L.bytes - 40);
        set_count(c, L.k + 1);
        expect_reject(c, &L, "one pair more than slots");
        free(c);
    }
}

Test(compact_encode, rejects_what_breaks_the_plain_rules) {
    dgc_compact_layout L;
    dgc_compact_layout_for(1000, 6, 32, &L);
    unsigned char *c = malloc(L.bytes);
    cr_assert_not_null(c);
    static const struct {
        uint64_t count;
        uint32_t idx[6];
        float val[6];
        const char *what;
    } bad[] = {
        {2, {5, 3}, {1, 1}, "unsorted"},
        {2, {5, 5}, {1, 2}, "duplicate"},
        {1, {1000}, {1}, "index n"},
        {2, {2, 0xffffffffu}, {1, 1}, "index 2^32-1"},
        {3, {5, 0, 7}, {1, 0.0f, 1}, "a real pair after padding"},
        {6, {0, 1, 2, 3, 0, 9}, {1, 1, 1, 1, 0.0f, 1}, "padding then a pair at the end"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *plain = plain_new(1000, 6, bad[i].count, bad[i].idx, bad[i].val);
        cr_assert_eq(dgc_compact_encode(plain, &L, c), -1, "%s: accepted", bad[i].what);
        free(plain);
    }
    /* bf16: a value with low bits set is not what receivers would decode. */
    dgc_compact_layout L16;
    dgc_compact_layout_for(1000, 6, 16, &L16);
    unsigned char *c16 = malloc(L16.bytes);
    uint32_t idx = 4;
    float v = 1.1f;
    char *plain = plain_new(1000, 6, 1, &idx, &v);
    cr_assert_eq(dgc_compact_encode(plain, &L16, c16), -1, "16-bit: an unrounded value accepted");
    cr_assert_eq(dgc_compact_encode(plain, &L, c), 0, "32-bit: 1.1f refused");
    free(plain);
    v = dgc_compact_value(1.1f, 16);
    plain = plain_new(1000, 6, 1, &idx, &v);
    cr_assert_eq(dgc_compact_encode(plain, &L16, c16), 0, "16-bit: a rounded value refused");
    free(plain);
    free(c);
    free(c16);
}

Test(compact_ratio, sparsity_999_permille_of_669706_floats_is_a_thousandfold) {
    const uint64_t n = 669706, k = dgc_k_for(n, 0.001);
    dgc_compact_layout L;
    dgc_compact_layout_for(n, k, 16, &L);
    double ratio = 4.0 * (double)n / (double)L.bytes;
    printf("compact ratio: n %llu k %llu b %u codes %llu: %zu bytes (plain %zu), 4n / bytes = %.1f\n",
           (unsigned long long)n, (unsigned long long)k, L.code_bits, (unsigned long long)L.codes, L.bytes,
           dgc_wire_bytes(k), ratio);
    fflush(stdout);
    cr_assert(ratio >= 1000.0, "4n / bytes = %.1f, below 1000", ratio);
}
