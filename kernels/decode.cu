/* dgc_gpu_decode and the stateless variants: the host's dgc_wire_decode,
 * dgc_wire_subtract and dgc_commit on the device, decided on the device.
 *
 *   validate      every header and slot of the gathered payloads; the
 *                 first fault, by (rank, slot), kept by an atomicMin on a key
 *   finalize      one thread: the outcome (bad / non-finite / ok), the report
 *   nan           out = NaN when some rank was non-finite or failed
 *   add           out (or the accumulator) += every rank's pairs, in rank
 *                 order, one launch for all ranks (sum_ranks: a block owns
 *                 a range of elements and takes the ranks in turn); a
 *                 rank's indices are unique (checked: strictly increasing),
 *                 so no two threads meet and no floating-point atomic is
 *                 needed (invariant 3)
 *   sub           momentum compensation: += (-m) * the kept previous pairs,
 *                 the same way (or the kept dense vector, after a
 *                 dense-transport step)
 *   commit        a single copy only (commit.cu), right after the decision,
 *                 before out (which may be g) is written: u, v updated
 *                 again and written
 *   average / convert
 *                 (a 16-bit buffer on a state without an fp32 accumulator:
 *                 add, sub, average and convert in one launch, sum16,
 *                 range by range in shared memory)
 *   mask          v = 0 (and u = 0) at this rank's own sent indices, in the
 *                 spares (or the single copy)
 *   finish        the spares become the committed state; the gathered
 *                 payloads are kept for the next compensation
 * Everything from the compensation on is launch_decode_tail, which the
 * dense transport's decode (dense.cu) shares.
 * Padding slots (index 0, +0.0f) are skipped: the host adds them, but
 * x + 0.0f == x bit for bit for every x a sum of non-zero values can hold
 * (only -0.0f would change, and a sum starting at +0.0f never is -0.0f). */
#include <stdio.h>

#include "device.cuh"
#include "headers.cuh"

using namespace dgc_cuda;

namespace {

constexpr int kSlotBits = 40;

__device__ __forceinline__ size_t dgc_wire_bytes_device(uint64_t k) { return sizeof(dgc_wire_header) + 8 * (size_t)k; }
__device__ __forceinline__ const char *payload_at(const char *base, int r, uint64_t k) {
    return base + (size_t)r * dgc_wire_bytes_device(k);
}
__device__ __forceinline__ const uint32_t *indices_of(const char *pl) {
    return reinterpret_cast<const uint32_t *>(pl + sizeof(dgc_wire_header));
}
__device__ __forceinline__ const float *values_of(const char *pl, uint64_t k) {
    return reinterpret_cast<const float *>(pl + sizeof(dgc_wire_header) + 4 * k);
}
__device__ __forceinline__ bool is_padding(uint32_t i, float v) { return i == 0 && __float_as_uint(v) == 0; }

/* DGC_GPU_BAD_INDEX / _ORDER for slot j, 0 when sound: padding, or a real
 * pair with an index below n, above the previous slot's, which is real. The
 * first slot alone may be (0, +0.0) and real: a value at index 0 that
 * rounded to +0 for the wire, with pairs after it (adding it changes
 * nothing, so the sum skips it either way); padding later fails the order
 * test at the slot after it. */
__device__ unsigned int slot_fault(const uint32_t *idx, const float *val, uint64_t j, uint64_t n,
                                   unsigned long long *value) {
    const uint32_t i = idx[j];
    if (is_padding(i, val[j])) return 0;
    *value = i;
    if (i >= n) return DGC_GPU_BAD_INDEX;
    if (j > 0 && ((j > 1 && is_padding(idx[j - 1], val[j - 1])) || idx[j - 1] >= i)) return DGC_GPU_BAD_ORDER;
    return 0;
}

__global__ void __launch_bounds__(kThreads) validate_kernel(const char *gathered, int nranks, uint64_t step,
                                                            uint64_t n, uint64_t k, scratch *sc) {
    const uint64_t total = (uint64_t)nranks * k;
    for (uint64_t t = blockIdx.x * (uint64_t)kThreads + threadIdx.x; t < total; t += (uint64_t)gridDim.x * kThreads) {
        const int r = (int)(t / k);
        const uint64_t j = t % k;
        const char *pl = payload_at(gathered, r, k);
        const dgc_wire_header *h = reinterpret_cast<const dgc_wire_header *>(pl);
        unsigned long long value;
        if (header_fault(h, step, n, k, &value)) {
            if (j == 0) atomicMin(&sc->bad_key, (unsigned long long)r << kSlotBits);
            continue;
        }
        if (h->flags & DGC_WIRE_FAILED) continue; /* only its header means anything */
        if (slot_fault(indices_of(pl), values_of(pl, k), j, n, &value))
            atomicMin(&sc->bad_key, (unsigned long long)r << kSlotBits | (j + 1));
    }
}

__global__ void finalize_kernel(const char *gathered, int nranks, uint64_t step, uint64_t n, uint64_t k, scratch *sc,
                                dgc_gpu_report *rep, unsigned long long *state_count) {
    const unsigned long long key = sc->bad_key, code = sc->code_bad_key;
    sc->bad_key = kNoBad; /* ready for the next call */
    sc->code_bad_key = kNoBad;
    sc->subtract = 0;
    /* A failed rank drops the step before any slot or code is looked at,
     * unless some header is bad: headers are all a rank without state can
     * check, and it must decide as this one does (invariant 3). */
    const size_t stride = dgc_wire_bytes_device(k);
    bool nonfinite;
    const int first_failed = scan_flags(gathered, stride, nranks, &nonfinite);
    if (first_failed >= 0 && !any_header_fault(gathered, stride, nranks, step, n, k)) {
        sc->dec_mode = DEC_NAN;
        report_dropped(rep, first_failed, state_count);
        return;
    }
    if (code != kNoBad && (key == kNoBad || (code >> 40) <= (key >> kSlotBits))) {
        /* A compact code at fault, at a rank no higher than any plain fault:
         * what it expanded into means nothing. */
        sc->dec_mode = DEC_BAD;
        report_bad(rep, DGC_GPU_BAD_CODE, (int)(code >> 40), (code >> 4) & ((1ull << 36) - 1), code & 15u, step, n);
        return;
    }
    if (key != kNoBad) {
        /* The fault again, for its reason and value: same data, same test. */
        const int r = (int)(key >> kSlotBits);
        const uint64_t s = key & ((1ull << kSlotBits) - 1);
        const char *pl = payload_at(gathered, r, k);
        unsigned long long value = 0;
        unsigned int why = s == 0 ? header_fault(reinterpret_cast<const dgc_wire_header *>(pl), step, n, k, &value)
                                  : slot_fault(indices_of(pl), values_of(pl, k), s - 1, n, &value);
        sc->dec_mode = DEC_BAD;
        report_bad(rep, why ? why : (unsigned)DGC_GPU_BAD_ORDER, r, s ? s - 1 : 0, value, step, n);
        return;
    }
    if (first_failed >= 0 || nonfinite) {
        sc->dec_mode = DEC_NAN;
        report_dropped(rep, first_failed, state_count);
    } else {
        sc->dec_mode = DEC_OK;
        sc->subtract = agreed_age(gathered, stride, nranks) != 0;
        report_saturated(rep, sc);
    }
}

/* out = NaN in dtype; mode NULL: unconditionally. */
template <int DT> __global__ void __launch_bounds__(kThreads) nan_kernel(void *out, uint64_t n, const int *mode) {
    if (mode && *mode != DEC_NAN) return;
    for (uint64_t i = blockIdx.x * (uint64_t)kThreads + threadIdx.x; i < n; i += (uint64_t)gridDim.x * kThreads)
        elem<DT>::store_nan(out, i);
}

/* The key slot j sorts by in a payload that passed its check: its index,
 * padding after the first slot past every index (padding only ends a
 * payload). Non-decreasing in j, so a binary search finds a range's slots. */
__device__ __forceinline__ uint64_t slot_key(const uint32_t *idx, const float *val, uint64_t j) {
    return j > 0 && is_padding(idx[j], val[j]) ? 1ull << 32 : (uint64_t)idx[j];
}

/* The first slot of a checked payload whose key is at least lo (k if none). */
__device__ uint64_t first_slot_from(const uint32_t *idx, const float *val, uint64_t k, uint64_t lo) {
    uint64_t a = 0, b = k;
    while (a < b) {
        const uint64_t m = a + (b - a) / 2;
        if (slot_key(idx, val, m) < lo) a = m + 1;
        else b = m;
    }
    return a;
}

/* The fewest elements a block of the rank-ordered sum owns: enough that
 * its searches and barriers per rank stay a small part of its work. A
 * larger buffer gives each block one range (sum_span): two searches per
 * rank, whose dependent loads are the kernel's latency. */
constexpr uint64_t kSumSpan = 4096;

/* acc += scale * every rank's pairs, rank by rank, in one launch: the
 * host's order (the sum of each rank's pairs in rank order, invariant 3)
 * for every element, without a launch per rank. Each block owns ranges of
 * elements, here [lo, hi), acc[i - acc_lo] standing for element i; for
 * each rank in turn it finds that rank's slots in the range
 * (indices are strictly increasing: one search each) and adds them, a
 * barrier between ranks, so that one element's additions are ordered by
 * rank and no two threads meet. scale 1 is the plain sum (1 * x == x); the
 * product is rounded before the sum, as dgc_wire_subtract does. */
template <bool SCALED>
__device__ void sum_range(const char *base, int nranks, uint64_t k, uint64_t lo, uint64_t hi, float scale,
                          float *acc, uint64_t acc_lo) {
    __shared__ uint64_t from[kThreads], to[kThreads];
    for (int r0 = 0; r0 < nranks; r0 += kThreads) {
        const int batch = nranks - r0 < kThreads ? nranks - r0 : kThreads;
        __syncthreads(); /* the previous batch's ranges are no longer read */
        if ((int)threadIdx.x < batch) {
            const char *pl = payload_at(base, r0 + (int)threadIdx.x, k);
            from[threadIdx.x] = first_slot_from(indices_of(pl), values_of(pl, k), k, lo);
            to[threadIdx.x] = first_slot_from(indices_of(pl), values_of(pl, k), k, hi);
        }
        __syncthreads();
        for (int q = 0; q < batch; q++) {
            const char *pl = payload_at(base, r0 + q, k);
            const uint32_t *idx = indices_of(pl);
            const float *val = values_of(pl, k);
            for (uint64_t j = from[q] + threadIdx.x; j < to[q]; j += kThreads) {
                const uint32_t i = idx[j];
                const float x = val[j];
                if (is_padding(i, x)) continue;
                if (SCALED) {
                    const float d = scale * x;
                    acc[i - acc_lo] = acc[i - acc_lo] + d;
                } else {
                    acc[i - acc_lo] = acc[i - acc_lo] + x;
                }
            }
            __syncthreads(); /* this rank's additions land before the next rank's */
        }
    }
}

/* sum_range over the block's ranges of span elements, into acc (n). */
template <bool SCALED>
__device__ void sum_ranks(const char *base, int nranks, uint64_t k, uint64_t n, uint64_t span, float scale,
                          float *acc) {
    for (uint64_t lo = blockIdx.x * span; lo < n; lo += (uint64_t)gridDim.x * span)
        sum_range<SCALED>(base, nranks, k, lo, lo + span < n ? lo + span : n, scale, acc, 0);
}

/* Blocks for sum_ranks over n elements, and the range each block owns. */
unsigned int sum_grid(uint64_t n, int sms) { return grid_for((n + kSumSpan - 1) / kSumSpan * kThreads, sms, 8); }
uint64_t sum_span(uint64_t n, unsigned int grid) {
    const uint64_t per_block = (n + grid - 1) / grid;
    return per_block > kSumSpan ? per_block : kSumSpan;
}

/* Every rank's pairs into acc (the host's add_pairs with scale 1). */
__global__ void __launch_bounds__(kThreads) add_kernel(const char *gathered, int nranks, uint64_t k, uint64_t n,
                                                       uint64_t span, float *acc, const scratch *sc) {
    if (sc->dec_mode != DEC_OK) return;
    sum_ranks<false>(gathered, nranks, k, n, span, 1.0f, acc);
}

/* Every kept rank's pairs, times -m (the host's dgc_wire_subtract:
 * out[idx] += (-m) * val, the product rounded, then the sum). */
__global__ void __launch_bounds__(kThreads) sub_kernel(const char *prev, int nranks, uint64_t n, uint64_t span,
                                                       float neg_m, float *acc, const scratch *sc) {
    if (sc->dec_mode != DEC_OK || !sc->subtract || sc->prev_kind != PREV_SPARSE || sc->prev_nranks != nranks) return;
    sum_ranks<true>(prev, nranks, sc->prev_k, n, span, neg_m, acc);
}

/* The kept dense vector of a dense-transport step, times -m, on a sparse
 * step (the MPI path's subtract_previous: out[i] += (-m) * prev[i]). */
__global__ void __launch_bounds__(kThreads) sub_dense_kernel(const float *prev, uint64_t n, float neg_m, float *acc,
                                                             const scratch *sc) {
    if (sc->dec_mode != DEC_OK || !sc->subtract || sc->prev_kind != PREV_DENSE) return;
    for (uint64_t i = blockIdx.x * (uint64_t)kThreads + threadIdx.x; i < n; i += (uint64_t)gridDim.x * kThreads) {
        const float d = neg_m * prev[i];
        acc[i] = acc[i] + d;
    }
}

/* A dense-transport step keeps its sum S_t as a dense vector. After a dense
 * step, one pass subtracts m S_{t-1} (when the headers agreed on its age)
 * and keeps S_t in its place (the MPI path's compensate_dense); otherwise
 * S_t is copied first, and the kept payloads (if any) are subtracted after
 * it by sub_kernel. */
__global__ void __launch_bounds__(kThreads) keep_dense_kernel(float *prev, uint64_t n, float neg_m, float *acc,
                                                              const scratch *sc) {
    if (sc->dec_mode != DEC_OK) return;
    const bool swap = sc->prev_kind == PREV_DENSE && sc->subtract;
    for (uint64_t i = blockIdx.x * (uint64_t)kThreads + threadIdx.x; i < n; i += (uint64_t)gridDim.x * kThreads) {
        const float x = acc[i];
        if (swap) {
            const float d = neg_m * prev[i];
            acc[i] = x + d;
        }
        prev[i] = x;
    }
}

/* ncclAvg on fp32: the sum divided by the ranks, element by element. */
__global__ void __launch_bounds__(kThreads) average_kernel(float *out, uint64_t n, float nr, const scratch *sc) {
    if (sc->dec_mode != DEC_OK) return;
    for (uint64_t i = blockIdx.x * (uint64_t)kThreads + threadIdx.x; i < n; i += (uint64_t)gridDim.x * kThreads)
        out[i] = out[i] / nr;
}

/* fp16/bf16: out from the accumulator (rounded to nearest), divided first
 * when averaging; NaN for a dropped step; zero for a bad one (the
 * accumulator was zeroed, by the compression or by the dense transport's
 * widening, and nothing was added). */
template <int DT>
__global__ void __launch_bounds__(kThreads) convert_kernel(void *out, const float *acc, uint64_t n, int average,
                                                           float nr, const scratch *sc) {
    const int mode = sc->dec_mode;
    const bool divide = average && mode == DEC_OK;
    for (uint64_t i = blockIdx.x * (uint64_t)kThreads + threadIdx.x; i < n; i += (uint64_t)gridDim.x * kThreads) {
        if (mode == DEC_NAN) {
            elem<DT>::store_nan(out, i);
        } else {
            float x = acc[i];
            if (divide) x = x / nr;
            elem<DT>::store(out, i, x);
        }
    }
}

/* A 16-bit buffer's decode on a state without an fp32 accumulator (no
 * dense room): add, sub, average and convert in one launch, each block
 * summing a range of kShortSpan elements in shared memory, with the same
 * operations in the same order on every element as through the
 * accumulator (so the same bits), then writing the range of out. A bad
 * step writes zero (nothing added), a dropped one NaN. prev: the kept
 * payloads when this call compensates, else NULL. */
constexpr uint64_t kShortSpan = 4096;

template <int DT>
__global__ void __launch_bounds__(kThreads) sum16_kernel(const char *gathered, int nranks, uint64_t k, const char *prev,
                                                         float neg_m, uint64_t n, int average, float nr, void *out,
                                                         const scratch *sc) {
    __shared__ float acc[kShortSpan];
    const int mode = sc->dec_mode; /* the same for every thread: no barrier below is skipped by some */
    const bool sub = mode == DEC_OK && prev && sc->subtract && sc->prev_kind == PREV_SPARSE && sc->prev_nranks == nranks;
    const bool divide = average && mode == DEC_OK;
    for (uint64_t lo = blockIdx.x * kShortSpan; lo < n; lo += (uint64_t)gridDim.x * kShortSpan) {
        const uint64_t hi = lo + kShortSpan < n ? lo + kShortSpan : n;
        if (mode == DEC_NAN) {
            for (uint64_t i = lo + threadIdx.x; i < hi; i += kThreads) elem<DT>::store_nan(out, i);
            continue;
        }
        for (uint64_t j = threadIdx.x; j < kShortSpan; j += kThreads) acc[j] = 0.0f;
        __syncthreads();
        if (mode == DEC_OK) {
            sum_range<false>(gathered, nranks, k, lo, hi, 1.0f, acc, lo);
            if (sub) sum_range<true>(prev, nranks, sc->prev_k, lo, hi, neg_m, acc, lo);
        }
        __syncthreads();
        for (uint64_t i = lo + threadIdx.x; i < hi; i += kThreads) {
            float x = acc[i - lo];
            if (divide) x = x / nr;
            elem<DT>::store(out, i, x);
        }
        __syncthreads(); /* the range is written out before the next one zeroes acc */
    }
}

/* The host's dgc_commit masking, on the spares that are about to become the
 * committed state: at this rank's own sent indices (the sorted selection),
 * v keeps what rounding the value for the wire lost (error feedback: +0
 * when nothing was lost), u = 0 with momentum masking. */
__global__ void __launch_bounds__(kThreads) mask_kernel(const scratch *sc, const uint32_t *sel, const float *lost,
                                                        float *v2, float *u2, uint64_t ns) {
    if (sc->dec_mode != DEC_OK || sc->nonfinite) return;
    const uint64_t nsel = sc->sel.nsel;
    float *v = spare(v2, sc->cur, ns);
    float *u = u2 ? spare(u2, sc->cur, ns) : nullptr;
    for (uint64_t j = blockIdx.x * (uint64_t)kThreads + threadIdx.x; j < nsel; j += (uint64_t)gridDim.x * kThreads) {
        const uint32_t i = sel[j];
        v[i] = lost[j];
        if (u) u[i] = 0.0f;
    }
}

/* What the host may learn of the kept sum once the step is done
 * (dgc_gpu_state_kept_fits): done_step last, after a system fence, so that
 * a host that sees it sees the rest. */
__device__ void tell_host(const scratch *sc, dgc_gpu_state_mapped *m, uint64_t step) {
    m->kept_kind = sc->prev_kind;
    m->kept_k = sc->prev_k;
    m->kept_nranks = sc->prev_nranks;
    m->kept_step = sc->prev_step;
    __threadfence_system();
    m->done_step = step + 1;
}

/* Commit: flip the committed half when there are two (no other thread of
 * this kernel reads cur; a single copy has none to flip), and note how this step's sum is kept for the next compensation:
 * the gathered payloads copied (PREV_SPARSE), or already in prev_dense
 * (PREV_DENSE). Committed or not, the host hears that the step is done. */
__global__ void __launch_bounds__(kThreads) finish_kernel(scratch *sc, const unsigned long long *gathered,
                                                          unsigned long long *prev, uint64_t words, uint64_t k,
                                                          int nranks, int keep, uint64_t step, int halves,
                                                          dgc_gpu_state_mapped *m) {
    const bool ok = sc->dec_mode == DEC_OK;
    if (ok && keep == PREV_SPARSE)
        for (uint64_t w = blockIdx.x * (uint64_t)kThreads + threadIdx.x; w < words; w += (uint64_t)gridDim.x * kThreads)
            prev[w] = gathered[w];
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    if (ok) {
        if (halves) sc->cur ^= 1;
        if (keep != PREV_NONE) {
            sc->prev_kind = keep;
            sc->prev_k = k;
            sc->prev_nranks = nranks;
            sc->prev_step = step;
        }
    }
    tell_host(sc, m, step);
}

__global__ void flag_only_kernel(void *payload, uint32_t flags, uint64_t step, uint64_t n, uint64_t k) {
    dgc_wire_header h;
    h.magic = DGC_WIRE_MAGIC;
    h.flags = flags;
    h.step = step;
    h.n = n;
    h.k = k;
    *static_cast<dgc_wire_header *>(payload) = h;
}

/* A rank without state: the headers only (its own carries only flags; the
 * others' slots are not its business), then out as the ranks with state
 * leave theirs, so that all ranks agree (invariant 3): zero when a header
 * is bad (they add nothing), else NaN (the step fails everywhere). Every
 * block decides from the same headers, so no block waits for another;
 * block 0 alone writes the report. An output not aligned to its elements
 * (a rank whose compression refused it takes part this way) is written
 * byte by byte: a typed store there would end the CUDA context. */
template <int DT>
__global__ void __launch_bounds__(kThreads) stateless_kernel(const char *gathered, size_t stride, int nranks,
                                                             uint64_t step, uint64_t n, uint64_t k,
                                                             dgc_gpu_report *rep, void *out) {
    __shared__ int mode;
    if (threadIdx.x == 0)
        mode = decide_from_headers(gathered, stride, nranks, step, n, k, blockIdx.x == 0 ? rep : nullptr, nullptr);
    __syncthreads();
    const bool zero = mode == DEC_BAD;
    constexpr unsigned es = sizeof(typename elem<DT>::type);
    const bool odd = reinterpret_cast<uintptr_t>(out) % es != 0;
    const uint32_t bits = zero ? 0u : elem<DT>::nan_bits;
    for (uint64_t i = blockIdx.x * (uint64_t)kThreads + threadIdx.x; i < n; i += (uint64_t)gridDim.x * kThreads) {
        if (odd) {
            unsigned char *o = static_cast<unsigned char *>(out) + i * es;
            for (unsigned b = 0; b < es; b++) o[b] = (unsigned char)(bits >> (8 * b)); /* little-endian */
        } else if (zero) {
            elem<DT>::store(out, i, 0.0f);
        } else {
            elem<DT>::store_nan(out, i);
        }
    }
}

int multiprocessors(void) {
    int dev = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
        return 1;
    return sms;
}

} // namespace

namespace dgc_cuda {

cudaError_t nan_launch(void *out, dgc_gpu_dtype dtype, uint64_t n, const int *mode, int sms, cudaStream_t st) {
    const unsigned int grid = grid_for(n, sms, 8);
    switch (dtype) {
    case DGC_GPU_F16: nan_kernel<DGC_GPU_F16><<<grid, kThreads, 0, st>>>(out, n, mode); break;
    case DGC_GPU_BF16: nan_kernel<DGC_GPU_BF16><<<grid, kThreads, 0, st>>>(out, n, mode); break;
    default: nan_kernel<DGC_GPU_F32><<<grid, kThreads, 0, st>>>(out, n, mode); break;
    }
    return cudaGetLastError();
}

dgc_gpu_report *device_report(dgc_gpu_report *report, cudaError_t *e) {
    *e = cudaSuccess;
    if (!report) return nullptr;
    void *d = nullptr;
    *e = cudaHostGetDevicePointer(&d, report, 0);
    return static_cast<dgc_gpu_report *>(d);
}

} // namespace dgc_cuda

namespace {

/* The masking and the commit, the decode's last launches. */
int launch_mask_finish(dgc_gpu_state *s, const dgc_step_params *p, int keep, uint64_t k, cudaStream_t st, char *err,
                       size_t errlen) {
    const int nranks = p->nranks;
    scratch *sc = s->sc;
    float *u2 = s->u2 && p->momentum_masking ? s->u2 : nullptr;
    mask_kernel<<<grid_for(k, s->sms, 8), kThreads, 0, st>>>(sc, s->keys[s->sorted], s->vals[s->sorted], s->v2, u2,
                                                             s->ns);
    CHECK("launching the masking");
    const uint64_t words = keep == PREV_SPARSE ? (uint64_t)nranks * dgc_wire_bytes(k) / 8 : 0;
    finish_kernel<<<words ? grid_for(words, s->sms, 8) : 1, kThreads, 0, st>>>(
        sc, static_cast<const unsigned long long *>(s->gathered), static_cast<unsigned long long *>(s->prev), words, k,
        nranks, keep, p->step, !single_copy(s), s->mapped_dev);
    CHECK("launching the commit");
    return 0;
}

/* A 16-bit buffer's sum without an accumulator (sum16_kernel), then the
 * masking and the commit. */
int launch_sum16(dgc_gpu_state *s, void *out, dgc_gpu_dtype dtype, const dgc_step_params *p, int keep, int average,
                 uint64_t k, cudaStream_t st, char *err, size_t errlen) {
    const uint64_t n = s->shape.n;
    const unsigned int grid = grid_for((n + kShortSpan - 1) / kShortSpan * kThreads, s->sms, 8);
    const char *gathered = static_cast<const char *>(s->gathered);
    const char *prev = keep ? static_cast<const char *>(s->prev) : nullptr;
    const float nr = (float)p->nranks;
    if (dtype == DGC_GPU_F16)
        sum16_kernel<DGC_GPU_F16><<<grid, kThreads, 0, st>>>(gathered, p->nranks, k, prev, -p->momentum, n, average,
                                                             nr, out, s->sc);
    else
        sum16_kernel<DGC_GPU_BF16><<<grid, kThreads, 0, st>>>(gathered, p->nranks, k, prev, -p->momentum, n, average,
                                                              nr, out, s->sc);
    CHECK("launching the 16-bit sum");
    return launch_mask_finish(s, p, keep ? PREV_SPARSE : PREV_NONE, k, st, err, errlen);
}

} // namespace

namespace dgc_cuda {

int launch_decode_tail(dgc_gpu_state *s, void *out, float *acc, dgc_gpu_dtype dtype, const dgc_step_params *p,
                       int keep, int average, uint64_t k, cudaStream_t st, char *err, size_t errlen) {
    const dgc_gpu_shape *sh = &s->shape;
    const uint64_t n = sh->n;
    const int nranks = p->nranks;
    scratch *sc = s->sc;
    const unsigned int dense = grid_for(n, s->sms, 8);
    if (keep == PREV_DENSE) { /* S_t kept (and m S_{t-1} subtracted, when it was dense too) before the pairs go */
        keep_dense_kernel<<<dense, kThreads, 0, st>>>(s->prev_dense, n, -p->momentum, acc, sc);
        CHECK("launching the dense compensation");
    } else if (keep == PREV_SPARSE && s->prev_dense) {
        sub_dense_kernel<<<dense, kThreads, 0, st>>>(s->prev_dense, n, -p->momentum, acc, sc);
        CHECK("launching the dense compensation");
    }
    if (keep != PREV_NONE && s->prev) {
        const unsigned int grid = sum_grid(n, s->sms);
        sub_kernel<<<grid, kThreads, 0, st>>>(static_cast<const char *>(s->prev), nranks, n, sum_span(n, grid),
                                              -p->momentum, acc, sc);
        CHECK("launching the momentum compensation");
    }
    const float nr = (float)nranks;
    if (dtype == DGC_GPU_F32) {
        if (average) {
            average_kernel<<<dense, kThreads, 0, st>>>(acc, n, nr, sc);
            CHECK("launching the average");
        }
    } else if (dtype == DGC_GPU_F16) {
        convert_kernel<DGC_GPU_F16><<<dense, kThreads, 0, st>>>(out, acc, n, average, nr, sc);
        CHECK("launching the conversion to fp16");
    } else {
        convert_kernel<DGC_GPU_BF16><<<dense, kThreads, 0, st>>>(out, acc, n, average, nr, sc);
        CHECK("launching the conversion to bf16");
    }
    return launch_mask_finish(s, p, keep, k, st, err, errlen);
}

} // namespace dgc_cuda

extern "C" int dgc_gpu_decode(dgc_gpu_state *s, void *out, dgc_gpu_dtype dtype, const dgc_step_params *p,
                              int compensate, int average, dgc_gpu_report *report, dgc_cuda_stream stream, char *err,
                              size_t errlen) {
    if (!s || !out || !p) return fail_msg(err, errlen, "dgc_gpu_decode: NULL argument");
    const dgc_gpu_shape *sh = &s->shape;
    const uint64_t n = sh->n, k = p->k;
    const int nranks = p->nranks;
    const int keep = compensate && p->momentum > 0.0f;
    if (p->n != n || k < 1 || k > sh->sparse_k || nranks < 1 || nranks > sh->nranks ||
        (unsigned)dtype > (unsigned)DGC_GPU_BF16 || (dtype != DGC_GPU_F32 && sh->dtype == DGC_GPU_F32) ||
        (keep && !s->prev)) {
        char msg[240];
        snprintf(msg, sizeof msg,
                 "dgc_gpu_decode: call (n %llu, k %llu, nranks %d, dtype %d, compensation %d) does not fit the state "
                 "(n %llu, sparse k %llu, nranks %d, dtype %d, keep_prev %d)",
                 (unsigned long long)p->n, (unsigned long long)k, nranks, (int)dtype, keep, (unsigned long long)n,
                 (unsigned long long)sh->sparse_k, sh->nranks, (int)sh->dtype, sh->keep_prev);
        return fail_msg(err, errlen, msg);
    }
    cudaStream_t st = (cudaStream_t)stream;
    cudaError_t e;
    dgc_gpu_report *rep = device_report(report, &e);
    if (e != cudaSuccess) return fail(err, errlen, "cudaHostGetDevicePointer of the report", e);
    scratch *sc = s->sc;
    const char *gathered = static_cast<const char *>(s->gathered);
    float *acc = dtype == DGC_GPU_F32 ? static_cast<float *>(out) : s->acc;

    if (sh->value_bits && launch_expand(s, p, st, err, errlen)) return -1;
    validate_kernel<<<grid_for((uint64_t)nranks * k, s->sms, 8), kThreads, 0, st>>>(gathered, nranks, p->step, n, k,
                                                                                     sc);
    CHECK("launching the payloads' check");
    finalize_kernel<<<1, 1, 0, st>>>(gathered, nranks, p->step, n, k, sc, rep, s->nonfinite_dev);
    CHECK("launching the decode's decision");
    /* A single copy's update, before anything is written to out (it may be g). */
    if (single_copy(s) && launch_commit(s, st, err, errlen)) return -1;
    if (!acc) return launch_sum16(s, out, dtype, p, keep, average, k, st, err, errlen);
    if (dtype == DGC_GPU_F32 && (e = nan_launch(out, dtype, n, &sc->dec_mode, s->sms, st)) != cudaSuccess)
        return fail(err, errlen, "launching the NaN fill", e);
    const unsigned int grid = sum_grid(n, s->sms);
    add_kernel<<<grid, kThreads, 0, st>>>(gathered, nranks, k, n, sum_span(n, grid), acc, sc);
    CHECK("launching the ranks' sum");
    return launch_decode_tail(s, out, acc, dtype, p, keep ? PREV_SPARSE : PREV_NONE, average, k, st, err, errlen);
}

extern "C" int dgc_gpu_flag_only(void *payload, uint32_t flags, const dgc_step_params *p, dgc_cuda_stream stream) {
    if (!payload || !p) return fail_msg(nullptr, 0, "dgc_gpu_flag_only: NULL argument");
    flag_only_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(payload, flags, p->step, p->n, p->k);
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? 0 : fail(nullptr, 0, "launching a flag-only header", e);
}

extern "C" int dgc_gpu_decode_stateless(const void *gathered, size_t stride, void *out, dgc_gpu_dtype dtype,
                                        const dgc_step_params *p, dgc_gpu_report *report, dgc_cuda_stream stream) {
    if (!gathered || !out || !p || p->nranks < 1 || stride < sizeof(dgc_wire_header) ||
        (unsigned)dtype > (unsigned)DGC_GPU_BF16)
        return fail_msg(nullptr, 0, "dgc_gpu_decode_stateless: bad argument");
    cudaStream_t st = (cudaStream_t)stream;
    cudaError_t e;
    dgc_gpu_report *rep = device_report(report, &e);
    if (e != cudaSuccess) return fail(nullptr, 0, "cudaHostGetDevicePointer of the report", e);
    const char *h = static_cast<const char *>(gathered);
    const unsigned int grid = grid_for(p->n, multiprocessors(), 8);
    switch (dtype) {
    case DGC_GPU_F16:
        stateless_kernel<DGC_GPU_F16><<<grid, kThreads, 0, st>>>(h, stride, p->nranks, p->step, p->n, p->k, rep, out);
        break;
    case DGC_GPU_BF16:
        stateless_kernel<DGC_GPU_BF16><<<grid, kThreads, 0, st>>>(h, stride, p->nranks, p->step, p->n, p->k, rep, out);
        break;
    default:
        stateless_kernel<DGC_GPU_F32><<<grid, kThreads, 0, st>>>(h, stride, p->nranks, p->step, p->n, p->k, rep, out);
        break;
    }
    if ((e = cudaGetLastError()) != cudaSuccess) return fail(nullptr, 0, "launching the stateless decode", e);
    return 0;
}

namespace dgc_cuda {

cudaError_t preload_decode(void) {
    const void *const kernels[] = {
        (const void *)validate_kernel,
        (const void *)finalize_kernel,
        (const void *)nan_kernel<DGC_GPU_F32>,
        (const void *)nan_kernel<DGC_GPU_F16>,
        (const void *)nan_kernel<DGC_GPU_BF16>,
        (const void *)add_kernel,
        (const void *)sub_kernel,
        (const void *)sub_dense_kernel,
        (const void *)keep_dense_kernel,
        (const void *)average_kernel,
        (const void *)convert_kernel<DGC_GPU_F16>,
        (const void *)convert_kernel<DGC_GPU_BF16>,
        (const void *)sum16_kernel<DGC_GPU_F16>,
        (const void *)sum16_kernel<DGC_GPU_BF16>,
        (const void *)mask_kernel,
        (const void *)finish_kernel,
        (const void *)flag_only_kernel,
        (const void *)stateless_kernel<DGC_GPU_F32>,
        (const void *)stateless_kernel<DGC_GPU_F16>,
        (const void *)stateless_kernel<DGC_GPU_BF16>,
    };
    return preload(kernels, sizeof kernels / sizeof kernels[0]);
}

} // namespace dgc_cuda
