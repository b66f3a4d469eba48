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
 * Other PyTorch patterns, 60 steps each (warm-up 10):
 * - ddp_shape_rebuild_moved: DDP's rebuild at new addresses (the rebuilt
 *   buckets allocated afresh, step 0's bucket kept for other tensors and
 *   never all-reduced again): equal bit for bit; what became of step 0's
 *   state is printed from the shim's statistics file (report_old_state).
 * - ddp_shape_unused: find_unused_parameters, its int32 local-used map
 *   all-reduced each step after the buckets and a bucket zero on one rank:
 *   equal bit for bit, the map exact on both paths.
 * - ddp_shape_bf16: bf16 buckets, which the MPI path has no type for: the
 *   NCCL path's output is the fp32 MPI path's rounded to bf16, bit for bit
 *   (compare()).
 * - ddp_shape_nccl_only: the NCCL path alone, a hash of its outputs, run
 *   under the full library and the NCCL-only one (same_output.sh).
 * - ddp_shape_fresh_auto: the comm hook's new tensor per call under the
 *   default DGC_BUFFER_KEY (auto), on both paths, from the same rotating
 *   pool: until the shim sees the buffers move, each call starts from a new
 *   state (the NCCL path retires the state a new buffer overlaps; the MPI
 *   path's addresses repeat only every 12 steps), and from then on states
 *   follow places: equal bit for bit. ddp_shape_fresh_address: keyed by
 *   address, a new state every call on both paths for 12 steps.
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

/* bf16 on the host: round to nearest even (finite values only here). */
static uint16_t float_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

static float bf16_to_float(uint16_t b) {
    uint32_t x = (uint32_t)b << 16;
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

static uint64_t hash_bytes(const void *p, size_t len) {
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static void check_identical(const void *out, size_t bytes, long step) {
    uint64_t h = hash_bytes(out, bytes), all[64];
    if (nranks > 64) fail("too many ranks");
    PMPI_Allgather(&h, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, MPI_COMM_WORLD);
    for (int r = 1; r < nranks; r++)
        if (all[r] != all[0]) fail("step %ld: rank %d's output bytes differ from rank 0's", step, r);
}

typedef struct {
    const char *name;
    const char *env[8];
    int group_rank; /* the rank that wraps each step's calls in a group (older DDP, coalesced calls), or -1 */
    int fresh;      /* a new buffer per bucket per call (a comm hook's new tensor) */
    int moved;      /* the rebuilt buckets at new addresses (B), step 0's bucket (A) left to other uses */
    int unused;     /* find_unused_parameters: the local-used map's all-reduce, a bucket unused on rank 1 */
    int bf16;       /* the buckets in bf16 (ncclBfloat16) */
    long steps;     /* 0: STEPS */
    int stats_file; /* DGC_STATS_FILE, read back after MPI_Finalize (print_stats_file) */
    int nccl_only;  /* no MPI path: a hash of every NCCL output instead, to compare two libraries' */
} test_case;

static const test_case *tc;
static long steps;
static size_t esize; /* the buckets' element size on the NCCL path: 4 (fp32) or 2 (bf16) */

/* fresh: every bucket is all-reduced from a buffer of its own each call, as
 * a comm hook that makes a new tensor per call (fp16_compress_hook's
 * pattern) gets from a caching allocator: slots of a pool in a rotating
 * order, so that a bucket often lands where another was. */
#define POOL 4
static unsigned char *dev_pool[POOL];
static float *host_pool[POOL];

static unsigned char *dev_slot(long step, int b) { return dev_pool[(b + step) % POOL] + (step % 3) * 64; }
static float *host_slot(long step, int b) { return host_pool[(b + step) % POOL] + (step % 3) * 16; }

/* fresh == SHARED: the caching allocator's steady state when a bucket's
 * tensor is freed (its all-reduce done) before the next one is made: the
 * same block for buckets 0 and 2 every step, another for bucket 1; each
 * bucket copied in, all-reduced and copied back in turn. */
#define SHARED 2

/* Copies bucket b in (to 1) or back out of (to 0) its fresh buffer; nothing
 * without fresh. Outside any group: a grouped collective is enqueued at
 * ncclGroupEnd, after whatever the stream got inside the group. */
static void fresh_copy(unsigned char *x, long n, long step, int b, int in, cudaStream_t s) {
    if (!tc->fresh) return;
    unsigned char *y = tc->fresh == SHARED ? dev_pool[b == 1] : dev_slot(step, b);
    const size_t bytes = (size_t)n * esize;
    CUDA_OK(cudaMemcpyAsync(in ? y : x, in ? x : y, bytes, cudaMemcpyDeviceToDevice, s));
}

static void nccl_bucket(unsigned char *x, long n, long step, int b, ncclComm_t comm, cudaStream_t s) {
    unsigned char *y = tc->fresh == SHARED ? dev_pool[b == 1] : tc->fresh ? dev_slot(step, b) : x;
    NCCL_OK(ncclAllReduce(y, y, (size_t)n, tc->bf16 ? ncclBfloat16 : ncclFloat32, ncclSum, comm, s));
}

/* The calls of one step, on the NCCL path, as DDP issues them. */
static void nccl_step(unsigned char *dev, long step, ncclComm_t comm, cudaStream_t s) {
    const int grouped = rank == tc->group_rank;
    const int nb = step == 0 ? 1 : NBUCKETS;
    if (tc->fresh == SHARED) { /* one bucket after another: copy in, all-reduce, copy back */
        long at = 0;
        for (int b = 0; b < nb; b++) {
            const long n = step == 0 ? ALL : bucket[b];
            fresh_copy(dev + at * esize, n, step, b, 1, s);
            nccl_bucket(dev + at * esize, n, step, b, comm, s);
            fresh_copy(dev + at * esize, n, step, b, 0, s);
            at += n;
        }
        return;
    }
    for (int pass = 0; pass < 3; pass++) { /* copy in, all-reduce (grouped or not), copy back */
        if (pass == 1 && grouped) NCCL_OK(ncclGroupStart());
        long at = 0;
        for (int b = 0; b < nb; b++) {
            const long n = step == 0 ? ALL : bucket[b];
            if (pass == 1) nccl_bucket(dev + at * esize, n, step, b, comm, s);
            else fresh_copy(dev + at * esize, n, step, b, pass == 0, s);
            at += n;
        }
        if (pass == 1 && grouped) NCCL_OK(ncclGroupEnd());
    }
}

static void mpi_bucket(float *x, long at, long n, long step, int b) {
    float *y = tc->fresh == SHARED ? host_pool[b == 1] : tc->fresh ? host_slot(step, b) : x + at;
    if (y != x + at) memcpy(y, x + at, (size_t)n * sizeof(float));
    if (MPI_Allreduce(MPI_IN_PLACE, y, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD) != MPI_SUCCESS)
        fail("MPI_Allreduce failed");
    if (y != x + at) memcpy(x + at, y, (size_t)n * sizeof(float));
}

static void mpi_step(float *host, long step) {
    if (step == 0) {
        mpi_bucket(host, 0, ALL, step, 0);
        return;
    }
    long at = 0;
    for (int b = 0; b < NBUCKETS; b++) {
        mpi_bucket(host, at, bucket[b], step, b);
        at += bucket[b];
    }
}

/* find_unused_parameters (unused): the parameters of the last bucket (its
 * 20000 elements) take no part in rank 1's forward pass at 3 steps in 4, so
 * that rank's gradients there are zero (DDP zeroes an unused parameter's
 * place in its bucket), and each step, once every bucket's all-reduce is
 * issued, DDP all-reduces its local-used map: one int32 per parameter, 1
 * where this rank used it, ncclInt32 ncclSum (Reducer::all_reduce_local_used_map,
 * a tensor of at::kInt on the device, the same tensor every step). Here a
 * parameter is 16 elements of a bucket (the last one shorter): 23886 of
 * them, past DGC_MIN_ELEMENTS, so that only its type makes it pass through. */
#define PARAM 16
#define NMAP ((262144 + PARAM - 1) / PARAM + (100003 + PARAM - 1) / PARAM + (20000 + PARAM - 1) / PARAM)
#define UNUSED_AT (262144 + 100003) /* the first element of the last bucket */
#define UNUSED_MAP ((262144 + PARAM - 1) / PARAM + (100003 + PARAM - 1) / PARAM)

static int is_unused(int r, long step) { return tc->unused && r == 1 && step % 4 != 0; }

static void local_used_map(int32_t *map, int r, long step) {
    for (long p = 0; p < NMAP; p++) map[p] = !(p >= UNUSED_MAP && is_unused(r, step));
}

/* The NCCL path's outputs as floats (bf16 widened). */
static void widen(const void *raw, float *out) {
    if (!tc->bf16) {
        memcpy(out, raw, (size_t)ALL * sizeof(float));
        return;
    }
    const uint16_t *h = raw;
    for (long i = 0; i < ALL; i++) out[i] = bf16_to_float(h[i]);
}

/* bf16: the NCCL path's output must be the MPI path's fp32 output rounded
 * to bf16 (nearest even), bit for bit. Both paths get the same gradients
 * (bf16 values, so exactly the same floats), keep residual and momentum in
 * fp32, and here send every step by the sparse all-gather, which sums in
 * fp32 (the case checks the STATS transport column): the NCCL path rounds
 * the decoded fp32 sum to the buffer's type once, at the end. A bf16 step
 * by the dense transport would sum in bf16, which the MPI path cannot (it
 * has no 16-bit type), and end the equality: then DGC_TRANSPORT=sparse
 * belongs in the case's settings. */
static void compare(const void *raw, const float *via_nccl, const float *via_mpi, long step) {
    for (long i = 0; i < ALL; i++) {
        if (tc->bf16) {
            const uint16_t got = ((const uint16_t *)raw)[i], want = float_to_bf16(via_mpi[i]);
            if (got != want)
                fail("step %ld element %ld: the NCCL path gave bf16 %#06x (%.9g), the MPI path %.9g, which "
                     "rounds to %#06x",
                     step, i, got, via_nccl[i], via_mpi[i], want);
        } else if (memcmp(&via_nccl[i], &via_mpi[i], sizeof(float)) != 0) {
            fail("step %ld element %ld: the NCCL path gave %.9g, the MPI path %.9g", step, i, via_nccl[i],
                 via_mpi[i]);
        }
        if (via_nccl[i] != via_nccl[i] || via_nccl[i] - via_nccl[i] != 0.0f)
            fail("step %ld element %ld: the NCCL path gave %g", step, i, via_nccl[i]);
    }
}

/* moved: the state of step 0's bucket, as the shim's statistics file says
 * at the last step (DGC_STATS_FILE with DGC_STATS_EVERY=1: its last line):
 * the row of the bucket's address and count, on each path. The ctest case
 * holds the line this prints to the shim's policy of the day. */
static const char *stats_stem;

static void report_old_state(const void *dev_a, const void *host_a) {
    char path[512];
    snprintf(path, sizeof path, "%s.%d", stats_stem, rank);
    FILE *f = fopen(path, "r");
    if (!f) fail("no statistics file %s", path);
    size_t cap = 1 << 22, len = 0;
    char *line = malloc(cap), *last = malloc(cap);
    if (!line || !last) fail("no host memory");
    last[0] = 0;
    while (fgets(line, (int)cap, f)) {
        len = strlen(line);
        if (len && line[len - 1] == '\n') memcpy(last, line, len + 1);
    }
    fclose(f);
    const void *at[2] = {dev_a, host_a};
    char said[2][96];
    for (int p = 0; p < 2; p++) {
        char key[128];
        snprintf(key, sizeof key, "{\"buffer\":\"%p\",\"count\":%ld,\"live\":", at[p], (long)ALL);
        const char *row = strstr(last, key);
        if (!row) {
            snprintf(said[p], sizeof said[p], "no row");
            continue;
        }
        row += strlen(key);
        const int live = strncmp(row, "true", 4) == 0;
        const char *st = strstr(row, "\"states\":");
        snprintf(said[p], sizeof said[p], "%s (states %lld)", live ? "live" : "released",
                 st ? atoll(st + strlen("\"states\":")) : -1ll);
    }
    const char *ls = strstr(last, "\"live_states\":");
    printf("gpu.nccl.%s rank %d: step 0's bucket at the last step: NCCL path %s, MPI path %s; live states %lld\n",
           case_name, rank, said[0], said[1], ls ? atoll(ls + strlen("\"live_states\":")) : -1ll);
    fflush(stdout);
    free(line);
    free(last);
}

static void run(void) {
    ncclUniqueId id;
    if (rank == 0) NCCL_OK(ncclGetUniqueId(&id));
    PMPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    ncclComm_t comm;
    NCCL_OK(ncclCommInitRank(&comm, nranks, id, rank));
    cudaStream_t s;
    CUDA_OK(cudaStreamCreate(&s));
    const size_t bytes = (size_t)ALL * sizeof(float), dbytes = (size_t)ALL * esize;
    float *g = malloc(bytes), *via_mpi = malloc(bytes), *via_nccl = malloc(bytes), *host_a = NULL;
    void *raw = malloc(dbytes), *up = malloc(dbytes);
    int32_t *map = malloc(NMAP * sizeof(int32_t)), *map_mpi = malloc(NMAP * sizeof(int32_t)),
            *map_nccl = malloc(NMAP * sizeof(int32_t)), *dev_map = NULL;
    unsigned char *dev = NULL, *dev_a = NULL;
    if (!g || !via_mpi || !via_nccl || !raw || !up || !map || !map_mpi || !map_nccl) fail("no host memory");
    /* Step 0's bucket; unless moved, the rebuilt buckets take its memory. */
    CUDA_OK(cudaMalloc((void **)&dev_a, dbytes));
    if (tc->moved && !(host_a = malloc(bytes))) fail("no host memory");
    if (tc->unused) CUDA_OK(cudaMalloc((void **)&dev_map, NMAP * sizeof(int32_t)));
    for (int j = 0; tc->fresh && j < POOL; j++) {
        CUDA_OK(cudaMalloc((void **)&dev_pool[j], dbytes + 256));
        if (!(host_pool[j] = malloc(bytes + 64 * sizeof(float)))) fail("no host memory");
    }
    long nonzero = 0;
    uint64_t hash = 0; /* nccl_only: every step's output hash, folded in order */
    for (long step = 0; step < steps; step++) {
        if (step == 1 && tc->moved) {
            /* DDP's rebuild: the buckets allocated afresh (B), step 0's
             * bucket (A) kept by the caching allocator for other tensors:
             * activations, written every step and never all-reduced. */
            CUDA_OK(cudaMalloc((void **)&dev, dbytes));
        } else if (step == 0) {
            dev = dev_a;
        }
        if (tc->moved && step > 0) CUDA_OK(cudaMemsetAsync(dev_a, (int)(step & 0xff), dbytes, s));
        for (long i = 0; i < ALL; i++) g[i] = i >= UNUSED_AT && is_unused(rank, step) ? 0.0f : grad(rank, step, i);
        if (tc->bf16) {
            uint16_t *h = up;
            for (long i = 0; i < ALL; i++) g[i] = bf16_to_float(h[i] = float_to_bf16(g[i]));
        } else {
            memcpy(up, g, bytes);
        }
        CUDA_OK(cudaMemcpy(dev, up, dbytes, cudaMemcpyHostToDevice));
        nccl_step(dev, step, comm, s);
        if (tc->unused) { /* after every bucket's all-reduce is issued, as the reducer does */
            local_used_map(map, rank, step);
            CUDA_OK(cudaMemcpyAsync(dev_map, map, NMAP * sizeof(int32_t), cudaMemcpyHostToDevice, s));
            NCCL_OK(ncclAllReduce(dev_map, dev_map, NMAP, ncclInt32, ncclSum, comm, s));
        }
        float *mpi_buf = tc->moved && step == 0 ? host_a : via_mpi;
        memcpy(mpi_buf, g, bytes);
        if (!tc->nccl_only) mpi_step(mpi_buf, step);
        if (mpi_buf != via_mpi) memcpy(via_mpi, mpi_buf, bytes);
        if (tc->unused) {
            memcpy(map_mpi, map, NMAP * sizeof(int32_t));
            if (MPI_Allreduce(MPI_IN_PLACE, map_mpi, NMAP, MPI_INT, MPI_SUM, MPI_COMM_WORLD) != MPI_SUCCESS)
                fail("MPI_Allreduce of the local-used map failed");
        }
        CUDA_OK(cudaStreamSynchronize(s));
        CUDA_OK(cudaMemcpy(raw, dev, dbytes, cudaMemcpyDeviceToHost));
        widen(raw, via_nccl);
        if (!tc->nccl_only) compare(raw, via_nccl, via_mpi, step);
        hash = (hash ^ hash_bytes(raw, dbytes)) * 1099511628211ull;
        check_identical(raw, dbytes, step);
        if (tc->unused) { /* exact on both paths: the number of ranks that used each parameter */
            CUDA_OK(cudaMemcpy(map_nccl, dev_map, NMAP * sizeof(int32_t), cudaMemcpyDeviceToHost));
            for (long p = 0; p < NMAP; p++) {
                int32_t want = 0;
                for (int r = 0; r < nranks; r++) want += !(p >= UNUSED_MAP && is_unused(r, step));
                if (map_nccl[p] != want || map_mpi[p] != want)
                    fail("step %ld: parameter %ld used on %d rank(s), the NCCL path's map says %d, the MPI path's %d",
                         step, p, (int)want, (int)map_nccl[p], (int)map_mpi[p]);
            }
        }
        for (long i = 0; i < ALL; i++) nonzero += via_nccl[i] != 0.0f;
    }
    if (nonzero == 0) fail("every output was zero");
    if (tc->moved) report_old_state(dev_a, host_a);
    if (tc->nccl_only)
        printf("gpu.nccl.%s rank %d: %ld steps, the NCCL path alone, %.1f non-zeros a step\nhash gpu.nccl.%s rank "
               "%d: %016llx\n",
               case_name, rank, steps, (double)nonzero / (double)steps, case_name, rank, (unsigned long long)hash);
    else
        printf("gpu.nccl.%s rank %d: %ld steps, NCCL path equal to the MPI path %s, %.1f non-zeros a step\n",
               case_name, rank, steps, tc->bf16 ? "rounded to bf16, bit for bit" : "bit for bit",
               (double)nonzero / (double)steps);
    CUDA_OK(cudaFree(dev_a));
    if (dev != dev_a) CUDA_OK(cudaFree(dev));
    if (dev_map) CUDA_OK(cudaFree(dev_map));
    for (int j = 0; tc->fresh && j < POOL; j++) {
        CUDA_OK(cudaFree(dev_pool[j]));
        free(host_pool[j]);
    }
    NCCL_OK(ncclCommDestroy(comm));
    free(g);
    free(via_mpi);
    free(via_nccl);
    free(raw);
    free(up);
    free(host_a);
    free(map);
    free(map_mpi);
    free(map_nccl);
}

#define DDP "DGC_WARMUP_STEPS=20", "DGC_MOMENTUM=0.9", "DGC_STATS=1"
/* The later variants: 60 steps, warm-up 10 (under 60 s each on the emulated device). */
#define DDP60 "DGC_WARMUP_STEPS=10", "DGC_MOMENTUM=0.9", "DGC_STATS=1"
static const test_case cases[] = {
    {.name = "ddp_shape", .env = {DDP}, .group_rank = -1},
    {.name = "ddp_shape_fp32", .env = {DDP, "DGC_VALUE_BITS=32"}, .group_rank = -1},
    /* A budget on every rank that the large buckets' states pass: they are
     * summed densely, on both paths, the small one compressed. 2 MB, not
     * 1: here one process holds both paths' states under the one budget
     * (the NCCL path's 20000-element state alone is 0.78 MB: it is sized for
     * the warm-up's densest step). */
    {.name = "ddp_shape_over_budget", .env = {DDP, "DGC_MAX_STATE_MB=2"}, .group_rank = -1},
    /* Rank 1 groups each step's calls, rank 0 does not. */
    {.name = "ddp_shape_mixed_groups", .env = {DDP}, .group_rank = 1},
    /* DGC_STATS_FILE, written from both paths' calls (print_stats_file). */
    {.name = "ddp_shape_stats_file", .env = {DDP, "DGC_STATS_EVERY=100"}, .group_rank = -1, .stats_file = 1},
    /* A fresh buffer per bucket per call (a comm hook's new tensor), keyed
     * by order on both paths: the NCCL path still equals the MPI path. */
    {.name = "ddp_shape_fresh", .env = {DDP, "DGC_BUFFER_KEY=order"}, .group_rank = -1, .fresh = 1},
    {.name = "ddp_shape_fresh_groups", .env = {DDP, "DGC_BUFFER_KEY=order"}, .group_rank = 1, .fresh = 1},
    /* The same under the caching allocator's steady state: buckets 0 and 2
     * in one block every step (SHARED). */
    {.name = "ddp_shape_fresh_shared", .env = {DDP60, "DGC_BUFFER_KEY=order"}, .group_rank = -1, .fresh = SHARED,
     .steps = 60},
    /* DDP's rebuild at new addresses: step 0's bucket in A, every later
     * step's buckets in B, allocated after step 0; A stays allocated and is
     * written every step (activations), never all-reduced again. */
    {.name = "ddp_shape_rebuild_moved", .env = {DDP60, "DGC_STATS_EVERY=1"}, .group_rank = -1, .moved = 1,
     .steps = 60},
    /* find_unused_parameters: the local-used map's int32 all-reduce each
     * step, after the buckets; the last bucket zero on rank 1 at 3 steps in 4. */
    {.name = "ddp_shape_unused", .env = {DDP60}, .group_rank = -1, .unused = 1, .steps = 60},
    /* bf16 buckets against the fp32 MPI path rounded to bf16 (compare()). */
    {.name = "ddp_shape_bf16", .env = {DDP60}, .group_rank = -1, .bf16 = 1, .steps = 60},
    /* A comm hook's new tensor per call under the default DGC_BUFFER_KEY.
     * The calls counted from DGC_STATS_FILE, not DGC_STATS: the states of
     * the first steps would make the report dozens of rows. */
    {.name = "ddp_shape_fresh_auto", .env = {"DGC_WARMUP_STEPS=10", "DGC_MOMENTUM=0.9", "DGC_LOG_LEVEL=info"},
     .group_rank = -1, .fresh = 1, .steps = 60, .stats_file = 1},
    /* The NCCL path alone (no MPI_Allreduce), its outputs hashed: run
     * under the full library and under the NCCL-only one, which must agree
     * (same_output.sh); under the full one the NCCL path equals the MPI
     * path (ddp_shape). */
    /* The node layout (issue 47) on 4 ranks, DGC_TOPOLOGY=node on both
     * paths: 2 nodes of 2 (the NCCL path's node transport against the MPI
     * path's), the same with rank 1 grouping its calls, 1 node of 4 (flat
     * on both), and 2 x 2 with bf16 buckets. */
    {.name = "ddp_shape_node", .env = {DDP, "DGC_TOPOLOGY=node", "DGC_NODE_SIZE=2", "DGC_LOG_LEVEL=info"},
     .group_rank = -1},
    {.name = "ddp_shape_node_groups", .env = {DDP60, "DGC_TOPOLOGY=node", "DGC_NODE_SIZE=2"}, .group_rank = 1,
     .steps = 60},
    {.name = "ddp_shape_node_one", .env = {DDP60, "DGC_TOPOLOGY=node", "DGC_NODE_SIZE=4"}, .group_rank = -1,
     .steps = 60},
    /* bf16 buckets in node layout: the shard summed and compressed in fp32,
     * rounded once (against the fp32 MPI path's node layout, compare()). */
    {.name = "ddp_shape_node_bf16", .env = {DDP60, "DGC_TOPOLOGY=node", "DGC_NODE_SIZE=2"}, .group_rank = -1,
     .bf16 = 1, .steps = 60},
    /* A comm hook's new tensor per call, in node layout on both paths:
     * under DGC_BUFFER_KEY=order, and under the default (auto). */
    {.name = "ddp_shape_node_fresh", .env = {DDP60, "DGC_BUFFER_KEY=order", "DGC_TOPOLOGY=node", "DGC_NODE_SIZE=2"},
     .group_rank = -1, .fresh = 1, .steps = 60},
    {.name = "ddp_shape_node_fresh_auto",
     .env = {"DGC_WARMUP_STEPS=10", "DGC_MOMENTUM=0.9", "DGC_LOG_LEVEL=info", "DGC_TOPOLOGY=node", "DGC_NODE_SIZE=2"},
     .group_rank = -1, .fresh = 1, .steps = 60, .stats_file = 1},
    {.name = "ddp_shape_nccl_only", .env = {DDP60}, .group_rank = -1, .nccl_only = 1, .steps = 60},
    /* The same keyed by address, 12 steps (the MPI path's rotating pool
     * repeats an address and count only after 12): every call a new state
     * on both paths, and the NCCL path's warning. */
    {.name = "ddp_shape_fresh_address", .env = {"DGC_WARMUP_STEPS=10", "DGC_MOMENTUM=0.9", "DGC_BUFFER_KEY=address"},
     .group_rank = -1, .fresh = 1, .steps = 12},
};

/* Each rank's DGC_STATS_FILE after MPI_Finalize: how many lines of each
 * event, and the exit line's compressed and pass-through calls, for the
 * case's --grep. */
static void print_stats_file(const char *stem) {
    char path[512];
    snprintf(path, sizeof path, "%s.%d", stem, rank);
    FILE *f = fopen(path, "r");
    if (!f) {
        printf("stats file rank %d: %s missing\n", rank, path);
        return;
    }
    const size_t cap = 1 << 22; /* a line has a row per buffer seen */
    char *line = malloc(cap);
    if (!line) fail("no host memory");
    int every = 0, exits = 0;
    long long calls = -1, passed = -1, by_place = 0;
    while (fgets(line, (int)cap, f)) {
        every += strstr(line, "\"event\":\"every\"") != NULL;
        if (strstr(line, "\"event\":\"exit\"")) {
            exits++;
            const char *c = strstr(line, "\"compressed_calls\":"), *p = strstr(line, "\"passthrough_calls\":");
            if (c) calls = atoll(c + strlen("\"compressed_calls\":"));
            if (p) passed = atoll(p + strlen("\"passthrough_calls\":"));
            /* The calls of states keyed by place (DGC_BUFFER_KEY=order or auto's switch). */
            for (const char *r = strstr(line, "\"buffer\":\"order#"); r; r = strstr(r + 1, "\"buffer\":\"order#")) {
                const char *n = strstr(r, "\"calls\":");
                if (n) by_place += atoll(n + strlen("\"calls\":"));
            }
        }
    }
    fclose(f);
    free(line);
    remove(path);
    printf("stats file rank %d: every %d exit %d compressed_calls %lld passthrough_calls %lld by_place %lld\n", rank,
           every, exits, calls, passed, by_place);
    fflush(stdout);
}

int main(int argc, char **argv) {
    for (size_t i = 0; argc == 2 && i < sizeof cases / sizeof cases[0]; i++)
        if (strcmp(argv[1], cases[i].name) == 0) tc = &cases[i];
    if (!tc) {
        fprintf(stderr, "usage: ddp_shape CASE (one of:");
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) fprintf(stderr, " %s", cases[i].name);
        fprintf(stderr, ")\n");
        return 2;
    }
    case_name = tc->name;
    steps = tc->steps ? tc->steps : STEPS;
    esize = tc->bf16 ? 2 : 4;
    /* Before MPI_Init: the shim reads its settings there (the MPI path) and
     * at the first NCCL call (the NCCL path). */
    for (int i = 0; i < 8 && tc->env[i]; i++) putenv((char *)tc->env[i]);
    /* Both ranks' parent is the same launcher: one stem for the case's ranks. */
    static char stats_env[128];
    snprintf(stats_env, sizeof stats_env, "DGC_STATS_FILE=/tmp/dgc-ddp-shape-%ld", (long)getppid());
    stats_stem = stats_env + strlen("DGC_STATS_FILE=");
    if (tc->stats_file || tc->moved) putenv(stats_env);
    /* One pipe for this program's lines and the shim's (stderr): mpirun
     * forwards a rank's stdout and stderr separately, in chunks, and a
     * chunk of one can end mid-line where the other's begins. */
    if (dup2(STDERR_FILENO, STDOUT_FILENO) < 0) return 1;
    if (MPI_Init(&argc, &argv) != MPI_SUCCESS) return 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    CUDA_OK(cudaSetDevice(0));
    run();
    PMPI_Barrier(MPI_COMM_WORLD);
    printf("PASS gpu.nccl.%s rank %d of %d\n", tc->name, rank, nranks);
    fflush(stdout);
    MPI_Finalize();
    if (tc->stats_file) print_stats_file(stats_stem);
    if (tc->moved) {
        char path[512];
        snprintf(path, sizeof path, "%s.%d", stats_stem, rank);
        remove(path);
    }
    return 0;
}
