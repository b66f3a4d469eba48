#include "test_common.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int rank, nranks;

void test_init(int *argc, char ***argv, int required) {
    int provided = MPI_THREAD_SINGLE;
    MPI_Init_thread(argc, argv, required, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    if (provided < required) fail("MPI gives thread level %d, the test needs %d", provided, required);
}

void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "FAIL rank %d: ", rank);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    MPI_Abort(MPI_COMM_WORLD, 1);
    abort();
}

uint64_t splitmix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

float grad(int r, long s, long i) {
    uint64_t h = splitmix(((uint64_t)r << 48) ^ ((uint64_t)s << 24) ^ (uint64_t)i);
    double u = (double)(h >> 11) / 9007199254740992.0 * 2.0 - 1.0;
    double scale = pow(10.0, -(double)(splitmix((uint64_t)i) % 3));
    return (float)(u * scale);
}

void fill_grad(float *g, int r, long s, long n) {
    for (long i = 0; i < n; i++) g[i] = grad(r, s, i);
}

static uint64_t hash_bytes(const void *p, size_t len) {
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

void check_identical(const float *out, long n, MPI_Comm comm, const char *what) {
    int size, me;
    MPI_Comm_size(comm, &size);
    MPI_Comm_rank(comm, &me);
    uint64_t h = hash_bytes(out, (size_t)n * sizeof *out);
    uint64_t *all = malloc((size_t)size * sizeof *all);
    MPI_Allgather(&h, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, comm);
    for (int r = 1; r < size; r++)
        if (all[r] != all[0]) fail("%s: output bytes differ between rank 0 and rank %d of its communicator", what, r);
    free(all);
}

long status_kb(const char *field) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    size_t len = strlen(field);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, field, len) && line[len] == ':') kb = atol(line + len + 1);
    if (f) fclose(f);
    if (kb < 0) fail("no %s in /proc/self/status", field);
    return kb;
}

long k_for(long n, double density) {
    long k = (long)ceil(density * (double)n * (1.0 - 1e-12));
    return k < 1 ? 1 : k > n ? n : k;
}

/* The k-th largest of a[0..n) (k counted from 0), by quickselect: a is
 * reordered. Written here, not taken from the shim, so the reference stays
 * independent. */
static float kth_largest(float *a, long n, long k) {
    long lo = 0, hi = n - 1;
    uint64_t seed = 0x2545f4914f6cdd1dull;
    while (lo < hi) {
        seed = splitmix(seed);
        float pivot = a[lo + (long)(seed % (uint64_t)(hi - lo + 1))];
        long i = lo, j = hi;
        while (i <= j) {
            while (a[i] > pivot) i++;
            while (a[j] < pivot) j--;
            if (i <= j) {
                float t = a[i];
                a[i++] = a[j];
                a[j--] = t;
            }
        }
        if (k <= j) hi = j;
        else if (k >= i) lo = i;
        else return a[k];
    }
    return a[k];
}

void first_step_reference(long n, long k, int ranks, float (*g)(int r, long i, void *ctx), void *ctx, float *out) {
    float *v = malloc((size_t)n * sizeof *v), *mag = malloc((size_t)n * sizeof *mag);
    memset(out, 0, (size_t)n * sizeof *out);
    for (int r = 0; r < ranks; r++) {
        for (long i = 0; i < n; i++) {
            v[i] = g(r, i, ctx);
            mag[i] = fabsf(v[i]);
        }
        float thr = kth_largest(mag, n, k - 1);
        /* Everything above the k-th largest, then ties with it up to k. */
        long taken = 0;
        for (long i = 0; i < n; i++)
            if (fabsf(v[i]) > thr) out[i] += v[i], taken++;
        for (long i = 0; i < n && taken < k && thr > 0; i++)
            if (fabsf(v[i]) == thr) out[i] += v[i], taken++;
    }
    free(v);
    free(mag);
}
