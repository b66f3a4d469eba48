/* DGC_STATS_FILE=PATH: each rank appends JSON lines to PATH.RANK, one object
 * a line, everything the DGC_STATS report shows and the last step's density
 * and transport (docs/configuration.md, "Statistics files", gives the fields). The file is started
 * afresh by the process's first line; a line is written with one write(2) on
 * an O_APPEND descriptor, so two threads' lines never interleave. */
#include "stats_file.h"

#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dgcshim/config.h"
#include "dgcshim/stats.h"
#include "log.h"
#include "registry.h"

/* A growing line; on no memory it stops growing and the line is not written. */
typedef struct {
    char *s;
    size_t len, cap;
    int broken;
} line;

static void put(line *l, const char *fmt, ...) {
    if (l->broken) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(l->s ? l->s + l->len : NULL, l->s ? l->cap - l->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) { l->broken = 1; return; }
        if (l->s && l->len + (size_t)n < l->cap) { l->len += (size_t)n; return; }
        size_t cap = (l->cap ? 2 * l->cap : 4096) + (size_t)n;
        char *s = realloc(l->s, cap);
        if (!s) { l->broken = 1; return; }
        l->s = s, l->cap = cap;
    }
}

static void put_stats(line *l, const dgc_buffer_stats *s) {
    put(l, "\"calls\":%llu,\"nonfinite\":%llu,\"dense_bytes\":%llu,\"wire_bytes\":%llu,\"last_wire_bytes\":%llu,"
           "\"ratio\":%.6g,\"last_ratio\":%.6g,\"engine_seconds\":%.17g,\"dense_transport\":%llu,"
           "\"reduce_transport\":%llu,\"node_calls\":%llu,\"card_bytes\":%llu,\"last_card_bytes\":%llu,"
           "\"nodes\":%u,\"node_size\":%u",
        (unsigned long long)s->calls, (unsigned long long)s->nonfinite, (unsigned long long)s->dense_bytes,
        (unsigned long long)s->wire_bytes, (unsigned long long)s->last_wire_bytes, dgc_stats_ratio(s),
        dgc_stats_last_ratio(s), s->engine_seconds, (unsigned long long)s->dense_transport,
        (unsigned long long)s->reduce_transport, (unsigned long long)s->node_calls,
        (unsigned long long)s->card_bytes, (unsigned long long)s->last_card_bytes, (unsigned)s->nodes,
        (unsigned)s->node_size);
}

typedef struct {
    line *l;
    int first;
} rows_ctx;

/* Under the registry's lock: formatting only. */
static void put_row(const dgc_report_row *r, void *ctx) {
    rows_ctx *c = ctx;
    char label[48];
    dgc_stats_label(r->buf, r->send, "", label, sizeof label);
    put(c->l, "%s{\"buffer\":\"%s\",\"count\":%llu,\"live\":%s,\"states\":%llu,\"state_bytes\":%llu,"
              "\"device_bytes\":%llu,",
        c->first ? "" : ",", label, (unsigned long long)r->count, r->live ? "true" : "false",
        (unsigned long long)r->states, (unsigned long long)r->bytes, (unsigned long long)r->device_bytes);
    put_stats(c->l, &r->stats);
    double density = r->count && r->stats.calls ? (double)r->stats.last_k / (double)r->count : 0;
    put(c->l, ",\"last_density\":%.6g,\"last_transport\":\"%s\"}", density,
        !r->stats.calls ? "none" : dgc_transport_name(r->stats.last_transport));
    c->first = 0;
}

/* t: the snapshot the line began with, so that one line's figures agree. */
static void put_totals(line *l, const dgc_registry_totals *t) {
    put(l, "],\"passthrough_calls\":%llu,\"passthrough_bytes\":%llu,\"over_budget\":%llu,\"saturated\":%llu,",
        (unsigned long long)t->passthrough, (unsigned long long)t->passthrough_bytes,
        (unsigned long long)t->over_budget, (unsigned long long)t->saturated);
    put(l, "\"passthrough_by\":{");
    for (int i = 0; i < DGC_PASS_REASONS; i++)
        put(l, "%s\"%s\":%llu", i ? "," : "", dgc_pass_reason_name((dgc_pass_reason)i),
            (unsigned long long)t->passthrough_by[i]);
    put(l, "},\"failed\":{");
    static const char *const causes[DGC_FAIL_CAUSES] = {"memory", "misalignment", "engine", "peer", "bad_payload"};
    for (int i = 0; i < DGC_FAIL_CAUSES; i++)
        put(l, "%s\"%s\":%llu", i ? "," : "", causes[i], (unsigned long long)t->failed[i]);
    put(l, "},\"freed_unkeyed\":{\"states\":%llu,", (unsigned long long)t->released_unkeyed_states);
    put_stats(l, &t->released_unkeyed);
    put(l, "},\"memory\":{\"bytes\":%llu,\"live_states\":%llu,\"released_states\":%llu,\"peak_bytes\":%llu,"
           "\"device_bytes\":%llu,\"device_peak_bytes\":%llu}}\n",
        (unsigned long long)t->bytes, (unsigned long long)t->live_states, (unsigned long long)t->released_states,
        (unsigned long long)t->peak_bytes, (unsigned long long)t->device_bytes,
        (unsigned long long)t->device_peak_bytes);
}

static const char *env(const char *name) { return getenv(name); }

/* The rank in the file's name: MPI's, else the launcher's, else none (-1). */
static int file_rank(void) {
    int r = dgc_config_rank();
    return r >= 0 ? r : dgc_config_launcher_rank(env);
}

static void write_line(const dgc_config *cfg, const char *event) {
    line l = {0};
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int rank = file_rank();
    dgc_registry_totals t;
    dgc_registry_totals_get(&t);
    put(&l, "{\"event\":\"%s\",\"rank\":%d,\"pid\":%ld,\"time\":%.6f,\"compressed_calls\":%llu,\"buffers\":[", event,
        rank, (long)getpid(), (double)ts.tv_sec + ts.tv_nsec * 1e-9, (unsigned long long)t.compressed);
    rows_ctx c = {&l, 1};
    dgc_registry_each_row(put_row, &c);
    put_totals(&l, &t);
    char path[DGC_TEXT_MAX + 32];
    if (rank >= 0) snprintf(path, sizeof path, "%s.%d", cfg->stats_file, rank);
    else snprintf(path, sizeof path, "%s.pid%ld", cfg->stats_file, (long)getpid());
    int fresh = dgc_registry_claim(DGC_FLAG_STATS_FILE_OPENED);
    int fd = l.broken ? -1 : open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (fresh ? O_TRUNC : 0), 0644);
    ssize_t n = fd < 0 ? -1 : write(fd, l.s, l.len);
    if (fd >= 0) close(fd);
    if ((size_t)n != l.len && dgc_registry_claim(DGC_FLAG_STATS_FILE_FAILED))
        DGC_WARN("DGC_STATS_FILE: could not write %s%s (said once)", path, l.broken ? ": no memory for the line" : "");
    free(l.s);
}

void dgc_stats_file_tick(void) {
    const dgc_config *cfg = dgc_config_current();
    if (!cfg->stats_file[0]) return;
    uint64_t n = dgc_registry_count_compressed();
    if (cfg->stats_every && n % cfg->stats_every == 0) write_line(cfg, "every");
}

void dgc_stats_file_final(void) {
    const dgc_config *cfg = dgc_config_current();
    if (cfg->stats_file[0] && dgc_registry_claim(DGC_FLAG_STATS_FILE_FINAL)) write_line(cfg, "exit");
}
