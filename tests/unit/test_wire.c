/* Unit tests for shim/wire/wire.c: payload layout and the decoder, the only code
 * that writes what other ranks sent into user memory. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dgcshim/wire.h"

static uint64_t rng_state = 88172645463325252ull;

static uint64_t rng_next(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static float rng_float(void) { return (float)((double)(rng_next() >> 11) / 4503599627370496.0 * 2.0 - 1.0); }

/* nranks payloads of k slots, back to back as an all-gather leaves them. */
typedef struct {
    char *buf;
    int nranks;
    uint64_t k;
} gathered;

static gathered gathered_new(int nranks, uint64_t k) {
    gathered g = {calloc((size_t)nranks, dgc_wire_bytes(k)), nranks, k};
    cr_assert_not_null(g.buf);
    return g;
}

static void *payload(gathered *g, int rank) { return g->buf + (size_t)rank * dgc_wire_bytes(g->k); }

static void set_header(gathered *g, int rank, uint32_t flags, uint64_t step, uint64_t n) {
    dgc_wire_header h = {DGC_WIRE_MAGIC, flags, step, n, g->k};
    memcpy(payload(g, rank), &h, sizeof h);
}

static void set_slot(gathered *g, int rank, uint64_t j, uint32_t index, float value) {
    dgc_wire_indices(payload(g, rank))[j] = index;
    dgc_wire_values(payload(g, rank), g->k)[j] = value;
}

/* Valid payloads with random pairs on every rank, index repeats likely. */
static gathered random_gathered(int nranks, uint64_t k, uint64_t step, uint64_t n) {
    gathered g = gathered_new(nranks, k);
    for (int r = 0; r < nranks; r++) {
        set_header(&g, r, 0, step, n);
        for (uint64_t j = 0; j < k; j++) set_slot(&g, r, j, (uint32_t)(rng_next() % n), rng_float());
    }
    return g;
}

/* The decode the design specifies: zeros, then rank 0..N-1, slot by slot. */
static void reference_decode(gathered *g, uint64_t n, float *out) {
    for (uint64_t i = 0; i < n; i++) out[i] = 0.0f;
    for (int r = 0; r < g->nranks; r++) {
        uint32_t *idx = dgc_wire_indices(payload(g, r));
        float *val = dgc_wire_values(payload(g, r), g->k);
        for (uint64_t j = 0; j < g->k; j++) out[idx[j]] += val[j];
    }
}

Test(wire_bytes, header_plus_eight_bytes_per_slot_and_word_aligned) {
    cr_assert_eq(sizeof(dgc_wire_header) % 8, 0, "the header must keep the payload in 8-byte words");
    static const uint64_t ks[] = {0, 1, 2, 3, 7, 1000, 123457};
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) {
        uint64_t k = ks[i];
        size_t want = sizeof(dgc_wire_header) + 4 * (size_t)k + 4 * (size_t)k;
        cr_assert_eq(dgc_wire_bytes(k), want, "k=%llu: %zu bytes, want %zu", (unsigned long long)k,
                     dgc_wire_bytes(k), want);
        cr_assert_eq(dgc_wire_bytes(k) % 8, 0, "k=%llu: not a multiple of 8", (unsigned long long)k);
    }
}

Test(wire_views, indices_then_values_after_the_header) {
    uint64_t k = 5;
    char *p = calloc(1, dgc_wire_bytes(k));
    cr_assert_not_null(p);
    cr_assert_eq((void *)dgc_wire_header_of(p), (void *)p);
    cr_assert_eq((char *)dgc_wire_indices(p), p + sizeof(dgc_wire_header));
    cr_assert_eq((char *)dgc_wire_values(p, k), p + sizeof(dgc_wire_header) + 4 * k);
    /* The last value ends exactly at the end of the payload. */
    cr_assert_eq((char *)(dgc_wire_values(p, k) + k), p + dgc_wire_bytes(k));
    free(p);
}

Test(wire_decode, sums_ranks_in_rank_order) {
    /* Float addition is not associative: 1 + 1e8 rounds to 1e8, so adding
     * rank 0, 1, 2 in order gives 0 at index 3 while any order that adds
     * 1e8 - 1e8 first gives 1. The decoder must produce the in-order bytes. */
    const uint64_t n = 8, k = 2, step = 5;
    gathered g = gathered_new(3, k);
    for (int r = 0; r < 3; r++) set_header(&g, r, 0, step, n);
    set_slot(&g, 0, 0, 3, 1.0f);
    set_slot(&g, 1, 0, 3, 1e8f);
    set_slot(&g, 2, 0, 3, -1e8f);
    set_slot(&g, 0, 1, 6, 0.5f);
    set_slot(&g, 1, 1, 0, -2.0f);
    set_slot(&g, 2, 1, 6, 0.25f);

    float want[8], out[8];
    reference_decode(&g, n, want);
    cr_assert(want[3] == 0.0f, "test premise: in-order float sum is 0, got %g", want[3]);
    memset(out, 0x7f, sizeof out); /* decode must overwrite, not accumulate */
    char err[256] = "";
    cr_assert_eq(dgc_wire_decode(g.buf, 3, step, n, k, out, err, sizeof err), DGC_DECODE_OK, "%s", err);
    cr_assert(memcmp(out, want, sizeof out) == 0, "decoded bytes differ from the rank-order sum");
    cr_assert(out[6] == 0.75f && out[0] == -2.0f && out[1] == 0.0f);
    free(g.buf);
}

Test(wire_decode, repeated_index_across_ranks_adds_up) {
    const uint64_t n = 4, k = 1;
    gathered g = gathered_new(5, k);
    for (int r = 0; r < 5; r++) {
        set_header(&g, r, 0, 0, n);
        set_slot(&g, r, 0, 2, (float)(r + 1)); /* 1+2+3+4+5, exact in float */
    }
    float out[4];
    char err[256] = "";
    cr_assert_eq(dgc_wire_decode(g.buf, 5, 0, n, k, out, err, sizeof err), DGC_DECODE_OK, "%s", err);
    cr_assert(out[2] == 15.0f, "index 2 sent by all five ranks: want 15, got %g", out[2]);
    cr_assert(out[0] == 0.0f && out[1] == 0.0f && out[3] == 0.0f);
    free(g.buf);
}

Test(wire_decode, random_payloads_match_reference_bitwise) {
    static const int ranks[] = {1, 2, 3, 8, 17};
    for (size_t t = 0; t < sizeof ranks / sizeof ranks[0]; t++) {
        const uint64_t n = 1000, k = 64, step = 42 + t;
        gathered g = random_gathered(ranks[t], k, step, n);
        float *out = malloc(n * sizeof *out), *want = malloc(n * sizeof *want);
        cr_assert(out && want);
        reference_decode(&g, n, want);
        char err[256] = "";
        cr_assert_eq(dgc_wire_decode(g.buf, ranks[t], step, n, k, out, err, sizeof err), DGC_DECODE_OK, "%s",
                     err);
        cr_assert(memcmp(out, want, n * sizeof *out) == 0, "nranks=%d: decode differs from reference", ranks[t]);
        free(out);
        free(want);
        free(g.buf);
    }
}

Test(wire_decode, zero_slots_give_zeros) {
    const uint64_t n = 16;
    gathered g = gathered_new(2, 0);
    set_header(&g, 0, 0, 1, n);
    set_header(&g, 1, 0, 1, n);
    float out[16];
    memset(out, 0xff, sizeof out);
    char err[256] = "";
    cr_assert_eq(dgc_wire_decode(g.buf, 2, 1, n, 0, out, err, sizeof err), DGC_DECODE_OK, "%s", err);
    for (uint64_t i = 0; i < n; i++)
        cr_assert(out[i] == 0.0f && !signbit(out[i]), "out[%llu]=%g", (unsigned long long)i, out[i]);
    free(g.buf);
}

Test(wire_decode, nonfinite_flag_makes_every_element_nan) {
    const uint64_t n = 50, k = 4, step = 9;
    for (int bad = 0; bad < 3; bad++) { /* whichever rank flags it */
        gathered g = random_gathered(3, k, step, n);
        set_header(&g, bad, DGC_WIRE_NONFINITE, step, n);
        float out[50];
        memset(out, 0, sizeof out);
        char err[256] = "";
        cr_assert_eq(dgc_wire_decode(g.buf, 3, step, n, k, out, err, sizeof err), DGC_DECODE_NONFINITE,
                     "rank %d flagged non-finite", bad);
        for (uint64_t i = 0; i < n; i++)
            cr_assert(isnan(out[i]), "rank %d flagged: out[%llu]=%g is not NaN", bad, (unsigned long long)i,
                      out[i]);
        free(g.buf);
    }
}

/* The age of the kept sum (flags bits 8 to 31): the summary gives it only
 * when every rank reports the same one below DGC_WIRE_AGE_MAX, whatever the
 * other flags; an age is never a fault, and the decoder sums as before. */
Test(wire_scan, ages_count_only_when_every_rank_reports_the_same) {
    const uint64_t n = 50, k = 4, step = 9;
    const struct {
        uint32_t age[3];
        uint32_t want;
    } cases[] = {
        {{1, 1, 1}, 1},
        {{7, 7, 7}, 7},
        {{0, 0, 0}, 0},
        {{1, 1, 0}, 0},               /* a rank with a new state keeps none */
        {{0, 1, 1}, 0},
        {{2, 1, 1}, 0},               /* a rank whose state is older */
        {{DGC_WIRE_AGE_MAX - 1, DGC_WIRE_AGE_MAX - 1, DGC_WIRE_AGE_MAX - 1}, DGC_WIRE_AGE_MAX - 1},
        {{DGC_WIRE_AGE_MAX, DGC_WIRE_AGE_MAX, DGC_WIRE_AGE_MAX}, 0}, /* saturated: equal need not be the same step */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (uint32_t flag = 0; flag <= DGC_WIRE_NONFINITE; flag++) {
            gathered g = random_gathered(3, k, step, n);
            for (int r = 0; r < 3; r++) set_header(&g, r, flag | DGC_WIRE_AGE_BITS(cases[c].age[r]), step, n);
            dgc_wire_summary sum;
            char err[256] = "";
            cr_assert_eq(dgc_wire_scan(g.buf, dgc_wire_bytes(k), 3, step, n, k, &sum, err, sizeof err), DGC_DECODE_OK,
                         "case %zu: %s", c, err);
            cr_assert_eq(sum.age, cases[c].want, "case %zu flags %u: age %u, want %u", c, flag, sum.age,
                         cases[c].want);
            cr_assert_eq(sum.nonfinite, flag ? 3 : 0, "case %zu: the age hid the non-finite flag", c);
            float out[50];
            cr_assert_eq(dgc_wire_decode(g.buf, 3, step, n, k, out, err, sizeof err),
                         flag ? DGC_DECODE_NONFINITE : DGC_DECODE_OK, "case %zu: %s", c, err);
            free(g.buf);
        }
    cr_assert_eq(DGC_WIRE_AGE_BITS(UINT64_C(1) << 40), DGC_WIRE_AGE_MAX << DGC_WIRE_AGE_SHIFT, "ages saturate");
    cr_assert_eq(DGC_WIRE_AGE(DGC_WIRE_AGE_BITS(5) | DGC_WIRE_NONFINITE), 5u);
}

/* One way to break rank `rank`'s payload. */
typedef enum {
    BREAK_MAGIC,
    BREAK_STEP,
    BREAK_N,
    BREAK_K,
    BREAK_FLAG_BIT1,
    BREAK_FLAG_HIGH,
    BREAK_INDEX_EQ_N,
    BREAK_INDEX_HUGE,
    BREAK_INDEX_LAST_SLOT,
    BREAK_COUNT
} breakage;

static const char *const breakage_names[BREAK_COUNT] = {"magic",     "step",        "n",
                                                        "k",         "flag bit 1",  "flag bit 7",
                                                        "index == n", "index 2^32-1", "index == n in the last slot"};

static void break_payload(gathered *g, int rank, breakage b, uint64_t n) {
    dgc_wire_header *h = dgc_wire_header_of(payload(g, rank));
    switch (b) {
    case BREAK_MAGIC: h->magic = 0x44474332u; break; /* "DGC2" */
    case BREAK_STEP: h->step += 1; break;
    case BREAK_N: h->n = n + 1; break;
    case BREAK_K: h->k = g->k - 1; break;
    case BREAK_FLAG_BIT1: h->flags |= 2u; break;
    case BREAK_FLAG_HIGH: h->flags |= 0x80u; break; /* the highest flag bit; bits 8 up are the age */
    case BREAK_INDEX_EQ_N: dgc_wire_indices(h)[0] = (uint32_t)n; break;
    case BREAK_INDEX_HUGE: dgc_wire_indices(h)[1] = 0xffffffffu; break;
    case BREAK_INDEX_LAST_SLOT: dgc_wire_indices(h)[g->k - 1] = (uint32_t)n; break;
    default: break;
    }
}

Test(wire_decode, every_bad_payload_is_rejected_with_output_untouched) {
    const uint64_t n = 100, k = 6, step = 11;
    const int nranks = 4;
    for (int b = 0; b < BREAK_COUNT; b++) {
        for (int rank = 0; rank < nranks; rank++) {
            gathered g = random_gathered(nranks, k, step, n);
            /* A non-finite flag on another rank must not let a bad payload
             * through: every check runs before anything is written. */
            set_header(&g, (rank + 1) % nranks, DGC_WIRE_NONFINITE, step, n);
            break_payload(&g, rank, (breakage)b, n);

            unsigned char out[100 * sizeof(float)], sentinel[sizeof out];
            for (size_t i = 0; i < sizeof out; i++) sentinel[i] = (unsigned char)(0xa5 ^ i);
            memcpy(out, sentinel, sizeof out);
            char err[256] = "";
            dgc_decode_result r = dgc_wire_decode(g.buf, nranks, step, n, k, (float *)out, err, sizeof err);
            cr_assert_eq(r, DGC_DECODE_BAD, "%s broken on rank %d: result %d, want DGC_DECODE_BAD",
                         breakage_names[b], rank, (int)r);
            cr_assert(memcmp(out, sentinel, sizeof out) == 0, "%s broken on rank %d: output was written",
                      breakage_names[b], rank);
            char want[32];
            snprintf(want, sizeof want, "rank %d", rank);
            cr_assert(strstr(err, want) != NULL, "%s broken on rank %d: error \"%s\" does not name it",
                      breakage_names[b], rank, err);
            free(g.buf);
        }
    }
}

Test(wire_decode, largest_valid_index_is_accepted) {
    const uint64_t n = 10, k = 1;
    gathered g = gathered_new(1, k);
    set_header(&g, 0, 0, 0, n);
    set_slot(&g, 0, 0, (uint32_t)(n - 1), 3.0f);
    float out[10];
    char err[256] = "";
    cr_assert_eq(dgc_wire_decode(g.buf, 1, 0, n, k, out, err, sizeof err), DGC_DECODE_OK, "%s", err);
    cr_assert(out[n - 1] == 3.0f);
    free(g.buf);
}

Test(wire_decode, short_error_buffer_is_not_overrun) {
    const uint64_t n = 10, k = 2;
    gathered g = random_gathered(2, k, 0, n);
    break_payload(&g, 1, BREAK_MAGIC, n);
    float out[10];
    char err[8];
    memset(err, 'x', sizeof err);
    cr_assert_eq(dgc_wire_decode(g.buf, 2, 0, n, k, out, err, 5), DGC_DECODE_BAD);
    cr_assert(memchr(err, '\0', 5) != NULL, "error text not terminated within errlen");
    cr_assert(err[5] == 'x' && err[7] == 'x', "wrote past errlen");
    free(g.buf);
}

/* Momentum compensation subtracts scale * value pair by pair, rank 0..N-1,
 * slot by slot: the same bytes on every rank. */
Test(wire_subtract, subtracts_scaled_pairs_in_rank_order) {
    const uint64_t n = 300, k = 40;
    const float scale = 0.9f;
    for (int nranks = 1; nranks <= 5; nranks++) {
        gathered g = random_gathered(nranks, k, 3, n);
        float got[300], want[300];
        for (uint64_t i = 0; i < n; i++) got[i] = want[i] = rng_float();
        dgc_wire_subtract(g.buf, nranks, k, scale, got);
        for (int r = 0; r < nranks; r++) {
            uint32_t *idx = dgc_wire_indices(payload(&g, r));
            float *val = dgc_wire_values(payload(&g, r), k);
            for (uint64_t j = 0; j < k; j++) want[idx[j]] += -scale * val[j];
        }
        cr_assert(memcmp(got, want, sizeof got) == 0, "%d ranks: subtraction differs from rank-order reference",
                  nranks);
        free(g.buf);
    }
}
