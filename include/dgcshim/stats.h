/* Per-buffer statistics, printed at MPI_Finalize on rank 0 when DGC_STATS=1. */
#ifndef DGCSHIM_STATS_H
#define DGCSHIM_STATS_H

#include <stddef.h>
#include <stdint.h>

#include "dgcshim/config.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    uint64_t calls;          /* compressed calls on this buffer */
    uint64_t nonfinite;      /* of those, steps dropped for Inf/NaN on some rank */
    uint64_t dense_bytes;    /* what a dense all-reduce would have sent per rank: 4n per call */
    uint64_t wire_bytes;     /* what this rank sent: one payload per call */
    uint64_t last_wire_bytes; /* the payload of the latest call: after warm-up, the steady state */
    double engine_seconds;   /* compress + decode + commit, excluding the exchange */
    uint64_t dense_transport; /* of the calls, those whose pairs went by the dense transport */
    uint64_t reduce_transport; /* of the calls, those that went by the reduce transport (MPI path) */
    uint64_t last_k;         /* the latest call's k: its density is last_k / count */
    dgc_transport last_transport; /* the latest call's: _SPARSE, _DENSE or _REDUCE */
    /* DGC_TOPOLOGY's node layout (MPI path): the calls that went by it (the
     * buffer is then this rank's shard), the estimated bytes through one
     * node's card in them (dgc_plan.card_bytes), and the latest call's
     * card bytes and layout (nodes x node_size). */
    uint64_t node_calls;
    uint64_t card_bytes, last_card_bytes;
    uint32_t nodes, node_size;
} dgc_buffer_stats;

/* A call in node layout (either path): counts it, with the estimated bytes
 * through one node's card and the layout. */
void dgc_stats_node_call(dgc_buffer_stats *s, uint64_t card_bytes, int nodes, int node_size);

/* dense_bytes / wire_bytes, 0 when nothing was sent. */
double dgc_stats_ratio(const dgc_buffer_stats *s);

/* The latest call's ratio: a dense call's bytes (dense_bytes / calls) over
 * its payload. */
double dgc_stats_last_ratio(const dgc_buffer_stats *s);

/* Adds b into a. */
void dgc_stats_add(dgc_buffer_stats *a, const dgc_buffer_stats *b);

/* A buffer's label in the report: its output address, followed by '<' and
 * the send buffer's address when the call was not in place (send NULL),
 * then mark. */
void dgc_stats_label(const void *buf, const void *send, const char *mark, char *out, size_t len);

/* The column header and one row of the report. state_bytes: the memory the
 * row's live state holds now (device memory on the GPU path), printed as
 * "-" when DGC_STATS_NO_BYTES (a freed state's row). */
#define DGC_STATS_NO_BYTES SIZE_MAX
void dgc_stats_header(char *buf, size_t len);
void dgc_stats_row(const char *label, uint64_t count, const dgc_buffer_stats *s, size_t state_bytes, char *buf,
                   size_t len);

#ifdef __cplusplus
}
#endif
#endif
