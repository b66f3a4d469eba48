/* The dense transport's two ends on the device (engine_cuda.h): this
 * rank's selected pairs scattered into the vector the compression zeroed,
 * and, once the front end has summed the vectors (reduce-scatter then
 * all-gather) and gathered the headers, the outcome decided from the
 * headers and the decode finished as the all-gather's is
 * (launch_decode_tail: compensation, average, conversion, masking, commit).
 *
 *   scatter     v[i] += x for this rank's pairs (indices unique: no atomics)
 *   tail out    spare = v[block * nranks ..], zeros after: the dense sum
 *               works on whole blocks, the rest goes one element a rank
 *   ... the front end's collectives ...
 *   decide      one thread: every header checked, the flags read
 *   tail in     v[block * nranks ..] = spare
 *   clear       v = 0 for a bad header (the all-gather's decode leaves zero)
 *   nan         out = NaN for a failed or non-finite rank (fp32; the
 *               conversion does it for the 16-bit types) */
#include <stdio.h>

#include "device.cuh"
#include "headers.cuh"

using namespace dgc_cuda;

namespace {

constexpr size_t kHeaderStride = sizeof(dgc_wire_header);

__global__ void __launch_bounds__(kThreads) own_pairs_kernel(const char *payload, uint64_t k, float *v) {
    const uint32_t *idx = reinterpret_cast<const uint32_t *>(payload + sizeof(dgc_wire_header));
    const float *val = reinterpret_cast<const float *>(payload + sizeof(dgc_wire_header) + 4 * k);
    for (uint64_t j = blockIdx.x * (uint64_t)kThreads + threadIdx.x; j < k; j += (uint64_t)gridDim.x * kThreads) {
        const uint32_t i = idx[j];
        const float x = val[j];
        if (i == 0 && __float_as_uint(x) == 0) continue; /* padding: x + 0.0f == x (see decode.cu) */
        v[i] = v[i] + x;
    }
}

__global__ void tail_out_kernel(const float *rest, uint64_t rem, float *spare, int nranks) {
    for (int j = threadIdx.x; j < nranks; j += blockDim.x) spare[j] = (uint64_t)j < rem ? rest[j] : 0.0f;
}

__global__ void decide_kernel(const char *headers, int nranks, uint64_t step, uint64_t n, uint64_t k, scratch *sc,
                              dgc_gpu_report *rep, unsigned long long *state_count) {
    sc->dec_mode = decide_from_headers(headers, kHeaderStride, nranks, step, n, k, rep, state_count);
}

__global__ void tail_in_kernel(float *rest, uint64_t rem, const float *spare) {
    for (uint64_t j = threadIdx.x; j < rem; j += blockDim.x) rest[j] = spare[j];
}

__global__ void __launch_bounds__(kThreads) clear_kernel(float *v, uint64_t n, const scratch *sc) {
    if (sc->dec_mode != DEC_BAD) return;
    for (uint64_t i = blockIdx.x * (uint64_t)kThreads + threadIdx.x; i < n; i += (uint64_t)gridDim.x * kThreads)
        v[i] = 0.0f;
}

/* The fp32 vector of a call: out itself, or the accumulator. */
float *vector_of(dgc_gpu_state *s, void *out, dgc_gpu_dtype dtype) {
    return dtype == DGC_GPU_F32 ? static_cast<float *>(out) : s->acc;
}

} // namespace

extern "C" int dgc_gpu_dense_view(dgc_gpu_state *s, void *out, dgc_gpu_dtype dtype, dgc_gpu_dense_vector *v) {
    if (!s || !out || !v || !s->spare || (unsigned)dtype > (unsigned)DGC_GPU_BF16 || (dtype != DGC_GPU_F32 && !s->acc))
        return -1;
    const uint64_t n = s->shape.n, r = (uint64_t)s->shape.nranks;
    v->body = vector_of(s, out, dtype);
    v->block = n / r;
    v->spare = s->spare;
    v->rem = n - v->block * r;
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

} // namespace

extern "C" int dgc_gpu_dense_scatter(dgc_gpu_state *s, void *out, dgc_gpu_dtype dtype, const dgc_step_params *p,
                                     dgc_cuda_stream stream, char *err, size_t errlen) {
    if (!s || !p) return fail_msg(err, errlen, "dgc_gpu_dense_scatter: NULL argument");
    dgc_gpu_dense_vector v;
    if (call_view(s, out, dtype, p, "dgc_gpu_dense_scatter", &v, err, errlen)) return -1;
    cudaStream_t st = (cudaStream_t)stream;
    own_pairs_kernel<<<grid_for(p->k, s->sms, 8), kThreads, 0, st>>>(static_cast<const char *>(s->payload), p->k,
                                                                     v.body);
    CHECK("launching the scatter of this rank's pairs");
    tail_out_kernel<<<1, kThreads, 0, st>>>(v.body + v.block * (uint64_t)p->nranks, v.rem, v.spare, p->nranks);
    CHECK("launching the dense sum's spare");
    return 0;
}

extern "C" int dgc_gpu_decode_dense(dgc_gpu_state *s, void *out, dgc_gpu_dtype dtype, const dgc_step_params *p,
                                    int compensate, int average, dgc_gpu_report *report, dgc_cuda_stream stream,
                                    char *err, size_t errlen) {
    if (!s || !p) return fail_msg(err, errlen, "dgc_gpu_decode_dense: NULL argument");
    dgc_gpu_dense_vector v;
    if (call_view(s, out, dtype, p, "dgc_gpu_decode_dense", &v, err, errlen)) return -1;
    const int keep = compensate && p->momentum > 0.0f;
    if (keep && !s->prev_dense) return fail_msg(err, errlen, "dgc_gpu_decode_dense: the state keeps no previous sum");
    cudaStream_t st = (cudaStream_t)stream;
    cudaError_t e;
    dgc_gpu_report *rep = device_report(report, &e);
    if (e != cudaSuccess) return fail(err, errlen, "cudaHostGetDevicePointer of the report", e);
    const uint64_t n = s->shape.n;
    scratch *sc = s->sc;

    decide_kernel<<<1, 1, 0, st>>>(static_cast<const char *>(s->gathered), p->nranks, p->step, n, p->k, sc, rep,
                                   s->nonfinite_dev);
    CHECK("launching the dense decode's decision");
    tail_in_kernel<<<1, kThreads, 0, st>>>(v.body + v.block * (uint64_t)p->nranks, v.rem, v.spare);
    CHECK("launching the dense sum's rest");
    clear_kernel<<<grid_for(n, s->sms, 8), kThreads, 0, st>>>(v.body, n, sc);
    CHECK("launching the clear of a bad step");
    if (dtype == DGC_GPU_F32 && (e = nan_launch(out, dtype, n, &sc->dec_mode, s->sms, st)) != cudaSuccess)
        return fail(err, errlen, "launching the NaN fill", e);
    return launch_decode_tail(s, out, v.body, dtype, p, keep ? PREV_DENSE : PREV_NONE, average, p->k, st, err,
                              errlen);
}
