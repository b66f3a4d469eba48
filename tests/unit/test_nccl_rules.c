/* The NCCL front end's decisions (shim/nccl/rules.c), without a GPU: which
 * ncclAllReduce calls are compressed, forwarded or held back in a group,
 * the rounds a batch of held-back calls runs in, the collectives each call
 * issues, the ranks' votes and the configuration check's verdict. The
 * expectations are written from docs/nccl.md and docs/design.md (invariants
 * 1 and 5), not from the code. */
#include <criterion/criterion.h>

#include "nccl/rules.h"

static const dgc_nccl_facts checked = {
    .candidate = 1, .known = 1, .check = DGC_CHECK_PASSED, .compressible = 1, .capturing = 0};

Test(nccl_route, a_checked_compressible_call_runs_now_or_is_deferred_in_a_group) {
    dgc_nccl_facts f = checked;
    cr_expect_eq(dgc_nccl_route_of(&f), DGC_ROUTE_RUN);
    f.in_group = 1;
    cr_expect_eq(dgc_nccl_route_of(&f), DGC_ROUTE_DEFER);
    f.group_holds = 1; /* an earlier compressed call on the same communicator: this one is recorded too */
    cr_expect_eq(dgc_nccl_route_of(&f), DGC_ROUTE_DEFER);
}

Test(nccl_route, other_calls_pass_at_once_unless_their_communicator_has_a_held_call) {
    dgc_nccl_facts f = {.candidate = 0, .capturing = -1}; /* an int sum, a max, a double: nothing else asked */
    cr_expect_eq(dgc_nccl_route_of(&f), DGC_ROUTE_PASS);
    f.in_group = 1;
    cr_expect_eq(dgc_nccl_route_of(&f), DGC_ROUTE_PASS);
    f.group_holds = 1; /* keeps its place behind the held call */
    cr_expect_eq(dgc_nccl_route_of(&f), DGC_ROUTE_HOLD);
    f = checked;
    f.compressible = 0; /* under DGC_MIN_ELEMENTS */
    f.capturing = -1;
    cr_expect_eq(dgc_nccl_route_of(&f), DGC_ROUTE_PASS, "no CUDA call for a small call on a checked communicator");
    f.in_group = f.group_holds = 1;
    cr_expect_eq(dgc_nccl_route_of(&f), DGC_ROUTE_HOLD);
    f = checked;
    f.count_dense = 1; /* the ranks voted to sum this count densely */
    cr_expect_eq(dgc_nccl_route_of(&f), DGC_ROUTE_PASS_DENSE);
    f.in_group = f.group_holds = 1;
    cr_expect_eq(dgc_nccl_route_of(&f), DGC_ROUTE_HOLD_DENSE);
}

Test(nccl_route, a_failed_check_fails_every_candidate_and_nothing_else) {
    dgc_nccl_facts f = {.candidate = 1, .known = 1, .check = DGC_CHECK_FAILED, .capturing = -1};
    cr_expect_eq(dgc_nccl_route_of(&f), DGC_ROUTE_FAIL);
    f.in_group = 1;
    cr_expect_eq(dgc_nccl_route_of(&f), DGC_ROUTE_FAIL);
    f.candidate = 0;
    cr_expect_eq(dgc_nccl_route_of(&f), DGC_ROUTE_PASS);
}

Test(nccl_route, a_new_communicator_asks_capture_then_a_record_then_its_check) {
    dgc_nccl_facts f = {.candidate = 1, .compressible = 1, .capturing = -1};
    cr_expect_eq(dgc_nccl_route_of(&f), DGC_ROUTE_ASK_CAPTURE);
    f.capturing = 1;
    cr_expect_eq(dgc_nccl_route_of(&f), DGC_ROUTE_PASS_CAPTURED, "a captured call makes no record");
    f.capturing = 0;
    cr_expect_eq(dgc_nccl_route_of(&f), DGC_ROUTE_OPEN);
    f.known = 1;
    f.check = DGC_CHECK_PENDING;
    cr_expect_eq(dgc_nccl_route_of(&f), DGC_ROUTE_CHECK_NOW);
    f.in_group = 1;
    cr_expect_eq(dgc_nccl_route_of(&f), DGC_ROUTE_CHECK_LATER, "a group waits for nothing");
}

/* Resolves a new communicator's first call as the front end does
 * (nccl/allreduce.c): learning what the record says before each question,
 * and the fact each answer asks for from the world (capture, the check's
 * verdict), until a final answer. Returns it; *asked counts the questions. */
typedef struct {
    int capturing, verdict, compressible;
} world;

static dgc_nccl_route resolve(dgc_nccl_facts f, world w, int *asked) {
    *asked = 0;
    for (int i = 0; i < 8; i++) {
        if (f.known) f.compressible = w.compressible, f.count_dense = 0; /* a new record: no count summed densely */
        dgc_nccl_route r = dgc_nccl_route_of(&f);
        switch (r) {
        case DGC_ROUTE_ASK_CAPTURE: f.capturing = w.capturing; break;
        case DGC_ROUTE_OPEN: f.known = 1, f.check = DGC_CHECK_PENDING; break;
        case DGC_ROUTE_CHECK_NOW: f.check = w.verdict; break;
        default: return r;
        }
        ++*asked;
    }
    cr_assert_fail("the route asks for ever");
    return DGC_ROUTE_FAIL;
}

/* Every combination of facts, each answer checked against the rules it
 * must keep. */
Test(nccl_route, every_combination_keeps_the_rules) {
    static const int checks[] = {DGC_CHECK_PENDING, DGC_CHECK_PASSED, DGC_CHECK_FAILED};
    int n = 0;
    for (int bits = 0; bits < 64; bits++)
        for (int ci = 0; ci < 3; ci++)
            for (int cap = -1; cap <= 1; cap++) {
                dgc_nccl_facts f = {.candidate = bits & 1, .known = (bits >> 1) & 1, .check = checks[ci],
                                    .compressible = (bits >> 2) & 1, .count_dense = (bits >> 3) & 1,
                                    .in_group = (bits >> 4) & 1, .group_holds = (bits >> 5) & 1, .capturing = cap};
                if (!f.in_group && f.group_holds) continue; /* holds are the group's */
                if (!f.known && (ci != 0 || f.compressible || f.count_dense)) continue; /* no record: nothing known */
                n++;
                dgc_nccl_route r = dgc_nccl_route_of(&f);
                /* invariant 5: inside a group nothing is launched and no host wait runs */
                if (f.in_group) cr_expect(r != DGC_ROUTE_RUN && r != DGC_ROUTE_CHECK_NOW, "case %d", n);
                else cr_expect(r != DGC_ROUTE_DEFER && r != DGC_ROUTE_HOLD && r != DGC_ROUTE_HOLD_DENSE &&
                                   r != DGC_ROUTE_CHECK_LATER, "case %d", n);
                /* questions only for what is not known yet */
                if (r == DGC_ROUTE_ASK_CAPTURE) cr_expect_eq(f.capturing, -1, "case %d", n);
                if (r == DGC_ROUTE_OPEN) cr_expect(!f.known, "case %d", n);
                if (r == DGC_ROUTE_CHECK_NOW || r == DGC_ROUTE_CHECK_LATER)
                    cr_expect(f.known && f.check == DGC_CHECK_PENDING, "case %d", n);
                /* only a checked, compressible candidate, not captured, is compressed */
                if (r == DGC_ROUTE_RUN || r == DGC_ROUTE_DEFER)
                    cr_expect(f.candidate && f.known && f.check == DGC_CHECK_PASSED && f.compressible &&
                                  !f.count_dense && f.capturing == 0,
                              "case %d", n);
                /* other calls never ask, never fail, and pass unless held */
                if (!f.candidate) cr_expect(r == DGC_ROUTE_PASS || r == DGC_ROUTE_HOLD, "case %d", n);
                if (r == DGC_ROUTE_HOLD || r == DGC_ROUTE_HOLD_DENSE) cr_expect(f.group_holds, "case %d", n);
                if (r == DGC_ROUTE_FAIL) cr_expect(f.known && f.check == DGC_CHECK_FAILED, "case %d", n);
                /* a checked communicator's pass-through needs no CUDA call */
                if (f.known && f.check == DGC_CHECK_PASSED && (!f.compressible || f.count_dense))
                    cr_expect(r != DGC_ROUTE_ASK_CAPTURE, "case %d", n);
            }
    cr_expect_gt(n, 100);
}

Test(nccl_route, resolving_ends_in_a_final_answer_after_at_most_three_questions) {
    for (int bits = 0; bits < 8; bits++)
        for (int verdict = -1; verdict <= 1; verdict += 2) {
            world w = {.capturing = bits & 1, .verdict = verdict, .compressible = (bits >> 1) & 1};
            dgc_nccl_facts f = {.candidate = 1, .in_group = (bits >> 2) & 1, .capturing = -1};
            int asked;
            dgc_nccl_route r = resolve(f, w, &asked);
            cr_expect_leq(asked, 3);
            if (w.capturing) cr_expect_eq(r, DGC_ROUTE_PASS_CAPTURED);
            else if (f.in_group) cr_expect_eq(r, DGC_ROUTE_CHECK_LATER, "a new communicator in a group is checked after it");
            else if (verdict == DGC_CHECK_FAILED) cr_expect_eq(r, DGC_ROUTE_FAIL);
            else if (!w.compressible) cr_expect_eq(r, DGC_ROUTE_PASS);
            else cr_expect_eq(r, DGC_ROUTE_RUN);
        }
}

/* A group as PyTorch DDP issues it on two communicators: the routes of its
 * calls in order, with the group's holds as the front end keeps them (a
 * communicator holds once one of its calls is deferred or held). */
Test(nccl_route, a_group_defers_compressed_calls_and_holds_the_later_ones_behind_them) {
    struct { int comm, candidate, compressible; dgc_nccl_route want; } calls[] = {
        {0, 1, 0, DGC_ROUTE_PASS},  /* small, before anything is held on comm 0: into NCCL's group at once */
        {0, 1, 1, DGC_ROUTE_DEFER}, /* compressed after the group */
        {0, 1, 0, DGC_ROUTE_HOLD},  /* small, behind it */
        {1, 0, 0, DGC_ROUTE_PASS},  /* another communicator's int sum: nothing held there */
        {1, 1, 1, DGC_ROUTE_DEFER},
        {0, 0, 0, DGC_ROUTE_HOLD},  /* an int sum on comm 0, still in its place */
        {1, 1, 1, DGC_ROUTE_DEFER},
    };
    int holds[2] = {0, 0};
    for (size_t i = 0; i < sizeof calls / sizeof *calls; i++) {
        dgc_nccl_facts f = checked;
        f.candidate = calls[i].candidate;
        f.compressible = calls[i].compressible;
        f.in_group = 1;
        f.group_holds = holds[calls[i].comm];
        dgc_nccl_route r = dgc_nccl_route_of(&f);
        cr_expect_eq(r, calls[i].want, "call %zu: route %d, expected %d", i, (int)r, (int)calls[i].want);
        if (r == DGC_ROUTE_DEFER || r == DGC_ROUTE_HOLD || r == DGC_ROUTE_HOLD_DENSE) holds[calls[i].comm] = 1;
        /* the same calls made one at a time */
        f.in_group = f.group_holds = 0;
        r = dgc_nccl_route_of(&f);
        cr_expect_eq(r, calls[i].want == DGC_ROUTE_DEFER ? DGC_ROUTE_RUN : DGC_ROUTE_PASS, "call %zu alone", i);
    }
}

Test(nccl_rounds, each_communicators_calls_in_the_order_made) {
    int a, b, c;
    const void *comms[] = {&a, &b, &a, &a, &b, &c};
    int round[6];
    cr_expect_eq(dgc_nccl_rounds(comms, 6, round), 3);
    const int want[] = {0, 0, 1, 2, 1, 0};
    for (int i = 0; i < 6; i++) cr_expect_eq(round[i], want[i], "call %d", i);
    cr_expect_eq(dgc_nccl_rounds(comms, 0, round), 0);
    const void *one[] = {&a, &a, &a, &a};
    cr_expect_eq(dgc_nccl_rounds(one, 4, round), 4);
    for (int i = 0; i < 4; i++) cr_expect_eq(round[i], i);
}

Test(nccl_collectives, what_each_call_issues_in_each_phase) {
    /* phase 0, phase 1 */
    cr_expect_eq(dgc_nccl_collectives(DGC_NCCL_DEAD, 1, 10, 1, 0), 0);
    cr_expect_eq(dgc_nccl_collectives(DGC_NCCL_DEAD, 0, 0, 0, 0), 0);
    cr_expect_eq(dgc_nccl_collectives(DGC_NCCL_PASS, 1, 10, 1, 0), 1, "the forwarded all-reduce");
    cr_expect_eq(dgc_nccl_collectives(DGC_NCCL_PASS, 1, 10, 1, 1), 0);
    for (int part = DGC_NCCL_STATE; part <= DGC_NCCL_FAILED; part++) {
        cr_expect_eq(dgc_nccl_collectives(part, 0, 0, 0, 0), 1, "the payloads' all-gather");
        cr_expect_eq(dgc_nccl_collectives(part, 0, 0, 0, 1), 0);
        /* dense: headers' all-gather, then reduce-scatter and all-gather of blocks and spare */
        cr_expect_eq(dgc_nccl_collectives(part, 1, 10, 3, 0), 3);
        cr_expect_eq(dgc_nccl_collectives(part, 1, 10, 3, 1), 2);
        cr_expect_eq(dgc_nccl_collectives(part, 1, 10, 0, 0), 2);
        cr_expect_eq(dgc_nccl_collectives(part, 1, 10, 0, 1), 1);
        cr_expect_eq(dgc_nccl_collectives(part, 1, 0, 3, 0), 2, "fewer elements than ranks: the spare alone");
        cr_expect_eq(dgc_nccl_collectives(part, 1, 0, 3, 1), 1);
    }
}

Test(nccl_vote, only_a_counts_first_call_on_several_ranks_votes) {
    cr_expect(dgc_nccl_votes(DGC_NCCL_STATE, 0, 2));
    cr_expect(dgc_nccl_votes(DGC_NCCL_FAILED, 0, 8), "a rank without state votes too");
    cr_expect(!dgc_nccl_votes(DGC_NCCL_STATE, 1, 2), "later calls do not");
    cr_expect(!dgc_nccl_votes(DGC_NCCL_STATE, 0, 1), "one rank decides alone");
    cr_expect(!dgc_nccl_votes(DGC_NCCL_PASS, 0, 2));
    cr_expect(!dgc_nccl_votes(DGC_NCCL_DEAD, 0, 2));
    const unsigned char none[4] = {0, 0, 0, 0}, one[4] = {0, 0, 1, 0};
    cr_expect(!dgc_nccl_vote_dense(none, 4));
    cr_expect(dgc_nccl_vote_dense(one, 4), "one rank without state: every rank sums the count densely");
    cr_expect(!dgc_nccl_vote_dense(one, 2), "only the communicator's ranks count");
}

Test(nccl_verdict, the_gathered_words_pass_only_when_every_rank_agrees) {
    enum { W = 4, PARSE = 3 };
    uint64_t all[3 * W] = {7, 8, 9, 0, 7, 8, 9, 0, 7, 8, 9, 0};
    int rank, word;
    cr_expect_eq(dgc_nccl_verdict(all, 3, W, PARSE, &rank, &word), DGC_CHECK_PASSED);
    cr_expect_eq(rank, -1);
    cr_expect_eq(word, -1);
    all[2 * W + 1] = 6; /* rank 2's second option differs */
    cr_expect_eq(dgc_nccl_verdict(all, 3, W, PARSE, &rank, &word), DGC_CHECK_FAILED);
    cr_expect_eq(word, 1);
    cr_expect_eq(rank, -1);
    cr_expect_eq(dgc_nccl_verdict(all, 2, W, PARSE, &rank, &word), DGC_CHECK_PASSED, "rank 2 is not in a 2-rank check");
    all[1 * W + PARSE] = 1; /* rank 1 could not parse its environment: named first */
    cr_expect_eq(dgc_nccl_verdict(all, 3, W, PARSE, &rank, &word), DGC_CHECK_FAILED);
    cr_expect_eq(rank, 1);
    cr_expect_eq(word, -1);
    cr_expect_eq(dgc_nccl_verdict(all, 1, W, PARSE, &rank, &word), DGC_CHECK_PASSED, "one rank agrees with itself");
}

/* The words after the parse flag are each rank's own (its node): never
 * compared. */
Test(nccl_verdict, a_ranks_own_words_are_not_compared) {
    enum { W = 3, PARSE = 1 };
    uint64_t all[2 * W] = {7, 0, 100, 7, 0, 200};
    int rank, word;
    cr_expect_eq(dgc_nccl_verdict(all, 2, W, PARSE, &rank, &word), DGC_CHECK_PASSED);
    all[W] = 8;
    cr_expect_eq(dgc_nccl_verdict(all, 2, W, PARSE, &rank, &word), DGC_CHECK_FAILED);
    cr_expect_eq(word, 0);
}

/* The node layout, by the MPI path's rule (docs/nccl.md, "Node layout"):
 * nodes in the order of their lowest rank, local ranks in rank order,
 * whether or not a node's ranks are consecutive. */
static const char *layout_of(const uint64_t *ids, int n, int rank, dgc_layout *l, int *index) {
    return dgc_nccl_layout_of(ids, n, 1, rank, l, index);
}

Test(nccl_layout, two_equal_nodes_in_rank_order_or_interleaved) {
    const uint64_t blocks[4] = {5, 5, 9, 9}, mixed[6] = {9, 5, 9, 3, 5, 3};
    dgc_layout l;
    int index;
    cr_expect_null(layout_of(blocks, 4, 2, &l, &index));
    cr_expect(l.node && l.nodes == 2 && l.node_size == 2 && l.local == 0 && index == 1);
    cr_expect_null(layout_of(blocks, 4, 1, &l, &index));
    cr_expect(l.local == 1 && index == 0);
    /* nodes 9 (ranks 0, 2), 5 (1, 4), 3 (3, 5): rank 4 is node 1's second */
    cr_expect_null(layout_of(mixed, 6, 4, &l, &index));
    cr_expect(l.nodes == 3 && l.node_size == 2 && l.local == 1 && index == 1);
    cr_expect_null(layout_of(mixed, 6, 3, &l, &index));
    cr_expect(l.local == 0 && index == 2);
}

Test(nccl_layout, stays_flat_with_the_reason) {
    const uint64_t one[4] = {1, 1, 1, 1}, each[3] = {1, 2, 3}, uneven[5] = {1, 1, 1, 2, 2};
    dgc_layout l;
    int index;
    cr_expect_str_eq(layout_of(one, 4, 3, &l, &index), "all its ranks are on one node");
    cr_expect(!l.node && l.nodes == 4 && l.node_size == 1 && index == 3);
    cr_expect_str_eq(layout_of(each, 3, 0, &l, &index), "one rank per node");
    cr_expect_str_eq(layout_of(uneven, 5, 4, &l, &index), "its nodes have different numbers of ranks");
    cr_expect_str_eq(layout_of(one, 1, 0, &l, &index), "one rank per node");
}

/* The stride skips the other words of the check's rows. */
Test(nccl_layout, reads_ids_at_the_stride) {
    const uint64_t rows[4 * 3] = {0, 0, 7, 1, 1, 7, 0, 0, 8, 1, 1, 8};
    dgc_layout l;
    int index;
    cr_expect_null(dgc_nccl_layout_of(rows + 2, 4, 3, 3, &l, &index));
    cr_expect(l.nodes == 2 && l.node_size == 2 && l.local == 1 && index == 1);
}

/* DGC_TRANSPORT=reduce is the MPI path's: the NCCL path plans as auto. */
/* docs/nccl.md, "GPU memory": a move device memory refused is not tried on
 * every call; it is tried for a later warm-up stage's smaller k, or after
 * DGC_NCCL_MOVE_RETRY_CALLS calls. */
Test(nccl_move, a_refused_move_waits_for_a_smaller_k_or_many_calls) {
    cr_expect(dgc_nccl_move_due(0, 0, 100, 5), "nothing refused: tried");
    cr_expect_not(dgc_nccl_move_due(100, 40, 100, 41), "the same k on the next call");
    cr_expect_not(dgc_nccl_move_due(100, 40, 100, 40 + DGC_NCCL_MOVE_RETRY_CALLS - 1), "the same k, not long after");
    cr_expect(dgc_nccl_move_due(100, 40, 100, 40 + DGC_NCCL_MOVE_RETRY_CALLS), "the same k, long after");
    cr_expect(dgc_nccl_move_due(100, 40, 25, 41), "a later stage's smaller k");
    cr_expect_not(dgc_nccl_move_due(100, 40, 400, 41), "a larger k");
}

Test(nccl_rules, reduce_plans_as_auto) {
    dgc_config cfg, spare;
    dgc_config_defaults(&cfg);
    cr_assert_eq(dgc_nccl_planning_config(&cfg, &spare), &cfg, "auto: the configuration itself");
    cfg.transport = DGC_TRANSPORT_REDUCE;
    const dgc_config *p = dgc_nccl_planning_config(&cfg, &spare);
    cr_assert_eq(p, &spare);
    cr_assert_eq(p->transport, DGC_TRANSPORT_AUTO);
    cr_assert_eq(p->sparsity, cfg.sparsity);
    cr_assert_eq(cfg.transport, DGC_TRANSPORT_REDUCE, "the installed one is left as it is");
}
