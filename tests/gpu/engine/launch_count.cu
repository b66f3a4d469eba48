/* gpu.engine.launches (emulated device only): a compressed call's kernel
 * launches do not grow with its ranks (issue 46, part 4). The same call shape
 * (compress, encode, decode with momentum compensation: every per-rank pass),
 * with plain pairs and with compact 16-bit payloads (the expansion's passes
 * too), at 2, 4 and 16 ranks; one process stands in for all of them, its own
 * payload copied into every rank's place of the gathered buffer. Launches
 * are counted by the emulated device's launch hook (tests/gpu/emulated/
 * launch_hook.cpp), which also aborts on a kernel the preload lists missed.
 *
 *   launch_count     prints the launches per call at each N; exit 0 when
 *                    they are equal, 1 when not */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "dgcshim/engine.h"
#include "dgcshim/engine_cuda.h"
#include "dgcshim/sum_rules.h"

extern "C" unsigned long long dgc_emu_launches(void);
extern "C" unsigned long long dgc_emu_preloaded(void);

namespace {

#define CK(x)                                                                                                        \
    do {                                                                                                             \
        cudaError_t e_ = (x);                                                                                        \
        if (e_ != cudaSuccess) {                                                                                     \
            fprintf(stderr, "FATAL %s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));                \
            exit(1);                                                                                                 \
        }                                                                                                            \
    } while (0)

constexpr uint64_t kN = 1 << 14, kK = 64;
constexpr int kSteps = 3; /* the second and third steps compensate: the subtraction's launches too */

dgc_step_params params_for(uint64_t step, int nranks, unsigned vbits) {
    dgc_step_params p;
    memset(&p, 0, sizeof p);
    p.n = kN;
    p.step = step;
    p.k = kK;
    p.momentum = 0.9f;
    p.momentum_masking = 1;
    p.nranks = nranks;
    p.sample_ratio = 0.01;
    p.sum_type = DGC_SUM_F32;
    p.value_bits = vbits;
    return p;
}

/* One call, every rank's payload this rank's own: the launches it made. */
long long one_call(dgc_gpu_state *s, float *g, float *out, dgc_gpu_report *rep, const dgc_step_params &p,
                   cudaStream_t st) {
    char err[256] = "";
    const size_t wb = dgc_gpu_wire_bytes(s, p.k);
    const unsigned long long before = dgc_emu_launches();
    if (dgc_gpu_compress(s, g, out, DGC_GPU_F32, &p, (dgc_cuda_stream)st, err, sizeof err) ||
        dgc_gpu_encode(s, &p, (dgc_cuda_stream)st, err, sizeof err)) {
        fprintf(stderr, "compress: %s\n", err);
        return -1;
    }
    const unsigned long long mid = dgc_emu_launches();
    for (int r = 0; r < p.nranks; r++)
        CK(cudaMemcpyAsync((char *)dgc_gpu_wire_gathered(s) + (size_t)r * wb, dgc_gpu_wire(s), wb,
                           cudaMemcpyDeviceToDevice, st));
    const unsigned long long copies = dgc_emu_launches() - mid; /* copies are not launches: 0 */
    if (dgc_gpu_decode(s, out, DGC_GPU_F32, &p, 1, 0, rep, (dgc_cuda_stream)st, err, sizeof err)) {
        fprintf(stderr, "decode: %s\n", err);
        return -1;
    }
    CK(cudaStreamSynchronize(st));
    return (long long)(dgc_emu_launches() - before - copies);
}

/* The launches of each call at nranks (vbits: the payload's values, 0 for
 * plain pairs), into calls; false on a failure. */
bool run(int nranks, unsigned vbits, std::vector<long long> *calls) {
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    dgc_gpu_shape sh;
    memset(&sh, 0, sizeof sh);
    sh.n = kN;
    sh.k = kK;
    sh.sparse_k = kK;
    sh.nranks = nranks;
    sh.with_momentum = 1;
    sh.keep_prev = 1;
    sh.dtype = DGC_GPU_F32;
    sh.value_bits = vbits;
    char err[256] = "";
    dgc_gpu_state *s = dgc_gpu_state_create(&sh, (dgc_cuda_stream)st, err, sizeof err);
    if (!s) {
        fprintf(stderr, "dgc_gpu_state_create: %s\n", err);
        return false;
    }
    std::vector<float> hg(kN);
    float *g = nullptr, *out = nullptr;
    CK(cudaMalloc(&g, kN * sizeof(float)));
    CK(cudaMalloc(&out, kN * sizeof(float)));
    dgc_gpu_report *rep = dgc_gpu_report_create();
    bool ok = true;
    for (int step = 1; step <= kSteps && ok; step++) {
        for (uint64_t i = 0; i < kN; i++) hg[i] = (float)((i * 2654435761u + (uint64_t)step * 40503u) % 1000) - 500.0f;
        CK(cudaMemcpyAsync(g, hg.data(), kN * sizeof(float), cudaMemcpyHostToDevice, st));
        const long long c = one_call(s, g, out, rep, params_for((uint64_t)step, nranks, vbits), st);
        ok = c >= 0;
        calls->push_back(c);
    }
    CK(cudaStreamSynchronize(st));
    if (rep->bad || rep->nonfinite || rep->failed) { /* every pass must have run, not returned at once */
        fprintf(stderr, "launch_count: %d ranks, value bits %u: the report says bad %u nonfinite %llu failed %llu\n",
                nranks, vbits, rep->bad, (unsigned long long)rep->nonfinite, (unsigned long long)rep->failed);
        ok = false;
    }
    dgc_gpu_report_destroy(rep);
    dgc_gpu_state_destroy(s);
    CK(cudaFree(g));
    CK(cudaFree(out));
    CK(cudaStreamDestroy(st));
    return ok;
}

} // namespace

int main() {
    if (!dgc_gpu_available()) {
        fprintf(stderr, "launch_count: no device\n");
        return 1;
    }
    const int ranks[] = {2, 4, 16};
    int failures = 0;
    for (unsigned vbits : {0u, 16u}) {
        std::vector<long long> first;
        for (int nranks : ranks) {
            std::vector<long long> calls;
            if (!run(nranks, vbits, &calls)) return 1;
            printf("%s, ranks %2d: launches per compress+encode+decode, steps 1..%d:",
                   vbits ? "compact16" : "plain    ", nranks, kSteps);
            for (long long c : calls) printf(" %lld", c);
            printf("\n");
            if (first.empty()) first = calls;
            else if (calls != first) {
                printf("FAIL: the launches at %d ranks differ from those at %d ranks\n", nranks, ranks[0]);
                failures++;
            }
        }
    }
    printf("kernels preloaded: %llu\n", dgc_emu_preloaded());
    printf("%s gpu.engine.launches\n", failures ? "FAIL" : "PASS");
    return failures ? 1 : 0;
}
