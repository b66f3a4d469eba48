/* An ordinary MPI program, run under LD_PRELOAD=libdgcshim.so, that checks
 * which state a call finds and how much memory the states take. Every
 * compressed call here runs with DGC_SAMPLE_RATIO=1 (exact top-k), so the
 * first call on fresh state has an exact reference (test_common.c).
 *
 *   lifetime_check comm_reuse --free disconnect|free
 *       two half-size communicators compress, are released, and a
 *       duplicate of MPI_COMM_WORLD (which Open MPI may give the same
 *       handle) must start from fresh state
 *   lifetime_check recycled [--shared-out 1]
 *       tensor A all ones and B all zeros reduced into outputs allocated
 *       and freed each step (or one output for both): B's output is zero
 *   lifetime_check idle --buffers B --rounds R --idle I
 *       B distinct buffers, R rounds: states unused for I calls are freed
 *       (the peak resident memory says so) and a buffer seen again starts
 *       from fresh state
 *   lifetime_check budget [--mixed 1]
 *       three buffers, DGC_MAX_STATE_MB set to room for one: the others
 *       are summed densely
 *       (bit-exact with PMPI_Allreduce when every rank is over budget; with
 *       --mixed, ranks over budget beside ranks that are not: nothing lost)
 *   lifetime_check growth --buffers B --rounds R [--fresh 1|2]
 *       R rounds over B persistent send buffers, or (--fresh) a new send
 *       buffer for every call (2: but the second call repeats the first's):
 *       the case greps for the shim's warning about live states that keep
 *       growing
 *   lifetime_check fusion --n N --buffers C --rounds R
 *       one buffer all-reduced in place R rounds over C distinct counts, as
 *       a fusion buffer is: the case greps for the shim's fusion warning
 *   lifetime_check memory --n N --warmup W --momentum m
 *       resident memory during warm-up and after it against docs/memory.md's
 *       formula
 *   lifetime_check moved [--back 1]
 *       with momentum compensation, rank 0's gradient buffer moves to a
 *       fresh allocation at step 3 (--back: and back at step 4): every
 *       rank's output stays the same bytes at every step
 *
 *   lifetime_check rebuild --n N --rounds R [--expect-kept 1]
 *       DDP's bucket rebuild: step 0 reduces one buffer of every
 *       gradient (4N elements), the R steps after it three buckets of
 *       their own (N, N + 1, 2N - 1 elements) elsewhere; then the step-0
 *       buffer once more: its state must have been freed within a few
 *       steps (DGC_IDLE_EPOCHS), long before DGC_STATE_IDLE_CALLS calls,
 *       so the call starts afresh (--expect-kept: the control, under
 *       DGC_STATE_IDLE_CALLS=0, where it must not)
 *   lifetime_check churn --n N --rounds R
 *       R rounds of MPI_Comm_dup, one compressed call, MPI_Comm_free: the
 *       handles MPI gives out must not climb (communicators left behind)
 *   lifetime_check fresh [--mixed 1] [--rounds S] [--expect-differ 1]
 *       fresh buffers at moving addresses every step against persistent
 *       ones, on two communicators: the same outputs bit for bit (or, the
 *       control, not)
 *
 * Prints "PASS mode" on rank 0, or the first failure and exits 1. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "test_common.h"

typedef struct {
    long n, buffers, rounds, idle, warmup;
    double sparsity, momentum;
    int shared_out, mixed, fresh, back, expect_differ, expect_kept;
    const char *free_how;
} options;

static float grad_at_step(int r, long i, void *ctx) { return grad(r, *(const long *)ctx, i); }

/* Fails unless out is, bit for bit, the fresh-state first step of grad(., step, .). */
static void expect_fresh(const float *out, long n, long k, long step, int ranks, const char *what) {
    float *want = malloc((size_t)n * sizeof *want);
    first_step_reference(n, k, ranks, grad_at_step, &step, want);
    for (long i = 0; i < n; i++)
        if (memcmp(&out[i], &want[i], sizeof(float)) != 0)
            fail("%s: element %ld is %.9g, fresh state gives %.9g (state carried over?)", what, i, out[i], want[i]);
    free(want);
}

/* 1 when out is what a fresh state gives for step's gradients. */
static int is_fresh(const float *out, long n, long k, long step, int ranks) {
    float *want = malloc((size_t)n * sizeof *want);
    first_step_reference(n, k, ranks, grad_at_step, &step, want);
    int same = memcmp(out, want, (size_t)n * sizeof *want) == 0;
    free(want);
    return same;
}

/* ---- a released communicator's handle reused ---- */
static void mode_comm_reuse(const options *o) {
    long n = o->n, k = k_for(n, 1 - o->sparsity);
    float *g = malloc((size_t)n * sizeof *g), *out = malloc((size_t)n * sizeof *out);
    MPI_Comm half;
    MPI_Comm_split(MPI_COMM_WORLD, rank < nranks / 2, rank, &half);
    MPI_Comm old = half;
    for (long s = 0; s < 3; s++) {
        fill_grad(g, rank, s, n);
        MPI_Allreduce(g, out, (int)n, MPI_FLOAT, MPI_SUM, half);
    }
    if (!strcmp(o->free_how, "disconnect")) MPI_Comm_disconnect(&half);
    else MPI_Comm_free(&half);
    MPI_Comm dup;
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    if (rank == 0) printf("released half-size handle %s by the duplicate\n", dup == old ? "reused" : "not reused");
    long step = 100;
    fill_grad(g, rank, step, n);
    MPI_Allreduce(g, out, (int)n, MPI_FLOAT, MPI_SUM, dup);
    check_identical(out, n, MPI_COMM_WORLD, "duplicate");
    expect_fresh(out, n, k, step, nranks, "first call on the duplicate");
    fill_grad(g, rank, step + 1, n); /* and it keeps working: compensation sees its own ranks */
    MPI_Allreduce(g, out, (int)n, MPI_FLOAT, MPI_SUM, dup);
    check_identical(out, n, MPI_COMM_WORLD, "second call on the duplicate");
    MPI_Comm_free(&dup);
    if (rank == 0) printf("PASS comm_reuse (%s)\n", o->free_how);
}

/* ---- two tensors, one output address ----
 * Fresh outputs come from mmap and go back with munmap, as large arrays of
 * numpy or PyTorch do: the kernel hands the same address out again, with no
 * allocator (or sanitizer quarantine) between. */
static float *fresh(long n) {
    void *p = mmap(NULL, (size_t)n * sizeof(float), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) fail("mmap failed");
    return p;
}
static void release(float *p, long n) { munmap(p, (size_t)n * sizeof *p); }

static void mode_recycled(const options *o) {
    long n = o->n;
    float *a = malloc((size_t)n * sizeof *a), *b = malloc((size_t)n * sizeof *b);
    float *shared = malloc((size_t)n * sizeof *shared);
    for (long i = 0; i < n; i++) a[i] = 1.0f, b[i] = 0.0f;
    int recycled = 0, a_moved = 0;
    float *first_a = NULL;
    double a_total = 0;
    for (long s = 0; s < 6; s++) {
        float *out_a = o->shared_out ? shared : fresh(n);
        MPI_Allreduce(a, out_a, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        for (long i = 0; i < n; i++) a_total += out_a[i];
        if (s == 0) first_a = out_a;
        a_moved |= out_a != first_a;
        if (!o->shared_out) release(out_a, n);
        float *out_b = o->shared_out ? shared : fresh(n);
        recycled |= out_b == out_a;
        MPI_Allreduce(b, out_b, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double sum = 0;
        for (long i = 0; i < n; i++) sum += fabs(out_b[i]);
        if (sum != 0) fail("step %ld: B is all zeros on every rank, its output sums to %g (A's residual?)", s, sum);
        if (!o->shared_out) release(out_b, n);
    }
    /* A's residual grows by one wherever it was not sent, so step s sends k
     * values s + 1 per rank (while n >= 6k): 21 k per rank in all, when A's
     * output came back at one address (its state then carried over). */
    long k = k_for(n, 1 - o->sparsity);
    if (!a_moved && a_total != 21.0 * (double)k * nranks)
        fail("A's outputs sum to %g, want %g", a_total, 21.0 * k * nranks);
    if (!recycled && !o->shared_out) fail("mmap never gave B the address A's output had: the case tests nothing");
    if (rank == 0) printf("PASS recycled (A's output address %s)\n", a_moved ? "moved" : "stable");
}

/* ---- resident memory, in MiB ---- */
static double rss_mb(void) { return status_kb("VmRSS") / 1024.0; }
static double hwm_mb(void) { return status_kb("VmHWM") / 1024.0; }

/* Sets the peak resident memory back to the current (Linux 4.0+), so that
 * VmHWM then measures this test's own peak. */
static void reset_peak(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f || fputs("5", f) < 0 || fclose(f) != 0) fail("cannot reset the peak RSS through /proc/self/clear_refs");
}

/* ---- idle states are freed ---- */
static void mode_idle(const options *o) {
    long n = o->n, nb = o->buffers, k = k_for(n, 1 - o->sparsity);
    float *g = malloc((size_t)n * sizeof *g), *out = malloc((size_t)n * sizeof *out);
    float *in = malloc((size_t)(n * nb) * sizeof *in);
    /* Resident before the peak is reset (a zero fill could become calloc's
     * untouched pages). */
    memset(in, 1, (size_t)(n * nb) * sizeof *in);
    memset(out, 1, (size_t)n * sizeof *out);
    reset_peak();
    double base = hwm_mb();
    for (long r = 0; r < o->rounds; r++) {
        for (long b = 0; b < nb; b++) {
            long step = r * nb + b; /* the step of count n: one call per buffer per round */
            fill_grad(in + b * n, rank, step, n);
            MPI_Allreduce(in + b * n, out, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            /* Every buffer's state was freed since its last use a round ago
             * (nb calls > idle): a call starts afresh (checked on the first
             * two of a round: the reference sorts n values per rank). */
            if (r > 0 && b < 2 && nb > o->idle)
                expect_fresh(out, n, k, step, nranks, "a buffer seen again after its state was freed");
        }
    }
    /* A state is 8 bytes per element (residual and spare) plus exchange
     * buffers: at most idle + 1 of them live at once. */
    double state_mb = 8.0 * (double)n / 1048576.0, grown = hwm_mb() - base, bound = (o->idle + 2) * state_mb * 1.5 + 8;
    if (grown > bound)
        fail("peak resident memory grew %.1f MiB over %ld buffers, more than %ld live states allow (%.1f MiB)", grown,
             nb, o->idle + 1, bound);
    if (rank == 0) printf("PASS idle: %ld buffers x %ld rounds, peak growth %.1f MiB (bound %.1f, all %ld live: %.1f)\n",
                          nb, o->rounds, grown, bound, nb, nb * state_mb);
    free(in);
}

/* ---- DDP's bucket rebuild ---- */
static void mode_rebuild(const options *o) {
    const long n = o->n, all = 4 * n, counts[3] = {n, n + 1, 2 * n - 1};
    float *first = malloc((size_t)all * sizeof *first), *buckets = malloc((size_t)all * sizeof *buckets);
    fill_grad(first, rank, 0, all);
    MPI_Allreduce(MPI_IN_PLACE, first, (int)all, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    for (long s = 1; s <= o->rounds; s++) {
        long at = 0;
        for (int b = 0; b < 3; b++) {
            fill_grad(buckets + at, rank, s, counts[b]);
            MPI_Allreduce(MPI_IN_PLACE, buckets + at, (int)counts[b], MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            at += counts[b];
        }
    }
    const long step = o->rounds + 1;
    fill_grad(first, rank, step, all);
    MPI_Allreduce(MPI_IN_PLACE, first, (int)all, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    check_identical(first, all, MPI_COMM_WORLD, "rebuild");
    const int fresh_now = is_fresh(first, all, k_for(all, 1 - o->sparsity), step, nranks);
    if (fresh_now == o->expect_kept)
        fail("the step-0 buffer after %ld steps of rebuilt buckets %s", o->rounds,
             o->expect_kept ? "started afresh: its state was freed" : "found its old state (not freed as idle)");
    if (rank == 0)
        printf("PASS rebuild: the step-0 buffer's state %s after %ld steps (%ld calls)\n",
               o->expect_kept ? "kept" : "freed", o->rounds, 3 * o->rounds + 1);
    free(first);
    free(buckets);
}

/* ---- the memory budget ---- */
static void mode_budget(const options *o) {
    long n = o->n, steps = 8, drain = 0;
    long k = k_for(n, 1 - o->sparsity);
    float *in[3], *out[3], *direct = malloc((size_t)n * sizeof *direct);
    double *in_sum = calloc((size_t)(3 * n), sizeof *in_sum), *out_sum = calloc((size_t)(3 * n), sizeof *out_sum);
    for (int t = 0; t < 3; t++) {
        in[t] = malloc((size_t)n * sizeof *in[t]);
        out[t] = malloc((size_t)n * sizeof *out[t]);
    }
    if (o->mixed) drain = 3 * n / k + 20; /* zero gradients until residuals are empty */
    if (o->mixed) steps = 4;
    for (long s = 0; s < steps + drain; s++) {
        for (int t = 0; t < 3; t++) {
            for (int r = 0; r < nranks && s < steps; r++)
                for (long i = 0; i < n; i++) in_sum[t * n + i] += grad(r + 8 * t, s, i);
            if (s < steps) fill_grad(in[t], rank + 8 * t, s, n);
            else memset(in[t], 0, (size_t)n * sizeof *in[t]);
            MPI_Allreduce(in[t], out[t], (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            check_identical(out[t], n, MPI_COMM_WORLD, "budget");
            for (long i = 0; i < n; i++) out_sum[t * n + i] += out[t][i];
            long nz = 0;
            for (long i = 0; i < n; i++) nz += out[t][i] != 0;
            if (t == 0 && nz > k * nranks) fail("buffer 0 (within budget) was not compressed: %ld non-zeros", nz);
            if (o->mixed || t == 0 || s >= steps) continue;
            /* The shim's dense sum reduces each element once, in an order of
             * its own (the same bytes on every rank, checked above): equal to
             * MPI_Allreduce's to rounding, not bit for bit. */
            PMPI_Allreduce(in[t], direct, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            for (long i = 0; i < n; i++)
                if (fabsf(direct[i] - out[t][i]) > 1e-5f * (fabsf(direct[i]) + fabsf(out[t][i])) + 1e-6f)
                    fail("step %ld buffer %d (over budget on every rank) element %ld: %.9g, a dense all-reduce %.9g",
                         s, t, i, out[t][i], direct[i]);
        }
    }
    if (o->mixed)
        for (long i = 0; i < 3 * n; i++)
            if (fabs(out_sum[i] - in_sum[i]) > 1e-4 * (1 + fabs(in_sum[i])) + 1e-3)
                fail("buffer %ld element %ld: outputs sum to %.9g, inputs to %.9g", i / n, i % n, out_sum[i], in_sum[i]);
    free(direct);
    if (rank == 0) printf("PASS budget%s\n", o->mixed ? " (ranks over and under budget side by side)" : "");
}

/* ---- states that keep growing ---- */
static void mode_growth(const options *o) {
    long n = o->n, calls = o->buffers * o->rounds;
    float *out = malloc((size_t)n * sizeof *out);
    float **in = calloc((size_t)calls, sizeof *in);
    for (long c = 0; c < calls; c++) {
        long b = o->fresh ? c : c % o->buffers;
        if (o->fresh == 2 && c == 1) b = 0; /* one reuse early on, then fresh ones (TensorFlow's way) */
        if (!in[b]) { /* fresh buffers are kept, so that none reuses an address */
            in[b] = malloc((size_t)n * sizeof *in[b]);
            fill_grad(in[b], rank, b, n);
        }
        MPI_Allreduce(in[b], out, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
    for (long c = 0; c < calls; c++) free(in[c]);
    free(in);
    if (rank == 0) printf("PASS growth: %ld calls over %ld %s buffers\n", calls, o->fresh ? calls : o->buffers,
                          o->fresh ? "fresh" : "persistent");
}

/* ---- resident memory against docs/memory.md's formula ----
 * A(x): what an array of x bytes takes: below 256 KiB the heap's 64-byte
 * rounding, from 2 MiB up whole 2 MiB pages, between them whole 4 KiB pages. */
static double alloc_bytes(double x) {
    double to = x < 262144 ? 64 : x >= 2097152 ? 2097152 : 4096;
    return ceil(x / to) * to;
}

/* The compact payload on the wire (docs/payload.md): header and
 * count word, the Elias-Fano upper area (k + (n-1)/2^L bits) and low area
 * (k L bits) for the L that makes the fewest bits, the values; each area in
 * 8-byte words. */
static double compact_bytes(double n, double k) {
    double best = INFINITY, low = 0;
    for (int L = 0; L <= 32; L++) {
        double bits = k * L + k + floor((n - 1) / ldexp(1, L));
        if (bits < best) best = bits, low = L;
    }
    double upper = k + floor((n - 1) / ldexp(1, (int)low));
    const char *vb = getenv("DGC_VALUE_BITS"); /* as the shim reads it: 16 unless 32 */
    double value_bits = vb && atoi(vb) == 32 ? 32 : 16;
    return 40 + 8 * ceil(upper / 64) + 8 * ceil(k * low / 64) + 8 * ceil(k * value_bits / 64);
}

/* docs/memory.md's per-buffer formula, for k slots, sparse transport: with
 * momentum (compensated) the last step's wire buffer is kept too. */
static double formula(double n, double k, int ranks, int momentum) {
    double payload = 32 + 8 * k, cand = fmin(n, fmax(8 * k, 4096));
    return (momentum ? 4 : 2) * alloc_bytes(4 * n) + 2 * alloc_bytes(4 * cand) + alloc_bytes(payload) +
           (momentum ? 2 : 1) * alloc_bytes((ranks + 1) * compact_bytes(n, k));
}

static void mode_memory(const options *o) {
    long n = o->n;
    int momentum = o->momentum > 0;
    float *g = malloc((size_t)n * sizeof *g), *out = malloc((size_t)n * sizeof *out);
    fill_grad(g, rank, 0, n);
    memset(out, 1, (size_t)n * sizeof *out); /* resident now, not at the first call */
    reset_peak();
    double base_rss = rss_mb(), base_hwm = hwm_mb();
    long k0 = k_for(n, 0.25), k_end = k_for(n, 1 - o->sparsity);
    for (long s = 0; s < o->warmup + 4; s++) {
        fill_grad(g, rank, s, n);
        MPI_Allreduce(g, out, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
    double peak = hwm_mb() - (base_hwm > base_rss ? base_hwm : base_rss), steady = rss_mb() - base_rss;
    double mib = 1048576.0, arrays = (momentum ? 4 : 2) * alloc_bytes(4.0 * n) / mib;
    double f_warm = formula(n, k0, nranks, momentum) / mib, f_end = formula(n, k_end, nranks, momentum) / mib;
    const double slack = 8; /* MiB: what MPI itself allocates around the exchange */
    if (rank == 0)
        printf("memory n=%ld ranks=%d momentum=%g: warm-up peak +%.1f MiB (formula %.1f), after warm-up +%.1f MiB "
               "(formula %.1f; arrays alone %.1f)\n", n, nranks, o->momentum, peak, f_warm, steady, f_end, arrays);
    if (peak > f_warm * 1.05 + slack) fail("warm-up peak %.1f MiB is above the formula's %.1f", peak, f_warm);
    if (steady > f_end * 1.05 + slack) fail("after warm-up %.1f MiB is above the formula's %.1f", steady, f_end);
    if (steady < arrays * 0.95) fail("after warm-up %.1f MiB, below the state arrays' %.1f: measured wrong?", steady, arrays);
    if (rank == 0) printf("PASS memory\n");
}

/* ---- one buffer, several counts in turn (a fusion buffer) ---- */
static void mode_fusion(const options *o) {
    long n = o->n;
    float *buf = malloc((size_t)n * sizeof *buf);
    for (long r = 0; r < o->rounds; r++)
        for (long c = 0; c < o->buffers; c++) {
            long count = n - c * (n / (2 * o->buffers)); /* distinct, all above DGC_MIN_ELEMENTS */
            fill_grad(buf, rank, r, count);
            MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            check_identical(buf, count, MPI_COMM_WORLD, "fusion buffer");
        }
    free(buf);
    if (rank == 0) printf("PASS fusion\n");
}

/* ---- one rank's buffer moves ----
 * With momentum compensation the output is S_t - m S_{t-1}, and each rank
 * keeps S_{t-1} with its buffer's state. A buffer that moves on one rank
 * alone (a fresh allocation after an evaluation or a checkpoint there) finds
 * a new state without S_{t-1} while the others' have it; moved back, it
 * finds an S older than the others'. Either way every rank must return the
 * same bytes: whether to subtract is one decision for all. */
static void mode_moved(const options *o) {
    long n = o->n, steps = 8;
    float *home = malloc((size_t)n * sizeof *home), *away = malloc((size_t)n * sizeof *away);
    for (long s = 0; s < steps; s++) {
        int moved = rank == 0 && (o->back ? s == 3 : s >= 3);
        float *buf = moved ? away : home;
        fill_grad(buf, rank, s, n);
        MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        char what[80];
        snprintf(what, sizeof what, "step %ld (rank 0's buffer %s)", s, moved ? "moved" : "at home");
        check_identical(buf, n, MPI_COMM_WORLD, what);
    }
    free(home);
    free(away);
    if (rank == 0) printf("PASS moved%s: %ld steps, the same bytes on every rank\n", o->back ? " and back" : "", steps);
}

/* ---- fresh buffers every step (DGC_BUFFER_KEY=order) ----
 * The same gradients all-reduced in place on two duplicates of
 * MPI_COMM_WORLD: on one from buffers that persist, on the other from
 * buffers at new places every step, taken from a pool in a rotating order
 * (a buffer often lands where another of its size was the step before),
 * and every few steps from a new allocation. --pattern flat: one buffer per
 * step (an mpi4py trainer's flat gradient); mixed: four per step, three of
 * one size and one of another. The outputs must agree bit for bit at every
 * call, or, with --expect-differ 1 (DGC_BUFFER_KEY=address, the control),
 * differ somewhere. */
static void mode_fresh(const options *o) {
    const int mixed = o->mixed;
    const long nb = mixed ? 4 : 1, n = o->n, steps = o->rounds;
    long size[4] = {n, n, n / 3, n};
    const long pool = nb + 2, most = n + 16;
    MPI_Comm keep, move;
    MPI_Comm_dup(MPI_COMM_WORLD, &keep);
    MPI_Comm_dup(MPI_COMM_WORLD, &move);
    float *persistent[4], *slot[6], *fresh = NULL;
    for (long b = 0; b < nb; b++) persistent[b] = malloc((size_t)size[b] * sizeof(float));
    for (long j = 0; j < pool; j++) slot[j] = malloc((size_t)most * sizeof(float));
    long differ = 0, calls = 0;
    for (long s = 0; s < steps; s++) {
        for (long b = 0; b < nb; b++, calls++) {
            float *p = persistent[b];
            /* Rotating slots, an offset that changes the address within
             * a slot, and a new allocation every fifth step. */
            float *q = slot[(b + s) % pool] + (s % 3) * 4;
            if (s % 5 == 4) q = fresh = realloc(fresh, (size_t)size[b] * sizeof(float) + 64 * (size_t)(s + b));
            fill_grad(p, rank + 8 * (int)b, s, size[b]);
            memcpy(q, p, (size_t)size[b] * sizeof(float));
            MPI_Allreduce(MPI_IN_PLACE, p, (int)size[b], MPI_FLOAT, MPI_SUM, keep);
            MPI_Allreduce(MPI_IN_PLACE, q, (int)size[b], MPI_FLOAT, MPI_SUM, move);
            check_identical(q, size[b], MPI_COMM_WORLD, "fresh");
            if (memcmp(p, q, (size_t)size[b] * sizeof(float)) == 0) continue;
            if (!o->expect_differ) {
                long i = 0;
                while (p[i] == q[i]) i++;
                fail("step %ld buffer %ld (%ld elements) element %ld: %.9g from a persistent buffer, %.9g from a "
                     "fresh one", s, b, size[b], i, (double)p[i], (double)q[i]);
            }
            differ++;
        }
    }
    if (o->expect_differ && !differ) fail("the control: fresh and persistent buffers agreed at all %ld calls", calls);
    for (long b = 0; b < nb; b++) free(persistent[b]);
    for (long j = 0; j < pool; j++) free(slot[j]);
    free(fresh);
    MPI_Comm_free(&keep);
    MPI_Comm_free(&move);
    if (rank == 0)
        printf("PASS fresh (%s): %ld calls, %s\n", mixed ? "mixed" : "flat", calls,
               o->expect_differ ? "fresh and persistent differ (control)" : "fresh equal to persistent, bit for bit");
}

/* ---- communicators made and freed, round after round ----
 * Each round duplicates MPI_COMM_WORLD, compresses on the duplicate (whose
 * record, layout and sub-communicators are made then) and frees it; then
 * PROBES duplicates of MPI_COMM_SELF are made and freed. MPI hands freed
 * handles out again, so without communicators left behind the last probe
 * gets the same handle every round; each one left behind (the shim's own)
 * takes a handle, and the probes' move on. Counted as the distinct handles
 * of the last probe in the rounds after the first ten. */
#define CHURN_HANDLES 8
#define PROBES 4
static void mode_churn(const options *o) {
    long n = o->n;
    float *g = malloc((size_t)n * sizeof *g), *out = malloc((size_t)n * sizeof *out);
    MPI_Fint seen[CHURN_HANDLES];
    int distinct = 0;
    for (long r = 0; r < o->rounds; r++) {
        MPI_Comm dup, probe[PROBES];
        MPI_Comm_dup(MPI_COMM_WORLD, &dup);
        fill_grad(g, rank, r, n);
        MPI_Allreduce(g, out, (int)n, MPI_FLOAT, MPI_SUM, dup);
        check_identical(out, n, MPI_COMM_WORLD, "churn");
        MPI_Comm_free(&dup);
        for (int i = 0; i < PROBES; i++) MPI_Comm_dup(MPI_COMM_SELF, &probe[i]);
        MPI_Fint handle = MPI_Comm_c2f(probe[PROBES - 1]);
        for (int i = 0; i < PROBES; i++) MPI_Comm_free(&probe[i]);
        int known = 0;
        for (int i = 0; i < distinct; i++) known |= seen[i] == handle;
        if (r >= 10 && !known) {
            if (distinct == CHURN_HANDLES)
                fail("round %ld: more than %d distinct communicator handles after round 10: communicators left "
                     "behind", r, CHURN_HANDLES);
            seen[distinct++] = handle;
        }
    }
    free(g);
    free(out);
    if (rank == 0) printf("PASS churn: %ld rounds, %d distinct handles after the first ten\n", o->rounds, distinct);
}

static void parse(int argc, char **argv, options *o) {
    *o = (options){.n = 40000, .buffers = 100, .rounds = 3, .idle = 10, .sparsity = 0.99, .free_how = "free"};
    for (int i = 2; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--n")) o->n = atol(v);
        else if (!strcmp(k, "--buffers")) o->buffers = atol(v);
        else if (!strcmp(k, "--rounds")) o->rounds = atol(v);
        else if (!strcmp(k, "--idle")) o->idle = atol(v);
        else if (!strcmp(k, "--warmup")) o->warmup = atol(v);
        else if (!strcmp(k, "--sparsity")) o->sparsity = atof(v);
        else if (!strcmp(k, "--momentum")) o->momentum = atof(v);
        else if (!strcmp(k, "--shared-out")) o->shared_out = atoi(v);
        else if (!strcmp(k, "--mixed")) o->mixed = atoi(v);
        else if (!strcmp(k, "--fresh")) o->fresh = atoi(v);
        else if (!strcmp(k, "--back")) o->back = atoi(v);
        else if (!strcmp(k, "--expect-differ")) o->expect_differ = atoi(v);
        else if (!strcmp(k, "--expect-kept")) o->expect_kept = atoi(v);
        else if (!strcmp(k, "--free")) o->free_how = v;
        else fail("unknown option %s", k);
    }
}

int main(int argc, char **argv) {
    test_init(&argc, &argv, MPI_THREAD_SINGLE);
    options o = {0};
    parse(argc, argv, &o);
    const char *mode = argc > 1 ? argv[1] : "";
    if (!strcmp(mode, "comm_reuse")) mode_comm_reuse(&o);
    else if (!strcmp(mode, "recycled")) mode_recycled(&o);
    else if (!strcmp(mode, "idle")) mode_idle(&o);
    else if (!strcmp(mode, "budget")) mode_budget(&o);
    else if (!strcmp(mode, "memory")) mode_memory(&o);
    else if (!strcmp(mode, "growth")) mode_growth(&o);
    else if (!strcmp(mode, "fusion")) mode_fusion(&o);
    else if (!strcmp(mode, "moved")) mode_moved(&o);
    else if (!strcmp(mode, "fresh")) mode_fresh(&o);
    else if (!strcmp(mode, "churn")) mode_churn(&o);
    else if (!strcmp(mode, "rebuild")) mode_rebuild(&o);
    else fail("unknown mode '%s'", mode);
    MPI_Finalize();
    return 0;
}
