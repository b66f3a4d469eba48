/* gpu.nccl.ddp_shape*: what PyTorch DDP does with NCCL, as a plain C NCCL +
 * MPI program run under LD_PRELOAD=libdgcshim.so on 2 ranks, against the
 * shim's own MPI path on the same gradients.
 *
 *   ddp_shape CASE      (under mpirun; every rank on device 0)
 *
 * DDP's pattern (the design notes, "The GPU path"): persistent buckets,
 * all-reduced in place, fp32, ncclSum, on the framework's own stream,
 * outside any group; at step 0 one bucket of every gradient, then the
 * bucket set is rebuilt once, in the same memory (buckets of 262144, 100003
 * and 20000 elements), for every later step. Each step, the same gradients
 * also go through MPI_Allreduce (MPI_IN_PLACE, MPI_FLOAT, MPI_SUM) on host
 * buffers of the same layout, under the same shim: the MPI path. Both run
 * DGC with warm-up and momentum correction and compensation; the NCCL
 * path's output must equal the MPI path's bit for bit at every step, and
 * be the same bytes on every rank. The shim's STATS (checked by the ctest
 * case) show every call compressed.
 *
 * ddp_shape_fresh*: each bucket is all-reduced from a new buffer every call
 * (a comm hook that makes a new tensor per call), on both paths, under
 * DGC_BUFFER_KEY=order; the same equality holds.
 *
 * The program knows nothing of the shim: MPI_Init is the ordinary one (so
 * the shim's MPI path runs), and the DGC_* settings are set before it. */
#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define STEPS 300
#define NBUCKETS 3
static const long bucket[NBUCKETS] = {262144, 100003, 20000};
#define ALL (262144 + 100003 + 20000)

static int rank, nranks;
static const char *case_name = "?";

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void fail(const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "FAIL gpu.nccl.%s rank %d: %s\n", case_name, rank, msg);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}

#define CUDA_OK(x)                                                                                                    \
    do {                                                                                                              \
        cudaError_t e_ = (x);                                                                                         \
        if (e_ != cudaSuccess) fail("%s: %s (line %d)", #x, cudaGetErrorString(e_), __LINE__);                        \
    } while (0)
#define NCCL_OK(x)                                                                                                    \
    do {                                                                                                              \
        ncclResult_t r_ = (x);                                                                                        \
        if (r_ != ncclSuccess) fail("%s: %d, %s (line %d)", #x, (int)r_, ncclGetErrorString(r_), __LINE__);           \
    } while (0)

static uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Rank r's gradient of parameter i at step: uniform in [-1, 1) (24 bits)
 * times a per-parameter scale over three decades, so that some layers'
 * values dominate as in a network. */
static float grad(int r, long step, long i) {
    const uint64_t k = mix(mix(mix((uint64_t)r) + (uint64_t)step) + (uint64_t)i);
    static const float scale[4] = {1.0f, 0.1f, 0.01f, 0.001f};
    return ((float)(k >> 40) / 8388608.0f - 1.0f) * scale[(i / 97) % 4];
}

static uint64_t hash_bytes(const void *p, size_t len) {
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static void check_identical(const float *out, long n, long step) {
    uint64_t h = hash_bytes(out, (size_t)n * sizeof(float)), all[64];
    if (nranks > 64) fail("too many ranks");
    PMPI_Allgather(&h, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, MPI_COMM_WORLD);
    for (int r = 1; r < nranks; r++)
        if (all[r] != all[0]) fail("step %ld: rank %d's output bytes differ from rank 0's", step, r);
}

static int group_rank = -1; /* the rank that wraps each step's calls in a group (older DDP, coalesced calls) */

/* fresh: every bucket is all-reduced from a buffer of its own each call, as
 * a comm hook that makes a new tensor per call (fp16_compress_hook's
 * pattern) gets from a caching allocator: slots of a pool in a rotating
 * order, so that a bucket often lands where another was (DGC_BUFFER_KEY=order). */
#define POOL 4
static int fresh;
static float *dev_pool[POOL], *host_pool[POOL];

static float *slot(float **pool, long step, int b) { return pool[(b + step) % POOL] + (step % 3) * 16; }

/* Copies bucket b in (to 1) or back out of (to 0) its fresh buffer; nothing
 * without fresh. Outside any group: a grouped collective is enqueued at
 * ncclGroupEnd, after whatever the stream got inside the group. */
static void fresh_copy(float *x, long n, long step, int b, int in, cudaStream_t s) {
    if (!fresh) return;
    float *y = slot(dev_pool, step, b);
    const size_t bytes = (size_t)n * sizeof(float);
    CUDA_OK(cudaMemcpyAsync(in ? y : x, in ? x : y, bytes, cudaMemcpyDeviceToDevice, s));
}

static void nccl_bucket(float *x, long n, long step, int b, ncclComm_t comm, cudaStream_t s) {
    float *y = fresh ? slot(dev_pool, step, b) : x;
    NCCL_OK(ncclAllReduce(y, y, (size_t)n, ncclFloat32, ncclSum, comm, s));
}

/* The calls of one step, on the NCCL path, as DDP issues them. */
static void nccl_step(float *dev, long step, ncclComm_t comm, cudaStream_t s) {
    const int grouped = rank == group_rank;
    const int nb = step == 0 ? 1 : NBUCKETS;
    for (int pass = 0; pass < 3; pass++) { /* copy in, all-reduce (grouped or not), copy back */
        if (pass == 1 && grouped) NCCL_OK(ncclGroupStart());
        long at = 0;
        for (int b = 0; b < nb; b++) {
            const long n = step == 0 ? ALL : bucket[b];
            if (pass == 1) nccl_bucket(dev + at, n, step, b, comm, s);
            else fresh_copy(dev + at, n, step, b, pass == 0, s);
            at += n;
        }
        if (pass == 1 && grouped) NCCL_OK(ncclGroupEnd());
    }
}

static void mpi_bucket(float *x, long n, long step, int b) {
    float *y = fresh ? slot(host_pool, step, b) : x;
    if (fresh) memcpy(y, x, (size_t)n * sizeof(float));
    if (MPI_Allreduce(MPI_IN_PLACE, y, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD) != MPI_SUCCESS)
        fail("MPI_Allreduce failed");
    if (fresh) memcpy(x, y, (size_t)n * sizeof(float));
}

static void mpi_step(float *host, long step) {
    if (step == 0) {
        mpi_bucket(host, ALL, step, 0);
        return;
    }
    long at = 0;
    for (int b = 0; b < NBUCKETS; b++) {
        mpi_bucket(host + at, bucket[b], step, b);
        at += bucket[b];
    }
}

static void run(void) {
    ncclUniqueId id;
    if (rank == 0) NCCL_OK(ncclGetUniqueId(&id));
    PMPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    ncclComm_t comm;
    NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
    cudaStream_t s;
    CUDA_OK(cudaStreamCreate(&s));
    const size_t bytes = (size_t)ALL * sizeof(float);
    float *g = malloc(bytes), *via_mpi = malloc(bytes), *via_nccl = malloc(bytes), *dev = NULL;
    if (!g || !via_mpi || !via_nccl) fail("no host memory");
    CUDA_OK(cudaMalloc((void **)&dev, bytes));
    for (int j = 0; fresh && j < POOL; j++) {
        CUDA_OK(cudaMalloc((void **)&dev_pool[j], bytes + 64 * sizeof(float)));
        if (!(host_pool[j] = malloc(bytes + 64 * sizeof(float)))) fail("no host memory");
    }
    long nonzero = 0;
    for (long step = 0; step < STEPS; step++) {
        for (long i = 0; i < ALL; i++) g[i] = grad(rank, step, i);
        CUDA_OK(cudaMemcpy(dev, g, bytes, cudaMemcpyHostToDevice));
        nccl_step(dev, step, comm, s);
        memcpy(via_mpi, g, bytes);
        mpi_step(via_mpi, step);
        CUDA_OK(cudaStreamSynchronize(s));
        CUDA_OK(cudaMemcpy(via_nccl, dev, bytes, cudaMemcpyDeviceToHost));
        for (long i = 0; i < ALL; i++)
            if (memcmp(&via_nccl[i], &via_mpi[i], sizeof(float)) != 0)
                fail("step %ld element %ld: the NCCL path gave %.9g, the MPI path %.9g", step, i, via_nccl[i],
                     via_mpi[i]);
        check_identical(via_nccl, ALL, step);
        for (long i = 0; i < ALL; i++) nonzero += via_nccl[i] != 0.0f;
    }
    if (nonzero == 0) fail("every output was zero");
    printf("gpu.nccl.%s rank %d: %d steps, NCCL path equal to the MPI path bit for bit, %.1f non-zeros a step\n",
           case_name, rank, STEPS, (double)nonzero / STEPS);
    CUDA_OK(cudaFree(dev));
    for (int j = 0; fresh && j < POOL; j++) {
        CUDA_OK(cudaFree(dev_pool[j]));
        free(host_pool[j]);
    }
    NCCL_OK(ncclCommDestroy(comm));
    free(g);
    free(via_mpi);
    free(via_nccl);
}

typedef struct {
    const char *name;
    const char *env[8];
    int group_rank;
    int fresh;
} test_case;

#define DDP "DGC_WARMUP_STEPS=20", "DGC_MOMENTUM=0.9", "DGC_STATS=1"
static const test_case cases[] = {
    {"ddp_shape", {DDP}, -1, 0},
    {"ddp_shape_fp32", {DDP, "DGC_VALUE_BITS=32"}, -1, 0},
    /* A budget on every rank that the large buckets' states pass: they are
     * summed densely, on both paths, the small one compressed. 2 MB, not
     * 1: here one process holds both paths' states under the one budget
     * (the NCCL path's 20000-element state alone is 0.78 MB: it is sized for
     * the warm-up's densest step). */
    {"ddp_shape_over_budget", {DDP, "DGC_MAX_STATE_MB=2"}, -1, 0},
    /* Rank 1 groups each step's calls, rank 0 does not. */
    {"ddp_shape_mixed_groups", {DDP}, 1, 0},
    /* DGC_STATS_FILE, written from both paths' calls (print_stats_file). */
    {"ddp_shape_stats_file", {DDP, "DGC_STATS_EVERY=100"}, -1, 0},
    /* A fresh buffer per bucket per call (a comm hook's new tensor), keyed
     * by order on both paths: the NCCL path still equals the MPI path. */
    {"ddp_shape_fresh", {DDP, "DGC_BUFFER_KEY=order"}, -1, 1},
    {"ddp_shape_fresh_groups", {DDP, "DGC_BUFFER_KEY=order"}, 1, 1},
};

/* Each rank's DGC_STATS_FILE after MPI_Finalize: how many lines of each
 * event, and the exit line's compressed_calls, for the case's --grep. */
static void print_stats_file(const char *stem) {
    char path[512], line[65536];
    snprintf(path, sizeof path, "%s.%d", stem, rank);
    FILE *f = fopen(path, "r");
    if (!f) {
        printf("stats file rank %d: %s missing\n", rank, path);
        return;
    }
    int every = 0, exits = 0;
    long long calls = -1;
    while (fgets(line, sizeof line, f)) {
        every += strstr(line, "\"event\":\"every\"") != NULL;
        if (strstr(line, "\"event\":\"exit\"")) {
            exits++;
            const char *c = strstr(line, "\"compressed_calls\":");
            if (c) calls = atoll(c + strlen("\"compressed_calls\":"));
        }
    }
    fclose(f);
    remove(path);
    printf("stats file rank %d: every %d exit %d compressed_calls %lld\n", rank, every, exits, calls);
    fflush(stdout);
}

int main(int argc, char **argv) {
    const test_case *tc = NULL;
    for (size_t i = 0; argc == 2 && i < sizeof cases / sizeof cases[0]; i++)
        if (strcmp(argv[1], cases[i].name) == 0) tc = &cases[i];
    if (!tc) {
        fprintf(stderr, "usage: ddp_shape CASE (ddp_shape, ddp_shape_fp32, ddp_shape_over_budget, "
                        "ddp_shape_mixed_groups, ddp_shape_stats_file, ddp_shape_fresh, ddp_shape_fresh_groups)\n");
        return 2;
    }
    case_name = tc->name;
    group_rank = tc->group_rank;
    fresh = tc->fresh;
    /* Before MPI_Init: the shim reads its settings there (the MPI path) and
     * at the first NCCL call (the NCCL path). */
    for (int i = 0; i < 8 && tc->env[i]; i++) putenv((char *)tc->env[i]);
    /* Both ranks' parent is the same launcher: one stem for the case's ranks. */
    static char stats_env[128];
    snprintf(stats_env, sizeof stats_env, "DGC_STATS_FILE=/tmp/dgc-ddp-shape-%ld", (long)getppid());
    int stats_file = strcmp(tc->name, "ddp_shape_stats_file") == 0;
    if (stats_file) putenv(stats_env);
    if (MPI_Init(&argc, &argv) != MPI_SUCCESS) return 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    CUDA_OK(cudaSetDevice(0));
    run();
    PMPI_Barrier(MPI_COMM_WORLD);
    printf("PASS gpu.nccl.%s rank %d of %d\n", tc->name, rank, nranks);
    fflush(stdout);
    MPI_Finalize();
    if (stats_file) print_stats_file(stats_env + strlen("DGC_STATS_FILE="));
    return 0;
}
