/* One compressed call's exchange: compress, all-gather, decode, commit.
 *
 * A rank never leaves the collective on a decision of its own. When it has
 * no memory for its state or scratch (DGC_PART_FAILED), or may not create a
 * state under its DGC_MAX_STATE_MB budget (DGC_PART_DENSE), it still takes
 * part, with a payload whose header says so. Payloads are exchanged in two
 * all-gathers when they are larger than the communicator's head size: the
 * head (every header among it) first, into memory the communicator reserved
 * when it was attached, so a rank that could not allocate its receive buffer
 * still receives it; after the head every rank knows what every other rank
 * could do, and all take the same branch:
 *   - some rank failed: every rank fails the call with MPI_ERR_NO_MEM, naming
 *     it, and nothing is committed anywhere (the step counter goes back too);
 *   - some rank is over budget: the call is summed densely (that rank's
 *     gradient, the others' selected pairs) by MPI_Allreduce;
 *   - otherwise the tails follow and the call completes as DGC.
 * A small payload fits its head whole: one all-gather, as before. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dgcshim/wire.h"
#include "log.h"
#include "mpi_internal.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The gathered layout for a split exchange: head or tail words of each
 * rank's payload land at offset rank * bytes, so gathered holds whole
 * payloads back to back, as the decoder reads them. */
static int spaced_type(size_t words, size_t bytes, MPI_Datatype *out) {
    MPI_Datatype run;
    if (PMPI_Type_contiguous((int)words, MPI_UINT64_T, &run) != MPI_SUCCESS) return -1;
    int rc = PMPI_Type_create_resized(run, 0, (MPI_Aint)bytes, out);
    PMPI_Type_free(&run);
    if (rc != MPI_SUCCESS) return -1;
    if (PMPI_Type_commit(out) != MPI_SUCCESS) {
        PMPI_Type_free(out);
        return -1;
    }
    return 0;
}

typedef struct {
    size_t bytes, head;        /* a payload, and how much of it goes first */
    MPI_Datatype head_t, tail_t; /* MPI_DATATYPE_NULL unless split and taking part with state */
} layout;

static int split(const layout *l) { return l->bytes > l->head; }

static void free_types(layout *l) {
    if (l->head_t != MPI_DATATYPE_NULL) PMPI_Type_free(&l->head_t);
    if (l->tail_t != MPI_DATATYPE_NULL) PMPI_Type_free(&l->tail_t);
}

/* This rank's part before any exchange: compress (state), or nothing. Turns
 * local into DGC_PART_FAILED when memory runs short. */
static int prepare(dgc_buffer *b, int local, const float *g, float *work, const dgc_step_params *p, layout *l) {
    if (local != DGC_PART_STATE) return local;
    if (dgc_registry_reserve(b, l->bytes, p->nranks)) {
        DGC_ERROR("no memory for the %zu-byte exchange buffers of a %llu-element buffer", l->bytes * (p->nranks + 1),
                  (unsigned long long)b->count);
        return DGC_PART_FAILED;
    }
    if (dgc_compress_zeroing(b->state, g, p, b->payload, work) < 0) {
        dgc_registry_account(b);
        DGC_ERROR("no memory for the selection scratch of a %llu-element buffer", (unsigned long long)b->count);
        return DGC_PART_FAILED;
    }
    dgc_registry_account(b);
    if (split(l) && (spaced_type(l->head / 8, l->bytes, &l->head_t) ||
                     spaced_type((l->bytes - l->head) / 8, l->bytes, &l->tail_t))) {
        dgc_discard(b->state);
        DGC_ERROR("could not create the exchange's MPI datatypes");
        return DGC_PART_FAILED;
    }
    return DGC_PART_STATE;
}

/* The first all-gather. Returns its MPI result; *base and *stride locate the
 * received headers. */
static int exchange_head(dgc_comm *c, dgc_buffer *b, int local, const dgc_step_params *p, layout *l, MPI_Comm comm,
                         const char **base, size_t *stride) {
    int words = (int)(l->head / 8);
    if (local == DGC_PART_STATE) {
        *base = b->gathered;
        *stride = l->bytes;
        return split(l) ? PMPI_Allgather(b->payload, words, MPI_UINT64_T, b->gathered, 1, l->head_t, comm)
                        : PMPI_Allgather(b->payload, words, MPI_UINT64_T, b->gathered, words, MPI_UINT64_T, comm);
    }
    char *send = c->reserve, *recv = send + c->head;
    dgc_wire_flag_only(send, local == DGC_PART_FAILED ? DGC_WIRE_FAILED : DGC_WIRE_DENSE, p->step,
                       p->n, p->k);
    *base = recv;
    *stride = l->head;
    return PMPI_Allgather(send, words, MPI_UINT64_T, recv, words, MPI_UINT64_T, comm);
}

static void fill_nan(float *out, uint64_t n) {
    for (uint64_t i = 0; i < n; i++) out[i] = __builtin_nanf("");
}

/* MPI_Allreduce counts in int: a buffer of up to 2^32 - 1 floats goes in
 * pieces. */
static int dense_sum(float *work, uint64_t n, MPI_Comm comm) {
    const uint64_t piece = (uint64_t)1 << 30;
    for (uint64_t i = 0; i < n; i += piece) {
        uint64_t len = n - i < piece ? n - i : piece;
        int rc = PMPI_Allreduce(MPI_IN_PLACE, work + i, (int)len, MPI_FLOAT, MPI_SUM, comm);
        if (rc != MPI_SUCCESS) return rc;
    }
    return MPI_SUCCESS;
}

/* Some rank is over its budget: its gradient and the others' selected pairs
 * are summed densely. The pairs sent are committed as usual (their mass
 * reaches the output); the compensation restarts, having no gathered pairs
 * to keep. */
static int dense_path(dgc_buffer *b, int local, const float *g, float *work, uint64_t n, const dgc_step_params *p,
                      MPI_Comm comm) {
    if (local == DGC_PART_STATE) {
        dgc_wire_add_own(b->payload, p->k, work); /* work was zeroed by the compression */
        dgc_commit(b->state, p);
        b->prev_k = 0;
    } else if (work != g) {
        memcpy(work, g, (size_t)n * sizeof *work);
    }
    dgc_registry_count_over_budget();
    return dense_sum(work, n, comm);
}

/* Momentum compensation: an unmodified SGD with momentum m computes
 * buf = m*buf + d; returning d = S_t - m*S_{t-1} (S: the summed sparse update)
 * makes buf == S_t, so the framework applies exactly the DGC update. Only a
 * finite step becomes the next S_{t-1}: after a skipped one, the optimizer's
 * buffer still holds the last finite S. */
static void compensate(dgc_buffer *b, float *out, const dgc_step_params *p, const dgc_config *cfg) {
    if (!cfg->compensate || p->momentum == 0.0f) return;
    if (b->prev_k && b->prev_nranks == p->nranks) dgc_wire_subtract(b->prev, p->nranks, b->prev_k, p->momentum, out);
    else if (b->prev_k)
        DGC_WARN("kept payloads of a %llu-element buffer came from %d ranks, this call has %d: compensation restarts",
                 (unsigned long long)b->count, b->prev_nranks, p->nranks);
    dgc_registry_keep_gathered(b, p->k, p->nranks);
}

static void count_call(dgc_buffer *b, const layout *l, double seconds) {
    b->stats.engine_seconds += seconds;
    b->stats.calls++;
    b->stats.dense_bytes += b->count * sizeof(float);
    b->stats.wire_bytes += l->bytes;
    b->stats.last_wire_bytes = l->bytes;
}

/* All ranks took part with state: the tails, then decode and commit. */
static int sparse_path(dgc_buffer *b, float *work, const dgc_step_params *p, layout *l, MPI_Comm comm,
                       const dgc_config *cfg, double engine_seconds) {
    if (split(l)) {
        int words = (int)((l->bytes - l->head) / 8);
        int rc = PMPI_Allgather((char *)b->payload + l->head, words, MPI_UINT64_T, (char *)b->gathered + l->head, 1,
                                l->tail_t, comm);
        if (rc != MPI_SUCCESS) {
            dgc_discard(b->state);
            return rc;
        }
    }
    double t0 = now();
    char err[256];
    dgc_decode_result r = dgc_wire_decode_zeroed(b->gathered, p->nranks, p->step, b->count, p->k, work, err, sizeof err);
    if (r == DGC_DECODE_OK) {
        dgc_commit(b->state, p);
        compensate(b, work, p, cfg);
    } else {
        dgc_discard(b->state);
    }
    count_call(b, l, engine_seconds + now() - t0);
    if (r == DGC_DECODE_BAD) {
        DGC_ERROR("%s", err);
        return dgc_mpi_fail(comm, MPI_ERR_OTHER);
    }
    return MPI_SUCCESS;
}

static void report_failed(const dgc_wire_summary *s, uint64_t n) {
    DGC_ERROR("rank %d%s could not get the memory this call needs (a %llu-element buffer): the call fails on "
              "every rank with MPI_ERR_NO_MEM and no rank's state changed",
              s->first_failed, s->failed > 1 ? " and others" : "", (unsigned long long)n);
}

int dgc_mpi_exchange(dgc_comm *c, dgc_buffer *b, int local, const float *g, float *work, const dgc_step_params *p,
                     MPI_Comm comm, const dgc_config *cfg) {
    uint64_t n = p->n;
    layout l = {dgc_wire_bytes(p->k), 0, MPI_DATATYPE_NULL, MPI_DATATYPE_NULL};
    l.head = l.bytes < c->head ? l.bytes : c->head;
    double t0 = now();
    local = prepare(b, local, g, work, p, &l);
    double engine_seconds = now() - t0;
    const char *base;
    size_t stride;
    int rc = exchange_head(c, local == DGC_PART_STATE ? b : NULL, local, p, &l, comm, &base, &stride);
    if (rc != MPI_SUCCESS) { /* MPI's own error, already handed to the handler */
        if (local == DGC_PART_STATE) dgc_discard(b->state);
        free_types(&l);
        return rc;
    }
    dgc_wire_summary sum;
    char err[256];
    if (dgc_wire_scan(base, stride, p->nranks, p->step, n, p->k, &sum, err, sizeof err) != DGC_DECODE_OK) {
        if (local == DGC_PART_STATE) dgc_discard(b->state);
        free_types(&l);
        DGC_ERROR("%s", err);
        return dgc_mpi_fail(comm, MPI_ERR_OTHER);
    }
    if (sum.failed) {
        if (local == DGC_PART_STATE) dgc_discard(b->state);
        free_types(&l);
        dgc_registry_undo_step(c, n);
        dgc_registry_count_failed();
        report_failed(&sum, n);
        return dgc_mpi_fail(comm, MPI_ERR_NO_MEM);
    }
    if (sum.nonfinite) { /* a skipped step: no state changes anywhere */
        fill_nan(work, n);
        if (local == DGC_PART_STATE) {
            dgc_discard(b->state);
            count_call(b, &l, engine_seconds);
            b->stats.nonfinite++;
        }
        free_types(&l);
        DGC_INFO("step %llu on a %llu-element buffer held Inf/NaN on some rank: output set to NaN, "
                 "residual and momentum kept as they were", (unsigned long long)p->step, (unsigned long long)n);
        return MPI_SUCCESS;
    }
    if (sum.dense) {
        free_types(&l);
        rc = dense_path(local == DGC_PART_STATE ? b : NULL, local, g, work, n, p, comm);
        if (local == DGC_PART_STATE) count_call(b, &l, engine_seconds);
        return rc;
    }
    rc = sparse_path(b, work, p, &l, comm, cfg, engine_seconds);
    free_types(&l);
    return rc;
}
