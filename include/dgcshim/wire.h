/* The payload every rank contributes to the all-gather: a fixed-size header
 * followed by k uint32 indices and k fp32 values. The size depends on k only,
 * so a plain all-gather needs no size exchange (invariant 1). */
#ifndef DGCSHIM_WIRE_H
#define DGCSHIM_WIRE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DGC_WIRE_MAGIC 0x44474331u /* "DGC1" */
#define DGC_WIRE_NONFINITE 1u      /* the sender's gradient held Inf or NaN */
/* The sender could not take part (no memory for its state or scratch): only
 * the header is meaningful, and the call fails on every rank. */
#define DGC_WIRE_FAILED 2u
/* The sender has no state for this buffer and may not make one (its memory
 * budget, DGC_MAX_STATE_MB): only the header is meaningful, and the call is
 * summed densely on every rank. */
#define DGC_WIRE_DENSE 4u
/* DGC_TRANSPORT=reduce: the sender holds the region boundaries balanced on
 * the previous step's global selection, for this step. Every rank that
 * completed that step computed the same ones from the same selection, so
 * when every header says so they are used, else every rank splits evenly. */
#define DGC_WIRE_BOUNDS 8u
/* The flags above live in the low 8 bits. Bits 8 to 31 carry the age of the
 * sum S the sender keeps for momentum compensation (DGC_COMPENSATE): this
 * call's step minus the step S was summed at; 0 when it keeps none this call
 * can use; DGC_WIRE_AGE_MAX for any age from there on. Each rank keeps S
 * with its own state of the buffer, and a state can be new on one rank
 * alone (the buffer moved there: a fresh allocation), or older than the
 * others' (moved back): the ranks subtract m S only when every header
 * reports the same age below DGC_WIRE_AGE_MAX, so that all subtract the same
 * step's sum, or none does (invariant 3). */
#define DGC_WIRE_FLAG_BITS 0xffu
#define DGC_WIRE_AGE_SHIFT 8
#define DGC_WIRE_AGE_MAX 0xffffffu
#define DGC_WIRE_AGE(flags) ((uint32_t)(flags) >> DGC_WIRE_AGE_SHIFT)
#define DGC_WIRE_AGE_BITS(age) \
    (((uint64_t)(age) < DGC_WIRE_AGE_MAX ? (uint32_t)(age) : DGC_WIRE_AGE_MAX) << DGC_WIRE_AGE_SHIFT)

typedef struct {
    uint32_t magic;
    uint32_t flags;
    uint64_t step;
    uint64_t n;
    uint64_t k;
} dgc_wire_header;

/* Bytes of one payload with k slots: header + 4k index bytes + 4k value bytes.
 * Always a multiple of 8, so the exchange can count in 8-byte words. */
size_t dgc_wire_bytes(uint64_t k);

/* Views into a payload. */
dgc_wire_header *dgc_wire_header_of(void *payload);
uint32_t *dgc_wire_indices(void *payload);
float *dgc_wire_values(void *payload, uint64_t k);

/* Outcome of decoding. */
typedef enum {
    DGC_DECODE_OK = 0,
    DGC_DECODE_NONFINITE = 1, /* some rank sent a non-finite gradient: out is all NaN */
    DGC_DECODE_BAD = -1       /* a header or index failed its check: out untouched */
} dgc_decode_result;

/* What the headers of one exchange say, read before any payload is used. */
typedef struct {
    int failed;       /* ranks that flagged DGC_WIRE_FAILED */
    int first_failed; /* the lowest of them, -1 when none */
    int dense;        /* ranks that flagged DGC_WIRE_DENSE */
    int nonfinite;    /* ranks that flagged DGC_WIRE_NONFINITE */
    uint32_t age;     /* the age of the kept sum every rank reported, when all agree on one
                       * below DGC_WIRE_AGE_MAX; else 0: no rank subtracts its kept sum */
    int bounds;       /* ranks that flagged DGC_WIRE_BOUNDS */
} dgc_wire_summary;

/* Checks the header of each of nranks payloads, which start stride bytes
 * apart (only their first sizeof(dgc_wire_header) bytes are read), against
 * the expected step, n and k, and sums up their flags and ages. Returns DGC_DECODE_OK,
 * or DGC_DECODE_BAD with err naming the rank and what was wrong. */
dgc_decode_result dgc_wire_scan(const void *base, size_t stride, int nranks, uint64_t step, uint64_t n,
                                uint64_t k, dgc_wire_summary *sum, char *err, size_t errlen);

/* Checks the headers of nranks payloads stride bytes apart as
 * dgc_wire_decode checks them: the expected step, n and k, and no flag but
 * DGC_WIRE_NONFINITE (a payload to be summed). *nonfinite: whether any
 * carries that flag. Returns 0, or -1 with err naming the rank and what was
 * wrong. */
int dgc_wire_check_headers(const void *base, size_t stride, int nranks, uint64_t step, uint64_t n, uint64_t k,
                           int *nonfinite, char *err, size_t errlen);

/* Writes the header of a payload that carries only flags (FAILED or DENSE). */
void dgc_wire_flag_only(void *payload, uint32_t flags, uint64_t step, uint64_t n, uint64_t k);

/* Checks all nranks payloads (each dgc_wire_bytes(k) apart) against the
 * expected step, n and k, and every index against n, before writing anything;
 * then sets out = 0 and adds the pairs rank by rank in rank order, so that
 * every rank computes the same bytes. On DGC_DECODE_BAD, err names the rank
 * and what was wrong. */
dgc_decode_result dgc_wire_decode(const void *gathered, int nranks, uint64_t step, uint64_t n,
                                  uint64_t k, float *out, char *err, size_t errlen);

/* out[idx[j]] += scale * val[j] for j < m, in order (indices checked by
 * the caller). scattered: whether the pairs lie far apart in out (then each
 * add is a cache miss, and the adds ahead are prefetched);
 * dgc_wire_scattered(k, n) says so for k pairs spread over n elements. */
void dgc_wire_scatter_add(const uint32_t *idx, const float *val, uint64_t m, float scale, int scattered, float *out);
int dgc_wire_scattered(uint64_t k, uint64_t n);

/* Adds the pairs of one payload (checked by the caller: this rank's own)
 * into out, for a dense sum of the selected pairs. */
void dgc_wire_add_own(const void *payload, uint64_t k, float *out);

/* Momentum compensation: out[idx] -= scale * val for every pair of
 * previously decoded payloads, rank by rank in rank order (so every rank
 * computes the same bytes). The payloads must have passed dgc_wire_decode. */
void dgc_wire_subtract(const void *gathered, int nranks, uint64_t k, float scale, float *out);

/* dgc_wire_decode for an out the caller has already set to zero. */
dgc_decode_result dgc_wire_decode_zeroed(const void *gathered, int nranks, uint64_t step, uint64_t n,
                                         uint64_t k, float *out, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
