/* Before the update pass: the clipping factor, the threshold sample, and the
 * radix select that turns a sample (or the candidates, or the whole buffer)
 * into an exact k-th largest.
 *
 * The sample is the host engine's (dgc_sample_plan_for, dgc_rule_run_start):
 * the same elements, the same updated values, so the want-th largest of it,
 * found exactly here as there, is the same threshold. Its values go into the
 * spare v array, which the update pass overwrites only after the threshold
 * is known (stream order): no memory of its own, whatever the sample ratio. */
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "device.cuh"
#include "dgcshim/update_rules.h"

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

/* One thread per (run, position in run). The value goes to position
 * r*DGC_SAMPLE_RUN + i when every run is full (dense), else the runs tile the
 * buffer (each its whole stratum) and the element's own index is its place:
 * either way the sample fills [0, count) of the spare v exactly. */
template <int DT, bool MOM, bool NEST>
__global__ void __launch_bounds__(kThreads)
    sample_kernel(const void *g, float *v2, const float *u2, uint64_t n, uint64_t ns, const scratch *sc, int clip,
                  float m, uint64_t runs, int whole, int dense, uint64_t step) {
    const int cur = sc->cur;
    const float *v = committed(v2, cur, ns);
    const float *u = MOM ? committed(u2, cur, ns) : nullptr;
    float *out = spare(v2, cur, ns);
    const float scale = clip ? sc->scale : 1.0f;
    const uint64_t total = runs * DGC_SAMPLE_RUN;
    for (uint64_t t = blockIdx.x * (uint64_t)kThreads + threadIdx.x; t < total; t += (uint64_t)gridDim.x * kThreads) {
        uint64_t len;
        const uint64_t r = t / DGC_SAMPLE_RUN, i = t % DGC_SAMPLE_RUN;
        const uint64_t start = dgc_rule_run_start(n, runs, r, whole, step, &len);
        if (i >= len) continue;
        const uint64_t e = start + i;
        const float gs = elem<DT>::load(g, e) * scale; /* as the host: times scale even when it is 1 */
        float add = gs;
        uint32_t ovf = 0; /* a sample's saturation is the update's to report */
        if (MOM) {
            float un;
            add = dgc_rule_momentum(u[e], gs, m, NEST, &un, &ovf);
        }
        out[dense ? t : e] = dgc_rule_sample_value(dgc_rule_accumulate(v[e], add, &ovf));
    }
}

/* One 8-bit pass of a radix select. Keys (|value| bits, or ~index among the
 * values equal to match: by_index) whose fixed digits (mask) match prefix
 * are counted by their digit at shift; equal digits within a warp are
 * merged first (match_any), since the leading digits of similar magnitudes
 * collide. The last block to finish picks the digit holding the want-th
 * largest and narrows prefix for the next pass; after the fourth, the key
 * itself is known and the results are written. */
__global__ void __launch_bounds__(kThreads) select_pass(select_job *job, int pass) {
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
    const uint32_t *idx = job->idx;
    const uint64_t count = job->count;
    const uint64_t stride = (uint64_t)gridDim.x * kThreads;
    /* The loop bound is the warp's, so that every lane reaches the ballot. */
    for (uint64_t base = blockIdx.x * (uint64_t)kThreads + (threadIdx.x & ~31u); base < count; base += stride) {
        const uint64_t i = base + lane;
        bool in = false;
        unsigned int digit = 0;
        if (i < count) {
            const unsigned int vkey = abs_key(vals[i]);
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

template <int DT>
void sample_launch(dgc_gpu_state *s, const void *g, const dgc_step_params *p, const dgc_sample_plan *sp,
                   cudaStream_t st) {
    const uint64_t n = s->shape.n, total = sp->runs * DGC_SAMPLE_RUN;
    const unsigned int grid = grid_for(total, s->sms, 8);
    const int clip = p->clip_norm > 0, dense = sp->count == total;
    if (!s->u2)
        sample_kernel<DT, false, false><<<grid, kThreads, 0, st>>>(g, s->v2, s->u2, n, s->ns, s->sc, clip, p->momentum,
                                                                   sp->runs, sp->whole, dense, p->step);
    else if (p->nesterov)
        sample_kernel<DT, true, true><<<grid, kThreads, 0, st>>>(g, s->v2, s->u2, n, s->ns, s->sc, clip, p->momentum,
                                                                 sp->runs, sp->whole, dense, p->step);
    else
        sample_kernel<DT, true, false><<<grid, kThreads, 0, st>>>(g, s->v2, s->u2, n, s->ns, s->sc, clip, p->momentum,
                                                                  sp->runs, sp->whole, dense, p->step);
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

cudaError_t launch_sample(dgc_gpu_state *s, const void *g, dgc_gpu_dtype dtype, const dgc_step_params *p,
                          const dgc_sample_plan *sp, cudaStream_t st) {
    switch (dtype) {
    case DGC_GPU_F16: sample_launch<DGC_GPU_F16>(s, g, p, sp, st); break;
    case DGC_GPU_BF16: sample_launch<DGC_GPU_BF16>(s, g, p, sp, st); break;
    default: sample_launch<DGC_GPU_F32>(s, g, p, sp, st); break;
    }
    return cudaGetLastError();
}

cudaError_t launch_select(dgc_gpu_state *s, select_job *job, uint64_t max_count, cudaStream_t st) {
    const unsigned int grid = grid_for(max_count, s->sms, 4);
    for (int pass = 0; pass < 4; pass++) {
        select_pass<<<grid, kThreads, 0, st>>>(job, pass);
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
        (const void *)sample_kernel<DGC_GPU_F32, false, false>,
        (const void *)sample_kernel<DGC_GPU_F32, true, true>,
        (const void *)sample_kernel<DGC_GPU_F32, true, false>,
        (const void *)sample_kernel<DGC_GPU_F16, false, false>,
        (const void *)sample_kernel<DGC_GPU_F16, true, true>,
        (const void *)sample_kernel<DGC_GPU_F16, true, false>,
        (const void *)sample_kernel<DGC_GPU_BF16, false, false>,
        (const void *)sample_kernel<DGC_GPU_BF16, true, true>,
        (const void *)sample_kernel<DGC_GPU_BF16, true, false>,
        (const void *)select_pass,
    };
    return preload(kernels, sizeof kernels / sizeof kernels[0]);
}

} // namespace dgc_cuda
