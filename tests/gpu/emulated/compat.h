/* The emulated device's compatibility layer: force-included (-include) into
 * every CUDA translation unit that chipStar compiles for the emulated tier
 * (DGC_CUDA=EMULATED), never into a real build. chipStar v1.2.1 turns CUDA
 * into SPIR-V, which Intel's OpenCL CPU runtime runs; that stack lacks some
 * CUDA facilities and gets a few others wrong. Each block below covers one
 * defect, under the name that tests/gpu/emulated/defects.sh checks it by:
 * when a newer chipStar fixes one, the self-test says GONE and the block can
 * go. The project's kernels do not change for the emulator.
 *
 * The replacements are written to give CUDA's documented results for the
 * kernels' use (1-D blocks of whole warps, lanes threadIdx.x & 31), not to
 * be general. */
#pragma once
#define DGC_EMU_COMPAT 1 /* defects/runtime.cu checks the workarounds when set */

#include <cuda_runtime.h>
#include <stdint.h>

#include <cmath>
#include <math.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

/* ---- ballot_crashes_jit: __ballot_sync (sub_group_ballot) aborts the Intel
 * CPU JIT ("Scalar sub_group_ballot execution breaks subgroup semantics").
 * A ballot from five xor-shuffles instead: each lane ors in the others'
 * bits. */
__device__ __forceinline__ unsigned int dgc_emu_ballot_sync(unsigned int mask, int pred) {
    unsigned int bits = pred ? 1u << (threadIdx.x & 31u) : 0u;
    for (int d = 16; d > 0; d >>= 1) bits |= (unsigned int)__shfl_xor_sync(0xffffffffu, (int)bits, d);
    return bits & mask;
}
#define __ballot_sync(mask, pred) dgc_emu_ballot_sync((mask), (pred))

/* ---- missing_any_sync: no __any_sync. */
__device__ __forceinline__ bool dgc_emu_any_sync(unsigned int mask, int pred) {
    return dgc_emu_ballot_sync(mask, pred) != 0u;
}
#define __any_sync(mask, pred) dgc_emu_any_sync((mask), (pred))

/* ---- missing_match_any_sync: no __match_any_sync. The lanes holding the
 * same value as this one, by a shuffle from each lane. */
__device__ __forceinline__ unsigned int dgc_emu_match_any_sync(unsigned int mask, unsigned int value) {
    unsigned int same = 0;
    for (int lane = 0; lane < 32; lane++)
        if ((unsigned int)__shfl_sync(0xffffffffu, (int)value, lane) == value) same |= 1u << lane;
    return same & mask;
}
#define __match_any_sync(mask, value) dgc_emu_match_any_sync((mask), (value))

/* ---- missing_ldcg_plain: __ldcg exists for the half types only. A load
 * that bypasses this thread's caches: volatile is as strong on a CPU. In the
 * unnamed namespace, beside chipStar's half overloads (spirv_hip_fp16.h puts
 * them there), so that a call from unnamed-namespace code sees all of them. */
namespace {
template <typename T> __device__ __forceinline__ T __ldcg(const T *p) { return *(const volatile T *)p; }
} // namespace

/* ---- missing_bf16_rn: no __float2bfloat16_rn; chipStar's __float2bfloat16
 * rounds to nearest even, which is what _rn names. */
__host__ __device__ inline __nv_bfloat16 __float2bfloat16_rn(float x) { return __float2bfloat16(x); }

/* ---- missing_bf16_raw: no __nv_bfloat16_raw, the bits of a bf16. */
struct __nv_bfloat16_raw {
    unsigned short x;
    __host__ __device__ __nv_bfloat16_raw() : x(0) {}
    __host__ __device__ __nv_bfloat16_raw(__hip_bfloat16 b) : x(b.data) {}
    __host__ __device__ operator __hip_bfloat16() const {
        __hip_bfloat16 b;
        b.data = x;
        return b;
    }
};

/* ---- cuda_arch_in_host_pass: chipStar defines __CUDA_ARCH__ (200) in the
 * host pass too, so the `#ifdef __CUDA_ARCH__` branch of a __host__
 * __device__ function (compact_rules.h) reaches device intrinsics from host
 * code. Host versions of those intrinsics, with CUDA's results. */
__host__ inline int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
__host__ inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
__host__ inline int __ffsll(long long x) { return __builtin_ffsll(x); }

/* ---- atomic_minmax_u32, atomic_minmax_u64: unsigned atomicMin/atomicMax
 * compare as signed (atomicMin(&x = ~0, 5) leaves ~0). Compare-and-swap
 * loops for the unsigned ones; the signed ones are right and pass through. */
template <typename T> __device__ inline T dgc_emu_atomic_extreme(T *a, T v, bool want_min) {
    T old = *(volatile T *)a;
    for (;;) {
        if (want_min ? old <= v : old >= v) return old;
        const T seen = atomicCAS(a, old, v);
        if (seen == old) return old;
        old = seen;
    }
}
__device__ inline int dgc_emu_atomicMin(int *a, int v) { return atomicMin(a, v); }
__device__ inline int dgc_emu_atomicMax(int *a, int v) { return atomicMax(a, v); }
__device__ inline unsigned int dgc_emu_atomicMin(unsigned int *a, unsigned int v) {
    return dgc_emu_atomic_extreme(a, v, true);
}
__device__ inline unsigned int dgc_emu_atomicMax(unsigned int *a, unsigned int v) {
    return dgc_emu_atomic_extreme(a, v, false);
}
__device__ inline unsigned long long dgc_emu_atomicMin(unsigned long long *a, unsigned long long v) {
    return dgc_emu_atomic_extreme(a, v, true);
}
__device__ inline unsigned long long dgc_emu_atomicMax(unsigned long long *a, unsigned long long v) {
    return dgc_emu_atomic_extreme(a, v, false);
}
#define atomicMin dgc_emu_atomicMin
#define atomicMax dgc_emu_atomicMax

/* ---- isfinite: device isfinite(float) is wrong (isfinite(1.0f) == 0). By
 * the exponent field instead, in host and device code alike. */
__host__ __device__ inline bool dgc_emu_isfinite(float x) {
    return (__builtin_bit_cast(uint32_t, x) & 0x7f800000u) != 0x7f800000u;
}
__host__ __device__ inline bool dgc_emu_isfinite(double x) {
    return (__builtin_bit_cast(uint64_t, x) & 0x7ff0000000000000ull) != 0x7ff0000000000000ull;
}
namespace std {
using ::dgc_emu_isfinite;
}
#define isfinite(x) dgc_emu_isfinite(x)

/* ---- bf16_multiple_definitions: chipStar's spirv_hip_bf16.h defines
 * non-inline functions, so every object that includes cuda_bf16.h holds a
 * copy; nothing here can fix a header, so the emulated tier links with
 * --allow-multiple-definition (cmake/emulated.cmake). The copies are the
 * same code. */

/* ---- missing_cub: chipStar has no CUB; tests/gpu/emulated/cub/ stands in
 * (its cub_standin.cuh says why that one). */
