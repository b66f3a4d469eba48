/* dgc_gpu_compress: the host engine's dgc_compress_zeroing on the device.
 *
 *   init          reset this call's scratch
 *   clip          sum of squares -> scale (only with clipping on)
 *   select x4     exact want-th largest of the shared sample's updated |v|
 *                 (computed as each pass reads it: fresh.cuh): the threshold
 *   update        the one pass over memory: candidates (|v| >= thr)
 *                 compacted, non-finite flagged, out (or the accumulator)
 *                 zeroed unless it is g and the state a single copy, and
 *                 u, v -> the spares where the state has two halves (a
 *                 single copy is written by the decode's commit)
 *   decide        which selection: all candidates (<= k), the top k of them
 *                 (<= the candidate room), or the exact top k of the buffer
 *                 (its updated values computed again where read)
 *   select x4     the k-th largest |v| of that set (returns at once for "all")
 *   ties x5       among candidates, when only some ties at t go: the index
 *                 of the last one taken (a select by index; returns at once
 *                 otherwise)
 *   compact x2    the selection into k slots: values above t in any order,
 *                 ties at t in index order (the host's rule), padding after
 *   sort          the slots by index (cub radix sort, padding key n last)
 *   pack          header and slots into the payload
 *
 * The selected set is the host's: both draw the same sample and find its
 * exact want-th largest, so both test against the same threshold, count the
 * same candidates and take the same path; within a path both take the exact
 * top k, and the ties at the k-th value that fit in index order: the same
 * pairs, bit for bit, on every run. */
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <stdio.h>

#include "fresh.cuh"
#include "headers.cuh"
#include "dgcshim/compact_rules.h"
#include "dgcshim/sum_rules.h"

using namespace dgc_cuda;

namespace {

__global__ void __launch_bounds__(kThreads) init_kernel(scratch *sc, uint64_t count, uint64_t want) {
    select_job *a = &sc->sample, *b = &sc->sel, *c = &sc->tie;
    a->hist[threadIdx.x] = 0;
    b->hist[threadIdx.x] = 0;
    c->hist[threadIdx.x] = 0;
    if (threadIdx.x != 0) return;
    sc->nonfinite = 0;
    sc->saturated = 0;
    sc->sum_nonfinite = 0;
    sc->ncand = 0;
    sc->gt_fill = 0;
    sc->tie_fill = 0;
    sc->clip_done = 0;
    sc->scale = 1.0f;
    sc->bad_key = kNoBad;
    sc->code_bad_key = kNoBad;
    sc->max_abs = 0;
    sc->scale_e = 0;
    a->vals = nullptr;
    a->fresh = FRESH_SAMPLE;
    a->idx = nullptr;
    a->count = count;
    a->want = a->want0 = want;
    a->prefix = a->mask = 0;
    a->active = 1;
    a->by_index = 0;
    a->done = 0;
    b->active = 0;
    b->by_index = 0;
    b->fresh = FRESH_NONE;
    b->done = 0;
    c->active = 0;
    c->fresh = FRESH_NONE;
    c->done = 0;
}

struct update_args {
    const void *g;
    float *zero;   /* out (fp32) or the accumulator, zeroed as the pass streams; NULL: the commit zeroes it */
    float *v2, *u2;
    int keep;      /* write u, v into the spares (two halves); a single copy is only read */
    uint64_t n, ns;
    scratch *sc;
    int clip;
    float m;
    uint32_t *cand_idx;
    float *cand_val;
    uint64_t cap;  /* dgc_candidate_cap(n, k): more candidates and the exact path takes over */
};

/* Stores the lane's hits (bit c: element first + c, value vn[c]) as
 * candidates; one atomic per warp. Call from all lanes. */
template <int W>
__device__ __forceinline__ void add_candidates(const update_args &a, unsigned int hits, uint64_t first,
                                               const float *vn) {
    if (!__any_sync(kFullMask, hits)) return;
    unsigned long long slot = warp_reserve(&a.sc->ncand, (unsigned)__popc(hits));
#pragma unroll
    for (int c = 0; c < W; c++) {
        if (!((hits >> c) & 1u)) continue;
        if (slot < a.cap) {
            a.cand_idx[slot] = (uint32_t)(first + (uint64_t)c);
            a.cand_val[slot] = vn[c];
        }
        slot++;
    }
}

/* The update pass: the roofline of the engine (reads g, u, v; writes the
 * zeroed output, and u, v where the state has two halves: 12 to 24 bytes an
 * element with momentum). VEC: 16-byte
 * loads and stores (4 elements a lane); the spares' halves are 256-byte
 * aligned (ns), g and out were checked by the caller. Loops are bounded per
 * warp so that every lane reaches the warp votes. out may be g: each lane
 * reads its elements before it zeroes them, and no lane touches another's.
 *
 * The register cap stays: __launch_bounds__(kThreads, 8) asks for 8 blocks
 * of 256 threads an SM, the whole of sm_90's 2048 threads, which leaves 32
 * registers a thread (65536 / 2048). The pass is bound by memory, and full
 * occupancy is what hides its latency. nvcc 13.0 for sm_90 fits all 18
 * instantiations in 30 or 32 registers with no spill (-Xptxas -v: 0 bytes of
 * spill stores and loads). Without the cap, three of them (no momentum,
 * 16-byte loads) would take 34 registers and 6 blocks an SM (75%) for
 * nothing saved. Any spill now shows in the build: kernels/CMakeLists.txt
 * passes --warn-on-spills to ptxas. Under DGC_WERROR (CI) it is an error.
 * In the GPU session's build (DGC_WERROR=OFF) it is a warning, and
 * scripts/test-gpu.sh prints it. If a later nvcc or architecture spills
 * here, relax the cap to (kThreads, 6) and measure. */
template <int DT, bool MOM, bool NEST, bool VEC>
__global__ void __launch_bounds__(kThreads, 8) update_kernel(update_args a) {
    const int cur = a.sc->cur;
    const float *v = committed(a.v2, cur, a.ns);
    float *vn_out = spare(a.v2, cur, a.ns);
    const float *u = MOM ? committed(a.u2, cur, a.ns) : nullptr;
    float *un_out = MOM ? spare(a.u2, cur, a.ns) : nullptr;
    const float scale = a.clip ? a.sc->scale : 1.0f;
    const float thr = __uint_as_float(a.sc->sample.tbits);
    const float m = a.m;
    const unsigned int lane = lane_id();
    const uint64_t stride = (uint64_t)gridDim.x * kThreads;
    const uint64_t first = blockIdx.x * (uint64_t)kThreads + (threadIdx.x & ~31u);
    uint32_t bad = 0, ovf = 0; /* a scaled gradient non-finite; a sum saturated (update_rules.h) */
    uint64_t head = 0; /* elements done by the vector loop */
    if (VEC) {
        const uint64_t n4 = a.n / 4;
        for (uint64_t base = first; base < n4; base += stride) {
            const uint64_t i4 = base + lane;
            unsigned int hits = 0;
            float vn[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            if (i4 < n4) {
                const float4 g4 = elem<DT>::load4(a.g, i4);
                const float4 v4 = reinterpret_cast<const float4 *>(v)[i4];
                float4 u4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (MOM) u4 = reinterpret_cast<const float4 *>(u)[i4];
                if (a.zero) reinterpret_cast<float4 *>(a.zero)[i4] = make_float4(0.0f, 0.0f, 0.0f, 0.0f); /* g is read */
                float un[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                vn[0] = update_one<MOM, NEST>(g4.x, u4.x, v4.x, scale, m, &un[0], &bad, &ovf);
                vn[1] = update_one<MOM, NEST>(g4.y, u4.y, v4.y, scale, m, &un[1], &bad, &ovf);
                vn[2] = update_one<MOM, NEST>(g4.z, u4.z, v4.z, scale, m, &un[2], &bad, &ovf);
                vn[3] = update_one<MOM, NEST>(g4.w, u4.w, v4.w, scale, m, &un[3], &bad, &ovf);
                if (a.keep) {
                    reinterpret_cast<float4 *>(vn_out)[i4] = make_float4(vn[0], vn[1], vn[2], vn[3]);
                    if (MOM) reinterpret_cast<float4 *>(un_out)[i4] = make_float4(un[0], un[1], un[2], un[3]);
                }
#pragma unroll
                for (int c = 0; c < 4; c++) hits |= (unsigned)dgc_rule_selected(vn[c], thr) << c;
            }
            add_candidates<4>(a, hits, 4 * i4, vn);
        }
        head = n4 * 4;
    }
    /* Element by element: the whole buffer when not aligned, else the tail. */
    const uint64_t rest = a.n - head;
    for (uint64_t base = first; base < rest; base += stride) {
        const uint64_t i = head + base + lane;
        unsigned int hits = 0;
        float vn = 0.0f;
        if (base + lane < rest) {
            const float gv = elem<DT>::load(a.g, i);
            const float vv = v[i];
            const float uv = MOM ? u[i] : 0.0f;
            if (a.zero) a.zero[i] = 0.0f;
            float un = 0.0f;
            vn = update_one<MOM, NEST>(gv, uv, vv, scale, m, &un, &bad, &ovf);
            if (a.keep) {
                vn_out[i] = vn;
                if (MOM) un_out[i] = un;
            }
            hits = (unsigned)dgc_rule_selected(vn, thr);
        }
        add_candidates<1>(a, hits, i, &vn);
    }
    if (__any_sync(kFullMask, bad) && lane == 0) atomicOr(&a.sc->nonfinite, 1u);
    if (__any_sync(kFullMask, ovf) && lane == 0) atomicOr(&a.sc->saturated, 1u);
}

/* Which selection this call takes, from the candidate count (the host's
 * rule: more than k candidates -> the top k of them; more than the room ->
 * the exact top k of the whole buffer). */
__global__ void decide_kernel(scratch *sc, const float *v2, uint64_t ns, uint64_t n, uint64_t k, uint64_t cap,
                              const uint32_t *cand_idx, const float *cand_val) {
    select_job *j = &sc->sel;
    const unsigned long long c = sc->ncand;
    j->prefix = 0;
    j->mask = 0;
    j->done = 0;
    j->want = j->want0 = k;
    j->vals = cand_val;
    j->fresh = FRESH_NONE;
    j->idx = cand_idx;
    j->count = c;
    if (c <= k) { /* every candidate goes: "above t = 0" is all of them (none is zero) */
        sc->mode = MODE_ALL;
        j->active = 0;
        j->tbits = 0;
        j->cnt_gt = c;
        j->ties_take = 0;
        j->nsel = c;
        j->ties_all = 1;
    } else if (c <= cap) {
        sc->mode = MODE_CANDIDATES;
        j->active = 1;
    } else {
        sc->mode = MODE_EXACT;
        j->active = 1;
        /* Every element's updated value: in the spare where the state has
         * two halves (out, which may be g, is zeroed by now), else computed
         * where read (g is intact: the commit zeroes it). */
        j->vals = ns ? spare(const_cast<float *>(v2), sc->cur, ns) : nullptr;
        j->fresh = ns ? FRESH_NONE : FRESH_ELEMENT;
        j->idx = nullptr;
        j->count = n;
    }
}

/* The selection's results, without the job's histogram (which would
 * otherwise be copied into every thread). */
struct sel_view {
    const float *vals;
    const uint32_t *idx;
    unsigned long long count, cnt_gt, ties_take, nsel;
    unsigned int tbits, ties_all, fresh;
};

__device__ __forceinline__ sel_view view_of(const select_job *j) {
    sel_view v;
    v.vals = j->vals;
    v.idx = j->idx;
    v.count = j->count;
    v.cnt_gt = j->cnt_gt;
    v.ties_take = j->ties_take;
    v.nsel = j->nsel;
    v.tbits = j->tbits;
    v.ties_all = j->ties_all;
    v.fresh = j->fresh;
    return v;
}

__device__ __forceinline__ uint32_t index_of(const sel_view &j, uint64_t i) {
    return j.idx ? j.idx[i] : (uint32_t)i;
}

/* The range of the job's values that block b of the compaction owns:
 * contiguous, so that ties can be taken in position order. */
__device__ __forceinline__ void block_range(uint64_t count, uint64_t *lo, uint64_t *hi) {
    *lo = blockIdx.x * count / gridDim.x;
    *hi = (blockIdx.x + 1) * count / gridDim.x;
}

/* Among candidates, when only some ties at t go: the host takes them in
 * index order, but the update pass stored the candidates in whatever order
 * its warps reserved their slots. So a select by index among the ties finds
 * the ties_take-th smallest index (the tie job), and the compaction takes
 * the ties up to it. (On the exact path positions are indices: ties_kernel
 * takes them in order; with all ties taken, order does not matter.) */
__global__ void tie_setup_kernel(scratch *sc) {
    const select_job *j = &sc->sel;
    select_job *t = &sc->tie;
    t->active = sc->mode == MODE_CANDIDATES && !j->ties_all;
    if (!t->active) return;
    t->vals = j->vals; /* the candidates' array: never fresh */
    t->fresh = FRESH_NONE;
    t->idx = j->idx;
    t->count = j->count;
    t->want = t->want0 = j->ties_take;
    t->prefix = t->mask = 0;
    t->done = 0;
    t->by_index = 1;
    t->match = j->tbits;
}

/* Values above t go to slots [0, cnt_gt) (exactly that many exist); ties go
 * too when all of them are taken, or, among candidates, those at indices up
 * to the tie job's cut (exactly ties_take); the ties in each block's range
 * are counted for the ordered pass of the exact path. */
__global__ void __launch_bounds__(kThreads) compact_kernel(scratch *sc, uint32_t *keys, float *vals, fresh_src src) {
    typedef cub::BlockReduce<unsigned int, kThreads> reduce_t;
    __shared__ typename reduce_t::TempStorage tmp;
    const sel_view j = view_of(&sc->sel);
    const float scale = j.fresh != FRESH_NONE ? fresh_scale(src) : 1.0f;
    const unsigned int lane = lane_id();
    const bool cut = sc->tie.active;                /* candidates, some ties: up to the cut index */
    const uint32_t last = ~sc->tie.tbits;
    uint64_t lo, hi;
    block_range(j.count, &lo, &hi);
    unsigned int ties = 0;
    for (uint64_t base = lo + (threadIdx.x & ~31u); base < hi; base += kThreads) {
        const uint64_t i = base + lane;
        bool gt = false, eq = false, take = false;
        float x = 0.0f;
        if (i < hi) {
            x = job_value(j.vals, j.fresh, src, i, scale);
            const unsigned int key = abs_key(x);
            gt = key > j.tbits;
            eq = key == j.tbits;
            take = eq && (j.ties_all || (cut && index_of(j, i) <= last));
        }
        ties += eq;
        if (__any_sync(kFullMask, gt)) {
            const unsigned long long slot = warp_reserve(&sc->gt_fill, gt);
            if (gt && slot < j.cnt_gt) {
                keys[slot] = index_of(j, i);
                vals[slot] = x;
            }
        }
        if ((j.ties_all || cut) && __any_sync(kFullMask, take)) {
            const unsigned long long slot = warp_reserve(&sc->tie_fill, take);
            if (take && slot < j.ties_take) {
                keys[j.cnt_gt + slot] = index_of(j, i);
                vals[j.cnt_gt + slot] = x;
            }
        }
    }
    const unsigned int total = reduce_t(tmp).Sum(ties);
    if (threadIdx.x == 0) sc->blk_ties[blockIdx.x] = total;
}

/* Padding keys after the selection, and, when only some ties go, the first
 * ties_take of them in position order (on the exact path, index order: the
 * host's select_exact). Same grid as compact_kernel: the same ranges. */
__global__ void __launch_bounds__(kThreads) ties_kernel(scratch *sc, uint32_t *keys, float *vals, uint64_t k,
                                                        uint32_t pad, fresh_src src) {
    typedef cub::BlockReduce<unsigned long long, kThreads> reduce_t;
    typedef cub::BlockScan<unsigned int, kThreads> scan_t;
    __shared__ union {
        typename reduce_t::TempStorage reduce;
        typename scan_t::TempStorage scan;
    } tmp;
    __shared__ unsigned long long before;
    const sel_view j = view_of(&sc->sel);
    for (uint64_t s = j.nsel + blockIdx.x * (uint64_t)kThreads + threadIdx.x; s < k; s += (uint64_t)gridDim.x * kThreads) {
        keys[s] = pad;
        vals[s] = 0.0f;
    }
    if (j.ties_all || sc->tie.active) return; /* the compaction took them */
    unsigned long long mine = 0;
    for (unsigned int q = threadIdx.x; q < blockIdx.x; q += kThreads) mine += sc->blk_ties[q];
    const unsigned long long sum = reduce_t(tmp.reduce).Sum(mine);
    if (threadIdx.x == 0) before = sum;
    __syncthreads();
    unsigned long long running = before; /* ties in the ranges of the blocks before this one */
    if (running >= j.ties_take) return;
    const float scale = j.fresh != FRESH_NONE ? fresh_scale(src) : 1.0f;
    uint64_t lo, hi;
    block_range(j.count, &lo, &hi);
    for (uint64_t base = lo; base < hi; base += kThreads) {
        const uint64_t i = base + threadIdx.x;
        float x = 0.0f;
        unsigned int eq = 0;
        if (i < hi) {
            x = job_value(j.vals, j.fresh, src, i, scale);
            eq = abs_key(x) == j.tbits;
        }
        unsigned int excl, agg;
        scan_t(tmp.scan).ExclusiveSum(eq, excl, agg);
        if (eq && running + excl < j.ties_take) {
            const uint64_t slot = j.cnt_gt + running + excl;
            keys[slot] = index_of(j, i);
            vals[slot] = x;
        }
        running += agg;
        __syncthreads(); /* the scan's storage is used again */
        if (running >= j.ties_take) break;
    }
}

/* Header and k slots: the sorted real pairs, then padding (index 0, +0.0f);
 * all padding when some updated value is non-finite (the host's payload). */
/* 16-bit values: the largest finite |x| among the selected values, whose
 * binade (and rounding) gives the payload's scale (dgc_compact_scale16).
 * An integer atomicMax: the same result in any order. */
__global__ void __launch_bounds__(kThreads) scale_kernel(scratch *sc, const float *vals, uint32_t limit) {
    const uint64_t nsel = sc->nonfinite ? 0 : sc->sel.nsel;
    for (uint64_t s = blockIdx.x * (uint64_t)kThreads + threadIdx.x; s < nsel; s += (uint64_t)gridDim.x * kThreads) {
        const uint32_t a = __float_as_uint(vals[s]) & 0x7fffffffu;
        if (dgc_cx_finite(a) && a != 0) atomicMax(&sc->max_abs, a < limit ? a : limit); /* of the clamped values */
    }
}

/* The payload from the sorted selection: each value clamped to limit (a
 * 16-bit buffer's: dgc_sum_step_limit_bits; FLT_MAX otherwise), then with
 * 16-bit values rounded to the grid of the payload's scale (the host's
 * dgc_compact_values), or, for a dense sum in a 16-bit type, to that type
 * (sum_rules.h), and what the clamp and rounding lost left in vals for the
 * masking to keep (x - x = +0 with 32-bit values: what was sent is gone). */
__global__ void __launch_bounds__(kThreads) pack_kernel(scratch *sc, const uint32_t *keys, float *vals, void *payload,
                                                        uint64_t step, uint64_t n, uint64_t k, int nranks, int round16,
                                                        unsigned sum_type, uint32_t limit) {
    const unsigned int nonfinite = sc->nonfinite;
    const uint64_t nsel = nonfinite ? 0 : sc->sel.nsel;
    const int e = round16 ? dgc_cx_scale16_of_max(sc->max_abs) : 0;
    uint32_t *idx = reinterpret_cast<uint32_t *>(static_cast<char *>(payload) + sizeof(dgc_wire_header));
    float *val = reinterpret_cast<float *>(static_cast<char *>(payload) + sizeof(dgc_wire_header) + 4 * k);
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        dgc_wire_header h;
        h.magic = DGC_WIRE_MAGIC;
        h.flags = (nonfinite ? DGC_WIRE_NONFINITE : 0u) | kept_age_bits(sc, step, nranks);
        h.step = step;
        h.n = n;
        h.k = k;
        *static_cast<dgc_wire_header *>(payload) = h;
        sc->scale_e = e;
    }
    for (uint64_t s = blockIdx.x * (uint64_t)kThreads + threadIdx.x; s < k; s += (uint64_t)gridDim.x * kThreads) {
        const bool real = s < nsel;
        float x = real ? vals[s] : 0.0f, r = x;
        const uint32_t u = __float_as_uint(x);
        if (sum_type != DGC_SUM_F32 && dgc_cx_finite(u)) {
            r = __uint_as_float(dgc_sum_round_bits(u, sum_type, limit));
        } else if (dgc_cx_finite(u)) {
            const uint32_t c = dgc_sum_clamp_bits(u, limit);
            r = __uint_as_float(round16 ? dgc_cx_round16_bits(c, e) : c);
        }
        idx[s] = real ? keys[s] : 0u;
        val[s] = r;
        if (real) vals[s] = x - r;
    }
}

template <int DT, bool MOM, bool NEST>
void update_launch(const update_args &a, bool vec, int sms, cudaStream_t st) {
    if (vec)
        update_kernel<DT, MOM, NEST, true><<<grid_for(a.n / 4 ? a.n / 4 : 1, sms, 8), kThreads, 0, st>>>(a);
    else
        update_kernel<DT, MOM, NEST, false><<<grid_for(a.n, sms, 8), kThreads, 0, st>>>(a);
}

template <int DT>
void update_dispatch(const update_args &a, bool mom, bool nesterov, bool vec, int sms, cudaStream_t st) {
    if (!mom) update_launch<DT, false, false>(a, vec, sms, st);
    else if (nesterov) update_launch<DT, true, true>(a, vec, sms, st);
    else update_launch<DT, true, false>(a, vec, sms, st);
}

/* cub's onesweep sort does not check the temp storage it is handed (it
 * drops AliasTemporaries' verdict): storage short of its need would be
 * written past, into the payload that follows it. The state sized it for
 * its largest k; the need of this k and bit count is asked again whenever k
 * changes (a few warm-up stages: host arithmetic, no launch, no wait). */
int check_sort_temp(dgc_gpu_state *s, uint64_t k, int end_bit, char *err, size_t errlen) {
    if (s->sort_k == k) return 0;
    size_t need = 0;
    const cudaError_t e = sort_temp_bytes(k, end_bit, &need);
    if (e != cudaSuccess) return fail(err, errlen, "sizing the selection's sort", e);
    if (need > s->sort_temp_bytes) {
        char msg[160];
        snprintf(msg, sizeof msg, "dgc_gpu_compress: sorting %llu slots needs %zu bytes of scratch, the state has %zu",
                 (unsigned long long)k, need, s->sort_temp_bytes);
        return fail_msg(err, errlen, msg);
    }
    s->sort_k = k;
    return 0;
}

} // namespace

extern "C" int dgc_gpu_compress(dgc_gpu_state *s, const void *g, void *out, dgc_gpu_dtype dtype,
                                const dgc_step_params *p, dgc_cuda_stream stream, char *err, size_t errlen) {
    if (!s || !g || !out || !p) return fail_msg(err, errlen, "dgc_gpu_compress: NULL argument");
    const dgc_gpu_shape *sh = &s->shape;
    const uint64_t n = sh->n, k = p->k;
    const int vb16 = p->value_bits == 16;
    /* A 16-bit dense sum rounds the values to its own type instead. */
    const int round16 = vb16 && p->sum_type == DGC_SUM_F32;
    if (p->n != n || k < 1 || k > sh->k || (unsigned)dtype > (unsigned)DGC_GPU_BF16 ||
        (dtype != DGC_GPU_F32 && sh->dtype == DGC_GPU_F32) || (sh->value_bits && sh->value_bits != (vb16 ? 16u : 32u)) ||
        (p->sum_type != DGC_SUM_F32 && p->sum_type != dgc_gpu_sum_type_of(dtype)) ||
        p->clamp_bits >= 0x7f800000u) { /* a finite magnitude */
        char msg[280];
        snprintf(msg, sizeof msg,
                 "dgc_gpu_compress: call (n %llu, k %llu, dtype %d, value bits %u, sum type %u, clamp 0x%08x) does not "
                 "fit the state (n %llu, k %llu, dtype %d, wire value bits %u)",
                 (unsigned long long)p->n, (unsigned long long)k, (int)dtype, p->value_bits, p->sum_type, p->clamp_bits,
                 (unsigned long long)n, (unsigned long long)sh->k, (int)sh->dtype, sh->value_bits);
        return fail_msg(err, errlen, msg);
    }
    /* A buffer not aligned to its elements would fault the kernels' typed
     * loads, and a misaligned-address fault ends the whole CUDA context,
     * the application's with it: refused, so that this rank takes part
     * flagged and the call fails on every rank instead. (No framework
     * hands NCCL such a buffer; NCCL itself would take it.) */
    const uintptr_t align = dtype == DGC_GPU_F32 ? 4 : 2;
    if ((uintptr_t)g % align || (uintptr_t)out % align) {
        char msg[160];
        snprintf(msg, sizeof msg, "dgc_gpu_compress: buffers at %p and %p are not aligned to their %u-byte elements",
                 g, out, (unsigned)align);
        return fail_msg(err, errlen, msg);
    }
    /* Before any launch: a call refused here leaves nothing half enqueued. */
    if (check_sort_temp(s, k, sort_end_bit(n), err, errlen)) return -1;
    cudaStream_t st = (cudaStream_t)stream;
    scratch *sc = s->sc;
    const uint64_t ns = s->ns;
    dgc_sample_plan sp;
    dgc_sample_plan_for(n, k, p->sample_ratio, &sp);
    const uint64_t cap = dgc_candidate_cap(n, k); /* <= s->cand_cap: the cap grows with k */

    /* An in-place fp32 call on a single copy keeps g until the commit has
     * read it again: the commit zeroes out then. */
    const bool zero_later = single_copy(s) && dtype == DGC_GPU_F32 && out == g;
    fresh_src &src = s->upd;
    src.g = g;
    src.v2 = s->v2;
    src.u2 = s->u2;
    src.ns = ns;
    src.sc = sc;
    src.m = p->momentum;
    src.dtype = (int)dtype;
    src.nesterov = p->nesterov != 0;
    src.clip = p->clip_norm > 0;
    src.n = n;
    src.runs = sp.runs;
    src.step = p->step;
    src.whole = sp.whole;
    src.dense = sp.count == sp.runs * DGC_SAMPLE_RUN;
    s->upd_zero = zero_later ? out : nullptr;

    init_kernel<<<1, kThreads, 0, st>>>(sc, sp.count, sp.want);
    CHECK("launching the compression's init");
    s->last_step = p->step + 1; /* what the decode's done_step will say (dgc_gpu_state_kept_fits) */
    if (p->clip_norm > 0) {
        cudaError_t e = launch_clip(s, g, dtype, p, st);
        if (e != cudaSuccess) return fail(err, errlen, "launching the clipping sum", e);
    }
    cudaError_t e = launch_select(s, &sc->sample, sp.count, src, st);
    if (e != cudaSuccess) return fail(err, errlen, "launching the threshold's select", e);

    update_args a;
    a.g = g;
    /* 16-bit: the accumulator (NULL without dense room: nothing to zero). */
    a.zero = dtype != DGC_GPU_F32 ? s->acc : zero_later ? nullptr : static_cast<float *>(out);
    a.v2 = s->v2;
    a.u2 = s->u2;
    a.keep = !single_copy(s);
    a.n = n;
    a.ns = ns;
    a.sc = sc;
    a.clip = p->clip_norm > 0;
    a.m = p->momentum;
    a.cand_idx = s->cand_idx;
    a.cand_val = s->cand_val;
    a.cap = cap;
    const bool mom = s->u2 != nullptr;
    bool vec;
    switch (dtype) {
    case DGC_GPU_F16:
        vec = (uintptr_t)g % elem<DGC_GPU_F16>::align4 == 0;
        update_dispatch<DGC_GPU_F16>(a, mom, p->nesterov != 0, vec, s->sms, st);
        break;
    case DGC_GPU_BF16:
        vec = (uintptr_t)g % elem<DGC_GPU_BF16>::align4 == 0;
        update_dispatch<DGC_GPU_BF16>(a, mom, p->nesterov != 0, vec, s->sms, st);
        break;
    default:
        vec = (uintptr_t)g % 16 == 0 && (uintptr_t)out % 16 == 0;
        update_dispatch<DGC_GPU_F32>(a, mom, p->nesterov != 0, vec, s->sms, st);
        break;
    }
    CHECK("launching the update pass");

    decide_kernel<<<1, 1, 0, st>>>(sc, s->v2, ns, n, k, cap, s->cand_idx, s->cand_val);
    CHECK("launching the selection's decision");
    if ((e = launch_select(s, &sc->sel, n, src, st)) != cudaSuccess)
        return fail(err, errlen, "launching the top-k select", e);
    tie_setup_kernel<<<1, 1, 0, st>>>(sc);
    CHECK("launching the ties' setup");
    if ((e = launch_select(s, &sc->tie, cap, src, st)) != cudaSuccess)
        return fail(err, errlen, "launching the ties' select", e);
    compact_kernel<<<kCompactBlocks, kThreads, 0, st>>>(sc, s->keys[0], s->vals[0], src);
    CHECK("launching the selection's compaction");
    ties_kernel<<<kCompactBlocks, kThreads, 0, st>>>(sc, s->keys[0], s->vals[0], k, (uint32_t)n, src);
    CHECK("launching the selection's ties");

    /* Padding keys are n, above every real index, so the real pairs come
     * first, by increasing index. */
    cub::DoubleBuffer<uint32_t> dk(s->keys[0], s->keys[1]);
    cub::DoubleBuffer<float> dv(s->vals[0], s->vals[1]);
    size_t temp = s->sort_temp_bytes;
    try { /* see sort_temp_bytes: no exception into C */
        e = cub::DeviceRadixSort::SortPairs(s->sort_temp, temp, dk, dv, (uint32_t)k, 0, sort_end_bit(n), st);
    } catch (...) {
        e = cudaErrorUnknown;
    }
    if (e != cudaSuccess) return fail(err, errlen, "sorting the selection", e);
    CHECK("sorting the selection");
    s->sorted = dk.selector;

    const uint32_t limit = dgc_sum_step_limit_bits(p->sum_type, p->clamp_bits, p->nranks);
    if (round16) {
        scale_kernel<<<grid_for(k, s->sms, 4), kThreads, 0, st>>>(sc, dv.Current(), limit);
        CHECK("launching the payload's scale");
    }
    pack_kernel<<<grid_for(k, s->sms, 4), kThreads, 0, st>>>(sc, dk.Current(), dv.Current(), s->payload, p->step, n,
                                                             k, p->nranks, round16, p->sum_type, limit);
    CHECK("launching the payload's packing");
    return 0;
}

namespace dgc_cuda {

cudaError_t preload_compress(void) {
    const void *const kernels[] = {
        (const void *)init_kernel,
        (const void *)update_kernel<DGC_GPU_F32, false, false, true>,
        (const void *)update_kernel<DGC_GPU_F32, false, false, false>,
        (const void *)update_kernel<DGC_GPU_F32, true, true, true>,
        (const void *)update_kernel<DGC_GPU_F32, true, true, false>,
        (const void *)update_kernel<DGC_GPU_F32, true, false, true>,
        (const void *)update_kernel<DGC_GPU_F32, true, false, false>,
        (const void *)update_kernel<DGC_GPU_F16, false, false, true>,
        (const void *)update_kernel<DGC_GPU_F16, false, false, false>,
        (const void *)update_kernel<DGC_GPU_F16, true, true, true>,
        (const void *)update_kernel<DGC_GPU_F16, true, true, false>,
        (const void *)update_kernel<DGC_GPU_F16, true, false, true>,
        (const void *)update_kernel<DGC_GPU_F16, true, false, false>,
        (const void *)update_kernel<DGC_GPU_BF16, false, false, true>,
        (const void *)update_kernel<DGC_GPU_BF16, false, false, false>,
        (const void *)update_kernel<DGC_GPU_BF16, true, true, true>,
        (const void *)update_kernel<DGC_GPU_BF16, true, true, false>,
        (const void *)update_kernel<DGC_GPU_BF16, true, false, true>,
        (const void *)update_kernel<DGC_GPU_BF16, true, false, false>,
        (const void *)decide_kernel,
        (const void *)tie_setup_kernel,
        (const void *)compact_kernel,
        (const void *)ties_kernel,
        (const void *)scale_kernel,
        (const void *)pack_kernel,
    };
    return preload(kernels, sizeof kernels / sizeof kernels[0]);
}

} // namespace dgc_cuda
