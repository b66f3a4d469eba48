/* MPI life cycle: read and validate the configuration once MPI is
 * initialised, check it agrees across ranks, print the banner; report
 * statistics and free every MPI state when MPI_Finalize runs (through an
 * attribute on MPI_COMM_SELF, mpi/comm.c, so that Fortran's MPI_FINALIZE,
 * which calls PMPI_Finalize directly, is covered too). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "dgcshim/config.h"
#include "dgcshim/stats.h"
#include "engine/stream.h"
#include "core/log.h"
#include "internal.h"
#include "core/registry.h"

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

/* Ends the job after a failed start-up check. Where the check ran, every
 * rank learnt the same verdict from its one all-reduce and has printed its
 * own line, so each leaves by itself, through MPI_Finalize and exit status
 * 1: the launcher then forwards every rank's output before the job ends.
 * MPI_Abort from each rank would have the launcher kill the others, and
 * MPICH's hydra was seen to drop every rank's line when it did (issue 43).
 * Where the check could not run, or in a spawned job (whose MPI_Finalize
 * would wait for a parent that goes on), only MPI_Abort is sure to end it. */
static _Noreturn void stop_job(int agree) {
    DGC_ERROR("stopping: %s", agree == DGC_AGREE_NO_MEMORY ? "no memory for the shim's start-up"
                                                         : "fix the DGC_* environment (see docs/configuration.md)");
    if (agree == DGC_AGREE_UNCHECKED || dgc_config_job() != 0) PMPI_Abort(MPI_COMM_WORLD, 1);
    /* No rank exits, and so has the launcher end the others, before every
     * rank has written its line. */
    PMPI_Barrier(MPI_COMM_WORLD);
    PMPI_Finalize();
    exit(1);
}

/* The line that says the shim is there, on rank 0: every setting at
 * DGC_LOG_LEVEL=info; at the default level one shorter line (the ranks, the
 * library, the settings that shape the result), since a job that shows
 * nothing of the shim leaves a user guessing whether it is on at all;
 * nothing at DGC_LOG_LEVEL=error. */
static void say_active(const dgc_config *cfg) {
    if (cfg->log_level >= DGC_LOG_INFO) {
        char line[4096]; /* two paths of up to DGC_TEXT_MAX among the values */
        dgc_config_describe(cfg, line, sizeof line);
        DGC_INFO("dgcshim active (host engine: %s, built for %s): %s", dgc_stream_variant_name(), dgc_mpi_built_for(),
                 line);
        return;
    }
    if (cfg->log_level < DGC_LOG_WARN) return;
    int size = 0;
    PMPI_Comm_size(MPI_COMM_WORLD, &size);
    Dl_info self;
    const char *lib = dladdr((void *)say_active, &self) && self.dli_fname ? self.dli_fname : "?";
    /* MPI_COMM_WORLD's layout, found when it was attached (just before). */
    const dgc_comm *world = dgc_mpi_comm_attached(MPI_COMM_WORLD);
    char layout[64];
    dgc_mpi_node_describe(world ? dgc_mpi_node_of(world) : NULL, layout, sizeof layout);
    char key[64], topology[64]; /* the table's own words for them */
    dgc_option_describe(cfg, DGC_OPT_BUFFER_KEY, key, sizeof key);
    dgc_option_describe(cfg, DGC_OPT_TOPOLOGY, topology, sizeof topology);
    dgc_log_tagged("INFO", "dgcshim active on %d ranks (%s): DGC_SPARSITY=%g DGC_MOMENTUM=%g DGC_WARMUP_STEPS=%llu "
                           "%s %s (MPI_COMM_WORLD: %s)%s; DGC_LOG_LEVEL=info shows every setting, error hides this line",
                   size, lib, cfg->sparsity, cfg->momentum, (unsigned long long)cfg->warmup_steps, key, topology,
                   layout, cfg->enable ? "" : " DGC_ENABLE=0");
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
    if (agree != DGC_AGREE_OK) stop_job(agree);
    dgc_config_install(&cfg);
    if (rank == 0) say_active(&cfg);
}

DGC_MPI_EXPORT int MPI_Init(int *argc, char ***argv) {
    dgc_mpi_check_abi("MPI_Init");
    int rc = PMPI_Init(argc, argv);
    if (rc == MPI_SUCCESS) dgc_mpi_setup();
    return rc;
}

DGC_MPI_EXPORT int MPI_Init_thread(int *argc, char ***argv, int required, int *provided) {
    dgc_mpi_check_abi("MPI_Init_thread");
    int rc = PMPI_Init_thread(argc, argv, required, provided);
    if (rc == MPI_SUCCESS) dgc_mpi_setup();
    return rc;
}
