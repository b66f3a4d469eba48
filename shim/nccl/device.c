/* The caller's device and stream, seen from the shim's own CUDA runtime.
 *
 * The shim links the CUDA runtime statically (so that libcudart is not
 * NEEDED): its runtime instance is not the application's, and keeps its own
 * idea of the current device. Both sit on the driver's primary contexts, so
 * device memory, streams and events are shared; the current device is not,
 * so every entry into CUDA first points the shim's runtime at the
 * communicator's device, and points it back afterwards (the driver's
 * current context is per thread and the application's runtime may read it).
 *
 * "Back" is the driver's current context as it was on entry, none
 * included: a thread with no current context (PyTorch's watchdog calling
 * ncclCommAbort, a thread that never touched CUDA) has none again on
 * leaving. cudaGetDevice cannot tell: it answers 0 on such a thread, and
 * restoring "device 0" would make GPU 0's primary context current there
 * (created, on a rank that drives GPU 3, with its few hundred MB). So the
 * guard reads and restores the context itself, through the driver's
 * cuCtxGetCurrent and cuCtxSetCurrent (found by the runtime's
 * cudaGetDriverEntryPointByVersion: libcuda is not linked). Where the
 * driver cannot give them (every driver that runs the CUDA 13 runtime
 * can), it falls back to device numbers: the device cudaGetDevice gave on
 * entry comes back, and a thread with no context cannot be told from one
 * on device 0. */
#include "core/log.h"
#include "internal.h"

typedef int (*ctx_get_fn)(void **ctx);
typedef int (*ctx_set_fn)(void *ctx);

/* The two symbols as CUDA 12.0 defines them (unchanged since 4.0). */
void dgc_device_resolve(void) {
    void *get = NULL, *set = NULL;
    enum cudaDriverEntryPointQueryResult st1 = cudaDriverEntryPointSymbolNotFound, st2 = st1;
    if (cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &get, 12000, cudaEnableDefault, &st1) != cudaSuccess ||
        cudaGetDriverEntryPointByVersion("cuCtxSetCurrent", &set, 12000, cudaEnableDefault, &st2) != cudaSuccess ||
        st1 != cudaDriverEntryPointSuccess || st2 != cudaDriverEntryPointSuccess || !get || !set) {
        (void)cudaGetLastError();
        DGC_DEBUG("the driver's cuCtxGetCurrent/cuCtxSetCurrent cannot be had: the device guard restores device "
                  "numbers (a thread with no current context cannot be told from one on device 0)");
        return;
    }
    dgc_registry_set_slot(DGC_SLOT_NCCL_CTX_GET, get);
    dgc_registry_set_slot(DGC_SLOT_NCCL_CTX_SET, set);
}

int dgc_device_switch(int device) {
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess) return 0;
    (void)cudaGetLastError();
    DGC_ERROR("cudaSetDevice(%d) failed: %s", device, cudaGetErrorString(e));
    return -1;
}

static void relax(dgc_device_guard *g) {
    g->mode = cudaStreamCaptureModeRelaxed;
    g->mode_saved = cudaThreadExchangeStreamCaptureMode(&g->mode) == cudaSuccess;
    if (!g->mode_saved) (void)cudaGetLastError();
}

static void unrelax(dgc_device_guard *g) {
    if (g->mode_saved && cudaThreadExchangeStreamCaptureMode(&g->mode) != cudaSuccess) (void)cudaGetLastError();
    g->mode_saved = 0;
}

int dgc_device_enter(dgc_device_guard *g, int device) {
    int cur = -1;
    ctx_get_fn get = (ctx_get_fn)dgc_registry_slot(DGC_SLOT_NCCL_CTX_GET);
    g->ctx = NULL;
    g->ctx_saved = get && get(&g->ctx) == 0;
    /* With no current context cudaGetDevice answers 0 all the same: never
     * take that for the thread's device. */
    int had = !g->ctx_saved || g->ctx;
    g->saved = had && cudaGetDevice(&cur) == cudaSuccess ? cur : -1;
    relax(g);
    if (cur == device && g->saved >= 0) return 0;
    if (dgc_device_switch(device) == 0) return 0;
    unrelax(g);
    return -1;
}

/* Asks rather than remembers: a batch after ncclGroupEnd switches to each
 * communicator's device in turn, so the caller may be on its own device at
 * entry and on another one now (real NCCL restores it around its group
 * launch too). The context on entry comes back as it was, none included;
 * without the driver's entry points, the device on entry, when it was one. */
void dgc_device_leave(dgc_device_guard *g) {
    int cur = -1;
    unrelax(g);
    if (g->ctx_saved) {
        ctx_get_fn get = (ctx_get_fn)dgc_registry_slot(DGC_SLOT_NCCL_CTX_GET);
        ctx_set_fn set = (ctx_set_fn)dgc_registry_slot(DGC_SLOT_NCCL_CTX_SET);
        void *now = NULL;
        if (get(&now) != 0 || now != g->ctx) (void)set(g->ctx);
        return;
    }
    if (g->saved < 0) return;
    if (cudaGetDevice(&cur) != cudaSuccess || cur != g->saved) cudaSetDevice(g->saved);
}

int dgc_stream_capturing(cudaStream_t stream) {
    enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    cudaError_t e = cudaStreamIsCapturing(stream, &st);
    if (e == cudaSuccess) return st != cudaStreamCaptureStatusNone;
    (void)cudaGetLastError(); /* not sticky: clear it so that it is not reported again */
    /* The legacy stream, queried while another stream captures in global
     * mode, answers cudaErrorStreamCaptureImplicit: a capture is under way,
     * so nothing of ours may run now either. */
    if (e == cudaErrorStreamCaptureImplicit) return 1;
    /* Anything else is the runtime failing to answer: this call passes
     * through (the safe way if a capture were under way), and says so. */
    if (dgc_registry_claim(DGC_FLAG_NCCL_CAPTURE_QUERY_SAID))
        DGC_WARN("cudaStreamIsCapturing failed (%s): the call passes through uncompressed; so does every call for "
                 "which it fails again (said once)",
                 cudaGetErrorString(e));
    else
        DGC_DEBUG("cudaStreamIsCapturing failed again (%s): the call passes through", cudaGetErrorString(e));
    return 1;
}
