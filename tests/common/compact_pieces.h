/* The CUDA codec's decomposition (kernels/compact.cu), run on the CPU: the
 * same compact_rules.h pieces, called over every word and slot as the
 * kernels' threads call them. The tests hold these to the host codec
 * (dgc_compact_encode, dgc_compact_check, dgc_compact_expand): what the
 * GPU's threads compute together, bit for bit and verdict for verdict.
 * Only the launches, the scan and the atomics are the kernels' own. */
#ifndef DGCSHIM_TESTS_COMPACT_PIECES_H
#define DGCSHIM_TESTS_COMPACT_PIECES_H

#include <stdint.h>
#include <string.h>

#include "dgcshim/compact_rules.h"
#include "dgcshim/wire.h"
#include "dgcshim/wire_compact.h"

static inline dgc_cx_view pieces_view(const dgc_compact_layout *L) {
    return dgc_cx_view_of(L->n, L->k, L->low_bits, L->value_bits, L->upper_bits);
}

/* The encoder: an engine's plain payload (nsel selected pairs first, sorted,
 * values on the wire grid of scale e) into words (L->bytes, zeroed here as
 * the kernels' memset does), each pair's bits or-ed in as its thread does. */
static inline void pieces_encode(const void *plain, uint64_t nsel, int e, const dgc_compact_layout *L,
                                 uint64_t *words) {
    const dgc_cx_view v = pieces_view(L);
    const uint32_t *idx = (const uint32_t *)((const char *)plain + sizeof(dgc_wire_header));
    const uint32_t *val = (const uint32_t *)((const char *)plain + sizeof(dgc_wire_header) + 4 * L->k);
    memset(words, 0, L->bytes);
    memcpy(words, plain, sizeof(dgc_wire_header));
    const uint64_t count = nsel ? dgc_cx_real_pairs(nsel, idx[0], val[0]) : 0;
    words[DGC_CX_HEADER_WORDS] = dgc_cx_count_word(count, count && v.value_bits == 16 ? e : 0);
    for (uint64_t j = 0; j < count; j++) {
        const uint64_t i = idx[j];
        const uint64_t bit = (i >> v.low_bits) + j;
        words[v.upper + (bit >> 6)] |= UINT64_C(1) << (bit & 63u);
        if (v.low_bits) {
            const dgc_cx_bits b = dgc_cx_slot_bits(j, v.low_bits, i & ((UINT64_C(1) << v.low_bits) - 1u));
            words[v.low + b.w] |= b.lo;
            if (b.hi) words[v.low + b.w + 1] |= b.hi;
        }
        uint32_t slot = val[j];
        if (v.value_bits == 16 && dgc_cx_half_of(val[j], e, &slot)) slot = 0xffffu; /* off the grid: a bug */
        const dgc_cx_bits b = dgc_cx_slot_bits(j, v.value_bits, slot);
        words[v.values + b.w] |= b.lo;
    }
}

/* The expander: DGC_CX_OK and the plain pairs (idx, val: k slots each,
 * padding after the count) or the first fault the pieces meet, in the
 * kernels' order: frame, upper words, slots, end. */
static inline int pieces_expand(const uint64_t *words, const dgc_compact_layout *L, uint32_t *idx, uint32_t *val) {
    const dgc_cx_view v = pieces_view(L);
    uint64_t count = 0, slot = 0, before = 0;
    int e = 0;
    int f = dgc_cx_frame(words, &v, &count, &e);
    if (f) return f;
    for (uint64_t w = 0; w < v.upper_words; w++) {
        const uint64_t x = words[v.upper + w];
        if ((f = dgc_cx_upper_word(words, &v, count, w, x, before, idx, &slot)) != DGC_CX_OK) return f;
        before += (uint64_t)dgc_cx_popcount(x);
    }
    uint32_t max = 0;
    val[0] = 0; /* k >= 1: the loop sets it again */
    for (uint64_t j = 0; j < v.k; j++) {
        uint32_t mag;
        if ((f = dgc_cx_slot(words, &v, count, e, j, idx, &val[j], &mag)) != DGC_CX_OK) return f;
        if (j >= count) idx[j] = 0;
        max = mag > max ? mag : max;
    }
    return dgc_cx_end(&v, count, e, before, max, idx[0], val[0]);
}

#endif
