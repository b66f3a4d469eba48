/* The NCCL front end at process exit.
 *
 * An NCCL-only job never reaches MPI_Finalize, where the MPI path prints the
 * DGC_STATS report: it is printed here instead (once: whoever claims
 * DGC_FLAG_REPORTED), on rank 0, with a line of call counts. Only host-side
 * figures are read: by exit time the CUDA runtime may have been torn down.
 *
 * And the one failure the shim cannot see while it runs: NCCL calls that
 * never reach it. Conda's PyTorch, TensorFlow up to 2.19 and Horovod's GPU
 * builds link NCCL in statically with local symbols, so their ncclAllReduce
 * calls go straight into their own copy. When a process that used the GPU
 * (libcuda is loaded) ends without a single NCCL call having reached the
 * shim and with no loaded object exporting ncclAllReduce, the loaded
 * objects are searched for a string every NCCL carries (the name of its
 * NCCL_COMM_ID variable), and the first one found is named in a warning.
 *
 * The handler is registered when the shim is loaded (registration only: no
 * CUDA, no environment), so that it runs before the loader unmaps anything. */
#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/log.h"
#include "internal.h"
#include "core/report.h"
#include "core/stats_file.h"

typedef struct {
    uintptr_t self;    /* an address inside the shim */
    int cuda;          /* libcuda is loaded */
    int dynamic;       /* some object exports ncclAllReduce: calls to it would have reached the shim */
    char found[512];   /* the first object holding NCCL that does not export it */
} scan_ctx;

static int in_object(const struct dl_phdr_info *info, uintptr_t a) {
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type == PT_LOAD && a >= lo && a < lo + ph->p_memsz) return 1;
    }
    return 0;
}

static const char *base_name(const struct dl_phdr_info *info) {
    const char *name = info->dlpi_name ? info->dlpi_name : "";
    const char *base = strrchr(name, '/');
    return base ? base + 1 : name;
}

static int look_for_cuda(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    scan_ctx *s = data;
    if (strncmp(base_name(info), "libcuda.so", 10) == 0) s->cuda = 1;
    return s->cuda;
}

/* 1 when the object itself exports ncclAllReduce: calls to it from any
 * other object bind to the shim's definition first. Both names are tried:
 * for the main program, dlsym searches the global scope, where the plain
 * name finds the shim's own definition first. */
static int exports_nccl(const struct dl_phdr_info *info) {
    const char *name = info->dlpi_name ? info->dlpi_name : "";
    void *h = dlopen(name[0] ? name : NULL, RTLD_NOLOAD | RTLD_LAZY);
    if (!h) return 0;
    static const char *const names[2] = {"ncclAllReduce", "pncclAllReduce"};
    int exports = 0;
    for (int i = 0; i < 2 && !exports; i++) {
        void *p = dlsym(h, names[i]);
        exports = p && in_object(info, (uintptr_t)p);
    }
    dlclose(h);
    return exports;
}

static int look_for_dynamic(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    scan_ctx *s = data;
    const char *base = base_name(info);
    if (in_object(info, s->self) || strstr(base, "linux-vdso")) return 0;
    s->dynamic = exports_nccl(info);
    return s->dynamic;
}

/* Reads through /proc/self/mem, which answers a page that cannot be read
 * with an error instead of a fault. */
static int segment_holds(int mem, uintptr_t lo, uintptr_t hi, const char *needle) {
    enum { CHUNK = 1 << 22 };
    size_t nlen = strlen(needle);
    char *buf = malloc(CHUNK + nlen);
    if (!buf) return 0;
    int hit = 0;
    size_t carry = 0;
    for (uintptr_t at = lo; at < hi && !hit;) {
        size_t want = hi - at < CHUNK ? (size_t)(hi - at) : CHUNK;
        ssize_t got = pread(mem, buf + carry, want, (off_t)at);
        if (got <= 0) break;
        hit = memmem(buf, carry + (size_t)got, needle, nlen) != NULL;
        size_t keep = carry + (size_t)got < nlen - 1 ? carry + (size_t)got : nlen - 1;
        memmove(buf, buf + carry + (size_t)got - keep, keep);
        carry = keep;
        at += (uintptr_t)got;
    }
    free(buf);
    return hit;
}

/* The objects that may hold a private NCCL: not the shim, and not NVIDIA's
 * own libraries (which carry none, and are large to read). */
static int look_for_nccl(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    scan_ctx *s = data;
    const char *base = base_name(info);
    if (in_object(info, s->self) || strstr(base, "linux-vdso") || strncmp(base, "libcu", 5) == 0 ||
        strncmp(base, "libnv", 5) == 0)
        return 0;
    int mem = open("/proc/self/mem", O_RDONLY | O_CLOEXEC);
    if (mem < 0) return 1;
    const char *needle = "NCCL_COMM_ID"; /* the shim's own image holds it too: skipped above */
    int hit = 0;
    for (int i = 0; i < info->dlpi_phnum && !hit; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_R)) continue;
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
        hit = segment_holds(mem, lo, lo + ph->p_filesz, needle);
    }
    close(mem);
    if (hit)
        snprintf(s->found, sizeof s->found, "%s",
                 info->dlpi_name && info->dlpi_name[0] ? info->dlpi_name : "the main program");
    return hit;
}

static const char *env_lookup(const char *name) { return getenv(name); }

/* Only when no loaded object exports NCCL: with a libnccl.so.2 in the
 * process, calls would have reached the shim, so none were made (a
 * launcher, a single-GPU run), and a framework's mention of the string
 * proves nothing. */
static void warn_unreached(void) {
    scan_ctx s = {.self = (uintptr_t)(void *)&warn_unreached};
    dl_iterate_phdr(look_for_cuda, &s);
    if (!s.cuda) return;
    dl_iterate_phdr(look_for_dynamic, &s);
    if (s.dynamic) return;
    dl_iterate_phdr(look_for_nccl, &s);
    if (!s.found[0]) return;
    if (dgc_registry_hook(DGC_HOOK_SELF_KEY) == -1) {
        /* Nothing read the environment (no MPI_Init, no NCCL call): its
         * DGC_LOG_LEVEL still decides whether this is said. */
        dgc_config cfg;
        char err[256];
        dgc_config_parse(&cfg, env_lookup, err, sizeof err); /* the defaults when invalid */
        dgc_config_install(&cfg);
    }
    DGC_WARN("this process used the GPU and %s holds NCCL, but no NCCL call reached the shim: that NCCL is linked "
             "in statically with local symbols (conda's PyTorch, TensorFlow up to 2.19, Horovod GPU builds), so "
             "nothing was compressed. Use a build that loads libnccl.so.2 dynamically: readelf -d libtorch_cuda.so "
             "must list libnccl.so.2 as NEEDED (pip wheels do); see docs/nccl.md",
             s.found);
}

static void at_exit(void) {
    dgc_stats_file_final(); /* a process that never finalised MPI */
    uint64_t seen = dgc_registry_tally(DGC_TALLY_NCCL_CALLS);
    if (!seen) {
        warn_unreached();
        return;
    }
    DGC_INFO("NCCL calls seen %llu: ncclAllReduce compressed %llu, passed through %llu (of them under CUDA graph "
             "capture %llu)",
             (unsigned long long)seen, (unsigned long long)dgc_registry_tally(DGC_TALLY_NCCL_COMPRESSED),
             (unsigned long long)dgc_registry_tally(DGC_TALLY_NCCL_PASSED),
             (unsigned long long)dgc_registry_tally(DGC_TALLY_NCCL_CAPTURED));
    const dgc_config *cfg = dgc_config_current();
    if (cfg->stats && dgc_config_rank() == 0 && dgc_registry_claim(DGC_FLAG_REPORTED)) dgc_stats_report();
}

__attribute__((constructor)) static void register_exit(void) { atexit(at_exit); }
