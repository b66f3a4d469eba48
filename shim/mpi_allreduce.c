/* MPI_Allreduce interposition. The pass-through test is a handful of
 * comparisons against the installed configuration: no lock, allocation,
 * system call or environment read, since frameworks issue many tiny
 * all-reduces. Everything else is the compressed path. */
#include <time.h>

#include "dgcshim/config.h"
#include "dgcshim/policy.h"
#include "dgcshim/wire.h"
#include "log.h"
#include "mpi_internal.h"
#include "registry.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* MPI_Init checked MPI_COMM_WORLD. Every other communicator is checked once,
 * before its first compressed exchange: those derived from MPI_COMM_WORLD
 * pass trivially, but ones from connect/accept or spawn hold ranks MPI_Init
 * never compared, and a handle does not tell which kind it is. */
static int check_comm(MPI_Comm comm, const dgc_config *cfg) {
    int seen = dgc_registry_comm_checked(dgc_mpi_comm_key(comm));
    if (seen < 0) return MPI_ERR_NO_MEM;
    if (seen == 0 && dgc_mpi_config_agrees(comm, cfg, 0) != 0) return MPI_ERR_OTHER;
    return MPI_SUCCESS;
}

/* Momentum compensation: an unmodified SGD with momentum m computes
 * buf = m*buf + d; returning d = S_t - m*S_{t-1} (S: the summed sparse update)
 * makes buf == S_t, so the framework applies exactly the DGC update. Only a
 * finite step becomes the next S_{t-1}: after a skipped one, the optimizer's
 * buffer still holds the last finite S. */
static void compensate(dgc_buffer *b, float *out, const dgc_step_params *p, const dgc_config *cfg) {
    if (!cfg->compensate || p->momentum == 0.0f) return;
    if (b->prev_k) dgc_wire_subtract(b->prev, p->nranks, b->prev_k, p->momentum, out);
    dgc_registry_keep_gathered(b, p->k);
}

/* Compress, exchange, decode, commit. rb receives the sum. Errors of the
 * shim's own go to comm's error handler here; an all-gather error already
 * went there inside MPI. */
static int exchange(dgc_buffer *b, const float *g, float *rb, const dgc_step_params *p, MPI_Comm comm,
                    const dgc_config *cfg) {
    size_t bytes = dgc_wire_bytes(p->k);
    if (dgc_registry_reserve(b, bytes, p->nranks)) return dgc_mpi_fail(comm, MPI_ERR_NO_MEM);
    double t0 = now();
    /* The output is zeroed as the update streams past: on an error below its
     * contents are undefined, as MPI allows. */
    int zeroed = dgc_compress_zeroing(b->state, g, p, b->send, rb);
    if (zeroed < 0) return dgc_mpi_fail(comm, MPI_ERR_NO_MEM);
    double t1 = now();
    int words = (int)(bytes / 8);
    int rc = PMPI_Allgather(b->send, words, MPI_UINT64_T, b->gathered, words, MPI_UINT64_T, comm);
    if (rc != MPI_SUCCESS) {
        dgc_discard(b->state);
        return rc;
    }
    double t2 = now();
    char err[256];
    dgc_decode_result r = (zeroed ? dgc_wire_decode_zeroed : dgc_wire_decode)(b->gathered, p->nranks, p->step,
                                                                             b->count, p->k, rb, err, sizeof err);
    if (r == DGC_DECODE_OK) {
        dgc_commit(b->state, p);
        compensate(b, rb, p, cfg);
    } else {
        dgc_discard(b->state);
    }
    b->stats.engine_seconds += (t1 - t0) + (now() - t2);
    b->stats.calls++;
    b->stats.dense_bytes += b->count * sizeof(float);
    b->stats.wire_bytes += bytes;
    b->stats.last_wire_bytes = bytes;
    if (r == DGC_DECODE_NONFINITE) {
        b->stats.nonfinite++;
        DGC_INFO("step %llu on a %llu-element buffer held Inf/NaN on some rank: output set to NaN, "
                 "residual and momentum kept as they were", (unsigned long long)p->step,
                 (unsigned long long)b->count);
    }
    if (r == DGC_DECODE_BAD) {
        DGC_ERROR("%s", err);
        return dgc_mpi_fail(comm, MPI_ERR_OTHER);
    }
    return MPI_SUCCESS;
}

/* The compressed path. Returns PASS when the call must pass through after all
 * (decided from count and step, so on every rank alike). */
enum { PASS = -1 };

static int compressed(const void *sb, void *rb, uint64_t count, MPI_Comm comm, int nranks,
                      const dgc_config *cfg) {
    int rc = check_comm(comm, cfg);
    if (rc != MPI_SUCCESS) return dgc_mpi_fail(comm, rc);
    uint64_t key = dgc_mpi_comm_key(comm), step;
    if (dgc_registry_next_step(key, count, &step)) return dgc_mpi_fail(comm, MPI_ERR_NO_MEM);
    dgc_step_params p;
    if (dgc_policy_plan(cfg, count, step, nranks, &p)) return PASS; /* too big for one all-gather */
    dgc_buffer *b = dgc_registry_buffer(key, rb, count, cfg->momentum > 0);
    if (!b) {
        DGC_ERROR("no memory for the state of a %llu-element buffer", (unsigned long long)count);
        return dgc_mpi_fail(comm, MPI_ERR_NO_MEM);
    }
    return exchange(b, sb == MPI_IN_PLACE ? rb : sb, rb, &p, comm, cfg);
}

static int is_candidate(const dgc_config *cfg, MPI_Datatype dt, MPI_Op op, MPI_Count count) {
    return cfg->enable && op == MPI_SUM && dt == MPI_FLOAT && count >= 0 &&
           (uint64_t)count >= cfg->min_elements;
}

/* Intra-communicator size, or 0 for inter-communicators (whose all-reduce
 * semantics differ: always passed through). */
static int intra_size(MPI_Comm comm) {
    int inter = 0, size = 0;
    if (PMPI_Comm_test_inter(comm, &inter) != MPI_SUCCESS || inter) return 0;
    PMPI_Comm_size(comm, &size);
    return size;
}

/* The compressed path's result, or PASS. */
static int try_compressed(const void *sb, void *rb, MPI_Count count, MPI_Datatype dt, MPI_Op op,
                          MPI_Comm comm) {
    const dgc_config *cfg = dgc_config_current();
    if (is_candidate(cfg, dt, op, count)) {
        int n = intra_size(comm);
        if (dgc_policy_compressible(cfg, (uint64_t)count, n))
            return compressed(sb, rb, (uint64_t)count, comm, n, cfg);
    }
    if (cfg->stats) dgc_registry_count_passthrough();
    return PASS;
}

int MPI_Allreduce(const void *sb, void *rb, int count, MPI_Datatype dt, MPI_Op op, MPI_Comm comm) {
    int rc = try_compressed(sb, rb, count, dt, op, comm);
    return rc != PASS ? rc : PMPI_Allreduce(sb, rb, count, dt, op, comm);
}

#if MPI_VERSION >= 4
int MPI_Allreduce_c(const void *sb, void *rb, MPI_Count count, MPI_Datatype dt, MPI_Op op, MPI_Comm comm) {
    int rc = try_compressed(sb, rb, count, dt, op, comm);
    return rc != PASS ? rc : PMPI_Allreduce_c(sb, rb, count, dt, op, comm);
}
#endif
