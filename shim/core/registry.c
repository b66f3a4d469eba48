/* Arrays searched linearly: a job has tens of gradient buffers and a handful
 * of communicators, and a lookup is nothing next to compressing a buffer. */
#include "registry.h"

#include "order.h"
#include "places.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "pages.h"

typedef struct {
    uint64_t count, next;
    int dense; /* the ranks agreed to sum this count densely (dgc_registry_set_count_dense) */
} step_counter;

struct dgc_comm_counters {
    size_t len;
    step_counter at[DGC_COUNTS_PER_COMM];
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static dgc_buffer **buffers;
static size_t nbuffers, buffers_cap;
static dgc_comm **comms;
static size_t ncomms, comms_cap;
static uint64_t next_comm_id = 1;
static dgc_registry_totals totals;
static dgc_report_row *released_rows; /* live is 0 in every one of them */
static size_t nreleased_rows, released_rows_cap;
static _Atomic uint64_t passthrough_by[DGC_PASS_REASONS];
static _Atomic uint64_t passthrough, passthrough_bytes, compressed, over_budget, failed[DGC_FAIL_CAUSES], saturated;
static int hooks[DGC_HOOK_COUNT] = {-1, -1};
static void *_Atomic slots[DGC_SLOT_COUNT];
static pthread_once_t onces[DGC_ONCE_COUNT] = {PTHREAD_ONCE_INIT};
static atomic_int flags[DGC_FLAG_COUNT];
static _Atomic uint64_t tallies[DGC_TALLY_COUNT];
typedef struct {
    void *p, *token;
    size_t bytes;
} parked_block;
static parked_block *parked;
static size_t nparked, parked_cap;
_Static_assert(DGC_ONCE_COUNT == 1, "one PTHREAD_ONCE_INIT per once");

static int grow(void **arr, size_t *cap, size_t want, size_t elem) {
    if (want <= *cap) return 0;
    size_t ncap = *cap ? *cap * 2 : 16;
    while (ncap < want) ncap *= 2;
    void *p = realloc(*arr, ncap * elem);
    if (!p) return -1;
    *arr = p;
    *cap = ncap;
    return 0;
}

/* ---- memory accounting (under the lock) ---- */

static void add_bytes(size_t add, size_t sub) {
    totals.bytes = totals.bytes + add - sub;
    if (totals.bytes > totals.peak_bytes) totals.peak_bytes = totals.bytes;
}

static void add_device_bytes(size_t add, size_t sub) {
    totals.device_bytes = totals.device_bytes + add - sub;
    if (totals.device_bytes > totals.device_peak_bytes) totals.device_peak_bytes = totals.device_bytes;
}

static size_t reserve_bytes_of(const dgc_comm *c) {
    return dgc_pages_footprint(c->head * ((size_t)c->nranks + 1)) + sizeof *c + sizeof *c->counters;
}

static size_t buffer_bytes(const dgc_buffer *b) {
    return sizeof *b + (b->state ? dgc_state_bytes(b->state) : 0) + dgc_pages_footprint(b->payload_cap) +
           dgc_pages_footprint(b->gathered_cap) + dgc_pages_footprint(b->prev_cap) +
           dgc_pages_footprint(b->wire_cap) + dgc_pages_footprint(b->scratch_cap) +
           (b->bounds ? ((size_t)b->bounds_ranks + 1) * sizeof *b->bounds : 0) + b->gpu_bytes;
}

/* ---- communicators ---- */

dgc_comm *dgc_registry_comm_open(int nranks, size_t head) {
    return dgc_registry_comm_open_owned(nranks, head, DGC_OWNER_MPI);
}

dgc_comm *dgc_registry_comm_open_owned(int nranks, size_t head, int owner) {
    dgc_comm *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->owner = owner;
    c->nranks = nranks;
    c->head = head;
    c->counters = calloc(1, sizeof *c->counters);
    c->reserve = dgc_pages_alloc(head * ((size_t)nranks + 1));
    pthread_mutex_lock(&lock);
    int ok = c->counters && c->reserve && grow((void **)&comms, &comms_cap, ncomms + 1, sizeof *comms) == 0;
    if (ok) {
        c->id = next_comm_id++;
        comms[ncomms++] = c;
        add_bytes(reserve_bytes_of(c), 0);
    }
    pthread_mutex_unlock(&lock);
    if (ok) return c;
    free(c->counters);
    dgc_pages_free(c->reserve, head * ((size_t)nranks + 1));
    free(c);
    return NULL;
}

static dgc_comm *find_comm(uint64_t id) {
    for (size_t i = 0; i < ncomms; i++)
        if (comms[i]->id == id) return comms[i];
    return NULL;
}

dgc_comm *dgc_registry_comm_find(uint64_t id) {
    pthread_mutex_lock(&lock);
    dgc_comm *c = find_comm(id);
    pthread_mutex_unlock(&lock);
    return c;
}

static dgc_comm *find_handle(const void *handle) {
    for (size_t i = 0; i < ncomms; i++)
        if (comms[i]->handle == handle) return comms[i];
    return NULL;
}

int dgc_registry_comm_bind(const void *handle, uint64_t id) {
    pthread_mutex_lock(&lock);
    dgc_comm *c = find_comm(id);
    if (c) c->handle = handle;
    pthread_mutex_unlock(&lock);
    return c ? 0 : -1;
}

dgc_comm *dgc_registry_comm_by_handle(const void *handle) {
    if (!handle) return NULL;
    pthread_mutex_lock(&lock);
    dgc_comm *c = find_handle(handle);
    pthread_mutex_unlock(&lock);
    return c;
}

/* The communicator is ending: a call in flight on another thread must not
 * reach it again, so it is marked closing first, and its queries already
 * under way (dgc_registry_comm_enter) are waited out: they take
 * microseconds. */
uint64_t dgc_registry_comm_unbind(const void *handle) {
    if (!handle) return 0;
    pthread_mutex_lock(&lock);
    dgc_comm *c = find_handle(handle);
    uint64_t id = 0;
    if (c) {
        c->handle = NULL;
        c->closing = 1;
        id = c->id;
        while (c->inside > 0) {
            pthread_mutex_unlock(&lock);
            sched_yield();
            pthread_mutex_lock(&lock);
        }
    }
    pthread_mutex_unlock(&lock);
    return id;
}

int dgc_registry_comm_enter(dgc_comm *c) {
    pthread_mutex_lock(&lock);
    int ok = !c->closing;
    c->inside += ok;
    pthread_mutex_unlock(&lock);
    return ok;
}

void dgc_registry_comm_leave(dgc_comm *c) {
    pthread_mutex_lock(&lock);
    c->inside--;
    pthread_mutex_unlock(&lock);
}

static dgc_report_row *released_row_of(const void *send, const void *buf, uint64_t count) {
    for (size_t i = 0; i < nreleased_rows; i++) {
        dgc_report_row *r = &released_rows[i];
        if (r->send == send && r->buf == buf && r->count == count) return r;
    }
    return NULL;
}

/* Under the lock: folds a freed entry's statistics into its key's row. */
static void keep_released_stats(const dgc_buffer *b) {
    dgc_report_row *r = released_row_of(b->send, b->buf, b->count);
    if (!r && nreleased_rows < DGC_RELEASED_ROWS &&
        grow((void **)&released_rows, &released_rows_cap, nreleased_rows + 1, sizeof *released_rows) == 0) {
        r = &released_rows[nreleased_rows++];
        *r = (dgc_report_row){.send = b->send, .buf = b->buf, .count = b->count};
    }
    if (r) {
        dgc_stats_add(&r->stats, &b->stats);
        if (b->stats.calls) { /* the latest, not a sum */
            r->stats.last_wire_bytes = b->stats.last_wire_bytes;
            r->stats.last_k = b->stats.last_k;
            r->stats.last_transport = b->stats.last_transport;
        }
        r->states++;
    } else {
        dgc_stats_add(&totals.released_unkeyed, &b->stats);
        totals.released_unkeyed_states++;
    }
}

/* Entries leave in two halves, so that no device memory is freed (a wait
 * for the GPU, on the NCCL path) under the lock, which every thread's calls
 * take (a thread whose NCCL kernel waits for a peer thread blocked on the
 * lock would never finish):
 *   detach (under the lock)   out of the table, out of the live counts;
 *   release (outside it)      the GPU state freed (gpu_release, which also
 *                             brings the statistics up to date), then, under
 *                             the lock again, the statistics kept for the
 *                             report, then the host memory freed. */
typedef struct {
    dgc_buffer **at;
    size_t len, cap;
} detached;

static void release_buffer(dgc_buffer *b);

/* Under the lock. */
static void detach_buffer(dgc_buffer *b, detached *d) {
    totals.live_states--;
    add_bytes(0, b->bytes);
    add_device_bytes(0, b->gpu_bytes);
    if (grow((void **)&d->at, &d->cap, d->len + 1, sizeof *d->at) == 0)
        d->at[d->len++] = b;
    else /* no memory to list it: released under the lock after all */
        release_buffer(b);
}

static void free_host_parts(dgc_buffer *b) {
    dgc_state_destroy(b->state);
    dgc_pages_free(b->payload, b->payload_cap);
    dgc_pages_free(b->gathered, b->gathered_cap);
    dgc_pages_free(b->prev, b->prev_cap);
    dgc_pages_free(b->wire, b->wire_cap);
    dgc_pages_free(b->scratch, b->scratch_cap);
    free(b->bounds);
    free(b);
}

/* Outside the lock. */
static void release_detached(detached *d) {
    for (size_t i = 0; i < d->len; i++)
        if (d->at[i]->gpu_release) d->at[i]->gpu_release(d->at[i]);
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < d->len; i++) {
        keep_released_stats(d->at[i]);
        totals.released_states++;
    }
    pthread_mutex_unlock(&lock);
    for (size_t i = 0; i < d->len; i++) free_host_parts(d->at[i]);
    free(d->at);
    *d = (detached){0};
}

/* Under the lock: frees an entry at once, keeping its statistics (when no
 * list could hold it). */
static void release_buffer(dgc_buffer *b) {
    if (b->gpu_release) b->gpu_release(b);
    keep_released_stats(b);
    totals.released_states++;
    free_host_parts(b);
}

/* Under the lock: takes the entries of comm id for which drop says so out
 * of the table, into d. */
static uint64_t detach_where(uint64_t id, int (*drop)(const dgc_buffer *b, const void *ctx), const void *ctx,
                             detached *d) {
    size_t w = 0;
    uint64_t taken = 0;
    for (size_t i = 0; i < nbuffers; i++) {
        dgc_buffer *b = buffers[i];
        if (b->comm == id && drop(b, ctx)) {
            detach_buffer(b, d);
            taken++;
        } else {
            buffers[w++] = b;
        }
    }
    nbuffers = w;
    return taken;
}

static int always(const dgc_buffer *b, const void *ctx) {
    (void)b, (void)ctx;
    return 1;
}

static void free_comm(dgc_comm *c) {
    if (c->ext_free) c->ext_free(c->ext);
    dgc_order_free(c->order);
    dgc_places_free(c->places);
    dgc_pages_free(c->reserve, c->head * ((size_t)c->nranks + 1));
    free(c->counters);
    free(c);
}

/* Under the lock: the record out of the table, its entries into d. */
static void detach_comm(dgc_comm *c, detached *d) {
    detach_where(c->id, always, NULL, d);
    size_t w = 0;
    for (size_t i = 0; i < ncomms; i++)
        if (comms[i] != c) comms[w++] = comms[i];
    ncomms = w;
    add_bytes(0, reserve_bytes_of(c));
}

/* Outside the lock: what detach_comm took, freed. */
static void free_detached_comm(dgc_comm *c, detached *d) {
    release_detached(d);
    free_comm(c);
}

void dgc_registry_comm_close(uint64_t id) {
    detached d = {0};
    pthread_mutex_lock(&lock);
    dgc_comm *c = find_comm(id);
    if (c && c->holds > 0) { /* a call uses it: the last to drop it frees it */
        c->closing = 1;
        c->handle = NULL;
        c = NULL;
    } else if (c) {
        detach_comm(c, &d);
    }
    pthread_mutex_unlock(&lock);
    if (c) free_detached_comm(c, &d);
}

dgc_comm *dgc_registry_comm_hold(const void *handle) {
    if (!handle) return NULL;
    pthread_mutex_lock(&lock);
    dgc_comm *c = find_handle(handle);
    if (c) c->holds++;
    pthread_mutex_unlock(&lock);
    return c;
}

void dgc_registry_comm_hold_again(dgc_comm *c) {
    pthread_mutex_lock(&lock);
    c->holds++;
    pthread_mutex_unlock(&lock);
}

void dgc_registry_comm_drop(dgc_comm *c) {
    if (!c) return;
    detached d = {0};
    int last = 0;
    pthread_mutex_lock(&lock);
    if (--c->holds == 0 && c->closing) {
        detach_comm(c, &d);
        last = 1;
    }
    pthread_mutex_unlock(&lock);
    if (last) free_detached_comm(c, &d);
}

int dgc_registry_comm_closing(dgc_comm *c) {
    pthread_mutex_lock(&lock);
    int closing = c->closing;
    pthread_mutex_unlock(&lock);
    return closing;
}

/* ---- steps (the communicator's own: no lock needed) ---- */

static step_counter *counter_of(dgc_comm *c, uint64_t count) {
    dgc_comm_counters *t = c->counters;
    for (size_t i = 0; i < t->len; i++)
        if (t->at[i].count == count) return &t->at[i];
    return NULL;
}

int dgc_registry_next_step(dgc_comm *c, uint64_t count, uint64_t *step) {
    step_counter *s = counter_of(c, count);
    if (!s) {
        if (c->counters->len == DGC_COUNTS_PER_COMM) return -1;
        s = &c->counters->at[c->counters->len++];
        *s = (step_counter){.count = count};
    }
    *step = s->next++;
    c->calls++;
    return 0;
}

int64_t dgc_registry_order_next(dgc_comm *c, uint64_t count) {
    if (!c->order && !(c->order = dgc_order_new())) return DGC_ORDER_LEARNING; /* summed densely, alike */
    return dgc_order_next(c->order, count);
}

void dgc_registry_order_undo(dgc_comm *c) {
    if (c->order) dgc_order_undo(c->order);
}

void dgc_registry_order_say(dgc_comm *c, int64_t at, uint64_t count, const char *what) {
    if (at == DGC_ORDER_CHANGED && !c->order_warned++)
        DGC_WARN("DGC_BUFFER_KEY=order: the order of %s's all-reduces changed (a %llu-element call broke the step of "
                 "%llu calls learnt so far); its calls are summed densely until the new order repeats, and states are "
                 "found by their place in it. Said once",
                 what, (unsigned long long)count, (unsigned long long)dgc_order_step(c->order));
    if (at == DGC_ORDER_TOO_LONG && !c->order_warned++)
        DGC_WARN("DGC_BUFFER_KEY=order: no repeating order of at most %d all-reduces found on %s: its float sums are "
                 "summed densely from now on (DGC_BUFFER_KEY=address keys persistent buffers)",
                 DGC_ORDER_MAX_STEP, what);
}

const int dgc_order_key_tag = 0;

int64_t dgc_registry_auto_place(dgc_comm *c, uint64_t count, const void *send, const void *buf, size_t elem,
                                int *now) {
    *now = 0;
    const int64_t at = dgc_registry_order_next(c, count);
    if (at < 0) return at == DGC_ORDER_TOO_LONG ? at : -1;
    if (c->by_place) return at;
    if (!c->places && !(c->places = dgc_places_new())) return -1;
    /* The gradient's memory: the send buffer of an out-of-place call (one
     * output may serve several persistent ones), else the buffer. */
    const uintptr_t lo = (uintptr_t)(send ? send : buf);
    const dgc_order *o = c->order;
    if (!dgc_places_note(c->places, dgc_order_generation(o), dgc_order_step(o), dgc_order_index(o), lo,
                         lo + count * elem))
        return -1;
    c->by_place = *now = 1;
    return at;
}

void dgc_registry_undo_step(dgc_comm *c, uint64_t count) {
    step_counter *s = counter_of(c, count);
    if (s && s->next) s->next--;
    if (c->calls) c->calls--;
}

int dgc_registry_note_moves(dgc_comm *c, uint64_t count, const void *send, const void *buf) {
    const step_counter *s = counter_of(c, count);
    if (!s || c->counters->len != 1) return 0; /* watched only while the communicator has this one count */
    if (s->next > 1 && (c->last_send != send || c->last_buf != buf)) c->moves++;
    c->last_send = send;
    c->last_buf = buf;
    if (c->moving_warned || s->next < DGC_MOVES_CALLS || 2 * c->moves < s->next) return 0;
    c->moving_warned = 1;
    return 1;
}

int dgc_registry_count_dense(dgc_comm *c, uint64_t count) {
    const step_counter *s = counter_of(c, count);
    return s && s->dense;
}

void dgc_registry_set_count_dense(dgc_comm *c, uint64_t count) {
    step_counter *s = counter_of(c, count);
    if (s) s->dense = 1;
}

/* ---- buffers ---- */

static int idle(const dgc_buffer *b, const void *ctx) {
    const uint64_t *limit = ctx; /* {calls now, idle calls, epoch now, idle epochs} */
    return !b->pinned && (limit[0] - b->last_call > limit[1] || limit[2] - b->epoch > limit[3]);
}

typedef struct {
    int (*drop)(const dgc_buffer *b, const void *ctx);
    const void *ctx;
} unpinned_pred;

static int unpinned(const dgc_buffer *b, const void *ctx) {
    const unpinned_pred *p = ctx;
    return !b->pinned && p->drop(b, p->ctx);
}

uint64_t dgc_registry_release_where(dgc_comm *c, int (*drop)(const dgc_buffer *b, const void *ctx), const void *ctx) {
    unpinned_pred pred = {drop, ctx};
    detached d = {0};
    pthread_mutex_lock(&lock);
    uint64_t freed = detach_where(c->id, unpinned, &pred, &d);
    c->live -= freed;
    pthread_mutex_unlock(&lock);
    release_detached(&d);
    return freed;
}

static int growing_after_reuse(const dgc_comm *c) {
    if (!c->reuse_call) return 0;
    uint64_t created = c->created - c->reuse_created, calls = c->calls - c->reuse_call;
    return created >= DGC_GROWTH_AFTER_REUSE && 2 * created > calls;
}

static int growing_by_volume(const dgc_comm *c) {
    return c->live >= DGC_GROWTH_STATES && c->calls >= DGC_GROWTH_CALLS && 2 * c->created > c->calls;
}

int dgc_registry_growth_first(dgc_comm *c) {
    if (c->growth_warned || !(growing_after_reuse(c) || growing_by_volume(c))) return 0;
    c->growth_warned = 1;
    return 1;
}

static uint64_t free_unused_for(dgc_comm *c, uint64_t idle_calls, uint64_t idle_epochs) {
    if (c->calls <= idle_calls && c->epoch <= idle_epochs) return 0;
    uint64_t limit[4] = {c->calls, idle_calls, c->epoch, idle_epochs};
    detached d = {0};
    pthread_mutex_lock(&lock);
    uint64_t freed = detach_where(c->id, idle, limit, &d);
    c->live -= freed;
    pthread_mutex_unlock(&lock);
    release_detached(&d);
    return freed;
}

uint64_t dgc_registry_free_idle(dgc_comm *c, uint64_t idle_calls) {
    return idle_calls ? free_unused_for(c, idle_calls, DGC_IDLE_EPOCHS) : 0;
}

uint64_t dgc_registry_free_stale(dgc_comm *c, uint64_t idle_calls) {
    return idle_calls ? free_unused_for(c, idle_calls, 1) : 0;
}

uint64_t dgc_registry_counts_at(dgc_comm *c, const void *send, const void *buf) {
    uint64_t found = 0;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < nbuffers; i++) {
        const dgc_buffer *b = buffers[i];
        found += b->comm == c->id && b->send == send && b->buf == buf;
    }
    pthread_mutex_unlock(&lock);
    return found;
}

dgc_buffer *dgc_registry_find(dgc_comm *c, const void *send, const void *buf, uint64_t count) {
    dgc_buffer *found = NULL;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < nbuffers && !found; i++) {
        dgc_buffer *b = buffers[i];
        if (b->comm == c->id && b->send == send && b->buf == buf && b->count == count) found = b;
    }
    pthread_mutex_unlock(&lock);
    if (found) {
        found->last_call = c->calls;
        if (found->epoch == c->epoch) c->epoch++; /* found twice in one epoch: a new step */
        found->epoch = c->epoch;
    }
    if (found && !c->reuse_call) {
        c->reuse_call = c->calls;
        c->reuse_created = c->created;
    }
    return found;
}

int dgc_registry_within_budget(size_t estimate, size_t budget) {
    pthread_mutex_lock(&lock);
    size_t held = totals.bytes;
    pthread_mutex_unlock(&lock);
    return !budget || held + estimate <= budget;
}

/* Makes b one of c's entries and counts its memory (takes the lock). */
static int add_entry(dgc_comm *c, dgc_buffer *b) {
    pthread_mutex_lock(&lock);
    int ok = grow((void **)&buffers, &buffers_cap, nbuffers + 1, sizeof *buffers) == 0;
    if (ok) {
        buffers[nbuffers++] = b;
        add_bytes(b->bytes, 0);
        add_device_bytes(b->gpu_bytes, 0);
        totals.live_states++;
        c->live++;
        c->created++;
    }
    pthread_mutex_unlock(&lock);
    return ok ? 0 : -1;
}

dgc_create_result dgc_registry_adopt(dgc_comm *c, const void *send, const void *buf, uint64_t count, void *gpu,
                                     size_t gpu_bytes, void (*release)(dgc_buffer *b), dgc_buffer **out) {
    *out = NULL;
    dgc_buffer *b = calloc(1, sizeof *b);
    if (!b) return DGC_NO_MEMORY;
    b->comm = c->id;
    b->send = send;
    b->buf = buf;
    b->count = count;
    b->last_call = c->calls;
    b->epoch = c->epoch;
    b->gpu = gpu;
    b->gpu_bytes = gpu_bytes;
    b->gpu_release = release;
    b->bytes = buffer_bytes(b);
    if (add_entry(c, b)) { /* not published: gpu stays the caller's */
        free(b);
        return DGC_NO_MEMORY;
    }
    *out = b;
    return DGC_CREATED;
}

dgc_create_result dgc_registry_create(dgc_comm *c, const void *send, const void *buf, uint64_t count,
                                      int with_momentum, size_t estimate, size_t budget, dgc_buffer **out) {
    *out = NULL;
    pthread_mutex_lock(&lock);
    size_t held = totals.bytes;
    pthread_mutex_unlock(&lock);
    if (budget && held + estimate > budget) return DGC_OVER_BUDGET;
    dgc_buffer *b = calloc(1, sizeof *b);
    if (!b) return DGC_NO_MEMORY;
    b->state = dgc_state_create(count, with_momentum);
    if (!b->state) {
        free(b);
        return DGC_NO_MEMORY;
    }
    b->comm = c->id;
    b->send = send;
    b->buf = buf;
    b->count = count;
    b->last_call = c->calls;
    b->epoch = c->epoch;
    b->bytes = buffer_bytes(b);
    if (add_entry(c, b)) {
        dgc_state_destroy(b->state);
        free(b);
        return DGC_NO_MEMORY;
    }
    *out = b;
    return DGC_CREATED;
}

/* Room beyond twice the need is given back. */
#define EXCHANGE_SLACK 2

int dgc_registry_reserve(dgc_buffer *b, size_t bytes, int nranks) {
    int rc = dgc_pages_fit(&b->payload, &b->payload_cap, bytes, EXCHANGE_SLACK) ||
             dgc_pages_fit(&b->gathered, &b->gathered_cap, bytes * (size_t)nranks, EXCHANGE_SLACK);
    dgc_registry_account(b);
    return rc ? -1 : 0;
}

int dgc_registry_reserve_wire(dgc_buffer *b, size_t bytes) {
    int rc = dgc_pages_fit(&b->wire, &b->wire_cap, bytes, EXCHANGE_SLACK);
    dgc_registry_account(b);
    return rc ? -1 : 0;
}

int dgc_registry_reserve_scratch(dgc_buffer *b, size_t bytes, int nranks) {
    int rc = dgc_pages_fit(&b->scratch, &b->scratch_cap, bytes, EXCHANGE_SLACK);
    if (rc == 0 && (!b->bounds || b->bounds_ranks != nranks)) {
        uint32_t *bounds = malloc(((size_t)nranks + 1) * sizeof *bounds);
        if (bounds) {
            free(b->bounds);
            b->bounds = bounds;
            b->bounds_ranks = nranks;
            b->bounds_step = UINT64_MAX; /* none balanced yet */
        } else {
            rc = -1;
        }
    }
    dgc_registry_account(b);
    return rc ? -1 : 0;
}

static void swap_into_prev(dgc_buffer *b, void **buf, size_t *cap) {
    void *p = b->prev;
    size_t c = b->prev_cap;
    b->prev = *buf;
    b->prev_cap = *cap;
    *buf = p;
    *cap = c;
}

void dgc_registry_keep_dense(dgc_buffer *b, uint64_t step, int nranks) {
    swap_into_prev(b, &b->gathered, &b->gathered_cap);
    b->prev_step = step;
    b->prev_code = (dgc_compact_layout){0};
    b->prev_nranks = nranks;
    b->prev_dense = 1;
}

void dgc_registry_keep_wire(dgc_buffer *b, const dgc_compact_layout *code, uint64_t step, int nranks) {
    swap_into_prev(b, &b->wire, &b->wire_cap);
    b->prev_step = step;
    b->prev_code = *code;
    b->prev_nranks = nranks;
    b->prev_dense = 0;
}

/* Under the lock: the entry's memory re-read into the totals. */
static void reaccount(dgc_buffer *b) {
    const size_t now = buffer_bytes(b);
    add_bytes(now, b->bytes);
    b->bytes = now;
}

void dgc_registry_account(dgc_buffer *b) {
    pthread_mutex_lock(&lock);
    reaccount(b);
    pthread_mutex_unlock(&lock);
}

void dgc_registry_gpu_moved(dgc_buffer *b, void *gpu, size_t gpu_bytes) {
    pthread_mutex_lock(&lock);
    add_device_bytes(gpu_bytes, b->gpu_bytes);
    b->gpu = gpu;
    b->gpu_bytes = gpu_bytes;
    reaccount(b);
    pthread_mutex_unlock(&lock);
}

void dgc_registry_each(void (*fn)(const dgc_buffer *b, void *ctx), void *ctx) {
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < nbuffers; i++) fn(buffers[i], ctx);
    pthread_mutex_unlock(&lock);
}

void dgc_registry_each_row(void (*fn)(const dgc_report_row *r, void *ctx), void *ctx) {
    pthread_mutex_lock(&lock);
    unsigned char *merged = nreleased_rows ? calloc(nreleased_rows, 1) : NULL;
    for (size_t i = 0; i < nbuffers; i++) {
        const dgc_buffer *b = buffers[i];
        dgc_report_row row = {.send = b->send, .buf = b->buf, .count = b->count, .states = 1, .live = 1,
                              .bytes = b->bytes, .device_bytes = b->gpu_bytes, .stats = b->stats};
        dgc_report_row *r = released_row_of(b->send, b->buf, b->count);
        size_t at = r ? (size_t)(r - released_rows) : 0;
        if (r && merged && !merged[at]) { /* one live entry takes it, should two communicators share a key */
            merged[at] = 1;
            dgc_stats_add(&row.stats, &r->stats);
            row.states += r->states;
        }
        fn(&row, ctx);
    }
    for (size_t i = 0; i < nreleased_rows; i++)
        if (!merged || !merged[i]) fn(&released_rows[i], ctx);
    free(merged); /* without it (no memory), live rows left out what was freed, which is printed on its own */
    pthread_mutex_unlock(&lock);
}

/* ---- totals ---- */

void dgc_registry_totals_get(dgc_registry_totals *t) {
    pthread_mutex_lock(&lock);
    *t = totals;
    pthread_mutex_unlock(&lock);
    t->passthrough = atomic_load_explicit(&passthrough, memory_order_relaxed);
    t->passthrough_bytes = atomic_load_explicit(&passthrough_bytes, memory_order_relaxed);
    for (int i = 0; i < DGC_PASS_REASONS; i++)
        t->passthrough_by[i] = atomic_load_explicit(&passthrough_by[i], memory_order_relaxed);
    t->compressed = atomic_load_explicit(&compressed, memory_order_relaxed);
    t->over_budget = atomic_load_explicit(&over_budget, memory_order_relaxed);
    for (int i = 0; i < DGC_FAIL_CAUSES; i++) t->failed[i] = atomic_load_explicit(&failed[i], memory_order_relaxed);
    t->saturated = atomic_load_explicit(&saturated, memory_order_relaxed);
}

void dgc_registry_count_passthrough(uint64_t bytes, dgc_pass_reason why) {
    atomic_fetch_add_explicit(&passthrough, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&passthrough_bytes, bytes, memory_order_relaxed);
    dgc_registry_note_pass_reason(why);
}
void dgc_registry_note_pass_reason(dgc_pass_reason why) {
    if ((unsigned)why < DGC_PASS_REASONS) atomic_fetch_add_explicit(&passthrough_by[why], 1, memory_order_relaxed);
}
uint64_t dgc_registry_count_compressed(void) {
    return atomic_fetch_add_explicit(&compressed, 1, memory_order_relaxed) + 1;
}
void dgc_registry_count_over_budget(void) { atomic_fetch_add_explicit(&over_budget, 1, memory_order_relaxed); }
void dgc_registry_count_failed(dgc_fail_cause cause, uint64_t calls) {
    if (cause >= 0 && cause < DGC_FAIL_CAUSES) atomic_fetch_add_explicit(&failed[cause], calls, memory_order_relaxed);
}

void dgc_registry_count_saturated(uint64_t steps, uint64_t count) {
    if (!steps) return;
    atomic_fetch_add_explicit(&saturated, steps, memory_order_relaxed);
    if (!dgc_registry_claim(DGC_FLAG_SATURATED_SAID)) return;
    char what[64] = "a buffer's residual";
    if (count) snprintf(what, sizeof what, "the residual of a %llu-element buffer", (unsigned long long)count);
    DGC_WARN("%s outgrew fp32 (finite gradients held back past +-3.4e38): it is held at +-FLT_MAX and the excess "
             "is lost; the values sent are clamped so that the ranks' sum stays finite (STATS counts these steps; "
             "said once)",
             what);
}

const char *dgc_pass_reason_name(dgc_pass_reason why) {
    static const char *const names[DGC_PASS_REASONS] = {"disabled", "op",         "type",        "small",
                                                        "ranks",    "table_full", "too_large",   "order_learning", "other"};
    return (unsigned)why < DGC_PASS_REASONS ? names[why] : "?";
}

const char *dgc_fail_cause_name(dgc_fail_cause cause) {
    switch (cause) {
    case DGC_FAIL_MEMORY: return "for memory";
    case DGC_FAIL_MISALIGNED: return "for misalignment";
    case DGC_FAIL_ENGINE: return "for the engine";
    case DGC_FAIL_PEER: return "for a peer's failure";
    case DGC_FAIL_BAD_PAYLOAD: return "for a bad payload";
    default: return "?";
    }
}

int dgc_registry_hook(int which) {
    pthread_mutex_lock(&lock);
    int v = hooks[which];
    pthread_mutex_unlock(&lock);
    return v;
}

void dgc_registry_set_hook(int which, int value) {
    pthread_mutex_lock(&lock);
    hooks[which] = value;
    pthread_mutex_unlock(&lock);
}

void *dgc_registry_slot(int which) { return atomic_load_explicit(&slots[which], memory_order_acquire); }

void dgc_registry_set_slot(int which, void *value) {
    atomic_store_explicit(&slots[which], value, memory_order_release);
}

void dgc_registry_once(int which, void (*fn)(void)) { pthread_once(&onces[which], fn); }

int dgc_registry_claim(int which) { return atomic_exchange_explicit(&flags[which], 1, memory_order_acq_rel) == 0; }
int dgc_registry_flag(int which) { return atomic_load_explicit(&flags[which], memory_order_acquire); }

void dgc_registry_tally_add(int which) { atomic_fetch_add_explicit(&tallies[which], 1, memory_order_relaxed); }
uint64_t dgc_registry_tally(int which) { return atomic_load_explicit(&tallies[which], memory_order_relaxed); }

/* ---- parked memory ---- */

int dgc_registry_park(void *p, size_t bytes, void *token) {
    pthread_mutex_lock(&lock);
    int ok = grow((void **)&parked, &parked_cap, nparked + 1, sizeof *parked) == 0;
    if (ok) parked[nparked++] = (parked_block){p, token, bytes};
    pthread_mutex_unlock(&lock);
    return ok ? 0 : -1;
}

void *dgc_registry_unpark(size_t bytes, int (*ready)(void *token), void (*drop_token)(void *token)) {
    void *found = NULL, *token = NULL;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < nparked && !found; i++) {
        if (parked[i].bytes != bytes || !ready(parked[i].token)) continue;
        found = parked[i].p;
        token = parked[i].token;
        parked[i] = parked[--nparked];
    }
    pthread_mutex_unlock(&lock);
    if (found && drop_token) drop_token(token);
    return found;
}

/* Takes the records for which all or owner says so out of the tables, then
 * frees them outside the lock. A record a call still holds is only marked
 * closing: the call's drop frees it. */
static void clear_where(int all, int owner) {
    dgc_comm **gone = NULL;
    detached *parts = NULL;
    size_t ngone = 0;
    pthread_mutex_lock(&lock);
    if (ncomms) {
        gone = calloc(ncomms, sizeof *gone);
        parts = calloc(ncomms, sizeof *parts);
    }
    for (size_t i = 0; i < ncomms;) {
        dgc_comm *c = comms[i];
        if (!(all || c->owner == owner)) {
            i++;
        } else if (c->holds > 0) {
            c->closing = 1;
            c->handle = NULL;
            i++;
        } else if (gone && parts) {
            detach_comm(c, &parts[ngone]); /* takes comms[i] out: i stays */
            gone[ngone++] = c;
        } else { /* no memory for the lists: freed here, under the lock */
            detached d = {0};
            detach_comm(c, &d);
            for (size_t j = 0; j < d.len; j++) release_buffer(d.at[j]);
            free(d.at);
            free_comm(c);
        }
    }
    if (ncomms == 0 && nbuffers == 0) {
        free(buffers);
        free(comms);
        buffers = NULL;
        comms = NULL;
        buffers_cap = comms_cap = 0;
    }
    pthread_mutex_unlock(&lock);
    for (size_t i = 0; i < ngone; i++) free_detached_comm(gone[i], &parts[i]);
    free(gone);
    free(parts);
}

void dgc_registry_clear_owner(int owner) { clear_where(0, owner); }

void dgc_registry_clear(void) { clear_where(1, 0); }
