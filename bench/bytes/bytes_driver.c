/* The benchmark's program: an ordinary MPI program that all-reduces an
 * n-float gradient (bench's splitmix-free pattern: a different random-looking
 * vector per rank and step) for warm steps, then for steps more between
 * MPI_Pcontrol(1) and MPI_Pcontrol(0), which pmpi_bytes.c counts.
 *
 *   bytes_driver N WARM STEPS */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static float value(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    x ^= x >> 31;
    return (float)((double)(x >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    if (argc != 4) {
        fprintf(stderr, "usage: bytes_driver N WARM STEPS\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    long n = atol(argv[1]), warm = atol(argv[2]), steps = atol(argv[3]);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    float *g = malloc((size_t)n * sizeof *g), *out = malloc((size_t)n * sizeof *out);
    for (long s = 0; s < warm + steps; s++) {
        if (s == warm) MPI_Pcontrol(1);
        for (long i = 0; i < n; i++) g[i] = value(((uint64_t)rank << 40) ^ ((uint64_t)s << 32) ^ (uint64_t)i);
        MPI_Allreduce(MPI_IN_PLACE, g, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
    MPI_Pcontrol(0);
    free(g);
    free(out);
    MPI_Finalize();
    return 0;
}
