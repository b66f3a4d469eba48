/* Device code both decodes share (the payloads' all-gather in decode.cu,
 * the dense transport in dense.cu): the check of one gathered header, the
 * flags of all of them, and what the host hears of a bad or dropped step
 * through the report. */
#ifndef DGCSHIM_KERNELS_HEADERS_CUH
#define DGCSHIM_KERNELS_HEADERS_CUH

#include "internal.cuh"

namespace dgc_cuda {

constexpr unsigned int kKnownFlags = DGC_WIRE_NONFINITE | DGC_WIRE_FAILED; /* DENSE has no meaning here */

__device__ __forceinline__ const dgc_wire_header *header_at(const char *base, int r, size_t stride) {
    return reinterpret_cast<const dgc_wire_header *>(base + (size_t)r * stride);
}

/* DGC_GPU_BAD_MAGIC / _HEADER for a header that does not fit this call, 0
 * when it does; *value: what was wrong. */
__device__ __forceinline__ unsigned int header_fault(const dgc_wire_header *h, uint64_t step, uint64_t n, uint64_t k,
                                                     unsigned long long *value) {
    if (h->magic != DGC_WIRE_MAGIC) { *value = h->magic; return DGC_GPU_BAD_MAGIC; }
    if (h->flags & DGC_WIRE_FLAG_BITS & ~kKnownFlags) { *value = h->flags; return DGC_GPU_BAD_MAGIC; }
    if (h->step != step) { *value = h->step; return DGC_GPU_BAD_HEADER; }
    if (h->n != n) { *value = h->n; return DGC_GPU_BAD_HEADER; }
    if (h->k != k) { *value = h->k; return DGC_GPU_BAD_HEADER; }
    return 0;
}

/* A step with a bad payload: counted every time, the first one's details
 * kept; the fields before bad, and bad before the count, so that a host
 * seeing the count move reads them whole. Mapped memory: plain stores from
 * one thread, no atomics (not atomic over PCIe). */
__device__ __forceinline__ void report_bad(dgc_gpu_report *rep, unsigned int reason, int rank, uint64_t slot,
                                           uint64_t value, uint64_t step, uint64_t n) {
    if (!rep) return;
    volatile dgc_gpu_report *r = rep;
    if (r->bad == 0) {
        r->bad_rank = rank;
        r->bad_slot = slot;
        r->bad_value = value;
        r->bad_step = step;
        __threadfence_system();
        r->bad = reason;
    }
    const uint64_t i = r->bad_steps % DGC_GPU_BAD_RING; /* this rank's own call, for its step to be given back */
    r->bad_calls[i][0] = n;
    r->bad_calls[i][1] = step;
    __threadfence_system();
    r->bad_steps = r->bad_steps + 1;
}

/* Some rank failed or was non-finite: the counters. */
__device__ __forceinline__ void report_dropped(dgc_gpu_report *rep, int first_failed,
                                               unsigned long long *state_count) {
    if (rep) {
        volatile dgc_gpu_report *r = rep;
        if (first_failed >= 0) {
            r->failed_rank = first_failed;
            __threadfence_system(); /* the rank before the count, as report_bad orders its fields */
            r->failed = r->failed + 1;
        } else {
            r->nonfinite = r->nonfinite + 1;
        }
    }
    if (state_count) {
        volatile unsigned long long *c = state_count;
        *c = *c + 1;
    }
}

/* A step decoded with this rank's update saturated: counted, for the host
 * (one thread; plain stores, as report_bad's). */
__device__ __forceinline__ void report_saturated(dgc_gpu_report *rep, const scratch *sc) {
    if (!rep || !sc->saturated) return;
    volatile dgc_gpu_report *r = rep;
    r->saturated = r->saturated + 1;
}

/* Whether some header does not fit this call. */
__device__ __forceinline__ bool any_header_fault(const char *base, size_t stride, int nranks, uint64_t step,
                                                 uint64_t n, uint64_t k) {
    for (int r = 0; r < nranks; r++) {
        unsigned long long value;
        if (header_fault(header_at(base, r, stride), step, n, k, &value)) return true;
    }
    return false;
}

/* Lowest rank flagged FAILED (-1: none); *nonfinite when some is NONFINITE. */
__device__ __forceinline__ int scan_flags(const char *base, size_t stride, int nranks, bool *nonfinite) {
    int first_failed = -1;
    *nonfinite = false;
    for (int r = 0; r < nranks; r++) {
        const uint32_t f = header_at(base, r, stride)->flags;
        if ((f & DGC_WIRE_FAILED) && first_failed < 0) first_failed = r;
        if (f & DGC_WIRE_NONFINITE) *nonfinite = true;
    }
    return first_failed;
}

/* The age of the kept sum every header reports (wire.h), when all report
 * the same one below DGC_WIRE_AGE_MAX; else 0: no rank subtracts its kept
 * sum (the host's dgc_wire_scan). */
__device__ __forceinline__ unsigned int agreed_age(const char *base, size_t stride, int nranks) {
    const unsigned int age = DGC_WIRE_AGE(header_at(base, 0, stride)->flags);
    for (int r = 1; r < nranks; r++)
        if (DGC_WIRE_AGE(header_at(base, r, stride)->flags) != age) return 0;
    return age < DGC_WIRE_AGE_MAX ? age : 0;
}

/* This rank's age of its kept sum for a call at step on nranks (wire.h):
 * 0 when it keeps none that call can use. */
__device__ __forceinline__ uint32_t kept_age_bits(const scratch *sc, uint64_t step, int nranks) {
    const bool kept = sc->prev_kind == PREV_DENSE || (sc->prev_kind == PREV_SPARSE && sc->prev_nranks == nranks);
    return kept && step > sc->prev_step ? DGC_WIRE_AGE_BITS(step - sc->prev_step) : 0u;
}

/* Headers only (a rank without state, or the dense transport): the lowest
 * rank's bad header reported, DEC_BAD; else DEC_NAN with the counters when
 * some rank failed or was non-finite; else DEC_OK. One thread. */
__device__ __forceinline__ int decide_from_headers(const char *base, size_t stride, int nranks, uint64_t step,
                                                   uint64_t n, uint64_t k, dgc_gpu_report *rep,
                                                   unsigned long long *state_count) {
    for (int r = 0; r < nranks; r++) {
        unsigned long long value = 0;
        const unsigned int why = header_fault(header_at(base, r, stride), step, n, k, &value);
        if (why) {
            report_bad(rep, why, r, 0, value, step, n);
            return DEC_BAD;
        }
    }
    bool nonfinite;
    const int first_failed = scan_flags(base, stride, nranks, &nonfinite);
    if (first_failed < 0 && !nonfinite) return DEC_OK;
    report_dropped(rep, first_failed, state_count);
    return DEC_NAN;
}

} // namespace dgc_cuda

#endif
