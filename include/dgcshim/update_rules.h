/* The element-wise DGC update rules, written once for the host engine and the
 * CUDA kernels (which compile this header with DGC_HOSTDEV = __host__ __device__).
 *
 * Each function is one step of the per-element algorithm in DESIGN.md. Keeping
 * them here is what makes "the same steps on host and device" true by
 * construction rather than by review. */
#ifndef DGCSHIM_UPDATE_RULES_H
#define DGCSHIM_UPDATE_RULES_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "dgcshim/hostdev.h"

/* Saturation. The state holds what was not sent, and finite gradients can
 * add up past fp32's range there (a gradient of 1e38 held back for a few
 * steps). Every sum the rules form is held at +-FLT_MAX when it overflows:
 * Inf in the state would make every later step non-finite, and dropped, for
 * ever. The excess is lost; *ovf is set, and the callers count the steps
 * where it was (dgc_last_saturated). Only Inf becomes FLT_MAX: NaN stays
 * NaN. A non-finite gradient is caught before, by dgc_rule_nonfinite of the
 * scaled gradient: that step is dropped, whatever its update holds. */
#define DGC_RULE_FLT_MAX_BITS 0x7f7fffffu

DGC_HOSTDEV float dgc_rule_saturate(float x, uint32_t *ovf) {
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    if ((b & 0x7fffffffu) != 0x7f800000u) return x;
    *ovf = 1;
    b = (b & 0x80000000u) | DGC_RULE_FLT_MAX_BITS;
    memcpy(&x, &b, sizeof x);
    return x;
}

/* Momentum correction on one element: the new momentum, plain u = m*u + g
 * or Nesterov u = m*(u + g), written to *u_out; returns what the residual
 * gains: u, or u + g for Nesterov. m = 0 gives plain error feedback (the
 * residual gains g). Each sum saturated (|m| < 1: a product cannot pass
 * its factor). */
DGC_HOSTDEV float dgc_rule_momentum(float u, float g, float m, int nesterov, float *u_out, uint32_t *ovf) {
    if (nesterov) {
        const float un = m * dgc_rule_saturate(u + g, ovf);
        *u_out = un;
        return dgc_rule_saturate(un + g, ovf);
    }
    const float un = dgc_rule_saturate(m * u + g, ovf);
    *u_out = un;
    return un;
}

/* Residual accumulation: v = v + add, saturated. */
DGC_HOSTDEV float dgc_rule_accumulate(float v, float add, uint32_t *ovf) { return dgc_rule_saturate(v + add, ovf); }

/* The local-clipping factor: min(1, clip_norm / sqrt(nranks) / ||g||_2).
 * clip_norm <= 0 disables clipping. sumsq is sum(g^2) in double. */
DGC_HOSTDEV float dgc_rule_clip_scale(double sumsq, double clip_norm, int nranks) {
    if (clip_norm <= 0 || !(sumsq > 0)) return 1.0f;
    double limit = clip_norm / __builtin_sqrt((double)nranks);
    double norm = __builtin_sqrt(sumsq);
    return norm > limit ? (float)(limit / norm) : 1.0f;
}

/* 1 when |x| is Inf or NaN, by the exponent bits: vectorises, unlike isfinite. */
DGC_HOSTDEV uint32_t dgc_rule_nonfinite(float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    return (bits & 0x7f800000u) == 0x7f800000u;
}

/* Selection test: sent when at or above the threshold and not zero. */
DGC_HOSTDEV int dgc_rule_selected(float v, float thr) {
    float a = fabsf(v); /* not v < 0 ? -v : v, a branch that random signs mispredict */
    return (a >= thr) & (a > 0.0f);
}

/* The threshold sample, the same on host and device: the buffer is cut into
 * runs equal strata; stratum r (elements [r*n/runs, (r+1)*n/runs)) gives one
 * run of up to DGC_SAMPLE_RUN consecutive elements, starting at a position
 * drawn from (step, r) alone, so that both engines (and every thread of a
 * kernel) compute it independently. whole: the runs tile the buffer (the
 * sample is all of it). Returns the run's first element; *len its length. */
#define DGC_SAMPLE_RUN 16

DGC_HOSTDEV uint64_t dgc_rule_mix(uint64_t x) { /* splitmix64's finaliser */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

DGC_HOSTDEV uint64_t dgc_rule_run_start(uint64_t n, uint64_t runs, uint64_t r, int whole, uint64_t step,
                                        uint64_t *len) {
    uint64_t lo = r * n / runs, hi = (r + 1) * n / runs;
    uint64_t l = hi - lo < DGC_SAMPLE_RUN ? hi - lo : DGC_SAMPLE_RUN;
    *len = l;
    if (whole) return lo;
    uint64_t draw = dgc_rule_mix((step + 1) * 0x9e3779b97f4a7c15ull + r);
    return lo + draw % (hi - lo - l + 1);
}

/* A sampled value: |updated v|, with NaN read as Inf (keeps the order sound;
 * the step is dropped anyway). */
DGC_HOSTDEV float dgc_rule_sample_value(float v_new) {
    float a = fabsf(v_new);
    return a != a ? INFINITY : a;
}

#endif
