/* One compressed call's exchange: compress, all-gather, decode, commit.
 *
 * A rank never leaves the collective on a decision of its own. When it has
 * no memory for its state or scratch (DGC_PART_FAILED), or may not create a
 * state under its DGC_MAX_STATE_MB budget (DGC_PART_DENSE), it still takes
 * part, with a payload whose header says so, sent from and received into
 * memory its communicator reserved when it was attached. A payload that fits
 * that reserve goes in one all-gather; a larger one is preceded by an
 * all-gather of the headers alone (32 bytes a rank), so that a rank that
 * could not allocate its receive buffer still learns what the others could
 * do. After the headers every rank takes the same branch:
 *   - some rank failed: every rank fails the call with MPI_ERR_NO_MEM, naming
 *     it, and nothing is committed anywhere (the step counter goes back too);
 *   - some rank is over budget: the call is summed densely (that rank's
 *     gradient, the others' selected pairs) by MPI_Allreduce;
 *   - otherwise the payloads follow, if they have not already, and the call
 *     completes as DGC.
 * The headers' round costs one small all-gather's latency, on payloads large
 * enough that it is a small part of their time. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dgcshim/wire.h"
#include "log.h"
#include "mpi_internal.h"

#define HEADER_WORDS ((int)(sizeof(dgc_wire_header) / 8))

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct {
    size_t bytes; /* one payload */
    int whole;    /* it fits the reserve: one all-gather carries everything */
} layout;

/* This rank's part before any exchange: compress (state), or nothing. Turns
 * local into DGC_PART_FAILED when memory runs short. */
static int prepare(dgc_buffer *b, int local, const float *g, float *work, const dgc_step_params *p) {
    if (local != DGC_PART_STATE) return local;
    size_t bytes = dgc_wire_bytes(p->k);
    if (dgc_registry_reserve(b, bytes, p->nranks)) {
        DGC_ERROR("no memory for the %zu-byte exchange buffers of a %llu-element buffer", bytes * (p->nranks + 1),
                  (unsigned long long)b->count);
        return DGC_PART_FAILED;
    }
    int rc = dgc_compress_zeroing(b->state, g, p, b->payload, work);
    dgc_registry_account(b);
    if (rc < 0) {
        DGC_ERROR("no memory for the selection scratch of a %llu-element buffer", (unsigned long long)b->count);
        return DGC_PART_FAILED;
    }
    return DGC_PART_STATE;
}

/* The first all-gather: whole payloads when they fit the reserve, else the
 * headers alone. A rank without state sends a header that says why, from the
 * reserve, and receives into it. Returns the MPI result; *base and *stride
 * locate the received headers. */
static int exchange_first(dgc_comm *c, dgc_buffer *b, int local, const dgc_step_params *p, const layout *l,
                          MPI_Comm comm, const char **base, size_t *stride) {
    int words = l->whole ? (int)(l->bytes / 8) : HEADER_WORDS;
    char *send = c->reserve, *recv = send + c->head;
    if (local == DGC_PART_STATE) send = b->payload;
    else dgc_wire_flag_only(send, local == DGC_PART_FAILED ? DGC_WIRE_FAILED : DGC_WIRE_DENSE, p->step, p->n, p->k);
    if (local == DGC_PART_STATE && l->whole) recv = b->gathered;
    *base = recv;
    *stride = (size_t)words * 8;
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

/* All ranks took part with state: the payloads if only the headers came yet,
 * then decode and commit. */
static int sparse_path(dgc_buffer *b, float *work, const dgc_step_params *p, const layout *l, MPI_Comm comm,
                       const dgc_config *cfg, double engine_seconds) {
    if (!l->whole) {
        int words = (int)(l->bytes / 8);
        int rc = PMPI_Allgather(b->payload, words, MPI_UINT64_T, b->gathered, words, MPI_UINT64_T, comm);
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

/* Drops this rank's uncommitted update. */
static void abandon(dgc_buffer *b, int local) {
    if (local == DGC_PART_STATE) dgc_discard(b->state);
}

/* Some rank's gradient held Inf or NaN: a skipped step, no state changes
 * anywhere, the output all NaN so that the framework sees it. */
static int skip_nonfinite(dgc_buffer *b, int local, float *work, const dgc_step_params *p, const layout *l,
                          double engine_seconds) {
    fill_nan(work, p->n);
    if (local == DGC_PART_STATE) {
        count_call(b, l, engine_seconds);
        b->stats.nonfinite++;
    }
    abandon(b, local);
    DGC_INFO("step %llu on a %llu-element buffer held Inf/NaN on some rank: output set to NaN, "
             "residual and momentum kept as they were", (unsigned long long)p->step, (unsigned long long)p->n);
    return MPI_SUCCESS;
}

int dgc_mpi_exchange(dgc_comm *c, dgc_buffer *b, int local, const float *g, float *work, const dgc_step_params *p,
                     MPI_Comm comm, const dgc_config *cfg) {
    layout l = {dgc_wire_bytes(p->k), 0};
    l.whole = l.bytes <= c->head;
    double t0 = now();
    local = prepare(b, local, g, work, p);
    double engine_seconds = now() - t0;
    if (local != DGC_PART_STATE) b = NULL;
    const char *base;
    size_t stride;
    int rc = exchange_first(c, b, local, p, &l, comm, &base, &stride);
    if (rc != MPI_SUCCESS) { /* MPI's own error, already handed to the handler */
        abandon(b, local);
        return rc;
    }
    dgc_wire_summary sum;
    char err[256];
    if (dgc_wire_scan(base, stride, p->nranks, p->step, p->n, p->k, &sum, err, sizeof err) != DGC_DECODE_OK) {
        abandon(b, local);
        DGC_ERROR("%s", err);
        return dgc_mpi_fail(comm, MPI_ERR_OTHER);
    }
    if (sum.failed) {
        abandon(b, local);
        dgc_registry_undo_step(c, p->n);
        dgc_registry_count_failed();
        report_failed(&sum, p->n);
        return dgc_mpi_fail(comm, MPI_ERR_NO_MEM);
    }
    if (sum.nonfinite) return skip_nonfinite(b, local, work, p, &l, engine_seconds);
    if (sum.dense) {
        rc = dense_path(b, local, g, work, p->n, p, comm);
        if (b) count_call(b, &l, engine_seconds);
        return rc;
    }
    return sparse_path(b, work, p, &l, comm, cfg, engine_seconds);
}
