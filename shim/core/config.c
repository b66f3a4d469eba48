/* The DGC_* variables: one table, one parser, one description.
 *
 * Modelled on mimalloc's options.c: the table row is the single source of the
 * name, default, range and storage of a variable. docs/configuration.md's table is checked
 * against it by tests/unit/test_config.c. */
#include "dgcshim/config.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* The process's environment (POSIX: the program declares it). */
extern char **environ;

/* KIND_CHOICE: one of the row's names, stored (an int) as its index.
 * KIND_TEXT: a path, stored as a string of at most DGC_TEXT_MAX - 1 bytes; empty is unset. */
typedef enum { KIND_BOOL, KIND_UINT, KIND_REAL, KIND_CHOICE, KIND_TEXT } option_kind;

typedef struct {
    const char *name;
    option_kind kind;
    const char *def;      /* default, as the user would write it */
    double lo, hi;        /* accepted range */
    int hi_open;          /* 1: hi itself is excluded */
    int lo_open;          /* 1: lo itself is excluded */
    const char *range;    /* the range as printed in errors and docs/configuration.md */
    int collective;       /* ranks must agree on it */
    size_t offset;        /* where the parsed value lives in dgc_config */
    const char *const *names; /* KIND_CHOICE: the accepted names, NULL-terminated */
    const double *only;       /* numbers: the only values accepted within the range, 0-terminated; NULL: all */
} option_desc;

#define OFF(field) offsetof(dgc_config, field)

static const char *const level_names[] = {"error", "warn", "info", "debug", NULL};
static const char *const transport_names[] = {"auto", "sparse", "dense", "reduce", NULL}; /* dgc_transport order */
static const char *const key_names[] = {"auto", "address", "order", NULL}; /* dgc_buffer_key order */
static const char *const topology_names[] = {"auto", "flat", "node", NULL}; /* dgc_topology order */
static const double widths[] = {16, 32, 0};
/* KIND_UINT with names: the one word it also takes, stored as DGC_UINT_AUTO. */
static const char *const auto_word[] = {"auto", NULL};

static const option_desc options[DGC_OPT_COUNT] = {
    [DGC_OPT_ENABLE] = {"DGC_ENABLE", KIND_BOOL, "1", 0, 1, 0, 0, "0 or 1", 1, OFF(enable)},
    [DGC_OPT_SPARSITY] = {"DGC_SPARSITY", KIND_REAL, "0.999", 0, 1, 1, 0, "[0, 1)", 1, OFF(sparsity)},
    [DGC_OPT_WARMUP_STEPS] = {"DGC_WARMUP_STEPS", KIND_UINT, "0", 0, 1e12, 0, 0,
                              "integer in [0, 10^12]", 1, OFF(warmup_steps)},
    [DGC_OPT_MOMENTUM] = {"DGC_MOMENTUM", KIND_REAL, "0", 0, 1, 1, 0, "[0, 1)", 1, OFF(momentum)},
    [DGC_OPT_NESTEROV] = {"DGC_NESTEROV", KIND_BOOL, "0", 0, 1, 0, 0, "0 or 1", 1, OFF(nesterov)},
    [DGC_OPT_MOMENTUM_MASKING] = {"DGC_MOMENTUM_MASKING", KIND_BOOL, "1", 0, 1, 0, 0, "0 or 1", 1,
                                  OFF(momentum_masking)},
    [DGC_OPT_CLIP_NORM] = {"DGC_CLIP_NORM", KIND_REAL, "0", 0, 1e30, 0, 0, "[0, 1e30], 0 = off", 1,
                           OFF(clip_norm)},
    [DGC_OPT_MIN_ELEMENTS] = {"DGC_MIN_ELEMENTS", KIND_UINT, "16384", 1, 4294967295.0, 0, 0,
                              "integer in [1, 4294967295]", 1, OFF(min_elements)},
    [DGC_OPT_MIN_RANKS] = {"DGC_MIN_RANKS", KIND_UINT, "2", 1, 1048576, 0, 0, "integer in [1, 1048576]",
                           1, OFF(min_ranks)},
    [DGC_OPT_SAMPLE_RATIO] = {"DGC_SAMPLE_RATIO", KIND_REAL, "0.01", 0, 1, 0, 1, "(0, 1]", 1,
                              OFF(sample_ratio)},
    [DGC_OPT_LOG_LEVEL] = {"DGC_LOG_LEVEL", KIND_CHOICE, "warn", 0, 3, 0, 0, "error, warn, info or debug",
                           0, OFF(log_level), level_names, NULL},
    [DGC_OPT_STATS] = {"DGC_STATS", KIND_BOOL, "0", 0, 1, 0, 0, "0 or 1", 0, OFF(stats)},
    [DGC_OPT_COMPENSATE] = {"DGC_COMPENSATE", KIND_BOOL, "1", 0, 1, 0, 0, "0 or 1", 1, OFF(compensate)},
    [DGC_OPT_STATE_IDLE_CALLS] = {"DGC_STATE_IDLE_CALLS", KIND_UINT, "1000", 0, 1e12, 0, 0,
                                  "integer in [0, 10^12], 0 = never", 1, OFF(state_idle_calls)},
    /* Per rank: a rank over its budget says so in its payload header, so
     * ranks with different budgets still decide every call alike. */
    [DGC_OPT_MAX_STATE_MB] = {"DGC_MAX_STATE_MB", KIND_UINT, "auto", 0, 1e9, 0, 0,
                              "auto or an integer in [0, 10^9], 0 = no limit", 0, OFF(max_state_mb), auto_word},
    [DGC_OPT_TRANSPORT] = {"DGC_TRANSPORT", KIND_CHOICE, "auto", 0, 3, 0, 0, "auto, sparse, dense or reduce", 1,
                           OFF(transport), transport_names, NULL},
    /* 16: each payload's values as binary16 under one power-of-two scale
     * (wire_compact.h), 11 significant bits; 32: fp32. */
    [DGC_OPT_VALUE_BITS] = {"DGC_VALUE_BITS", KIND_UINT, "16", 16, 32, 0, 0, "16 or 32", 1, OFF(value_bits),
                            NULL, widths},
    [DGC_OPT_BUFFER_KEY] = {"DGC_BUFFER_KEY", KIND_CHOICE, "auto", 0, 2, 0, 0, "auto, address or order", 1,
                            OFF(buffer_key), key_names, NULL},
    [DGC_OPT_TOPOLOGY] = {"DGC_TOPOLOGY", KIND_CHOICE, "auto", 0, 2, 0, 0, "auto, flat or node", 1, OFF(topology),
                          topology_names, NULL},
    [DGC_OPT_NODE_SIZE] = {"DGC_NODE_SIZE", KIND_UINT, "0", 0, 1048576, 0, 0,
                           "integer in [0, 1048576], 0 = the nodes MPI reports", 1, OFF(node_size)},
    [DGC_OPT_STATS_FILE] = {"DGC_STATS_FILE", KIND_TEXT, "", 0, 0, 0, 0, "a path of at most 1023 bytes, empty = none",
                            0, OFF(stats_file)},
    [DGC_OPT_STATS_EVERY] = {"DGC_STATS_EVERY", KIND_UINT, "0", 0, 1e12, 0, 0, "integer in [0, 10^12], 0 = at exit only",
                             0, OFF(stats_every)},
    [DGC_OPT_NCCL_LIBRARY] = {"DGC_NCCL_LIBRARY", KIND_TEXT, "", 0, 0, 0, 0,
                              "a path of at most 1023 bytes, empty = search", 0, OFF(nccl_library)},
};

/* One line each, for `dgcshim config` (docs/configuration.md says more). */
static const char *const summaries[DGC_OPT_COUNT] = {
    [DGC_OPT_ENABLE] = "0: pure pass-through on every rank",
    [DGC_OPT_SPARSITY] = "fraction of elements not sent; k = ceil((1 - sparsity) n)",
    [DGC_OPT_WARMUP_STEPS] = "steps over which sparsity ramps 75%, 93.75%, ... up to DGC_SPARSITY",
    [DGC_OPT_MOMENTUM] = "momentum m of the correction u = m u + g; 0 = plain residual",
    [DGC_OPT_NESTEROV] = "Nesterov form of the momentum correction",
    [DGC_OPT_MOMENTUM_MASKING] = "zero the momentum at the indices sent (momentum factor masking)",
    [DGC_OPT_CLIP_NORM] = "local gradient clipping norm before accumulation; 0 = off",
    [DGC_OPT_MIN_ELEMENTS] = "buffers with fewer elements pass through",
    [DGC_OPT_MIN_RANKS] = "communicators with fewer ranks pass through",
    [DGC_OPT_SAMPLE_RATIO] = "fraction of the residual sampled to estimate the top-k threshold; 1 = exact",
    [DGC_OPT_LOG_LEVEL] = "log verbosity; errors always print",
    [DGC_OPT_STATS] = "1: print per-buffer statistics on rank 0 at MPI_Finalize (or exit)",
    [DGC_OPT_COMPENSATE] = "return S_t - m S_{t-1} so that an unmodified SGD with momentum m applies DGC's update",
    [DGC_OPT_STATE_IDLE_CALLS] = "free a buffer's state after this many calls without it; 0 = never",
    [DGC_OPT_MAX_STATE_MB] = "this rank's memory budget for states, in MiB; 0 = no limit; auto: a quarter of the "
                             "GPU's memory on the NCCL path, no limit on the MPI path",
    [DGC_OPT_TRANSPORT] = "how the selected pairs travel: per call the fewer bytes, or forced",
    [DGC_OPT_VALUE_BITS] = "bits per value on the wire: 16 (scaled binary16) or 32 (fp32)",
    [DGC_OPT_BUFFER_KEY] = "what a buffer's residual follows: its address, or its place in the step's calls "
                           "(fresh buffers every step); auto: the address until buffers are seen made afresh",
    [DGC_OPT_TOPOLOGY] = "node sums exactly inside each node and compresses each local rank's shard across "
                         "nodes; flat compresses every rank's whole buffer; auto: node where there are 2+ equal "
                         "nodes of 2+ ranks",
    [DGC_OPT_NODE_SIZE] = "ranks per node for DGC_TOPOLOGY: L consecutive ranks form a node; 0 = the nodes MPI "
                          "reports (MPI_COMM_TYPE_SHARED), or on the NCCL path the ranks of one host",
    [DGC_OPT_STATS_FILE] = "every rank writes JSON lines of its statistics to PATH.RANK (dgcshim report)",
    [DGC_OPT_STATS_EVERY] = "with DGC_STATS_FILE: also write a line every this many compressed calls",
    [DGC_OPT_NCCL_LIBRARY] = "the loaded library that holds the real NCCL, for unusual installs",
};


static void *field(dgc_config *cfg, const option_desc *o) { return (char *)cfg + o->offset; }
static const void *cfield(const dgc_config *cfg, const option_desc *o) {
    return (const char *)cfg + o->offset;
}

static int in_range(const option_desc *o, double x) {
    if (!(x >= o->lo) || !(x <= o->hi)) return 0; /* also rejects NaN */
    if (o->lo_open && x == o->lo) return 0;
    if (o->hi_open && x == o->hi) return 0;
    if (!o->only) return 1;
    for (const double *v = o->only; *v != 0; v++) /* a width, say: in range is not enough */
        if (x == *v) return 1;
    return 0;
}

/* strtod and strtoull skip these (isspace in the C locale) and then accept a
 * sign; the check for a sign must skip the same set. */
static const char *skip_space(const char *t) {
    while (*t == ' ' || *t == '\t' || *t == '\n' || *t == '\v' || *t == '\f' || *t == '\r') t++;
    return t;
}

/* strtod's ERANGE covers overflow (rejected) and underflow: a subnormal
 * result is the value asked for, to within rounding, so it stands; a result
 * flushed to zero from non-zero text is not, so it is rejected. */
static int real_in_reach(double x) { return x != 0 && !isinf(x); }

/* Parses text into a double, integer-only for UINT/BOOL; 0 on malformed text. */
static int parse_number(const option_desc *o, const char *text, double *out) {
    char *end = NULL;
    errno = 0;
    if (o->kind == KIND_REAL) {
        *out = strtod(text, &end);
        if (errno == ERANGE && real_in_reach(*out)) errno = 0;
    } else {
        const char *digits = skip_space(text);
        if (digits[0] == '-' || digits[0] == '+') return 0;
        unsigned long long u = strtoull(digits, &end, 10);
        if (end == digits) end = (char *)text;
        *out = (double)u;
    }
    if (errno != 0 || end == text) return 0;
    end = (char *)skip_space(end);
    return *end == '\0';
}

static int parse_choice(const option_desc *o, const char *text, double *out) {
    for (size_t i = 0; o->names[i]; i++) {
        if (strcasecmp(text, o->names[i]) == 0) {
            *out = (double)i;
            return 1;
        }
    }
    return 0;
}

static void store(dgc_config *cfg, const option_desc *o, double x) {
    switch (o->kind) {
    case KIND_BOOL:
    case KIND_CHOICE: *(int *)field(cfg, o) = (int)x; break;
    case KIND_UINT: *(uint64_t *)field(cfg, o) = (uint64_t)x; break;
    case KIND_REAL: *(double *)field(cfg, o) = x == 0 ? 0.0 : x; break; /* -0 hashes as 0 */
    case KIND_TEXT: break; /* parse_text */
    }
}

static int parse_text(dgc_config *cfg, const option_desc *o, const char *text) {
    size_t n = strlen(text);
    if (n >= DGC_TEXT_MAX) return 0;
    memcpy(field(cfg, o), text, n + 1);
    return 1;
}

static int parse_one(dgc_config *cfg, const option_desc *o, const char *text) {
    if (o->kind == KIND_TEXT) return parse_text(cfg, o, text);
    if (o->kind == KIND_UINT && o->names && strcasecmp(skip_space(text), o->names[0]) == 0) {
        *(uint64_t *)field(cfg, o) = DGC_UINT_AUTO; /* beyond every range: no double holds it exactly */
        return 1;
    }
    double x = 0;
    int ok = o->kind == KIND_CHOICE ? parse_choice(o, text, &x) : parse_number(o, text, &x);
    if (!ok || !in_range(o, x)) return 0;
    store(cfg, o, x);
    return 1;
}

void dgc_config_defaults(dgc_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    for (int i = 0; i < DGC_OPT_COUNT; i++) {
        int ok = parse_one(cfg, &options[i], options[i].def);
        (void)ok; /* defaults are valid by construction; tests/unit checks it */
    }
}

/* The offending text as quoted in an error: long values are cut so that the
 * range and default, which say how to fix it, always fit. */
#define QUOTE_MAX 64

/* Names under DGC_ that are not library settings: the project's own scripts
 * and test programs read them, and they reach processes that have the library
 * loaded (ctest's environment, scripts/test-gpu.sh, .ci/run), so the check
 * for unknown names must let them by. The one list of them;
 * docs/configuration.md repeats it. */
static const struct {
    const char *name;
    int prefix; /* 1: every name that starts with it */
} reserved[] = {
    {"DGC_TEST_", 1},          /* scripts/test*.sh, tests/python: DGC_TEST_PYTHON, DGC_TEST_VENV, ... */
    {"DGC_EMU_", 1},           /* tests/gpu/emulated: injected faults (DGC_EMU_HOSTALLOC_FAILS, ...) */
    {"DGC_EMULATED", 1},       /* the emulated device: DGC_EMULATED_DEVICE, DGC_EMULATED_ARGS */
    {"DGC_CHIPSTAR_", 1},      /* scripts/test-emulated.sh, .ci/run: DGC_CHIPSTAR_TARBALL */
    {"DGC_SANITIZE", 0},       /* tests/mpi/run_case.sh: the sanitizer build */
    {"DGC_CASE_TIMEOUT", 0},   /* the integration cases' time limit */
    {"DGC_NCCL_CASE_TIMEOUT", 0}, /* tests/gpu/nccl/run_nccl_case.sh */
    {"DGC_NCCL_TEST_LIB", 0},  /* the NCCL the GPU tests preload */
    {"DGC_NETNS_AGENT_LOG", 0}, /* bench/netns/rsh_netns.sh */
    {"DGC_SHIM", 0},           /* scripts/ddp_side_by_side.sh, bench/gpu/run.sh: the library's path */
};

const char *dgc_config_reserved_at(size_t i, int *prefix) {
    if (i >= sizeof reserved / sizeof reserved[0]) return NULL;
    if (prefix) *prefix = reserved[i].prefix;
    return reserved[i].name;
}

int dgc_config_reserved(const char *name) {
    for (size_t i = 0; i < sizeof reserved / sizeof reserved[0]; i++) {
        size_t n = strlen(reserved[i].name);
        if (reserved[i].prefix ? strncmp(name, reserved[i].name, n) == 0 : strcmp(name, reserved[i].name) == 0)
            return 1;
    }
    return 0;
}

/* Optimal string alignment distance (Levenshtein with transpositions), case
 * ignored: DGC_SPRASITY and DGC_sparsity are one step from DGC_SPARSITY. Names
 * longer than the buffer count as far from everything. */
#define NAME_MAX_LEN 64
static size_t name_distance(const char *a, size_t na, const char *b, size_t nb) {
    if (na > NAME_MAX_LEN || nb > NAME_MAX_LEN) return (size_t)-1;
    unsigned char d[NAME_MAX_LEN + 1][NAME_MAX_LEN + 1]; /* distances fit: at most NAME_MAX_LEN */
    for (size_t i = 0; i <= na; i++) d[i][0] = (unsigned char)i;
    for (size_t j = 0; j <= nb; j++) d[0][j] = (unsigned char)j;
    for (size_t i = 1; i <= na; i++) {
        for (size_t j = 1; j <= nb; j++) {
            int ai = toupper((unsigned char)a[i - 1]), bj = toupper((unsigned char)b[j - 1]);
            unsigned best = d[i - 1][j - 1] + (unsigned)(ai != bj);
            if (d[i - 1][j] + 1u < best) best = d[i - 1][j] + 1u;
            if (d[i][j - 1] + 1u < best) best = d[i][j - 1] + 1u;
            if (i > 1 && j > 1 && ai == toupper((unsigned char)b[j - 2]) && toupper((unsigned char)a[i - 2]) == bj &&
                d[i - 2][j - 2] + 1u < best)
                best = d[i - 2][j - 2] + 1u;
            d[i][j] = (unsigned char)best;
        }
    }
    return d[na][nb];
}

static int known_name(const char *name, size_t len) {
    for (int i = 0; i < DGC_OPT_COUNT; i++)
        if (strlen(options[i].name) == len && strncmp(options[i].name, name, len) == 0) return 1;
    return 0;
}

const char *dgc_config_suggest(const char *name, size_t len) {
    const char *best = NULL;
    size_t best_d = (size_t)-1;
    for (int i = 0; i < DGC_OPT_COUNT; i++) {
        size_t d = name_distance(name, len, options[i].name, strlen(options[i].name));
        if (d < best_d) best = options[i].name, best_d = d;
    }
    /* Close: at most a third of what follows DGC_ differs (one typo in a short name, a
     * few in a long one); anything further is more likely a variable of something else. */
    size_t tail = len > 4 ? len - 4 : 1;
    if (!best || best_d * 3 > tail + 2) return NULL;
    return known_name(name, len) ? NULL : best; /* differs in case only: still the one meant */
}

/* The first DGC_* name in envp that is neither a setting nor reserved: a
 * typo would otherwise leave its setting at the default without a word. */
static int check_names(char *const *envp, char *err, size_t errlen) {
    for (; envp && *envp; envp++) {
        const char *entry = *envp;
        if (strncmp(entry, "DGC_", 4) != 0) continue;
        const char *eq = strchr(entry, '=');
        size_t len = eq ? (size_t)(eq - entry) : strlen(entry);
        char name[NAME_MAX_LEN + 1];
        snprintf(name, sizeof name, "%.*s", (int)(len < NAME_MAX_LEN ? len : NAME_MAX_LEN), entry);
        if (known_name(entry, len) || (len <= NAME_MAX_LEN && dgc_config_reserved(name))) continue;
        const char *near = dgc_config_suggest(entry, len);
        const char *cut = len > NAME_MAX_LEN ? "... (cut)" : "";
        if (near)
            snprintf(err, errlen, "unknown variable %s%s, did you mean %s? (`dgcshim config` lists the settings; "
                     "docs/configuration.md)", name, cut, near);
        else
            snprintf(err, errlen, "unknown variable %s%s: not a dgcshim setting (`dgcshim config` lists them; "
                     "docs/configuration.md)", name, cut);
        return -1;
    }
    return 0;
}

int dgc_config_parse(dgc_config *cfg, dgc_env_lookup lookup, char *err, size_t errlen) {
    return dgc_config_parse_env(cfg, lookup, environ, err, errlen);
}

int dgc_config_parse_env(dgc_config *cfg, dgc_env_lookup lookup, char *const *envp, char *err, size_t errlen) {
    dgc_config_defaults(cfg);
    for (int i = 0; i < DGC_OPT_COUNT; i++) {
        const option_desc *o = &options[i];
        const char *text = lookup(o->name);
        if (text == NULL) continue;
        if (!parse_one(cfg, o, text)) {
            int cut = strlen(text) > QUOTE_MAX;
            snprintf(err, errlen, "invalid %s='%.*s'%s: accepted %s (default %s)", o->name, QUOTE_MAX, text,
                     cut ? "... (cut)" : "", o->range, o->def[0] ? o->def : "unset");
            dgc_config_defaults(cfg);
            return -1;
        }
    }
    if (check_names(envp, err, errlen) != 0) {
        dgc_config_defaults(cfg);
        return -1;
    }
    return 0;
}

const char *dgc_transport_name(dgc_transport t) {
    return (unsigned)t <= DGC_TRANSPORT_REDUCE ? transport_names[t] : "?";
}

const char *dgc_option_name(dgc_option opt) { return options[opt].name; }
const char *dgc_option_default(dgc_option opt) { return options[opt].def; }
const char *dgc_option_range(dgc_option opt) { return options[opt].range; }
const char *dgc_option_summary(dgc_option opt) { return summaries[opt]; }
int dgc_option_is_collective(dgc_option opt) { return options[opt].collective; }

uint64_t dgc_option_hash(const dgc_config *cfg, dgc_option opt) {
    const option_desc *o = &options[opt];
    size_t size = o->kind == KIND_UINT   ? sizeof(uint64_t)
                  : o->kind == KIND_REAL ? sizeof(double)
                  : o->kind == KIND_TEXT ? strlen(cfield(cfg, o))
                                         : sizeof(int);
    const unsigned char *p = cfield(cfg, o);
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < size; i++) h = (h ^ p[i]) * 1099511628211ull;
    h = (h ^ (uint64_t)opt) * 1099511628211ull;
    return h;
}

/* Shortest of %.15g and %.17g that reads back as the same double, so that
 * two ranks' differing values never print alike. */
static int describe_real(const char *name, double x, char *buf, size_t len) {
    char num[40];
    snprintf(num, sizeof num, "%.15g", x);
    if (strtod(num, NULL) != x) snprintf(num, sizeof num, "%.17g", x);
    return snprintf(buf, len, "%s=%s", name, num);
}

static int describe_one(const dgc_config *cfg, const option_desc *o, char *buf, size_t len) {
    const void *p = cfield(cfg, o);
    switch (o->kind) {
    case KIND_BOOL: return snprintf(buf, len, "%s=%d", o->name, *(const int *)p);
    case KIND_CHOICE: return snprintf(buf, len, "%s=%s", o->name, o->names[*(const int *)p]);
    case KIND_UINT:
        if (o->names && *(const uint64_t *)p == DGC_UINT_AUTO) return snprintf(buf, len, "%s=%s", o->name, o->names[0]);
        return snprintf(buf, len, "%s=%llu", o->name, (unsigned long long)*(const uint64_t *)p);
    case KIND_REAL: return describe_real(o->name, *(const double *)p, buf, len);
    case KIND_TEXT: return snprintf(buf, len, "%s=%s", o->name, (const char *)p);
    }
    return 0;
}

size_t dgc_config_state_budget(const dgc_config *cfg, size_t auto_bytes) {
    return cfg->max_state_mb == DGC_UINT_AUTO ? auto_bytes : (size_t)cfg->max_state_mb << 20;
}

void dgc_option_describe(const dgc_config *cfg, dgc_option opt, char *buf, size_t len) {
    if (len) buf[0] = '\0';
    describe_one(cfg, &options[opt], buf, len);
}

void dgc_config_describe(const dgc_config *cfg, char *buf, size_t len) {
    size_t used = 0;
    if (len) buf[0] = '\0';
    for (int i = 0; i < DGC_OPT_COUNT && used + 1 < len; i++) {
        if (i > 0) buf[used++] = ' ', buf[used] = '\0';
        int n = describe_one(cfg, &options[i], buf + used, len - used);
        if (n < 0) break;
        used += (size_t)n < len - used ? (size_t)n : len - used - 1;
    }
}

/* Process-wide state: the installed configuration and the rank for logging.
 * Zero-initialised, so enable reads 0 until MPI_Init installs a validated one. */
static dgc_config current;
static int current_rank = -1;
static int current_job;

const dgc_config *dgc_config_current(void) { return &current; }
void dgc_config_install(const dgc_config *cfg) { current = *cfg; }
int dgc_config_rank(void) { return current_rank; }
void dgc_config_set_rank(int rank) { current_rank = rank; }
int dgc_config_job(void) { return current_job; }
void dgc_config_set_job(int job) { current_job = job; }

int dgc_config_launcher_rank(dgc_env_lookup lookup) {
    static const char *const names[] = {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const char *s = lookup(names[i]);
        if (!s || *s < '0' || *s > '9') continue; /* unset, empty, signed or not a number */
        char *end = NULL;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (errno == 0 && *end == '\0' && v <= INT_MAX) return (int)v;
    }
    return -1;
}
