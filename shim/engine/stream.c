/* The update stream (engine/stream.h), one text for every instruction set:
 * CMake compiles it plainly for the generic variant and again with -mavx2 or
 * -mavx512f and DGC_STREAM_NAME set for the others.
 *
 * The loop works on CHUNKs of 16 floats held in one 64-byte vector type; the
 * compiler maps it onto one AVX-512 register, two AVX ones or four SSE ones,
 * so the arithmetic (the rules of update_rules.h) is written once. Only the
 * non-temporal store, the compares and the packing of candidates need
 * intrinsics, below.
 *
 * Why this shape: the pass is bound by memory, and on a core shared by
 * several ranks (emulated hosts, or a busy node) every instruction counts
 * too. The new v and u and the zeroed output go out with non-temporal
 * stores, which skip the read-for-ownership a plain store to a cold line
 * costs; the threshold test is one compare per chunk, and only chunks with a
 * candidate go on to collect it. They pack their candidates to the end of the
 * list with a permutation and full-width stores, not lane by lane: in
 * warm-up a quarter to half of all elements are candidates, and a branch per
 * lane would mispredict as often as not. */
#include "stream.h"

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
typedef uint32_t vu __attribute__((vector_size(CHUNK * sizeof(float))));

INLINE void load(vf *x, const float *p) { memcpy(x, p, sizeof *x); /* g may be unaligned */ }

/* Sets bit 31 of acc in the lanes whose |x| is Inf or NaN
 * (dgc_rule_nonfinite): an exponent of all ones, which one more exponent
 * step carries into the sign bit. No compare, for the reason in
 * magnitude_mask. */
INLINE void or_nonfinite(vu *acc, const vf *x) {
    vu b;
    memcpy(&b, x, sizeof b);
    *acc |= (b & 0x7f800000u) + 0x00800000u;
}

/* 1 when some lane of x has bit 31 set. */
INLINE int any_sign(const vu *x) {
#if defined(__AVX512F__)
    __m512i r;
    memcpy(&r, x, sizeof r);
    return _mm512_test_epi32_mask(r, _mm512_set1_epi32((int)0x80000000u)) != 0;
#elif defined(__AVX__)
    __m256 h[2];
    memcpy(h, x, sizeof h);
    return (_mm256_movemask_ps(h[0]) | _mm256_movemask_ps(h[1])) != 0;
#elif defined(__SSE2__)
    __m128 q[4];
    memcpy(q, x, sizeof q);
    return (_mm_movemask_ps(q[0]) | _mm_movemask_ps(q[1]) | _mm_movemask_ps(q[2]) | _mm_movemask_ps(q[3])) != 0;
#else
    uint32_t any = 0;
    for (int q = 0; q < CHUNK; q++) any |= (*x)[q];
    return any >> 31;
#endif
}

/* dgc_rule_saturate, lane by lane: +-Inf becomes +-FLT_MAX (t is 0 exactly
 * there; NaN stays), and *ovf is set when some lane did. Only for the rare
 * chunk where some sum was not finite. */
INLINE void saturate(vf *x, uint32_t *ovf) {
    vu b;
    memcpy(&b, x, sizeof b);
    const vu t = (b & 0x7fffffffu) ^ 0x7f800000u;
    const vu inf = -(((t - 1u) & ~t) >> 31); /* all ones where t == 0 */
    b = (b & ~inf) | (((b & 0x80000000u) | DGC_RULE_FLT_MAX_BITS) & inf);
    memcpy(x, &b, sizeof b);
    *ovf |= (uint32_t)any_sign(&inf);
}

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

/* Bit q set when |vn[q]| >= t, or > t when strict; NaN never (the compare
 * is ordered, as C's >= is). |x| is x without its sign bit, as fabsf makes
 * it. The compare is written for the native width: GCC 12 lowers a compare
 * of two 64-byte vectors on a target with narrower ones not to AVX or SSE
 * halves but to 16 scalar compares and a round trip through the stack, which
 * cost the pass more than all its arithmetic. */
INLINE unsigned magnitude_mask(const vf *vn, float t, int strict) {
    vi bits;
    memcpy(&bits, vn, sizeof bits);
    bits &= 0x7fffffff;
#if defined(__AVX512F__)
    __m512 a;
    memcpy(&a, &bits, sizeof a);
    const __m512 tv = _mm512_set1_ps(t);
    return strict ? _mm512_cmp_ps_mask(a, tv, _CMP_GT_OQ) : _mm512_cmp_ps_mask(a, tv, _CMP_GE_OQ);
#elif defined(__AVX__)
    __m256 a[2];
    memcpy(a, &bits, sizeof a);
    const __m256 tv = _mm256_set1_ps(t);
    unsigned m = 0;
    for (int k = 0; k < 2; k++) {
        __m256 r = strict ? _mm256_cmp_ps(a[k], tv, _CMP_GT_OQ) : _mm256_cmp_ps(a[k], tv, _CMP_GE_OQ);
        m |= (unsigned)_mm256_movemask_ps(r) << (8 * k);
    }
    return m;
#elif defined(__SSE2__)
    __m128 a[4];
    memcpy(a, &bits, sizeof a);
    const __m128 tv = _mm_set1_ps(t);
    unsigned m = 0;
    for (int k = 0; k < 4; k++) {
        __m128 r = strict ? _mm_cmpgt_ps(a[k], tv) : _mm_cmpge_ps(a[k], tv);
        m |= (unsigned)_mm_movemask_ps(r) << (4 * k);
    }
    return m;
#else
    vf a;
    memcpy(&a, &bits, sizeof a);
    vi r = strict ? a > t : a >= t;
    unsigned m = 0;
    for (int q = 0; q < CHUNK; q++) m |= (unsigned)(r[q] != 0) << q;
    return m;
#endif
}

/* Bit q set when |vn[q]| >= thr (NaN: not set; the step is dropped anyway). */
INLINE unsigned hit_mask(const vf *vn, float thr) { return magnitude_mask(vn, thr, 0); }

/* Bit q set when vn[q] is not zero, by the same float compare as
 * dgc_rule_selected's a > 0 (so denormals read alike under DAZ too): with
 * hit_mask, the exact selection test. Only a threshold of 0 or below makes it
 * matter, so it is asked only of chunks that have a hit. */
INLINE unsigned nonzero_mask(const vf *vn) { return magnitude_mask(vn, 0.0f, 1); }

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

#if defined(__AVX2__) && !defined(__AVX512F__)
/* For each 8-bit mask, the lanes it has set in ascending order, one byte each
 * (the rest 0): the permutation that packs those lanes to the front. Built by
 * the compiler from its definition, lane p going to byte popcount(m below p),
 * rather than typed out as 256 numbers. */
#define LANE_BIT(m, p) (((m) >> (p)) & 1u)
#define POP_BELOW(m, p) (LANE_BIT(m, 0) * ((p) > 0) + LANE_BIT(m, 1) * ((p) > 1) + LANE_BIT(m, 2) * ((p) > 2) + \
                         LANE_BIT(m, 3) * ((p) > 3) + LANE_BIT(m, 4) * ((p) > 4) + LANE_BIT(m, 5) * ((p) > 5) + \
                         LANE_BIT(m, 6) * ((p) > 6))
#define LANE_AT(m, p) ((uint64_t)(LANE_BIT(m, p) * (p)) << (8 * POP_BELOW(m, p)))
#define PACK_ORDER(m) (LANE_AT(m, 1) | LANE_AT(m, 2) | LANE_AT(m, 3) | LANE_AT(m, 4) | LANE_AT(m, 5) | \
                       LANE_AT(m, 6) | LANE_AT(m, 7)) /* lane 0 goes to byte 0 as 0: nothing to add */
#define PACK4(m) PACK_ORDER(m), PACK_ORDER((m) + 1), PACK_ORDER((m) + 2), PACK_ORDER((m) + 3)
#define PACK16(m) PACK4(m), PACK4((m) + 4), PACK4((m) + 8), PACK4((m) + 12)
#define PACK64(m) PACK16(m), PACK16((m) + 16), PACK16((m) + 32), PACK16((m) + 48)
static const uint64_t pack_order[256] = {PACK64(0u), PACK64(64u), PACK64(128u), PACK64(192u)};
#endif

/* Appends the lanes of vn set in sel, in lane order, as candidates c, c + 1,
 * ... (i is lane 0's index); returns the new count. It writes all CHUNK slots
 * from c on whatever sel holds: the lanes not selected land past the new
 * count, where the next chunk's candidates overwrite them or nothing reads
 * them, so the caller makes sure c + CHUNK <= cand_cap. No branch per lane:
 * at the densities of warm-up (a quarter to half the lanes) testing each bit
 * would mispredict about once in two. */
INLINE uint64_t pack_chunk(const dgc_stream_job *j, uint64_t c, uint64_t i, const vf *vn, unsigned sel) {
#if defined(__AVX512F__)
    /* Packed in the register, then one full store: the compress-to-memory
     * form is microcoded and slow on some cores (AMD's Zen 4). */
    __m512 r;
    memcpy(&r, vn, sizeof r);
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    __m512i idx = _mm512_add_epi32(lane, _mm512_set1_epi32((int)(uint32_t)i));
    _mm512_storeu_ps(j->cand_val + c, _mm512_maskz_compress_ps((__mmask16)sel, r));
    _mm512_storeu_si512(j->cand + c, _mm512_maskz_compress_epi32((__mmask16)sel, idx));
    return c + (uint64_t)__builtin_popcount(sel);
#elif defined(__AVX2__)
    /* Per half: the permutation from the table; permuting the lane numbers
     * 0..7 by it gives it back, so the indices are it plus the half's first. */
    __m256 h[2];
    memcpy(h, vn, sizeof h);
    for (int k = 0; k < 2; k++) {
        unsigned m = (sel >> (8 * k)) & 0xffu;
        __m256i perm = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)&pack_order[m]));
        __m256i idx = _mm256_add_epi32(perm, _mm256_set1_epi32((int)(uint32_t)(i + 8 * (unsigned)k)));
        _mm256_storeu_ps(j->cand_val + c, _mm256_permutevar8x32_ps(h[k], perm));
        _mm256_storeu_si256((__m256i *)(j->cand + c), idx);
        c += (uint64_t)__builtin_popcount(m); /* one POPCNT: GCC's -mavx2 implies it */
    }
    return c;
#else
    /* Every lane is written at slot c and c moves on only past selected
     * ones (SSE2 has no lane permutation by a variable). */
    for (int q = 0; q < CHUNK; q++) {
        j->cand[c] = (uint32_t)(i + (uint64_t)q);
        j->cand_val[c] = (*vn)[q];
        c += (sel >> q) & 1u;
    }
    return c;
#endif
}

/* The fewest selected lanes a chunk is packed for. The vector packs cost a
 * few instructions whatever the count, so they take every chunk with one;
 * the generic pack writes all CHUNK slots one by one, which costs more than
 * the bit-by-bit loop for the one or two lanes that most hit chunks of a
 * sparse step hold. */
#if defined(__AVX2__) || defined(__AVX512F__)
#define PACK_MIN_LANES 1
#else
#define PACK_MIN_LANES 3
#endif

/* Adds the candidates of the chunk at i whose hit_mask is hits (non-zero);
 * returns the new count. */
INLINE uint64_t add_chunk(const dgc_stream_job *j, uint64_t c, uint64_t i, const vf *vn, unsigned hits) {
    unsigned sel = hits & nonzero_mask(vn);
    unsigned rest = sel; /* non-zero when sel has PACK_MIN_LANES bits or more */
    for (int k = 1; k < PACK_MIN_LANES; k++) rest &= rest - 1;
    if (rest && c + CHUNK <= j->cand_cap) return pack_chunk(j, c, i, vn, sel);
    if (c >= j->cand_cap) return c + (uint64_t)__builtin_popcount(sel); /* past the room only the count goes on */
    for (; sel; sel &= sel - 1) { /* few lanes, or near the end of the room */
        int q = __builtin_ctz(sel);
        if (c < j->cand_cap) {
            j->cand[c] = (uint32_t)(i + (uint64_t)q);
            j->cand_val[c] = (*vn)[q];
        }
        c++;
    }
    return c;
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
    vu bad = {0}; /* bit 31 set in a lane whose scaled gradient was Inf or NaN */
    uint32_t ovf = 0;
    uint64_t c = 0;
    for (uint64_t ch = 0; ch < nchunks; ch++) {
        const uint64_t i = ch * CHUNK;
        vf gv, uv, vv;
        load(&gv, g + i);
        gv *= scale;
        or_nonfinite(&bad, &gv);
        load(&vv, v + i);
        /* The rules; their saturation changes nothing unless some sum
         * overflowed, so it is done only for a chunk where one did. */
        vf un = gv, add = gv;
        vu inf = {0};
        if (with_u) {
            load(&uv, u + i);
            un = nesterov ? m * (uv + gv) : m * uv + gv;
            add = nesterov ? un + gv : un;
            or_nonfinite(&inf, &un);
            or_nonfinite(&inf, &add);
        }
        vf vn = vv + add;
        or_nonfinite(&inf, &vn);
        if (__builtin_expect(any_sign(&inf), 0)) {
            if (with_u && nesterov) {
                vf sum = uv + gv;
                saturate(&sum, &ovf);
                un = m * sum;
                add = un + gv;
                saturate(&add, &ovf);
            } else if (with_u) {
                saturate(&un, &ovf);
                add = un;
            }
            vn = vv + add;
            saturate(&vn, &ovf);
        }
        put_nt(v_next + i, &vn);
        if (with_u) put_nt(u_next + i, &un);
        if (zero && i >= lag) put_nt(zero + i - lag, &z);
        unsigned hits = hit_mask(&vn, thr);
        if (hits) c = add_chunk(j, c, i, &vn, hits);
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
    for (int q = 0; q < CHUNK; q++) any_bad |= bad[q] >> 31;
    for (uint64_t i = nchunks * CHUNK; i < j->n; i++) { /* the tail, one by one */
        float un = 0.0f, gs = g[i] * scale;
        float add = with_u ? dgc_rule_momentum(u[i], gs, m, nesterov, &un, &ovf) : gs;
        float vn = dgc_rule_accumulate(v[i], add, &ovf);
        v_next[i] = vn;
        if (with_u) u_next[i] = un;
        if (zero) zero[i] = 0.0f;
        any_bad |= dgc_rule_nonfinite(gs);
        c = add_candidate(j, c, i, vn);
    }
    *ncand = c;
    if (any_bad) return DGC_STREAM_NONFINITE; /* the step is dropped: what the update holds does not matter */
    return ovf ? DGC_STREAM_SATURATED : 0u;
}

uint32_t DGC_STREAM_NAME(const dgc_stream_job *job, uint64_t *ncand) {
    if (!job->u) return run(job, 0, 0, ncand);
    if (job->nesterov) return run(job, 1, 1, ncand);
    return run(job, 1, 0, ncand);
}
