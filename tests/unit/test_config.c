/* Unit tests for shim/core/config.c: the DGC_* table, parser, hash, description and
 * docs/configuration.md's option table. The environment is a small name=value table read
 * through a dgc_env_lookup, never setenv. */
#include <criterion/criterion.h>

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dgcshim/config.h"

/* ---- a fake environment ------------------------------------------------- */

typedef struct {
    const char *name, *value;
} env_pair;

static const env_pair *fake_env;
static size_t fake_env_len;

static const char *fake_lookup(const char *name) {
    for (size_t i = 0; i < fake_env_len; i++)
        if (strcmp(fake_env[i].name, name) == 0) return fake_env[i].value;
    return NULL;
}

/* Parses with exactly the given pairs set: values through fake_lookup, and
 * the names checked for unknown ones from the same pairs in environ's form. */
static int parse_env(dgc_config *cfg, const env_pair *pairs, size_t n, char *err, size_t errlen) {
    fake_env = pairs;
    fake_env_len = n;
    if (errlen) err[0] = '\0';
    static char entries[48][DGC_TEXT_MAX + 80];
    char *envp[49];
    cr_assert(n <= 48, "at most 48 variables in a fake environment");
    for (size_t i = 0; i < n; i++) {
        snprintf(entries[i], sizeof entries[i], "%s=%s", pairs[i].name, pairs[i].value);
        envp[i] = entries[i];
    }
    envp[n] = NULL;
    return dgc_config_parse_env(cfg, fake_lookup, envp, err, errlen);
}

static int parse_one(dgc_config *cfg, const char *name, const char *value, char *err, size_t errlen) {
    env_pair p = {name, value};
    return parse_env(cfg, &p, 1, err, errlen);
}

/* The defaults the design specifies, written out independently of the table. */
static void spec_defaults(dgc_config *c) {
    memset(c, 0, sizeof *c);
    c->enable = 1;
    c->sparsity = 0.999;
    c->warmup_steps = 0;
    c->momentum = 0.0;
    c->nesterov = 0;
    c->momentum_masking = 1;
    c->clip_norm = 0.0;
    c->min_elements = 16384;
    c->min_ranks = 2;
    c->sample_ratio = 0.01;
    c->log_level = DGC_LOG_WARN;
    c->stats = 0;
    c->compensate = 1;
    c->state_idle_calls = 1000;
    c->max_state_mb = DGC_UINT_AUTO;
    c->transport = DGC_TRANSPORT_AUTO;
    c->value_bits = 16;
    c->buffer_key = DGC_KEY_AUTO;
}

static void assert_config_eq(const dgc_config *got, const dgc_config *want, const char *ctx) {
    cr_assert_eq(got->enable, want->enable, "%s: enable %d, want %d", ctx, got->enable, want->enable);
    cr_assert(got->sparsity == want->sparsity, "%s: sparsity %.17g, want %.17g", ctx, got->sparsity,
              want->sparsity);
    cr_assert_eq(got->warmup_steps, want->warmup_steps, "%s: warmup_steps %llu, want %llu", ctx,
                 (unsigned long long)got->warmup_steps, (unsigned long long)want->warmup_steps);
    cr_assert(got->momentum == want->momentum, "%s: momentum %.17g, want %.17g", ctx, got->momentum,
              want->momentum);
    cr_assert_eq(got->nesterov, want->nesterov, "%s: nesterov", ctx);
    cr_assert_eq(got->momentum_masking, want->momentum_masking, "%s: momentum_masking", ctx);
    cr_assert(got->clip_norm == want->clip_norm, "%s: clip_norm %.17g, want %.17g", ctx, got->clip_norm,
              want->clip_norm);
    cr_assert_eq(got->min_elements, want->min_elements, "%s: min_elements %llu, want %llu", ctx,
                 (unsigned long long)got->min_elements, (unsigned long long)want->min_elements);
    cr_assert_eq(got->min_ranks, want->min_ranks, "%s: min_ranks %llu, want %llu", ctx,
                 (unsigned long long)got->min_ranks, (unsigned long long)want->min_ranks);
    cr_assert(got->sample_ratio == want->sample_ratio, "%s: sample_ratio %.17g, want %.17g", ctx,
              got->sample_ratio, want->sample_ratio);
    cr_assert_eq(got->log_level, want->log_level, "%s: log_level %d, want %d", ctx, got->log_level,
                 want->log_level);
    cr_assert_eq(got->stats, want->stats, "%s: stats", ctx);
    cr_assert_eq(got->compensate, want->compensate, "%s: compensate", ctx);
    cr_assert_eq(got->state_idle_calls, want->state_idle_calls, "%s: state_idle_calls", ctx);
    cr_assert_eq(got->max_state_mb, want->max_state_mb, "%s: max_state_mb", ctx);
    cr_assert_eq(got->transport, want->transport, "%s: transport", ctx);
    cr_assert_eq(got->value_bits, want->value_bits, "%s: value_bits", ctx);
    cr_assert_eq(got->buffer_key, want->buffer_key, "%s: buffer_key", ctx);
    cr_assert_eq(got->topology, want->topology, "%s: topology", ctx);
    cr_assert_eq(got->node_size, want->node_size, "%s: node_size", ctx);
    cr_assert_eq(got->stats_every, want->stats_every, "%s: stats_every", ctx);
    cr_assert_str_eq(got->stats_file, want->stats_file, "%s: stats_file", ctx);
    cr_assert_str_eq(got->nccl_library, want->nccl_library, "%s: nccl_library", ctx);
}

static const char *const all_names[] = {
    "DGC_ENABLE",    "DGC_SPARSITY",         "DGC_WARMUP_STEPS", "DGC_MOMENTUM",
    "DGC_NESTEROV",  "DGC_MOMENTUM_MASKING", "DGC_CLIP_NORM",    "DGC_MIN_ELEMENTS",
    "DGC_MIN_RANKS", "DGC_SAMPLE_RATIO",     "DGC_LOG_LEVEL",    "DGC_STATS",
    "DGC_COMPENSATE", "DGC_STATE_IDLE_CALLS", "DGC_MAX_STATE_MB", "DGC_TRANSPORT", "DGC_VALUE_BITS",
    "DGC_BUFFER_KEY", "DGC_TOPOLOGY", "DGC_NODE_SIZE", "DGC_STATS_FILE", "DGC_STATS_EVERY", "DGC_NCCL_LIBRARY",
};
#define NNAMES (sizeof all_names / sizeof all_names[0])
/* The variables that take a number or a name; the last ones take any path. */
#define NVALUED (NNAMES - 3)

/* ---- the table ----------------------------------------------------------- */

Test(config_table, names_in_enum_order_and_defaults_as_specified) {
    cr_assert_eq(DGC_OPT_COUNT, (int)NNAMES, "the design lists %zu variables", NNAMES);
    static const char *const defaults[] = {"1", "0.999", "0", "0", "0", "1", "0", "16384", "2", "0.01", "warn", "0", "1",
                                           "1000", "auto", "auto", "16", "auto", "auto", "0", "", "0", ""};
    for (int i = 0; i < DGC_OPT_COUNT; i++) {
        cr_assert_str_eq(dgc_option_name((dgc_option)i), all_names[i]);
        cr_assert_str_eq(dgc_option_default((dgc_option)i), defaults[i], "%s default", all_names[i]);
        cr_assert(dgc_option_range((dgc_option)i) && dgc_option_range((dgc_option)i)[0],
                  "%s has no range text", all_names[i]);
    }
}

Test(config_table, wire_changing_options_are_collective) {
    /* These decide k, the step schedule or pass-through: ranks must agree. */
    static const dgc_option must[] = {DGC_OPT_ENABLE,       DGC_OPT_SPARSITY,  DGC_OPT_WARMUP_STEPS,
                                      DGC_OPT_MIN_ELEMENTS, DGC_OPT_MIN_RANKS, DGC_OPT_MOMENTUM,
                                      DGC_OPT_COMPENSATE,   DGC_OPT_TRANSPORT, DGC_OPT_VALUE_BITS,
                                      DGC_OPT_BUFFER_KEY,   DGC_OPT_TOPOLOGY,  DGC_OPT_NODE_SIZE};
    for (size_t i = 0; i < sizeof must / sizeof must[0]; i++)
        cr_assert(dgc_option_is_collective(must[i]), "%s must be collective", dgc_option_name(must[i]));
    cr_assert(!dgc_option_is_collective(DGC_OPT_LOG_LEVEL), "log level may differ between ranks");
    cr_assert(!dgc_option_is_collective(DGC_OPT_STATS), "stats printing may differ between ranks");
    /* Freeing idle states changes results: every rank must free alike. */
    cr_assert(dgc_option_is_collective(DGC_OPT_STATE_IDLE_CALLS), "DGC_STATE_IDLE_CALLS must be collective");
    /* A memory budget is a rank's own (hosts differ); the exchange keeps
     * ranks with different budgets in step. */
    cr_assert(!dgc_option_is_collective(DGC_OPT_MAX_STATE_MB), "DGC_MAX_STATE_MB is per rank");
}

/* ---- defaults ------------------------------------------------------------ */

Test(config_defaults, nothing_set_gives_the_spec_defaults) {
    dgc_config cfg, want;
    char err[256];
    memset(&cfg, 0x5a, sizeof cfg);
    cr_assert_eq(parse_env(&cfg, NULL, 0, err, sizeof err), 0, "%s", err);
    spec_defaults(&want);
    assert_config_eq(&cfg, &want, "parse of an empty environment");

    memset(&cfg, 0x5a, sizeof cfg);
    dgc_config_defaults(&cfg);
    assert_config_eq(&cfg, &want, "dgc_config_defaults");
}

/* Not under DGC_, or reserved for the project's scripts and tests: ignored. */
Test(config_defaults, unrelated_variables_are_ignored) {
    static const env_pair env[] = {{"DGC", "1"},
                                   {"dgc_enable", "0"},
                                   {"PATH", "/bin"},
                                   {"DGCSHIM_LIBRARY", "/x.so"},
                                   {"DGC_SANITIZE", "ON"},
                                   {"DGC_TEST_VENV", "/v"},
                                   {"DGC_TEST_HOROVOD", "0"},
                                   {"DGC_EMU_HOSTALLOC_FAILS", "1"},
                                   {"DGC_EMULATED_DEVICE", "1"},
                                   {"DGC_CHIPSTAR_TARBALL", "/t.tgz"},
                                   {"DGC_CASE_TIMEOUT", "120"},
                                   {"DGC_NCCL_CASE_TIMEOUT", "60"},
                                   {"DGC_NCCL_TEST_LIB", "/n.so"},
                                   {"DGC_NETNS_AGENT_LOG", "/l"},
                                   {"DGC_SHIM", "/s.so"}};
    dgc_config cfg, want;
    char err[256];
    cr_assert_eq(parse_env(&cfg, env, sizeof env / sizeof env[0], err, sizeof err), 0, "%s", err);
    spec_defaults(&want);
    assert_config_eq(&cfg, &want, "unrelated variables");
}

/* ---- unknown names ---------------------------------------------------------- */

/* A typo is an error that names it and the setting it is closest to, as a
 * bad value is, and leaves the defaults. */
Test(config_names, a_typo_is_an_error_with_the_closest_name) {
    static const struct {
        const char *typo, *meant;
    } cases[] = {{"DGC_SPARSTY", "DGC_SPARSITY"},       {"DGC_SPRASITY", "DGC_SPARSITY"},
                 {"DGC_sparsity", "DGC_SPARSITY"},      {"DGC_MOMENTM", "DGC_MOMENTUM"},
                 {"DGC_WARMUP_STEP", "DGC_WARMUP_STEPS"}, {"DGC_STAT", "DGC_STATS"},
                 {"DGC_MOMENTUM_MASK", "DGC_MOMENTUM_MASKING"}, {"DGC_STATS_FLIE", "DGC_STATS_FILE"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        env_pair env[] = {{"DGC_MOMENTUM", "0.9"}, {cases[i].typo, "0.99"}};
        dgc_config cfg, want;
        char err[256], expect[128];
        cr_assert_eq(parse_env(&cfg, env, 2, err, sizeof err), -1, "%s was accepted", cases[i].typo);
        snprintf(expect, sizeof expect, "unknown variable %s, did you mean %s?", cases[i].typo, cases[i].meant);
        cr_expect(strstr(err, expect), "%s: got '%s'", expect, err);
        spec_defaults(&want);
        assert_config_eq(&cfg, &want, "an unknown name leaves the defaults");
    }
}

Test(config_names, a_name_far_from_every_setting_gets_no_suggestion) {
    static const char *const names[] = {"DGC_X", "DGC_", "DGC_FROBNICATE", "DGC_CUDA", "DGC_TESTS"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        env_pair env[] = {{names[i], "1"}};
        dgc_config cfg;
        char err[256], expect[128];
        cr_assert_eq(parse_env(&cfg, env, 1, err, sizeof err), -1, "%s was accepted", names[i]);
        snprintf(expect, sizeof expect, "unknown variable %s: not a dgcshim setting", names[i]);
        cr_expect(strstr(err, expect) && !strstr(err, "did you mean"), "%s: got '%s'", names[i], err);
    }
}

/* A long name is cut in the message, which still fits the callers' 256 bytes. */
Test(config_names, a_long_name_is_cut) {
    char name[300];
    memset(name, 'A', sizeof name - 1);
    memcpy(name, "DGC_", 4);
    name[sizeof name - 1] = '\0';
    env_pair env[] = {{name, "1"}};
    dgc_config cfg;
    char err[256];
    cr_assert_eq(parse_env(&cfg, env, 1, err, sizeof err), -1);
    cr_expect(strstr(err, "AAAA... (cut): not a dgcshim setting") && strlen(err) < sizeof err - 1, "%s", err);
}

/* A bad value is reported before an unknown name, and the exact names are
 * all accepted (the table's own names are never unknown). */
Test(config_names, every_setting_name_is_known) {
    env_pair env[DGC_OPT_COUNT];
    for (int i = 0; i < DGC_OPT_COUNT; i++) {
        env[i].name = dgc_option_name((dgc_option)i);
        env[i].value = dgc_option_default((dgc_option)i);
    }
    dgc_config cfg;
    char err[256];
    cr_assert_eq(parse_env(&cfg, env, DGC_OPT_COUNT, err, sizeof err), 0, "%s", err);
    env_pair both[] = {{"DGC_SPARSTY", "0.9"}, {"DGC_SPARSITY", "1.5"}};
    cr_assert_eq(parse_env(&cfg, both, 2, err, sizeof err), -1);
    cr_expect(strstr(err, "invalid DGC_SPARSITY='1.5'"), "%s", err);
}

Test(config_names, reserved_names_and_prefixes) {
    cr_expect(dgc_config_reserved("DGC_TEST_ANYTHING"));
    cr_expect(dgc_config_reserved("DGC_SANITIZE"));
    cr_expect(!dgc_config_reserved("DGC_SANITIZER"), "DGC_SANITIZE is a name, not a prefix");
    cr_expect(!dgc_config_reserved("DGC_SPARSITY"));
    cr_expect(!dgc_config_reserved("DGC_TEST"), "the prefix is DGC_TEST_");
    cr_expect_null(dgc_config_suggest("DGC_SPARSITY", 12), "an exact name needs no suggestion");
}

/* ---- good values ---------------------------------------------------------- */

Test(config_parse, one_good_value_for_each_variable) {
    static const env_pair env[] = {
        {"DGC_ENABLE", "0"},         {"DGC_SPARSITY", "0.99"},     {"DGC_WARMUP_STEPS", "1000"},
        {"DGC_MOMENTUM", "0.9"},     {"DGC_NESTEROV", "1"},        {"DGC_MOMENTUM_MASKING", "0"},
        {"DGC_CLIP_NORM", "2.5"},    {"DGC_MIN_ELEMENTS", "1024"}, {"DGC_MIN_RANKS", "4"},
        {"DGC_SAMPLE_RATIO", "0.5"}, {"DGC_LOG_LEVEL", "debug"},   {"DGC_STATS", "1"},
        {"DGC_COMPENSATE", "0"},     {"DGC_STATE_IDLE_CALLS", "50"}, {"DGC_MAX_STATE_MB", "2048"},
        {"DGC_TRANSPORT", "dense"}, {"DGC_VALUE_BITS", "32"},      {"DGC_BUFFER_KEY", "order"},
        {"DGC_TOPOLOGY", "node"},   {"DGC_NODE_SIZE", "8"},
    };
    dgc_config want;
    spec_defaults(&want);
    /* Each alone: only its own field moves. */
    for (size_t i = 0; i < sizeof env / sizeof env[0]; i++) {
        dgc_config cfg, w = want;
        char err[256];
        cr_assert_eq(parse_one(&cfg, env[i].name, env[i].value, err, sizeof err), 0, "%s=%s: %s", env[i].name,
                     env[i].value, err);
        switch (i) {
        case 0: w.enable = 0; break;
        case 1: w.sparsity = 0.99; break;
        case 2: w.warmup_steps = 1000; break;
        case 3: w.momentum = 0.9; break;
        case 4: w.nesterov = 1; break;
        case 5: w.momentum_masking = 0; break;
        case 6: w.clip_norm = 2.5; break;
        case 7: w.min_elements = 1024; break;
        case 8: w.min_ranks = 4; break;
        case 9: w.sample_ratio = 0.5; break;
        case 10: w.log_level = DGC_LOG_DEBUG; break;
        case 11: w.stats = 1; break;
        case 12: w.compensate = 0; break;
        case 13: w.state_idle_calls = 50; break;
        case 14: w.max_state_mb = 2048; break;
        case 15: w.transport = DGC_TRANSPORT_DENSE; break;
        case 16: w.value_bits = 32; break;
        case 17: w.buffer_key = DGC_KEY_ORDER; break;
        case 18: w.topology = DGC_TOPOLOGY_NODE; break;
        case 19: w.node_size = 8; break;
        }
        assert_config_eq(&cfg, &w, env[i].name);
    }
    /* All together. */
    dgc_config cfg;
    char err[256];
    cr_assert_eq(parse_env(&cfg, env, sizeof env / sizeof env[0], err, sizeof err), 0, "%s", err);
    cr_assert(cfg.enable == 0 && cfg.sparsity == 0.99 && cfg.warmup_steps == 1000 && cfg.momentum == 0.9 &&
              cfg.nesterov == 1 && cfg.momentum_masking == 0 && cfg.clip_norm == 2.5 && cfg.min_elements == 1024 &&
              cfg.min_ranks == 4 && cfg.sample_ratio == 0.5 && cfg.log_level == DGC_LOG_DEBUG && cfg.stats == 1 &&
              cfg.compensate == 0 && cfg.state_idle_calls == 50 && cfg.max_state_mb == 2048 &&
              cfg.transport == DGC_TRANSPORT_DENSE && cfg.value_bits == 32 && cfg.buffer_key == DGC_KEY_ORDER &&
              cfg.topology == DGC_TOPOLOGY_NODE && cfg.node_size == 8);
}

Test(config_parse, transport_names) {
    static const struct {
        const char *text;
        int transport;
    } cases[] = {{"auto", DGC_TRANSPORT_AUTO}, {"sparse", DGC_TRANSPORT_SPARSE}, {"dense", DGC_TRANSPORT_DENSE},
                 {"Dense", DGC_TRANSPORT_DENSE}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dgc_config cfg;
        char err[256];
        cr_assert_eq(parse_one(&cfg, "DGC_TRANSPORT", cases[i].text, err, sizeof err), 0, "%s: %s", cases[i].text,
                     err);
        cr_assert_eq(cfg.transport, cases[i].transport, "DGC_TRANSPORT=%s", cases[i].text);
    }
}

Test(config_parse, log_level_names) {
    static const struct {
        const char *text;
        int level;
    } cases[] = {{"error", DGC_LOG_ERROR}, {"warn", DGC_LOG_WARN},   {"info", DGC_LOG_INFO},
                 {"debug", DGC_LOG_DEBUG}, {"INFO", DGC_LOG_INFO}, {"Debug", DGC_LOG_DEBUG}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dgc_config cfg;
        char err[256];
        cr_assert_eq(parse_one(&cfg, "DGC_LOG_LEVEL", cases[i].text, err, sizeof err), 0, "%s: %s", cases[i].text,
                     err);
        cr_assert_eq(cfg.log_level, cases[i].level, "DGC_LOG_LEVEL=%s", cases[i].text);
    }
}

/* Accepted values at or near the edges of each range. */
Test(config_parse, boundaries_accepted) {
    static const struct {
        const char *name, *value;
    } ok[] = {
        {"DGC_SPARSITY", "0"},          {"DGC_SPARSITY", "0.9999999"}, {"DGC_SAMPLE_RATIO", "1"},
        {"DGC_SAMPLE_RATIO", "1e-9"},   {"DGC_MOMENTUM", "0"},         {"DGC_MOMENTUM", "0.999999"},
        {"DGC_CLIP_NORM", "0"},         {"DGC_CLIP_NORM", "1e30"},     {"DGC_WARMUP_STEPS", "1000000000000"},
        {"DGC_MIN_ELEMENTS", "1"},      {"DGC_MIN_ELEMENTS", "4294967295"}, {"DGC_MIN_RANKS", "1"},
        {"DGC_MIN_RANKS", "1048576"},   {"DGC_ENABLE", "1"},           {"DGC_STATS", "0"},
        {"DGC_STATE_IDLE_CALLS", "0"},  {"DGC_STATE_IDLE_CALLS", "1000000000000"},
        {"DGC_MAX_STATE_MB", "0"},      {"DGC_MAX_STATE_MB", "1000000000"}, {"DGC_MAX_STATE_MB", "AUTO"},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        dgc_config cfg;
        char err[256];
        cr_assert_eq(parse_one(&cfg, ok[i].name, ok[i].value, err, sizeof err), 0, "%s=%s rejected: %s", ok[i].name,
                     ok[i].value, err);
    }
    dgc_config cfg;
    char err[256];
    cr_assert_eq(parse_one(&cfg, "DGC_SPARSITY", "0", err, sizeof err), 0);
    cr_assert(cfg.sparsity == 0.0);
    cr_assert_eq(parse_one(&cfg, "DGC_SAMPLE_RATIO", "1", err, sizeof err), 0);
    cr_assert(cfg.sample_ratio == 1.0);
    cr_assert_eq(parse_one(&cfg, "DGC_WARMUP_STEPS", "1000000000000", err, sizeof err), 0);
    cr_assert_eq(cfg.warmup_steps, 1000000000000ull);
    cr_assert_eq(parse_one(&cfg, "DGC_MIN_ELEMENTS", "4294967295", err, sizeof err), 0);
    cr_assert_eq(cfg.min_elements, 4294967295ull);
}

/* ---- bad values ------------------------------------------------------------ */

/* Expects name=value rejected with a message naming the variable, the value
 * and the range, and the defaults left in *cfg. range_hint is text from the
 * spec that the range must show (NULL: use the table's range text). */
static void expect_rejected(const char *name, const char *value, const char *range_hint) {
    dgc_config cfg, want;
    char err[512];
    memset(&cfg, 0x5a, sizeof cfg);
    int rc = parse_one(&cfg, name, value, err, sizeof err);
    cr_assert_eq(rc, -1, "%s='%s' was accepted", name, value);
    cr_assert(strstr(err, name) != NULL, "%s='%s': message \"%s\" does not name the variable", name, value, err);
    if (value[0])
        cr_assert(strstr(err, value) != NULL, "%s='%s': message \"%s\" does not show the value", name, value, err);
    int opt = -1;
    for (int i = 0; i < DGC_OPT_COUNT; i++)
        if (strcmp(dgc_option_name((dgc_option)i), name) == 0) opt = i;
    cr_assert(opt >= 0);
    const char *range = range_hint ? range_hint : dgc_option_range((dgc_option)opt);
    cr_assert(strstr(err, range) != NULL, "%s='%s': message \"%s\" does not show the range \"%s\"", name, value,
              err, range);
    spec_defaults(&want);
    char ctx[128];
    snprintf(ctx, sizeof ctx, "after rejecting %s='%s'", name, value);
    assert_config_eq(&cfg, &want, ctx);
}

Test(config_parse, malformed_text_rejected_for_every_variable) {
    static const char *const bad[] = {"abc", "", " ", "1x", "0.5.5", "--1", "1 2"};
    for (size_t i = 0; i < NVALUED; i++)
        for (size_t j = 0; j < sizeof bad / sizeof bad[0]; j++) expect_rejected(all_names[i], bad[j], NULL);
}

Test(config_parse, nan_and_infinity_rejected_for_every_variable) {
    static const char *const bad[] = {"nan", "NaN", "-nan", "inf", "-inf", "infinity"};
    for (size_t i = 0; i < NVALUED; i++)
        for (size_t j = 0; j < sizeof bad / sizeof bad[0]; j++) expect_rejected(all_names[i], bad[j], NULL);
}

Test(config_parse, negative_values_rejected_for_every_variable) {
    static const char *const bad[] = {"-1", "-0.5", "-16384"};
    for (size_t i = 0; i < NVALUED; i++)
        for (size_t j = 0; j < sizeof bad / sizeof bad[0]; j++) expect_rejected(all_names[i], bad[j], NULL);
}

Test(config_parse, negative_integer_after_leading_blank_rejected) {
    /* strtoull skips blanks and then accepts a sign, negating modulo 2^64:
     * " -18446744073709551615" reads as 1 and " -18446744073709551614" as 2. */
    expect_rejected("DGC_MIN_RANKS", " -18446744073709551615", NULL);
    expect_rejected("DGC_ENABLE", " -18446744073709551615", NULL);
    expect_rejected("DGC_WARMUP_STEPS", "\t-18446744073709551614", NULL);
    expect_rejected("DGC_MIN_ELEMENTS", " -1", NULL);
    /* ... and so does every other character isspace() knows. */
    static const char *const space[] = {"\v", "\r", "\f", "\n", " \n\t\v"};
    char text[64];
    for (size_t i = 0; i < sizeof space / sizeof space[0]; i++) {
        snprintf(text, sizeof text, "%s-18446744073709551615", space[i]);
        expect_rejected("DGC_MIN_RANKS", text, NULL);
        snprintf(text, sizeof text, "%s+5", space[i]);
        expect_rejected("DGC_WARMUP_STEPS", text, NULL);
    }
}

Test(config_parse, surrounding_whitespace_of_any_kind_is_allowed_around_a_number) {
    static const char *const ok[] = {"\v7", "7\v", "\r\n7\f", " 7 "};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        dgc_config cfg;
        char err[256];
        cr_assert_eq(parse_one(&cfg, "DGC_MIN_RANKS", ok[i], err, sizeof err), 0, "case %zu: %s", i, err);
        cr_assert_eq(cfg.min_ranks, 7);
    }
}

Test(config_parse, subnormal_values_are_values) {
    /* strtod reports ERANGE for a subnormal result, which is still the
     * number asked for: in range for DGC_CLIP_NORM and DGC_SAMPLE_RATIO. */
    dgc_config cfg;
    char err[256];
    cr_assert_eq(parse_one(&cfg, "DGC_CLIP_NORM", "1e-310", err, sizeof err), 0, "%s", err);
    cr_assert(cfg.clip_norm > 0 && cfg.clip_norm < 2e-310, "clip %g", cfg.clip_norm);
    cr_assert_eq(parse_one(&cfg, "DGC_SAMPLE_RATIO", "4.9e-324", err, sizeof err), 0, "%s", err);
    cr_assert(cfg.sample_ratio > 0);
    /* Underflow all the way to zero is not the value asked for. */
    expect_rejected("DGC_CLIP_NORM", "1e-400", NULL);
    expect_rejected("DGC_SPARSITY", "1e-99999", NULL);
    /* Overflow neither. */
    expect_rejected("DGC_CLIP_NORM", "1e400", NULL);
}

Test(config_parse, a_long_value_leaves_room_for_range_and_default) {
    char value[600];
    memset(value, '9', sizeof value - 1);
    value[sizeof value - 1] = '\0';
    dgc_config cfg;
    char err[256];
    cr_assert_eq(parse_one(&cfg, "DGC_MIN_ELEMENTS", value, err, sizeof err), -1);
    cr_assert(strstr(err, "DGC_MIN_ELEMENTS") != NULL, "%s", err);
    cr_assert(strstr(err, dgc_option_range(DGC_OPT_MIN_ELEMENTS)) != NULL, "range missing: %s", err);
    cr_assert(strstr(err, "(default 16384)") != NULL, "default missing: %s", err);
    cr_assert(strstr(err, "999999999") != NULL, "the value's start is not quoted: %s", err);
}

Test(config_parse, out_of_range_rejected) {
    static const struct {
        const char *name, *value, *range;
    } bad[] = {
        {"DGC_ENABLE", "2", "0 or 1"},
        {"DGC_NESTEROV", "2", "0 or 1"},
        {"DGC_MOMENTUM_MASKING", "7", "0 or 1"},
        {"DGC_STATS", "10", "0 or 1"},
        {"DGC_COMPENSATE", "2", "0 or 1"},
        {"DGC_ENABLE", "0.5", "0 or 1"},
        {"DGC_SPARSITY", "1", "[0, 1)"},
        {"DGC_SPARSITY", "1.0", "[0, 1)"},
        {"DGC_SPARSITY", "1.5", "[0, 1)"},
        {"DGC_MOMENTUM", "1", "[0, 1)"},
        {"DGC_MOMENTUM", "-0.1", "[0, 1)"},
        {"DGC_SAMPLE_RATIO", "0", "(0, 1]"},
        {"DGC_SAMPLE_RATIO", "0.0", "(0, 1]"},
        {"DGC_SAMPLE_RATIO", "1.01", "(0, 1]"},
        {"DGC_CLIP_NORM", "-1", NULL},
        {"DGC_CLIP_NORM", "2e30", NULL},
        {"DGC_WARMUP_STEPS", "1000000000001", NULL},
        {"DGC_WARMUP_STEPS", "1.5", NULL},
        {"DGC_WARMUP_STEPS", "99999999999999999999999", NULL}, /* overflows uint64 */
        {"DGC_MIN_ELEMENTS", "0", NULL},
        {"DGC_MIN_ELEMENTS", "4294967296", NULL},
        {"DGC_MIN_RANKS", "0", NULL},
        {"DGC_MIN_RANKS", "1048577", NULL},
        {"DGC_LOG_LEVEL", "verbose", NULL},
        {"DGC_LOG_LEVEL", "warning", NULL},
        {"DGC_LOG_LEVEL", "5", NULL},
        {"DGC_TRANSPORT", "1", NULL},
        {"DGC_TRANSPORT", "allgather", NULL},
        {"DGC_TRANSPORT", "", NULL},
        {"DGC_VALUE_BITS", "24", NULL},
        {"DGC_VALUE_BITS", "8", NULL},
        {"DGC_VALUE_BITS", "64", NULL},
        {"DGC_BUFFER_KEY", "position", NULL},
        {"DGC_BUFFER_KEY", "1", NULL},
        {"DGC_TOPOLOGY", "hierarchical", NULL},
        {"DGC_TOPOLOGY", "2", NULL},
        {"DGC_NODE_SIZE", "-1", NULL},
        {"DGC_NODE_SIZE", "1048577", NULL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) expect_rejected(bad[i].name, bad[i].value, bad[i].range);
}

Test(config_parse, one_bad_among_good_values_fails_and_restores_defaults) {
    static const env_pair env[] = {{"DGC_SPARSITY", "0.9"}, {"DGC_MOMENTUM", "0.9"}, {"DGC_SAMPLE_RATIO", "0"}};
    dgc_config cfg, want;
    char err[256];
    cr_assert_eq(parse_env(&cfg, env, 3, err, sizeof err), -1);
    cr_assert(strstr(err, "DGC_SAMPLE_RATIO") != NULL, "%s", err);
    spec_defaults(&want);
    assert_config_eq(&cfg, &want, "after a failed parse");
}

Test(config_parse, short_error_buffer_is_not_overrun) {
    dgc_config cfg;
    char err[16];
    memset(err, 'x', sizeof err);
    cr_assert_eq(parse_one(&cfg, "DGC_SPARSITY", "abc", err, 8), -1);
    cr_assert(memchr(err, '\0', 8) != NULL, "not terminated within errlen");
    cr_assert(err[8] == 'x' && err[15] == 'x', "wrote past errlen");
}

/* ---- hash ------------------------------------------------------------------ */

static uint64_t hash_of(const char *name, const char *value, dgc_option opt) {
    dgc_config cfg;
    char err[256];
    cr_assert_eq(parse_one(&cfg, name, value, err, sizeof err), 0, "%s=%s: %s", name, value, err);
    return dgc_option_hash(&cfg, opt);
}

Test(config_hash, equal_values_hash_equal_and_different_values_differ) {
    static const struct {
        dgc_option opt;
        const char *a, *same, *other;
    } cases[] = {
        {DGC_OPT_ENABLE, "1", "1", "0"},
        {DGC_OPT_SPARSITY, "0.99", "9.9e-1", "0.999"},
        {DGC_OPT_WARMUP_STEPS, "100", "100", "101"},
        {DGC_OPT_MOMENTUM, "0.9", "0.90", "0.8"},
        {DGC_OPT_NESTEROV, "0", "0", "1"},
        {DGC_OPT_MOMENTUM_MASKING, "1", "1", "0"},
        {DGC_OPT_CLIP_NORM, "2", "2.0", "3"},
        {DGC_OPT_MIN_ELEMENTS, "1024", "1024", "1025"},
        {DGC_OPT_MIN_RANKS, "2", "2", "3"},
        {DGC_OPT_SAMPLE_RATIO, "0.5", "0.500", "0.25"},
        {DGC_OPT_LOG_LEVEL, "info", "INFO", "debug"},
        {DGC_OPT_STATS, "1", "1", "0"},
        {DGC_OPT_COMPENSATE, "0", "0", "1"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *name = dgc_option_name(cases[i].opt);
        uint64_t h = hash_of(name, cases[i].a, cases[i].opt);
        cr_assert_eq(h, hash_of(name, cases[i].same, cases[i].opt), "%s: '%s' and '%s' hash differently", name,
                     cases[i].a, cases[i].same);
        cr_assert_neq(h, hash_of(name, cases[i].other, cases[i].opt), "%s: '%s' and '%s' hash equal", name,
                      cases[i].a, cases[i].other);
    }
}

Test(config_hash, options_with_the_same_bits_hash_differently) {
    /* ENABLE=1 and NESTEROV=1 store the same int: the hash must still tell
     * the options apart, or a swap between them would go unnoticed. */
    dgc_config cfg;
    dgc_config_defaults(&cfg);
    cfg.enable = 1;
    cfg.nesterov = 1;
    cr_assert_neq(dgc_option_hash(&cfg, DGC_OPT_ENABLE), dgc_option_hash(&cfg, DGC_OPT_NESTEROV));
}

Test(config_hash, negative_zero_hashes_like_zero_when_accepted) {
    /* -0 == 0 as a double, so two ranks with "0" and "-0" agree on the value;
     * the consistency check must not call that a disagreement. Rejecting "-0"
     * would also be acceptable. */
    static const char *const names[] = {"DGC_MOMENTUM", "DGC_CLIP_NORM", "DGC_SPARSITY"};
    static const dgc_option opts[] = {DGC_OPT_MOMENTUM, DGC_OPT_CLIP_NORM, DGC_OPT_SPARSITY};
    for (int i = 0; i < 3; i++) {
        dgc_config neg, pos;
        char err[256];
        if (parse_one(&neg, names[i], "-0", err, sizeof err) != 0) continue;
        cr_assert_eq(parse_one(&pos, names[i], "0", err, sizeof err), 0);
        cr_assert_eq(dgc_option_hash(&neg, opts[i]), dgc_option_hash(&pos, opts[i]),
                     "%s: '-0' accepted but hashes unlike '0'", names[i]);
    }
}

/* ---- description ------------------------------------------------------------ */

Test(config_describe, names_every_option_with_its_value) {
    dgc_config cfg;
    dgc_config_defaults(&cfg);
    cfg.min_ranks = 7;
    cfg.log_level = DGC_LOG_INFO;
    char buf[4096];
    dgc_config_describe(&cfg, buf, sizeof buf);
    for (size_t i = 0; i < NNAMES; i++) {
        char want[64];
        snprintf(want, sizeof want, "%s=", all_names[i]);
        cr_assert(strstr(buf, want) != NULL, "\"%s\" missing from \"%s\"", want, buf);
    }
    cr_assert(strstr(buf, "DGC_MIN_RANKS=7") != NULL, "%s", buf);
    cr_assert(strstr(buf, "DGC_LOG_LEVEL=info") != NULL, "%s", buf);
    cr_assert(strstr(buf, "DGC_SPARSITY=0.999") != NULL, "%s", buf);
    cr_assert(strstr(buf, "DGC_MIN_ELEMENTS=16384") != NULL, "%s", buf);
}

/* The banner's text, fed back as the environment, gives the same config. */
static void check_round_trip(const env_pair *env, size_t nenv) {
    dgc_config cfg, again;
    char err[256];
    cr_assert_eq(parse_env(&cfg, env, nenv, err, sizeof err), 0, "%s", err);
    for (int i = 0; i < DGC_OPT_COUNT; i++) {
        char buf[128];
        dgc_option_describe(&cfg, (dgc_option)i, buf, sizeof buf);
        char *eq = strchr(buf, '=');
        cr_assert_not_null(eq, "\"%s\" has no '='", buf);
        *eq = '\0';
        cr_assert_str_eq(buf, dgc_option_name((dgc_option)i));
        cr_assert_eq(parse_one(&again, buf, eq + 1, err, sizeof err), 0, "%s=%s: %s", buf, eq + 1, err);
        cr_assert_eq(dgc_option_hash(&again, (dgc_option)i), dgc_option_hash(&cfg, (dgc_option)i),
                     "%s=%s does not parse back to the same value", buf, eq + 1);
    }
}

Test(config_describe, round_trips_through_the_parser) {
    static const env_pair env[] = {{"DGC_SPARSITY", "0.95"}, {"DGC_MOMENTUM", "0.5"}, {"DGC_CLIP_NORM", "4"},
                                   {"DGC_LOG_LEVEL", "error"}, {"DGC_WARMUP_STEPS", "12"}};
    check_round_trip(env, sizeof env / sizeof env[0]);
}

Test(config_describe, round_trips_values_needing_more_than_six_digits) {
    /* dgc_option_describe is what the cross-rank mismatch error prints: two
     * ranks with 0.9999999 and 0.9999998 must not both read "1" (which is not
     * even an accepted sparsity). */
    static const env_pair env[] = {{"DGC_SPARSITY", "0.9999999"}, {"DGC_MOMENTUM", "0.123456789"},
                                   {"DGC_CLIP_NORM", "1234567.5"}, {"DGC_SAMPLE_RATIO", "0.00123456789"}};
    check_round_trip(env, sizeof env / sizeof env[0]);
}

Test(config_describe, truncates_safely_in_any_buffer) {
    dgc_config cfg;
    dgc_config_defaults(&cfg);
    char full[4096];
    dgc_config_describe(&cfg, full, sizeof full);
    size_t total = strlen(full);
    for (size_t len = 1; len < total + 4; len++) {
        char *buf = malloc(len); /* exact size, so the sanitizer sees any overrun */
        cr_assert_not_null(buf);
        dgc_config_describe(&cfg, buf, len);
        size_t got = strnlen(buf, len);
        cr_assert(got < len, "len %zu: not terminated", len);
        cr_assert(strncmp(buf, full, got) == 0, "len %zu: \"%s\" is not a prefix of the full text", len, buf);
        free(buf);
    }
}

/* ---- process-wide configuration ------------------------------------------- */

Test(config_current, reads_disabled_until_installed) {
    /* Each Criterion test runs in its own process, so nothing is installed yet. */
    cr_assert_eq(dgc_config_current()->enable, 0, "compression must be off before MPI_Init validates");
    dgc_config cfg;
    dgc_config_defaults(&cfg);
    cfg.min_ranks = 9;
    dgc_config_install(&cfg);
    cr_assert_eq(dgc_config_current()->enable, 1);
    cr_assert_eq(dgc_config_current()->min_ranks, 9);
}

/* ---- README ------------------------------------------------------------------ */

/* 1 when needle occurs in hay with no letter, digit or '.' on either side,
 * so that the default "0" is not found inside "0.999" or "10^12". */
static int contains_token(const char *hay, const char *needle) {
    size_t nl = strlen(needle);
    for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle)) {
        char before = p == hay ? ' ' : p[-1];
        char after = p[nl];
        if (!isalnum((unsigned char)before) && before != '.' && before != '_' && !isalnum((unsigned char)after) &&
            after != '.' && after != '_')
            return 1;
    }
    return 0;
}

/* The i-th cell of a Markdown table row ("| a | b |": 0 is a), trimmed, into
 * out; 0, or -1 when the row has fewer cells. */
static int table_cell(const char *row, int i, char *out, size_t len) {
    const char *p = strchr(row, '|');
    for (int c = 0; p && c < i; c++) p = strchr(p + 1, '|');
    if (!p) return -1;
    p++;
    const char *end = strchr(p, '|');
    if (!end) return -1;
    while (p < end && (*p == ' ' || *p == '\t')) p++;
    while (end > p && (end[-1] == ' ' || end[-1] == '\t')) end--;
    snprintf(out, len, "%.*s", (int)(end - p), p);
    return 0;
}

/* docs/configuration.md has one table row per variable of the option
 * table: `NAME` | its default | exactly its accepted range | meaning. */
Test(config_docs, every_option_has_a_row_with_its_default_and_range) {
    const char *path = DGC_SOURCE_DIR "/docs/configuration.md";
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s does not exist: it must document every DGC_* variable in a table row", path);
    int found[DGC_OPT_COUNT] = {0};
    char line[4096], name[128], def[256], range[256];
    while (fgets(line, sizeof line, f)) {
        const char *p = line;
        while (*p == ' ' || *p == '\t') p++;
        if (*p != '|' || table_cell(p, 0, name, sizeof name) || table_cell(p, 1, def, sizeof def) ||
            table_cell(p, 2, range, sizeof range))
            continue;
        for (int i = 0; i < DGC_OPT_COUNT; i++) {
            char quoted[64];
            snprintf(quoted, sizeof quoted, "`%s`", dgc_option_name((dgc_option)i));
            if (strcmp(name, quoted) != 0) continue;
            const char *want = dgc_option_default((dgc_option)i);
            if (!want[0]) want = "unset"; /* a path's empty default */
            cr_expect(contains_token(def, want), "docs/configuration.md gives `%s` the default %s; the option table says %s",
                      dgc_option_name((dgc_option)i), def, want);
            cr_expect_str_eq(range, dgc_option_range((dgc_option)i),
                             "docs/configuration.md gives `%s` the range %s; the option table says %s",
                             dgc_option_name((dgc_option)i), range, dgc_option_range((dgc_option)i));
            found[i] = 1;
        }
    }
    fclose(f);
    for (int i = 0; i < DGC_OPT_COUNT; i++)
        cr_expect(found[i], "docs/configuration.md has no table row for `%s`", dgc_option_name((dgc_option)i));
}

/* docs/configuration.md's table of reserved names is the code's list: each
 * `NAME` (or `PREFIX*`) in its first column is an entry, and every entry is
 * there. */
Test(config_docs, the_reserved_names_table_is_the_code_list) {
    const char *path = DGC_SOURCE_DIR "/docs/configuration.md";
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s", path);
    char line[4096], cell[256];
    int in_section = 0, listed[64] = {0};
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "## ", 3) == 0) in_section = strstr(line, "reserved") != NULL;
        if (!in_section || line[0] != '|' || table_cell(line, 0, cell, sizeof cell)) continue;
        for (char *p = strchr(cell, '`'); p; p = strchr(p, '`')) {
            char *end = strchr(p + 1, '`');
            if (!end) break;
            *end = '\0';
            char *name = p + 1;
            size_t n = strlen(name);
            int prefix = n && name[n - 1] == '*';
            if (prefix) name[n - 1] = '\0';
            int found = 0, pre = 0;
            const char *e;
            for (size_t i = 0; (e = dgc_config_reserved_at(i, &pre)); i++)
                if (strcmp(e, name) == 0 && pre == prefix) found = 1, listed[i] = 1;
            cr_expect(found, "docs/configuration.md reserves `%s%s`, which shim/core/config.c's list lacks", name,
                      prefix ? "*" : "");
            p = end + 1;
        }
    }
    fclose(f);
    const char *e;
    int pre = 0;
    for (size_t i = 0; (e = dgc_config_reserved_at(i, &pre)); i++)
        cr_expect(listed[i], "shim/core/config.c reserves %s%s, which docs/configuration.md does not list", e,
                  pre ? "*" : "");
}

/* Every variable has its line of meaning for `dgcshim config`. */
Test(config_table, every_option_has_a_summary) {
    for (int i = 0; i < DGC_OPT_COUNT; i++) {
        const char *s = dgc_option_summary((dgc_option)i);
        cr_expect(s && strlen(s) > 10, "%s has no summary line", dgc_option_name((dgc_option)i));
    }
}

/* A path is taken as given up to DGC_TEXT_MAX - 1 bytes, refused past it, and
 * its error says so with the variable's name. */
Test(config_parse, text_options_keep_a_path_and_refuse_a_longer_one) {
    dgc_config cfg;
    char err[256];
    cr_assert_eq(parse_one(&cfg, "DGC_STATS_FILE", "/tmp/run/stats", err, sizeof err), 0, "%s", err);
    cr_expect_str_eq(cfg.stats_file, "/tmp/run/stats");
    static char longer[DGC_TEXT_MAX + 1];
    memset(longer, 'a', DGC_TEXT_MAX);
    cr_assert_eq(parse_one(&cfg, "DGC_STATS_FILE", longer, err, sizeof err), -1);
    cr_expect(strstr(err, "invalid DGC_STATS_FILE='aaa") && strstr(err, "(default unset)"), "%s", err);
    cr_expect_str_eq(cfg.stats_file, "", "an error leaves the defaults");
    longer[DGC_TEXT_MAX - 1] = '\0';
    cr_expect_eq(parse_one(&cfg, "DGC_STATS_FILE", longer, err, sizeof err), 0, "1023 bytes fit");
}

/* ---- the launcher's rank (NCCL-only processes) -------------------------- */

static int launcher_rank(const env_pair *pairs, size_t n) {
    fake_env = pairs;
    fake_env_len = n;
    return dgc_config_launcher_rank(fake_lookup);
}

Test(launcher_rank, torchrun_rank_first_then_mpi_launchers_then_slurm) {
    const env_pair all[] = {{"SLURM_PROCID", "5"}, {"PMIX_RANK", "4"}, {"PMI_RANK", "3"},
                            {"OMPI_COMM_WORLD_RANK", "2"}, {"RANK", "1"}};
    cr_assert_eq(launcher_rank(all, 5), 1);
    cr_assert_eq(launcher_rank(all, 4), 2);
    cr_assert_eq(launcher_rank(all, 3), 3);
    cr_assert_eq(launcher_rank(all, 2), 4);
    cr_assert_eq(launcher_rank(all, 1), 5);
    cr_assert_eq(launcher_rank(all, 0), -1, "no launcher variable: unknown");
}

Test(launcher_rank, values_that_are_not_a_rank_are_skipped) {
    const char *bad[] = {"", "-1", "+1", " 1", "1 ", "1x", "0x10", "2147483648", "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const env_pair pairs[] = {{"RANK", bad[i]}, {"OMPI_COMM_WORLD_RANK", "7"}};
        cr_assert_eq(launcher_rank(pairs, 2), 7, "RANK='%s' is not a rank: the next variable counts", bad[i]);
    }
    const env_pair edge[] = {{"RANK", "2147483647"}};
    cr_assert_eq(launcher_rank(edge, 1), 2147483647);
    const env_pair zero[] = {{"RANK", "0"}};
    cr_assert_eq(launcher_rank(zero, 1), 0);
}

/* DGC_MAX_STATE_MB=auto: the front end's own budget (the NCCL path's share
 * of the device), a number its MiB, 0 none; the start-up line says auto. */
Test(config_parse, max_state_mb_auto_and_numbers) {
    dgc_config cfg;
    char err[256], text[128];
    cr_assert_eq(parse_one(&cfg, "DGC_MAX_STATE_MB", "auto", err, sizeof err), 0, "%s", err);
    cr_assert_eq(cfg.max_state_mb, DGC_UINT_AUTO);
    cr_assert_eq(dgc_config_state_budget(&cfg, 12345), 12345);
    cr_assert_eq(dgc_config_state_budget(&cfg, 0), 0);
    dgc_option_describe(&cfg, DGC_OPT_MAX_STATE_MB, text, sizeof text);
    cr_assert_str_eq(text, "DGC_MAX_STATE_MB=auto");
    cr_assert_eq(parse_one(&cfg, "DGC_MAX_STATE_MB", "3", err, sizeof err), 0, "%s", err);
    cr_assert_eq(dgc_config_state_budget(&cfg, 12345), (size_t)3 << 20);
    dgc_option_describe(&cfg, DGC_OPT_MAX_STATE_MB, text, sizeof text);
    cr_assert_str_eq(text, "DGC_MAX_STATE_MB=3");
    cr_assert_eq(parse_one(&cfg, "DGC_MAX_STATE_MB", "0", err, sizeof err), 0, "%s", err);
    cr_assert_eq(dgc_config_state_budget(&cfg, 12345), 0);
    expect_rejected("DGC_MAX_STATE_MB", "autox", NULL);
    expect_rejected("DGC_MIN_RANKS", "auto", NULL); /* a number without the word */
}
