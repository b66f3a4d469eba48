/* A single copy's commit (internal.cuh, single_copy): once the
 * decode knows the step goes through, the compression's update is done again
 * from its g and the committed u and v, and written over them. The masking
 * of the sent indices follows (decode.cu), as it does on the spares of a
 * state with two halves.
 *
 * Why again rather than kept: a second copy of u and v (8 bytes an element)
 * is what a state would otherwise hold so that a failed step changes
 * nothing. Here the compression only reads, and a failed step (a bad
 * payload, a dropped rank, a call that never reaches its decode) leaves u
 * and v as they were. The same rules on the same inputs give the same bits
 * (fresh.cuh), so the residual the step keeps is the one it selected from.
 *
 * An in-place fp32 call's output is g: the update pass left it, and it is
 * zeroed here, after the read, whatever the outcome (a bad step leaves zero,
 * a dropped one is filled with NaN next, a good one is summed into it). */
#include "fresh.cuh"

using namespace dgc_cuda;

namespace {

template <int DT, bool MOM, bool NEST>
__global__ void __launch_bounds__(kThreads) commit_kernel(const void *g, float *v, float *u, float *zero, uint64_t n,
                                                          float m, int clip, const scratch *sc) {
    const bool write = sc->dec_mode == DEC_OK && !sc->nonfinite;
    if (!write && !zero) return;
    const float scale = clip ? sc->scale : 1.0f;
    for (uint64_t i = blockIdx.x * (uint64_t)kThreads + threadIdx.x; i < n; i += (uint64_t)gridDim.x * kThreads) {
        if (write) {
            uint32_t bad = 0, ovf = 0; /* the update pass reported both */
            float un = 0.0f;
            const float vn = update_one<MOM, NEST>(elem<DT>::load(g, i), MOM ? u[i] : 0.0f, v[i], scale, m, &un, &bad,
                                                   &ovf);
            v[i] = vn;
            if (MOM) u[i] = un;
        }
        if (zero) zero[i] = 0.0f; /* after this thread's read of g[i]: zero may be g */
    }
}

template <int DT>
void commit_dispatch(const dgc_gpu_state *s, unsigned int grid, cudaStream_t st) {
    const fresh_src &f = s->upd;
    const uint64_t n = s->shape.n;
    float *v = s->v2, *u = s->u2, *zero = static_cast<float *>(s->upd_zero);
    if (!u)
        commit_kernel<DT, false, false><<<grid, kThreads, 0, st>>>(f.g, v, nullptr, zero, n, f.m, f.clip, s->sc);
    else if (f.nesterov)
        commit_kernel<DT, true, true><<<grid, kThreads, 0, st>>>(f.g, v, u, zero, n, f.m, f.clip, s->sc);
    else
        commit_kernel<DT, true, false><<<grid, kThreads, 0, st>>>(f.g, v, u, zero, n, f.m, f.clip, s->sc);
}

} // namespace

namespace dgc_cuda {

int launch_commit(dgc_gpu_state *s, cudaStream_t st, char *err, size_t errlen) {
    if (!s->upd.g) return 0; /* a decode with no compression before it (a decoder's test): no update to commit */
    const unsigned int grid = grid_for(s->shape.n, s->sms, 8);
    switch (s->upd.dtype) {
    case DGC_GPU_F16: commit_dispatch<DGC_GPU_F16>(s, grid, st); break;
    case DGC_GPU_BF16: commit_dispatch<DGC_GPU_BF16>(s, grid, st); break;
    default: commit_dispatch<DGC_GPU_F32>(s, grid, st); break;
    }
    CHECK("launching the commit of the update");
    return 0;
}

cudaError_t preload_commit(void) {
    const void *const kernels[] = {
        (const void *)commit_kernel<DGC_GPU_F32, false, false>, (const void *)commit_kernel<DGC_GPU_F32, true, true>,
        (const void *)commit_kernel<DGC_GPU_F32, true, false>,  (const void *)commit_kernel<DGC_GPU_F16, false, false>,
        (const void *)commit_kernel<DGC_GPU_F16, true, true>,   (const void *)commit_kernel<DGC_GPU_F16, true, false>,
        (const void *)commit_kernel<DGC_GPU_BF16, false, false>, (const void *)commit_kernel<DGC_GPU_BF16, true, true>,
        (const void *)commit_kernel<DGC_GPU_BF16, true, false>,
    };
    return preload(kernels, sizeof kernels / sizeof kernels[0]);
}

} // namespace dgc_cuda
