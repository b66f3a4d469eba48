/* A dense float sum whose result is the same bytes on every rank.
 *
 * MPI_Allreduce makes no such promise: Open MPI picks recursive doubling,
 * Rabenseifner or a ring by size and rank count, and some of them reduce the
 * same element on several ranks in different orders. Here every element is
 * reduced once, on the one rank that owns its block (MPI_Reduce_scatter_block),
 * and that rank's bytes are then copied to all (MPI_Allgather): the bytes a
 * ring all-reduce moves, 2 (N-1)/N 4n per rank, and invariant 3 by
 * construction.
 *
 * Both collectives work in place on the caller's vector, so the sum needs no
 * memory of its own beyond N floats for the n mod N elements left over, for
 * which the communicator's reserve ((N+1) x at least 64 bytes) has room.
 * Counts are ints: the vector goes in pieces of at most 2^30 elements. */
#include <string.h>

#include "internal.h"

#define PIECE ((uint64_t)1 << 30)

/* The first blocks * nranks elements of v, in place. */
static int sum_blocks(float *v, uint64_t block, int rank, MPI_Comm comm) {
    if (block == 0) return MPI_SUCCESS;
    int rc = PMPI_Reduce_scatter_block(MPI_IN_PLACE, v, (int)block, MPI_FLOAT, MPI_SUM, comm);
    if (rc != MPI_SUCCESS) return rc;
    /* This rank's reduced block came back at the start of v. */
    memmove(v + (uint64_t)rank * block, v, (size_t)block * sizeof *v);
    return PMPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, v, (int)block, MPI_FLOAT, comm);
}

/* The rem < nranks elements after the blocks: one each, padded with zeros
 * in spare (nranks floats). */
static int sum_rest(float *v, uint64_t rem, int nranks, int rank, float *spare, MPI_Comm comm) {
    if (rem == 0) return MPI_SUCCESS;
    memset(spare, 0, (size_t)nranks * sizeof *spare);
    memcpy(spare, v, (size_t)rem * sizeof *v);
    int rc = sum_blocks(spare, 1, rank, comm);
    if (rc == MPI_SUCCESS) memcpy(v, spare, (size_t)rem * sizeof *v);
    return rc;
}

int dgc_mpi_dense_sum(float *work, uint64_t n, const dgc_comm *c, MPI_Comm comm) {
    const int rank = c->rank;
    float *spare = c->reserve;
    for (uint64_t at = 0; at < n; at += PIECE) {
        uint64_t len = n - at < PIECE ? n - at : PIECE, block = len / (uint64_t)c->nranks;
        uint64_t body = block * (uint64_t)c->nranks;
        int rc = sum_blocks(work + at, block, rank, comm);
        if (rc == MPI_SUCCESS) rc = sum_rest(work + at + body, len - body, c->nranks, rank, spare, comm);
        if (rc != MPI_SUCCESS) return rc;
    }
    return MPI_SUCCESS;
}
