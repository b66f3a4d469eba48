/* ballot_crashes_jit: __ballot_sync as chipStar compiles it plainly (its
 * sub_group_ballot). On this stack the OpenCL CPU JIT aborts while
 * compiling the module ("Scalar sub_group_ballot execution breaks subgroup
 * semantics"); where it does not, the program prints the ballot and
 * exits 0, and defects.sh says the workaround can go. Its own translation
 * unit: the JIT compiles a whole module at once. */
#include <stdio.h>

__global__ void ballot_kernel(unsigned int *out) { out[threadIdx.x] = __ballot_sync(0xffffffffu, threadIdx.x & 1u); }

int main() {
    unsigned int *d, h[32];
    if (cudaMalloc(&d, sizeof h) != cudaSuccess) return 2;
    ballot_kernel<<<1, 32>>>(d);
    if (cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost) != cudaSuccess) return 3;
    printf("ballot %#x (CUDA: 0xaaaaaaaa)\n", h[0]);
    return h[0] == 0xaaaaaaaau ? 0 : 4;
}
