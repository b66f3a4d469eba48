/* The 16-bit wire values (DGC_VALUE_BITS=16) written from their definition,
 * not from the shim, for the tests that check the shim against it
 * (tests/unit/test_compact.c, tests/mpi/allreduce_check.c): binary16 under a
 * per-payload scale 2^(e - 14), i.e. x to the nearest multiple of
 * q = 2^max(binade(x) - 10, e - 38, -149), ties to the even multiple, sign
 * kept, and the largest value below 2^128 where rounding would reach it.
 * Exact double arithmetic throughout. */
#ifndef DGCSHIM_TESTS_ROUND16_REF_H
#define DGCSHIM_TESTS_ROUND16_REF_H

#include <math.h>

/* floor(log2 |x|) of a non-zero finite double. */
static inline int ref_binade(double x) {
    int ex;
    frexp(x, &ex);
    return ex - 1;
}

/* x rounded for the wire under the scale e (|x| / q < 2^12 with at most 24
 * significant bits: exact in double). */
static inline float ref_round16(float x, int e) {
    double a = fabs((double)x);
    if (a == 0) return x;
    int qe = ref_binade(a) - 10;
    if (qe < e - 38) qe = e - 38;
    if (qe < -149) qe = -149;
    double t = ldexp(a, -qe), fl = floor(t), frac = t - fl;
    if (frac > 0.5 || (frac == 0.5 && fmod(fl, 2.0) == 1.0)) fl += 1;
    double r = ldexp(fl, qe);
    if (r >= ldexp(1, 128)) r = ldexp(2047, 117);
    return (float)copysign(r, (double)x); /* exact: representable */
}

/* The scale of a payload whose largest |value| is max: 0 when max is 0, else
 * its binade, one more when max rounds up into the next binade (below
 * 2^128): then the largest sent value lies in [2^e, 2^(e+1)). */
static inline int ref_scale16(double max) {
    if (max == 0) return 0;
    int e = ref_binade(max);
    if (e < 127 && fabs((double)ref_round16((float)max, e)) >= ldexp(1, e + 1)) e++;
    return e;
}

#endif
