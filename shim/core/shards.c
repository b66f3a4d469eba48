#include "shards.h"

static void undo_below(dgc_comm *cc, uint64_t n, const dgc_layout *lay, int upto) {
    for (int l = upto - 1; l >= 0; l--) {
        uint64_t lo, hi;
        dgc_policy_shard(n, lay->node_size, l, &lo, &hi);
        dgc_registry_undo_step(cc, hi - lo);
    }
}

int dgc_shard_steps_take(dgc_comm *cc, uint64_t n, const dgc_layout *lay, uint64_t *mine) {
    for (int l = 0; l < lay->node_size; l++) {
        uint64_t lo, hi, step;
        dgc_policy_shard(n, lay->node_size, l, &lo, &hi);
        if (dgc_registry_next_step(cc, hi - lo, &step)) {
            undo_below(cc, n, lay, l);
            return -1;
        }
        if (l == lay->local) *mine = step;
    }
    return 0;
}

void dgc_shard_steps_undo(dgc_comm *cc, uint64_t n, const dgc_layout *lay) { undo_below(cc, n, lay, lay->node_size); }
