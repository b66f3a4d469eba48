/* The engine's update stream: the one pass over memory a compressed call makes.
 *
 * It reads g, u, v, writes the updated u and v into the spare arrays and zero
 * into the output, and collects the indices whose updated |v| reaches the
 * threshold. On a large buffer this pass is nearly all of the engine's time,
 * so engine/stream.c is compiled once per instruction set (SSE2, AVX2,
 * AVX-512 on x86-64) from one text; dgc_stream_update picks the widest the
 * CPU has. Every variant computes the same IEEE operations element by
 * element, so all give bit-identical results. */
#ifndef DGCSHIM_ENGINE_STREAM_H
#define DGCSHIM_ENGINE_STREAM_H

#include <stdint.h>

typedef struct {
    uint64_t n;
    const float *g;       /* the gradient, any alignment */
    const float *u, *v;   /* committed state; u NULL without momentum */
    float *u_next, *v_next; /* spares, 64-byte aligned */
    float *zero;          /* set to 0 as the pass goes: NULL, or float-aligned (may be g) */
    float scale;          /* clipping factor applied to g */
    float momentum;
    int nesterov;
    float thr;            /* candidates: |v_next| >= thr, v_next != 0 */
    uint32_t *cand;       /* room for cand_cap candidates, in both arrays; */
    float *cand_val;      /* slots past the count returned may be overwritten */
    uint64_t cand_cap;
} dgc_stream_job;

/* What the pass returns: DGC_STREAM_NONFINITE when some scaled gradient is
 * Inf or NaN (the step is dropped; the updated arrays then hold anything),
 * else DGC_STREAM_SATURATED when some sum of finite values overflowed and
 * the rules held it at +-FLT_MAX (update_rules.h). */
enum { DGC_STREAM_NONFINITE = 1u, DGC_STREAM_SATURATED = 2u };

/* Runs the pass, returning DGC_STREAM_* bits. Sets *ncand to the number of
 * candidates, which exceeds cand_cap when they did not all fit (the first
 * cand_cap are stored). */
typedef uint32_t (*dgc_stream_fn)(const dgc_stream_job *job, uint64_t *ncand);

uint32_t dgc_stream_update(const dgc_stream_job *job, uint64_t *ncand);

/* The variants, for tests and benchmarks. generic is plain C vectors (SSE2
 * on x86-64); the AVX ones exist on x86-64 builds only (DGC_STREAM_X86) and
 * may be called only where dgc_stream_variant returns them. */
uint32_t dgc_stream_update_generic(const dgc_stream_job *job, uint64_t *ncand);
#ifdef DGC_STREAM_X86
uint32_t dgc_stream_update_avx2(const dgc_stream_job *job, uint64_t *ncand);
uint32_t dgc_stream_update_avx512(const dgc_stream_job *job, uint64_t *ncand);
#endif

/* The variant called name ("generic", "avx2", "avx512"), or NULL when this build
 * or CPU lacks it; name NULL asks for the one dgc_stream_update uses. */
dgc_stream_fn dgc_stream_variant(const char *name);

/* The name of the variant dgc_stream_update uses, for the banner. */
const char *dgc_stream_variant_name(void);

#endif
