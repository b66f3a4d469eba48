/* The node layout's steps: one call on an n-element buffer takes a step of
 * each of its L shards' counts on the cross record, in shard order, as L
 * calls of those counts would. Both paths take them here, so that their
 * shards' steps, and with them k and the warm-up, are the same bits
 * (gpu.nccl.ddp_shape_node). */
#ifndef DGCSHIM_CORE_SHARDS_H
#define DGCSHIM_CORE_SHARDS_H

#include <stdint.h>

#include "dgcshim/policy.h"
#include "registry.h"

/* Takes the steps of the L shards of an n-element call on cc; *mine gets
 * lay->local's. Returns 0, or -1 with none taken when cc's table of counts
 * is full (alike on every rank: every rank counts every shard). */
int dgc_shard_steps_take(dgc_comm *cc, uint64_t n, const dgc_layout *lay, uint64_t *mine);

/* Gives back the steps dgc_shard_steps_take took for an n-element call. */
void dgc_shard_steps_undo(dgc_comm *cc, uint64_t n, const dgc_layout *lay);

#endif
