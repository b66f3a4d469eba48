/* The compact payload: the plain one (wire.h) with its sorted indices in an
 * Elias-Fano code of a fixed budget and its values in 32 bits (fp32) or 16
 * (binary16 under a per-payload power-of-two scale). Its size depends on
 * (n, k, value_bits) only, so the all-gather still needs no size exchange.
 *
 * Layout (every area a whole number of little-endian uint64 words, packed
 * LSB-first):
 *   [32-byte header, copied from the plain payload]
 *   [uint64 count word: bits 0..39 the count c of real pairs, bits 40..47
 *    zero, bits 48..63 the scale exponent e as an int16 (0 with 32-bit values)]
 *   [upper area: upper_bits = k + ((n-1) >> L) bits; for pair j the bit
 *    (i_j >> L) + j is set, every other bit is 0]
 *   [low area: k slots of L = low_bits bits; slot j = i_j & (2^L - 1)]
 *   [value area: k slots of value_bits bits: the fp32 bits of x_j, or the
 *    binary16 bits of x_j * 2^(14 - e)]
 * Slots at or past c, and the bits after the last slot of each area, are 0:
 * with e canonical (below) there is one compact form for each plain payload.
 *
 * The 16-bit values: every value of a payload lies on the binary16 grid
 * scaled by 2^(e - 14) (and on fp32's: no finer than 2^-149), and e is the
 * binade of the largest |value| (0 when all are 0), so that the largest
 * binary16 pattern has the exponent field 29: the scale spends the format's
 * range where this payload's values are, and keeps 11 significant bits. */
#ifndef DGCSHIM_WIRE_COMPACT_H
#define DGCSHIM_WIRE_COMPACT_H

#include <stddef.h>
#include <stdint.h>

#include "dgcshim/wire.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    uint64_t n, k;
    unsigned low_bits;   /* L: the low bits of each index kept verbatim, in [0, 32] */
    unsigned value_bits; /* 16 (scaled binary16) or 32 (fp32) */
    uint64_t upper_bits; /* k + ((n-1) >> L): enough for any k sorted indices below n */
    size_t bytes;        /* the whole compact payload, a multiple of 8 */
} dgc_compact_layout;

/* L minimising k*L + k + ((n-1) >> L) over L in [0, 32] (ties: the smaller
 * L; for n = 0 the last term is taken as 0); value_bits 16 or 32 (anything
 * but 16 is taken as 32). */
void dgc_compact_layout_for(uint64_t n, uint64_t k, unsigned value_bits, dgc_compact_layout *out);

/* The scale exponent e of 16-bit values: 0 when count is 0 or every x is
 * +-0; else the binade (floor(log2)) of the largest |x|, plus one when that
 * largest value rounds up into the next binade (below 2^128). Then the
 * largest |dgc_compact_value(x_j, 16, e)| lies in [2^e, 2^(e+1)), which is
 * what makes e canonical. Non-finite x are passed over (they are never sent). */
int dgc_compact_scale16(const float *x, uint64_t count);

/* The value receivers decode from x: x itself (value_bits 32), or (16) x
 * rounded to the binary16 grid scaled by 2^(scale_exp - 14): to the nearest
 * multiple of max(2^(binade(x) - 10), 2^(scale_exp - 38), 2^-149), ties to
 * the even multiple, sign kept (-0.0f for a negative x that rounds to 0); a
 * result reaching 2^128 becomes (2^11 - 1) * 2^117 with x's sign. Integer
 * arithmetic: the same result under any fesetround. Non-finite x come back
 * as they are. */
float dgc_compact_value(float x, unsigned value_bits, int scale_exp);

/* out[j] = dgc_compact_value(x[j], value_bits, scale_exp) for j < count, in
 * blocks the compiler vectorises; out may be x. */
void dgc_compact_values(const float *x, uint64_t count, unsigned value_bits, int scale_exp, float *out);

/* Encodes a plain payload (wire.h layout with L->k slots: its real pairs
 * first, indices strictly increasing and below n, then padding slots
 * (0, +0.0f)) into compact (L->bytes). The trailing run of (0, +0.0f) slots
 * is the padding. With value_bits 16 the scale e comes from the values
 * (the binade of the largest |value|, 0 when all are 0), and every value
 * must already be dgc_compact_value(x, 16, e). Returns 0, or -1 when the
 * plain payload breaks those rules (not sorted, a duplicate, index >= n, a
 * real pair after padding, a non-finite value, a 16-bit value that is not on
 * its payload's grid); compact is then partly written. */
int dgc_compact_encode(const void *plain, const dgc_compact_layout *L, void *compact);

/* Checks a compact payload from rank and, when sound, writes the plain
 * payload it stands for into plain (dgc_wire_bytes(L->k) bytes): same header,
 * the pairs, padding after. Rejects a count above k or with bits 40..47 set;
 * an upper area with fewer set bits than the count, or a set bit after the
 * count-th; an index at or past n (or 2^32), or not above the one before; a
 * non-zero low slot or value slot at or past the count, or a non-zero bit
 * past the last slot of an area; a non-finite value (binary16 exponent field
 * 31, or an fp32 Inf/NaN); with 16-bit values an e outside [-149, 127], a
 * decoded value fp32 cannot hold exactly, and an e that is not canonical (the
 * largest |value| outside [2^e, 2^(e+1)), or e != 0 when every value is 0);
 * with 32-bit values a non-zero e; a single pair (0, +0.0) (that is padding:
 * the canonical form counts it out); and a layout L that is not
 * dgc_compact_layout_for's. The header is copied as is (the caller checks it
 * with dgc_wire_scan). Returns 0, or -1 with err naming the rank and what was
 * wrong; plain's contents are then unspecified (partly written). Never reads
 * outside L->bytes of compact, never writes outside dgc_wire_bytes(L->k) of
 * plain. Linear in L->bytes + L->k. */
int dgc_compact_expand(const void *compact, const dgc_compact_layout *L, int rank, void *plain, char *err,
                       size_t errlen);

/* dgc_compact_expand's checks alone, with the same message for the same
 * first fault; writes nothing but err. Returns 0 or -1. */
int dgc_compact_check(const void *compact, const dgc_compact_layout *L, int rank, char *err, size_t errlen);

/* Sums nranks compact payloads (laid out as L, stride bytes apart from
 * base, rank 0 first) into out (L->n floats) without expanding them: for
 * every pair (i, x) of rank 0, then of rank 1, and so on, out[i] += scale * x,
 * exactly the bytes dgc_compact_expand then dgc_wire_add_own (or, scale
 * -m, dgc_wire_subtract) rank by rank would give. out is walked a tile at a
 * time with every rank's pairs for the tile, so it is read and written
 * about once whatever nranks is. Every payload is checked as
 * dgc_compact_expand checks it (the 32-byte headers excepted: the caller
 * checks them with dgc_wire_scan or dgc_wire_check_headers). Returns 0, or
 * -1 with err naming the lowest bad rank's first fault, as
 * dgc_compact_check names it; out is then partly summed (but never written
 * outside its n floats). */
int dgc_compact_add(const void *base, size_t stride, int nranks, const dgc_compact_layout *L, float scale,
                    float *out, char *err, size_t errlen);

/* The sum of one exchange's gathered compact payloads (L->bytes apart) into
 * out (L->n floats, zeroed by the caller), with every check a reader makes
 * and in the order the plain dgc_wire_decode and the CUDA decode make them:
 * the headers (step, n = L->n, k = L->k, flags: dgc_wire_check_headers),
 * then every payload, and only then a DGC_WIRE_NONFINITE flag, which makes
 * out all NaN. So a damaged payload is DGC_DECODE_BAD even when another
 * rank was non-finite. DGC_DECODE_BAD leaves out zero, with err naming the
 * lowest bad rank's fault. */
dgc_decode_result dgc_compact_decode(const void *gathered, int nranks, uint64_t step, const dgc_compact_layout *L,
                                     float *out, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
