/* A communicator's step learnt from the order of its counts (core/order.h,
 * DGC_BUFFER_KEY=order): positions against the step written out by hand,
 * the learning calls (summed densely) before the step is seen repeating, a
 * first step unlike the others, a changed order, undo, and a step too long
 * to learn. */
#include <criterion/criterion.h>

#include "core/order.h"

/* Feeds calls counts (cycled over the pattern) and checks each answer. */
static void feed(dgc_order *o, const uint64_t *pattern, int period, int calls, const int64_t *want) {
    for (int i = 0; i < calls; i++) {
        int64_t got = dgc_order_next(o, pattern[i % period]);
        cr_assert_eq(got, want[i], "call %d (count %llu): %lld, want %lld", i,
                     (unsigned long long)pattern[i % period], (long long)got, (long long)want[i]);
    }
}

#define L DGC_ORDER_LEARNING

Test(order, one_buffer_per_step_is_position_0_after_the_span) {
    dgc_order *o = dgc_order_new();
    const uint64_t p[] = {1000};
    const int64_t want[] = {L, L, L, L, L, L, L, L, 0, 0, 0, 0};
    feed(o, p, 1, 12, want);
    cr_assert_eq(dgc_order_step(o), 1);
    dgc_order_free(o);
}

Test(order, equal_and_different_sizes_get_their_own_positions) {
    dgc_order *o = dgc_order_new();
    const uint64_t p[] = {300, 300, 70, 300}; /* a step: three buffers of 300 (0, 1, 2) and one of 70 */
    const int64_t want[] = {L, L, L, L, L, L, L, L, 0, 1, 0, 2, 0, 1, 0, 2};
    feed(o, p, 4, 16, want);
    cr_assert_eq(dgc_order_step(o), 4);
    dgc_order_free(o);
}

Test(order, a_step_that_begins_with_a_run_is_not_taken_for_a_step_of_one) {
    dgc_order *o = dgc_order_new();
    /* [a, a, b]: [a, a] alone looks like a step of one call; the span's
     * floor waits for more. The step learnt begins at the b (a rotation),
     * and each a keeps its own position from step to step. */
    const uint64_t p[] = {5, 5, 9};
    const int64_t want[] = {L, L, L, L, L, L, L, L, 0, 0, 1, 0, 0, 1, 0, 0, 1};
    feed(o, p, 3, 17, want);
    cr_assert_eq(dgc_order_step(o), 3);
    dgc_order_free(o);
}

Test(order, a_first_step_unlike_the_others_goes_by) {
    /* DDP: step 0 all-reduces one bucket of every gradient, later steps
     * three buckets. */
    dgc_order *o = dgc_order_new();
    cr_assert_eq(dgc_order_next(o, 382147), L);
    const uint64_t buckets[] = {262144, 100003, 20000};
    int64_t got[20];
    for (int i = 0; i < 20; i++) got[i] = dgc_order_next(o, buckets[i % 3]);
    int first = 0;
    while (first < 20 && got[first] == L) first++;
    cr_assert(first > 0 && first <= 9, "learnt after %d calls", first);
    for (int i = first; i < 20; i++) cr_assert_eq(got[i], 0, "call %d: %lld", i, (long long)got[i]);
    cr_assert_eq(dgc_order_step(o), 3);
    dgc_order_free(o);
}

Test(order, a_changed_order_is_said_and_learnt_again) {
    dgc_order *o = dgc_order_new();
    const uint64_t p[] = {10, 20};
    const int64_t want[] = {L, L, L, L, L, L, L, L, 0, 0};
    feed(o, p, 2, 10, want);
    cr_assert_eq(dgc_order_next(o, 30), DGC_ORDER_CHANGED); /* expected 10 */
    const uint64_t q[] = {10, 20, 30};
    int64_t got = L;
    int i = 0;
    for (; i < 20 && got == L; i++) got = dgc_order_next(o, q[i % 3]);
    cr_assert(got == 0 && i <= 9, "learnt again after %d calls (%lld)", i, (long long)got);
    cr_assert_eq(dgc_order_step(o), 3);
    cr_assert_eq(dgc_order_next(o, 99), L, "a second change is not said again");
    dgc_order_free(o);
}

Test(order, undo_takes_the_call_back) {
    dgc_order *o = dgc_order_new();
    const uint64_t p[] = {7, 7, 8};
    const int64_t want[] = {L, L, L, L, L, L, L, L, 0, 0};
    feed(o, p, 3, 10, want); /* calls 8 (count 8) and 9 (the first 7 after it) */
    dgc_order_undo(o);       /* call 9 failed on every rank */
    cr_assert_eq(dgc_order_next(o, 7), 0);
    cr_assert_eq(dgc_order_next(o, 7), 1);
    cr_assert_eq(dgc_order_next(o, 8), 0);
    dgc_order_free(o);
}

Test(order, no_step_within_the_limit_is_never_learnt) {
    dgc_order *o = dgc_order_new();
    int64_t last = 0;
    for (uint64_t i = 0; i < 2 * DGC_ORDER_MAX_STEP + 20; i++) last = dgc_order_next(o, i + 1); /* never repeats */
    cr_assert_eq(last, DGC_ORDER_TOO_LONG);
    cr_assert_eq(dgc_order_next(o, 1), DGC_ORDER_TOO_LONG, "for good");
    dgc_order_free(o);
}
