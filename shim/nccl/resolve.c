/* Finding the real NCCL.
 *
 * dlsym(RTLD_NEXT) is not enough: PyTorch loads libnccl.so.2 in a local
 * scope (RTLD_NEXT returns NULL from a preloaded library), and TensorFlow
 * 2.20+ carries NCCL inside libtensorflow_framework.so.2. So the loaded
 * objects are walked in load order (main program first) and the first one
 * that itself defines pncclAllReduce is taken; every entry point then comes
 * from that one object. NCCL exports each ncclX as a weak alias of pncclX:
 * calling pncclX can never come back into the shim. The plain ncclX name is
 * the fallback for builds without the p-names, accepted only when it lies
 * in that object (never the shim's own definition).
 * DGC_NCCL_LIBRARY=/path/lib.so names the object for unusual installs. */
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "internal.h"

/* A loaded object as dl_iterate_phdr describes it: its name and the address
 * ranges of its PT_LOAD segments, to tell whether a symbol lies in it. */
#define MAX_SEGMENTS 16
typedef struct {
    char *name; /* "" for the main program */
    size_t nseg;
    uintptr_t lo[MAX_SEGMENTS], hi[MAX_SEGMENTS];
} object;

typedef struct {
    object *at;
    size_t len, cap;
    int failed;
} object_list;

static int contains(const object *o, const void *p) {
    uintptr_t a = (uintptr_t)p;
    for (size_t i = 0; i < o->nseg; i++)
        if (a >= o->lo[i] && a < o->hi[i]) return 1;
    return 0;
}

/* Collects the objects first and dlopens them afterwards, outside the
 * loader's lock that dl_iterate_phdr holds. */
static int collect(struct dl_phdr_info *info, size_t size, void *ctx) {
    (void)size;
    object_list *l = ctx;
    if (l->len == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        object *at = realloc(l->at, cap * sizeof *at);
        if (!at) {
            l->failed = 1;
            return 1;
        }
        l->at = at;
        l->cap = cap;
    }
    object *o = &l->at[l->len];
    memset(o, 0, sizeof *o);
    o->name = strdup(info->dlpi_name ? info->dlpi_name : "");
    if (!o->name) {
        l->failed = 1;
        return 1;
    }
    for (int i = 0; i < info->dlpi_phnum && o->nseg < MAX_SEGMENTS; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD) continue;
        o->lo[o->nseg] = info->dlpi_addr + ph->p_vaddr;
        o->hi[o->nseg] = info->dlpi_addr + ph->p_vaddr + ph->p_memsz;
        o->nseg++;
    }
    l->len++;
    return 0;
}

static void free_objects(object_list *l) {
    for (size_t i = 0; i < l->len; i++) free(l->at[i].name);
    free(l->at);
}

/* An address inside the shim, to recognise the shim among the objects. */
static void *own_address(void) { return (void *)(uintptr_t)&dgc_nccl_resolve; }

/* The symbol pname (else name) from handle; within, when not NULL, must
 * contain it; never the shim's own. */
static void *lookup(void *handle, const object *within, const object *shim, const char *pname, const char *name) {
    const char *names[2] = {pname, name};
    for (int i = 0; i < 2; i++) {
        void *p = dlsym(handle, names[i]);
        if (!p || (shim && contains(shim, p))) continue;
        if (within && !contains(within, p)) continue;
        return p;
    }
    return NULL;
}

/* Every entry point from one object. Returns 0, or -1 naming the first
 * required one that is missing. */
static int fill(dgc_nccl_api *api, void *h, const object *within, const object *shim, char *missing, size_t len) {
    struct {
        const char *name;
        void *dst;
        size_t size;
        int required;
    } table[] = {
#define ENTRY(field, name, required) {name, &api->field, sizeof api->field, required}
        ENTRY(all_reduce, "AllReduce", 1),
        ENTRY(all_gather, "AllGather", 1),
        ENTRY(reduce_scatter, "ReduceScatter", 1),
        ENTRY(group_start, "GroupStart", 1),
        ENTRY(group_end, "GroupEnd", 1),
        ENTRY(group_simulate_end, "GroupSimulateEnd", 0),
        ENTRY(comm_count, "CommCount", 1),
        ENTRY(comm_cu_device, "CommCuDevice", 1),
        ENTRY(comm_user_rank, "CommUserRank", 1),
        ENTRY(comm_get_async_error, "CommGetAsyncError", 1),
        ENTRY(comm_destroy, "CommDestroy", 1),
        ENTRY(comm_abort, "CommAbort", 1),
        ENTRY(comm_finalize, "CommFinalize", 0),
        ENTRY(get_version, "GetVersion", 1),
        ENTRY(comm_init_rank, "CommInitRank", 0),
        ENTRY(comm_init_rank_config, "CommInitRankConfig", 0),
        ENTRY(comm_init_all, "CommInitAll", 0),
        ENTRY(comm_split, "CommSplit", 0),
        ENTRY(broadcast, "Broadcast", 0),
        ENTRY(send, "Send", 0),
        ENTRY(recv, "Recv", 0),
#undef ENTRY
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        char pname[64], name[64];
        snprintf(pname, sizeof pname, "pnccl%s", table[i].name);
        snprintf(name, sizeof name, "nccl%s", table[i].name);
        void *p = lookup(h, within, shim, pname, name);
        if (!p && table[i].required) {
            snprintf(missing, len, "%s", name);
            return -1;
        }
        memcpy(table[i].dst, &p, table[i].size); /* a data pointer's bits as the function pointer (POSIX) */
    }
    return 0;
}

static void finish(dgc_nccl_api *api, const char *object_name) {
    snprintf(api->object, sizeof api->object, "%s", object_name);
    int v = 0;
    api->version = api->get_version(&v) == ncclSuccess ? v : 0;
}

/* DGC_NCCL_LIBRARY: the object already loaded under that path, only. A copy
 * loaded now would be a second NCCL, to which the program's communicators
 * do not belong: calling it with them would crash. */
static dgc_nccl_api *from_path(const char *path, const object *shim) {
    void *h = dlopen(path, RTLD_NOLOAD | RTLD_NOW);
    if (!h) {
        DGC_ERROR("DGC_NCCL_LIBRARY=%s is not among the objects this process has loaded (give the path the program "
                  "itself loads, as /proc/<pid>/maps shows it): looking for NCCL among the loaded objects instead",
                  path);
        return NULL;
    }
    dgc_nccl_api *api = calloc(1, sizeof *api);
    char missing[64];
    if (!api || fill(api, h, NULL, shim, missing, sizeof missing)) {
        if (api)
            DGC_ERROR("DGC_NCCL_LIBRARY=%s lacks %s: looking for NCCL among the loaded objects instead", path,
                      missing);
        free(api);
        dlclose(h);
        return NULL;
    }
    finish(api, path); /* h stays open: the pointers live as long as the process */
    return api;
}

static const char *display_name(const object *o) {
    return o->name[0] ? o->name : "the main program";
}

/* The first object, in load order, that defines pncclAllReduce (or, failing
 * that, ncclAllReduce) itself. */
static dgc_nccl_api *from_loaded(const object_list *l, const object *shim) {
    for (int pass = 0; pass < 2; pass++) {
        const char *probe = pass == 0 ? "pncclAllReduce" : "ncclAllReduce";
        for (size_t i = 0; i < l->len; i++) {
            const object *o = &l->at[i];
            if (o == shim || strstr(o->name, "linux-vdso") || strstr(o->name, "linux-gate")) continue;
            void *h = dlopen(o->name[0] ? o->name : NULL, RTLD_NOLOAD | RTLD_LAZY);
            if (!h) continue;
            void *p = dlsym(h, probe);
            if (!p || !contains(o, p)) {
                dlclose(h);
                continue;
            }
            dgc_nccl_api *api = calloc(1, sizeof *api);
            char missing[64];
            if (api && fill(api, h, o, shim, missing, sizeof missing) == 0) {
                finish(api, display_name(o));
                return api; /* h stays open */
            }
            if (api) DGC_WARN("%s defines %s but not %s: not used as the real NCCL", display_name(o), probe, missing);
            free(api);
            dlclose(h);
        }
    }
    return NULL;
}

dgc_nccl_api *dgc_nccl_resolve(void) {
    object_list l = {0};
    dl_iterate_phdr(collect, &l);
    const object *shim = NULL;
    for (size_t i = 0; i < l.len && !shim; i++)
        if (contains(&l.at[i], own_address())) shim = &l.at[i];
    dgc_nccl_api *api = NULL;
    const char *path = getenv("DGC_NCCL_LIBRARY");
    if (path && path[0]) api = from_path(path, shim);
    if (!api && !l.failed) api = from_loaded(&l, shim);
    if (!api)
        DGC_ERROR("no real NCCL found among the loaded objects%s: NCCL calls fail with ncclSystemError; set "
                  "DGC_NCCL_LIBRARY=/path/to/libnccl.so.2",
                  l.failed ? " (no memory to list them)" : "");
    free_objects(&l);
    return api;
}
