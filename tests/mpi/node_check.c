/* The node layout's spec (DGC_TOPOLOGY=node), as two jobs whose outputs
 * must match bit for bit (tests/mpi/node_spec.sh):
 *
 *   node       N = M L ranks in node layout: every step, each buffer is
 *              all-reduced once, in place or not; every rank must hold the
 *              same output; rank 0 writes every output to --out.
 *   reference  M ranks, flat: rank m forms node m's sum of each buffer
 *              (its L ranks' gradients added in local-rank order), and
 *              all-reduces it shard by shard, in shard order, each shard from
 *              a buffer of its own; rank 0 writes the outputs, reassembled.
 *
 * --nonfinite-step S puts a NaN into rank --nonfinite-rank's first buffer
 * at step S. In node layout the whole call is skipped (every output NaN, no
 * state changed); the reference gets a NaN in every shard of that node's
 * sum, which skips every shard's call alike.
 * --mismatch-at S: at step S every rank all-reduces its first buffer with
 * a count of its own (n + 8 r), an erroneous call that must fail on every
 * rank and change nothing: the reference skips it.
 * It knows nothing of the shim: an ordinary MPI program. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_common.h"

#define BUFFERS 2

typedef struct {
    long n[BUFFERS];
    long steps;
    int node_size;
    long nonfinite_step;
    int nonfinite_rank;
    long mismatch_at;
    const char *out;
} options;

static float *alloc_floats(long n) {
    float *p = calloc((size_t)n, sizeof(float));
    if (!p) fail("no memory for %ld floats", n);
    return p;
}

/* Buffer j's gradient of world rank r at step s. */
static void gradient(float *g, int r, long s, int j, long n) { fill_grad(g, r, s * BUFFERS + j, n); }

static FILE *open_out(const options *o) {
    if (rank != 0) return NULL;
    FILE *f = fopen(o->out, "wb");
    if (!f) fail("cannot write %s", o->out);
    return f;
}

static void write_floats(FILE *f, const float *v, long n) {
    if (f && fwrite(v, sizeof *v, (size_t)n, f) != (size_t)n) fail("short write");
}

/* The erroneous call of --mismatch-at: every rank must see it fail. */
static void mismatched_call(float *g, float *out, long n) {
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    int rc = MPI_Allreduce(g, out, (int)(n + 8 * rank), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    int failed = rc != MPI_SUCCESS, all = 0;
    MPI_Allreduce(&failed, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all) fail("a call whose count differs between ranks did not fail on every rank (here: %d)", rc);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
}

static void mode_node(const options *o) {
    FILE *f = open_out(o);
    float *g[BUFFERS], *out[BUFFERS];
    for (int j = 0; j < BUFFERS; j++) g[j] = alloc_floats(o->n[j] + 8L * nranks), out[j] = alloc_floats(o->n[j] + 8L * nranks);
    for (long s = 0; s < o->steps; s++) {
        for (int j = 0; j < BUFFERS; j++) {
            if (s == o->mismatch_at && j == 0) {
                gradient(g[j], rank, s, j, o->n[j] + 8L * rank);
                mismatched_call(g[j], out[j], o->n[j]);
                continue;
            }
            gradient(g[j], rank, s, j, o->n[j]);
            if (s == o->nonfinite_step && j == 0 && rank == o->nonfinite_rank) g[j][o->n[j] - 1] = NAN;
            if (j == 1) { /* the second buffer in place */
                memcpy(out[j], g[j], (size_t)o->n[j] * sizeof(float));
                MPI_Allreduce(MPI_IN_PLACE, out[j], (int)o->n[j], MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            } else {
                MPI_Allreduce(g[j], out[j], (int)o->n[j], MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            }
            check_identical(out[j], o->n[j], MPI_COMM_WORLD, "node layout");
            if (s == o->nonfinite_step && j == 0)
                for (long i = 0; i < o->n[j]; i++)
                    if (!isnan(out[j][i])) fail("step %ld: element %ld is %g, not NaN, on a skipped step", s, i,
                                                (double)out[j][i]);
            write_floats(f, out[j], o->n[j]);
        }
    }
    if (f) fclose(f);
    if (rank == 0) printf("PASS node: %ld steps, outputs identical on every rank\n", o->steps);
}

static void mode_reference(const options *o) {
    const int L = o->node_size;
    FILE *f = open_out(o);
    float *sum = alloc_floats(o->n[0] > o->n[1] ? o->n[0] : o->n[1]);
    float *g = alloc_floats(o->n[0] > o->n[1] ? o->n[0] : o->n[1]);
    float *shard_in[BUFFERS][64], *shard_out[BUFFERS][64], *out[BUFFERS];
    if (L < 2 || L > 64) fail("--node-size %d: 2 to 64", L);
    for (int j = 0; j < BUFFERS; j++) {
        out[j] = alloc_floats(o->n[j]);
        for (int t = 0; t < L; t++) {
            long len = o->n[j] * (t + 1) / L - o->n[j] * t / L;
            shard_in[j][t] = alloc_floats(len);
            shard_out[j][t] = alloc_floats(len);
        }
    }
    for (long s = 0; s < o->steps; s++) {
        for (int j = 0; j < BUFFERS; j++) {
            const long n = o->n[j];
            gradient(sum, rank * L, s, j, n);
            for (int l = 1; l < L; l++) {
                gradient(g, rank * L + l, s, j, n);
                for (long i = 0; i < n; i++) sum[i] += g[i];
            }
            if (s == o->mismatch_at && j == 0) continue; /* failed on every rank, changing nothing */
            const int poisoned = s == o->nonfinite_step && j == 0 && rank == o->nonfinite_rank / L;
            for (int t = 0; t < L; t++) {
                long lo = n * t / L, len = n * (t + 1) / L - lo;
                memcpy(shard_in[j][t], sum + lo, (size_t)len * sizeof(float));
                if (poisoned) shard_in[j][t][0] = NAN;
                MPI_Allreduce(shard_in[j][t], shard_out[j][t], (int)len, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
                memcpy(out[j] + lo, shard_out[j][t], (size_t)len * sizeof(float));
            }
            write_floats(f, out[j], n);
        }
    }
    if (f) fclose(f);
    if (rank == 0) printf("PASS reference: %ld steps on %d ranks, %d shards\n", o->steps, nranks, L);
}

/* Two output files equal float by float: the same bits, or both NaN. */
static void mode_compare(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    if (!fa || !fb) fail("cannot read %s or %s", a, b);
    long at = 0, nan = 0;
    float x, y;
    for (;; at++) {
        size_t ra = fread(&x, sizeof x, 1, fa), rb = fread(&y, sizeof y, 1, fb);
        if (ra != rb) fail("%s and %s differ in length at float %ld", a, b, at);
        if (!ra) break;
        if (isnan(x) && isnan(y)) {
            nan++;
            continue;
        }
        if (memcmp(&x, &y, sizeof x)) fail("float %ld: node layout %.9g, reference %.9g", at, (double)x, (double)y);
    }
    if (at == 0) fail("no outputs to compare");
    printf("PASS compare: %ld floats equal bit for bit (%ld NaN in both)\n", at, nan);
}

int main(int argc, char **argv) {
    test_init(&argc, &argv, MPI_THREAD_SINGLE);
    if (argc < 2) fail("usage: node_check node|reference|compare ...");
    const char *mode = argv[1];
    if (!strcmp(mode, "compare")) {
        if (argc < 4) fail("usage: node_check compare A B");
        if (rank == 0) mode_compare(argv[2], argv[3]);
        MPI_Finalize();
        return 0;
    }
    options o = {{50000, 30001}, 20, 2, -1, 1, -1, NULL};
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--n")) o.n[0] = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--n2")) o.n[1] = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--steps")) o.steps = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--node-size")) o.node_size = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--nonfinite-step")) o.nonfinite_step = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--nonfinite-rank")) o.nonfinite_rank = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--mismatch-at")) o.mismatch_at = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--out")) o.out = argv[i + 1];
        else fail("unknown option %s", argv[i]);
    }
    if (!o.out) fail("--out FILE is required");
    if (!strcmp(mode, "node")) mode_node(&o);
    else if (!strcmp(mode, "reference")) mode_reference(&o);
    else fail("unknown mode '%s'", mode);
    MPI_Finalize();
    return 0;
}
