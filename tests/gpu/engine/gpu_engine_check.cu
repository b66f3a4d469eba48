/* The CUDA engine against the host engine, case by case:
 *
 *   gpu_engine_check CASE [--small]
 *     CASE: against_host half_inputs determinism bad_payloads nonfinite
 *           overflow ties large dense_transport compact compact_fuzz
 *           sum_rules clamp saturation, or all
 *     --small: small buffers only (for compute-sanitizer's memcheck and
 *              racecheck, which run each kernel many times slower)
 *
 * The reference is what the MPI path does with the host engine:
 * dgc_compress, then dgc_wire_decode of the gathered payloads, dgc_commit or
 * dgc_discard, dgc_wire_subtract for momentum compensation. Simulated ranks
 * are GPU states on one device, their payloads gathered by device copies.
 * With clipping off everything is compared bit for bit: the selected pairs,
 * u and v, the output.
 *
 * Ties: where the k-th largest value occurs more than once and not all its
 * ties fit, both engines take them in index order, on every path (the GPU's
 * candidates come in no order: a select by index finds the cut), so the
 * pairs must match there too.
 *
 * Exit: 0 all passed, 1 a failure, 77 no usable CUDA device. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "dgcshim/engine.h"
#include "dgcshim/engine_cuda.h"
#include "dgcshim/policy.h"
#include "dgcshim/sum_rules.h"
#include "dgcshim/wire.h"
#include "dgcshim/wire_compact.h"

namespace {

int failures = 0;
int failures_before = 0; /* at the start of the current case */
bool small_mode = false;
const char *case_name = "";

#define CK(x)                                                                                                        \
    do {                                                                                                             \
        cudaError_t e_ = (x);                                                                                        \
        if (e_ != cudaSuccess) {                                                                                     \
            fprintf(stderr, "FATAL %s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));                \
            exit(1);                                                                                                 \
        }                                                                                                            \
    } while (0)

void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("FAIL gpu.engine.%s: ", case_name);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    failures++;
}

const char *verdict() { return failures > failures_before ? "FAIL" : "PASS"; }

uint32_t bits_of(float x) {
    uint32_t b;
    memcpy(&b, &x, 4);
    return b;
}
float float_of(uint32_t b) {
    float x;
    memcpy(&x, &b, 4);
    return x;
}

struct rng {
    uint64_t s;
    explicit rng(uint64_t seed) : s(seed * 0x9e3779b97f4a7c15ull + 1) {}
    uint64_t next() {
        uint64_t z = (s += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    /* Random sign, magnitude log-uniform over [2^-20, 2) with a full random
     * mantissa: ties among the largest values are rare. */
    float grad() {
        const uint64_t r = next();
        const uint32_t exp = 107u + (uint32_t)((r >> 32) % 21u);
        return float_of((uint32_t)(r >> 63) << 31 | exp << 23 | ((uint32_t)r & 0x7fffffu));
    }
};

/* ---------------------------------------------------------------- element types */

size_t dsize(dgc_gpu_dtype t) { return dgc_gpu_dtype_size(t); }
const char *dname(dgc_gpu_dtype t) { return t == DGC_GPU_F32 ? "f32" : t == DGC_GPU_F16 ? "f16" : "bf16"; }

/* fp32 -> the dtype's bits, round to nearest (the device's conversion). */
uint32_t to_dtype_bits(float x, dgc_gpu_dtype t) {
    if (t == DGC_GPU_F32) return bits_of(x);
    if (t == DGC_GPU_F16) {
        const __half_raw h = __float2half_rn(x);
        return h.x;
    }
    const __nv_bfloat16_raw h = __float2bfloat16_rn(x);
    return h.x;
}
float from_dtype_bits(uint32_t b, dgc_gpu_dtype t) {
    if (t == DGC_GPU_F32) return float_of(b);
    if (t == DGC_GPU_F16) {
        __half_raw h;
        h.x = (unsigned short)b;
        return __half2float(__half(h));
    }
    __nv_bfloat16_raw h;
    h.x = (unsigned short)b;
    return __bfloat162float(__nv_bfloat16(h));
}
uint32_t nan_bits(dgc_gpu_dtype t) { return t == DGC_GPU_F32 ? 0x7fc00000u : t == DGC_GPU_F16 ? 0x7e00u : 0x7fc0u; }

/* A buffer of n elements of dtype on the host, as raw bits. */
struct hbuf {
    dgc_gpu_dtype t;
    std::vector<uint8_t> b;
    hbuf(uint64_t n, dgc_gpu_dtype type) : t(type), b(n * dsize(type)) {}
    uint32_t get(uint64_t i) const {
        if (t == DGC_GPU_F32) {
            uint32_t x;
            memcpy(&x, &b[i * 4], 4);
            return x;
        }
        uint16_t x;
        memcpy(&x, &b[i * 2], 2);
        return x;
    }
    void set(uint64_t i, uint32_t x) {
        if (t == DGC_GPU_F32) memcpy(&b[i * 4], &x, 4);
        else {
            uint16_t y = (uint16_t)x;
            memcpy(&b[i * 2], &y, 2);
        }
    }
};

/* ---------------------------------------------------------------- payloads */

typedef std::vector<std::pair<uint32_t, uint32_t>> pairs; /* (index, value bits) */

dgc_wire_header header_of(const uint8_t *pl) {
    dgc_wire_header h;
    memcpy(&h, pl, sizeof h);
    return h;
}
uint32_t slot_index(const uint8_t *pl, uint64_t k, uint64_t j) {
    (void)k;
    uint32_t x;
    memcpy(&x, pl + sizeof(dgc_wire_header) + 4 * j, 4);
    return x;
}
uint32_t slot_value(const uint8_t *pl, uint64_t k, uint64_t j) {
    uint32_t x;
    memcpy(&x, pl + sizeof(dgc_wire_header) + 4 * k + 4 * j, 4);
    return x;
}
void set_slot(uint8_t *pl, uint64_t k, uint64_t j, uint32_t idx, uint32_t val) {
    memcpy(pl + sizeof(dgc_wire_header) + 4 * j, &idx, 4);
    memcpy(pl + sizeof(dgc_wire_header) + 4 * k + 4 * j, &val, 4);
}

/* The pairs of a payload as the wire defines them (wire.h): padding is the
 * trailing run of (0, +0.0f) slots. Indices strictly increase, so a real
 * (0, +0.0f) can only come first (a value at index 0 that rounded to +0 for
 * the wire), and it is real when pairs follow it; alone it is the padding
 * (the compact count leaves it out). Either way it adds nothing to a sum. */
bool is_pad(const std::pair<uint32_t, uint32_t> &p) { return p.first == 0 && p.second == 0; }
void drop_padding(pairs *p) {
    while (!p->empty() && is_pad(p->back())) p->pop_back();
}

/* The first nreal slots of a host payload, sorted by index, padding dropped. */
pairs host_pairs(const uint8_t *pl, uint64_t k, uint64_t nreal) {
    pairs p;
    for (uint64_t j = 0; j < nreal; j++) p.push_back({slot_index(pl, k, j), slot_value(pl, k, j)});
    std::sort(p.begin(), p.end());
    drop_padding(&p);
    return p;
}

/* The real pairs of a GPU payload; false (with why) when its layout breaks
 * the GPU rule: strictly increasing real pairs, then padding (0, +0.0f). */
bool gpu_pairs(const uint8_t *pl, uint64_t k, uint64_t n, pairs *out, std::string *why) {
    out->clear();
    char msg[160];
    uint64_t end = k; /* the padding: slots [end, k) */
    while (end > 0 && slot_index(pl, k, end - 1) == 0 && slot_value(pl, k, end - 1) == 0) end--;
    for (uint64_t j = 0; j < end; j++) {
        const uint32_t i = slot_index(pl, k, j), v = slot_value(pl, k, j);
        if (i >= n || (!out->empty() && out->back().first >= i)) {
            snprintf(msg, sizeof msg, "slot %llu (index %u, value 0x%08x) breaks the layout",
                     (unsigned long long)j, i, v);
            *why = msg;
            return false;
        }
        out->push_back({i, v});
    }
    return true;
}

/* ---------------------------------------------------------------- the simulation */

struct variant {
    float m;
    int nesterov, masking, compensate, in_place, average;
    double clip;
};

struct config {
    uint64_t n;
    double density;      /* target density; k per step from dgc_density_at */
    uint64_t warmup;     /* warm-up steps (0: the target from the start) */
    double ratio;        /* DGC_SAMPLE_RATIO */
    variant v;
    int nranks;
    int steps;
    dgc_gpu_dtype dtype;
    int gen;             /* 0: independent log-uniform; 1: fp16-distinct; 2: shared large values; 3: ties;
                          * 4: k non-zeros, index 0 tiny; 5: shared values near fp16's top;
                          * 6: huge and steady (1e38 to 2e38, a sign per element) */
    bool misalign;       /* g and out one element past an aligned address: the element-wise pass */
    uint64_t seed;
    int transport;       /* TRANSPORT_*: how the pairs travel, step by step */
    unsigned vbits;      /* DGC_VALUE_BITS and the wire: 0, plain pairs; 16 or 32, compact payloads */
    bool resize;         /* before each step, move every state into the smallest shape the steps left need,
                          * as the NCCL path does at the warm-up's end (dgc_gpu_state_resize) */
};

/* The dense transport (dgc_gpu_dense_scatter, a simulated reduce-scatter
 * and all-gather, dgc_gpu_decode_dense) every step, or in turns of two
 * steps (dense, dense, sparse, sparse, ...: every change of transport and
 * of how the compensation keeps the previous sum). */
enum { TRANSPORT_SPARSE = 0, TRANSPORT_DENSE = 1, TRANSPORT_TURNS = 2 };

bool dense_at(const config &c, uint64_t step) {
    return c.transport == TRANSPORT_DENSE || (c.transport == TRANSPORT_TURNS && (step / 2) % 2 == 0);
}

std::string describe(const config &c) {
    char b[300];
    snprintf(b, sizeof b, "n %llu density %g warmup %llu ratio %g m %g nesterov %d masking %d compensate %d in-place %d "
                          "average %d ranks %d %s%s%s%s",
             (unsigned long long)c.n, c.density, (unsigned long long)c.warmup, c.ratio, (double)c.v.m, c.v.nesterov,
             c.v.masking, c.v.compensate, c.v.in_place, c.v.average, c.nranks, dname(c.dtype),
             c.misalign ? " misaligned" : "",
             c.transport == TRANSPORT_DENSE ? " dense" : c.transport == TRANSPORT_TURNS ? " dense/sparse" : "",
             c.vbits == 16 ? " compact16" : c.vbits == 32 ? " compact32" : "");
    return b;
}

uint64_t k_at(const config &c, uint64_t step) {
    return dgc_k_for(c.n, dgc_density_at(1.0 - c.density, c.warmup, step));
}

struct sim {
    config c;
    cudaStream_t st = nullptr;
    std::vector<dgc_gpu_state *> gs;
    std::vector<dgc_state *> hs;
    std::vector<void *> dg, dout;          /* device g and out, per rank (the same when in place) */
    std::vector<void *> allocs;            /* what cudaMalloc returned */
    std::vector<dgc_gpu_report *> rep;     /* one per rank: a rank's report is its own */
    std::vector<uint8_t> hprev;            /* host compensation: last finite step's gathered payloads, */
    uint64_t hprev_k = 0;                  /* their k (0: none kept as payloads) */
    std::vector<float> hprev_dense;        /* or its dense sum (a dense-transport step) */
    uint64_t hprev_step = 0;               /* the step it was summed at: its age in the headers */
    uint64_t kmax = 0;
    int64_t poison_sum = -1;               /* dense_exchange: this element of the sum made Inf (16-bit) */
    int resized = 0, kept_refused = 0;     /* c.resize: states moved, moves refused for what they keep */
    bool ok = true;

    explicit sim(const config &cfg) : c(cfg) {
        CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
        kmax = k_at(c, 0);
        for (uint64_t s = 1; s < (uint64_t)c.steps + 2; s++) kmax = std::max(kmax, k_at(c, s));
        dgc_gpu_shape sh;
        sh.n = c.n;
        sh.k = kmax;
        sh.sparse_k = c.transport == TRANSPORT_DENSE ? 0 : kmax;
        sh.dense = c.transport != TRANSPORT_SPARSE;
        sh.value_bits = c.vbits;
        sh.nranks = c.nranks;
        sh.with_momentum = c.v.m > 0;
        sh.keep_prev = c.v.compensate && c.v.m > 0;
        sh.dtype = c.dtype;
        for (int r = 0; r < c.nranks; r++) {
            char err[256] = "";
            dgc_gpu_state *s = dgc_gpu_state_create(&sh, (dgc_cuda_stream)st, err, sizeof err);
            if (!s) {
                fail("dgc_gpu_state_create (%s): %s", describe(c).c_str(), err);
                ok = false;
                return;
            }
            if (dgc_gpu_state_bytes(s) != dgc_gpu_state_footprint(&sh)) {
                fail("state bytes %zu != footprint %zu", dgc_gpu_state_bytes(s), dgc_gpu_state_footprint(&sh));
                ok = false;
            }
            gs.push_back(s);
            hs.push_back(dgc_state_create(c.n, c.v.m > 0));
            const size_t skip = c.misalign ? dsize(c.dtype) : 0;
            void *g = nullptr, *o = nullptr;
            CK(cudaMalloc(&g, c.n * dsize(c.dtype) + skip));
            allocs.push_back(g);
            if (c.v.in_place) o = g;
            else {
                CK(cudaMalloc(&o, c.n * dsize(c.dtype) + skip));
                allocs.push_back(o);
            }
            dg.push_back((char *)g + skip);
            dout.push_back((char *)o + skip);
            rep.push_back(dgc_gpu_report_create());
        }
    }
    ~sim() {
        cudaStreamSynchronize(st);
        for (size_t r = 0; r < gs.size(); r++) {
            dgc_gpu_state_destroy(gs[r]);
            dgc_state_destroy(hs[r]);
        }
        for (size_t r = 0; r < rep.size(); r++) dgc_gpu_report_destroy(rep[r]);
        for (void *a : allocs) cudaFree(a);
        cudaStreamDestroy(st);
    }
    dgc_step_params params(uint64_t step, uint64_t k) const {
        dgc_step_params p;
        memset(&p, 0, sizeof p);
        p.n = c.n;
        p.step = step;
        p.k = k;
        p.momentum = c.v.m;
        p.nesterov = c.v.nesterov;
        p.momentum_masking = c.v.masking;
        p.clip_norm = c.v.clip;
        p.nranks = c.nranks;
        p.sample_ratio = c.ratio;
        p.value_bits = c.vbits;
        /* The dense transport sums a 16-bit buffer in its type: the pairs
         * rounded to it, on the device and on the host alike. */
        p.sum_type = dense_at(c, step) ? dgc_gpu_sum_type_of(c.dtype) : (unsigned)DGC_SUM_F32;
        /* As the NCCL path sets it: the output goes back into dtype. */
        p.clamp_bits = dgc_policy_value_limit_bits(dgc_gpu_sum_type_of(c.dtype), c.nranks,
                                                   c.v.compensate && c.v.m > 0 ? (double)c.v.m : 0.0);
        return p;
    }
};

/* This step's gradient of rank r: the dtype's bits (what the GPU reads) and
 * their exact fp32 values (what the host engine reads). */
void make_grad(const config &c, uint64_t step, int r, hbuf *g, std::vector<float> *g32) {
    rng R(c.seed * 1000003ull + step * 7919ull + (uint64_t)r);
    rng shared(c.seed * 1000003ull + step * 7919ull + 999ull);
    g32->resize(c.n);
    if (c.gen == 1) {
        /* Distinct magnitudes for the largest values even in fp16 (10-bit
         * mantissa) and bf16 (7): the element of rank q in a random
         * permutation gets 2^(-q/per) * (1 + (q % per)/per), per being the
         * mantissa's steps; the smallest are zero. */
        const uint64_t per = c.dtype == DGC_GPU_BF16 ? 128 : 1024;
        std::vector<uint32_t> perm(c.n);
        for (uint64_t i = 0; i < c.n; i++) perm[i] = (uint32_t)i;
        for (uint64_t i = c.n - 1; i > 0; i--) std::swap(perm[i], perm[R.next() % (i + 1)]);
        for (uint64_t i = 0; i < c.n; i++) {
            const uint64_t q = perm[i], e = q / per;
            float x = e < 14 ? ldexpf(1.0f + (float)(q % per) / (float)per, -(int)e) : 0.0f;
            if (R.next() & 1) x = -x;
            (*g32)[i] = x;
        }
    } else if (c.gen == 4) {
        /* k - 1 non-zeros at places fixed per rank (the same every step, so
         * the residual stays on them), index 0 at 2^-41 below values of at
         * least 2^-20: k non-zeros in all, no tie at the k-th. */
        const uint64_t k = dgc_k_for(c.n, c.density);
        rng place(c.seed * 31 + (uint64_t)r);
        for (uint64_t i = 0; i < c.n; i++) (*g32)[i] = 0.0f;
        for (uint64_t placed = 0; placed + 1 < k;) {
            const uint64_t i = 1 + place.next() % (c.n - 1);
            if ((*g32)[i] != 0.0f) continue;
            (*g32)[i] = R.grad();
            placed++;
        }
        (*g32)[0] = ldexpf(1.0f, -41);
    } else if (c.gen == 5) {
        /* One element in 50 at places fixed for the case, the same on
         * every rank, at 2^14 to 65504; the rest below 7: the ranks' fp32
         * sum of the large ones passes fp16's range unless each rank clamps
         * what it sends (dgc_sum_limit_bits). Half the places change sign
         * every step, so that with compensation S_t - m S_{t-1} adds two
         * sums of one sign (the clamp divided by 1 + m). */
        rng place(c.seed);
        for (uint64_t i = 0; i < c.n; i++) {
            const bool large = place.next() % 50 == 0;
            const bool flip = place.next() & 1;
            const float sign = (place.next() & 1) != (flip && step % 2) ? -1.0f : 1.0f;
            (*g32)[i] = large ? sign * (float)(16384 + R.next() % 49121)
                              : sign * (float)((R.next() >> 40) & 0xffff) * 1e-4f;
        }
    } else if (c.gen == 6) {
        /* Huge and steady: each element 1e38 to 2e38 with a sign fixed for
         * the case, every step: what is held back passes fp32's range
         * within a step or two, and the rules hold it at +-FLT_MAX
         * (update_rules.h); the values sent are clamped to the ranks' limit. */
        rng place(c.seed * 77 + (uint64_t)r);
        for (uint64_t i = 0; i < c.n; i++) {
            const float sign = place.next() & 1 ? -1.0f : 1.0f;
            (*g32)[i] = sign * 1e38f * (1.0f + (float)((place.next() >> 40) & 0xffffff) / 16777216.0f);
        }
    } else if (c.gen == 3) {
        /* Ties: a tenth of the elements at 1.0, one in 2000 at 2.0 (fewer
         * than k, so that t is 1.0), the rest small. */
        rng place(c.seed); /* the same places every step */
        for (uint64_t i = 0; i < c.n; i++) {
            const uint64_t q = place.next() % 2000;
            (*g32)[i] = q < 200 ? 1.0f : q == 200 ? 2.0f : (float)((R.next() >> 40) & 0xffff) * 1e-7f;
        }
    } else {
        for (uint64_t i = 0; i < c.n; i++) {
            float x = R.grad();
            if (c.gen == 2) { /* the same large values on every rank: indices overlap */
                const float y = shared.grad();
                x = fabsf(y) > 0.25f ? y + x * 1e-3f : x * 1e-3f;
            }
            (*g32)[i] = x;
        }
    }
    for (uint64_t i = 0; i < c.n; i++) {
        const uint32_t b = to_dtype_bits((*g32)[i], c.dtype);
        g->set(i, b);
        (*g32)[i] = from_dtype_bits(b, c.dtype); /* exactly what the device converts */
    }
}

enum { STEP_OK = 0, STEP_FAIL = 1 };

/* a + b in dtype, as NCCL's sum of two elements leaves it: the exact sum
 * rounded once (for fp16 and bf16 the fp32 sum of two 16-bit values is
 * exact, or too far from a tie to round differently), Inf past the range. */
uint32_t add_in(dgc_gpu_dtype t, uint32_t a, uint32_t b) {
    return to_dtype_bits(from_dtype_bits(a, t) + from_dtype_bits(b, t), t);
}

/* Element-wise sum of the ranks' vectors (raw bits of dtype t, n each) in
 * rank order: what a reduce-scatter then an all-gather leave on every
 * rank, one sum per element copied to all. */
std::vector<uint32_t> rank_order_sum(dgc_gpu_dtype t, const std::vector<std::vector<uint32_t>> &v) {
    std::vector<uint32_t> sum = v[0];
    for (size_t r = 1; r < v.size(); r++)
        for (size_t i = 0; i < sum.size(); i++) sum[i] = add_in(t, sum[i], v[r][i]);
    return sum;
}

/* The dense transport between the simulated ranks, as the NCCL front end
 * runs it: each rank's pairs scattered, its header all-gathered, the
 * vectors (blocks and spare, in the buffer's type) summed in rank order
 * and the sum copied back into every rank's vector. */
bool dense_exchange(sim &S, const dgc_step_params &p, bool damage_header, char *err, size_t errlen) {
    const int R = S.c.nranks;
    const dgc_gpu_dtype t = S.c.dtype;
    const size_t e = dsize(t);
    std::vector<dgc_gpu_dense_vector> v(R);
    for (int r = 0; r < R; r++) {
        if (dgc_gpu_dense_view(S.gs[r], S.dout[r], t, &v[r]) || v[r].type != t) {
            snprintf(err, errlen, "dgc_gpu_dense_view refused rank %d's state, or not in the buffer's type", r);
            return false;
        }
        if (dgc_gpu_dense_scatter(S.gs[r], S.dout[r], t, &p, (dgc_cuda_stream)S.st, err, errlen)) return false;
    }
    const uint64_t body = v[0].block * (uint64_t)R, all = body + (uint64_t)R;
    std::vector<std::vector<uint8_t>> raw(R, std::vector<uint8_t>(all * e));
    for (int r = 0; r < R; r++) {
        CK(cudaMemcpyAsync(raw[r].data(), v[r].body, body * e, cudaMemcpyDeviceToHost, S.st));
        CK(cudaMemcpyAsync(raw[r].data() + body * e, v[r].spare, R * e, cudaMemcpyDeviceToHost, S.st));
    }
    CK(cudaStreamSynchronize(S.st));
    std::vector<std::vector<uint32_t>> hv(R, std::vector<uint32_t>(all));
    for (int r = 0; r < R; r++)
        for (uint64_t i = 0; i < all; i++) {
            uint32_t b = 0;
            memcpy(&b, raw[r].data() + i * e, e);
            hv[r][i] = b;
        }
    std::vector<uint32_t> sum = rank_order_sum(t, hv);
    if (S.poison_sum >= 0) sum[(size_t)S.poison_sum] = to_dtype_bits(INFINITY, t); /* as an overflow leaves it */
    std::vector<uint8_t> out(all * e);
    for (uint64_t i = 0; i < all; i++) memcpy(out.data() + i * e, &sum[i], e);
    for (int q = 0; q < R; q++) {
        CK(cudaMemcpyAsync(v[q].body, out.data(), body * e, cudaMemcpyHostToDevice, S.st));
        CK(cudaMemcpyAsync(v[q].spare, out.data() + body * e, R * e, cudaMemcpyHostToDevice, S.st));
        for (int r = 0; r < R; r++)
            CK(cudaMemcpyAsync((char *)dgc_gpu_gathered(S.gs[q]) + (size_t)r * sizeof(dgc_wire_header),
                               dgc_gpu_payload(S.gs[r]), sizeof(dgc_wire_header), cudaMemcpyDeviceToDevice, S.st));
        if (damage_header) /* rank 1's magic, 0 in every rank's copy */
            CK(cudaMemsetAsync((char *)dgc_gpu_gathered(S.gs[q]) + sizeof(dgc_wire_header), 0, 4, S.st));
    }
    CK(cudaStreamSynchronize(S.st)); /* out lives on this stack */
    return true;
}

/* The host's side of a 16-bit dense sum: each rank's pairs (from its plain
 * payload, already rounded to the type) written into a zero vector of the
 * type, the vectors summed in rank order, widened to fp32. */
std::vector<float> host_dense_sum16(dgc_gpu_dtype t, const std::vector<uint8_t> &gathered, int R, uint64_t n,
                                    uint64_t k) {
    const size_t wb = dgc_wire_bytes(k);
    std::vector<std::vector<uint32_t>> hv(R, std::vector<uint32_t>(n, 0));
    for (int r = 0; r < R; r++) {
        const uint8_t *pl = gathered.data() + (size_t)r * wb;
        for (uint64_t j = 0; j < k; j++) {
            uint32_t i;
            float x;
            memcpy(&i, pl + sizeof(dgc_wire_header) + 4 * j, 4);
            memcpy(&x, pl + sizeof(dgc_wire_header) + 4 * k + 4 * j, 4);
            if (i == 0 && bits_of(x) == 0) continue; /* padding */
            hv[r][i] = add_in(t, hv[r][i], to_dtype_bits(x, t));
        }
    }
    const std::vector<uint32_t> sum = rank_order_sum(t, hv);
    std::vector<float> out(n);
    for (uint64_t i = 0; i < n; i++) out[i] = from_dtype_bits(sum[i], t);
    return out;
}

/* One call on every simulated rank, GPU and host, and the comparison.
 * poison: (rank, index) given NaN in g, rank -1 for none. */
/* What the steps from step on need (the NCCL path's outlook): the largest
 * k, the largest that goes sparse, whether any goes dense. */
dgc_gpu_shape shape_from(const sim &S, uint64_t step) {
    dgc_gpu_shape sh = *dgc_gpu_state_shape(S.gs[0]);
    sh.k = sh.sparse_k = 0;
    sh.dense = 0;
    for (uint64_t s = step; s < (uint64_t)S.c.steps + 2; s++) {
        sh.k = std::max(sh.k, k_at(S.c, s));
        if (dense_at(S.c, s)) sh.dense = 1;
        else sh.sparse_k = std::max(sh.sparse_k, k_at(S.c, s));
    }
    return sh;
}

/* c.resize: each rank's state into the shape the steps left need, where
 * that is much smaller (the NCCL path's rule) and what it keeps fits. 0, or
 * -1 (failed). */
int resize_states(sim &S, uint64_t step) {
    const dgc_gpu_shape want = shape_from(S, step);
    for (int r = 0; r < S.c.nranks; r++) {
        const dgc_gpu_shape *have = dgc_gpu_state_shape(S.gs[r]);
        if (!(2 * want.k <= have->k || 2 * want.sparse_k <= have->sparse_k || (have->dense && !want.dense))) continue;
        if (!dgc_gpu_state_kept_fits(S.gs[r], &want)) { /* every step is done here: only what it keeps can refuse */
            S.kept_refused++;
            continue;
        }
        char err[256] = "";
        dgc_gpu_state *t = dgc_gpu_state_resize(S.gs[r], &want, (dgc_cuda_stream)S.st, err, sizeof err);
        if (!t) {
            fail("dgc_gpu_state_resize at step %llu: %s (%s)", (unsigned long long)step, err, describe(S.c).c_str());
            return -1;
        }
        if (dgc_gpu_state_bytes(t) != dgc_gpu_state_footprint(&want)) {
            fail("resized state bytes %zu != footprint %zu", dgc_gpu_state_bytes(t), dgc_gpu_state_footprint(&want));
            return -1;
        }
        S.gs[r] = t;
        S.resized++;
    }
    return 0;
}

int run_step(sim &S, uint64_t step, int poison_rank = -1, uint64_t poison_index = 0, bool corrupt = false) {
    const config &c = S.c;
    if (c.resize && resize_states(S, step)) return STEP_FAIL;
    const int R = c.nranks;
    const uint64_t n = c.n, k = k_at(c, step);
    const dgc_step_params p = S.params(step, k);
    const size_t wb = dgc_wire_bytes(k), cw = dgc_gpu_wire_bytes(S.gs[0], k);
    const std::string what = describe(c) + " step " + std::to_string(step) + " k " + std::to_string(k);
    char err[256] = "";

    std::vector<hbuf> g(R, hbuf(n, c.dtype));
    std::vector<std::vector<float>> g32(R);
    for (int r = 0; r < R; r++) {
        make_grad(c, step, r, &g[r], &g32[r]);
        if (r == poison_rank) {
            g32[r][poison_index] = NAN;
            g[r].set(poison_index, nan_bits(c.dtype));
        }
        CK(cudaMemcpyAsync(S.dg[r], g[r].b.data(), g[r].b.size(), cudaMemcpyHostToDevice, S.st));
    }
    /* GPU: compress, gather (device copies), decode on every rank. */
    for (int r = 0; r < R; r++)
        if (dgc_gpu_compress(S.gs[r], S.dg[r], S.dout[r], c.dtype, &p, (dgc_cuda_stream)S.st, err, sizeof err)) {
            fail("dgc_gpu_compress: %s (%s)", err, what.c_str());
            return STEP_FAIL;
        }
    const bool dense = dense_at(c, step);
    if (dense) {
        if (!dense_exchange(S, p, corrupt, err, sizeof err)) {
            fail("dense transport: %s (%s)", err, what.c_str());
            return STEP_FAIL;
        }
    } else {
        for (int r = 0; r < R; r++)
            if (dgc_gpu_encode(S.gs[r], &p, (dgc_cuda_stream)S.st, err, sizeof err)) {
                fail("dgc_gpu_encode: %s (%s)", err, what.c_str());
                return STEP_FAIL;
            }
        for (int q = 0; q < R; q++)
            for (int r = 0; r < R; r++)
                CK(cudaMemcpyAsync((char *)dgc_gpu_wire_gathered(S.gs[q]) + (size_t)r * cw, dgc_gpu_wire(S.gs[r]), cw,
                                   cudaMemcpyDeviceToDevice, S.st));
        if (corrupt)
            for (int q = 0; q < R; q++) /* the count word's reserved bits: every rank must reject rank 1's payload */
                CK(cudaMemsetAsync((char *)dgc_gpu_wire_gathered(S.gs[q]) + cw + 32 + 5, 0x01, 1, S.st));
    }
    for (int q = 0; q < R; q++)
        if ((dense ? dgc_gpu_decode_dense : dgc_gpu_decode)(S.gs[q], S.dout[q], c.dtype, &p, c.v.compensate,
                                                            c.v.average, S.rep[q], (dgc_cuda_stream)S.st, err,
                                                            sizeof err)) {
            fail("dgc_gpu_decode%s: %s (%s)", dense ? "_dense" : "", err, what.c_str());
            return STEP_FAIL;
        }
    std::vector<uint8_t> gathered((size_t)R * wb), wires((size_t)R * cw);
    for (int r = 0; r < R; r++) {
        CK(cudaMemcpyAsync(gathered.data() + (size_t)r * wb, dgc_gpu_payload(S.gs[r]), wb, cudaMemcpyDeviceToHost,
                           S.st));
        if (c.vbits && !dense)
            CK(cudaMemcpyAsync(wires.data() + (size_t)r * cw, dgc_gpu_wire(S.gs[r]), cw, cudaMemcpyDeviceToHost, S.st));
    }
    std::vector<hbuf> out(R, hbuf(n, c.dtype));
    for (int r = 0; r < R; r++)
        CK(cudaMemcpyAsync(out[r].b.data(), S.dout[r], out[r].b.size(), cudaMemcpyDeviceToHost, S.st));
    CK(cudaStreamSynchronize(S.st));

    /* Host: compress each rank, compare payloads. */
    std::vector<uint8_t> hpay(wb);
    for (int r = 0; r < R; r++) {
        if (dgc_compress(S.hs[r], g32[r].data(), &p, hpay.data())) {
            fail("host dgc_compress failed (%s)", what.c_str());
            return STEP_FAIL;
        }
        const uint8_t *gp = gathered.data() + (size_t)r * wb;
        const dgc_wire_header hh = header_of(hpay.data()), gh = header_of(gp);
        /* The host engine leaves the age to its front end; the device packs
         * it: the steps since the kept sum's (wire.h), 0 while none is kept. */
        const bool kept = c.v.compensate && c.v.m > 0 && (S.hprev_k || !S.hprev_dense.empty());
        const uint32_t want_flags = hh.flags | (kept ? DGC_WIRE_AGE_BITS(step - S.hprev_step) : 0u);
        if (hh.magic != gh.magic || want_flags != gh.flags || hh.step != gh.step || hh.n != gh.n || hh.k != gh.k) {
            fail("rank %d header: host (magic 0x%x flags 0x%x step %llu n %llu k %llu), gpu (0x%x 0x%x %llu %llu %llu) "
                 "(%s)",
                 r, hh.magic, want_flags, (unsigned long long)hh.step, (unsigned long long)hh.n,
                 (unsigned long long)hh.k, gh.magic, gh.flags, (unsigned long long)gh.step, (unsigned long long)gh.n,
                 (unsigned long long)gh.k, what.c_str());
            return STEP_FAIL;
        }
        pairs hp = host_pairs(hpay.data(), k, dgc_last_selected(S.hs[r])), gp_pairs;
        std::string why;
        if (!gpu_pairs(gp, k, n, &gp_pairs, &why)) {
            fail("rank %d gpu payload: %s (%s)", r, why.c_str(), what.c_str());
            return STEP_FAIL;
        }
        if (hp != gp_pairs) {
            size_t j = 0;
            while (j < hp.size() && j < gp_pairs.size() && hp[j] == gp_pairs[j]) j++;
            fail("rank %d pairs differ: host %zu, gpu %zu; first difference at sorted position %zu: host (%u, 0x%08x) "
                 "gpu (%u, 0x%08x) (%s)",
                 r, hp.size(), gp_pairs.size(), j, j < hp.size() ? hp[j].first : 0u,
                 j < hp.size() ? hp[j].second : 0u, j < gp_pairs.size() ? gp_pairs[j].first : 0u,
                 j < gp_pairs.size() ? gp_pairs[j].second : 0u, what.c_str());
            return STEP_FAIL;
        }
    }

    /* Compact payloads: each rank's, as the device encoded it, is the host
     * encoder's bytes for its plain payload. */
    if (c.vbits && !dense) {
        dgc_compact_layout L;
        dgc_compact_layout_for(n, k, c.vbits, &L);
        std::vector<uint8_t> want(L.bytes);
        for (int r = 0; r < R; r++) {
            if (dgc_compact_encode(gathered.data() + (size_t)r * wb, &L, want.data())) {
                fail("rank %d: the host encoder refuses the GPU's plain payload (%s)", r, what.c_str());
                return STEP_FAIL;
            }
            if (memcmp(want.data(), wires.data() + (size_t)r * cw, L.bytes) != 0) {
                size_t b = 0;
                while (want[b] == wires[(size_t)r * cw + b]) b++;
                fail("rank %d compact payload differs from the host encoder's at byte %zu of %zu (%s)", r, b, L.bytes,
                     what.c_str());
                return STEP_FAIL;
            }
        }
    }
    if (corrupt) { /* every rank rejected rank 1's payload: output zero, no state changed, the report says why */
        /* the sparse all-gather: the count word's reserved bits (fault 1); the
         * dense transport: the header's magic, 0 */
        const unsigned want_bad = dense ? (unsigned)DGC_GPU_BAD_MAGIC : (unsigned)DGC_GPU_BAD_CODE;
        const unsigned long long want_value = dense ? 0 : 1;
        for (int r = 0; r < R; r++) dgc_discard(S.hs[r]);
        for (int q = 0; q < R; q++) {
            for (uint64_t i = 0; i < n; i++)
                if (out[q].get(i) != 0) {
                    fail("rank %d output[%llu] = 0x%x after a bad payload, expected 0 (%s)", q,
                         (unsigned long long)i, out[q].get(i), what.c_str());
                    return STEP_FAIL;
                }
            if (S.rep[q]->bad != want_bad || S.rep[q]->bad_rank != 1 || S.rep[q]->bad_value != want_value) {
                fail("rank %d report: bad %u rank %d value %llu, expected %u from rank 1, value %llu (%s)", q,
                     S.rep[q]->bad, S.rep[q]->bad_rank, (unsigned long long)S.rep[q]->bad_value, want_bad, want_value,
                     what.c_str());
                return STEP_FAIL;
            }
        }
        return STEP_OK; /* the states are compared at the next step, which builds on the unchanged ones */
    }

    /* Host decode of the very bytes the GPU gathered, then what the MPI
     * path does: commit, compensation; the average and the conversion as
     * the GPU path defines them. */
    std::vector<float> hout(n);
    dgc_decode_result res = dgc_wire_decode(gathered.data(), R, step, n, k, hout.data(), err, sizeof err);
    if (res == DGC_DECODE_BAD) {
        fail("host decode of the GPU payloads: %s (%s)", err, what.c_str());
        return STEP_FAIL;
    }
    if (res == DGC_DECODE_OK && dense && c.dtype != DGC_GPU_F32) {
        /* The pairs were rounded to the type: the fp32 sum of two ranks'
         * would differ from the 16-bit one only past rounding; here it is
         * what the device must have summed. */
        for (int r = 0; r < R; r++) {
            const float *val = reinterpret_cast<const float *>(gathered.data() + (size_t)r * wb +
                                                                sizeof(dgc_wire_header) + 4 * k);
            for (uint64_t j = 0; j < k; j++)
                if (!isfinite(val[j]) || from_dtype_bits(to_dtype_bits(val[j], c.dtype), c.dtype) != val[j]) {
                    fail("rank %d slot %llu: value %a is not on the %s grid of the 16-bit dense sum (%s)", r,
                         (unsigned long long)j, (double)val[j], dname(c.dtype), what.c_str());
                    return STEP_FAIL;
                }
        }
        hout = host_dense_sum16(c.dtype, gathered, R, n, k);
        if (S.poison_sum >= 0) hout[(size_t)S.poison_sum] = INFINITY;
        for (uint64_t i = 0; i < n; i++) /* a sum that overflowed drops the step, as a non-finite gradient does */
            if (!isfinite(hout[i])) res = DGC_DECODE_NONFINITE;
    }
    if (res == DGC_DECODE_OK) {
        for (int r = 0; r < R; r++) dgc_commit(S.hs[r], &p);
        if (c.v.compensate && c.v.m > 0) { /* as the MPI path compensates, either way the sum was kept */
            const std::vector<float> sum = hout;
            if (S.hprev_k) dgc_wire_subtract(S.hprev.data(), R, S.hprev_k, c.v.m, hout.data());
            else if (!S.hprev_dense.empty())
                for (uint64_t i = 0; i < n; i++) hout[i] += -c.v.m * S.hprev_dense[i];
            S.hprev_k = dense ? 0 : k;
            S.hprev_step = step;
            if (dense) S.hprev_dense = sum;
            else S.hprev = gathered, S.hprev_dense.clear();
        }
        if (c.v.average)
            for (uint64_t i = 0; i < n; i++) hout[i] = hout[i] / (float)R;
    } else {
        for (int r = 0; r < R; r++) dgc_discard(S.hs[r]);
    }
    for (int q = 0; q < R; q++) {
        for (uint64_t i = 0; i < n; i++) {
            const uint32_t want = res == DGC_DECODE_OK ? to_dtype_bits(hout[i], c.dtype) : nan_bits(c.dtype);
            const uint32_t got = out[q].get(i);
            if (c.gen == 5 && res == DGC_DECODE_OK && !isfinite(from_dtype_bits(got, c.dtype))) {
                fail("rank %d output[%llu] = 0x%08x overflowed: the clamp must keep it finite (%s)", q,
                     (unsigned long long)i, got, what.c_str());
                return STEP_FAIL;
            }
            if (want != got) {
                fail("rank %d output[%llu] = 0x%08x (%g), host 0x%08x (%g) (%s)", q, (unsigned long long)i, got,
                     (double)from_dtype_bits(got, c.dtype), want, (double)from_dtype_bits(want, c.dtype),
                     what.c_str());
                return STEP_FAIL;
            }
        }
    }
    /* The committed state, bit for bit. */
    std::vector<float> v(n), u(n);
    for (int r = 0; r < R; r++) {
        if (dgc_gpu_state_read(S.gs[r], v.data(), c.v.m > 0 ? u.data() : nullptr)) {
            fail("dgc_gpu_state_read: %s", dgc_gpu_last_error());
            return STEP_FAIL;
        }
        const float *hv = dgc_state_residual(S.hs[r]), *hu = dgc_state_momentum(S.hs[r]);
        for (uint64_t i = 0; i < n; i++) {
            if (bits_of(v[i]) != bits_of(hv[i])) {
                fail("rank %d v[%llu] = 0x%08x (%g), host 0x%08x (%g) (%s)", r, (unsigned long long)i, bits_of(v[i]),
                     (double)v[i], bits_of(hv[i]), (double)hv[i], what.c_str());
                return STEP_FAIL;
            }
            if (hu && bits_of(u[i]) != bits_of(hu[i])) {
                fail("rank %d u[%llu] = 0x%08x (%g), host 0x%08x (%g) (%s)", r, (unsigned long long)i, bits_of(u[i]),
                     (double)u[i], bits_of(hu[i]), (double)hu[i], what.c_str());
                return STEP_FAIL;
            }
        }
    }
    return STEP_OK;
}

/* A step the rest of a case builds on. */
bool must_match(sim &S, uint64_t step, int poison_rank = -1, uint64_t poison_index = 0) {
    return run_step(S, step, poison_rank, poison_index) == STEP_OK;
}

/* Runs every step of a configuration; returns the steps compared. */
int run_config(const config &c) {
    sim S(c);
    if (!S.ok) return 0;
    int done = 0;
    for (int s = 0; s < c.steps; s++) {
        const int r = run_step(S, (uint64_t)s);
        if (r != STEP_OK) break;
        done++;
    }
    return done;
}

const variant kVariants[] = {
    /* m, nesterov, masking, compensate, in_place, average, clip */
    {0.0f, 0, 0, 0, 1, 0, 0.0}, {0.9f, 0, 1, 1, 0, 0, 0.0}, {0.9f, 1, 1, 1, 1, 0, 0.0},
    {0.9f, 0, 0, 0, 1, 0, 0.0}, {0.9f, 1, 0, 1, 0, 0, 0.0},
};

config base_config(uint64_t n, double density, double ratio, const variant &v, int nranks, uint64_t seed) {
    config c;
    c.n = n;
    c.density = density;
    c.warmup = 4;
    c.ratio = ratio;
    c.v = v;
    c.nranks = nranks;
    c.steps = 6;
    c.dtype = DGC_GPU_F32;
    c.gen = 0;
    c.misalign = false;
    c.seed = seed;
    c.transport = TRANSPORT_SPARSE;
    c.vbits = 0;
    c.resize = false;
    return c;
}

/* ---------------------------------------------------------------- cases */

void case_against_host() {
    std::vector<uint64_t> sizes = {1, 7, 1000, 20011};
    if (!small_mode) sizes.push_back((1u << 20) + 3);
    const double densities[] = {0.25, 0.01, 0.001};
    const double ratios[] = {1.0, 0.01};
    int configs = 0, steps = 0;
    uint64_t seed = 1;
    for (uint64_t n : sizes)
        for (double d : densities)
            for (double ratio : ratios)
                for (int vi = 0; vi < (int)(sizeof kVariants / sizeof kVariants[0]); vi++) {
                    /* Under the sanitizers: fewer, still every path. */
                    if (small_mode && (n == 7 || d == 0.001 || vi == 1 || vi == 3)) continue;
                    const variant &v = kVariants[vi];
                    config c = base_config(n, d, ratio, v, 1, seed++);
                    c.misalign = vi == 3 || (small_mode && vi == 4 && ratio == 1.0);
                    if (small_mode) c.steps = 3;
                    steps += run_config(c);
                    configs++;
                }
    /* Several ranks: each decodes the gathered payloads of all. */
    std::vector<uint64_t> msizes = {1000, 20011};
    if (!small_mode) msizes.push_back((1u << 20) + 3);
    for (uint64_t n : msizes)
        for (int R = 2; R <= 4; R++)
            for (double ratio : ratios)
                for (int vi : {0, 1, 4}) {
                    if (small_mode && (R == 4 || vi == 4)) continue;
                    variant v = kVariants[vi];
                    v.average = R == 3; /* ncclAvg on fp32 too */
                    config c = base_config(n, 0.01, ratio, v, R, seed++);
                    c.steps = small_mode ? 3 : 5;
                    steps += run_config(c);
                    configs++;
                }
    printf("%s gpu.engine.against_host: %d configurations, %d steps compared bit for bit\n",
           verdict(), configs, steps);
}

/* The dense transport against the host: each step's output (the same sum,
 * in rank order), the committed state, and the compensation across every
 * change of transport, for several rank counts (counts no multiple of them:
 * the spare), fp32 and the 16-bit types, in place or not, averaged or not. */
void case_dense_transport() {
    /* Under the sanitizers (--small), which run each kernel many times
     * slower: one small size, up to 2 ranks, still every path. */
    std::vector<uint64_t> sizes = {1000};
    if (!small_mode) sizes.push_back(20011), sizes.push_back((1u << 20) + 3);
    int configs = 0, steps = 0;
    uint64_t seed = 700;
    for (int transport : {TRANSPORT_DENSE, TRANSPORT_TURNS})
        for (uint64_t n : sizes)
            for (int R : {1, 2, 3, 4})
                for (int vi : {0, 1, 2}) {
                    if (small_mode && (R > 2 || (vi == 0 && R > 1))) continue;
                    variant v = kVariants[vi];
                    v.average = R == 3;
                    config c = base_config(n, 0.01, 0.01, v, R, seed++);
                    c.transport = transport;
                    c.dtype = R == 2 && vi == 2 ? DGC_GPU_BF16 : R == 3 && vi == 1 ? DGC_GPU_F16 : DGC_GPU_F32;
                    c.gen = c.dtype == DGC_GPU_F32 ? 0 : 1;
                    c.steps = small_mode ? 4 : 8;
                    steps += run_config(c);
                    configs++;
                }
    printf("%s gpu.engine.dense_transport: %d configurations, %d steps compared bit for bit\n", verdict(), configs,
           steps);
}

/* The warm-up's end (dgc_gpu_state_resize, as the NCCL path moves a state
 * once its larger k is behind it): states sized for the first step move,
 * stage by stage, into blocks sized for the steps left, keeping residual,
 * momentum and the kept sum; every step still equals the host's, bit for
 * bit, output and state; the moved state's bytes are its footprint. The
 * dense transport in turns keeps its room (and a dense kept sum); the
 * sparse one gives both back. */
void case_resize() {
    std::vector<uint64_t> sizes = {1000};
    if (!small_mode) sizes.push_back(20011), sizes.push_back((1u << 20) + 3);
    int configs = 0, steps = 0, moved = 0, refused = 0;
    double first_per = 0, last_per = 0; /* bytes an element: the largest n, 2 ranks, momentum, compensation */
    uint64_t seed = 1300;
    for (int transport : {TRANSPORT_SPARSE, TRANSPORT_TURNS})
        for (uint64_t n : sizes)
            for (int R : {1, 2, 3})
                for (int vi : {0, 1, 2}) {
                    if (small_mode && R == 3) continue;
                    config c = base_config(n, 0.01, 0.01, kVariants[vi], R, seed++);
                    c.transport = transport;
                    c.resize = true;
                    c.warmup = 6;
                    c.steps = small_mode ? 6 : 9;
                    if (R == 2 && vi == 2) c.dtype = DGC_GPU_BF16, c.gen = 1, c.vbits = 16;
                    sim S(c);
                    if (!S.ok) break;
                    const size_t first = dgc_gpu_state_bytes(S.gs[0]);
                    int done = 0;
                    for (int s = 0; s < c.steps && run_step(S, (uint64_t)s) == STEP_OK; s++) done++;
                    if (done == c.steps && S.resized == 0)
                        fail("no state moved over a warm-up of %llu steps (%s)", (unsigned long long)c.warmup,
                             describe(c).c_str());
                    if (done == c.steps && dgc_gpu_state_bytes(S.gs[0]) >= first)
                        fail("the moved state holds %zu bytes, not fewer than the first step's %zu (%s)",
                             dgc_gpu_state_bytes(S.gs[0]), first, describe(c).c_str());
                    if (n == sizes.back() && R == 2 && vi == 1 && transport == TRANSPORT_SPARSE) {
                        first_per = (double)first / (double)n;
                        last_per = (double)dgc_gpu_state_bytes(S.gs[0]) / (double)n;
                    }
                    steps += done;
                    moved += S.resized;
                    refused += S.kept_refused;
                    configs++;
                }
    printf("%s gpu.engine.resize: %d configurations, %d steps compared bit for bit, %d states moved, %d moves "
           "waited for what they keep; %llu elements, 2 ranks, momentum and compensation: %.1f bytes an element at "
           "the first step, %.1f after the warm-up\n",
           verdict(), configs, steps, moved, refused, (unsigned long long)sizes.back(), first_per, last_per);
}

/* A state's device memory after the warm-up (issue 46): at most 12 bytes an
 * element at the default sparsity, at any N up to 64, every type, with and
 * without momentum, plain and 16-bit payloads. u and v take 8 (one copy
 * each: the commit does the update again, commit.cu), the rest is O(k): the
 * candidates, the sort, this rank's payload, the N gathered and the N kept
 * for the compensation. The shape is the one the NCCL path asks for past the
 * warm-up (dgc_policy_outlook with the defaults), and the footprint function
 * is what a state takes (every case that makes one checks it against
 * dgc_gpu_state_bytes). The warm-up's first shape is printed beside it. */
void case_footprint() {
    dgc_config cfg;
    dgc_config_defaults(&cfg);
    cfg.warmup_steps = 100; /* the defaults have none: a warm-up to end */
    int shapes = 0;
    double worst = 0, first = 0, two = 0, two_bf16 = 0; /* 25M elements, 2 ranks, momentum, plain payloads */
    std::string worst_what;
    for (uint64_t n : {262144ull, 25000000ull})
        for (int R = 1; R <= 64; R *= 2)
            for (dgc_gpu_dtype t : {DGC_GPU_F32, DGC_GPU_F16, DGC_GPU_BF16})
                for (int mom : {0, 1})
                    for (unsigned vb : {0u, 16u}) {
                        dgc_gpu_shape sh{};
                        sh.n = n;
                        sh.k = dgc_k_for(n, dgc_density_at(cfg.sparsity, cfg.warmup_steps, cfg.warmup_steps));
                        sh.nranks = R;
                        sh.with_momentum = mom;
                        sh.keep_prev = mom;
                        sh.dtype = t;
                        sh.value_bits = vb;
                        dgc_policy_outlook(&cfg, n, dgc_gpu_sum_type_of(t), cfg.warmup_steps, R, &sh.sparse_k,
                                           &sh.dense);
                        const size_t bytes = dgc_gpu_state_footprint(&sh);
                        const double per = (double)bytes / (double)n;
                        char what[160];
                        snprintf(what, sizeof what, "n %llu, %d ranks, %s, momentum %d, value bits %u, k %llu, dense %d",
                                 (unsigned long long)n, R, dname(t), mom, vb, (unsigned long long)sh.k, sh.dense);
                        if (bytes == 0) fail("no footprint for %s", what);
                        else if (per > 12.0) fail("%.2f bytes an element, more than 12 (%s)", per, what);
                        if (per > worst) worst = per, worst_what = what;
                        if (n == 25000000 && R == 2 && mom && vb == 0 && t != DGC_GPU_F16)
                            (t == DGC_GPU_F32 ? two : two_bf16) = per;
                        shapes++;
                    }
    {   /* The warm-up's first step, for comparison: 2 ranks, fp32, momentum. */
        dgc_gpu_shape sh{};
        sh.n = 25000000;
        sh.k = dgc_k_for(sh.n, dgc_density_at(cfg.sparsity, cfg.warmup_steps, 0));
        sh.nranks = 2;
        sh.with_momentum = 1;
        sh.keep_prev = 1;
        sh.dtype = DGC_GPU_F32;
        dgc_policy_outlook(&cfg, sh.n, DGC_SUM_F32, 0, 2, &sh.sparse_k, &sh.dense);
        first = (double)dgc_gpu_state_footprint(&sh) / (double)sh.n;
    }
    printf("%s gpu.engine.footprint: %d shapes after the warm-up (sparsity %g), at most %.2f bytes an element (%s); "
           "25M elements on 2 ranks with momentum: %.2f (fp32), %.2f (bf16) after the warm-up, %.2f (fp32) at its "
           "first step\n",
           verdict(), shapes, cfg.sparsity, worst, worst_what.c_str(), two, two_bf16, first);
}

/* Compact payloads (DGC_VALUE_BITS 16 and 32): the device's encoding is the
 * host encoder's, bit for bit; its expansion and decode give the host's
 * output and state (16-bit values rounded as the host engine rounds them,
 * what rounding lost kept in the residual), by the all-gather alone and in
 * turns with the dense transport; and a damaged payload is rejected on
 * every rank with nothing changed. */
void case_compact() {
    std::vector<uint64_t> sizes = {1000}; /* --small: as case_dense_transport */
    if (!small_mode) sizes.push_back(20011), sizes.push_back((1u << 20) + 3);
    int configs = 0, steps = 0;
    uint64_t seed = 900;
    for (unsigned vb : {16u, 32u})
        for (int transport : {TRANSPORT_SPARSE, TRANSPORT_TURNS})
            for (uint64_t n : sizes)
                for (int R : {1, 2, 3, 4})
                    for (int vi : {0, 1, 2}) {
                        if (small_mode && (R > 2 || vi == 0)) continue;
                        variant v = kVariants[vi];
                        v.average = R == 3;
                        config c = base_config(n, n > 20000 ? 0.001 : 0.01, 0.01, v, R, seed++);
                        c.vbits = vb;
                        c.transport = transport;
                        c.dtype = R == 2 && vi == 2 ? DGC_GPU_BF16 : DGC_GPU_F32;
                        c.gen = c.dtype == DGC_GPU_F32 ? 0 : 1;
                        c.steps = small_mode ? 3 : 7;
                        steps += run_config(c);
                        configs++;
                    }
    /* A damaged payload at step 2 (sparse), then the next steps as if it had
     * not happened. */
    config c = base_config(20011, 0.01, 0.01, kVariants[1], 3, 990);
    c.vbits = 16;
    sim S(c);
    if (S.ok && must_match(S, 0) && must_match(S, 1)) {
        if (run_step(S, 2, -1, 0, true) != STEP_OK)
            fail("the step with a damaged payload did not go as expected (see above, or a tie: %s)", describe(c).c_str());
        else if (must_match(S, 2) && must_match(S, 3))
            steps += 4;
    }
    /* A sparse gradient, every non-zero sent (k of them), index 0's tiny
     * enough to round to +0 under its payload's scale: a real (0, +0.0) pair
     * first, pairs after it. */
    c = base_config(20011, 0.01, 1.0, kVariants[0], 2, 991);
    c.vbits = 16;
    c.warmup = 0;
    c.gen = 4;
    steps += run_config(c);
    printf("%s gpu.engine.compact: %d configurations and a damaged payload, %d steps compared bit for bit\n",
           verdict(), configs + 1, steps);
}

/* A sound compact payload of m pairs below n, as an engine sends it:
 * sorted distinct indices, values (some of them zeros, subnormals, values
 * near fp32's top) rounded to the wire grid of their scale. */
std::vector<uint8_t> sound_payload(rng &R, uint64_t n, uint64_t k, unsigned vb, uint64_t step,
                                   const dgc_compact_layout &L) {
    std::vector<uint8_t> plain(dgc_wire_bytes(k), 0);
    const dgc_wire_header h = {DGC_WIRE_MAGIC, 0, step, n, k};
    memcpy(plain.data(), &h, sizeof h);
    std::vector<uint32_t> idx;
    const uint64_t m = R.next() % (k + 1);
    for (uint64_t j = 0; j < m; j++) idx.push_back((uint32_t)(R.next() % n));
    std::sort(idx.begin(), idx.end());
    idx.erase(std::unique(idx.begin(), idx.end()), idx.end());
    std::vector<float> x(idx.size()), val(idx.size());
    for (float &v : x) {
        const uint64_t c = R.next() % 10;
        v = c == 0 ? 0.0f : c == 1 ? -0.0f : c == 2 ? float_of((uint32_t)(R.next() % 0x800000u)) :
            c == 3 ? float_of(0x7f7fffffu ^ (uint32_t)(R.next() % 4096u)) : R.grad();
    }
    const int e = vb == 16 ? dgc_compact_scale16(x.data(), x.size()) : 0;
    dgc_compact_values(x.data(), x.size(), vb, e, val.data());
    memcpy(plain.data() + sizeof h, idx.data(), 4 * idx.size());
    memcpy(plain.data() + sizeof h + 4 * k, val.data(), 4 * val.size());
    std::vector<uint8_t> c(L.bytes);
    if (dgc_compact_encode(plain.data(), &L, c.data())) fail("the host encoder refused a sound payload");
    return c;
}

/* The device's expander on damaged payloads: rank 1's (rank 0's is sound)
 * with a few bits flipped past the header, or its count word rewritten. The
 * device must reject exactly what dgc_compact_check rejects, never touch
 * memory outside its buffers (compute-sanitizer's memcheck, --small), and
 * when it accepts, give the host's sum. */
void case_compact_fuzz() {
    struct shape_case {
        uint64_t n, k;
        unsigned vb;
    };
    const shape_case shapes[] = {{7, 7, 32}, {1000, 10, 16}, {1000, 10, 32}, {20011, 201, 16},
                                 {65536, 4096, 16}, {(1u << 20) + 3, 1049, 32}};
    const int per_shape = small_mode ? 15 : 400;
    int tried = 0, accepted = 0;
    rng R(4242);
    for (const shape_case &sc : shapes) {
        if (small_mode && sc.n > 65536) continue;
        dgc_gpu_shape sh;
        memset(&sh, 0, sizeof sh);
        sh.n = sc.n;
        sh.k = sh.sparse_k = sc.k;
        sh.nranks = 2;
        sh.dtype = DGC_GPU_F32;
        sh.value_bits = sc.vb;
        cudaStream_t st;
        CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
        char err[256] = "";
        dgc_gpu_state *s = dgc_gpu_state_create(&sh, (dgc_cuda_stream)st, err, sizeof err);
        dgc_gpu_report *rep = dgc_gpu_report_create();
        float *out = nullptr;
        CK(cudaMalloc(&out, sc.n * sizeof(float)));
        if (!s || !rep) {
            fail("state for n %llu k %llu: %s", (unsigned long long)sc.n, (unsigned long long)sc.k, err);
            return;
        }
        dgc_compact_layout L;
        dgc_compact_layout_for(sc.n, sc.k, sc.vb, &L);
        const size_t cw = dgc_gpu_wire_bytes(s, sc.k);
        dgc_step_params p;
        memset(&p, 0, sizeof p);
        p.n = sc.n;
        p.k = sc.k;
        p.step = 1;
        p.nranks = 2;
        p.value_bits = sc.vb;
        std::vector<float> got(sc.n), want(sc.n);
        for (int t = 0; t < per_shape; t++) {
            std::vector<uint8_t> c0 = sound_payload(R, sc.n, sc.k, sc.vb, 1, L), c1 = sound_payload(R, sc.n, sc.k, sc.vb, 1, L);
            const uint64_t body = L.bytes - 32;
            switch (R.next() % 3) {
            case 0:
            case 1:
                for (int f = 1 + (int)(R.next() % 3); f > 0; f--) {
                    const uint64_t bit = R.next() % (8 * body);
                    c1[32 + bit / 8] ^= (uint8_t)(1u << (bit % 8));
                }
                break;
            default: {
                uint64_t w;
                memcpy(&w, c1.data() + 32, 8);
                w = (w & ~((1ull << 40) - 1)) | (R.next() % (sc.k + 2));
                if (R.next() % 4 == 0) w |= 1ull << (40 + R.next() % 8);
                memcpy(c1.data() + 32, &w, 8);
            }
            }
            const bool host_ok = dgc_compact_check(c1.data(), &L, 1, err, sizeof err) == 0;
            memset(rep, 0, sizeof *rep);
            CK(cudaMemcpyAsync(dgc_gpu_wire_gathered(s), c0.data(), L.bytes, cudaMemcpyHostToDevice, st));
            CK(cudaMemcpyAsync((char *)dgc_gpu_wire_gathered(s) + cw, c1.data(), L.bytes, cudaMemcpyHostToDevice, st));
            CK(cudaMemsetAsync(out, 0, sc.n * sizeof(float), st));
            if (dgc_gpu_decode(s, out, DGC_GPU_F32, &p, 0, 0, rep, (dgc_cuda_stream)st, err, sizeof err)) {
                fail("dgc_gpu_decode: %s", err);
                break;
            }
            CK(cudaMemcpyAsync(got.data(), out, sc.n * sizeof(float), cudaMemcpyDeviceToHost, st));
            CK(cudaStreamSynchronize(st));
            tried++;
            const bool dev_ok = rep->bad == 0;
            if (dev_ok != host_ok) {
                fail("n %llu k %llu vb %u, payload %d: the host %s it (%s), the device %s it (bad %u, slot %llu, fault "
                     "%llu)",
                     (unsigned long long)sc.n, (unsigned long long)sc.k, sc.vb, t, host_ok ? "accepts" : "rejects",
                     host_ok ? "" : err, dev_ok ? "accepts" : "rejects", rep->bad, (unsigned long long)rep->bad_slot,
                     (unsigned long long)rep->bad_value);
                break;
            }
            if (!host_ok) continue;
            accepted++;
            std::vector<uint8_t> gathered(2 * dgc_wire_bytes(sc.k));
            if (dgc_compact_expand(c0.data(), &L, 0, gathered.data(), err, sizeof err) ||
                dgc_compact_expand(c1.data(), &L, 1, gathered.data() + dgc_wire_bytes(sc.k), err, sizeof err) ||
                dgc_wire_decode(gathered.data(), 2, 1, sc.n, sc.k, want.data(), err, sizeof err) != DGC_DECODE_OK) {
                fail("host decode of accepted payloads: %s", err);
                break;
            }
            if (memcmp(got.data(), want.data(), sc.n * sizeof(float)) != 0) {
                fail("n %llu k %llu, payload %d: the device's sum differs from the host's", (unsigned long long)sc.n,
                     (unsigned long long)sc.k, t);
                break;
            }
        }
        CK(cudaFree(out));
        dgc_gpu_report_destroy(rep);
        dgc_gpu_state_destroy(s);
        CK(cudaStreamDestroy(st));
    }
    if (accepted == 0 || accepted == tried) fail("damage left %d of %d payloads accepted: not a test", accepted, tried);
    printf("%s gpu.engine.compact_fuzz: %d damaged payloads (%d still sound), verdicts and sums as the host's\n",
           verdict(), tried, accepted);
}

void case_half_inputs() {
    int configs = 0, steps = 0;
    std::vector<uint64_t> sizes = {1000, 20011};
    if (!small_mode) sizes.push_back((1u << 20) + 3);
    uint64_t seed = 500;
    for (dgc_gpu_dtype t : {DGC_GPU_F16, DGC_GPU_BF16})
        for (uint64_t n : sizes)
            for (int R : {1, 2})
                for (int vi : {0, 1, 2}) {
                    variant v = kVariants[vi];
                    v.average = R == 2;
                    config c = base_config(n, n > 1000 ? 0.001 : 0.01, 0.01, v, R, seed++);
                    c.dtype = t;
                    c.gen = 1;
                    c.misalign = R == 2 && vi == 1;
                    c.warmup = 0;
                    c.steps = small_mode ? 2 : 4;
                    steps += run_config(c);
                    configs++;
                }
    printf("%s gpu.engine.half_inputs: %d configurations, %d steps (fp16 and bf16 gradients, output converted)\n",
           verdict(), configs, steps);
}

/* Four ranks whose largest values share indices, so that the sums add the
 * same index from several ranks: every rank's output must be the same
 * bytes, and the host's. Then the same gathered bytes decoded again on two
 * fresh states. */
void case_determinism() {
    const uint64_t n = small_mode ? 20011 : (1u << 20) + 3;
    config c = base_config(n, 0.01, 0.01, kVariants[1], 4, 77);
    c.gen = 2;
    c.steps = small_mode ? 2 : 4;
    const int steps = run_config(c);

    /* Two fresh states decode one set of payloads. */
    config d = base_config(n, 0.01, 0.01, kVariants[0], 2, 78);
    d.gen = 2;
    d.warmup = 0;
    sim S(d);
    if (!S.ok) return;
    const uint64_t k = k_at(d, 0);
    const dgc_step_params p = S.params(0, k);
    const size_t wb = dgc_wire_bytes(k);
    char err[256];
    /* One host buffer per rank, alive until the stream is synchronized: an
     * asynchronous copy from pageable memory may read it late (CUDA only
     * says such a copy "might be synchronous"; chipStar's is not). */
    std::vector<hbuf> g(2, hbuf(n, d.dtype));
    for (int r = 0; r < 2; r++) {
        std::vector<float> g32;
        make_grad(d, 0, r, &g[r], &g32);
        CK(cudaMemcpyAsync(S.dg[r], g[r].b.data(), g[r].b.size(), cudaMemcpyHostToDevice, S.st));
        if (dgc_gpu_compress(S.gs[r], S.dg[r], S.dout[r], d.dtype, &p, (dgc_cuda_stream)S.st, err, sizeof err))
            fail("dgc_gpu_compress: %s", err);
    }
    for (int q = 0; q < 2; q++)
        for (int r = 0; r < 2; r++)
            CK(cudaMemcpyAsync((char *)dgc_gpu_gathered(S.gs[q]) + r * wb, dgc_gpu_payload(S.gs[r]), wb,
                               cudaMemcpyDeviceToDevice, S.st));
    std::vector<uint8_t> gathered(2 * wb);
    CK(cudaMemcpyAsync(gathered.data(), dgc_gpu_gathered(S.gs[0]), 2 * wb, cudaMemcpyDeviceToHost, S.st));
    std::vector<std::vector<float>> out(2, std::vector<float>(n));
    for (int q = 0; q < 2; q++) {
        if (dgc_gpu_decode(S.gs[q], S.dout[q], d.dtype, &p, 0, 0, S.rep[q], (dgc_cuda_stream)S.st, err, sizeof err))
            fail("dgc_gpu_decode: %s", err);
        CK(cudaMemcpyAsync(out[q].data(), S.dout[q], n * 4, cudaMemcpyDeviceToHost, S.st));
    }
    CK(cudaStreamSynchronize(S.st));
    std::vector<float> h(n);
    const dgc_decode_result res = dgc_wire_decode(gathered.data(), 2, 0, n, k, h.data(), err, sizeof err);
    if (res == DGC_DECODE_NONFINITE) /* no message of its own: finite gradients, fresh states */
        fail("host decode: a payload is flagged non-finite (headers 0x%x, 0x%x)", header_of(gathered.data()).flags,
             header_of(gathered.data() + wb).flags);
    else if (res != DGC_DECODE_OK)
        fail("host decode: %s", err);
    if (memcmp(out[0].data(), out[1].data(), n * 4) != 0) fail("two states decoded the same payloads differently");
    if (memcmp(out[0].data(), h.data(), n * 4) != 0) fail("the GPU decode differs from dgc_wire_decode");
    printf("%s gpu.engine.determinism: 4 ranks with shared indices, %d steps; 2 states on one gathered set\n",
           verdict(), steps);
}

struct bad_case {
    const char *name;
    int rank;
    uint32_t reason;
    uint64_t slot;
};

/* Corrupts the gathered payloads as the case says; returns the value the
 * report must name. */
uint64_t corrupt(std::vector<uint8_t> &gth, size_t wb, uint64_t k, uint64_t n, uint64_t step, int which) {
    auto hdr = [&](int r) { return reinterpret_cast<dgc_wire_header *>(gth.data() + (size_t)r * wb); };
    auto pl = [&](int r) { return gth.data() + (size_t)r * wb; };
    switch (which) {
    case 0: hdr(1)->magic = 0xdeadbeefu; return 0xdeadbeefu;
    case 1: hdr(1)->flags = 8u; return 8u;
    case 2: hdr(2)->flags = DGC_WIRE_DENSE; return DGC_WIRE_DENSE;
    case 3: hdr(1)->step = step + 7; return step + 7;
    case 4: hdr(2)->n = n + 1; return n + 1;
    case 5: hdr(1)->k = k + 1; return k + 1;
    case 6: set_slot(pl(2), k, 5, (uint32_t)n, slot_value(pl(2), k, 5)); return n;
    case 7: { /* slot 3 repeats slot 2's index */
        const uint32_t i = slot_index(pl(1), k, 2);
        set_slot(pl(1), k, 3, i, slot_value(pl(1), k, 3));
        return i;
    }
    case 8: set_slot(pl(2), k, 4, 0, 0); return slot_index(pl(2), k, 5); /* padding, then slot 5 real */
    case 9: /* two faults: rank 2's header and rank 1's slot 6; rank 1 is first */
        hdr(2)->magic = 1;
        set_slot(pl(1), k, 6, 0xffffffffu, slot_value(pl(1), k, 6));
        return 0xffffffffu;
    default: return 0;
    }
}

void case_bad_payloads() {
    const bad_case cases[] = {
        {"bad magic", 1, DGC_GPU_BAD_MAGIC, 0},        {"unknown flag", 1, DGC_GPU_BAD_MAGIC, 0},
        {"DENSE flag", 2, DGC_GPU_BAD_MAGIC, 0},       {"wrong step", 1, DGC_GPU_BAD_HEADER, 0},
        {"wrong n", 2, DGC_GPU_BAD_HEADER, 0},         {"wrong k", 1, DGC_GPU_BAD_HEADER, 0},
        {"index >= n", 2, DGC_GPU_BAD_INDEX, 5},       {"repeated index", 1, DGC_GPU_BAD_ORDER, 3},
        {"padding before a real pair", 2, DGC_GPU_BAD_ORDER, 5}, {"two faults, lower rank first", 1, DGC_GPU_BAD_INDEX, 6},
    };
    config c = base_config(20011, 0.01, 0.01, kVariants[1], 3, 300);
    c.warmup = 0;
    sim S(c);
    if (!S.ok || !must_match(S, 0)) { /* a committed step first: prev kept, cur flipped */
        printf("%s gpu.engine.bad_payloads: the first step failed\n", verdict());
        return;
    }
    const uint64_t step = 1, n = c.n, k = k_at(c, step);
    const dgc_step_params p = S.params(step, k);
    const size_t wb = dgc_wire_bytes(k);
    std::vector<float> v0(n), u0(n), v1(n), u1(n), out(n);
    if (dgc_gpu_state_read(S.gs[0], v0.data(), u0.data())) fail("state read: %s", dgc_gpu_last_error());
    char err[256];
    int which = 0;
    for (const bad_case &bc : cases) {
        memset(S.rep[0], 0, sizeof *S.rep[0]);
        std::vector<hbuf> g(c.nranks, hbuf(n, c.dtype)); /* each alive until the synchronize below */
        std::vector<float> g32;
        for (int r = 0; r < c.nranks; r++) {
            make_grad(c, step, r, &g[r], &g32);
            CK(cudaMemcpyAsync(S.dg[r], g[r].b.data(), g[r].b.size(), cudaMemcpyHostToDevice, S.st));
            if (dgc_gpu_compress(S.gs[r], S.dg[r], S.dout[r], c.dtype, &p, (dgc_cuda_stream)S.st, err, sizeof err))
                fail("dgc_gpu_compress: %s", err);
        }
        std::vector<uint8_t> gth((size_t)c.nranks * wb);
        for (int r = 0; r < c.nranks; r++)
            CK(cudaMemcpyAsync(gth.data() + r * wb, dgc_gpu_payload(S.gs[r]), wb, cudaMemcpyDeviceToHost, S.st));
        CK(cudaStreamSynchronize(S.st));
        const uint64_t value = corrupt(gth, wb, k, n, step, which++);
        CK(cudaMemcpyAsync(dgc_gpu_gathered(S.gs[0]), gth.data(), gth.size(), cudaMemcpyHostToDevice, S.st));
        if (dgc_gpu_decode(S.gs[0], S.dout[0], c.dtype, &p, c.v.compensate, 0, S.rep[0], (dgc_cuda_stream)S.st, err,
                           sizeof err))
            fail("dgc_gpu_decode: %s", err);
        CK(cudaMemcpyAsync(out.data(), S.dout[0], n * 4, cudaMemcpyDeviceToHost, S.st));
        CK(cudaStreamSynchronize(S.st));
        const volatile dgc_gpu_report *rp = S.rep[0];
        if (rp->bad != bc.reason || rp->bad_rank != bc.rank || rp->bad_slot != bc.slot || rp->bad_value != value ||
            rp->bad_step != step)
            fail("%s: report bad %u rank %d slot %llu value %llu step %llu; expected %u rank %d slot %llu value %llu "
                 "step %llu",
                 bc.name, rp->bad, rp->bad_rank, (unsigned long long)rp->bad_slot, (unsigned long long)rp->bad_value,
                 (unsigned long long)rp->bad_step, bc.reason, bc.rank, (unsigned long long)bc.slot,
                 (unsigned long long)value, (unsigned long long)step);
        for (uint64_t i = 0; i < n; i++)
            if (bits_of(out[i]) != 0) {
                fail("%s: output[%llu] = %g, expected 0 (left as the compression left it)", bc.name,
                     (unsigned long long)i, (double)out[i]);
                break;
            }
        if (dgc_gpu_state_read(S.gs[0], v1.data(), u1.data())) fail("state read: %s", dgc_gpu_last_error());
        if (memcmp(v0.data(), v1.data(), n * 4) || memcmp(u0.data(), u1.data(), n * 4))
            fail("%s: the state changed", bc.name);
    }
    /* The report keeps the first: another bad decode (bad magic, rank 0)
     * leaves the last case's record, and so does a good step; but it counts
     * every bad step, so that the host fails each one's call. */
    const dgc_gpu_report kept = *S.rep[0];
    if (kept.bad_steps != 1) fail("the report counts %llu bad steps, want 1", (unsigned long long)kept.bad_steps);
    {
        std::vector<uint8_t> gth((size_t)c.nranks * wb);
        CK(cudaMemcpy(gth.data(), dgc_gpu_gathered(S.gs[0]), gth.size(), cudaMemcpyDeviceToHost));
        reinterpret_cast<dgc_wire_header *>(gth.data())->magic = 0; /* rank 0 */
        CK(cudaMemcpy(dgc_gpu_gathered(S.gs[0]), gth.data(), gth.size(), cudaMemcpyHostToDevice));
        if (dgc_gpu_decode(S.gs[0], S.dout[0], c.dtype, &p, c.v.compensate, 0, S.rep[0], (dgc_cuda_stream)S.st, err,
                           sizeof err))
            fail("dgc_gpu_decode: %s", err);
        CK(cudaStreamSynchronize(S.st));
    }
    /* Nothing of the bad calls remains: the next good step matches the host. */
    const int good = run_step(S, step);
    if (good == STEP_FAIL) fail("the good step after the bad payloads does not match the host");
    dgc_gpu_report now = *S.rep[0];
    if (now.bad_steps != 2) fail("after a second bad step the report counts %llu, want 2", (unsigned long long)now.bad_steps);
    if (now.bad != kept.bad || now.bad_rank != kept.bad_rank || now.bad_slot != kept.bad_slot ||
        now.bad_value != kept.bad_value || now.bad_step != kept.bad_step)
        fail("the report's first bad payload was overwritten (bad %u rank %d slot %llu, kept %u rank %d slot %llu)",
             S.rep[0]->bad, S.rep[0]->bad_rank, (unsigned long long)S.rep[0]->bad_slot, kept.bad, kept.bad_rank,
             (unsigned long long)kept.bad_slot);
    /* Each bad step records this rank's own call (n, step), for the front
     * end to give its step back. */
    for (int i = 0; i < 2; i++)
        if (now.bad_calls[i][0] != n || now.bad_calls[i][1] != step)
            fail("bad step %d recorded the call (%llu, %llu), want (%llu, %llu)", i,
                 (unsigned long long)now.bad_calls[i][0], (unsigned long long)now.bad_calls[i][1],
                 (unsigned long long)n, (unsigned long long)step);
    /* A buffer not aligned to its elements is refused before any launch (a
     * typed load there would end the CUDA context); the state is as it was. */
    {
        const dgc_step_params q = S.params(step + 1, k);
        char *odd = static_cast<char *>(S.dg[0]) + 1;
        err[0] = '\0';
        if (dgc_gpu_compress(S.gs[0], odd, odd, c.dtype, &q, (dgc_cuda_stream)S.st, err, sizeof err) == 0 ||
            !strstr(err, "not aligned"))
            fail("a misaligned buffer was not refused (%s)", err);
        if (cudaStreamSynchronize(S.st) != cudaSuccess) fail("the refusal left a CUDA error");
    }
    printf("%s gpu.engine.bad_payloads: %zu kinds of bad payload, then a good step; a misaligned buffer refused\n",
           verdict(), sizeof cases / sizeof cases[0]);
}

/* Step `step` with rank 1 taking part without state (a flag-only header,
 * garbage slots), rank 0 with its state; bad_header: rank 0's header
 * damaged too (its magic), in every rank's gathered copy. Every rank's
 * output must be what the ranks with state give (NaN for the failed rank;
 * zero for a bad header, which no rank adds past), the report must say
 * which, and rank 0's state must not change. */
void stateless_step(sim &S, uint64_t step, bool bad_header) {
    const config &c = S.c;
    const dgc_gpu_dtype t = c.dtype;
    const uint64_t n = c.n, k = k_at(c, step);
    const dgc_step_params p = S.params(step, k);
    const size_t wb = dgc_wire_bytes(k);
    const char *what = bad_header ? "failed rank beside a bad header" : "failed rank";
    char err[256];
    const unsigned long long failed0 = S.rep[0]->failed, dropped0 = dgc_gpu_state_nonfinite(S.gs[0]);
    std::vector<float> v0(n), u0(n), v1(n), u1(n);
    if (dgc_gpu_state_read(S.gs[0], v0.data(), u0.data())) fail("state read: %s", dgc_gpu_last_error());
    hbuf g(n, c.dtype);
    std::vector<float> g32;
    make_grad(c, step, 0, &g, &g32);
    CK(cudaMemcpyAsync(S.dg[0], g.b.data(), g.b.size(), cudaMemcpyHostToDevice, S.st));
    if (dgc_gpu_compress(S.gs[0], S.dg[0], S.dout[0], c.dtype, &p, (dgc_cuda_stream)S.st, err, sizeof err))
        fail("dgc_gpu_compress: %s", err);
    void *own = nullptr, *gth = nullptr;
    CK(cudaMalloc(&own, wb));
    CK(cudaMalloc(&gth, 2 * wb));
    CK(cudaMemsetAsync(own, 0xab, wb, S.st)); /* garbage slots: only the header counts */
    if (dgc_gpu_flag_only(own, DGC_WIRE_FAILED, &p, (dgc_cuda_stream)S.st)) fail("dgc_gpu_flag_only failed");
    CK(cudaMemcpyAsync(dgc_gpu_gathered(S.gs[0]), dgc_gpu_payload(S.gs[0]), wb, cudaMemcpyDeviceToDevice, S.st));
    CK(cudaMemcpyAsync((char *)dgc_gpu_gathered(S.gs[0]) + wb, own, wb, cudaMemcpyDeviceToDevice, S.st));
    if (bad_header) CK(cudaMemsetAsync(dgc_gpu_gathered(S.gs[0]), 0, 1, S.st)); /* magic's low byte */
    CK(cudaMemcpyAsync(gth, dgc_gpu_gathered(S.gs[0]), 2 * wb, cudaMemcpyDeviceToDevice, S.st));
    if (dgc_gpu_decode(S.gs[0], S.dout[0], c.dtype, &p, c.v.compensate, c.v.average, S.rep[0], (dgc_cuda_stream)S.st,
                       err, sizeof err))
        fail("dgc_gpu_decode: %s", err);
    if (dgc_gpu_decode_stateless(gth, wb, S.dout[1], c.dtype, &p, S.rep[1], (dgc_cuda_stream)S.st))
        fail("dgc_gpu_decode_stateless: %s", dgc_gpu_last_error());
    std::vector<hbuf> out(2, hbuf(n, c.dtype));
    for (int r = 0; r < 2; r++)
        CK(cudaMemcpyAsync(out[r].b.data(), S.dout[r], out[r].b.size(), cudaMemcpyDeviceToHost, S.st));
    CK(cudaStreamSynchronize(S.st));
    const uint32_t want = bad_header ? 0u : nan_bits(t);
    for (int r = 0; r < 2; r++) {
        for (uint64_t i = 0; i < n; i++)
            if (out[r].get(i) != want) {
                fail("%s %s: rank %d output[%llu] = 0x%x, expected 0x%x", dname(t), what, r, (unsigned long long)i,
                     out[r].get(i), want);
                break;
            }
        const unsigned long long failed = S.rep[r]->failed;
        if (bad_header && (S.rep[r]->bad != DGC_GPU_BAD_MAGIC || S.rep[r]->bad_rank != 0 || failed != failed0))
            fail("%s %s: rank %d report bad %u rank %d failed %llu, expected %d (magic) rank 0 failed %llu", dname(t),
                 what, r, S.rep[r]->bad, S.rep[r]->bad_rank, failed, DGC_GPU_BAD_MAGIC, failed0);
        if (!bad_header && (failed != failed0 + 1 || S.rep[r]->failed_rank != 1 || S.rep[r]->bad))
            fail("%s %s: rank %d report failed %llu rank %d bad %u, expected %llu rank 1 bad 0", dname(t), what, r,
                 failed, S.rep[r]->failed_rank, S.rep[r]->bad, failed0 + 1);
    }
    const unsigned long long dropped = dgc_gpu_state_nonfinite(S.gs[0]), want_dropped = dropped0 + !bad_header;
    if (dropped != want_dropped) fail("%s %s: state 0 dropped %llu, expected %llu", dname(t), what, dropped, want_dropped);
    if (dgc_gpu_state_read(S.gs[0], v1.data(), u1.data())) fail("state read: %s", dgc_gpu_last_error());
    if (memcmp(v0.data(), v1.data(), n * 4) || memcmp(u0.data(), u1.data(), n * 4))
        fail("%s %s: the state changed", dname(t), what);
    CK(cudaFree(own));
    CK(cudaFree(gth));
    /* The host did compress rank 0 for this step in the real path: keep in
     * step by compressing and discarding; rank 1 did nothing. */
    std::vector<uint8_t> hpay(wb);
    if (dgc_compress(S.hs[0], g32.data(), &p, hpay.data()) == 0) dgc_discard(S.hs[0]);
}

/* A NaN in one rank's gradient: every rank's output all NaN, no state
 * changes, counters +1; then a finite step works. Then a rank that failed
 * (flag-only header, garbage slots): NaN everywhere, failed counters; then
 * the same beside a bad header: zero everywhere, the report's bad. */
void case_nonfinite() {
    for (dgc_gpu_dtype t : {DGC_GPU_F32, DGC_GPU_BF16}) {
        config c = base_config(20011, 0.01, 0.01, kVariants[1], 2, 400);
        c.warmup = 0;
        c.dtype = t;
        c.gen = t == DGC_GPU_F32 ? 0 : 1;
        sim S(c);
        /* Step 1 is compared to the host: NaN out, states as before. */
        if (!S.ok || !must_match(S, 0) || !must_match(S, 1, 1, 17)) continue;
        for (int r = 0; r < 2; r++) {
            if (S.rep[r]->nonfinite != 1) fail("rank %d report nonfinite %llu, expected 1", r,
                                               (unsigned long long)S.rep[r]->nonfinite);
            if (dgc_gpu_state_nonfinite(S.gs[r]) != 1)
                fail("rank %d state nonfinite %llu, expected 1", r, (unsigned long long)dgc_gpu_state_nonfinite(S.gs[r]));
        }
        if (!must_match(S, 2)) continue; /* step 3 is compared to the host after it */
        stateless_step(S, 3, false);
        stateless_step(S, 3, true); /* the report's bad is sticky: after the failed step's checks */
        if (run_step(S, 3) == STEP_FAIL) fail("%s: the finite step after the failed ones does not match", dname(t));
    }
    /* The dense transport of 16-bit buffers: a NaN in a gradient, then a
     * sum that overflowed (made Inf in the exchange): each drops its step on
     * every rank, NaN out, nothing committed, counted; then steps match. */
    for (dgc_gpu_dtype t : {DGC_GPU_F16, DGC_GPU_BF16}) {
        config c = base_config(20011, 0.01, 0.01, kVariants[1], 2, 450);
        c.warmup = 0;
        c.dtype = t;
        c.gen = 1;
        c.transport = TRANSPORT_DENSE;
        sim S(c);
        if (!S.ok || !must_match(S, 0) || !must_match(S, 1, 1, 17)) continue;
        S.poison_sum = 20010; /* in the spare's part: n mod 2 = 1 */
        const bool dropped = must_match(S, 2);
        S.poison_sum = -1;
        if (!dropped) continue;
        for (int r = 0; r < 2; r++)
            if (S.rep[r]->nonfinite != 2 || dgc_gpu_state_nonfinite(S.gs[r]) != 2)
                fail("%s dense: rank %d counts %llu and %llu dropped steps, expected 2 (a NaN, an overflow)",
                     dname(t), r, (unsigned long long)S.rep[r]->nonfinite,
                     (unsigned long long)dgc_gpu_state_nonfinite(S.gs[r]));
        if (!must_match(S, 3)) continue;
        /* A bad header (rank 1's magic): zero out on every rank (the widening's
         * zero), nothing committed; the next step builds on the old state. */
        if (run_step(S, 4, -1, 0, true) != STEP_OK || !must_match(S, 5))
            fail("%s dense: the bad header, or the step after it, does not match", dname(t));
    }
    printf("%s gpu.engine.nonfinite: NaN in one rank (fp32, bf16), a failed rank, one beside a bad header, then "
           "finite steps; fp16/bf16 by the dense transport: a NaN, an overflowed sum, a bad header\n",
           verdict());
}

/* Candidates beyond dgc_candidate_cap: ten thousand equal values where k is
 * 100 take the exact path on both sides, ties in index order. */
void case_overflow() {
    int steps = 0, configs = 0;
    for (double ratio : {0.01, 1.0})
        for (int vi : {0, 1}) {
            config c = base_config(100000, 0.001, ratio, kVariants[vi], 1, 600 + configs);
            c.gen = 3;
            c.warmup = 0;
            c.steps = small_mode ? 2 : 4;
            steps += run_config(c);
            configs++;
        }
    printf("%s gpu.engine.overflow: %d configurations, %d steps on the exact path (k 100, candidate room %llu)\n",
           verdict(), configs, steps, (unsigned long long)dgc_candidate_cap(100000, 100));
}

/* A residual that outgrows fp32 from finite gradients (gen 6): the rules
 * saturate u and v at +-FLT_MAX on the device as on the host, the values
 * sent are clamped to the ranks' limit (dgc_policy_value_limit_bits), and
 * the device counts the saturated steps in the report; states, pairs and
 * outputs bit for bit, every output finite. */
void case_saturation() {
    int steps = 0, configs = 0;
    for (int transport : {TRANSPORT_SPARSE, TRANSPORT_DENSE})
        for (unsigned vbits : {0u, 16u, 32u})
            for (int vi : {0, 1, 2}) {
                if (transport == TRANSPORT_DENSE && vbits == 16) continue; /* the dense transport sends no values */
                if (small_mode && vi == 2) continue;
                config c = base_config(20011, 0.001, 0.01, kVariants[vi], 2, 1100 + configs);
                c.gen = 6;
                c.warmup = 0;
                c.transport = transport;
                c.vbits = vbits;
                c.steps = 5;
                sim S(c);
                if (!S.ok) return;
                int done = 0, host_saturated = 0;
                for (; done < c.steps; done++) {
                    if (run_step(S, (uint64_t)done) != STEP_OK) break;
                    host_saturated += dgc_last_saturated(S.hs[0]);
                }
                steps += done;
                configs++;
                if (done < c.steps) continue; /* run_step said why */
                const unsigned long long dev = S.rep[0]->saturated;
                if (!host_saturated || dev != (unsigned long long)host_saturated)
                    fail("%s: the host saturated %d steps, the device reports %llu", describe(c).c_str(),
                         host_saturated, dev);
            }
    printf("%s gpu.engine.saturation: %d configurations, %d steps of gradients near 1e38 (residuals held at FLT_MAX)\n",
           verdict(), configs, steps);
}

/* Ties among candidates: a tenth of the elements at 1.0, k = 2% of them,
 * so the ten thousand ties fit the candidate room (8k) and only some go:
 * the update pass stores candidates in no order, and the GPU must still
 * take the ties in index order, as the host does (pairs, states and
 * outputs bit for bit), on every run alike. */
void case_ties() {
    int steps = 0, configs = 0;
    for (int R : {1, 3})
        for (int vi : {0, 1}) {
            config c = base_config(100000, 0.02, 0.01, kVariants[vi], R, 650 + configs);
            c.gen = 3;
            c.warmup = 0;
            c.steps = small_mode ? 2 : 4;
            steps += run_config(c);
            configs++;
        }
    printf("%s gpu.engine.ties: %d configurations, %d steps with some of the ties among candidates (k 2000, "
           "candidate room %llu)\n",
           verdict(), configs, steps, (unsigned long long)dgc_candidate_cap(100000, 2000));
}

void case_large() {
    const uint64_t n = small_mode ? (1u << 20) : 25000000;
    config c = base_config(n, 0.001, 0.01, kVariants[1], 1, 700);
    c.warmup = 0;
    c.steps = 3;
    const int steps = run_config(c);
    printf("%s gpu.engine.large: n %llu, %d steps\n", verdict(), (unsigned long long)n, steps);
}

/* fp16 buffers whose ranks' sum would pass 65504: every rank clamps what
 * it sends to the limit of its rank count (dgc_sum_limit_bits), on either
 * transport and with any wire values, so the sum converts back to fp16
 * finite, and the excess stays in the residual; the output and the state
 * bit for bit against the host engine, which clamps alike. */
void case_clamp() {
    const uint64_t n = small_mode ? 1000 : 20011;
    int configs = 0, steps = 0;
    uint64_t seed = 900;
    struct way {
        int transport;
        unsigned vbits;
    };
    for (way w : {way{TRANSPORT_SPARSE, 0}, way{TRANSPORT_SPARSE, 16}, way{TRANSPORT_SPARSE, 32},
                  way{TRANSPORT_DENSE, 0}, way{TRANSPORT_TURNS, 16}})
        for (int R : {2, 3})
            for (int vi : {0, 1}) {
                if (small_mode && vi == 1 && R == 2) continue;
                variant v = kVariants[vi];
                v.average = R == 2;
                config c = base_config(n, 0.01, 0.01, v, R, seed++);
                c.dtype = DGC_GPU_F16;
                c.gen = 5;
                c.warmup = 0;
                c.transport = w.transport;
                c.vbits = w.vbits;
                c.steps = small_mode ? 3 : 5;
                /* The premise: unclamped, the first step's sum overflows. */
                float top = 0.0f;
                std::vector<float> sum(n, 0.0f), g32;
                for (int r = 0; r < R; r++) {
                    hbuf g(n, c.dtype);
                    make_grad(c, 0, r, &g, &g32);
                    for (uint64_t i = 0; i < n; i++) sum[i] += g32[i];
                }
                for (float x : sum) top = std::max(top, fabsf(x));
                if (top <= 65504.0f) fail("premise: %d ranks' largest sum %g fits fp16 (%s)", R, (double)top,
                                          describe(c).c_str());
                steps += run_config(c);
                configs++;
            }
    printf("%s gpu.engine.clamp: %d configurations, %d steps of fp16 sums past 65504 unclamped\n", verdict(), configs,
           steps);
}

/* dgc_gpu_node_sum: the node layout's sum of L pieces in local-rank order
 * against the host's additions in that order, bit for bit (fp32 pieces, in
 * place too, and fp16 and bf16 pieces widened); its flag set by a
 * non-finite sum only (an Inf in one piece), and left alone otherwise.
 * Then each sum is finished into an output (check_finish). */
/* dgc_gpu_node_finish: the decoded fp32 shard into the output, in its
 * type, divided first by a divisor above 1, each value rounded once as the
 * host rounds it (Inf kept); fp32 in place when averaging. */
void check_finish(float *sum, const std::vector<float> &want, dgc_gpu_dtype t, uint64_t len, int divisor) {
    void *out = nullptr;
    const size_t es = dsize(t);
    const bool in_place = t == DGC_GPU_F32;
    if (in_place) out = sum;
    else CK(cudaMalloc(&out, len * es));
    char err[256] = "";
    if (dgc_gpu_node_finish(sum, out, t, len, divisor, nullptr, err, sizeof err)) fail("dgc_gpu_node_finish: %s", err);
    std::vector<uint8_t> got(len * es);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(got.data(), out, len * es, cudaMemcpyDeviceToHost));
    for (uint64_t i = 0; i < len; i++) {
        uint32_t b = 0;
        memcpy(&b, &got[i * es], es);
        const float x = divisor > 1 ? want[i] / (float)divisor : want[i];
        if (b != to_dtype_bits(x, t)) {
            fail("%s, len %llu, divisor %d: element %llu finished as %#x, the host makes %a of it, %#x", dname(t),
                 (unsigned long long)len, divisor, (unsigned long long)i, b, (double)x, to_dtype_bits(x, t));
            break;
        }
    }
    if (!in_place) CK(cudaFree(out));
}

void case_node_sum() {
    const uint64_t lens[] = {1, 1000, small_mode ? 4099ull : 300007ull};
    int checked = 0;
    uint64_t seed = 1200;
    for (dgc_gpu_dtype t : {DGC_GPU_F32, DGC_GPU_F16, DGC_GPU_BF16})
        for (int L : {1, 2, 3, 8})
            for (uint64_t len : lens)
                for (int poison = 0; poison < 2; poison++) {
                    rng r(seed++);
                    const size_t es = dsize(t), bytes = len * (uint64_t)L * es;
                    std::vector<uint8_t> host(bytes);
                    std::vector<float> want(len, 0.0f);
                    for (uint64_t e = 0; e < len * (uint64_t)L; e++) {
                        const uint32_t b = to_dtype_bits(r.grad() * 1024.0f, t);
                        memcpy(&host[e * es], &b, es); /* little-endian: the low bytes */
                    }
                    const uint64_t at = len / 2;
                    if (poison) { /* the last piece's middle element: Inf */
                        const uint32_t inf = to_dtype_bits(INFINITY, t);
                        memcpy(&host[((uint64_t)(L - 1) * len + at) * es], &inf, es);
                    }
                    for (int l = 0; l < L; l++)
                        for (uint64_t i = 0; i < len; i++) {
                            uint32_t b = 0;
                            memcpy(&b, &host[((uint64_t)l * len + i) * es], es);
                            want[i] = l == 0 ? from_dtype_bits(b, t) : want[i] + from_dtype_bits(b, t);
                        }
                    void *pieces = nullptr;
                    float *sum = nullptr;
                    unsigned int *flag = nullptr, got_flag = 7;
                    const bool in_place = t == DGC_GPU_F32 && (seed & 1);
                    CK(cudaMalloc(&pieces, bytes));
                    CK(cudaMalloc(&flag, sizeof *flag));
                    if (!in_place) CK(cudaMalloc(&sum, len * sizeof(float)));
                    else sum = static_cast<float *>(pieces);
                    CK(cudaMemcpy(pieces, host.data(), bytes, cudaMemcpyHostToDevice));
                    CK(cudaMemset(flag, 0, sizeof *flag));
                    char err[256] = "";
                    if (dgc_gpu_node_sum(pieces, t, L, len, sum, flag, nullptr, err, sizeof err))
                        fail("dgc_gpu_node_sum: %s", err);
                    std::vector<float> got(len);
                    CK(cudaDeviceSynchronize());
                    CK(cudaMemcpy(got.data(), sum, len * sizeof(float), cudaMemcpyDeviceToHost));
                    CK(cudaMemcpy(&got_flag, flag, sizeof got_flag, cudaMemcpyDeviceToHost));
                    for (uint64_t i = 0; i < len; i++)
                        if (bits_of(got[i]) != bits_of(want[i])) {
                            fail("%s, L %d, len %llu: element %llu is %a, the host's ordered sum %a", dname(t), L,
                                 (unsigned long long)len, (unsigned long long)i, (double)got[i], (double)want[i]);
                            break;
                        }
                    if (got_flag != (unsigned)poison)
                        fail("%s, L %d, len %llu: the non-finite flag is %u, want %d", dname(t), L,
                             (unsigned long long)len, got_flag, poison);
                    /* fp32 sums are finished only when averaging: in place, last */
                    if (t != DGC_GPU_F32 || poison) check_finish(sum, want, t, len, poison ? L + 1 : 1);
                    CK(cudaFree(pieces));
                    CK(cudaFree(flag));
                    if (!in_place) CK(cudaFree(sum));
                    checked++;
                }
    printf("%s gpu.engine.node_sum: %d configurations (fp32, fp16, bf16; 1 to 8 pieces; in place and not; one "
           "with an Inf, one without; each finished into its output, averaged or not)\n",
           verdict(), checked);
}

struct named_case {
    const char *name;
    void (*run)(void);
};
/* The rounding of values to a 16-bit sum's type (sum_rules.h) on the
 * device, bit for bit against the host's (which unit.test_sum_rules holds
 * to its references): a million values over every fp32 encoding and every
 * encoding near binary16's edges, at the limits of 1, 3 and 1000 ranks. */
__global__ void sum_round_kernel(const uint32_t *in, uint32_t *out, size_t count, unsigned type, uint32_t limit) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x)
        out[i] = dgc_sum_round_bits(in[i], type, limit);
}

void case_sum_rules() {
    std::vector<uint32_t> in;
    for (uint64_t u = 0; u < (1ull << 32); u += 4093)
        if ((u & 0x7f800000u) != 0x7f800000u) in.push_back((uint32_t)u);
    for (uint32_t edge : {0x477fe000u, 0x477ff000u, 0x38800000u, 0x33800000u, 0x33000000u, 0x7f7f0000u, 1u})
        for (int64_t d = -5000; d <= 5000; d++) {
            const int64_t u = (int64_t)edge + d;
            if (u >= 0 && u <= 0x7f7fffff) in.push_back((uint32_t)u), in.push_back((uint32_t)u | 0x80000000u);
        }
    uint32_t *din = nullptr, *dout = nullptr;
    CK(cudaMalloc(&din, in.size() * 4));
    CK(cudaMalloc(&dout, in.size() * 4));
    CK(cudaMemcpy(din, in.data(), in.size() * 4, cudaMemcpyHostToDevice));
    std::vector<uint32_t> got(in.size());
    int checked = 0;
    for (unsigned type : {(unsigned)DGC_SUM_F16, (unsigned)DGC_SUM_BF16})
        for (int N : {1, 3, 1000}) {
            const uint32_t limit = dgc_sum_limit_bits(type, N);
            sum_round_kernel<<<256, 256>>>(din, dout, in.size(), type, limit);
            CK(cudaGetLastError());
            CK(cudaMemcpy(got.data(), dout, in.size() * 4, cudaMemcpyDeviceToHost));
            for (size_t i = 0; i < in.size(); i++) {
                const uint32_t want = dgc_sum_round_bits(in[i], type, limit);
                if (got[i] != want) {
                    fail("type %u, %d ranks: 0x%08x rounds to 0x%08x on the device, 0x%08x on the host", type, N,
                         in[i], got[i], want);
                    break;
                }
            }
            checked++;
        }
    CK(cudaFree(din));
    CK(cudaFree(dout));
    printf("%s gpu.engine.sum_rules: %zu values, %d types and rank counts, device against host\n", verdict(),
           in.size(), checked);
}

/* Mapped pinned host memory, which the device's report and every state's
 * counter live in: a kernel writes a mapped word through its device
 * pointer, and the host reads it back after the stream is done. First in
 * the device session: everything on the NCCL path depends on it. */
__global__ void write_word(volatile unsigned long long *w, unsigned long long v) { *w = v; }

void case_mapped() {
    unsigned long long *host = nullptr, *dev = nullptr;
    cudaError_t e = cudaHostAlloc((void **)&host, sizeof *host, cudaHostAllocMapped);
    if (e != cudaSuccess) {
        fail("cudaHostAlloc(cudaHostAllocMapped): %s", cudaGetErrorString(e));
        return;
    }
    *host = 0;
    e = cudaHostGetDevicePointer((void **)&dev, host, 0);
    if (e != cudaSuccess) fail("cudaHostGetDevicePointer: %s", cudaGetErrorString(e));
    const unsigned long long want = 0x5eed5eedcafef00dull;
    if (e == cudaSuccess) {
        write_word<<<1, 1>>>(dev, want);
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        if (*(volatile unsigned long long *)host != want)
            fail("the host read 0x%llx from a mapped word the kernel wrote 0x%llx to", *host, want);
    }
    dgc_gpu_report *r = dgc_gpu_report_create();
    if (!r) fail("dgc_gpu_report_create: %s", dgc_gpu_last_error());
    dgc_gpu_report_destroy(r);
    CK(cudaFreeHost(host));
    printf("%s gpu.engine.mapped: a kernel's write to mapped host memory reaches the host\n", verdict());
}

const named_case kCases[] = {
    {"mapped", case_mapped},
    {"against_host", case_against_host}, {"half_inputs", case_half_inputs}, {"determinism", case_determinism},
    {"bad_payloads", case_bad_payloads}, {"nonfinite", case_nonfinite},     {"overflow", case_overflow},
    {"ties", case_ties},                     {"large", case_large},                   {"dense_transport", case_dense_transport},
    {"resize", case_resize},                {"footprint", case_footprint},
    {"compact", case_compact},              {"compact_fuzz", case_compact_fuzz},
    {"sum_rules", case_sum_rules},          {"clamp", case_clamp},        {"saturation", case_saturation},
    {"node_sum", case_node_sum},
};

} // namespace

int main(int argc, char **argv) {
    const char *which = nullptr;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--small")) small_mode = true;
        else which = argv[i];
    }
    bool known = which && !strcmp(which, "all");
    for (const named_case &c : kCases) known = known || (which && !strcmp(which, c.name));
    if (!known) {
        fprintf(stderr, "usage: %s CASE [--small]\n  CASE: all", argv[0]);
        for (const named_case &c : kCases) fprintf(stderr, " %s", c.name);
        fprintf(stderr, "\n");
        return 2;
    }
    if (!dgc_gpu_available()) {
        printf("SKIPPED gpu.engine.%s: no CUDA device (%s)\n", which, dgc_gpu_last_error());
        return 77;
    }
    for (const named_case &c : kCases) {
        if (strcmp(which, "all") && strcmp(which, c.name)) continue;
        case_name = c.name;
        failures_before = failures;
        c.run();
    }
    return failures ? 1 : 0;
}
