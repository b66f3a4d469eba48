/* Shared by the MPI front-end files. */
#ifndef DGCSHIM_MPI_INTERNAL_H
#define DGCSHIM_MPI_INTERNAL_H

#include <mpi.h>
#include <stdint.h>

#include "dgcshim/config.h"
#include "dgcshim/engine.h"
#include "dgcshim/policy.h"
#include "core/registry.h"

/* The interposed functions are the library's interface, exported by name:
 * the build hides everything else, and an mpi.h need not declare its
 * functions visible (Open MPI's does, MPICH's does not: the shim would be
 * silently inert there). tests/exports.sh checks the list. */
#define DGC_MPI_EXPORT __attribute__((visibility("default")))

/* The MPI the shim was built for: name, version, MPI standard, ABI. */
const char *dgc_mpi_built_for(void);

/* Stops the process, saying why, when an MPI library of another family
 * than the build's is loaded in it; when names the moment ("load",
 * "MPI_Init"). Runs at load and before each MPI_Init lets MPI start. */
void dgc_mpi_check_abi(const char *when);

/* What this rank brings to the configuration check. */
enum { DGC_LOCAL_PARSE_FAILED = 1, DGC_LOCAL_NO_MEMORY = 2 };
/* Its outcome, the same on every rank, except DGC_AGREE_UNCHECKED: the
 * check's own all-reduce failed, so this rank cannot know what the others
 * concluded. */
enum { DGC_AGREE_OK = 0, DGC_AGREE_NO_MEMORY = 1, DGC_AGREE_MISMATCH = -1, DGC_AGREE_UNCHECKED = -2 };

/* One collective on comm: do all ranks hold the same collective DGC_* values,
 * did every rank parse its environment, and did every rank get the memory it
 * needs (local: DGC_LOCAL_* bits)? Returns DGC_AGREE_*; on a mismatch it
 * logs, on every rank, the name of the first variable that differs (or that
 * some rank rejected its environment). Every rank gets the same answer, so
 * every rank fails together. */
int dgc_mpi_config_agrees(MPI_Comm comm, const dgc_config *cfg, int local);

/* Hands code to comm's error handler (fatal by default) and returns code. */
int dgc_mpi_fail(MPI_Comm comm, int code);

/* Creates the attribute keyvals that tie records to communicators and end
 * the shim's MPI life at MPI_Finalize, from any language, before MPI shuts
 * down (the statistics reported, every MPI state freed); attaches
 * MPI_COMM_WORLD (checking the configuration on it, local: DGC_LOCAL_*
 * bits). Returns DGC_AGREE_*. */
int dgc_mpi_lifetime_init(const dgc_config *cfg, int local);

/* The record of comm (nranks ranks), attached on the first call that
 * compresses on it, which is also when its configuration check runs.
 * NULL with *rc an MPI error class when the check failed or memory was
 * short, on every rank alike. */
dgc_comm *dgc_mpi_comm(MPI_Comm comm, int nranks, const dgc_config *cfg, int *rc);

/* comm's record when it has one already, else NULL: never a collective. */
dgc_comm *dgc_mpi_comm_attached(MPI_Comm comm);

/* One compressed call, from its plan on. local says how this rank takes
 * part (below); b is its buffer entry when it is DGC_PART_STATE. g is the
 * gradient and work the float-aligned output the sum is built in (g may be
 * work). Returns MPI_SUCCESS or an error class (already handed to comm's
 * error handler); every rank returns alike. */
enum { DGC_PART_STATE, DGC_PART_DENSE, DGC_PART_FAILED };
int dgc_mpi_exchange(dgc_comm *c, dgc_buffer *b, int local, const float *g, float *work, const dgc_plan *plan,
                     MPI_Comm comm, const dgc_config *cfg);

/* Sums n floats of work over comm in place, the result the same bytes on
 * every rank (mpi/dense.c); uses c->reserve as scratch. */
int dgc_mpi_dense_sum(float *work, uint64_t n, const dgc_comm *c, MPI_Comm comm);

/* The C entry point's logic, shared with the Fortran ones: the result of a
 * compressed call, or DGC_MPI_PASS when the call must go to the library. */
#define DGC_MPI_PASS (-1)

/* DGC_TRANSPORT=reduce (reduce.c). The scratch a call needs
 * (dgc_registry_reserve_scratch: reserved before the headers' round, so
 * that a rank short of memory says so there). */
size_t dgc_mpi_reduce_scratch(const dgc_region_plan *rp, int nranks, uint64_t k);
/* After the headers' round, on every rank with state: the all-to-all, the
 * owners' sums and selections, the all-gather of the selections into
 * b->wire (this rank's, then every rank's, laid out as rp->pick: what
 * dgc_registry_keep_wire keeps), decoded into work (zeroed by the
 * compression). *keep: per selected pair of this rank's payload, whether to
 * commit it. balanced: every header said it holds this step's balanced
 * bounds; me: this rank in comm. The buffer's bounds are balanced for the next step after. Returns
 * MPI_SUCCESS, MPI's error, or DGC_MPI_BAD_PAYLOAD with err (work zero). */
#define DGC_MPI_BAD_PAYLOAD (-2)
int dgc_mpi_reduce(dgc_buffer *b, float *work, const dgc_step_params *p, const dgc_region_plan *rp, int balanced,
                   int me, MPI_Comm comm, const unsigned char **keep, char *err, size_t errlen);
int dgc_mpi_try_compressed(const void *sb, void *rb, MPI_Count count, MPI_Datatype dt, MPI_Op op, MPI_Comm comm);

/* The node layout (node.c, DGC_TOPOLOGY): a communicator's layout and the
 * sub-communicators that carry it. */
typedef struct dgc_mpi_node dgc_mpi_node;

/* Finds comm's layout: a collective over comm (every rank calls it at the
 * same point, after the configuration check). NULL when comm is flat
 * (said at debug level, with why; at the default level when DGC_TOPOLOGY=node
 * asked for the node layout), the same on every rank. head(nranks): the
 * all-gather head of a record of nranks (comm.c's). */
dgc_mpi_node *dgc_mpi_node_find(MPI_Comm comm, int nranks, const dgc_config *cfg, size_t (*head)(int));
/* Makes x c's, freed with c's record (its sub-communicators and the cross
 * record with it); and finds it again (NULL: c is flat). */
void dgc_mpi_node_attach(dgc_comm *c, dgc_mpi_node *x);
dgc_mpi_node *dgc_mpi_node_of(const dgc_comm *c);
const dgc_layout *dgc_mpi_node_layout(const dgc_mpi_node *x);
/* The record of the cross communicator (the ranks of this local rank, one
 * per node), which holds this rank's shard states; *cross gets it. */
dgc_comm *dgc_mpi_node_cross(const dgc_mpi_node *x, MPI_Comm *cross);
/* "flat" (x NULL) or "node, M nodes x L ranks", for the start-up line. */
void dgc_mpi_node_describe(const dgc_mpi_node *x, char *buf, size_t len);
/* Room for the L pieces of this rank's shard of len elements: 0, or -1
 * when memory is short. */
int dgc_mpi_node_reserve(dgc_mpi_node *x, uint64_t len);
/* MAX of count int64 words over the node, in place. */
int dgc_mpi_node_agree(const dgc_mpi_node *x, int64_t *words, int count);
/* *sum: the node's sum of this rank's shard of g (n elements), added in
 * local-rank order, in x's scratch (after dgc_mpi_node_reserve);
 * *nonfinite: whether it holds Inf or NaN. */
int dgc_mpi_node_sum(dgc_mpi_node *x, const float *g, uint64_t n, float **sum, int *nonfinite);
/* Every local rank's decoded shard (in work at its place) to every other:
 * work then holds the whole sum. */
int dgc_mpi_node_spread(dgc_mpi_node *x, float *work, uint64_t n);

/* Reads the environment, checks it on MPI_COMM_WORLD and installs it; called
 * once MPI is initialised, by whichever language's MPI_Init ran. */
void dgc_mpi_setup(void);

#endif
