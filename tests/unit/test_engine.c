/* Unit tests for the host DGC engine (shim/engine/host.c): the warm-up
 * schedule, k, and compress/commit/discard against a straightforward
 * reference implementation of one DGC step written here. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dgcshim/engine.h"
#include "dgcshim/policy.h"
#include "dgcshim/wire.h"
#include "dgcshim/wire_compact.h"

/* ---- helpers ----------------------------------------------------------------- */

static uint64_t rng_state;

static void rng_seed(uint64_t s) { rng_state = s * 0x9e3779b97f4a7c15ull + 12345; }

static uint64_t rng_next(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static double rng_unit(void) { return (double)(rng_next() >> 11) / 9007199254740992.0; }

/* Roughly normal, like a gradient: a sum of four uniforms, centred. */
static void fill_gradient(float *g, size_t n, float scale) {
    for (size_t i = 0; i < n; i++)
        g[i] = scale * (float)(rng_unit() + rng_unit() + rng_unit() + rng_unit() - 2.0);
}

static float *alloc_floats(size_t n) {
    float *p = calloc(n ? n : 1, sizeof *p);
    cr_assert_not_null(p);
    return p;
}

static void *alloc_payload(uint64_t k) {
    void *p = malloc(dgc_wire_bytes(k));
    cr_assert_not_null(p);
    memset(p, 0xcd, dgc_wire_bytes(k)); /* so unwritten slots show */
    return p;
}

static dgc_step_params plain_params(uint64_t step, uint64_t k, double sample_ratio) {
    dgc_step_params p = {
        .step = step,
        .k = k,
        .momentum = 0.0f,
        .nesterov = 0,
        .momentum_masking = 1,
        .clip_norm = 0.0,
        .nranks = 1,
        .sample_ratio = sample_ratio,
    };
    return p;
}

/* Checks the header, that the first nsel slots are in-range indices in
 * strictly increasing order (what the compact encoding needs) and the rest
 * padding (index 0, value +0.0f); marks sent indices in sent[]. */
static void check_payload_shape(void *payload, const dgc_step_params *p, uint64_t n, uint64_t nsel, uint32_t flags,
                                unsigned char *sent) {
    dgc_wire_header *h = dgc_wire_header_of(payload);
    cr_assert_eq(h->magic, DGC_WIRE_MAGIC, "magic 0x%08x", h->magic);
    cr_assert_eq(h->flags, flags, "flags 0x%x, want 0x%x", h->flags, flags);
    cr_assert_eq(h->step, p->step, "step %llu, want %llu", (unsigned long long)h->step, (unsigned long long)p->step);
    cr_assert_eq(h->n, n, "n %llu, want %llu", (unsigned long long)h->n, (unsigned long long)n);
    cr_assert_eq(h->k, p->k, "k %llu, want %llu", (unsigned long long)h->k, (unsigned long long)p->k);
    cr_assert(nsel <= p->k, "%llu selected, more than k=%llu", (unsigned long long)nsel, (unsigned long long)p->k);

    uint32_t *idx = dgc_wire_indices(payload);
    float *val = dgc_wire_values(payload, p->k);
    if (sent) memset(sent, 0, n);
    for (uint64_t j = 0; j < nsel; j++) {
        cr_assert(idx[j] < n, "slot %llu: index %u >= n", (unsigned long long)j, idx[j]);
        cr_assert(j == 0 || idx[j - 1] < idx[j], "slot %llu: index %u after %u", (unsigned long long)j, idx[j],
                  idx[j - 1]);
        if (sent) {
            cr_assert(!sent[idx[j]], "index %u sent twice", idx[j]);
            sent[idx[j]] = 1;
        }
    }
    static const float zero = 0.0f;
    for (uint64_t j = nsel; j < p->k; j++) {
        cr_assert_eq(idx[j], 0, "padding slot %llu has index %u", (unsigned long long)j, idx[j]);
        cr_assert(memcmp(&val[j], &zero, sizeof zero) == 0, "padding slot %llu has value %g", (unsigned long long)j,
                  val[j]);
    }
}

/* Every sent value is the updated v at its index, and no unsent |v| beats a
 * sent one. */
static void check_sent_are_largest(void *payload, uint64_t k, uint64_t nsel, const float *v_upd,
                                   const unsigned char *sent, uint64_t n) {
    uint32_t *idx = dgc_wire_indices(payload);
    float *val = dgc_wire_values(payload, k);
    float min_sent = INFINITY, max_unsent = 0.0f;
    for (uint64_t j = 0; j < nsel; j++) {
        cr_assert(val[j] == v_upd[idx[j]], "slot %llu sends %g for index %u, updated v is %g",
                  (unsigned long long)j, val[j], idx[j], v_upd[idx[j]]);
        cr_assert(val[j] != 0.0f, "slot %llu is real but sends 0", (unsigned long long)j);
        if (fabsf(val[j]) < min_sent) min_sent = fabsf(val[j]);
    }
    for (uint64_t i = 0; i < n; i++)
        if (!sent[i] && fabsf(v_upd[i]) > max_unsent) max_unsent = fabsf(v_upd[i]);
    if (nsel > 0)
        cr_assert(min_sent >= max_unsent, "sent |v| down to %g but an unsent |v| is %g", min_sent, max_unsent);
}

/* ---- the reference DGC step ---------------------------------------------------- */

/* State of the reference: u, v, and the update of the step in progress. */
typedef struct {
    size_t n;
    float *u, *v, *u_new, *v_new;
} ref_state;

static ref_state ref_create(size_t n) {
    ref_state r = {n, alloc_floats(n), alloc_floats(n), alloc_floats(n), alloc_floats(n)};
    return r;
}

static void ref_destroy(ref_state *r) {
    free(r->u);
    free(r->v);
    free(r->u_new);
    free(r->v_new);
}

/* u = m*u + g, v += u; Nesterov: u = m*(u + g), v += u + g. g already clipped. */
static void ref_update(ref_state *r, const float *g, float m, int nesterov) {
    for (size_t i = 0; i < r->n; i++) {
        float u = nesterov ? m * (r->u[i] + g[i]) : m * r->u[i] + g[i];
        float add = nesterov ? u + g[i] : u;
        r->u_new[i] = u;
        r->v_new[i] = r->v[i] + add;
    }
}

static void ref_commit(ref_state *r, const unsigned char *sent, int masking) {
    for (size_t i = 0; i < r->n; i++) {
        r->u[i] = sent[i] && masking ? 0.0f : r->u_new[i];
        r->v[i] = sent[i] ? 0.0f : r->v_new[i];
    }
}

typedef struct {
    float mag;
    uint32_t idx;
} mag_idx;

static int cmp_mag_desc(const void *x, const void *y) {
    const mag_idx *a = x, *b = y;
    return (a->mag < b->mag) - (a->mag > b->mag);
}

/* Exact top k of |v| by sorting; marks them in top[]. Asserts a clear gap
 * after the kth so that the set is unambiguous (a test premise). */
static void ref_top_k(const float *v, size_t n, size_t k, unsigned char *top) {
    mag_idx *m = malloc(n * sizeof *m);
    cr_assert_not_null(m);
    for (size_t i = 0; i < n; i++) m[i] = (mag_idx){fabsf(v[i]), (uint32_t)i};
    qsort(m, n, sizeof *m, cmp_mag_desc);
    if (k < n)
        cr_assert(m[k - 1].mag > m[k].mag * (1.0f + 1e-5f), "test premise: no near-tie at the kth (%g vs %g)",
                  m[k - 1].mag, m[k].mag);
    memset(top, 0, n);
    for (size_t j = 0; j < k; j++) top[m[j].idx] = 1;
    free(m);
}

static int close_to(float got, float want) {
    return fabsf(got - want) <= 1e-5f * fabsf(want) + 1e-6f;
}

/* ---- warm-up schedule and k ----------------------------------------------------- */

Test(density, warmup_stages_for_sparsity_0999) {
    /* Target 0.1%: stages 25%, 6.25%, 1.5625%, 0.390625% (the next, 0.098%,
     * would be below target), two steps each over 8 warm-up steps. */
    static const double want[8] = {0.25, 0.25, 0.0625, 0.0625, 0.015625, 0.015625, 0.00390625, 0.00390625};
    for (uint64_t s = 0; s < 8; s++) {
        double d = dgc_density_at(0.999, 8, s);
        cr_assert(d == want[s], "step %llu: density %.10g, want %.10g", (unsigned long long)s, d, want[s]);
    }
    const double target = 1.0 - 0.999;
    static const uint64_t after[] = {8, 9, 100, 1000000000000ull};
    for (size_t i = 0; i < 4; i++)
        cr_assert(fabs(dgc_density_at(0.999, 8, after[i]) - target) < 1e-12, "step %llu after warm-up: %.10g",
                  (unsigned long long)after[i], dgc_density_at(0.999, 8, after[i]));
}

/* The stages of the DGC paper down to (not below) target, computed here. */
static int ref_stages(double target, double *out) {
    int s = 0;
    for (double d = 0.25; d > target && s < 64; d /= 4.0) out[s++] = d;
    return s;
}

Test(density, stages_spread_evenly_and_never_below_target) {
    static const double sparsities[] = {0.999, 0.99, 0.995, 0.9, 0.8, 0.9999};
    static const uint64_t warmups[] = {1, 3, 4, 10, 17, 1000};
    for (size_t a = 0; a < sizeof sparsities / sizeof sparsities[0]; a++) {
        double target = 1.0 - sparsities[a];
        double stages[64];
        int ns = ref_stages(target, stages);
        for (size_t b = 0; b < sizeof warmups / sizeof warmups[0]; b++) {
            uint64_t w = warmups[b];
            uint64_t count[64] = {0};
            double prev = 1.0;
            for (uint64_t s = 0; s < w; s++) {
                double d = dgc_density_at(sparsities[a], w, s);
                cr_assert(d >= target, "sparsity %g warmup %llu step %llu: %g below target %g", sparsities[a],
                          (unsigned long long)w, (unsigned long long)s, d, target);
                cr_assert(d <= prev, "sparsity %g warmup %llu step %llu: density rose to %g", sparsities[a],
                          (unsigned long long)w, (unsigned long long)s, d);
                prev = d;
                int st = -1;
                for (int i = 0; i < ns; i++)
                    if (d == stages[i]) st = i;
                cr_assert(st >= 0, "sparsity %g warmup %llu step %llu: %g is not a warm-up stage", sparsities[a],
                          (unsigned long long)w, (unsigned long long)s, d);
                count[st]++;
            }
            cr_assert(dgc_density_at(sparsities[a], w, 0) == 0.25, "warm-up starts at 25%%");
            if (w >= (uint64_t)ns) {
                /* Every stage used, stage lengths differ by at most one. */
                uint64_t lo = UINT64_MAX, hi = 0;
                for (int i = 0; i < ns; i++) {
                    lo = count[i] < lo ? count[i] : lo;
                    hi = count[i] > hi ? count[i] : hi;
                }
                cr_assert(lo >= 1 && hi - lo <= 1, "sparsity %g warmup %llu: stage lengths %llu..%llu",
                          sparsities[a], (unsigned long long)w, (unsigned long long)lo, (unsigned long long)hi);
            }
            cr_assert(fabs(dgc_density_at(sparsities[a], w, w) - target) < 1e-12, "target from step warmup_steps on");
        }
    }
}

Test(density, no_stages_when_target_is_a_quarter_or_more) {
    static const double sparsities[] = {0.75, 0.5, 0.0, 0.7};
    for (size_t a = 0; a < 4; a++)
        for (uint64_t s = 0; s < 12; s++) {
            double d = dgc_density_at(sparsities[a], 10, s);
            cr_assert(fabs(d - (1.0 - sparsities[a])) < 1e-12, "sparsity %g step %llu: %g, want the target",
                      sparsities[a], (unsigned long long)s, d);
        }
}

Test(density, no_warmup_means_target_from_step_0) {
    static const uint64_t steps[] = {0, 1, 2, 1000};
    for (size_t i = 0; i < 4; i++) {
        cr_assert(fabs(dgc_density_at(0.999, 0, steps[i]) - 0.001) < 1e-12);
        cr_assert(fabs(dgc_density_at(0.9, 0, steps[i]) - 0.1) < 1e-12);
    }
}

Test(k_for, ceil_of_density_times_n_in_integers) {
    /* Densities that are exact binary fractions, so ceil(n * a / 2^b) can be
     * computed in integers: (n*a + 2^b - 1) >> b, then clamped to [1, n]. */
    static const struct {
        uint64_t a;
        int b;
    } dens[] = {{1, 2}, {1, 4}, {3, 8}, {1, 10}, {1, 20}, {5, 12}, {1, 0}};
    static const uint64_t ns[] = {1, 2, 3, 7, 100, 1000, 16384, 1000003, 4294967295ull};
    for (size_t a = 0; a < sizeof dens / sizeof dens[0]; a++)
        for (size_t b = 0; b < sizeof ns / sizeof ns[0]; b++) {
            uint64_t n = ns[b];
            double density = (double)dens[a].a / (double)(1ull << dens[a].b);
            uint64_t want = (n * dens[a].a + (1ull << dens[a].b) - 1) >> dens[a].b;
            if (want < 1) want = 1;
            if (want > n) want = n;
            uint64_t got = dgc_k_for(n, density);
            cr_assert_eq(got, want, "n=%llu density=%g: k=%llu, want %llu", (unsigned long long)n, density,
                         (unsigned long long)got, (unsigned long long)want);
        }
}

Test(k_for, at_least_one_and_at_most_n) {
    static const uint64_t ns[] = {1, 2, 10, 16384, 4294967295ull};
    for (size_t i = 0; i < 5; i++) {
        cr_assert_eq(dgc_k_for(ns[i], 1e-15), 1, "tiny density still sends one");
        cr_assert_eq(dgc_k_for(ns[i], 0.0), 1, "zero density still sends one");
        cr_assert_eq(dgc_k_for(ns[i], 1.0), ns[i]);
        cr_assert_eq(dgc_k_for(ns[i], 3.0), ns[i], "k is clamped to n");
    }
}

Test(k_for, sparsity_0999_keeps_one_in_a_thousand) {
    /* DGC_SPARSITY=0.999 means 0.1% of the elements; 1 - 0.999 in double is
     * 0.0010000000000000009, and ceil() must not turn that rounding error
     * into an extra slot (1001 instead of 1000 for a million elements). */
    static const uint64_t ns[] = {1000, 16384000, 1000000, 25000000};
    for (size_t i = 0; i < 4; i++) {
        uint64_t got = dgc_k_for(ns[i], dgc_density_at(0.999, 0, 0));
        cr_assert_eq(got, ns[i] / 1000, "n=%llu: k=%llu, want %llu", (unsigned long long)ns[i],
                     (unsigned long long)got, (unsigned long long)(ns[i] / 1000));
    }
}

/* ---- compress / commit --------------------------------------------------------- */

Test(engine_state, sizes_and_arrays) {
    dgc_state *s = dgc_state_create(1000, 0);
    cr_assert_not_null(s);
    cr_assert_eq(dgc_state_size(s), 1000);
    cr_assert_null(dgc_state_momentum(s), "no momentum array without momentum");
    for (int i = 0; i < 1000; i++) cr_assert(dgc_state_residual(s)[i] == 0.0f, "fresh residual is zero");
    dgc_state_destroy(s);
    s = dgc_state_create(1000, 1);
    cr_assert_not_null(s);
    cr_assert_not_null(dgc_state_momentum(s));
    for (int i = 0; i < 1000; i++) cr_assert(dgc_state_momentum(s)[i] == 0.0f, "fresh momentum is zero");
    dgc_state_destroy(s);
    dgc_state_destroy(NULL);
}

/* Several plain error-feedback steps checked against the reference: payload
 * shape, at most k sent, the sent ones the largest, v committed right. */
static void run_selection_steps(size_t n, uint64_t k, double ratio, int steps, uint64_t seed) {
    rng_seed(seed);
    dgc_state *s = dgc_state_create(n, 0);
    cr_assert_not_null(s);
    ref_state r = ref_create(n);
    float *g = alloc_floats(n), *before = alloc_floats(n);
    unsigned char *sent = malloc(n);
    void *payload = alloc_payload(k);
    cr_assert_not_null(sent);
    for (int step = 0; step < steps; step++) {
        fill_gradient(g, n, 1.0f);
        dgc_step_params p = plain_params((uint64_t)step, k, ratio);
        memcpy(before, dgc_state_residual(s), n * sizeof *before);
        cr_assert_eq(dgc_compress(s, g, &p, payload), 0);
        cr_assert(memcmp(before, dgc_state_residual(s), n * sizeof *before) == 0,
                  "dgc_compress changed the committed residual");
        uint64_t nsel = dgc_last_selected(s);
        check_payload_shape(payload, &p, n, nsel, 0, sent);
        ref_update(&r, g, 0.0f, 0);
        check_sent_are_largest(payload, k, nsel, r.v_new, sent, n);
        cr_assert(nsel > 0, "n=%zu k=%llu ratio %g step %d: nothing sent", n, (unsigned long long)k, ratio, step);
        if (ratio == 1.0) /* exact threshold, all values nonzero: a full payload */
            cr_assert_eq(nsel, k, "ratio 1 step %d: %llu sent, want k=%llu", step, (unsigned long long)nsel,
                         (unsigned long long)k);
        dgc_commit(s, &p);
        ref_commit(&r, sent, 1);
        const float *v = dgc_state_residual(s);
        for (size_t i = 0; i < n; i++)
            cr_assert(v[i] == r.v[i], "step %d: residual[%zu]=%g, reference %g", step, i, v[i], r.v[i]);
    }
    free(payload);
    free(sent);
    free(before);
    free(g);
    ref_destroy(&r);
    dgc_state_destroy(s);
}

Test(engine_select, exact_threshold_sends_exactly_the_top_k) {
    run_selection_steps(20011, 21, 1.0, 5, 1);
    run_selection_steps(1000, 250, 1.0, 4, 2);
    run_selection_steps(300, 1, 1.0, 3, 3);
    run_selection_steps(7, 2, 1.0, 3, 7); /* smaller than any internal block */
    run_selection_steps(1, 1, 1.0, 2, 8);
}

Test(engine_select, sampled_threshold_sends_at_most_k_of_the_largest) {
    run_selection_steps(100003, 101, 0.01, 4, 4);
    run_selection_steps(20011, 21, 0.01, 5, 5);
    run_selection_steps(5000, 1250, 0.01, 4, 6);
    run_selection_steps(7, 2, 0.01, 3, 9);
}

/* The sample aims past k by a margin that shrinks, relative to k, as the
 * expected hits grow: twice k while hits are few (the threshold rests on a
 * handful of samples), a few percent more than k at warm-up densities. */
Test(engine_select, sample_plan_oversamples_by_a_margin) {
    dgc_sample_plan sp;
    dgc_sample_plan_for(1000000, 1000, 0.01, &sp); /* 16000 sampled (the floor of 16 expected hits) */
    cr_assert_eq(sp.want, 32, "16 expected hits: want %llu, twice them", (unsigned long long)sp.want);
    dgc_sample_plan_for(8388608, 2097152, 0.01, &sp); /* 25%: about 21000 hits expected */
    const double hits = ceil(2097152.0 * (double)sp.count / 8388608.0);
    cr_assert(sp.want > hits * 1.05 && sp.want < hits * 1.15, "25%%: want %llu for %.0f expected hits",
              (unsigned long long)sp.want, hits);
    dgc_sample_plan_for(1000, 250, 1.0, &sp); /* the whole buffer: the exact k-th */
    cr_assert(sp.whole && sp.want == 250);
}

/* That margin still fills the payload at warm-up densities, on gradients
 * with structure: layers of very different scales, a ramp, plain noise. */
Test(engine_select, sampled_threshold_fills_the_payload_at_warm_up_densities) {
    const size_t n = (size_t)1 << 20;
    static const double densities[] = {0.25, 0.0625, 0.015625};
    float *g = alloc_floats(n);
    for (int shape = 0; shape < 3; shape++) {
        for (int d = 0; d < 3; d++) {
            const uint64_t k = dgc_k_for(n, densities[d]);
            rng_seed(40 + (uint64_t)(shape * 3 + d));
            dgc_state *s = dgc_state_create(n, 0);
            void *payload = alloc_payload(k);
            cr_assert_not_null(s);
            for (uint64_t step = 0; step < 3; step++) {
                fill_gradient(g, n, 1.0f);
                for (size_t i = 0; i < n; i++) {
                    if (shape == 1) g[i] *= powf(10.0f, -(float)(i / (n / 8))); /* 8 layers, 1 to 1e-7 */
                    if (shape == 2) g[i] *= (float)i / (float)n;                 /* a ramp */
                }
                dgc_step_params p = plain_params(step, k, 0.01);
                cr_assert_eq(dgc_compress(s, g, &p, payload), 0);
                cr_assert_eq(dgc_last_selected(s), k, "shape %d density %g step %llu: %llu sent, want k = %llu", shape,
                             densities[d], (unsigned long long)step, (unsigned long long)dgc_last_selected(s),
                             (unsigned long long)k);
                dgc_commit(s, &p);
            }
            free(payload);
            dgc_state_destroy(s);
        }
    }
    free(g);
}

Test(engine_select, ties_still_give_exactly_k_with_exact_threshold) {
    /* All |g| equal: every element ties at the threshold. With more elements
     * than the candidate buffer holds this exercises the exact fallback. */
    static const size_t ns[] = {1000, 10000};
    for (size_t t = 0; t < 2; t++) {
        size_t n = ns[t];
        uint64_t k = 10;
        dgc_state *s = dgc_state_create(n, 0);
        float *g = alloc_floats(n);
        unsigned char *sent = malloc(n);
        void *payload = alloc_payload(k);
        cr_assert(s && sent);
        for (size_t i = 0; i < n; i++) g[i] = i % 2 ? 0.5f : -0.5f;
        dgc_step_params p = plain_params(0, k, 1.0);
        cr_assert_eq(dgc_compress(s, g, &p, payload), 0);
        cr_assert_eq(dgc_last_selected(s), k, "n=%zu: %llu sent, want %llu", n,
                     (unsigned long long)dgc_last_selected(s), (unsigned long long)k);
        check_payload_shape(payload, &p, n, k, 0, sent);
        check_sent_are_largest(payload, k, k, g, sent, n);
        /* Sampled: still at most k, all real ones of the tied magnitude. */
        p.sample_ratio = 0.01;
        cr_assert_eq(dgc_compress(s, g, &p, payload), 0);
        check_payload_shape(payload, &p, n, dgc_last_selected(s), 0, sent);
        check_sent_are_largest(payload, k, dgc_last_selected(s), g, sent, n);
        free(payload);
        free(sent);
        free(g);
        dgc_state_destroy(s);
    }
}

/* Ties at the k-th value when the candidates overflow their room (the exact
 * fallback over the whole buffer), with a larger value after them: the
 * ties go in index order with it, and the payload encodes compactly. Found
 * by MPICH's allreduce tests run under the shim: all 1.0 but the last 2.0,
 * and the encoder refused the unsorted pairs. */
Test(engine_select, overflowing_ties_stay_in_index_order) {
    const size_t n = 20000;
    const uint64_t k = 20; /* room max(8k, 4096): every element is a candidate */
    dgc_state *s = dgc_state_create(n, 0);
    float *g = alloc_floats(n);
    unsigned char *sent = malloc(n);
    void *payload = alloc_payload(k);
    cr_assert(s && sent);
    for (size_t i = 0; i < n; i++) g[i] = 1.0f;
    g[n - 1] = 2.0f;
    for (double ratio = 1.0; ratio >= 0.01; ratio /= 100) {
        dgc_step_params p = plain_params(0, k, ratio);
        p.value_bits = 16;
        cr_assert_eq(dgc_compress(s, g, &p, payload), 0);
        cr_assert_eq(dgc_last_selected(s), k);
        check_payload_shape(payload, &p, n, k, 0, sent);
        check_sent_are_largest(payload, k, k, g, sent, n);
        cr_assert(sent[n - 1], "the largest value was not sent");
        for (size_t i = 0; i + 1 < k; i++) cr_assert(sent[i], "tie at %zu not taken first", i);
        dgc_compact_layout L;
        dgc_compact_layout_for(n, k, 16, &L);
        unsigned char *compact = malloc(L.bytes);
        cr_assert_eq(dgc_compact_encode(payload, &L, compact), 0, "ratio %g: the payload does not encode", ratio);
        free(compact);
        dgc_discard(s);
    }
    free(payload);
    free(sent);
    free(g);
    dgc_state_destroy(s);
}

/* DGC_MAX_STATE_MB is checked against dgc_state_footprint before a state
 * exists: what the state then holds must stay within it, through the exact
 * fallback (ties past the candidate room; found by a tester: its n-float
 * copy took a 2 MB budget to 2.7 MB), a whole-buffer sample (ratio 1) and
 * the warm-up's larger k first. */
Test(engine_state, footprint_bounds_what_the_state_holds) {
    const size_t n = 200000;
    static const double ratios[] = {1.0, 0.01};
    static const uint64_t ks[] = {50000, 200}; /* the warm-up's first k, then the target's */
    float *g = alloc_floats(n);
    void *payload = alloc_payload(ks[0]);
    for (int momentum = 0; momentum <= 1; momentum++)
        for (size_t r = 0; r < 2; r++)
            for (int tied = 0; tied <= 1; tied++) {
                dgc_state *s = dgc_state_create(n, momentum);
                cr_assert(s);
                const size_t bound = dgc_state_footprint(n, momentum, ks[0], ratios[r]);
                for (uint64_t step = 0; step < 4; step++) {
                    for (size_t i = 0; i < n; i++) g[i] = tied ? (float)(i % 7) : (float)((i * 2654435761u) % 1000) - 500.0f;
                    const uint64_t k = ks[step >= 2];
                    dgc_step_params p = plain_params(step, k, ratios[r]);
                    p.momentum = momentum ? 0.9f : 0.0f;
                    cr_assert_eq(dgc_compress(s, g, &p, payload), 0);
                    dgc_commit(s, &p);
                    cr_assert_leq(dgc_state_bytes(s), bound,
                                  "momentum %d ratio %g tied %d step %llu: holds %zu bytes, footprint %zu", momentum,
                                  ratios[r], tied, (unsigned long long)step, dgc_state_bytes(s), bound);
                }
                dgc_state_destroy(s);
            }
    free(payload);
    free(g);
}

Test(engine_select, fewer_nonzeros_than_k_sends_just_those_and_pads) {
    const size_t n = 1000;
    const uint64_t k = 10;
    static const uint32_t nz[] = {5, 700, 999};
    static const double ratios[] = {1.0, 0.01};
    for (int t = 0; t < 2; t++) {
        dgc_state *s = dgc_state_create(n, 0);
        float *g = alloc_floats(n);
        unsigned char *sent = malloc(n);
        void *payload = alloc_payload(k);
        cr_assert(s && sent);
        g[nz[0]] = 1.5f;
        g[nz[1]] = -2.0f;
        g[nz[2]] = 0.25f;
        dgc_step_params p = plain_params(7, k, ratios[t]);
        cr_assert_eq(dgc_compress(s, g, &p, payload), 0);
        uint64_t nsel = dgc_last_selected(s);
        check_payload_shape(payload, &p, n, nsel, 0, sent); /* header and (0, 0.0f) padding */
        check_sent_are_largest(payload, k, nsel, g, sent, n);
        if (ratios[t] == 1.0)
            cr_assert_eq(nsel, 3, "three nonzeros, exact threshold: %llu sent", (unsigned long long)nsel);
        for (size_t i = 0; i < n; i++)
            if (sent[i]) cr_assert(g[i] != 0.0f, "a zero element (%zu) was sent", i);
        free(payload);
        free(sent);
        free(g);
        dgc_state_destroy(s);
    }
}

Test(engine_select, zero_gradient_sends_nothing) {
    const size_t n = 512;
    const uint64_t k = 8;
    dgc_state *s = dgc_state_create(n, 1);
    float *g = alloc_floats(n);
    void *payload = alloc_payload(k);
    dgc_step_params p = plain_params(0, k, 1.0);
    p.clip_norm = 1.0; /* ||g|| = 0 must not divide by zero */
    p.nranks = 4;
    p.momentum = 0.9f;
    cr_assert_eq(dgc_compress(s, g, &p, payload), 0);
    cr_assert_eq(dgc_last_selected(s), 0);
    check_payload_shape(payload, &p, n, 0, 0, NULL);
    dgc_commit(s, &p);
    for (size_t i = 0; i < n; i++) cr_assert(dgc_state_residual(s)[i] == 0.0f && dgc_state_momentum(s)[i] == 0.0f);
    free(payload);
    free(g);
    dgc_state_destroy(s);
}

/* DGC_VALUE_BITS=16: the payload's values are rounded with one scale for
 * the payload (that of the selected values), the payload encodes, and what
 * rounding lost stays in the residual exactly. 64 non-zeros over 48
 * binades, so that the smallest fall under the scale's subnormal range. */
Test(engine_values, sixteen_bits_one_scale_per_payload_rounding_kept_in_the_residual) {
    const size_t n = 4096;
    const uint64_t k = 64;
    dgc_state *s = dgc_state_create(n, 0);
    float *g = alloc_floats(n);
    void *payload = alloc_payload(k);
    cr_assert_not_null(s);
    rng_seed(16);
    float sel[64];
    for (uint64_t j = 0; j < k; j++) {
        size_t i = 17 + 61 * j;
        g[i] = ldexpf(1.0f + (float)rng_unit(), 3 - (int)(j % 48)) * (j % 3 ? 1.0f : -1.0f);
        sel[j] = g[i];
    }
    dgc_step_params p = plain_params(0, k, 1.0);
    p.value_bits = 16;
    cr_assert_eq(dgc_compress(s, g, &p, payload), 0);
    cr_assert_eq(dgc_last_selected(s), k);
    const int e = dgc_compact_scale16(sel, k);
    cr_assert(e == 3 || e == 4, "scale %d", e);
    const uint32_t *idx = dgc_wire_indices(payload);
    const float *val = dgc_wire_values(payload, k);
    int zeros = 0;
    for (uint64_t j = 0; j < k; j++) {
        float want = dgc_compact_value(g[idx[j]], 16, e);
        cr_assert(memcmp(&val[j], &want, 4) == 0, "slot %llu: %a, want %a", (unsigned long long)j, (double)val[j],
                  (double)want);
        zeros += val[j] == 0;
    }
    cr_assert(zeros > 0, "premise: some values fall under 2^(e-38) and are sent as 0");
    dgc_compact_layout L;
    dgc_compact_layout_for(n, k, 16, &L);
    unsigned char *compact = malloc(L.bytes);
    cr_assert_eq(dgc_compact_encode(payload, &L, compact), 0, "the engine's 16-bit payload does not encode");
    dgc_commit(s, &p);
    const float *v = dgc_state_residual(s);
    for (uint64_t j = 0; j < k; j++) {
        uint32_t i = idx[j];
        cr_assert(v[i] == g[i] - val[j] && (double)v[i] + (double)val[j] == (double)g[i],
                  "index %u: residual %a + sent %a != %a", i, (double)v[i], (double)val[j], (double)g[i]);
    }
    free(compact);
    free(payload);
    free(g);
    dgc_state_destroy(s);
}

/* A dense sum in a 16-bit type (the NCCL path's fp16 and bf16 buffers):
 * each value is rounded to the type instead (DGC_VALUE_BITS aside), onto
 * its grid, within half its quantum (or clamped to its largest finite),
 * and the residual keeps the rest: residual + sent == the value. */
static void run_sum_type(unsigned type, int digits, int min_exp, int nranks, float max) {
    const size_t n = 4096;
    const uint64_t k = 64;
    dgc_state *s = dgc_state_create(n, 0);
    float *g = alloc_floats(n);
    void *payload = alloc_payload(k);
    cr_assert_not_null(s);
    rng_seed(17 + type);
    for (uint64_t j = 0; j < k; j++) /* 2^20 down to 2^-27: past both ends of binary16 */
        g[17 + 61 * j] = ldexpf(1.0f + (float)rng_unit(), 20 - (int)(j % 48)) * (j % 3 ? 1.0f : -1.0f);
    dgc_step_params p = plain_params(0, k, 1.0);
    p.value_bits = 16; /* ignored for the values: the sum's type rounds them */
    p.sum_type = type;
    p.nranks = nranks; /* the fp16 limit falls with the ranks: their sum must not overflow */
    cr_assert_eq(dgc_compress(s, g, &p, payload), 0);
    cr_assert_eq(dgc_last_selected(s), k);
    const uint32_t *idx = dgc_wire_indices(payload);
    const float *val = dgc_wire_values(payload, k);
    int clamped = 0, tiny = 0;
    for (uint64_t j = 0; j < k; j++) {
        const float x = g[idx[j]], y = val[j];
        if (fabsf(x) >= max) {
            cr_assert(y == copysignf(max, x), "slot %llu: %a clamped to %a", (unsigned long long)j, (double)x,
                      (double)y);
            clamped++;
            continue;
        }
        int e;
        frexpf(fabsf(x), &e);
        const int binade = e - 1 < min_exp ? min_exp : e - 1;
        const double q = ldexp(1.0, binade - (digits - 1));
        tiny += binade == min_exp;
        cr_assert(fabs((double)y / q - nearbyint((double)y / q)) == 0 && fabs((double)x - (double)y) <= q / 2,
                  "slot %llu: %a sent as %a, off the grid of quantum %a", (unsigned long long)j, (double)x, (double)y,
                  q);
    }
    cr_assert(type != DGC_SUM_F16 || (clamped > 0 && tiny > 0), "premise: values past both ends of binary16");
    dgc_commit(s, &p);
    const float *v = dgc_state_residual(s);
    for (uint64_t j = 0; j < k; j++) {
        const uint32_t i = idx[j];
        cr_assert(v[i] == g[i] - val[j] && (double)v[i] + (double)val[j] == (double)g[i],
                  "index %u: residual %a + sent %a != %a", i, (double)v[i], (double)val[j], (double)g[i]);
    }
    free(payload);
    free(g);
    dgc_state_destroy(s);
}

Test(engine_values, fp16_sum_rounds_to_binary16_clamped_rest_in_the_residual) {
    run_sum_type(DGC_SUM_F16, 11, -14, 1, 65504.0f);
    run_sum_type(DGC_SUM_F16, 11, -14, 3, 21808.0f); /* 65504 * 2046 / 6144, down to the grid */
}

Test(engine_values, bf16_sum_rounds_to_bfloat16_rest_in_the_residual) {
    run_sum_type(DGC_SUM_BF16, 8, -126, 4, 0x1.fep127f);
}

/* An fp16 buffer on the sparse transport (the NCCL path): the ranks' fp32
 * sum goes back into fp16, so each value is clamped to the limit of the
 * rank count (21808 at three) before its rounding for the wire, the 16-bit
 * wire's scale is that of the clamped values, and the excess stays in the
 * residual; three ranks' sum of the largest values then stays finite. */
static void run_sparse_clamp(unsigned value_bits) {
    const size_t n = 4096;
    const uint64_t k = 64;
    const int R = 3;
    const float limit = 21808.0f;
    float *g = alloc_floats(n);
    for (uint64_t j = 0; j < k; j++) /* 2^22 down to 2^-9, both signs: the top 16 past the limit */
        g[5 + 63 * j] = ldexpf(1.0f + (float)j / 64.0f, 22 - (int)(j / 2)) * (j % 2 ? -1.0f : 1.0f);
    dgc_step_params p = plain_params(0, k, 1.0);
    p.value_bits = value_bits;
    p.clamp_bits = 0x46aa6000u; /* 21808, the fp16 limit at three ranks */
    p.nranks = R;
    void *gathered = calloc((size_t)R, dgc_wire_bytes(k));
    cr_assert_not_null(gathered);
    float xc[64];
    for (int r = 0; r < R; r++) {
        dgc_state *s = dgc_state_create(n, 0);
        cr_assert_not_null(s);
        char *pl = (char *)gathered + (size_t)r * dgc_wire_bytes(k);
        cr_assert_eq(dgc_compress(s, g, &p, pl), 0);
        cr_assert_eq(dgc_last_selected(s), k);
        const uint32_t *idx = dgc_wire_indices(pl);
        const float *val = dgc_wire_values(pl, k);
        for (uint64_t j = 0; j < k; j++) {
            const float x = g[idx[j]];
            xc[j] = fabsf(x) > limit ? copysignf(limit, x) : x;
        }
        const int e = value_bits == 16 ? dgc_compact_scale16(xc, k) : 0;
        cr_assert(value_bits != 16 || e != dgc_compact_scale16(&g[5], 1), "premise: the clamp changes the scale");
        int clamped = 0;
        for (uint64_t j = 0; j < k; j++) {
            const float want = dgc_compact_value(xc[j], value_bits, e);
            cr_assert(val[j] == want, "rank %d slot %llu: %a sent as %a, want %a", r, (unsigned long long)j,
                      (double)g[idx[j]], (double)val[j], (double)want);
            clamped += fabsf(val[j]) == limit;
        }
        cr_assert_eq(clamped, 16);
        dgc_commit(s, &p);
        const float *v = dgc_state_residual(s);
        for (uint64_t j = 0; j < k; j++) {
            const uint32_t i = idx[j];
            cr_assert((double)v[i] + (double)val[j] == (double)g[i], "index %u: residual %a + sent %a != %a", i,
                      (double)v[i], (double)val[j], (double)g[i]);
        }
        dgc_state_destroy(s);
    }
    float *out = alloc_floats(n);
    char err[200] = "";
    cr_assert_eq(dgc_wire_decode(gathered, R, 0, n, k, out, err, sizeof err), DGC_DECODE_OK, "%s", err);
    for (size_t i = 0; i < n; i++)
        cr_assert(fabsf(out[i]) < 65520.0f, "out[%zu] = %a rounds to fp16 Inf", i, (double)out[i]);
    cr_assert(fabsf(out[5]) == 3 * limit);
    free(out);
    free(gathered);
    free(g);
}

Test(engine_values, fp16_buffer_on_the_sparse_transport_is_clamped_rest_in_the_residual) {
    run_sparse_clamp(32);
    run_sparse_clamp(16);
}

/* The largest |S_t - m S_{t-1}| over steps of an fp16 buffer on two ranks
 * with momentum 0.9 and compensation, the sparse transport as the NCCL
 * path runs it (host engine, fp32 sum, subtraction of the kept payloads),
 * each value clamped to limit: gradients of 40000 at 32 places on both
 * ranks, changing sign every step. */
static float worst_compensated_output(uint32_t limit) {
    const size_t n = 4096;
    const uint64_t k = 64;
    const int R = 2;
    const float m = 0.9f;
    dgc_state *s[2] = {dgc_state_create(n, 1), dgc_state_create(n, 1)};
    float *g = alloc_floats(n), *out = alloc_floats(n);
    const size_t wb = dgc_wire_bytes(k);
    char *gathered = calloc(R, wb), *prev = calloc(R, wb);
    cr_assert(s[0] && s[1] && gathered && prev);
    float worst = 0.0f;
    for (uint64_t step = 0; step < 8; step++) {
        for (size_t i = 0; i < n; i++) g[i] = i % 128 == 0 ? (step % 2 ? -40000.0f : 40000.0f) : 0.0f;
        dgc_step_params p = plain_params(step, k, 1.0);
        p.n = n;
        p.momentum = m;
        p.nranks = R;
        p.value_bits = 16;
        p.clamp_bits = limit;
        for (int r = 0; r < R; r++) cr_assert_eq(dgc_compress(s[r], g, &p, gathered + (size_t)r * wb), 0);
        char err[200] = "";
        cr_assert_eq(dgc_wire_decode(gathered, R, step, n, k, out, err, sizeof err), DGC_DECODE_OK, "%s", err);
        if (step > 0) dgc_wire_subtract(prev, R, k, m, out); /* out -= m S_{t-1} */
        memcpy(prev, gathered, (size_t)R * wb);
        for (int r = 0; r < R; r++) dgc_commit(s[r], &p);
        for (size_t i = 0; i < n; i++) worst = fmaxf(worst, fabsf(out[i]));
    }
    free(prev);
    free(gathered);
    free(out);
    free(g);
    dgc_state_destroy(s[0]);
    dgc_state_destroy(s[1]);
    return worst;
}

/* With compensation the clamp is divided by 1 + m (dgc_policy_value_limit_bits):
 * the output converts to fp16 finite, where the sum's own limit alone lets
 * it overflow. */
Test(engine_values, fp16_compensated_output_stays_finite) {
    const float plain = worst_compensated_output(dgc_policy_value_limit_bits(DGC_SUM_F16, 2, 0.0));
    const float comp = worst_compensated_output(dgc_policy_value_limit_bits(DGC_SUM_F16, 2, 0.9));
    cr_assert(plain >= 65520.0f, "premise: without the 1 + m the output overflows fp16 (largest %a)", (double)plain);
    cr_assert(comp < 65520.0f, "the output %a rounds to fp16 Inf", (double)comp);
}

/* ---- conservation ---------------------------------------------------------------- */

Test(engine_conservation, outputs_plus_residual_equal_inputs_without_momentum) {
    /* Invariant 2: with m = 0 nothing is lost. Sum over steps of what was sent
     * (decoded from the own payload) plus the final residual equals the sum of
     * the gradients, element by element, up to float rounding. */
    static const double ratios[] = {0.01, 1.0};
    for (int t = 0; t < 2; t++) {
        const size_t n = 5003;
        const uint64_t k = 50;
        const int steps = 20;
        rng_seed(10 + (uint64_t)t);
        dgc_state *s = dgc_state_create(n, 0);
        float *g = alloc_floats(n), *out = alloc_floats(n);
        double *sum_in = calloc(n, sizeof *sum_in), *sum_out = calloc(n, sizeof *sum_out),
               *sum_abs = calloc(n, sizeof *sum_abs);
        void *payload = alloc_payload(k);
        cr_assert(s && sum_in && sum_out && sum_abs);
        for (int step = 0; step < steps; step++) {
            fill_gradient(g, n, 1.0f);
            dgc_step_params p = plain_params((uint64_t)step, k, ratios[t]);
            cr_assert_eq(dgc_compress(s, g, &p, payload), 0);
            char err[256] = "";
            cr_assert_eq(dgc_wire_decode(payload, 1, (uint64_t)step, n, k, out, err, sizeof err), DGC_DECODE_OK, "%s",
                         err);
            dgc_commit(s, &p);
            for (size_t i = 0; i < n; i++) {
                sum_in[i] += g[i];
                sum_abs[i] += fabs(g[i]);
                sum_out[i] += out[i];
            }
        }
        const float *v = dgc_state_residual(s);
        double sent_total = 0;
        for (size_t i = 0; i < n; i++) {
            double diff = fabs(sum_out[i] + v[i] - sum_in[i]);
            cr_assert(diff <= 1e-5 * sum_abs[i] + 1e-6, "ratio %g element %zu: sent %g + residual %g != inputs %g",
                      ratios[t], i, sum_out[i], v[i], sum_in[i]);
            sent_total += fabs(sum_out[i]);
        }
        cr_assert(sent_total > 0, "premise: something was sent");
        free(payload);
        free(sum_abs);
        free(sum_out);
        free(sum_in);
        free(out);
        free(g);
        dgc_state_destroy(s);
    }
}

/* ---- momentum -------------------------------------------------------------------- */

/* Runs steps with momentum m and compares the engine's sent set, u and v with
 * the reference after every commit. */
static void run_momentum(int nesterov, int masking) {
    const size_t n = 2000;
    const uint64_t k = 40;
    const float m = 0.9f;
    rng_seed(20 + (uint64_t)(2 * nesterov + masking));
    dgc_state *s = dgc_state_create(n, 1);
    ref_state r = ref_create(n);
    float *g = alloc_floats(n);
    unsigned char *sent = malloc(n), *top = malloc(n);
    void *payload = alloc_payload(k);
    cr_assert(s && sent && top);
    int unmasked_nonzero = 0;
    for (int step = 0; step < 6; step++) {
        fill_gradient(g, n, 1.0f);
        dgc_step_params p = plain_params((uint64_t)step, k, 1.0);
        p.momentum = m;
        p.nesterov = nesterov;
        p.momentum_masking = masking;
        cr_assert_eq(dgc_compress(s, g, &p, payload), 0);
        check_payload_shape(payload, &p, n, dgc_last_selected(s), 0, sent);
        cr_assert_eq(dgc_last_selected(s), k);

        ref_update(&r, g, m, nesterov);
        ref_top_k(r.v_new, n, k, top);
        cr_assert(memcmp(sent, top, n) == 0, "nesterov=%d step %d: sent set differs from the reference top k",
                  nesterov, step);
        uint32_t *idx = dgc_wire_indices(payload);
        float *val = dgc_wire_values(payload, k);
        for (uint64_t j = 0; j < k; j++)
            cr_assert(close_to(val[j], r.v_new[idx[j]]), "step %d: sent %g at %u, reference v %g", step, val[j],
                      idx[j], r.v_new[idx[j]]);

        dgc_commit(s, &p);
        ref_commit(&r, sent, masking);
        const float *u = dgc_state_momentum(s), *v = dgc_state_residual(s);
        for (size_t i = 0; i < n; i++) {
            cr_assert(close_to(u[i], r.u[i]), "nesterov=%d masking=%d step %d: u[%zu]=%g, reference %g", nesterov,
                      masking, step, i, u[i], r.u[i]);
            cr_assert(close_to(v[i], r.v[i]), "nesterov=%d masking=%d step %d: v[%zu]=%g, reference %g", nesterov,
                      masking, step, i, v[i], r.v[i]);
            if (sent[i]) {
                cr_assert(v[i] == 0.0f, "v not zeroed at sent index %zu", i);
                if (masking) cr_assert(u[i] == 0.0f, "masking on: u not zeroed at sent index %zu", i);
                else if (u[i] != 0.0f) unmasked_nonzero = 1;
            }
        }
    }
    if (!masking) cr_assert(unmasked_nonzero, "masking off: u at sent indices should keep its value");
    free(payload);
    free(top);
    free(sent);
    free(g);
    ref_destroy(&r);
    dgc_state_destroy(s);
}

Test(engine_momentum, plain_with_masking) { run_momentum(0, 1); }
Test(engine_momentum, plain_without_masking) { run_momentum(0, 0); }
Test(engine_momentum, nesterov_with_masking) { run_momentum(1, 1); }
Test(engine_momentum, nesterov_without_masking) { run_momentum(1, 0); }

Test(engine_momentum, masking_touches_only_sent_indices) {
    /* One step from zero state with m > 0: u = g everywhere, then u = 0 exactly
     * at the sent indices (masking on) and nowhere else. */
    const size_t n = 300;
    const uint64_t k = 30;
    rng_seed(30);
    float *g = alloc_floats(n);
    fill_gradient(g, n, 1.0f);
    unsigned char *sent = malloc(n);
    void *payload = alloc_payload(k);
    cr_assert_not_null(sent);
    for (int masking = 0; masking < 2; masking++) {
        dgc_state *s = dgc_state_create(n, 1);
        dgc_step_params p = plain_params(0, k, 1.0);
        p.momentum = 0.5f;
        p.momentum_masking = masking;
        cr_assert_eq(dgc_compress(s, g, &p, payload), 0);
        check_payload_shape(payload, &p, n, dgc_last_selected(s), 0, sent);
        dgc_commit(s, &p);
        for (size_t i = 0; i < n; i++) {
            float u = dgc_state_momentum(s)[i];
            float want_u = sent[i] && masking ? 0.0f : g[i];
            cr_assert(u == want_u, "masking=%d i=%zu sent=%d: u=%g, want %g", masking, i, sent[i], u, want_u);
            cr_assert(dgc_state_residual(s)[i] == (sent[i] ? 0.0f : g[i]));
        }
        dgc_state_destroy(s);
    }
    free(payload);
    free(sent);
    free(g);
}

/* ---- clipping ---------------------------------------------------------------------- */

Test(engine_clip, accumulated_update_is_the_locally_clipped_gradient) {
    /* After one step from zero state, sent + residual is the whole update:
     * g * min(1, c / sqrt(N) / ||g||). */
    const size_t n = 1000;
    const uint64_t k = 100;
    static const struct {
        double c_over_norm; /* c in units of ||g|| */
        int nranks;
    } cases[] = {{0.5, 1}, {1.0, 4}, {8.0, 4}, {2.0, 16}, {100.0, 2}, {0.01, 8}};
    rng_seed(40);
    float *g = alloc_floats(n), *out = alloc_floats(n);
    fill_gradient(g, n, 3.0f);
    double norm = 0;
    for (size_t i = 0; i < n; i++) norm += (double)g[i] * g[i];
    norm = sqrt(norm);
    void *payload = alloc_payload(k);
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
        double c = cases[t].c_over_norm * norm;
        double scale = c / sqrt((double)cases[t].nranks) / norm;
        if (scale > 1) scale = 1;
        dgc_state *s = dgc_state_create(n, 0);
        dgc_step_params p = plain_params(0, k, 1.0);
        p.clip_norm = c;
        p.nranks = cases[t].nranks;
        cr_assert_eq(dgc_compress(s, g, &p, payload), 0);
        char err[256] = "";
        cr_assert_eq(dgc_wire_decode(payload, 1, 0, n, k, out, err, sizeof err), DGC_DECODE_OK, "%s", err);
        dgc_commit(s, &p);
        const float *v = dgc_state_residual(s);
        for (size_t i = 0; i < n; i++) {
            double got = (double)out[i] + v[i], want = g[i] * scale;
            cr_assert(fabs(got - want) <= 1e-6 * fabs(want) + 1e-12,
                      "c=%g N=%d i=%zu: sent+residual %.9g, want g*%.6g = %.9g", c, p.nranks, i, got, scale, want);
        }
        dgc_state_destroy(s);
    }
    free(payload);
    free(out);
    free(g);
}

/* ---- non-finite gradients --------------------------------------------------------- */

/* Steps a state (and its twin) through finite history, then feeds the state a
 * gradient with one bad value. The flag must be set, dgc_discard must leave
 * the committed state as it was, and the next finite step must give the same
 * payload and state as on the twin that never saw the bad step. */
static void run_nonfinite(float bad, int with_momentum, double clip) {
    const size_t n = 3000;
    const uint64_t k = 30;
    rng_seed(50);
    dgc_state *s = dgc_state_create(n, with_momentum), *twin = dgc_state_create(n, with_momentum);
    float *g = alloc_floats(n), *v0 = alloc_floats(n), *u0 = alloc_floats(n);
    void *pa = alloc_payload(k), *pb = alloc_payload(k);
    cr_assert(s && twin);
    dgc_step_params p = plain_params(0, k, 0.01);
    p.momentum = with_momentum ? 0.9f : 0.0f;
    p.nesterov = 0;
    p.clip_norm = clip;
    p.nranks = 2;
    for (uint64_t step = 0; step < 3; step++) {
        fill_gradient(g, n, 1.0f);
        p.step = step;
        cr_assert_eq(dgc_compress(s, g, &p, pa), 0);
        cr_assert_eq(dgc_compress(twin, g, &p, pb), 0);
        dgc_commit(s, &p);
        dgc_commit(twin, &p);
    }
    memcpy(v0, dgc_state_residual(s), n * sizeof *v0);
    if (with_momentum) memcpy(u0, dgc_state_momentum(s), n * sizeof *u0);

    fill_gradient(g, n, 1.0f);
    g[n / 3] = bad;
    p.step = 3;
    cr_assert_eq(dgc_compress(s, g, &p, pa), 0);
    dgc_wire_header *h = dgc_wire_header_of(pa);
    cr_assert(h->flags & DGC_WIRE_NONFINITE, "gradient with %g: flag not set (flags 0x%x)", bad, h->flags);
    cr_assert(h->magic == DGC_WIRE_MAGIC && h->step == 3 && h->n == n && h->k == k, "header of a non-finite payload");
    /* Whatever slots it carries must still be decodable (valid indices). */
    float *out = alloc_floats(n);
    char err[256] = "";
    cr_assert_eq(dgc_wire_decode(pa, 1, 3, n, k, out, err, sizeof err), DGC_DECODE_NONFINITE, "%s", err);
    dgc_discard(s);
    cr_assert(memcmp(v0, dgc_state_residual(s), n * sizeof *v0) == 0, "discard changed the residual");
    if (with_momentum)
        cr_assert(memcmp(u0, dgc_state_momentum(s), n * sizeof *u0) == 0, "discard changed the momentum");

    fill_gradient(g, n, 1.0f);
    p.step = 4;
    cr_assert_eq(dgc_compress(s, g, &p, pa), 0);
    cr_assert_eq(dgc_compress(twin, g, &p, pb), 0);
    cr_assert_eq(dgc_wire_header_of(pa)->flags, 0, "the finite step after a bad one is flagged");
    cr_assert(memcmp(pa, pb, dgc_wire_bytes(k)) == 0, "payload after a discarded step differs from a clean run");
    dgc_commit(s, &p);
    dgc_commit(twin, &p);
    cr_assert(memcmp(dgc_state_residual(s), dgc_state_residual(twin), n * sizeof(float)) == 0,
              "residual after a discarded step differs from a clean run");
    if (with_momentum)
        cr_assert(memcmp(dgc_state_momentum(s), dgc_state_momentum(twin), n * sizeof(float)) == 0,
                  "momentum after a discarded step differs from a clean run");
    for (size_t i = 0; i < n; i++) cr_assert(isfinite(dgc_state_residual(s)[i]), "residual[%zu] not finite", i);
    free(out);
    free(pb);
    free(pa);
    free(u0);
    free(v0);
    free(g);
    dgc_state_destroy(twin);
    dgc_state_destroy(s);
}

Test(engine_nonfinite, nan_is_flagged_and_discarded) {
    run_nonfinite(NAN, 0, 0.0);
    run_nonfinite(NAN, 1, 0.0);
}

Test(engine_nonfinite, infinities_are_flagged_and_discarded) {
    run_nonfinite(INFINITY, 0, 0.0);
    run_nonfinite(-INFINITY, 1, 0.0);
}

Test(engine_nonfinite, flagged_with_clipping_on) {
    /* Clipping scales by c/||g||: with Inf in g the scale is 0 and Inf*0 is
     * NaN; with NaN the norm is NaN. Either way the step must be flagged. */
    run_nonfinite(INFINITY, 1, 1.0);
    run_nonfinite(NAN, 0, 1.0);
}

/* dgc_compress_zeroing at one output offset (floats past a 64-byte
 * boundary): the same payload and state as dgc_compress, with the output
 * zeroed on the way, also in place (out == g: read before zeroed). The
 * output's zero goes out in whole aligned lines, lagging the update by the
 * offset, so every offset has its own edges. */
static void check_zeroing(size_t n, uint64_t k, size_t off) {
    rng_seed(31 + n + off);
    size_t bytes = ((n + 32) * sizeof(float) + 63) & ~(size_t)63; /* C11: a multiple of the alignment */
    float *g = alloc_floats(n), *out_base = aligned_alloc(64, bytes), *inplace_base = aligned_alloc(64, bytes);
    cr_assert(out_base && inplace_base);
    float *out = out_base + off, *inplace = inplace_base + off;
    fill_gradient(g, n, 1.0f);
    dgc_state *a = dgc_state_create(n, 1), *b = dgc_state_create(n, 1), *c = dgc_state_create(n, 1);
    void *pa = alloc_payload(k), *pb = alloc_payload(k), *pc = alloc_payload(k);
    for (uint64_t step = 0; step < 3; step++) {
        dgc_step_params p = plain_params(step, k, 0.01);
        p.momentum = 0.9f;
        for (size_t i = 0; i < n + 16 - off; i++) out[i] = 7.0f; /* and past the end */
        memcpy(inplace, g, n * sizeof *g);
        inplace[n] = 7.0f;
        cr_assert_eq(dgc_compress(a, g, &p, pa), 0);
        cr_assert_eq(dgc_compress_zeroing(b, g, &p, pb, out), 1, "n %zu offset %zu: not zeroed", n, off);
        cr_assert_eq(dgc_compress_zeroing(c, inplace, &p, pc, inplace), 1);
        cr_assert(memcmp(pa, pb, dgc_wire_bytes(k)) == 0, "n %zu offset %zu step %llu: payload differs with zeroing",
                  n, off, (unsigned long long)step);
        cr_assert(memcmp(pa, pc, dgc_wire_bytes(k)) == 0, "n %zu offset %zu step %llu: payload differs in place", n,
                  off, (unsigned long long)step);
        for (size_t i = 0; i < n; i++) {
            cr_assert(out[i] == 0.0f, "n %zu offset %zu: out[%zu] = %g, not zeroed", n, off, i, out[i]);
            cr_assert(inplace[i] == 0.0f, "n %zu offset %zu: in-place g[%zu] = %g, not zeroed", n, off, i,
                      inplace[i]);
        }
        for (size_t i = n; i < n + 16 - off; i++)
            cr_assert(out[i] == 7.0f, "n %zu offset %zu: out[%zu], past the end, was written", n, off, i);
        cr_assert(inplace[n] == 7.0f, "n %zu offset %zu: in place, past the end was written", n, off);
        dgc_commit(a, &p);
        dgc_commit(b, &p);
        dgc_commit(c, &p);
        cr_assert(memcmp(dgc_state_residual(a), dgc_state_residual(b), n * sizeof(float)) == 0);
        cr_assert(memcmp(dgc_state_residual(a), dgc_state_residual(c), n * sizeof(float)) == 0);
        fill_gradient(g, n, 1.0f);
    }
    dgc_state_destroy(a);
    dgc_state_destroy(b);
    dgc_state_destroy(c);
    free(pa);
    free(pb);
    free(pc);
    free(g);
    free(out_base);
    free(inplace_base);
}

Test(engine_zeroing, same_payload_and_zeroed_output_at_every_offset_also_in_place) {
    /* 4099: many chunks and a tail; 40: two chunks and a tail; 17 and 16:
     * one chunk, where a lagging output line never completes; 5: tail only. */
    const size_t sizes[] = {4099, 40, 17, 16, 5};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
        for (size_t off = 0; off < 16; off++) check_zeroing(sizes[s], sizes[s] > 100 ? 41 : 2, off);
}

Test(engine_zeroing, output_not_float_aligned_is_left_alone) {
    const size_t n = 100;
    float *g = alloc_floats(n);
    unsigned char *raw = malloc(n * sizeof(float) + 1);
    cr_assert(raw);
    fill_gradient(g, n, 1.0f);
    float *odd = (float *)(void *)(raw + 1); /* never dereferenced as float here */
    memset(raw, 0x5a, n * sizeof(float) + 1);
    dgc_state *s = dgc_state_create(n, 0);
    void *pl = alloc_payload(2);
    dgc_step_params p = plain_params(0, 2, 0.01);
    cr_assert_eq(dgc_compress_zeroing(s, g, &p, pl, odd), 0, "a misaligned output is not zeroed");
    for (size_t i = 0; i < n * sizeof(float) + 1; i++) cr_assert_eq(raw[i], 0x5a, "byte %zu was written", i);
    dgc_state_destroy(s);
    free(pl);
    free(raw);
    free(g);
}
