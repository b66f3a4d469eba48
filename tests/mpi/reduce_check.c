/* DGC_TRANSPORT=reduce against an independent reference written plainly
 * here: every rank simulates every rank's DGC state, splits its pairs into
 * regions (equal at first, then cut at the previous global selection's
 * quantiles), sends each owner at most cap of them (the largest), lets each
 * owner sum in rank order and keep the largest non-zero sums, and commits
 * only what was sent and kept. With 32-bit values and exact top-k
 * (DGC_VALUE_BITS=32, DGC_SAMPLE_RATIO=1), a reduce step's output must equal
 * the reference bit for bit. Steps the shim sends by the dense transport
 * (reduce falls back to it when it would send more bytes: the warm-up's
 * dense stages) are compared within a tolerance, since MPI sums those in its
 * own order, and so is the first reduce step after one when momentum is
 * compensated (S_{t-1} came from MPI's sum); --expect-change 1: the
 * transport must change between steps at least once, with momentum; which transport a step takes is the shim's policy (the one
 * thing taken from the library), everything else is written here.
 *
 *   reduce_check [--n N] [--steps S] [--sparsity X] [--warmup W] [--momentum M]
 *                [--shape plain|skewed|hole] [--nonfinite-step S] [--nomem-headroom MB]
 *                [--expect-change 0|1]
 *
 * skewed: every rank's gradient is large in the first 1/(4N) of the buffer
 * only, so its pairs crowd one region and overflow its room (cap); hole:
 * the last region's gradients are zero, so its owner receives nothing.
 * --nomem-headroom: the first call is made once with the last rank's address
 * space capped (MB above what it maps now), so that it has no memory for its
 * state: every rank must get MPI_ERR_NO_MEM (none may hang), and the steps
 * from then on must be the reference's, as if that call never was. The
 * variables the shim reads come from the environment (mpirun -x), and the
 * reference reads the same ones. Prints "PASS reduce ..." on rank 0. */
#include <math.h>
#include <stdio.h>
#include <sys/resource.h>
#include <stdlib.h>
#include <string.h>

#include "dgcshim/policy.h"
#include "test_common.h"

typedef struct {
    long n, steps, warmup, nonfinite_step, nomem_headroom, expect_change;
    double sparsity, momentum;
    const char *shape;
} options;

typedef struct {
    float *u, *v;
    long *sel; /* this step's selected indices, ascending */
    long nsel;
    unsigned char *sent; /* per selected pair: sent to its owner */
} ref_rank;

static options o;

static float shaped(int r, long s, long i) {
    float g = grad(r, s, i);
    if (!strcmp(o.shape, "skewed")) return i < o.n / (4 * nranks) ? g : g * 1e-3f;
    if (!strcmp(o.shape, "hole")) return i >= (long)((uint64_t)o.n * (uint64_t)(nranks - 1) / (uint64_t)nranks) ? 0.0f : g;
    return g;
}

static double density_at(long step) {
    double target = 1.0 - o.sparsity;
    if (step >= o.warmup) return target;
    int stages = 0;
    for (double d = 0.25; d > target; d /= 4) stages++;
    if (stages == 0) return target;
    double d = 0.25 / pow(4.0, (double)(step * stages / o.warmup));
    return d > target ? d : target;
}

static const float *key;
static int by_mag_then_index(const void *a, const void *b) {
    long i = *(const long *)a, j = *(const long *)b;
    float x = fabsf(key[i]), y = fabsf(key[j]);
    return x < y ? 1 : x > y ? -1 : (i > j) - (i < j);
}
static int by_index(const void *a, const void *b) {
    long i = *(const long *)a, j = *(const long *)b;
    return (i > j) - (i < j);
}

/* The update of rank r's u and v, then its k largest non-zero |v|, sorted by index. */
static void select_pairs(ref_rank *st, const float *g, long k, long *order) {
    float m = (float)o.momentum;
    for (long i = 0; i < o.n; i++) {
        st->u[i] = m * st->u[i] + g[i];
        st->v[i] = st->v[i] + st->u[i];
    }
    for (long i = 0; i < o.n; i++) order[i] = i;
    key = st->v;
    qsort(order, (size_t)o.n, sizeof *order, by_mag_then_index);
    long c = 0;
    while (c < k && st->v[order[c]] != 0) c++;
    memcpy(st->sel, order, (size_t)c * sizeof *order);
    qsort(st->sel, (size_t)c, sizeof *st->sel, by_index);
    st->nsel = c;
}

/* Marks sent[lo, hi) of rank st: all when they fit cap, else the cap largest |v| (ties: lower index). */
static void mark_sent(ref_rank *st, long lo, long hi, long cap, long *tmp) {
    for (long j = lo; j < hi; j++) st->sent[j] = hi - lo <= cap;
    if (hi - lo <= cap) return;
    for (long j = lo; j < hi; j++) tmp[j - lo] = st->sel[j];
    key = st->v;
    qsort(tmp, (size_t)(hi - lo), sizeof *tmp, by_mag_then_index);
    for (long c = 0; c < cap; c++)
        for (long j = lo; j < hi; j++)
            if (st->sel[j] == tmp[c]) st->sent[j] = 1;
}

/* One reduce step of every rank: want gets the output S_t; commits into the
 * ranks' states; sel_all (sorted) and *m the global selection. */
static void reduce_step(ref_rank *st, const long *bounds, long k, float *want, float *acc, long *sel_all, long *m,
                        long *tmp) {
    const long ranks = nranks, keep = (k + ranks - 1) / ranks, twice = (2 * k + ranks - 1) / ranks;
    const long cap = twice < k ? twice : k;
    for (int r = 0; r < nranks; r++) {
        long j = 0;
        for (int q = 0; q < nranks; q++) {
            long lo = j;
            while (j < st[r].nsel && st[r].sel[j] < bounds[q + 1]) j++;
            mark_sent(&st[r], lo, j, cap, tmp);
        }
    }
    memset(want, 0, (size_t)o.n * sizeof *want);
    *m = 0;
    for (int q = 0; q < nranks; q++) { /* owner q */
        long ncand = 0;
        for (long i = bounds[q]; i < bounds[q + 1]; i++) acc[i] = 0.0f;
        for (int r = 0; r < nranks; r++)
            for (long j = 0; j < st[r].nsel; j++) {
                long i = st[r].sel[j];
                if (st[r].sent[j] && i >= bounds[q] && i < bounds[q + 1]) acc[i] += st[r].v[i];
            }
        for (long i = bounds[q]; i < bounds[q + 1]; i++)
            if (acc[i] != 0.0f) tmp[ncand++] = i;
        key = acc;
        qsort(tmp, (size_t)ncand, sizeof *tmp, by_mag_then_index);
        long take = ncand < keep ? ncand : keep;
        qsort(tmp, (size_t)take, sizeof *tmp, by_index);
        for (long c = 0; c < take; c++) {
            want[tmp[c]] = acc[tmp[c]];
            sel_all[(*m)++] = tmp[c];
        }
    }
    for (int r = 0; r < nranks; r++) /* commit: sent and selected only */
        for (long j = 0; j < st[r].nsel; j++) {
            long i = st[r].sel[j];
            if (st[r].sent[j] && want[i] != 0.0f) {
                st[r].v[i] = 0.0f;
                st[r].u[i] = 0.0f;
            }
        }
}

/* The dense transport's step (and the all-gather's): every selected pair
 * summed and committed. */
static void plain_step(ref_rank *st, float *want) {
    memset(want, 0, (size_t)o.n * sizeof *want);
    for (int r = 0; r < nranks; r++)
        for (long j = 0; j < st[r].nsel; j++) {
            long i = st[r].sel[j];
            want[i] += st[r].v[i];
            st[r].v[i] = 0.0f;
            st[r].u[i] = 0.0f;
        }
}

/* The first call with the last rank short of memory: MPI_ERR_NO_MEM on every rank. */
static void call_without_memory(const float *g, float *out) {
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    struct rlimit old, capped;
    getrlimit(RLIMIT_AS, &old);
    capped = old;
    capped.rlim_cur = (rlim_t)(status_kb("VmSize") + o.nomem_headroom * 1024) * 1024;
    int victim = rank == nranks - 1;
    if (victim && setrlimit(RLIMIT_AS, &capped) != 0) fail("cannot cap the address space");
    int rc = MPI_Allreduce(g, out, (int)o.n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    if (victim && setrlimit(RLIMIT_AS, &old) != 0) fail("cannot lift the address-space cap");
    int cls = MPI_SUCCESS;
    if (rc != MPI_SUCCESS) MPI_Error_class(rc, &cls);
    int not_nomem = cls != MPI_ERR_NO_MEM, any = 0;
    MPI_Allreduce(&not_nomem, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (any) fail("the call the last rank had no memory for: this rank's error class %d, want MPI_ERR_NO_MEM on all",
                  cls);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
}

static void equal_bounds(long *bounds) {
    for (int q = 0; q <= nranks; q++) bounds[q] = (long)((uint64_t)o.n * (uint64_t)q / (uint64_t)nranks);
}

static void parse(int argc, char **argv) {
    o = (options){.n = 20011, .steps = 30, .sparsity = 0.99, .nonfinite_step = -1, .shape = "plain"};
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--n")) o.n = atol(v);
        else if (!strcmp(k, "--steps")) o.steps = atol(v);
        else if (!strcmp(k, "--sparsity")) o.sparsity = atof(v);
        else if (!strcmp(k, "--warmup")) o.warmup = atol(v);
        else if (!strcmp(k, "--momentum")) o.momentum = atof(v);
        else if (!strcmp(k, "--shape")) o.shape = v;
        else if (!strcmp(k, "--nonfinite-step")) o.nonfinite_step = atol(v);
        else if (!strcmp(k, "--nomem-headroom")) o.nomem_headroom = atol(v);
        else if (!strcmp(k, "--expect-change")) o.expect_change = atol(v);
        else fail("unknown option %s", k);
    }
}

int main(int argc, char **argv) {
    test_init(&argc, &argv, MPI_THREAD_SINGLE);
    parse(argc, argv);
    dgc_config cfg;
    dgc_config_defaults(&cfg);
    cfg.transport = DGC_TRANSPORT_REDUCE;
    cfg.value_bits = 32;
    const long n = o.n;
    ref_rank *st = calloc((size_t)nranks, sizeof *st);
    for (int r = 0; r < nranks; r++) {
        st[r].u = calloc((size_t)n, sizeof(float));
        st[r].v = calloc((size_t)n, sizeof(float));
        st[r].sel = malloc((size_t)n * sizeof(long));
        st[r].sent = malloc((size_t)n);
    }
    float *g = malloc((size_t)n * sizeof *g), *out = malloc((size_t)n * sizeof *out);
    float *want = malloc((size_t)n * sizeof *want), *acc = malloc((size_t)n * sizeof *acc);
    float *prev = calloc((size_t)n, sizeof *prev);
    long *order = malloc((size_t)n * sizeof *order), *tmp = malloc((size_t)n * sizeof *tmp);
    long *sel_all = malloc((size_t)n * sizeof *sel_all), *bounds = malloc(((size_t)nranks + 1) * sizeof *bounds);
    long balanced_for = -1, reduce_steps = 0, overflowed = 0, empty_owner = 0, switches = 0;
    int prev_reduce = -1, changed_compensated = 0; /* the previous step's transport: a change is the warm-up's dense stages ending */
    int prev_exact = 1; /* S_{t-1} came from a reduce step (or there is none) */
    const float mom = (float)o.momentum;
    for (long s = 0; s < o.steps; s++) {
        for (long i = 0; i < n; i++) g[i] = shaped(rank, s, i);
        int bad = s == o.nonfinite_step;
        if (bad && rank == nranks - 1) g[n / 3] = NAN;
        if (s == 0 && o.nomem_headroom > 0) call_without_memory(g, out);
        MPI_Allreduce(g, out, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        check_identical(out, n, MPI_COMM_WORLD, "reduce");
        if (bad) {
            for (long i = 0; i < n; i++)
                if (!isnan(out[i])) fail("step %ld: element %ld is %g after a non-finite gradient", s, i, out[i]);
            continue; /* nothing committed; the bounds are not this step's any more */
        }
        long k = k_for(n, density_at(s));
        dgc_transport_bytes tb;
        int reduce = dgc_policy_transport(&cfg, (uint64_t)n, 4, (uint64_t)k, nranks, &tb) == DGC_TRANSPORT_REDUCE;
        for (int r = 0; r < nranks; r++) {
            for (long i = 0; i < n; i++) g[i] = shaped(r, s, i);
            select_pairs(&st[r], g, k, order);
        }
        long m = 0;
        if (reduce) {
            if (balanced_for != s) equal_bounds(bounds);
            for (int q = 0; q < nranks; q++) {
                long got = 0;
                for (int r = 0; r < nranks; r++)
                    for (long j = 0; j < st[r].nsel; j++) got += st[r].sel[j] >= bounds[q] && st[r].sel[j] < bounds[q + 1];
                empty_owner += got == 0;
            }
            reduce_step(st, bounds, k, want, acc, sel_all, &m, tmp);
            for (int r = 0; r < nranks; r++)
                for (long j = 0; j < st[r].nsel; j++) overflowed += !st[r].sent[j];
            equal_bounds(bounds);
            if (m > 0)
                for (int q = 1; q < nranks; q++) bounds[q] = sel_all[(uint64_t)q * (uint64_t)m / (uint64_t)nranks];
            balanced_for = s + 1;
            reduce_steps++;
        } else {
            plain_step(st, want);
            balanced_for = -1;
        }
        switches += prev_reduce >= 0 && reduce != prev_reduce;
        changed_compensated |= prev_reduce >= 0 && reduce != prev_reduce && mom != 0.0f;
        prev_reduce = reduce;
        int exact = reduce && (mom == 0.0f || prev_exact);
        for (long i = 0; i < n; i++) {
            float sum = want[i];
            if (mom != 0.0f) want[i] = sum - mom * prev[i];
            prev[i] = sum;
            if (exact ? memcmp(&want[i], &out[i], sizeof(float)) != 0
                      : fabsf(want[i] - out[i]) > 1e-5f * (fabsf(want[i]) + fabsf(out[i])) + 1e-6f)
                fail("step %ld (%s) element %ld: shim %.9g, reference %.9g", s, reduce ? "reduce" : "dense", i, out[i],
                     want[i]);
        }
        prev_exact = reduce;
    }
    if (reduce_steps == 0) fail("no step went by the reduce transport");
    if (!strcmp(o.shape, "skewed") && overflowed == 0) fail("no region overflowed its room");
    if (!strcmp(o.shape, "hole") && empty_owner == 0) fail("no owner received nothing");
    if (o.expect_change && (switches == 0 || !changed_compensated))
        fail("no change of transport between steps with the compensation across it (%ld changes)", switches);
    if (rank == 0 && o.nomem_headroom > 0) printf("PASS reduce: every rank got MPI_ERR_NO_MEM, then the reference\n");
    if (rank == 0)
        printf("PASS reduce n=%ld steps=%ld ranks=%d shape=%s: %ld reduce steps, %ld pairs left behind, %ld empty "
               "regions, %ld changes of transport\n", n, o.steps, nranks, o.shape, reduce_steps, overflowed, empty_owner,
               switches);
    return MPI_Finalize();
}
