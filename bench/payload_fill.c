/* payload_fill: how full the host engine's payloads are, i.e. the pairs a
 * call sends over what it could send, min(k, the non-zeros of the updated
 * residual), by buffer size and density.
 *
 * The threshold comes from a sample (DGC_SAMPLE_RATIO of the buffer, at least
 * enough for 16 expected hits) aimed at about twice k candidates, or from the
 * whole buffer where a sample would be half of it or more, or could not rank
 * k elements (density near 1). Where the sample's threshold lands above the
 * true k-th largest, fewer than k pairs go out: what stays waits in the
 * residual for a later call (nothing is lost: docs/algorithm.md).
 *
 * For each size and density it runs --steps calls of one state (momentum 0,
 * gradients N(0,1), a heavy-tailed variant, N(0,1) cubed, and one whose
 * non-zeros are a block of 1% of the buffer at a new offset each call, as an
 * embedding's gradient) and prints the
 * smallest and the mean fill over the calls after the first (the first call
 * sees no residual). Counts, not times: the figures do not depend on the
 * machine's load.
 *
 *   payload_fill [--steps S] [--sample-ratio R] */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dgcshim/engine.h"
#include "dgcshim/wire.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double uniform(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return ((double)(rng >> 11) + 0.5) / 9007199254740992.0;
}
static float normal(void) { return (float)(sqrt(-2.0 * log(uniform())) * cos(6.283185307179586 * uniform())); }

/* The smallest and mean fill over the calls after the first. */
static const char *const pattern_names[] = {"N(0,1)", "N(0,1)^3", "1% block"};

static void gradient(float *g, uint64_t n, int pattern, long t) {
    const uint64_t len = n / 100 ? n / 100 : 1, at = (uint64_t)(t * 7919) % (n - len + 1);
    for (uint64_t i = 0; i < n; i++) {
        float x = normal();
        if (pattern == 1) x = x * x * x;
        if (pattern == 2 && (i < at || i >= at + len)) x = 0.0f;
        g[i] = x;
    }
}

static int measure(uint64_t n, double density, int pattern, long steps, double ratio, double *min, double *mean) {
    dgc_state *s = dgc_state_create(n, 0);
    float *g = malloc(n * sizeof *g);
    uint64_t k = (uint64_t)ceil(density * (double)n);
    if (k < 1) k = 1;
    void *payload = malloc(dgc_wire_bytes(k));
    if (!s || !g || !payload) return -1;
    dgc_step_params p = {.n = n, .k = k, .nranks = 4, .sample_ratio = ratio, .value_bits = 32};
    *min = 1.0;
    double sum = 0;
    for (long t = 0; t < steps; t++) {
        gradient(g, n, pattern, t);
        /* Zeros are never sent: a call can fill at most the non-zeros of
         * the updated residual (momentum 0: v + g). */
        const float *v = dgc_state_residual(s);
        uint64_t nonzero = 0;
        for (uint64_t i = 0; i < n; i++) nonzero += v[i] + g[i] != 0.0f;
        const uint64_t room = nonzero < k ? nonzero : k;
        p.step = (uint64_t)t;
        if (dgc_compress(s, g, &p, payload)) return -1;
        double fill = room ? (double)dgc_last_selected(s) / (double)room : 1.0;
        dgc_commit(s, &p);
        if (t == 0) continue;
        sum += fill;
        if (fill < *min) *min = fill;
    }
    *mean = sum / (double)(steps - 1);
    dgc_state_destroy(s);
    free(g);
    free(payload);
    return 0;
}

int main(int argc, char **argv) {
    long steps = 20;
    double ratio = 0.01;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--steps")) steps = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--sample-ratio")) ratio = atof(argv[i + 1]);
        else {
            fprintf(stderr, "usage: payload_fill [--steps S] [--sample-ratio R]\n");
            return 64;
        }
    }
    if (steps < 2) steps = 2;
    static const uint64_t sizes[] = {100, 1000, 10000, 100000, 1000000};
    static const double densities[] = {1.0, 0.25, 0.0625, 0.01, 0.001};
    printf("# payload_fill: pairs sent / min(k, non-zeros), host engine, %ld calls, DGC_SAMPLE_RATIO=%g, momentum 0\n", steps,
           ratio);
    printf("# %10s %8s  %-12s %8s %8s\n", "n", "density", "gradients", "min", "mean");
    for (size_t a = 0; a < sizeof sizes / sizeof *sizes; a++)
        for (size_t b = 0; b < sizeof densities / sizeof *densities; b++)
            for (int pattern = 0; pattern < 3; pattern++) {
                double min, mean;
                if (measure(sizes[a], densities[b], pattern, steps, ratio, &min, &mean)) {
                    fprintf(stderr, "payload_fill: no memory at n %llu\n", (unsigned long long)sizes[a]);
                    return 1;
                }
                printf("  %10llu %8g  %-12s %8.4f %8.4f\n", (unsigned long long)sizes[a], densities[b],
                       pattern_names[pattern], min, mean);
            }
    return 0;
}
