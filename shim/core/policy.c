#include "dgcshim/policy.h"

#include <float.h>
#include <limits.h>
#include <math.h>
#include <string.h>

#include "dgcshim/sum_rules.h"
#include "dgcshim/wire.h"
#include "dgcshim/wire_compact.h"

double dgc_density_at(double sparsity, uint64_t warmup_steps, uint64_t step) {
    double target = 1.0 - sparsity;
    if (step >= warmup_steps) return target;
    int stages = 0;
    for (double d = 0.25; d > target; d *= 0.25) stages++;
    if (stages == 0) return target;
    uint64_t stage = step * (uint64_t)stages / warmup_steps;
    double d = 0.25;
    for (uint64_t i = 0; i < stage; i++) d *= 0.25;
    return d > target ? d : target;
}

uint64_t dgc_k_for(uint64_t n, double density) {
    /* 1 - 0.999 is 0.0010000000000000009 in double: without the nudge, ceil
     * would turn that rounding into an extra slot (1001 for n = 10^6). */
    double x = density * (double)n;
    double k = ceil(x * (1.0 - 1e-12));
    if (k < 1) return n ? 1 : 0;
    return k > (double)n ? n : (uint64_t)k;
}

int dgc_policy_compressible(const dgc_config *cfg, uint64_t count, int nranks) {
    return cfg->enable && count >= cfg->min_elements && count <= DGC_MAX_ELEMENTS &&
           (uint64_t)nranks >= cfg->min_ranks;
}

/* fp32: the largest L on an 11-bit grid whose sum over N ranks, rounded at
 * every step (unit roundoff 2^-24), stays within FLT_MAX: N L (1 +
 * 2^-24)^(N-1) <= N L / (1 - (N-1) 2^-24) <= FLT_MAX. On the grid of the
 * 16-bit wire values (11 significant bits), so that their rounding never
 * lifts a clamped value past it. Only values near 1e38 meet it: the finite
 * gradients a saturated residual holds (update_rules.h). */
static uint32_t f32_limit_bits(int nranks) {
    const double N = nranks > 1 ? (double)nranks : 1.0;
    const double x = (double)FLT_MAX * (1.0 - (N - 1.0) * 0x1p-24) / N;
    float f = (float)x;
    if ((double)f > x) f = nextafterf(f, 0.0f);
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return b & 0xffffe000u; /* down to 11 significant bits */
}

uint32_t dgc_policy_value_limit_bits(unsigned type, int nranks, double compensated_m) {
    const uint32_t limit = type == DGC_SUM_F32 ? f32_limit_bits(nranks) : dgc_sum_limit_bits(type, nranks);
    if (!(compensated_m > 0.0)) return limit;
    float l, f;
    memcpy(&l, &limit, sizeof l);
    const double x = (double)l / (1.0 + compensated_m);
    f = (float)x;
    if ((double)f > x) f = nextafterf(f, 0.0f);
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    /* Down to the type's grid: x is normal in it (at least 16 / 2 for fp16). */
    return b & (type == DGC_SUM_BF16 ? 0xffff0000u : 0xffffe000u); /* fp32's limit: 11 bits, as fp16's grid */
}

void dgc_transport_bytes_for(uint64_t n, unsigned elem_bytes, uint64_t k, unsigned value_bits, int nranks,
                             dgc_transport_bytes *out) {
    if (nranks < 1) nranks = 1;
    uint64_t others = (uint64_t)nranks - 1, header = sizeof(dgc_wire_header);
    dgc_compact_layout code;
    dgc_compact_layout_for(n, k, value_bits, &code);
    out->payload = code.bytes;
    out->sparse = others * code.bytes;
    /* 2 (N-1) e n / N, rounded up: at most 2^20 ranks, 2^32 elements and 4
     * bytes each, so the product fits 64 bits. */
    out->dense = (2 * others * elem_bytes * n + (uint64_t)nranks - 1) / (uint64_t)nranks + others * header;
    dgc_region_plan r;
    dgc_policy_regions(n, k, value_bits, nranks, &r);
    out->reduce = r.bytes;
}

/* cap: twice a rank's even share of its k pairs, so that a region may hold
 * twice its share before pairs stay behind; keep: an even share of k, so
 * that the output holds about k pairs, as the other transports'. */
void dgc_policy_regions(uint64_t n, uint64_t k, unsigned value_bits, int nranks, dgc_region_plan *out) {
    const uint64_t ranks = nranks < 1 ? 1 : (uint64_t)nranks, others = ranks - 1;
    const uint64_t twice = (2 * k + ranks - 1) / ranks;
    out->keep = (k + ranks - 1) / ranks;
    out->cap = twice < k ? twice : k;
    dgc_compact_layout_for(n, out->cap, value_bits, &out->send);
    dgc_compact_layout_for(n, out->keep, 32, &out->pick);
    out->body = out->send.bytes - sizeof(dgc_wire_header);
    /* The headers' round, the all-to-all (one headerless payload to each
     * other owner) and the ring all-gather of the selections (each owner's
     * to each other rank: headers kept, they carry DGC_WIRE_FAILED). */
    out->bytes = others * (sizeof(dgc_wire_header) + out->body + out->pick.bytes);
}

void dgc_policy_bounds_equal(uint64_t n, int nranks, uint32_t *bounds) {
    const uint64_t ranks = nranks < 1 ? 1 : (uint64_t)nranks;
    for (uint64_t r = 0; r <= ranks; r++) bounds[r] = (uint32_t)(n * r / ranks); /* n < 2^32, r <= 2^20 */
}

void dgc_policy_bounds_balanced(uint64_t n, int nranks, const uint32_t *sel, uint64_t m, uint32_t *bounds) {
    dgc_policy_bounds_equal(n, nranks, bounds);
    if (m == 0) return;
    const uint64_t ranks = nranks < 1 ? 1 : (uint64_t)nranks;
    for (uint64_t r = 1; r < ranks; r++) bounds[r] = sel[r * m / ranks]; /* m <= 2^32, r < 2^20 */
}

dgc_transport dgc_policy_transport(const dgc_config *cfg, uint64_t n, unsigned elem_bytes, uint64_t k, int nranks,
                                   dgc_transport_bytes *bytes) {
    dgc_transport_bytes b;
    dgc_transport_bytes_for(n, elem_bytes, k, (unsigned)cfg->value_bits, nranks, &b);
    if (bytes) *bytes = b;
    if (cfg->transport == DGC_TRANSPORT_REDUCE) { /* opt-in; the dense transport where it sends fewer bytes */
        if (nranks <= 1) return DGC_TRANSPORT_SPARSE;
        return b.reduce < b.dense ? DGC_TRANSPORT_REDUCE : DGC_TRANSPORT_DENSE;
    }
    if (cfg->transport != DGC_TRANSPORT_AUTO) return (dgc_transport)cfg->transport;
    if (nranks <= 1) return DGC_TRANSPORT_SPARSE; /* nothing travels either way */
    return b.sparse < b.dense ? DGC_TRANSPORT_SPARSE : DGC_TRANSPORT_DENSE;
}

static unsigned elem_bytes_of(unsigned sum_type) { return sum_type == DGC_SUM_F32 ? 4u : 2u; }

int dgc_policy_plan(const dgc_config *cfg, uint64_t count, unsigned sum_type, uint64_t step, int nranks,
                    dgc_plan *out) {
    const uint64_t k = dgc_k_for(count, dgc_density_at(cfg->sparsity, cfg->warmup_steps, step));
    const unsigned value_bits = (unsigned)cfg->value_bits;
    out->transport = dgc_policy_transport(cfg, count, elem_bytes_of(sum_type), k, nranks, &out->bytes);
    /* The sparse all-gather counts the compact payloads in 8-byte words with
     * an int count, per rank and in total. The dense transport has no such
     * limit: it gathers the headers alone and sums the vector in pieces. */
    if (out->transport != DGC_TRANSPORT_DENSE) { /* the NCCL path sends _REDUCE's calls by the all-gather */
        uint64_t words = out->bytes.payload / 8;
        if (words > (uint64_t)INT_MAX || words * (uint64_t)nranks > (uint64_t)INT_MAX) return -1;
    }
    dgc_compact_layout_for(count, k, value_bits, &out->code);
    out->regions = (dgc_region_plan){0};
    out->layout = (dgc_layout){.node = 0, .nodes = nranks, .node_size = 1, .local = 0};
    out->shard_lo = 0;
    out->shard_hi = count;
    out->card_bytes = 0;
    if (out->transport == DGC_TRANSPORT_REDUCE) dgc_policy_regions(count, k, value_bits, nranks, &out->regions);
    const int compensated = cfg->compensate && cfg->momentum > 0;
    out->p = (dgc_step_params){
        .n = count,
        .step = step,
        .k = k,
        .momentum = (float)cfg->momentum,
        .nesterov = cfg->nesterov,
        .momentum_masking = cfg->momentum_masking,
        .clip_norm = cfg->clip_norm,
        .nranks = nranks,
        .sample_ratio = cfg->sample_ratio,
        .value_bits = value_bits,
        /* A 16-bit buffer's dense transport sums in its own type; the pairs
         * of the sparse one are summed in fp32 and rounded once. */
        .sum_type = out->transport == DGC_TRANSPORT_DENSE ? sum_type : DGC_SUM_F32,
        /* The values sent are clamped so that the ranks' sum stays finite in
         * the output's type, also with momentum compensation (S_t - m S_{t-1}). */
        .clamp_bits = dgc_policy_value_limit_bits(sum_type, nranks, compensated ? cfg->momentum : 0.0),
    };
    return 0;
}

void dgc_policy_shard(uint64_t n, int node_size, int l, uint64_t *lo, uint64_t *hi) {
    const uint64_t L = node_size < 1 ? 1 : (uint64_t)node_size; /* n < 2^32 and L <= 2^20: no overflow */
    *lo = n * (uint64_t)l / L;
    *hi = n * ((uint64_t)l + 1) / L;
}

int dgc_policy_node_call(const dgc_layout *layout, uint64_t count) {
    return layout->node && layout->node_size >= 2 && count >= (uint64_t)layout->node_size &&
           count <= (uint64_t)INT_MAX - (uint64_t)layout->node_size; /* L pieces of a shard within an int */
}

uint64_t dgc_policy_cross_bytes(const dgc_plan *plan) {
    if (plan->transport == DGC_TRANSPORT_DENSE) return plan->bytes.dense;
    if (plan->transport == DGC_TRANSPORT_REDUCE) return plan->bytes.reduce;
    return plan->bytes.sparse;
}

int dgc_policy_plan_node(const dgc_config *cfg, uint64_t count, unsigned sum_type, uint64_t shard_step,
                         const dgc_layout *layout, dgc_plan *out) {
    /* Whether the call fits is decided on the largest shard, ceil(n / L), so
     * that every local rank decides alike. */
    const uint64_t L = (uint64_t)layout->node_size, largest = (count + L - 1) / L;
    if (dgc_policy_plan(cfg, largest, sum_type, shard_step, layout->nodes, out)) return -1;
    uint64_t lo, hi;
    dgc_policy_shard(count, layout->node_size, layout->local, &lo, &hi);
    dgc_policy_plan(cfg, hi - lo, sum_type, shard_step, layout->nodes, out); /* fits: no larger */
    out->layout = *layout;
    out->shard_lo = lo;
    out->shard_hi = hi;
    out->card_bytes = (uint64_t)layout->node_size * dgc_policy_cross_bytes(out);
    return 0;
}

/* The densities from step on are dgc_density_at's stages that follow it: a
 * quarter each (exact in binary), never below the target, then the target. */
void dgc_policy_outlook(const dgc_config *cfg, uint64_t count, unsigned sum_type, uint64_t step, int nranks,
                        uint64_t *sparse_k, int *dense) {
    const unsigned elem_bytes = elem_bytes_of(sum_type);
    const double target = 1.0 - cfg->sparsity;
    double d = dgc_density_at(cfg->sparsity, cfg->warmup_steps, step);
    *sparse_k = 0;
    *dense = 0;
    for (;;) {
        uint64_t k = dgc_k_for(count, d);
        if (dgc_policy_transport(cfg, count, elem_bytes, k, nranks, NULL) == DGC_TRANSPORT_DENSE) *dense = 1;
        else if (k > *sparse_k) *sparse_k = k;
        if (!(d > target)) break;
        d *= 0.25;
        if (d < target) d = target;
    }
}
