/* Are a communicator's buffers made afresh (places.h)? The memory each
 * index of the learnt step had last; at the step's last index, those
 * ranges sorted (a step whose own calls overlap shows there); each call
 * looked up among the sorted ranges of the step before. */
#include "places.h"

#include <stdlib.h>

typedef struct {
    uintptr_t lo, hi; /* hi 0: no call at this index yet */
    uint64_t index;
} range;

struct dgc_places {
    range *last;        /* last[i]: index i's latest memory */
    range *sorted;      /* the ranges of last at the latest step's end, by lo */
    uint64_t nsorted;
    int disjoint;       /* no two of them overlap */
    uint64_t gen, step; /* the learnt step watched */
    int odd_now;        /* the current step has shown shared memory */
    int odd_steps;      /* steps of this generation that did */
    int decided;        /* dgc_places_note has returned 1 */
};

dgc_places *dgc_places_new(void) { return calloc(1, sizeof(dgc_places)); }

void dgc_places_free(dgc_places *p) {
    if (!p) return;
    free(p->last);
    free(p->sorted);
    free(p);
}

/* A new learnt step: nothing seen at any of its indices yet. */
static int watch(dgc_places *p, uint64_t gen, uint64_t step) {
    free(p->last);
    free(p->sorted);
    p->last = calloc(step, sizeof *p->last);
    p->sorted = malloc(step * sizeof *p->sorted);
    p->nsorted = 0;
    p->gen = gen;
    p->step = step;
    p->odd_now = p->odd_steps = 0;
    if (p->last && p->sorted) return 0;
    free(p->last);
    free(p->sorted);
    p->last = p->sorted = NULL;
    return -1;
}

static int by_lo(const void *a, const void *b) {
    const range *x = a, *y = b;
    return (x->lo > y->lo) - (x->lo < y->lo);
}

/* The step's ranges sorted; 1 when two of them overlap. */
static int close_step(dgc_places *p) {
    uint64_t n = 0;
    for (uint64_t i = 0; i < p->step; i++)
        if (p->last[i].hi) p->sorted[n++] = p->last[i];
    qsort(p->sorted, n, sizeof *p->sorted, by_lo);
    uintptr_t reach = 0;
    p->nsorted = n;
    p->disjoint = 1;
    for (uint64_t i = 0; i < n && p->disjoint; i++) {
        if (i && p->sorted[i].lo < reach) p->disjoint = 0;
        if (p->sorted[i].hi > reach) reach = p->sorted[i].hi;
    }
    return !p->disjoint;
}

/* Does [lo, hi) overlap what another index had at the last step's end?
 * The ranges that begin before hi; of disjoint ones, only those just
 * before the first that begins at or after hi can reach past lo. */
static int meets_other(const dgc_places *p, uint64_t index, uintptr_t lo, uintptr_t hi) {
    uint64_t a = 0, b = p->nsorted;
    while (a < b) {
        uint64_t m = a + (b - a) / 2;
        if (p->sorted[m].lo < hi) a = m + 1;
        else b = m;
    }
    for (uint64_t i = a; i-- > 0;) {
        if (p->sorted[i].hi > lo && p->sorted[i].index != index) return 1;
        if (p->disjoint && p->sorted[i].hi <= lo) break;
    }
    return 0;
}

int dgc_places_note(dgc_places *p, uint64_t gen, uint64_t step, uint64_t index, uintptr_t lo, uintptr_t hi) {
    if (p->decided || !step || index >= step || hi <= lo) return 0;
    if ((gen != p->gen || step != p->step || !p->last) && watch(p, gen, step)) return 0;
    if (index == 0) p->odd_now = 0;
    int odd = meets_other(p, index, lo, hi);
    p->last[index] = (range){lo, hi, index};
    if (index == step - 1 && close_step(p)) odd = 1;
    if (!odd || p->odd_now) return 0;
    p->odd_now = 1;
    if (++p->odd_steps < DGC_PLACES_STEPS) return 0;
    p->decided = 1;
    return 1;
}
