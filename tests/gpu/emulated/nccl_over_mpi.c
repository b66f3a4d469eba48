/* A stand-in for NCCL over MPI, for the emulated device only: a libnccl.so.2
 * that carries NCCL's collectives through MPI between processes whose
 * "device" is the CPU (chipStar). NCCL cannot run without a GPU and no CPU
 * build of it exists; this library is test-only, never installed, and what
 * passes through it passes on the emulated device, not on NCCL.
 *
 * Kept small and plainly right rather than fast:
 * - each collective runs when its stream is done: it waits for the caller's
 *   stream, stages the device buffers through host memory, runs the MPI
 *   collective on the communicator's own MPI communicator, and copies the
 *   result back, all before it returns (NCCL returns at once and runs the
 *   collective in stream order; the results are the same);
 * - inside ncclGroupStart/End the calls are held and run at the outermost
 *   ncclGroupEnd, in the order they were made (ncclGroupSimulateEnd drops
 *   them);
 * - sums of fp16 and bf16 are taken in fp32 and rounded to the type after
 *   each addition (round to nearest even), the others are MPI's own; ncclAvg
 *   is the sum divided by the rank count;
 * - every MPI call is a PMPI_ one, so that a preloaded shim's MPI front end
 *   never sees this library's traffic, and they are serialised by one lock;
 *   a wait polls, so that ncclCommAbort from another thread ends it (200 ms
 *   later, so that the aborting thread has returned first, as on a GPU);
 * - ncclCommInitRank finds its peers through the rank that made the
 *   ncclUniqueId (it must be a member): each member sends its world rank
 *   there, the maker answers with the list, and all build the MPI
 *   communicator with MPI_Comm_create_group;
 * - a non-blocking communicator (config.blocking = 0) answers ncclInProgress
 *   from its calls, having done the work: ncclCommGetAsyncError then says
 *   ncclSuccess (NCCL allows either; the caller's polling runs);
 * - ncclBroadcast is MPI's; ncclSend and ncclRecv are MPI_Isend and
 *   MPI_Irecv of bytes, a group's consecutive ones all posted before any is
 *   waited for (so its pairs match in any order, as NCCL's do);
 * - ncclCommSplit is MPI_Comm_split of the parent's MPI communicator (color
 *   NCCL_SPLIT_NOCOLOR: no child, *newcomm NULL; children ordered by key,
 *   then parent rank, as NCCL orders them); the child is blocking as the
 *   parent is unless its config says otherwise. For the shim's tests,
 *   NCCL_OVER_MPI_SPLIT_FAIL (parent ranks, comma-separated, or "all")
 *   makes those ranks' splits fail with ncclSystemError after the collective
 *   part, so that the other ranks' splits still complete, as when one
 *   rank's NCCL fails to set its child up;
 * - NCCL_OVER_MPI_REPORT_LIVE=1 prints, at exit, how many communicators
 *   (made, or split off by anyone, the shim included) were neither
 *   destroyed nor aborted: the shim's tests see that its internal
 *   children end with their parent.
 * Entry points are pnccl* with nccl* as weak aliases, as NCCL exports them,
 * so that the shim finds this object as it finds the real one. */
#include <mpi.h>
#include <nccl.h>
#include <cuda_runtime_api.h>

#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
#define ALIAS(name) __attribute__((weak, alias("p" #name))) EXPORT

struct ncclComm {
    MPI_Comm mpi;
    int rank, nranks, device, blocking;
    volatile int aborted;
    int ended; /* destroyed or aborted: no longer live */
    ncclResult_t async; /* what ncclCommGetAsyncError answers */
};

/* ---- the lock over MPI, and waits that an abort ends ---- */

static pthread_mutex_t mpi_lock = PTHREAD_MUTEX_INITIALIZER;

/* Communicators made and not yet destroyed or aborted
 * (NCCL_OVER_MPI_REPORT_LIVE), and the world rank that reports them. */
static int live, world_rank = -1;

static void made_one(void) {
    __atomic_add_fetch(&live, 1, __ATOMIC_RELAXED);
    if (world_rank < 0) {
        pthread_mutex_lock(&mpi_lock);
        PMPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
        pthread_mutex_unlock(&mpi_lock);
    }
}

static void ended_one(ncclComm_t comm) {
    if (!__atomic_exchange_n(&comm->ended, 1, __ATOMIC_ACQ_REL)) __atomic_sub_fetch(&live, 1, __ATOMIC_RELAXED);
}

/* The count itself, for the stand-in's own check (stand_in_check.c). */
EXPORT int nccl_over_mpi_live(void) { return __atomic_load_n(&live, __ATOMIC_RELAXED); }

__attribute__((destructor)) static void report_live(void) {
    const char *v = getenv("NCCL_OVER_MPI_REPORT_LIVE");
    if (!v || strcmp(v, "1") || world_rank < 0) return;
    fprintf(stderr, "nccl_over_mpi: rank %d: %d communicator(s) neither destroyed nor aborted at exit\n", world_rank,
            __atomic_load_n(&live, __ATOMIC_RELAXED));
}

static ncclResult_t wait_request(ncclComm_t comm, MPI_Request *req) {
    for (;;) {
        int done = 0;
        pthread_mutex_lock(&mpi_lock);
        const int rc = PMPI_Test(req, &done, MPI_STATUS_IGNORE);
        pthread_mutex_unlock(&mpi_lock);
        if (rc != MPI_SUCCESS) return ncclSystemError;
        if (done) return ncclSuccess;
        if (comm && comm->aborted) { /* the request is left behind with the communicator */
            /* NCCL's kernels see the abort flag at their next poll, and the
             * waiting thread its stream later still: the aborting thread
             * is done first, as it is on a GPU. */
            struct timespec ts = {0, 200000000};
            nanosleep(&ts, NULL);
            return ncclRemoteError;
        }
        sched_yield();
    }
}

static void last_error(const char *fmt, const char *what);

/* ---- types and reductions ---- */

static size_t type_size(ncclDataType_t t) {
    switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
    }
}

static MPI_Datatype mpi_type(ncclDataType_t t) {
    switch (t) {
    case ncclInt8: return MPI_INT8_T;
    case ncclUint8: return MPI_UINT8_T;
    case ncclInt32: return MPI_INT32_T;
    case ncclUint32: return MPI_UINT32_T;
    case ncclInt64: return MPI_INT64_T;
    case ncclUint64: return MPI_UINT64_T;
    case ncclFloat32: return MPI_FLOAT;
    case ncclFloat64: return MPI_DOUBLE;
    case ncclFloat16: case ncclBfloat16: return MPI_UINT16_T; /* reduced by the ops below */
    default: return MPI_DATATYPE_NULL;
    }
}

static float half_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0) {
        float f = (float)man * (1.0f / 16777216.0f); /* man x 2^-24, exact */
        return sign ? -f : f;
    }
    bits = exp == 31 ? sign | 0x7f800000u | (man << 13) : sign | ((exp + 112u) << 23) | (man << 13);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static uint16_t float_to_half(float f) { /* round to nearest even */
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) { /* subnormal in fp16: units of 2^-24, rounded to even */
        const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
        const int shift = 126 - (int)(ax >> 23); /* 14 .. */
        if (shift > 24) return (uint16_t)sign;
        uint32_t q = m >> shift;
        const uint32_t rest = m & ((1u << shift) - 1u), halfway = 1u << (shift - 1);
        if (rest > halfway || (rest == halfway && (q & 1u))) q++;
        return (uint16_t)(sign | q);
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
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

typedef float (*widen_fn)(uint16_t);
typedef uint16_t (*narrow_fn)(float);

static float combine(float a, float b, ncclRedOp_t op) {
    switch (op) {
    case ncclProd: return a * b;
    case ncclMax: return a > b || a != a ? a : b;
    case ncclMin: return a < b || a != a ? a : b;
    default: return a + b; /* ncclSum, ncclAvg (divided afterwards) */
    }
}

static void reduce16(const uint16_t *in, uint16_t *inout, int len, ncclRedOp_t op, widen_fn w, narrow_fn nr) {
    for (int i = 0; i < len; i++) inout[i] = nr(combine(w(in[i]), w(inout[i]), op));
}

#define HALF_OP(kind, opname, w, nr)                                                                                 \
    static void kind##_##opname(void *in, void *inout, int *len, MPI_Datatype *dt) {                                 \
        (void)dt;                                                                                                    \
        reduce16(in, inout, *len, opname, w, nr);                                                                    \
    }
HALF_OP(half, ncclSum, half_to_float, float_to_half)
HALF_OP(half, ncclProd, half_to_float, float_to_half)
HALF_OP(half, ncclMax, half_to_float, float_to_half)
HALF_OP(half, ncclMin, half_to_float, float_to_half)
HALF_OP(bf16, ncclSum, bf16_to_float, float_to_bf16)
HALF_OP(bf16, ncclProd, bf16_to_float, float_to_bf16)
HALF_OP(bf16, ncclMax, bf16_to_float, float_to_bf16)
HALF_OP(bf16, ncclMin, bf16_to_float, float_to_bf16)

static MPI_Op half_ops[2][4]; /* [bf16][sum prod max min]; mpi_op runs under mpi_lock */
static int half_ops_made;

static MPI_Op mpi_op(ncclRedOp_t op, ncclDataType_t t) {
    const int o = op == ncclAvg ? 0 : (int)op;
    if (o < 0 || o > 3) return MPI_OP_NULL;
    if (t == ncclFloat16 || t == ncclBfloat16) {
        if (!half_ops_made) {
            MPI_User_function *fns[2][4] = {{half_ncclSum, half_ncclProd, half_ncclMax, half_ncclMin},
                                            {bf16_ncclSum, bf16_ncclProd, bf16_ncclMax, bf16_ncclMin}};
            for (int b = 0; b < 2; b++)
                for (int k = 0; k < 4; k++) PMPI_Op_create(fns[b][k], 1, &half_ops[b][k]);
            half_ops_made = 1;
        }
        return half_ops[t == ncclBfloat16][o];
    }
    static const MPI_Op native[4] = {MPI_SUM, MPI_PROD, MPI_MAX, MPI_MIN};
    return native[o];
}

/* ncclAvg: the sum divided by the rank count, element by element. */
static void divide(void *buf, size_t count, ncclDataType_t t, int n) {
    for (size_t i = 0; i < count; i++) switch (t) {
        case ncclFloat32: ((float *)buf)[i] /= (float)n; break;
        case ncclFloat64: ((double *)buf)[i] /= (double)n; break;
        case ncclFloat16: ((uint16_t *)buf)[i] = float_to_half(half_to_float(((uint16_t *)buf)[i]) / (float)n); break;
        case ncclBfloat16: ((uint16_t *)buf)[i] = float_to_bf16(bf16_to_float(((uint16_t *)buf)[i]) / (float)n); break;
        case ncclInt8: ((int8_t *)buf)[i] /= (int8_t)n; break;
        case ncclUint8: ((uint8_t *)buf)[i] /= (uint8_t)n; break;
        case ncclInt32: ((int32_t *)buf)[i] /= n; break;
        case ncclUint32: ((uint32_t *)buf)[i] /= (uint32_t)n; break;
        case ncclInt64: ((int64_t *)buf)[i] /= n; break;
        case ncclUint64: ((uint64_t *)buf)[i] /= (uint64_t)n; break;
        default: break;
        }
}

/* ---- errors ---- */

static __thread char last_error_text[256];

static void last_error(const char *fmt, const char *what) {
    snprintf(last_error_text, sizeof last_error_text, fmt, what);
    fprintf(stderr, "nccl_over_mpi: %s\n", last_error_text);
}

/* ---- one collective, run now ---- */

typedef enum { OP_ALL_REDUCE, OP_ALL_GATHER, OP_REDUCE_SCATTER, OP_BROADCAST, OP_SEND, OP_RECV } op_kind;

typedef struct {
    op_kind kind;
    const void *send;
    void *recv;
    size_t count; /* per rank for all-gather and reduce-scatter */
    ncclDataType_t type;
    ncclRedOp_t op;
    ncclComm_t comm;
    cudaStream_t stream;
    int peer; /* the root of a broadcast, the peer of a send or receive */
} call;

static int is_p2p(const call *c) { return c->kind == OP_SEND || c->kind == OP_RECV; }

static ncclResult_t cuda_ok(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return ncclSuccess;
    last_error("CUDA call failed: %s", what);
    return ncclUnhandledCudaError;
}

static ncclResult_t run(const call *c) {
    ncclComm_t comm = c->comm;
    if (comm->aborted) return ncclInvalidUsage;
    const size_t es = type_size(c->type), n = (size_t)comm->nranks;
    const size_t in_elems = c->kind == OP_REDUCE_SCATTER ? c->count * n
                            : c->kind == OP_BROADCAST && comm->rank != c->peer ? 0
                                                                                : c->count;
    const size_t out_elems = c->kind == OP_ALL_GATHER ? c->count * n : c->count;
    const size_t all = (in_elems > out_elems ? in_elems : out_elems) * es;
    char *in = malloc(in_elems * es + 1), *out = malloc(all + 1);
    ncclResult_t rc = in && out ? ncclSuccess : ncclSystemError;
    if (rc == ncclSuccess) rc = cuda_ok(cudaStreamSynchronize(c->stream), "cudaStreamSynchronize");
    if (rc == ncclSuccess && in_elems)
        rc = cuda_ok(cudaMemcpy(in, c->send, in_elems * es, cudaMemcpyDeviceToHost), "cudaMemcpy to the host");
    MPI_Request req = MPI_REQUEST_NULL;
    if (rc == ncclSuccess) {
        const MPI_Datatype dt = mpi_type(c->type);
        pthread_mutex_lock(&mpi_lock);
        const MPI_Op op = mpi_op(c->op, c->type);
        int mrc = MPI_SUCCESS;
        switch (c->kind) {
        case OP_ALL_REDUCE:
            mrc = PMPI_Iallreduce(in, out, (int)c->count, dt, op, comm->mpi, &req);
            break;
        case OP_ALL_GATHER:
            mrc = PMPI_Iallgather(in, (int)c->count, dt, out, (int)c->count, dt, comm->mpi, &req);
            break;
        case OP_REDUCE_SCATTER:
            mrc = PMPI_Ireduce_scatter_block(in, out, (int)c->count, dt, op, comm->mpi, &req);
            break;
        case OP_BROADCAST: /* the root's input travels in out */
            if (comm->rank == c->peer) memcpy(out, in, c->count * es);
            mrc = PMPI_Ibcast(out, (int)c->count, dt, c->peer, comm->mpi, &req);
            break;
        default: mrc = MPI_ERR_OTHER; break; /* sends and receives run in batches (run_p2p) */
        }
        pthread_mutex_unlock(&mpi_lock);
        rc = mrc == MPI_SUCCESS ? wait_request(comm, &req) : ncclSystemError;
    }
    if (rc == ncclSuccess && c->op == ncclAvg && c->kind != OP_ALL_GATHER) divide(out, out_elems, c->type, (int)n);
    if (rc == ncclSuccess && out_elems)
        rc = cuda_ok(cudaMemcpy(c->recv, out, out_elems * es, cudaMemcpyHostToDevice), "cudaMemcpy to the device");
    free(in);
    free(out);
    if (rc != ncclSuccess && comm->async == ncclSuccess) comm->async = rc;
    return rc;
}

/* n sends and receives (consecutive in a group, or one alone): all posted,
 * then all waited for, so that a group's pairs match in any order, as
 * NCCL's do; between two ranks they match in the order made (MPI's order on
 * one tag). */
static ncclResult_t run_p2p(const call *c, size_t n) {
    char **host = calloc(n, sizeof *host);
    MPI_Request *req = malloc(n * sizeof *req);
    ncclResult_t rc = host && req ? ncclSuccess : ncclSystemError;
    for (size_t i = 0; i < n; i++) req[i] = MPI_REQUEST_NULL;
    for (size_t i = 0; rc == ncclSuccess && i < n; i++) {
        const size_t bytes = c[i].count * type_size(c[i].type);
        if (c[i].comm->aborted) rc = ncclInvalidUsage;
        else if (!(host[i] = malloc(bytes + 1))) rc = ncclSystemError;
        else rc = cuda_ok(cudaStreamSynchronize(c[i].stream), "cudaStreamSynchronize");
        if (rc == ncclSuccess && c[i].kind == OP_SEND && bytes)
            rc = cuda_ok(cudaMemcpy(host[i], c[i].send, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to the host");
        if (rc != ncclSuccess) break;
        pthread_mutex_lock(&mpi_lock);
        const int mrc = c[i].kind == OP_SEND ? PMPI_Isend(host[i], (int)bytes, MPI_BYTE, c[i].peer, 0, c[i].comm->mpi,
                                                          &req[i])
                                             : PMPI_Irecv(host[i], (int)bytes, MPI_BYTE, c[i].peer, 0, c[i].comm->mpi,
                                                          &req[i]);
        pthread_mutex_unlock(&mpi_lock);
        if (mrc != MPI_SUCCESS) rc = ncclSystemError;
    }
    for (size_t i = 0; i < n; i++) { /* every posted one is waited for, whatever failed */
        if (!req || req[i] == MPI_REQUEST_NULL) continue;
        const ncclResult_t w = wait_request(c[i].comm, &req[i]);
        if (w != ncclSuccess && rc == ncclSuccess) rc = w;
    }
    for (size_t i = 0; rc == ncclSuccess && i < n; i++)
        if (c[i].kind == OP_RECV && c[i].count)
            rc = cuda_ok(cudaMemcpy(c[i].recv, host[i], c[i].count * type_size(c[i].type), cudaMemcpyHostToDevice),
                         "cudaMemcpy to the device");
    for (size_t i = 0; host && i < n; i++) free(host[i]);
    free(host);
    free(req);
    for (size_t i = 0; i < n && rc != ncclSuccess; i++)
        if (c[i].comm->async == ncclSuccess) c[i].comm->async = rc;
    return rc;
}

static ncclResult_t check(const call *c) {
    if (!c->comm) return ncclInvalidArgument;
    pthread_mutex_lock(&mpi_lock);
    const MPI_Op op = type_size(c->type) ? mpi_op(c->op, c->type) : MPI_OP_NULL;
    pthread_mutex_unlock(&mpi_lock);
    if (op == MPI_OP_NULL) {
        last_error("%s: a type or reduction this stand-in does not carry", "nccl_over_mpi");
        return ncclInvalidArgument;
    }
    if (c->count > (size_t)INT32_MAX / (size_t)c->comm->nranks) return ncclInvalidArgument;
    if ((c->kind == OP_BROADCAST || is_p2p(c)) && (c->peer < 0 || c->peer >= c->comm->nranks)) {
        last_error("%s: a root or peer out of range", "nccl_over_mpi");
        return ncclInvalidArgument;
    }
    if (is_p2p(c) && c->count * type_size(c->type) > (size_t)INT32_MAX) return ncclInvalidArgument;
    return ncclSuccess;
}

/* ---- groups: held per thread, run at the outermost end ---- */

static __thread int group_depth;
static __thread call *held;
static __thread size_t held_len, held_cap;

static ncclResult_t submit(const call *c) {
    ncclResult_t rc = check(c);
    if (rc != ncclSuccess) return rc;
    if (group_depth == 0) {
        rc = is_p2p(c) ? run_p2p(c, 1) : run(c);
        return rc == ncclSuccess && !c->comm->blocking ? ncclInProgress : rc;
    }
    if (held_len == held_cap) {
        size_t cap = held_cap ? 2 * held_cap : 16;
        call *h = realloc(held, cap * sizeof *h);
        if (!h) return ncclSystemError;
        held = h;
        held_cap = cap;
    }
    held[held_len++] = *c;
    return ncclSuccess;
}

EXPORT ncclResult_t pncclGroupStart(void) {
    group_depth++;
    return ncclSuccess;
}

EXPORT ncclResult_t pncclGroupEnd(void) {
    if (group_depth == 0) return ncclInvalidUsage;
    if (--group_depth > 0) return ncclSuccess;
    ncclResult_t rc = ncclSuccess;
    int in_progress = 0;
    for (size_t i = 0; i < held_len;) {
        size_t n = 1; /* a run of sends and receives goes as one batch */
        while (is_p2p(&held[i]) && i + n < held_len && is_p2p(&held[i + n])) n++;
        const ncclResult_t r = is_p2p(&held[i]) ? run_p2p(&held[i], n) : run(&held[i]);
        if (r != ncclSuccess && rc == ncclSuccess) rc = r;
        for (size_t j = i; j < i + n; j++) in_progress |= !held[j].comm->blocking;
        i += n;
    }
    held_len = 0;
    return rc == ncclSuccess && in_progress ? ncclInProgress : rc;
}

EXPORT ncclResult_t pncclGroupSimulateEnd(ncclSimInfo_t *info) {
    if (group_depth == 0) return ncclInvalidUsage;
    if (--group_depth == 0) held_len = 0;
    if (info) info->estimatedTime = 0.0f;
    return ncclSuccess;
}

/* ---- collectives ---- */

EXPORT ncclResult_t pncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                                   ncclComm_t comm, cudaStream_t stream) {
    const call c = {OP_ALL_REDUCE, send, recv, count, type, op, comm, stream, 0};
    return submit(&c);
}

EXPORT ncclResult_t pncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t type, ncclComm_t comm,
                                   cudaStream_t stream) {
    const call c = {OP_ALL_GATHER, send, recv, count, type, ncclSum, comm, stream, 0};
    return submit(&c);
}

EXPORT ncclResult_t pncclReduceScatter(const void *send, void *recv, size_t count, ncclDataType_t type,
                                       ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    const call c = {OP_REDUCE_SCATTER, send, recv, count, type, op, comm, stream, 0};
    return submit(&c);
}

EXPORT ncclResult_t pncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t type, int root,
                                   ncclComm_t comm, cudaStream_t stream) {
    const call c = {OP_BROADCAST, send, recv, count, type, ncclSum, comm, stream, root};
    return submit(&c);
}

EXPORT ncclResult_t pncclSend(const void *send, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                              cudaStream_t stream) {
    const call c = {OP_SEND, send, NULL, count, type, ncclSum, comm, stream, peer};
    return submit(&c);
}

EXPORT ncclResult_t pncclRecv(void *recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                              cudaStream_t stream) {
    const call c = {OP_RECV, NULL, recv, count, type, ncclSum, comm, stream, peer};
    return submit(&c);
}

/* ---- communicators ---- */

typedef struct {
    uint32_t magic;
    int32_t maker; /* the world rank that made it, the rendezvous */
    int32_t tag;
    uint32_t pid;
} id_body;

#define ID_MAGIC 0x6e6f6d70u /* "nomp" */
#define TAG_BASE 21000
#define TAG_SPAN 4000

EXPORT ncclResult_t pncclGetUniqueId(ncclUniqueId *id) {
    static int made;
    int world_rank = 0, init = 0;
    PMPI_Initialized(&init);
    if (!init) {
        last_error("%s: MPI is not initialised (this NCCL runs over it)", "ncclGetUniqueId");
        return ncclSystemError;
    }
    pthread_mutex_lock(&mpi_lock);
    PMPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    const id_body b = {ID_MAGIC, world_rank, TAG_BASE + 2 * (made++ % (TAG_SPAN / 2)), (uint32_t)getpid()};
    pthread_mutex_unlock(&mpi_lock);
    memset(id, 0, sizeof *id);
    memcpy(id->internal, &b, sizeof b);
    return ncclSuccess;
}

/* Every member's world rank, in communicator rank order, through the maker. */
static ncclResult_t rendezvous(const id_body *b, int nranks, int rank, int *worlds) {
    int me;
    PMPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Request req;
    if (me == b->maker) {
        if (rank < 0 || rank >= nranks) return ncclInvalidArgument;
        for (int i = 0; i < nranks; i++) worlds[i] = -1;
        worlds[rank] = me;
        for (int got = 1; got < nranks; got++) {
            int pair[2];
            pthread_mutex_lock(&mpi_lock);
            PMPI_Irecv(pair, 2, MPI_INT, MPI_ANY_SOURCE, b->tag, MPI_COMM_WORLD, &req);
            pthread_mutex_unlock(&mpi_lock);
            if (wait_request(NULL, &req) != ncclSuccess) return ncclSystemError;
            if (pair[0] < 0 || pair[0] >= nranks || worlds[pair[0]] >= 0) return ncclInvalidUsage;
            worlds[pair[0]] = pair[1];
        }
        for (int i = 0; i < nranks; i++) {
            if (worlds[i] == me) continue;
            pthread_mutex_lock(&mpi_lock);
            PMPI_Isend(worlds, nranks, MPI_INT, worlds[i], b->tag + 1, MPI_COMM_WORLD, &req);
            pthread_mutex_unlock(&mpi_lock);
            if (wait_request(NULL, &req) != ncclSuccess) return ncclSystemError;
        }
        return ncclSuccess;
    }
    const int pair[2] = {rank, me};
    pthread_mutex_lock(&mpi_lock);
    PMPI_Isend(pair, 2, MPI_INT, b->maker, b->tag, MPI_COMM_WORLD, &req);
    pthread_mutex_unlock(&mpi_lock);
    if (wait_request(NULL, &req) != ncclSuccess) return ncclSystemError;
    pthread_mutex_lock(&mpi_lock);
    PMPI_Irecv(worlds, nranks, MPI_INT, b->maker, b->tag + 1, MPI_COMM_WORLD, &req);
    pthread_mutex_unlock(&mpi_lock);
    return wait_request(NULL, &req);
}

static ncclResult_t init_rank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank, int blocking) {
    id_body b;
    memcpy(&b, id.internal, sizeof b);
    if (b.magic != ID_MAGIC || nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
    ncclComm_t c = calloc(1, sizeof *c);
    int *worlds = malloc((size_t)nranks * sizeof *worlds);
    if (!c || !worlds) {
        free(c);
        free(worlds);
        return ncclSystemError;
    }
    c->rank = rank;
    c->nranks = nranks;
    c->blocking = blocking;
    if (cudaGetDevice(&c->device) != cudaSuccess) c->device = 0;
    ncclResult_t rc = ncclSuccess;
    if (nranks == 1) {
        pthread_mutex_lock(&mpi_lock);
        if (PMPI_Comm_dup(MPI_COMM_SELF, &c->mpi) != MPI_SUCCESS) rc = ncclSystemError;
        pthread_mutex_unlock(&mpi_lock);
    } else if ((rc = rendezvous(&b, nranks, rank, worlds)) == ncclSuccess) {
        MPI_Group world, members;
        pthread_mutex_lock(&mpi_lock);
        PMPI_Comm_group(MPI_COMM_WORLD, &world);
        PMPI_Group_incl(world, nranks, worlds, &members);
        if (PMPI_Comm_create_group(MPI_COMM_WORLD, members, b.tag, &c->mpi) != MPI_SUCCESS) rc = ncclSystemError;
        PMPI_Group_free(&members);
        PMPI_Group_free(&world);
        pthread_mutex_unlock(&mpi_lock);
    }
    free(worlds);
    if (rc != ncclSuccess) {
        free(c);
        return rc;
    }
    *out = c;
    made_one();
    return blocking ? ncclSuccess : ncclInProgress;
}

EXPORT ncclResult_t pncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    return init_rank(comm, nranks, id, rank, 1);
}

EXPORT ncclResult_t pncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                            ncclConfig_t *config) {
    const int blocking = !config || config->blocking == NCCL_CONFIG_UNDEF_INT || config->blocking != 0;
    return init_rank(comm, nranks, id, rank, blocking);
}

static void release(ncclComm_t comm) {
    pthread_mutex_lock(&mpi_lock);
    PMPI_Comm_free(&comm->mpi);
    pthread_mutex_unlock(&mpi_lock);
    free(comm);
}

/* Whether NCCL_OVER_MPI_SPLIT_FAIL names this parent rank. */
static int split_fails(int rank) {
    const char *v = getenv("NCCL_OVER_MPI_SPLIT_FAIL");
    if (!v || !*v) return 0;
    if (!strcmp(v, "all")) return 1;
    for (const char *p = v; *p;) {
        char *end;
        const long r = strtol(p, &end, 10);
        if (end == p) return 0;
        if (r == rank) return 1;
        p = *end == ',' ? end + 1 : end;
    }
    return 0;
}

EXPORT ncclResult_t pncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config) {
    if (!comm || !newcomm || (color < 0 && color != NCCL_SPLIT_NOCOLOR)) return ncclInvalidArgument;
    *newcomm = NULL;
    if (comm->aborted) return ncclInvalidUsage;
    MPI_Comm child = MPI_COMM_NULL;
    pthread_mutex_lock(&mpi_lock);
    const int mrc = PMPI_Comm_split(comm->mpi, color == NCCL_SPLIT_NOCOLOR ? MPI_UNDEFINED : color, key, &child);
    pthread_mutex_unlock(&mpi_lock);
    if (mrc != MPI_SUCCESS) return ncclSystemError;
    const int blocking = config && config->blocking != NCCL_CONFIG_UNDEF_INT ? config->blocking != 0 : comm->blocking;
    if (split_fails(comm->rank)) {
        if (child != MPI_COMM_NULL) {
            pthread_mutex_lock(&mpi_lock);
            PMPI_Comm_free(&child);
            pthread_mutex_unlock(&mpi_lock);
        }
        last_error("%s: failed on purpose (NCCL_OVER_MPI_SPLIT_FAIL)", "ncclCommSplit");
        return ncclSystemError;
    }
    if (child == MPI_COMM_NULL) return blocking ? ncclSuccess : ncclInProgress;
    ncclComm_t c = calloc(1, sizeof *c);
    if (!c) {
        pthread_mutex_lock(&mpi_lock);
        PMPI_Comm_free(&child);
        pthread_mutex_unlock(&mpi_lock);
        return ncclSystemError;
    }
    c->mpi = child;
    pthread_mutex_lock(&mpi_lock);
    PMPI_Comm_rank(child, &c->rank);
    PMPI_Comm_size(child, &c->nranks);
    pthread_mutex_unlock(&mpi_lock);
    c->device = comm->device;
    c->blocking = blocking;
    *newcomm = c;
    made_one();
    return blocking ? ncclSuccess : ncclInProgress;
}

EXPORT ncclResult_t pncclCommFinalize(ncclComm_t comm) {
    if (!comm) return ncclInvalidArgument;
    return comm->blocking ? ncclSuccess : ncclInProgress;
}

EXPORT ncclResult_t pncclCommDestroy(ncclComm_t comm) {
    if (!comm) return ncclInvalidArgument;
    ended_one(comm);
    release(comm);
    return ncclSuccess;
}

/* Ends the waits of calls in flight (ncclRemoteError there); the memory
 * stays, as a call in flight on another thread may still read it. */
EXPORT ncclResult_t pncclCommAbort(ncclComm_t comm) {
    if (!comm) return ncclInvalidArgument;
    comm->aborted = 1;
    comm->async = ncclRemoteError;
    ended_one(comm);
    return ncclSuccess;
}

EXPORT ncclResult_t pncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *err) {
    if (!comm || !err) return ncclInvalidArgument;
    *err = comm->async;
    return ncclSuccess;
}

EXPORT ncclResult_t pncclCommCount(const ncclComm_t comm, int *count) {
    if (!comm || !count) return ncclInvalidArgument;
    *count = comm->nranks;
    return ncclSuccess;
}

EXPORT ncclResult_t pncclCommUserRank(const ncclComm_t comm, int *rank) {
    if (!comm || !rank) return ncclInvalidArgument;
    *rank = comm->rank;
    return ncclSuccess;
}

EXPORT ncclResult_t pncclCommCuDevice(const ncclComm_t comm, int *device) {
    if (!comm || !device) return ncclInvalidArgument;
    *device = comm->device;
    return ncclSuccess;
}

EXPORT ncclResult_t pncclGetVersion(int *version) {
    if (!version) return ncclInvalidArgument;
    *version = NCCL_VERSION_CODE; /* the nccl.h this was built against */
    return ncclSuccess;
}

EXPORT const char *pncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

EXPORT const char *pncclGetLastError(ncclComm_t comm) {
    (void)comm;
    return last_error_text;
}

ALIAS(ncclGroupStart) ncclResult_t ncclGroupStart(void);
ALIAS(ncclGroupEnd) ncclResult_t ncclGroupEnd(void);
ALIAS(ncclGroupSimulateEnd) ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t *info);
ALIAS(ncclAllReduce) ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type,
                                                ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ALIAS(ncclAllGather) ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t type,
                                                ncclComm_t comm, cudaStream_t stream);
ALIAS(ncclReduceScatter) ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count,
                                                        ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                                                        cudaStream_t stream);
ALIAS(ncclBroadcast) ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t type,
                                                int root, ncclComm_t comm, cudaStream_t stream);
ALIAS(ncclSend) ncclResult_t ncclSend(const void *send, size_t count, ncclDataType_t type, int peer,
                                      ncclComm_t comm, cudaStream_t stream);
ALIAS(ncclRecv) ncclResult_t ncclRecv(void *recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                                      cudaStream_t stream);
ALIAS(ncclGetUniqueId) ncclResult_t ncclGetUniqueId(ncclUniqueId *id);
ALIAS(ncclCommInitRank) ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank);
ALIAS(ncclCommInitRankConfig) ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id,
                                                                  int rank, ncclConfig_t *config);
ALIAS(ncclCommSplit) ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                                                ncclConfig_t *config);
ALIAS(ncclCommFinalize) ncclResult_t ncclCommFinalize(ncclComm_t comm);
ALIAS(ncclCommDestroy) ncclResult_t ncclCommDestroy(ncclComm_t comm);
ALIAS(ncclCommAbort) ncclResult_t ncclCommAbort(ncclComm_t comm);
ALIAS(ncclCommGetAsyncError) ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *err);
ALIAS(ncclCommCount) ncclResult_t ncclCommCount(const ncclComm_t comm, int *count);
ALIAS(ncclCommUserRank) ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank);
ALIAS(ncclCommCuDevice) ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device);
ALIAS(ncclGetVersion) ncclResult_t ncclGetVersion(int *version);
ALIAS(ncclGetErrorString) const char *ncclGetErrorString(ncclResult_t r);
ALIAS(ncclGetLastError) const char *ncclGetLastError(ncclComm_t comm);
