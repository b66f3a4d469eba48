/* Small pieces the host benchmarks share: a monotonic clock, the best of
 * repeated timings, and a strict unsigned option parser. */
#ifndef DGCSHIM_BENCH_UTIL_H
#define DGCSHIM_BENCH_UTIL_H

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline double best_of(const double *t, int n) {
    double b = t[0];
    for (int i = 1; i < n; i++)
        if (t[i] < b) b = t[i];
    return b;
}

/* A whole decimal number, nothing after it, no sign: 0 or -1. */
static inline int parse_u64(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-') return -1;
    *out = v;
    return 0;
}

#endif
