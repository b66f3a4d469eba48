/* A communicator's step, learnt from the order of its calls
 * (DGC_BUFFER_KEY=order): the smallest period of its sequence of compressed
 * counts. A call's position is its index among its count's calls within the
 * step, so that a program that all-reduces fresh buffers every step, in a
 * fixed order, finds the same state at the same place of every step,
 * wherever its buffers lie.
 *
 * The step is known once the latest calls repeat one pattern of calls at
 * least twice, over DGC_ORDER_MIN_SPAN calls or more, and the call at hand
 * continues it: until then (and again after the order changes) a call has
 * no position and is summed densely.
 * That decision reads only counts, which every rank passes alike, so every
 * rank decides every call alike (docs/design.md, rule 1). A sequence whose
 * step is longer than DGC_ORDER_MAX_STEP calls is never learnt. */
#ifndef DGCSHIM_ORDER_H
#define DGCSHIM_ORDER_H

#include <stdint.h>

#define DGC_ORDER_MAX_STEP 4096
#define DGC_ORDER_MIN_SPAN 8

enum {
    DGC_ORDER_LEARNING = -1, /* the step is not known yet: sum this call densely */
    DGC_ORDER_CHANGED = -2,  /* the step just changed (a call broke the learnt order): the same, said once */
    DGC_ORDER_TOO_LONG = -3  /* no step of at most DGC_ORDER_MAX_STEP calls: the same, for good */
};

typedef struct dgc_order dgc_order;

dgc_order *dgc_order_new(void);
void dgc_order_free(dgc_order *o);

/* Records a call of count elements; returns its position (>= 0) in the
 * step, or one of the negative values above. */
int64_t dgc_order_next(dgc_order *o, uint64_t count);

/* Forgets the latest call recorded (it failed on every rank). */
void dgc_order_undo(dgc_order *o);

/* The learnt step's length in calls, 0 while none is known. */
uint64_t dgc_order_step(const dgc_order *o);

/* The latest call's index among the step's calls (0 .. step - 1), when
 * dgc_order_next gave it a position; and how many steps have been learnt
 * so far (a new one after each change), to tell one learnt step's indices
 * from another's. */
uint64_t dgc_order_index(const dgc_order *o);
uint64_t dgc_order_generation(const dgc_order *o);

#endif
