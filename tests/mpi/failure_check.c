/* An ordinary MPI program, run under LD_PRELOAD=libdgcshim.so, that checks
 * what happens when things go wrong: a rank out of memory, ranks whose
 * configurations differ, an invalid communicator, and many threads at once.
 * Compressed calls run with DGC_SAMPLE_RATIO=1 (exact top-k) where a result
 * is compared with the fresh-state reference (test_common.c).
 *
 *   failure_check nomem [--n N] [--headroom MB] [--flat-reference 0]
 *       the last rank's address space is capped (MB above what it maps now)
 *       so that its state cannot be allocated: every rank must get
 *       MPI_ERR_NO_MEM from the same call
 *       (none may hang), and the call repeated once the cap is lifted must
 *       give the fresh first step: nothing was committed anywhere
 *   failure_check spawn_mismatch
 *       spawns two more ranks with another DGC_SPARSITY and merges them in:
 *       every compressed call on the merged communicator fails with
 *       MPI_ERR_OTHER on every rank, the first and every later one
 *   failure_check comm_null
 *       MPI_Allreduce on MPI_COMM_NULL: every rank's handler gets MPI_ERR_COMM
 *       raised in MPI_Allreduce (not in a function the shim calls), and the
 *       next compressed call on MPI_COMM_WORLD is the fresh first step
 *   failure_check threads [--threads T]
 *       MPI_THREAD_MULTIPLE: T threads compress on their own duplicates of
 *       MPI_COMM_WORLD at once (two with the same count); each thread's
 *       outputs must equal those of the same calls made one thread at a time
 *
 * Prints "PASS mode" on rank 0, or the first failure and exits 1. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "test_common.h"

static float grad_at_step(int r, long i, void *ctx) { return grad(r, *(const long *)ctx, i); }

/* Every rank of comm must hold the same error class, want. */
static void expect_class_everywhere(int rc, int want, MPI_Comm comm, const char *what) {
    int cls = MPI_SUCCESS, size;
    if (rc != MPI_SUCCESS) MPI_Error_class(rc, &cls);
    MPI_Comm_size(comm, &size);
    int *all = malloc((size_t)size * sizeof *all);
    MPI_Allgather(&cls, 1, MPI_INT, all, 1, MPI_INT, comm);
    for (int r = 0; r < size; r++) {
        if (all[r] == want) continue;
        char a[MPI_MAX_ERROR_STRING] = "", b[MPI_MAX_ERROR_STRING] = "";
        int len;
        MPI_Error_string(all[r], a, &len);
        MPI_Error_string(want, b, &len);
        fail("%s: rank %d of the communicator got error class %d (%s), want %d (%s)", what, r, all[r], a, want, b);
    }
    free(all);
}

/* ---- a rank out of memory ---- */
static void mode_nomem(long n, long headroom_mb, int flat_reference) {
    const long k = k_for(n, 0.01);
    float *g = malloc((size_t)n * sizeof *g), *out = malloc((size_t)n * sizeof *out);
    long step = 0;
    fill_grad(g, rank, step, n);
    memset(out, 1, (size_t)n * sizeof *out);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    int victim = rank == nranks - 1;
    struct rlimit old, capped;
    getrlimit(RLIMIT_AS, &old);
    capped = old;
    capped.rlim_cur = (rlim_t)(status_kb("VmSize") + headroom_mb * 1024) * 1024; /* room for MPI, not for the state */
    if (victim && setrlimit(RLIMIT_AS, &capped) != 0) fail("cannot cap the address space");
    int rc = MPI_Allreduce(g, out, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    if (victim && setrlimit(RLIMIT_AS, &old) != 0) fail("cannot lift the address-space cap");
    expect_class_everywhere(rc, MPI_ERR_NO_MEM, MPI_COMM_WORLD, "the call a rank had no memory for");
    rc = MPI_Allreduce(g, out, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    expect_class_everywhere(rc, MPI_SUCCESS, MPI_COMM_WORLD, "the same call with memory");
    check_identical(out, n, MPI_COMM_WORLD, "after the failed call");
    if (!flat_reference) { /* the node layout's first step is no flat one: identical and working is what holds */
        if (rank == 0) printf("PASS nomem: every rank got MPI_ERR_NO_MEM, then a call that works\n");
        return;
    }
    float *want = malloc((size_t)n * sizeof *want);
    first_step_reference(n, k, nranks, grad_at_step, &step, want);
    if (memcmp(out, want, (size_t)n * sizeof *out) != 0)
        fail("the repeated call is not the fresh first step: the failed call committed something");
    if (rank == 0) printf("PASS nomem: every rank got MPI_ERR_NO_MEM, then the fresh first step\n");
}

/* ---- ranks with different configurations on a merged communicator ---- */
static void run_mismatched(MPI_Comm merged) {
    const long n = 100000;
    float *g = malloc((size_t)n * sizeof *g), *out = malloc((size_t)n * sizeof *out);
    int me;
    MPI_Comm_rank(merged, &me);
    MPI_Comm_set_errhandler(merged, MPI_ERRORS_RETURN);
    for (long s = 0; s < 3; s++) {
        fill_grad(g, me, s, n);
        int rc = MPI_Allreduce(g, out, (int)n, MPI_FLOAT, MPI_SUM, merged);
        char what[64];
        snprintf(what, sizeof what, "compressed call %ld on the merged communicator", s);
        expect_class_everywhere(rc, MPI_ERR_OTHER, merged, what);
    }
    if (me == 0) printf("PASS spawn_mismatch: 3 calls, each failed on every rank with MPI_ERR_OTHER\n");
    MPI_Comm_free(&merged);
}

static void mode_spawn_parent(void) {
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) fail("cannot read /proc/self/exe");
    self[len] = '\0';
    /* The children run through env(1): the shim preloaded as here, with
     * another sparsity. */
    char preload[4096], asan[1024];
    snprintf(preload, sizeof preload, "LD_PRELOAD=%s", getenv("LD_PRELOAD") ? getenv("LD_PRELOAD") : "");
    snprintf(asan, sizeof asan, "ASAN_OPTIONS=%s", getenv("ASAN_OPTIONS") ? getenv("ASAN_OPTIONS") : "");
    char *args[] = {preload, asan, "DGC_SPARSITY=0.9", self, "spawn_child", NULL};
    MPI_Comm inter, merged;
    int codes[2];
    MPI_Comm_spawn("/usr/bin/env", args, 2, MPI_INFO_NULL, 0, MPI_COMM_WORLD, &inter, codes);
    MPI_Intercomm_merge(inter, 0, &merged);
    run_mismatched(merged);
    MPI_Comm_free(&inter);
}

static void mode_spawn_child(void) {
    MPI_Comm parent, merged;
    MPI_Comm_get_parent(&parent);
    if (parent == MPI_COMM_NULL) fail("spawn_child run without a parent");
    MPI_Intercomm_merge(parent, 1, &merged);
    run_mismatched(merged);
    MPI_Comm_free(&parent);
}

/* ---- an invalid communicator ---- */
/* Which MPI function raised the error. Open MPI hands a C error handler
 * its name as the first of its variable arguments (the standard leaves them
 * to the implementation): what its fatal handler prints as "An error
 * occurred in MPI_Allreduce". MPICH names it in the error's own text (its
 * error stack: "MPI_Allreduce(sbuf=..., comm=MPI_COMM_NULL) failed"). Read
 * here, where no aborting process can lose the message on its way to the
 * launcher. */
static char raised_in[64];

static void record_raiser(MPI_Comm *comm, int *code, ...) {
    (void)comm;
#if defined(MPICH_VERSION)
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(*code, text, &len);
    const char *at = strstr(text, "MPI_");
    size_t name = at ? strspn(at, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_") : 0;
    snprintf(raised_in, sizeof raised_in, "%.*s", (int)name, at ? at : "(none)");
    if (!at) snprintf(raised_in, sizeof raised_in, "(none)");
#else
    (void)code;
    va_list ap;
    va_start(ap, code);
    const char *name = va_arg(ap, const char *);
    va_end(ap);
    snprintf(raised_in, sizeof raised_in, "%s", name ? name : "(none)");
#endif
}

/* Open MPI raises an invalid communicator on MPI_COMM_WORLD's handler. */
static void mode_comm_null(void) {
    const long n = 100000, k = k_for(n, 0.01);
    float *g = malloc((size_t)n * sizeof *g), *out = malloc((size_t)n * sizeof *out);
    float *want = malloc((size_t)n * sizeof *want);
    long step = 0;
    fill_grad(g, rank, step, n);
    MPI_Errhandler eh;
    MPI_Comm_create_errhandler(record_raiser, &eh);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, eh);
    int rc = MPI_Allreduce(g, out, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_NULL);
    expect_class_everywhere(rc, MPI_ERR_COMM, MPI_COMM_WORLD, "MPI_Allreduce on MPI_COMM_NULL");
    int ours = strcmp(raised_in, "MPI_Allreduce") == 0, all = 0;
    MPI_Allreduce(&ours, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD); /* a small int: passed through */
    if (!ours) fail("the error on MPI_COMM_NULL was raised in '%s', not MPI_Allreduce", raised_in);
    if (!all) fail("the error on MPI_COMM_NULL was raised outside MPI_Allreduce on some other rank");
    rc = MPI_Allreduce(g, out, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    expect_class_everywhere(rc, MPI_SUCCESS, MPI_COMM_WORLD, "the next call on MPI_COMM_WORLD");
    first_step_reference(n, k, nranks, grad_at_step, &step, want);
    if (memcmp(out, want, (size_t)n * sizeof *out) != 0)
        fail("the call after MPI_COMM_NULL is not the fresh first step");
    if (rank == 0)
        printf("PASS comm_null: MPI_ERR_COMM raised in MPI_Allreduce on every rank, then the fresh first step\n");
    MPI_Errhandler_free(&eh);
    free(g), free(out), free(want);
}

/* ---- threads ---- */
#define MAX_THREADS 8
#define THREAD_STEPS 12

typedef struct {
    int t;
    long n;
    MPI_Comm comm;
    uint64_t hash[THREAD_STEPS];
} job;

static uint64_t hash_floats(const float *x, long n) {
    uint64_t h = 1469598103934665603ull;
    const unsigned char *b = (const unsigned char *)x;
    for (size_t i = 0; i < (size_t)n * sizeof *x; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static void *run_job(void *arg) {
    job *j = arg;
    float *g = malloc((size_t)j->n * sizeof *g), *out = malloc((size_t)j->n * sizeof *out);
    for (long s = 0; s < THREAD_STEPS; s++) {
        fill_grad(g, rank + 16 * j->t, s, j->n);
        MPI_Allreduce(g, out, (int)j->n, MPI_FLOAT, MPI_SUM, j->comm);
        check_identical(out, j->n, j->comm, "a thread's output");
        long nz = 0;
        for (long i = 0; i < j->n; i++) nz += out[i] != 0;
        /* S_t - m S_{t-1} (momentum compensation): once both steps are past the
         * warm-up (6 steps), at most 2 k pairs per rank */
        if (s >= 7 && nz > 2 * k_for(j->n, 0.01) * nranks) fail("thread %d step %ld: not compressed (%ld non-zeros)", j->t, s, nz);
        j->hash[s] = hash_floats(out, j->n);
    }
    free(g);
    free(out);
    return NULL;
}

static void mode_threads(int nthreads) {
    job concurrent[MAX_THREADS], serial[MAX_THREADS];
    pthread_t tid[MAX_THREADS];
    for (int t = 0; t < nthreads; t++) {
        /* Threads 0 and 1 share a count: their step counters must not mix. */
        long n = t == 1 ? 30000 : 30000 + 5000 * t;
        concurrent[t] = serial[t] = (job){.t = t, .n = n};
        MPI_Comm_dup(MPI_COMM_WORLD, &concurrent[t].comm);
        MPI_Comm_dup(MPI_COMM_WORLD, &serial[t].comm);
    }
    for (int t = 0; t < nthreads; t++) pthread_create(&tid[t], NULL, run_job, &concurrent[t]);
    for (int t = 0; t < nthreads; t++) pthread_join(tid[t], NULL);
    for (int t = 0; t < nthreads; t++) run_job(&serial[t]);
    for (int t = 0; t < nthreads; t++) {
        for (long s = 0; s < THREAD_STEPS; s++)
            if (concurrent[t].hash[s] != serial[t].hash[s])
                fail("thread %d step %ld: output differs from the same calls made one thread at a time", t, s);
        MPI_Comm_free(&concurrent[t].comm);
        MPI_Comm_free(&serial[t].comm);
    }
    if (rank == 0) printf("PASS threads: %d threads x %d steps, equal to the serial replay\n", nthreads, THREAD_STEPS);
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    int flat_reference = 1; /* nomem: the repeated call is compared with flat DGC's first step */
    long threads = 4, n = 8 << 20, headroom = 24; /* nomem: 32 MiB of floats, the state wants 64 */
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--threads")) threads = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--n")) n = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--headroom")) headroom = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--flat-reference")) flat_reference = atoi(argv[i + 1]);
    }
    test_init(&argc, &argv, !strcmp(mode, "threads") ? MPI_THREAD_MULTIPLE : MPI_THREAD_SINGLE);
    if (!strcmp(mode, "nomem")) mode_nomem(n, headroom, flat_reference);
    else if (!strcmp(mode, "spawn_mismatch")) mode_spawn_parent();
    else if (!strcmp(mode, "spawn_child")) mode_spawn_child();
    else if (!strcmp(mode, "comm_null")) mode_comm_null();
    else if (!strcmp(mode, "threads")) mode_threads(threads < 1 ? 1 : threads > MAX_THREADS ? MAX_THREADS : (int)threads);
    else fail("unknown mode '%s'", mode);
    MPI_Finalize();
    return 0;
}
