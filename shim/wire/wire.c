/* Payload layout and the decoder. The decoder is the only code that writes
 * what other ranks sent into user memory, so it validates everything first. */
#include "dgcshim/wire.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

size_t dgc_wire_bytes(uint64_t k) { return sizeof(dgc_wire_header) + (size_t)k * 8u; }

dgc_wire_header *dgc_wire_header_of(void *payload) { return (dgc_wire_header *)payload; }

uint32_t *dgc_wire_indices(void *payload) {
    return (uint32_t *)((char *)payload + sizeof(dgc_wire_header));
}

float *dgc_wire_values(void *payload, uint64_t k) {
    return (float *)((char *)payload + sizeof(dgc_wire_header) + (size_t)k * 4u);
}

static const char *payload_at(const void *gathered, int rank, uint64_t k) {
    return (const char *)gathered + (size_t)rank * dgc_wire_bytes(k);
}

#define KNOWN_FLAGS (DGC_WIRE_NONFINITE | DGC_WIRE_FAILED | DGC_WIRE_DENSE | DGC_WIRE_BOUNDS)

/* Returns 0 when the header at p is sound for (step, n, k), else writes why
 * into err. flags_ok: the flags this use accepts. */
static int check_header(const char *p, int rank, uint64_t step, uint64_t n, uint64_t k, uint32_t flags_ok,
                        dgc_wire_header *h, char *err, size_t errlen) {
    memcpy(h, p, sizeof *h);
    const uint32_t flags = h->flags & DGC_WIRE_FLAG_BITS; /* the rest is the age */
    if (h->magic != DGC_WIRE_MAGIC || (flags & ~KNOWN_FLAGS) != 0) {
        snprintf(err, errlen, "payload from rank %d is not a dgcshim payload (magic 0x%08x flags 0x%x)",
                 rank, h->magic, h->flags);
        return -1;
    }
    if ((flags & ~flags_ok) != 0 || ((flags & DGC_WIRE_FAILED) && (flags & DGC_WIRE_DENSE))) {
        snprintf(err, errlen, "payload from rank %d carries flags 0x%x where they cannot be", rank, h->flags);
        return -1;
    }
    if (h->step != step || h->n != n || h->k != k) {
        snprintf(err, errlen,
                 "payload from rank %d disagrees: step %llu n %llu k %llu, expected step %llu n %llu k %llu",
                 rank, (unsigned long long)h->step, (unsigned long long)h->n, (unsigned long long)h->k,
                 (unsigned long long)step, (unsigned long long)n, (unsigned long long)k);
        return -1;
    }
    return 0;
}

/* Returns 0 when rank's payload is sound, else writes why into err. */
static int check_payload(const char *p, int rank, uint64_t step, uint64_t n, uint64_t k, char *err,
                         size_t errlen) {
    dgc_wire_header h;
    if (check_header(p, rank, step, n, k, DGC_WIRE_NONFINITE, &h, err, errlen)) return -1;
    const uint32_t *idx = (const uint32_t *)(p + sizeof h);
    /* The largest index first, a reduction the compiler vectorises; only a
     * bad payload is walked again, for the slot to name. */
    uint32_t max = 0;
    for (uint64_t j = 0; j < k; j++) max = idx[j] > max ? idx[j] : max;
    if (k == 0 || max < n) return 0;
    uint64_t j = 0;
    while (idx[j] < n) j++;
    snprintf(err, errlen, "payload from rank %d: slot %llu holds index %u, out of range for n %llu", rank,
             (unsigned long long)j, idx[j], (unsigned long long)n);
    return -1;
}

dgc_decode_result dgc_wire_scan(const void *base, size_t stride, int nranks, uint64_t step, uint64_t n,
                                uint64_t k, dgc_wire_summary *sum, char *err, size_t errlen) {
    *sum = (dgc_wire_summary){0, -1, 0, 0, 0, 0};
    uint32_t age = 0;
    int agree = 1;
    for (int r = 0; r < nranks; r++) {
        dgc_wire_header h;
        if (check_header((const char *)base + (size_t)r * stride, r, step, n, k, KNOWN_FLAGS, &h, err, errlen))
            return DGC_DECODE_BAD;
        if (r == 0) age = DGC_WIRE_AGE(h.flags);
        agree &= DGC_WIRE_AGE(h.flags) == age;
        if (h.flags & DGC_WIRE_FAILED) {
            if (sum->first_failed < 0) sum->first_failed = r;
            sum->failed++;
        }
        sum->dense += (h.flags & DGC_WIRE_DENSE) != 0;
        sum->nonfinite += (h.flags & DGC_WIRE_NONFINITE) != 0;
        sum->bounds += (h.flags & DGC_WIRE_BOUNDS) != 0;
    }
    sum->age = agree && age < DGC_WIRE_AGE_MAX ? age : 0;
    return DGC_DECODE_OK;
}

int dgc_wire_check_headers(const void *base, size_t stride, int nranks, uint64_t step, uint64_t n, uint64_t k,
                           int *nonfinite, char *err, size_t errlen) {
    *nonfinite = 0;
    for (int r = 0; r < nranks; r++) {
        dgc_wire_header h;
        if (check_header((const char *)base + (size_t)r * stride, r, step, n, k, DGC_WIRE_NONFINITE, &h, err, errlen))
            return -1;
        *nonfinite |= (h.flags & DGC_WIRE_NONFINITE) != 0;
    }
    return 0;
}

void dgc_wire_flag_only(void *payload, uint32_t flags, uint64_t step, uint64_t n, uint64_t k) {
    dgc_wire_header h = {DGC_WIRE_MAGIC, flags, step, n, k};
    memcpy(payload, &h, sizeof h);
}

static int any_nonfinite(const void *gathered, int nranks, uint64_t k) {
    for (int r = 0; r < nranks; r++) {
        dgc_wire_header h;
        memcpy(&h, payload_at(gathered, r, k), sizeof h);
        if (h.flags & DGC_WIRE_NONFINITE) return 1;
    }
    return 0;
}

#define PREFETCH_AHEAD 16
/* Pairs on average this many elements apart or closer count as dense. */
#define DENSE_GAP 64

int dgc_wire_scattered(uint64_t k, uint64_t n) { return k < n / DENSE_GAP; }

void dgc_wire_scatter_add(const uint32_t *idx, const float *val, uint64_t m, float scale, int scattered, float *out) {
    /* Scattered indices land all over the output, each add a cache (and
     * often TLB) miss: prefetching PREFETCH_AHEAD pairs ahead overlaps
     * them. Dense ones (warm-up: a pair every few elements, in order) walk
     * the output as a stream the hardware prefetches by itself, and there the
     * extra load and prefetch per pair only cost. */
    uint64_t j = 0;
    if (scattered)
        for (; j + PREFETCH_AHEAD < m; j++) {
            __builtin_prefetch(out + idx[j + PREFETCH_AHEAD], 1);
            out[idx[j]] += scale * val[j]; /* 1.0f * x is x, bit for bit */
        }
    for (; j < m; j++) out[idx[j]] += scale * val[j];
}

static void add_pairs(const char *p, uint64_t k, float scale, float *out) {
    dgc_wire_header h; /* n from the header: checked, or this rank's own */
    memcpy(&h, p, sizeof h);
    const uint32_t *idx = (const uint32_t *)(p + sizeof(dgc_wire_header));
    const float *val = (const float *)(p + sizeof(dgc_wire_header) + (size_t)k * 4u);
    dgc_wire_scatter_add(idx, val, k, scale, dgc_wire_scattered(k, h.n), out);
}

void dgc_wire_add_own(const void *payload, uint64_t k, float *out) {
    add_pairs(payload, k, 1.0f, out);
}

void dgc_wire_subtract(const void *gathered, int nranks, uint64_t k, float scale, float *out) {
    for (int r = 0; r < nranks; r++) add_pairs(payload_at(gathered, r, k), k, -scale, out);
}

static dgc_decode_result decode(const void *gathered, int nranks, uint64_t step, uint64_t n, uint64_t k,
                                float *out, int zeroed, char *err, size_t errlen) {
    for (int r = 0; r < nranks; r++)
        if (check_payload(payload_at(gathered, r, k), r, step, n, k, err, errlen) != 0)
            return DGC_DECODE_BAD;
    if (any_nonfinite(gathered, nranks, k)) {
        /* Every element non-finite: whatever the framework checks, it sees it. */
        for (uint64_t i = 0; i < n; i++) out[i] = NAN;
        return DGC_DECODE_NONFINITE;
    }
    if (!zeroed) memset(out, 0, (size_t)n * sizeof *out);
    for (int r = 0; r < nranks; r++) add_pairs(payload_at(gathered, r, k), k, 1.0f, out);
    return DGC_DECODE_OK;
}

dgc_decode_result dgc_wire_decode(const void *gathered, int nranks, uint64_t step, uint64_t n,
                                  uint64_t k, float *out, char *err, size_t errlen) {
    return decode(gathered, nranks, step, n, k, out, 0, err, errlen);
}

dgc_decode_result dgc_wire_decode_zeroed(const void *gathered, int nranks, uint64_t step, uint64_t n,
                                         uint64_t k, float *out, char *err, size_t errlen) {
    return decode(gathered, nranks, step, n, k, out, 1, err, errlen);
}
