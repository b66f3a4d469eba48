/* Facilities chipStar v1.2.1 does not have: each section, chosen by -D,
 * must fail to compile while the defect lasts (defects.sh compiles them
 * plainly, without compat.h). */
#include <cuda_bf16.h>

#if defined(MISSING_ANY_SYNC)
__global__ void k(int *p) { *p = __any_sync(0xffffffffu, *p); }
#elif defined(MISSING_MATCH_ANY_SYNC)
__global__ void k(unsigned int *p) { *p = __match_any_sync(0xffffffffu, *p); }
#elif defined(MISSING_LDCG_PLAIN)
__global__ void k(unsigned long long *p) { p[1] = __ldcg(p); }
#elif defined(MISSING_BF16_RN)
__global__ void k(float *p) { *p = __bfloat162float(__float2bfloat16_rn(*p)); }
#elif defined(MISSING_BF16_RAW)
__global__ void k(unsigned short *p) {
    __nv_bfloat16_raw r;
    r.x = *p;
    *p = r.x;
}
#elif defined(MISSING_CUB)
#include <cub/block/block_reduce.cuh>
#elif defined(BF16_TWICE)
/* bf16_multiple_definitions: two objects that include cuda_bf16.h, linked
 * together without --allow-multiple-definition. */
#if BF16_TWICE == 1
int bf16_twice_other();
int main() { return bf16_twice_other(); }
#else
int bf16_twice_other() { return 0; }
#endif
#else
#error "missing.cu: choose a section with -D"
#endif
