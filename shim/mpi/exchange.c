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

#include "dgcshim/policy.h"
#include "dgcshim/wire.h"
#include "dgcshim/wire_compact.h"
#include "core/log.h"
#include "core/stats_file.h"
#include "internal.h"

#define HEADER_WORDS ((int)(sizeof(dgc_wire_header) / 8))

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int compensating(const dgc_step_params *p, const dgc_config *cfg);
static uint64_t kept_age(const dgc_buffer *b, const dgc_step_params *p, const dgc_config *cfg);

/* A call's payloads: the engine writes the plain layout (wire.h: 8 bytes a
 * pair); the sparse all-gather carries them in the compact encoding
 * (wire_compact.h: Elias-Fano indices, 16- or 32-bit values), encoded after
 * the compression and summed as they are, checked, after the gather
 * (dgc_compact_add). */
typedef struct {
    size_t bytes; /* one payload on the wire: compact */
    size_t plain; /* one payload in memory */
    dgc_compact_layout code;
    int whole;    /* it fits the reserve: one all-gather carries everything */
    int dense;    /* the pairs travel by the dense transport (after the headers) */
    size_t share; /* what the dense (or reduce) transport sends to each other rank, on average */
    int reduce;   /* the pairs travel by the reduce transport (after the headers: reduce.c) */
    const dgc_region_plan *rp; /* the plan's regions (reduce) */
} layout;

/* The gathered buffer's size, in plain payloads of this call: none (the
 * sparse transport sums the compact payloads where they were received),
 * except room for the dense sum when compensation starts keeping it (the
 * first dense-transport step after sparse ones): payloads are 8-byte
 * multiples, so count*4 rounds up to whole ones. */
static int gathered_payloads(const dgc_buffer *b, const dgc_step_params *p, const layout *l, const dgc_config *cfg) {
    if (!l->dense || !compensating(p, cfg) || b->prev_dense) return 0;
    return (int)(((size_t)b->count * sizeof(float) + l->plain - 1) / l->plain);
}

/* The compact form of this rank's payload, and room for every rank's:
 * sparse transport only. */
static int encode(dgc_buffer *b, const dgc_step_params *p, const layout *l) {
    const size_t ranks = (size_t)p->nranks + 1;
    const size_t wire = l->reduce ? l->rp->pick.bytes * ranks : l->dense ? 0 : l->bytes * ranks;
    if (dgc_registry_reserve_wire(b, wire) ||
        (l->reduce && dgc_registry_reserve_scratch(b, dgc_mpi_reduce_scratch(l->rp, p->nranks, p->k), p->nranks))) {
        DGC_ERROR("no memory for the %zu-byte wire buffers of a %llu-element buffer", wire,
                  (unsigned long long)b->count);
        return -1;
    }
    if (l->reduce) { /* the regions' payloads are made after the headers' round, which settles the bounds */
        if (b->bounds_step == p->step) dgc_wire_header_of(b->payload)->flags |= DGC_WIRE_BOUNDS;
        return 0;
    }
    if (l->dense || dgc_compact_encode(b->payload, &l->code, b->wire) == 0) return 0;
    DGC_ERROR("the engine's payload for a %llu-element buffer could not be encoded (unsorted pairs or values not "
              "rounded for the wire): a bug",
              (unsigned long long)b->count);
    return -1;
}

/* This rank's part before any exchange: compress (state), or nothing. Turns
 * local into DGC_PART_FAILED when memory runs short. */

static int prepare(dgc_buffer *b, int local, const float *g, float *work, const dgc_step_params *p, const layout *l,
                   const dgc_config *cfg) {
    if (local != DGC_PART_STATE) return local;
    size_t bytes = l->plain;
    int gathered = gathered_payloads(b, p, l, cfg);
    if (dgc_registry_reserve(b, bytes, gathered)) {
        DGC_ERROR("no memory for the %zu-byte exchange buffers of a %llu-element buffer",
                  bytes * (1 + (size_t)gathered), (unsigned long long)b->count);
        return DGC_PART_FAILED;
    }
    int rc = dgc_compress_zeroing(b->state, g, p, b->payload, work);
    dgc_registry_account(b);
    if (rc < 0) {
        DGC_ERROR("no memory for the selection scratch of a %llu-element buffer", (unsigned long long)b->count);
        return DGC_PART_FAILED;
    }
    dgc_wire_header_of(b->payload)->flags |= DGC_WIRE_AGE_BITS(kept_age(b, p, cfg));
    if (encode(b, p, l)) {
        dgc_discard(b->state);
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
    if (local == DGC_PART_STATE) send = l->whole ? b->wire : b->payload; /* the same header either way */
    else dgc_wire_flag_only(send, local == DGC_PART_FAILED ? DGC_WIRE_FAILED : DGC_WIRE_DENSE, p->step, p->n, p->k);
    if (local == DGC_PART_STATE && l->whole) recv = (char *)b->wire + l->bytes;
    *base = recv;
    *stride = (size_t)words * 8;
    return PMPI_Allgather(send, words, MPI_UINT64_T, recv, words, MPI_UINT64_T, comm);
}

static void fill_nan(float *out, uint64_t n) {
    for (uint64_t i = 0; i < n; i++) out[i] = __builtin_nanf("");
}

/* Makes the step's update the state, counting a saturated one
 * (update_rules.h: finite gradients past fp32's range). */
static void commit(dgc_buffer *b, const dgc_step_params *p) {
    dgc_commit(b->state, p);
    if (dgc_last_saturated(b->state)) dgc_registry_count_saturated(1, b->count);
}

/* Some rank is over its budget: its gradient and the others' selected pairs
 * are summed densely. The pairs sent are committed as usual (their mass
 * reaches the output); the compensation restarts, having no gathered pairs
 * to keep. */
static int dense_path(dgc_comm *c, dgc_buffer *b, int local, const float *g, float *work, uint64_t n,
                      const dgc_step_params *p, MPI_Comm comm) {
    if (local == DGC_PART_STATE) {
        dgc_wire_add_own(b->payload, p->k, work); /* work was zeroed by the compression */
        commit(b, p);
        b->prev_code.k = 0;
        b->prev_dense = 0;
    } else if (work != g) {
        memcpy(work, g, (size_t)n * sizeof *work);
    }
    dgc_registry_count_over_budget();
    return dgc_mpi_dense_sum(work, n, c, comm);
}

/* Momentum compensation: an unmodified SGD with momentum m computes
 * buf = m*buf + d; returning d = S_t - m*S_{t-1} (S: the summed sparse update)
 * makes buf == S_t, so the framework applies exactly the DGC update. Only a
 * finite step becomes the next S_{t-1}: after a skipped one, the optimizer's
 * buffer still holds the last finite S. S_{t-1} is kept as the previous
 * step's received compact payloads, or, after a dense-transport step, as the
 * dense sum itself (smaller then: the transport went dense because N
 * payloads outweigh the dense vector).
 *
 * Each rank keeps S with its own state of the buffer, and a buffer can get
 * a new state on one rank alone (it moved there) or find an older one (it
 * moved back). So every header reports the age of the S its sender keeps
 * (kept_age), and m S is subtracted only when all report the same age
 * (dgc_wire_summary.age): then all hold the same step's S. Otherwise no rank
 * subtracts (the compensation restarts, on every rank alike), and each keeps
 * this step's S. */
static int compensating(const dgc_step_params *p, const dgc_config *cfg) {
    return cfg->compensate && p->momentum != 0.0f;
}

/* This rank's age of its kept S for this call (wire.h), 0 for none. */
static uint64_t kept_age(const dgc_buffer *b, const dgc_step_params *p, const dgc_config *cfg) {
    int kept = b->prev_dense || (b->prev_code.k && b->prev_nranks == p->nranks);
    return compensating(p, cfg) && kept && p->step > b->prev_step ? p->step - b->prev_step : 0;
}

/* A rank that keeps an S the headers did not agree on drops it: at debug
 * level, since a buffer that moves on some rank does so every step. */
static void restart_note(const dgc_buffer *b, const dgc_step_params *p, const dgc_config *cfg) {
    if (kept_age(b, p, cfg))
        DGC_DEBUG("step %llu on a %llu-element buffer: the ranks do not all keep the same step's sum, so the "
                  "momentum compensation restarts", (unsigned long long)p->step, (unsigned long long)b->count);
}

/* out -= m * S_{t-1}, whichever way S_{t-1} was kept; every rank holds the
 * same S_{t-1} bytes (the headers agreed on its age) and subtracts in the
 * same order. */
static void subtract_previous(dgc_buffer *b, float *out, const dgc_step_params *p) {
    char err[256];
    if (b->prev_dense) {
        const float *prev = b->prev, scale = -p->momentum;
        for (uint64_t i = 0; i < b->count; i++) out[i] += scale * prev[i];
        return;
    }
    const dgc_compact_layout *code = &b->prev_code;
    if (dgc_compact_add((const char *)b->prev + code->bytes, code->bytes, p->nranks, code, -p->momentum, out, err,
                        sizeof err)) /* they were summed once already: cannot happen */
        DGC_ERROR("kept payloads of a %llu-element buffer no longer pass their checks (a bug): %s",
                  (unsigned long long)b->count, err);
}

/* agreed: every header reported the same age of its kept S (nonzero).
 * code: the layout of the payloads in b->wire that sum to S_t. */
static void compensate(dgc_buffer *b, float *out, const dgc_step_params *p, const dgc_compact_layout *code,
                       const dgc_config *cfg, uint32_t agreed) {
    if (!compensating(p, cfg)) return;
    if (agreed) subtract_previous(b, out, p);
    else restart_note(b, p, cfg);
    dgc_registry_keep_wire(b, code, p->step, p->nranks);
}

/* The same after a dense-transport step: out holds S_t, which becomes the
 * kept S. When the previous one was dense too, one pass subtracts it and
 * keeps the new one in its place; else S_t is copied into the gathered
 * buffer (prepare sized it so: nothing can fail here, on one rank alone),
 * the kept pairs subtracted, and the two swapped. */
static void compensate_dense(dgc_buffer *b, float *out, const dgc_step_params *p, const dgc_config *cfg,
                             uint32_t agreed) {
    if (!compensating(p, cfg)) return;
    if (!agreed) restart_note(b, p, cfg);
    if (b->prev_dense) {
        float *prev = b->prev;
        const float scale = -p->momentum;
        for (uint64_t i = 0; i < b->count; i++) {
            float s = out[i];
            if (agreed) out[i] = s + scale * prev[i];
            prev[i] = s;
        }
        b->prev_step = p->step;
        return;
    }
    memcpy(b->gathered, out, (size_t)b->count * sizeof *out);
    if (agreed) subtract_previous(b, out, p);
    dgc_registry_keep_dense(b, p->step, p->nranks);
}

static void count_call(dgc_buffer *b, const layout *l, uint64_t k, double seconds) {
    b->stats.engine_seconds += seconds;
    b->stats.calls++;
    b->stats.dense_bytes += b->count * sizeof(float);
    /* What this rank sent to each other rank: its payload, or by the dense
     * transport its total over N-1 (so both transports' bytes compare). */
    size_t sent = l->dense || l->reduce ? l->share : l->bytes;
    b->stats.wire_bytes += sent;
    b->stats.last_wire_bytes = sent;
    b->stats.dense_transport += l->dense != 0;
    b->stats.reduce_transport += l->reduce != 0;
    b->stats.last_k = k;
    b->stats.last_transport = l->reduce ? DGC_TRANSPORT_REDUCE : l->dense ? DGC_TRANSPORT_DENSE : DGC_TRANSPORT_SPARSE;
    dgc_stats_file_tick();
}

/* The dense transport: this rank's pairs scattered into its (zeroed)
 * output, summed densely; then committed and compensated as a sparse step
 * would be. The same pairs, residual and masking as the all-gather; only the
 * order of the additions differs, and it is the same on every rank. */
static int dense_transport_path(dgc_comm *c, dgc_buffer *b, float *work, const dgc_step_params *p, const layout *l,
                                MPI_Comm comm, const dgc_config *cfg, uint32_t agreed, double engine_seconds) {
    double t0 = now();
    dgc_wire_add_own(b->payload, p->k, work);
    double t1 = now();
    int rc = dgc_mpi_dense_sum(work, b->count, c, comm);
    if (rc != MPI_SUCCESS) {
        dgc_discard(b->state);
        return rc;
    }
    double t2 = now();
    commit(b, p);
    compensate_dense(b, work, p, cfg, agreed);
    count_call(b, l, p->k, engine_seconds + (t1 - t0) + (now() - t2));
    return MPI_SUCCESS;
}

/* The reduce transport (reduce.c): every rank took part with state. Only
 * the pairs sent and selected are committed; the rest stay in the residual. */
static int reduce_path(const dgc_comm *c, dgc_buffer *b, float *work, const dgc_step_params *p, const layout *l, MPI_Comm comm,
                       const dgc_config *cfg, uint32_t agreed, int balanced, double engine_seconds) {
    const unsigned char *keep = NULL;
    char err[256];
    int rc = dgc_mpi_reduce(b, work, p, l->rp, balanced, c->rank, comm, &keep, err, sizeof err);
    if (rc == MPI_SUCCESS) {
        dgc_commit_only(b->state, p, keep);
        if (dgc_last_saturated(b->state)) dgc_registry_count_saturated(1, b->count);
        compensate(b, work, p, &l->rp->pick, cfg, agreed);
    } else {
        dgc_discard(b->state);
    }
    count_call(b, l, p->k, engine_seconds);
    if (rc == DGC_MPI_BAD_PAYLOAD) {
        dgc_registry_count_failed(DGC_FAIL_BAD_PAYLOAD, 1);
        DGC_ERROR("%s", err);
        return dgc_mpi_fail(comm, MPI_ERR_OTHER);
    }
    return rc;
}

/* All ranks took part with state: the payloads if only the headers came yet,
 * then sum and commit. */
static int sparse_path(dgc_buffer *b, float *work, const dgc_step_params *p, const layout *l, MPI_Comm comm,
                       const dgc_config *cfg, uint32_t agreed, double engine_seconds) {
    char *wire = b->wire, *received = wire + l->bytes;
    if (!l->whole) {
        int words = (int)(l->bytes / 8);
        int rc = PMPI_Allgather(wire, words, MPI_UINT64_T, received, words, MPI_UINT64_T, comm);
        if (rc != MPI_SUCCESS) {
            dgc_discard(b->state);
            return rc;
        }
    }
    double t0 = now();
    char err[256];
    /* Checked as the first round's headers were, then summed (work was
     * zeroed by the compression; a bad payload leaves it zero again: what the
     * caller hands back with the error). */
    dgc_decode_result r = dgc_compact_decode(received, p->nranks, p->step, &l->code, work, err, sizeof err);
    if (r == DGC_DECODE_OK) {
        commit(b, p);
        compensate(b, work, p, &l->code, cfg, agreed);
    } else {
        dgc_discard(b->state);
    }
    count_call(b, l, p->k, engine_seconds + now() - t0);
    if (r == DGC_DECODE_BAD) {
        dgc_registry_count_failed(DGC_FAIL_BAD_PAYLOAD, 1);
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
        count_call(b, l, p->k, engine_seconds);
        b->stats.nonfinite++;
    }
    abandon(b, local);
    DGC_INFO("step %llu on a %llu-element buffer held Inf/NaN on some rank: output set to NaN, "
             "residual and momentum kept as they were", (unsigned long long)p->step, (unsigned long long)p->n);
    return MPI_SUCCESS;
}

int dgc_mpi_exchange(dgc_comm *c, dgc_buffer *b, int local, const float *g, float *work, const dgc_plan *plan,
                     MPI_Comm comm, const dgc_config *cfg) {
    const dgc_step_params *p = &plan->p;
    const dgc_transport_bytes tb = plan->bytes;
    layout l = {.plain = dgc_wire_bytes(p->k), .code = plan->code, .rp = &plan->regions};
    l.bytes = l.code.bytes;
    l.dense = plan->transport == DGC_TRANSPORT_DENSE;
    l.share = p->nranks > 1 ? (size_t)((tb.dense + (uint64_t)p->nranks - 2) / ((uint64_t)p->nranks - 1)) : 0;
    l.reduce = plan->transport == DGC_TRANSPORT_REDUCE;
    if (l.reduce) l.share = (size_t)(sizeof(dgc_wire_header) + l.rp->body + l.rp->pick.bytes);
    /* The dense and reduce transports always send the headers first. */
    l.whole = !l.dense && !l.reduce && l.bytes <= c->head;
    DGC_DEBUG("step %llu, %llu elements, k %llu: %s transport (bytes a rank sends: sparse all-gather %llu, dense %llu, "
              "reduce %llu)",
              (unsigned long long)p->step, (unsigned long long)p->n, (unsigned long long)p->k,
              dgc_transport_name(plan->transport), (unsigned long long)tb.sparse,
              (unsigned long long)tb.dense, (unsigned long long)tb.reduce);
    double t0 = now();
    local = prepare(b, local, g, work, p, &l, cfg);
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
        dgc_registry_count_failed(DGC_FAIL_BAD_PAYLOAD, 1);
        DGC_ERROR("%s", err);
        return dgc_mpi_fail(comm, MPI_ERR_OTHER);
    }
    if (sum.failed) { /* the caller gives the step back, as for every failed call */
        abandon(b, local);
        dgc_registry_count_failed(local == DGC_PART_FAILED ? DGC_FAIL_MEMORY : DGC_FAIL_PEER, 1);
        report_failed(&sum, p->n);
        return dgc_mpi_fail(comm, MPI_ERR_NO_MEM);
    }
    if (sum.nonfinite) return skip_nonfinite(b, local, work, p, &l, engine_seconds);
    if (sum.dense) {
        rc = dense_path(c, b, local, g, work, p->n, p, comm);
        if (b) count_call(b, &l, p->k, engine_seconds);
        return rc;
    }
    if (l.dense) return dense_transport_path(c, b, work, p, &l, comm, cfg, sum.age, engine_seconds);
    if (l.reduce) return reduce_path(c, b, work, p, &l, comm, cfg, sum.age, sum.bounds == p->nranks, engine_seconds);
    return sparse_path(b, work, p, &l, comm, cfg, sum.age, engine_seconds);
}
