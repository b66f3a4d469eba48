/* libFuzzer target for the wire decoder (shim/wire/wire.c): the only code that
 * writes what other ranks sent into user memory, so whatever arrives it must
 * either reject with a message and leave the output alone, or sum it exactly.
 *
 * Input: 6 choice bytes, then the gathered buffer, zero-padded or truncated
 * to nranks payloads of dgc_wire_bytes(k):
 *   [0] nranks - 1 (mod 8)     [1..2] n - 1 (little endian, mod 4096)
 *   [3] k - 1 (mod min(n, 64)) [4] step
 *   [5] bit 0: decode_zeroed flavour; bits 1-2: errlen (2, 7, 64 or 256);
 *       bit 3: stamp the expected magic, step, n and k into the raw headers
 *       (flags and indices stay raw), so the index and flag checks are
 *       reached without the fuzzer solving the header first;
 *       bits 4-7: the scale for dgc_wire_subtract.
 * The raw buffer is decoded and checked against verdicts and sums computed
 * here; then a repaired copy (sound headers, indices taken mod n), which must
 * decode, is checked the same way and run through dgc_wire_subtract. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dgcshim/wire.h"
#include "fuzz_check.h"

#define CHOICE_BYTES 6
#define GUARD 8                   /* floats either side of the output */
#define GUARD_BITS 0x7fa5a5a5u    /* a NaN no arithmetic produces */
#define ERRCAP 300                /* the err buffer; the decoder gets errlen of it */
#define ERR_FILL 0xa5

static const size_t errlens[] = {2, 7, 64, 256};
static const float scales[] = {0.9f, 0.5f, 1.0f, 0.0f, -1.0f, 1e-3f, 3.0f, 0.99f,
                               1e30f, 1e-30f, -0.5f, 2.0f, 0.1f, 0.75f, 1e-45f, 7.0f};

static dgc_wire_header header_at(const char *buf, size_t bytes, int r) {
    dgc_wire_header h;
    memcpy(&h, buf + (size_t)r * bytes, sizeof h);
    return h;
}

static uint32_t index_at(const char *buf, size_t bytes, int r, uint64_t j) {
    uint32_t i;
    memcpy(&i, buf + (size_t)r * bytes + sizeof(dgc_wire_header) + 4 * j, sizeof i);
    return i;
}

static float value_at(const char *buf, size_t bytes, int r, uint64_t k, uint64_t j) {
    float v;
    memcpy(&v, buf + (size_t)r * bytes + sizeof(dgc_wire_header) + 4 * k + 4 * j, sizeof v);
    return v;
}

/* Flags in the low byte; the age of the kept sum above it, any value. */
static int header_sound(const dgc_wire_header *h, uint64_t step, uint64_t n, uint64_t k, uint32_t flags_ok) {
    const uint32_t f = h->flags & 0xffu;
    return h->magic == DGC_WIRE_MAGIC && (f & ~flags_ok) == 0 && !((f & DGC_WIRE_FAILED) && (f & DGC_WIRE_DENSE)) &&
           h->step == step && h->n == n && h->k == k;
}

/* What dgc_wire_scan must answer, and the flags it must count. */
static dgc_decode_result expected_scan(const char *buf, int nranks, uint64_t step, uint64_t n, uint64_t k,
                                       dgc_wire_summary *sum) {
    *sum = (dgc_wire_summary){0, -1, 0, 0, 0, 0};
    uint32_t ages[64];
    for (int r = 0; r < nranks; r++) {
        dgc_wire_header h = header_at(buf, dgc_wire_bytes(k), r);
        if (!header_sound(&h, step, n, k, DGC_WIRE_NONFINITE | DGC_WIRE_FAILED | DGC_WIRE_DENSE | DGC_WIRE_BOUNDS))
            return DGC_DECODE_BAD;
        ages[r] = h.flags >> 8;
        if ((h.flags & DGC_WIRE_FAILED) && sum->first_failed < 0) sum->first_failed = r;
        sum->failed += (h.flags & DGC_WIRE_FAILED) != 0;
        sum->dense += (h.flags & DGC_WIRE_DENSE) != 0;
        sum->nonfinite += (h.flags & DGC_WIRE_NONFINITE) != 0;
        sum->bounds += (h.flags & DGC_WIRE_BOUNDS) != 0;
    }
    /* The ranks' age, when all report the same one below 2^24 - 1. */
    int same = 1;
    for (int r = 1; r < nranks; r++) same &= ages[r] == ages[0];
    sum->age = same && ages[0] != 0xffffffu ? ages[0] : 0;
    return DGC_DECODE_OK;
}

/* What the decoder must answer: it takes plain and NONFINITE payloads only,
 * each index below n. */
static dgc_decode_result expected_decode(const char *buf, int nranks, uint64_t step, uint64_t n, uint64_t k) {
    int nonfinite = 0;
    for (int r = 0; r < nranks; r++) {
        dgc_wire_header h = header_at(buf, dgc_wire_bytes(k), r);
        if (!header_sound(&h, step, n, k, DGC_WIRE_NONFINITE)) return DGC_DECODE_BAD;
        for (uint64_t j = 0; j < k; j++)
            if (index_at(buf, dgc_wire_bytes(k), r, j) >= n) return DGC_DECODE_BAD;
        nonfinite |= (h.flags & DGC_WIRE_NONFINITE) != 0;
    }
    return nonfinite ? DGC_DECODE_NONFINITE : DGC_DECODE_OK;
}

/* Bit for bit, except that two NaNs match: which operand's payload a NaN sum
 * carries is the compiler's choice of operand order, not the decoder's. */
static int same_float(float a, float b) { return memcmp(&a, &b, sizeof a) == 0 || (isnan(a) && isnan(b)); }

/* A rejection wrote a non-empty message, NUL-terminated inside errlen, and
 * nothing past errlen. */
static void check_err(const char *err, size_t errlen) {
    CHECK(err[0] != '\0');
    CHECK(memchr(err, '\0', errlen) != NULL);
    for (size_t i = errlen; i < ERRCAP; i++) CHECK((unsigned char)err[i] == ERR_FILL);
}

/* An output with GUARD floats of GUARD_BITS either side. */
static float *guarded(uint64_t n) {
    float *mem = malloc((n + 2 * GUARD) * sizeof *mem);
    CHECK(mem != NULL);
    uint32_t bits = GUARD_BITS;
    for (uint64_t i = 0; i < n + 2 * GUARD; i++) memcpy(&mem[i], &bits, sizeof bits);
    return mem;
}

static void check_guards(const float *mem, uint64_t n) {
    uint32_t bits = GUARD_BITS;
    for (uint64_t i = 0; i < GUARD; i++) {
        CHECK(memcmp(&mem[i], &bits, sizeof bits) == 0);
        CHECK(memcmp(&mem[GUARD + n + i], &bits, sizeof bits) == 0);
    }
}

/* Scans and decodes buf, checks every invariant, returns the decoder's answer. */
static dgc_decode_result check_decode(const char *buf, int nranks, uint64_t step, uint64_t n, uint64_t k,
                                      int zeroed, size_t errlen) {
    const size_t bytes = dgc_wire_bytes(k), span = (n + 2 * GUARD) * sizeof(float);
    float *mem = guarded(n), *out = mem + GUARD, *before = malloc(span), *ref = calloc(n, sizeof *ref);
    CHECK(before && ref);
    /* Garbage where the plain decoder must zero first; zeros for _zeroed,
     * whose caller promises them. */
    memset(out, zeroed ? 0 : 0x7f, n * sizeof *out);
    memcpy(before, mem, span);

    char serr[ERRCAP], derr[ERRCAP];
    memset(serr, ERR_FILL, sizeof serr);
    memset(derr, ERR_FILL, sizeof derr);
    dgc_wire_summary sum, want_sum;
    dgc_decode_result scan = dgc_wire_scan(buf, bytes, nranks, step, n, k, &sum, serr, errlen);
    dgc_decode_result res = zeroed ? dgc_wire_decode_zeroed(buf, nranks, step, n, k, out, derr, errlen)
                                   : dgc_wire_decode(buf, nranks, step, n, k, out, derr, errlen);

    /* Both verdicts are the ones the headers and indices call for. */
    CHECK(scan == expected_scan(buf, nranks, step, n, k, &want_sum));
    CHECK(res == expected_decode(buf, nranks, step, n, k));
    if (scan == DGC_DECODE_BAD) {
        check_err(serr, errlen);
    } else {
        CHECK(sum.failed == want_sum.failed && sum.first_failed == want_sum.first_failed);
        CHECK(sum.dense == want_sum.dense && sum.nonfinite == want_sum.nonfinite);
        CHECK(sum.age == want_sum.age && sum.bounds == want_sum.bounds);
    }
    /* The scan and the decoder agree: what the scan rejects, or flags as
     * failed or dense, the decoder never sums. */
    if (scan == DGC_DECODE_BAD || sum.failed > 0 || sum.dense > 0) CHECK(res == DGC_DECODE_BAD);
    if (scan == DGC_DECODE_OK && res != DGC_DECODE_BAD)
        CHECK((res == DGC_DECODE_NONFINITE) == (sum.nonfinite > 0));

    if (res == DGC_DECODE_BAD) {
        check_err(derr, errlen);
        CHECK(memcmp(mem, before, span) == 0); /* output and guards untouched */
    } else if (res == DGC_DECODE_NONFINITE) {
        for (uint64_t i = 0; i < n; i++) CHECK(isnan(out[i]));
    } else {
        for (int r = 0; r < nranks; r++)
            for (uint64_t j = 0; j < k; j++) ref[index_at(buf, bytes, r, j)] += value_at(buf, bytes, r, k, j);
        for (uint64_t i = 0; i < n; i++) CHECK(same_float(out[i], ref[i]));
    }
    check_guards(mem, n);
    free(mem);
    free(before);
    free(ref);
    return res;
}

/* dgc_wire_subtract on a decodable buffer against out[idx] -= scale * val,
 * rank by rank; a + (-s) * v is a - s * v exactly in IEEE arithmetic. */
static void check_subtract(const char *buf, int nranks, uint64_t n, uint64_t k, float scale) {
    const size_t bytes = dgc_wire_bytes(k);
    float *mem = guarded(n), *out = mem + GUARD, *ref = malloc(n * sizeof *ref);
    CHECK(ref != NULL);
    for (uint64_t i = 0; i < n; i++) out[i] = ref[i] = (float)i * 0.25f - 3.0f;
    dgc_wire_subtract(buf, nranks, k, scale, out);
    for (int r = 0; r < nranks; r++)
        for (uint64_t j = 0; j < k; j++) ref[index_at(buf, bytes, r, j)] -= scale * value_at(buf, bytes, r, k, j);
    for (uint64_t i = 0; i < n; i++) CHECK(same_float(out[i], ref[i]));
    check_guards(mem, n);
    free(mem);
    free(ref);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < CHOICE_BYTES) return 0;
    const int nranks = 1 + data[0] % 8;
    const uint64_t n = 1 + (uint64_t)(data[1] | data[2] << 8) % 4096;
    const uint64_t k = 1 + data[3] % (n < 64 ? n : 64);
    const uint64_t step = data[4];
    const int zeroed = data[5] & 1, stamp = (data[5] >> 3) & 1;
    const size_t errlen = errlens[(data[5] >> 1) & 3];
    const float scale = scales[data[5] >> 4];

    /* Exactly the gathered size, so ASan sees any read past it; malloc keeps
     * the 8-byte alignment the payloads have after an all-gather. */
    const size_t bytes = dgc_wire_bytes(k), total = (size_t)nranks * bytes;
    const size_t avail = size - CHOICE_BYTES < total ? size - CHOICE_BYTES : total;
    char *raw = calloc(1, total), *rep = malloc(total);
    CHECK(raw && rep);
    memcpy(raw, data + CHOICE_BYTES, avail);
    for (int r = 0; r < nranks && stamp; r++) {
        dgc_wire_header h = header_at(raw, bytes, r);
        h = (dgc_wire_header){DGC_WIRE_MAGIC, h.flags, step, n, k};
        memcpy(raw + (size_t)r * bytes, &h, sizeof h);
    }
    check_decode(raw, nranks, step, n, k, zeroed, errlen);

    /* Repaired: sound headers, the NONFINITE flag kept, every index below n.
     * Such a buffer is what ranks running the engine send: it must decode. */
    memcpy(rep, raw, total);
    for (int r = 0; r < nranks; r++) {
        char *p = rep + (size_t)r * bytes;
        dgc_wire_header h = header_at(rep, bytes, r);
        h = (dgc_wire_header){DGC_WIRE_MAGIC, h.flags & DGC_WIRE_NONFINITE, step, n, k};
        memcpy(p, &h, sizeof h);
        for (uint64_t j = 0; j < k; j++) {
            uint32_t i = (uint32_t)(index_at(rep, bytes, r, j) % n);
            memcpy(p + sizeof h + 4 * j, &i, sizeof i);
        }
    }
    dgc_decode_result res = check_decode(rep, nranks, step, n, k, zeroed, errlen);
    CHECK(res == DGC_DECODE_OK || res == DGC_DECODE_NONFINITE);
    check_subtract(rep, nranks, n, k, scale);
    free(raw);
    free(rep);
    return 0;
}
