/* The sum of the gathered compact payloads, read in place.
 *
 * Expanding every payload into the plain layout and then adding the plain
 * pairs wrote and read 8 bytes a pair through memory, and walked the whole
 * output once per rank: at the first warm-up stage (a pair every 4
 * elements) that was two thirds of a rank's engine time. Here each rank's
 * payload is walked a chunk of pairs at a time (wire/compact_walk.h: checked
 * before it is handed out), and the output a tile at a time: for one tile,
 * rank 0's pairs in it, then rank 1's, ..., so the tile stays in cache while
 * every rank adds into it, and each element still receives its ranks' terms
 * in rank order, the order that makes every rank's sum the same bytes. */
#include <stdio.h>
#include <string.h>

#include "dgcshim/wire.h"
#include "dgcshim/wire_compact.h"
#include "compact_walk.h"

/* Output elements per tile: 128 KiB, well inside a core's L2 next to the
 * ranks' chunks. */
#define TILE 32768u
/* Ranks walked together: their walks (about 3 KiB each) live on the stack.
 * Ranks past these are summed in further passes, rank order kept. */
#define RANKS_AT_ONCE 8

/* How many of w's chunk pairs from next on lie below end: all, mostly
 * (a chunk spans at most a few tiles at warm-up densities), else a binary
 * search of the sorted indices. */
static uint64_t stop_below(const dgc_compact_walk *w, uint64_t end) {
    uint64_t lo = w->next, hi = w->got;
    if (w->index[hi - 1] < end) return hi;
    while (lo < hi) {
        const uint64_t mid = lo + (hi - lo) / 2;
        if (w->index[mid] < end) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Adds w's pairs below end into out, refilling its chunk as it goes. */
static void add_until(dgc_compact_walk *w, uint64_t end, float scale, int scattered, float *out) {
    for (;;) {
        if (w->next == w->got && dgc_compact_walk_next(w) == 0) return;
        const uint64_t stop = stop_below(w, end);
        dgc_wire_scatter_add(w->index + w->next, w->value + w->next, stop - w->next, scale, scattered, out);
        w->next = stop;
        if (stop < w->got) return; /* the next pair is past this tile */
    }
}

/* Ranks [first, first + m): 0 when all were sound. */
static int add_ranks(const unsigned char *base, size_t stride, int first, int m, const dgc_compact_layout *L,
                     float scale, float *out) {
    dgc_compact_walk w[RANKS_AT_ONCE];
    int bad = 0;
    for (int q = 0; q < m; q++) bad |= dgc_compact_walk_start(&w[q], base + (size_t)(first + q) * stride, L) != 0;
    if (bad) return -1;
    /* Scattered pairs miss the cache whether tiled or not: they go in one
     * tile, so that each add covers a whole chunk and its prefetches reach
     * 16 pairs ahead (a tile then holds a few pairs a rank). */
    const int scattered = dgc_wire_scattered(L->k, L->n);
    const uint64_t span = scattered ? L->n : TILE;
    for (uint64_t tile = 0; tile < L->n; tile += span) {
        const uint64_t end = L->n - tile < span ? L->n : tile + span;
        for (int q = 0; q < m; q++) add_until(&w[q], end, scale, scattered, out);
    }
    for (int q = 0; q < m; q++) bad |= dgc_compact_walk_end(&w[q]) != 0;
    return bad ? -1 : 0;
}

/* The exact checks of every rank's payload, in rank order: -1 with err
 * naming the lowest bad rank's first fault, else 0. */
static int check_ranks(const unsigned char *base, size_t stride, int nranks, const dgc_compact_layout *L, char *err,
                       size_t errlen) {
    for (int r = 0; r < nranks; r++)
        if (dgc_compact_check(base + (size_t)r * stride, L, r, err, errlen)) return -1;
    return 0;
}

int dgc_compact_add(const void *base, size_t stride, int nranks, const dgc_compact_layout *L, float scale,
                    float *out, char *err, size_t errlen) {
    const unsigned char *b = base;
    for (int first = 0; first < nranks; first += RANKS_AT_ONCE) {
        const int m = nranks - first < RANKS_AT_ONCE ? nranks - first : RANKS_AT_ONCE;
        if (add_ranks(b, stride, first, m, L, scale, out) == 0) continue;
        /* The walk only says whether: the exact checks say what, rank by rank. */
        if (check_ranks(b, stride, nranks, L, err, errlen)) return -1;
        snprintf(err, errlen, "the compact payloads of ranks %d to %d failed the walk but pass the checks: a bug",
                 first, first + m - 1);
        return -1;
    }
    return 0;
}

dgc_decode_result dgc_compact_decode(const void *gathered, int nranks, uint64_t step, const dgc_compact_layout *L,
                                     float *out, char *err, size_t errlen) {
    const unsigned char *g = gathered;
    int nonfinite = 0;
    if (dgc_wire_check_headers(g, L->bytes, nranks, step, L->n, L->k, &nonfinite, err, errlen)) return DGC_DECODE_BAD;
    if (nonfinite) { /* rare: nothing is summed, but a damaged payload must still be found */
        if (check_ranks(g, L->bytes, nranks, L, err, errlen)) return DGC_DECODE_BAD;
        for (uint64_t i = 0; i < L->n; i++) out[i] = __builtin_nanf("");
        return DGC_DECODE_NONFINITE;
    }
    if (dgc_compact_add(g, L->bytes, nranks, L, 1.0f, out, err, errlen) == 0) return DGC_DECODE_OK;
    memset(out, 0, (size_t)L->n * sizeof *out);
    return DGC_DECODE_BAD;
}
