/* The compact payload on the device (wire_compact.h): the encoder of this
 * rank's payload and the expander of every rank's, made of compact_rules.h's
 * pieces, which the host codec shares and unit.test_compact_rules holds to
 * it (the same bytes, verdicts and pairs).
 *
 *   encode    zero the payload; one thread a slot ors its pair's upper bit,
 *             low slot and value slot in (integer atomics: any order gives
 *             the same words); thread 0 the header and count word
 *   expand    frame    one thread a rank: its header into the plain payload,
 *                      the count word and the areas' ends (dgc_cx_frame)
 *             popc     one thread an upper word: its set bits
 *             scan     their running sum over every rank's words (cub)
 *             upper    one thread an upper word: the indices of the pairs its
 *                      bits start (dgc_cx_upper_word), into the plain payload
 *             slots    one thread a slot: order, value, tail (dgc_cx_slot)
 *             end      one thread a rank: set bits, scale, lone padding
 * A fault goes into sc->code_bad_key (code_key: lowest rank, then slot, by
 * an atomicMin), which the plain decode's decision reads; the plain decode
 * then runs on the expanded payloads as it would on received plain ones. */
#include <cub/device/device_scan.cuh>
#include <limits.h>
#include <stdio.h>

#include "dgcshim/compact_rules.h"
#include "dgcshim/wire_compact.h"
#include "headers.cuh"

using namespace dgc_cuda;

namespace {

__device__ __forceinline__ void code_fault(scratch *sc, int rank, uint64_t slot, int reason) {
    atomicMin(&sc->code_bad_key, code_key(rank, slot, reason));
}

__device__ __forceinline__ void or_word(unsigned long long *w, unsigned long long bits) {
    if (bits) atomicOr(w, bits);
}

/* This rank's pairs (pack_kernel's payload: nsel sorted pairs, values on the
 * grid of sc->scale_e) into its compact payload, zeroed before. */
__global__ void __launch_bounds__(kThreads) encode_kernel(const scratch *sc, const char *plain, dgc_cx_view v,
                                                          unsigned long long *wire) {
    const uint64_t k = v.k;
    const uint32_t *idx = reinterpret_cast<const uint32_t *>(plain + sizeof(dgc_wire_header));
    const uint32_t *val = reinterpret_cast<const uint32_t *>(plain + sizeof(dgc_wire_header) + 4 * k);
    const uint64_t nsel = sc->nonfinite ? 0 : sc->sel.nsel;
    const uint64_t count = nsel ? dgc_cx_real_pairs(nsel, idx[0], val[0]) : 0;
    const int e = count && v.value_bits == 16 ? sc->scale_e : 0;
    if (blockIdx.x == 0 && threadIdx.x < DGC_CX_HEADER_WORDS)
        wire[threadIdx.x] = reinterpret_cast<const unsigned long long *>(plain)[threadIdx.x];
    if (blockIdx.x == 0 && threadIdx.x == 0) wire[DGC_CX_HEADER_WORDS] = dgc_cx_count_word(count, e);
    const unsigned lb = v.low_bits;
    for (uint64_t j = blockIdx.x * (uint64_t)kThreads + threadIdx.x; j < count; j += (uint64_t)gridDim.x * kThreads) {
        const uint64_t i = idx[j], bit = (i >> lb) + j;
        atomicOr(&wire[v.upper + (bit >> 6)], 1ull << (bit & 63u));
        if (lb) {
            const dgc_cx_bits b = dgc_cx_slot_bits(j, lb, i & ((1ull << lb) - 1u));
            or_word(&wire[v.low + b.w], b.lo);
            or_word(&wire[v.low + b.w + 1], b.hi);
        }
        uint32_t slot = val[j];
        if (v.value_bits == 16 && dgc_cx_half_of(val[j], e, &slot)) slot = 0xffffu; /* off the grid: a bug; NaN */
        const dgc_cx_bits b = dgc_cx_slot_bits(j, v.value_bits, slot);
        or_word(&wire[v.values + b.w], b.lo);
    }
}

/* Where rank r's compact payload and its plain expansion lie. */
struct places {
    const char *wire;  /* the gathered compact payloads */
    size_t wire_bytes; /* one of them */
    char *plain;       /* the plain payloads they expand into */
    size_t plain_bytes;
    __device__ const unsigned long long *compact(int r) const {
        return reinterpret_cast<const unsigned long long *>(wire + (size_t)r * wire_bytes);
    }
    __device__ uint32_t *indices(int r) const {
        return reinterpret_cast<uint32_t *>(plain + (size_t)r * plain_bytes + sizeof(dgc_wire_header));
    }
    __device__ uint32_t *values(int r, uint64_t k) const {
        return reinterpret_cast<uint32_t *>(plain + (size_t)r * plain_bytes + sizeof(dgc_wire_header) + 4 * k);
    }
};

__global__ void frame_kernel(places at, dgc_cx_view v, int nranks, uint64_t step, rank_code *codes, scratch *sc) {
    const int r = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (r >= nranks) return;
    const unsigned long long *pl = at.compact(r);
    unsigned long long *header = reinterpret_cast<unsigned long long *>(at.plain + (size_t)r * at.plain_bytes);
    for (unsigned w = 0; w < DGC_CX_HEADER_WORDS; w++) header[w] = pl[w];
    rank_code c = {0, 0, 0, 1, 0};
    unsigned long long value;
    const dgc_wire_header *h = reinterpret_cast<const dgc_wire_header *>(pl);
    /* A bad header is the plain check's to name; a failed rank sent only its header. */
    if (!header_fault(h, step, v.n, v.k, &value) && !(h->flags & DGC_WIRE_FAILED)) {
        uint64_t count = 0;
        int e = 0;
        const int f = dgc_cx_frame(reinterpret_cast<const uint64_t *>(pl), &v, &count, &e);
        if (f) code_fault(sc, r, 0, f);
        else c = rank_code{count, e, 0, 0, 0};
    }
    codes[r] = c;
}

__global__ void __launch_bounds__(kThreads) popc_kernel(places at, dgc_cx_view v, int nranks,
                                                        unsigned long long *popc) {
    const uint64_t total = (uint64_t)nranks * v.upper_words;
    for (uint64_t t = blockIdx.x * (uint64_t)kThreads + threadIdx.x; t < total; t += (uint64_t)gridDim.x * kThreads) {
        const int r = (int)(t / v.upper_words);
        popc[t] = (unsigned long long)dgc_cx_popcount(at.compact(r)[v.upper + t % v.upper_words]);
    }
}

/* The set bits of rank r's words before word t (t an index over every
 * rank's words), from the inclusive running sum. */
__device__ __forceinline__ uint64_t bits_before(const unsigned long long *popc, const unsigned long long *sum,
                                                uint64_t t, uint64_t first) {
    const uint64_t base = first ? sum[first - 1] : 0;
    return sum[t] - popc[t] - base;
}

__global__ void __launch_bounds__(kThreads) upper_kernel(places at, dgc_cx_view v, int nranks, const rank_code *codes,
                                                         const unsigned long long *popc,
                                                         const unsigned long long *sum, scratch *sc) {
    const uint64_t total = (uint64_t)nranks * v.upper_words;
    for (uint64_t t = blockIdx.x * (uint64_t)kThreads + threadIdx.x; t < total; t += (uint64_t)gridDim.x * kThreads) {
        const int r = (int)(t / v.upper_words);
        const rank_code c = codes[r];
        if (c.skip) continue;
        const uint64_t w = t % v.upper_words, first = (uint64_t)r * v.upper_words;
        const uint64_t *pl = reinterpret_cast<const uint64_t *>(at.compact(r));
        uint64_t slot = 0;
        const int f = dgc_cx_upper_word(pl, &v, c.count, w, pl[v.upper + w], bits_before(popc, sum, t, first),
                                        at.indices(r), &slot);
        if (f) code_fault(sc, r, slot, f);
    }
}

__global__ void __launch_bounds__(kThreads) slot_kernel(places at, dgc_cx_view v, int nranks, rank_code *codes,
                                                        scratch *sc) {
    const uint64_t total = (uint64_t)nranks * v.k;
    for (uint64_t t = blockIdx.x * (uint64_t)kThreads + threadIdx.x; t < total; t += (uint64_t)gridDim.x * kThreads) {
        const int r = (int)(t / v.k);
        const rank_code c = codes[r];
        if (c.skip) continue;
        const uint64_t j = t % v.k;
        uint32_t *idx = at.indices(r), value = 0, mag = 0;
        const int f = dgc_cx_slot(reinterpret_cast<const uint64_t *>(at.compact(r)), &v, c.count, c.e, j, idx, &value,
                                  &mag);
        at.values(r, v.k)[j] = value;
        if (j >= c.count) idx[j] = 0; /* the padding: no other thread reads it (order is checked below the count) */
        if (mag) atomicMax(&codes[r].max16, mag);
        if (f) code_fault(sc, r, j, f);
    }
}

__global__ void end_kernel(places at, dgc_cx_view v, int nranks, const rank_code *codes,
                           const unsigned long long *sum, scratch *sc) {
    const int r = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (r >= nranks) return;
    const rank_code c = codes[r];
    if (c.skip) return;
    const uint64_t first = (uint64_t)r * v.upper_words, last = first + v.upper_words - 1;
    const uint64_t set_bits = sum[last] - (first ? sum[first - 1] : 0);
    const int f = dgc_cx_end(&v, c.count, c.e, set_bits, c.max16, at.indices(r)[0], at.values(r, v.k)[0]);
    if (f) code_fault(sc, r, set_bits, f);
}

dgc_cx_view view_for(const dgc_gpu_state *s, uint64_t k, size_t *bytes) {
    dgc_compact_layout cl;
    dgc_compact_layout_for(s->shape.n, k, s->shape.value_bits, &cl);
    *bytes = cl.bytes;
    return dgc_cx_view_of(cl.n, cl.k, cl.low_bits, cl.value_bits, cl.upper_bits);
}

cudaError_t scan(void *temp, size_t *bytes, const unsigned long long *in, unsigned long long *out, uint64_t items,
                 cudaStream_t st) {
    /* cub's first call per device asks which device is current and throws
     * when it cannot tell: no C++ exception may reach the C callers. */
    try {
        return cub::DeviceScan::InclusiveSum(temp, *bytes, in, out, (int)items, st);
    } catch (...) {
        return cudaErrorUnknown;
    }
}

} // namespace

namespace dgc_cuda {

cudaError_t scan_temp_bytes(uint64_t items, size_t *bytes) {
    *bytes = 0;
    return scan(nullptr, bytes, nullptr, nullptr, items ? items : 1, (cudaStream_t)0);
}

int launch_expand(dgc_gpu_state *s, const dgc_step_params *p, cudaStream_t st, char *err, size_t errlen) {
    size_t cbytes;
    const dgc_cx_view v = view_for(s, p->k, &cbytes);
    const int nranks = p->nranks;
    const uint64_t words = (uint64_t)nranks * v.upper_words;
    if (cbytes > s->wire_room || words > (uint64_t)INT_MAX) {
        char msg[200];
        snprintf(msg, sizeof msg,
                 "dgc_gpu_decode: %d compact payloads of %zu bytes (%llu upper words) do not fit the state's %zu bytes "
                 "a payload",
                 nranks, cbytes, (unsigned long long)words, s->wire_room);
        return fail_msg(err, errlen, msg);
    }
    /* Before any launch: the scan's scratch, sized for the largest k, must
     * hold this k's (cub promises no order between sizes). */
    size_t need = 0;
    cudaError_t e = scan(nullptr, &need, nullptr, nullptr, words, st);
    if (e != cudaSuccess) return fail(err, errlen, "sizing the expansion's scan", e);
    if (need > s->scan_temp_bytes) {
        char msg[160];
        snprintf(msg, sizeof msg, "dgc_gpu_decode: scanning %llu upper words needs %zu bytes of scratch, the state has %zu",
                 (unsigned long long)words, need, s->scan_temp_bytes);
        return fail_msg(err, errlen, msg);
    }
    const places at = {static_cast<const char *>(s->wire_gathered), cbytes, static_cast<char *>(s->gathered),
                       dgc_wire_bytes(p->k)};
    const unsigned int per_rank = (unsigned int)((nranks + kThreads - 1) / kThreads);
    frame_kernel<<<per_rank, kThreads, 0, st>>>(at, v, nranks, p->step, s->codes, s->sc);
    CHECK("launching the compact payloads' frames");
    popc_kernel<<<grid_for(words, s->sms, 8), kThreads, 0, st>>>(at, v, nranks, s->popc);
    CHECK("launching the upper areas' counts");
    size_t temp = s->scan_temp_bytes;
    if ((e = scan(s->scan_temp, &temp, s->popc, s->popc_sum, words, st)) != cudaSuccess)
        return fail(err, errlen, "scanning the upper areas", e);
    upper_kernel<<<grid_for(words, s->sms, 8), kThreads, 0, st>>>(at, v, nranks, s->codes, s->popc, s->popc_sum, s->sc);
    CHECK("launching the indices' expansion");
    slot_kernel<<<grid_for((uint64_t)nranks * v.k, s->sms, 8), kThreads, 0, st>>>(at, v, nranks, s->codes, s->sc);
    CHECK("launching the slots' expansion");
    end_kernel<<<per_rank, kThreads, 0, st>>>(at, v, nranks, s->codes, s->popc_sum, s->sc);
    CHECK("launching the compact payloads' ends");
    return 0;
}

} // namespace dgc_cuda

extern "C" int dgc_gpu_encode(dgc_gpu_state *s, const dgc_step_params *p, dgc_cuda_stream stream, char *err,
                              size_t errlen) {
    if (!s || !p) return fail_msg(err, errlen, "dgc_gpu_encode: NULL argument");
    const dgc_gpu_shape *sh = &s->shape;
    if (!sh->value_bits) return 0;
    if (!s->popc || p->k < 1 || p->k > sh->sparse_k || (p->value_bits == 16) != (sh->value_bits == 16)) {
        char msg[200];
        snprintf(msg, sizeof msg,
                 "dgc_gpu_encode: call (k %llu, value bits %u) does not fit the state (sparse k %llu, wire value bits "
                 "%u)",
                 (unsigned long long)p->k, p->value_bits, (unsigned long long)sh->sparse_k, sh->value_bits);
        return fail_msg(err, errlen, msg);
    }
    cudaStream_t st = (cudaStream_t)stream;
    size_t cbytes;
    const dgc_cx_view v = view_for(s, p->k, &cbytes);
    if (cbytes > s->wire_room) {
        char msg[160];
        snprintf(msg, sizeof msg, "dgc_gpu_encode: a compact payload of %zu bytes does not fit the state's %zu",
                 cbytes, s->wire_room);
        return fail_msg(err, errlen, msg);
    }
    cudaError_t e = cudaMemsetAsync(s->wire, 0, cbytes, st);
    if (e != cudaSuccess) return fail(err, errlen, "zeroing the compact payload", e);
    encode_kernel<<<grid_for(p->k, s->sms, 8), kThreads, 0, st>>>(s->sc, static_cast<const char *>(s->payload), v,
                                                                  static_cast<unsigned long long *>(s->wire));
    CHECK("launching the compact encoding");
    return 0;
}

namespace dgc_cuda {

cudaError_t preload_compact(void) {
    const void *const kernels[] = {
        (const void *)encode_kernel,
        (const void *)frame_kernel,
        (const void *)popc_kernel,
        (const void *)upper_kernel,
        (const void *)slot_kernel,
        (const void *)end_kernel,
    };
    return preload(kernels, sizeof kernels / sizeof kernels[0]);
}

} // namespace dgc_cuda
