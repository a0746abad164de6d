// TANDEM_HD marks functions shared by host and device code: the elementwise functors in
// ops/kernels are written once and compiled by both the C++ compiler and nvcc.
#pragma once

#if defined(__CUDACC__)
#define TANDEM_HD __host__ __device__
#define TANDEM_HD_INLINE __host__ __device__ __forceinline__
#else
#define TANDEM_HD
#define TANDEM_HD_INLINE inline
#endif
