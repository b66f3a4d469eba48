/* The dense transport's two ends on the device (engine_cuda.h): this
 * rank's selected pairs scattered into the vector, and, once the front end
 * has summed the vectors (reduce-scatter then all-gather) and gathered the
 * headers, the outcome decided from the headers and the decode finished as
 * the all-gather's is (launch_decode_tail: compensation, average,
 * conversion, masking, commit).
 *
 * The vector is out itself, in the buffer's type: the sum then sends what
 * the uncompressed all-reduce would. A 16-bit buffer's pairs were rounded to
 * its type by the compression (sum_type), so writing them is exact; its sum
 * is widened into the fp32 accumulator for the rest of the decode.
 *
 *   zero        16-bit: out = 0 (fp32: the compression zeroed it)
 *   scatter     v[i] += x for this rank's pairs (indices unique: no atomics)
 *   tail out    spare = v[block * nranks ..], zeros after: the dense sum
 *               works on whole blocks, the rest goes one element a rank
 *   ... the front end's collectives ...
 *   decide      one thread: every header checked, the flags and ages read
 *   tail in     v[block * nranks ..] = spare
 *   clear       fp32: v = 0 for a bad header (the all-gather's decode
 *               leaves zero); 16-bit: widen, acc = v, or 0 for a bad header,
 *               and a sum that overflowed drops the step (NaN, no commit)
 *   nan         out = NaN for a failed or non-finite rank (fp32; the
 *               conversion does it for the 16-bit types) */
#include <stdio.h>

#include "device.cuh"
#include "headers.cuh"

using namespace dgc_cuda;

namespace {

constexpr size_t kHeaderStride = sizeof(dgc_wire_header);

template <int DT>
__global__ void __launch_bounds__(kThreads) own_pairs_kernel(const char *payload, uint64_t k, void *v) {
    const uint32_t *idx = reinterpret_cast<const uint32_t *>(payload + sizeof(dgc_wire_header));
    const float *val = reinterpret_cast<const float *>(payload + sizeof(dgc_wire_header) + 4 * k);
    for (uint64_t j = blockIdx.x * (uint64_t)kThreads + threadIdx.x; j < k; j += (uint64_t)gridDim.x * kThreads) {
        const uint32_t i = idx[j];
        const float x = val[j];
        if (i == 0 && __float_as_uint(x) == 0) continue; /* padding: x + 0.0f == x (see decode.cu) */
        elem<DT>::store(v, i, elem<DT>::load(v, i) + x); /* exact: 0 + x, x on the type's grid */
    }
}

/* The spare's copies, on the elements' bits (T: their storage). */
template <typename T> __global__ void tail_out_kernel(const T *rest, uint64_t rem, T *spare, int nranks) {
    for (int j = threadIdx.x; j < nranks; j += blockDim.x) spare[j] = (uint64_t)j < rem ? rest[j] : T(0);
}

template <typename T> __global__ void tail_in_kernel(T *rest, uint64_t rem, const T *spare) {
    for (uint64_t j = threadIdx.x; j < rem; j += blockDim.x) rest[j] = spare[j];
}

__global__ void decide_kernel(const char *headers, int nranks, uint64_t step, uint64_t n, uint64_t k, scratch *sc,
                              dgc_gpu_report *rep, unsigned long long *state_count) {
    const int mode = decide_from_headers(headers, kHeaderStride, nranks, step, n, k, rep, state_count);
    sc->dec_mode = mode;
    sc->subtract = mode == DEC_OK && agreed_age(headers, kHeaderStride, nranks) != 0;
    if (mode == DEC_OK) report_saturated(rep, sc);
}

__global__ void __launch_bounds__(kThreads) clear_kernel(float *v, uint64_t n, const scratch *sc) {
    if (sc->dec_mode != DEC_BAD) return;
    for (uint64_t i = blockIdx.x * (uint64_t)kThreads + threadIdx.x; i < n; i += (uint64_t)gridDim.x * kThreads)
        v[i] = 0.0f;
}

/* A 16-bit sum into the fp32 accumulator (exact), or zero for a bad step;
 * for a dropped one the conversion writes NaN whatever acc holds. A sum
 * that overflowed (the clamp of sum_rules.h keeps it from doing so up to
 * 1024 ranks) is noted, for sum_verdict_kernel. */
template <int DT>
__global__ void __launch_bounds__(kThreads) widen_kernel(const void *v, float *acc, uint64_t n, scratch *sc) {
    const bool bad = sc->dec_mode == DEC_BAD;
    bool inf = false;
    for (uint64_t i = blockIdx.x * (uint64_t)kThreads + threadIdx.x; i < n; i += (uint64_t)gridDim.x * kThreads) {
        const float x = bad ? 0.0f : elem<DT>::load(v, i);
        inf |= !isfinite(x);
        acc[i] = x;
    }
    if (inf) atomicOr(&sc->sum_nonfinite, 1u);
}

/* An overflowed sum drops the step as a non-finite gradient does: NaN out,
 * nothing committed (what was selected stays in the residual), counted.
 * Every rank holds the same sum, so every rank decides alike. */
__global__ void sum_verdict_kernel(scratch *sc, dgc_gpu_report *rep, unsigned long long *state_count) {
    if (!sc->sum_nonfinite || sc->dec_mode != DEC_OK) return;
    sc->dec_mode = DEC_NAN;
    report_dropped(rep, -1, state_count);
}

} // namespace

extern "C" int dgc_gpu_dense_view(dgc_gpu_state *s, void *out, dgc_gpu_dtype dtype, dgc_gpu_dense_vector *v) {
    if (!s || !out || !v || !s->spare || (unsigned)dtype > (unsigned)DGC_GPU_BF16 || (dtype != DGC_GPU_F32 && !s->acc))
        return -1;
    const uint64_t n = s->shape.n, r = (uint64_t)s->shape.nranks;
    v->body = out;
    v->block = n / r;
    v->spare = s->spare; /* nranks floats: room for nranks of any type */
    v->rem = n - v->block * r;
    v->type = dtype;
    return 0;
}

namespace {

/* The call's vector, when the call fits the state (n, k, nranks) and the
 * state has its dense room (dgc_gpu_dense_view); else -1 with err. */
int call_view(dgc_gpu_state *s, void *out, dgc_gpu_dtype dtype, const dgc_step_params *p, const char *what,
              dgc_gpu_dense_vector *v, char *err, size_t errlen) {
    const dgc_gpu_shape *sh = &s->shape;
    if (p->n == sh->n && p->k >= 1 && p->k <= sh->k && p->nranks == sh->nranks &&
        dgc_gpu_dense_view(s, out, dtype, v) == 0)
        return 0;
    char msg[240];
    snprintf(msg, sizeof msg,
             "%s: call (n %llu, k %llu, nranks %d, dtype %d) does not fit the state (n %llu, k %llu, nranks %d, "
             "dtype %d, dense room %d)",
             what, (unsigned long long)p->n, (unsigned long long)p->k, p->nranks, (int)dtype,
             (unsigned long long)sh->n, (unsigned long long)sh->k, sh->nranks, (int)sh->dtype, sh->dense);
    return fail_msg(err, errlen, msg);
}

template <int DT, typename T>
int scatter_launch(dgc_gpu_state *s, const dgc_gpu_dense_vector &v, const dgc_step_params *p, cudaStream_t st,
                   char *err, size_t errlen) {
    own_pairs_kernel<DT><<<grid_for(p->k, s->sms, 8), kThreads, 0, st>>>(static_cast<const char *>(s->payload),
                                                                         p->k, v.body);
    CHECK("launching the scatter of this rank's pairs");
    T *body = static_cast<T *>(v.body);
    tail_out_kernel<T><<<1, kThreads, 0, st>>>(body + v.block * (uint64_t)p->nranks, v.rem, static_cast<T *>(v.spare),
                                              p->nranks);
    CHECK("launching the dense sum's spare");
    return 0;
}

} // namespace

extern "C" int dgc_gpu_dense_scatter(dgc_gpu_state *s, void *out, dgc_gpu_dtype dtype, const dgc_step_params *p,
                                     dgc_cuda_stream stream, char *err, size_t errlen) {
    if (!s || !p) return fail_msg(err, errlen, "dgc_gpu_dense_scatter: NULL argument");
    dgc_gpu_dense_vector v{};
    if (call_view(s, out, dtype, p, "dgc_gpu_dense_scatter", &v, err, errlen)) return -1;
    if (p->sum_type != dgc_gpu_sum_type_of(dtype))
        return fail_msg(err, errlen, "dgc_gpu_dense_scatter: the pairs were not rounded to the buffer's type "
                                     "(sum_type)");
    cudaStream_t st = (cudaStream_t)stream;
    if (dtype == DGC_GPU_F32) return scatter_launch<DGC_GPU_F32, uint32_t>(s, v, p, st, err, errlen);
    /* After the compression, in stream order: it has read g, which may be out. */
    cudaError_t e = cudaMemsetAsync(out, 0, (size_t)p->n * sizeof(uint16_t), st);
    if (e != cudaSuccess) return fail(err, errlen, "zeroing the dense vector", e);
    if (dtype == DGC_GPU_F16) return scatter_launch<DGC_GPU_F16, uint16_t>(s, v, p, st, err, errlen);
    return scatter_launch<DGC_GPU_BF16, uint16_t>(s, v, p, st, err, errlen);
}

extern "C" int dgc_gpu_decode_dense(dgc_gpu_state *s, void *out, dgc_gpu_dtype dtype, const dgc_step_params *p,
                                    int compensate, int average, dgc_gpu_report *report, dgc_cuda_stream stream,
                                    char *err, size_t errlen) {
    if (!s || !p) return fail_msg(err, errlen, "dgc_gpu_decode_dense: NULL argument");
    dgc_gpu_dense_vector v{};
    if (call_view(s, out, dtype, p, "dgc_gpu_decode_dense", &v, err, errlen)) return -1;
    const int keep = compensate && p->momentum > 0.0f;
    if (keep && !s->prev_dense) return fail_msg(err, errlen, "dgc_gpu_decode_dense: the state keeps no previous sum");
    cudaStream_t st = (cudaStream_t)stream;
    cudaError_t e;
    dgc_gpu_report *rep = device_report(report, &e);
    if (e != cudaSuccess) return fail(err, errlen, "cudaHostGetDevicePointer of the report", e);
    const uint64_t n = s->shape.n, at = v.block * (uint64_t)p->nranks;
    scratch *sc = s->sc;
    const unsigned int grid = grid_for(n, s->sms, 8);

    decide_kernel<<<1, 1, 0, st>>>(static_cast<const char *>(s->gathered), p->nranks, p->step, n, p->k, sc, rep,
                                   s->nonfinite_dev);
    CHECK("launching the dense decode's decision");
    float *acc;
    if (dtype == DGC_GPU_F32) {
        tail_in_kernel<uint32_t><<<1, kThreads, 0, st>>>(static_cast<uint32_t *>(v.body) + at, v.rem,
                                                         static_cast<const uint32_t *>(v.spare));
        CHECK("launching the dense sum's rest");
        acc = static_cast<float *>(out);
        clear_kernel<<<grid, kThreads, 0, st>>>(acc, n, sc);
        CHECK("launching the clear of a bad step");
        if ((e = nan_launch(out, dtype, n, &sc->dec_mode, s->sms, st)) != cudaSuccess)
            return fail(err, errlen, "launching the NaN fill", e);
    } else {
        tail_in_kernel<uint16_t><<<1, kThreads, 0, st>>>(static_cast<uint16_t *>(v.body) + at, v.rem,
                                                         static_cast<const uint16_t *>(v.spare));
        CHECK("launching the dense sum's rest");
        acc = s->acc;
        if (dtype == DGC_GPU_F16) widen_kernel<DGC_GPU_F16><<<grid, kThreads, 0, st>>>(out, acc, n, sc);
        else widen_kernel<DGC_GPU_BF16><<<grid, kThreads, 0, st>>>(out, acc, n, sc);
        CHECK("launching the widening of the 16-bit sum");
        sum_verdict_kernel<<<1, 1, 0, st>>>(sc, rep, s->nonfinite_dev);
        CHECK("launching the 16-bit sum's verdict");
    }
    return launch_decode_tail(s, out, acc, dtype, p, keep ? PREV_DENSE : PREV_NONE, average, p->k, st, err, errlen);
}

namespace dgc_cuda {

cudaError_t preload_dense(void) {
    const void *const kernels[] = {
        (const void *)own_pairs_kernel<DGC_GPU_F32>,
        (const void *)own_pairs_kernel<DGC_GPU_F16>,
        (const void *)own_pairs_kernel<DGC_GPU_BF16>,
        (const void *)tail_out_kernel<uint32_t>,
        (const void *)tail_out_kernel<uint16_t>,
        (const void *)tail_in_kernel<uint32_t>,
        (const void *)tail_in_kernel<uint16_t>,
        (const void *)decide_kernel,
        (const void *)clear_kernel,
        (const void *)widen_kernel<DGC_GPU_F16>,
        (const void *)widen_kernel<DGC_GPU_BF16>,
        (const void *)sum_verdict_kernel,
    };
    return preload(kernels, sizeof kernels / sizeof kernels[0]);
}

} // namespace dgc_cuda
