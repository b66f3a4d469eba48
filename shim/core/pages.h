/* Memory for the shim's arrays, given back to the system when freed.
 *
 * glibc keeps freed heap memory for reuse and, after a large block is freed,
 * raises its mmap threshold so that the next large blocks come from the heap
 * too: a buffer state freed or shrunk would then stay in the process's
 * resident set. The shim promises bounded memory, so its large arrays are
 * mapped pages of their own, returned with munmap. Small ones come from the
 * C heap, 64-byte aligned. Which of the two is decided by the size alone, so
 * a free needs the size the block was asked for. */
#ifndef DGCSHIM_PAGES_H
#define DGCSHIM_PAGES_H

#include <stddef.h>

/* bytes of zeroed memory, 64-byte aligned (2 MiB aligned and advised for
 * transparent huge pages from 2 MiB up); NULL when memory is short. */
void *dgc_pages_alloc(size_t bytes);

/* Frees a block from dgc_pages_alloc(bytes); NULL is ignored. */
void dgc_pages_free(void *p, size_t bytes);

/* Makes *p a block of at least want bytes (*cap: its size as asked for),
 * contents not kept: its users fill it afresh each time. A block more than
 * slack times larger than want, by more than 64 KiB, is given back and
 * replaced (warm-up's buffers are hundreds of times the steady state's).
 * Returns 0, or -1 with *p NULL and *cap 0 when memory is short. */
int dgc_pages_fit(void **p, size_t *cap, size_t want, size_t slack);

/* What a block of bytes takes from the system, rounding included: the
 * figure the shim's memory accounting adds up. */
size_t dgc_pages_footprint(size_t bytes);

#endif
