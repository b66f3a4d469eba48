/* Before the update pass: the clipping factor, and the radix select that
 * turns the threshold sample (or the candidates, or the whole buffer) into
 * an exact k-th largest.
 *
 * The sample is the host engine's (dgc_sample_plan_for, dgc_rule_run_start):
 * the same elements, the same updated values, so the want-th largest of it,
 * found exactly here as there, is the same threshold. Its values are not
 * stored: each pass computes them from g, u and v (fresh.cuh), so that the
 * sample takes no memory whatever its ratio, and the state needs no second
 * copy of v to hold it. */
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "fresh.cuh"

namespace dgc_cuda {
namespace {

static_assert(kThreads == 256, "one thread per radix digit");

/* sum(g^2) in double, partials per block in a fixed grid, added by the last
 * block in block order: the same factor on every run. Only this rank's state
 * depends on it, so its order of summation need not be the host's. */
template <int DT>
__global__ void __launch_bounds__(kThreads) clip_kernel(const void *g, uint64_t n, scratch *sc, double clip_norm,
                                                        int nranks) {
    typedef cub::BlockReduce<double, kThreads> reduce_t;
    __shared__ typename reduce_t::TempStorage tmp;
    __shared__ bool last;
    double acc = 0.0;
    for (uint64_t i = blockIdx.x * (uint64_t)kThreads + threadIdx.x; i < n; i += (uint64_t)gridDim.x * kThreads) {
        const double x = elem<DT>::load(g, i);
        acc += x * x;
    }
    const double part = reduce_t(tmp).Sum(acc);
    if (threadIdx.x == 0) {
        sc->clip_part[blockIdx.x] = part;
        __threadfence();
        last = atomicAdd(&sc->clip_done, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    double mine = 0.0;
    for (unsigned int q = threadIdx.x; q < gridDim.x; q += kThreads) mine += __ldcg(&sc->clip_part[q]);
    const double total = reduce_t(tmp).Sum(mine); /* tmp is free again: a barrier came after the first Sum */
    if (threadIdx.x == 0) {
        sc->scale = dgc_rule_clip_scale(total, clip_norm, nranks);
        sc->clip_done = 0;
    }
}

/* One 8-bit pass of a radix select. Keys (|value| bits, or ~index among the
 * values equal to match: by_index) whose fixed digits (mask) match prefix
 * are counted by their digit at shift; equal digits within a warp are
 * merged first (match_any), since the leading digits of similar magnitudes
 * collide. The last block to finish picks the digit holding the want-th
 * largest and narrows prefix for the next pass; after the fourth, the key
 * itself is known and the results are written. */
__global__ void __launch_bounds__(kThreads) select_pass(select_job *job, int pass, fresh_src src) {
    if (!job->active) return;
    typedef cub::BlockScan<unsigned long long, kThreads> scan_t;
    __shared__ unsigned int h[256];
    __shared__ typename scan_t::TempStorage ts;
    __shared__ bool last;
    const unsigned int lane = lane_id();
    h[threadIdx.x] = 0;
    __syncthreads();
    const unsigned int shift = 24u - 8u * (unsigned)pass;
    const unsigned int prefix = job->prefix, mask = job->mask, by_index = job->by_index, match = job->match;
    const float *vals = job->vals;
    const unsigned int fresh = job->fresh;
    const float scale = fresh != FRESH_NONE ? fresh_scale(src) : 1.0f;
    const uint32_t *idx = job->idx;
    const uint64_t count = job->count;
    const uint64_t stride = (uint64_t)gridDim.x * kThreads;
    /* The loop bound is the warp's, so that every lane reaches the ballot. */
    for (uint64_t base = blockIdx.x * (uint64_t)kThreads + (threadIdx.x & ~31u); base < count; base += stride) {
        const uint64_t i = base + lane;
        bool in = false;
        unsigned int digit = 0;
        if (i < count) {
            const unsigned int vkey = abs_key(job_value(vals, fresh, src, i, scale));
            /* By index: the largest ~index is the smallest index. */
            const unsigned int key = by_index ? ~idx[i] : vkey;
            in = (!by_index || vkey == match) && (key & mask) == prefix;
            digit = (key >> shift) & 255u;
        }
        const unsigned int act = __ballot_sync(kFullMask, in);
        if (in) {
            const unsigned int peers = __match_any_sync(act, digit);
            if (lane == (unsigned)(__ffs(peers) - 1)) atomicAdd(&h[digit], (unsigned)__popc(peers));
        }
    }
    __syncthreads();
    if (h[threadIdx.x]) atomicAdd(&job->hist[threadIdx.x], h[threadIdx.x]);
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(&job->done, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();

    /* Thread t looks at digit dd = 255 - t, so an inclusive scan gives the
     * number of keys with a digit >= dd. */
    const unsigned int dd = 255u - threadIdx.x;
    const unsigned long long c = __ldcg(&job->hist[dd]);
    const unsigned long long want = job->want;
    unsigned long long incl;
    scan_t(ts).InclusiveSum(c, incl);
    const unsigned long long excl = incl - c; /* keys with a digit > dd */
    /* Exactly one digit holds the want-th largest when want <= the total;
     * the second test keeps the job defined if it ever were not. */
    const bool chosen = (excl < want && want <= incl) || (dd == 0 && want > incl);
    __syncthreads(); /* every thread has read want and hist */
    job->hist[dd] = 0;
    if (threadIdx.x == 0) job->done = 0;
    if (!chosen) return;
    const unsigned long long w = want > incl ? c : want - excl; /* rank among the keys with digit dd */
    const unsigned int p = prefix | (dd << shift);
    job->want = w;
    job->prefix = p;
    job->mask = mask | (255u << shift);
    if (pass == 3) {
        job->tbits = p;
        job->cnt_gt = job->want0 - w;
        /* t = 0 takes no ties: zero is never sent (dgc_rule_selected). */
        const unsigned long long take = p ? w : 0;
        job->ties_take = take;
        job->nsel = job->want0 - w + take;
        job->ties_all = take == 0 || take == c;
    }
}

template <int DT>
void clip_launch(const void *g, uint64_t n, scratch *sc, const dgc_step_params *p, cudaStream_t st) {
    clip_kernel<DT><<<kClipBlocks, kThreads, 0, st>>>(g, n, sc, p->clip_norm, p->nranks);
}

} // namespace

cudaError_t launch_clip(dgc_gpu_state *s, const void *g, dgc_gpu_dtype dtype, const dgc_step_params *p,
                        cudaStream_t st) {
    const uint64_t n = s->shape.n;
    switch (dtype) {
    case DGC_GPU_F16: clip_launch<DGC_GPU_F16>(g, n, s->sc, p, st); break;
    case DGC_GPU_BF16: clip_launch<DGC_GPU_BF16>(g, n, s->sc, p, st); break;
    default: clip_launch<DGC_GPU_F32>(g, n, s->sc, p, st); break;
    }
    return cudaGetLastError();
}

cudaError_t launch_select(dgc_gpu_state *s, select_job *job, uint64_t max_count, const fresh_src &src,
                          cudaStream_t st) {
    const unsigned int grid = grid_for(max_count, s->sms, 4);
    for (int pass = 0; pass < 4; pass++) {
        select_pass<<<grid, kThreads, 0, st>>>(job, pass, src);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

} // namespace dgc_cuda

namespace dgc_cuda {

cudaError_t preload_sample_select(void) {
    const void *const kernels[] = {
        (const void *)clip_kernel<DGC_GPU_F32>,
        (const void *)clip_kernel<DGC_GPU_F16>,
        (const void *)clip_kernel<DGC_GPU_BF16>,
        (const void *)select_pass,
    };
    return preload(kernels, sizeof kernels / sizeof kernels[0]);
}

} // namespace dgc_cuda
