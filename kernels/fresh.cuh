/* The update of one element, and the updated residual computed where it is
 * needed instead of kept.
 *
 * A state after the warm-up holds one copy of the residual v and momentum u
 * (state.cu: no dense room). The compression reads g, u and v and writes
 * neither: what it needs of the updated values (the threshold sample, the
 * candidates, on the exact path the whole buffer) it computes from them on
 * the fly, and the commit (commit.cu) computes them once more, now that the
 * step is known to go through, and writes them. The rules are the host's
 * (update_rules.h) and the build has no contraction (--fmad=false), so every
 * computation of one element gives the same bits. */
#ifndef DGCSHIM_KERNELS_FRESH_CUH
#define DGCSHIM_KERNELS_FRESH_CUH

#include "device.cuh"
#include "dgcshim/update_rules.h"

namespace dgc_cuda {

/* One element's update, the host's expressions in the host's order: g*scale
 * first, even when scale is 1 (x*1 == x). Returns the updated residual, the
 * new momentum in *un; *bad and *ovf collect the rules' flags. */
template <bool MOM, bool NEST>
__device__ __forceinline__ float update_one(float g, float u, float v, float scale, float m, float *un,
                                            uint32_t *bad, uint32_t *ovf) {
    const float gs = g * scale;
    *bad |= dgc_rule_nonfinite(gs);
    float add = gs;
    if (MOM) add = dgc_rule_momentum(u, gs, m, NEST, un, ovf);
    return dgc_rule_accumulate(v, add, ovf);
}

/* Which values a select job's position t stands for, when the job reads no
 * array (select_job.fresh). */
enum {
    FRESH_NONE = 0,    /* the job's vals array */
    FRESH_SAMPLE = 1,  /* the threshold sample: run t / DGC_SAMPLE_RUN of the plan, |updated v| (NaN as Inf) */
    FRESH_ELEMENT = 2, /* element t's updated v itself (the exact path: every element) */
};

/* struct fresh_src (what an updated value is computed from) is in
 * internal.cuh: the state keeps the latest call's for the commit. */

__device__ __forceinline__ float fresh_load(const fresh_src &s, uint64_t e) {
    switch (s.dtype) {
    case DGC_GPU_F16: return elem<DGC_GPU_F16>::load(s.g, e);
    case DGC_GPU_BF16: return elem<DGC_GPU_BF16>::load(s.g, e);
    default: return elem<DGC_GPU_F32>::load(s.g, e);
    }
}

/* Element e's updated residual; scale: fresh_scale's. */
__device__ __forceinline__ float fresh_update(const fresh_src &s, uint64_t e, float scale) {
    const int cur = s.sc->cur;
    const float v = committed(s.v2, cur, s.ns)[e];
    const float g = fresh_load(s, e);
    float un;
    uint32_t bad = 0, ovf = 0; /* the update pass reports both */
    if (!s.u2) return update_one<false, false>(g, 0.0f, v, scale, s.m, &un, &bad, &ovf);
    const float u = committed(s.u2, cur, s.ns)[e];
    if (s.nesterov) return update_one<true, true>(g, u, v, scale, s.m, &un, &bad, &ovf);
    return update_one<true, false>(g, u, v, scale, s.m, &un, &bad, &ovf);
}

__device__ __forceinline__ float fresh_scale(const fresh_src &s) { return s.clip ? s.sc->scale : 1.0f; }

/* The value at position t of a job of kind fresh (not FRESH_NONE). */
__device__ __forceinline__ float fresh_value(const fresh_src &s, unsigned int fresh, uint64_t t, float scale) {
    if (fresh == FRESH_ELEMENT) return fresh_update(s, t, scale);
    uint64_t e = t;
    if (s.dense) {
        uint64_t len;
        const uint64_t i = t % DGC_SAMPLE_RUN;
        e = dgc_rule_run_start(s.n, s.runs, t / DGC_SAMPLE_RUN, s.whole, s.step, &len) + i;
        if (i >= len) return 0.0f; /* never: a dense plan's runs are full */
    }
    return dgc_rule_sample_value(fresh_update(s, e, scale));
}

/* A job's value at position i: its array's, or computed. */
__device__ __forceinline__ float job_value(const float *vals, unsigned int fresh, const fresh_src &s, uint64_t i,
                                           float scale) {
    return fresh == FRESH_NONE ? vals[i] : fresh_value(s, fresh, i, scale);
}

} // namespace dgc_cuda

#endif
