/* MPI life cycle: read and validate the configuration once MPI is
 * initialised, check it agrees across ranks, print the banner; report
 * statistics and free every MPI state when MPI_Finalize runs (through an
 * attribute on MPI_COMM_SELF, mpi_comm.c, so that Fortran's MPI_FINALIZE,
 * which calls PMPI_Finalize directly, is covered too). */
#include <stdio.h>
#include <stdlib.h>

#include "dgcshim/config.h"
#include "dgcshim/stats.h"
#include "engine_stream.h"
#include "log.h"
#include "mpi_internal.h"
#include "registry.h"

static const char *env_lookup(const char *name) { return getenv(name); }

/* A spawned job's number, so that its log lines differ from its parent's
 * (both have a rank 0). Open MPI numbers jobs in the low 16 bits of the job
 * id, 1 being the job mpirun started; other MPIs: -1, printed "spawned". */
static int spawned_job(void) {
    MPI_Comm parent = MPI_COMM_NULL;
    PMPI_Comm_get_parent(&parent);
    if (parent == MPI_COMM_NULL) return 0;
    const char *id = getenv("OMPI_MCA_ess_base_jobid");
    char *end = NULL;
    unsigned long long v = id ? strtoull(id, &end, 10) : 0;
    return id && end != id && *end == '\0' && (v & 0xffff) ? (int)(v & 0xffff) : -1;
}

/* Parses the environment, agrees on it with every rank of MPI_COMM_WORLD and
 * installs it; a bad or inconsistent environment stops the job here. */
void dgc_mpi_setup(void) {
    if (dgc_registry_hook(DGC_HOOK_SELF_KEY) != -1) return; /* already done: C and Fortran both init'ed */
    int rank = 0;
    PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
    dgc_config_set_rank(rank);
    dgc_config_set_job(spawned_job());
    dgc_config cfg;
    char err[256];
    int failed = dgc_config_parse(&cfg, env_lookup, err, sizeof err) != 0;
    dgc_config quiet = cfg;
    quiet.enable = 0; /* log level now, compression only once every rank agreed */
    dgc_config_install(&quiet);
    if (failed) DGC_ERROR("%s", err);
    int agree = dgc_mpi_lifetime_init(&cfg, failed ? DGC_LOCAL_PARSE_FAILED : 0);
    if (agree != DGC_AGREE_OK) {
        DGC_ERROR("stopping: %s", agree == DGC_AGREE_NO_MEMORY ? "no memory for the shim's start-up"
                                                             : "fix the DGC_* environment (see the README's "
                                                               "configuration table)");
        PMPI_Abort(MPI_COMM_WORLD, 1);
    }
    dgc_config_install(&cfg);
    if (rank == 0) {
        char line[1024];
        dgc_config_describe(&cfg, line, sizeof line);
        DGC_INFO("dgcshim active (host engine: %s): %s", dgc_stream_variant_name(), line);
    }
}

int MPI_Init(int *argc, char ***argv) {
    int rc = PMPI_Init(argc, argv);
    if (rc == MPI_SUCCESS) dgc_mpi_setup();
    return rc;
}

int MPI_Init_thread(int *argc, char ***argv, int required, int *provided) {
    int rc = PMPI_Init_thread(argc, argv, required, provided);
    if (rc == MPI_SUCCESS) dgc_mpi_setup();
    return rc;
}

/* A buffer is its output address; one reduced from a send buffer of its own
 * (not in place) adds that, since one output can serve several inputs
 * (dgc_stats_label). A buffer whose states were all freed before the report
 * (its communicator freed, or idle) is marked with a '*'. */
typedef struct {
    dgc_buffer_stats total;
    uint64_t freed_rows;
} report_acc;

static void print_row(const dgc_report_row *r, void *ctx) {
    report_acc *acc = ctx;
    char label[48], row[288];
    dgc_stats_label(r->buf, r->send, r->live ? "" : "*", label, sizeof label);
    dgc_stats_row(label, r->count, &r->stats, row, sizeof row);
    dgc_log_tagged("STATS", "%s", row);
    dgc_stats_add(&acc->total, &r->stats);
    acc->freed_rows += !r->live;
}

void dgc_stats_report(void) {
    char row[256];
    dgc_stats_header(row, sizeof row);
    dgc_log_tagged("STATS", "%s", row);
    report_acc acc = {0};
    dgc_registry_each_row(print_row, &acc);
    dgc_registry_totals t;
    dgc_registry_totals_get(&t);
    if (t.released_unkeyed_states) { /* past DGC_RELEASED_ROWS keys */
        char label[32];
        snprintf(label, sizeof label, "freed(%llu)", (unsigned long long)t.released_unkeyed_states);
        dgc_stats_row(label, 0, &t.released_unkeyed, row, sizeof row);
        dgc_log_tagged("STATS", "%s", row);
        dgc_stats_add(&acc.total, &t.released_unkeyed);
    }
    dgc_stats_row("total", 0, &acc.total, row, sizeof row);
    dgc_log_tagged("STATS", "%s", row);
    if (acc.freed_rows)
        dgc_log_tagged("STATS", "*: %llu buffer%s whose states were freed before this report (communicator freed, "
                       "or idle for DGC_STATE_IDLE_CALLS calls)", (unsigned long long)acc.freed_rows,
                       acc.freed_rows == 1 ? "" : "s");
    char failed[256];
    size_t at = 0;
    for (int i = 0; i < DGC_FAIL_CAUSES; i++)
        at += (size_t)snprintf(failed + at, sizeof failed - at, "%s%s %llu", i ? ", " : "",
                               dgc_fail_cause_name((dgc_fail_cause)i), (unsigned long long)t.failed[i]);
    dgc_log_tagged("STATS", "pass-through calls %llu, compressed calls %llu, summed densely over budget %llu, "
                   "failed %s; steps with a saturated residual %llu", (unsigned long long)t.passthrough,
                   (unsigned long long)acc.total.calls, (unsigned long long)t.over_budget, failed,
                   (unsigned long long)t.saturated);
    dgc_log_tagged("STATS", "memory: %llu bytes in %llu live states (released %llu), peak %llu bytes",
                   (unsigned long long)t.bytes, (unsigned long long)t.live_states,
                   (unsigned long long)t.released_states, (unsigned long long)t.peak_bytes);
}

/* NCCL communicators are not MPI's to free: their records stay until
 * ncclCommDestroy, and the report printed here (once: the NCCL front end
 * prints it at exit otherwise) shows them as they stand. */
void dgc_mpi_finalizing(void) {
    const dgc_config *cfg = dgc_config_current();
    if (cfg->stats && dgc_config_rank() == 0 && dgc_registry_claim(DGC_FLAG_REPORTED)) dgc_stats_report();
    dgc_config off = *cfg;
    off.enable = 0;
    dgc_config_install(&off);
    dgc_registry_clear_owner(DGC_OWNER_MPI);
}
