/* Selection helpers for the host engine: the k-th largest of a float array
 * (quickselect, in place), the k-th largest magnitude (radix select, reading
 * only), and a heap of the largest. O(n), no allocation. */
#ifndef DGCSHIM_TOPK_H
#define DGCSHIM_TOPK_H

#include <stddef.h>
#include <stdint.h>

/* Reorders a[0..n) so that a[kth] holds the value that would sit at kth in a
 * descending sort, everything before it >= and after it <=. Returns a[kth].
 * Requires kth < n and no NaN in a. */
float dgc_topk_kth_largest(float *a, size_t n, size_t kth);

/* The value of the kth largest |a[i]| (0-based, kth < n), a[] untouched;
 * *above (when not NULL) gets how many |a[i]| are strictly larger. */
float dgc_topk_kth_largest_abs(const float *a, size_t n, size_t kth, size_t *above);

/* The rule by which every top k here is kept in index order (the host
 * engine's, the reduce transport's regions and owners; the CUDA engine's
 * too): each magnitude a above t, the k-th largest, and the ties at t while
 * *ties (k less the count above t) lasts. Branch-free: the callers' loops
 * run over candidates dropped at random. */
static inline uint64_t dgc_topk_keeps(float a, float t, uint64_t *ties) {
    const uint64_t tie = a == t, keep = (uint64_t)(a > t) | (tie & (uint64_t)(*ties > 0));
    *ties -= tie & keep;
    return keep;
}

/* The `size` largest values pushed so far, as a min-heap over caller memory:
 * after pushing n values, the minimum is the size-th largest of them. A push
 * below the minimum of a full heap costs one comparison, so finding the k-th
 * largest of n this way is about n comparisons when k is much below n. */
typedef struct {
    float *h;
    size_t size, len;
} dgc_topk_heap;

void dgc_topk_heap_init(dgc_topk_heap *heap, float *mem, size_t size);
void dgc_topk_heap_push(dgc_topk_heap *heap, float x);
/* The size-th largest value pushed (the smallest held); requires len > 0. */
float dgc_topk_heap_min(const dgc_topk_heap *heap);

#endif
