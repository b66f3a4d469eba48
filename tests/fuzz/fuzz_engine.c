/* libFuzzer target for the host engine's round trip (shim/engine/host.c):
 * compress, decode the one payload, commit or discard, for a few steps, on
 * gradients of any bit pattern (NaN, Inf, subnormals, huge values).
 *
 * Input: 7 choice bytes, then gradient bytes, reused cyclically (none: zeros):
 *   [0..1] n - 16 (little endian, mod 2033)   [2..3] k - 1 (mod n)
 *   [4] bits 0-1 momentum (0, 0.9, 0.5, 0); bit 2 nesterov; bit 3 masking;
 *       bits 4-5 clip norm (off, 1e-3, 1, 1e3); bits 6-7 steps - 1
 *   [5] bits 0-2 sample ratio; bits 3-5 nranks - 1 (for the clipping scale);
 *       bit 6 tame: exponents squeezed into 2^-20..2^19, so that most steps
 *       are finite and get committed; bit 7: the twin zeroes g itself
 *   [6] bits 0-3 g's offset in floats, bits 4-7 the separate output's, so
 *       the zeroing pass meets every alignment modulo a cache line
 * A twin state runs each step through dgc_compress_zeroing and must produce
 * the same payload and state. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dgcshim/engine.h"
#include "dgcshim/update_rules.h"
#include "dgcshim/wire.h"
#include "fuzz_check.h"

#define CHOICE_BYTES 7
#define FILL 0x7f /* what the zeroing pass must overwrite, and its guards keep */
/* Below this |g| four steps of momentum 0.9 cannot overflow a float (|v| stays
 * under about 50 |g|): such gradients must never be flagged non-finite. */
#define HUGE_GRAD 1e35f

static const float momenta[] = {0.0f, 0.9f, 0.5f, 0.0f};
static const double clips[] = {0.0, 1e-3, 1.0, 1e3};
static const double ratios[] = {1.0, 0.5, 0.25, 0.1, 0.05, 0.01, 0.001, 1.0};

typedef struct {
    dgc_step_params p;
    int with_u, steps, tame, in_place;
    unsigned g_off, out_off;
} plan;

static plan read_plan(const uint8_t *d) {
    plan pl = {0};
    /* Up to 8192: above 4096 candidates the exact selection takes over, a
     * path smaller buffers never reach. */
    pl.p.n = 16 + (uint64_t)(d[0] | d[1] << 8) % 8177;
    pl.p.k = 1 + (uint64_t)(d[2] | d[3] << 8) % pl.p.n;
    pl.p.momentum = momenta[d[4] & 3];
    pl.p.nesterov = (d[4] >> 2) & 1;
    pl.p.momentum_masking = (d[4] >> 3) & 1;
    pl.p.clip_norm = clips[(d[4] >> 4) & 3];
    pl.steps = 1 + (d[4] >> 6);
    pl.p.sample_ratio = ratios[d[5] & 7];
    pl.p.nranks = 1 + ((d[5] >> 3) & 7);
    pl.tame = (d[5] >> 6) & 1;
    pl.in_place = d[5] >> 7;
    pl.g_off = d[6] & 15;
    pl.out_off = d[6] >> 4;
    pl.with_u = pl.p.momentum != 0.0f; /* as the front end creates states */
    return pl;
}

/* Step s's gradient: the bytes after the choices, read on cyclically. */
static void fill_gradient(float *g, uint64_t n, int s, const uint8_t *d, size_t len, int tame) {
    for (uint64_t i = 0; i < n; i++) {
        uint32_t bits = 0;
        for (uint64_t b = 0; b < 4 && len; b++) bits |= (uint32_t)d[(((uint64_t)s * n + i) * 4 + b) % len] << (8 * b);
        if (tame && (bits & 0x7fffffffu)) bits = (bits & 0x807fffffu) | (107u + (bits >> 23 & 0xffu) % 40u) << 23;
        memcpy(&g[i], &bits, sizeof bits);
    }
}

static int is_pos_zero(float x) { return memcmp(&x, &(float){0.0f}, sizeof x) == 0; }

/* The header, then nsel distinct in-range non-zero pairs, then padding
 * (index 0, +0.0f). Marks the sent indices in sent[]; returns the flags. */
static uint32_t check_payload(void *payload, const dgc_step_params *p, uint64_t nsel, unsigned char *sent) {
    dgc_wire_header *h = dgc_wire_header_of(payload);
    CHECK(h->magic == DGC_WIRE_MAGIC);
    CHECK(h->flags == 0 || h->flags == DGC_WIRE_NONFINITE);
    CHECK(h->step == p->step && h->n == p->n && h->k == p->k);
    CHECK(nsel <= p->k);
    const uint32_t *idx = dgc_wire_indices(payload);
    const float *val = dgc_wire_values(payload, p->k);
    memset(sent, 0, p->n);
    for (uint64_t j = 0; j < nsel; j++) {
        CHECK(idx[j] < p->n);
        CHECK(!sent[idx[j]]);
        sent[idx[j]] = 1;
        CHECK(val[j] != 0.0f);
    }
    for (uint64_t j = nsel; j < p->k; j++) CHECK(idx[j] == 0 && is_pos_zero(val[j]));
    return h->flags;
}

/* After a commit: the sent indices are masked, the rest of the update stays,
 * nothing unsent outweighs anything sent. Without clipping the update is
 * recomputed here from the rules, and what was sent plus what stays must be
 * it exactly (one of the two is zero); with momentum 0 that is conservation:
 * residual after + output == residual before + gradient. */
static void check_committed(const dgc_state *s, const plan *pl, void *payload, uint64_t nsel,
                            const unsigned char *sent, const float *dec, const float *g, const float *v0,
                            const float *u0) {
    const float *v = dgc_state_residual(s), *u = dgc_state_momentum(s);
    const uint32_t *idx = dgc_wire_indices(payload);
    const float *val = dgc_wire_values(payload, pl->p.k);
    float min_sent = INFINITY, max_unsent = 0.0f;
    for (uint64_t j = 0; j < nsel; j++) {
        CHECK(is_pos_zero(v[idx[j]]));
        CHECK(memcmp(&dec[idx[j]], &val[j], sizeof *val) == 0);
        if (u && pl->p.momentum_masking) CHECK(is_pos_zero(u[idx[j]]));
        min_sent = fminf(min_sent, fabsf(val[j]));
    }
    for (uint64_t i = 0; i < pl->p.n; i++) {
        if (sent[i]) continue;
        CHECK(is_pos_zero(dec[i]));
        max_unsent = fmaxf(max_unsent, fabsf(v[i]));
    }
    CHECK(max_unsent <= min_sent);
    CHECK(nsel > 0 || max_unsent == 0.0f); /* something waiting: something sent */
    if (pl->p.clip_norm > 0) return;
    for (uint64_t i = 0; i < pl->p.n; i++) {
        float un = 0.0f;
        uint32_t ovf = 0;
        float add = u ? dgc_rule_momentum(u0[i], g[i], pl->p.momentum, pl->p.nesterov, &un, &ovf) : g[i];
        const float vn = dgc_rule_accumulate(v0[i], add, &ovf);
        if (ovf) continue; /* saturated: the excess is lost, by design */
        CHECK(v[i] + dec[i] == vn);
        if (u) CHECK(u[i] == (sent[i] && pl->p.momentum_masking ? 0.0f : un));
    }
}

static void check_twins(const dgc_state *a, const dgc_state *b, uint64_t n) {
    CHECK(memcmp(dgc_state_residual(a), dgc_state_residual(b), n * sizeof(float)) == 0);
    if (dgc_state_momentum(a)) CHECK(memcmp(dgc_state_momentum(a), dgc_state_momentum(b), n * sizeof(float)) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < CHOICE_BYTES) return 0;
    const plan pl = read_plan(data);
    const uint64_t n = pl.p.n, k = pl.p.k;
    const size_t fb = n * sizeof(float), pbytes = dgc_wire_bytes(k);
    dgc_state *a = dgc_state_create(n, pl.with_u), *b = dgc_state_create(n, pl.with_u);
    float *gmem = malloc((pl.g_off + n) * sizeof(float)), *g = gmem + pl.g_off;
    float *omem = malloc((pl.out_off + n) * sizeof(float)), *out = omem + pl.out_off;
    float *g0 = malloc(fb), *v0 = malloc(fb), *u0 = malloc(fb), *dec = malloc(fb);
    char *pa = malloc(pbytes), *pb = malloc(pbytes);
    unsigned char *sent = malloc(n);
    CHECK(a && b && gmem && omem && g0 && v0 && u0 && dec && pa && pb && sent);
    memset(gmem, FILL, pl.g_off * sizeof(float));
    /* The twin's output and the floats before it, which must stay as they are. */
    float *zmem = pl.in_place ? gmem : omem, *z = pl.in_place ? g : out;
    const size_t zguard = (pl.in_place ? pl.g_off : pl.out_off) * sizeof(float);

    int bounded = 1; /* every gradient so far finite and below HUGE_GRAD */
    for (int s = 0; s < pl.steps; s++) {
        dgc_step_params p = pl.p;
        p.step = (uint64_t)s;
        fill_gradient(g, n, s, data + CHOICE_BYTES, size - CHOICE_BYTES, pl.tame);
        memcpy(g0, g, fb);
        memcpy(v0, dgc_state_residual(a), fb);
        if (pl.with_u) memcpy(u0, dgc_state_momentum(a), fb);
        memset(pa, 0xcd, pbytes); /* so unwritten slots show */
        memset(pb, 0xcd, pbytes);
        memset(omem, FILL, (pl.out_off + n) * sizeof(float));

        CHECK(dgc_compress(a, g, &p, pa) == 0);
        CHECK(memcmp(g, g0, fb) == 0); /* g is the caller's: read only */
        CHECK(dgc_compress_zeroing(b, g, &p, pb, z) == 1);
        for (uint64_t i = 0; i < n; i++) CHECK(is_pos_zero(z[i]));
        for (size_t i = 0; i < zguard; i++) CHECK(((unsigned char *)zmem)[i] == FILL);
        CHECK(memcmp(pa, pb, pbytes) == 0);

        const uint64_t nsel = dgc_last_selected(a);
        const uint32_t flags = check_payload(pa, &p, nsel, sent);
        int nonfinite = 0;
        float max_g = 0.0f;
        for (uint64_t i = 0; i < n; i++) {
            if (!isfinite(g0[i])) nonfinite = 1;
            else max_g = fmaxf(max_g, fabsf(g0[i]));
        }
        bounded = bounded && !nonfinite && max_g <= HUGE_GRAD;
        if (bounded) CHECK(flags == 0);
        if (nonfinite) CHECK(flags == DGC_WIRE_NONFINITE); /* Inf or NaN reaches the output */

        char err[256] = "";
        dgc_decode_result res = dgc_wire_decode(pa, 1, p.step, n, k, dec, err, sizeof err);
        CHECK(res == (flags ? DGC_DECODE_NONFINITE : DGC_DECODE_OK));
        if (res == DGC_DECODE_OK) {
            dgc_commit(a, &p);
            dgc_commit(b, &p);
            check_committed(a, &pl, pa, nsel, sent, dec, g0, v0, u0);
        } else { /* a non-finite step leaves the state as it was */
            dgc_discard(a);
            dgc_discard(b);
            CHECK(memcmp(dgc_state_residual(a), v0, fb) == 0);
            if (pl.with_u) CHECK(memcmp(dgc_state_momentum(a), u0, fb) == 0);
        }
        check_twins(a, b, n);
    }
    dgc_state_destroy(a);
    dgc_state_destroy(b);
    free(gmem);
    free(omem);
    free(g0);
    free(v0);
    free(u0);
    free(dec);
    free(pa);
    free(pb);
    free(sent);
    return 0;
}
