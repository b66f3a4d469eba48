/* Which MPI the shim was built for, and whether the process uses that one.
 *
 * mpi.h fixes the ABI at build time: Open MPI's handles are pointers,
 * MPICH's (and Intel MPI's, Cray MPICH's, MVAPICH2's, which keep its ABI)
 * are integers. A shim built for one and preloaded into a program of the
 * other brings its own MPI library into the process as a dependency; the
 * program's calls then reach the shim, whose PMPI_* calls reach the
 * program's library with handles of the wrong kind ("Invalid communicator",
 * or worse). So the shim looks at every MPI library loaded in the process
 * (any object that defines MPI_Get_library_version, which MPI allows before
 * MPI_Init and which takes no handle) when it is loaded and again before it
 * lets MPI_Init through (mpi4py and others load their MPI later), and stops
 * the process, naming both libraries and the build that fits, when one is
 * of another family. */
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

#define STR_(x) #x
#define STR(x) STR_(x)
/* MPI families, by ABI: Open MPI; MPICH and the libraries that keep its
 * ABI (Intel MPI, Cray MPICH, MVAPICH2). */
enum { FAMILY_UNKNOWN, FAMILY_OPEN_MPI, FAMILY_MPICH };

#if defined(OMPI_MAJOR_VERSION)
#define BUILT_FAMILY FAMILY_OPEN_MPI
#define BUILT_VERSION "Open MPI " STR(OMPI_MAJOR_VERSION) "." STR(OMPI_MINOR_VERSION) "." STR(OMPI_RELEASE_VERSION)
#define BUILT_ABI "Open MPI ABI"
#elif defined(MPICH_VERSION)
#define BUILT_FAMILY FAMILY_MPICH
#define BUILT_VERSION "MPICH " MPICH_VERSION
#define BUILT_ABI "MPICH ABI"
#else
#define BUILT_FAMILY FAMILY_UNKNOWN
#define BUILT_VERSION "an MPI of unknown family"
#define BUILT_ABI "unknown ABI"
#endif

const char *dgc_mpi_built_for(void) {
    return BUILT_VERSION ", MPI " STR(MPI_VERSION) "." STR(MPI_SUBVERSION) ", " BUILT_ABI;
}

/* The family of an MPI_Get_library_version string. */
static int family_of(const char *version) {
    if (strstr(version, "Open MPI")) return FAMILY_OPEN_MPI;
    /* MPICH and the libraries that keep its ABI, as their version strings
     * name themselves */
    static const char *const mpich[] = {"MPICH", "Intel(R) MPI", "MVAPICH", "CRAY MPICH"};
    for (size_t i = 0; i < sizeof mpich / sizeof *mpich; i++)
        if (strstr(version, mpich[i])) return FAMILY_MPICH;
    return FAMILY_UNKNOWN;
}

enum { MAX_OBJECTS = 512 };
typedef struct {
    char *names[MAX_OBJECTS];
    int n;
} objects;

/* Names only: dlopen must not run under dl_iterate_phdr's lock. */
static int collect(struct dl_phdr_info *info, size_t size, void *arg) {
    (void)size;
    objects *o = arg;
    if (info->dlpi_name && info->dlpi_name[0] && o->n < MAX_OBJECTS) o->names[o->n++] = strdup(info->dlpi_name);
    return 0;
}

typedef int (*version_fn)(char *, int *);

/* The first line of the version of the MPI library that the object named
 * defines itself (not one of its dependencies), or 0. */
static int own_version(const char *name, char *out, size_t cap) {
    void *h = dlopen(name, RTLD_LAZY | RTLD_NOLOAD);
    if (!h) return 0;
    void *f = dlsym(h, "MPI_Get_library_version");
    Dl_info where;
    int own = f && dladdr(f, &where) && where.dli_fname && strcmp(where.dli_fname, name) == 0;
    if (own) {
        static char v[16384]; /* MPI_MAX_LIBRARY_VERSION_STRING of any MPI (MPICH's is 8192) */
        int len = 0;
        own = ((version_fn)f)(v, &len) == 0 && len > 0;
        if (own) {
            v[len < (int)sizeof v ? len : (int)sizeof v - 1] = '\0';
            v[strcspn(v, "\n")] = '\0'; /* the first line; its tabs (MPICH's "Version:\t4.0.2") as spaces */
            for (char *c = v; *c; c++)
                if (*c == '\t') *c = ' ';
            snprintf(out, cap, "%.*s", (int)(cap - 1), v);
        }
    }
    dlclose(h);
    return own;
}

/* Stops the process when an MPI library of another family than the
 * build's is loaded. when: "loaded", "MPI_Init". */
void dgc_mpi_check_abi(const char *when) {
    if (BUILT_FAMILY == FAMILY_UNKNOWN) return; /* nothing to compare with */
    objects o = {.n = 0};
    dl_iterate_phdr(collect, &o);
    char version[512];
    for (int i = 0; i < o.n; i++) {
        const char *name = o.names[i];
        if (!own_version(name, version, sizeof version)) continue;
        int family = family_of(version);
        if (family == FAMILY_UNKNOWN || family == BUILT_FAMILY) continue;
        const char *fix = family == FAMILY_MPICH ? "cmake -DMPI_C_COMPILER=mpicc.mpich (libdgcshim-mpich.so)"
                                                  : "cmake -DMPI_C_COMPILER=mpicc.openmpi (libdgcshim.so)";
        fprintf(stderr,
                "dgcshim ERROR this process uses %s (%s), but this libdgcshim was built for %s: two MPI "
                "ABIs in one process cannot work, and every MPI call would go wrong. Stopping at %s. Preload the "
                "shim built for the program's MPI: %s; docs/mpi.md, \"Which MPI\".\n",
                version, name, dgc_mpi_built_for(), when, fix);
        fflush(stderr);
        _exit(1);
    }
    for (int i = 0; i < o.n; i++) free(o.names[i]);
}

/* At load: a program linked with another MPI stops before its first call. */
__attribute__((constructor)) static void check_at_load(void) { dgc_mpi_check_abi("load"); }
