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

/* Checks all nranks payloads (each dgc_wire_bytes(k) apart) against the
 * expected step, n and k, and every index against n, before writing anything;
 * then sets out = 0 and adds the pairs rank by rank in rank order, so that
 * every rank computes the same bytes. On DGC_DECODE_BAD, err names the rank
 * and what was wrong. */
dgc_decode_result dgc_wire_decode(const void *gathered, int nranks, uint64_t step, uint64_t n,
                                  uint64_t k, float *out, char *err, size_t errlen);

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
