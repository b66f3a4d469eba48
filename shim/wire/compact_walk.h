/* A compact payload's pairs a chunk at a time, checked as they come, for
 * readers that consume them in place (wire/sum.c) instead of expanding the
 * whole payload first (dgc_compact_expand). Internal to the shim. */
#ifndef DGCSHIM_WIRE_COMPACT_WALK_H
#define DGCSHIM_WIRE_COMPACT_WALK_H

#include <stdint.h>

#include "dgcshim/wire_compact.h"

/* Pairs per chunk: at most this many (256 and up to 7 more, a byte's worth
 * of the upper area). */
#define DGC_COMPACT_WALK_CHUNK 264u

typedef struct {
    /* The current chunk: got pairs, index ascending; next is the caller's
     * cursor into it (walk_next sets both to 0 before refilling). */
    uint32_t index[DGC_COMPACT_WALK_CHUNK];
    float value[DGC_COMPACT_WALK_CHUNK];
    uint64_t got, next;
    /* Where the walk is; private to wire/compact.c. */
    uint32_t high[DGC_COMPACT_WALK_CHUNK];
    const unsigned char *upper, *low, *values;
    uint64_t t, bytes, j, count, least, limit;
    unsigned lb, vb;
    int e;
    uint32_t max, bad;
} dgc_compact_walk;

/* Starts a walk over compact (laid out as L), checking what can be checked
 * before any pair (the layout, the count word, the areas' tails, the range
 * of the largest high part, a lone padding pair). Returns 0, or -1 when the
 * payload is already known to be bad. */
int dgc_compact_walk_start(dgc_compact_walk *w, const void *compact, const dgc_compact_layout *L);

/* The next chunk of pairs into w->index and w->value (w->got of them, also
 * returned): each chunk is checked whole first (indices strictly increasing,
 * below n and above the last chunk's; values finite and exact), so every
 * index handed out is below L->n whatever the payload holds. 0 at the end,
 * or once something was found bad (then for good). */
uint64_t dgc_compact_walk_next(dgc_compact_walk *w);

/* After the walk: 0 when the whole payload was sound, exactly as
 * dgc_compact_expand would have found it; -1 otherwise (dgc_compact_check
 * then says why). */
int dgc_compact_walk_end(const dgc_compact_walk *w);

#endif
