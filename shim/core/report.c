/* The DGC_STATS report: every buffer's row, the totals and the failures by
 * cause, as STATS log lines. Both front ends print it: MPI_Finalize, or the
 * NCCL front end at exit in a process that never finalised MPI. */
#include "report.h"

#include <stdio.h>

#include "dgcshim/stats.h"
#include "log.h"
#include "registry.h"

/* A buffer is its output address; one reduced from a send buffer of its own
 * (not in place) adds that, since one output can serve several inputs
 * (dgc_stats_label). A buffer whose states were all freed before the report
 * (its communicator freed, or idle) is marked with a '*'. */
typedef struct {
    dgc_buffer_stats total;
    size_t bytes; /* the live states' */
    uint64_t freed_rows;
} report_acc;

static void print_row(const dgc_report_row *r, void *ctx) {
    report_acc *acc = ctx;
    char label[48], row[288];
    dgc_stats_label(r->buf, r->send, r->live ? "" : "*", label, sizeof label);
    dgc_stats_row(label, r->count, &r->stats, r->live ? r->bytes : DGC_STATS_NO_BYTES, row, sizeof row);
    dgc_log_tagged("STATS", "%s", row);
    dgc_stats_add(&acc->total, &r->stats);
    acc->bytes += r->bytes;
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
        dgc_stats_row(label, 0, &t.released_unkeyed, DGC_STATS_NO_BYTES, row, sizeof row);
        dgc_log_tagged("STATS", "%s", row);
        dgc_stats_add(&acc.total, &t.released_unkeyed);
    }
    dgc_stats_row("total", 0, &acc.total, acc.bytes, row, sizeof row);
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
    if (acc.total.node_calls)
        dgc_log_tagged("STATS", "node layout (DGC_TOPOLOGY): %llu of the compressed calls, %u nodes x %u ranks (rows "
                       "are this rank's shards); estimated bytes through a node's card: %llu in all, %llu in the "
                       "latest call", (unsigned long long)acc.total.node_calls, (unsigned)acc.total.nodes,
                       (unsigned)acc.total.node_size, (unsigned long long)acc.total.card_bytes,
                       (unsigned long long)acc.total.last_card_bytes);
    if (t.passthrough) {
        char why[256];
        dgc_report_pass_reasons(&t, why, sizeof why);
        dgc_log_tagged("STATS", "pass-through calls by reason: %s", why);
    }
    dgc_log_tagged("STATS", "memory: %llu bytes in %llu live states (released %llu), peak %llu bytes",
                   (unsigned long long)t.bytes, (unsigned long long)t.live_states,
                   (unsigned long long)t.released_states, (unsigned long long)t.peak_bytes);
    if (t.device_peak_bytes)
        dgc_log_tagged("STATS", "device memory of the GPU states: %llu bytes now, peak %llu bytes",
                       (unsigned long long)t.device_bytes, (unsigned long long)t.device_peak_bytes);
}

void dgc_report_pass_reasons(const dgc_registry_totals *t, char *buf, size_t len) {
    size_t w = 0;
    buf[0] = '\0';
    for (int i = 0; i < DGC_PASS_REASONS && w < len; i++)
        if (t->passthrough_by[i])
            w += (size_t)snprintf(buf + w, len - w, "%s%s %llu", w ? ", " : "",
                                  dgc_pass_reason_name((dgc_pass_reason)i), (unsigned long long)t->passthrough_by[i]);
}
