/* allreduce_bench: time MPI_Allreduce(MPI_FLOAT, MPI_SUM) over a range of sizes,
 * in the style of osu_allreduce and nccl-tests.
 *
 * An ordinary MPI program that knows nothing of dgcshim: run it plainly for the
 * dense Open MPI figures, and under LD_PRELOAD=libdgcshim.so (mpirun -x) for the
 * shim's, with the same binary.
 *
 *   allreduce_bench [--min-bytes B] [--max-bytes B] [--iters N] [--warmup N]
 *                   [--comm-per-size] [--csv]
 *
 * Sizes double from --min-bytes (1 MiB) to --max-bytes (256 MiB); byte counts take
 * a K, M or G suffix (powers of 1024). Per size: --warmup untimed calls (5), then
 * --iters timed calls (20), each preceded by MPI_Barrier and timed alone, on the
 * same send and receive buffers every time (the shim keeps its residual per
 * buffer, as a training job does). The send buffer holds fixed pseudo-random
 * gradients, different on every rank.
 *
 * Columns (one row per size, as nccl-tests):
 *   size        bytes per rank (count * 4)
 *   count       elements
 *   type        float
 *   time_us     mean time per call; each rank averages its own calls, the row shows
 *               the slowest rank (a collective is done when its last rank is)
 *   algbw_GBps  size / time_us, in GB/s (1e9 bytes)
 *   busbw_GBps  algbw * 2(N-1)/N: the bandwidth each link would need for a ring
 *               all-reduce to take this long; comparable across N (nccl-tests)
 * Lines starting with '#' are comments. --csv prints the same columns with commas.
 *
 * --comm-per-size runs every size on its own MPI_Comm_dup of MPI_COMM_WORLD and
 * frees it afterwards (the shim then drops that size's state at MPI_Comm_free, so
 * memory holds one size at a time; DGC_STATS=1 then reports nothing per size).
 */
#include <errno.h>
#include <inttypes.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint64_t min_bytes, max_bytes;
    int iters, warmup, comm_per_size, csv;
} options;

static void usage(FILE *f) {
    fprintf(f,
            "usage: allreduce_bench [--min-bytes B] [--max-bytes B] [--iters N] [--warmup N]\n"
            "                       [--comm-per-size] [--csv]\n"
            "  --min-bytes B     smallest size per rank (default 1M; K, M, G = 2^10, 2^20, 2^30)\n"
            "  --max-bytes B     largest size per rank (default 256M); sizes double from min\n"
            "  --iters N         timed calls per size (default 20)\n"
            "  --warmup N        untimed calls per size before them (default 5)\n"
            "  --comm-per-size   each size on its own duplicate of MPI_COMM_WORLD, freed after\n"
            "  --csv             comma-separated rows\n");
}

static int parse_bytes(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || s[0] == '-') return -1;
    uint64_t mul = 1;
    switch (*end) {
    case '\0': break;
    case 'k': case 'K': mul = 1ull << 10; end++; break;
    case 'm': case 'M': mul = 1ull << 20; end++; break;
    case 'g': case 'G': mul = 1ull << 30; end++; break;
    default: return -1;
    }
    if (*end == 'B' || *end == 'b') end++;
    if (*end != '\0' || v > UINT64_MAX / mul) return -1;
    *out = (uint64_t)v * mul;
    return 0;
}

static int parse_int(const char *s, int lo, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end != '\0' || v < lo || v > 1000000000L) return -1;
    *out = (int)v;
    return 0;
}

/* 0 ok, 1 --help, -1 error (message printed). */
static int parse_args(int argc, char **argv, options *o, int rank) {
    *o = (options){.min_bytes = 1ull << 20, .max_bytes = 256ull << 20, .iters = 20, .warmup = 5};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            if (rank == 0) usage(stdout);
            return 1;
        } else if (!strcmp(a, "--comm-per-size")) {
            o->comm_per_size = 1;
        } else if (!strcmp(a, "--csv")) {
            o->csv = 1;
        } else if (!strcmp(a, "--min-bytes") && v) {
            bad = parse_bytes(v, &o->min_bytes), i++;
        } else if (!strcmp(a, "--max-bytes") && v) {
            bad = parse_bytes(v, &o->max_bytes), i++;
        } else if (!strcmp(a, "--iters") && v) {
            bad = parse_int(v, 1, &o->iters), i++;
        } else if (!strcmp(a, "--warmup") && v) {
            bad = parse_int(v, 0, &o->warmup), i++;
        } else {
            if (rank == 0) {
                fprintf(stderr, "allreduce_bench: unknown or incomplete option '%s'\n", a);
                usage(stderr);
            }
            return -1;
        }
        if (bad) {
            if (rank == 0) fprintf(stderr, "allreduce_bench: bad value '%s' for %s\n", v, a);
            return -1;
        }
    }
    if (o->min_bytes < sizeof(float) || o->max_bytes < o->min_bytes) {
        if (rank == 0)
            fprintf(stderr, "allreduce_bench: need 4 <= --min-bytes <= --max-bytes (got %" PRIu64 ", %" PRIu64 ")\n",
                    o->min_bytes, o->max_bytes);
        return -1;
    }
    /* MPI_Allreduce takes an int count. */
    if (o->max_bytes / sizeof(float) > (uint64_t)INT32_MAX) {
        if (rank == 0) fprintf(stderr, "allreduce_bench: --max-bytes too large for an int count\n");
        return -1;
    }
    return 0;
}

/* Fixed pseudo-random gradients: mostly small, a few large (what DGC selects). */
static void fill(float *x, size_t n, int rank) {
    uint64_t s = 0x9e3779b97f4a7c15ull * (uint64_t)(rank + 1);
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        float u = (float)(s >> 40) * (1.0f / 16777216.0f) - 0.5f; /* [-0.5, 0.5) */
        x[i] = (s & 0xff) == 0 ? 100.0f * u : 1e-3f * u;
    }
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, nranks;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);

    options o;
    int pr = parse_args(argc, argv, &o, rank);
    if (pr != 0) {
        MPI_Finalize();
        return pr > 0 ? 0 : 2;
    }

    size_t max_count = (size_t)(o.max_bytes / sizeof(float));
    float *send = malloc(max_count * sizeof(float));
    float *recv = malloc(max_count * sizeof(float));
    int ok = send && recv, all_ok;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all_ok) {
        if (rank == 0) fprintf(stderr, "allreduce_bench: cannot allocate 2 x %" PRIu64 " bytes\n", o.max_bytes);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    fill(send, max_count, rank);
    memset(recv, 0, max_count * sizeof(float));

    if (rank == 0) {
        char host[MPI_MAX_PROCESSOR_NAME];
        int len;
        MPI_Get_processor_name(host, &len);
        const char *pre = getenv("LD_PRELOAD");
        printf("# allreduce_bench: MPI_Allreduce(MPI_FLOAT, MPI_SUM), %d ranks, rank 0 on %s\n", nranks, host);
        printf("# LD_PRELOAD=%s\n", pre && *pre ? pre : "(none)");
        printf("# iters %d warmup %d, barrier before each call; time = slowest rank's mean\n", o.iters, o.warmup);
        if (o.csv)
            printf("size,count,type,time_us,algbw_GBps,busbw_GBps\n");
        else
            printf("# %12s %12s %6s %12s %11s %11s\n", "size", "count", "type", "time_us", "algbw_GBps", "busbw_GBps");
        fflush(stdout);
    }

    for (uint64_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= 2) {
        int count = (int)(bytes / sizeof(float));
        MPI_Comm comm = MPI_COMM_WORLD;
        if (o.comm_per_size) MPI_Comm_dup(MPI_COMM_WORLD, &comm);

        for (int i = 0; i < o.warmup; i++) {
            MPI_Barrier(comm);
            MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, comm);
        }
        double total = 0;
        for (int i = 0; i < o.iters; i++) {
            MPI_Barrier(comm);
            double t0 = MPI_Wtime();
            MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, comm);
            total += MPI_Wtime() - t0;
        }
        double mean = total / o.iters, slowest;
        MPI_Reduce(&mean, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, comm);

        if (rank == 0) {
            double size = (double)count * sizeof(float);
            double algbw = size / slowest / 1e9;
            double busbw = algbw * 2.0 * (nranks - 1) / nranks;
            if (o.csv)
                printf("%.0f,%d,float,%.1f,%.4f,%.4f\n", size, count, slowest * 1e6, algbw, busbw);
            else
                printf("  %12.0f %12d %6s %12.1f %11.4f %11.4f\n", size, count, "float", slowest * 1e6, algbw, busbw);
            fflush(stdout);
        }
        if (o.comm_per_size) MPI_Comm_free(&comm);
        if (bytes > UINT64_MAX / 2) break;
    }

    free(send);
    free(recv);
    MPI_Finalize();
    return 0;
}
