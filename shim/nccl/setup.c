/* The NCCL front end's process set-up, on the first interposed call.
 *
 * An NCCL-only job (torchrun, a TensorFlow job) never calls MPI_Init, where
 * the MPI path reads the DGC_* environment: so the first NCCL call reads it
 * here, unless MPI_Init already did. A bad value cannot stop the job at
 * start as on the MPI path (there is no collective to agree with yet): it is
 * logged here, with the variable and its range, and every communicator's
 * configuration check then fails on every rank alike (nccl/agree.c). */
#include <stdio.h>
#include <stdlib.h>

#include "core/log.h"
#include "internal.h"

static const char *env_lookup(const char *name) { return getenv(name); }

static void setup(void) {
    /* The configuration first (its DGC_LOG_LEVEL governs what resolving
     * says), its error, if any, once the rank is known. */
    dgc_config cfg;
    char err[256];
    int configure = dgc_registry_hook(DGC_HOOK_SELF_KEY) == -1; /* MPI_Init did not configure the process */
    int failed = 0;
    if (configure) {
        failed = dgc_config_parse(&cfg, env_lookup, err, sizeof err) != 0;
        dgc_config_install(&cfg); /* the defaults when it failed: the log level at least */
    }
    dgc_nccl_api *api = dgc_nccl_resolve();
    dgc_device_resolve(); /* the driver's context functions, for the device guard */
    /* The rank, for log lines and the rank-0 report: the launcher's, else
     * the rank in the communicator of the call that got here first (which
     * may be a subgroup's: several processes would then be rank 0). */
    ncclComm_t first = dgc_registry_slot(DGC_SLOT_NCCL_FIRST_COMM);
    int rank = dgc_config_launcher_rank(env_lookup);
    if (dgc_config_rank() == -1 && rank >= 0) dgc_config_set_rank(rank);
    if (api && first && dgc_config_rank() == -1 && api->comm_user_rank(first, &rank) == ncclSuccess)
        dgc_config_set_rank(rank);
    if (failed) {
        dgc_registry_claim(DGC_FLAG_NCCL_PARSE_FAILED);
        DGC_ERROR("%s; until it is fixed, every float sum or average ncclAllReduce fails with ncclInvalidUsage on "
                  "every rank",
                  err);
    }
    dgc_registry_set_slot(DGC_SLOT_NCCL_API, api);
}

const dgc_nccl_api *dgc_nccl_enter(ncclComm_t comm) {
    dgc_registry_tally_add(DGC_TALLY_NCCL_CALLS);
    if (comm && !dgc_registry_slot(DGC_SLOT_NCCL_API)) dgc_registry_set_slot(DGC_SLOT_NCCL_FIRST_COMM, comm);
    dgc_registry_once(DGC_ONCE_NCCL_SETUP, setup);
    const dgc_nccl_api *api = dgc_registry_slot(DGC_SLOT_NCCL_API);
    if (!api && dgc_registry_claim(DGC_FLAG_NCCL_MISSING_SAID))
        DGC_ERROR("an NCCL function was called but the shim has no real NCCL to forward it to: it fails");
    return api;
}

/* NCCL_VERSION_CODE: major*10000 + minor*100 + patch from 2.9 on,
 * major*1000 + minor*100 + patch before. */
static void version_text(int v, char *buf, size_t len) {
    if (v <= 0) snprintf(buf, len, "version unknown");
    else if (v >= 20900) snprintf(buf, len, "version %d.%d.%d", v / 10000, v / 100 % 100, v % 100);
    else snprintf(buf, len, "version %d.%d.%d", v / 1000, v / 100 % 10, v % 100);
}

/* Every setting at DGC_LOG_LEVEL=info; at the default level one shorter
 * line on rank 0, so that a DDP job shows the shim is on (as the MPI path
 * does); nothing at error. */
void dgc_nccl_banner(const dgc_nccl_api *api, int nranks) {
    const dgc_config *cfg = dgc_config_current();
    if (cfg->log_level < DGC_LOG_WARN || (cfg->log_level == DGC_LOG_WARN && dgc_config_rank() != 0)) return;
    if (!dgc_registry_claim(DGC_FLAG_NCCL_BANNER)) return;
    char version[48], line[4096]; /* two paths of up to DGC_TEXT_MAX among the values */
    version_text(api->version, version, sizeof version);
    if (cfg->log_level >= DGC_LOG_INFO) {
        dgc_config_describe(cfg, line, sizeof line);
        DGC_INFO("dgcshim NCCL path active: real NCCL from %s (%s): %s", api->object, version, line);
        return;
    }
    dgc_log_tagged("INFO", "dgcshim NCCL path active on %d ranks (real NCCL from %s, %s): DGC_SPARSITY=%g "
                           "DGC_MOMENTUM=%g DGC_WARMUP_STEPS=%llu; DGC_LOG_LEVEL=info shows every setting, error "
                           "hides this line",
                   nranks, api->object, version, cfg->sparsity, cfg->momentum, (unsigned long long)cfg->warmup_steps);
}
