/* A stand-in for the four CUB facilities the kernels use, for the emulated
 * device only (chipStar has no CUB). It follows CUB's documented contract,
 * not its implementation, and is strict where that costs nothing, so that a
 * kernel leaning on more than the contract fails here as it could on a GPU:
 *
 *   BlockReduce::Sum         the sum in thread 0 only; every other thread
 *                            gets its own input back (CUB: "only valid in
 *                            thread 0")
 *   BlockScan::*Sum          per-thread results and the block's aggregate in
 *                            every thread; ExclusiveSum gives thread 0 zero
 *   DeviceRadixSort::SortPairs  a stable LSD sort of bits [begin, end) of the
 *                            keys, the values moved with them; flips each
 *                            DoubleBuffer's selector once per pass, so the
 *                            caller must read Current(), as CUB says; refuses
 *                            (cudaErrorInvalidValue) scratch smaller than it
 *                            asked for
 *   DeviceScan::InclusiveSum a prefix sum, the same scratch protocol
 *
 * Why a stand-in and not the hipCUB/rocPRIM ports: see docs/emulated-device.md
 * ("CUB on the emulated device"). Device-wide work runs in one thread of one
 * block: exact and race-free, and fast enough for the tests' sizes. */
#ifndef DGC_EMU_CUB_STANDIN_CUH
#define DGC_EMU_CUB_STANDIN_CUH

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include <type_traits>

namespace cub {

template <typename T> struct DoubleBuffer {
    T *d_buffers[2];
    int selector;
    __host__ __device__ DoubleBuffer() : selector(0) { d_buffers[0] = d_buffers[1] = nullptr; }
    __host__ __device__ DoubleBuffer(T *current, T *alternate) : selector(0) {
        d_buffers[0] = current;
        d_buffers[1] = alternate;
    }
    __host__ __device__ T *Current() { return d_buffers[selector]; }
    __host__ __device__ T *Alternate() { return d_buffers[selector ^ 1]; }
};

template <typename T, int Threads> class BlockReduce {
  public:
    struct TempStorage {
        T part[Threads];
    };
    __device__ explicit BlockReduce(TempStorage &s) : s_(s) {}
    __device__ T Sum(T x) {
        const unsigned int t = threadIdx.x;
        s_.part[t] = x;
        __syncthreads();
        for (unsigned int half = Threads / 2; half > 0; half >>= 1) {
            if (t < half) s_.part[t] = s_.part[t] + s_.part[t + half];
            __syncthreads();
        }
        return t == 0 ? s_.part[0] : x;
    }

  private:
    TempStorage &s_;
};

template <typename T, int Threads> class BlockScan {
  public:
    struct TempStorage {
        T in[Threads];
        T before[Threads]; /* the exclusive prefix of each thread */
        T total;
    };
    __device__ explicit BlockScan(TempStorage &s) : s_(s) {}
    __device__ void ExclusiveSum(T x, T &exclusive) {
        scan(x);
        exclusive = s_.before[threadIdx.x];
    }
    __device__ void ExclusiveSum(T x, T &exclusive, T &aggregate) {
        scan(x);
        exclusive = s_.before[threadIdx.x];
        aggregate = s_.total;
    }
    __device__ void InclusiveSum(T x, T &inclusive) {
        scan(x);
        inclusive = s_.before[threadIdx.x] + x;
    }
    __device__ void InclusiveSum(T x, T &inclusive, T &aggregate) {
        scan(x);
        inclusive = s_.before[threadIdx.x] + x;
        aggregate = s_.total;
    }

  private:
    __device__ void scan(T x) {
        s_.in[threadIdx.x] = x;
        __syncthreads();
        if (threadIdx.x == 0) {
            T acc = T(0);
            for (int t = 0; t < Threads; t++) {
                s_.before[t] = acc;
                acc = acc + s_.in[t];
            }
            s_.total = acc;
        }
        __syncthreads();
    }
    TempStorage &s_;
};

namespace standin {

/* What every device-wide call asks for: a caller that never allocates, or
 * passes less, is refused as CUB refuses it. */
constexpr size_t kScratchBytes = 256;

inline cudaError_t scratch(void *temp, size_t &bytes, bool *query) {
    *query = temp == nullptr;
    if (*query) {
        bytes = kScratchBytes;
        return cudaSuccess;
    }
    return bytes < kScratchBytes ? cudaErrorInvalidValue : cudaSuccess;
}

/* One stable counting-sort pass over the digit at shift (at most 8 bits). */
template <typename K, typename V>
__global__ void radix_pass(const K *keys, K *keys_out, const V *vals, V *vals_out, uint64_t n, int shift, int bits) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    uint64_t start[256];
    const unsigned int digits = 1u << bits, mask = digits - 1u;
    for (unsigned int d = 0; d < digits; d++) start[d] = 0;
    for (uint64_t i = 0; i < n; i++) start[(unsigned int)(keys[i] >> shift) & mask]++;
    uint64_t at = 0;
    for (unsigned int d = 0; d < digits; d++) {
        const uint64_t c = start[d];
        start[d] = at;
        at += c;
    }
    for (uint64_t i = 0; i < n; i++) {
        const uint64_t to = start[(unsigned int)(keys[i] >> shift) & mask]++;
        keys_out[to] = keys[i];
        vals_out[to] = vals[i];
    }
}

template <typename In, typename Out> __global__ void inclusive_sum(In in, Out out, uint64_t n) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    typename std::remove_cv<typename std::remove_reference<decltype(out[0])>::type>::type acc = 0;
    for (uint64_t i = 0; i < n; i++) {
        acc = acc + in[i];
        out[i] = acc;
    }
}

} // namespace standin

struct DeviceRadixSort {
    template <typename K, typename V, typename Count>
    static cudaError_t SortPairs(void *temp, size_t &bytes, DoubleBuffer<K> &keys, DoubleBuffer<V> &vals, Count n,
                                 int begin_bit = 0, int end_bit = sizeof(K) * 8, cudaStream_t stream = 0) {
        bool query;
        const cudaError_t e = standin::scratch(temp, bytes, &query);
        if (e != cudaSuccess || query) return e;
        for (int b = begin_bit; b < end_bit; b += 8) {
            const int bits = end_bit - b < 8 ? end_bit - b : 8;
            if (n > 0)
                standin::radix_pass<K, V><<<1, 1, 0, stream>>>(keys.Current(), keys.Alternate(), vals.Current(),
                                                               vals.Alternate(), (uint64_t)n, b, bits);
            keys.selector ^= 1;
            vals.selector ^= 1;
        }
        return cudaGetLastError();
    }
};

struct DeviceScan {
    template <typename In, typename Out, typename Count>
    static cudaError_t InclusiveSum(void *temp, size_t &bytes, In in, Out out, Count n, cudaStream_t stream = 0) {
        bool query;
        const cudaError_t e = standin::scratch(temp, bytes, &query);
        if (e != cudaSuccess || query) return e;
        if (n > 0) standin::inclusive_sum<In, Out><<<1, 1, 0, stream>>>(in, out, (uint64_t)n);
        return cudaGetLastError();
    }
};

} // namespace cub

#endif
