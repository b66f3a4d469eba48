/* Unit tests for the update stream's variants (shim/engine/stream.c): every
 * instruction-set variant the CPU runs must give bit-for-bit what the generic
 * one gives (new u and v, zeroed output, candidates in index order, the
 * non-finite flag, the overflow count), and the generic one what the
 * per-element rules of update_rules.h give. A variant this build or CPU
 * lacks is reported skipped, by name.
 *
 * Candidates are packed a chunk of 16 at a time with full-width stores while
 * the room allows, and one by one near its end, so the cases take the room
 * to every boundary of that (see check_caps) and the lanes through every
 * pattern a half chunk can hold (see set_pattern). */
#include <criterion/criterion.h>

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dgcshim/update_rules.h"
#include "engine/stream.h"

static uint64_t rng_state;

static float rng_float(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

typedef struct {
    float *g, *u, *v, *u_next, *v_next, *out;
    float *g0, *u0, *v0; /* the inputs as they were before the pass */
    uint32_t *cand;
    float *cand_val;
} arrays;

static float *floats64(size_t n) {
    float *p = aligned_alloc(64, ((n + 32) * sizeof(float) + 63) & ~(size_t)63);
    cr_assert_not_null(p);
    return p;
}

static void arrays_alloc(arrays *a, size_t n, size_t cap) {
    a->g = floats64(n);
    a->u = floats64(n);
    a->v = floats64(n);
    a->u_next = floats64(n);
    a->v_next = floats64(n);
    a->out = floats64(n);
    a->g0 = floats64(n);
    a->u0 = floats64(n);
    a->v0 = floats64(n);
    a->cand = calloc(cap + 1, sizeof *a->cand);
    a->cand_val = calloc(cap + 1, sizeof *a->cand_val);
    cr_assert(a->cand && a->cand_val);
}

static void arrays_free(arrays *a) {
    free(a->g);
    free(a->u);
    free(a->v);
    free(a->u_next);
    free(a->v_next);
    free(a->out);
    free(a->g0);
    free(a->u0);
    free(a->v0);
    free(a->cand);
    free(a->cand_val);
}

/* One case: the inputs are the same for every variant (same seed). */
typedef struct {
    size_t n, g_off, out_off, cap;
    int with_u, nesterov, in_place, nan_at; /* nan_at < 0: none */
    int specials; /* Inf, -0.0, denormals and FLT_MAX among the inputs */
    int pattern;  /* the lanes selected by set_pattern's rule (thr 1) */
    float scale, momentum, thr;
} stream_case;

/* The room the arrays have for candidates; one more slot past any case's
 * cap holds a sentinel that no pass may touch. */
#define CAP_MAX 20000
#define SENTINEL 0xeeeeeeeeu

/* Chunk ch (16 elements from index 16 * ch) has the low half's lanes
 * selected by the bits of (ch + 255) % 256 and the high half's by those of
 * (167 * ch + 255) % 256, so from 256 chunks on every 8-bit mask has come up
 * in each half, next to a different one in the other; chunk 0 is all
 * selected, so a cap of 16 ends exactly at its end. Selected values are
 * 2 to 4 in size, the others 0.25, with both signs; g = u = 0, so the
 * updated v is v itself. */
static void set_pattern(float *g, float *u, float *v, size_t n) {
    for (size_t i = 0; i < n; i++) {
        size_t ch = i / 16, q = i % 16;
        unsigned mask = q < 8 ? (unsigned)((ch + 255) % 256) : (unsigned)((167 * ch + 255) % 256);
        int selected = (mask >> (q % 8)) & 1;
        float sign = (i / 3) % 2 ? -1.0f : 1.0f;
        g[i] = u[i] = 0.0f;
        v[i] = sign * (selected ? 2.0f + (float)q / 8.0f : 0.25f);
    }
}

/* Special values at a few places, several to a chunk: each goes in g
 * (scaled, then added to v), or in v (with g and u zero, so it passes
 * unchanged; -0.0 in all three stays -0.0 through every rule), or FLT_MAX
 * in all three (finite, but their sums overflow: the rules saturate). */
static void set_specials(float *g, float *u, float *v, size_t n) {
    const float in_v[] = {-0.0f, FLT_TRUE_MIN, -FLT_TRUE_MIN, FLT_MIN / 2, FLT_MAX, -FLT_MAX, 0.0f};
    const float in_g[] = {INFINITY, -INFINITY};
    size_t k = 0;
    for (size_t i = 5; i < n; i += 7 + i % 5, k++) {
        if (k % 5 == 4) {
            const float sign = k % 2 ? -1.0f : 1.0f;
            g[i] = u[i] = v[i] = sign * FLT_MAX;
        } else if (k % 3 == 2) {
            g[i] = in_g[(k / 3) % 2];
        } else {
            g[i] = u[i] = k % 2 ? -0.0f : 0.0f;
            v[i] = in_v[k % (sizeof in_v / sizeof *in_v)];
        }
    }
}

typedef struct {
    uint32_t bad;
    uint64_t ncand;
} outcome;

static outcome run_case(dgc_stream_fn fn, const stream_case *c, arrays *a) {
    rng_state = 0x12345678u + c->n;
    float *g = a->g + c->g_off, *out = c->in_place ? g : a->out + c->out_off;
    for (size_t i = 0; i < c->n + 16; i++) {
        a->g[i] = rng_float();
        a->u[i] = rng_float();
        a->v[i] = 2.0f * rng_float();
        a->out[i] = 7.0f;
        a->u_next[i] = a->v_next[i] = -3.0f;
    }
    /* Ties: updated |v| exactly at the threshold (g = u = 0 leaves v as is)
     * is selected; exactly 0 never is. */
    for (size_t t = 1; t < c->n; t += c->n / 4 + 1) {
        g[t] = a->u[t] = 0.0f;
        a->v[t] = (t & 2) ? -c->thr : c->thr;
        g[t - 1] = a->u[t - 1] = a->v[t - 1] = 0.0f;
    }
    if (c->pattern) set_pattern(g, a->u, a->v, c->n);
    if (c->specials) set_specials(g, a->u, a->v, c->n);
    if (c->nan_at >= 0) g[c->nan_at] = NAN;
    memcpy(a->g0, a->g, (c->n + 16) * sizeof(float));
    memcpy(a->u0, a->u, (c->n + 16) * sizeof(float));
    memcpy(a->v0, a->v, (c->n + 16) * sizeof(float));
    memset(a->cand, 0xee, (CAP_MAX + 1) * sizeof *a->cand);
    memset(a->cand_val, 0xee, (CAP_MAX + 1) * sizeof *a->cand_val);
    dgc_stream_job job = {.n = c->n, .g = g, .u = c->with_u ? a->u : NULL, .v = a->v,
                          .u_next = a->u_next, .v_next = a->v_next, .zero = out, .scale = c->scale,
                          .momentum = c->momentum, .nesterov = c->nesterov, .thr = c->thr,
                          .cand = a->cand, .cand_val = a->cand_val, .cand_cap = c->cap};
    outcome o;
    o.bad = fn(&job, &o.ncand);
    return o;
}

/* The per-element rules, straight from update_rules.h: what every variant
 * must equal. */
static void check_against_rules(const stream_case *c, const arrays *a, outcome o) {
    const float *g0 = a->g0 + c->g_off, *u0 = a->u0, *v0 = a->v0;
    uint64_t want = 0;
    uint32_t bad = 0, ovf = 0;
    for (size_t i = 0; i < c->n; i++) bad |= dgc_rule_nonfinite(g0[i] * c->scale);
    if (bad) { /* the step is dropped: only the flag is promised */
        cr_assert(o.bad & DGC_STREAM_NONFINITE, "non-finite flag");
        return;
    }
    for (size_t i = 0; i < c->n; i++) {
        float gi = g0[i];
        float un = 0.0f, add = gi * c->scale;
        if (c->with_u) add = dgc_rule_momentum(u0[i], gi * c->scale, c->momentum, c->nesterov, &un, &ovf);
        float vn = dgc_rule_accumulate(v0[i], add, &ovf);
        cr_assert(memcmp(&vn, &a->v_next[i], sizeof vn) == 0, "v_next[%zu] = %a, rules give %a", i, a->v_next[i], vn);
        if (c->with_u) cr_assert(memcmp(&un, &a->u_next[i], sizeof un) == 0, "u_next[%zu]", i);
        if (dgc_rule_selected(vn, c->thr)) {
            if (want < c->cap) {
                cr_assert_eq(a->cand[want], i, "candidate %llu", (unsigned long long)want);
                cr_assert(memcmp(&a->cand_val[want], &vn, sizeof vn) == 0, "candidate %llu's value",
                          (unsigned long long)want);
            }
            want++;
        }
    }
    cr_assert_eq(o.ncand, want, "%llu candidates, rules give %llu", (unsigned long long)o.ncand,
                 (unsigned long long)want);
    cr_assert_eq(o.bad, ovf ? (uint32_t)DGC_STREAM_SATURATED : 0u,
                 "n %zu (u %d, nesterov %d, specials %d, scale %g, m %g): flags %u, the rules say %s", c->n, c->with_u,
                 c->nesterov, c->specials, (double)c->scale, (double)c->momentum, o.bad, ovf ? "saturated" : "none");
}

static void check_same(const char *name, const stream_case *c, arrays *ref, arrays *got) {
    outcome r = run_case(dgc_stream_update_generic, c, ref);
    check_against_rules(c, ref, r);
    outcome o = run_case(dgc_stream_variant(name), c, got);
    const char *what = c->with_u ? (c->nesterov ? "nesterov" : "momentum") : "plain";
    cr_assert_eq(o.bad, r.bad, "%s %s n %zu: non-finite flag", name, what, c->n);
    cr_assert_eq(o.ncand, r.ncand, "%s %s n %zu: %llu candidates, generic %llu", name, what, c->n,
                 (unsigned long long)o.ncand, (unsigned long long)r.ncand);
    /* The stored candidates; the slots past them up to the cap may hold
     * anything, the one at the cap must be untouched. */
    size_t stored = r.ncand < c->cap ? r.ncand : c->cap;
    cr_assert(memcmp(got->cand, ref->cand, stored * sizeof *ref->cand) == 0, "%s %s n %zu cap %zu: candidate indices",
              name, what, c->n, c->cap);
    cr_assert(memcmp(got->cand_val, ref->cand_val, stored * sizeof *ref->cand_val) == 0,
              "%s %s n %zu cap %zu: candidate values", name, what, c->n, c->cap);
    uint32_t past[2];
    memcpy(&past[0], &got->cand_val[c->cap], sizeof past[0]);
    memcpy(&past[1], &ref->cand_val[c->cap], sizeof past[1]);
    cr_assert(got->cand[c->cap] == SENTINEL && ref->cand[c->cap] == SENTINEL && past[0] == SENTINEL &&
                  past[1] == SENTINEL,
              "%s %s n %zu cap %zu: a slot past the cap was written", name, what, c->n, c->cap);
    cr_assert(memcmp(got->v_next, ref->v_next, (c->n + 16) * sizeof(float)) == 0, "%s %s n %zu: v_next", name, what,
              c->n);
    cr_assert(memcmp(got->u_next, ref->u_next, (c->n + 16) * sizeof(float)) == 0, "%s: u_next", name);
    cr_assert(memcmp(got->out, ref->out, (c->n + 16) * sizeof(float)) == 0, "%s %s n %zu: output", name, what, c->n);
    cr_assert(memcmp(got->g, ref->g, (c->n + 16) * sizeof(float)) == 0, "%s: g (in place)", name);
    float *out = c->in_place ? got->g + c->g_off : got->out + c->out_off;
    for (size_t i = 0; i < c->n; i++) cr_assert(out[i] == 0.0f, "%s: out[%zu] not zeroed", name, i);
}

/* The case again with the room for candidates at each boundary of the
 * packing: none, under a chunk, a chunk, and around half and all of the t
 * candidates there are, so that the room runs out before, inside and just
 * after a chunk's candidates, and the count goes on past it. */
static void check_caps(const char *name, stream_case c, arrays *ref, arrays *got) {
    c.cap = CAP_MAX;
    const size_t t = (size_t)run_case(dgc_stream_update_generic, &c, ref).ncand;
    const size_t caps[] = {0, 1, 15, 16, 17, 31, t / 2, t / 2 + 7, t - t % 16, t > 16 ? t - 16 : 0,
                           t > 15 ? t - 15 : 0, t > 1 ? t - 1 : 0, t, t + 1, t + 15, t + 16, CAP_MAX};
    for (size_t k = 0; k < sizeof caps / sizeof *caps; k++) {
        c.cap = caps[k];
        check_same(name, &c, ref, got);
    }
}

static void check_variant(const char *name) {
    if (!dgc_stream_variant(name)) cr_skip_test("stream variant %s: not in this build or not on this CPU", name);
    const size_t n_max = 5000;
    arrays ref, got;
    arrays_alloc(&ref, n_max, CAP_MAX);
    arrays_alloc(&got, n_max, CAP_MAX);
    const size_t sizes[] = {5000, 4099, 33, 16, 7};
    const float special_thr[] = {0.0f, -0.0f, FLT_TRUE_MIN, 1.5f, FLT_MAX, INFINITY, NAN};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
        for (int mode = 0; mode < 3; mode++)
            for (size_t off = 0; off < 16; off += 3) {
                stream_case c = {.n = sizes[s], .g_off = off, .out_off = (off * 7) % 16, .cap = CAP_MAX,
                                 .with_u = mode > 0, .nesterov = mode == 2, .in_place = off % 2,
                                 .nan_at = -1, .scale = off ? 0.75f : 1.0f, .momentum = 0.9f, .thr = 1.5f};
                check_caps(name, c, &ref, &got); /* about a quarter of the lanes */
                c.thr = 0.5f;                    /* most of them */
                check_caps(name, c, &ref, &got);
                c.thr = 0.0f; /* every non-zero value, never a zero one */
                check_caps(name, c, &ref, &got);
                c.thr = 1.5f;
                c.nan_at = (int)(sizes[s] / 2);
                check_same(name, &c, &ref, &got);
                c.nan_at = -1;
                c.specials = 1;
                for (size_t k = 0; k < sizeof special_thr / sizeof *special_thr; k++) {
                    c.thr = special_thr[k];
                    check_same(name, &c, &ref, &got);
                }
                c.specials = 0;
                c.pattern = 1;
                c.thr = 1.0f;
                check_caps(name, c, &ref, &got);
            }
    arrays_free(&ref);
    arrays_free(&got);
}

Test(stream, generic_follows_the_rules) { check_variant("generic"); }
Test(stream, avx2_matches_generic_bit_for_bit) { check_variant("avx2"); }
Test(stream, avx512_matches_generic_bit_for_bit) { check_variant("avx512"); }

Test(stream, default_is_the_widest_available) {
    dgc_stream_fn fn = dgc_stream_variant(NULL);
    cr_assert_not_null(fn);
    if (dgc_stream_variant("avx512")) cr_assert_eq(fn, dgc_stream_variant("avx512"));
    else if (dgc_stream_variant("avx2")) cr_assert_eq(fn, dgc_stream_variant("avx2"));
    else cr_assert_eq(fn, dgc_stream_variant("generic"));
    cr_assert_null(dgc_stream_variant("sse9"), "an unknown name is refused");
}
