/* intranode_bench: the node layout's data movement inside a node, alone, as
 * DGC_TOPOLOGY=node does it (shim/mpi/node.c) but without the shim: per call,
 * MPI_Alltoallv of the L shards of an n-float buffer inside each node
 * (MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)), the sum of the L pieces of this
 * rank's shard in local-rank order, and MPI_Allgatherv of the shards. Prints
 * each phase's time per call, the slowest rank's mean over the timed calls
 * (after one untimed call), on rank 0.
 *
 *   cmake --build build --target intranode_bench
 *   bench/netns/run.sh --ppn 2 4 -- $PWD/build/bench/intranode_bench [n floats, 8388608] [calls, 5]
 *
 * On the emulated cluster the ranks of one host talk TCP over its lo (run.sh's
 * default btl tcp,self), or shared memory with NETNS_BTL=tcp,vader,self. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    long n = argc > 1 ? atol(argv[1]) : 8388608;
    int iters = argc > 2 ? atoi(argv[2]) : 5;
    int rank, nranks, L, l;
    MPI_Comm node;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    if (n < 1 || iters < 1) {
        if (rank == 0) fprintf(stderr, "usage: intranode_bench [n floats >= 1] [calls >= 1]\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
    MPI_Comm_size(node, &L);
    MPI_Comm_rank(node, &l);
    int *cnt = malloc(4 * (size_t)L * sizeof(int)), *dsp = cnt + L, *rcnt = cnt + 2 * L, *rdsp = cnt + 3 * L;
    for (int i = 0; i < L; i++) {
        long lo = n * i / L, hi = n * (i + 1) / L;
        cnt[i] = (int)(hi - lo);
        dsp[i] = (int)lo;
    }
    int mine = cnt[l];
    for (int i = 0; i < L; i++) {
        rcnt[i] = mine;
        rdsp[i] = i * mine;
    }
    float *g = malloc((size_t)n * 4), *w = malloc((size_t)n * 4), *s = malloc((size_t)mine * L * 4 + 4);
    if (!g || !w || !s) MPI_Abort(MPI_COMM_WORLD, 1);
    for (long i = 0; i < n; i++) {
        g[i] = (float)((i + rank) % 1000) * 1e-3f;
        w[i] = 0;
    }
    double t[3] = {0, 0, 0};
    for (int it = -1; it < iters; it++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        MPI_Alltoallv(g, cnt, dsp, MPI_FLOAT, s, rcnt, rdsp, MPI_FLOAT, node);
        double t1 = MPI_Wtime();
        float *o = w + dsp[l];
        for (int j = 0; j < mine; j++) {
            float a = s[j];
            for (int i = 1; i < L; i++) a += s[(long)i * mine + j];
            o[j] = a;
        }
        double t2 = MPI_Wtime();
        MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, w, cnt, dsp, MPI_FLOAT, node);
        double t3 = MPI_Wtime();
        if (it >= 0) {
            t[0] += t1 - t0;
            t[1] += t2 - t1;
            t[2] += t3 - t2;
        }
    }
    for (int i = 0; i < 3; i++) t[i] /= iters;
    double m[3];
    MPI_Reduce(t, m, 3, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0)
        printf("intranode_bench: %d ranks, nodes of L=%d, n=%ld floats: alltoallv %.1f ms, sum %.1f ms, "
               "allgatherv %.1f ms, total %.1f ms per call (slowest rank's mean of %d)\n",
               nranks, L, n, m[0] * 1e3, m[1] * 1e3, m[2] * 1e3, (m[0] + m[1] + m[2]) * 1e3, iters);
    free(cnt);
    free(g);
    free(w);
    free(s);
    MPI_Comm_free(&node);
    MPI_Finalize();
    return 0;
}
