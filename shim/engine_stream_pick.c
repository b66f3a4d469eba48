/* Which update-stream variant runs: the widest the CPU (and the OS, which
 * must save the wide registers; __builtin_cpu_supports checks both) has.
 * Asked on every call rather than cached: it costs a few loads against a
 * pass over megabytes, and keeps this module free of mutable state. */
#include <string.h>

#include "engine_stream.h"

const char *dgc_stream_variant_name(void) {
#ifdef DGC_STREAM_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return "avx512";
    if (__builtin_cpu_supports("avx2")) return "avx2";
#endif
    return "generic";
}

dgc_stream_fn dgc_stream_variant(const char *name) {
    if (!name) name = dgc_stream_variant_name();
#ifdef DGC_STREAM_X86
    __builtin_cpu_init();
    if (strcmp(name, "avx512") == 0) return __builtin_cpu_supports("avx512f") ? dgc_stream_update_avx512 : NULL;
    if (strcmp(name, "avx2") == 0) return __builtin_cpu_supports("avx2") ? dgc_stream_update_avx2 : NULL;
#endif
    return strcmp(name, "generic") == 0 ? dgc_stream_update_generic : NULL;
}

uint32_t dgc_stream_update(const dgc_stream_job *job, uint64_t *ncand) {
    return dgc_stream_variant(NULL)(job, ncand);
}
