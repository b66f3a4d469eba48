/* Cross-rank agreement on the configuration. Two ranks that picked different
 * sparsities would exchange payloads of different sizes: a hang or garbage.
 * So before anything is compressed, all ranks compare per-variable hashes in
 * one MPI_MAX all-reduce over (hash, ~hash) pairs: max(~h) == ~min(h), so
 * min == max, i.e. agreement, reads off one reduction. */
#include "dgcshim/config.h"
#include "log.h"
#include "mpi_internal.h"

enum { SLOT_FAILED = 2 * DGC_OPT_COUNT, NSLOTS };

int dgc_mpi_config_agrees(MPI_Comm comm, const dgc_config *cfg, int parse_failed) {
    uint64_t a[NSLOTS] = {0};
    for (int i = 0; i < DGC_OPT_COUNT; i++) {
        uint64_t h = dgc_option_is_collective((dgc_option)i) ? dgc_option_hash(cfg, (dgc_option)i) : 0;
        a[i] = h;
        a[DGC_OPT_COUNT + i] = ~h;
    }
    a[SLOT_FAILED] = parse_failed ? 1 : 0;
    if (PMPI_Allreduce(MPI_IN_PLACE, a, NSLOTS, MPI_UINT64_T, MPI_MAX, comm) != MPI_SUCCESS) {
        DGC_ERROR("the DGC_* consistency check could not run (MPI_Allreduce failed)");
        return -1;
    }
    if (a[SLOT_FAILED]) {
        if (!parse_failed)
            DGC_ERROR("another rank rejected its DGC_* environment (its own message says which variable)");
        return -1;
    }
    for (int i = 0; i < DGC_OPT_COUNT; i++) {
        if (a[i] == ~a[DGC_OPT_COUNT + i]) continue;
        char mine[128];
        dgc_option_describe(cfg, (dgc_option)i, mine, sizeof mine);
        DGC_ERROR("%s differs between ranks (this rank has %s); every rank must run with the same value "
                  "(accepted %s, default %s): check mpirun -x and per-host environments",
                  dgc_option_name((dgc_option)i), mine, dgc_option_range((dgc_option)i),
                  dgc_option_default((dgc_option)i));
        return -1;
    }
    return 0;
}

int dgc_mpi_fail(MPI_Comm comm, int code) {
    PMPI_Comm_call_errhandler(comm, code);
    return code;
}
