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
 * their bits): 31 bits in three digits (11, 11, 9), most significant first,
 * each pass counting only the values that match the digits fixed so far.
 * Reads a[] three times, writes nothing: no scratch. The digits above the
 * chosen one add up to how many values lie strictly above the result, which
 * the caller would otherwise count in a pass of its own. NaN (exponent all
 * ones, mantissa not zero) sorts above Inf. */
#define RADIX_BITS 11
static const int radix_shift[3] = {20, 9, 0};
static const unsigned radix_width[3] = {11, 11, 9};

/* One digit's histogram over the values whose digits above it match
 * prefix (under mask; none for the first digit, where every value counts).
 * Neighbouring values often share a digit, and one counter incremented again
 * and again waits on its own last store each time: four interleaved
 * histograms of 32-bit counts (32 KiB, the size of an L1 cache) keep four
 * increments in flight. Every value adds its match (0 or 1) at its own
 * digit, so there is no branch on the data: a branch per value mispredicted
 * as often as a tenth of the values matched, which made the two later
 * passes three times the first. Blocks of fewer than 2^32 values keep the
 * counts exact. */
#define LANES 4
#define BLOCK ((size_t)1 << 31)

static void count_digits(const float *a, size_t n, int shift, uint32_t digit_mask, uint32_t mask, uint32_t prefix,
                         size_t *hist) {
    for (size_t b0 = 0; b0 < n; b0 += BLOCK) {
        const size_t end = n - b0 < BLOCK ? n : b0 + BLOCK;
        uint32_t h[LANES][1u << RADIX_BITS] = {{0}};
        size_t i = b0;
        for (; i + LANES <= end; i += LANES) {
            uint32_t b[LANES];
            memcpy(b, &a[i], sizeof b);
            for (int l = 0; l < LANES; l++) {
                const uint32_t x = b[l] & 0x7fffffffu;
                h[l][(x >> shift) & digit_mask] += (x & mask) == prefix;
            }
        }
        for (; i < end; i++) {
            uint32_t x;
            memcpy(&x, &a[i], sizeof x);
            x &= 0x7fffffffu;
            h[0][(x >> shift) & digit_mask] += (x & mask) == prefix;
        }
        for (unsigned d = 0; d <= digit_mask; d++)
            for (int l = 0; l < LANES; l++) hist[d] += h[l][d];
    }
}

float dgc_topk_kth_largest_abs(const float *a, size_t n, size_t kth, size_t *above) {
    uint32_t prefix = 0, mask = 0;
    size_t want = kth, larger = 0; /* values before it within the prefix; values above the prefix */
    for (int pass = 0; pass < 3; pass++) {
        const int shift = radix_shift[pass];
        const uint32_t digit_mask = (UINT32_C(1) << radix_width[pass]) - 1u;
        size_t hist[1u << RADIX_BITS] = {0};
        count_digits(a, n, shift, digit_mask, mask, prefix, hist);
        uint32_t d = digit_mask;
        while (want >= hist[d]) { /* from the largest digit down */
            want -= hist[d];
            larger += hist[d--];
        }
        prefix |= d << shift;
        mask |= digit_mask << shift;
    }
    if (above) *above = larger;
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
