/* The emulated device's run-time defects, checked on the device. Built
 * twice (tests/gpu/emulated/CMakeLists.txt): as chipStar compiles plain
 * CUDA (defects_raw), where each defect should still show, and with
 * compat.h force-included (defects_compat), where each workaround must give
 * CUDA's result; the compat build also checks the facilities compat.h adds.
 * One line per check, read by defects.sh:
 *
 *   right <name>: <what was seen>     CUDA's documented result
 *   wrong <name>: <what was seen>     something else
 *
 * Exit 0, or 2 when the device itself fails. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_bf16.h>

namespace {

void report(bool right, const char *name, const char *seen) { printf("%s %s: %s\n", right ? "right" : "wrong", name, seen); }

#define CK(x)                                                                                                        \
    do {                                                                                                             \
        const int e_ = (int)(x);                                                                                     \
        if (e_ != 0) {                                                                                               \
            printf("FATAL %s: error %d\n", #x, e_);                                                                  \
            exit(2);                                                                                                 \
        }                                                                                                            \
    } while (0)

template <typename T> T *device_copy(const T &h) {
    T *d;
    CK(cudaMalloc(&d, sizeof h));
    CK(cudaMemcpy(d, &h, sizeof h, cudaMemcpyHostToDevice));
    return d;
}
template <typename T> void fetch(T *h, T *d) {
    CK(cudaGetLastError());
    CK(cudaMemcpy(h, d, sizeof *h, cudaMemcpyDeviceToHost));
    CK(cudaFree(d));
}

struct finite_probe {
    float x[3];
    int got[3];
};
__global__ void isfinite_kernel(finite_probe *p) {
    for (int i = 0; i < 3; i++) p->got[i] = isfinite(p->x[i]) ? 1 : 0;
}

void check_isfinite() {
    finite_probe h = {{1.0f, 0.0f, INFINITY}, {0, 0, 0}};
    finite_probe *d = device_copy(h);
    isfinite_kernel<<<1, 1>>>(d);
    fetch(&h, d);
    char seen[128];
    snprintf(seen, sizeof seen, "device isfinite(1.0f) %d, isfinite(0.0f) %d, isfinite(inf) %d (CUDA: 1 1 0)", h.got[0],
             h.got[1], h.got[2]);
    report(h.got[0] == 1 && h.got[1] == 1 && h.got[2] == 0, "isfinite", seen);
}

/* Values whose order differs between the unsigned and the signed reading. */
struct extremes {
    unsigned long long min64, max64;
    unsigned int min32, max32;
};
__global__ void atomics_kernel(extremes *a) {
    atomicMin(&a->min64, 5ull);
    atomicMax(&a->max64, ~0ull - 1);
    atomicMin(&a->min32, 5u);
    atomicMax(&a->max32, ~0u - 1);
}

void check_atomics() {
    extremes h = {~0ull, 5ull, ~0u, 5u};
    extremes *d = device_copy(h);
    atomics_kernel<<<1, 1>>>(d);
    fetch(&h, d);
    char seen[160];
    snprintf(seen, sizeof seen, "atomicMin(~0, 5) left %#llx, atomicMax(5, ~0-1) left %#llx (CUDA: 0x5, ~0-1)",
             h.min64, h.max64);
    report(h.min64 == 5 && h.max64 == ~0ull - 1, "atomic_minmax_u64", seen);
    snprintf(seen, sizeof seen, "atomicMin(~0, 5) left %#x, atomicMax(5, ~0-1) left %#x (CUDA: 0x5, ~0-1)", h.min32,
             h.max32);
    report(h.min32 == 5 && h.max32 == ~0u - 1, "atomic_minmax_u32", seen);
}

/* nvcc defines __CUDA_ARCH__ in the device pass only. */
bool arch_in_host_pass() {
#ifdef __CUDA_ARCH__
    return true;
#else
    return false;
#endif
}

#ifdef DGC_EMU_COMPAT
/* What compat.h adds, against CUDA's definitions: one warp of 32 lanes. */
struct warp_probe {
    unsigned int ballot[32], any[32], none[32], match[32];
    unsigned long long word, ldcg;
};
__global__ void warp_kernel(warp_probe *p) {
    const unsigned int lane = threadIdx.x & 31u;
    p->ballot[lane] = __ballot_sync(0xffffffffu, lane % 3 == 0);
    p->any[lane] = __any_sync(0xffffffffu, lane == 17);
    p->none[lane] = __any_sync(0xffffffffu, 0);
    p->match[lane] = __match_any_sync(0xffffffffu, lane % 4);
    if (lane == 0) p->ldcg = __ldcg(&p->word);
}

void check_warp() {
    warp_probe h;
    memset(&h, 0, sizeof h);
    h.word = 0x0123456789abcdefull;
    warp_probe *d = device_copy(h);
    warp_kernel<<<1, 32>>>(d);
    fetch(&h, d);
    unsigned int want_ballot = 0, bad = 0;
    for (unsigned int l = 0; l < 32; l++) want_ballot |= (l % 3 == 0 ? 1u : 0u) << l;
    for (unsigned int l = 0; l < 32; l++) {
        const unsigned int want_match = 0x11111111u << (l % 4);
        bad += h.ballot[l] != want_ballot || h.any[l] != 1 || h.none[l] != 0 || h.match[l] != want_match;
    }
    char seen[160];
    snprintf(seen, sizeof seen, "lanes where __ballot_sync, __any_sync or __match_any_sync differ from CUDA's: %u", bad);
    report(bad == 0, "warp_votes", seen);
    snprintf(seen, sizeof seen, "__ldcg of a 64-bit word gave %#llx (want %#llx)", h.ldcg, h.word);
    report(h.ldcg == h.word, "ldcg_plain", seen);
}

__global__ void bf16_kernel(const float *x, unsigned short *bits, int n) {
    for (int i = 0; i < n; i++) {
        const __nv_bfloat16_raw r = __float2bfloat16_rn(x[i]);
        bits[i] = r.x;
    }
}

void check_bf16() {
    /* Round to nearest even at bf16's 8 significant bits: ties go to even. */
    const float x[4] = {1.0f, 1.00390625f /* tie: to 1.0 */, 1.01171875f /* tie: to 1.015625 */, -3.0e38f};
    const unsigned short want[4] = {0x3f80, 0x3f80, 0x3f82, 0xff62};
    float *dx;
    unsigned short *db, got[4];
    CK(cudaMalloc(&dx, sizeof x));
    CK(cudaMalloc(&db, sizeof got));
    CK(cudaMemcpy(dx, x, sizeof x, cudaMemcpyHostToDevice));
    bf16_kernel<<<1, 1>>>(dx, db, 4);
    CK(cudaGetLastError());
    CK(cudaMemcpy(got, db, sizeof got, cudaMemcpyDeviceToHost));
    char seen[160];
    snprintf(seen, sizeof seen, "__float2bfloat16_rn bits %04x %04x %04x %04x (want 3f80 3f80 3f82 ff62)", got[0],
             got[1], got[2], got[3]);
    report(memcmp(got, want, sizeof want) == 0, "bf16_rn", seen);
    CK(cudaFree(dx));
    CK(cudaFree(db));
}

void check_host_intrinsics() {
    const bool right = __clzll(1ll) == 63 && __clzll(0) == 64 && __popcll(0xf0f0ull) == 8 && __ffsll(0x100ll) == 9 &&
                       __ffsll(0) == 0;
    report(right, "host_intrinsics", "__clzll, __popcll and __ffsll from host code");
}
#endif

} // namespace

#ifndef DGC_EMU_COMPAT
/* stream_is_capturing, which cuda_adapter.cpp answers for the front end's C
 * code, asked of chipStar's hip* function it forwards to. */
void check_runtime_api() {
    hipStream_t s;
    CK(hipStreamCreate(&s));
    hipStreamCaptureStatus st = hipStreamCaptureStatusActive;
    const hipError_t e = hipStreamIsCapturing(s, &st);
    char seen[160];
    snprintf(seen, sizeof seen, "hipStreamIsCapturing on a new stream: error %d, status %d (CUDA: 0, 0)", (int)e,
             (int)st);
    report(e == hipSuccess && st == hipStreamCaptureStatusNone, "stream_is_capturing", seen);
    (void)hipGetLastError();
    /* stream_query: a queued copy, polled for 3 s, never reads as done by
     * hipStreamQuery, while an event recorded after it does (the adapter
     * answers cudaStreamQuery with such an event). */
    void *d = nullptr;
    static char host[4096];
    CK(hipMalloc(&d, sizeof host));
    CK(hipMemcpyAsync(host, d, sizeof host, hipMemcpyDeviceToHost, s));
    hipEvent_t ev;
    CK(hipEventCreateWithFlags(&ev, hipEventDisableTiming));
    CK(hipEventRecord(ev, s));
    hipError_t q = hipErrorNotReady, qe = hipErrorNotReady;
    for (int i = 0; i < 3000 && (q == hipErrorNotReady || qe == hipErrorNotReady); i++) {
        if (q == hipErrorNotReady) q = hipStreamQuery(s);
        if (qe == hipErrorNotReady) qe = hipEventQuery(ev);
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, nullptr);
    }
    snprintf(seen, sizeof seen, "hipStreamQuery after a queued copy, polled 3 s: %d (CUDA: 0); an event after it: %d",
             (int)q, (int)qe);
    report(q == hipSuccess, "stream_query", seen);
    CK(hipStreamSynchronize(s));
    /* stream_wait_event_captures: hipStreamWaitEvent marks the waiting
     * stream as under capture, into a graph never made, so that its next
     * operation is "captured" through a wild pointer; a capture begun on it
     * is refused as one already under way (CUDA: it begins). The stream is
     * left as it is: any use of it could crash. */
    hipStream_t w;
    CK(hipStreamCreate(&w));
    CK(hipStreamWaitEvent(w, ev, 0));
    const hipError_t b = hipStreamBeginCapture(w, hipStreamCaptureModeGlobal);
    snprintf(seen, sizeof seen, "hipStreamBeginCapture after hipStreamWaitEvent: error %d (CUDA: 0)", (int)b);
    report(b == hipSuccess, "stream_wait_event_captures", seen);
    if (b == hipSuccess) {
        hipGraph_t g;
        CK(hipStreamEndCapture(w, &g));
        CK(hipGraphDestroy(g));
        CK(hipStreamDestroy(w));
    }
    (void)hipGetLastError();
    CK(hipEventDestroy(ev));
    CK(hipFree(d));
    CK(hipStreamDestroy(s));
}
#endif

int main() {
#ifndef DGC_EMU_COMPAT
    check_runtime_api();
#endif
    check_isfinite();
    check_atomics();
#ifndef DGC_EMU_COMPAT /* compat.h cannot undefine it; host_intrinsics checks its workaround */
    report(!arch_in_host_pass(), "cuda_arch_in_host_pass",
           arch_in_host_pass() ? "__CUDA_ARCH__ is defined in the host pass" : "undefined in the host pass");
#else
    check_warp();
    check_bf16();
    check_host_intrinsics();
#endif
    return 0;
}
