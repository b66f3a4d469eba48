/* DGC_TRANSPORT=reduce: bytes per rank that stop growing with the number
 * of ranks. The index range is split into nranks regions, one owned by each
 * rank (policy.h, dgc_policy_bounds_*):
 *   1. each rank sends each owner, in one all-to-all of fixed-size compact
 *      payloads, at most cap of its selected pairs in the owner's region
 *      (the largest; the rest stay in its residual, uncommitted); the
 *      payloads travel without their headers, which the owner rebuilds from
 *      what the headers' round agreed (a header per peer is most of what
 *      grows with the number of ranks);
 *   2. each owner sums what it received in rank order (fp32) and selects the
 *      keep largest sums;
 *   3. one all-gather of the owners' selections (32-bit values: the sums
 *      travel exactly) gives every rank the same output;
 *   4. each rank commits only the pairs it sent whose index was selected;
 *      the others go back into its residual as they were (invariant 2).
 * After a call every rank balances the boundaries for the next one on this
 * call's global selection, which all hold alike; the headers say whether
 * every rank has them (DGC_WIRE_BOUNDS), else all split evenly.
 *
 * A fault only its owner sees (a received payload that fails its checks)
 * must not leave the others waiting: the owner still takes part in the
 * all-gather, with a selection whose header carries DGC_WIRE_FAILED, which
 * every rank's decode rejects, so that all fail the call alike. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dgcshim/compact_rules.h"
#include "dgcshim/wire.h"
#include "dgcshim/wire_compact.h"
#include "core/log.h"
#include "engine/topk.h"
#include "internal.h"

static size_t up8(size_t x) { return (x + 7) & ~(size_t)7; }

/* The scratch's areas (dgc_mpi_reduce_scratch). */
typedef struct {
    char *send, *recv; /* nranks headerless payloads each (rp->body bytes; send has a header's slack) */
    char *one;         /* one received payload with its header rebuilt (rp->send.bytes) */
    char *plain;       /* one plain payload of cap slots: a region's pairs, a received payload, a selection */
    uint32_t *cand;    /* the owner's candidates: every index received, then the distinct ones */
    float *mag;        /* their |sums| */
    unsigned char *keep; /* per selected pair of this rank: 1 when sent, then when committed */
    uint32_t *sel;     /* the global selection's indices, sorted */
    char *pick;        /* this owner's selection, plain (keep slots) */
} areas;

static size_t carve(areas *a, char *base, const dgc_region_plan *rp, int nranks, uint64_t k) {
    const size_t n = (size_t)nranks, plain = dgc_wire_bytes(rp->cap);
    const size_t sizes[] = {n * rp->body + sizeof(dgc_wire_header), n * rp->body, rp->send.bytes, plain,
                            n * rp->cap * 4, n * rp->cap * 4, (size_t)k, n * rp->keep * 4, dgc_wire_bytes(rp->keep)};
    char **at[] = {&a->send, &a->recv, &a->one, &a->plain, (char **)&a->cand, (char **)&a->mag,
                   (char **)&a->keep, (char **)&a->sel, &a->pick};
    size_t off = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        if (base) *at[i] = base + off;
        off += up8(sizes[i]);
    }
    return off;
}

size_t dgc_mpi_reduce_scratch(const dgc_region_plan *rp, int nranks, uint64_t k) {
    areas a;
    return carve(&a, NULL, rp, nranks, k);
}

/* The real pairs of a compact payload: its count word. */
static uint64_t compact_count(const char *compact) {
    uint64_t w;
    memcpy(&w, compact + DGC_CX_HEADER_WORDS * sizeof w, sizeof w);
    return w & DGC_CX_COUNT_MASK;
}

/* A plain payload of slots pairs: header, the m pairs given, padding. */
static void plain_of(char *plain, uint64_t step, uint64_t n, uint64_t slots, const uint32_t *idx, const float *val,
                     uint64_t m) {
    dgc_wire_header h = {DGC_WIRE_MAGIC, 0, step, n, slots};
    memcpy(plain, &h, sizeof h);
    uint32_t *pi = dgc_wire_indices(plain);
    float *pv = dgc_wire_values(plain, slots);
    if (m > 0) { /* the failure paths pass no pairs, and memcpy wants a source even for 0 bytes */
        memcpy(pi, idx, (size_t)m * sizeof *idx);
        memcpy(pv, val, (size_t)m * sizeof *val);
    }
    memset(pi + m, 0, (size_t)(slots - m) * sizeof *pi);
    memset(pv + m, 0, (size_t)(slots - m) * sizeof *pv);
}

/* Marks in keep[lo, hi) the at most cap pairs with the largest |val| (ties:
 * the lower index), in place of all of them when they do not fit. */
static void mark_largest(const float *val, uint64_t lo, uint64_t hi, uint64_t cap, unsigned char *keep) {
    const uint64_t m = hi - lo;
    if (m <= cap) {
        memset(keep + lo, 1, (size_t)m);
        return;
    }
    memset(keep + lo, 0, (size_t)m);
    if (cap == 0) return;
    size_t above;
    const float t = dgc_topk_kth_largest_abs(val + lo, (size_t)m, (size_t)cap - 1, &above);
    uint64_t ties = cap - above;
    for (uint64_t j = lo; j < hi; j++) keep[j] = (unsigned char)dgc_topk_keeps(val[j] < 0 ? -val[j] : val[j], t, &ties);
}

/* Encodes the plain payload a->plain as region r's message: the whole
 * payload at r's place, then its body moved over the header (the area's
 * slack takes the last one's overhang). */
static int encode_body(const dgc_region_plan *rp, int r, areas *a) {
    char *at = a->send + (size_t)r * rp->body;
    if (dgc_compact_encode(a->plain, &rp->send, at) != 0) return -1;
    memmove(at, at + sizeof(dgc_wire_header), (size_t)rp->body);
    return 0;
}

/* Step 1: this rank's pairs, region by region, encoded into a->send. */
static void split(const dgc_buffer *b, const dgc_step_params *p, const dgc_region_plan *rp, const uint32_t *bounds,
                  int nranks, areas *a) {
    const uint32_t *idx = dgc_wire_indices(b->payload);
    const float *val = dgc_wire_values(b->payload, p->k);
    const uint64_t m = dgc_last_selected(b->state);
    uint32_t *ri = a->cand; /* scratch for one region's pairs */
    float *rv = a->mag;
    uint64_t j = 0;
    for (int r = 0; r < nranks; r++) {
        const uint64_t lo = j;
        while (j < m && idx[j] < bounds[r + 1]) j++;
        mark_largest(val, lo, j, rp->cap, a->keep);
        uint64_t c = 0;
        for (uint64_t i = lo; i < j; i++)
            if (a->keep[i]) ri[c] = idx[i], rv[c] = val[i], c++;
        plain_of(a->plain, p->step, p->n, rp->cap, ri, rv, c);
        if (encode_body(rp, r, a) != 0) {
            /* Cannot happen (the engine's pairs are sorted and on their
             * grid); were it to, the region's pairs stay behind, whole. */
            DGC_ERROR("a region's pairs of a %llu-element buffer could not be encoded (a bug): kept in the "
                      "residual", (unsigned long long)p->n);
            memset(a->keep + lo, 0, (size_t)(j - lo));
            plain_of(a->plain, p->step, p->n, rp->cap, ri, rv, 0);
            encode_body(rp, r, a);
        }
    }
    memset(a->keep + j, 0, (size_t)(m - j)); /* none: the last bound is n */
}

static int cmp_u32(const void *x, const void *y) {
    const uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;
    return (a > b) - (a < b);
}

/* Step 2: the received pairs summed into work in rank order, checked to lie
 * in this owner's region [lo, hi); their distinct indices into a->cand.
 * Returns the number of candidates, or -1 with err. */
static int64_t owner_sum(const dgc_step_params *p, const dgc_region_plan *rp, int nranks, uint32_t lo, uint32_t hi,
                         areas *a, float *work, char *err, size_t errlen) {
    const dgc_wire_header h = {DGC_WIRE_MAGIC, 0, p->step, p->n, rp->cap};
    memcpy(a->one, &h, sizeof h);
    uint64_t m = 0;
    for (int r = 0; r < nranks; r++) {
        char *pl = a->plain;
        memcpy(a->one + sizeof h, a->recv + (size_t)r * rp->body, (size_t)rp->body);
        if (dgc_compact_expand(a->one, &rp->send, r, pl, err, errlen)) return -1;
        const uint64_t c = compact_count(a->one);
        const uint32_t *idx = dgc_wire_indices(pl);
        const float *val = dgc_wire_values(pl, rp->cap);
        for (uint64_t j = 0; j < c; j++) {
            if (idx[j] < lo || idx[j] >= hi) {
                snprintf(err, errlen, "rank %d sent index %u to the owner of [%u, %u)", r, idx[j], lo, hi);
                return -1;
            }
            work[idx[j]] += val[j];
            a->cand[m++] = idx[j];
        }
    }
    qsort(a->cand, (size_t)m, sizeof *a->cand, cmp_u32);
    uint64_t d = 0;
    for (uint64_t j = 0; j < m; j++)
        if (d == 0 || a->cand[j] != a->cand[d - 1]) a->cand[d++] = a->cand[j];
    return (int64_t)d;
}

/* Step 2, continued: the keep largest non-zero |sums| of the candidates
 * (ties: the lower index) into the plain selection a->pick, in index
 * order; work is zero again after. A zero sum is never selected: its pairs
 * stay in their senders' residuals. */
static void owner_select(const dgc_step_params *p, const dgc_region_plan *rp, uint64_t ncand, areas *a, float *work) {
    uint64_t nz = 0;
    for (uint64_t j = 0; j < ncand; j++)
        if (work[a->cand[j]] != 0.0f) a->cand[nz++] = a->cand[j];
    float t = 0.0f;
    uint64_t ties = 0;
    if (nz > rp->keep) {
        for (uint64_t j = 0; j < nz; j++) a->mag[j] = work[a->cand[j]];
        size_t above;
        t = dgc_topk_kth_largest_abs(a->mag, (size_t)nz, (size_t)rp->keep - 1, &above);
        ties = rp->keep - above;
    }
    uint32_t *pi = (uint32_t *)a->mag; /* the selection's pairs, built in place of the magnitudes */
    float *pv = a->mag + rp->keep;
    uint64_t c = 0;
    for (uint64_t j = 0; j < nz; j++) {
        const float s = work[a->cand[j]];
        if (nz <= rp->keep || dgc_topk_keeps(s < 0 ? -s : s, t, &ties)) pi[c] = a->cand[j], pv[c] = s, c++;
    }
    for (uint64_t j = 0; j < ncand; j++) work[a->cand[j]] = 0.0f;
    plain_of(a->pick, p->step, p->n, rp->keep, pi, pv, c);
}

/* Step 4: the global selection's indices (sorted: owners in region order),
 * each owner's checked to lie in its region; keep narrowed to the pairs
 * sent and selected. Returns the selection's size, or -1 with err. */
static int64_t selected(const dgc_buffer *b, const dgc_region_plan *rp,
                        const uint32_t *bounds, int nranks, areas *a, char *err, size_t errlen) {
    const char *got = (const char *)b->wire + rp->pick.bytes;
    uint64_t m = 0;
    for (int r = 0; r < nranks; r++) {
        const char *c = got + (size_t)r * rp->pick.bytes;
        if (dgc_compact_expand(c, &rp->pick, r, a->plain, err, errlen)) return -1;
        const uint64_t cnt = compact_count(c);
        const uint32_t *idx = dgc_wire_indices(a->plain);
        for (uint64_t j = 0; j < cnt; j++) {
            if (idx[j] < bounds[r] || idx[j] >= bounds[r + 1]) {
                snprintf(err, errlen, "rank %d selected index %u outside its region [%u, %u)", r, idx[j], bounds[r],
                         bounds[r + 1]);
                return -1;
            }
            a->sel[m++] = idx[j];
        }
    }
    const uint32_t *mine = dgc_wire_indices(b->payload);
    const uint64_t own = dgc_last_selected(b->state);
    uint64_t s = 0;
    for (uint64_t j = 0; j < own; j++) {
        while (s < m && a->sel[s] < mine[j]) s++;
        a->keep[j] = a->keep[j] && s < m && a->sel[s] == mine[j];
    }
    return (int64_t)m;
}

int dgc_mpi_reduce(dgc_buffer *b, float *work, const dgc_step_params *p, const dgc_region_plan *rp, int balanced,
                   int me, MPI_Comm comm, const unsigned char **keep, char *err, size_t errlen) {
    const int nranks = p->nranks;
    areas a;
    carve(&a, b->scratch, rp, nranks, p->k);
    *keep = a.keep;
    uint32_t *bounds = b->bounds;
    if (!balanced || b->bounds_step != p->step) dgc_policy_bounds_equal(p->n, nranks, bounds);
    split(b, p, rp, bounds, nranks, &a);
    const int send_words = (int)(rp->body / 8), pick_words = (int)(rp->pick.bytes / 8);
    int rc = PMPI_Alltoall(a.send, send_words, MPI_UINT64_T, a.recv, send_words, MPI_UINT64_T, comm);
    if (rc != MPI_SUCCESS) return rc;
    char own_err[256] = "";
    int64_t ncand = owner_sum(p, rp, nranks, bounds[me], bounds[me + 1], &a, work, own_err, sizeof own_err);
    if (ncand >= 0) {
        owner_select(p, rp, (uint64_t)ncand, &a, work);
    } else { /* said here; every rank fails the call on this selection's flag */
        DGC_ERROR("%s", own_err);
        memset(work + bounds[me], 0, (size_t)(bounds[me + 1] - bounds[me]) * sizeof *work);
        plain_of(a.pick, p->step, p->n, rp->keep, NULL, NULL, 0);
    }
    if (dgc_compact_encode(a.pick, &rp->pick, b->wire) != 0 && ncand >= 0) {
        DGC_ERROR("the selection of a %llu-element buffer's region could not be encoded (a non-finite sum?)",
                  (unsigned long long)p->n);
        ncand = -1;
        plain_of(a.pick, p->step, p->n, rp->keep, NULL, NULL, 0);
        dgc_compact_encode(a.pick, &rp->pick, b->wire);
    }
    if (ncand < 0) dgc_wire_header_of(b->wire)->flags = DGC_WIRE_FAILED;
    char *got = (char *)b->wire + rp->pick.bytes;
    rc = PMPI_Allgather(b->wire, pick_words, MPI_UINT64_T, got, pick_words, MPI_UINT64_T, comm);
    if (rc != MPI_SUCCESS) return rc;
    if (dgc_compact_decode(got, nranks, p->step, &rp->pick, work, err, errlen) != DGC_DECODE_OK)
        return DGC_MPI_BAD_PAYLOAD;
    int64_t m = selected(b, rp, bounds, nranks, &a, err, errlen);
    if (m < 0) {
        memset(work, 0, (size_t)p->n * sizeof *work);
        return DGC_MPI_BAD_PAYLOAD;
    }
    dgc_policy_bounds_balanced(p->n, nranks, a.sel, (uint64_t)m, bounds);
    b->bounds_step = p->step + 1;
    return MPI_SUCCESS;
}
