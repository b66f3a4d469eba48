/* Arrays searched linearly: a job has tens of gradient buffers at most, and a
 * lookup is nothing next to compressing one of them. */
#include "registry.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint64_t comm, count, next;
} step_counter;

typedef struct {
    uint64_t comm;
} checked_comm;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static dgc_buffer **buffers;
static size_t nbuffers, buffers_cap;
static step_counter *counters;
static size_t ncounters, counters_cap;
static checked_comm *checked;
static size_t nchecked, checked_cap;
static _Atomic uint64_t passthrough;

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

static dgc_buffer *find_buffer(uint64_t comm, const void *buf, uint64_t count) {
    for (size_t i = 0; i < nbuffers; i++) {
        dgc_buffer *b = buffers[i];
        if (b->comm == comm && b->buf == buf && b->count == count) return b;
    }
    return NULL;
}

static dgc_buffer *new_buffer(uint64_t comm, const void *buf, uint64_t count, int with_momentum) {
    if (grow((void **)&buffers, &buffers_cap, nbuffers + 1, sizeof *buffers)) return NULL;
    dgc_buffer *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    b->state = dgc_state_create(count, with_momentum);
    if (!b->state) {
        free(b);
        return NULL;
    }
    b->comm = comm;
    b->buf = buf;
    b->count = count;
    buffers[nbuffers++] = b;
    return b;
}

dgc_buffer *dgc_registry_buffer(uint64_t comm, const void *buf, uint64_t count, int with_momentum) {
    pthread_mutex_lock(&lock);
    dgc_buffer *b = find_buffer(comm, buf, count);
    if (!b) b = new_buffer(comm, buf, count, with_momentum);
    pthread_mutex_unlock(&lock);
    return b;
}

static int reserve_bytes(void **p, size_t *cap, size_t want) {
    if (*cap >= want) return 0;
    void *q = realloc(*p, want);
    if (!q) return -1;
    *p = q;
    *cap = want;
    return 0;
}

int dgc_registry_reserve(dgc_buffer *b, size_t bytes, int nranks) {
    if (reserve_bytes(&b->send, &b->send_cap, bytes)) return -1;
    return reserve_bytes(&b->gathered, &b->gathered_cap, bytes * (size_t)nranks);
}

void dgc_registry_keep_gathered(dgc_buffer *b, uint64_t k) {
    void *p = b->prev;
    size_t cap = b->prev_cap;
    b->prev = b->gathered;
    b->prev_cap = b->gathered_cap;
    b->gathered = p;
    b->gathered_cap = cap;
    b->prev_k = k;
}

int dgc_registry_next_step(uint64_t comm, uint64_t count, uint64_t *step) {
    int rc = 0;
    pthread_mutex_lock(&lock);
    size_t i = 0;
    while (i < ncounters && !(counters[i].comm == comm && counters[i].count == count)) i++;
    if (i < ncounters) {
        *step = counters[i].next++;
    } else if (grow((void **)&counters, &counters_cap, ncounters + 1, sizeof *counters) == 0) {
        counters[ncounters++] = (step_counter){comm, count, 1};
        *step = 0;
    } else {
        rc = -1;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

int dgc_registry_comm_checked(uint64_t comm) {
    pthread_mutex_lock(&lock);
    int seen = 0;
    for (size_t i = 0; i < nchecked && !seen; i++) seen = checked[i].comm == comm;
    if (!seen) {
        if (grow((void **)&checked, &checked_cap, nchecked + 1, sizeof *checked) == 0)
            checked[nchecked++] = (checked_comm){comm};
        else
            seen = -1;
    }
    pthread_mutex_unlock(&lock);
    return seen;
}

static void free_buffer(dgc_buffer *b) {
    dgc_state_destroy(b->state);
    free(b->send);
    free(b->gathered);
    free(b->prev);
    free(b);
}

void dgc_registry_drop_comm(uint64_t comm) {
    pthread_mutex_lock(&lock);
    size_t w = 0;
    for (size_t i = 0; i < nbuffers; i++) {
        if (buffers[i]->comm == comm) free_buffer(buffers[i]);
        else buffers[w++] = buffers[i];
    }
    nbuffers = w;
    w = 0;
    for (size_t i = 0; i < ncounters; i++)
        if (counters[i].comm != comm) counters[w++] = counters[i];
    ncounters = w;
    w = 0;
    for (size_t i = 0; i < nchecked; i++)
        if (checked[i].comm != comm) checked[w++] = checked[i];
    nchecked = w;
    pthread_mutex_unlock(&lock);
}

void dgc_registry_each(void (*fn)(const dgc_buffer *b, void *ctx), void *ctx) {
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < nbuffers; i++) fn(buffers[i], ctx);
    pthread_mutex_unlock(&lock);
}

void dgc_registry_count_passthrough(void) {
    atomic_fetch_add_explicit(&passthrough, 1, memory_order_relaxed);
}

uint64_t dgc_registry_passthrough_calls(void) {
    return atomic_load_explicit(&passthrough, memory_order_relaxed);
}

void dgc_registry_clear(void) {
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < nbuffers; i++) free_buffer(buffers[i]);
    free(buffers);
    free(counters);
    free(checked);
    buffers = NULL;
    counters = NULL;
    checked = NULL;
    nbuffers = buffers_cap = ncounters = counters_cap = nchecked = checked_cap = 0;
    pthread_mutex_unlock(&lock);
}
