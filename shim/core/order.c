/* A communicator's step from the order of its counts (order.h). While
 * learning, the counts since learning began are kept; at each call the
 * shortest period P is sought such that the latest calls repeat P calls at
 * least twice and over at least DGC_ORDER_MIN_SPAN calls, and the call at
 * hand continues them. Looking at the latest calls, not all since the
 * start, lets a first step unlike the others (DDP's one bucket of every
 * gradient before it builds its buckets) go by; the span's floor keeps a
 * step that begins with a run of one count ([a, a, b, a]) from being taken
 * for a step of one call. Once found, the step is those P calls, and only
 * the position within it is kept. */
#include "order.h"

#include <stdlib.h>

#define HISTORY_MAX (2 * DGC_ORDER_MAX_STEP + DGC_ORDER_MIN_SPAN)

struct dgc_order {
    uint64_t *seen;     /* learning: the counts since it began */
    uint64_t len, cap;
    uint64_t step;      /* the learnt step's length; 0 while learning */
    uint64_t *pattern;  /* the step's counts */
    uint32_t *position; /* position[j]: the index of call j among the step's calls of its count */
    uint64_t phase;     /* the next call's index within the step */
    uint64_t generation; /* steps learnt so far */
    int changed, too_long;
};

dgc_order *dgc_order_new(void) { return calloc(1, sizeof(dgc_order)); }

static void forget_step(dgc_order *o) {
    free(o->pattern);
    free(o->position);
    o->pattern = NULL;
    o->position = NULL;
    o->step = 0;
}

void dgc_order_free(dgc_order *o) {
    if (!o) return;
    free(o->seen);
    forget_step(o);
    free(o);
}

static int grow(dgc_order *o) {
    if (o->len < o->cap) return 0;
    uint64_t cap = o->cap ? 2 * o->cap : 64;
    if (cap > HISTORY_MAX) cap = HISTORY_MAX;
    uint64_t *seen = realloc(o->seen, cap * sizeof *seen);
    if (!seen) return -1;
    o->seen = seen;
    o->cap = cap;
    return 0;
}

/* Are seen[at - span .. at] periodic with period p (the latest span calls
 * repeat p calls, and seen[at] continues them)? span <= at. */
static int repeats(const uint64_t *seen, uint64_t at, uint64_t p, uint64_t span) {
    for (uint64_t j = at - span + p; j <= at; j++)
        if (seen[j] != seen[j - p]) return 0;
    return 1;
}

/* The shortest period the calls before seen[at] show (see the top), or 0. */
static uint64_t period_at(const uint64_t *seen, uint64_t at) {
    for (uint64_t p = 1; p <= DGC_ORDER_MAX_STEP && 2 * p <= at; p++) {
        const uint64_t span = 2 * p > DGC_ORDER_MIN_SPAN ? 2 * p : DGC_ORDER_MIN_SPAN;
        if (span <= at && seen[at] == seen[at - p] && repeats(seen, at, p, span)) return p;
    }
    return 0;
}

/* Makes the p calls before seen[at] the step; seen[at] is its first. The
 * step may begin anywhere in the program's own loop (a rotation of it):
 * each buffer still finds one and the same position every step. */
static int learn_step(dgc_order *o, uint64_t at, uint64_t p) {
    o->pattern = malloc(p * sizeof *o->pattern);
    o->position = malloc(p * sizeof *o->position);
    if (!o->pattern || !o->position) {
        forget_step(o);
        return -1;
    }
    for (uint64_t j = 0; j < p; j++) {
        o->pattern[j] = o->seen[at - p + j];
        uint32_t before = 0;
        for (uint64_t i = 0; i < j; i++) before += o->pattern[i] == o->pattern[j];
        o->position[j] = before;
    }
    o->step = p;
    o->phase = 1 % p;
    o->generation++;
    o->len = 0; /* the history is not needed while the step holds */
    return 0;
}

static int64_t learning(dgc_order *o, uint64_t count) {
    if (o->too_long || grow(o) || o->len == HISTORY_MAX) {
        o->too_long = 1;
        return DGC_ORDER_TOO_LONG;
    }
    const uint64_t at = o->len++;
    o->seen[at] = count;
    const uint64_t p = period_at(o->seen, at);
    if (!p || learn_step(o, at, p)) return DGC_ORDER_LEARNING;
    return o->position[0];
}

int64_t dgc_order_next(dgc_order *o, uint64_t count) {
    if (!o->step) return learning(o, count);
    if (o->pattern[o->phase] == count) {
        int64_t at = o->position[o->phase];
        o->phase = (o->phase + 1) % o->step;
        return at;
    }
    /* The order changed: learn it again from this call on. */
    forget_step(o);
    o->len = 0;
    int64_t r = learning(o, count);
    if (r == DGC_ORDER_LEARNING && !o->changed) {
        o->changed = 1;
        return DGC_ORDER_CHANGED;
    }
    return r;
}

void dgc_order_undo(dgc_order *o) {
    if (o->step) o->phase = (o->phase + o->step - 1) % o->step;
    else if (o->len) o->len--;
}

uint64_t dgc_order_step(const dgc_order *o) { return o->step; }

uint64_t dgc_order_index(const dgc_order *o) { return o->step ? (o->phase + o->step - 1) % o->step : 0; }

uint64_t dgc_order_generation(const dgc_order *o) { return o->generation; }
