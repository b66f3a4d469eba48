/* emulated.stand_ins: the emulated device's two stand-ins checked on their
 * own, without the shim, under mpirun -np 2:
 *
 * - the NCCL over MPI (nccl_over_mpi.c): dense collectives through it equal
 *   MPI's on the same data (fp32, fp64 and int32 sums, max, average,
 *   fp16 and bf16 sums rounded once per addition, all-gather,
 *   reduce-scatter), in place and not, on a stream of the program's; calls
 *   held in a group run at the outermost ncclGroupEnd and not before; a
 *   simulated group runs nothing; a non-blocking communicator answers
 *   ncclInProgress and then ncclSuccess; ncclCommSplit makes children
 *   ordered by key whose collectives are MPI's over MPI_Comm_split's
 *   communicator, none for NCCL_SPLIT_NOCOLOR, non-blocking as the parent
 *   (or as the config says), and fails on the ranks NCCL_OVER_MPI_SPLIT_FAIL
 *   names only; ncclBroadcast from each root equals the root's data, in
 *   place and not; grouped ncclSend/ncclRecv, an all-to-all of uneven
 *   pieces posted in different orders on different ranks, deliver each
 *   piece whole; entry points are pnccl* with nccl* aliases; the count of
 *   communicators neither destroyed nor aborted follows every make and end;
 * - the CUDA runtime adapter (cuda_adapter.cpp): cudaGetDevice as the
 *   first call says 0; cudaStreamIsCapturing says none, then active during a
 *   capture; cudaStreamQuery reads a queued copy as done; cudaMemGetInfo's
 *   free memory falls by an allocation and comes
 *   back when it is freed; an allocation past the memory is
 *   cudaErrorMemoryAllocation.
 * Prints PASS emulated.stand_ins rank R, or FAIL with what differed. */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <math.h>
#include <mpi.h>
#include <nccl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int rank, nranks;

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void fail(const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "FAIL emulated.stand_ins rank %d: %s\n", rank, msg);
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
        if (r_ != ncclSuccess) fail("%s: %d (line %d)", #x, (int)r_, __LINE__);                                      \
    } while (0)

static uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* A float of 24 random bits in [-1, 1) times 2^(s - 8): fp32 sums round. */
static float value(int r, int tag, long i) {
    const uint64_t k = mix(mix((uint64_t)tag * 7919u + (uint64_t)r) + (uint64_t)i);
    return ((float)(k >> 40) / 8388608.0f - 1.0f) * (float)(1 << (k & 15)) / 256.0f;
}

static void *dev(size_t bytes) {
    void *p = NULL;
    CUDA_OK(cudaMalloc(&p, bytes));
    return p;
}

static void get(void *host, const void *d, size_t bytes, cudaStream_t s) {
    CUDA_OK(cudaStreamSynchronize(s));
    CUDA_OK(cudaMemcpy(host, d, bytes, cudaMemcpyDeviceToHost));
}

static ncclComm_t make_comm(int blocking) {
    ncclUniqueId id;
    if (rank == 0) NCCL_OK(ncclGetUniqueId(&id));
    MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    ncclComm_t c = NULL;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = blocking;
    ncclResult_t r = ncclCommInitRankConfig(&c, nranks, id, rank, &cfg);
    if (r != (blocking ? ncclSuccess : ncclInProgress)) fail("ncclCommInitRankConfig(blocking %d): %d", blocking, (int)r);
    ncclResult_t a = ncclInProgress;
    NCCL_OK(ncclCommGetAsyncError(c, &a));
    if (a != ncclSuccess) fail("a new communicator's async error is %d", (int)a);
    return c;
}

/* fp32/fp64/int32 all-reduces and avg against MPI_Allreduce on the same data. */
static void check_native(ncclComm_t comm, cudaStream_t s) {
    const long n = 10007;
    float *f = malloc(n * 4), *want = malloc(n * 4), *got = malloc(n * 4);
    double *d = malloc(n * 8), *dwant = malloc(n * 8), *dgot = malloc(n * 8);
    int32_t *x = malloc(n * 4), *xwant = malloc(n * 4), *xgot = malloc(n * 4);
    if (!f || !want || !got || !d || !dwant || !dgot || !x || !xwant || !xgot) fail("no host memory");
    for (long i = 0; i < n; i++) {
        f[i] = value(rank, 1, i);
        d[i] = (double)value(rank, 2, i) * 1e-3;
        x[i] = (int32_t)(mix((uint64_t)i * 31u + (uint64_t)rank) % 2000001u) - 1000000;
    }
    void *a = dev(n * 8), *b = dev(n * 8);
    struct {
        ncclRedOp_t op;
        MPI_Op mop;
        const char *name;
    } ops[] = {{ncclSum, MPI_SUM, "sum"}, {ncclMax, MPI_MAX, "max"}, {ncclMin, MPI_MIN, "min"}, {ncclProd, MPI_PROD, "prod"}};
    for (int o = 0; o < 4; o++)
        for (int inplace = 0; inplace < 2; inplace++) {
            void *out = inplace ? a : b;
            CUDA_OK(cudaMemcpy(a, f, n * 4, cudaMemcpyHostToDevice));
            NCCL_OK(ncclAllReduce(a, out, n, ncclFloat32, ops[o].op, comm, s));
            get(got, out, n * 4, s);
            PMPI_Allreduce(f, want, (int)n, MPI_FLOAT, ops[o].mop, MPI_COMM_WORLD);
            if (memcmp(got, want, n * 4)) fail("fp32 %s%s differs from MPI_Allreduce's", ops[o].name, inplace ? " in place" : "");
            CUDA_OK(cudaMemcpy(a, d, n * 8, cudaMemcpyHostToDevice));
            NCCL_OK(ncclAllReduce(a, out, n, ncclFloat64, ops[o].op, comm, s));
            get(dgot, out, n * 8, s);
            PMPI_Allreduce(d, dwant, (int)n, MPI_DOUBLE, ops[o].mop, MPI_COMM_WORLD);
            if (memcmp(dgot, dwant, n * 8)) fail("fp64 %s differs from MPI_Allreduce's", ops[o].name);
            if (ops[o].op == ncclProd) continue; /* int32 products overflow */
            CUDA_OK(cudaMemcpy(a, x, n * 4, cudaMemcpyHostToDevice));
            NCCL_OK(ncclAllReduce(a, out, n, ncclInt32, ops[o].op, comm, s));
            get(xgot, out, n * 4, s);
            PMPI_Allreduce(x, xwant, (int)n, MPI_INT32_T, ops[o].mop, MPI_COMM_WORLD);
            if (memcmp(xgot, xwant, n * 4)) fail("int32 %s differs from MPI_Allreduce's", ops[o].name);
        }
    CUDA_OK(cudaMemcpy(a, f, n * 4, cudaMemcpyHostToDevice));
    NCCL_OK(ncclAllReduce(a, a, n, ncclFloat32, ncclAvg, comm, s));
    get(got, a, n * 4, s);
    PMPI_Allreduce(f, want, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    for (long i = 0; i < n; i++)
        if (!(got[i] == want[i] / (float)nranks)) fail("fp32 avg element %ld: %.9g, want %.9g", i, got[i], want[i] / nranks);
    CUDA_OK(cudaFree(a));
    CUDA_OK(cudaFree(b));
    free(f), free(want), free(got), free(d), free(dwant), free(dgot), free(x), free(xwant), free(xgot);
}

/* The host's binary16 and bf16, round to nearest even (as nccl_check's). */
static float half_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0) {
        const float f = ldexpf((float)man, -24);
        return sign ? -f : f;
    }
    const uint32_t bits = exp == 31 ? sign | 0x7f800000u | (man << 13) : sign | ((exp + 112u) << 23) | (man << 13);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static uint16_t float_to_half(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) {
        float a;
        memcpy(&a, &ax, 4);
        return (uint16_t)(sign | (uint32_t)nearbyintf(a * 16777216.0f));
    }
    uint32_t h = (((ax >> 23) - 112u) << 10) | ((ax >> 13) & 0x3ffu);
    const uint32_t rest = ax & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

static float bf16_to_float(uint16_t b) {
    const uint32_t x = (uint32_t)b << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static uint16_t float_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* fp16 and bf16 sums: with two ranks, one rounding of the exact sum. The
 * inputs are multiples of 1/64 exact in the type whose sums need one bit
 * more, so ties and rounding show. */
static void check_half(ncclComm_t comm, cudaStream_t s) {
    if (nranks != 2) fail("two ranks");
    const long n = 4001;
    uint16_t *h = malloc(n * 2), *got = malloc(n * 2), *all = malloc(2 * n * 2);
    if (!h || !got || !all) fail("no host memory");
    uint16_t *a = dev(n * 2);
    for (int bf = 0; bf < 2; bf++) {
        const long span = bf ? 255 : 2047; /* 8 significant bits, 11 */
        for (long i = 0; i < n; i++) {
            const long q = (long)(mix((uint64_t)i * 131u + (uint64_t)rank + 77u * (uint64_t)bf) % (uint64_t)(2 * span + 1)) - span;
            h[i] = bf ? float_to_bf16((float)q / 64.0f) : float_to_half((float)q / 64.0f);
        }
        CUDA_OK(cudaMemcpy(a, h, n * 2, cudaMemcpyHostToDevice));
        NCCL_OK(ncclAllReduce(a, a, n, bf ? ncclBfloat16 : ncclFloat16, ncclSum, comm, s));
        get(got, a, n * 2, s);
        PMPI_Allgather(h, (int)n, MPI_UINT16_T, all, (int)n, MPI_UINT16_T, MPI_COMM_WORLD);
        for (long i = 0; i < n; i++) {
            const float x0 = bf ? bf16_to_float(all[i]) : half_to_float(all[i]);
            const float x1 = bf ? bf16_to_float(all[n + i]) : half_to_float(all[n + i]);
            const uint16_t want = bf ? float_to_bf16(x0 + x1) : float_to_half(x0 + x1); /* x0 + x1 exact in fp32 */
            if (got[i] != want)
                fail("%s sum element %ld: %.9g + %.9g gave 0x%04x, want 0x%04x", bf ? "bf16" : "fp16", i, x0, x1, got[i],
                     want);
        }
    }
    CUDA_OK(cudaFree(a));
    free(h);
    free(got);
    free(all);
}

/* A check's arrays for count floats: this rank's values for tag (f), room
 * for MPI's and the stand-in's results, and two device arrays. */
typedef struct {
    float *f, *want, *got, *a, *b;
} arrays;

static arrays arrays_for(long count, int tag) {
    arrays x = {malloc(count * 4), malloc(count * 4), malloc(count * 4), NULL, NULL};
    if (!x.f || !x.want || !x.got) fail("no host memory");
    for (long i = 0; i < count; i++) x.f[i] = value(rank, tag, i);
    x.a = dev(count * 4);
    x.b = dev(count * 4);
    return x;
}

static void arrays_free(arrays *x) {
    CUDA_OK(cudaFree(x->a));
    CUDA_OK(cudaFree(x->b));
    free(x->f), free(x->want), free(x->got);
}

/* ncclReduceScatter of x's ranks x n values on nc against
 * MPI_Reduce_scatter_block's over mc, which has the same ranks. */
static void check_reduce_scatter(arrays *x, long n, int ranks, ncclComm_t nc, MPI_Comm mc, cudaStream_t s,
                                 const char *what) {
    CUDA_OK(cudaMemcpy(x->a, x->f, n * ranks * 4, cudaMemcpyHostToDevice));
    NCCL_OK(ncclReduceScatter(x->a, x->b, n, ncclFloat32, ncclSum, nc, s));
    get(x->got, x->b, n * 4, s);
    PMPI_Reduce_scatter_block(x->f, x->want, (int)n, MPI_FLOAT, MPI_SUM, mc);
    if (memcmp(x->got, x->want, n * 4)) fail("%s's reduce-scatter differs from MPI_Reduce_scatter_block's", what);
}

/* All-gather and reduce-scatter against MPI's. */
static void check_gather_scatter(ncclComm_t comm, cudaStream_t s) {
    const long n = 3001;
    arrays x = arrays_for(n * nranks, 3);
    float *f = x.f, *want = x.want, *got = x.got, *a = x.a, *b = x.b;
    CUDA_OK(cudaMemcpy(a, f, n * 4, cudaMemcpyHostToDevice));
    NCCL_OK(ncclAllGather(a, b, n, ncclFloat32, comm, s));
    get(got, b, n * nranks * 4, s);
    PMPI_Allgather(f, (int)n, MPI_FLOAT, want, (int)n, MPI_FLOAT, MPI_COMM_WORLD);
    if (memcmp(got, want, n * nranks * 4)) fail("all-gather differs from MPI_Allgather's");
    check_reduce_scatter(&x, n, nranks, comm, MPI_COMM_WORLD, s, "the communicator");
    arrays_free(&x);
}

/* Held calls run at the outermost ncclGroupEnd, not before; a simulated
 * group runs none. */
static void check_groups(ncclComm_t comm, cudaStream_t s) {
    const long n = 1000;
    float one[1000], got[1000];
    for (long i = 0; i < n; i++) one[i] = 1.0f;
    float *a = dev(n * 4);
    CUDA_OK(cudaMemcpy(a, one, n * 4, cudaMemcpyHostToDevice));
    NCCL_OK(ncclGroupStart());
    NCCL_OK(ncclGroupStart());
    NCCL_OK(ncclAllReduce(a, a, n, ncclFloat32, ncclSum, comm, s));
    NCCL_OK(ncclGroupEnd());
    get(got, a, n * 4, s);
    if (got[0] != 1.0f) fail("a call in a nested group ran before the outermost ncclGroupEnd");
    NCCL_OK(ncclAllReduce(a, a, n, ncclFloat32, ncclSum, comm, s));
    NCCL_OK(ncclGroupEnd());
    get(got, a, n * 4, s);
    const float want = (float)nranks * (float)nranks;
    if (got[0] != want || got[n - 1] != want) fail("two held calls in order: %g, want %g", got[0], want);
    ncclSimInfo_t info = NCCL_SIM_INFO_INITIALIZER;
    NCCL_OK(ncclGroupStart());
    NCCL_OK(ncclAllReduce(a, a, n, ncclFloat32, ncclSum, comm, s));
    NCCL_OK(ncclGroupSimulateEnd(&info));
    get(got, a, n * 4, s);
    if (got[0] != want) fail("a simulated group ran its call");
    CUDA_OK(cudaFree(a));
}

/* A non-blocking communicator: ncclInProgress, then ncclSuccess. */
static void check_nonblocking(cudaStream_t s) {
    ncclComm_t c = make_comm(0);
    float *a = dev(4000);
    ncclResult_t r = ncclAllReduce(a, a, 1000, ncclFloat32, ncclSum, c, s);
    if (r != ncclInProgress) fail("a non-blocking communicator's call returned %d, want ncclInProgress", (int)r);
    NCCL_OK(ncclCommGetAsyncError(c, &r));
    if (r != ncclSuccess) fail("its async error is %d", (int)r);
    r = ncclCommFinalize(c);
    if (r != ncclInProgress) fail("ncclCommFinalize returned %d", (int)r);
    NCCL_OK(ncclCommDestroy(c));
    CUDA_OK(cudaFree(a));
}

/* ncclCommSplit: children by color, ordered by key; their all-reduce and
 * reduce-scatter equal MPI's over MPI_Comm_split's communicator; a rank
 * with NCCL_SPLIT_NOCOLOR gets none; a non-blocking parent's child (config
 * NULL) answers ncclInProgress, one made with blocking 1 does not. */
static void check_split(ncclComm_t comm, cudaStream_t s) {
    const long n = 2003;
    arrays x = arrays_for(n * nranks, 4);
    float *f = x.f, *want = x.want, *got = x.got, *a = x.a, *b = x.b;
    /* Nodes of two ranks, reversed within each by key. */
    const int color = rank / 2, key = -rank;
    ncclComm_t child = NULL;
    NCCL_OK(ncclCommSplit(comm, color, key, &child, NULL));
    MPI_Comm mchild;
    PMPI_Comm_split(MPI_COMM_WORLD, color, key, &mchild);
    int crank = -1, ccount = -1, mrank, msize;
    ncclResult_t r0;
    MPI_Comm_rank(mchild, &mrank);
    MPI_Comm_size(mchild, &msize);
    if (!child) fail("no child for color %d", color);
    NCCL_OK(ncclCommUserRank(child, &crank));
    NCCL_OK(ncclCommCount(child, &ccount));
    if (crank != mrank || ccount != msize) fail("child rank %d of %d, MPI_Comm_split's %d of %d", crank, ccount, mrank, msize);
    CUDA_OK(cudaMemcpy(a, f, n * 4, cudaMemcpyHostToDevice));
    NCCL_OK(ncclAllReduce(a, b, n, ncclFloat32, ncclSum, child, s));
    get(got, b, n * 4, s);
    PMPI_Allreduce(f, want, (int)n, MPI_FLOAT, MPI_SUM, mchild);
    if (memcmp(got, want, n * 4)) fail("the child's all-reduce differs from MPI's over the split communicator");
    check_reduce_scatter(&x, n, msize, child, mchild, s, "the child");
    MPI_Comm_free(&mchild);
    NCCL_OK(ncclCommDestroy(child));
    /* The last rank takes no part. */
    child = (ncclComm_t)1;
    NCCL_OK(ncclCommSplit(comm, rank == nranks - 1 ? NCCL_SPLIT_NOCOLOR : 0, rank, &child, NULL));
    if ((child == NULL) != (rank == nranks - 1)) fail("NCCL_SPLIT_NOCOLOR: child %p on rank %d", (void *)child, rank);
    if (child) {
        NCCL_OK(ncclCommCount(child, &ccount));
        if (ccount != nranks - 1) fail("a child without the last rank has %d ranks", ccount);
        NCCL_OK(ncclCommDestroy(child));
    }
    /* NCCL_OVER_MPI_SPLIT_FAIL=0: rank 0's split fails, the others' complete. */
    setenv("NCCL_OVER_MPI_SPLIT_FAIL", "0", 1);
    child = (ncclComm_t)1;
    r0 = ncclCommSplit(comm, 0, rank, &child, NULL);
    unsetenv("NCCL_OVER_MPI_SPLIT_FAIL");
    if (rank == 0 ? r0 != ncclSystemError || child : r0 != ncclSuccess || !child)
        fail("NCCL_OVER_MPI_SPLIT_FAIL=0: rank %d's split returned %d, child %p", rank, (int)r0, (void *)child);
    if (child) NCCL_OK(ncclCommDestroy(child));
    /* A non-blocking parent: its child is non-blocking, unless told. */
    ncclComm_t nb = make_comm(0);
    ncclResult_t r = ncclCommSplit(nb, 0, rank, &child, NULL);
    if (r != ncclInProgress || !child) fail("splitting a non-blocking parent returned %d, want ncclInProgress", (int)r);
    NCCL_OK(ncclCommGetAsyncError(child, &r));
    if (r != ncclSuccess) fail("the non-blocking child's async error is %d", (int)r);
    r = ncclAllReduce(a, b, n, ncclFloat32, ncclSum, child, s);
    if (r != ncclInProgress) fail("the non-blocking child's call returned %d", (int)r);
    NCCL_OK(ncclCommDestroy(child));
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 1;
    NCCL_OK(ncclCommSplit(nb, 0, rank, &child, &cfg));
    NCCL_OK(ncclAllReduce(a, b, n, ncclFloat32, ncclSum, child, s));
    NCCL_OK(ncclCommDestroy(child));
    NCCL_OK(ncclCommDestroy(nb));
    arrays_free(&x);
}

/* ncclBroadcast from every root; an all-to-all of uneven pieces by grouped
 * ncclSend/ncclRecv, as the shim's node sum does it (rank r sends peer p
 * piece p of its data, p + 1 + r floats), the receives posted before the
 * sends on odd ranks. */
static void check_bcast_p2p(ncclComm_t comm, cudaStream_t s) {
    const long n = 5003, piece = 64 + 8 * (long)nranks;
    float *f = malloc(n * 4), *got = malloc(n * 4), *all = malloc((size_t)piece * (size_t)nranks * 4);
    if (!f || !got || !all) fail("no host memory");
    float *a = dev(n * 4), *b = dev(n * 4), *in = dev((size_t)piece * (size_t)nranks * 4),
          *out = dev((size_t)piece * (size_t)nranks * 4);
    for (int root = 0; root < nranks; root++)
        for (int inplace = 0; inplace < 2; inplace++) {
            for (long i = 0; i < n; i++) f[i] = value(rank, 40 + root, i);
            CUDA_OK(cudaMemcpy(a, f, n * 4, cudaMemcpyHostToDevice));
            CUDA_OK(cudaMemset(b, 0, n * 4));
            NCCL_OK(ncclBroadcast(a, inplace ? a : b, n, ncclFloat32, root, comm, s));
            get(got, inplace ? a : b, n * 4, s);
            for (long i = 0; i < n; i++)
                if (got[i] != value(root, 40 + root, i)) fail("broadcast from %d: element %ld differs", root, i);
        }
    for (long i = 0; i < piece * nranks; i++) all[i] = value(rank, 50, i);
    CUDA_OK(cudaMemcpy(in, all, (size_t)piece * (size_t)nranks * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(out, 0, (size_t)piece * (size_t)nranks * 4));
    NCCL_OK(ncclGroupStart());
    for (int j = 0; j < 2 * nranks; j++) {
        const int p = j % nranks, recv_first = rank % 2;
        const long len = p + 1 + rank, from_len = rank + 1 + p; /* what p sends this rank: rank + 1 + p */
        if ((j < nranks) == recv_first) NCCL_OK(ncclRecv(out + (size_t)p * piece, from_len, ncclFloat32, p, comm, s));
        else NCCL_OK(ncclSend(in + (size_t)p * piece, len, ncclFloat32, p, comm, s));
    }
    NCCL_OK(ncclGroupEnd());
    get(all, out, (size_t)piece * (size_t)nranks * 4, s);
    for (int p = 0; p < nranks; p++)
        for (long i = 0; i < piece; i++) {
            const float want = i < rank + 1 + p ? value(p, 50, (long)rank * piece + i) : 0.0f;
            if (all[(size_t)p * piece + i] != want) fail("the piece from rank %d: element %ld differs", p, i);
        }
    CUDA_OK(cudaFree(a));
    CUDA_OK(cudaFree(b));
    CUDA_OK(cudaFree(in));
    CUDA_OK(cudaFree(out));
    free(f);
    free(got);
    free(all);
}

/* The adapter's answers where chipStar's differ from CUDA's. */
static void check_adapter(void) {
    int d = 7;
    CUDA_OK(cudaGetDevice(&d));
    if (d != 0) fail("cudaGetDevice as the first call gave %d, CUDA's answer is 0", d);
    cudaStream_t s;
    CUDA_OK(cudaStreamCreate(&s));
    enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusActive;
    CUDA_OK(cudaStreamIsCapturing(s, &st));
    if (st != cudaStreamCaptureStatusNone) fail("a fresh stream is capturing (%d)", (int)st);
    st = cudaStreamCaptureStatusActive;
    CUDA_OK(cudaStreamIsCapturing((cudaStream_t)0, &st));
    if (st != cudaStreamCaptureStatusNone) fail("the null stream is capturing (%d)", (int)st);
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CUDA_OK(cudaStreamIsCapturing(s, &st));
    if (st != cudaStreamCaptureStatusActive) fail("a stream under capture says %d, want active", (int)st);
    cudaGraph_t g;
    CUDA_OK(cudaStreamEndCapture(s, &g));
    CUDA_OK(cudaGraphDestroy(g));
    CUDA_OK(cudaStreamIsCapturing(s, &st));
    if (st != cudaStreamCaptureStatusNone) fail("a stream after its capture says %d", (int)st);
    static char host[4096];
    void *q = dev(sizeof host);
    CUDA_OK(cudaMemcpyAsync(host, q, sizeof host, cudaMemcpyDeviceToHost, s));
    cudaError_t qe = cudaErrorNotReady;
    for (int i = 0; i < 3000 && qe == cudaErrorNotReady; i++) {
        struct timespec ts = {0, 1000000};
        if ((qe = cudaStreamQuery(s)) == cudaErrorNotReady) nanosleep(&ts, NULL);
    }
    if (qe != cudaSuccess) fail("cudaStreamQuery after a queued copy, polled 3 s: %d, want cudaSuccess", (int)qe);
    CUDA_OK(cudaFree(q));
    size_t f0, f1, f2, t;
    const size_t big = 64u << 20;
    CUDA_OK(cudaMemGetInfo(&f0, &t));
    void *p = dev(big);
    CUDA_OK(cudaMemGetInfo(&f1, &t));
    CUDA_OK(cudaFree(p));
    CUDA_OK(cudaMemGetInfo(&f2, &t));
    if (t == 0 || f0 > t || f0 - f1 < big || f2 < f1 + big)
        fail("cudaMemGetInfo: free %zu of %zu, %zu after a %zu-byte allocation, %zu after freeing it", f0, t, f1, big, f2);
    void *huge = NULL;
    cudaError_t e = cudaMalloc(&huge, t + (1ull << 40));
    if (e != cudaErrorMemoryAllocation) fail("cudaMalloc past the device's memory gave %d, want cudaErrorMemoryAllocation", (int)e);
    (void)cudaGetLastError();
    CUDA_OK(cudaStreamDestroy(s));
}

int main(int argc, char **argv) {
    if (PMPI_Init(&argc, &argv) != MPI_SUCCESS) return 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    check_adapter();
    if (!dlsym(RTLD_DEFAULT, "pncclAllReduce") || !dlsym(RTLD_DEFAULT, "ncclAllReduce"))
        fail("the stand-in must export pncclAllReduce and its alias ncclAllReduce");
    ncclComm_t comm = make_comm(1);
    int count = 0, me = -1;
    NCCL_OK(ncclCommCount(comm, &count));
    NCCL_OK(ncclCommUserRank(comm, &me));
    if (count != nranks || me != rank) fail("ncclCommCount %d, ncclCommUserRank %d", count, me);
    cudaStream_t s;
    CUDA_OK(cudaStreamCreate(&s));
    check_native(comm, s);
    check_half(comm, s);
    check_gather_scatter(comm, s);
    check_groups(comm, s);
    check_nonblocking(s);
    check_split(comm, s);
    check_bcast_p2p(comm, s);
    /* Every communicator made here is ended now but comm: the count that
     * NCCL_OVER_MPI_REPORT_LIVE prints at exit follows makes, splits,
     * destroys and aborts. */
    int (*live)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "nccl_over_mpi_live");
    if (!live) fail("the stand-in must export nccl_over_mpi_live");
    if (live() != 1) fail("%d communicators live before the last destroy, want 1 (comm)", live());
    ncclComm_t extra = make_comm(1), child = NULL;
    NCCL_OK(ncclCommSplit(extra, 0, rank, &child, NULL));
    if (live() != 3) fail("%d communicators live after a make and a split, want 3", live());
    NCCL_OK(ncclCommAbort(child));
    NCCL_OK(ncclCommAbort(child)); /* a second abort ends nothing more */
    NCCL_OK(ncclCommDestroy(extra));
    NCCL_OK(ncclCommDestroy(comm));
    if (live() != 0) fail("%d communicators live after every one was ended", live());
    MPI_Barrier(MPI_COMM_WORLD);
    printf("PASS emulated.stand_ins rank %d of %d\n", rank, nranks);
    PMPI_Finalize();
    return 0;
}
