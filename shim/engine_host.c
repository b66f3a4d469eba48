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
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "dgcshim/update_rules.h"
#include "topk.h"

/* Oversampling of the threshold: aim for about twice k candidates, then keep
 * the exact top k of them, so the payload is nearly always full. */
#define CANDIDATE_FACTOR 2
#define MIN_EXPECTED_HITS 16
/* Candidates beyond this many times k trigger the exact fallback. */
#define CANDIDATE_CAP_FACTOR 8
#define CANDIDATE_CAP_MIN 4096
/* The update computes BLOCK elements into an L1-resident staging area; the
 * scan reads them there in CHUNKs, testing a whole chunk with vector compares
 * and looking at single elements only in the few chunks that hold a
 * candidate; then the block is streamed out to the state with non-temporal
 * stores, which skip the read-for-ownership a plain store of a cold line
 * costs (a third of the traffic of this pass). */
#define BLOCK 2048
#define CHUNK 16
/* The sample is taken in runs of RUN consecutive elements: one cache line
 * per run instead of one per sampled element. */
#define RUN 16

struct dgc_state {
    uint64_t n;
    float *v, *v_next;
    float *u, *u_next; /* NULL without momentum */
    uint32_t *cand;    /* candidate indices; the first nsel are the selection */
    uint64_t cand_cap;
    uint64_t nsel;
    float *scratch; /* sample values, or |v| for the exact fallback */
    uint64_t scratch_cap;
    float *stage_v, *stage_u; /* BLOCK elements each */
};

double dgc_density_at(double sparsity, uint64_t warmup_steps, uint64_t step) {
    double target = 1.0 - sparsity;
    if (step >= warmup_steps) return target;
    int stages = 0;
    for (double d = 0.25; d > target; d *= 0.25) stages++;
    if (stages == 0) return target;
    uint64_t stage = step * (uint64_t)stages / warmup_steps;
    double d = 0.25;
    for (uint64_t i = 0; i < stage; i++) d *= 0.25;
    return d > target ? d : target;
}

uint64_t dgc_k_for(uint64_t n, double density) {
    /* 1 - 0.999 is 0.0010000000000000009 in double: without the nudge, ceil
     * would turn that rounding into an extra slot (1001 for n = 10^6). */
    double x = density * (double)n;
    double k = ceil(x * (1.0 - 1e-12));
    if (k < 1) return n ? 1 : 0;
    return k > (double)n ? n : (uint64_t)k;
}

/* 64-byte aligned floats (streaming stores need 16), zeroed when asked. */
static float *floats(uint64_t n, int zero) {
    size_t bytes = ((size_t)n * sizeof(float) + 63) & ~(size_t)63;
    float *p = aligned_alloc(64, bytes ? bytes : 64);
    if (p && zero) memset(p, 0, bytes);
    return p;
}

dgc_state *dgc_state_create(uint64_t n, int with_momentum) {
    dgc_state *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->n = n;
    s->v = floats(n, 1);
    s->v_next = floats(n, 0);
    s->stage_v = floats(BLOCK, 0);
    s->stage_u = floats(BLOCK, 0);
    int ok = s->v && s->v_next && s->stage_v && s->stage_u;
    if (with_momentum) {
        s->u = floats(n, 1);
        s->u_next = floats(n, 0);
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
    free(s->v);
    free(s->v_next);
    free(s->u);
    free(s->u_next);
    free(s->cand);
    free(s->scratch);
    free(s->stage_v);
    free(s->stage_u);
    free(s);
}

uint64_t dgc_state_size(const dgc_state *s) { return s->n; }
const float *dgc_state_residual(const dgc_state *s) { return s->v; }
const float *dgc_state_momentum(const dgc_state *s) { return s->u; }
uint64_t dgc_last_selected(const dgc_state *s) { return s->nsel; }

static int reserve(void **buf, uint64_t *cap, uint64_t want, size_t elem) {
    if (*cap >= want) return 0;
    void *p = realloc(*buf, want * elem);
    if (!p) return -1;
    *buf = p;
    *cap = want;
    return 0;
}

/* The updated residual at i, computed without touching the state. */
static float updated_v(const dgc_state *s, const float *g, uint64_t i, float scale,
                       const dgc_step_params *p) {
    float un;
    float add = dgc_rule_momentum(s->u ? s->u[i] : 0.0f, g[i] * scale, s->u ? p->momentum : 0.0f,
                                  p->nesterov, &un);
    return dgc_rule_accumulate(s->v[i], add);
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

static uint64_t xorshift(uint64_t *x) {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/* Threshold from a stratified sample of the updated |v|: one random run of
 * RUN elements per stratum, the strata tiling the buffer. With a ratio of 1
 * the sample is the whole buffer and the threshold is exact. */
static int sampled_threshold(dgc_state *s, const float *g, float scale, const dgc_step_params *p,
                             float *thr) {
    uint64_t n = s->n;
    /* At least MIN_EXPECTED_HITS sampled values are expected above the
     * threshold, else on small buffers it rests on one or two samples and
     * payloads go out under-full. */
    uint64_t m = (uint64_t)ceil(p->sample_ratio * (double)n);
    uint64_t floor_m = (uint64_t)ceil((double)MIN_EXPECTED_HITS * (double)n / (double)p->k);
    if (m < floor_m) m = floor_m;
    if (m < 1) m = 1;
    if (m > n) m = n;
    if (reserve((void **)&s->scratch, &s->scratch_cap, m, sizeof(float))) return -1;
    uint64_t runs = (m + RUN - 1) / RUN, seed = (p->step + 1) * 0x9e3779b97f4a7c15ull, j = 0;
    for (uint64_t r = 0; r < runs && j < m; r++) {
        uint64_t lo = r * n / runs, hi = (r + 1) * n / runs, len = hi - lo < RUN ? hi - lo : RUN;
        uint64_t start = m == n ? lo : lo + xorshift(&seed) % (hi - lo - len + 1);
        for (uint64_t i = start; i < start + len && j < m; i++) {
            float a = fabsf(updated_v(s, g, i, scale, p));
            s->scratch[j++] = a != a ? INFINITY : a;
        }
    }
    m = j;
    uint64_t want = (uint64_t)ceil((double)p->k * (double)m / (double)n);
    if (m < n) want *= CANDIDATE_FACTOR;
    if (want < 1) want = 1;
    if (want > m) want = m;
    *thr = dgc_topk_kth_largest(s->scratch, m, want - 1);
    return 0;
}

/* One block of the update into the staging area. with_u and nesterov are
 * compile-time constants at every call site, so each variant vectorises. */
static inline __attribute__((always_inline)) uint32_t update_block(dgc_state *s, const float *g,
                                                                   uint64_t lo, uint64_t len,
                                                                   float scale, float m, int with_u,
                                                                   int nesterov) {
    uint32_t bad = 0;
    const float *u = s->u + (with_u ? lo : 0), *v = s->v + lo, *gb = g + lo;
    float *su = s->stage_u, *sv = s->stage_v;
    for (uint64_t i = 0; i < len; i++) {
        float un;
        float add = dgc_rule_momentum(with_u ? u[i] : 0.0f, gb[i] * scale, with_u ? m : 0.0f, nesterov, &un);
        if (with_u) su[i] = un;
        float vn = dgc_rule_accumulate(v[i], add);
        sv[i] = vn;
        bad |= dgc_rule_nonfinite(vn);
    }
    return bad;
}

/* Appends the candidates among the staged block (global offset lo) to
 * s->cand; returns the new count c, which may exceed cand_cap (only the
 * first cand_cap are stored). */
static uint64_t scan_block(dgc_state *s, uint64_t lo, uint64_t len, float thr, uint64_t c) {
    const float *v = s->stage_v;
    for (uint64_t base = 0; base < len; base += CHUNK) {
        uint64_t end = base + CHUNK < len ? base + CHUNK : len;
        uint32_t hit = 0;
        for (uint64_t i = base; i < end; i++) hit |= (uint32_t)(fabsf(v[i]) >= thr);
        if (!hit) continue;
        for (uint64_t i = base; i < end; i++) {
            if (!dgc_rule_selected(v[i], thr)) continue;
            if (c < s->cand_cap) s->cand[c] = (uint32_t)(lo + i);
            c++;
        }
    }
    return c;
}

/* Copies a staged block to the state, bypassing the cache where it can:
 * dst and src are 16-byte aligned (BLOCK is a multiple of 4). */
static void stream_out(float *dst, const float *src, uint64_t len) {
    uint64_t i = 0;
#ifdef __SSE2__
    for (; i + 4 <= len; i += 4) _mm_stream_ps(dst + i, _mm_load_ps(src + i));
#endif
    for (; i < len; i++) dst[i] = src[i];
}

/* Streams the update, collecting candidate indices; returns 1 when some
 * updated value is non-finite. *overflow is set when candidates outgrew
 * cand_cap (the caller then selects exactly). */
static uint32_t stream_update(dgc_state *s, const float *g, float scale, const dgc_step_params *p,
                              float thr, uint64_t *ncand, int *overflow) {
    uint32_t bad = 0;
    uint64_t c = 0;
    int with_u = s->u != NULL;
    for (uint64_t lo = 0; lo < s->n; lo += BLOCK) {
        uint64_t len = s->n - lo < BLOCK ? s->n - lo : BLOCK;
        if (!with_u) bad |= update_block(s, g, lo, len, scale, 0.0f, 0, 0);
        else if (p->nesterov) bad |= update_block(s, g, lo, len, scale, p->momentum, 1, 1);
        else bad |= update_block(s, g, lo, len, scale, p->momentum, 1, 0);
        c = scan_block(s, lo, len, thr, c);
        stream_out(s->v_next + lo, s->stage_v, len);
        if (with_u) stream_out(s->u_next + lo, s->stage_u, len);
    }
#ifdef __SSE2__
    _mm_sfence(); /* streaming stores are weakly ordered */
#endif
    *overflow = c > s->cand_cap;
    *ncand = *overflow ? 0 : c;
    return bad;
}

/* Exact top k of the updated |v|, for when the sampled threshold was far off. */
static int select_exact(dgc_state *s, uint64_t k) {
    uint64_t n = s->n;
    if (reserve((void **)&s->scratch, &s->scratch_cap, n, sizeof(float))) return -1;
    for (uint64_t i = 0; i < n; i++) s->scratch[i] = fabsf(s->v_next[i]);
    float t = dgc_topk_kth_largest(s->scratch, n, k - 1);
    uint64_t c = 0;
    for (uint64_t i = 0; i < n && c < k; i++) /* strictly above t: fewer than k */
        if (fabsf(s->v_next[i]) > t) s->cand[c++] = (uint32_t)i;
    for (uint64_t i = 0; i < n && c < k && t > 0; i++) /* then ties at t */
        if (fabsf(s->v_next[i]) == t) s->cand[c++] = (uint32_t)i;
    s->nsel = c;
    return 0;
}

static void pack(const dgc_state *s, const dgc_step_params *p, uint32_t flags, void *payload) {
    dgc_wire_header h = {DGC_WIRE_MAGIC, flags, p->step, s->n, p->k};
    memcpy(payload, &h, sizeof h);
    uint32_t *idx = dgc_wire_indices(payload);
    float *val = dgc_wire_values(payload, p->k);
    for (uint64_t j = 0; j < s->nsel; j++) {
        idx[j] = s->cand[j];
        val[j] = s->v_next[s->cand[j]];
    }
    for (uint64_t j = s->nsel; j < p->k; j++) {
        idx[j] = 0;
        val[j] = 0.0f;
    }
}

int dgc_compress(dgc_state *s, const float *g, const dgc_step_params *p, void *payload) {
    uint64_t cap = p->k * CANDIDATE_CAP_FACTOR;
    if (cap < CANDIDATE_CAP_MIN) cap = CANDIDATE_CAP_MIN;
    if (cap > s->n) cap = s->n;
    if (reserve((void **)&s->cand, &s->cand_cap, cap, sizeof(uint32_t))) return -1;
    s->nsel = 0;

    float scale = 1.0f;
    if (p->clip_norm > 0) scale = dgc_rule_clip_scale(sum_squares(g, s->n), p->clip_norm, p->nranks);
    float thr;
    if (sampled_threshold(s, g, scale, p, &thr)) return -1;
    uint64_t ncand;
    int overflow;
    if (stream_update(s, g, scale, p, thr, &ncand, &overflow)) {
        pack(s, p, DGC_WIRE_NONFINITE, payload);
        return 0;
    }
    if (overflow) {
        if (select_exact(s, p->k)) return -1;
    } else {
        dgc_topk_indices(s->cand, ncand, p->k, s->v_next);
        s->nsel = ncand < p->k ? ncand : p->k;
    }
    pack(s, p, 0, payload);
    return 0;
}

static void swap_arrays(float **a, float **b) {
    float *t = *a;
    *a = *b;
    *b = t;
}

void dgc_commit(dgc_state *s, const dgc_step_params *p) {
    swap_arrays(&s->v, &s->v_next);
    if (s->u) swap_arrays(&s->u, &s->u_next);
    for (uint64_t j = 0; j < s->nsel; j++) {
        uint32_t i = s->cand[j];
        s->v[i] = 0.0f;
        if (s->u && p->momentum_masking) s->u[i] = 0.0f;
    }
    s->nsel = 0;
}

void dgc_discard(dgc_state *s) { s->nsel = 0; }
