/* The host (CPU) DGC engine.
 *
 * Memory traffic is what this code is about: a 25M-element buffer is 100 MB
 * per array. One streaming pass reads g, u, v and writes the updated u, v into
 * the spare ("next") arrays while it tests each element against the sampled
 * threshold; commit is a pointer swap plus k scattered writes. Writing into
 * spares instead of in place costs no extra traffic and lets a step that
 * turned out non-finite on some rank be dropped after the gather. */
#include "dgcshim/engine.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dgcshim/sum_rules.h"
#include "dgcshim/update_rules.h"
#include "dgcshim/wire_compact.h"
#include "stream.h"
#include "core/pages.h"
#include "topk.h"

/* Oversampling of the threshold: aim for more than k candidates, then keep
 * the exact top k of them, so the payload is nearly always full. Twice k,
 * or, where the sample expects many hits (large k: warm-up), k plus a
 * margin of MARGIN_SIGMAS standard deviations of the hits' count, taken as
 * if each run of DGC_SAMPLE_RUN sampled elements were one element repeated
 * (the worst correlation a run can have): every extra candidate is written
 * in the update pass and read again by the selection, and at 25% density
 * twice k is half the buffer. */
#define CANDIDATE_FACTOR 2
#define MARGIN_SIGMAS 4.0
#define MIN_EXPECTED_HITS 16
/* The sample's threshold comes from a heap when want is this many times
 * smaller than the sample. */
#define HEAP_FACTOR 16
/* Candidates beyond this many times k trigger the exact fallback. */
#define CANDIDATE_CAP_FACTOR 8
#define CANDIDATE_CAP_MIN 4096
/* Sample runs (DGC_SAMPLE_RUN elements: one cache line per run instead of
 * one per sampled element) prefetched ahead. */
#define PREFETCH_RUNS 8
/* Masking after the exchange writes k scattered elements. */
#define MASK_PREFETCH_AHEAD 16

struct dgc_state {
    uint64_t n;
    float *v, *v_next;
    float *u, *u_next; /* NULL without momentum */
    uint32_t *cand;    /* candidate indices; the first nsel are the selection */
    float *cand_val;   /* their updated values, kept so nothing re-reads v_next; after pack, for the
                        * selection, what rounding the value for the wire lost, which commit keeps */
    uint64_t cand_cap;
    uint64_t nsel;
    int saturated;  /* the last compression held some u or v at +-FLT_MAX (update_rules.h) */
    float *scratch; /* sample values, or |v| for the exact fallback */
    uint64_t scratch_cap;
};

/* State arrays: 64-byte aligned (streaming stores need it) and zeroed. */
static float *floats(uint64_t n) { return dgc_pages_alloc((size_t)n * sizeof(float)); }
static void free_floats(float *p, uint64_t n) { dgc_pages_free(p, (size_t)n * sizeof(float)); }

dgc_state *dgc_state_create(uint64_t n, int with_momentum) {
    dgc_state *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->n = n;
    s->v = floats(n);
    s->v_next = floats(n);
    int ok = s->v && s->v_next;
    if (with_momentum) {
        s->u = floats(n);
        s->u_next = floats(n);
        ok = ok && s->u && s->u_next;
    }
    if (!ok) {
        dgc_state_destroy(s);
        return NULL;
    }
    return s;
}

void dgc_state_destroy(dgc_state *s) {
    if (!s) return;
    free_floats(s->v, s->n);
    free_floats(s->v_next, s->n);
    free_floats(s->u, s->n);
    free_floats(s->u_next, s->n);
    dgc_pages_free(s->cand, s->cand_cap * sizeof *s->cand);
    dgc_pages_free(s->cand_val, s->cand_cap * sizeof *s->cand_val);
    dgc_pages_free(s->scratch, s->scratch_cap * sizeof *s->scratch);
    free(s);
}

/* Candidate room for k slots: about CANDIDATE_FACTOR k are expected, up to
 * CANDIDATE_CAP_FACTOR k are kept before the exact fallback takes over. */
uint64_t dgc_candidate_cap(uint64_t n, uint64_t k) {
    uint64_t cap = k * CANDIDATE_CAP_FACTOR;
    if (cap < CANDIDATE_CAP_MIN) cap = CANDIDATE_CAP_MIN;
    return cap > n ? n : cap;
}

static size_t array_bytes(uint64_t elems, size_t elem) { return dgc_pages_footprint((size_t)elems * elem); }

size_t dgc_state_bytes(const dgc_state *s) {
    size_t arrays = (s->u ? 4 : 2) * array_bytes(s->n, sizeof(float));
    return sizeof *s + arrays + 2 * array_bytes(s->cand_cap, sizeof(uint32_t)) +
           array_bytes(s->scratch_cap, sizeof(float));
}

/* A small want (the usual case) keeps a heap of the want largest as the
 * sample is drawn; a large one (warm-up, ratio 1) stores the sample and
 * runs quickselect on it. */
static int sample_uses_heap(const dgc_sample_plan *sp) { return sp->want * HEAP_FACTOR <= sp->count; }

/* The floats of sample scratch sampled_threshold keeps: the heap or the whole sample. */
static uint64_t sample_scratch_of(const dgc_sample_plan *sp) { return sample_uses_heap(sp) ? sp->want : sp->count; }

static uint64_t sample_scratch(uint64_t n, uint64_t k, double sample_ratio) {
    dgc_sample_plan sp;
    dgc_sample_plan_for(n, k, sample_ratio, &sp);
    return sample_scratch_of(&sp);
}

size_t dgc_state_footprint(uint64_t n, int with_momentum, uint64_t k, double sample_ratio) {
    /* The exact fallback needs no scratch (select_exact reads v in place). */
    return sizeof(dgc_state) + (with_momentum ? 4 : 2) * array_bytes(n, sizeof(float)) +
           2 * array_bytes(dgc_candidate_cap(n, k), sizeof(uint32_t)) +
           array_bytes(sample_scratch(n, k, sample_ratio), sizeof(float));
}

uint64_t dgc_state_size(const dgc_state *s) { return s->n; }
const float *dgc_state_residual(const dgc_state *s) { return s->v; }
const float *dgc_state_momentum(const dgc_state *s) { return s->u; }
uint64_t dgc_last_selected(const dgc_state *s) { return s->nsel; }

int dgc_last_saturated(const dgc_state *s) { return s->saturated; }

/* Makes *buf hold want elements (dgc_pages_fit, counted in elements). A
 * block over 4 times the need (warm-up is over, or the exact fallback ran
 * once) is given back. */
static int fit(void **buf, uint64_t *cap, uint64_t want, size_t elem) {
    size_t bytes = (size_t)*cap * elem;
    int rc = dgc_pages_fit(buf, &bytes, (size_t)want * elem, 4);
    *cap = bytes / elem;
    return rc;
}

/* Room for cap candidates, indices and values alike. */
static int fit_candidates(dgc_state *s, uint64_t cap) {
    uint64_t cap_val = s->cand_cap;
    if (fit((void **)&s->cand_val, &cap_val, cap, sizeof(float))) {
        dgc_pages_free(s->cand, s->cand_cap * sizeof *s->cand);
        s->cand = NULL;
        s->cand_cap = 0;
        return -1;
    }
    if (fit((void **)&s->cand, &s->cand_cap, cap, sizeof(uint32_t))) {
        dgc_pages_free(s->cand_val, cap_val * sizeof *s->cand_val);
        s->cand_val = NULL;
        return -1;
    }
    return 0;
}

/* |updated v| over [start, start + len), computed without touching the
 * state; NaN reads as Inf, which keeps the selection's ordering sound. The
 * momentum test is outside the loops so that each loop vectorises. */
static void updated_run(const dgc_state *s, const float *g, uint64_t start, uint64_t len, float scale,
                        const dgc_step_params *p, float *out) {
    const float *v = s->v + start, *gs = g + start;
    uint32_t ovf = 0; /* a sample's saturation is the stream's to report */
    if (s->u) {
        const float *u = s->u + start;
        for (uint64_t i = 0; i < len; i++) {
            float un;
            float add = dgc_rule_momentum(u[i], gs[i] * scale, p->momentum, p->nesterov, &un, &ovf);
            out[i] = fabsf(dgc_rule_accumulate(v[i], add, &ovf));
        }
    } else {
        for (uint64_t i = 0; i < len; i++) out[i] = fabsf(dgc_rule_accumulate(v[i], gs[i] * scale, &ovf));
    }
    for (uint64_t i = 0; i < len; i++) out[i] = dgc_rule_sample_value(out[i]);
}

static double sum_squares(const float *g, uint64_t n) {
    double acc[8] = {0};
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += (double)g[i + l] * (double)g[i + l];
    for (; i < n; i++) acc[0] += (double)g[i] * (double)g[i];
    double t = 0;
    for (int l = 0; l < 8; l++) t += acc[l];
    return t;
}

/* How many sampled values above the threshold to aim for beyond the
 * expected hits (CANDIDATE_FACTOR, MARGIN_SIGMAS). */
static uint64_t oversampling(uint64_t hits) {
    const uint64_t twice = hits * (CANDIDATE_FACTOR - 1);
    const double margin = ceil(MARGIN_SIGMAS * sqrt((double)DGC_SAMPLE_RUN * (double)hits));
    return margin < (double)twice ? (uint64_t)margin : twice;
}

void dgc_sample_plan_for(uint64_t n, uint64_t k, double sample_ratio, dgc_sample_plan *out) {
    /* At least MIN_EXPECTED_HITS sampled values are expected above the
     * threshold, else on small buffers it rests on one or two samples and
     * payloads go out under-full. */
    uint64_t m = (uint64_t)ceil(sample_ratio * (double)n);
    uint64_t floor_m = (uint64_t)ceil((double)MIN_EXPECTED_HITS * (double)n / (double)k);
    if (m < floor_m) m = floor_m;
    if (m < 1) m = 1;
    if (2 * m < n) {
        const uint64_t runs = (m + DGC_SAMPLE_RUN - 1) / DGC_SAMPLE_RUN;
        /* Every run is DGC_SAMPLE_RUN long when the strata are; else each
         * is its whole stratum. */
        const uint64_t count = n / runs >= DGC_SAMPLE_RUN ? runs * DGC_SAMPLE_RUN : n;
        uint64_t want = (uint64_t)ceil((double)k * (double)m / (double)n);
        want += oversampling(want);
        if (want < 1) want = 1;
        if (want < count) {
            *out = (dgc_sample_plan){.whole = 0, .runs = runs, .count = count, .want = want};
            return;
        }
    }
    /* The whole buffer, whose k-th largest is exact, where a sample would be
     * half of it or more (a small buffer: a run or two), or where a sample
     * could not rank k elements (density near 1: its want-th largest would be
     * its smallest, and everything below that would wait for a later call,
     * so that density 1 would not send everything). */
    const uint64_t runs = (n + DGC_SAMPLE_RUN - 1) / DGC_SAMPLE_RUN;
    *out = (dgc_sample_plan){.whole = 1, .runs = runs, .count = n, .want = k < 1 ? 1 : k > n ? n : k};
}

/* Prefetches run r's first and last cache lines, since the sampling loop is
 * otherwise a chain of misses the hardware prefetcher cannot guess. */
static uint64_t run_start(const dgc_state *s, const float *g, const dgc_sample_plan *sp, uint64_t r, uint64_t step,
                          uint64_t *len) {
    uint64_t start = dgc_rule_run_start(s->n, sp->runs, r, sp->whole, step, len);
    for (uint64_t i = start; i < start + *len; i += *len - 1 > 0 ? *len - 1 : 1) {
        __builtin_prefetch(g + i);
        __builtin_prefetch(s->v + i);
        if (s->u) __builtin_prefetch(s->u + i);
    }
    return start;
}

/* Threshold from a stratified sample of the updated |v| (dgc_sample_plan):
 * the want-th largest of it, exact. With a whole-buffer sample the threshold
 * is the exact k-th largest. */
static int sampled_threshold(dgc_state *s, const float *g, float scale, const dgc_step_params *p,
                             float *thr) {
    dgc_sample_plan sp;
    dgc_sample_plan_for(s->n, p->k, p->sample_ratio, &sp);
    const int use_heap = sample_uses_heap(&sp);
    if (fit((void **)&s->scratch, &s->scratch_cap, sample_scratch_of(&sp), sizeof(float))) return -1;
    dgc_topk_heap heap;
    dgc_topk_heap_init(&heap, s->scratch, sp.want);
    uint64_t starts[PREFETCH_RUNS], lens[PREFETCH_RUNS], j = 0;
    for (uint64_t r = 0; r < sp.runs && r < PREFETCH_RUNS; r++) starts[r] = run_start(s, g, &sp, r, p->step, &lens[r]);
    for (uint64_t r = 0; r < sp.runs; r++) {
        uint64_t start = starts[r % PREFETCH_RUNS], len = lens[r % PREFETCH_RUNS];
        if (r + PREFETCH_RUNS < sp.runs)
            starts[r % PREFETCH_RUNS] = run_start(s, g, &sp, r + PREFETCH_RUNS, p->step, &lens[r % PREFETCH_RUNS]);
        float vals[DGC_SAMPLE_RUN];
        updated_run(s, g, start, len, scale, p, vals);
        for (uint64_t i = 0; i < len; i++, j++) {
            if (use_heap) dgc_topk_heap_push(&heap, vals[i]);
            else s->scratch[j] = vals[i];
        }
    }
    *thr = use_heap ? dgc_topk_heap_min(&heap) : dgc_topk_kth_largest(s->scratch, j, sp.want - 1);
    return 0;
}

/* The update pass (engine/stream.c); returns 1 when some scaled gradient is
 * non-finite, and records whether some u or v saturated. *overflow is set
 * when candidates outgrew cand_cap (the caller then selects exactly). */
static uint32_t stream_update(dgc_state *s, const float *g, float *zero, float scale, const dgc_step_params *p,
                              float thr, uint64_t *ncand, int *overflow) {
    dgc_stream_job job = {.n = s->n, .g = g, .u = s->u, .v = s->v, .u_next = s->u_next, .v_next = s->v_next,
                          .zero = zero, .scale = scale, .momentum = p->momentum, .nesterov = p->nesterov,
                          .thr = thr, .cand = s->cand, .cand_val = s->cand_val, .cand_cap = s->cand_cap};
    uint64_t c;
    uint32_t r = dgc_stream_update(&job, &c);
    s->saturated = (r & DGC_STREAM_SATURATED) != 0;
    /* Against the room k calls for, not the room held (which may be up to 4x
     * more after warm-up): the CUDA engine takes the same path. */
    *overflow = c > dgc_candidate_cap(s->n, p->k);
    *ncand = *overflow ? 0 : c;
    return (r & DGC_STREAM_NONFINITE) != 0;
}

/* Exact top k of the updated |v|, for when the sampled threshold was far
 * off. A radix select that only reads v: an n-float copy to quickselect in
 * would be memory the state's footprint (and DGC_MAX_STATE_MB) leaves out. */
static int select_exact(dgc_state *s, uint64_t k) {
    const uint64_t n = s->n;
    size_t above;
    const float t = dgc_topk_kth_largest_abs(s->v_next, (size_t)n, (size_t)(k - 1), &above);
    /* Every |v| above t (fewer than k) and the first ties at t that fit (none
     * when t is 0), in one pass in index order: the compact encoding needs
     * sorted indices, and a second pass for the ties would put them after
     * larger values at higher indices. */
    uint64_t c = 0;
    uint64_t ties = t > 0 ? k - (uint64_t)above : 0;
    for (uint64_t i = 0; i < n && c < k; i++)
        if (dgc_topk_keeps(fabsf(s->v_next[i]), t, &ties)) s->cand[c++] = (uint32_t)i;
    for (uint64_t j = 0; j < c; j++) s->cand_val[j] = s->v_next[s->cand[j]];
    s->nsel = c;
    return 0;
}

/* The exact top k of the ncand candidates (more than k of them), kept in
 * index order: the k-th largest |value| t (a radix select, in place), then
 * those above t, then ties at t, in order, up to k (dgc_topk_keeps, as
 * select_exact). Sorted payloads are what the compact encoding needs
 * (Elias-Fano). */
static int select_candidates(dgc_state *s, uint64_t ncand, uint64_t k) {
    size_t above;
    float t = dgc_topk_kth_largest_abs(s->cand_val, ncand, k - 1, &above); /* no copy: a radix select */
    uint64_t ties = k - above, c = 0; /* ties at t that fit */
    /* In place and without a branch on the data (at warm-up densities about
     * one candidate in ten is dropped, at random): every candidate is
     * written at c, which only moves past the kept ones; c <= j, so nothing
     * unread is overwritten. */
    for (uint64_t j = 0; j < ncand && c < k; j++) {
        const float x = s->cand_val[j];
        const uint64_t keep = dgc_topk_keeps(fabsf(x), t, &ties);
        s->cand[c] = s->cand[j];
        s->cand_val[c] = x;
        c += keep;
    }
    s->nsel = c;
    return 0;
}

/* x rounded to the 16-bit type of its sum and clamped to limit
 * (sum_rules.h); x itself when it is not finite (only a non-finite step has
 * such values, and it commits nothing). */
static float sum_rounded(float x, unsigned type, uint32_t limit) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7f800000u) == 0x7f800000u) return x;
    u = dgc_sum_round_bits(u, type, limit);
    memcpy(&x, &u, sizeof x);
    return x;
}

/* x with its magnitude clamped to limit (dgc_sum_clamp_bits); x itself
 * when it is not finite. */
static float clamped(float x, uint32_t limit) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7f800000u) == 0x7f800000u) return x;
    u = dgc_sum_clamp_bits(u, limit);
    memcpy(&x, &u, sizeof x);
    return x;
}

static void pack(dgc_state *s, const dgc_step_params *p, uint32_t flags, void *payload) {
    dgc_wire_header h = {DGC_WIRE_MAGIC, flags, p->step, s->n, p->k};
    memcpy(payload, &h, sizeof h);
    uint32_t *idx = dgc_wire_indices(payload);
    float *val = dgc_wire_values(payload, p->k);
    const uint32_t limit = dgc_sum_step_limit_bits(p->sum_type, p->clamp_bits, p->nranks);
    if (p->sum_type != DGC_SUM_F32) { /* summed in a 16-bit type: rounded to it instead */
        for (uint64_t j = 0; j < s->nsel; j++) val[j] = sum_rounded(s->cand_val[j], p->sum_type, limit);
    } else {
        /* Clamped first (a 16-bit buffer's limit), then one scale for the
         * whole payload from the clamped values before rounding: the compact
         * encoding carries it once, and it keeps the largest value's 11
         * significant bits. */
        const float *x = s->cand_val;
        if (p->clamp_bits != 0u) {
            for (uint64_t j = 0; j < s->nsel; j++) val[j] = clamped(s->cand_val[j], limit);
            x = val;
        }
        const int scale = p->value_bits == 16 ? dgc_compact_scale16(x, s->nsel) : 0;
        dgc_compact_values(x, s->nsel, p->value_bits, scale, val); /* what every rank will add */
    }
    memcpy(idx, s->cand, (size_t)s->nsel * sizeof *idx);
    for (uint64_t j = 0; j < s->nsel; j++) s->cand_val[j] -= val[j]; /* what commit keeps (error feedback) */
    for (uint64_t j = s->nsel; j < p->k; j++) {
        idx[j] = 0;
        val[j] = 0.0f;
    }
}

int dgc_compress(dgc_state *s, const float *g, const dgc_step_params *p, void *payload) {
    return dgc_compress_zeroing(s, g, p, payload, NULL) < 0 ? -1 : 0;
}

int dgc_compress_zeroing(dgc_state *s, const float *g, const dgc_step_params *p, void *payload, float *out) {
    float *zero = out && ((uintptr_t)out % sizeof(float)) == 0 ? out : NULL;
    s->nsel = 0;
    s->saturated = 0;
    if (fit_candidates(s, dgc_candidate_cap(s->n, p->k))) return -1;

    float scale = 1.0f;
    if (p->clip_norm > 0) scale = dgc_rule_clip_scale(sum_squares(g, s->n), p->clip_norm, p->nranks);
    float thr;
    if (sampled_threshold(s, g, scale, p, &thr)) return -1;
    uint64_t ncand;
    int overflow;
    if (stream_update(s, g, zero, scale, p, thr, &ncand, &overflow)) {
        pack(s, p, DGC_WIRE_NONFINITE, payload);
        return zero != NULL;
    }
    if (overflow) {
        if (select_exact(s, p->k)) return -1;
    } else {
        if (ncand > p->k) {
            if (select_candidates(s, ncand, p->k)) return -1;
        } else {
            s->nsel = ncand;
        }
    }
    pack(s, p, 0, payload);
    return zero != NULL;
}

static void swap_arrays(float **a, float **b) {
    float *t = *a;
    *a = *b;
    *b = t;
}

void dgc_commit(dgc_state *s, const dgc_step_params *p) { dgc_commit_only(s, p, NULL); }

void dgc_commit_only(dgc_state *s, const dgc_step_params *p, const unsigned char *keep) {
    swap_arrays(&s->v, &s->v_next);
    if (s->u) swap_arrays(&s->u, &s->u_next);
    float *u = s->u && p->momentum_masking ? s->u : NULL;
    for (uint64_t j = 0; j < s->nsel; j++) { /* scattered: prefetch as the decoder does */
        if (j + MASK_PREFETCH_AHEAD < s->nsel) {
            __builtin_prefetch(s->v + s->cand[j + MASK_PREFETCH_AHEAD], 1);
            if (u) __builtin_prefetch(u + s->cand[j + MASK_PREFETCH_AHEAD], 1);
        }
        /* Error feedback: the residual keeps what rounding the value for the
         * wire lost, as pack left it (with 32-bit values x - x, +0: what was
         * sent is gone). */
        if (keep && !keep[j]) continue; /* v and u keep the update's values */
        uint32_t i = s->cand[j];
        s->v[i] = s->cand_val[j];
        if (u) u[i] = 0.0f;
    }
    s->nsel = 0;
}

void dgc_discard(dgc_state *s) { s->nsel = 0; }
