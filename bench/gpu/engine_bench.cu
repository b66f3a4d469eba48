/* The CUDA engine's time per call against the memory roofline.
 *
 *   engine_bench [--csv] [--iters N] [--sizes N1,N2,...] [--ranks N]
 *     --csv: only the machine-readable lines ("# csv,..." header, "csv,..."
 *            rows, as compressor_bench prints them; printed after the table
 *            otherwise)
 *     --ranks N: payloads gathered and decoded per call (default 2)
 *
 * For each size (default 25M and 100M fp32 elements) at 99.9% sparsity (the
 * k after warm-up; the state sized for the warm-up's first k, as the shim
 * sizes it), with momentum 0.9 (and compensation) and 0: the median over
 * --iters calls (default 20, after 3 untimed) of
 *     call   = compress + compact encode + the gathered payloads filled by
 *              N device copies (the all-gather's stand-in) + expand and
 *              decode of N payloads + commit
 *     engine = call - the copies
 * as the NCCL path runs a call (16-bit values: DGC_VALUE_BITS' default).
 * CUDA events around the whole call time it as the device sees it, with
 * nothing queued ahead: where the host queues launches more slowly than
 * the device runs them (small buffers, many ranks), the gaps count, as they
 * do in training; host_us is the host's own time to queue a call. Events
 * between the parts split the call into compress, gather and decode.
 * Beside it, the device-to-device copy bandwidth measured in the same run
 * (cudaMemcpyAsync of 1 GiB, bytes read + written over time), and the
 * roofline: the least bytes one step's update must move (read g, u, v;
 * write u, v; zero out: 24 bytes an element with momentum, 16 without u)
 * over that bandwidth. roofline/engine is the fraction of the roofline the
 * engine reaches. A state past the warm-up keeps one copy of u and v and
 * reads g, u and v twice (the compression, then the commit once the
 * outcome is known: kernels/commit.cu), 36 and 24 bytes: its fraction is at
 * most 2/3.
 * Without a CUDA device: SKIPPED, exit 77. */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <algorithm>
#include <vector>

#include "dgcshim/engine.h"
#include "dgcshim/policy.h"
#include "dgcshim/engine_cuda.h"

#define CK(x)                                                                                                        \
    do {                                                                                                             \
        cudaError_t e_ = (x);                                                                                        \
        if (e_ != cudaSuccess) {                                                                                     \
            fprintf(stderr, "engine_bench: %s: %s\n", #x, cudaGetErrorString(e_));                                   \
            exit(1);                                                                                                 \
        }                                                                                                            \
    } while (0)

namespace {

/* A gradient-like fill: random sign, magnitude log-uniform over [2^-20, 2). */
__global__ void fill_kernel(float *g, uint64_t n, uint64_t seed) {
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x) {
        uint64_t z = (i + 1) * 0x9e3779b97f4a7c15ull + seed;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        const uint32_t exp = 107u + (uint32_t)((z >> 32) % 21u);
        g[i] = __uint_as_float((uint32_t)(z >> 63) << 31 | exp << 23 | ((uint32_t)z & 0x7fffffu));
    }
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t m = v.size() / 2;
    return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

/* Device-to-device copy bandwidth, bytes read + written per second. */
double copy_bandwidth(cudaStream_t st) {
    const size_t bytes = (size_t)1 << 30;
    void *a = nullptr, *b = nullptr;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    CK(cudaMemsetAsync(a, 1, bytes, st));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<double> t;
    for (int i = 0; i < 13; i++) {
        CK(cudaEventRecord(e0, st));
        CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (i >= 3) t.push_back(ms * 1e-3);
    }
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    CK(cudaFree(a));
    CK(cudaFree(b));
    return 2.0 * (double)bytes / median(t);
}

double now_us() {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec * 1e-3;
}

struct result {
    uint64_t n, k;
    float m;
    int nranks;
    double compress_us, decode_us, engine_us, gather_us, call_us, host_us, roofline_us, bytes;
};

bool run(uint64_t n, float m, int nranks, int iters, double bw, cudaStream_t st, result *res) {
    const uint64_t k = dgc_k_for(n, 0.001);
    dgc_gpu_shape sh;
    sh.n = n;
    sh.k = dgc_k_for(n, 0.25);
    sh.sparse_k = sh.k; /* the all-gather at every k (the warm-up's first included) */
    sh.dense = 0;
    sh.value_bits = 16; /* compact payloads, 16-bit values: the NCCL path's default */
    sh.nranks = nranks;
    sh.with_momentum = m > 0;
    sh.keep_prev = m > 0;
    sh.dtype = DGC_GPU_F32;
    char err[256] = "";
    dgc_gpu_state *s = dgc_gpu_state_create(&sh, (dgc_cuda_stream)st, err, sizeof err);
    if (!s) {
        fprintf(stderr, "engine_bench: n %llu: %s\n", (unsigned long long)n, err);
        return false;
    }
    dgc_gpu_report *rep = dgc_gpu_report_create();
    float *g = nullptr, *out = nullptr;
    CK(cudaMalloc(&g, n * sizeof(float)));
    CK(cudaMalloc(&out, n * sizeof(float)));
    fill_kernel<<<1024, 256, 0, st>>>(g, n, 12345);
    CK(cudaGetLastError());
    dgc_step_params p;
    memset(&p, 0, sizeof p);
    p.n = n;
    p.k = k;
    p.momentum = m;
    p.nesterov = 0;
    p.momentum_masking = 1;
    p.clip_norm = 0;
    p.nranks = nranks;
    p.sample_ratio = 0.01;
    p.value_bits = 16;
    cudaEvent_t ev[4];
    for (cudaEvent_t &e : ev) CK(cudaEventCreate(&e));
    std::vector<double> tc, td, tg, te, tw, th;
    CK(cudaStreamSynchronize(st));
    for (int it = 0; it < iters + 3; it++) {
        p.step = 100 + (uint64_t)it;
        const double h0 = now_us();
        CK(cudaEventRecord(ev[0], st));
        if (dgc_gpu_compress(s, g, out, DGC_GPU_F32, &p, (dgc_cuda_stream)st, err, sizeof err) ||
            dgc_gpu_encode(s, &p, (dgc_cuda_stream)st, err, sizeof err)) {
            fprintf(stderr, "engine_bench: compress: %s\n", err);
            return false;
        }
        CK(cudaEventRecord(ev[1], st));
        const size_t wb = dgc_gpu_wire_bytes(s, k);
        for (int r = 0; r < nranks; r++)
            CK(cudaMemcpyAsync((char *)dgc_gpu_wire_gathered(s) + (size_t)r * wb, dgc_gpu_wire(s), wb,
                               cudaMemcpyDeviceToDevice, st));
        CK(cudaEventRecord(ev[2], st));
        if (dgc_gpu_decode(s, out, DGC_GPU_F32, &p, m > 0, 0, rep, (dgc_cuda_stream)st, err, sizeof err)) {
            fprintf(stderr, "engine_bench: decode: %s\n", err);
            return false;
        }
        CK(cudaEventRecord(ev[3], st));
        const double h1 = now_us();
        CK(cudaEventSynchronize(ev[3]));
        if (it < 3) continue;
        float a, b, c, w;
        CK(cudaEventElapsedTime(&a, ev[0], ev[1]));
        CK(cudaEventElapsedTime(&b, ev[1], ev[2]));
        CK(cudaEventElapsedTime(&c, ev[2], ev[3]));
        CK(cudaEventElapsedTime(&w, ev[0], ev[3]));
        tc.push_back(a * 1e3);
        tg.push_back(b * 1e3);
        td.push_back(c * 1e3);
        tw.push_back(w * 1e3);
        te.push_back((w - b) * 1e3);
        th.push_back(h1 - h0);
    }
    if (rep && (rep->bad || rep->nonfinite || rep->failed))
        fprintf(stderr, "engine_bench: n %llu: the report says bad %u nonfinite %llu failed %llu\n",
                (unsigned long long)n, rep->bad, (unsigned long long)rep->nonfinite, (unsigned long long)rep->failed);
    res->n = n;
    res->k = k;
    res->m = m;
    res->nranks = nranks;
    res->compress_us = median(tc);
    res->decode_us = median(td);
    res->gather_us = median(tg);
    res->engine_us = median(te);
    res->call_us = median(tw);
    res->host_us = median(th);
    res->bytes = m > 0 ? 24 : 16;
    res->roofline_us = res->bytes * (double)n / bw * 1e6;
    for (cudaEvent_t &e : ev) CK(cudaEventDestroy(e));
    CK(cudaFree(g));
    CK(cudaFree(out));
    dgc_gpu_report_destroy(rep);
    dgc_gpu_state_destroy(s);
    return true;
}

} // namespace

int main(int argc, char **argv) {
    bool csv = false;
    int iters = 20, nranks = 2;
    std::vector<uint64_t> sizes = {25000000, 100000000};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--csv")) csv = true;
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--ranks") && i + 1 < argc) nranks = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--sizes") && i + 1 < argc) {
            sizes.clear();
            for (char *t = strtok(argv[++i], ","); t; t = strtok(nullptr, ",")) sizes.push_back(strtoull(t, nullptr, 10));
        } else {
            fprintf(stderr, "usage: %s [--csv] [--iters N] [--sizes N1,N2,...] [--ranks N]\n", argv[0]);
            return 2;
        }
    }
    if (iters < 1) iters = 1;
    if (nranks < 1) {
        fprintf(stderr, "engine_bench: --ranks must be at least 1\n");
        return 2;
    }
    if (!dgc_gpu_available()) {
        printf("SKIPPED engine_bench: no CUDA device (%s)\n", dgc_gpu_last_error());
        return 77;
    }
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaDeviceProp prop;
    int dev = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaGetDeviceProperties(&prop, dev));
    const double bw = copy_bandwidth(st);
    if (!csv)
        printf("# %s, device-to-device copy %.0f GB/s (read + write), median of %d calls, %d ranks' payloads\n"
               "%12s %10s %8s %11s %10s %10s %10s %10s %9s %6s %12s %9s\n",
               prop.name, bw * 1e-9, iters, nranks, "n", "k", "momentum", "compress_us", "decode_us", "engine_us",
               "gather_us", "call_us", "host_us", "B/elem", "roofline_us", "roof/eng");
    std::vector<result> all;
    int rc = 0;
    for (uint64_t n : sizes)
        for (float m : {0.9f, 0.0f}) {
            result r;
            if (!run(n, m, nranks, iters, bw, st, &r)) {
                rc = 1;
                continue;
            }
            all.push_back(r);
            if (!csv)
                printf("%12llu %10llu %8g %11.1f %10.1f %10.1f %10.1f %10.1f %9.1f %6.0f %12.1f %9.3f\n",
                       (unsigned long long)r.n, (unsigned long long)r.k, (double)r.m, r.compress_us, r.decode_us,
                       r.engine_us, r.gather_us, r.call_us, r.host_us, r.bytes, r.roofline_us,
                       r.roofline_us / r.engine_us);
            fflush(stdout);
        }
    /* The machine-readable lines, as compressor_bench prints them (bench/gpu/run.sh reads them). */
    printf("#\n# csv,device,n,k,ranks,momentum,sparsity,dtype,compress_median_ms,decode_median_ms,engine_median_ms,"
           "gather_median_ms,call_median_ms,host_median_ms,copy_gbps,bytes_per_elem,roofline_ms,roofline_over_engine\n");
    for (const result &r : all)
        printf("csv,%s,%llu,%llu,%d,%g,0.999,f32,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.0f,%.0f,%.4f,%.3f\n", prop.name,
               (unsigned long long)r.n, (unsigned long long)r.k, r.nranks, (double)r.m, r.compress_us * 1e-3,
               r.decode_us * 1e-3, r.engine_us * 1e-3, r.gather_us * 1e-3, r.call_us * 1e-3, r.host_us * 1e-3,
               bw * 1e-9, r.bytes, r.roofline_us * 1e-3, r.roofline_us / r.engine_us);
    CK(cudaStreamDestroy(st));
    return rc;
}
