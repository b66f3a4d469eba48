/* Formatting of the statistics report, columns in the nccl-tests spirit. */
#include "dgcshim/stats.h"

#include "registry.h"

#include <stdio.h>

double dgc_stats_ratio(const dgc_buffer_stats *s) {
    return s->wire_bytes ? (double)s->dense_bytes / (double)s->wire_bytes : 0.0;
}

double dgc_stats_last_ratio(const dgc_buffer_stats *s) {
    /* A dense call's bytes from the buffer's own record: 4 per element for
     * fp32, 2 for fp16 and bf16 on the NCCL path. */
    if (!s->last_wire_bytes || !s->calls) return 0.0;
    return (double)s->dense_bytes / (double)s->calls / (double)s->last_wire_bytes;
}

void dgc_stats_node_call(dgc_buffer_stats *s, uint64_t card_bytes, int nodes, int node_size) {
    s->node_calls++;
    s->card_bytes += card_bytes;
    s->last_card_bytes = card_bytes;
    s->nodes = (uint32_t)nodes;
    s->node_size = (uint32_t)node_size;
}

void dgc_stats_add(dgc_buffer_stats *a, const dgc_buffer_stats *b) {
    a->calls += b->calls;
    a->nonfinite += b->nonfinite;
    a->dense_bytes += b->dense_bytes;
    a->wire_bytes += b->wire_bytes;
    a->engine_seconds += b->engine_seconds;
    a->dense_transport += b->dense_transport;
    a->reduce_transport += b->reduce_transport;
    a->node_calls += b->node_calls;
    a->card_bytes += b->card_bytes;
    if (b->node_calls) { /* the latest layout seen, for the totals' line */
        a->last_card_bytes = b->last_card_bytes;
        a->nodes = b->nodes;
        a->node_size = b->node_size;
    }
}

void dgc_stats_label(const void *buf, const void *send, const char *mark, char *out, size_t len) {
    if (send == DGC_ORDER_SEND) snprintf(out, len, "order#%llu%s", (unsigned long long)((uintptr_t)buf - 1), mark);
    else if (send) snprintf(out, len, "%p<%p%s", buf, send, mark);
    else snprintf(out, len, "%p%s", buf, mark);
}

void dgc_stats_header(char *buf, size_t len) {
    snprintf(buf, len, "%-18s %12s %8s %9s %14s %12s %9s %10s %11s %12s %15s", "buffer", "count", "calls", "nonfinite",
             "dense_bytes", "wire_bytes", "ratio", "last_ratio", "engine_ms", "state_bytes", "transport");
}

void dgc_stats_row(const char *label, uint64_t count, const dgc_buffer_stats *s, size_t state_bytes, char *buf,
                   size_t len) {
    char last[16] = "-", held[24] = "-";
    if (state_bytes != DGC_STATS_NO_BYTES) snprintf(held, sizeof held, "%zu", state_bytes);
    if (count) snprintf(last, sizeof last, "%.1fx", dgc_stats_last_ratio(s));
    /* The transport column: calls by the sparse all-gather / by the dense
     * one, then / by the reduce transport where some went by it. */
    char transport[64];
    int w = snprintf(transport, sizeof transport, "s%llu/d%llu",
                     (unsigned long long)(s->calls - s->dense_transport - s->reduce_transport),
                     (unsigned long long)s->dense_transport);
    if (s->reduce_transport && w > 0 && (size_t)w < sizeof transport)
        w += snprintf(transport + w, sizeof transport - (size_t)w, "/r%llu", (unsigned long long)s->reduce_transport);
    /* Calls by the node layout: @MxL, the buffer's row then being this rank's shard. */
    if (s->node_calls && w > 0 && (size_t)w < sizeof transport)
        snprintf(transport + w, sizeof transport - (size_t)w, "@%ux%u", (unsigned)s->nodes, (unsigned)s->node_size);
    snprintf(buf, len, "%-18s %12llu %8llu %9llu %14llu %12llu %8.1fx %10s %11.3f %12s %15s", label,
             (unsigned long long)count, (unsigned long long)s->calls, (unsigned long long)s->nonfinite,
             (unsigned long long)s->dense_bytes, (unsigned long long)s->wire_bytes, dgc_stats_ratio(s), last,
             s->engine_seconds * 1e3, held, transport);
}
