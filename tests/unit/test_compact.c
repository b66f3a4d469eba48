/* Unit tests for shim/wire/compact.c: the layout against a brute force, the
 * scaled binary16 rounding against two references written here from the
 * format (an enumeration of binary16 patterns, and the quantum rule in
 * double arithmetic), the scale's canonical property, independence from the
 * FPU rounding mode, the encoder's bytes against a bit-at-a-time encoder
 * written here, round trips, and every rejection of the expander. */
#include <criterion/criterion.h>

#include <fenv.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dgcshim/engine.h"
#include "dgcshim/policy.h"
#include "dgcshim/wire.h"
#include "dgcshim/wire_compact.h"
#include "../common/round16_ref.h"

#define GUARD 64
#define GUARD_BYTE 0xa5

/* The other readers of a compact payload must agree with the expander:
 * dgc_compact_check with the same verdict and message, and dgc_compact_add
 * (the payload as rank 7 of 8, after 7 empty ones) with the same verdict and
 * message (but for a layout, which is every rank's: rank 0's), adding what the expanded pairs hold and writing nothing outside
 * its n floats. plain: the expanded payload when expand_rc is 0. The sum is
 * left out for n past 2^22 (an output of 16 MiB). */
static void others_agree(const void *compact, const dgc_compact_layout *L, int expand_rc, const char *expand_err,
                         const void *plain) {
    char err[256] = "";
    const int rc = dgc_compact_check(compact, L, 7, err, sizeof err);
    cr_assert_eq(rc, expand_rc, "dgc_compact_check says %d, the expander %d (%s)", rc, expand_rc, err);
    if (rc) cr_assert_str_eq(err, expand_err, "dgc_compact_check's message differs");
    if (L->n > (UINT64_C(1) << 22)) return;
    unsigned char *gathered = calloc(8, L->bytes);
    float *mem = malloc((L->n + 2 * GUARD) * sizeof *mem), *want = calloc(L->n + 1, sizeof *want);
    cr_assert(gathered && mem && want);
    /* A payload of an unsound layout is not L->bytes long: it is not read
     * (the layout, every rank's, is refused first), so zeros stand in. */
    const int unsound = expand_rc && strstr(expand_err, "compact layout") != NULL;
    if (!unsound) memcpy(gathered + 7 * L->bytes, compact, L->bytes);
    for (uint64_t i = 0; i < L->n + 2 * GUARD; i++) mem[i] = i < GUARD || i >= GUARD + L->n ? NAN : 0.0f;
    err[0] = '\0';
    const int arc = dgc_compact_add(gathered, L->bytes, 8, L, 1.0f, mem + GUARD, err, sizeof err);
    cr_assert_eq(arc, expand_rc, "dgc_compact_add says %d, the expander %d (%s)", arc, expand_rc, err);
    if (unsound) /* every rank's: rank 0 is named */
        cr_assert(strstr(err, "payload from rank 0: compact layout") && strstr(err, "is not sound"), "%s", err);
    else if (arc)
        cr_assert_str_eq(err, expand_err, "dgc_compact_add's message differs: %s", err);
    else dgc_wire_add_own(plain, L->k, want);
    for (uint64_t i = 0; i < GUARD; i++) {
        cr_assert(isnan(mem[i]) && isnan(mem[GUARD + L->n + i]), "dgc_compact_add wrote outside its output");
    }
    if (!arc) cr_assert(memcmp(mem + GUARD, want, L->n * sizeof *want) == 0, "dgc_compact_add's sum differs");
    free(gathered);
    free(mem);
    free(want);
}

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

/* A random finite float whose binade is in [lo, hi] (clamped to fp32's),
 * either sign. */
static float rng_float_in(int lo, int hi) {
    if (lo < -149) lo = -149;
    if (hi > 127) hi = 127;
    if (hi < lo) hi = lo;
    int b = lo + (int)(rng_next() % (uint64_t)(hi - lo + 1));
    uint32_t sign = (uint32_t)(rng_next() & 1) << 31, u;
    if (b >= -126) {
        u = (uint32_t)(b + 127) << 23 | (uint32_t)(rng_next() & 0x7fffff);
    } else { /* subnormal: the top bit at b + 149 */
        int t = b + 149;
        u = (uint32_t)1 << t | (uint32_t)(rng_next() & ((UINT64_C(1) << t) - 1));
    }
    return bitsf(sign | u);
}

/* ---- references, from the formats' definitions --------------------------- */

/* Reference 1, from the quantum rule: ref_round16 (../common/round16_ref.h). */

/* Reference 2, from binary16 itself: every binary16 magnitude (the exponent
 * field let run past 30, so that values past the format's range still have
 * neighbours), times 2^(e - 14), kept when fp32 can hold it (a multiple of
 * 2^-149), sorted; up to and including 2^128. */
typedef struct {
    double *v;
    size_t n;
    int e;
} grid;

static void grid_add(grid *g, size_t *cap, double s) {
    if (floor(ldexp(s, 149)) != ldexp(s, 149)) return; /* finer than fp32 */
    if (g->n == *cap) {
        *cap *= 2;
        g->v = realloc(g->v, *cap * sizeof *g->v);
        cr_assert_not_null(g->v);
    }
    g->v[g->n++] = s;
}

static grid grid_for(int e) {
    grid g = {malloc(4096 * sizeof(double)), 0, e};
    size_t cap = 4096;
    cr_assert_not_null(g.v);
    for (int f = 0; f < 1024; f++) grid_add(&g, &cap, ldexp(f, -24 + e - 14)); /* subnormals and 0 */
    for (int field = 1;; field++) {
        for (int f = 0; f < 1024; f++) {
            double s = ldexp(1024 + f, field - 25 + e - 14);
            grid_add(&g, &cap, s);
            if (s >= ldexp(1, 128)) return g;
        }
    }
}

/* The nearest grid value to x; a tie goes to the even position (the even
 * binary16 significand: every binade holds 1024 values, the subnormal range
 * 1024 or, on fp32's grid, consecutive multiples of 2^-149 from 0). */
static float ref_round_grid(const grid *g, float x) {
    double a = fabs((double)x);
    size_t lo = 0, hi = g->n - 1; /* v[lo] <= a < v[hi] */
    if (a == 0) return x;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (g->v[mid] <= a) lo = mid;
        else hi = mid;
    }
    double dl = a - g->v[lo], dh = g->v[hi] - a, r;
    if (dl < dh) r = g->v[lo];
    else if (dh < dl) r = g->v[hi];
    else r = lo % 2 == 0 ? g->v[lo] : g->v[hi];
    if (r >= ldexp(1, 128)) r = ldexp(2047, 117);
    return (float)copysign(r, (double)x);
}

/* The reference scale (ref_scale16) of the largest finite |x|. */
static int ref_scale(const float *x, uint64_t count) {
    double max = 0;
    for (uint64_t j = 0; j < count; j++)
        if (isfinite(x[j]) && fabs((double)x[j]) > max) max = fabs((double)x[j]);
    return ref_scale16(max);
}

static double ref_half_value(uint32_t h) {
    uint32_t field = (h >> 10) & 31, frac = h & 1023;
    double a = field ? ldexp(1024 + frac, (int)field - 25) : ldexp(frac, -24);
    return h & 0x8000u ? -a : a;
}

/* The binary16 bits of y (exactly representable; checked). */
static uint32_t ref_half_bits_of(double y);
static uint32_t ref_half_bits(double y) {
    uint32_t h = ref_half_bits_of(y);
    cr_assert(ref_half_value(h) == y && signbit(ref_half_value(h)) == signbit(y), "binary16 0x%04x is not %a", h, y);
    return h;
}

static uint32_t ref_half_bits_of(double y) {
    uint32_t sign = signbit(y) ? 0x8000u : 0;
    double a = fabs(y);
    if (a == 0) return sign;
    if (a < ldexp(1, -14)) {
        double f = ldexp(a, 24);
        cr_assert(f == floor(f) && f < 1024, "%a is no binary16 subnormal", y);
        return sign | (uint32_t)f;
    }
    int b = ref_binade(a);
    cr_assert(b <= 15, "%a is past binary16's range", y);
    double m = ldexp(a, 10 - b);
    cr_assert(m == floor(m), "%a has more than 11 significant bits", y);
    return sign | (uint32_t)(b + 15) << 10 | ((uint32_t)m - 1024u);
}

/* ---- the layout ------------------------------------------------------------ */

typedef struct {
    unsigned L;
    uint64_t U;
    size_t upper, low, values, bytes; /* byte offsets, and the size */
} ref_layout;

/* By brute force: every L, its cost k L + U counted as the budget says. */
static ref_layout ref_layout_for(uint64_t n, uint64_t k, unsigned vb) {
    ref_layout r = {0, 0, 0, 0, 0, 0};
    uint64_t best = UINT64_MAX;
    for (unsigned L = 0; L <= 32; L++) {
        uint64_t high = n == 0 ? 0 : (n - 1) / ((uint64_t)1 << L);
        uint64_t cost = k * L + k + high;
        if (cost < best) best = cost, r.L = L, r.U = k + high;
    }
    r.upper = 40;
    r.low = r.upper + 8 * words(r.U);
    r.values = r.low + 8 * words(k * r.L);
    r.bytes = r.values + 8 * words(k * vb);
    return r;
}

static void check_layout(uint64_t n, uint64_t k) {
    for (unsigned vb = 16; vb <= 32; vb += 16) {
        ref_layout r = ref_layout_for(n, k, vb);
        dgc_compact_layout L;
        dgc_compact_layout_for(n, k, vb, &L);
        cr_assert(L.n == n && L.k == k && L.value_bits == vb, "n %llu k %llu: fields", (unsigned long long)n,
                  (unsigned long long)k);
        cr_assert(L.low_bits == r.L && L.upper_bits == r.U && L.bytes == r.bytes,
                  "n %llu k %llu vb %u: L %u U %llu bytes %zu, want L %u U %llu bytes %zu", (unsigned long long)n,
                  (unsigned long long)k, vb, L.low_bits, (unsigned long long)L.upper_bits, L.bytes, r.L,
                  (unsigned long long)r.U, r.bytes);
        cr_assert_eq(L.bytes % 8, 0);
    }
}

Test(compact_layout, low_bits_minimise_the_budget_and_bytes_follow) {
    static const uint64_t ns[] = {0, 1, 2, 3, 7, 100, 1000, 65535, 669706, 1000000, 5000000, 123456789,
                                  UINT32_MAX, (uint64_t)UINT32_MAX + 1};
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++) {
        uint64_t n = ns[a];
        uint64_t ks[] = {0, 1, 2, 3, n / 1000, n / 100, n / 7, n / 3, n / 2, n - (n > 0), n};
        for (size_t c = 0; c < sizeof ks / sizeof ks[0]; c++) check_layout(n, ks[c]);
    }
    for (uint64_t n = 0; n <= 300; n++)
        for (uint64_t k = 0; k <= n + 2; k++) check_layout(n, k);
    for (int t = 0; t < 20000; t++) {
        uint64_t n = rng_next() % ((uint64_t)1 << (rng_next() % 34));
        check_layout(n, n ? rng_next() % (n + 1) : 0);
    }
    /* The headline: n 10^6, k 1000. L = 9: 9000 + 1000 + 1953 = 11953 bits,
     * under L = 10 (10000 + 1000 + 976) and L = 8 (8000 + 1000 + 3906). */
    dgc_compact_layout L;
    dgc_compact_layout_for(1000000, 1000, 32, &L);
    cr_assert(L.low_bits == 9 && L.upper_bits == 2953, "L %u U %llu", L.low_bits, (unsigned long long)L.upper_bits);
    cr_assert_eq(L.bytes, 40 + 8 * 47 + 8 * 141 + 8 * 500);
    dgc_compact_layout_for(1000000, 1000, 16, &L);
    cr_assert_eq(L.bytes, 40 + 8 * 47 + 8 * 141 + 8 * 250);
    /* A tie: n 10^6, k 250000 costs 999999 bits with L = 1 and L = 2. */
    dgc_compact_layout_for(1000000, 250000, 32, &L);
    cr_assert_eq(L.low_bits, 1);
}

/* ---- the values -------------------------------------------------------------- */

static void check_round(const grid *g, float x) {
    if (!isfinite(x)) return; /* past FLT_MAX */
    float got = dgc_compact_value(x, 16, g->e), q = ref_round16(x, g->e), r = ref_round_grid(g, x);
    cr_assert_eq(fbits(q), fbits(r), "references disagree at x %a e %d: %a, %a", (double)x, g->e, (double)q,
                 (double)r);
    cr_assert_eq(fbits(got), fbits(r), "round16(%a, %d) = %a (0x%08x), want %a (0x%08x)", (double)x, g->e,
                 (double)got, fbits(got), (double)r, fbits(r));
    cr_assert_eq(fbits(dgc_compact_value(x, 32, g->e)), fbits(x), "32 bits must be the identity");
}

/* x, and the floats on either side of it. */
static void check_round_near(const grid *g, float x) {
    check_round(g, x);
    check_round(g, nextafterf(x, INFINITY));
    check_round(g, nextafterf(x, -INFINITY));
    check_round(g, -x);
}

Test(compact_value, round16_matches_the_binary16_grid) {
    static const int es[] = {-149, -148, -140, -125, -112, -111, -110, -100, -40, -1, 0, 1, 14, 15, 100, 126, 127};
    for (size_t a = 0; a < sizeof es / sizeof es[0]; a++) {
        const int e = es[a];
        grid g = grid_for(e);
        /* Edges: signed zeros, fp32's extremes, the binade bounds, the
         * subnormal binary16 quantum. */
        static const float fixed[] = {0.0f, -0.0f, FLT_TRUE_MIN, -FLT_TRUE_MIN, FLT_MIN, FLT_MAX, -FLT_MAX, 1.0f,
                                      2047.5f, 2047.25f, 1.5f};
        for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) check_round_near(&g, fixed[i]);
        for (int d = -40; d <= 2; d++)
            if (e + d >= -149 && e + d <= 127) check_round_near(&g, ldexpf(1.0f, e + d));
        /* Ties: midpoints of neighbouring grid values that fp32 holds. */
        for (int t = 0; t < 20000; t++) {
            size_t i = (size_t)(rng_next() % (g.n - 1));
            double mid = (g.v[i] + g.v[i + 1]) / 2;
            if (mid < ldexp(1, 128) && (double)(float)mid == mid) check_round_near(&g, (float)mid);
        }
        /* Random values around the scale, and anywhere. */
        for (int t = 0; t < 20000; t++) check_round(&g, rng_float_in(e - 45, e + 1));
        for (int t = 0; t < 5000; t++) {
            uint32_t u = (uint32_t)rng_next();
            if ((u & 0x7f800000u) != 0x7f800000u) check_round(&g, bitsf(u));
        }
        free(g.v);
    }
    /* Near FLT_MAX with e 127: 2^128 is out of reach, the largest below it stays. */
    cr_assert_eq(fbits(dgc_compact_value(FLT_MAX, 16, 127)), fbits(ldexpf(2047.0f, 117)));
    cr_assert_eq(fbits(dgc_compact_value(-FLT_MAX, 16, 127)), fbits(-ldexpf(2047.0f, 117)));
    cr_assert_eq(fbits(dgc_compact_value(ldexpf(2047.5f, 117), 16, 127)), fbits(ldexpf(2047.0f, 117)));
    /* A negative value that rounds to 0 keeps its sign. */
    cr_assert_eq(fbits(dgc_compact_value(-1e-30f, 16, 0)), 0x80000000u);
    cr_assert_eq(fbits(dgc_compact_value(1e-30f, 16, 0)), 0u);
    /* Non-finite values come back as they are. */
    cr_assert_eq(fbits(dgc_compact_value(INFINITY, 16, 0)), fbits(INFINITY));
    cr_assert(isnan(dgc_compact_value(NAN, 16, 3)));
}

Test(compact_value, round16_random_scales_against_the_quantum_rule) {
    for (int t = 0; t < 300000; t++) {
        int e = -149 + (int)(rng_next() % 277);
        float x = t % 3 ? rng_float_in(e - 45, e + 1) : bitsf((uint32_t)rng_next() & 0xff7fffffu);
        float got = dgc_compact_value(x, 16, e), want = ref_round16(x, e);
        cr_assert_eq(fbits(got), fbits(want), "round16(%a, %d) = %a, want %a", (double)x, e, (double)got,
                     (double)want);
    }
}

/* The batch form against the reference, value by value: blocks all on the
 * fast path, blocks with one odd value (a subnormal result, a zero, Inf,
 * NaN, one past the scale) among them, counts that end inside a block, in
 * place and not. */
Test(compact_value, batch_form_matches_the_reference_in_every_block) {
    enum { MAX = 1000 };
    static float x[MAX], out[MAX], inplace[MAX];
    static const float odd[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-40f, -3e-39f, FLT_MAX, -FLT_MAX};
    for (int t = 0; t < 400; t++) {
        const int e = t % 5 == 0 ? -149 + (int)(rng_next() % 277) : -20 + (int)(rng_next() % 40);
        const uint64_t count = 1 + rng_next() % MAX;
        for (uint64_t j = 0; j < count; j++) x[j] = rng_float_in(e - 30, e + 1);
        if (t % 2) x[rng_next() % count] = odd[rng_next() % (sizeof odd / sizeof *odd)];
        if (t % 7 == 0) x[rng_next() % count] = bitsf((uint32_t)rng_next());
        memcpy(inplace, x, (size_t)count * sizeof *x);
        dgc_compact_values(x, count, 16, e, out);
        dgc_compact_values(inplace, count, 16, e, inplace);
        for (uint64_t j = 0; j < count; j++) {
            const float want = dgc_compact_value(x[j], 16, e);
            if (isnan(want)) {
                cr_assert(isnan(out[j]) && isnan(inplace[j]), "slot %llu: NaN must stay NaN", (unsigned long long)j);
                continue;
            }
            cr_assert_eq(fbits(out[j]), fbits(want), "e %d slot %llu of %llu: %a, want %a", e, (unsigned long long)j,
                         (unsigned long long)count, (double)out[j], (double)want);
            cr_assert_eq(fbits(inplace[j]), fbits(want), "in place, e %d slot %llu", e, (unsigned long long)j);
        }
        dgc_compact_values(x, count, 32, e, out); /* 32 bits: a copy */
        cr_assert(memcmp(out, x, (size_t)count * sizeof *x) == 0, "32-bit values must come back as they are");
    }
}

static void check_scale(const float *x, uint64_t count) {
    int e = dgc_compact_scale16(x, count);
    cr_assert_eq(e, ref_scale(x, count), "scale %d, reference %d", e, ref_scale(x, count));
    cr_assert(e >= -149 && e <= 127, "scale %d out of range", e);
    double max = 0;
    for (uint64_t j = 0; j < count; j++) {
        float r = dgc_compact_value(x[j], 16, e);
        if (isfinite(r) && fabs((double)r) > max) max = fabs((double)r);
    }
    if (max == 0) cr_assert_eq(e, 0, "all zero: scale %d", e);
    else cr_assert(max >= ldexp(1, e) && max < ldexp(1, e + 1), "largest rounded %a outside [2^%d, 2^%d)", max, e,
                   e + 1);
}

Test(compact_value, scale16_is_canonical) {
    cr_assert_eq(dgc_compact_scale16(NULL, 0), 0);
    static const float zeros[] = {0.0f, -0.0f, 0.0f};
    cr_assert_eq(dgc_compact_scale16(zeros, 3), 0);
    static const struct {
        float x;
        int e;
    } one[] = {
        {1.0f, 0}, {1.999f, 0}, {2047.4f, 10}, {2047.5f, 11}, /* the tie goes up, to even 2048 */
        {2047.9f, 11}, {-2047.9f, 11}, {FLT_MAX, 127}, {FLT_TRUE_MIN, -149}, {-FLT_TRUE_MIN, -149},
        {FLT_MIN, -126}, {0x1p-140f, -140}, {0x1.ff8p-140f, -140}, /* fp32 subnormals: nothing to round */
        {0x1.ffcp-138f, -138}, {0x1.ffep-138f, -137}, /* 4095 * 2^-149 ties up to 2^-137 */
    };
    for (size_t i = 0; i < sizeof one / sizeof one[0]; i++) {
        float x[3] = {0.25f * one[i].x, one[i].x, -0.0f};
        cr_assert_eq(dgc_compact_scale16(x, 3), one[i].e, "scale of %a: %d, want %d", (double)one[i].x,
                     dgc_compact_scale16(x, 3), one[i].e);
        check_scale(x, 3);
    }
    float with_inf[] = {1.0f, INFINITY, NAN, -3.0f};
    cr_assert_eq(dgc_compact_scale16(with_inf, 4), 1, "non-finite values are passed over");
    float x[64];
    for (int t = 0; t < 20000; t++) {
        uint64_t count = 1 + rng_next() % 64;
        int top = -149 + (int)(rng_next() % 277);
        for (uint64_t j = 0; j < count; j++) {
            uint64_t r = rng_next() % 8;
            x[j] = r == 0 ? 0.0f : r == 1 ? -0.0f : rng_float_in(top - 50, top);
        }
        if (t % 4 == 0) { /* a largest value just below a binade's top: it may round up */
            float a = ldexpf(2.0f, top < 127 ? top : 126);
            for (uint64_t d = rng_next() % 4096; d > 0; d--) a = nextafterf(a, 0);
            x[rng_next() % count] = t % 8 ? a : -a;
        }
        check_scale(x, count);
    }
}

/* The same results under every rounding mode: the user's process may
 * change it, and all ranks must agree bit for bit. */
Test(compact_value, round16_and_scale16_ignore_the_rounding_mode) {
    enum { N = 20000 };
    static float x[N], want[N];
    static int e[N];
    for (int t = 0; t < N; t++) {
        e[t] = -149 + (int)(rng_next() % 277);
        x[t] = t % 2 ? rng_float_in(e[t] - 45, e[t] + 1) : bitsf((uint32_t)rng_next() & 0xff7fffffu);
        want[t] = dgc_compact_value(x[t], 16, e[t]);
    }
    int want_scale = dgc_compact_scale16(x, N);
    static const int modes[] = {FE_UPWARD, FE_DOWNWARD, FE_TOWARDZERO};
    static const char *names[] = {"FE_UPWARD", "FE_DOWNWARD", "FE_TOWARDZERO"};
    for (int m = 0; m < 3; m++) {
        cr_assert_eq(fesetround(modes[m]), 0);
        int bad = -1;
        for (int t = 0; t < N && bad < 0; t++)
            if (fbits(dgc_compact_value(x[t], 16, e[t])) != fbits(want[t])) bad = t;
        int scale = dgc_compact_scale16(x, N);
        fesetround(FE_TONEAREST);
        cr_assert_eq(bad, -1, "%s: round16(%a, %d) differs", names[m], bad < 0 ? 0.0 : (double)x[bad],
                     bad < 0 ? 0 : e[bad]);
        cr_assert_eq(scale, want_scale, "%s: scale16 differs", names[m]);
    }
}

/* ---- encoding: against a bit-at-a-time encoder written here ---------------- */

static void put_bit(unsigned char *a, uint64_t bit, unsigned v) {
    if (v) a[bit / 8] |= (unsigned char)(1u << (bit % 8));
    else a[bit / 8] &= (unsigned char)~(1u << (bit % 8));
}

static unsigned get_bit(const unsigned char *a, uint64_t bit) { return (a[bit / 8] >> (bit % 8)) & 1u; }

static void put_field(unsigned char *a, uint64_t first, unsigned bits, uint64_t v) {
    for (unsigned i = 0; i < bits; i++) put_bit(a, first + i, (unsigned)(v >> i) & 1u);
}

static uint64_t get_field(const unsigned char *a, uint64_t first, unsigned bits) {
    uint64_t v = 0;
    for (unsigned i = 0; i < bits; i++) v |= (uint64_t)get_bit(a, first + i) << i;
    return v;
}

/* The reference scale of a payload's (rounded) values: the binade of the
 * largest, 0 when all are 0. */
static int payload_scale(const float *val, uint64_t count) {
    double max = 0;
    for (uint64_t j = 0; j < count; j++)
        if (fabs((double)val[j]) > max) max = fabs((double)val[j]);
    return max == 0 ? 0 : ref_binade(max);
}

/* The compact bytes of count sorted pairs, written from wire_compact.h's
 * description. */
static unsigned char *ref_encode(uint64_t n, uint64_t k, unsigned vb, const char *plain, uint64_t count,
                                 const uint32_t *idx, const float *val) {
    ref_layout r = ref_layout_for(n, k, vb);
    unsigned char *c = calloc(1, r.bytes);
    cr_assert_not_null(c);
    memcpy(c, plain, 32);
    int e = vb == 16 ? payload_scale(val, count) : 0;
    put_field(c + 32, 0, 40, count);
    put_field(c + 32, 48, 16, (uint64_t)(uint16_t)(int16_t)e);
    for (uint64_t j = 0; j < count; j++) {
        put_bit(c + r.upper, (idx[j] >> r.L) + j, 1);
        put_field(c + r.low, j * r.L, r.L, idx[j] & (((uint64_t)1 << r.L) - 1));
        uint64_t v = vb == 32 ? fbits(val[j]) : ref_half_bits(ldexp((double)val[j], 14 - e));
        put_field(c + r.values, j * vb, vb, v);
    }
    return c;
}

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

/* Encodes (checking the bytes against ref_encode and the count word),
 * expands into a guarded buffer and checks the plain bytes come back. */
static void round_trip(uint64_t n, uint64_t k, unsigned vb, uint64_t count, const uint32_t *idx,
                       const float *val) {
    dgc_compact_layout L;
    dgc_compact_layout_for(n, k, vb, &L);
    char *plain = plain_new(n, k, count, idx, val);
    unsigned char *compact = malloc(L.bytes), *mem = malloc(dgc_wire_bytes(k) + 2 * GUARD);
    cr_assert(compact && mem);
    memset(compact, 0x5a, L.bytes);
    cr_assert_eq(dgc_compact_encode(plain, &L, compact), 0, "n %llu k %llu count %llu vb %u: encode failed",
                 (unsigned long long)n, (unsigned long long)k, (unsigned long long)count, vb);
    /* A lone (0, +0.0) pair is padding: the count field leaves it out. */
    uint64_t real = count == 1 && idx[0] == 0 && fbits(val[0]) == 0 ? 0 : count;
    unsigned char *want = ref_encode(n, k, vb, plain, real, idx, val);
    for (size_t b = 0; b < L.bytes; b++)
        cr_assert_eq(compact[b], want[b], "n %llu k %llu count %llu vb %u L %u: byte %zu is 0x%02x, want 0x%02x",
                     (unsigned long long)n, (unsigned long long)k, (unsigned long long)count, vb, L.low_bits, b,
                     compact[b], want[b]);
    memset(mem, GUARD_BYTE, dgc_wire_bytes(k) + 2 * GUARD);
    char err[256] = "";
    cr_assert_eq(dgc_compact_expand(compact, &L, 3, mem + GUARD, err, sizeof err), 0,
                 "n %llu k %llu count %llu vb %u L %u: %s", (unsigned long long)n, (unsigned long long)k,
                 (unsigned long long)count, vb, L.low_bits, err);
    cr_assert(memcmp(mem + GUARD, plain, dgc_wire_bytes(k)) == 0,
              "n %llu k %llu count %llu vb %u L %u: expanded plain payload differs", (unsigned long long)n,
              (unsigned long long)k, (unsigned long long)count, vb, L.low_bits);
    others_agree(compact, &L, 0, "", plain);
    for (size_t i = 0; i < GUARD; i++) {
        cr_assert_eq(mem[i], GUARD_BYTE, "wrote before the plain payload");
        cr_assert_eq(mem[GUARD + dgc_wire_bytes(k) + i], GUARD_BYTE, "wrote past the plain payload");
    }
    free(want);
    free(plain);
    free(compact);
    free(mem);
}

/* Values as the engine sends them: rounded with their payload's scale. */
static void round_values(float *val, uint64_t count, unsigned vb) {
    int e = dgc_compact_scale16(val, count);
    for (uint64_t j = 0; j < count; j++) val[j] = dgc_compact_value(val[j], vb, e);
}

/* count distinct sorted indices below n (selection sampling, or a dense run
 * when count is most of n), values over a random span of binades. */
static void random_set(uint64_t n, uint64_t count, unsigned vb, uint32_t *idx, float *val) {
    uint64_t chosen = 0;
    for (uint64_t i = 0; i < n && chosen < count; i++)
        if (rng_next() % (n - i) < count - chosen) idx[chosen++] = (uint32_t)i;
    cr_assert_eq(chosen, count);
    int top = -149 + (int)(rng_next() % 277), span = (int)(rng_next() % 60);
    for (uint64_t j = 0; j < count; j++) {
        uint64_t r = rng_next() % 16;
        val[j] = r == 0 ? 0.0f : r == 1 ? -0.0f : r == 2 ? rng_float() : rng_float_in(top - span, top);
    }
    round_values(val, count, vb);
}

Test(compact_round_trip, random_sorted_sets) {
    for (int t = 0; t < 600; t++) {
        uint64_t scale = 1;
        for (uint64_t d = rng_next() % 7; d > 0; d--) scale *= 10;
        uint64_t n = 1 + rng_next() % (scale * 5);
        uint64_t kscale = 1;
        for (uint64_t d = rng_next() % 7; d > 0; d--) kscale *= 10;
        uint64_t k = 1 + rng_next() % (n < kscale * 5 ? n : kscale * 5);
        if (t % 11 == 0 && n <= 100000) k = n; /* dense */
        uint64_t count = rng_next() % (k + 1);
        if (t % 5 == 0) count = k;
        if (t % 13 == 0) count = 0;
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

/* count indices by a rule, values of one sign and many sizes. */
static void shaped(uint64_t n, uint64_t k, uint64_t count, int shape, unsigned vb) {
    uint32_t *idx = malloc((count + 1) * 4);
    float *val = malloc((count + 1) * 4);
    cr_assert(idx && val);
    uint64_t step = count ? n / count : 1;
    for (uint64_t j = 0; j < count; j++) {
        switch (shape) {
        case 0: idx[j] = (uint32_t)(n - count + j); break;            /* all at the end */
        case 1: idx[j] = (uint32_t)j; break;                          /* 0..count-1 */
        default: idx[j] = (uint32_t)(n - 1 - (count - 1 - j) * step); /* evenly, the widest gaps */
        }
        val[j] = (float)(j + 1) * 0.37f;
    }
    round_values(val, count, vb);
    round_trip(n, k, vb, count, idx, val);
    free(idx);
    free(val);
}

Test(compact_round_trip, edge_sets) {
    static const uint64_t nk[][2] = {
        {1, 1},          {2, 1},          {2, 2},        {3, 1},       {1000, 1},     {1000, 1000},
        {1000000, 1000}, {669706, 670},   {5000000, 1},  {5000000, 5000}, {1000000, 1000000},
        {4096, 64},      {UINT32_MAX, 1}, {(uint64_t)UINT32_MAX + 1, 1}, {(uint64_t)UINT32_MAX + 1, 3},
        {(uint64_t)UINT32_MAX + 1, 1000}};
    for (size_t a = 0; a < sizeof nk / sizeof nk[0]; a++) {
        uint64_t n = nk[a][0], k = nk[a][1];
        for (unsigned vb = 16; vb <= 32; vb += 16) {
            uint32_t last = (uint32_t)(n - 1), first = 0;
            float one = 1.5f, neg_zero = -0.0f;
            round_trip(n, k, vb, 1, &last, &one);      /* index n-1 alone */
            round_trip(n, k, vb, 1, &first, &one);     /* index 0 alone */
            round_trip(n, k, vb, 1, &first, &neg_zero); /* (0, -0.0) is a real pair */
            round_trip(n, k, vb, 0, NULL, NULL);       /* nothing */
            for (int shape = 0; shape < 3; shape++) {
                shaped(n, k, k, shape, vb);
                if (k > 2) shaped(n, k, k / 2, shape, vb);
            }
        }
    }
}

/* Extreme values: the scale at both ends of its range, fp32 subnormals,
 * binary16 subnormals under the scale, negative zeros beside them. */
Test(compact_round_trip, extreme_values) {
    static const float sets[][4] = {
        {FLT_MAX, -FLT_MAX, 1.0f, -0.0f},
        {FLT_TRUE_MIN, -FLT_TRUE_MIN, 0.0f, -0.0f},
        {0x1.ffcp-127f, FLT_TRUE_MIN, 0x1p-140f, -0.0f},
        {1.0f, 0x1p-24f, 0x1p-30f, 0x1p-38f},
        {65504.0f, 0x1p-10f, -0x1p-24f, 3.0f},
        {-0.0f, -0.0f, -0.0f, -0.0f},
    };
    uint32_t idx[4] = {1, 5, 99, 100};
    for (size_t s = 0; s < sizeof sets / sizeof sets[0]; s++) {
        for (unsigned vb = 16; vb <= 32; vb += 16) {
            float val[4];
            memcpy(val, sets[s], sizeof val);
            round_values(val, 4, vb);
            round_trip(101, 6, vb, 4, idx, val);
        }
    }
}

Test(compact_round_trip, a_lone_zero_pair_is_padding) {
    uint32_t i = 0;
    float v = 0.0f;
    round_trip(10, 4, 16, 1, &i, &v); /* checks the count field is 0 */
    round_trip(10, 4, 32, 1, &i, &v);
    v = -0.0f;
    round_trip(10, 4, 16, 1, &i, &v); /* -0.0 is a real value */
}

/* The encoder and expander under another rounding mode give the same bytes. */
Test(compact_round_trip, under_every_rounding_mode) {
    static const int modes[] = {FE_UPWARD, FE_DOWNWARD, FE_TOWARDZERO};
    for (int m = 0; m < 3; m++) {
        cr_assert_eq(fesetround(modes[m]), 0);
        for (int t = 0; t < 40; t++) {
            uint64_t n = 1 + rng_next() % 100000, k = 1 + rng_next() % (n < 500 ? n : 500);
            uint64_t count = rng_next() % (k + 1);
            uint32_t *idx = malloc((count + 1) * 4);
            float *val = malloc((count + 1) * 4);
            cr_assert(idx && val);
            random_set(n, count, 16, idx, val);
            round_trip(n, k, 16, count, idx, val);
            free(idx);
            free(val);
        }
        fesetround(FE_TONEAREST);
    }
}

Test(compact_encode, rejects_what_breaks_the_plain_rules) {
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
        {2, {1, 2}, {1, INFINITY}, "Inf"},
        {2, {1, 2}, {-INFINITY, 1}, "-Inf"},
        {1, {4}, {NAN}, "NaN"},
    };
    for (unsigned vb = 16; vb <= 32; vb += 16) {
        dgc_compact_layout L;
        dgc_compact_layout_for(1000, 6, vb, &L);
        unsigned char *c = malloc(L.bytes);
        cr_assert_not_null(c);
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            char *plain = plain_new(1000, 6, bad[i].count, bad[i].idx, bad[i].val);
            cr_assert_eq(dgc_compact_encode(plain, &L, c), -1, "vb %u: %s: accepted", vb, bad[i].what);
            free(plain);
        }
        free(c);
    }
    /* 16 bits: values off their payload's grid. */
    dgc_compact_layout L16, L32;
    dgc_compact_layout_for(1000, 6, 16, &L16);
    dgc_compact_layout_for(1000, 6, 32, &L32);
    unsigned char *c16 = malloc(L16.bytes), *c32 = malloc(L32.bytes);
    static const struct {
        float val[2];
        const char *what;
    } off[] = {
        {{1.1f, 0.5f}, "1.1: more than 11 significant bits"},
        {{1.0f, 0x1p-40f}, "2^-40 under a largest 1.0: below the scaled subnormal quantum 2^-38"},
        {{1.0f, 0x1.8p-38f}, "1.5 * 2^-38 under 1.0: between two subnormal steps"},
        {{FLT_MAX, 1.0f}, "FLT_MAX: 24 significant bits"},
    };
    uint32_t idx[2] = {4, 9};
    for (size_t i = 0; i < sizeof off / sizeof off[0]; i++) {
        char *plain = plain_new(1000, 6, 2, idx, off[i].val);
        cr_assert_eq(dgc_compact_encode(plain, &L16, c16), -1, "16-bit: %s: accepted", off[i].what);
        cr_assert_eq(dgc_compact_encode(plain, &L32, c32), 0, "32-bit: %s: refused", off[i].what);
        free(plain);
        float v[2] = {off[i].val[0], off[i].val[1]};
        round_values(v, 2, 16);
        plain = plain_new(1000, 6, 2, idx, v);
        cr_assert_eq(dgc_compact_encode(plain, &L16, c16), 0, "16-bit: %s, rounded: refused", off[i].what);
        free(plain);
    }
    /* 2^-38 under 1.0 is on the grid (binary16's least subnormal, scaled). */
    float v[2] = {1.0f, 0x1p-38f};
    char *plain = plain_new(1000, 6, 2, idx, v);
    cr_assert_eq(dgc_compact_encode(plain, &L16, c16), 0, "2^-38 under 1.0 refused");
    free(plain);
    dgc_compact_layout forged = L16;
    forged.low_bits++;
    plain = plain_new(1000, 6, 2, idx, v);
    cr_assert_eq(dgc_compact_encode(plain, &forged, c16), -1, "a layout not dgc_compact_layout_for's");
    free(plain);
    free(c16);
    free(c32);
}

/* ---- the expander's rejections ----------------------------------------------- */

static void expect_reject(const unsigned char *compact, const dgc_compact_layout *L, const char *what,
                          const char *needle) {
    char *plain = malloc(dgc_wire_bytes(L->k));
    char err[256] = "";
    cr_assert_not_null(plain);
    cr_assert_eq(dgc_compact_expand(compact, L, 7, plain, err, sizeof err), -1, "%s: accepted", what);
    others_agree(compact, L, -1, err, NULL);
    cr_assert(strstr(err, "rank 7") != NULL, "%s: message does not name the rank: %s", what, err);
    cr_assert(strstr(err, needle) != NULL, "%s: message does not say \"%s\": %s", what, needle, err);
    cr_log_info("%s: %s", what, err);
    free(plain);
}

static void expect_accept(const unsigned char *compact, const dgc_compact_layout *L, const char *what) {
    char *plain = malloc(dgc_wire_bytes(L->k));
    char err[256] = "";
    cr_assert_not_null(plain);
    cr_assert_eq(dgc_compact_expand(compact, L, 7, plain, err, sizeof err), 0, "%s: %s", what, err);
    others_agree(compact, L, 0, "", plain);
    free(plain);
}

/* n 1000, k 9: L 6 (54 + 9 + 15 bits), U 24; every area has bits past its
 * last slot. Pairs {3, 17, 600, 601, 999} with values of several binades. */
#define VN 1000
#define VK 9
static const uint32_t v_idx[] = {3, 17, 600, 601, 999};
static const float v_val[] = {1.0f, -2.0f, 0.5f, 3.0f, -0.25f}; /* on the grid of e = 1 */

typedef struct {
    dgc_compact_layout L;
    ref_layout r;
    unsigned char *c;
} sample;

static sample valid_sample(unsigned vb) {
    sample s;
    dgc_compact_layout_for(VN, VK, vb, &s.L);
    s.r = ref_layout_for(VN, VK, vb);
    cr_assert(s.L.low_bits == 6 && s.L.upper_bits == 24, "premise: L 6, U 24");
    char *plain = plain_new(VN, VK, 5, v_idx, v_val);
    s.c = malloc(s.L.bytes);
    cr_assert_not_null(s.c);
    cr_assert_eq(dgc_compact_encode(plain, &s.L, s.c), 0);
    free(plain);
    expect_accept(s.c, &s.L, "the sample");
    return s;
}

static void set_word(unsigned char *c, uint64_t count, unsigned reserved, int e) {
    uint64_t w = count | (uint64_t)reserved << 40 | (uint64_t)(uint16_t)(int16_t)e << 48;
    memcpy(c + 32, &w, 8); /* the test runs little-endian */
}

static void set_value(const sample *s, uint64_t j, uint32_t bits) {
    put_field(s->c + s->r.values, j * s->L.value_bits, s->L.value_bits, bits);
}

Test(compact_expand, rejects_a_bad_count_word) {
    for (unsigned vb = 16; vb <= 32; vb += 16) {
        int e = vb == 16 ? 1 : 0;
        sample s = valid_sample(vb);
        set_word(s.c, VK + 1, 0, e);
        expect_reject(s.c, &s.L, "count k + 1", "more than its 9 slots");
        set_word(s.c, (UINT64_C(1) << 40) - 1, 0, e);
        expect_reject(s.c, &s.L, "count 2^40 - 1", "more than its");
        set_word(s.c, 5, 1, e);
        expect_reject(s.c, &s.L, "bit 40 set", "bits 40..47");
        set_word(s.c, 5, 0x80, e);
        expect_reject(s.c, &s.L, "bit 47 set", "bits 40..47");
        set_word(s.c, 4, 0, e);
        expect_reject(s.c, &s.L, "count 4 of 5 pairs: value slot 4 past it", "value slot 4 after its 4 pairs");
        set_word(s.c, 5, 0, e);
        expect_accept(s.c, &s.L, "restored");
        if (vb == 32) {
            set_word(s.c, 5, 0, 1);
            expect_reject(s.c, &s.L, "scale with 32-bit values", "32-bit values");
            set_word(s.c, 5, 0, -1);
            expect_reject(s.c, &s.L, "scale -1 with 32-bit values", "32-bit values");
        } else {
            static const int bad_e[] = {-150, 128, 32767, -32768};
            for (size_t i = 0; i < sizeof bad_e / sizeof bad_e[0]; i++) {
                set_word(s.c, 5, 0, bad_e[i]);
                char what[64];
                snprintf(what, sizeof what, "scale %d", bad_e[i]);
                expect_reject(s.c, &s.L, what, "outside [-149, 127]");
            }
            /* Another e in range scales every value alike: a different
             * payload, canonical too, unless fp32 cannot hold a value. */
            set_word(s.c, 5, 0, 0);
            expect_accept(s.c, &s.L, "e 0: the values halved");
            set_word(s.c, 5, 0, 127);
            expect_accept(s.c, &s.L, "e 127: the values times 2^126");
            set_word(s.c, 5, 0, -149);
            expect_reject(s.c, &s.L, "e -149: 1.0 becomes 2^-150", "not exact in fp32");
        }
        free(s.c);
    }
}

Test(compact_expand, rejects_bad_upper_bits) {
    for (unsigned vb = 16; vb <= 32; vb += 16) {
        sample s = valid_sample(vb);
        unsigned char *up = s.c + s.r.upper;
        /* Pair high parts: 3>>6 = 0, 17>>6 = 0, 600>>6 = 9, 601>>6 = 9,
         * 999>>6 = 15: bits 0, 1, 11, 12, 19. */
        static const uint64_t bits[] = {0, 1, 11, 12, 19};
        for (size_t i = 0; i < 5; i++) cr_assert(get_bit(up, bits[i]), "premise: upper bit %llu", (unsigned long long)bits[i]);
        put_bit(up, 23, 1);
        expect_reject(s.c, &s.L, "a sixth set bit", "upper area bit 23 is set after its 5 pairs");
        put_bit(up, 23, 0);
        put_bit(up, 24, 1);
        expect_reject(s.c, &s.L, "a bit past U", "upper area bit 24, past its 24 bits");
        put_bit(up, 24, 0);
        put_bit(up, 63, 1);
        expect_reject(s.c, &s.L, "the word's last bit", "past its 24 bits");
        put_bit(up, 63, 0);
        put_bit(up, 19, 0);
        expect_reject(s.c, &s.L, "four set bits for five pairs", "4 set bits, fewer than its 5 pairs");
        put_bit(up, 23, 1); /* high 23 - 4 = 19: index 19 << 6 + 39 past n */
        expect_reject(s.c, &s.L, "high part past n", "out of range for n 1000");
        put_bit(up, 23, 0);
        put_bit(up, 20, 1); /* high 16: 16 << 6 = 1024 >= n */
        expect_reject(s.c, &s.L, "high part 16", "out of range for n 1000");
        put_bit(up, 20, 0);
        put_bit(up, 19, 1);
        /* High 15 with low 999 & 63 = 39: 999. Low 63 instead: 1023 >= n. */
        put_field(s.c + s.r.low, 4 * 6, 6, 63);
        expect_reject(s.c, &s.L, "index 1023", "index 1023, out of range");
        put_field(s.c + s.r.low, 4 * 6, 6, 999 & 63);
        expect_accept(s.c, &s.L, "restored");
        /* 600 and 601 share high 9: equal lows are a duplicate, a smaller
         * second low a decrease. */
        put_field(s.c + s.r.low, 3 * 6, 6, 600 & 63);
        expect_reject(s.c, &s.L, "duplicate", "(a duplicate)");
        put_field(s.c + s.r.low, 3 * 6, 6, (600 & 63) - 1);
        expect_reject(s.c, &s.L, "decrease", "not above pair 2's 600");
        put_field(s.c + s.r.low, 3 * 6, 6, 601 & 63);
        /* Move 17 into 3's high part 0 with low 2: 2 after 3. */
        put_field(s.c + s.r.low, 1 * 6, 6, 2);
        expect_reject(s.c, &s.L, "2 after 3", "pair 1 has index 2, not above pair 0's 3");
        free(s.c);
    }
}

Test(compact_expand, rejects_bits_past_the_slots) {
    for (unsigned vb = 16; vb <= 32; vb += 16) {
        sample s = valid_sample(vb);
        put_field(s.c + s.r.low, 5 * 6, 6, 1);
        expect_reject(s.c, &s.L, "low slot 5 of 5 pairs", "low slot 5 after its 5 pairs");
        put_field(s.c + s.r.low, 5 * 6, 6, 0);
        put_field(s.c + s.r.low, 8 * 6, 6, 32);
        expect_reject(s.c, &s.L, "last low slot", "low slot 8 after its 5 pairs");
        put_field(s.c + s.r.low, 8 * 6, 6, 0);
        put_bit(s.c + s.r.low, 54, 1);
        expect_reject(s.c, &s.L, "low bit past the slots", "low area bit 54, past its 9 slots");
        put_bit(s.c + s.r.low, 54, 0);
        set_value(&s, 5, 1);
        expect_reject(s.c, &s.L, "value slot 5 of 5 pairs", "value slot 5 after its 5 pairs");
        set_value(&s, 5, vb == 16 ? 0x8000u : 0x80000000u); /* -0.0 is not 0 bits */
        expect_reject(s.c, &s.L, "value slot 5 = -0.0", "value slot 5 after");
        set_value(&s, 5, 0);
        set_value(&s, 8, 1);
        expect_reject(s.c, &s.L, "last value slot", "value slot 8 after");
        set_value(&s, 8, 0);
        put_bit(s.c + s.r.values, (uint64_t)VK * vb, 1);
        expect_reject(s.c, &s.L, "value bit past the slots", "past its 9 slots");
        put_bit(s.c + s.r.values, (uint64_t)VK * vb, 0);
        s.c[s.L.bytes - 1] = 0x80;
        expect_reject(s.c, &s.L, "last value word's top bit", "past its 9 slots");
        free(s.c);
    }
}

Test(compact_expand, rejects_bad_values) {
    sample s = valid_sample(32);
    set_value(&s, 2, fbits(INFINITY));
    expect_reject(s.c, &s.L, "fp32 Inf", "value slot 2 is Inf or NaN");
    set_value(&s, 2, 0x7fc00000u);
    expect_reject(s.c, &s.L, "fp32 NaN", "value slot 2 is Inf or NaN");
    free(s.c);

    s = valid_sample(16);
    /* e = 1: 3.0 is y = 1.5 * 2^14, the largest (0x7600, field 29). */
    cr_assert_eq(get_field(s.c + s.r.values, 3 * 16, 16), ref_half_bits(3.0 * 0x1p13), "premise: 3.0 at e 1");
    set_value(&s, 1, 0x7c00u);
    expect_reject(s.c, &s.L, "binary16 Inf", "value slot 1 is binary16 Inf or NaN");
    set_value(&s, 1, 0xfe00u);
    expect_reject(s.c, &s.L, "binary16 NaN", "value slot 1 is binary16 Inf or NaN");
    set_value(&s, 1, ref_half_bits(-2.0 * 0x1p13));
    expect_accept(s.c, &s.L, "restored");
    /* Not canonical: a largest value out of [2^e, 2^(e+1)). */
    set_value(&s, 3, ref_half_bits(1.5 * 0x1p13)); /* 1.5 < 2^1: largest now 2.0 (field 29) */
    expect_accept(s.c, &s.L, "-2.0 is still the largest, in [2, 4)");
    set_value(&s, 1, ref_half_bits(-1.0 * 0x1p13)); /* largest 1.5: field 28 */
    expect_reject(s.c, &s.L, "largest 1.5 under e 1", "not canonical");
    set_value(&s, 1, ref_half_bits(-4.0 * 0x1p13)); /* y = 2^15: field 30 */
    expect_reject(s.c, &s.L, "largest 4.0 under e 1", "not canonical");
    free(s.c);

    /* Every value 0 (a real pair (5, -0.0)): e must be 0. */
    dgc_compact_layout L;
    dgc_compact_layout_for(VN, VK, 16, &L);
    uint32_t i5 = 5;
    float z = -0.0f;
    char *plain = plain_new(VN, VK, 1, &i5, &z);
    unsigned char *c = malloc(L.bytes);
    cr_assert_eq(dgc_compact_encode(plain, &L, c), 0);
    expect_accept(c, &L, "(5, -0.0) with e 0");
    set_word(c, 1, 0, 3);
    expect_reject(c, &L, "(5, -0.0) with e 3", "every value 0");
    free(c);
    free(plain);

    /* Not exact in fp32: e -149 scales y by 2^-163, so y must be a multiple
     * of 2^14 there; 0x7401 (2^14 + 16) is not. */
    float tiny = FLT_TRUE_MIN;
    plain = plain_new(VN, VK, 1, &i5, &tiny);
    c = malloc(L.bytes);
    cr_assert_eq(dgc_compact_encode(plain, &L, c), 0);
    uint64_t w;
    memcpy(&w, c + 32, 8);
    cr_assert_eq((int16_t)(w >> 48), -149, "premise: FLT_TRUE_MIN has scale -149");
    ref_layout r = ref_layout_for(VN, VK, 16);
    cr_assert_eq(get_field(c + r.values, 0, 16), 0x7400u, "premise: 2^-149 is y = 2^14");
    expect_accept(c, &L, "FLT_TRUE_MIN");
    put_field(c + r.values, 0, 16, 0x7401u);
    expect_reject(c, &L, "2^-149 + 2^-159", "not exact in fp32");
    put_field(c + r.values, 0, 16, 0x77ffu);
    expect_reject(c, &L, "(2^15 - 2^4) * 2^-163", "not exact in fp32");
    free(c);
    free(plain);
}

Test(compact_expand, rejects_a_counted_padding_pair_and_unsound_layouts) {
    for (unsigned vb = 16; vb <= 32; vb += 16) {
        dgc_compact_layout L;
        dgc_compact_layout_for(VN, VK, vb, &L);
        ref_layout r = ref_layout_for(VN, VK, vb);
        unsigned char *c = calloc(1, L.bytes);
        cr_assert_not_null(c);
        expect_accept(c, &L, "all zero: no pairs");
        set_word(c, 1, 0, 0);
        put_bit(c + r.upper, 0, 1); /* index 0, value +0.0 */
        expect_reject(c, &L, "a counted (0, +0.0) pair", "is padding");
        put_field(c + r.values, 0, vb, vb == 16 ? 0x8000u : 0x80000000u);
        expect_accept(c, &L, "(0, -0.0) is a real pair");

        dgc_compact_layout bad = L;
        bad.low_bits = L.low_bits + 1;
        expect_reject(c, &bad, "L + 1", "is not sound");
        bad = L;
        bad.low_bits = 33;
        expect_reject(c, &bad, "L 33", "is not sound");
        bad = L;
        bad.upper_bits = L.upper_bits - 1;
        expect_reject(c, &bad, "U - 1", "is not sound");
        bad = L;
        bad.bytes = L.bytes + 8;
        expect_reject(c, &bad, "bytes + 8", "is not sound");
        bad = L;
        bad.value_bits = 8;
        expect_reject(c, &bad, "value bits 8", "is not sound");
        free(c);
    }
}

/* Any one bit flipped in a sound payload is either rejected or gives a
 * plain payload whose encoding is the flipped bytes: one compact form per
 * plain payload. */
Test(compact_expand, every_single_bit_flip_is_rejected_or_canonical) {
    for (unsigned vb = 16; vb <= 32; vb += 16) {
        sample s = valid_sample(vb);
        char *plain = malloc(dgc_wire_bytes(VK));
        unsigned char *again = malloc(s.L.bytes);
        cr_assert(plain && again);
        char err[256];
        int rejected = 0;
        for (uint64_t bit = 32 * 8; bit < 8 * (uint64_t)s.L.bytes; bit++) {
            s.c[bit / 8] ^= (unsigned char)(1u << (bit % 8));
            const int rc = dgc_compact_expand(s.c, &s.L, 7, plain, err, sizeof err);
            others_agree(s.c, &s.L, rc, err, plain);
            if (rc == 0) {
                cr_assert_eq(dgc_compact_encode(plain, &s.L, again), 0, "bit %llu: expanded, not encodable",
                             (unsigned long long)bit);
                cr_assert(memcmp(again, s.c, s.L.bytes) == 0, "bit %llu: accepted but not canonical",
                          (unsigned long long)bit);
            } else {
                rejected++;
            }
            s.c[bit / 8] ^= (unsigned char)(1u << (bit % 8));
        }
        cr_log_info("vb %u: %d of %zu bit flips rejected", vb, rejected, 8 * (s.L.bytes - 32));
        cr_assert(rejected > 0);
        free(plain);
        free(again);
        free(s.c);
    }
}

/* ---- many pairs: the fast loops and the per-slot code behind them ----------
 *
 * The expander and the encoder take sound payloads through loops that only
 * flag what they do not handle (values in blocks of 256 slots, indices in
 * chunks of 256 pairs), and hand anything flagged to per-slot code that
 * names the first fault. These payloads are big enough for several blocks
 * and chunks, so that what the fast loops skip or flag sits in the middle
 * of one, and the message must still be exactly the per-slot code's. */

/* n 99990, k 2000: L 5 (10000 + 3124 bits beat L 6's 12000 + 1562), U 5124,
 * the largest high part (n - 1) >> 5 = 3124 with low 21 (n - 1 = 99989).
 * Pairs j: index 7 + 3j (several pairs share each high part); values
 * 0.25 * (1 + j % 8), largest 2.0: e 1. */
#define BN 99990
#define BK 2000

static uint32_t b_idx(uint64_t j) { return (uint32_t)(7 + 3 * j); }

static sample big_sample(unsigned vb) {
    sample s;
    dgc_compact_layout_for(BN, BK, vb, &s.L);
    s.r = ref_layout_for(BN, BK, vb);
    cr_assert(s.L.low_bits == 5 && s.L.upper_bits == 5124, "premise: L 5, U 5124, got L %u U %llu", s.L.low_bits,
              (unsigned long long)s.L.upper_bits);
    uint32_t *idx = malloc(BK * 4);
    float *val = malloc(BK * 4);
    cr_assert(idx && val);
    for (uint64_t j = 0; j < BK; j++) idx[j] = b_idx(j), val[j] = 0.25f * (float)(1 + j % 8);
    char *plain = plain_new(BN, BK, BK, idx, val);
    s.c = malloc(s.L.bytes);
    cr_assert_not_null(s.c);
    cr_assert_eq(dgc_compact_encode(plain, &s.L, s.c), 0);
    free(plain);
    free(idx);
    free(val);
    expect_accept(s.c, &s.L, "the big sample");
    return s;
}

/* Rejected, with exactly this message. */
static void expect_message(const unsigned char *compact, const dgc_compact_layout *L, const char *want) {
    char *plain = malloc(dgc_wire_bytes(L->k));
    char err[256] = "";
    cr_assert_not_null(plain);
    cr_assert_eq(dgc_compact_expand(compact, L, 7, plain, err, sizeof err), -1, "accepted; want: %s", want);
    cr_assert_str_eq(err, want);
    others_agree(compact, L, -1, err, NULL);
    free(plain);
}

/* Moves pair j's upper bit to where high part `high` puts it. */
static void move_pair(const sample *s, uint64_t j, uint64_t high) {
    unsigned char *up = s->c + s->r.upper;
    put_bit(up, (b_idx(j) >> 5) + j, 0);
    put_bit(up, high + j, 1);
}

Test(compact_expand, many_pairs_odd_values_in_the_middle_of_a_block) {
    /* Accepted: odd values in blocks 2 and 6 among common ones (e 0): zeros
     * of both signs (the fast loops take them), binary16 subnormals (2^-30 is
     * 0x0100 under e 0, 2^-38 the least, 1023 * 2^-38 the largest; the
     * per-slot code takes their blocks), and binary16's least normal. */
    static const float odd[] = {0.0f, -0.0f, 0x1p-30f, -0x1p-38f, 0x1.ff8p-29f, 0x1p-28f};
    for (unsigned vb = 16; vb <= 32; vb += 16) {
        for (size_t o = 0; o < sizeof odd / sizeof odd[0]; o++) {
            uint32_t *idx = malloc(BK * 4);
            float *val = malloc(BK * 4);
            cr_assert(idx && val);
            for (uint64_t j = 0; j < BK; j++) idx[j] = b_idx(j), val[j] = 1.0f + 0.125f * (float)(j % 8);
            val[700] = odd[o];
            val[1555] = -odd[o];
            round_values(val, BK, vb);
            cr_assert_eq(fbits(val[700]), fbits(odd[o]), "premise: %a is on the grid", (double)odd[o]);
            round_trip(BN, BK, vb, BK, idx, val);
            free(idx);
            free(val);
        }
    }
}

Test(compact_expand, many_pairs_the_first_bad_value_is_named) {
    sample s = big_sample(16);
    cr_assert_eq(get_field(s.c + s.r.values, 700 * 16, 16), ref_half_bits(0.25 * 5 * 0x1p13), "premise: e 1");
    set_value(&s, 700, 0x7c00u);
    expect_message(s.c, &s.L, "payload from rank 7: value slot 700 is binary16 Inf or NaN (0x7c00)");
    set_value(&s, 1900, 0xfe00u); /* a later one in another block */
    expect_message(s.c, &s.L, "payload from rank 7: value slot 700 is binary16 Inf or NaN (0x7c00)");
    set_value(&s, 300, 0xfc01u); /* an earlier one */
    expect_message(s.c, &s.L, "payload from rank 7: value slot 300 is binary16 Inf or NaN (0xfc01)");
    /* A value error comes before an index error (a duplicate at pair 1501). */
    put_field(s.c + s.r.low, 1501 * 5, 5, b_idx(1500) & 31);
    expect_message(s.c, &s.L, "payload from rank 7: value slot 300 is binary16 Inf or NaN (0xfc01)");
    free(s.c);

    /* Not exact in fp32: under e -120, binary16 field 23 is fp32's least
     * normal binade (-126), a fast value; field 1 is 2^-148 and field 0 (a
     * subnormal) 2^-158 at the least: a multiple of 2^-149 or not. */
    s = big_sample(16);
    set_word(s.c, BK, 0, -120);
    for (uint64_t j = 0; j < BK; j++) set_value(&s, j, j == 3 ? 0x7400u : 0x5c00u + (uint32_t)(j % 1024));
    expect_accept(s.c, &s.L, "e -120, values from 2^-126");
    set_value(&s, 1030, 0x0200u); /* 512 * 2^-158 = 2^-149 */
    set_value(&s, 1031, 0x8000u); /* -0.0 */
    expect_accept(s.c, &s.L, "2^-149 and -0.0 under e -120");
    set_value(&s, 1030, 0x0401u);
    expect_message(s.c, &s.L,
                   "payload from rank 7: value slot 1030 (binary16 0x0401 times 2^-134) is not exact in fp32");
    set_value(&s, 1030, 0x0000u);
    set_value(&s, 1999, 0x8001u);
    expect_message(s.c, &s.L,
                   "payload from rank 7: value slot 1999 (binary16 0x8001 times 2^-134) is not exact in fp32");
    free(s.c);

    s = big_sample(32);
    set_value(&s, 1234, 0x7fc00000u);
    expect_message(s.c, &s.L, "payload from rank 7: value slot 1234 is Inf or NaN (0x7fc00000)");
    set_value(&s, 256, 0xff800000u); /* the first slot of block 1 */
    expect_message(s.c, &s.L, "payload from rank 7: value slot 256 is Inf or NaN (0xff800000)");
    free(s.c);
}

Test(compact_expand, many_pairs_index_faults_past_the_first_chunk) {
    for (unsigned vb = 16; vb <= 32; vb += 16) {
        sample s = big_sample(vb);
        unsigned char *low = s.c + s.r.low, *up = s.c + s.r.upper;
        /* Pairs 1500 (4507) and 1501 (4510) share high part 140. */
        cr_assert(b_idx(1500) >> 5 == 140 && b_idx(1501) >> 5 == 140, "premise: a shared high part");
        put_field(low, 1501 * 5, 5, b_idx(1500) & 31);
        expect_message(s.c, &s.L,
                       "payload from rank 7: pair 1501 has index 4507, not above pair 1500's 4507 (a duplicate)");
        put_field(low, 1501 * 5, 5, (b_idx(1500) & 31) - 1);
        expect_message(s.c, &s.L, "payload from rank 7: pair 1501 has index 4506, not above pair 1500's 4507");
        put_field(low, 1501 * 5, 5, b_idx(1501) & 31);
        expect_accept(s.c, &s.L, "restored");

        /* The last pair at the largest high part, 3124, with low 22: index
         * 99990 = n, past the limit though its high part is not. */
        move_pair(&s, BK - 1, 3124);
        put_field(low, (BK - 1) * 5, 5, 22);
        expect_message(s.c, &s.L, "payload from rank 7: pair 1999 has index 99990, out of range for n 99990");
        put_field(low, (BK - 1) * 5, 5, 21);
        expect_accept(s.c, &s.L, "the last pair at n - 1");

        /* One more set bit, between pair 1998's (187 + 1998) and pair
         * 1999's (5123): pair 1999 moves to it (high part 3101, index 99253)
         * and the bit at 5123 is one too many. */
        put_bit(up, 5100, 1);
        expect_message(s.c, &s.L, "payload from rank 7: upper area bit 5123 is set after its 2000 pairs' bits");
        put_bit(up, 5100, 0);
        put_bit(up, 5124, 1); /* past U */
        expect_message(s.c, &s.L, "payload from rank 7: upper area bit 5124, past its 5124 bits, is not 0");
        put_bit(up, 5124, 0);
        expect_accept(s.c, &s.L, "restored");

        /* Pairs 1998 and 1999 gone but for one bit at U - 1: it is pair
         * 1998's, high part 5123 - 1998 = 3125, past the limit's 3124 (as
         * pair 1999's it would be within). */
        put_bit(up, (b_idx(BK - 2) >> 5) + BK - 2, 0);
        cr_assert(get_bit(up, 5123), "premise: pair 1999 at U - 1");
        expect_message(s.c, &s.L,
                       "payload from rank 7: pair 1998 has index at least 3125 * 2^5, out of range for n 99990");
        put_bit(up, 5123, 0);
        expect_message(s.c, &s.L, "payload from rank 7: upper area has 1998 set bits, fewer than its 2000 pairs");
        free(s.c);
    }
}

/* A fault at each pair in turn: wherever the blocks and chunks begin and
 * end, the message names the pair. */
Test(compact_expand, many_pairs_a_fault_at_every_pair) {
    char want[256];
    for (unsigned vb = 16; vb <= 32; vb += 16) {
        sample s = big_sample(vb);
        const uint32_t bad = vb == 16 ? 0x7c00u : 0x7f800000u;
        for (uint64_t j = 0; j < BK; j++) {
            const uint32_t was = (uint32_t)get_field(s.c + s.r.values, j * vb, vb);
            set_value(&s, j, bad);
            snprintf(want, sizeof want, "payload from rank 7: value slot %llu is %s (0x%0*x)", (unsigned long long)j,
                     vb == 16 ? "binary16 Inf or NaN" : "Inf or NaN", vb / 4, bad);
            expect_message(s.c, &s.L, want);
            set_value(&s, j, was);
        }
        unsigned char *low = s.c + s.r.low;
        int dups = 0;
        for (uint64_t j = 1; j < BK; j++) {
            if (b_idx(j) >> 5 != b_idx(j - 1) >> 5) continue; /* a low slot alone cannot undercut */
            put_field(low, j * 5, 5, b_idx(j - 1) & 31);
            snprintf(want, sizeof want,
                     "payload from rank 7: pair %llu has index %u, not above pair %llu's %u (a duplicate)",
                     (unsigned long long)j, b_idx(j - 1), (unsigned long long)(j - 1), b_idx(j - 1));
            expect_message(s.c, &s.L, want);
            put_field(low, j * 5, 5, b_idx(j) & 31);
            dups++;
        }
        cr_assert_gt(dups, BK * 8 / 10, "premise: most pairs share a high part with the one before");
        expect_accept(s.c, &s.L, "restored");
        free(s.c);
    }
}

/* More set bits than the count, as many as the area holds: nothing is
 * written past the plain payload, however few its slots. */
Test(compact_expand, a_full_upper_area_writes_nothing_past_the_plain_payload) {
    static const uint64_t nk[][2] = {{1000, 1}, {1000, 3}, {3, 3}, {100000, 40}, {600, 300}};
    for (size_t a = 0; a < sizeof nk / sizeof nk[0]; a++) {
        for (unsigned vb = 16; vb <= 32; vb += 16) {
            const uint64_t n = nk[a][0], k = nk[a][1];
            dgc_compact_layout L;
            dgc_compact_layout_for(n, k, vb, &L);
            ref_layout r = ref_layout_for(n, k, vb);
            unsigned char *c = calloc(1, L.bytes), *mem = malloc(dgc_wire_bytes(k) + 2 * GUARD);
            cr_assert(c && mem);
            set_word(c, k, 0, 0);
            for (uint64_t bit = 0; bit < L.upper_bits; bit++) put_bit(c + r.upper, bit, 1);
            if (vb == 16) /* values 1.0 under e 0, so that the indices are reached */
                for (uint64_t j = 0; j < k; j++) put_field(c + r.values, j * 16, 16, 0x7400u);
            memset(mem, GUARD_BYTE, dgc_wire_bytes(k) + 2 * GUARD);
            char err[256] = "";
            cr_assert_eq(dgc_compact_expand(c, &L, 7, mem + GUARD, err, sizeof err), -1, "n %llu k %llu: accepted",
                         (unsigned long long)n, (unsigned long long)k);
            others_agree(c, &L, -1, err, NULL);
            cr_log_info("n %llu k %llu vb %u, every upper bit set: %s", (unsigned long long)n, (unsigned long long)k,
                        vb, err);
            for (size_t i = 0; i < GUARD; i++) {
                cr_assert_eq(mem[i], GUARD_BYTE, "wrote before the plain payload");
                cr_assert_eq(mem[GUARD + dgc_wire_bytes(k) + i], GUARD_BYTE, "wrote past the plain payload");
            }
            free(c);
            free(mem);
        }
    }
}

Test(compact_encode, many_pairs_a_late_fault_is_refused) {
    dgc_compact_layout L16;
    dgc_compact_layout_for(BN, BK, 16, &L16);
    unsigned char *c = malloc(L16.bytes);
    uint32_t *idx = malloc(BK * 4);
    float *val = malloc(BK * 4);
    cr_assert(c && idx && val);
    static const struct {
        uint64_t j;
        float v;
        const char *what;
    } off[] = {
        {1500, 1.1f, "1.1: more than 11 significant bits"},
        {1500, 0x1.8p-38f, "1.5 * 2^-38 under 2.0: between two subnormal steps"},
        {255, 0x1p-40f, "2^-40, the last slot of block 0"},
        {1999, -0x1.001p0f, "-(1 + 2^-12), the last slot"},
    };
    for (size_t i = 0; i < sizeof off / sizeof off[0]; i++) {
        for (uint64_t j = 0; j < BK; j++) idx[j] = b_idx(j), val[j] = 0.25f * (float)(1 + j % 8);
        val[off[i].j] = off[i].v;
        char *plain = plain_new(BN, BK, BK, idx, val);
        cr_assert_eq(dgc_compact_encode(plain, &L16, c), -1, "%s: accepted", off[i].what);
        free(plain);
    }
    for (uint64_t j = 0; j < BK; j++) idx[j] = b_idx(j), val[j] = 0.25f * (float)(1 + j % 8);
    idx[1501] = idx[1500];
    char *plain = plain_new(BN, BK, BK, idx, val);
    cr_assert_eq(dgc_compact_encode(plain, &L16, c), -1, "a duplicate at pair 1501: accepted");
    free(plain);
    idx[1501] = b_idx(1501);
    idx[BK - 1] = BN;
    plain = plain_new(BN, BK, BK, idx, val);
    cr_assert_eq(dgc_compact_encode(plain, &L16, c), -1, "the last index n: accepted");
    free(plain);
    free(c);
    free(idx);
    free(val);
}

/* The byte budget at the sizes docs/payload.md quotes. */
Test(compact_ratio, sparsity_999_permille_of_669706_floats_is_over_a_thousandfold) {
    const uint64_t n = 669706, k = dgc_k_for(n, 0.001);
    dgc_compact_layout L;
    dgc_compact_layout_for(n, k, 16, &L);
    double ratio = 4.0 * (double)n / (double)L.bytes;
    printf("compact ratio: n %llu k %llu L %u U %llu: %zu bytes (plain %zu), 4n / bytes = %.1f\n",
           (unsigned long long)n, (unsigned long long)k, L.low_bits, (unsigned long long)L.upper_bits, L.bytes,
           dgc_wire_bytes(k), ratio);
    fflush(stdout);
    cr_assert(ratio >= 1100.0, "4n / bytes = %.1f, below 1100", ratio);
}

/* ---- the sum of gathered payloads, read in place (shim/wire/sum.c) ---------- */

/* nranks payloads of k slots over n (rank r holds k - r % 3 real pairs, so
 * counts differ), encoded into gathered (L.bytes apart) and expanded into
 * plain (dgc_wire_bytes(k) apart). */
static void gathered_pair(uint64_t n, uint64_t k, unsigned vb, int nranks, unsigned char **gathered, char **plain,
                          dgc_compact_layout *L) {
    dgc_compact_layout_for(n, k, vb, L);
    *gathered = calloc((size_t)nranks, L->bytes);
    *plain = calloc((size_t)nranks, dgc_wire_bytes(k));
    uint32_t *idx = malloc(k * sizeof *idx);
    float *val = malloc(k * sizeof *val);
    cr_assert(*gathered && *plain && idx && val);
    for (int r = 0; r < nranks; r++) {
        const uint64_t count = k > (uint64_t)(r % 3) ? k - (uint64_t)(r % 3) : k;
        random_set(n, count, vb, idx, val);
        char *p = plain_new(n, k, count, idx, val);
        cr_assert_eq(dgc_compact_encode(p, L, *gathered + (size_t)r * L->bytes), 0);
        memcpy(*plain + (size_t)r * dgc_wire_bytes(k), p, dgc_wire_bytes(k));
        free(p);
    }
    free(idx);
    free(val);
}

Test(compact_add, equals_expanding_then_adding_rank_by_rank) {
    /* n over several tiles and not a multiple of one; densities from a pair
     * every other element to one in two thousand; rank counts across the
     * eight walked at once. */
    static const uint64_t n = 100003;
    static const uint64_t ks[] = {50001, 25001, 6251, 1000, 50, 1};
    static const int ranks[] = {1, 3, 8, 9, 17};
    for (unsigned vb = 16; vb <= 32; vb += 16)
        for (size_t a = 0; a < sizeof ks / sizeof ks[0]; a++)
            for (size_t b = 0; b < sizeof ranks / sizeof ranks[0]; b++) {
                const uint64_t k = ks[a];
                const int R = ranks[b];
                dgc_compact_layout L;
                unsigned char *gathered;
                char *plain;
                gathered_pair(n, k, vb, R, &gathered, &plain, &L);
                float *got = malloc(n * sizeof *got), *want = malloc(n * sizeof *want);
                cr_assert(got && want);
                for (int s = 0; s < 2; s++) {
                    const float m = 0.9f; /* scale 1 (a sum), then -m (compensation) */
                    for (uint64_t i = 0; i < n; i++) got[i] = want[i] = (float)(i % 7) * 0.125f;
                    char err[256] = "";
                    cr_assert_eq(dgc_compact_add(gathered, L.bytes, R, &L, s ? -m : 1.0f, got, err, sizeof err), 0,
                                 "k %llu ranks %d vb %u: %s", (unsigned long long)k, R, vb, err);
                    if (s) dgc_wire_subtract(plain, R, k, m, want);
                    else
                        for (int r = 0; r < R; r++) dgc_wire_add_own(plain + (size_t)r * dgc_wire_bytes(k), k, want);
                    cr_assert(memcmp(got, want, n * sizeof *got) == 0, "k %llu ranks %d vb %u scale %s: sums differ",
                              (unsigned long long)k, R, vb, s ? "-m" : "1");
                }
                free(got);
                free(want);
                free(gathered);
                free(plain);
            }
}

/* Damages one compact payload: its last upper bit moved past the last
 * high part, which gives its last pair an index at or past n. */
static void push_last_index_past_n(unsigned char *compact, const dgc_compact_layout *L, const ref_layout *r) {
    unsigned char *up = compact + r->upper;
    uint64_t last = L->upper_bits;
    while (!get_bit(up, --last)) {}
    put_bit(up, last, 0);
    put_bit(up, L->upper_bits - 1, 1);
}

Test(compact_add, names_the_lowest_bad_rank_and_stays_inside_its_output) {
    static const uint64_t n = 70001, k = 17500;
    for (unsigned vb = 16; vb <= 32; vb += 16) {
        dgc_compact_layout L;
        unsigned char *gathered;
        char *plain;
        gathered_pair(n, k, vb, 11, &gathered, &plain, &L);
        ref_layout r = ref_layout_for(n, k, vb);
        /* Rank 9 (in the second group of eight): an index at or past n. Rank
         * 10: a NaN value. */
        push_last_index_past_n(gathered + 9 * L.bytes, &L, &r);
        put_field(gathered + 10 * L.bytes + r.values, 5 * vb, vb, vb == 16 ? 0x7e00u : 0x7fc00000u);
        float *mem = malloc((n + 2 * GUARD) * sizeof *mem);
        cr_assert_not_null(mem);
        for (uint64_t i = 0; i < n + 2 * GUARD; i++) mem[i] = i < GUARD || i >= GUARD + n ? NAN : 0.0f;
        char err[256] = "", want[256] = "";
        cr_assert_eq(dgc_compact_add(gathered, L.bytes, 11, &L, 1.0f, mem + GUARD, err, sizeof err), -1);
        char *one = malloc(dgc_wire_bytes(k));
        cr_assert_not_null(one);
        cr_assert_eq(dgc_compact_expand(gathered + 9 * L.bytes, &L, 9, one, want, sizeof want), -1);
        cr_assert_str_eq(err, want);
        cr_log_info("vb %u: %s", vb, err);
        for (uint64_t i = 0; i < GUARD; i++)
            cr_assert(isnan(mem[i]) && isnan(mem[GUARD + n + i]), "wrote outside its output");
        /* Rank 10 alone (from rank 9's place on): its own message. */
        cr_assert_eq(dgc_compact_add(gathered + 10 * L.bytes, L.bytes, 1, &L, 1.0f, mem + GUARD, err, sizeof err), -1);
        cr_assert_eq(dgc_compact_expand(gathered + 10 * L.bytes, &L, 0, one, want, sizeof want), -1);
        cr_assert_str_eq(err, want);
        free(one);
        free(mem);
        free(gathered);
        free(plain);
    }
}

/* One exchange's decode (the MPI path's): the headers, then every payload,
 * and only then a non-finite flag, the order of dgc_wire_decode and the CUDA
 * decode. A damaged payload is an error even beside a non-finite rank. */
Test(compact_decode, checks_every_payload_before_a_nonfinite_flag) {
    static const uint64_t n = 70001, k = 17500;
    for (unsigned vb = 16; vb <= 32; vb += 16) {
        dgc_compact_layout L;
        unsigned char *gathered;
        char *plain;
        gathered_pair(n, k, vb, 3, &gathered, &plain, &L);
        float *out = calloc(n, sizeof *out), *want = calloc(n, sizeof *want);
        cr_assert(out && want);
        char err[256] = "", want_err[256] = "";

        /* Sound: the sum, as dgc_compact_add makes it. */
        cr_assert_eq(dgc_compact_add(gathered, L.bytes, 3, &L, 1.0f, want, err, sizeof err), 0);
        cr_assert_eq(dgc_compact_decode(gathered, 3, 42, &L, out, err, sizeof err), DGC_DECODE_OK, "%s", err);
        cr_assert(memcmp(out, want, n * sizeof *out) == 0, "vb %u: the sum differs", vb);

        /* A wrong step: the header's fault, out zero again. */
        cr_assert_eq(dgc_compact_decode(gathered, 3, 41, &L, out, err, sizeof err), DGC_DECODE_BAD);
        cr_assert(strstr(err, "rank 0") && strstr(err, "step"), "vb %u: %s", vb, err);

        /* Rank 0 non-finite, as the engine sends it: the flag, no pairs. */
        char *p0 = plain_new(n, k, 0, NULL, NULL);
        dgc_wire_header h;
        memcpy(&h, p0, sizeof h);
        h.flags = DGC_WIRE_NONFINITE;
        memcpy(p0, &h, sizeof h);
        cr_assert_eq(dgc_compact_encode(p0, &L, gathered), 0);
        memset(out, 0, n * sizeof *out);
        cr_assert_eq(dgc_compact_decode(gathered, 3, 42, &L, out, err, sizeof err), DGC_DECODE_NONFINITE, "%s", err);
        for (uint64_t i = 0; i < n; i++) cr_assert(isnan(out[i]), "vb %u: element %llu is not NaN", vb,
                                                   (unsigned long long)i);

        /* Rank 2 damaged beside it (its last upper bit moved past the last
         * high part): the payload's fault, named as dgc_compact_check names
         * it, and out zero. */
        ref_layout r = ref_layout_for(n, k, vb);
        push_last_index_past_n(gathered + 2 * L.bytes, &L, &r);
        cr_assert_eq(dgc_compact_check(gathered + 2 * L.bytes, &L, 2, want_err, sizeof want_err), -1);
        memset(out, 0, n * sizeof *out);
        cr_assert_eq(dgc_compact_decode(gathered, 3, 42, &L, out, err, sizeof err), DGC_DECODE_BAD);
        cr_assert_str_eq(err, want_err);
        for (uint64_t i = 0; i < n; i++) cr_assert(out[i] == 0.0f, "vb %u: element %llu written", vb,
                                                   (unsigned long long)i);
        free(p0);
        free(out);
        free(want);
        free(gathered);
        free(plain);
    }
}
