/* The emulated device's CUDA runtime: the cuda* functions that C code
 * compiled against the CUDA toolkit's headers calls (the shim's NCCL front
 * end, nccl_check, the NCCL stand-in, the DDP-shaped program), with the
 * CUDA ABI, as forwards to chipStar's hip* functions. chipStar exports no
 * cuda* symbol, and its CUDA headers are C++ only. Test-only: built for
 * DGC_CUDA=EMULATED, never installed.
 *
 * One shared object per process (libdgc_emu_cudart.so), so that what it
 * remembers (streams under capture, device memory in use) is the same for
 * every caller. Error codes are mapped to CUDA's values (hip's agree for
 * every code mapped here).
 *
 * Where chipStar v1.2.1 differs from CUDA, the forward says so under the
 * defect's name (docs/emulated-device.md); emulated.defects shows it is
 * still there, emulated.stand_ins (stand_in_check.c) checks the answer:
 *   stream_is_capturing       hipStreamIsCapturing is not implemented (801,
 *                             or invalid value on the null stream, each
 *                             logged as an error); captures begun and ended
 *                             here are remembered and answered instead
 *   stream_query              hipStreamQuery never reads queued work as
 *                             done; an event recorded after it answers
 *   stream_wait_event_captures  hipStreamWaitEvent leaves the stream
 *                             "under capture" into no graph; the host waits
 *                             for the event instead
 *
 * Two things of NVIDIA's that chipStar does not have are emulated here, so
 * that tests can see what the shim does with them:
 *   pinned_copies             on NVIDIA a cudaMemcpyAsync between the device
 *                             and pageable host memory may return only once
 *                             the stream has reached it (device to host:
 *                             always), so a host wait that must poll would
 *                             block in CUDA. The shim's copies (found by
 *                             their caller's object) must use memory from
 *                             cudaHostAlloc: any other aborts the process,
 *                             naming the rule
 *   thread_contexts           the driver's current context per thread:
 *                             none until the thread sets a device or makes a
 *                             call that needs one (which, as on NVIDIA,
 *                             makes the runtime's device current); the
 *                             driver's cuCtxGetCurrent and cuCtxSetCurrent,
 *                             through cudaGetDriverEntryPointByVersion */
#include <hip/hip_runtime_api.h>

#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <map>
#include <mutex>
#include <set>

#define EXPORT extern "C" __attribute__((visibility("default")))

namespace {

/* CUDA's values for the codes hip can answer. */
int to_cuda(hipError_t e) {
    switch ((int)e) {
    case 0: case 1: case 2: case 3: case 4: case 17: case 21: case 100: case 101: case 400: case 600: case 700:
    case 716: case 719: case 801: case 900: case 901: case 902: case 903: case 904: case 905: case 906: case 907:
    case 908:
        return (int)e;
    default:
        return 999; /* cudaErrorUnknown */
    }
}

std::mutex lock;
std::set<hipStream_t> capturing; /* stream_is_capturing */
std::map<uintptr_t, size_t> pinned; /* pinned_copies: cudaHostAlloc's blocks by start */

/* thread_contexts: 0, none; d + 1, device d's primary context. */
thread_local int context = 0;
int device_token[64]; /* what cuCtxGetCurrent hands out: &device_token[d] */

/* A call that needs a context makes the runtime's device current where the
 * thread has none, as NVIDIA's runtime does. */
void need_context() {
    if (context) return;
    int d = 0;
    if (hipGetDevice(&d) != hipSuccess || d < 0 || d >= 64) d = 0;
    context = d + 1;
}

int is_pinned(const void *p, size_t size) {
    std::lock_guard<std::mutex> g(lock);
    auto it = pinned.upper_bound((uintptr_t)p);
    if (it == pinned.begin()) return 0;
    --it;
    return (uintptr_t)p + size <= it->first + it->second;
}

/* pinned_copies: the caller is the shim when its return address lies in
 * libdgcshim*.so. */
int from_shim(void *ret) {
    Dl_info info;
    return dladdr(ret, &info) && info.dli_fname && strstr(info.dli_fname, "libdgcshim");
}

} // namespace

#define FORWARD(call) return to_cuda(call)
/* A forward that needs the thread's context (thread_contexts). */
#define CFORWARD(call)                                                                                                \
    do {                                                                                                               \
        need_context();                                                                                                \
        return to_cuda(call);                                                                                          \
    } while (0)

/* ---- memory ---- */

EXPORT int cudaMalloc(void **p, size_t size) { CFORWARD(hipMalloc(p, size)); }
EXPORT int cudaFree(void *p) { CFORWARD(hipFree(p)); }
EXPORT int cudaMallocAsync(void **p, size_t size, hipStream_t s) { CFORWARD(hipMallocAsync(p, size, s)); }
EXPORT int cudaFreeAsync(void *p, hipStream_t s) { CFORWARD(hipFreeAsync(p, s)); }
/* DGC_EMU_HOSTALLOC_FAILS=N, a fault a test injects: the process's first N
 * calls fail as a device without pinned memory left would
 * (gpu.nccl.setup_failed). */
EXPORT int cudaHostAlloc(void **p, size_t size, unsigned int flags) {
    static std::mutex m;
    static long fail_left = -1;
    {
        std::lock_guard<std::mutex> g(m);
        if (fail_left < 0) {
            const char *n = getenv("DGC_EMU_HOSTALLOC_FAILS");
            fail_left = n ? strtol(n, nullptr, 10) : 0;
        }
        if (fail_left > 0) {
            fail_left--;
            return 2; /* cudaErrorMemoryAllocation */
        }
    }
    need_context();
    const hipError_t e = hipHostMalloc(p, size, flags);
    if (e == hipSuccess) {
        std::lock_guard<std::mutex> g(lock);
        pinned[(uintptr_t)*p] = size;
    }
    return to_cuda(e);
}
EXPORT int cudaFreeHost(void *p) {
    {
        std::lock_guard<std::mutex> g(lock);
        pinned.erase((uintptr_t)p);
    }
    CFORWARD(hipHostFree(p));
}
EXPORT int cudaHostGetDevicePointer(void **dev, void *host, unsigned int flags) {
    CFORWARD(hipHostGetDevicePointer(dev, host, flags));
}
EXPORT int cudaMemGetInfo(size_t *free_bytes, size_t *total) { CFORWARD(hipMemGetInfo(free_bytes, total)); }
EXPORT int cudaMemset(void *p, int value, size_t size) { CFORWARD(hipMemset(p, value, size)); }
EXPORT int cudaMemsetAsync(void *p, int value, size_t size, hipStream_t s) {
    CFORWARD(hipMemsetAsync(p, value, size, s));
}
/* cudaMemcpyKind and hipMemcpyKind share their values (0-4). */
EXPORT int cudaMemcpy(void *dst, const void *src, size_t size, int kind) {
    CFORWARD(hipMemcpy(dst, src, size, (hipMemcpyKind)kind));
}
/* pinned_copies: the shim's copies between the device and the host must
 * use pinned memory (kind 1 host to device, 2 device to host). */
EXPORT int cudaMemcpyAsync(void *dst, const void *src, size_t size, int kind, hipStream_t s) {
    const void *host = kind == 1 ? src : kind == 2 ? dst : nullptr;
    if (host && size && !is_pinned(host, size) && from_shim(__builtin_return_address(0))) {
        fprintf(stderr,
                "emulated device (pinned_copies): libdgcshim called cudaMemcpyAsync %s pageable host memory (%zu "
                "bytes at %p); on NVIDIA it would return only once the stream reached it, so a polling wait after "
                "it would block in CUDA\n",
                kind == 1 ? "from" : "into", size, host);
        abort();
    }
    CFORWARD(hipMemcpyAsync(dst, src, size, (hipMemcpyKind)kind, s));
}

/* ---- devices, streams, errors ---- */

EXPORT int cudaGetDeviceCount(int *n) { FORWARD(hipGetDeviceCount(n)); }
EXPORT int cudaSetDevice(int d) {
    const hipError_t e = hipSetDevice(d);
    if (e == hipSuccess && d >= 0 && d < 64) context = d + 1;
    return to_cuda(e);
}
/* thread_contexts: the driver's cuCtxGetCurrent and cuCtxSetCurrent (0:
 * CUDA_SUCCESS). */
static int ctx_get_current(void **ctx) {
    *ctx = context ? (void *)&device_token[context - 1] : nullptr;
    return 0;
}
static int ctx_set_current(void *ctx) {
    if (!ctx) {
        context = 0;
        return 0;
    }
    const ptrdiff_t d = (int *)ctx - device_token;
    if (d < 0 || d >= 64) return 201; /* CUDA_ERROR_INVALID_CONTEXT */
    if (hipSetDevice((int)d) != hipSuccess) return 201;
    context = (int)d + 1;
    return 0;
}
/* cudaDriverEntryPointQueryResult: 0 found, 1 not found. */
EXPORT int cudaGetDriverEntryPointByVersion(const char *symbol, void **fn, unsigned int version,
                                            unsigned long long flags, int *status) {
    (void)version, (void)flags;
    *fn = !strcmp(symbol, "cuCtxGetCurrent")   ? (void *)ctx_get_current
          : !strcmp(symbol, "cuCtxSetCurrent") ? (void *)ctx_set_current
                                               : nullptr;
    if (status) *status = *fn ? 0 : 1;
    return 0;
}
EXPORT int cudaGetDevice(int *d) { FORWARD(hipGetDevice(d)); }
EXPORT int cudaDeviceSynchronize(void) { CFORWARD(hipDeviceSynchronize()); }
EXPORT int cudaStreamCreate(hipStream_t *s) { CFORWARD(hipStreamCreate(s)); }
EXPORT int cudaStreamCreateWithFlags(hipStream_t *s, unsigned int flags) {
    CFORWARD(hipStreamCreateWithFlags(s, flags));
}
EXPORT int cudaStreamDestroy(hipStream_t s) { CFORWARD(hipStreamDestroy(s)); }
EXPORT int cudaStreamSynchronize(hipStream_t s) { CFORWARD(hipStreamSynchronize(s)); }
/* stream_query: chipStar's hipStreamQuery never reads queued work as done
 * (emulated.defects); an event recorded after that work does. */
EXPORT int cudaStreamQuery(hipStream_t s) {
    need_context();
    hipError_t e = hipStreamQuery(s);
    if (e != hipErrorNotReady) return to_cuda(e);
    hipEvent_t ev;
    if (hipEventCreateWithFlags(&ev, hipEventDisableTiming) != hipSuccess) return to_cuda(e);
    e = hipEventRecord(ev, s);
    if (e == hipSuccess) e = hipEventQuery(ev);
    (void)hipEventDestroy(ev);
    return to_cuda(e);
}
EXPORT int cudaEventCreateWithFlags(hipEvent_t *e, unsigned int flags) { CFORWARD(hipEventCreateWithFlags(e, flags)); }
EXPORT int cudaEventRecord(hipEvent_t e, hipStream_t s) { CFORWARD(hipEventRecord(e, s)); }
EXPORT int cudaEventQuery(hipEvent_t e) { CFORWARD(hipEventQuery(e)); }
EXPORT int cudaEventSynchronize(hipEvent_t e) { CFORWARD(hipEventSynchronize(e)); }
EXPORT int cudaEventDestroy(hipEvent_t e) { CFORWARD(hipEventDestroy(e)); }
/* stream_wait_event_captures: chipStar's hipStreamWaitEvent marks the
 * stream as under capture into a graph never made, and the stream's next
 * operation crashes; the host waits for the event instead, which orders
 * the stream's later work after it all the same (on the emulated device an
 * event's work always ends: the stand-in NCCL runs collectives when they
 * are called). */
EXPORT int cudaStreamWaitEvent(hipStream_t s, hipEvent_t e, unsigned int flags) {
    (void)s, (void)flags;
    CFORWARD(hipEventSynchronize(e));
}
EXPORT int cudaLaunchHostFunc(hipStream_t s, void (*fn)(void *), void *arg) { CFORWARD(hipLaunchHostFunc(s, fn, arg)); }
EXPORT int cudaGetLastError(void) { FORWARD(hipGetLastError()); }
EXPORT int cudaPeekAtLastError(void) { FORWARD(hipPeekAtLastError()); }
EXPORT const char *cudaGetErrorString(int e) { return hipGetErrorString((hipError_t)e); }
EXPORT const char *cudaGetErrorName(int e) { return hipGetErrorName((hipError_t)e); }

/* ---- capture: stream_is_capturing ---- */

EXPORT int cudaStreamBeginCapture(hipStream_t s, int mode) {
    const hipError_t e = hipStreamBeginCapture(s, (hipStreamCaptureMode)mode);
    if (e == hipSuccess) {
        std::lock_guard<std::mutex> g(lock);
        capturing.insert(s);
    }
    return to_cuda(e);
}

EXPORT int cudaStreamEndCapture(hipStream_t s, hipGraph_t *graph) {
    {
        std::lock_guard<std::mutex> g(lock);
        capturing.erase(s);
    }
    CFORWARD(hipStreamEndCapture(s, graph));
}

/* The thread's capture mode, kept here: chipStar captures nothing the shim
 * could disturb, so the mode changes nothing but what the next exchange
 * hands back (cudaStreamCaptureModeGlobal 0, the default). */
EXPORT int cudaThreadExchangeStreamCaptureMode(int *mode) {
    static thread_local int current = 0;
    const int was = current;
    current = *mode;
    *mode = was;
    return 0;
}

/* cudaStreamCaptureStatus: 0 none, 1 active (hip's values too). Not asked
 * of chipStar, which would only log its refusal on every call.
 * DGC_EMU_CAPTURE_QUERY_FAILS=N, a fault a test injects: the first N
 * queries fail with cudaErrorNotSupported, as a runtime that cannot answer
 * would (gpu.nccl.capture_query). */
EXPORT int cudaStreamIsCapturing(hipStream_t s, int *status) {
    need_context();
    std::lock_guard<std::mutex> g(lock);
    static long fail_left = -1;
    if (fail_left < 0) {
        const char *n = getenv("DGC_EMU_CAPTURE_QUERY_FAILS");
        fail_left = n ? strtol(n, nullptr, 10) : 0;
    }
    if (fail_left > 0) {
        fail_left--;
        return 801; /* cudaErrorNotSupported */
    }
    *status = capturing.count(s) ? 1 : 0;
    return 0;
}

EXPORT int cudaGraphInstantiate(hipGraphExec_t *exec, hipGraph_t graph, unsigned long long flags) {
    CFORWARD(hipGraphInstantiateWithFlags(exec, graph, flags));
}
EXPORT int cudaGraphLaunch(hipGraphExec_t exec, hipStream_t s) { CFORWARD(hipGraphLaunch(exec, s)); }
EXPORT int cudaGraphExecDestroy(hipGraphExec_t exec) { CFORWARD(hipGraphExecDestroy(exec)); }
EXPORT int cudaGraphDestroy(hipGraph_t graph) { CFORWARD(hipGraphDestroy(graph)); }
