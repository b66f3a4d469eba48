/* MPI_Allreduce interposition. The pass-through test is a handful of
 * comparisons against the installed configuration: no lock, allocation,
 * system call or environment read, since frameworks issue many tiny
 * all-reduces. Everything else is the compressed path. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dgcshim/config.h"
#include "dgcshim/policy.h"
#include "dgcshim/wire.h"
#include "dgcshim/wire_compact.h"
#include "core/log.h"
#include "core/shards.h"
#include "internal.h"
#include "core/order.h"
#include "core/pages.h"

/* 4-byte IEEE floats under any of their names: C's, and Fortran's REAL and
 * REAL*4 (REAL only where it is 4 bytes: not with -fdefault-real-8). The
 * size is a property of the type, the same on every rank. */
static int is_float(MPI_Datatype dt) {
    if (dt == MPI_FLOAT) return 1;
    int size = 0;
    if (dt != MPI_REAL && dt != MPI_REAL4) return 0;
    return PMPI_Type_size(dt, &size) == MPI_SUCCESS && size == 4;
}

/* Why a call is no candidate for compression, or -1 when it is one: the
 * first test it fails, in the order the statistics name them. */
static int refusal(const dgc_config *cfg, MPI_Datatype dt, MPI_Op op, MPI_Count count) {
    if (!cfg->enable) return DGC_PASS_DISABLED;
    if (op != MPI_SUM) return DGC_PASS_OP;
    if (!is_float(dt)) return DGC_PASS_TYPE;
    if (count < 0 || (uint64_t)count < cfg->min_elements) return DGC_PASS_SMALL;
    return -1;
}

/* Intra-communicator size, or 0 for what is passed through: inter-
 * communicators (whose all-reduce semantics differ) and MPI_COMM_NULL, which
 * MPI_Allreduce itself then reports as its own error. */
static int intra_size(MPI_Comm comm) {
    int inter = 0, size = 0;
    if (comm == MPI_COMM_NULL) return 0;
    if (PMPI_Comm_test_inter(comm, &inter) != MPI_SUCCESS || inter) return 0;
    PMPI_Comm_size(comm, &size);
    return size;
}

/* Where a call reads its gradient and builds its sum. The engine needs
 * float-aligned memory, and whether to compress must not depend on an
 * address (ranks would decide differently), so a misaligned buffer is
 * handled, not passed through: copied into the output when that is aligned,
 * else into a bounce buffer of this call's own. */
typedef struct {
    const float *g;
    float *work;
    float *bounce;
    void *out;
    size_t bytes;
} io_view;

static int aligned(const void *p) { return (uintptr_t)p % _Alignof(float) == 0; }

static int view_open(io_view *v, const void *sb, void *rb, uint64_t n) {
    int inplace = sb == MPI_IN_PLACE;
    const void *src = inplace ? rb : sb;
    *v = (io_view){.out = rb, .bytes = (size_t)n * sizeof(float)};
    if (aligned(rb)) {
        v->work = rb;
        if (!inplace && !aligned(sb)) memcpy(rb, sb, v->bytes);
        v->g = inplace || !aligned(sb) ? rb : sb;
        return 0;
    }
    v->bounce = dgc_pages_alloc(v->bytes);
    if (!v->bounce) return -1;
    v->work = v->bounce;
    if (aligned(src)) {
        v->g = src;
    } else {
        memcpy(v->bounce, src, v->bytes);
        v->g = v->bounce;
    }
    return 0;
}

static void view_close(io_view *v, int ok) {
    if (!v->bounce) return;
    if (ok) memcpy(v->out, v->bounce, v->bytes);
    dgc_pages_free(v->bounce, v->bytes);
}

/* Fresh buffers every call (dgc_registry_growth_first): said once. */
static void warn_growth(dgc_comm *c, uint64_t count) {
    if (!dgc_registry_growth_first(c)) return;
    DGC_WARN("%llu buffer states live on one communicator (%llu created in %llu calls, the latest for %llu "
             "elements): the program all-reduces fresh buffers (a new send or output address each call), so "
             "residuals do not carry over between steps. All-reduce each gradient in place, or from and into buffers that persist "
             "(TensorFlow allocates new gradient tensors every step: under Horovod keep its tensor fusion and pass "
             "groups=1 to hvd.DistributedOptimizer; see docs/frameworks.md); states unused for "
             "DGC_STATE_IDLE_CALLS calls are freed",
             (unsigned long long)c->live, (unsigned long long)c->created, (unsigned long long)c->calls,
             (unsigned long long)count);
}

/* What a call's state is found by (DGC_BUFFER_KEY): its send and output
 * addresses, or its place in the communicator's step. */
typedef struct {
    const void *send, *buf;
    int by_order;
    int dense; /* DGC_BUFFER_KEY=auto: its addresses keep moving (moving_dense) */
} state_key;

/* One count at ever other addresses, by address: a flat gradient copied
 * into a fresh array every step then trains with its residual split
 * between states, while several persistent buffers of one size look just
 * the same. Said once per communicator, at the default log level. Returns
 * 1 when the call is to be summed densely: under DGC_BUFFER_KEY=auto, every
 * call on the communicator from then on (exact, where compressing could
 * diverge). A rank's own decision, from its addresses: the exchange makes
 * every rank sum such a call densely (DGC_PART_DENSE), as for a budget. */
static int moving_dense(dgc_comm *c, uint64_t count, const state_key *key, const dgc_config *cfg) {
    if (key->by_order) return 0;
    if (dgc_registry_note_moves(c, count, key->send, key->buf)) {
        if (cfg->buffer_key == DGC_KEY_AUTO)
            DGC_WARN("every compressed all-reduce on this communicator is of %llu elements, and most calls come at "
                     "another address than the call before: one buffer made afresh each step (torch.cat(...).numpy() "
                     "or np.concatenate every step), or several persistent buffers of one size, which addresses "
                     "cannot tell apart. Its calls are summed densely from now on (exact, uncompressed). Set "
                     "DGC_BUFFER_KEY=order for a buffer made afresh each step (states follow the order of the "
                     "calls), or DGC_BUFFER_KEY=address for distinct persistent buffers (docs/mpi.md). Said once",
                     (unsigned long long)count);
        else
            DGC_WARN("every compressed all-reduce on this communicator is of %llu elements, and most calls come at "
                     "another address than the call before: if that is one buffer made afresh each step, its "
                     "residual is split between states and training suffers: set DGC_BUFFER_KEY=order (states follow "
                     "the order of the calls; docs/mpi.md). If these are distinct buffers that persist, all is well. "
                     "Said once",
                     (unsigned long long)count);
    }
    return cfg->buffer_key == DGC_KEY_AUTO && c->moving_warned;
}

/* A buffer all-reduced with this many distinct counts is taken for a fusion
 * buffer: two can be a framework's first step (DDP's all-parameter bucket). */
#define FUSION_COUNTS 3

/* One buffer with ever new counts: a fusion buffer packing different tensors
 * each step (Horovod's tensor fusion): said once per communicator. */
static void warn_fusion(dgc_comm *c, const void *key, const void *rb, uint64_t count) {
    if (c->fusion_warned) return;
    uint64_t counts = dgc_registry_counts_at(c, key, rb);
    if (counts < FUSION_COUNTS) return;
    c->fusion_warned = 1;
    DGC_WARN("the buffer at %p has been all-reduced with %llu different element counts (the latest %llu): a "
             "fusion buffer that packs different tensors from step to step, so the residual kept at an offset "
             "belongs to another tensor the next step. With Horovod pass groups=1 to hvd.DistributedOptimizer "
             "(all gradients in one fused buffer of a fixed layout), or set HOROVOD_FUSION_THRESHOLD=0 (each "
             "gradient in place on its own; PyTorch); see docs/frameworks.md",
             rb, (unsigned long long)counts, (unsigned long long)count);
}

/* What a new state for the call planned will hold, each block as the page
 * allocator rounds it (blocks of 2 MiB and more to whole huge pages): the
 * engine's state, this rank's plain payload, the wire buffer (its compact
 * payload and every rank's), with compensation the last step's, and the
 * reduce transport's scratch and bounds. The first call's k is the largest
 * (the warm-up only lowers it). */
static size_t state_estimate(const dgc_plan *plan, int nranks, const dgc_config *cfg) {
    const dgc_step_params *p = &plan->p;
    const int momentum = cfg->momentum > 0;
    const size_t ranks = (size_t)nranks;
    size_t est = sizeof(dgc_buffer) + dgc_state_footprint(p->n, momentum, p->k, p->sample_ratio) +
                 dgc_pages_footprint(dgc_wire_bytes(p->k)) + dgc_pages_footprint(plan->code.bytes * (ranks + 1));
    if (momentum && cfg->compensate) est += dgc_pages_footprint(plan->code.bytes * (ranks + 1));
    if (plan->transport == DGC_TRANSPORT_REDUCE)
        est += dgc_pages_footprint(dgc_mpi_reduce_scratch(&plan->regions, nranks, p->k)) +
               (ranks + 1) * sizeof(uint32_t);
    return est;
}

/* The buffer entry of this call, and how this rank takes part. */
static int find_state(dgc_comm *c, const state_key *key, const dgc_plan *plan, int nranks, const dgc_config *cfg,
                      dgc_buffer **b) {
    const dgc_step_params *p = &plan->p;
    *b = NULL;
    if (key->dense) return DGC_PART_DENSE;
    *b = dgc_registry_find(c, key->send, key->buf, p->n);
    dgc_registry_free_idle(c, cfg->state_idle_calls);
    if (*b) return DGC_PART_STATE;
    const int momentum = cfg->momentum > 0;
    const size_t est = state_estimate(plan, nranks, cfg);
    const size_t budget = dgc_config_state_budget(cfg, 0); /* auto: host memory is not the GPU's to share */
    dgc_create_result r = dgc_registry_create(c, key->send, key->buf, p->n, momentum, est, budget, b);
    /* States that missed a whole step first (buffers a program no longer
     * reduces), then the budget's verdict. */
    if (r == DGC_OVER_BUDGET && dgc_registry_free_stale(c, cfg->state_idle_calls))
        r = dgc_registry_create(c, key->send, key->buf, p->n, momentum, est, budget, b);
    if (r == DGC_OVER_BUDGET) {
        if (!c->budget_warned++)
            DGC_WARN("a new %llu-element buffer would pass DGC_MAX_STATE_MB=%llu: summed densely on every rank "
                 "(no state for it) while memory is short; said once per communicator",
                     (unsigned long long)p->n, (unsigned long long)(budget >> 20));
        return DGC_PART_DENSE;
    }
    if (r == DGC_NO_MEMORY) {
        DGC_ERROR("no memory for the state of a %llu-element buffer", (unsigned long long)p->n);
        return DGC_PART_FAILED;
    }
    warn_growth(c, p->n);
    if (!key->by_order) warn_fusion(c, key->send, key->buf, p->n); /* positions of different counts share keys */
    return DGC_PART_STATE;
}

/* DGC_BUFFER_KEY=order: the call's key from its place in c's step; -1 while
 * the step is not known (the call is summed densely: a decision from the
 * counts alone, the same on every rank). */
static int order_key(dgc_comm *c, uint64_t count, state_key *key) {
    const int64_t at = dgc_registry_order_next(c, count);
    if (at >= 0) {
        *key = (state_key){DGC_ORDER_SEND, DGC_ORDER_BUF(at), 1, 0};
        return 0;
    }
    dgc_registry_order_say(c, at, count, "a communicator");
    return -1;
}

/* DGC_BUFFER_KEY=auto: by address until the communicator's buffers show
 * that they are made afresh (core/places.h: one lands on memory another
 * place of the step had), then by place in the step, as under order. A
 * rank's own choice among its states: the call is compressed either way,
 * as on every other rank. */
static void auto_key(dgc_comm *c, uint64_t count, state_key *key) {
    int now = 0;
    const int64_t at = dgc_registry_auto_place(c, count, key->send, key->buf, sizeof(float), &now);
    if (now)
        DGC_INFO("a communicator's buffers are made afresh from step to step (one came where another of the step "
                 "had been): its buffer states follow each call's place in the step from now on, as under "
                 "DGC_BUFFER_KEY=order (said once per communicator)");
    if (at >= 0) *key = (state_key){DGC_ORDER_SEND, DGC_ORDER_BUF(at), 1, 0};
}

/* The node's first round, before any data moves: whether its ranks called
 * with one count, and whether each has the memory to take part. */
enum { ROUND_COUNT, ROUND_MINUS_COUNT, ROUND_FAILED, ROUND_WORDS };

/* Node layout, after the node's sum: 1 when the sum of some shard in the
 * node is not finite (some rank's gradient held Inf or NaN, or the sum
 * overflowed). Every rank of the node then sends a non-finite shard, so that
 * every cross exchange, and with it every rank of the job, skips the step
 * whole, as a flat call does: no shard's state changes while the output is
 * NaN. */
static int node_nonfinite(const dgc_mpi_node *x, int mine, float *sum, uint64_t len, int *rc) {
    int64_t bad = mine;
    *rc = dgc_mpi_node_agree(x, &bad, 1);
    if (bad && len) sum[0] = __builtin_nanf("");
    return bad != 0;
}

/* The node's last round: the worst result of its ranks' exchanges. Every
 * node holds one rank of every cross exchange, so every rank of the job
 * learns the same. */
static int node_outcome(const dgc_mpi_node *x, int rc) {
    int64_t worst = rc;
    if (dgc_mpi_node_agree(x, &worst, 1) != MPI_SUCCESS) return MPI_ERR_OTHER;
    return (int)worst;
}

static void count_node_call(dgc_buffer *b, const dgc_plan *plan) {
    if (b) dgc_stats_node_call(&b->stats, plan->card_bytes, plan->layout.nodes, plan->layout.node_size);
}

/* One call in node layout: the node sums each shard exactly, this rank's
 * shard goes through the flat exchange among the ranks of its local rank
 * (cross), and the node gathers the decoded shards. A rank that cannot take
 * part (memory) says so in the first round; its node then sends flagged
 * payloads in every cross exchange, so that the call fails on every rank. */
static int node_call(dgc_mpi_node *x, const state_key *key, const void *sb, void *rb, uint64_t count, MPI_Comm comm,
                     const dgc_config *cfg, dgc_pass_reason *why) {
    const dgc_layout *lay = dgc_mpi_node_layout(x);
    MPI_Comm cross;
    dgc_comm *cc = dgc_mpi_node_cross(x, &cross);
    uint64_t step = 0;
    if (!cc) return dgc_mpi_fail(comm, MPI_ERR_INTERN); /* its record dies with the parent's: cannot happen */
    if (dgc_shard_steps_take(cc, count, lay, &step)) {
        if (!cc->table_full_warned++)
            DGC_WARN("a communicator's node layout has all-reduced %d distinct shard sizes: new counts pass through",
                     DGC_COUNTS_PER_COMM);
        *why = DGC_PASS_TABLE;
        return DGC_MPI_PASS;
    }
    dgc_plan plan;
    if (dgc_policy_plan_node(cfg, count, DGC_SUM_F32, step, lay, &plan)) {
        dgc_shard_steps_undo(cc, count, lay);
        *why = DGC_PASS_LARGE;
        return DGC_MPI_PASS;
    }
    const uint64_t len = plan.shard_hi - plan.shard_lo;
    io_view v;
    dgc_buffer *b = NULL;
    int local = DGC_PART_FAILED;
    if (view_open(&v, sb, rb, count) == 0) {
        local = find_state(cc, key, &plan, lay->nodes, cfg, &b);
        if (dgc_mpi_node_reserve(x, len)) {
            DGC_ERROR("no memory for the node's %llu-element pieces", (unsigned long long)(len * (uint64_t)lay->node_size));
            local = DGC_PART_FAILED;
        }
    } else {
        DGC_ERROR("no memory for an aligned copy of a misaligned %llu-element buffer", (unsigned long long)count);
    }
    int64_t round[ROUND_WORDS] = {(int64_t)count, -(int64_t)count, local == DGC_PART_FAILED};
    int rc = dgc_mpi_node_agree(x, round, ROUND_WORDS);
    float *sum = NULL;
    int nonfinite = 0;
    if (rc == MPI_SUCCESS && round[ROUND_COUNT] != -round[ROUND_MINUS_COUNT]) {
        DGC_ERROR("the ranks of one node all-reduce different counts (up to %lld and down to %lld elements): the "
                  "call fails on every rank", (long long)round[ROUND_COUNT], (long long)-round[ROUND_MINUS_COUNT]);
    }
    if (rc == MPI_SUCCESS && (round[ROUND_FAILED] || round[ROUND_COUNT] != -round[ROUND_MINUS_COUNT]))
        local = DGC_PART_FAILED; /* no data moves in this node; its flagged payloads fail the call everywhere */
    else if (rc == MPI_SUCCESS)
        rc = dgc_mpi_node_sum(x, v.g, count, &sum, &nonfinite);
    if (rc == MPI_SUCCESS && local != DGC_PART_FAILED) node_nonfinite(x, nonfinite, sum, len, &rc);
    if (rc != MPI_SUCCESS) { /* MPI's own failure inside the node */
        view_close(&v, 0);
        dgc_shard_steps_undo(cc, count, lay);
        return dgc_mpi_fail(comm, rc);
    }
    float *out = v.work ? v.work + plan.shard_lo : NULL; /* NULL: this rank failed, and writes nothing */
    rc = dgc_mpi_exchange(cc, b, local, sum, out, &plan, cross, cfg);
    if (rc == MPI_SUCCESS) count_node_call(local == DGC_PART_STATE ? b : NULL, &plan);
    rc = node_outcome(x, rc);
    if (rc == MPI_SUCCESS) rc = dgc_mpi_node_spread(x, v.work, count);
    view_close(&v, rc == MPI_SUCCESS);
    if (rc != MPI_SUCCESS) {
        dgc_shard_steps_undo(cc, count, lay);
        return dgc_mpi_fail(comm, rc);
    }
    return MPI_SUCCESS;
}

/* One call in the flat layout: every rank compresses the whole buffer and
 * exchanges with every other. */
static int flat_call(dgc_comm *c, const state_key *key, const void *sb, void *rb, uint64_t count, uint64_t step,
                     MPI_Comm comm, const dgc_config *cfg, dgc_pass_reason *why) {
    dgc_plan plan;
    if (dgc_policy_plan(cfg, count, DGC_SUM_F32, step, c->nranks, &plan)) { /* too big for one all-gather */
        *why = DGC_PASS_LARGE;
        return DGC_MPI_PASS;
    }
    io_view v;
    dgc_buffer *b = NULL;
    int local = DGC_PART_FAILED;
    if (view_open(&v, sb, rb, count) == 0) local = find_state(c, key, &plan, c->nranks, cfg, &b);
    else DGC_ERROR("no memory for an aligned copy of a misaligned %llu-element buffer", (unsigned long long)count);
    int rc = dgc_mpi_exchange(c, b, local, v.g, v.work, &plan, comm, cfg);
    view_close(&v, rc == MPI_SUCCESS);
    return rc;
}

/* *why: the reason when it hands the call back (DGC_MPI_PASS). */
static int compressed(const void *sb, void *rb, uint64_t count, MPI_Comm comm, int nranks, const dgc_config *cfg,
                      dgc_pass_reason *why) {
    int rc;
    dgc_comm *c = dgc_mpi_comm(comm, nranks, cfg, &rc);
    if (!c) return dgc_mpi_fail(comm, rc);
    state_key key = {sb == MPI_IN_PLACE ? NULL : sb, rb, 0, 0};
    if (cfg->buffer_key == DGC_KEY_ORDER && order_key(c, count, &key)) {
        *why = DGC_PASS_ORDER;
        return DGC_MPI_PASS;
    }
    if (cfg->buffer_key == DGC_KEY_AUTO) auto_key(c, count, &key);
    uint64_t step;
    if (dgc_registry_next_step(c, count, &step)) {
        if (!c->table_full_warned++)
            DGC_WARN("a communicator has all-reduced %d distinct float counts: new counts pass through",
                     DGC_COUNTS_PER_COMM);
        *why = DGC_PASS_TABLE;
        return DGC_MPI_PASS;
    }
    key.dense = moving_dense(c, count, &key, cfg);
    dgc_mpi_node *x = dgc_mpi_node_of(c);
    if (x && dgc_policy_node_call(dgc_mpi_node_layout(x), count)) rc = node_call(x, &key, sb, rb, count, comm, cfg, why);
    else rc = flat_call(c, &key, sb, rb, count, step, comm, cfg, why);
    /* A failed call changed no state, and it fails on every rank (ranks whose
     * calls disagreed, different counts, fail alike): each gives its own
     * step back, so that the counters meet again and the next well-formed
     * call works, instead of failing for ever on steps taken apart. */
    if (rc != MPI_SUCCESS && rc != DGC_MPI_PASS) {
        dgc_registry_undo_step(c, count);
        if (cfg->buffer_key != DGC_KEY_ADDRESS) dgc_registry_order_undo(c); /* order and auto learn from every call */
    }
    return rc;
}

/* A sum as large as a gradient's, in a type the shim does not compress
 * (numpy's default float64, above all): said once per process, since the
 * job then runs dense with nothing else to show it. Doubles are not
 * compressed through an fp32 state on purpose: a program that sums in
 * double chose the precision, and not every large sum is a gradient. */
static void warn_type(const dgc_config *cfg, int refused, MPI_Datatype dt, MPI_Count count) {
    if (refused != DGC_PASS_TYPE || count < 0 || (uint64_t)count < cfg->min_elements) return;
    const int said = DGC_FLAG_TYPE_PASSTHROUGH_SAID;
    if (dgc_registry_flag(said) || !dgc_registry_claim(said)) return; /* a load first: no write on every call */
    char name[MPI_MAX_OBJECT_NAME] = "";
    int len = 0;
    if (PMPI_Type_get_name(dt, name, &len) != MPI_SUCCESS || len == 0) snprintf(name, sizeof name, "a derived type");
    DGC_WARN("a %lld-element sum of %s passes through uncompressed: the shim compresses sums of 4-byte floats only "
             "(MPI_FLOAT, MPI_REAL4). Send gradients as float32 (numpy: .astype(np.float32); PyTorch: float32 "
             "tensors); said once, STATS counts such calls under \"type\"",
             (long long)count, name);
}

int dgc_mpi_try_compressed(const void *sb, void *rb, MPI_Count count, MPI_Datatype dt, MPI_Op op, MPI_Comm comm) {
    const dgc_config *cfg = dgc_config_current();
    const int refused = refusal(cfg, dt, op, count);
    dgc_pass_reason why = (dgc_pass_reason)refused;
    if (refused < 0) {
        const int n = intra_size(comm);
        if (dgc_policy_compressible(cfg, (uint64_t)count, n)) {
            int rc = compressed(sb, rb, (uint64_t)count, comm, n, cfg, &why);
            if (rc == MPI_SUCCESS) dgc_registry_tally_add(DGC_TALLY_MPI_COMPRESSED);
            if (rc != DGC_MPI_PASS) return rc;
        } else { /* what dgc_policy_compressible adds to refusal's tests */
            why = n <= 0 || (uint64_t)n < cfg->min_ranks ? DGC_PASS_RANKS : DGC_PASS_LARGE;
        }
    }
    warn_type(cfg, refused, dt, count);
    /* Every call that goes on to PMPI_Allreduce is counted, also the ones
     * compressed() hands back (a communicator's count table full, a payload
     * too large for one all-gather); without statistics only its reason,
     * for the exit line when nothing was compressed (mpi/comm.c). */
    if (dgc_config_counts(cfg)) {
        int size = 0;
        if (PMPI_Type_size(dt, &size) != MPI_SUCCESS || size < 0) size = 0;
        dgc_registry_count_passthrough((uint64_t)count * (uint64_t)size, why);
    } else {
        dgc_registry_note_pass_reason(why);
    }
    return DGC_MPI_PASS;
}

DGC_MPI_EXPORT int MPI_Allreduce(const void *sb, void *rb, int count, MPI_Datatype dt, MPI_Op op, MPI_Comm comm) {
    int rc = dgc_mpi_try_compressed(sb, rb, count, dt, op, comm);
    return rc != DGC_MPI_PASS ? rc : PMPI_Allreduce(sb, rb, count, dt, op, comm);
}

#if MPI_VERSION >= 4
DGC_MPI_EXPORT int MPI_Allreduce_c(const void *sb, void *rb, MPI_Count count, MPI_Datatype dt, MPI_Op op, MPI_Comm comm) {
    int rc = dgc_mpi_try_compressed(sb, rb, count, dt, op, comm);
    return rc != DGC_MPI_PASS ? rc : PMPI_Allreduce_c(sb, rb, count, dt, op, comm);
}
#endif
