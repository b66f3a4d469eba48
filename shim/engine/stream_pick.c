/* Which update-stream variant runs: the widest the CPU (and the OS, which
 * must save the wide registers; __builtin_cpu_supports checks both) has.
 * Asked on every call rather than cached: it costs a few loads against a
 * pass over megabytes, and keeps this module free of mutable state. */
#include <stddef.h>
#include <string.h>

#include "stream.h"

/* __builtin_cpu_supports takes only a literal, hence one function each. */
#ifdef DGC_STREAM_X86
static int has_avx512(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f");
}
static int has_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2");
}
#endif
static int has_generic(void) { return 1; }

/* Widest first: the first one the CPU has is the default. */
static const struct {
    const char *name;
    dgc_stream_fn fn;
    int (*available)(void);
} variants[] = {
#ifdef DGC_STREAM_X86
    {"avx512", dgc_stream_update_avx512, has_avx512},
    {"avx2", dgc_stream_update_avx2, has_avx2},
#endif
    {"generic", dgc_stream_update_generic, has_generic},
};

#define NVARIANTS (sizeof variants / sizeof *variants)

/* The index of the variant called name (NULL: the widest available), or -1. */
static int find(const char *name) {
    for (size_t i = 0; i < NVARIANTS; i++)
        if (variants[i].available() && (!name || strcmp(name, variants[i].name) == 0)) return (int)i;
    return -1;
}

dgc_stream_fn dgc_stream_variant(const char *name) {
    int i = find(name);
    return i < 0 ? NULL : variants[i].fn;
}

const char *dgc_stream_variant_name(void) { return variants[find(NULL)].name; }

uint32_t dgc_stream_update(const dgc_stream_job *job, uint64_t *ncand) {
    return variants[find(NULL)].fn(job, ncand);
}
