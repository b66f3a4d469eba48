/* The node layout's exact sum on the device (the NCCL path's node
 * transport): the L pieces of this rank's shard, one from each local rank,
 * added in local-rank order, ((p_0 + p_1) + p_2) + ..., in fp32, 16-bit
 * pieces widened first. That is the order of the MPI path's node sum
 * (shim/mpi/node.c), whatever NCCL's own reductions would do, so that the
 * two paths' shards, and from them their compressions, are the same bits.
 * Additions only: --fmad=false has nothing to fuse here, and the host's
 * float additions round as the device's do. */
#include <math.h>

#include "device.cuh"

using namespace dgc_cuda;

namespace {

template <int DT>
__global__ void __launch_bounds__(kThreads) node_sum_kernel(const void *pieces, int L, uint64_t len, float *sum,
                                                            unsigned int *nonfinite) {
    bool bad = false;
    for (uint64_t i = blockIdx.x * (uint64_t)kThreads + threadIdx.x; i < len; i += (uint64_t)gridDim.x * kThreads) {
        float s = elem<DT>::load(pieces, i);
        for (int l = 1; l < L; l++) s += elem<DT>::load(pieces, (uint64_t)l * len + i);
        sum[i] = s; /* after every read of element i: sum may be piece 0 */
        bad |= !isfinite(s);
    }
    if (bad) *nonfinite = 1u; /* every writer writes 1: no order to keep */
}

/* After the node's agreement (the flag all-reduced over its ranks): a
 * shard whose node held Inf or NaN anywhere starts with NaN, so that every
 * cross exchange, and so every rank, skips the step whole. */
__global__ void node_poison_kernel(float *sum, const unsigned int *flag) {
    if (*flag) sum[0] = __int_as_float(0x7fc00000); /* the host's __builtin_nanf("") */
}

/* Grid-stride blocks: a fixed cap, since no state (and no multiprocessor
 * count) goes with this call; enough to fill any current device. */
constexpr int kNodeSumBlocks = 4096;

} // namespace

int dgc_gpu_node_sum(const void *pieces, dgc_gpu_dtype dtype, int L, uint64_t len, float *sum,
                     unsigned int *nonfinite, dgc_cuda_stream stream, char *err, size_t errlen) {
    if (L < 1 || !nonfinite || (len && (!pieces || !sum)))
        return fail_msg(err, errlen, "dgc_gpu_node_sum: no pieces, no sum or no flag");
    if (len == 0) return 0;
    cudaStream_t st = (cudaStream_t)stream;
    const unsigned int grid = grid_for(len, kNodeSumBlocks, 1);
    switch (dtype) {
    case DGC_GPU_F16: node_sum_kernel<DGC_GPU_F16><<<grid, kThreads, 0, st>>>(pieces, L, len, sum, nonfinite); break;
    case DGC_GPU_BF16: node_sum_kernel<DGC_GPU_BF16><<<grid, kThreads, 0, st>>>(pieces, L, len, sum, nonfinite); break;
    default: node_sum_kernel<DGC_GPU_F32><<<grid, kThreads, 0, st>>>(pieces, L, len, sum, nonfinite); break;
    }
    CHECK("launching the node's sum");
    return 0;
}

int dgc_gpu_node_poison(float *sum, const unsigned int *flag, dgc_cuda_stream stream, char *err, size_t errlen) {
    node_poison_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(sum, flag);
    CHECK("launching the node's non-finite mark");
    return 0;
}

namespace dgc_cuda {

cudaError_t preload_node(void) {
    const void *const kernels[] = {(const void *)node_poison_kernel, (const void *)node_sum_kernel<DGC_GPU_F32>,
                                   (const void *)node_sum_kernel<DGC_GPU_F16>,
                                   (const void *)node_sum_kernel<DGC_GPU_BF16>};
    return preload(kernels, sizeof kernels / sizeof kernels[0]);
}

} // namespace dgc_cuda
