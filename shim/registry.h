/* The buffer-state registry: per (communicator, buffer, count) DGC state and
 * statistics, per (communicator, count) step counters, and per-communicator
 * flags. The only module besides config that holds process-wide mutable state.
 *
 * Lookups take a mutex; pass-through calls never come here. An entry handed
 * out stays valid until its communicator is dropped or the registry cleared. */
#ifndef DGCSHIM_REGISTRY_H
#define DGCSHIM_REGISTRY_H

#include <stddef.h>
#include <stdint.h>

#include "dgcshim/engine.h"
#include "dgcshim/stats.h"

typedef struct {
    uint64_t comm;   /* the front end's key for the communicator */
    const void *buf; /* the output buffer: where the gradient comes back */
    uint64_t count;
    dgc_state *state;
    void *send;      /* this rank's payload */
    void *gathered;  /* every rank's payload */
    size_t send_cap, gathered_cap;
    void *prev;      /* the last decoded step's gathered payloads (momentum compensation) */
    size_t prev_cap;
    uint64_t prev_k; /* their k; 0 when there is no previous step */
    dgc_buffer_stats stats;
} dgc_buffer;

/* The entry for (comm, buf, count), created with fresh state on first sight.
 * NULL when memory is short. */
dgc_buffer *dgc_registry_buffer(uint64_t comm, const void *buf, uint64_t count, int with_momentum);

/* Makes the entry's payload buffers hold at least bytes and nranks * bytes. */
int dgc_registry_reserve(dgc_buffer *b, size_t bytes, int nranks);

/* Keeps this step's gathered payloads (k slots each) as the previous step's:
 * swaps gathered and prev, so no copy. */
void dgc_registry_keep_gathered(dgc_buffer *b, uint64_t k);

/* The step of this call: how many calls on (comm, count) came before it.
 * A function of the call sequence alone, hence identical on every rank.
 * Returns -1 when memory is short (the caller must fail the call: guessing a
 * step would let ranks disagree). */
int dgc_registry_next_step(uint64_t comm, uint64_t count, uint64_t *step);

/* 1 when the configuration check already ran on comm, else 0 and marks it as
 * run; -1 when memory is short. */
int dgc_registry_comm_checked(uint64_t comm);

/* Forgets everything about comm (its handle may be reused after it is freed). */
void dgc_registry_drop_comm(uint64_t comm);

/* Calls fn for every buffer entry, in creation order. */
void dgc_registry_each(void (*fn)(const dgc_buffer *b, void *ctx), void *ctx);

/* Pass-through calls, counted only when statistics are on. */
void dgc_registry_count_passthrough(void);
uint64_t dgc_registry_passthrough_calls(void);

/* Frees every entry. */
void dgc_registry_clear(void);

#endif
