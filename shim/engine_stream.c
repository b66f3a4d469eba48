/* The update stream (engine_stream.h), one text for every instruction set:
 * CMake compiles it plainly for the generic variant and again with -mavx2 or
 * -mavx512f and DGC_STREAM_NAME set for the others.
 *
 * The loop works on CHUNKs of 16 floats held in one 64-byte vector type; the
 * compiler maps it onto one AVX-512 register, two AVX ones or four SSE ones,
 * so the arithmetic (the rules of update_rules.h) is written once. Only the
 * non-temporal store and the candidate mask need intrinsics, below.
 *
 * Why this shape: the pass is bound by memory, and on a core shared by
 * several ranks (emulated hosts, or a busy node) every instruction counts
 * too. The new v and u and the zeroed output go out with non-temporal
 * stores, which skip the read-for-ownership a plain store to a cold line
 * costs; the threshold test is one compare per chunk, and only chunks with a
 * candidate are looked at lane by lane. */
#include "engine_stream.h"

#include <string.h>
#ifdef __SSE2__
#include <immintrin.h>
#endif

#include "dgcshim/update_rules.h"

#ifndef DGC_STREAM_NAME
#define DGC_STREAM_NAME dgc_stream_update_generic
#endif

#define CHUNK 16
#define INLINE static inline __attribute__((always_inline))

/* Vectors go by pointer between the helpers: a 64-byte vector passed by value
 * would have a different ABI in each variant. */
typedef float vf __attribute__((vector_size(CHUNK * sizeof(float))));
typedef int32_t vi __attribute__((vector_size(CHUNK * sizeof(float))));

INLINE void load(vf *x, const float *p) { memcpy(x, p, sizeof *x); /* g may be unaligned */ }

/* Non-temporal store of a chunk to p, which is 64-byte aligned. */
INLINE void put_nt(float *p, const vf *x) {
#if defined(__AVX512F__)
    __m512 r;
    memcpy(&r, x, sizeof r);
    _mm512_stream_ps(p, r);
#elif defined(__AVX__)
    __m256 h[2];
    memcpy(h, x, sizeof h);
    for (int k = 0; k < 2; k++) _mm256_stream_ps(p + 8 * k, h[k]);
#elif defined(__SSE2__)
    __m128 q[4];
    memcpy(q, x, sizeof q);
    for (int k = 0; k < 4; k++) _mm_stream_ps(p + 4 * k, q[k]);
#else
    memcpy(p, x, sizeof *x);
#endif
}

/* Bit q set when |vn[q]| >= thr (NaN: not set; the step is dropped anyway). */
INLINE unsigned hit_mask(const vf *vn, float thr) {
    vi bits;
    memcpy(&bits, vn, sizeof bits);
    bits &= 0x7fffffff;
    vf a;
    memcpy(&a, &bits, sizeof a);
#if defined(__AVX512F__)
    __m512 r;
    memcpy(&r, &a, sizeof r);
    return _mm512_cmp_ps_mask(r, _mm512_set1_ps(thr), _CMP_GE_OQ);
#else
    vi ge = a >= thr;
#if defined(__AVX__)
    __m256 h[2];
    memcpy(h, &ge, sizeof h);
    return (unsigned)_mm256_movemask_ps(h[0]) | (unsigned)_mm256_movemask_ps(h[1]) << 8;
#elif defined(__SSE2__)
    __m128 q[4];
    memcpy(q, &ge, sizeof q);
    unsigned m = 0;
    for (int k = 0; k < 4; k++) m |= (unsigned)_mm_movemask_ps(q[k]) << (4 * k);
    return m;
#else
    unsigned m = 0;
    for (int q = 0; q < CHUNK; q++) m |= (unsigned)(ge[q] != 0) << q;
    return m;
#endif
#endif
}

/* Counts element i (updated value vn) as candidate number c when it is
 * selected, storing it while there is room; returns the new count. */
INLINE uint64_t add_candidate(const dgc_stream_job *j, uint64_t c, uint64_t i, float vn) {
    if (!dgc_rule_selected(vn, j->thr)) return c;
    if (c < j->cand_cap) {
        j->cand[c] = (uint32_t)i;
        j->cand_val[c] = vn;
    }
    return c + 1;
}

/* with_u and nesterov are constants at every call site, so each variant of
 * the rules is its own straight-line loop. */
INLINE uint32_t run(const dgc_stream_job *j, int with_u, int nesterov, uint64_t *ncand) {
    const float *g = j->g; /* not restrict: zero may be g */
    const float *restrict u = j->u, *restrict v = j->v;
    float *restrict u_next = j->u_next, *restrict v_next = j->v_next;
    float *zero = j->zero;
    const float scale = j->scale, m = j->momentum, thr = j->thr;
    const uint64_t nchunks = j->n / CHUNK;
    /* The output's zero goes out in whole aligned lines too: a line is
     * written once the chunks holding it were read (out may be g), so it lags
     * the chunk by lag elements when out is not 64-byte aligned as v_next
     * is. Partial-line streaming stores would cost a read at the memory. */
    const uint64_t lag = zero ? ((uintptr_t)zero & 63) / sizeof(float) : 0;
    const vf z = {0};
    vi bad = {0};
    uint64_t c = 0;
    for (uint64_t ch = 0; ch < nchunks; ch++) {
        const uint64_t i = ch * CHUNK;
        vf gv, uv, vv;
        load(&gv, g + i);
        gv *= scale;
        vf un = gv, add = gv;
        if (with_u) {
            load(&uv, u + i);
            un = DGC_RULE_MOMENTUM(uv, gv, m, nesterov);
            add = DGC_RULE_ADDEND(un, gv, nesterov);
        }
        load(&vv, v + i);
        vf vn = DGC_RULE_ACCUMULATE(vv, add);
        put_nt(v_next + i, &vn);
        if (with_u) put_nt(u_next + i, &un);
        if (zero && i >= lag) put_nt(zero + i - lag, &z);
        vi bits;
        memcpy(&bits, &vn, sizeof bits);
        bad |= (bits & 0x7f800000) == 0x7f800000;
        for (unsigned hits = hit_mask(&vn, thr); hits; hits &= hits - 1) {
            int q = __builtin_ctz(hits);
            c = add_candidate(j, c, i + (uint64_t)q, vn[q]);
        }
    }
#ifdef __SSE2__
    _mm_sfence(); /* streaming stores are weakly ordered */
#endif
    if (zero && nchunks) { /* the partial lines at both ends, all read by now */
        uint64_t first = (CHUNK - lag) % CHUNK, end = nchunks * CHUNK;
        memset(zero, 0, first * sizeof(float));
        memset(zero + end - lag, 0, lag * sizeof(float));
    }
    uint32_t any_bad = 0;
    for (int q = 0; q < CHUNK; q++) any_bad |= (uint32_t)bad[q];
    for (uint64_t i = nchunks * CHUNK; i < j->n; i++) { /* the tail, one by one */
        float un = 0.0f, gs = g[i] * scale;
        float add = with_u ? dgc_rule_momentum(u[i], gs, m, nesterov, &un) : gs;
        float vn = dgc_rule_accumulate(v[i], add);
        v_next[i] = vn;
        if (with_u) u_next[i] = un;
        if (zero) zero[i] = 0.0f;
        any_bad |= dgc_rule_nonfinite(vn);
        c = add_candidate(j, c, i, vn);
    }
    *ncand = c;
    return any_bad != 0;
}

uint32_t DGC_STREAM_NAME(const dgc_stream_job *job, uint64_t *ncand) {
    if (!job->u) return run(job, 0, 0, ncand);
    if (job->nesterov) return run(job, 1, 1, ncand);
    return run(job, 1, 0, ncand);
}
