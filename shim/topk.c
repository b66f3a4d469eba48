/* Quickselect (Hoare partition, median-of-three pivot) over floats, a radix
 * select over magnitudes that leaves its input alone, and a min-heap of the
 * largest values. Written out, not through a comparator callback, since a
 * call per comparison would dominate. */
#include "topk.h"

#include <string.h>

static void swap_f(float *a, float *b) {
    float t = *a;
    *a = *b;
    *b = t;
}

/* Median of three by value, moved to position lo; the others bracket it. */
static float pivot_f(float *a, size_t lo, size_t hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (a[mid] > a[lo]) swap_f(&a[mid], &a[lo]);
    if (a[hi] > a[lo]) swap_f(&a[hi], &a[lo]);
    if (a[hi] > a[mid]) swap_f(&a[hi], &a[mid]);
    return a[mid]; /* a[lo] >= a[mid] >= a[hi] */
}

float dgc_topk_kth_largest(float *a, size_t n, size_t kth) {
    size_t lo = 0, hi = n - 1;
    while (lo < hi) {
        float p = pivot_f(a, lo, hi);
        size_t i = lo, j = hi;
        for (;;) { /* descending: big values to the left */
            while (a[i] > p) i++;
            while (a[j] < p) j--;
            if (i >= j) break;
            swap_f(&a[i], &a[j]);
            i++;
            j--;
        }
        /* now a[lo..j] >= p >= a[j+1..hi] */
        if (kth <= j) hi = j;
        else lo = j + 1;
    }
    return a[kth];
}

/* Radix select on the bit patterns of |x| (non-negative floats order like
 * their bits): one 8-bit digit a pass, most significant first, counting
 * only the values that match the digits fixed so far. Reads a[] four
 * times, writes nothing: no scratch. NaN (exponent all ones, mantissa not
 * zero) sorts above Inf. */
float dgc_topk_kth_largest_abs(const float *a, size_t n, size_t kth) {
    uint32_t prefix = 0, mask = 0;
    size_t want = kth; /* how many larger values come before it, within the prefix */
    for (int shift = 24; shift >= 0; shift -= 8) {
        size_t hist[256] = {0};
        for (size_t i = 0; i < n; i++) {
            uint32_t b;
            memcpy(&b, &a[i], sizeof b);
            b &= 0x7fffffffu;
            if ((b & mask) == prefix) hist[(b >> shift) & 0xffu]++;
        }
        int d = 255;
        while (want >= hist[d]) want -= hist[d--]; /* from the largest digit down */
        prefix |= (uint32_t)d << shift;
        mask |= 0xffu << shift;
    }
    float t;
    memcpy(&t, &prefix, sizeof t);
    return t;
}

void dgc_topk_heap_init(dgc_topk_heap *heap, float *mem, size_t size) {
    heap->h = mem;
    heap->size = size;
    heap->len = 0;
}

static void sift_down(float *h, size_t len, size_t i) {
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < len && h[l] < h[m]) m = l;
        if (r < len && h[r] < h[m]) m = r;
        if (m == i) return;
        swap_f(&h[i], &h[m]);
        i = m;
    }
}

void dgc_topk_heap_push(dgc_topk_heap *heap, float x) {
    float *h = heap->h;
    if (heap->len < heap->size) { /* sift up */
        size_t i = heap->len++;
        h[i] = x;
        while (i > 0 && h[(i - 1) / 2] > h[i]) {
            swap_f(&h[(i - 1) / 2], &h[i]);
            i = (i - 1) / 2;
        }
    } else if (x > h[0]) {
        h[0] = x;
        sift_down(h, heap->len, 0);
    }
}

float dgc_topk_heap_min(const dgc_topk_heap *heap) { return heap->h[0]; }
