/* The compact payload: the plain one (wire.h) with its indices delta-coded in
 * a fixed bit width and its values in 16 (bf16) or 32 bits. Its size depends
 * on (n, k, value_bits) only, so the all-gather still needs no size exchange.
 *
 * Layout (every area a whole number of little-endian uint64 words):
 *   [32-byte header, copied from the plain payload]
 *   [uint64: count of real pairs]
 *   [code area: L->codes codes of L->code_bits bits, packed LSB-first]
 *   [value area: k values of value_bits bits packed likewise; a 16-bit value
 *    is the top 16 bits of its float]
 * Gap coding, with M = 2^b - 1 and prev = -1: for each index i, gap =
 * i - prev - 1; while gap >= M emit M (an escape: M more, index not yet) and
 * take M off; then emit gap (< M), which ends the index. Unused trailing code
 * and value slots, and the bits after the last slot of each area, are 0: one
 * canonical form for each plain payload. */
#ifndef DGCSHIM_WIRE_COMPACT_H
#define DGCSHIM_WIRE_COMPACT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    uint64_t n, k;
    unsigned code_bits;  /* b: bits per gap code */
    unsigned value_bits; /* 16 (bf16) or 32 (fp32) */
    uint64_t codes;      /* code slots: k + floor(n / (2^b - 1)), enough for any k sorted indices below n */
    size_t bytes;        /* the whole compact payload, a multiple of 8 */
} dgc_compact_layout;

/* b minimising codes * b over b in [1, 32] (ties: the smaller b); value_bits
 * 16 or 32 (anything but 16 is taken as 32). */
void dgc_compact_layout_for(uint64_t n, uint64_t k, unsigned value_bits, dgc_compact_layout *out);

/* The value receivers decode from x: x itself (32), or x rounded to bf16
 * (round to nearest even; NaN stays NaN, made quiet; Inf stays Inf; values
 * past bf16's max round to Inf as IEEE does), as a float. */
float dgc_compact_value(float x, unsigned value_bits);

/* Encodes a plain payload (wire.h layout with L->k slots: its real pairs
 * first, indices strictly increasing and below n, then padding slots
 * (0, +0.0f); with value_bits 16 every value already dgc_compact_value-rounded)
 * into compact (L->bytes). The trailing run of (0, +0.0f) slots is the
 * padding. Returns 0, or -1 when the plain payload breaks those rules (not
 * sorted, a duplicate, index >= n, a real pair after padding, a 16-bit value
 * that is not bf16-exact); compact is then partly written. */
int dgc_compact_encode(const void *plain, const dgc_compact_layout *L, void *compact);

/* Checks a compact payload from rank and, when sound, writes the plain
 * payload it stands for into plain (dgc_wire_bytes(L->k) bytes): same header,
 * the pairs, padding after. Rejects a count of pairs above k, an index at or
 * past n (or past UINT32_MAX), codes running past L->codes, a non-zero code or
 * value bit after the last used slot, a single pair (0, +0.0f) (that is
 * padding: the canonical form counts it out) and a layout L that is not
 * dgc_compact_layout_for's. The header is copied as is (the caller checks it
 * with dgc_wire_scan). Returns 0, or -1 with err naming the rank and what was
 * wrong; plain's contents are then unspecified (partly written). Never reads
 * outside L->bytes of compact, never writes outside dgc_wire_bytes(L->k) of
 * plain. Linear in L->bytes + L->k. */
int dgc_compact_expand(const void *compact, const dgc_compact_layout *L, int rank, void *plain, char *err,
                       size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
