/* An unmodified MPI program in the shape of a data-parallel training loop:
 * every step it fills a gradient-sized float buffer and averages it across
 * ranks with one MPI_Allreduce. It knows nothing of dgcshim; run it with and
 * without LD_PRELOAD=libdgcshim.so to compare.
 *
 *   mpirun -np 4 ./allreduce_loop [elements=1048576] [steps=50]
 *
 * Prints, on rank 0, the mean time per all-reduce and the L2 norm of the
 * summed output of the last step. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, nranks;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    long n = argc > 1 ? atol(argv[1]) : 1048576;
    int steps = argc > 2 ? atoi(argv[2]) : 50;
    float *grad = malloc((size_t)n * sizeof *grad), *avg = malloc((size_t)n * sizeof *avg);
    if (!grad || !avg || n <= 0 || steps <= 0) MPI_Abort(MPI_COMM_WORLD, 2);
    unsigned seed = 12345u + (unsigned)rank;
    double total = 0;
    for (int s = 0; s < steps; s++) {
        for (long i = 0; i < n; i++) grad[i] = (float)rand_r(&seed) / (float)RAND_MAX - 0.5f;
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        MPI_Allreduce(grad, avg, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        total += MPI_Wtime() - t0;
    }
    double norm = 0;
    for (long i = 0; i < n; i++) norm += (double)avg[i] * avg[i];
    if (rank == 0)
        printf("allreduce_loop: %d ranks, %ld floats, %d steps, %.3f ms per all-reduce, |sum| %.4g\n", nranks, n,
               steps, 1e3 * total / steps, sqrt(norm));
    free(grad);
    free(avg);
    MPI_Finalize();
    return 0;
}
