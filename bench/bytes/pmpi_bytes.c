/* A byte counter of the project's own, preloaded before libdgcshim.so:
 * it interposes the PMPI collectives the shim (and a plain program) sends
 * through, and adds up what this rank sends under the standard algorithms
 * (ring all-gather and all-reduce, pairwise all-to-all and reduce-scatter):
 *   all-gather of c bytes a rank:   (N-1) c       all-to-all of c bytes a peer: (N-1) c
 *   all-reduce of c bytes:          2 (N-1) c / N reduce-scatter of c bytes a rank: (N-1) c
 * and the messages each sends (N-1 a collective; 2 (N-1) for the
 * all-reduce). Counting runs between MPI_Pcontrol(1) and MPI_Pcontrol(0)
 * (MPI's own profiling switch); at MPI_Finalize rank 0 prints
 *   BYTES ranks N max_bytes B mean_bytes M messages K calls C
 * for the counted window, B the largest rank's. The dense ring it is
 * compared with is the same formula for the uncompressed call (run.sh).
 * Only a benchmark's: never part of the shim. */
#include <dlfcn.h>
#include <mpi.h>
#include <stdio.h>

static int counting;
static double bytes, messages, calls;

static void add(MPI_Comm comm, double per_peer, int all_reduce) {
    int n = 1;
    if (!counting || PMPI_Comm_size(comm, &n) != MPI_SUCCESS || n < 2) return;
    bytes += all_reduce ? 2.0 * (n - 1) * per_peer / n : (double)(n - 1) * per_peer;
    messages += all_reduce ? 2.0 * (n - 1) : (double)(n - 1);
    calls += 1;
}

static double size_of(MPI_Datatype t, int count) {
    int s = 0;
    PMPI_Type_size(t, &s);
    return (double)s * count;
}

#define REAL(name, type) ((type)dlsym(RTLD_NEXT, #name))

int PMPI_Allgather(const void *sb, int sc, MPI_Datatype st, void *rb, int rc, MPI_Datatype rt, MPI_Comm comm) {
    typedef int (*fn)(const void *, int, MPI_Datatype, void *, int, MPI_Datatype, MPI_Comm);
    add(comm, size_of(st, sc), 0);
    return REAL(PMPI_Allgather, fn)(sb, sc, st, rb, rc, rt, comm);
}

int PMPI_Alltoall(const void *sb, int sc, MPI_Datatype st, void *rb, int rc, MPI_Datatype rt, MPI_Comm comm) {
    typedef int (*fn)(const void *, int, MPI_Datatype, void *, int, MPI_Datatype, MPI_Comm);
    add(comm, size_of(st, sc), 0);
    return REAL(PMPI_Alltoall, fn)(sb, sc, st, rb, rc, rt, comm);
}

int PMPI_Allreduce(const void *sb, void *rb, int c, MPI_Datatype t, MPI_Op op, MPI_Comm comm) {
    typedef int (*fn)(const void *, void *, int, MPI_Datatype, MPI_Op, MPI_Comm);
    add(comm, size_of(t, c), 1);
    return REAL(PMPI_Allreduce, fn)(sb, rb, c, t, op, comm);
}

int PMPI_Reduce_scatter_block(const void *sb, void *rb, int c, MPI_Datatype t, MPI_Op op, MPI_Comm comm) {
    typedef int (*fn)(const void *, void *, int, MPI_Datatype, MPI_Op, MPI_Comm);
    add(comm, size_of(t, c), 0);
    return REAL(PMPI_Reduce_scatter_block, fn)(sb, rb, c, t, op, comm);
}

int MPI_Pcontrol(const int level, ...) {
    counting = level != 0;
    return MPI_SUCCESS;
}

int MPI_Finalize(void) {
    typedef int (*fn)(void);
    double mine[3] = {bytes, messages, calls}, sum[3], max;
    int n = 1, r = 0;
    PMPI_Comm_size(MPI_COMM_WORLD, &n);
    PMPI_Comm_rank(MPI_COMM_WORLD, &r);
    REAL(PMPI_Reduce, int (*)(const void *, void *, int, MPI_Datatype, MPI_Op, int, MPI_Comm))(
        mine, sum, 3, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    REAL(PMPI_Reduce, int (*)(const void *, void *, int, MPI_Datatype, MPI_Op, int, MPI_Comm))(
        &bytes, &max, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (r == 0)
        printf("BYTES ranks %d max_bytes %.0f mean_bytes %.0f messages %.0f calls %.0f\n", n, max, sum[0] / n,
               sum[1] / n, sum[2] / n);
    fflush(stdout);
    return REAL(PMPI_Finalize, fn)();
}
