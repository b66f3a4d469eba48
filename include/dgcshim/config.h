/* dgcshim configuration: the DGC_* environment variables.
 *
 * Every variable lives in one table (shim/core/config.c). The parser, the start-up
 * banner, the cross-rank consistency hash and docs/configuration.md all follow that table. */
#ifndef DGCSHIM_CONFIG_H
#define DGCSHIM_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    DGC_LOG_ERROR = 0,
    DGC_LOG_WARN = 1,
    DGC_LOG_INFO = 2,
    DGC_LOG_DEBUG = 3
} dgc_log_level;

/* A number variable's "auto" (DGC_MAX_STATE_MB). */
#define DGC_UINT_AUTO UINT64_MAX

/* The longest text value (a path) a variable takes, with its NUL. */
#define DGC_TEXT_MAX 1024

typedef struct dgc_config {
    int enable;              /* DGC_ENABLE */
    double sparsity;         /* DGC_SPARSITY, [0, 1) */
    uint64_t warmup_steps;   /* DGC_WARMUP_STEPS */
    double momentum;         /* DGC_MOMENTUM, [0, 1) */
    int nesterov;            /* DGC_NESTEROV */
    int momentum_masking;    /* DGC_MOMENTUM_MASKING */
    double clip_norm;        /* DGC_CLIP_NORM, 0 = off */
    uint64_t min_elements;   /* DGC_MIN_ELEMENTS */
    uint64_t min_ranks;      /* DGC_MIN_RANKS */
    double sample_ratio;     /* DGC_SAMPLE_RATIO, (0, 1] */
    int log_level;           /* DGC_LOG_LEVEL, a dgc_log_level */
    int stats;               /* DGC_STATS */
    int compensate;          /* DGC_COMPENSATE */
    uint64_t state_idle_calls; /* DGC_STATE_IDLE_CALLS, 0 = never */
    uint64_t max_state_mb;   /* DGC_MAX_STATE_MB, 0 = no limit, DGC_UINT_AUTO = auto (dgc_state_budget) */
    int transport;           /* DGC_TRANSPORT, a dgc_transport */
    uint64_t value_bits;     /* DGC_VALUE_BITS: 16 (scaled binary16, wire_compact.h) or 32 (fp32) */
    uint64_t stats_every;    /* DGC_STATS_EVERY, 0 = only at exit */
    char stats_file[DGC_TEXT_MAX];   /* DGC_STATS_FILE, "" = none */
    char nccl_library[DGC_TEXT_MAX]; /* DGC_NCCL_LIBRARY, "" = find it among the loaded objects */
    int buffer_key;          /* DGC_BUFFER_KEY, a dgc_buffer_key */
    int topology;            /* DGC_TOPOLOGY, a dgc_topology */
    uint64_t node_size;      /* DGC_NODE_SIZE, 0 = the nodes MPI reports */
} dgc_config;

/* How a communicator's ranks exchange (DGC_TOPOLOGY, MPI path). */
typedef enum {
    DGC_TOPOLOGY_AUTO = 0, /* node where the communicator spans 2 or more equal nodes of 2 or more ranks, else flat */
    DGC_TOPOLOGY_FLAT = 1, /* every rank compresses the whole buffer and exchanges with every other */
    DGC_TOPOLOGY_NODE = 2  /* exact sum inside the node, each local rank's shard compressed across nodes */
} dgc_topology;

/* What a call's residual state follows (DGC_BUFFER_KEY). */
typedef enum {
    DGC_KEY_AUTO = 0,    /* by address until buffers are seen made afresh (then by place); a communicator whose
                          * one count keeps moving is summed densely (MPI path) */
    DGC_KEY_ADDRESS = 1, /* the call's send and output addresses: persistent buffers */
    DGC_KEY_ORDER = 2    /* its place among the step's calls of its count: fresh buffers every step */
} dgc_buffer_key;

/* How a compressed call's selected pairs travel (DGC_TRANSPORT). */
typedef enum {
    DGC_TRANSPORT_AUTO = 0,   /* per call, whichever moves fewer bytes */
    DGC_TRANSPORT_SPARSE = 1, /* all-gather of the fixed-size payloads */
    DGC_TRANSPORT_DENSE = 2,  /* pairs scattered into a dense vector, summed densely */
    DGC_TRANSPORT_REDUCE = 3  /* MPI path: pairs to the owners of index regions, who sum and select (opt-in) */
} dgc_transport;

/* DGC_TRANSPORT's word for t: "auto", "sparse", "dense" or "reduce". */
const char *dgc_transport_name(dgc_transport t);

/* Options in table order; DGC_OPT_COUNT is the number of variables. */
typedef enum {
    DGC_OPT_ENABLE,
    DGC_OPT_SPARSITY,
    DGC_OPT_WARMUP_STEPS,
    DGC_OPT_MOMENTUM,
    DGC_OPT_NESTEROV,
    DGC_OPT_MOMENTUM_MASKING,
    DGC_OPT_CLIP_NORM,
    DGC_OPT_MIN_ELEMENTS,
    DGC_OPT_MIN_RANKS,
    DGC_OPT_SAMPLE_RATIO,
    DGC_OPT_LOG_LEVEL,
    DGC_OPT_STATS,
    DGC_OPT_COMPENSATE,
    DGC_OPT_STATE_IDLE_CALLS,
    DGC_OPT_MAX_STATE_MB,
    DGC_OPT_TRANSPORT,
    DGC_OPT_VALUE_BITS,
    DGC_OPT_BUFFER_KEY,
    DGC_OPT_TOPOLOGY,
    DGC_OPT_NODE_SIZE,
    DGC_OPT_STATS_FILE,
    DGC_OPT_STATS_EVERY,
    DGC_OPT_NCCL_LIBRARY,
    DGC_OPT_COUNT
} dgc_option;

/* Looks a variable up by name; returns NULL when unset. getenv is one. */
typedef const char *(*dgc_env_lookup)(const char *name);

/* Fills *cfg from the environment. Returns 0, or -1 with a message naming the
 * variable, the value and the accepted range in err. A DGC_* name in the
 * process's environment (environ) that is neither a setting nor reserved
 * (dgc_config_reserved) is an error too, "unknown variable DGC_SPARSTY, did
 * you mean DGC_SPARSITY? ...": a typo must not leave a setting at its
 * default unnoticed. On error *cfg holds the defaults for every variable, so
 * callers can still log sensibly. */
int dgc_config_parse(dgc_config *cfg, dgc_env_lookup lookup, char *err, size_t errlen);

/* dgc_config_parse with the names to check given: envp in environ's form
 * ("NAME=VALUE", NULL-terminated; NULL: none). Values still come from lookup. */
int dgc_config_parse_env(dgc_config *cfg, dgc_env_lookup lookup, char *const *envp, char *err, size_t errlen);

/* 1 when name belongs to the project's scripts and tests, not to the library
 * (DGC_TEST_*, DGC_SANITIZE, ...: docs/configuration.md lists them). */
int dgc_config_reserved(const char *name);

/* The i-th entry of the reserved list ("DGC_TEST_", prefix 1), NULL past its end. */
const char *dgc_config_reserved_at(size_t i, int *prefix);

/* The setting whose name is closest to name's first len bytes (edit
 * distance, case ignored) when it is close, else NULL. */
const char *dgc_config_suggest(const char *name, size_t len);

/* 1 when statistics are kept: for the report (DGC_STATS) or the file (DGC_STATS_FILE). */
static inline int dgc_config_counts(const dgc_config *cfg) { return cfg->stats || cfg->stats_file[0]; }

/* The defaults, as if no variable were set. */
void dgc_config_defaults(dgc_config *cfg);

/* Name ("DGC_SPARSITY"), default as text, and accepted range as text. */
const char *dgc_option_name(dgc_option opt);
const char *dgc_option_default(dgc_option opt);
const char *dgc_option_range(dgc_option opt);
/* One line of meaning ("fraction of elements not sent"), for `dgcshim config`. */
const char *dgc_option_summary(dgc_option opt);

/* 1 when ranks must agree on the option (it changes what goes on the wire). */
int dgc_option_is_collective(dgc_option opt);

/* A hash of the parsed value of one option; equal values hash equal. */
uint64_t dgc_option_hash(const dgc_config *cfg, dgc_option opt);

/* Writes "DGC_SPARSITY=0.999" for one option into buf. */
void dgc_option_describe(const dgc_config *cfg, dgc_option opt, char *buf, size_t len);

/* Writes "DGC_ENABLE=1 DGC_SPARSITY=0.999 ..." (every option) into buf. */
void dgc_config_describe(const dgc_config *cfg, char *buf, size_t len);

/* This rank's budget for states in bytes (0: none): DGC_MAX_STATE_MB, or
 * auto_bytes, the front end's own, where it is auto. */
size_t dgc_config_state_budget(const dgc_config *cfg, size_t auto_bytes);

/* The process-wide configuration the interposers read. It reads as disabled
 * (enable = 0) until dgc_config_install() runs, so nothing is compressed
 * before MPI_Init has validated the environment. */
const dgc_config *dgc_config_current(void);
void dgc_config_install(const dgc_config *cfg);

/* The rank used in log lines and for the rank-0 report (-1 until known). */
int dgc_config_rank(void);
void dgc_config_set_rank(int rank);

/* The process's rank in the whole job as its launcher exported it: the
 * first of RANK (torchrun), OMPI_COMM_WORLD_RANK, PMI_RANK, PMIX_RANK and
 * SLURM_PROCID that holds a decimal integer in [0, INT_MAX]; -1 when none
 * does. An NCCL-only process has no world communicator to ask. */
int dgc_config_launcher_rank(dgc_env_lookup lookup);

/* The job a spawned process belongs to, for log lines ("rank 0 job 2"); 0
 * for the job mpirun started, whose lines carry no job. */
int dgc_config_job(void);
void dgc_config_set_job(int job);

#ifdef __cplusplus
}
#endif
#endif
