/* The CUDA codec's pieces (compact_rules.h, run on the CPU by
 * tests/common/compact_pieces.h as the kernels' threads run them) against
 * the host codec: the same bytes from the encoder, the same verdict from the
 * expander on sound and damaged payloads, and the same pairs when sound. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../common/compact_pieces.h"

static uint64_t rng_state = 88172645463325252ull;
static uint64_t next(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static float float_of(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* A gradient value: mostly ordinary, sometimes one of the corners the
 * conversions treat apart (zeros, subnormals, the top binades, values that
 * round up a binade, fp32's smallest). */
static float value(void) {
    switch (next() % 12) {
    case 0: return 0.0f;
    case 1: return -0.0f;
    case 2: return float_of((uint32_t)(next() % 0x800000u) | (uint32_t)(next() & 1) << 31); /* subnormal */
    case 3: return float_of(0x7f7fffffu ^ (uint32_t)(next() % 4096u));                       /* near FLT_MAX */
    case 4: return float_of(0x3f7ff000u | (uint32_t)(next() % 0x1000u));                     /* rounds up to 1 */
    case 5: return float_of(1u);
    default: {
        const uint32_t field = 60u + (uint32_t)(next() % 140u);
        return float_of((uint32_t)(next() & 1) << 31 | field << 23 | (uint32_t)(next() % 0x800000u));
    }
    }
}

static int by_value(const void *a, const void *b) {
    const uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* An engine's payload: m sorted distinct indices below n (index 0 more
 * often than chance, for the lone padding pair), values rounded for the
 * wire under the payload's scale, padding after. *e: the scale. */
static void *engine_payload(uint64_t n, uint64_t k, uint64_t *pm, unsigned vb, int *e) {
    uint64_t m = *pm;
    void *plain = calloc(1, dgc_wire_bytes(k));
    cr_assert(plain);
    dgc_wire_header h = {DGC_WIRE_MAGIC, 0, 3, n, k};
    memcpy(plain, &h, sizeof h);
    uint32_t *idx = dgc_wire_indices(plain);
    float *val = dgc_wire_values(plain, k);
    /* m distinct indices in order: random ones sorted, duplicates dropped
     * (so m may come out a little smaller), and index 0 a quarter of the
     * time; near the top of a large n too, where the high parts are large. */
    uint64_t j = 0;
    for (; j < m; j++) {
        const uint64_t r = next();
        idx[j] = (uint32_t)(r % 8 == 0 ? n - 1 - (r >> 8) % (n < 64 ? n : 64) : (r >> 8) % n);
    }
    if (m && next() % 4 == 0) idx[0] = 0;
    qsort(idx, m, sizeof *idx, by_value);
    uint64_t d = 0;
    for (j = 0; j < m; j++)
        if (d == 0 || idx[j] != idx[d - 1]) idx[d++] = idx[j];
    for (j = d; j < m; j++) idx[j] = 0;
    m = d;
    float x[4096];
    cr_assert(m <= 4096);
    for (j = 0; j < m; j++) x[j] = value();
    if (m == 1 && next() % 3 == 0) x[0] = 0.0f;
    *e = vb == 16 ? dgc_compact_scale16(x, m) : 0;
    dgc_compact_values(x, m, vb, *e, val);
    *pm = m;
    return plain;
}

static uint64_t pick_n(void) {
    static const uint64_t sizes[] = {1, 2, 3, 7, 64, 65, 1000, 4096, 65536, 1000003, 4294967295ull};
    return sizes[next() % (sizeof sizes / sizeof *sizes)];
}

/* A random case: n, k up to kmax, m pairs, value bits, the engine's
 * payload (its scale *e) and the layout. */
static void *random_case(uint64_t kmax, uint64_t *n, uint64_t *k, uint64_t *m, unsigned *vb, int *e,
                         dgc_compact_layout *L) {
    *n = pick_n();
    *k = 1 + next() % (*n < kmax ? *n : kmax);
    *m = next() % (*k + 1);
    *vb = next() & 1 ? 16 : 32;
    void *plain = engine_payload(*n, *k, m, *vb, e);
    dgc_compact_layout_for(*n, *k, *vb, L);
    return plain;
}

Test(compact_pieces, encode_gives_the_host_encoders_bytes) {
    for (int t = 0; t < 3000; t++) {
        uint64_t n, k, m;
        unsigned vb;
        int e;
        dgc_compact_layout L;
        void *plain = random_case(2048, &n, &k, &m, &vb, &e, &L);
        unsigned char *host = calloc(1, L.bytes);
        uint64_t *mine = calloc(1, L.bytes);
        cr_assert(host && mine);
        cr_assert_eq(dgc_compact_encode(plain, &L, host), 0, "case %d: the host refused an engine's payload", t);
        pieces_encode(plain, m, e, &L, mine);
        cr_assert(memcmp(host, mine, L.bytes) == 0, "case %d (n %llu k %llu m %llu vb %u e %d): bytes differ", t,
                  (unsigned long long)n, (unsigned long long)k, (unsigned long long)m, vb, e);
        free(plain);
        free(host);
        free(mine);
    }
}

/* The pieces' verdict and pairs against the host's on words: 1 when both
 * accept (and give the same pairs), 0 when both reject. */
static int agree(const uint64_t *words, const dgc_compact_layout *L, const char *what, int t) {
    char err[256];
    uint32_t *idx = malloc(4 * L->k), *val = malloc(4 * L->k);
    void *plain = malloc(dgc_wire_bytes(L->k));
    cr_assert(idx && val && plain);
    memset(idx, 0xa5, 4 * L->k); /* what a stale gathered buffer would hold */
    const int host = dgc_compact_check(words, L, 0, err, sizeof err);
    const int mine = pieces_expand(words, L, idx, val);
    cr_assert_eq(host == 0, mine == DGC_CX_OK, "%s, case %d (n %llu k %llu vb %u): host %s (%s), pieces fault %d", what,
                 t, (unsigned long long)L->n, (unsigned long long)L->k, L->value_bits, host ? "rejects" : "accepts",
                 host ? err : "", mine);
    if (host == 0) {
        cr_assert_eq(dgc_compact_expand(words, L, 0, plain, err, sizeof err), 0);
        cr_assert(memcmp(dgc_wire_indices(plain), idx, 4 * L->k) == 0, "%s, case %d: indices differ", what, t);
        cr_assert(memcmp(dgc_wire_values(plain, L->k), val, 4 * L->k) == 0, "%s, case %d: values differ", what, t);
    }
    free(idx);
    free(val);
    free(plain);
    return host == 0;
}

/* Sound payloads, then each damaged: a few random bits flipped anywhere
 * past the header (which neither checks), or the count word rewritten (a
 * count near k, reserved bits, a scale off by a little). Both readers must
 * reject or accept alike; both verdicts must occur. */
Test(compact_pieces, expand_agrees_with_the_host_on_sound_and_damaged_payloads) {
    int accepted = 0, rejected = 0;
    for (int t = 0; t < 4000; t++) {
        uint64_t n, k, m;
        unsigned vb;
        int e;
        dgc_compact_layout L;
        void *plain = random_case(1024, &n, &k, &m, &vb, &e, &L);
        uint64_t *words = calloc(1, L.bytes);
        cr_assert(words);
        cr_assert_eq(dgc_compact_encode(plain, &L, words), 0);
        cr_assert(agree(words, &L, "sound", t), "case %d: a sound payload rejected", t);
        const uint64_t nwords = L.bytes / 8 - DGC_CX_HEADER_WORDS;
        switch (next() % 4) {
        case 0:
        case 1:
            for (int f = 1 + (int)(next() % 3); f > 0; f--) {
                const uint64_t bit = next() % (64 * nwords);
                words[DGC_CX_HEADER_WORDS + bit / 64] ^= UINT64_C(1) << (bit % 64);
            }
            break;
        case 2: {
            uint64_t c = words[DGC_CX_HEADER_WORDS] & DGC_CX_COUNT_MASK;
            c = next() % 2 ? c + (next() % 3) - 1 : next() % (k + 2);
            words[DGC_CX_HEADER_WORDS] = (words[DGC_CX_HEADER_WORDS] & ~DGC_CX_COUNT_MASK) | (c & DGC_CX_COUNT_MASK);
            if (next() % 4 == 0) words[DGC_CX_HEADER_WORDS] |= UINT64_C(1) << (40 + next() % 8);
            break;
        }
        default: {
            const int s = (int)(int16_t)(uint16_t)(words[DGC_CX_HEADER_WORDS] >> 48) + (int)(next() % 5) - 2;
            words[DGC_CX_HEADER_WORDS] = (words[DGC_CX_HEADER_WORDS] & ((UINT64_C(1) << 48) - 1u)) |
                                         (uint64_t)(uint16_t)(int16_t)s << 48;
            break;
        }
        }
        if (agree(words, &L, "damaged", t)) accepted++;
        else rejected++;
        free(plain);
        free(words);
    }
    cr_assert(accepted > 50 && rejected > 1000, "damage left %d accepted, %d rejected", accepted, rejected);
}

/* The one case damage seldom makes: a lone pair (0, +0.0) is padding
 * counted as a pair, and rejected; (0, -0.0) and (1, +0.0) are pairs. */
Test(compact_pieces, a_lone_padding_pair_is_rejected_as_by_the_host) {
    static const uint64_t sizes[][2] = {{1, 1}, {7, 3}, {1000, 1}, {1000, 1000}, {4294967295ull, 5}};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
        for (unsigned vb = 16; vb <= 32; vb += 16) {
            dgc_compact_layout L;
            dgc_compact_layout_for(sizes[s][0], sizes[s][1], vb, &L);
            uint64_t *words = calloc(1, L.bytes);
            cr_assert(words);
            const dgc_cx_view v = pieces_view(&L);
            words[DGC_CX_HEADER_WORDS] = 1;  /* one pair, scale 0 */
            words[v.upper] = 1;              /* index 0 */
            cr_assert_eq(agree(words, &L, "lone (0, +0.0)", (int)s), 0);
            words[v.values] = vb == 16 ? 0x8000u : 0x80000000u; /* -0.0: a pair */
            if (vb == 16) words[v.values] |= 0x7400u;           /* the canonical scale needs the top binade */
            cr_assert_eq(agree(words, &L, "lone (0, -x)", (int)s), 1);
            free(words);
        }
}
