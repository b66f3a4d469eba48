/* Are a communicator's buffers made afresh (core/places.h,
 * DGC_BUFFER_KEY=auto)? Persistent buffers never make states follow
 * places, nor do several of one size behind a shorter learnt step; memory
 * that rotates between indices, or one block for several calls of a step,
 * does, at the second step that shows it; one such step (DDP's rebuild)
 * does not; a new learnt step starts the watch afresh. Then the registry's
 * dgc_registry_auto_place over the order's learning. */
#include <criterion/criterion.h>

#include "core/order.h"
#include "core/places.h"
#include "core/registry.h"

#define BLOCK 4096
static char mem[64 * BLOCK];

static uintptr_t at(int block) { return (uintptr_t)&mem[(size_t)block * BLOCK]; }

/* Notes one step of `step` calls, call i at block addr[i] (BLOCK bytes);
 * returns the index that returned 1, or -1. */
static int note_step(dgc_places *p, uint64_t gen, uint64_t step, const int *addr) {
    int hit = -1;
    for (uint64_t i = 0; i < step; i++)
        if (dgc_places_note(p, gen, step, i, at(addr[i]), at(addr[i]) + BLOCK)) hit = (int)i;
    return hit;
}

Test(places, persistent_buffers_are_not_fresh) {
    dgc_places *p = dgc_places_new();
    const int a[] = {0, 1, 2, 3};
    for (int s = 0; s < 50; s++) cr_assert_eq(note_step(p, 1, 4, a), -1, "step %d", s);
    dgc_places_free(p);
}

Test(places, persistent_buffers_of_one_size_behind_a_shorter_step) {
    dgc_places *p = dgc_places_new();
    const int even[] = {0}, odd[] = {1}; /* two buffers of one size: a learnt step of one call */
    for (int s = 0; s < 50; s++) cr_assert_eq(note_step(p, 1, 1, s % 2 ? odd : even), -1, "step %d", s);
    dgc_places_free(p);
}

Test(places, one_fresh_buffer_at_moving_addresses_is_not_seen) {
    dgc_places *p = dgc_places_new();
    for (int s = 0; s < 50; s++) {
        const int a[] = {s % 7};
        cr_assert_eq(note_step(p, 1, 1, a), -1, "step %d", s);
    }
    dgc_places_free(p);
}

Test(places, rotating_blocks_decide_at_the_second_step_that_shows_them) {
    dgc_places *p = dgc_places_new();
    const int a0[] = {0, 1, 2}, a1[] = {1, 2, 3}, a2[] = {2, 3, 0};
    cr_assert_eq(note_step(p, 1, 3, a0), -1); /* first seen */
    cr_assert_eq(note_step(p, 1, 3, a1), -1); /* index 0 on index 1's block: the first such step */
    cr_assert_eq(note_step(p, 1, 3, a2), 0);  /* again, from its first call */
    cr_assert_eq(note_step(p, 1, 3, a0), -1); /* said once */
    dgc_places_free(p);
}

Test(places, a_partial_overlap_counts) {
    dgc_places *p = dgc_places_new();
    for (int s = 0; s < 3; s++) {
        int hit = -1;
        for (uint64_t i = 0; i < 2; i++) { /* index 1 begins in the middle of index 0's last memory */
            uintptr_t lo = at((int)i) + (uintptr_t)(s % 2) * BLOCK / 2 * (i == 1 ? -1 : 1);
            if (dgc_places_note(p, 1, 2, i, lo, lo + BLOCK)) hit = (int)i;
        }
        cr_assert_eq(hit, s == 2 ? 0 : -1, "step %d: %d", s, hit);
    }
    dgc_places_free(p);
}

Test(places, one_block_for_several_calls_decides_at_the_second_step_end) {
    dgc_places *p = dgc_places_new();
    const int a[] = {0, 1, 0}; /* indices 0 and 2 in one block, every step alike */
    cr_assert_eq(note_step(p, 1, 3, a), -1);
    cr_assert_eq(note_step(p, 1, 3, a), 0); /* index 0 on the block index 2 had: the second step */
    dgc_places_free(p);
}

Test(places, one_move_is_no_sign) {
    dgc_places *p = dgc_places_new();
    const int before[] = {0, 1, 2}, after[] = {1, 2, 3}; /* DDP's rebuild: one bucket where another was */
    cr_assert_eq(note_step(p, 1, 3, before), -1);
    cr_assert_eq(note_step(p, 1, 3, after), -1);
    for (int s = 0; s < 20; s++) cr_assert_eq(note_step(p, 1, 3, after), -1, "step %d", s);
    dgc_places_free(p);
}

Test(places, a_new_learnt_step_starts_the_watch_afresh) {
    dgc_places *p = dgc_places_new();
    const int a0[] = {0, 1, 2}, a1[] = {1, 2, 0}, b0[] = {6, 7}, b1[] = {7, 6};
    cr_assert_eq(note_step(p, 1, 3, a0), -1);
    cr_assert_eq(note_step(p, 1, 3, a1), -1); /* one odd step of generation 1 */
    cr_assert_eq(note_step(p, 2, 2, b0), -1); /* the order changed */
    cr_assert_eq(note_step(p, 2, 2, b1), -1); /* one odd step of generation 2 */
    cr_assert_eq(note_step(p, 2, 2, b0), 0);  /* its second */
    dgc_places_free(p);
}

/* The registry over the order: three fresh buffers per step, of 1000,
 * 1000 and 500 floats, rotating over three blocks. The order is learnt at
 * the 9th call (DGC_ORDER_MIN_SPAN 8: position 0 of count 1000, the first
 * index of the step); the step of calls 10-12 shows it once, the 13th call
 * again: from the 13th call on, the call's position. */
Test(places, auto_place_follows_the_order_once_memory_is_shared) {
    dgc_comm *c = dgc_registry_comm_open(2, 64);
    cr_assert_not_null(c);
    const uint64_t counts[] = {1000, 1000, 500};
    const int64_t position[] = {0, 1, 0};
    int said = 0;
    for (int call = 1; call <= 30; call++) {
        const int i = (call - 1) % 3, s = (call - 1) / 3;
        int now = 0;
        int64_t got = dgc_registry_auto_place(c, counts[i], NULL, (void *)at((i + s) % 3), sizeof(float), &now);
        said += now;
        cr_assert_eq(got, call >= 13 ? position[i] : -1, "call %d: %lld", call, (long long)got);
        cr_assert_eq(now, call == 13, "call %d", call);
    }
    cr_assert_eq(said, 1);
    dgc_registry_comm_close(c->id);
}

Test(places, auto_place_keys_persistent_buffers_by_address) {
    dgc_comm *c = dgc_registry_comm_open(2, 64);
    cr_assert_not_null(c);
    const uint64_t counts[] = {300, 300, 70};
    for (int call = 0; call < 300; call++) {
        int now = 0;
        cr_assert_eq(dgc_registry_auto_place(c, counts[call % 3], NULL, (void *)at(call % 3), sizeof(float), &now),
                     -1, "call %d", call);
    }
    dgc_registry_comm_close(c->id);
}
