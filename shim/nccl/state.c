/* Buffer states of the GPU path: one per (communicator, send buffer or NULL
 * when in place, output buffer, count), in the registry, tied to the
 * communicator's life, its GPU memory freed through the entry's release.
 *
 * Frameworks reuse memory: DDP all-reduces every parameter once in one
 * step-0 bucket, whose memory the caching allocator then hands to the real
 * buckets. A new buffer whose bytes overlap an older state's therefore
 * retires that state (whatever it held belonged to a tensor that is gone),
 * so the step-0 bucket does not keep its GPU memory for the rest of the run;
 * states unused for DGC_STATE_IDLE_CALLS calls go too, as on the MPI path.
 *
 * Whether a rank has a state is a local matter (memory, budget, addresses),
 * so it never decides alone what the rank sends (invariant 1): at a count's
 * first call the ranks vote on it, and a count some rank cannot hold is
 * summed densely on every rank from then on (nccl/call.c); later, a rank
 * without its state takes part with the DGC_WIRE_FAILED flag. */
#include <stdint.h>
#include <stdio.h>

#include "core/log.h"
#include "core/order.h"
#include "internal.h"

/* Frees the engine's state without a host wait; called by the registry,
 * outside its lock, when the entry goes (idle, retired, communicator
 * closed): its block in stream order on the communicator's own stream after
 * the communicator's last work, its mapped counter parked until then
 * (nccl/memory.c). */
static void release_gpu(dgc_buffer *b) {
    dgc_gpu_state *s = b->gpu;
    dgc_nccl_comm *x = b->gpu_owner;
    if (!s) return;
    b->stats.nonfinite = dgc_gpu_state_nonfinite(s);
    b->gpu = NULL;
    dgc_device_guard g;
    if (dgc_device_enter(&g, x->device)) return; /* left allocated: no runtime to free it with */
    cudaEvent_t after = NULL;
    if (dgc_nccl_comm_after(x, &after)) {
        DGC_DEBUG("a state's memory is left allocated: the communicator's last work cannot be waited for");
    } else {
        void *counter = dgc_gpu_state_release(s, x->own);
        dgc_nccl_mapped_put(counter, sizeof(dgc_gpu_state_mapped), after);
    }
    dgc_device_leave(&g);
}

static int fits(const dgc_gpu_shape *have, const dgc_gpu_shape *want) {
    return have->n == want->n && have->k >= want->k && have->sparse_k >= want->sparse_k &&
           have->dense >= want->dense && have->nranks == want->nranks &&
           have->with_momentum == want->with_momentum && have->keep_prev == want->keep_prev &&
           have->dtype == want->dtype && have->value_bits == want->value_bits;
}

static int is_entry(const dgc_buffer *b, const void *ctx) { return b == ctx; }

/* Worth a move: what scales with k at least halved, or the dense room gone. */
static int much_smaller(const dgc_gpu_shape *have, const dgc_gpu_shape *want) {
    return 2 * want->k <= have->k || 2 * want->sparse_k <= have->sparse_k || (have->dense && !want->dense);
}

/* The warm-up's end, in stages: a state sized for an earlier step's larger
 * k (the warm-up's first is the largest: candidates, sort buffers and
 * payloads scale with it) or for dense steps that no longer come moves into
 * a block sized for this step's shape, so that the warm-up's scratch goes
 * back to the pool. Only once every step enqueued on it is done and what it
 * keeps for the compensation fits the new shape (dgc_gpu_state_kept_fits):
 * nothing changes but where the state lives, on every rank alike or not (a
 * rank that moves later, or never, decides nothing differently). */
static void shrink(dgc_nccl_call *k, dgc_buffer *b, const dgc_gpu_shape *want) {
    const dgc_gpu_shape *have = dgc_gpu_state_shape(b->gpu);
    if (!much_smaller(have, want) || !dgc_gpu_state_kept_fits(b->gpu, want)) return;
    const uint64_t calls = k->c->calls;
    if (!dgc_nccl_move_due(b->gpu_move_refused_k, b->gpu_move_refused_call, want->k, calls)) return;
    const size_t before = dgc_gpu_state_bytes(b->gpu);
    char err[256] = "";
    dgc_gpu_state *s = dgc_gpu_state_resize(b->gpu, want, k->stream, err, sizeof err);
    if (!s) {
        (void)cudaGetLastError();
        b->gpu_move_refused_k = want->k;
        b->gpu_move_refused_call = calls;
        DGC_DEBUG("the state of a %llu-element buffer stays at %zu bytes: %s (tried again for a smaller k, or %d "
                  "calls on)",
                  (unsigned long long)k->count, before, err, DGC_NCCL_MOVE_RETRY_CALLS);
        return;
    }
    b->gpu_move_refused_k = 0;
    dgc_registry_gpu_moved(b, s, dgc_gpu_state_bytes(s));
    DGC_DEBUG("the state of a %llu-element buffer moved from %zu to %zu bytes of device memory (k %llu, sparse k "
              "%llu, dense room %d)", (unsigned long long)k->count, before, dgc_gpu_state_bytes(s),
              (unsigned long long)want->k, (unsigned long long)want->sparse_k, want->dense);
}

/* Byte ranges of the new buffer: output, and send when not in place. */
typedef struct {
    uintptr_t lo[2], hi[2];
    int n;
} ranges;

static int overlaps(const dgc_buffer *b, const void *ctx) {
    const ranges *r = ctx;
    if (!b->gpu) return 0;
    uintptr_t bytes = (uintptr_t)(b->count * b->gpu_elem);
    const void *mine[2] = {b->buf, b->send};
    for (int i = 0; i < 2; i++) {
        if (!mine[i]) continue;
        uintptr_t lo = (uintptr_t)mine[i], hi = lo + bytes;
        for (int j = 0; j < r->n; j++)
            if (lo < r->hi[j] && r->lo[j] < hi) return 1;
    }
    return 0;
}

/* Retiring the same communicator's states again and again means buffers
 * that overlap each other in turn (a buffer reduced whole and in parts):
 * their residuals restart every time. */
#define RETIRE_WARN 16

static void retire_overlapping(dgc_nccl_call *k, const void *key, int auto_key) {
    dgc_comm *c = k->c;
    dgc_nccl_comm *x = dgc_nccl_ext(c);
    ranges r = {{0}, {0}, 0};
    uintptr_t bytes = (uintptr_t)(k->count * dgc_nccl_key_elem(k));
    const void *mine[2] = {dgc_nccl_key_place(k), key};
    for (int i = 0; i < 2; i++) {
        if (!mine[i]) continue;
        r.lo[r.n] = (uintptr_t)mine[i];
        r.hi[r.n] = (uintptr_t)mine[i] + bytes;
        r.n++;
    }
    uint64_t gone = dgc_registry_release_where(c, overlaps, &r);
    if (!gone) return;
    DGC_DEBUG("%llu state(s) retired: a new %llu-element buffer at %p overlaps their memory",
              (unsigned long long)gone, (unsigned long long)k->count, dgc_nccl_key_place(k));
    /* Under auto, states follow places once the order is learnt and the
     * buffers show they move (auto_place): a sign only where no order is. */
    if (auto_key && k->order_at != DGC_ORDER_TOO_LONG) return;
    x->retired += gone;
    if (x->retired < RETIRE_WARN || x->retire_warned++) return;
    if (auto_key)
        DGC_WARN("%llu buffer states on one communicator were retired because new buffers overlapped them: their "
                 "residuals keep starting afresh. DGC_BUFFER_KEY=auto makes states follow each buffer's place in "
                 "the step (a comm hook's new tensor per call) once it learns the order of the calls, but no order "
                 "of at most %d all-reduces repeats here (said once per communicator)",
                 (unsigned long long)x->retired, DGC_ORDER_MAX_STEP);
    else
        DGC_WARN("%llu buffer states on one communicator were retired because new buffers overlapped them: the "
                 "program all-reduces buffers that overlap each other in turn, so their residuals keep starting "
                 "afresh: a comm hook that makes a new tensor per call (fp16_compress_hook) wants "
                 "DGC_BUFFER_KEY=auto or order, which follow each bucket's place in the step (said once per "
                 "communicator)",
                 (unsigned long long)x->retired);
}

/* Fresh buffers every call (dgc_registry_growth_first): said once. */
static void warn_growth(dgc_comm *c, uint64_t count) {
    if (!dgc_registry_growth_first(c)) return;
    DGC_WARN("%llu buffer states live on one NCCL communicator (%llu created in %llu calls, the latest for %llu "
             "elements): the program all-reduces fresh buffers, so residuals do not carry over between steps; "
             "states unused for DGC_STATE_IDLE_CALLS calls are freed",
             (unsigned long long)c->live, (unsigned long long)c->created, (unsigned long long)c->calls,
             (unsigned long long)count);
}

dgc_buffer *dgc_nccl_state_get(dgc_nccl_call *k, const dgc_config *cfg) {
    dgc_comm *c = k->c;
    /* By address, or under DGC_BUFFER_KEY=order by place in the step
     * (registry.h's DGC_ORDER_SEND key), where memory says nothing. */
    const int by_order = k->order_at >= 0;
    const void *key = by_order ? DGC_ORDER_SEND : dgc_nccl_key_send(k);
    const void *place = by_order ? DGC_ORDER_BUF(k->order_at) : dgc_nccl_key_place(k);
    dgc_gpu_shape want = {
        .n = k->count,
        .k = k->plan.p.k,
        .nranks = c->nranks,
        .with_momentum = cfg->momentum > 0,
        .keep_prev = cfg->compensate && cfg->momentum > 0,
        .dtype = k->gpu_dtype,
        .value_bits = (unsigned)cfg->value_bits,
    };
    /* Sized once for every later step: the gathered payloads for the largest
     * k that goes sparse, the dense room when some step goes dense. */
    dgc_config spare;
    dgc_policy_outlook(dgc_nccl_planning_config(cfg, &spare), k->count, dgc_gpu_sum_type_of(k->gpu_dtype),
                       k->plan.p.step, c->nranks, &want.sparse_k, &want.dense);
    k->lack = DGC_NCCL_LACK_NONE;
    k->footprint = 0;
    /* A run takes a communicator's calls one round at a time: a buffer is
     * never pinned by another call here (the same buffer twice in a group
     * is two calls in turn, as without the group). */
    dgc_buffer *b = dgc_registry_find(c, key, place, k->count);
    if (b && !fits(dgc_gpu_state_shape(b->gpu), &want)) { /* the same memory, now another type or size */
        dgc_registry_release_where(c, is_entry, b);
        b = NULL;
    }
    dgc_registry_free_idle(c, cfg->state_idle_calls);
    if (b) {
        b->pinned = 1;
        shrink(k, b, &want);
        return b;
    }
    if (!by_order) retire_overlapping(k, key, cfg->buffer_key == DGC_KEY_AUTO);
    /* Sized here, once per state made, not on every call: it asks cub for
     * the sort's scratch at every k a warm-up can use (log2 k queries). */
    k->footprint = dgc_gpu_state_footprint(&want);
    const size_t budget = dgc_config_state_budget(cfg, dgc_nccl_ext(c)->auto_budget);
    /* States that missed a whole step go first when this one would not fit
     * (DDP's step-0 bucket, the buckets a rebuild left behind). */
    if (!dgc_registry_within_budget(k->footprint, budget)) dgc_registry_free_stale(c, cfg->state_idle_calls);
    if (!dgc_registry_within_budget(k->footprint, budget)) {
        DGC_DEBUG("the state of a new %llu-element buffer (%zu bytes) would pass this rank's budget of %zu MiB "
                  "(DGC_MAX_STATE_MB%s)",
                  (unsigned long long)k->count, k->footprint, budget >> 20,
                  cfg->max_state_mb == DGC_UINT_AUTO ? "=auto: a quarter of the device's memory" : "");
        k->lack = DGC_NCCL_LACK_BUDGET;
        return NULL;
    }
    char err[256] = "";
    void *counter = dgc_nccl_mapped_get(sizeof(dgc_gpu_state_mapped));
    dgc_gpu_state *s = counter ? dgc_gpu_state_create_with(&want, k->stream, counter, err, sizeof err) : NULL;
    if (counter && !s && dgc_registry_free_stale(c, cfg->state_idle_calls)) {
        (void)cudaGetLastError();
        s = dgc_gpu_state_create_with(&want, k->stream, counter, err, sizeof err);
    }
    if (!counter) snprintf(err, sizeof err, "no mapped pinned host memory for its counter");
    else if (!s) dgc_nccl_mapped_put(counter, sizeof(dgc_gpu_state_mapped), NULL);
    if (!s) {
        (void)cudaGetLastError(); /* handled here: the flagged payload's launches must not read it as theirs */
        DGC_DEBUG("no device memory for the state of a %llu-element buffer (%zu bytes: %s)",
                  (unsigned long long)k->count, k->footprint, err);
        k->lack = DGC_NCCL_LACK_DEVICE;
        return NULL;
    }
    if (dgc_registry_adopt(c, key, place, k->count, s, dgc_gpu_state_bytes(s), release_gpu, &b) != DGC_CREATED) {
        dgc_nccl_mapped_put(dgc_gpu_state_release(s, k->stream), sizeof(dgc_gpu_state_mapped), NULL);
        DGC_DEBUG("no host memory for the entry of a %llu-element buffer", (unsigned long long)k->count);
        k->lack = DGC_NCCL_LACK_HOST;
        return NULL;
    }
    b->gpu_owner = dgc_nccl_ext(c);
    b->gpu_elem = dgc_nccl_key_elem(k);
    b->pinned = 1;
    DGC_DEBUG("state for %llu elements at %p (send buffer %p, NULL in place): %zu bytes of device memory",
              (unsigned long long)k->count, place, key, dgc_gpu_state_bytes(s));
    warn_growth(c, k->count);
    return b;
}

void dgc_nccl_state_drop(dgc_nccl_call *k) {
    if (!k->b) return;
    dgc_nccl_chain_out(dgc_nccl_ext(k->c), k->stream); /* this call's work on it so far comes first */
    k->b->pinned = 0;
    dgc_registry_release_where(k->c, is_entry, k->b);
    k->b = NULL;
}
