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

/* The decoded fp32 shard into the output: divided by the ranks when
 * averaging (as the flat path's decode divides), in the buffer's type,
 * rounded once (nearest even). out may be sum (fp32). */
template <int DT>
__global__ void __launch_bounds__(kThreads) node_finish_kernel(const float *sum, void *out, uint64_t len, float nr) {
    for (uint64_t i = blockIdx.x * (uint64_t)kThreads + threadIdx.x; i < len; i += (uint64_t)gridDim.x * kThreads) {
        float x = sum[i];
        if (nr != 1.0f) x = x / nr;
        elem<DT>::store(out, i, x);
    }
}

/* The report's failure counts, read in stream order (mapped memory that
 * this stream's kernels write). */
__device__ __forceinline__ uint64_t failures(const dgc_gpu_report *rep) {
    const volatile dgc_gpu_report *r = rep;
    return r->failed + r->bad_steps;
}

__global__ void node_watch_kernel(const dgc_gpu_report *rep, uint64_t *words) {
    words[0] = rep ? failures(rep) : 0;
}

__global__ void node_judge_kernel(const dgc_gpu_report *rep, uint64_t *words, int host_failed) {
    words[2] = host_failed || (rep && failures(rep) != words[0]) ? 1 : 0;
    words[3] = 0;
}

/* A failed call everywhere: NaN, as a flat call's failed step. */
__global__ void __launch_bounds__(kThreads) node_fail_kernel(float *sum, uint64_t len, const uint64_t *words,
                                                             dgc_gpu_report *rep) {
    if (!words[3]) return;
    for (uint64_t i = blockIdx.x * (uint64_t)kThreads + threadIdx.x; i < len; i += (uint64_t)gridDim.x * kThreads)
        sum[i] = __int_as_float(0x7fc00000);
    if (blockIdx.x == 0 && threadIdx.x == 0 && !words[2] && rep) {
        volatile dgc_gpu_report *r = rep;
        r->node_failed = r->node_failed + 1;
    }
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

int dgc_gpu_node_finish(const float *sum, void *out, dgc_gpu_dtype dtype, uint64_t len, int divisor,
                        dgc_cuda_stream stream, char *err, size_t errlen) {
    if (len && (!sum || !out)) return fail_msg(err, errlen, "dgc_gpu_node_finish: no sum or no output");
    if (divisor < 1) return fail_msg(err, errlen, "dgc_gpu_node_finish: a divisor below 1");
    if (len == 0 || (dtype == DGC_GPU_F32 && divisor == 1 && (const void *)sum == out)) return 0; /* nothing to do */
    cudaStream_t st = (cudaStream_t)stream;
    const unsigned int grid = grid_for(len, kNodeSumBlocks, 1);
    const float nr = (float)divisor;
    switch (dtype) {
    case DGC_GPU_F16: node_finish_kernel<DGC_GPU_F16><<<grid, kThreads, 0, st>>>(sum, out, len, nr); break;
    case DGC_GPU_BF16: node_finish_kernel<DGC_GPU_BF16><<<grid, kThreads, 0, st>>>(sum, out, len, nr); break;
    default: node_finish_kernel<DGC_GPU_F32><<<grid, kThreads, 0, st>>>(sum, out, len, nr); break;
    }
    CHECK("launching the node's shard into the output");
    return 0;
}

int dgc_gpu_node_watch(const dgc_gpu_report *report, uint64_t *words, dgc_cuda_stream stream, char *err,
                       size_t errlen) {
    if (!words) return fail_msg(err, errlen, "dgc_gpu_node_watch: no words");
    node_watch_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(report, words);
    CHECK("launching the node's watch on its shard");
    return 0;
}

int dgc_gpu_node_judge(const dgc_gpu_report *report, uint64_t *words, int host_failed, dgc_cuda_stream stream,
                       char *err, size_t errlen) {
    if (!words) return fail_msg(err, errlen, "dgc_gpu_node_judge: no words");
    node_judge_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(report, words, host_failed);
    CHECK("launching the node's verdict on its shard");
    return 0;
}

int dgc_gpu_node_fail(float *sum, uint64_t len, const uint64_t *words, dgc_gpu_report *report,
                      dgc_cuda_stream stream, char *err, size_t errlen) {
    if (!words || (len && !sum)) return fail_msg(err, errlen, "dgc_gpu_node_fail: no words or no sum");
    const unsigned int grid = grid_for(len ? len : 1, kNodeSumBlocks, 1);
    node_fail_kernel<<<grid, kThreads, 0, (cudaStream_t)stream>>>(sum, len, words, report);
    CHECK("launching the node's failure mark");
    return 0;
}

namespace dgc_cuda {

cudaError_t preload_node(void) {
    const void *const kernels[] = {(const void *)node_poison_kernel, (const void *)node_sum_kernel<DGC_GPU_F32>,
                                   (const void *)node_sum_kernel<DGC_GPU_F16>,
                                   (const void *)node_sum_kernel<DGC_GPU_BF16>,
                                   (const void *)node_finish_kernel<DGC_GPU_F32>,
                                   (const void *)node_finish_kernel<DGC_GPU_F16>,
                                   (const void *)node_finish_kernel<DGC_GPU_BF16>,
                                   (const void *)node_watch_kernel, (const void *)node_judge_kernel,
                                   (const void *)node_fail_kernel};
    return preload(kernels, sizeof kernels / sizeof kernels[0]);
}

} // namespace dgc_cuda
