/* An ordinary MPI program that checks what MPI_Allreduce returns when run
 * under LD_PRELOAD=libdgcshim.so. It knows nothing of the shim's code: its
 * DGC reference below is written from DESIGN.md alone, and pass-through is
 * checked against PMPI_Allreduce, which the shim does not intercept.
 *
 *   allreduce_check reference [options]   DGC result == independent reference
 *                                         (--ties 1: gradients of many equal values;
 *                                         --mismatch-at S: before step S one call whose
 *                                         count differs between ranks, which must fail
 *                                         on every rank and leave the steps after it
 *                                         the reference's, as if it never was)
 *   allreduce_check passthrough [--expect-compressed 0|1]
 *   allreduce_check distinct [--n K] [--steps M] K calls of K distinct counts (17..K+16),
 *                                         the last M of them compared with PMPI_Allreduce
 *                                         bit for bit (past the shim's count table they pass through)
 *   allreduce_check drain [options]       conservation over many steps
 *   allreduce_check exact [--n K] [--steps M]
 *                                         at DGC_SPARSITY=0, integer sums exact every call
 *   allreduce_check stats                 a 1M-element buffer for DGC_STATS
 *   allreduce_check optimizer [--momentum m] [--dump FILE]
 *                                         SGD with momentum over the shim's output
 *   allreduce_check compare FILE FILE     two weight dumps agree to rounding
 *
 * Every mode also checks that all ranks hold identical output bytes. Exits 0
 * and prints "PASS mode" on rank 0, or prints the first failure and exits 1. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/round16_ref.h"
#include "test_common.h"

typedef struct {
    long n, steps, warmup, nonfinite_step, mismatch_at;
    double sparsity, momentum, clip;
    int nesterov, masking, inplace, expect_compressed, inf, compensate;
    int misalign; /* bytes past float alignment of the send and receive buffers */
    int ties;     /* gradients of ties: all 1.0 but the last element, 2 + rank */
    const char *dump;
    int value_bits; /* DGC_VALUE_BITS as the shim reads it: 16 (the default) or 32 */
    double value;   /* mode overflow: every gradient element */
} options;

/* ---- the reference, from DESIGN.md ---- */
static double density_at(const options *o, long step) {
    double target = 1.0 - o->sparsity;
    if (step >= o->warmup) return target;
    int stages = 0;
    for (double d = 0.25; d > target; d /= 4) stages++;
    if (stages == 0) return target;
    long stage = step * stages / o->warmup;
    double d = 0.25 / pow(4.0, (double)stage);
    return d > target ? d : target;
}

static long k_at(const options *o, long step) {
    /* ceil, forgiving the rounding of 1 - sparsity (0.001 comes out a hair
     * above 0.001 in double): DESIGN.md's k is ceil of the exact product. */
    long k = (long)ceil(density_at(o, step) * (double)o->n * (1.0 - 1e-12));
    return k < 1 ? 1 : k > o->n ? o->n : k;
}

typedef struct {
    float *u, *v;
} ref_rank;

static const float *sort_key;
static int by_magnitude_desc(const void *a, const void *b) {
    float x = fabsf(sort_key[*(const long *)a]), y = fabsf(sort_key[*(const long *)b]);
    /* Ties by index, lowest first: the shim's rule (at most k, the first
     * ones in the buffer) */
    long i = *(const long *)a, j = *(const long *)b;
    return x < y ? 1 : x > y ? -1 : i < j ? -1 : i > j;
}

/* The scale of one payload's count values (tests/common/round16_ref.h). */
static int payload_scale(const float *v, const long *sel, long count) {
    double max = 0;
    for (long j = 0; j < count; j++)
        if (fabs((double)v[sel[j]]) > max) max = fabs((double)v[sel[j]]);
    return ref_scale16(max);
}

/* A value as the wire carries it: fp32, or 16 bits under the scale e. */
static float on_the_wire(float x, int value_bits, int e) { return value_bits == 32 ? x : ref_round16(x, e); }

/* One step of rank r's DGC state; adds its sent pairs into out and their
 * magnitudes into amag. */
static void ref_step(const options *o, ref_rank *st, const float *g0, long k, float *out, float *amag,
                     long *order) {
    long n = o->n;
    float scale = 1.0f;
    if (o->clip > 0) {
        double ss = 0;
        for (long i = 0; i < n; i++) ss += (double)g0[i] * g0[i];
        double limit = o->clip / sqrt((double)nranks), norm = sqrt(ss);
        if (norm > limit) scale = (float)(limit / norm);
    }
    float m = (float)o->momentum;
    for (long i = 0; i < n; i++) {
        float g = g0[i] * scale;
        if (o->nesterov) {
            st->u[i] = m * (st->u[i] + g);
            st->v[i] = st->v[i] + (st->u[i] + g);
        } else {
            st->u[i] = m * st->u[i] + g;
            st->v[i] = st->v[i] + st->u[i];
        }
    }
    for (long i = 0; i < n; i++) order[i] = i;
    sort_key = st->v;
    qsort(order, (size_t)n, sizeof *order, by_magnitude_desc);
    long count = 0; /* the pairs sent: the k largest, zeros left out */
    while (count < k && st->v[order[count]] != 0) count++;
    int e = o->value_bits == 16 ? payload_scale(st->v, order, count) : 0;
    for (long j = 0; j < count; j++) {
        long i = order[j];
        float sent = on_the_wire(st->v[i], o->value_bits, e);
        out[i] += sent;
        amag[i] += fabsf(st->v[i]);
        st->v[i] -= sent; /* error feedback: what rounding lost stays */
        if (o->masking) st->u[i] = 0;
    }
}

/* mag: the size of the terms that made want, for a relative tolerance that
 * survives cancellation (S_t - m S_{t-1} can be near zero). */
static int close_enough(float a, float b, float mag) {
    return fabsf(a - b) <= 1e-5f * (fabsf(a) + fabsf(b) + mag) + 1e-7f;
}

static void check_against_reference(const options *o, const float *got, const float *want, const float *mag,
                                    long step) {
    for (long i = 0; i < o->n; i++)
        if (!close_enough(got[i], want[i], mag[i]))
            fail("step %ld element %ld: shim %.9g, reference %.9g", step, i, got[i], want[i]);
}

/* Momentum compensation (DESIGN.md): the shim returns S_t - m S_{t-1}, with
 * S_{t-1} the last finite step's summed update. want holds S_t and amag the
 * summed magnitudes of its pairs on entry; mag gets the magnitudes of every
 * term of the result (the shim subtracts pair by pair, so its rounding
 * follows the pairs, not their sum). */
static void compensate(const options *o, float *want, float *prev, const float *amag, float *prev_amag,
                       float *mag) {
    float m = (float)o->momentum;
    for (long i = 0; i < o->n; i++) {
        float s = want[i];
        mag[i] = amag[i];
        if (o->compensate && m != 0.0f) {
            want[i] = s - m * prev[i];
            mag[i] += m * prev_amag[i];
        }
        prev[i] = s;
        prev_amag[i] = amag[i];
    }
}

static void check_nonfinite(const float *out, long n, long step) {
    for (long i = 0; i < n; i++)
        if (isfinite(out[i])) fail("step %ld: element %ld is finite (%g) after a non-finite gradient", step, i, out[i]);
}

/* Rank r's gradient at step s: the common one, or with --ties 1 so many
 * equal values that they overflow the shim's candidate room and its exact
 * fallback has to keep them in index order beside a larger one. */
static void reference_grad(const options *o, float *g, int r, long s) {
    if (!o->ties) {
        fill_grad(g, r, s, o->n);
        return;
    }
    for (long i = 0; i < o->n; i++) g[i] = 1.0f;
    g[o->n - 1] = 2.0f + (float)r;
}

/* One erroneous call: rank r passes n + 8 r floats (MPI_ERRORS_RETURN, as
 * mpi4py sets it). Every rank must get an error; nothing may hang. */
static void call_with_mismatched_count(const options *o) {
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    const long m = o->n + 8L * rank;
    float *a = calloc((size_t)m, sizeof *a), *b = malloc((size_t)m * sizeof *b);
    if (!a || !b) fail("no memory");
    for (long i = 0; i < m; i++) a[i] = (float)((i * 7 + rank) % 13) - 6.0f;
    int rc = MPI_Allreduce(a, b, (int)m, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    int ok = rc == MPI_SUCCESS, any = 0;
    MPI_Allreduce(&ok, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (any) fail("the call with counts differing between ranks returned MPI_SUCCESS on some rank (this one: %d)", rc);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
    free(a);
    free(b);
}

static void mode_reference(const options *o) {
    long n = o->n;
    ref_rank *st = calloc((size_t)nranks, sizeof *st);
    for (int r = 0; r < nranks; r++) {
        st[r].u = calloc((size_t)n, sizeof(float));
        st[r].v = calloc((size_t)n, sizeof(float));
    }
    float *g = malloc((size_t)n * sizeof *g);
    /* The buffers MPI sees, o->misalign bytes past alignment: read and
     * written here only through memcpy. */
    size_t bytes = (size_t)n * sizeof(float);
    char *send_raw = malloc(bytes + 8), *recv_raw = malloc(bytes + 8);
    char *send = send_raw + o->misalign, *recv = recv_raw + o->misalign;
    float *out = malloc((size_t)n * sizeof *out), *want = malloc((size_t)n * sizeof *want);
    float *prev = calloc((size_t)n, sizeof *prev), *mag = malloc((size_t)n * sizeof *mag);
    float *amag = malloc((size_t)n * sizeof *amag), *prev_amag = calloc((size_t)n, sizeof *prev_amag);
    long *order = malloc((size_t)n * sizeof *order);
    long nonzero_steps = 0;
    for (long s = 0; s < o->steps; s++) {
        int bad = s == o->nonfinite_step;
        if (s == o->mismatch_at) call_with_mismatched_count(o);
        reference_grad(o, g, rank, s);
        if (bad && rank == nranks - 1) g[n / 2] = o->inf ? INFINITY : NAN;
        if (o->inplace) {
            memcpy(recv, g, bytes);
            MPI_Allreduce(MPI_IN_PLACE, recv, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        } else {
            memcpy(send, g, bytes);
            MPI_Allreduce(send, recv, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        }
        memcpy(out, recv, bytes);
        check_identical(out, n, MPI_COMM_WORLD, "reference");
        if (bad) { /* a skipped step: no state changes anywhere */
            check_nonfinite(out, n, s);
            continue;
        }
        memset(want, 0, (size_t)n * sizeof *want);
        memset(amag, 0, (size_t)n * sizeof *amag);
        for (int r = 0; r < nranks; r++) {
            reference_grad(o, g, r, s);
            ref_step(o, &st[r], g, k_at(o, s), want, amag, order);
        }
        compensate(o, want, prev, amag, prev_amag, mag);
        check_against_reference(o, out, want, mag, s);
        for (long i = 0; i < n; i++) nonzero_steps += out[i] != 0;
    }
    if (nonzero_steps == 0) fail("the output was zero at every step");
    if (rank == 0) printf("PASS reference n=%ld steps=%ld ranks=%d\n", o->n, o->steps, nranks);
}

/* ---- pass-through: bit-exact with the real library ---- */
static void compare_with_pmpi(const void *in, size_t bytes, int count, MPI_Datatype dt, MPI_Op op,
                              const char *what, int inplace) {
    void *a = malloc(bytes), *b = malloc(bytes);
    if (inplace) {
        memcpy(a, in, bytes);
        MPI_Allreduce(MPI_IN_PLACE, a, count, dt, op, MPI_COMM_WORLD);
    } else {
        MPI_Allreduce(in, a, count, dt, op, MPI_COMM_WORLD);
    }
    PMPI_Allreduce(in, b, count, dt, op, MPI_COMM_WORLD);
    if (memcmp(a, b, bytes) != 0) fail("%s%s: MPI_Allreduce differs from PMPI_Allreduce", what, inplace ? " (in place)" : "");
    free(a);
    free(b);
}

static void mode_passthrough(const options *o) {
    long n = 100000;
    float *f = malloc((size_t)n * sizeof *f);
    int *ints = malloc((size_t)n * sizeof *ints);
    double *d = malloc((size_t)n * sizeof *d);
    fill_grad(f, rank, 0, n);
    for (long i = 0; i < n; i++) {
        ints[i] = (int)(f[i] * 1000);
        d[i] = f[i];
    }
    for (int ip = 0; ip <= 1; ip++) {
        compare_with_pmpi(ints, (size_t)n * sizeof *ints, (int)n, MPI_INT, MPI_SUM, "MPI_INT SUM", ip);
        compare_with_pmpi(d, (size_t)n * sizeof *d, (int)n, MPI_DOUBLE, MPI_SUM, "MPI_DOUBLE SUM", ip);
        compare_with_pmpi(f, (size_t)n * sizeof *f, (int)n, MPI_FLOAT, MPI_MAX, "MPI_FLOAT MAX", ip);
        compare_with_pmpi(f, 1000 * sizeof *f, 1000, MPI_FLOAT, MPI_SUM, "small MPI_FLOAT SUM", ip);
        compare_with_pmpi(f, 1 * sizeof *f, 1, MPI_FLOAT, MPI_SUM, "one-element MPI_FLOAT SUM", ip);
    }
    /* The large float SUM: compressed (fewer non-zeros than dense) or exact. */
    float *a = malloc((size_t)n * sizeof *a), *b = malloc((size_t)n * sizeof *b);
    MPI_Allreduce(f, a, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    PMPI_Allreduce(f, b, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    check_identical(a, n, MPI_COMM_WORLD, "large float SUM");
    long nz = 0;
    for (long i = 0; i < n; i++) nz += a[i] != 0;
    int exact = memcmp(a, b, (size_t)n * sizeof *a) == 0;
    if (o->expect_compressed && (exact || nz > n / 10))
        fail("a %ld-element MPI_FLOAT SUM was not compressed (%ld non-zeros): is the shim preloaded?", n, nz);
    if (!o->expect_compressed && !exact) fail("a %ld-element MPI_FLOAT SUM changed with the shim disabled", n);
    if (rank == 0) printf("PASS passthrough (large float SUM %s)\n", exact ? "exact" : "compressed");
}

/* ---- density 1 sends everything ----
 * At DGC_SPARSITY=0 (k = n) with fp32 values every element goes out in the
 * call it came in, so integer gradients (exact in fp32) sum exactly, every
 * call, as MPI's dense sum would: nothing may wait in a residual. At sizes
 * whose threshold comes from a sample (a run of 16 at n = 100, a sampled
 * fraction at 200,000) and from the whole buffer. --n K: that size alone. */
/* Step s's exact sum at element i over nranks ranks of exact_grad. */
static float exact_grad(int r, long s, long i) { return (float)((i * 7 + s) % 1000 + r); }
static float exact_sum(long s, long i) { return (float)(nranks * ((i * 7 + s) % 1000) + nranks * (nranks - 1) / 2); }

static void mode_exact(const options *o) {
    static const long sizes[] = {100, 1000, 20000, 200000};
    const long nsizes = o->n != 40000 ? 1 : (long)(sizeof sizes / sizeof *sizes);
    for (long z = 0; z < nsizes; z++) {
        const long n = o->n != 40000 ? o->n : sizes[z];
        float *g = malloc((size_t)n * sizeof *g), *out = malloc((size_t)n * sizeof *out);
        if (!g || !out) fail("no memory");
        for (long s = 0; s < o->steps; s++) {
            for (long i = 0; i < n; i++) g[i] = exact_grad(rank, s, i);
            MPI_Allreduce(g, out, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            check_identical(out, n, MPI_COMM_WORLD, "exact");
            long wrong = 0, first = -1;
            for (long i = 0; i < n; i++)
                if (out[i] != exact_sum(s, i) && wrong++ == 0) first = i;
            if (wrong)
                fail("n %ld, call %ld: %ld of %ld sums wrong (element %ld is %g, want %g)", n, s, wrong, n, first,
                     (double)out[first], (double)exact_sum(s, first));
        }
        free(g);
        free(out);
    }
    if (rank == 0) printf("PASS exact: %ld sizes, %ld calls each, every sum exact\n", nsizes, o->steps);
}

/* ---- conservation over many steps (momentum 0, default sampling) ----
 * Real gradients for o->steps steps, then zero gradients until the residuals
 * have drained: the summed outputs must then equal the summed inputs. The
 * drain ends at the first step after which they do; how long it takes
 * depends on the transport (the all-gather outputs up to N k pairs a step,
 * the reduce transport about k), so only a step past any transport's need
 * (20 n / k + 20) fails the case. */
static int drained(const double *in_sum, const double *out_sum, const double *mag, long n, long *worst) {
    for (long i = 0; i < n; i++)
        if (fabs(out_sum[i] - in_sum[i]) > 1e-4 * (1 + mag[i])) {
            *worst = i;
            return 0;
        }
    return 1;
}

static void mode_drain(const options *o) {
    long n = o->n, k = k_at(o, o->warmup + 1), zero_steps = 20 * n / k + 20, worst = 0;
    float *g = malloc((size_t)n * sizeof *g), *out = malloc((size_t)n * sizeof *out);
    double *in_sum = calloc((size_t)n, sizeof *in_sum), *out_sum = calloc((size_t)n, sizeof *out_sum);
    double *mag = calloc((size_t)n, sizeof *mag);
    long s = 0;
    for (; s < o->steps + zero_steps; s++) {
        if (s >= o->steps && drained(in_sum, out_sum, mag, n, &worst)) break;
        for (int r = 0; r < nranks; r++) {
            if (s < o->steps) fill_grad(g, r, s, n);
            else memset(g, 0, (size_t)n * sizeof *g);
            for (long i = 0; i < n; i++) {
                in_sum[i] += g[i];
                mag[i] += fabs(g[i]);
            }
        }
        if (s < o->steps) fill_grad(g, rank, s, n);
        else memset(g, 0, (size_t)n * sizeof *g);
        MPI_Allreduce(g, out, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        check_identical(out, n, MPI_COMM_WORLD, "drain");
        long nz = 0;
        for (long i = 0; i < n; i++) {
            out_sum[i] += out[i];
            nz += out[i] != 0;
        }
        long kk = k_at(o, s);
        if (nz > kk * nranks) fail("step %ld: %ld non-zeros, more than ranks x k = %ld", s, nz, kk * nranks);
        if (s == o->steps - 1 && nz == 0) fail("no output at all during the real steps");
    }
    if (!drained(in_sum, out_sum, mag, n, &worst))
        fail("element %ld after %ld zero steps: outputs sum to %.9g, inputs to %.9g", worst, zero_steps,
             out_sum[worst], in_sum[worst]);
    if (rank == 0) printf("PASS drain n=%ld steps=%ld, drained after %ld zero steps\n", n, o->steps, s - o->steps);
}

/* ---- many distinct counts: the table of step counters fills ---- */
static void mode_distinct(const options *o) {
    const long kinds = o->n, last = o->steps, top = kinds + 16;
    float *g = malloc((size_t)top * sizeof *g), *out = malloc((size_t)top * sizeof *out);
    if (!g || !out) fail("no memory");
    for (long c = 17; c <= top; c++) {
        for (long i = 0; i < c; i++) g[i] = (float)((i * 31 + c + rank) % 17) - 8.0f;
        if (c > top - last) {
            compare_with_pmpi(g, (size_t)c * sizeof *g, (int)c, MPI_FLOAT, MPI_SUM, "a count past the table", 0);
            continue;
        }
        MPI_Allreduce(g, out, (int)c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        check_identical(out, c, MPI_COMM_WORLD, "distinct");
    }
    free(g);
    free(out);
    if (rank == 0) printf("PASS distinct: %ld counts, the last %ld as PMPI_Allreduce\n", kinds, last);
}

/* ---- a residual that outgrows fp32 ----
 * Every rank's gradient is --value at every element for --steps steps (a
 * dense sum, nranks x value, that fp32 holds), then ordinary gradients in
 * [-1, 1) for as many: what is held back adds up past FLT_MAX in the
 * residual. Every output must be finite, the same on every rank, and carry
 * something; the outputs of the ordinary steps too (the residual was held at
 * +-FLT_MAX, not left at Inf, which would drop every later step). */
static void mode_overflow(const options *o) {
    long n = o->n;
    if (!((double)nranks * o->value <= (double)FLT_MAX)) fail("premise: %d x %g is past fp32", nranks, o->value);
    float *g = malloc((size_t)n * sizeof *g), *out = malloc((size_t)n * sizeof *out);
    if (!g || !out) fail("no memory");
    for (long s = 0; s < 2 * o->steps; s++) {
        const int big = s < o->steps;
        if (big) for (long i = 0; i < n; i++) g[i] = (float)o->value;
        else fill_grad(g, rank, s, n);
        MPI_Allreduce(g, out, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        check_identical(out, n, MPI_COMM_WORLD, "overflow");
        long nz = 0;
        for (long i = 0; i < n; i++) {
            if (!isfinite(out[i])) fail("step %ld (%s gradients): element %ld is %g", s, big ? "huge" : "ordinary", i,
                                        (double)out[i]);
            nz += out[i] != 0;
        }
        if (nz == 0) fail("step %ld: no output", s);
    }
    if (rank == 0) printf("PASS overflow n=%ld value=%g steps=%ld+%ld\n", n, o->value, o->steps, o->steps);
}

/* ---- momentum compensation under a real optimizer ----
 * A linear objective <c, w>: every rank's gradient is c plus noise of its
 * own, independent of w, so both ways of running the job see the same
 * sparse updates S_t and any difference in the weights is the optimizer's
 * rounding alone. The weights follow SGD with momentum --momentum
 * (buf = m buf + d; w -= lr buf) over the averaged shim output. Rank 0
 * writes the final weights to --dump for mode compare. */
static void mode_optimizer(const options *o) {
    long n = o->n;
    float lr = 0.01f, m = (float)o->momentum;
    float *w = calloc((size_t)n, sizeof *w), *buf = calloc((size_t)n, sizeof *buf);
    float *g = malloc((size_t)n * sizeof *g);
    for (long s = 0; s < o->steps; s++) {
        for (long i = 0; i < n; i++) g[i] = grad(0, -1, i) + 0.5f * grad(rank, s, i);
        MPI_Allreduce(MPI_IN_PLACE, g, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        for (long i = 0; i < n; i++) {
            buf[i] = m * buf[i] + g[i] / (float)nranks;
            w[i] -= lr * buf[i];
        }
    }
    double objective = 0, scale = 0;
    for (long i = 0; i < n; i++) {
        objective += (double)grad(0, -1, i) * w[i];
        scale += fabs((double)grad(0, -1, i));
    }
    if (!(objective < -0.1 * scale)) fail("the weights did not descend: <c, w> = %g", objective);
    if (rank == 0 && o->dump) {
        FILE *f = fopen(o->dump, "wb");
        if (!f || fwrite(w, sizeof *w, (size_t)n, f) != (size_t)n || fclose(f) != 0) fail("cannot write %s", o->dump);
    }
    if (rank == 0) printf("PASS optimizer momentum %g: <c, w> = %.6g\n", o->momentum, objective);
}

/* Two weight files agree element by element to rounding. */
static void mode_compare(int argc, char **argv) {
    if (argc < 4) fail("usage: compare FILE FILE");
    float *a = NULL, *b = NULL;
    long n[2] = {0, 0};
    for (int f = 0; f < 2; f++) {
        FILE *fp = fopen(argv[2 + f], "rb");
        if (!fp) fail("cannot read %s", argv[2 + f]);
        fseek(fp, 0, SEEK_END);
        n[f] = ftell(fp) / (long)sizeof(float);
        rewind(fp);
        float *x = malloc((size_t)n[f] * sizeof *x);
        if (fread(x, sizeof *x, (size_t)n[f], fp) != (size_t)n[f]) fail("short read of %s", argv[2 + f]);
        fclose(fp);
        if (f == 0) a = x;
        else b = x;
    }
    if (n[0] != n[1] || n[0] == 0) fail("sizes differ or empty: %ld, %ld", n[0], n[1]);
    double worst = 0;
    for (long i = 0; i < n[0]; i++) {
        double d = fabs((double)a[i] - b[i]) / (1e-3 + fabs((double)a[i]) + fabs((double)b[i]));
        if (d > worst) worst = d;
        if (d > 1e-4) fail("element %ld: %.9g against %.9g", i, a[i], b[i]);
    }
    if (rank == 0) printf("PASS compare %ld weights, worst relative difference %.3g\n", n[0], worst);
}

static void mode_stats(void) {
    long n = 1048576;
    float *g = malloc((size_t)n * sizeof *g), *out = malloc((size_t)n * sizeof *out);
    for (long s = 0; s < 5; s++) {
        fill_grad(g, rank, s, n);
        MPI_Allreduce(g, out, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        check_identical(out, n, MPI_COMM_WORLD, "stats");
    }
    if (rank == 0) printf("PASS stats n=%ld\n", n);
}

static void parse(int argc, char **argv, options *o) {
    *o = (options){.n = 40000, .steps = 20, .sparsity = 0.99, .masking = 1, .nonfinite_step = -1, .mismatch_at = -1,
                   .expect_compressed = 1};
    /* The reference rounds as the shim is configured to (the environment
     * mpirun gives every rank). */
    const char *bits = getenv("DGC_VALUE_BITS");
    o->value_bits = bits && atoi(bits) == 32 ? 32 : 16;
    for (int i = 2; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--n")) o->n = atol(v);
        else if (!strcmp(k, "--steps")) o->steps = atol(v);
        else if (!strcmp(k, "--warmup")) o->warmup = atol(v);
        else if (!strcmp(k, "--sparsity")) o->sparsity = atof(v);
        else if (!strcmp(k, "--momentum")) o->momentum = atof(v);
        else if (!strcmp(k, "--nesterov")) o->nesterov = atoi(v);
        else if (!strcmp(k, "--masking")) o->masking = atoi(v);
        else if (!strcmp(k, "--clip")) o->clip = atof(v);
        else if (!strcmp(k, "--inplace")) o->inplace = atoi(v);
        else if (!strcmp(k, "--misalign")) o->misalign = atoi(v);
        else if (!strcmp(k, "--nonfinite-step")) o->nonfinite_step = atol(v);
        else if (!strcmp(k, "--mismatch-at")) o->mismatch_at = atol(v);
        else if (!strcmp(k, "--inf")) o->inf = atoi(v);
        else if (!strcmp(k, "--expect-compressed")) o->expect_compressed = atoi(v);
        else if (!strcmp(k, "--compensate")) o->compensate = atoi(v);
        else if (!strcmp(k, "--dump")) o->dump = v;
        else if (!strcmp(k, "--ties")) o->ties = atoi(v);
        else if (!strcmp(k, "--value")) o->value = atof(v);
        else fail("unknown option %s", k);
    }
}

int main(int argc, char **argv) {
    test_init(&argc, &argv, MPI_THREAD_SINGLE);
    options o = {0};
    const char *mode = argc > 1 ? argv[1] : "";
    if (strcmp(mode, "compare") != 0) parse(argc, argv, &o);
    if (!strcmp(mode, "reference")) mode_reference(&o);
    else if (!strcmp(mode, "passthrough")) mode_passthrough(&o);
    else if (!strcmp(mode, "distinct")) mode_distinct(&o);
    else if (!strcmp(mode, "drain")) mode_drain(&o);
    else if (!strcmp(mode, "exact")) mode_exact(&o);
    else if (!strcmp(mode, "overflow")) mode_overflow(&o);
    else if (!strcmp(mode, "stats")) mode_stats();
    else if (!strcmp(mode, "optimizer")) mode_optimizer(&o);
    else if (!strcmp(mode, "compare")) mode_compare(argc, argv);
    else fail("unknown mode '%s'", mode);
    MPI_Finalize();
    return 0;
}
