/* Shared by the MPI front-end files. */
#ifndef DGCSHIM_MPI_INTERNAL_H
#define DGCSHIM_MPI_INTERNAL_H

#include <mpi.h>
#include <stdint.h>

/* The registry's key for a communicator handle (a pointer in Open MPI, an int
 * in MPICH). */
static inline uint64_t dgc_mpi_comm_key(MPI_Comm comm) { return (uint64_t)(uintptr_t)comm; }

/* One collective on comm: do all ranks hold the same collective DGC_* values,
 * and did every rank parse its environment? Returns 0 when they agree; else
 * logs, on every rank, the name of the first variable that differs (or that
 * some rank rejected its environment) and returns -1. Every rank gets the same
 * answer, so every rank fails together. */
int dgc_mpi_config_agrees(MPI_Comm comm, const dgc_config *cfg, int parse_failed);

/* Hands code to comm's error handler (fatal by default) and returns code. */
int dgc_mpi_fail(MPI_Comm comm, int code);

#endif
