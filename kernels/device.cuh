/* Device helpers the kernels share: the caller's element types, warp-level
 * slot reservation, the radix key of a value. Everything here is inline;
 * nothing is exported. */
#ifndef DGCSHIM_KERNELS_DEVICE_CUH
#define DGCSHIM_KERNELS_DEVICE_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "internal.cuh"

namespace dgc_cuda {

/* The caller's element type as a template parameter. Conversions to fp32 are
 * exact; the host engine is fed the same fp32 values. */
template <int DT> struct elem;
template <> struct elem<DGC_GPU_F32> {
    typedef float type;
    static __device__ __forceinline__ float load(const void *p, uint64_t i) { return static_cast<const float *>(p)[i]; }
    /* Four elements from element 4*i4 (the buffer is 16-byte aligned). */
    static __device__ __forceinline__ float4 load4(const void *p, uint64_t i4) {
        return static_cast<const float4 *>(p)[i4];
    }
    static __device__ __forceinline__ void store(void *p, uint64_t i, float x) { static_cast<float *>(p)[i] = x; }
    static __device__ __forceinline__ void store_nan(void *p, uint64_t i) {
        static_cast<uint32_t *>(p)[i] = 0x7fc00000u; /* the host's __builtin_nanf("") */
    }
    static constexpr uint32_t nan_bits = 0x7fc00000u;
    static constexpr size_t align4 = 16; /* alignment load4 needs */
};
template <> struct elem<DGC_GPU_F16> {
    typedef __half type;
    static __device__ __forceinline__ float load(const void *p, uint64_t i) {
        return __half2float(static_cast<const __half *>(p)[i]);
    }
    static __device__ __forceinline__ float4 load4(const void *p, uint64_t i4) {
        const uint2 raw = static_cast<const uint2 *>(p)[i4];
        const __half2 a = *reinterpret_cast<const __half2 *>(&raw.x);
        const __half2 b = *reinterpret_cast<const __half2 *>(&raw.y);
        return make_float4(__low2float(a), __high2float(a), __low2float(b), __high2float(b));
    }
    /* Round to nearest, as a framework's own conversion does. */
    static __device__ __forceinline__ void store(void *p, uint64_t i, float x) {
        static_cast<__half *>(p)[i] = __float2half_rn(x);
    }
    static __device__ __forceinline__ void store_nan(void *p, uint64_t i) {
        static_cast<uint16_t *>(p)[i] = 0x7e00u;
    }
    static constexpr uint32_t nan_bits = 0x7e00u;
    static constexpr size_t align4 = 8;
};
template <> struct elem<DGC_GPU_BF16> {
    typedef __nv_bfloat16 type;
    static __device__ __forceinline__ float load(const void *p, uint64_t i) {
        return __bfloat162float(static_cast<const __nv_bfloat16 *>(p)[i]);
    }
    static __device__ __forceinline__ float4 load4(const void *p, uint64_t i4) {
        const uint2 raw = static_cast<const uint2 *>(p)[i4];
        const __nv_bfloat162 a = *reinterpret_cast<const __nv_bfloat162 *>(&raw.x);
        const __nv_bfloat162 b = *reinterpret_cast<const __nv_bfloat162 *>(&raw.y);
        return make_float4(__low2float(a), __high2float(a), __low2float(b), __high2float(b));
    }
    static __device__ __forceinline__ void store(void *p, uint64_t i, float x) {
        static_cast<__nv_bfloat16 *>(p)[i] = __float2bfloat16_rn(x);
    }
    static __device__ __forceinline__ void store_nan(void *p, uint64_t i) {
        static_cast<uint16_t *>(p)[i] = 0x7fc0u;
    }
    static constexpr uint32_t nan_bits = 0x7fc0u;
    static constexpr size_t align4 = 8;
};

/* The radix key of a value: the bits of |x|. For x >= 0 (and NaN read as
 * larger than Inf) the unsigned order of keys is the order of |x|. */
__device__ __forceinline__ unsigned int abs_key(float x) { return __float_as_uint(x) & 0x7fffffffu; }

__device__ __forceinline__ unsigned int lane_id() { return threadIdx.x & 31u; }

/* Reserves cnt consecutive slots for this lane in a list filled through
 * *counter, with one atomic for the whole warp (candidates are sparse, but a
 * dense run of them must not cost an atomic each). Call from all 32 lanes.
 * Returns the lane's first slot. */
__device__ __forceinline__ unsigned long long warp_reserve(unsigned long long *counter, unsigned int cnt) {
    const unsigned int lane = lane_id();
    unsigned int incl = cnt;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        const unsigned int y = __shfl_up_sync(kFullMask, incl, d);
        if (lane >= (unsigned)d) incl += y;
    }
    unsigned long long base = 0;
    if (lane == 31 && incl != 0) base = atomicAdd(counter, (unsigned long long)incl);
    base = __shfl_sync(kFullMask, base, 31);
    return base + (incl - cnt);
}

/* The committed and the spare half of a [2][n] array; n 0 (a single copy,
 * internal.cuh): the one array, both. */
__device__ __forceinline__ const float *committed(const float *a2, int cur, uint64_t n) { return a2 + (cur ? n : 0); }
__device__ __forceinline__ float *spare(float *a2, int cur, uint64_t n) { return a2 + (cur ? 0 : n); }

} // namespace dgc_cuda

#endif
