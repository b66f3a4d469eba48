/* compressor_bench: the host DGC engine against the machine's memory bandwidth
 * and against an exact top-k, all measured in the same run.
 *
 * For each configuration (momentum 0 and momentum 0.9 by default) it times one
 * DGC step on an n-element fp32 buffer, as the shim's MPI path takes it:
 *     dgc_compress_zeroing              (update u, v; sampled threshold; select; pack;
 *                                        the output zeroed in the same stream)
 *     dgc_compact_encode                (the payload as the all-gather carries it)
 *     dgc_compact_add of nranks payloads (this rank's replicated), read in place
 *     dgc_commit                        (swap in the update, mask the sent indices)
 * after a few warm steps, so the residual is non-zero and every buffer is
 * faulted in. The all-gather itself is not timed (it is the network's part).
 *
 * Roofline: the bytes the step must move at the least (read g, v [, u], write
 * v [, u], zero the n-element output, the plain payload read and the compact
 * one written by the encoder, nranks compact payloads read and the scatter
 * of nranks*k pairs into the output, and the k masking writes), divided by the copy bandwidth of a large memcpy in
 * the same run (counted as 2 x bytes / time). Fraction of roofline =
 * roofline time / engine time; 1.0 would be a step as fast as memcpy moving
 * the same bytes.
 *
 * Exact top-k baseline: what the sampled threshold avoids. Copy |v| of the
 * updated residual into scratch, quickselect the k-th largest over all n with
 * dgc_topk_kth_largest, collect the k indices. It does not include the update
 * pass that the engine also does, so the speedup is a lower bound.
 *
 * The machine this was written on has 2 shared cores: every figure is the best
 * of --reps repetitions (the median of the engine total is printed beside it),
 * and only ratios measured in the same run are meant to be compared. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "dgcshim/engine.h"
#include "dgcshim/policy.h"
#include "bench_util.h"
#include "dgcshim/wire.h"
#include "dgcshim/wire_compact.h"
#include "engine/topk.h"

typedef struct {
    uint64_t n;
    int nranks;
    double sparsity;
    double sample_ratio;
    unsigned value_bits;
    int reps;
    int warm;
    uint64_t copy_mb;
    double momenta[8];
    int nmomenta;
    int nesterov;
    int phases; /* reference kernels that split the engine's time by phase (default on) */
} options;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median_of(const double *t, int n) {
    double tmp[256];
    memcpy(tmp, t, (size_t)n * sizeof *t);
    qsort(tmp, (size_t)n, sizeof *tmp, cmp_double);
    return n % 2 ? tmp[n / 2] : 0.5 * (tmp[n / 2 - 1] + tmp[n / 2]);
}

static void *xmalloc(size_t bytes, const char *what) {
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) {
        fprintf(stderr, "compressor_bench: cannot allocate %zu bytes for %s\n", bytes, what);
        exit(1);
    }
    return p;
}

static uint64_t splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A gradient-like buffer: roughly normal values (Irwin-Hall of 4 uniforms)
 * whose scale changes every 64K elements over three decades, as it does from
 * layer to layer of a real network. */
static void fill_gradient(float *g, uint64_t n, uint64_t seed) {
    uint64_t x = seed;
    float scale = 1.0f;
    for (uint64_t i = 0; i < n; i++) {
        if ((i & 0xffff) == 0) scale = powf(10.0f, -3.0f * (float)(splitmix(&x) >> 40) / 16777216.0f);
        uint64_t r = splitmix(&x);
        float s = (float)(r & 0xffff) + (float)((r >> 16) & 0xffff) + (float)((r >> 32) & 0xffff) +
                  (float)(r >> 48);
        g[i] = scale * (s / 65536.0f - 2.0f);
    }
}

/* ---- memory bandwidth ------------------------------------------------------ */

/* Best copy bandwidth in bytes/s over reps memcpys of a bytes-sized buffer,
 * counted as 2 x bytes (read + write). */
static double copy_bandwidth(char *src, char *dst, size_t bytes, int reps) {
    double t[256] = {0};
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        memcpy(dst, src, bytes);
        t[r] = now_s() - t0;
        src[(size_t)r * 4096 % bytes] ^= 1; /* keep the copies from being merged */
    }
    return 2.0 * (double)bytes / best_of(t, reps);
}

/* ---- reference streaming kernels (phase split) ---------------------------- */

/* What the engine's update pass would cost on its own: the same streams and
 * (plain-momentum) arithmetic, no selection. */
static __attribute__((noinline)) uint32_t ref_update(const float *restrict g, const float *restrict v,
                                                     float *restrict vn, const float *restrict u,
                                                     float *restrict un, float m, uint64_t n,
                                                     float thr) {
    uint32_t hit = 0;
    if (!u) {
        for (uint64_t i = 0; i < n; i++) {
            float x = v[i] + g[i];
            vn[i] = x;
            hit |= (uint32_t)(fabsf(x) >= thr);
        }
    } else {
        for (uint64_t i = 0; i < n; i++) {
            float uu = m * u[i] + g[i];
            un[i] = uu;
            float x = v[i] + uu;
            vn[i] = x;
            hit |= (uint32_t)(fabsf(x) >= thr);
        }
    }
    return hit;
}

/* The same with non-temporal (streaming) stores, which skip the read for
 * ownership of the written lines. vn and un must be 16-byte aligned. Falls
 * back to ref_update without SSE2. */
static __attribute__((noinline)) uint32_t ref_update_nt(const float *restrict g, const float *restrict v,
                                                        float *restrict vn, const float *restrict u,
                                                        float *restrict un, float m, uint64_t n,
                                                        float thr) {
#ifdef __SSE2__
    const __m128 t = _mm_set1_ps(thr), mm = _mm_set1_ps(m);
    const __m128 absmask = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
    __m128 h = _mm_setzero_ps();
    uint64_t i = 0;
    if (!u) {
        for (; i + 4 <= n; i += 4) {
            __m128 x = _mm_add_ps(_mm_loadu_ps(v + i), _mm_loadu_ps(g + i));
            _mm_stream_ps(vn + i, x);
            h = _mm_or_ps(h, _mm_cmpge_ps(_mm_and_ps(x, absmask), t));
        }
    } else {
        for (; i + 4 <= n; i += 4) {
            __m128 uu = _mm_add_ps(_mm_mul_ps(mm, _mm_loadu_ps(u + i)), _mm_loadu_ps(g + i));
            _mm_stream_ps(un + i, uu);
            __m128 x = _mm_add_ps(_mm_loadu_ps(v + i), uu);
            _mm_stream_ps(vn + i, x);
            h = _mm_or_ps(h, _mm_cmpge_ps(_mm_and_ps(x, absmask), t));
        }
    }
    _mm_sfence();
    uint32_t hit = (uint32_t)_mm_movemask_ps(h) != 0;
    if (i < n)
        hit |= ref_update(g + i, v + i, vn + i, u ? u + i : NULL, u ? un + i : NULL, m, n - i, thr);
    return hit;
#else
    return ref_update(g, v, vn, u, un, m, n, thr);
#endif
}

/* Fraction of the len-element runs of a that hold an |a[i]| >= t. */
static double hit_fraction(const float *a, uint64_t n, uint64_t len, float t) {
    uint64_t runs = 0, hits = 0;
    for (uint64_t lo = 0; lo < n; lo += len, runs++) {
        uint64_t hi = lo + len < n ? lo + len : n;
        for (uint64_t i = lo; i < hi; i++)
            if (fabsf(a[i]) >= t) {
                hits++;
                break;
            }
    }
    return runs ? (double)hits / (double)runs : 0;
}

/* ---- the exact top-k baseline --------------------------------------------- */

static uint64_t exact_topk(const float *v, float *scratch, uint32_t *idx, uint64_t n, uint64_t k) {
    for (uint64_t i = 0; i < n; i++) scratch[i] = fabsf(v[i]);
    float t = dgc_topk_kth_largest(scratch, n, k - 1);
    uint64_t c = 0;
    for (uint64_t i = 0; i < n && c < k; i++)
        if (fabsf(v[i]) > t) idx[c++] = (uint32_t)i;
    for (uint64_t i = 0; i < n && c < k; i++)
        if (fabsf(v[i]) == t) idx[c++] = (uint32_t)i;
    return c;
}

/* ---- one configuration ---------------------------------------------------- */

typedef struct {
    double momentum;
    uint64_t n, k, selected;
    double bytes;
    double compress_ms, decode_ms, commit_ms, total_ms, total_med_ms;
    double roofline_ms, frac, frac_med;
    double exact_ms, speedup;
    /* phase split (off with --no-phases) */
    double ref_update_ms, ref_update_nt_ms, memset_ms, hit16, hit256;
} result;

typedef struct {
    float *g[2];
    float *out;
    float *vexact;
    float *scratch;
    uint32_t *idx;
    char *payload;  /* the plain payload */
    char *gathered; /* the compact payloads */
} buffers;

static int run_config(const options *o, buffers *b, double momentum, result *res) {
    uint64_t n = o->n;
    uint64_t k = dgc_k_for(n, 1.0 - o->sparsity);
    int with_u = momentum > 0;
    dgc_state *s = dgc_state_create(n, with_u);
    if (!s) {
        fprintf(stderr, "compressor_bench: dgc_state_create(%llu) failed\n", (unsigned long long)n);
        return -1;
    }
    dgc_step_params p = {0};
    p.k = k;
    p.momentum = (float)momentum;
    p.nesterov = o->nesterov;
    p.momentum_masking = 1;
    p.clip_norm = 0;
    p.nranks = o->nranks;
    p.sample_ratio = o->sample_ratio;
    p.value_bits = o->value_bits;
    dgc_compact_layout L;
    dgc_compact_layout_for(n, k, o->value_bits, &L);

    size_t pb = dgc_wire_bytes(k);
    char err[256];
    double tc[256] = {0}, td[256] = {0}, tm[256] = {0}, tt[256] = {0};
    uint64_t selected = 0;
    for (int it = 0; it < o->warm + o->reps; it++) {
        p.step = (uint64_t)it;
        const float *g = b->g[it & 1];
        double t0 = now_s();
        /* As the shim does: the output is zeroed by the update stream. */
        int zeroed = dgc_compress_zeroing(s, g, &p, b->payload, b->out);
        if (zeroed < 0 || dgc_compact_encode(b->payload, &L, b->gathered) != 0) {
            fprintf(stderr, "compressor_bench: dgc_compress or dgc_compact_encode failed\n");
            dgc_state_destroy(s);
            return -1;
        }
        if (!zeroed) memset(b->out, 0, n * sizeof(float)); /* the shim's output is always float-aligned */
        double t1 = now_s();
        /* The all-gather (untimed): every other rank sent the same payload. */
        for (int r = 1; r < o->nranks; r++) memcpy(b->gathered + (size_t)r * L.bytes, b->gathered, L.bytes);
        double t2 = now_s();
        int dr = dgc_compact_add(b->gathered, L.bytes, o->nranks, &L, 1.0f, b->out, err, sizeof err);
        double t3 = now_s();
        selected = dgc_last_selected(s);
        dgc_commit(s, &p);
        double t4 = now_s();
        if (dr != 0) {
            fprintf(stderr, "compressor_bench: dgc_compact_add failed: %s\n", err);
            dgc_state_destroy(s);
            return -1;
        }
        if (it >= o->warm) {
            int r = it - o->warm;
            tc[r] = t1 - t0;
            td[r] = t3 - t2;
            tm[r] = t4 - t3;
            tt[r] = (t1 - t0) + (t4 - t2);
        }
    }

    /* The array the exact baseline selects from: the next step's updated
     * residual, v + (m*u + g), the same array dgc_compress selects from. */
    const float *v = dgc_state_residual(s);
    const float *u = dgc_state_momentum(s);
    const float *g = b->g[(o->warm + o->reps) & 1];
    for (uint64_t i = 0; i < n; i++) b->vexact[i] = v[i] + (u ? p.momentum * u[i] + g[i] : g[i]);
    double te[256] = {0};
    for (int r = 0; r < o->reps; r++) {
        double t0 = now_s();
        uint64_t c = exact_topk(b->vexact, b->scratch, b->idx, n, k);
        te[r] = now_s() - t0;
        if (c != k) fprintf(stderr, "compressor_bench: exact top-k found %llu of %llu\n",
                            (unsigned long long)c, (unsigned long long)k);
    }

    res->ref_update_ms = res->ref_update_nt_ms = res->memset_ms = 0;
    res->hit16 = res->hit256 = 0;
    if (o->phases) {
        /* Same streams as the update pass, into the scratch arrays we own. */
        float *un = with_u ? b->scratch : NULL;
        double tr[256] = {0}, trn[256] = {0}, tz[256] = {0};
        float thr = 1e30f;
        for (int r = 0; r < o->reps; r++) {
            double t0 = now_s();
            uint32_t h = ref_update(g, v, b->vexact, u, un, p.momentum, n, thr);
            tr[r] = now_s() - t0;
            t0 = now_s();
            h |= ref_update_nt(g, v, b->vexact, u, un, p.momentum, n, thr);
            trn[r] = now_s() - t0;
            thr = h ? thr * 2 : thr; /* keep h live */
            t0 = now_s();
            memset(b->out, 0, n * sizeof(float));
            tz[r] = now_s() - t0;
        }
        /* How sparse the candidates are, with the threshold at the 2k-th
         * largest |v| (what the engine's sampled threshold aims at). */
        uint64_t want = 2 * k < n ? 2 * k : n;
        for (uint64_t i = 0; i < n; i++) b->scratch[i] = fabsf(b->vexact[i]);
        float t2k = dgc_topk_kth_largest(b->scratch, n, want - 1);
        res->hit16 = hit_fraction(b->vexact, n, 16, t2k);
        res->hit256 = hit_fraction(b->vexact, n, 256, t2k);
        res->ref_update_ms = 1e3 * best_of(tr, o->reps);
        res->ref_update_nt_ms = 1e3 * best_of(trn, o->reps);
        res->memset_ms = 1e3 * best_of(tz, o->reps);
    }

    /* Bytes the step must move: the streams, the zero fill, the encoder
     * (plain payload in, compact out), the nranks compact payloads read and
     * the scatter of their nranks*k pairs (output read-modify-write 8 B), and
     * the k masking writes per state array. */
    double streams = with_u ? 20.0 : 12.0;
    double bytes = streams * (double)n + 4.0 * (double)n + (double)pb + (double)L.bytes +
                   (double)o->nranks * ((double)L.bytes + 8.0 * (double)k) + 4.0 * (double)k * (with_u ? 2 : 1);

    res->momentum = momentum;
    res->n = n;
    res->k = k;
    res->selected = selected;
    res->bytes = bytes;
    res->compress_ms = 1e3 * best_of(tc, o->reps);
    res->decode_ms = 1e3 * best_of(td, o->reps);
    res->commit_ms = 1e3 * best_of(tm, o->reps);
    res->total_ms = 1e3 * best_of(tt, o->reps);
    res->total_med_ms = 1e3 * median_of(tt, o->reps);
    res->exact_ms = 1e3 * best_of(te, o->reps);
    res->speedup = res->exact_ms / res->total_ms;
    dgc_state_destroy(s);
    return 0;
}

/* ---- command line ----------------------------------------------------------- */

static void usage(FILE *f) {
    fprintf(f,
            "usage: compressor_bench [options]\n"
            "  --n N              elements of the fp32 buffer (default 25000000, ResNet-50)\n"
            "  --ranks N          payloads to decode, this rank's replicated (default 4)\n"
            "  --sparsity S       DGC sparsity, k = ceil((1-S)*n) (default 0.999)\n"
            "  --sample-ratio R   DGC_SAMPLE_RATIO for the threshold sample (default 0.01)\n"
            "  --value-bits B     DGC_VALUE_BITS of the compact payload, 16 or 32 (default 16)\n"
            "  --momentum LIST    comma-separated momenta, one configuration each (default 0,0.9)\n"
            "  --nesterov         Nesterov momentum\n"
            "  --reps N           timed repetitions; the best is reported (default 7)\n"
            "  --warm N           untimed warm steps before them (default 3)\n"
            "  --copy-mb N        buffer for the memcpy bandwidth (default 256)\n"
            "  --no-phases        skip the reference kernels that split the engine's time\n");
}

static int parse_double(const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end) return -1;
    *out = v;
    return 0;
}

static int parse_args(int argc, char **argv, options *o) {
    o->n = 25000000;
    o->nranks = 4;
    o->sparsity = 0.999;
    o->sample_ratio = 0.01;
    o->value_bits = 16;
    o->reps = 7;
    o->warm = 3;
    o->copy_mb = 256;
    o->momenta[0] = 0.0;
    o->momenta[1] = 0.9;
    o->nmomenta = 2;
    o->nesterov = 0;
    o->phases = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t u;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        } else if (!strcmp(a, "--nesterov")) {
            o->nesterov = 1;
            continue;
        } else if (!strcmp(a, "--no-phases")) {
            o->phases = 0;
            continue;
        }
        static const char *const valued[] = {"--n",    "--ranks",   "--sparsity", "--sample-ratio", "--reps",
                                             "--warm", "--copy-mb", "--momentum", "--value-bits"};
        int known = 0;
        for (size_t j = 0; j < sizeof valued / sizeof *valued; j++) known |= !strcmp(a, valued[j]);
        if (!known) {
            fprintf(stderr, "compressor_bench: unknown option %s\n", a);
            usage(stderr);
            return -1;
        }
        if (!val) {
            fprintf(stderr, "compressor_bench: %s needs a value\n", a);
            return -1;
        }
        i++;
        if (!strcmp(a, "--n")) {
            if (parse_u64(val, &o->n) || o->n < 1 || o->n > UINT32_MAX) goto bad;
        } else if (!strcmp(a, "--ranks")) {
            if (parse_u64(val, &u) || u < 1 || u > 1024) goto bad;
            o->nranks = (int)u;
        } else if (!strcmp(a, "--sparsity")) {
            if (parse_double(val, &o->sparsity) || !(o->sparsity >= 0 && o->sparsity < 1)) goto bad;
        } else if (!strcmp(a, "--sample-ratio")) {
            if (parse_double(val, &o->sample_ratio) || !(o->sample_ratio > 0 && o->sample_ratio <= 1))
                goto bad;
        } else if (!strcmp(a, "--value-bits")) {
            if (parse_u64(val, &u) || (u != 16 && u != 32)) goto bad;
            o->value_bits = (unsigned)u;
        } else if (!strcmp(a, "--reps")) {
            if (parse_u64(val, &u) || u < 1 || u > 256) goto bad;
            o->reps = (int)u;
        } else if (!strcmp(a, "--warm")) {
            if (parse_u64(val, &u) || u > 1000) goto bad;
            o->warm = (int)u;
        } else if (!strcmp(a, "--copy-mb")) {
            if (parse_u64(val, &o->copy_mb) || o->copy_mb < 1 || o->copy_mb > 2048) goto bad;
        } else if (!strcmp(a, "--momentum")) {
            char buf[256];
            snprintf(buf, sizeof buf, "%s", val);
            o->nmomenta = 0;
            for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
                if (o->nmomenta == 8) goto bad;
                double m;
                if (parse_double(tok, &m) || !(m >= 0 && m < 1)) goto bad;
                o->momenta[o->nmomenta++] = m;
            }
            if (o->nmomenta == 0) goto bad;
        }
        continue;
    bad:
        fprintf(stderr, "compressor_bench: bad value for %s: %s\n", a, val);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv) {
    options o;
    if (parse_args(argc, argv, &o)) return 2;
    uint64_t n = o.n;
    uint64_t kmax = dgc_k_for(n, 1.0 - o.sparsity);
    size_t copy_bytes = (size_t)o.copy_mb << 20;

    buffers b;
    b.g[0] = xmalloc(n * sizeof(float), "gradient 0");
    b.g[1] = xmalloc(n * sizeof(float), "gradient 1");
    b.out = xmalloc(n * sizeof(float), "output");
    b.vexact = xmalloc(n * sizeof(float), "exact input");
    b.scratch = xmalloc(n * sizeof(float), "exact scratch");
    b.idx = xmalloc(kmax * sizeof(uint32_t), "exact indices");
    dgc_compact_layout Lmax;
    dgc_compact_layout_for(n, kmax, o.value_bits, &Lmax);
    b.payload = xmalloc(dgc_wire_bytes(kmax), "payload");
    b.gathered = xmalloc((size_t)o.nranks * Lmax.bytes, "gathered payloads");
    char *csrc = xmalloc(copy_bytes, "copy source");
    char *cdst = xmalloc(copy_bytes, "copy destination");
    fill_gradient(b.g[0], n, 1);
    fill_gradient(b.g[1], n, 2);
    memset(b.out, 0, n * sizeof(float));
    memset(b.vexact, 0, n * sizeof(float));
    memset(b.scratch, 0, n * sizeof(float));
    memset(b.payload, 0, dgc_wire_bytes(kmax));
    memset(b.gathered, 0, (size_t)o.nranks * Lmax.bytes);
    memset(csrc, 1, copy_bytes);
    memset(cdst, 0, copy_bytes);

    /* Copy bandwidth before, between and after the configurations, the best
     * of all: a shared machine can be busy during any one of them. */
    double bw = copy_bandwidth(csrc, cdst, copy_bytes, o.reps);
    int copy_rounds = 1;
    result res[8];
    for (int c = 0; c < o.nmomenta; c++) {
        if (run_config(&o, &b, o.momenta[c], &res[c])) return 1;
        double bw2 = copy_bandwidth(csrc, cdst, copy_bytes, o.reps);
        copy_rounds++;
        if (bw2 > bw) bw = bw2;
    }
    for (int c = 0; c < o.nmomenta; c++) {
        res[c].roofline_ms = 1e3 * res[c].bytes / bw;
        res[c].frac = res[c].roofline_ms / res[c].total_ms;
        res[c].frac_med = res[c].roofline_ms / res[c].total_med_ms;
    }

    printf("# compressor_bench: host DGC engine, one step = dgc_compress_zeroing + dgc_compact_encode + "
           "dgc_compact_add + dgc_commit (%u-bit values)\n", o.value_bits);
    printf("# n %llu fp32, sparsity %g (k = %llu), sample_ratio %g, ranks decoded %d, nesterov %d, "
           "momentum masking 1\n",
           (unsigned long long)n, o.sparsity, (unsigned long long)kmax, o.sample_ratio, o.nranks, o.nesterov);
    printf("# %d warm steps, best of %d timed steps (med = median engine total); single thread\n", o.warm,
           o.reps);
    printf("# copy bandwidth (memcpy %llu MB, 2 x bytes / time, best of %d x %d rounds around the configurations):"
           " %.2f GB/s\n",
           (unsigned long long)o.copy_mb, o.reps, copy_rounds, bw / 1e9);
    printf("# bytes = (12 B/elem, 20 with momentum) streams + 4 B/elem zero fill + encoder (plain in, compact out)"
           " + per rank its compact payload and 8 B per pair scattered + masking; roofline = bytes / copy bandwidth\n");
    printf("# exact = |v| copy + quickselect k-th largest over all n + index collection (no update pass)\n");
    printf("#\n");
    printf("# %10s %9s %5s %9s %9s %9s %9s %9s %9s %9s %7s %6s %9s %8s\n", "", "", "", "", "compress",
           "dec+com", "total", "med", "roofline", "eff bw", "frac", "frac", "exact", "speedup");
    printf("# %10s %9s %5s %9s %9s %9s %9s %9s %9s %9s %7s %6s %9s %8s\n", "n", "k", "mom", "bytes(MB)",
           "(ms)", "(ms)", "(ms)", "(ms)", "(ms)", "(GB/s)", "roof", "(med)", "(ms)", "vs exact");
    for (int c = 0; c < o.nmomenta; c++) {
        const result *r = &res[c];
        printf("  %10llu %9llu %5.2f %9.1f %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %7.3f %6.3f %9.2f %7.1fx\n",
               (unsigned long long)r->n, (unsigned long long)r->k, r->momentum, r->bytes / 1e6,
               r->compress_ms, r->decode_ms + r->commit_ms, r->total_ms, r->total_med_ms, r->roofline_ms,
               r->bytes / (r->total_ms * 1e-3) / 1e9, r->frac, r->frac_med, r->exact_ms, r->speedup);
    }
    for (int c = 0; c < o.nmomenta; c++) {
        const result *r = &res[c];
        if (r->selected != r->k)
            printf("# note: momentum %.2f selected %llu of k = %llu\n", r->momentum,
                   (unsigned long long)r->selected, (unsigned long long)r->k);
    }
    if (o.phases) {
        printf("#\n# phase split, ms, best of %d. compress (with the encode) zeroes the output inside its update\n"
               "# stream (dgc_compress_zeroing, as the shim calls it), so decode is the in-place sum alone. ref update:\n"
               "# the update pass's streams and arithmetic alone, no selection, no zeroing, with plain and\n"
               "# with non-temporal stores; ref memset: a separate zero-fill pass, for comparison;\n"
               "# overhead = compress - the faster ref update (sample, candidate scan, top k, pack, zeroing, encode).\n"
               "# hit16/hit256: share of 16- and 256-element runs holding a |v| >= the 2k-th largest.\n",
               o.reps);
        printf("# %5s %9s %10s %10s %10s %10s %9s %8s %7s %7s\n", "mom", "compress", "ref upd",
               "ref upd NT", "ref memset", "overhead", "decode", "commit", "hit16", "hit256");
        for (int c = 0; c < o.nmomenta; c++) {
            const result *r = &res[c];
            double ref = r->ref_update_ms < r->ref_update_nt_ms ? r->ref_update_ms : r->ref_update_nt_ms;
            printf("  %5.2f %9.2f %10.2f %10.2f %10.2f %10.2f %9.2f %8.2f %6.2f%% %6.1f%%\n", r->momentum,
                   r->compress_ms, r->ref_update_ms, r->ref_update_nt_ms, r->memset_ms, r->compress_ms - ref,
                   r->decode_ms, r->commit_ms, 100.0 * r->hit16, 100.0 * r->hit256);
        }
    }
    printf("#\n# csv,n,k,ranks,momentum,sample_ratio,bytes,compress_ms,decode_ms,commit_ms,total_ms,"
           "total_median_ms,copy_gbps,roofline_ms,frac_roofline,exact_ms,speedup_vs_exact,selected\n");
    for (int c = 0; c < o.nmomenta; c++) {
        const result *r = &res[c];
        printf("csv,%llu,%llu,%d,%g,%g,%.0f,%.4f,%.4f,%.4f,%.4f,%.4f,%.3f,%.4f,%.4f,%.4f,%.3f,%llu\n",
               (unsigned long long)r->n, (unsigned long long)r->k, o.nranks, r->momentum, o.sample_ratio,
               r->bytes, r->compress_ms, r->decode_ms, r->commit_ms, r->total_ms, r->total_med_ms, bw / 1e9,
               r->roofline_ms, r->frac, r->exact_ms, r->speedup, (unsigned long long)r->selected);
    }

    free(b.g[0]);
    free(b.g[1]);
    free(b.out);
    free(b.vexact);
    free(b.scratch);
    free(b.idx);
    free(b.payload);
    free(b.gathered);
    free(csrc);
    free(cdst);
    return 0;
}
