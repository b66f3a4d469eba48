/* libFuzzer target for the compact payload's expander (shim/wire_compact.c):
 * it turns what another rank sent into a plain payload, so whatever arrives
 * it must either reject with a message or give the one plain payload that
 * the bytes stand for; and what it accepts must be canonical: encoding the
 * result gives back the same bytes.
 *
 * Input: 7 choice bytes, then the compact payload, zero-padded or truncated
 * to the layout's bytes:
 *   [0] bit 0: value bits (0: 32, 1: 16); bits 1-2: errlen (2, 7, 64 or 256);
 *       bit 3: take the count field mod k + 2, so that decoding is reached
 *       without the fuzzer solving the count first;
 *       bits 4-5: how many of bytes [1..4] make n - 1 (1 to 4)
 *   [1..4] n - 1, little endian (n from 1 to 2^32)
 *   [5..6] k - 1 (little endian, mod min(n, 256))
 * The verdict and the decoded pairs are checked against a bit-at-a-time
 * reference decoder written here from the format's description. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dgcshim/wire.h"
#include "dgcshim/wire_compact.h"
#include "fuzz_check.h"

#define CHOICE_BYTES 7
#define ERRCAP 300
#define ERR_FILL 0xa5
#define MAX_K 256

static const size_t errlens[] = {2, 7, 64, 256};

static unsigned ref_bit(const unsigned char *area, uint64_t i) { return (area[i / 8] >> (i % 8)) & 1u; }

static uint64_t ref_field(const unsigned char *area, uint64_t first_bit, unsigned bits) {
    uint64_t v = 0;
    for (unsigned i = 0; i < bits; i++) v |= (uint64_t)ref_bit(area, first_bit + i) << i;
    return v;
}

static uint64_t words(uint64_t bits) { return (bits + 63) / 64; }

/* The reference: 0 and the pairs when the payload is sound, else -1. */
static int ref_expand(const unsigned char *c, const dgc_compact_layout *L, uint64_t *count_out, uint32_t *idx,
                      uint32_t *val) {
    const uint64_t k = L->k, b = L->code_bits, vb = L->value_bits, M = (UINT64_C(1) << b) - 1;
    const uint64_t limit = L->n < (UINT64_C(1) << 32) ? L->n : (UINT64_C(1) << 32);
    const unsigned char *codes = c + 40, *values = codes + 8 * words(L->codes * b);
    uint64_t count;
    memcpy(&count, c + 32, 8);
    if (count > k) return -1;
    for (uint64_t i = count * vb; i < 64 * words(k * vb); i++)
        if (ref_bit(values, i)) return -1;
    uint64_t used = 0, next = 0;
    for (uint64_t j = 0; j < count; j++) {
        uint64_t i = next, code;
        do {
            if (used >= L->codes) return -1;
            code = ref_field(codes, used++ * b, (unsigned)b);
            i += code;
            if (i >= limit) return -1;
        } while (code == M);
        idx[j] = (uint32_t)i;
        val[j] = (uint32_t)ref_field(values, j * vb, (unsigned)vb) << (32 - vb);
        next = i + 1;
    }
    for (uint64_t i = used * b; i < 64 * words(L->codes * b); i++)
        if (ref_bit(codes, i)) return -1;
    if (count == 1 && idx[0] == 0 && val[0] == 0) return -1;
    *count_out = count;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < CHOICE_BYTES) return 0;
    const unsigned vb = data[0] & 1 ? 16 : 32, nbytes = 1 + ((data[0] >> 4) & 3);
    const size_t errlen = errlens[(data[0] >> 1) & 3];
    uint64_t n = 0;
    for (unsigned i = 0; i < nbytes; i++) n |= (uint64_t)data[1 + i] << (8 * i);
    n += 1;
    const uint64_t k = 1 + (uint64_t)(data[5] | data[6] << 8) % (n < MAX_K ? n : MAX_K);

    dgc_compact_layout L;
    dgc_compact_layout_for(n, k, vb, &L);
    CHECK(L.bytes % 8 == 0 && L.code_bits >= 1 && L.code_bits <= 32 && L.value_bits == vb);
    CHECK(L.codes == k + n / ((UINT64_C(1) << L.code_bits) - 1));

    /* Exactly the layout's size, so ASan sees any read past it. */
    const size_t avail = size - CHOICE_BYTES < L.bytes ? size - CHOICE_BYTES : L.bytes;
    unsigned char *compact = calloc(1, L.bytes), *again = malloc(L.bytes);
    char *plain = malloc(dgc_wire_bytes(k));
    CHECK(compact && again && plain);
    memcpy(compact, data + CHOICE_BYTES, avail);
    if (data[0] & 8) {
        uint64_t count;
        memcpy(&count, compact + 32, 8);
        count %= k + 2;
        memcpy(compact + 32, &count, 8);
    }

    uint32_t ref_idx[MAX_K], ref_val[MAX_K];
    uint64_t ref_count = 0;
    const int want = ref_expand(compact, &L, &ref_count, ref_idx, ref_val);

    char err[ERRCAP];
    memset(err, ERR_FILL, sizeof err);
    const int rc = dgc_compact_expand(compact, &L, 5, plain, err, errlen);
    CHECK(rc == want);
    if (rc != 0) {
        CHECK(err[0] != '\0');
        CHECK(memchr(err, '\0', errlen) != NULL);
        for (size_t i = errlen; i < ERRCAP; i++) CHECK((unsigned char)err[i] == ERR_FILL);
    } else {
        CHECK(memcmp(plain, compact, sizeof(dgc_wire_header)) == 0);
        const uint32_t *idx = dgc_wire_indices(plain);
        const float *val = dgc_wire_values(plain, k);
        for (uint64_t j = 0; j < k; j++) {
            uint32_t v;
            memcpy(&v, &val[j], 4);
            if (j < ref_count) {
                CHECK(idx[j] < n);
                CHECK(j == 0 || idx[j] > idx[j - 1]);
                CHECK(idx[j] == ref_idx[j] && v == ref_val[j]);
                if (vb == 16) CHECK((v & 0xffffu) == 0);
            } else {
                CHECK(idx[j] == 0 && v == 0); /* padding, +0.0 */
            }
        }
        /* Canonical: the plain payload encodes back to the same bytes. */
        memset(again, 0x5a, L.bytes);
        CHECK(dgc_compact_encode(plain, &L, again) == 0);
        CHECK(memcmp(again, compact, L.bytes) == 0);
    }
    free(compact);
    free(again);
    free(plain);
    return 0;
}
