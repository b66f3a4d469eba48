/* Cross-rank agreement on the configuration. Two ranks that picked different
 * sparsities would exchange payloads of different sizes: a hang or garbage.
 * So before anything is compressed, all ranks compare per-variable hashes in
 * one MPI_MAX all-reduce over (hash, ~hash) pairs: max(~h) == ~min(h), so
 * min == max, i.e. agreement, reads off one reduction. Two more slots carry
 * what ranks could not do on their own (parse, allocate), so that a local
 * failure stops every rank at the same call instead of hanging the others. */
#include "core/log.h"
#include "internal.h"

enum { SLOT_PARSE = 2 * DGC_OPT_COUNT, SLOT_MEMORY, NSLOTS };

static void report_mismatch(const dgc_config *cfg, int i) {
    char mine[128];
    dgc_option_describe(cfg, (dgc_option)i, mine, sizeof mine);
    DGC_ERROR("%s differs between ranks (this rank has %s); every rank must run with the same value "
              "(accepted %s, default %s): check mpirun -x and per-host environments",
              dgc_option_name((dgc_option)i), mine, dgc_option_range((dgc_option)i),
              dgc_option_default((dgc_option)i));
}

int dgc_mpi_config_agrees(MPI_Comm comm, const dgc_config *cfg, int local) {
    uint64_t a[NSLOTS] = {0};
    for (int i = 0; i < DGC_OPT_COUNT; i++) {
        uint64_t h = dgc_option_is_collective((dgc_option)i) ? dgc_option_hash(cfg, (dgc_option)i) : 0;
        a[i] = h;
        a[DGC_OPT_COUNT + i] = ~h;
    }
    a[SLOT_PARSE] = (local & DGC_LOCAL_PARSE_FAILED) != 0;
    a[SLOT_MEMORY] = (local & DGC_LOCAL_NO_MEMORY) != 0;
    if (PMPI_Allreduce(MPI_IN_PLACE, a, NSLOTS, MPI_UINT64_T, MPI_MAX, comm) != MPI_SUCCESS) {
        DGC_ERROR("the DGC_* consistency check could not run (MPI_Allreduce failed)");
        return DGC_AGREE_UNCHECKED;
    }
    if (a[SLOT_PARSE]) {
        if (!(local & DGC_LOCAL_PARSE_FAILED))
            DGC_ERROR("another rank rejected its DGC_* environment (its own message says which variable)");
        return DGC_AGREE_MISMATCH;
    }
    if (a[SLOT_MEMORY]) {
        DGC_ERROR("%s could not reserve the memory a communicator needs (a few hundred KiB); the call fails "
                  "on every rank with MPI_ERR_NO_MEM", (local & DGC_LOCAL_NO_MEMORY) ? "this rank" : "another rank");
        return DGC_AGREE_NO_MEMORY;
    }
    for (int i = 0; i < DGC_OPT_COUNT; i++) {
        if (a[i] == ~a[DGC_OPT_COUNT + i]) continue;
        report_mismatch(cfg, i);
        return DGC_AGREE_MISMATCH;
    }
    return DGC_AGREE_OK;
}

int dgc_mpi_fail(MPI_Comm comm, int code) {
    PMPI_Comm_call_errhandler(comm, code);
    return code;
}
