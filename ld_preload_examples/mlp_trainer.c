/* A data-parallel MLP trainer on Fashion-MNIST, in plain C and MPI.
 *
 * An ordinary MPI program: it knows nothing of dgcshim. Run it as is for
 * dense data-parallel SGD, or under LD_PRELOAD=libdgcshim.so to have its one
 * gradient all-reduce per step replaced by Deep Gradient Compression.
 *
 *   mpirun -np 4 ./mlp_trainer [--epochs 5] [--hidden 512,512] [--lr 0.05] ...
 *   mpirun -np 4 -x LD_PRELOAD=$PWD/libdgcshim.so -x DGC_MOMENTUM=0.9 ./mlp_trainer
 *   mpirun -np 4 -x LD_PRELOAD=$PWD/libdgcshim.so -x DGC_MOMENTUM=0.9 -x DGC_COMPENSATE=0 \
 *          ./mlp_trainer --momentum 0
 * (with the shim's default DGC_COMPENSATE=1 the optimizer keeps its momentum;
 * with DGC_COMPENSATE=0, the DGC paper's way, set it to 0).
 *
 * Model: 784 - hidden... - 10, ReLU, softmax cross-entropy, He (Kaiming)
 * normal initialisation from --seed, identical on every rank. Inputs are
 * standardised pixels (v / 255 - mean) / std with the training set's mean and
 * std. Parameter layout, layer after layer: W_l input-major [in][out] (row i
 * holds the weights leaving input i), then b_l [out].
 *
 * What matters to the shim:
 *   - every parameter (all weights and biases) lives in ONE contiguous float
 *     buffer, every gradient in ONE contiguous float buffer of the same
 *     layout, both allocated once and reused every step (the shim keeps its
 *     residual per buffer address);
 *   - each step calls exactly one
 *       MPI_Allreduce(MPI_IN_PLACE, grad, nparams, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD)
 *     and every rank makes the same number of steps;
 *   - then grad /= nranks and SGD with momentum:
 *       g = grad + wd * w;  buf = m * buf + g;  w -= lr_t * buf
 *     with lr_t = lr (1 + cos(pi t / T)) / 2 over the run's T steps (--lr-schedule
 *     cosine, the default) or lr_t = lr (constant).
 *   Metrics go through MPI_Allreduce on doubles (passed through by the shim).
 *
 * Kernels: every product is C += A * B with rows of C and B contiguous (an
 * axpy GCC vectorises), skipping the zeros of A: the ReLU zeros of the
 * activations and deltas, and the black background of the images (kept at 0 by
 * folding the input mean into layer 0's bias, see forward()). The backward
 * pass reads an output-major copy of W_l (l >= 1), refreshed after each step.
 * The kernels are built for AVX-512, AVX2+FMA and baseline x86-64, picked at
 * load time. No allocation after start-up.
 *
 * Data: rank 0 reads the IDX files ({train,t10k}-{images-idx3,labels-idx1}-ubyte.gz,
 * gzip or plain) with zlib, checks them and broadcasts them. Rank r trains on
 * the contiguous shard [r*n/N, (r+1)*n/N) of the training set, shuffled every
 * epoch with a PRNG seeded by (seed, rank, epoch); steps per epoch =
 * (smallest shard) / batch. The test set is split across ranks for evaluation.
 *
 * Output (rank 0, stdout), one line per epoch and one at the end:
 *   epoch E loss L test_acc A epoch_s T comm_s C compute_s P test_loss TL eval_s V
 *   final test_acc A params N steps S wall_s T comm_s C compute_s P weights_identical 1
 * loss: mean training cross-entropy of the epoch over all ranks' samples;
 * epoch_s: wall time of the epoch's training steps (evaluation excluded);
 * comm_s: rank 0's time inside the gradient MPI_Allreduce; compute_s: rank 0's
 * time in forward, backward and the optimizer step; eval_s: test evaluation.
 * final wall_s: the whole training loop, evaluations included. weights_identical:
 * 1 when every rank ends with bitwise the same parameters. */
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#ifdef __SSE__
#include <xmmintrin.h>
#endif

#define INPUT_DIM 784
#define NUM_CLASSES 10
#define MAX_LAYERS 17 /* up to 16 hidden layers */
#define EVAL_ROWS 256 /* rows per evaluation chunk */

#define DEFAULT_DATA_DIR "/usr/share/datasets/fashion-mnist"

/* The dense kernels are compiled for AVX2+FMA and AVX-512 besides the baseline
 * x86-64, chosen at load time (GCC function multiversioning), so the binary
 * stays portable while using the host's vector units. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define KERNEL __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define KERNEL
#endif

/* ------------------------------------------------------------------------ */
/* Options                                                                   */

typedef struct {
    const char *data_dir;
    int hidden[MAX_LAYERS];
    int nhidden;
    int epochs;
    int batch;
    double lr;
    int cosine; /* 1: lr * (1 + cos(pi t / T)) / 2 over the T steps of the run; 0: constant */
    double momentum;
    double weight_decay;
    uint64_t seed;
    long train_limit; /* 0 = all */
    long test_limit;  /* 0 = all */
} options;

static int g_rank = 0;

static void usage(FILE *f) {
    fprintf(f,
            "usage: mlp_trainer [options]\n"
            "  --data DIR            IDX files directory (default " DEFAULT_DATA_DIR ")\n"
            "  --hidden LIST         hidden layer sizes, comma separated (default 512,512; '' = none)\n"
            "  --epochs N            epochs (default 5)\n"
            "  --batch N             minibatch per rank (default 32)\n"
            "  --lr X                learning rate (default 0.05)\n"
            "  --lr-schedule S       cosine (decay to 0 over the run, per step) or constant (default cosine)\n"
            "  --momentum X          SGD momentum in [0,1) (default 0.9; 0 under DGC_COMPENSATE=0)\n"
            "  --weight-decay X      L2 weight decay (default 0)\n"
            "  --seed N              seed for initialisation and shuffling (default 1)\n"
            "  --train-limit N       use only the first N training images (default all)\n"
            "  --test-limit N        use only the first N test images (default all)\n"
            "  --help                this text\n");
}

/* Every rank parses the same argv, so every rank reaches the same verdict. */
static int bad_option(const char *opt, const char *val, const char *want) {
    if (g_rank == 0) fprintf(stderr, "mlp_trainer: error: invalid %s '%s': expected %s\n", opt, val, want);
    return -1;
}

static int parse_long(const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end != '\0' || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

static int parse_double(const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end != '\0' || !(v >= lo && v <= hi)) return -1;
    *out = v;
    return 0;
}

static int parse_hidden(const char *s, options *o) {
    o->nhidden = 0;
    if (*s == '\0') return 0;
    const char *p = s;
    for (;;) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < 1 || v > 65536 || o->nhidden >= MAX_LAYERS - 1) return -1;
        o->hidden[o->nhidden++] = (int)v;
        if (*end == '\0') return 0;
        if (*end != ',') return -1;
        p = end + 1;
    }
}

/* Returns 0 to run, 1 for --help, -1 on error (message printed on rank 0). */
static int parse_options(int argc, char **argv, options *o) {
    o->data_dir = DEFAULT_DATA_DIR;
    o->hidden[0] = 512;
    o->hidden[1] = 512;
    o->nhidden = 2;
    o->epochs = 5;
    o->batch = 32;
    o->lr = 0.05;
    o->cosine = 1;
    o->momentum = 0.9;
    o->weight_decay = 0.0;
    o->seed = 1;
    o->train_limit = 0;
    o->test_limit = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return 1;
        if (i + 1 >= argc) {
            if (g_rank == 0) fprintf(stderr, "mlp_trainer: error: unknown option or missing value: '%s'\n", a);
            return -1;
        }
        const char *v = argv[++i];
        long l;
        if (!strcmp(a, "--data")) {
            o->data_dir = v;
        } else if (!strcmp(a, "--hidden")) {
            if (parse_hidden(v, o)) return bad_option(a, v, "up to 16 comma-separated sizes in [1, 65536]");
        } else if (!strcmp(a, "--epochs")) {
            if (parse_long(v, 1, 100000, &l)) return bad_option(a, v, "an integer in [1, 100000]");
            o->epochs = (int)l;
        } else if (!strcmp(a, "--batch")) {
            if (parse_long(v, 1, 65536, &l)) return bad_option(a, v, "an integer in [1, 65536]");
            o->batch = (int)l;
        } else if (!strcmp(a, "--lr")) {
            if (parse_double(v, 0.0, 1e3, &o->lr)) return bad_option(a, v, "a number in [0, 1000]");
        } else if (!strcmp(a, "--lr-schedule")) {
            if (strcmp(v, "cosine") && strcmp(v, "constant")) return bad_option(a, v, "cosine or constant");
            o->cosine = !strcmp(v, "cosine");
        } else if (!strcmp(a, "--momentum")) {
            if (parse_double(v, 0.0, 0.999999, &o->momentum)) return bad_option(a, v, "a number in [0, 1)");
        } else if (!strcmp(a, "--weight-decay")) {
            if (parse_double(v, 0.0, 1.0, &o->weight_decay)) return bad_option(a, v, "a number in [0, 1]");
        } else if (!strcmp(a, "--seed")) {
            if (parse_long(v, 0, LONG_MAX, &l)) return bad_option(a, v, "a non-negative integer");
            o->seed = (uint64_t)l;
        } else if (!strcmp(a, "--train-limit")) {
            if (parse_long(v, 1, LONG_MAX, &l)) return bad_option(a, v, "a positive integer");
            o->train_limit = l;
        } else if (!strcmp(a, "--test-limit")) {
            if (parse_long(v, 1, LONG_MAX, &l)) return bad_option(a, v, "a positive integer");
            o->test_limit = l;
        } else {
            if (g_rank == 0) fprintf(stderr, "mlp_trainer: error: unknown option '%s' (try --help)\n", a);
            return -1;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* PRNG: splitmix64 (seeding, shuffles, Box-Muller normals)                  */

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double uniform01(uint64_t *s) { return (double)(splitmix64(s) >> 11) * 0x1.0p-53; }

static double normal(uint64_t *s) {
    double u1 = uniform01(s), u2 = uniform01(s);
    if (u1 < DBL_MIN) u1 = DBL_MIN;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static uint64_t mix_seed(uint64_t seed, uint64_t a, uint64_t b) {
    uint64_t s = seed ^ 0x6A09E667F3BCC909ull;
    uint64_t h = splitmix64(&s);
    s = h ^ (a * 0xD1B54A32D192ED03ull);
    h = splitmix64(&s);
    s = h ^ (b * 0x8CB92BA72F3D8DD7ull);
    return splitmix64(&s);
}

/* ------------------------------------------------------------------------ */
/* IDX reading (rank 0)                                                      */

static uint32_t be32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* Opens DIR/NAME.gz, or DIR/NAME when that does not exist (zlib reads plain
 * files transparently). Returns NULL with a message in err. */
static gzFile open_idx(const char *dir, const char *name, char *path, size_t pathsz, char *err, size_t errsz) {
    snprintf(path, pathsz, "%s/%s.gz", dir, name);
    gzFile f = gzopen(path, "rb");
    if (f) return f;
    int e = errno;
    char plain[4096];
    snprintf(plain, sizeof plain, "%s/%s", dir, name);
    f = gzopen(plain, "rb");
    if (f) {
        snprintf(path, pathsz, "%s", plain);
        return f;
    }
    snprintf(err, errsz, "cannot open %s: %s", path, strerror(e ? e : errno));
    return NULL;
}

static int read_exact(gzFile f, void *buf, size_t n, const char *path, char *err, size_t errsz) {
    unsigned char *p = buf;
    while (n > 0) {
        unsigned chunk = n > (1u << 30) ? (1u << 30) : (unsigned)n;
        int got = gzread(f, p, chunk);
        if (got <= 0) {
            int zerr;
            const char *zmsg = gzerror(f, &zerr);
            snprintf(err, errsz, "%s: %s", path,
                     got < 0 ? (zmsg && *zmsg ? zmsg : "read error") : "truncated file (unexpected end of data)");
            return -1;
        }
        p += got;
        n -= (size_t)got;
    }
    return 0;
}

/* Reads an IDX image file (magic 0x00000803, n x 28 x 28 unsigned bytes). */
static unsigned char *read_images(const char *dir, const char *name, long *n_out, char *err, size_t errsz) {
    char path[4096];
    gzFile f = open_idx(dir, name, path, sizeof path, err, errsz);
    if (!f) return NULL;
    gzbuffer(f, 1 << 17);
    unsigned char h[16];
    unsigned char *data = NULL;
    if (read_exact(f, h, sizeof h, path, err, errsz)) goto fail;
    uint32_t magic = be32(h), n = be32(h + 4), rows = be32(h + 8), cols = be32(h + 12);
    if (magic != 0x00000803u) {
        snprintf(err, errsz, "%s: bad magic 0x%08x, expected 0x00000803 (IDX unsigned byte, 3 dimensions)", path,
                 magic);
        goto fail;
    }
    if (rows != 28 || cols != 28) {
        snprintf(err, errsz, "%s: images are %ux%u, expected 28x28", path, rows, cols);
        goto fail;
    }
    if (n == 0 || n > 10000000u) {
        snprintf(err, errsz, "%s: implausible image count %u", path, n);
        goto fail;
    }
    data = malloc((size_t)n * INPUT_DIM);
    if (!data) {
        snprintf(err, errsz, "%s: out of memory for %u images", path, n);
        goto fail;
    }
    if (read_exact(f, data, (size_t)n * INPUT_DIM, path, err, errsz)) goto fail;
    unsigned char extra;
    if (gzread(f, &extra, 1) != 0) {
        snprintf(err, errsz, "%s: trailing data after %u images", path, n);
        goto fail;
    }
    gzclose(f);
    *n_out = (long)n;
    return data;
fail:
    free(data);
    gzclose(f);
    return NULL;
}

/* Reads an IDX label file (magic 0x00000801, n unsigned bytes in [0, 9]). */
static unsigned char *read_labels(const char *dir, const char *name, long *n_out, char *err, size_t errsz) {
    char path[4096];
    gzFile f = open_idx(dir, name, path, sizeof path, err, errsz);
    if (!f) return NULL;
    unsigned char h[8];
    unsigned char *data = NULL;
    if (read_exact(f, h, sizeof h, path, err, errsz)) goto fail;
    uint32_t magic = be32(h), n = be32(h + 4);
    if (magic != 0x00000801u) {
        snprintf(err, errsz, "%s: bad magic 0x%08x, expected 0x00000801 (IDX unsigned byte, 1 dimension)", path,
                 magic);
        goto fail;
    }
    if (n == 0 || n > 10000000u) {
        snprintf(err, errsz, "%s: implausible label count %u", path, n);
        goto fail;
    }
    data = malloc(n);
    if (!data) {
        snprintf(err, errsz, "%s: out of memory for %u labels", path, n);
        goto fail;
    }
    if (read_exact(f, data, n, path, err, errsz)) goto fail;
    unsigned char extra;
    if (gzread(f, &extra, 1) != 0) {
        snprintf(err, errsz, "%s: trailing data after %u labels", path, n);
        goto fail;
    }
    for (uint32_t i = 0; i < n; i++)
        if (data[i] >= NUM_CLASSES) {
            snprintf(err, errsz, "%s: label %u at index %u is out of range [0, %d]", path, data[i], i,
                     NUM_CLASSES - 1);
            goto fail;
        }
    gzclose(f);
    *n_out = (long)n;
    return data;
fail:
    free(data);
    gzclose(f);
    return NULL;
}

typedef struct {
    unsigned char *images; /* n x 784 */
    unsigned char *labels; /* n */
    long n;
} dataset;

static void fatal(const char *msg) {
    fprintf(stderr, "mlp_trainer: rank %d: error: %s\n", g_rank, msg);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}

/* Rank 0 loads a split and checks it; the others wait in the broadcast (an
 * MPI_Abort on rank 0 ends them). */
static void load_split(const char *dir, const char *split, long limit, dataset *d) {
    long n = 0;
    if (g_rank == 0) {
        char err[8192], iname[64], lname[64];
        snprintf(iname, sizeof iname, "%s-images-idx3-ubyte", split);
        snprintf(lname, sizeof lname, "%s-labels-idx1-ubyte", split);
        long ni = 0, nl = 0;
        d->images = read_images(dir, iname, &ni, err, sizeof err);
        if (!d->images) fatal(err);
        d->labels = read_labels(dir, lname, &nl, err, sizeof err);
        if (!d->labels) fatal(err);
        if (ni != nl) {
            snprintf(err, sizeof err, "%s/%s: %ld images but %ld labels", dir, split, ni, nl);
            fatal(err);
        }
        n = limit > 0 && limit < ni ? limit : ni;
    }
    MPI_Bcast(&n, 1, MPI_LONG, 0, MPI_COMM_WORLD);
    if (g_rank != 0) {
        d->images = malloc((size_t)n * INPUT_DIM);
        d->labels = malloc((size_t)n);
        if (!d->images || !d->labels) fatal("out of memory for the data set");
    }
    d->n = n;
    /* in pieces: MPI counts are int */
    for (size_t off = 0, total = (size_t)n * INPUT_DIM; off < total;) {
        size_t chunk = total - off > (1u << 30) ? (1u << 30) : total - off;
        MPI_Bcast(d->images + off, (int)chunk, MPI_UNSIGNED_CHAR, 0, MPI_COMM_WORLD);
        off += chunk;
    }
    MPI_Bcast(d->labels, (int)n, MPI_UNSIGNED_CHAR, 0, MPI_COMM_WORLD);
}

/* ------------------------------------------------------------------------ */
/* Dense kernels                                                             */

/* C[m][n] += sum_k A(m,k) * Bm[k][n] for m < M, n < N, k < K, where
 * A(m,k) = A[m*sam + k*sak] (any strides, so A may be read transposed), Bm is
 * row-major with leading dimension ldb, C with ldc. The zero entries of A are
 * skipped (after ReLU about half of them); the others are taken four at a time
 * so each pass over a row of C does four multiply-adds per load and store. */
KERNEL static void gemm_acc_sparse_a(int M, int N, int K, const float *A, long sam, long sak, const float *Bm,
                                     long ldb, float *C, long ldc, int *restrict nzk, float *restrict nza) {
    for (int m = 0; m < M; m++) {
        int cnt = 0;
        const float *am = A + (size_t)m * sam;
        for (int k = 0; k < K; k++) {
            float a = am[(size_t)k * sak];
            if (a != 0.0f) {
                nzk[cnt] = k;
                nza[cnt] = a;
                cnt++;
            }
        }
        float *restrict c = C + (size_t)m * ldc;
        int t = 0;
        for (; t + 4 <= cnt; t += 4) {
            const float *restrict b0 = Bm + (size_t)nzk[t] * ldb;
            const float *restrict b1 = Bm + (size_t)nzk[t + 1] * ldb;
            const float *restrict b2 = Bm + (size_t)nzk[t + 2] * ldb;
            const float *restrict b3 = Bm + (size_t)nzk[t + 3] * ldb;
            float a0 = nza[t], a1 = nza[t + 1], a2 = nza[t + 2], a3 = nza[t + 3];
#pragma omp simd
            for (int n = 0; n < N; n++) c[n] += a0 * b0[n] + a1 * b1[n] + a2 * b2[n] + a3 * b3[n];
        }
        for (; t < cnt; t++) {
            const float *restrict b0 = Bm + (size_t)nzk[t] * ldb;
            float a0 = nza[t];
#pragma omp simd
            for (int n = 0; n < N; n++) c[n] += a0 * b0[n];
        }
    }
}

/* y += a * x */
KERNEL static void axpy(int n, float a, const float *restrict x, float *restrict y) {
#pragma omp simd
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

/* y = max(y, 0) */
KERNEL static void relu(size_t n, float *restrict y) {
#pragma omp simd
    for (size_t i = 0; i < n; i++) y[i] = y[i] > 0.0f ? y[i] : 0.0f;
}

/* d = 0 where x <= 0 (the ReLU's derivative) */
KERNEL static void relu_mask(size_t n, const float *restrict x, float *restrict d) {
#pragma omp simd
    for (size_t i = 0; i < n; i++) d[i] = x[i] > 0.0f ? d[i] : 0.0f;
}

/* w -= lr * (buf = m * buf + (grad * scale + wd * w)) */
KERNEL static void sgd_step(size_t n, float *restrict w, float *restrict buf, const float *restrict grad, float scale,
                            float lr, float mom, float wd) {
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        float g = grad[i] * scale + wd * w[i];
        float v = mom * buf[i] + g;
        buf[i] = v;
        w[i] -= lr * v;
    }
}

/* Dst[c][r] = Src[r][c] for an R x C matrix, in 32 x 32 tiles. */
static void transpose(int R, int C, const float *restrict src, float *restrict dst) {
    for (int r0 = 0; r0 < R; r0 += 32)
        for (int c0 = 0; c0 < C; c0 += 32) {
            int r1 = r0 + 32 < R ? r0 + 32 : R, c1 = c0 + 32 < C ? c0 + 32 : C;
            for (int c = c0; c < c1; c++)
                for (int r = r0; r < r1; r++) dst[(size_t)c * R + r] = src[(size_t)r * C + c];
        }
}

/* ------------------------------------------------------------------------ */
/* Model                                                                     */

typedef struct {
    int nlayers;              /* weight layers */
    int dims[MAX_LAYERS + 1]; /* dims[0] = 784, dims[nlayers] = 10 */
    size_t woff[MAX_LAYERS];  /* offset of W_l in the parameter buffer: [dims[l]][dims[l+1]], input-major */
    size_t boff[MAX_LAYERS];  /* offset of b_l ([dims[l+1]]) */
    float *wout[MAX_LAYERS];  /* l >= 1: copy of W_l output-major [dims[l+1]][dims[l]], for the backward pass */
    float in_shift;           /* the network sees x - in_shift; x itself (zero background) is what is stored */
    float *bias0;             /* b_0[j] - in_shift * sum_i W_0[i][j], per forward pass */
    size_t nparams;
    int max_dim;
    int rows; /* scratch rows: max(batch, EVAL_ROWS) */
    float *params, *grad, *mom_buf; /* one contiguous buffer each */
    float *act[MAX_LAYERS + 1];     /* act[l]: rows x dims[l]; act[0] input, act[nlayers] logits */
    float *delta[2];                /* batch x max_dim, ping-pong */
    int *nzk;
    float *nza;
    unsigned char *ylab; /* labels of the rows in act[0] */
} model;

static void *xalloc(size_t bytes) {
    void *p = NULL;
    if (bytes == 0) bytes = 64;
    bytes = (bytes + 63) & ~(size_t)63;
    if (posix_memalign(&p, 64, bytes)) fatal("out of memory");
    return p;
}

/* After every change of the parameters: the output-major copies. */
static void refresh_copies(model *mdl) {
    for (int l = 1; l < mdl->nlayers; l++)
        transpose(mdl->dims[l], mdl->dims[l + 1], mdl->params + mdl->woff[l], mdl->wout[l]);
}

static void model_init(model *mdl, const options *o) {
    memset(mdl, 0, sizeof *mdl);
    mdl->nlayers = o->nhidden + 1;
    mdl->dims[0] = INPUT_DIM;
    for (int l = 0; l < o->nhidden; l++) mdl->dims[l + 1] = o->hidden[l];
    mdl->dims[mdl->nlayers] = NUM_CLASSES;
    size_t off = 0;
    mdl->max_dim = 0;
    for (int l = 0; l <= mdl->nlayers; l++)
        if (mdl->dims[l] > mdl->max_dim) mdl->max_dim = mdl->dims[l];
    for (int l = 0; l < mdl->nlayers; l++) {
        mdl->woff[l] = off;
        off += (size_t)mdl->dims[l + 1] * mdl->dims[l];
        mdl->boff[l] = off;
        off += (size_t)mdl->dims[l + 1];
    }
    mdl->nparams = off;
    if (mdl->nparams > INT_MAX) {
        char msg[256];
        snprintf(msg, sizeof msg, "model has %zu parameters, more than one MPI_Allreduce count can hold (%d)",
                 mdl->nparams, INT_MAX);
        fatal(msg);
    }
    mdl->params = xalloc(mdl->nparams * sizeof(float));
    mdl->grad = xalloc(mdl->nparams * sizeof(float));
    mdl->mom_buf = xalloc(mdl->nparams * sizeof(float));
    memset(mdl->grad, 0, mdl->nparams * sizeof(float));
    memset(mdl->mom_buf, 0, mdl->nparams * sizeof(float));
    mdl->rows = o->batch > EVAL_ROWS ? o->batch : EVAL_ROWS;
    for (int l = 0; l <= mdl->nlayers; l++) mdl->act[l] = xalloc((size_t)mdl->rows * mdl->dims[l] * sizeof(float));
    for (int k = 0; k < 2; k++) mdl->delta[k] = xalloc((size_t)o->batch * mdl->max_dim * sizeof(float));
    int kmax = mdl->max_dim > o->batch ? mdl->max_dim : o->batch;
    mdl->nzk = xalloc((size_t)kmax * sizeof(int));
    mdl->nza = xalloc((size_t)kmax * sizeof(float));
    mdl->ylab = xalloc((size_t)mdl->rows);
    mdl->bias0 = xalloc((size_t)mdl->dims[1] * sizeof(float));
    for (int l = 1; l < mdl->nlayers; l++) mdl->wout[l] = xalloc((size_t)mdl->dims[l] * mdl->dims[l + 1] * sizeof(float));

    /* He (Kaiming) normal: W ~ N(0, 2 / fan_in), biases 0. Same seed, same
     * sequence, same weights on every rank. */
    uint64_t s = mix_seed(o->seed, 0x1717, 0);
    for (int l = 0; l < mdl->nlayers; l++) {
        double sd = sqrt(2.0 / mdl->dims[l]);
        float *w = mdl->params + mdl->woff[l];
        size_t nw = (size_t)mdl->dims[l + 1] * mdl->dims[l];
        for (size_t i = 0; i < nw; i++) w[i] = (float)(sd * normal(&s));
        memset(mdl->params + mdl->boff[l], 0, (size_t)mdl->dims[l + 1] * sizeof(float));
    }
    refresh_copies(mdl);
}

/* Fills act[0] and ylab with n samples (indices idx[0..n) of d, or
 * first..first+n); pixel value v becomes v * pixel_scale. */
static void load_rows(model *mdl, const dataset *d, const long *idx, long first, int n, float pixel_scale) {
    float lut[256];
    for (int v = 0; v < 256; v++) lut[v] = (float)v * pixel_scale;
    for (int r = 0; r < n; r++) {
        long s = idx ? idx[r] : first + r;
        const unsigned char *px = d->images + (size_t)s * INPUT_DIM;
        float *x = mdl->act[0] + (size_t)r * INPUT_DIM;
        for (int i = 0; i < INPUT_DIM; i++) x[i] = lut[px[i]];
        mdl->ylab[r] = d->labels[s];
    }
}

/* act[l+1][b][j] = b_l[j] + sum_i act[l][b][i] * W_l[i][j], ReLU on hidden
 * layers; for l = 0 the input is act[0] - in_shift, computed as
 * sum_i act[0][b][i] W_0[i][j] + (b_0[j] - in_shift sum_i W_0[i][j]) so that
 * the zero background of act[0] is still skipped. */
static void forward(model *mdl, int n) {
    {
        int I = mdl->dims[0], J = mdl->dims[1];
        const float *w = mdl->params + mdl->woff[0];
        float *b0 = mdl->bias0;
        memset(b0, 0, (size_t)J * sizeof(float));
        for (int i = 0; i < I; i++) axpy(J, 1.0f, w + (size_t)i * J, b0);
        const float *b = mdl->params + mdl->boff[0];
        for (int j = 0; j < J; j++) b0[j] = b[j] - mdl->in_shift * b0[j];
    }
    for (int l = 0; l < mdl->nlayers; l++) {
        int I = mdl->dims[l], J = mdl->dims[l + 1];
        const float *bias = l == 0 ? mdl->bias0 : mdl->params + mdl->boff[l];
        float *y = mdl->act[l + 1];
        for (int r = 0; r < n; r++) memcpy(y + (size_t)r * J, bias, (size_t)J * sizeof(float));
        gemm_acc_sparse_a(n, J, I, mdl->act[l], I, 1, mdl->params + mdl->woff[l], J, y, J, mdl->nzk, mdl->nza);
        if (l + 1 < mdl->nlayers) relu((size_t)n * J, y);
    }
}

/* Softmax cross-entropy over the logits of n rows. Returns the summed loss,
 * counts correct predictions, and (when dlogits != NULL) writes
 * d(mean loss)/d(logits) = (softmax - onehot) / n. */
static double softmax_xent(const model *mdl, int n, long *correct, float *dlogits) {
    const float *z = mdl->act[mdl->nlayers];
    double loss = 0;
    for (int r = 0; r < n; r++) {
        const float *zr = z + (size_t)r * NUM_CLASSES;
        int y = mdl->ylab[r], arg = 0;
        float mx = zr[0];
        for (int c = 1; c < NUM_CLASSES; c++)
            if (zr[c] > mx) mx = zr[c], arg = c;
        double sum = 0;
        float e[NUM_CLASSES];
        for (int c = 0; c < NUM_CLASSES; c++) {
            e[c] = expf(zr[c] - mx);
            sum += e[c];
        }
        loss += log(sum) - (double)(zr[y] - mx);
        if (arg == y) ++*correct;
        if (dlogits) {
            float inv = (float)(1.0 / sum), scale = 1.0f / (float)n;
            for (int c = 0; c < NUM_CLASSES; c++)
                dlogits[(size_t)r * NUM_CLASSES + c] = (e[c] * inv - (c == y ? 1.0f : 0.0f)) * scale;
        }
    }
    return loss;
}

/* Gradient of the mean loss over n rows into mdl->grad (overwritten). */
static double forward_backward(model *mdl, int n) {
    forward(mdl, n);
    long correct = 0;
    float *delta = mdl->delta[0], *prev = mdl->delta[1];
    double loss = softmax_xent(mdl, n, &correct, delta);
    memset(mdl->grad, 0, mdl->nparams * sizeof(float));
    for (int l = mdl->nlayers - 1; l >= 0; l--) {
        int I = mdl->dims[l], J = mdl->dims[l + 1];
        float *gw = mdl->grad + mdl->woff[l], *gb = mdl->grad + mdl->boff[l];
        const float *x = mdl->act[l];
        for (int r = 0; r < n; r++) axpy(J, 1.0f, delta + (size_t)r * J, gb);
        /* dW[i][j] += sum_b x[b][i] * delta[b][j]: A = x read transposed */
        gemm_acc_sparse_a(I, J, n, x, 1, I, delta, J, gw, J, mdl->nzk, mdl->nza);
        if (l == 0) /* the input was x - in_shift: dW[i][j] -= in_shift * sum_b delta[b][j] */
            for (int i = 0; i < I; i++) axpy(J, -mdl->in_shift, gb, gw + (size_t)i * J);
        if (l > 0) {
            /* dX[b][i] = sum_j delta[b][j] * W[i][j] (output-major copy), then the ReLU mask of x */
            memset(prev, 0, (size_t)n * I * sizeof(float));
            gemm_acc_sparse_a(n, I, J, delta, J, 1, mdl->wout[l], I, prev, I, mdl->nzk, mdl->nza);
            relu_mask((size_t)n * I, x, prev);
            float *tmp = delta;
            delta = prev;
            prev = tmp;
        }
    }
    return loss;
}

/* Evaluates rows [lo, hi) of the test set: adds summed loss and correct count. */
static void evaluate(model *mdl, const dataset *test, long lo, long hi, float pixel_scale, double *loss,
                     long *correct) {
    for (long s = lo; s < hi; s += EVAL_ROWS) {
        int n = (int)(hi - s < EVAL_ROWS ? hi - s : EVAL_ROWS);
        load_rows(mdl, test, NULL, s, n, pixel_scale);
        forward(mdl, n);
        *loss += softmax_xent(mdl, n, correct, NULL);
    }
}

static uint64_t fnv1a(const void *p, size_t n) {
    const unsigned char *c = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ c[i]) * 0x100000001b3ull;
    return h;
}

/* Sparse updates (gradient dropping, DGC) leave most momentum-buffer entries
 * decaying by m each step with no new gradient: within a few hundred steps
 * they are denormal floats, which x86 computes on many times more slowly.
 * Flush them to zero, as TensorFlow does on the CPU by default. */
static void flush_denormals(void) {
#ifdef __SSE__
    _mm_setcsr(_mm_getcsr() | 0x8040); /* FTZ | DAZ */
#endif
}

/* ------------------------------------------------------------------------ */

int main(int argc, char **argv) {
    flush_denormals();
    MPI_Init(&argc, &argv);
    int nranks;
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);

    options o;
    int pr = parse_options(argc, argv, &o);
    if (pr != 0) {
        if (pr > 0 && g_rank == 0) usage(stdout);
        if (pr < 0 && g_rank == 0) usage(stderr);
        MPI_Finalize();
        return pr > 0 ? 0 : 2;
    }

    dataset train, test;
    load_split(o.data_dir, "train", o.train_limit, &train);
    load_split(o.data_dir, "t10k", o.test_limit, &test);

    /* The network sees standardised pixels (v / 255 - mean) / std, mean and
     * std over the training set (computed identically on every rank from the
     * broadcast data). Stored is v * pixel_scale = v / (255 std), whose zero
     * background the kernels skip; the shift mean / std is applied by the
     * model (see forward). */
    double pmean, pstd;
    {
        uint64_t hist[256] = {0};
        for (size_t t = 0; t < (size_t)train.n * INPUT_DIM; t++) hist[train.images[t]]++;
        double sum = 0, sq = 0, cnt = (double)train.n * INPUT_DIM;
        for (int v = 0; v < 256; v++) {
            sum += (v / 255.0) * (double)hist[v];
            sq += (v / 255.0) * (v / 255.0) * (double)hist[v];
        }
        pmean = sum / cnt;
        double var = sq / cnt - pmean * pmean;
        pstd = sqrt(var > 1e-12 ? var : 1e-12);
    }
    float pixel_scale = (float)(1.0 / (255.0 * pstd));

    /* Shards: rank r owns [r*n/N, (r+1)*n/N); every rank makes the same
     * number of steps, set by the smallest shard. */
    long shard_lo = train.n * g_rank / nranks;
    long shard_hi = train.n * (g_rank + 1) / nranks;
    long shard_n = shard_hi - shard_lo;
    long min_shard = train.n / nranks;
    long steps_per_epoch = min_shard / o.batch;
    if (steps_per_epoch < 1) {
        if (g_rank == 0)
            fprintf(stderr,
                    "mlp_trainer: error: %ld training images over %d ranks give shards of %ld, smaller than one "
                    "batch of %d\n",
                    train.n, nranks, min_shard, o.batch);
        MPI_Finalize();
        return 2;
    }
    long test_lo = test.n * g_rank / nranks;
    long test_hi = test.n * (g_rank + 1) / nranks;

    model mdl;
    model_init(&mdl, &o);
    mdl.in_shift = (float)(pmean / pstd);
    long *order = xalloc((size_t)shard_n * sizeof(long));

    if (g_rank == 0) {
        char layers[512];
        int p = snprintf(layers, sizeof layers, "%d", mdl.dims[0]);
        for (int l = 1; l <= mdl.nlayers && p < (int)sizeof layers; l++)
            p += snprintf(layers + p, sizeof layers - (size_t)p, "-%d", mdl.dims[l]);
        printf("mlp_trainer ranks %d layers %s params %zu batch %d global_batch %ld steps_per_epoch %ld epochs %d "
               "lr %g lr_schedule %s momentum %g weight_decay %g seed %llu train %ld test %ld data %s\n",
               nranks, layers, mdl.nparams, o.batch, (long)o.batch * nranks, steps_per_epoch, o.epochs, o.lr,
               o.cosine ? "cosine" : "constant", o.momentum, o.weight_decay, (unsigned long long)o.seed, train.n, test.n, o.data_dir);
        fflush(stdout);
    }

    const float scale = 1.0f / (float)nranks;
    double total_comm = 0, total_compute = 0, final_acc = 0;
    long total_steps = 0;
    MPI_Barrier(MPI_COMM_WORLD);
    double t_start = MPI_Wtime();
    for (int epoch = 1; epoch <= o.epochs; epoch++) {
        uint64_t rs = mix_seed(o.seed, (uint64_t)g_rank + 1, (uint64_t)epoch);
        for (long i = 0; i < shard_n; i++) order[i] = shard_lo + i;
        for (long i = shard_n - 1; i > 0; i--) {
            long j = (long)(splitmix64(&rs) % (uint64_t)(i + 1));
            long t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        double comm = 0, compute = 0, loss_sum = 0;
        MPI_Barrier(MPI_COMM_WORLD);
        double t_epoch = MPI_Wtime();
        for (long step = 0; step < steps_per_epoch; step++) {
            double t0 = MPI_Wtime();
            load_rows(&mdl, &train, order + step * o.batch, 0, o.batch, pixel_scale);
            loss_sum += forward_backward(&mdl, o.batch);
            double t1 = MPI_Wtime();
            MPI_Allreduce(MPI_IN_PLACE, mdl.grad, (int)mdl.nparams, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            double t2 = MPI_Wtime();
            double lr = o.lr;
            if (o.cosine)
                lr *= 0.5 * (1.0 + cos(3.141592653589793 * (double)(total_steps + step) /
                                       (double)(steps_per_epoch * o.epochs)));
            sgd_step(mdl.nparams, mdl.params, mdl.mom_buf, mdl.grad, scale, (float)lr, (float)o.momentum,
                     (float)o.weight_decay);
            refresh_copies(&mdl);
            double t3 = MPI_Wtime();
            compute += (t1 - t0) + (t3 - t2);
            comm += t2 - t1;
        }
        double epoch_s = MPI_Wtime() - t_epoch;
        total_steps += steps_per_epoch;
        total_comm += comm;
        total_compute += compute;

        double t_eval = MPI_Wtime();
        double test_loss = 0;
        long correct = 0;
        evaluate(&mdl, &test, test_lo, test_hi, pixel_scale, &test_loss, &correct);
        double m[4] = {loss_sum, (double)steps_per_epoch * o.batch, test_loss, (double)correct};
        MPI_Allreduce(MPI_IN_PLACE, m, 4, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        double eval_s = MPI_Wtime() - t_eval;
        final_acc = m[3] / (double)test.n;
        if (g_rank == 0) {
            printf("epoch %d loss %.4f test_acc %.4f epoch_s %.2f comm_s %.2f compute_s %.2f test_loss %.4f "
                   "eval_s %.2f\n",
                   epoch, m[0] / m[1], final_acc, epoch_s, comm, compute, m[2] / (double)test.n, eval_s);
            fflush(stdout);
        }
    }
    double wall = MPI_Wtime() - t_start;

    /* Data parallelism keeps one model: check every rank holds the same bits. */
    unsigned long h = (unsigned long)fnv1a(mdl.params, mdl.nparams * sizeof(float)), hand, hor;
    MPI_Allreduce(&h, &hand, 1, MPI_UNSIGNED_LONG, MPI_BAND, MPI_COMM_WORLD);
    MPI_Allreduce(&h, &hor, 1, MPI_UNSIGNED_LONG, MPI_BOR, MPI_COMM_WORLD);
    if (g_rank == 0) {
        printf("final test_acc %.4f params %zu steps %ld wall_s %.2f comm_s %.2f compute_s %.2f "
               "weights_identical %d\n",
               final_acc, mdl.nparams, total_steps, wall, total_comm, total_compute, hand == hor);
        fflush(stdout);
    }

    free(order);
    free(mdl.bias0);
    for (int l = 1; l < mdl.nlayers; l++) free(mdl.wout[l]);
    for (int l = 0; l <= mdl.nlayers; l++) free(mdl.act[l]);
    free(mdl.delta[0]);
    free(mdl.delta[1]);
    free(mdl.nzk);
    free(mdl.nza);
    free(mdl.ylab);
    free(mdl.params);
    free(mdl.grad);
    free(mdl.mom_buf);
    free(train.images);
    free(train.labels);
    free(test.images);
    free(test.labels);
    MPI_Finalize();
    return 0;
}
