/* DGC_HOSTDEV: how the rule headers (update_rules.h, compact_rules.h,
 * sum_rules.h) declare their functions, so that one text serves the host
 * engine (static inline C) and the CUDA kernels (__host__ __device__). */
#ifndef DGCSHIM_HOSTDEV_H
#define DGCSHIM_HOSTDEV_H

#ifdef __CUDACC__
#define DGC_HOSTDEV __host__ __device__ __forceinline__
#else
#define DGC_HOSTDEV static inline
#endif

#endif
