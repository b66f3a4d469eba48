/* The CUDA engine's state: one device allocation carved into every array the
 * state will ever use, sized at creation for the shape's k (the warm-up's
 * first, the largest), so that no later call allocates (invariant 5). Also
 * the report, availability and error text, and the test read-back.
 *
 * Nothing here runs at load time: no constructors, no global objects that
 * call CUDA. The library is loaded into MPI-only jobs on machines without a
 * driver; the runtime is first touched by dgc_gpu_available or a create. */
#include <cub/device/device_radix_sort.cuh>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dgcshim/wire_compact.h"
#include "internal.cuh"

namespace dgc_cuda {

/* The last failure's text, per thread (the front end logs it). */
static thread_local char last_error[256];

int fail(char *err, size_t errlen, const char *what, cudaError_t e) {
    snprintf(last_error, sizeof last_error, "%s: %s", what, cudaGetErrorString(e));
    if (err && errlen) snprintf(err, errlen, "%s", last_error);
    return -1;
}

int fail_msg(char *err, size_t errlen, const char *msg) {
    snprintf(last_error, sizeof last_error, "%s", msg);
    if (err && errlen) snprintf(err, errlen, "%s", msg);
    return -1;
}

unsigned int grid_for(uint64_t count, int sms, int per_sm) {
    uint64_t blocks = (count + kThreads - 1) / kThreads;
    uint64_t cap = (uint64_t)(sms > 0 ? sms : 1) * (uint64_t)per_sm;
    if (blocks > cap) blocks = cap;
    return blocks ? (unsigned int)blocks : 1u;
}

int sort_end_bit(uint64_t n) {
    int b = 0;
    while (b < 32 && (n >> b) != 0) b++; /* n itself (the padding key) fits in b bits */
    return b ? b : 1;
}

cudaError_t sort_temp_bytes(uint64_t k, int end_bit, size_t *bytes) {
    cub::DoubleBuffer<uint32_t> keys(nullptr, nullptr);
    cub::DoubleBuffer<float> vals(nullptr, nullptr);
    *bytes = 0;
    /* cub's first call per device asks which device is current and throws
     * when it cannot tell: no C++ exception may reach the C callers. */
    try {
        return cub::DeviceRadixSort::SortPairs(nullptr, *bytes, keys, vals, (uint32_t)k, 0, end_bit, (cudaStream_t)0);
    } catch (...) {
        return cudaErrorUnknown;
    }
}

cudaError_t preload(const void *const *kernels, size_t count) {
    for (size_t i = 0; i < count; i++) {
        cudaFuncAttributes a;
        const cudaError_t e = cudaFuncGetAttributes(&a, kernels[i]);
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

} // namespace dgc_cuda

using namespace dgc_cuda;

namespace {

constexpr size_t kAlign = 256;

size_t up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

/* The committed and the spare half of v (and u) start 256-byte aligned, so
 * that the update pass moves them in 16-byte vectors whatever n is. */
uint64_t stride_of(uint64_t n) { return (n + 63) / 64 * 64; }

/* Offsets of every array in the one allocation. */
struct layout {
    size_t v2, u2, acc, cand_idx, cand_val, keys0, vals0, temp, payload, gathered, prev, prev_dense, spare, sc, total;
    size_t wire, wire_gathered, popc, popc_sum, codes, scan_temp;
    size_t temp_bytes, scan_temp_bytes, wire_room;
    uint64_t cap;
};

/* The sort's temp storage for any k up to the shape's: cub's need is not
 * promised to grow with the item count (it switches algorithms with size),
 * so the largest over the k a warm-up can use is taken: k, k/2, ... 1. */
cudaError_t max_sort_temp(uint64_t k, size_t *bytes) {
    *bytes = 0;
    for (uint64_t kk = k;; kk /= 2) {
        size_t b;
        cudaError_t e = sort_temp_bytes(kk ? kk : 1, 32, &b);
        if (e != cudaSuccess) return e;
        if (b > *bytes) *bytes = b;
        if (kk <= 1) break;
    }
    return cudaSuccess;
}

cudaError_t plan(const dgc_gpu_shape *sh, layout *l) {
    const uint64_t n = sh->n, k = sh->k, r = (uint64_t)sh->nranks;
    l->cap = dgc_candidate_cap(n, k);
    cudaError_t e = max_sort_temp(k, &l->temp_bytes);
    if (e != cudaSuccess) return e;
    size_t o = 0;
    const size_t f = sizeof(float), w = dgc_wire_bytes(k);
    /* Two halves of v and u only with dense room (internal.cuh, dgc_gpu_state.ns). */
    const uint64_t halves = sh->dense ? 2 : 1, ns = stride_of(n);
    l->v2 = o; o += up(halves * ns * f);
    l->u2 = o; o += sh->with_momentum ? up(halves * ns * f) : 0;
    /* A 16-bit buffer's fp32 sum: n floats for the dense transport's sum;
     * the all-gather's decode sums in shared memory (decode.cu, sum16). */
    l->acc = o; o += sh->dtype != DGC_GPU_F32 && sh->dense ? up(n * f) : 0;
    l->cand_idx = o; o += up(l->cap * sizeof(uint32_t));
    l->cand_val = o; o += up(l->cap * f);
    /* The sort's other buffers are the candidate arrays (cap >= k), dead
     * once the selection is compacted out of them. */
    l->keys0 = o; o += up(k * sizeof(uint32_t));
    l->vals0 = o; o += up(k * f);
    l->temp = o; o += up(l->temp_bytes);
    /* Gathered: the sparse steps' payloads, or the dense steps' headers;
     * kept: the payloads of a sparse step, the vector of a dense one. */
    const size_t ws = sh->sparse_k ? dgc_wire_bytes(sh->sparse_k) : 0;
    const size_t gathered = ws > sizeof(dgc_wire_header) || !sh->dense ? ws : sizeof(dgc_wire_header);
    l->payload = o; o += up(w);
    l->gathered = o; o += up(r * gathered);
    l->prev = o; o += sh->keep_prev ? up(r * ws) : 0;
    l->prev_dense = o; o += sh->keep_prev && sh->dense ? up(n * f) : 0;
    l->spare = o; o += sh->dense ? up(r * f) : 0;
    /* Compact payloads for the sparse steps, up to sparse_k slots. Their
     * bits grow with k, but not quite their bytes: each of the three areas
     * rounds up to whole words, and where a larger k takes fewer low bits a
     * payload can come out a word or two shorter than a smaller k's. Three
     * words of slack cover every k below (wire_room; encode and decode
     * refuse a call past it). */
    const bool compact = sh->value_bits && sh->sparse_k;
    dgc_compact_layout cl = {};
    if (compact) dgc_compact_layout_for(n, sh->sparse_k, sh->value_bits, &cl);
    if (compact) cl.bytes += 24;
    l->wire_room = compact ? cl.bytes : 0;
    const uint64_t upper_words = compact ? (cl.upper_bits + 63) / 64 : 0;
    l->scan_temp_bytes = 0;
    if (compact && (e = dgc_cuda::scan_temp_bytes(r * upper_words, &l->scan_temp_bytes)) != cudaSuccess) return e;
    l->wire = o; o += up(cl.bytes);
    l->wire_gathered = o; o += up(r * cl.bytes);
    l->popc = o; o += up(r * upper_words * 8);
    l->popc_sum = o; o += up(r * upper_words * 8);
    l->codes = o; o += compact ? up(r * sizeof(rank_code)) : 0;
    l->scan_temp = o; o += up(l->scan_temp_bytes);
    l->sc = o; o += up(sizeof(scratch));
    l->total = o;
    return cudaSuccess;
}

int shape_ok(const dgc_gpu_shape *sh, char *err, size_t errlen) {
    if (!sh || sh->n == 0 || sh->n > UINT32_MAX || sh->k == 0 || sh->k > sh->n || sh->sparse_k > sh->k ||
        (sh->sparse_k == 0 && !sh->dense) || sh->nranks < 1 || (unsigned)sh->dtype > (unsigned)DGC_GPU_BF16 ||
        (sh->value_bits != 0 && sh->value_bits != 16 && sh->value_bits != 32)) {
        char msg[200];
        snprintf(msg, sizeof msg,
                 "bad GPU state shape (n %llu, k %llu, sparse k %llu, dense %d, nranks %d, value bits %u): need 1 <= "
                 "k <= n < 2^32, sparse k <= k, some transport, value bits 0, 16 or 32",
                 sh ? (unsigned long long)sh->n : 0ull, sh ? (unsigned long long)sh->k : 0ull,
                 sh ? (unsigned long long)sh->sparse_k : 0ull, sh ? sh->dense : 0, sh ? sh->nranks : 0,
                 sh ? sh->value_bits : 0u);
        return fail_msg(err, errlen, msg);
    }
    return 0;
}

/* The warm-up's end (dgc_gpu_state_resize): the committed halves of v and u
 * into the new block's first halves (its only copy, without dense room), and what the scratch keeps from call
 * to call (which half is committed: now the first; how the last sum is
 * kept). The rest of the new scratch was zeroed as a new state's. */
__global__ void __launch_bounds__(kThreads) move_kernel(const scratch *from, scratch *to, const float *v2,
                                                        const float *u2, float *nv2, float *nu2, uint64_t ns,
                                                        uint64_t n) {
    const int cur = from->cur;
    const float *v = v2 + (cur ? ns : 0);
    const float *u = u2 ? u2 + (cur ? ns : 0) : nullptr;
    for (uint64_t i = blockIdx.x * (uint64_t)kThreads + threadIdx.x; i < n; i += (uint64_t)gridDim.x * kThreads) {
        nv2[i] = v[i];
        if (u) nu2[i] = u[i];
    }
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    to->cur = 0;
    to->prev_kind = from->prev_kind;
    to->prev_nranks = from->prev_nranks;
    to->prev_k = from->prev_k;
    to->prev_step = from->prev_step;
}

/* This file's own kernel: the warm-up's end (dgc_gpu_state_resize). */
cudaError_t preload_state() {
    const void *const kernels[] = {(const void *)move_kernel};
    return preload(kernels, sizeof kernels / sizeof kernels[0]);
}

} // namespace

/* Every kernel of the engine loaded on the current device (internal.cuh,
 * preload: lazy loading). Each state asks again: once a kernel is loaded the
 * query is a lookup, states are made a few times a run, and the engine
 * keeps no record of which devices it has seen (no global state). */
static int preload_kernels(char *err, size_t errlen) {
    cudaError_t (*const files[])(void) = {dgc_cuda::preload_sample_select, dgc_cuda::preload_compress,
                                          dgc_cuda::preload_decode, dgc_cuda::preload_dense,
                                          dgc_cuda::preload_compact, dgc_cuda::preload_commit, dgc_cuda::preload_node,
                                          preload_state};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        const cudaError_t e = files[i]();
        if (e != cudaSuccess) return dgc_cuda::fail(err, errlen, "loading the engine's kernels", e);
    }
    return 0;
}

extern "C" {

size_t dgc_gpu_dtype_size(dgc_gpu_dtype t) { return t == DGC_GPU_F32 ? 4 : 2; }

size_t dgc_gpu_state_footprint(const dgc_gpu_shape *shape) {
    layout l;
    if (shape_ok(shape, NULL, 0) || plan(shape, &l) != cudaSuccess) return 0;
    return l.total;
}

dgc_gpu_state *dgc_gpu_state_create(const dgc_gpu_shape *shape, dgc_cuda_stream stream, char *err, size_t errlen) {
    return dgc_gpu_state_create_with(shape, stream, NULL, err, errlen);
}

/* The block: from the device's memory pool in stream order where it has
 * one (so that it can be freed without a wait), else cudaMalloc. */
static cudaError_t alloc_block(dgc_gpu_state *s, size_t bytes, cudaStream_t st) {
    cudaError_t e = cudaMallocAsync(&s->block, bytes, st);
    if (e == cudaSuccess) {
        s->pooled = 1;
        return e;
    }
    (void)cudaGetLastError();
    s->block = NULL;
    e = cudaMalloc(&s->block, bytes);
    if (e != cudaSuccess) s->block = NULL;
    return e;
}

/* The state's arrays in its block, at the plan's offsets. */
static void carve(dgc_gpu_state *s, const layout *lp) {
    const layout &l = *lp;
    const dgc_gpu_shape *shape = &s->shape;
    char *b = (char *)s->block;
    s->v2 = (float *)(b + l.v2);
    s->u2 = shape->with_momentum ? (float *)(b + l.u2) : NULL;
    s->acc = shape->dtype != DGC_GPU_F32 && shape->dense ? (float *)(b + l.acc) : NULL;
    s->cand_idx = (uint32_t *)(b + l.cand_idx);
    s->cand_val = (float *)(b + l.cand_val);
    s->cand_cap = l.cap;
    s->keys[0] = (uint32_t *)(b + l.keys0);
    s->keys[1] = s->cand_idx;
    s->vals[0] = (float *)(b + l.vals0);
    s->vals[1] = s->cand_val;
    s->sort_temp = b + l.temp;
    s->sort_temp_bytes = l.temp_bytes;
    s->payload = b + l.payload;
    s->gathered = b + l.gathered;
    s->prev = shape->keep_prev && shape->sparse_k ? b + l.prev : NULL;
    s->prev_dense = shape->keep_prev && shape->dense ? (float *)(b + l.prev_dense) : NULL;
    s->spare = shape->dense ? (float *)(b + l.spare) : NULL;
    const bool compact = shape->value_bits && shape->sparse_k;
    s->wire = compact ? b + l.wire : s->payload;
    s->wire_gathered = compact ? b + l.wire_gathered : s->gathered;
    s->popc = compact ? (unsigned long long *)(b + l.popc) : NULL;
    s->popc_sum = compact ? (unsigned long long *)(b + l.popc_sum) : NULL;
    s->codes = compact ? (rank_code *)(b + l.codes) : NULL;
    s->scan_temp = compact ? b + l.scan_temp : NULL;
    s->scan_temp_bytes = l.scan_temp_bytes;
    s->wire_room = l.wire_room;
    s->sc = (scratch *)(b + l.sc);
}

/* A state's shape and block, made and carved (not yet zeroed): what a new
 * state and a resized one share. */
static cudaError_t make_block(dgc_gpu_state *s, const dgc_gpu_shape *shape, const layout *l, int sms,
                              cudaStream_t st) {
    s->shape = *shape;
    s->sms = sms;
    s->bytes = l->total;
    s->ns = shape->dense ? stride_of(shape->n) : 0;
    const cudaError_t e = alloc_block(s, l->total, st);
    if (e == cudaSuccess) carve(s, l);
    return e;
}

static cudaError_t zero_block(dgc_gpu_state *s, cudaStream_t st) {
    cudaError_t e;
    if ((e = cudaMemsetAsync(s->block, 0, s->bytes, st)) != cudaSuccess ||
        (e = cudaMemsetAsync(&s->sc->bad_key, 0xff, sizeof s->sc->bad_key, st)) != cudaSuccess)
        return e;
    return cudaMemsetAsync(&s->sc->code_bad_key, 0xff, sizeof s->sc->code_bad_key, st);
}

/* The mapped memory's device address, and the counter within it. */
static cudaError_t map_counter(dgc_gpu_state *s) {
    s->nonfinite_host = &s->mapped_host->nonfinite;
    cudaError_t e = cudaHostGetDevicePointer((void **)&s->mapped_dev, s->mapped_host, 0);
    if (e == cudaSuccess) s->nonfinite_dev = &s->mapped_dev->nonfinite;
    return e;
}

/* A state that could not be made: freed without a wait for the device. */
static void discard(dgc_gpu_state *s, cudaStream_t st) {
    const int own_counter = !s->counter_given;
    void *counter = dgc_gpu_state_release(s, (dgc_cuda_stream)st);
    if (counter && own_counter) (void)cudaFreeHost(counter);
}

dgc_gpu_state *dgc_gpu_state_create_with(const dgc_gpu_shape *shape, dgc_cuda_stream stream, void *counter,
                                         char *err, size_t errlen) {
    if (shape_ok(shape, err, errlen)) return NULL;
    cudaStream_t st = (cudaStream_t)stream;
    layout l;
    cudaError_t e = plan(shape, &l);
    if (e != cudaSuccess) {
        fail(err, errlen, "sizing the sort's scratch", e);
        return NULL;
    }
    int dev = 0, sms = 0;
    if ((e = cudaGetDevice(&dev)) != cudaSuccess ||
        (e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess) {
        fail(err, errlen, "querying the device", e);
        return NULL;
    }
    if (preload_kernels(err, errlen)) return NULL;
    dgc_gpu_state *s = (dgc_gpu_state *)calloc(1, sizeof *s);
    if (!s) {
        fail_msg(err, errlen, "no host memory for a GPU state");
        return NULL;
    }
    char what[128];
    if ((e = make_block(s, shape, &l, sms, st)) != cudaSuccess) {
        snprintf(what, sizeof what, "cudaMalloc of %zu bytes for a %llu-element buffer's state", l.total,
                 (unsigned long long)shape->n);
        fail(err, errlen, what, e);
        discard(s, st);
        return NULL;
    }
    if (counter) {
        s->mapped_host = (dgc_gpu_state_mapped *)counter;
        s->counter_given = 1;
    } else if ((e = cudaHostAlloc((void **)&s->mapped_host, sizeof *s->mapped_host, cudaHostAllocMapped)) !=
               cudaSuccess) {
        fail(err, errlen, "cudaHostAlloc of the state's counter", e);
        s->mapped_host = NULL;
        discard(s, st);
        return NULL;
    }
    memset(s->mapped_host, 0, sizeof *s->mapped_host);
    if ((e = map_counter(s)) != cudaSuccess) {
        fail(err, errlen, "cudaHostGetDevicePointer of the state's counter", e);
        discard(s, st);
        return NULL;
    }
    /* Zero state (v = u = 0, cur = 0, nothing kept), and no bad slot yet. */
    if ((e = zero_block(s, st)) != cudaSuccess) {
        fail(err, errlen, "zeroing a new GPU state", e);
        discard(s, st);
        return NULL;
    }
    return s;
}

void dgc_gpu_state_destroy(dgc_gpu_state *s) {
    if (!s) return;
    /* cudaFree waits for the device only for cudaMalloc's memory. */
    if (s->block && s->pooled) (void)cudaDeviceSynchronize();
    if (s->block) (void)cudaFree(s->block);
    if (s->nonfinite_host && !s->counter_given) (void)cudaFreeHost(s->nonfinite_host);
    free(s);
}

void *dgc_gpu_state_release(dgc_gpu_state *s, dgc_cuda_stream stream) {
    if (!s) return NULL;
    if (s->block && s->pooled) (void)cudaFreeAsync(s->block, (cudaStream_t)stream);
    else if (s->block) (void)cudaFree(s->block);
    void *counter = s->nonfinite_host;
    free(s);
    return counter;
}

int dgc_gpu_state_kept_fits(const dgc_gpu_state *s, const dgc_gpu_shape *shape) {
    const volatile dgc_gpu_state_mapped *m = s->mapped_host;
    if (m->done_step != s->last_step) return 0; /* some step still on its way: it may keep another sum */
    __atomic_thread_fence(__ATOMIC_ACQUIRE);    /* the rest was written before done_step */
    switch (m->kept_kind) {
    case PREV_NONE: return 1;
    case PREV_SPARSE:
        return shape->keep_prev && shape->sparse_k >= m->kept_k && shape->nranks == m->kept_nranks;
    default: return shape->keep_prev && shape->dense;
    }
}

/* A block given back after the work on st: in stream order from a memory
 * pool; else (no pools: the emulated device) by cudaFree after a wait for
 * st, where cudaFree alone might not wait for the copies out of it. */
static void free_block(void *block, int pooled, cudaStream_t st) {
    if (pooled) {
        (void)cudaFreeAsync(block, st);
        return;
    }
    (void)cudaStreamSynchronize(st);
    (void)cudaFree(block);
}

/* Only k, sparse_k and the dense room may change. */
static int same_buffer(const dgc_gpu_shape *a, const dgc_gpu_shape *b) {
    return a->n == b->n && a->nranks == b->nranks && a->with_momentum == b->with_momentum &&
           a->keep_prev == b->keep_prev && a->dtype == b->dtype && a->value_bits == b->value_bits;
}

/* The new state's content from s's, on st: the committed halves and the
 * scratch's kept fields (move_kernel), then the kept sum, as the mapped
 * memory says it is kept (every step is done: dgc_gpu_state_kept_fits). */
static cudaError_t move_content(const dgc_gpu_state *s, dgc_gpu_state *t, cudaStream_t st) {
    move_kernel<<<grid_for(s->shape.n, s->sms, 8), kThreads, 0, st>>>(s->sc, t->sc, s->v2, s->u2, t->v2, t->u2,
                                                                      s->ns, s->shape.n);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    const volatile dgc_gpu_state_mapped *m = s->mapped_host;
    if (m->kept_kind == PREV_SPARSE && t->prev)
        return cudaMemcpyAsync(t->prev, s->prev, (size_t)m->kept_nranks * dgc_wire_bytes(m->kept_k),
                               cudaMemcpyDeviceToDevice, st);
    if (m->kept_kind == PREV_DENSE && t->prev_dense)
        return cudaMemcpyAsync(t->prev_dense, s->prev_dense, s->shape.n * sizeof(float), cudaMemcpyDeviceToDevice,
                               st);
    return cudaSuccess;
}

dgc_gpu_state *dgc_gpu_state_resize(dgc_gpu_state *s, const dgc_gpu_shape *shape, dgc_cuda_stream stream,
                                    char *err, size_t errlen) {
    if (shape_ok(shape, err, errlen)) return NULL;
    if (!same_buffer(&s->shape, shape)) {
        fail_msg(err, errlen, "dgc_gpu_state_resize: only k, sparse k and the dense room may change");
        return NULL;
    }
    cudaStream_t st = (cudaStream_t)stream;
    layout l;
    cudaError_t e = plan(shape, &l);
    dgc_gpu_state *t = e == cudaSuccess ? (dgc_gpu_state *)calloc(1, sizeof *t) : NULL;
    if (!t) {
        if (e == cudaSuccess) fail_msg(err, errlen, "no host memory for a GPU state");
        else fail(err, errlen, "sizing the sort's scratch", e);
        return NULL;
    }
    if ((e = make_block(t, shape, &l, s->sms, st)) != cudaSuccess) {
        fail(err, errlen, "allocating a resized state", e);
        free(t);
        return NULL;
    }
    if ((e = zero_block(t, st)) != cudaSuccess || (e = move_content(s, t, st)) != cudaSuccess) {
        free_block(t->block, t->pooled, st);
        free(t);
        fail(err, errlen, "moving a state into its resized block", e);
        return NULL;
    }
    t->mapped_host = s->mapped_host;
    t->mapped_dev = s->mapped_dev;
    t->nonfinite_host = s->nonfinite_host;
    t->nonfinite_dev = s->nonfinite_dev;
    t->counter_given = s->counter_given;
    t->last_step = s->last_step;
    free_block(s->block, s->pooled, st);
    free(s);
    return t;
}

const dgc_gpu_shape *dgc_gpu_state_shape(const dgc_gpu_state *s) { return &s->shape; }
size_t dgc_gpu_state_bytes(const dgc_gpu_state *s) { return s->bytes; }
void *dgc_gpu_payload(dgc_gpu_state *s) { return s->payload; }
void *dgc_gpu_gathered(dgc_gpu_state *s) { return s->gathered; }
void *dgc_gpu_wire(dgc_gpu_state *s) { return s->wire; }
void *dgc_gpu_wire_gathered(dgc_gpu_state *s) { return s->wire_gathered; }

size_t dgc_gpu_wire_bytes(const dgc_gpu_state *s, uint64_t k) {
    if (!s->shape.value_bits || !s->shape.sparse_k) return dgc_wire_bytes(k); /* dgc_gpu_wire is the plain payload */
    dgc_compact_layout cl;
    dgc_compact_layout_for(s->shape.n, k, s->shape.value_bits, &cl);
    return cl.bytes;
}

uint64_t dgc_gpu_state_nonfinite(const dgc_gpu_state *s) {
    return *(volatile const unsigned long long *)s->nonfinite_host;
}

int dgc_gpu_state_read(dgc_gpu_state *s, float *v, float *u) {
    cudaError_t e;
    int cur = 0;
    const uint64_t n = s->shape.n, ns = s->ns;
    if ((e = cudaDeviceSynchronize()) != cudaSuccess ||
        (e = cudaMemcpy(&cur, &s->sc->cur, sizeof cur, cudaMemcpyDeviceToHost)) != cudaSuccess)
        return fail(NULL, 0, "reading a GPU state", e);
    if (v && (e = cudaMemcpy(v, s->v2 + (cur ? ns : 0), n * sizeof(float), cudaMemcpyDeviceToHost)) != cudaSuccess)
        return fail(NULL, 0, "reading a GPU state's residual", e);
    if (u && s->u2 &&
        (e = cudaMemcpy(u, s->u2 + (cur ? ns : 0), n * sizeof(float), cudaMemcpyDeviceToHost)) != cudaSuccess)
        return fail(NULL, 0, "reading a GPU state's momentum", e);
    return 0;
}

dgc_gpu_report *dgc_gpu_report_create(void) {
    if (!dgc_gpu_available()) return NULL;
    dgc_gpu_report *r = NULL;
    cudaError_t e = cudaHostAlloc((void **)&r, sizeof *r, cudaHostAllocMapped);
    if (e != cudaSuccess) {
        fail(NULL, 0, "cudaHostAlloc of a report", e);
        return NULL;
    }
    memset(r, 0, sizeof *r);
    return r;
}

void dgc_gpu_report_destroy(dgc_gpu_report *r) {
    if (r) cudaFreeHost(r);
}

/* Why no device is usable, kept for every thread's dgc_gpu_last_error. */
static char probe_reason[256];

/* Asked once, on first use: a function-local static is initialised lazily
 * and thread-safely, never at load time. */
static int probe(void) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) fail(probe_reason, sizeof probe_reason, "cudaGetDeviceCount", e);
    else if (count < 1) fail_msg(probe_reason, sizeof probe_reason, "cudaGetDeviceCount: no CUDA device");
    return e == cudaSuccess && count > 0;
}

int dgc_gpu_available(void) {
    static const int available = probe();
    return available;
}

const char *dgc_gpu_last_error(void) {
    if (last_error[0]) return last_error;
    return probe_reason[0] ? probe_reason : "no error";
}

} // extern "C"
