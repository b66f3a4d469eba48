/* What the CUDA engine's files share: the state (host side), the scratch
 * block the kernels talk through (device side), and the launch helpers each
 * file exports to dgc_gpu_compress / dgc_gpu_decode.
 *
 * Why a scratch block: every decision that depends on data (the threshold,
 * how many candidates, which selection path, whether a payload is bad or a
 * step non-finite, which array is committed) is written by one kernel and
 * read by the next, in stream order, so the host never waits for the device.
 * Kernels are launched unconditionally and return at once when the scratch
 * says they have nothing to do.
 *
 * Cross-file helpers live in namespace dgc_cuda with hidden visibility
 * (CMake's CUDA_VISIBILITY_PRESET): nvcc makes kernel stubs static, so each
 * kernel is launched from the file that defines it. */
#ifndef DGCSHIM_KERNELS_INTERNAL_CUH
#define DGCSHIM_KERNELS_INTERNAL_CUH

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "dgcshim/engine.h"
#include "dgcshim/engine_cuda.h"
#include "dgcshim/wire.h"

namespace dgc_cuda {

constexpr int kThreads = 256;          /* every kernel's block size (a multiple of 32: warp code relies on it) */
constexpr int kClipBlocks = 1024;      /* fixed, so the sum of squares adds its partials in a fixed order */
constexpr int kCompactBlocks = 1024;   /* fixed: the ordered tie compaction scans per-block counts */
constexpr unsigned kFullMask = 0xffffffffu;
constexpr unsigned long long kNoBad = ~0ull; /* bad_key when no payload failed its check */

/* Selection paths, chosen on the device once the candidates are counted. */
enum { MODE_ALL = 0, MODE_CANDIDATES = 1, MODE_EXACT = 2 };
/* Decode outcomes, chosen on the device from the gathered headers. */
enum { DEC_OK = 0, DEC_BAD = 1, DEC_NAN = 2 };
/* How the previous finite step's sum is kept for the compensation: the
 * gathered payloads of a sparse step (prev), or the dense vector of a
 * dense-transport step (prev_dense). */
enum { PREV_NONE = 0, PREV_SPARSE = 1, PREV_DENSE = 2 };

/* One radix select: the want-th largest key among count values, keys being
 * the bit patterns of |value| (non-negative floats order like their bits).
 * Four passes of 8 bits; each pass's last block picks the digit. */
struct select_job {
    const float *vals;     /* the values (NULL: computed, fresh); key = bits & 0x7fffffff */
    const uint32_t *idx;   /* their element indices, NULL: the position is the index */
    unsigned long long count, want, want0;
    unsigned int prefix, mask; /* the digits fixed so far */
    unsigned int active;   /* 0: every pass returns at once */
    unsigned int by_index; /* keys are ~index, among the values whose key is match: the job finds
                            * the want-th smallest index of those (the ties' cut, in index order) */
    unsigned int match;
    unsigned int fresh;    /* FRESH_* (fresh.cuh): vals NULL, the values computed from g, u and v */
    unsigned int done;     /* blocks finished in the current pass */
    unsigned int hist[256];
    /* results, after the fourth pass */
    unsigned int tbits;    /* the want0-th largest key */
    unsigned int ties_all; /* every element equal to t is taken: no ordered tie scan */
    unsigned long long cnt_gt;    /* elements with key > t (they are all taken) */
    unsigned long long ties_take; /* elements with key == t taken, the first ones in position order */
    unsigned long long nsel;      /* cnt_gt + ties_take */
};

/* What the expansion learns of one rank's compact payload from its frame. */
struct rank_code {
    unsigned long long count; /* its pairs */
    int e;                    /* its scale */
    unsigned int max16;       /* its values' largest binary16 magnitude */
    int skip;                 /* not expanded: flagged FAILED, a bad header (the plain check names it) or frame */
    int pad;
};

/* A compact-code fault's key: the lowest rank first, then the lowest slot,
 * then the reason, as one atomicMin keeps it. */
__host__ __device__ inline unsigned long long code_key(int rank, unsigned long long slot, int reason) {
    const unsigned long long s = slot < (1ull << 36) - 1 ? slot : (1ull << 36) - 1;
    return (unsigned long long)rank << 40 | s << 4 | (unsigned long long)reason;
}

/* The device-side scratch of one state. cur and prev_* persist across calls;
 * the rest is reset by each compress. */
struct scratch {
    int cur;                 /* which half of v2 (and u2) is committed */
    int prev_kind;           /* PREV_*: how the last committed step's sum is kept */
    int prev_nranks;
    int mode;                /* MODE_* of this call's selection */
    int subtract;            /* every header reported the same age of its kept sum: compensate */
    unsigned long long prev_k;
    unsigned long long prev_step; /* the step the kept sum was summed at (the headers' age) */
    float scale;             /* clipping factor (1 when clipping is off) */
    unsigned int clip_done;  /* blocks finished in the sum of squares */
    unsigned int nonfinite;  /* some scaled gradient is Inf or NaN */
    unsigned int saturated;  /* some sum of finite values overflowed and was held at +-FLT_MAX (update_rules.h) */
    int dec_mode;            /* DEC_* of this call's decode */
    unsigned int sum_nonfinite; /* a 16-bit dense sum held Inf or NaN */
    unsigned long long ncand;     /* candidates seen (may exceed the room) */
    unsigned long long gt_fill;   /* slots taken by values above t */
    unsigned long long tie_fill;  /* slots taken by ties (when all ties go) */
    unsigned long long bad_key;   /* (rank << 40 | slot + 1) of the first bad slot, kNoBad */
    unsigned long long code_bad_key; /* code_key of the first compact-code fault, kNoBad */
    unsigned int max_abs;    /* the selected values' largest finite |x| bits: the 16-bit scale */
    int scale_e;             /* the payload's scale exponent (0 unless 16-bit values) */
    select_job sample;       /* the threshold from the sample */
    select_job sel;          /* the exact top k among candidates or the whole buffer */
    select_job tie;          /* among candidates, when only some ties at t go: the last index taken */
    unsigned int blk_ties[kCompactBlocks];
    double clip_part[kClipBlocks];
};

/* What an updated value is computed from (fresh.cuh): the call's g and the
 * committed arrays, and the sample plan's runs (dgc_rule_run_start). */
struct fresh_src {
    const void *g;
    const float *v2, *u2; /* the state's arrays (u2 NULL without momentum); sc->cur picks the committed half */
    uint64_t ns;          /* their halves' stride: 0 for a single copy */
    const scratch *sc;    /* the clipping scale, written by the clip kernel before any read here */
    float m;
    int dtype, nesterov, clip;
    uint64_t n, runs, step; /* the sample plan's */
    int whole, dense;       /* dense: every run full, run r at positions [r*RUN, (r+1)*RUN) */
};

} // namespace dgc_cuda

/* The host side of a state. One cudaMalloc holds every device array. */
struct dgc_gpu_state {
    dgc_gpu_shape shape;
    int sms;                 /* multiprocessors: caps the grids of grid-stride kernels */
    void *block;             /* the one device allocation */
    int pooled;              /* block came from cudaMallocAsync (freed in stream order), not cudaMalloc */
    int counter_given;       /* nonfinite_host was the caller's (dgc_gpu_state_create_with) */
    size_t bytes;            /* its size: dgc_gpu_state_footprint(shape) */
    /* Residual and momentum (u2 NULL without momentum): two halves, the
     * committed one and the one the next step writes, when the shape has
     * dense room (the dense transport sums in out, which may be g, before
     * the step's outcome is known); else one copy (ns 0, single_copy()),
     * both "halves" the same array, which the compression only reads and
     * the commit (commit.cu) writes once the outcome is known. */
    uint64_t ns;             /* the halves' stride: n rounded up to 64 floats (256 bytes); 0 for one copy */
    float *v2, *u2;
    /* The latest compression's update, which a single copy's commit does
     * again: its g (the caller keeps it until the decode, as NCCL keeps a
     * send buffer) and parameters, and out when that is g (an in-place fp32
     * call: zeroed by the commit, after it has read g, instead of by the
     * update pass). upd.g NULL: no compression yet. */
    dgc_cuda::fresh_src upd;
    void *upd_zero;
    float *acc;              /* fp32 accumulator, n (NULL when the dtype is fp32) */
    uint32_t *cand_idx;      /* candidates of the update pass, cand_cap of them */
    float *cand_val;
    uint64_t cand_cap;
    uint32_t *keys[2];       /* the selection, k slots, and the sort's other buffer: */
    float *vals[2];          /* [1] are the candidate arrays, free by then */
    void *sort_temp;
    size_t sort_temp_bytes;
    void *payload;           /* dgc_wire_bytes(k) */
    void *gathered;          /* nranks * dgc_wire_bytes(k) */
    void *prev;              /* nranks * dgc_wire_bytes(sparse_k), when keep_prev and sparse_k */
    /* A compact shape with sparse steps: the compact payloads, sent and
     * received, and the expansion's scratch (per upper word of every rank:
     * its set bits and their running sum; per rank: its frame). */
    void *wire, *wire_gathered;
    unsigned long long *popc, *popc_sum;
    dgc_cuda::rank_code *codes;
    void *scan_temp;
    size_t scan_temp_bytes;
    size_t wire_room;        /* bytes for one compact payload (a call's may not be larger) */
    float *prev_dense;       /* n, when keep_prev and dense */
    float *spare;            /* nranks, when dense: the dense sum's elements past its blocks */
    dgc_cuda::scratch *sc;
    dgc_gpu_state_mapped *mapped_host, *mapped_dev; /* what the kernels tell the host */
    unsigned long long *nonfinite_host; /* &mapped_host->nonfinite: steps dropped, for dgc_gpu_state_nonfinite */
    unsigned long long *nonfinite_dev;  /* &mapped_dev->nonfinite */
    uint64_t last_step;      /* the step of the latest compression enqueued (plus 1; 0: none yet) */
    /* After a compress: which keys/vals buffer holds the sorted selection
     * (the sort decides on the host), for the decode's masking. */
    int sorted;
    uint64_t sort_k;         /* k the sort's temp storage was last checked for */
};

namespace dgc_cuda {

/* A state without dense room: one copy of v and u (dgc_gpu_state.ns). */
inline bool single_copy(const dgc_gpu_state *s) { return s->ns == 0; }

/* Records a CUDA failure for dgc_gpu_last_error and writes "what: why" into
 * err (when not NULL). Returns -1. */
int fail(char *err, size_t errlen, const char *what, cudaError_t e);
/* The same for a failure that is not CUDA's (bad arguments). */
int fail_msg(char *err, size_t errlen, const char *msg);

/* After a launch, in a function with err and errlen: the launch's failure,
 * recorded and returned as -1 (fail). */
#define CHECK(what)                                                                                                  \
    do {                                                                                                             \
        cudaError_t e_ = cudaGetLastError();                                                                         \
        if (e_ != cudaSuccess) return dgc_cuda::fail(err, errlen, what, e_);                                         \
    } while (0)

/* Blocks for a grid-stride kernel over count items: enough to cover them,
 * at most per_sm blocks per multiprocessor, at least one. */
unsigned int grid_for(uint64_t count, int sms, int per_sm);

/* Bytes of cub's sort temp storage for k pairs of keys with end_bit bits. */
cudaError_t sort_temp_bytes(uint64_t k, int end_bit, size_t *bytes);
/* Bits the sort looks at for indices below n, with n as the padding key. */
int sort_end_bit(uint64_t n);

/* sample_select.cu: clipping, the threshold sample, radix select passes. */
cudaError_t launch_clip(dgc_gpu_state *s, const void *g, dgc_gpu_dtype dtype, const dgc_step_params *p,
                        cudaStream_t st);
/* The four passes over a job; max_count bounds the job's count (grid size);
 * src: where a job without an array computes its values (fresh.cuh). */
cudaError_t launch_select(dgc_gpu_state *s, select_job *job, uint64_t max_count, const fresh_src &src,
                          cudaStream_t st);

/* compact.cu: the compact codec. */
/* cub's scan scratch for items upper words. */
cudaError_t scan_temp_bytes(uint64_t items, size_t *bytes);
/* The expansion of the gathered compact payloads into dgc_gpu_gathered,
 * faults into sc->code_bad_key; the plain decode follows. */
int launch_expand(dgc_gpu_state *s, const dgc_step_params *p, cudaStream_t st, char *err, size_t errlen);

/* decode.cu: what both transports' decodes share. */
/* out = NaN in dtype, when *mode is DEC_NAN (mode NULL: unconditionally). */
cudaError_t nan_launch(void *out, dgc_gpu_dtype dtype, uint64_t n, const int *mode, int sms, cudaStream_t st);
/* The report's device address (NULL for no report). */
dgc_gpu_report *device_report(dgc_gpu_report *report, cudaError_t *e);
/* After the sum of the call's pairs is in acc (out, or the accumulator):
 * the compensation (keep: PREV_SPARSE or PREV_DENSE, how this step's sum is
 * to be kept; PREV_NONE: no compensation), the average, the conversion to
 * dtype, the masking and the commit, each a no-op unless the decode's
 * outcome is DEC_OK (the conversion writes NaN for DEC_NAN). k: the call's
 * slots, for keeping its payloads. Returns 0, or -1 (err) when a launch
 * failed. */
int launch_decode_tail(dgc_gpu_state *s, void *out, float *acc, dgc_gpu_dtype dtype, const dgc_step_params *p,
                       int keep, int average, uint64_t k, cudaStream_t st, char *err, size_t errlen);


/* Lazy loading (CUDA's default since 12.2) loads a kernel at its first
 * launch, which may come mid-run (the dense transport's first step, a
 * 16-bit buffer, the first compensation) while this process's NCCL kernels
 * spin: a load waits for the device. Each file names every kernel it can
 * launch, every template instantiation included (nvcc makes kernel stubs
 * static: no other file can name them), and preload_kernels (state.cu)
 * loads them all when a state is made: cudaFuncGetAttributes loads a
 * kernel. CUB's own kernels are not named (its internals): they load at
 * the first compressed call, which making a state immediately precedes. */
cudaError_t preload(const void *const *kernels, size_t count);
cudaError_t preload_sample_select(void);
cudaError_t preload_compress(void);
cudaError_t preload_decode(void);
cudaError_t preload_dense(void);
cudaError_t preload_compact(void);
cudaError_t preload_commit(void);
/* node.cu: the node layout's sum. */
cudaError_t preload_node(void);

/* commit.cu: a single copy's commit, after the decode's outcome is known
 * (DEC_OK: u and v updated again, from the compression's g, and written;
 * any outcome: an in-place fp32 out zeroed). */
int launch_commit(dgc_gpu_state *s, cudaStream_t st, char *err, size_t errlen);
} // namespace dgc_cuda

#endif
