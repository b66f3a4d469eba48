/* Unit tests for shim/engine/topk.c: the quickselects behind the host engine's
 * selection. Every expectation comes from sorting a copy of the input. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/topk.h"

static const size_t sizes[] = {1, 2, 3, 10, 1000, 100000};
#define NSIZES (sizeof sizes / sizeof sizes[0])

static uint64_t rng_state;

static void rng_seed(uint64_t s) { rng_state = s * 0x9e3779b97f4a7c15ull + 1; }

static uint64_t rng_next(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* Uniform in [-1, 1). */
static float rng_float(void) { return (float)((double)(rng_next() >> 11) / 4503599627370496.0 - 1.0); }

typedef enum {
    FILL_RANDOM,    /* distinct-ish values of both signs */
    FILL_DUPLICATE, /* few distinct values, many repeats, both signs */
    FILL_EQUAL,     /* every element the same */
    FILL_NEGATIVE,  /* all negative */
    FILL_ASCENDING, /* sorted inputs are the classic quickselect trap */
    FILL_DESCENDING,
    FILL_COUNT
} fill_kind;

static void fill(float *a, size_t n, fill_kind kind) {
    for (size_t i = 0; i < n; i++) {
        switch (kind) {
        case FILL_RANDOM: a[i] = rng_float(); break;
        case FILL_DUPLICATE: a[i] = (float)((int)(rng_next() % 7) - 3); break;
        case FILL_EQUAL: a[i] = 2.5f; break;
        case FILL_NEGATIVE: a[i] = -fabsf(rng_float()) - 1.0f; break;
        case FILL_ASCENDING: a[i] = (float)i; break;
        case FILL_DESCENDING: a[i] = (float)(n - i); break;
        default: a[i] = 0; break;
        }
    }
}

static int cmp_desc(const void *x, const void *y) {
    float a = *(const float *)x, b = *(const float *)y;
    return (a < b) - (a > b);
}

static float *sorted_desc(const float *a, size_t n) {
    float *s = malloc(n * sizeof *s);
    cr_assert_not_null(s);
    memcpy(s, a, n * sizeof *s);
    qsort(s, n, sizeof *s, cmp_desc);
    return s;
}

/* The kth positions a test tries on an n-element array. */
static size_t kth_choices(size_t n, size_t *out) {
    size_t c = 0;
    out[c++] = 0;
    if (n > 1) out[c++] = n - 1;
    if (n > 2) out[c++] = n / 2;
    if (n > 3) out[c++] = 1;
    if (n > 10) out[c++] = n / 1000 + 1; /* the DGC regime: k far below n */
    if (n > 4) out[c++] = (size_t)(rng_next() % n);
    return c;
}

static void check_kth(const float *orig, size_t n, size_t kth, const char *what) {
    float *ref = sorted_desc(orig, n);
    float *a = malloc(n * sizeof *a);
    cr_assert_not_null(a);
    memcpy(a, orig, n * sizeof *a);

    float got = dgc_topk_kth_largest(a, n, kth);
    cr_assert(got == ref[kth], "%s n=%zu kth=%zu: got %g, sorting says %g", what, n, kth, got, ref[kth]);
    cr_assert(a[kth] == ref[kth], "%s n=%zu kth=%zu: a[kth]=%g, want %g", what, n, kth, a[kth], ref[kth]);
    for (size_t i = 0; i < kth; i++)
        cr_assert(a[i] >= got, "%s n=%zu kth=%zu: a[%zu]=%g before kth is below %g", what, n, kth, i, a[i], got);
    for (size_t i = kth + 1; i < n; i++)
        cr_assert(a[i] <= got, "%s n=%zu kth=%zu: a[%zu]=%g after kth is above %g", what, n, kth, i, a[i], got);

    /* Reordered, not changed: the same multiset. */
    qsort(a, n, sizeof *a, cmp_desc);
    cr_assert(memcmp(a, ref, n * sizeof *a) == 0, "%s n=%zu kth=%zu: elements changed", what, n, kth);
    free(a);
    free(ref);
}

Test(topk_kth_largest, matches_sort_for_every_size_and_fill) {
    static const char *names[FILL_COUNT] = {"random", "duplicates", "all-equal", "negative", "ascending",
                                            "descending"};
    rng_seed(1);
    for (size_t s = 0; s < NSIZES; s++) {
        size_t n = sizes[s];
        float *a = malloc(n * sizeof *a);
        cr_assert_not_null(a);
        for (int kind = 0; kind < FILL_COUNT; kind++) {
            fill(a, n, (fill_kind)kind);
            size_t ks[8];
            size_t nk = kth_choices(n, ks);
            for (size_t j = 0; j < nk; j++) check_kth(a, n, ks[j], names[kind]);
        }
        free(a);
    }
}

Test(topk_kth_largest, every_kth_of_a_small_array_with_ties) {
    /* Exhaustive over kth, for several seeds: ties around the pivot are where
     * Hoare partitions go wrong. */
    for (uint64_t seed = 0; seed < 50; seed++) {
        rng_seed(100 + seed);
        size_t n = 1 + (size_t)(rng_next() % 40);
        float a[40];
        fill(a, n, FILL_DUPLICATE);
        for (size_t kth = 0; kth < n; kth++) check_kth(a, n, kth, "small-dup");
    }
}

Test(topk_kth_largest, zeros_of_both_signs_count_as_equal) {
    float a[] = {0.0f, -0.0f, 1.0f, -0.0f, 0.0f};
    float got = dgc_topk_kth_largest(a, 5, 1);
    cr_assert(got == 0.0f, "second largest of {0,-0,1,-0,0} is a zero, got %g", got);
}

/* The heap keeps the `size` largest of what was pushed: its minimum is the
 * size-th largest, for every size, fill and push count. */
Test(topk_heap, minimum_is_the_size_th_largest_pushed) {
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        size_t n = sizes[si];
        for (int kind = 0; kind < FILL_COUNT; kind++) {
            float *a = malloc(n * sizeof *a);
            fill(a, n, (fill_kind)kind);
            float *sorted = sorted_desc(a, n);
            size_t choices[8];
            size_t nc = kth_choices(n, choices);
            for (size_t c = 0; c < nc; c++) {
                size_t size = choices[c] + 1;
                float *mem = malloc(size * sizeof *mem);
                dgc_topk_heap heap;
                dgc_topk_heap_init(&heap, mem, size);
                for (size_t i = 0; i < n; i++) dgc_topk_heap_push(&heap, a[i]);
                cr_assert_eq(dgc_topk_heap_min(&heap), sorted[size - 1], "n %zu fill %d size %zu: heap min %g, sorted %g",
                             n, kind, size, dgc_topk_heap_min(&heap), sorted[size - 1]);
                free(mem);
            }
            free(sorted);
            free(a);
        }
    }
}

/* The radix select the engine keeps its candidates in order with: the kth
 * largest |a[i]| and how many lie above it, a[] untouched, against a sort, over every fill and k. */
Test(topk_kth_largest_abs, matches_sort_of_magnitudes_and_leaves_input) {
    rng_seed(5);
    for (size_t s = 0; s < NSIZES; s++) {
        size_t n = sizes[s];
        if (n == 0) continue;
        float *a = malloc(n * sizeof *a), *copy = malloc(n * sizeof *copy), *mag = malloc(n * sizeof *mag);
        cr_assert(a && copy && mag);
        for (int kind = 0; kind < FILL_COUNT; kind++) {
            fill(a, n, (fill_kind)kind);
            memcpy(copy, a, n * sizeof *a);
            for (size_t i = 0; i < n; i++) mag[i] = fabsf(a[i]);
            qsort(mag, n, sizeof *mag, cmp_desc);
            size_t step = n > 64 ? n / 37 : 1;
            for (size_t kth = 0; kth < n; kth += step) {
                size_t above = 0, want_above = 0;
                float got = dgc_topk_kth_largest_abs(a, n, kth, &above);
                cr_assert(got == mag[kth], "n=%zu kind %d kth %zu: %g, sorting says %g", n, kind, kth, got, mag[kth]);
                while (want_above < n && mag[want_above] > got) want_above++;
                cr_assert_eq(above, want_above, "n=%zu kind %d kth %zu: %zu above %g, sorting says %zu", n, kind, kth,
                             above, got, want_above);
            }
            cr_assert(memcmp(a, copy, n * sizeof *a) == 0, "the input changed");
        }
        free(a);
        free(copy);
        free(mag);
    }
}
