/* compact_bench: the compact payload's encoder and expander (shim/wire/compact.c)
 * against memcpy, measured in the same run.
 *
 * For each k and value width it builds one realistic plain payload of k pairs
 * out of n: distinct random sorted indices (selection sampling) and gaussian
 * values, which with 16 bits are rounded as the engine sends them
 * (dgc_compact_scale16, dgc_compact_value). It then times
 *     dgc_compact_encode   plain -> compact
 *     dgc_compact_expand   compact -> plain (what each rank does for every
 *                          other rank's payload, every step)
 *     memcpy               of the plain payload's bytes (8 per pair)
 * and prints ns per pair and each codec time over memcpy's: a ratio of 1.0
 * would be a codec as fast as copying the plain payload. The expanded payload
 * is checked against the original before timing.
 *
 * Every figure is the best of --reps repetitions; a repetition of a small
 * payload loops until it has handled at least 2^24 pairs, so that the clock's
 * resolution does not matter. Only ratios measured in the same run are meant
 * to be compared: the machine this was written on has 2 shared cores. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "dgcshim/wire.h"
#include "dgcshim/wire_compact.h"

#define MAX_KS 8
#define MAX_REPS 256

typedef struct {
    uint64_t n;
    uint64_t ks[MAX_KS];
    int nks;
    unsigned bits[2];
    int nbits;
    int ranks;
    int reps;
} options;

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng_next(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static double rng_unit(void) { return ((double)(rng_next() >> 11) + 0.5) / 9007199254740992.0; } /* (0, 1) */

static double rng_gauss(void) { return sqrt(-2.0 * log(rng_unit())) * cos(6.283185307179586 * rng_unit()); }

/* A plain payload of k slots, all real pairs: count = k indices chosen
 * uniformly below n, sorted; values N(0, 1e-3) on the 16-bit grid when vb 16. */
static char *make_plain(uint64_t n, uint64_t k, unsigned vb) {
    char *p = calloc(1, dgc_wire_bytes(k));
    if (!p) return NULL;
    dgc_wire_header h = {DGC_WIRE_MAGIC, 0, 1, n, k};
    memcpy(p, &h, sizeof h);
    uint32_t *idx = dgc_wire_indices(p);
    float *val = dgc_wire_values(p, k);
    uint64_t chosen = 0;
    for (uint64_t i = 0; i < n && chosen < k; i++)
        if (rng_next() % (n - i) < k - chosen) idx[chosen++] = (uint32_t)i;
    for (uint64_t j = 0; j < k; j++) {
        float x = (float)(1e-3 * rng_gauss());
        val[j] = x != 0.0f ? x : 1e-3f; /* a trailing (0, +0.0) would be padding */
    }
    if (vb == 16) {
        const int e = dgc_compact_scale16(val, k);
        for (uint64_t j = 0; j < k; j++) val[j] = dgc_compact_value(val[j], 16, e);
    }
    return p;
}

/* Repetitions of a small payload loop this often, so that one handles at
 * least 2^24 pairs. */
static uint64_t inner_for(uint64_t k) { return k >= (UINT64_C(1) << 24) ? 1 : ((UINT64_C(1) << 24) + k - 1) / k; }

static int run_one(const options *o, uint64_t k, unsigned vb) {
    const uint64_t n = o->n;
    dgc_compact_layout L;
    dgc_compact_layout_for(n, k, vb, &L);
    const size_t plain_bytes = dgc_wire_bytes(k);
    char *plain = make_plain(n, k, vb), *back = malloc(plain_bytes), *copy = malloc(plain_bytes);
    unsigned char *compact = malloc(L.bytes);
    char err[256] = "";
    int rc = -1;
    if (!plain || !back || !copy || !compact) {
        fprintf(stderr, "compact_bench: out of memory for k %llu\n", (unsigned long long)k);
        goto out;
    }
    if (dgc_compact_encode(plain, &L, compact) != 0) {
        fprintf(stderr, "compact_bench: encode refused the payload (k %llu, %u bits)\n", (unsigned long long)k, vb);
        goto out;
    }
    if (dgc_compact_expand(compact, &L, 0, back, err, sizeof err) != 0 || memcmp(back, plain, plain_bytes) != 0) {
        fprintf(stderr, "compact_bench: round trip failed (k %llu, %u bits): %s\n", (unsigned long long)k, vb, err);
        goto out;
    }

    const uint64_t inner = inner_for(k);
    volatile unsigned char sink = 0;
    double te[MAX_REPS] = {0}, tx[MAX_REPS] = {0}, tm[MAX_REPS] = {0};
    for (int r = 0; r < o->reps; r++) {
        double t0 = now_s();
        for (uint64_t i = 0; i < inner; i++) rc = dgc_compact_encode(plain, &L, compact);
        double t1 = now_s();
        for (uint64_t i = 0; i < inner; i++) rc |= dgc_compact_expand(compact, &L, 0, back, err, sizeof err);
        double t2 = now_s();
        for (uint64_t i = 0; i < inner; i++) {
            memcpy(copy, plain, plain_bytes);
            sink = sink + (unsigned char)copy[i % plain_bytes]; /* each copy is read: none can be dropped */
        }
        double t3 = now_s();
        te[r] = (t1 - t0) / (double)inner;
        tx[r] = (t2 - t1) / (double)inner;
        tm[r] = (t3 - t2) / (double)inner;
        if (rc != 0) {
            fprintf(stderr, "compact_bench: a timed call failed (k %llu, %u bits): %s\n", (unsigned long long)k, vb,
                    err);
            rc = -1;
            goto out;
        }
    }
    const double enc = best_of(te, o->reps), exp_ = best_of(tx, o->reps), cpy = best_of(tm, o->reps);
    const double per = 1e9 / (double)k;
    printf("%10llu %10llu %4u %2u %10zu %9.3f %9.3f %9.3f %7.2f %7.2f\n", (unsigned long long)n,
           (unsigned long long)k, vb, L.low_bits, L.bytes, enc * per, exp_ * per, cpy * per, enc / cpy, exp_ / cpy);
    fflush(stdout);
    rc = 0;
out:
    free(plain);
    free(back);
    free(copy);
    free(compact);
    return rc;
}

/* The sum of o->ranks payloads of k pairs into an n-float output, as a rank
 * decodes a step: expanding each into the plain layout then adding the plain
 * pairs (dgc_compact_expand, dgc_wire_decode_zeroed: the way before
 * wire/sum.c), against dgc_compact_add reading them in place. Both start
 * from a zeroed output; their outputs are compared bit for bit first. */
static int run_sum(const options *o, uint64_t k, unsigned vb) {
    const uint64_t n = o->n;
    const int R = o->ranks;
    dgc_compact_layout L;
    dgc_compact_layout_for(n, k, vb, &L);
    const size_t plain_bytes = dgc_wire_bytes(k);
    unsigned char *compact = malloc(L.bytes * (size_t)R);
    char *gathered = malloc(plain_bytes * (size_t)R);
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    char err[256] = "";
    int rc = -1;
    if (!compact || !gathered || !a || !b) {
        fprintf(stderr, "compact_bench: out of memory for the sum of k %llu\n", (unsigned long long)k);
        goto out;
    }
    for (int r = 0; r < R; r++) {
        char *plain = make_plain(n, k, vb);
        if (!plain || dgc_compact_encode(plain, &L, compact + (size_t)r * L.bytes) != 0) {
            fprintf(stderr, "compact_bench: could not make rank %d's payload\n", r);
            free(plain);
            goto out;
        }
        free(plain);
    }
    double tx[MAX_REPS] = {0}, ta[MAX_REPS] = {0};
    for (int rep = 0; rep < o->reps; rep++) {
        memset(a, 0, n * sizeof *a);
        memset(b, 0, n * sizeof *b);
        double t0 = now_s();
        int bad = 0;
        for (int r = 0; r < R; r++)
            bad |= dgc_compact_expand(compact + (size_t)r * L.bytes, &L, r, gathered + (size_t)r * plain_bytes, err,
                                      sizeof err);
        bad |= dgc_wire_decode_zeroed(gathered, R, 1, n, k, a, err, sizeof err) != DGC_DECODE_OK;
        double t1 = now_s();
        bad |= dgc_compact_add(compact, L.bytes, R, &L, 1.0f, b, err, sizeof err);
        double t2 = now_s();
        if (bad || memcmp(a, b, n * sizeof *a) != 0) {
            fprintf(stderr, "compact_bench: the two sums differ or failed (k %llu, %u bits): %s\n",
                    (unsigned long long)k, vb, err);
            goto out;
        }
        tx[rep] = t1 - t0;
        ta[rep] = t2 - t1;
    }
    const double ex = best_of(tx, o->reps), ad = best_of(ta, o->reps), per = 1e9 / ((double)k * R);
    printf("%10llu %10llu %4u %5d %11.2f %11.2f %9.3f %9.3f %7.2f\n", (unsigned long long)n, (unsigned long long)k,
           vb, R, 1e3 * ex, 1e3 * ad, ex * per, ad * per, ex / ad);
    fflush(stdout);
    rc = 0;
out:
    free(compact);
    free(gathered);
    free(a);
    free(b);
    return rc;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: compact_bench [--n N] [--k K[,K...]] [--bits 16|32|16,32] [--ranks R] [--reps R]\n"
            "  --n     indices below N (default 8388608)\n"
            "  --k     pairs per payload, all real (default 2097152,8389)\n"
            "  --bits  value widths (default 16,32)\n"
            "  --ranks payloads summed into one output (default 8)\n"
            "  --reps  repetitions, best taken (default 7)\n");
}

/* A comma-separated list of at most cap values in [lo, hi]. */
static int parse_list(const char *s, uint64_t *out, int cap, uint64_t lo, uint64_t hi) {
    char buf[256];
    int count = 0;
    snprintf(buf, sizeof buf, "%s", s);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        uint64_t v;
        if (count == cap || parse_u64(tok, &v) || v < lo || v > hi) return -1;
        out[count++] = v;
    }
    return count ? count : -1;
}

static int parse_args(int argc, char **argv, options *o) {
    o->n = 8388608;
    o->ks[0] = 2097152;
    o->ks[1] = 8389;
    o->nks = 2;
    o->bits[0] = 16;
    o->bits[1] = 32;
    o->nbits = 2;
    o->reps = 7;
    o->ranks = 8;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t u, list[MAX_KS];
        int c;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        }
        if (strcmp(a, "--n") && strcmp(a, "--k") && strcmp(a, "--bits") && strcmp(a, "--reps") &&
            strcmp(a, "--ranks")) {
            fprintf(stderr, "compact_bench: unknown option %s\n", a);
            usage(stderr);
            return -1;
        }
        if (!val) {
            fprintf(stderr, "compact_bench: %s needs a value\n", a);
            return -1;
        }
        i++;
        if (!strcmp(a, "--n")) {
            if (parse_u64(val, &o->n) || o->n < 1 || o->n > UINT32_MAX) goto bad;
        } else if (!strcmp(a, "--k")) {
            if ((c = parse_list(val, o->ks, MAX_KS, 1, UINT32_MAX)) < 0) goto bad;
            o->nks = c;
        } else if (!strcmp(a, "--bits")) {
            if ((c = parse_list(val, list, 2, 16, 32)) < 0) goto bad;
            for (int j = 0; j < c; j++) {
                if (list[j] != 16 && list[j] != 32) goto bad;
                o->bits[j] = (unsigned)list[j];
            }
            o->nbits = c;
        } else if (!strcmp(a, "--ranks")) {
            if (parse_u64(val, &u) || u < 1 || u > 4096) goto bad;
            o->ranks = (int)u;
        } else {
            if (parse_u64(val, &u) || u < 1 || u > MAX_REPS) goto bad;
            o->reps = (int)u;
        }
        continue;
    bad:
        fprintf(stderr, "compact_bench: bad value for %s: %s\n", a, val);
        return -1;
    }
    for (int j = 0; j < o->nks; j++)
        if (o->ks[j] > o->n) {
            fprintf(stderr, "compact_bench: k %llu is more than n %llu\n", (unsigned long long)o->ks[j],
                    (unsigned long long)o->n);
            return -1;
        }
    return 0;
}

int main(int argc, char **argv) {
    options o;
    if (parse_args(argc, argv, &o)) return 2;
    printf("compact_bench: best of %d; ns per pair, and each codec's time over memcpy of the plain payload\n",
           o.reps);
    printf("%10s %10s %4s %2s %10s %9s %9s %9s %7s %7s\n", "n", "k", "bits", "L", "bytes", "encode", "expand",
           "memcpy", "enc/cp", "exp/cp");
    for (int b = 0; b < o.nbits; b++)
        for (int j = 0; j < o.nks; j++)
            if (run_one(&o, o.ks[j], o.bits[b])) return 1;
    printf("\n# the sum of --ranks payloads into one output: expand each then add the plain pairs, against\n"
           "# dgc_compact_add reading them in place; ms, ns per pair, and the first over the second\n");
    printf("%10s %10s %4s %5s %11s %11s %9s %9s %7s\n", "n", "k", "bits", "ranks", "expand+add", "compact_add",
           "ns/pair", "ns/pair", "speedup");
    for (int b = 0; b < o.nbits; b++)
        for (int j = 0; j < o.nks; j++)
            if (run_sum(&o, o.ks[j], o.bits[b])) return 1;
    return 0;
}
