/* Communicators and their records.
 *
 * Every communicator the shim compresses on carries an MPI attribute holding
 * its record's id. MPI runs the attribute's delete callback whenever the
 * communicator is deallocated, by whatever path: MPI_Comm_free from C or
 * from Fortran (whose bindings call PMPI_Comm_free), MPI_Comm_disconnect,
 * MPI_Finalize. So the record and its buffer states die with the
 * communicator, and a handle that MPI hands out again for a new communicator
 * carries no attribute: it starts afresh, whatever its value. The copy
 * callback is MPI_COMM_NULL_COPY_FN, so a duplicate starts afresh too.
 *
 * A second attribute, on MPI_COMM_SELF, is the portable hook into
 * MPI_Finalize: MPI deletes MPI_COMM_SELF's attributes first thing there,
 * whichever language called it. This file owns the process's MPI life: set
 * up by init.c's MPI_Init (dgc_mpi_lifetime_init), ended here. */
#include <stdint.h>

#include "core/log.h"
#include "core/report.h"
#include "core/stats_file.h"
#include "internal.h"

/* The largest payload exchanged in one all-gather; a larger one goes after an
 * all-gather of the headers alone (mpi/exchange.c). The reserve is
 * (nranks + 1) of them, so it stays near 1 MiB for any size. */
static size_t head_bytes(int nranks) {
    size_t h = ((size_t)1 << 20) / (size_t)nranks;
    if (h > ((size_t)64 << 10)) h = (size_t)64 << 10;
    if (h < 64) h = 64;
    return h & ~(size_t)7;
}

static int comm_deleted(MPI_Comm comm, int keyval, void *val, void *extra) {
    (void)comm, (void)keyval, (void)extra;
    dgc_registry_comm_close((uint64_t)(uintptr_t)val);
    return MPI_SUCCESS;
}

/* A job in which nothing was compressed says so on rank 0, at the default
 * log level, with the reasons: otherwise it runs dense, as without the
 * shim, and nothing shows it (a double gradient, a buffer under
 * DGC_MIN_ELEMENTS, no MPI_Allreduce at all). */
static void say_if_nothing_compressed(const dgc_config *cfg) {
    if (dgc_config_rank() != 0 || !cfg->enable || dgc_registry_tally(DGC_TALLY_MPI_COMPRESSED)) return;
    dgc_registry_totals t;
    dgc_registry_totals_get(&t);
    char why[256];
    dgc_report_pass_reasons(&t, why, sizeof why);
    if (why[0])
        DGC_WARN("nothing was compressed in this job: every MPI_Allreduce passed through (by reason: %s; "
                 "docs/mpi.md#what-is-compressed)", why);
    else
        DGC_WARN("nothing was compressed in this job: no MPI_Allreduce reached the shim");
}

/* NCCL communicators are not MPI's to free: their records stay until
 * ncclCommDestroy, and the report printed here (once: the NCCL front end
 * prints it at exit otherwise) shows them as they stand. */
static void finalizing(void) {
    const dgc_config *cfg = dgc_config_current();
    say_if_nothing_compressed(cfg);
    if (cfg->stats && dgc_config_rank() == 0 && dgc_registry_claim(DGC_FLAG_REPORTED)) dgc_stats_report();
    dgc_stats_file_final();
    dgc_config off = *cfg;
    off.enable = 0;
    dgc_config_install(&off);
    dgc_registry_clear_owner(DGC_OWNER_MPI);
}

static int self_deleted(MPI_Comm comm, int keyval, void *val, void *extra) {
    (void)comm, (void)keyval, (void)val, (void)extra;
    finalizing();
    return MPI_SUCCESS;
}

/* Opens a record for comm and ties it to comm's life, then runs the
 * configuration check (a collective: every rank attaches at the same call).
 * Returns DGC_AGREE_*; *out is the record unless memory was short somewhere. */
static int attach(MPI_Comm comm, int nranks, const dgc_config *cfg, int local, dgc_comm **out) {
    int key = dgc_registry_hook(DGC_HOOK_COMM_KEY);
    dgc_comm *c = dgc_registry_comm_open(nranks, head_bytes(nranks));
    if (c) PMPI_Comm_rank(comm, &c->rank); /* asked once: the transports need it on every call */
    if (c && PMPI_Comm_set_attr(comm, key, (void *)(uintptr_t)c->id) != MPI_SUCCESS) {
        dgc_registry_comm_close(c->id);
        c = NULL;
    }
    if (!c) local |= DGC_LOCAL_NO_MEMORY;
    int agree = dgc_mpi_config_agrees(comm, cfg, local);
    *out = NULL;
    if (agree == DGC_AGREE_NO_MEMORY) { /* every rank forgets the comm and tries again next call */
        if (c) PMPI_Comm_delete_attr(comm, key);
        return agree;
    }
    if (c) c->check = agree == DGC_AGREE_OK ? DGC_CHECK_PASSED : DGC_CHECK_FAILED;
    if (agree == DGC_AGREE_OK) { /* every rank has its record here, and finds the layout with the others */
        dgc_mpi_node *x = dgc_mpi_node_find(comm, nranks, cfg, head_bytes);
        if (x) dgc_mpi_node_attach(c, x);
    }
    *out = c;
    return agree;
}

int dgc_mpi_lifetime_init(const dgc_config *cfg, int local) {
    int comm_key = MPI_KEYVAL_INVALID, self_key = MPI_KEYVAL_INVALID;
    if (PMPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, comm_deleted, &comm_key, NULL) != MPI_SUCCESS ||
        PMPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, self_deleted, &self_key, NULL) != MPI_SUCCESS ||
        PMPI_Comm_set_attr(MPI_COMM_SELF, self_key, NULL) != MPI_SUCCESS)
        local |= DGC_LOCAL_NO_MEMORY;
    dgc_registry_set_hook(DGC_HOOK_COMM_KEY, comm_key);
    dgc_registry_set_hook(DGC_HOOK_SELF_KEY, self_key);
    int size = 0;
    PMPI_Comm_size(MPI_COMM_WORLD, &size);
    dgc_comm *world;
    if (comm_key == MPI_KEYVAL_INVALID) return dgc_mpi_config_agrees(MPI_COMM_WORLD, cfg, local);
    return attach(MPI_COMM_WORLD, size, cfg, local, &world);
}

dgc_comm *dgc_mpi_comm_attached(MPI_Comm comm) {
    int key = dgc_registry_hook(DGC_HOOK_COMM_KEY), found = 0;
    void *val = NULL;
    if (key == MPI_KEYVAL_INVALID || PMPI_Comm_get_attr(comm, key, &val, &found) != MPI_SUCCESS || !found) return NULL;
    return dgc_registry_comm_find((uint64_t)(uintptr_t)val);
}

dgc_comm *dgc_mpi_comm(MPI_Comm comm, int nranks, const dgc_config *cfg, int *rc) {
    int key = dgc_registry_hook(DGC_HOOK_COMM_KEY), found = 0;
    void *val = NULL;
    *rc = MPI_ERR_INTERN;
    if (key == MPI_KEYVAL_INVALID || PMPI_Comm_get_attr(comm, key, &val, &found) != MPI_SUCCESS) return NULL;
    dgc_comm *c = NULL;
    if (!found) {
        if (attach(comm, nranks, cfg, 0, &c) == DGC_AGREE_NO_MEMORY) {
            *rc = MPI_ERR_NO_MEM;
            return NULL;
        }
    } else {
        c = dgc_registry_comm_find((uint64_t)(uintptr_t)val);
    }
    if (!c) return NULL; /* an attribute without a record: cannot happen */
    if (c->check == DGC_CHECK_FAILED) {
        /* Recorded as failed on every rank: each fails here, alike, without
         * exchanging payloads that other ranks would size differently. */
        if (found && !c->check_reported++)
            DGC_ERROR("compressed calls on this communicator fail: its ranks disagree on the DGC_* "
                      "configuration (the first error on it said which variable)");
        *rc = MPI_ERR_OTHER;
        return NULL;
    }
    *rc = MPI_SUCCESS;
    return c;
}
