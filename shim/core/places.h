/* Are a communicator's buffers made afresh (DGC_BUFFER_KEY=auto)?
 *
 * Once the order of a communicator's calls is learnt (order.h), each call
 * has an index in the step. A buffer that persists (DDP's buckets, a
 * trainer's own arrays) comes at one index every step, whatever else the
 * step holds, since the true step is a whole number of learnt ones: no two
 * indices ever use the same memory. A program that makes a new tensor per
 * call (a comm hook such as fp16_compress_hook) breaks that as soon as its
 * allocator hands one call's memory to another: its tensors rotate over
 * the same blocks, or one block serves several calls of a step. Two steps
 * that show it (one does not: DDP's rebuild at new addresses can put one
 * bucket where another was, once) and the communicator's states follow
 * each call's place in the step from then on, as DGC_BUFFER_KEY=order keeps
 * them.
 *
 * What it cannot see: one buffer made afresh each step at moving addresses
 * with nothing else in the step (the learnt step is one call, so its
 * memory never meets another index's), which looks just like several
 * persistent buffers of one size; or fresh buffers that never land on
 * memory another index had. Those stay keyed by address.
 *
 * A rank's own view, from its own addresses: it picks which of this rank's
 * states a call uses, nothing that the ranks must decide alike. */
#ifndef DGCSHIM_PLACES_H
#define DGCSHIM_PLACES_H

#include <stdint.h>

/* Steps of one learnt order that show shared memory before states follow
 * places. */
#define DGC_PLACES_STEPS 2

typedef struct dgc_places dgc_places;

dgc_places *dgc_places_new(void);
void dgc_places_free(dgc_places *p);

/* Notes a call at index `index` of a learnt step of `step` calls (the
 * order's generation gen: a new step starts the watch afresh) whose
 * gradient is the memory [lo, hi). Returns 1 once, at the call that makes
 * the DGC_PLACES_STEPS-th step of one generation in which a call's memory
 * overlapped the memory another index had last (in this step or the one
 * before); 0 otherwise, and when no memory can be had (addresses keep
 * keying the states). */
int dgc_places_note(dgc_places *p, uint64_t gen, uint64_t step, uint64_t index, uintptr_t lo, uintptr_t hi);

#endif
