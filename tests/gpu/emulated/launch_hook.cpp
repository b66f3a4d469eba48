/* The emulated device's launch hook: test-only, linked into the CUDA test
 * programs of the emulated tier (DGC_CUDA=EMULATED), never into a product.
 * chipStar's kernel stubs launch through hipLaunchKernel, and the engine is
 * linked into the program statically, so definitions here take the engine's
 * calls and forward them to libCHIP.so (dlsym RTLD_NEXT). The CUDA runtime
 * adapter (cuda_adapter.cpp) cannot see these: the engine calls chipStar's
 * hip* functions directly, not cuda*.
 *
 *   launches         every hipLaunchKernel is counted (dgc_emu_launches):
 *                    gpu.engine.launches checks that a compressed call's
 *                    launches do not grow with its ranks
 *   preloaded_kernels  cudaFuncGetAttributes (hipFuncGetAttributes) marks a
 *                    kernel preloaded and its module (one per kernels/ file
 *                    file) the shim's; a launch of a kernel of such a module
 *                    that was never preloaded aborts, naming it, so that
 *                    every emulated case checks the preload lists
 *                    (internal.cuh: preload; kernels/state.cu). The CUB
 *                    stand-in's kernels (namespace cub) are exempt: the
 *                    engine does not name CUB's kernels (docs/emulated-device.md)
 *
 * What it records is the hook's own (seen), under a lock. */
#include <hip/hip_runtime_api.h>

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <map>
#include <mutex>
#include <set>
#include <string>

#define EXPORT extern "C" __attribute__((visibility("default")))

namespace {

/* What the hook has seen. Built on first use, never destroyed: chipStar
 * registers kernels from static constructors, which may run before this
 * file's globals would be constructed (and after they would be destroyed). */
struct seen {
    std::mutex lock;
    unsigned long long launches = 0;
    std::map<const void *, std::pair<void **, std::string>> kernels; /* host stub -> (module, device name) */
    std::set<const void *> preloaded;
    std::set<void **> shim_modules; /* modules with a preloaded kernel */
};
seen &hook() {
    static seen *s = new seen;
    return *s;
}

template <typename F> F next(const char *name) {
    void *f = dlsym(RTLD_NEXT, name);
    if (!f) {
        fprintf(stderr, "launch_hook: no %s after this object: %s\n", name, dlerror());
        abort();
    }
    return reinterpret_cast<F>(f);
}

/* preloaded_kernels: a launch the preload lists missed. */
void check_preloaded(const void *f) {
    seen &h = hook();
    std::lock_guard<std::mutex> g(h.lock);
    h.launches++;
    auto it = h.kernels.find(f);
    if (it == h.kernels.end() || h.preloaded.count(f) || !h.shim_modules.count(it->second.first)) return;
    const std::string &name = it->second.second;
    if (name.find("3cub") != std::string::npos) return;
    fprintf(stderr,
            "launch_hook: kernel %s launched but never preloaded: its file's preload list (kernels/*.cu, "
            "preload_kernels in kernels/state.cu) misses it\n",
            name.c_str());
    abort();
}

} // namespace

EXPORT void __hipRegisterFunction(void **modules, const void *host, char *device, const char *name,
                                  unsigned int limit, void *tid, void *bid, dim3 *block, dim3 *grid, int *wsize) {
    typedef void (*fn)(void **, const void *, char *, const char *, unsigned int, void *, void *, dim3 *, dim3 *,
                       int *);
    static const fn real = next<fn>("__hipRegisterFunction");
    {
        seen &h = hook();
        std::lock_guard<std::mutex> g(h.lock);
        h.kernels[host] = std::make_pair(modules, std::string(name ? name : "?"));
    }
    real(modules, host, device, name, limit, tid, bid, block, grid, wsize);
}

EXPORT hipError_t hipFuncGetAttributes(hipFuncAttributes *attr, const void *f) {
    typedef hipError_t (*fn)(hipFuncAttributes *, const void *);
    static const fn real = next<fn>("hipFuncGetAttributes");
    const hipError_t e = real(attr, f);
    if (e == hipSuccess) {
        seen &h = hook();
        std::lock_guard<std::mutex> g(h.lock);
        h.preloaded.insert(f);
        auto it = h.kernels.find(f);
        if (it != h.kernels.end()) h.shim_modules.insert(it->second.first);
    }
    return e;
}

EXPORT hipError_t hipLaunchKernel(const void *f, dim3 grid, dim3 block, void **args, size_t shared,
                                  hipStream_t stream) {
    typedef hipError_t (*fn)(const void *, dim3, dim3, void **, size_t, hipStream_t);
    static const fn real = next<fn>("hipLaunchKernel");
    check_preloaded(f);
    return real(f, grid, block, args, shared, stream);
}

/* launches: kernels launched by this process so far. */
EXPORT unsigned long long dgc_emu_launches(void) {
    seen &h = hook();
    std::lock_guard<std::mutex> g(h.lock);
    return h.launches;
}

/* preloaded_kernels: how many distinct kernels were preloaded. */
EXPORT unsigned long long dgc_emu_preloaded(void) {
    seen &h = hook();
    std::lock_guard<std::mutex> g(h.lock);
    return h.preloaded.size();
}
