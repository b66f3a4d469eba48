/* MPI life cycle: read and validate the configuration at MPI_Init, check it
 * agrees across ranks, print the banner; report statistics at MPI_Finalize;
 * forget a communicator's state when it is freed. */
#include <stdio.h>
#include <stdlib.h>

#include "dgcshim/config.h"
#include "dgcshim/stats.h"
#include "engine_stream.h"
#include "log.h"
#include "mpi_internal.h"
#include "registry.h"

static const char *env_lookup(const char *name) { return getenv(name); }

/* Parses the environment, agrees on it with every rank of MPI_COMM_WORLD and
 * installs it; a bad or inconsistent environment stops the job here. */
static void setup(void) {
    int rank = 0;
    PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
    dgc_config_set_rank(rank);
    dgc_config cfg;
    char err[256];
    int failed = dgc_config_parse(&cfg, env_lookup, err, sizeof err) != 0;
    if (failed) {
        dgc_config_install(&cfg); /* defaults, so the log level is sane */
        DGC_ERROR("%s", err);
    }
    if (dgc_mpi_config_agrees(MPI_COMM_WORLD, &cfg, failed) != 0) {
        DGC_ERROR("stopping: fix the DGC_* environment (see the README's configuration table)");
        PMPI_Abort(MPI_COMM_WORLD, 1);
    }
    dgc_registry_comm_checked(dgc_mpi_comm_key(MPI_COMM_WORLD));
    dgc_config_install(&cfg);
    if (rank == 0) {
        char line[768];
        dgc_config_describe(&cfg, line, sizeof line);
        DGC_INFO("dgcshim active (host engine: %s): %s", dgc_stream_variant_name(), line);
    }
}

int MPI_Init(int *argc, char ***argv) {
    int rc = PMPI_Init(argc, argv);
    if (rc == MPI_SUCCESS) setup();
    return rc;
}

int MPI_Init_thread(int *argc, char ***argv, int required, int *provided) {
    int rc = PMPI_Init_thread(argc, argv, required, provided);
    if (rc == MPI_SUCCESS) setup();
    return rc;
}

static void print_row(const dgc_buffer *b, void *ctx) {
    dgc_buffer_stats *total = ctx;
    char label[32], row[256];
    snprintf(label, sizeof label, "%p", b->buf);
    dgc_stats_row(label, b->count, &b->stats, row, sizeof row);
    dgc_log_tagged("STATS", "%s", row);
    dgc_stats_add(total, &b->stats);
}

static void report(void) {
    char row[256];
    dgc_stats_header(row, sizeof row);
    dgc_log_tagged("STATS", "%s", row);
    dgc_buffer_stats total = {0};
    dgc_registry_each(print_row, &total);
    dgc_stats_row("total", 0, &total, row, sizeof row);
    dgc_log_tagged("STATS", "%s", row);
    dgc_log_tagged("STATS", "pass-through calls %llu, compressed calls %llu",
                   (unsigned long long)dgc_registry_passthrough_calls(), (unsigned long long)total.calls);
}

int MPI_Finalize(void) {
    if (dgc_config_current()->stats && dgc_config_rank() == 0) report();
    dgc_registry_clear();
    return PMPI_Finalize();
}

int MPI_Comm_free(MPI_Comm *comm) {
    dgc_registry_drop_comm(dgc_mpi_comm_key(*comm));
    return PMPI_Comm_free(comm);
}
