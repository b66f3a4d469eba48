/* The caller's device and stream, seen from the shim's own CUDA runtime.
 *
 * The shim links the CUDA runtime statically (so that libcudart is not
 * NEEDED): its runtime instance is not the application's, and keeps its own
 * idea of the current device. Both sit on the driver's primary contexts, so
 * device memory, streams and events are shared; the current device is not,
 * so every entry into CUDA first points the shim's runtime at the
 * communicator's device, and points it back afterwards (the driver's
 * current context is per thread and the application's runtime may read it). */
#include "core/log.h"
#include "internal.h"

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
    g->saved = cudaGetDevice(&cur) == cudaSuccess ? cur : -1;
    relax(g);
    if (cur == device && g->saved >= 0) return 0;
    if (dgc_device_switch(device) == 0) return 0;
    unrelax(g);
    return -1;
}

/* Asks rather than remembers: a batch after ncclGroupEnd switches to each
 * communicator's device in turn, so the caller may be on its own device at
 * entry and on another one now (real NCCL restores it around its group
 * launch too). */
void dgc_device_leave(dgc_device_guard *g) {
    int cur = -1;
    unrelax(g);
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
